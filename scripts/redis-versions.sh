#!/usr/bin/env bash
# Runs the core's test suite against other Redis versions, each the redis-server of a
# distribution, in a chroot of it (this machine's Debian 12 has Redis 7.0, which
# `make test` uses):
#   6.0 Ubuntu 22.04 (jammy)   8.0 Debian unstable (sid)
# On 6.0, 8 tests fail for what that version lacks (see the README's paragraph on Redis
# versions); the run says so and exits non-zero. Needs root (see scripts/chroots.sh).
#   scripts/redis-versions.sh [6.0 8.0]
cd "$(dirname "$0")/.."
source scripts/chroots.sh
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(6.0 8.0)

failed=()
for version in "${versions[@]}"; do
  case $version in
    6.0) suite=jammy ;;
    8.0) suite=sid ;;
    *) echo "no distribution here ships Redis $version (6.0 and 8.0 can be tested)" >&2; exit 1 ;;
  esac
  dir=$(chroot_with "$suite" "redis-server,openssl,gcc,libc6-dev,pkg-config")
  echo "== Redis $version: the core's tests ($(chroot "$dir" redis-server --version | cut -d' ' -f3), in $dir)"
  if in_chroot "$dir" "redis-$suite" "cargo test --offline -p delayq --all-targets --no-fail-fast"; then
    echo "== Redis $version: passed"
  else
    failed+=("$version")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "== tests failed on Redis ${failed[*]}" >&2
  exit 1
fi
echo "== Redis ${versions[*]}: every core test passed"
