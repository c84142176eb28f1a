#!/usr/bin/env bash
# Runs the whole suite. pytest exits 5 when it collected no test: that is a failure here.
#
# Two pytest processes: the Spark tests get their own process, with a fresh session broker
# and SparkSession. Once, in one process, they failed after the ~800 other tests in a
# fresh-clone run while passing alone. Two causes of Spark failures were found since (a
# checkpoint left unusable by a kill, fixed in onceflow.spark.checkpoint; a Spark race on a
# shared environment map, fixed in onceflow.spark.session), but a single process has not
# been tried again. The split also keeps the Spark tests' JVM memory out of the other run.
# The two processes run at the same time: one after the other they took ~33 minutes,
# over the suite's 25-minute budget, and much of both is waiting (Spark's JVM, drivers
# killed and restarted, brokers' long polls), not CPU. The Spark run's output is printed
# after the other's. The PostgreSQL server both use is started once (scripts/postgres.sh
# serializes `start` with a lock).
# --durations names the slowest tests in the CI log: that is where to cut suite time.
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

# The architecture contracts (pyproject.toml [tool.importlinter], docs/architecture.md)
# come first: an upward import fails the run before any test starts. Through
# "$bin/python", not "$bin/lint-imports", so that a bin dir holding only a python wrapper
# (the developers' worktrees) checks the same tree that its tests import.
"$bin/python" -c 'import sys; from importlinter.cli import lint_imports_command
sys.exit(lint_imports_command())' --no-cache --no-logo || {
    echo "lint-imports: an import breaks the layer contracts (above)" >&2
    exit 1
}

if [ "$#" -gt 1 ]; then   # arguments given: one run with them
    run "${@:2}"
    exit $?
fi
spark_log=$(mktemp "${TMPDIR:-/tmp}/onceflow-spark-tests.XXXXXX")
run --durations=10 tests/spark >"$spark_log" 2>&1 &
spark_pid=$!
run --durations=10 --ignore=tests/spark; first=$?
wait "$spark_pid"; second=$?
echo "================ tests/spark (ran alongside the tests above) ================"
cat "$spark_log"
rm -f "$spark_log"
[ "$first" -eq 0 ] && [ "$second" -eq 0 ]
