#!/usr/bin/env bash
# Builds the Python module (abi3 wheel, CPython >= 3.10) and installs it into the
# current python3, so `python3 -c 'import delayq'` works. `pip install ./py-ext` does
# the same through PEP 517; this keeps maturin's build cache in target/py.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -f target/wheels/delayq-*.whl
(cd py-ext && maturin build -q --release --target-dir ../target/py -o ../target/wheels)
python3 -m pip install -q --disable-pip-version-check --force-reinstall --no-deps target/wheels/delayq-*.whl
python3 -c 'import delayq; print("== Python module installed: delayq", delayq.__version__, "at", delayq.__file__)'
