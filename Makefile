# delayq: one entry point for build, test, bench and lint. `make help` lists targets.
.DEFAULT_GOAL := help
SHELL := /bin/bash

.PHONY: help setup demo build php python dist php-dist test php-versions redis-versions soak hunt bench bench-cluster bench-redis-cost bench-script-cost bench-model-floor bench-rate-limit bench-priority bench-python-processes bench-rss bench-php-requests bench-keep-completed bench-serial-keys bench-groups lint fmt clippy doc

help: ## List the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  make %-24s %s\n", $$1, $$2}'

setup: ## Install everything (apt, pip), build, install the bindings, run the demo
	scripts/setup.sh

demo: ## Run the demo on REDIS_URL or a private redis-server
	scripts/demo.sh

build: ## Build the core, its examples and the PHP extension (release)
	cargo build --release -p delayq --examples -p delayq-php

php: ## Build the PHP extension and install it into the system PHP (needs root)
	scripts/php-install.sh

python: ## Build the Python module and install it into the current python3
	scripts/py-install.sh

dist: ## Python packages in dist/python/: an sdist and an abi3 wheel (CPython 3.10 and later)
	scripts/dist-python.sh

php-dist: ## delayq.so per installed PHP in dist/php/<version>/, with an ini and install.sh, and a tarball each
	scripts/dist-php.sh

test: ## Run every test (each suite starts its own redis-server)
	scripts/test.sh

php-versions: ## Build the PHP extension for PHP 8.1, 8.3 and 8.4 and run PHPUnit on each, in chroots (root)
	scripts/php-versions.sh

redis-versions: ## Run the core's tests against Redis 6.0 and 8.0, in chroots (root)
	scripts/redis-versions.sh

soak: ## The long load test: 200 000 messages over 60 s, 8 producers, 8 handlers
	DELAYQ_SOAK_MESSAGES=200000 DELAYQ_SOAK_SECONDS=60 cargo test --release -p delayq --test soak -- --nocapture

SEEDS ?= 100..200
hunt: ## The random-operations model test on more seeds, longer (SEEDS=a..b, default 100..200)
	DELAYQ_MODEL_SEEDS=$(SEEDS) DELAYQ_MODEL_STEPS=1500 cargo test --release -p delayq --test model

bench: ## Benchmark delayq against the seed recipe on a private, pinned redis-server
	python3 bench/run.py

bench-cluster: ## One queue with 1 and 3 partitions on a 3-master cluster, next to one Redis
	python3 bench/cluster.py

bench-redis-cost: ## Redis time per drained message: delayq's scripts against the recipe's pop
	python3 bench/redis_cost.py

bench-script-cost: ## Redis time per message of claim.lua and ack.lua, from one client (DIRS=copies to compare; CALLGRIND=1: instructions)
	python3 bench/script_cost.py $(if $(CALLGRIND),--callgrind) $(DIRS)

bench-model-floor: ## Redis cost per message: the recipe's pop, the least issue 2's data model needs, delayq (CALLGRIND=1: instructions)
	python3 bench/model_floor.py $(if $(CALLGRIND),--callgrind) $(DIRS)

bench-rate-limit: ## How closely 4 pools follow a rate limit, and what holding them back costs Redis
	python3 bench/rate_limit.py

bench-priority: ## How long an urgent message waits behind 30k bulk ones: one queue, or two in priority order
	python3 bench/priority.py

bench-python-processes: ## Python messages/s on a CPU-bound handler with delayq worker --processes 1, 2, 4
	python3 bench/python_processes.py

bench-rss: ## Worker memory over a 10M-message PHP drain: a leak or a warm-up?
	python3 bench/rss_curve.py

bench-php-requests: ## A push per PHP-FPM request, with and without a persistent connection
	python3 bench/php_requests.py

bench-keep-completed: ## Drain rate and Redis memory with keep_completed 0 and 10 000
	python3 bench/keep_completed.py

bench-serial-keys: ## Drain rate of messages spread over 1, 10, 100 serial keys and none
	python3 bench/serial_keys.py

bench-groups: ## A claim's Redis time and drain rate with 10 000 groups; how long small groups wait behind a big one
	python3 bench/groups.py

lint: fmt clippy ## cargo fmt --check and clippy -D warnings

fmt: ## Check formatting
	cargo fmt --all -- --check

clippy: ## Lint the core and the bindings with warnings as errors
	cargo clippy --workspace --all-targets -- -D warnings

doc: ## Build the API docs
	cargo doc -p delayq --no-deps
