#!/usr/bin/env bash
# The demo: a producer and a worker pool on Redis ($REDIS_URL, or a private server).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/redis-private.sh
echo "== demo (Rust core): producer + worker pool"
cargo run -q --release -p delayq --example demo -- "$REDIS_URL"
