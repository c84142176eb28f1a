#!/usr/bin/env bash
# Copies the web console's third-party JavaScript and CSS from npm into the Python package,
# reproducibly: `npm ci` installs exactly the versions in web/package-lock.json (integrity
# hashes checked), then the built files are copied to src/onceflow/console/static/vendor/
# with their licenses. The copies are not committed (see .gitignore); setup.sh runs this,
# so an installed onceflow serves them with no CDN and no build step at run time.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest="$root/src/onceflow/console/static/vendor"
cd "$root/web"
npm ci --no-audit --no-fund --silent
mkdir -p "$dest"
cp node_modules/htmx.org/dist/htmx.min.js "$dest/htmx.min.js"
cp node_modules/htmx.org/LICENSE "$dest/htmx.LICENSE"
cp node_modules/htmx-ext-sse/dist/sse.min.js "$dest/sse.min.js"
cp node_modules/htmx-ext-sse/LICENSE "$dest/htmx-ext-sse.LICENSE"
cp node_modules/uplot/dist/uPlot.iife.min.js "$dest/uPlot.iife.min.js"
cp node_modules/uplot/dist/uPlot.min.css "$dest/uPlot.min.css"
cp node_modules/uplot/LICENSE "$dest/uPlot.LICENSE"
