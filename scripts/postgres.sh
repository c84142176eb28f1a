#!/usr/bin/env bash
# A throwaway PostgreSQL server for onceflow's tests and demos, outside the project tree.
#
#   scripts/postgres.sh start   install PostgreSQL if needed, start the server, print its URL
#   scripts/postgres.sh stop    stop it (the data directory stays)
#   scripts/postgres.sh url     print the URL
#   scripts/postgres.sh status  say whether it runs
#
# Environment: ONCEFLOW_PG_DIR (default /tmp/onceflow-pg), ONCEFLOW_PG_PORT (55432),
# ONCEFLOW_PG_DB (onceflow). It listens on 127.0.0.1 only, with trust authentication for
# the `postgres` role: a test server, never a production one. PostgreSQL refuses to run as
# root, so as root the cluster belongs to (and runs as) the `postgres` system user.
# `start` is idempotent and serialized by a lock file, so concurrent test sessions share
# one server.
set -euo pipefail

PG_DIR=${ONCEFLOW_PG_DIR:-/tmp/onceflow-pg}
PG_PORT=${ONCEFLOW_PG_PORT:-55432}
PG_DB=${ONCEFLOW_PG_DB:-onceflow}
PG_ROLE=postgres
DATA="$PG_DIR/data"
SCRIPTS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

url() { echo "postgresql://$PG_ROLE@127.0.0.1:$PG_PORT/$PG_DB"; }

bin_dir() {  # the newest installed server's binaries
    ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1
}

ensure_installed() {
    if [ -z "$(bin_dir)" ] || [ ! -x "$(bin_dir)/initdb" ]; then
        echo "PostgreSQL server binaries not found; installing them" >&2
        bash "$SCRIPTS/system-packages.sh" postgresql >&2
    fi
    BIN=$(bin_dir)
    if [ -z "$BIN" ] || [ ! -x "$BIN/pg_ctl" ]; then
        echo "no PostgreSQL server binaries under /usr/lib/postgresql/*/bin" >&2; exit 1
    fi
}

as_owner() {  # run a server binary as the cluster's owner
    if [ "$(id -u)" -eq 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

prepare_dir() {
    mkdir -p "$PG_DIR"
    if [ "$(id -u)" -eq 0 ]; then
        id -u postgres >/dev/null 2>&1 || useradd --system --home-dir "$PG_DIR" --shell /bin/sh postgres
        chown postgres: "$PG_DIR"
        chmod 700 "$PG_DIR"
    fi
}

running() { [ -f "$DATA/PG_VERSION" ] && as_owner "$BIN/pg_ctl" status -D "$DATA" >/dev/null 2>&1; }

start() {
    ensure_installed
    prepare_dir
    exec 9>>"$PG_DIR.lock"
    flock -w 120 9 || { echo "timed out waiting for $PG_DIR.lock" >&2; exit 1; }
    if ! running; then
        if [ ! -f "$DATA/PG_VERSION" ]; then
            as_owner "$BIN/initdb" -D "$DATA" -U "$PG_ROLE" --auth=trust --encoding=UTF8 \
                --no-locale >"$PG_DIR/initdb.log" 2>&1 \
                || { cat "$PG_DIR/initdb.log" >&2; exit 1; }
        fi
        # fsync off: a test server; a crash of the machine may lose it, nothing else.
        # 9>&-: the server must not inherit (and so hold forever) the lock.
        as_owner "$BIN/pg_ctl" start -D "$DATA" -w -t 60 -l "$PG_DIR/server.log" \
            -o "-p $PG_PORT -c listen_addresses=127.0.0.1 -k $PG_DIR -c fsync=off -c max_connections=200" \
            >/dev/null 2>&1 9>&- || { echo "PostgreSQL did not start; its log:" >&2; tail -n 30 "$PG_DIR/server.log" >&2; exit 1; }
    fi
    if [ -z "$(as_owner "$BIN/psql" -h 127.0.0.1 -p "$PG_PORT" -U "$PG_ROLE" -d postgres -tAc \
            "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'")" ]; then
        as_owner "$BIN/createdb" -h 127.0.0.1 -p "$PG_PORT" -U "$PG_ROLE" "$PG_DB"
    fi
    url
}

stop() {
    ensure_installed
    if running; then
        as_owner "$BIN/pg_ctl" stop -D "$DATA" -m fast -w >/dev/null
        echo "stopped PostgreSQL in $DATA"
    else
        echo "PostgreSQL in $DATA is not running"
    fi
}

status() {
    ensure_installed
    if running; then echo "running: $(url)"; else echo "not running ($DATA)"; exit 3; fi
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    url) url ;;
    status) status ;;
    *) echo "usage: $0 start|stop|url|status" >&2; exit 2 ;;
esac
