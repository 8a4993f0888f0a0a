"""`make bench`'s W2 drain of the core alone (core/examples/drain.rs: 4 threads, a no-op
handler, no binding) with two or more builds of that example, in turns, so that each
build sees the machine in the same moods: to show what a change to the core or its
scripts gained without PHP or Python around it. Build an older commit's example with
`CARGO_TARGET_DIR=/tmp/old cargo build --release -p delayq --example drain` in a worktree
of it; this tree's is target/release/examples/drain.

    python3 bench/core_drain_ab.py [--n=200000] [--rounds=5] [--label=NAME] LABEL=PATH ...
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import run  # noqa: E402


def drain_once(bench: run.Bench, binary: str, n: int) -> float:
    bench.fresh()
    out = subprocess.run(["taskset", "-c", "1", binary, bench.redis.url, str(n)], capture_output=True, text=True,
                         check=True).stdout
    result = json.loads(out)
    if result["acked"] != n or result["left"] != 0:
        sys.exit(f"{binary}: {result}: the run is void")
    return float(result["rate"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("builds", nargs="+", help="LABEL=path/to/examples/drain")
    parser.add_argument("--n", type=int, default=200000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--label", default="core-drain-ab")
    opts = parser.parse_args()
    builds = run.builds_given(parser, opts.builds)
    bench = run.Bench(quick=False)
    try:
        runs = run.in_turns(builds, lambda label: {"rate": drain_once(bench, builds[label], opts.n)}, opts.rounds)
    finally:
        bench.redis.stop()
    lines = [
        f"# W2 drain of the core alone with {len(builds)} builds, in turns, {time.strftime('%Y-%m-%d')}",
        "",
        f"Command: `python3 bench/core_drain_ab.py --n={opts.n} --rounds={opts.rounds} "
        + " ".join(f"{label}=…" for label in builds)
        + "` (core/examples/drain.rs, 4 threads, a no-op handler, as `make bench`'s W2 \"rust\" row; "
        "Redis pinned to CPU 0, the example to CPU 1; medians, range in brackets).",
        "",
        *run.rate_rows(runs),
    ]
    run.write_results(f"-{opts.label}", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
