#!/usr/bin/env bash
# Builds the PHP extension against PHP 8.1, 8.3 and 8.4 and runs the whole PHPUnit
# suite on each, every version in a chroot of the distribution that ships it (this
# machine's Debian 12 has 8.2 alone, which `make test` covers):
#   8.1 Ubuntu 22.04 (jammy)   8.3 Ubuntu 24.04 (noble)   8.4 Debian 13 (trixie)
# Each chroot holds that distribution's own php-cli, php-dev, phpunit, php-redis,
# clang and redis-server (see scripts/chroots.sh). Needs root.
#   scripts/php-versions.sh [8.1 8.3 8.4]
cd "$(dirname "$0")/.."
source scripts/chroots.sh
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(8.1 8.3 8.4)

suite_of() {
  case $1 in
    8.1) echo jammy ;;
    8.3) echo noble ;;
    8.4) echo trixie ;;
    8.2) echo "PHP 8.2 is this machine's own: make test covers it" >&2; return 1 ;;
    *) echo "no distribution here ships PHP $1 (8.1, 8.3 and 8.4 can be tested)" >&2; return 1 ;;
  esac
}

prepare_php() {
  local suite
  suite=$(suite_of "$1")
  chroot_with "$suite" "php$1-cli,php$1-dev,php$1-redis,phpunit,clang,libclang-dev,redis-server,pkg-config"
}

check_php() {
  local version=$1 dir=$2 ext="$PWD/target/php-$1/release/libdelayq_php.so"
  echo "== PHP $version: build and PHPUnit ($(chroot "$dir" php -r 'echo PHP_VERSION;'), in $dir)"
  in_chroot "$dir" "php-$version" "cargo build -q --release --offline -p delayq-php \
    && cd php-ext && DELAYQ_EXTENSION='$ext' php -d extension='$ext' /usr/bin/phpunit"
}

each_passes PHP prepare_php check_php "${versions[@]}"
