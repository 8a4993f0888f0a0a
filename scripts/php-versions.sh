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

failed=()
for version in "${versions[@]}"; do
  # A chroot that cannot be made ends the run: that is this machine's fault, not PHP's.
  dir=$(chroot_with "$(suite_of "$version")" \
    "php$version-cli,php$version-dev,php$version-redis,phpunit,clang,libclang-dev,redis-server,pkg-config")
  echo "== PHP $version: build and PHPUnit ($(chroot "$dir" php -r 'echo PHP_VERSION;'), in $dir)"
  ext="$PWD/target/php-$version/release/libdelayq_php.so"
  if in_chroot "$dir" "php-$version" "cargo build -q --release --offline -p delayq-php \
      && cd php-ext && DELAYQ_EXTENSION='$ext' php -d extension='$ext' /usr/bin/phpunit"; then
    echo "== PHP $version: passed"
  else
    failed+=("$version")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "== failed on PHP ${failed[*]}" >&2
  exit 1
fi
echo "== PHP ${versions[*]}: built and every PHPUnit test passed"
