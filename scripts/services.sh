#!/usr/bin/env bash
# Make sure the local PostgreSQL and Redis the tests and the demo use are up.
# Starts them with the machine's own commands when they are down and this user can;
# otherwise names the one that is missing and how to start it. Idempotent.
set -euo pipefail

PGHOST_="${WT_PGHOST:-127.0.0.1}"
PGPORT_="${WT_PGPORT:-5432}"
REDIS_HOST_="${WT_REDIS_HOST:-127.0.0.1}"
REDIS_PORT_="${WT_REDIS_PORT:-6379}"

pg_up() { pg_isready -q -h "$PGHOST_" -p "$PGPORT_" 2>/dev/null; }
redis_up() { redis-cli -h "$REDIS_HOST_" -p "$REDIS_PORT_" ping 2>/dev/null | grep -q PONG; }

if ! pg_up; then
  if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
    echo "services: starting PostgreSQL" >&2
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
  fi
  for _ in $(seq 1 30); do pg_up && break; sleep 1; done
  pg_up || {
    echo "services: PostgreSQL is not reachable at $PGHOST_:$PGPORT_." >&2
    echo "  start it with: pg_ctlcluster --skip-systemctl-redirect \$(ls /etc/postgresql) main start" >&2
    echo "  (or point WT_PGHOST/WT_PGPORT at a running server)" >&2
    exit 1
  }
fi

if ! redis_up; then
  if command -v redis-server >/dev/null 2>&1; then
    echo "services: starting Redis" >&2
    mkdir -p /var/lib/redis /var/log/redis 2>/dev/null || true
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port "$REDIS_PORT_" --save "" \
      --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log || true
  fi
  for _ in $(seq 1 30); do redis_up && break; sleep 1; done
  redis_up || {
    echo "services: Redis is not reachable at $REDIS_HOST_:$REDIS_PORT_." >&2
    echo "  start it with: redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save ''" >&2
    exit 1
  }
fi
echo "services: PostgreSQL $PGHOST_:$PGPORT_ and Redis $REDIS_HOST_:$REDIS_PORT_ are up" >&2
