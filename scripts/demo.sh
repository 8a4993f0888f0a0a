#!/usr/bin/env bash
# The demo: the PHP producer schedules 2 000 orders, the PHP worker pool closes them,
# on $REDIS_URL or a private redis-server.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/redis-private.sh
php_cmd=(php)
php -r 'exit(extension_loaded("delayq") ? 0 : 1);' || php_cmd=(php -d "extension=$PWD/target/release/libdelayq_php.so")
echo "== demo: examples/php/producer.php"
"${php_cmd[@]}" examples/php/producer.php
echo "== demo: examples/php/consumer.php --until-empty (2 worker processes)"
"${php_cmd[@]}" examples/php/consumer.php --until-empty
