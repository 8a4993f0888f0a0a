#!/usr/bin/env bash
# Builds the Python package for distribution into dist/python/: an sdist (the Rust
# sources of the module and of the core it needs; pip builds it with a Rust toolchain)
# and an abi3 wheel (one file for every CPython from 3.10 on; pip installs it with no
# toolchain at all). Shares maturin's build cache with scripts/py-install.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v maturin >/dev/null || { echo "maturin missing: run scripts/setup.sh first (or pip install maturin)" >&2; exit 1; }
rm -f dist/python/delayq-*.whl dist/python/delayq-*.tar.gz
mkdir -p dist/python
(cd py-ext && maturin sdist -o ../dist/python)
(cd py-ext && maturin build -q --release --target-dir ../target/py -o ../dist/python)
wheel=$(ls dist/python/delayq-*.whl)
case "$wheel" in
  *-abi3-*) ;;
  *) echo "$wheel is not an abi3 wheel: py-ext/pyproject.toml lost pyo3's abi3 feature" >&2; exit 1 ;;
esac
echo "== dist/python: $(cd dist/python && ls delayq-*)"
