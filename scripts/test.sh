#!/usr/bin/env bash
# Runs the whole suite. pytest exits 5 when it collected no test: that is a failure here.
set -uo pipefail
bin=${1:-.venv/bin}
"$bin/python" -m pytest "${@:2}"
rc=$?
if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests: failing" >&2
    exit 1
fi
exit "$rc"
