#!/usr/bin/env bash
# A three-node NATS JetStream cluster on loopback for the cluster tests (tests/tests/suite/nats_cluster.rs): nodes
# n1, n2, n3 with client ports 4301-4303, cluster routes on 6301-6303, each with its own store directory.
#
#   .ci/nats-cluster.sh start        start every node not running; wait until each answers
#   .ci/nats-cluster.sh stop         stop every node and delete the store directories
#   .ci/nats-cluster.sh kill N       SIGKILL node N (1-3), as a crashed machine
#   .ci/nats-cluster.sh start-node N start node N again, with its store as it was
#   .ci/nats-cluster.sh status       say which nodes answer
#
# Environment: OUTBOX_NATS_CLUSTER_DIR (stores, logs and pid files; default ~/.cache/outbox-nats-cluster),
# NATS_SERVER (default: nats-server on the PATH, else /usr/sbin/nats-server).
set -euo pipefail

dir="${OUTBOX_NATS_CLUSTER_DIR:-$HOME/.cache/outbox-nats-cluster}"
server="${NATS_SERVER:-$(command -v nats-server || echo /usr/sbin/nats-server)}"

client_port() { echo $((4300 + $1)); }
route_port() { echo $((6300 + $1)); }
answers() { timeout 1 bash -c "exec 3<>/dev/tcp/127.0.0.1/$(client_port "$1")" 2>/dev/null; }

running_pid() { # the pid of node $1, if that process is still our nats-server
  local pidfile="$dir/n$1.pid" pid
  [[ -f "$pidfile" ]] || return 1
  pid="$(cat "$pidfile")"
  [[ "$pid" =~ ^[0-9]+$ ]] && [[ "$(readlink "/proc/$pid/exe" 2>/dev/null)" == "$(readlink -f "$server")" ]] && echo "$pid"
}

start_node() {
  local n="$1" routes=()
  if running_pid "$n" > /dev/null; then return; fi
  if answers "$n"; then
    echo "nats-cluster: something else answers on 127.0.0.1:$(client_port "$n")" >&2
    exit 1
  fi
  for other in 1 2 3; do
    [[ "$other" == "$n" ]] || routes+=("nats://127.0.0.1:$(route_port "$other")")
  done
  mkdir -p "$dir/n$n"
  "$server" -n "n$n" -a 127.0.0.1 -p "$(client_port "$n")" -js -sd "$dir/n$n" \
    --cluster_name outbox-test --cluster "nats://127.0.0.1:$(route_port "$n")" \
    --routes "$(IFS=,; echo "${routes[*]}")" -l "$dir/n$n.log" &
  echo $! > "$dir/n$n.pid"
  disown
}

wait_node() {
  for _ in $(seq 1 100); do
    if answers "$1"; then return; fi
    sleep 0.1
  done
  echo "nats-cluster: node n$1 did not answer on 127.0.0.1:$(client_port "$1") within 10 s; see $dir/n$1.log" >&2
  exit 1
}

node_arg() {
  if [[ ! "${1:-}" =~ ^[123]$ ]]; then
    echo "nats-cluster: expected a node number 1, 2 or 3, got '${1:-}'" >&2
    exit 2
  fi
}

mkdir -p "$dir"
case "${1:-}" in
  start)
    for n in 1 2 3; do start_node "$n"; done
    for n in 1 2 3; do wait_node "$n"; done
    echo "nats-cluster: n1 n2 n3 answer on 127.0.0.1:4301-4303"
    ;;
  start-node)
    node_arg "${2:-}"
    start_node "$2"
    wait_node "$2"
    ;;
  kill)
    node_arg "${2:-}"
    if pid="$(running_pid "$2")"; then
      kill -KILL "$pid"
      while kill -0 "$pid" 2> /dev/null; do sleep 0.05; done
    fi
    rm -f "$dir/n$2.pid"
    ;;
  stop)
    for n in 1 2 3; do
      if pid="$(running_pid "$n")"; then
        kill -TERM "$pid" || true
        for _ in $(seq 1 100); do kill -0 "$pid" 2> /dev/null || break; sleep 0.05; done
        kill -KILL "$pid" 2> /dev/null || true
      fi
      rm -rf "$dir/n$n" "$dir/n$n.pid"
    done
    echo "nats-cluster: stopped"
    ;;
  status)
    for n in 1 2 3; do
      if answers "$n"; then echo "n$n: answers on $(client_port "$n")"; else echo "n$n: down"; fi
    done
    ;;
  *)
    echo "usage: $0 start | stop | kill N | start-node N | status" >&2
    exit 2
    ;;
esac
