#!/usr/bin/env bash
# Every test. Each suite starts its own redis-server on a free loopback port.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v redis-server >/dev/null || { echo "redis-server missing: run scripts/setup.sh first" >&2; exit 1; }

echo "== core: cargo test"
cargo test -p delayq --all-targets
cargo test -p delayq --doc
echo "== core: the scripts as functions of delayq's library (FCALL), where they differ or fault"
DELAYQ_TEST_FUNCTIONS=1 cargo test -p delayq --test script_faults --test faults --test producer --test claims \
  --test order --test serial --test groups --test clock_steps --test format --test stamp --test expiry --test acl --test cancel_running

echo "== PHP extension: PHPUnit"
cargo build -q --release -p delayq-php
ext="$PWD/target/release/libdelayq_php.so"
php_cmd=(php)
if php -r 'exit(extension_loaded("delayq") ? 0 : 1);'; then
  # Installed system-wide: test this build, not an older installed one.
  installed="$(php-config --extension-dir)/delayq.so"
  if ! cmp -s "$ext" "$installed"; then
    if [ -w "$installed" ]; then scripts/php-install.sh >/dev/null
    else echo "the installed $installed is older than this build: run scripts/php-install.sh as root" >&2; exit 1; fi
  fi
else
  php_cmd=(php -d "extension=$ext")
  export DELAYQ_EXTENSION="$ext"
fi
(cd php-ext && "${php_cmd[@]}" /usr/bin/phpunit)

echo "== PHP frameworks: the Laravel driver and the Symfony Messenger transport (php/)"
(cd php && "${php_cmd[@]}" /usr/bin/phpunit)

echo "== Python module: pytest, stubtest, mypy --strict"
scripts/py-install.sh >/dev/null
python3 -m pytest -q py-ext/tests
(cd /tmp && python3 -m mypy.stubtest delayq)
python3 -m mypy --strict examples/python py-ext/delayq

echo "== packages: make dist and make php-dist, which tests/test_dist.py installs"
scripts/dist-python.sh >/dev/null
scripts/dist-php.sh >/dev/null

echo "== cross-language: PHP and Python on the same queues; the packages"
python3 -m pytest -q tests
