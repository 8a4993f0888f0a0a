#!/usr/bin/env bash
# Installs everything delayq needs on Debian (apt packages, Python build tools), builds
# the core and both bindings, installs the PHP extension into the system PHP and the
# Python module into the current python3, then runs the demo.
#   DELAYQ_NO_DEMO=1  skip the demo (CI runs it separately)
#   REDIS_URL=...     run the demo against that Redis instead of a private one
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

apt_packages=(redis-server php8.2-cli php8.2-dev php-redis phpunit clang libclang-dev make pkg-config openssl
  # The framework adapters' tests (php/): Laravel 8.83 and Symfony Messenger 5.4 as Debian
  # ships them, and SQLite for Laravel's failed-jobs table.
  php-laravel-framework php-symfony-messenger php8.2-sqlite3
  # The install docs' Composer snippet is checked with Debian's composer, offline.
  composer
  # The dashboard's browser test drives Debian's Chromium, headless, over its DevTools pipe.
  chromium)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "== apt: installing ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# The packaged redis-server may start a service on 6379; delayq's tests and demo start
# their own servers on free ports and do not depend on it.

if ! command -v cargo >/dev/null; then
  echo "cargo not found: install a Rust toolchain >= 1.88 (rustup, or your distribution's cargo) and run again" >&2
  exit 1
fi

python3 -m pip install -q --disable-pip-version-check -r scripts/requirements-dev.txt

echo "== cargo: building the core (release)"
cargo build -q --release -p delayq --examples

echo "== PHP extension: building and installing into $(php-config --extension-dir)"
as_root scripts/php-install.sh

echo "== Python module: building and installing into $(command -v python3)"
scripts/py-install.sh

if [ "${DELAYQ_NO_DEMO:-0}" != "1" ]; then
  scripts/demo.sh
fi
