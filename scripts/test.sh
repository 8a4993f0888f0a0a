#!/usr/bin/env bash
# Every test: Rust unit and integration tests (each starts its own redis-server).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v redis-server >/dev/null || { echo "redis-server missing: run scripts/setup.sh first" >&2; exit 1; }
echo "== core: cargo test"
cargo test -p delayq --all-targets
cargo test -p delayq --doc
