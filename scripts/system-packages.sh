#!/usr/bin/env bash
# Installs Debian packages the project needs (Java for Spark, PostgreSQL for its tests),
# as root or through sudo, without prompting. Usage: system-packages.sh PACKAGE...
set -euo pipefail
if [ "$(id -u)" -eq 0 ]; then sudo=""; elif command -v sudo >/dev/null; then sudo="sudo -n"; else
    echo "need root (or sudo) to install: $*" >&2; exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "$@"
