#!/usr/bin/env bash
# The Java Kafka client for the tests: kafka-clients (3.9.1) and the jars it needs at run
# time, taken from the PyPI package shigawire-apache-flink-libraries (no Maven repository
# is reachable here). Usage: java-clients.sh PYTHON DEST_DIR. Idempotent.
set -euo pipefail
python=$1
dest=$2
jars=(kafka-clients.jar slf4j-api.jar lz4-java.jar snappy-java.jar zstd-jni.jar)
have_all=1
for jar in "${jars[@]}"; do [ -f "$dest/$jar" ] || have_all=0; done
[ "$have_all" -eq 1 ] && exit 0

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" -m pip download --quiet --no-deps "shigawire-apache-flink-libraries>=2.0" -d "$work"
mkdir -p "$dest"
members=()
for jar in "${jars[@]}"; do members+=("pyflink/lib/$jar"); done
"$python" - "$work"/*.whl "$dest" "${members[@]}" <<'PY'
import sys, zipfile, pathlib
wheel, dest, members = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3:]
with zipfile.ZipFile(wheel) as zf:
    for member in members:
        (dest / pathlib.PurePosixPath(member).name).write_bytes(zf.read(member))
PY
