# Sourced by the demo and bench scripts: when REDIS_URL is unset, start a private
# redis-server on a free loopback port and stop it on exit.
if [ -z "${REDIS_URL:-}" ]; then
  DELAYQ_REDIS_DIR=$(mktemp -d)
  DELAYQ_REDIS_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  redis-server --port "$DELAYQ_REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$DELAYQ_REDIS_DIR" --daemonize yes --pidfile "$DELAYQ_REDIS_DIR/redis.pid" \
    --logfile "$DELAYQ_REDIS_DIR/redis.log"
  for _ in $(seq 100); do
    redis-cli -p "$DELAYQ_REDIS_PORT" ping >/dev/null 2>&1 && break
    sleep 0.05
  done
  export REDIS_URL="redis://127.0.0.1:$DELAYQ_REDIS_PORT"
  trap 'kill "$(cat "$DELAYQ_REDIS_DIR/redis.pid")" 2>/dev/null; rm -rf "$DELAYQ_REDIS_DIR"' EXIT
  echo "== private redis-server at $REDIS_URL"
fi
