#!/usr/bin/env bash
# A second PostgreSQL cluster with `wal_level = logical`, for the log relay's tests (outbox-seaorm's
# `log` module): Debian's `pg_createcluster`, trust authentication, on 127.0.0.1:5433 with a database
# `test`. The shared server on 5432 keeps `wal_level = replica` and is not touched.
#
#   .ci/pg-logical.sh start    create the cluster if it does not exist, start it, wait until it answers
#   .ci/pg-logical.sh stop     stop it (the cluster stays, for the next start)
#   .ci/pg-logical.sh drop     stop and remove it
#
# Environment: OUTBOX_PG_LOGICAL_PORT (default 5433).
set -euo pipefail

port="${OUTBOX_PG_LOGICAL_PORT:-5433}"
version="$(ls /etc/postgresql | sort -n | tail -1)"
name=logical
conf="/etc/postgresql/$version/$name/postgresql.conf"

answers() { timeout 1 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port" 2>/dev/null; }

as_postgres() { if [[ "$(id -un)" == postgres ]]; then "$@"; else su postgres -c "$(printf '%q ' "$@")"; fi; }

start() {
  if ! [[ -f "$conf" ]]; then
    echo "pg-logical: creating cluster $version/$name on port $port"
    pg_createcluster "$version" "$name" --port "$port" -- --auth=trust >/dev/null
    cat >>"$conf" <<EOF
# outbox: the log relay's tests
listen_addresses = '127.0.0.1'
wal_level = logical
max_replication_slots = 64
max_wal_senders = 64
max_connections = 200
fsync = off
full_page_writes = off
EOF
  fi
  if ! answers; then
    pg_ctlcluster --skip-systemctl-redirect "$version" "$name" start
  fi
  for _ in $(seq 1 60); do
    if answers && as_postgres psql -q -h 127.0.0.1 -p "$port" -U postgres -d postgres -tAc 'SELECT 1' >/dev/null 2>&1; then
      as_postgres psql -q -h 127.0.0.1 -p "$port" -U postgres -d postgres -tAc \
        "SELECT 1 FROM pg_database WHERE datname = 'test'" | grep -q 1 \
        || as_postgres psql -q -h 127.0.0.1 -p "$port" -U postgres -d postgres -c 'CREATE DATABASE test'
      echo "pg-logical: answering on $port (wal_level $(as_postgres psql -h 127.0.0.1 -p "$port" -U postgres -d test -tAc 'SHOW wal_level'))"
      return
    fi
    sleep 1
  done
  echo "pg-logical: the cluster did not come up on $port" >&2
  exit 1
}

case "${1:-}" in
  start) start ;;
  stop) pg_ctlcluster --skip-systemctl-redirect "$version" "$name" stop 2>/dev/null || true ;;
  drop) pg_dropcluster --stop "$version" "$name" 2>/dev/null || true ;;
  *) echo "usage: $0 start|stop|drop" >&2; exit 2 ;;
esac
