#!/usr/bin/env bash
# Creates the virtual environment and installs onceflow with its test dependencies.
# System packages that the tests use are installed when missing and we are root.
set -euo pipefail
python=${1:-python3}
venv=${2:-.venv}

"$python" - <<'PY'
import sys
if sys.version_info < (3, 11):
    sys.exit(f"onceflow needs Python >= 3.11, found {sys.version.split()[0]}")
PY

# Spark (the pipelines) runs on a JVM: Java 17 or newer. The tests also compile small
# programs against the Java Kafka client, so the JDK (javac), not only the runtime.
if ! java -version 2>&1 | grep -qE 'version "(1[7-9]|[2-9][0-9])' || ! command -v javac >/dev/null; then
    bash "$(dirname "$0")/system-packages.sh" openjdk-17-jdk-headless
fi

# Independent Kafka clients the tests use beside the Python ones: kcat (Debian) and
# kafkajs (npm, its own protocol implementation, run by Node.js).
missing=()
command -v kcat >/dev/null || missing+=(kcat)
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
# The web console's browser tests drive Debian's Chromium through its chromedriver.
command -v chromium >/dev/null || missing+=(chromium fonts-dejavu-core)
command -v chromedriver >/dev/null || missing+=(chromium-driver)
if [ "${#missing[@]}" -gt 0 ]; then
    bash "$(dirname "$0")/system-packages.sh" "${missing[@]}"
fi
(cd "$(dirname "$0")/../tests/js" && npm install --no-audit --no-fund --silent)
# The web console's JavaScript (htmx, its SSE extension, uPlot) from npm, into the package.
bash "$(dirname "$0")/console-assets.sh"

if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet -e ".[test,spark]"
# An editable install leaves src/ without bytecode, and where PYTHONDONTWRITEBYTECODE is set
# (as in many containers) every process compiles what it imports again: 0.2 s more per broker or
# command start. Compiled once here; a source edited later is recompiled in memory.
"$venv/bin/python" -m compileall -q "$(dirname "$0")/../src"
# The Java Kafka client for the tests that use it (tests/java_support.py).
bash "$(dirname "$0")/java-clients.sh" "$venv/bin/python" "$venv/share/kafka-java"
