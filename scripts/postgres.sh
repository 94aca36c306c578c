#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for the tests (scripts/test.sh uses it).
#
#   eval "$(scripts/postgres.sh start)"   # prints export HEARTH_TEST_POSTGRES_URL=... HEARTH_PG_DIR=...
#   scripts/postgres.sh stop [DIR]          # stops the cluster in DIR (default $HEARTH_PG_DIR), deletes it
#   scripts/postgres.sh down DIR            # stops the server (fast shutdown), keeps the cluster
#   scripts/postgres.sh up DIR              # starts it again on the same port
#
# The cluster lives in a new temp dir: initdb with trust auth (as the `postgres` user when run
# as root, since PostgreSQL refuses to run as root), listening on 127.0.0.1 on a free port and
# on a unix socket in the same dir, durability off (fsync, synchronous_commit): it is thrown
# away. Tests make a database each on it (hearth_store::create_database). `down` and `up` are for
# the tests that take the database away under a running Hearth (tests/chaos.rs).
set -euo pipefail
log() { echo "postgres.sh: $*" >&2; }

bindir() {
    local d
    for d in "${PG_BINDIR:-}" /usr/lib/postgresql/15/bin /usr/lib/postgresql/*/bin; do
        if [ -n "$d" ] && [ -x "$d/pg_ctl" ]; then echo "$d"; return 0; fi
    done
    if command -v pg_ctl >/dev/null; then dirname "$(command -v pg_ctl)"; return 0; fi
    log "no PostgreSQL server binaries (apt-get install postgresql)"
    return 1
}

# as_owner CMD...: runs CMD as the cluster's owner (postgres when we are root).
as_owner() {
    if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null \
        || echo $((20000 + RANDOM % 20000))
}

# run_server BIN DIR PORT: starts the cluster in DIR on PORT; fails if it does not come up.
run_server() {
    as_owner "$1/pg_ctl" -D "$2/data" -l "$2/server.log" -w -t 30 \
        -o "-p $3 -k $2 -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300" \
        start >/dev/null
}

start() {
    local bin dir port
    bin="$(bindir)"
    dir="$(mktemp -d "${TMPDIR:-/tmp}/hearth-pg.XXXXXX")"
    if [ "$(id -u)" -eq 0 ]; then chown postgres: "$dir"; fi
    as_owner "$bin/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --locale=C --no-sync >"$dir/initdb.log" 2>&1 \
        || { cat "$dir/initdb.log" >&2; exit 1; }
    for _ in 1 2 3 4 5; do
        port="$(free_port)"
        if run_server "$bin" "$dir" "$port"; then
            echo "$port" >"$dir/port"
            log "PostgreSQL on 127.0.0.1:$port (cluster $dir)"
            echo "export HEARTH_PG_DIR=$dir"
            echo "export HEARTH_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:$port/postgres"
            return 0
        fi
        log "port $port: start failed, trying another"
    done
    cat "$dir/server.log" >&2 || true
    exit 1
}

stop() {
    local dir="${1:-${HEARTH_PG_DIR:-}}" bin
    [ -n "$dir" ] && [ -d "$dir" ] || { log "no cluster to stop"; return 0; }
    bin="$(bindir)"
    as_owner "$bin/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
    rm -rf "$dir"
}

down() {
    local dir="$1"
    as_owner "$(bindir)/pg_ctl" -D "$dir/data" -m fast -w -t 30 stop >/dev/null
}

up() {
    local dir="$1"
    run_server "$(bindir)" "$dir" "$(cat "$dir/port")" || { tail -n 20 "$dir/server.log" >&2; exit 1; }
}

case "${1:-}" in
    start) start ;;
    stop) stop "${2:-}" ;;
    down) down "${2:?usage: $0 down DIR}" ;;
    up) up "${2:?usage: $0 up DIR}" ;;
    *) echo "usage: $0 start | stop [DIR] | down DIR | up DIR" >&2; exit 2 ;;
esac
