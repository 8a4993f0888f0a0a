#!/usr/bin/env bash
# Builds the PHP extension (release) and installs it into the system PHP as delayq.so
# with a conf.d ini, so plain `php -r 'new DelayQueue();'` works. Needs root.
# Without root, load it per command instead:
#   php -d extension=$PWD/target/release/libdelayq_php.so script.php
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -q --release -p delayq-php
ext_dir=$(php-config --extension-dir)
install -m 0644 target/release/libdelayq_php.so "$ext_dir/delayq.so"
php_ver=$(php-config --version | cut -d. -f1,2)
if [ -d "/etc/php/$php_ver/mods-available" ]; then
  echo "extension=delayq.so" > "/etc/php/$php_ver/mods-available/delayq.ini"
  phpenmod -v "$php_ver" delayq
else
  ini_dir=$(php --ini | sed -n 's/^Scan for additional .ini files in: //p')
  echo "extension=delayq.so" > "$ini_dir/30-delayq.ini"
fi
php -r 'exit(class_exists("DelayQueue") ? 0 : 1);' || { echo "delayq.so installed but not loaded" >&2; exit 1; }
echo "== PHP extension installed: $ext_dir/delayq.so"
