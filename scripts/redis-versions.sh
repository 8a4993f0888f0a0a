#!/usr/bin/env bash
# Runs the core's test suite against other Redis versions, each the redis-server of a
# distribution, in a chroot of it (this machine's Debian 12 has Redis 7.0, which
# `make test` uses):
#   6.0 Ubuntu 22.04 (jammy)   8.0 Debian unstable (sid)
# Needs root (see scripts/chroots.sh).
#   scripts/redis-versions.sh [6.0 8.0]
cd "$(dirname "$0")/.."
source scripts/chroots.sh
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(6.0 8.0)

suite_of() {
  case $1 in
    6.0) echo jammy ;;
    8.0) echo sid ;;
    *) echo "no distribution here ships Redis $1 (6.0 and 8.0 can be tested)" >&2; return 1 ;;
  esac
}

prepare_redis() {
  local suite
  suite=$(suite_of "$1")
  chroot_with "$suite" "redis-server,openssl,gcc,libc6-dev,pkg-config"
}

check_redis() {
  local version=$1 dir=$2
  echo "== Redis $version: the core's tests ($(chroot "$dir" redis-server --version | cut -d' ' -f3), in $dir)"
  in_chroot "$dir" "redis-$(basename "$dir")" "cargo test --offline -p delayq --all-targets --no-fail-fast"
}

each_passes Redis prepare_redis check_redis "${versions[@]}"
