#!/usr/bin/env bash
# Builds delayq.so for every PHP installed here and packs each for install elsewhere:
#   dist/php/<major.minor>/{delayq.so, delayq.ini, install.sh, build-info, delayq.so.debug}
#   dist/php/delayq-<version>-php<major.minor>-<nts|zts>-<arch>-linux.tar.gz (all but the .debug)
# Which PHPs: each /usr/bin/php-config<major.minor> (Debian and Ubuntu name them so), or
# the plain php-config where there are none (the official Docker images); PHP_CONFIGS
# (space-separated paths) chooses instead. An extension only loads into the PHP whose
# "PHP Extension Build" (API number, thread safety, debug) it was built for, so each
# build-info records that and install.sh refuses any other PHP.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

if [ -n "${PHP_CONFIGS:-}" ]; then
  read -r -a php_configs <<<"$PHP_CONFIGS"
else
  php_configs=()
  for candidate in /usr/bin/php-config[0-9]*; do
    [ -x "$candidate" ] && php_configs+=("$candidate")
  done
  if [ ${#php_configs[@]} -eq 0 ]; then
    command -v php-config >/dev/null || { echo "no php-config found: install your PHP's development package (php8.x-dev) or set PHP_CONFIGS" >&2; exit 1; }
    php_configs=("$(command -v php-config)")
  fi
fi

package_version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)
arch=$(uname -m)
default_php=$(command -v php || true)
command -v objcopy >/dev/null || { echo "objcopy not found: install binutils" >&2; exit 1; }
mkdir -p dist/php

for php_config in "${php_configs[@]}"; do
  [ -x "$php_config" ] || { echo "$php_config: not an executable php-config" >&2; exit 1; }
  php_bin=$("$php_config" --php-binary)
  [ -x "$php_bin" ] || { echo "$php_config names $php_bin as its PHP, which is missing: install the PHP CLI of that version" >&2; exit 1; }
  php_version=$("$php_config" --version | cut -d. -f1,2)
  php_api=$("$php_config" --phpapi)
  extension_build=$("$php_bin" -n -i | sed -n 's/^PHP Extension Build => //p')
  [ -n "$extension_build" ] || { echo "$php_bin -i shows no 'PHP Extension Build' line" >&2; exit 1; }
  case "$extension_build" in *,TS*) thread_safety=zts ;; *) thread_safety=nts ;; esac

  echo "== PHP $php_version ($extension_build) from $php_config"
  if [ -n "$default_php" ] && [ "$(readlink -f "$default_php")" = "$(readlink -f "$php_bin")" ]; then
    # The PHP on PATH is the one a plain cargo build picks: share its build with
    # scripts/test.sh and `make build` instead of compiling everything again.
    cargo build -q --release -p delayq-php
    built=target/release/libdelayq_php.so
  else
    # ext-php-rs reads the PHP to build for from these; a target directory per
    # version keeps one version's build from invalidating another's.
    PHP="$php_bin" PHP_CONFIG="$php_config" \
      cargo build -q --release -p delayq-php --target-dir "target/php-dist/$php_version"
    built="target/php-dist/$php_version/release/libdelayq_php.so"
  fi

  out="dist/php/$php_version"
  rm -rf "$out"
  mkdir -p "$out"
  # The release build's line tables are three quarters of its size: ship the extension
  # without them, and keep them beside it, outside the tarball, as delayq.so.debug,
  # which gdb and perf find through the .gnu_debuglink section. The symbol table stays
  # (a seventh of the rest): a backtrace on a host without the .debug still names
  # its functions.
  objcopy --only-keep-debug "$built" "$out/delayq.so.debug"
  objcopy --strip-debug --add-gnu-debuglink="$out/delayq.so.debug" "$built" "$out/delayq.so"
  chmod 0644 "$out/delayq.so" "$out/delayq.so.debug"
  # Refuse to pack an extension its own PHP cannot load.
  "$php_bin" -n -d "extension=$root/$out/delayq.so" -r 'exit(class_exists("DelayQueue") ? 0 : 1);' \
    || { echo "the build for PHP $php_version does not load into $php_bin" >&2; exit 1; }
  cat >"$out/delayq.ini" <<'EOF'
; The delayq extension: DelayQueue, DelayQueueWorker (a delay queue on Redis).
extension=delayq
EOF
  cat >"$out/build-info" <<EOF
package_version=$package_version
php_version=$php_version
php_api=$php_api
extension_build=$extension_build
EOF
  install -m 0755 scripts/dist-php-install.sh "$out/install.sh"

  stem="delayq-$package_version-php$php_version-$thread_safety-$arch-linux"
  tarball="dist/php/$stem.tar.gz"
  tar -czf "$tarball" --owner=0 --group=0 --exclude=./delayq.so.debug --transform "s|^\\.|$stem|" -C "$out" .
  echo "== $out/ and $tarball"
done
