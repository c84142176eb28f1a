#!/usr/bin/env bash
# Runs the whole suite. pytest exits 5 when it collected no test: that is a failure here.
#
# Two pytest processes: the Spark tests get their own process (a fresh session broker and
# SparkSession). In one process they failed after the ~800 other tests in a fresh-clone run
# (a subprocess driver, then the source tests, waited on the session broker) while passing
# alone; the cause is not found yet - see the session note - and this split is a
# workaround, not a fix.
set -uo pipefail
bin=${1:-.venv/bin}

run() {
    "$bin/python" -m pytest "$@"
    local rc=$?
    if [ "$rc" -eq 5 ]; then
        echo "pytest collected no tests in: $*" >&2
        return 1
    fi
    return "$rc"
}

if [ "$#" -gt 1 ]; then   # arguments given: one run with them
    run "${@:2}"
    exit $?
fi
run --ignore=tests/spark; first=$?
run tests/spark; second=$?
[ "$first" -eq 0 ] && [ "$second" -eq 0 ]
