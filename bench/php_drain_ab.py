"""`make bench`'s W2 drain from PHP (4 worker processes, a no-op handler, every message
checked for loss and duplicates) with two or more builds of the extension, in turns, so
that each build sees the machine in the same moods: to show what a change to the
binding gained. Each build is a delayq.so given by path; this machine's own delayq
ini is left out of the PHP runs, so only the given build is loaded.

With --orders=K every payload also holds a list of K orders (bench/get_payload.py's
shape), so that decoding it is part of what a worker does.

    python3 bench/php_drain_ab.py [--n=200000] [--rounds=5] [--orders=K] [--label=NAME] LABEL=PATH.so ...
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import run  # noqa: E402

sys.path.insert(0, str(ROOT / "tests"))
from phpcli import scan_dir_without_delayq as ini_dir_without_delayq  # noqa: E402


def drain_once(bench: run.Bench, n: int, orders: int) -> float:
    bench.fresh()
    with tempfile.TemporaryDirectory() as tmp:
        run.fill("delayq", f"--n={n}", f"--url={bench.redis.url}", f"--due-file={tmp}/due", f"--orders={orders}")
        records = Path(tmp) / "records"
        records.mkdir()
        start = time.time()
        proc = run.consume(bench.redis, "delayq", records)
        proc.wait(timeout=600)
        rows = run.read_records(records)
        lost, dups = run.verify(rows, n)
        if lost or dups:
            sys.exit(f"{lost} lost and {dups} run twice: the run is void")
        return n / (max(at for _, at in rows) - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("builds", nargs="+", help="LABEL=path/to/delayq.so")
    parser.add_argument("--n", type=int, default=200000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--orders", type=int, default=0)
    parser.add_argument("--label", default="php-drain-ab")
    opts = parser.parse_args()
    builds = run.builds_given(parser, opts.builds)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["PHP_INI_SCAN_DIR"] = str(ini_dir_without_delayq(Path(tmp) / "conf.d"))
        # Else every run would load the machine's own build beside the given one.
        if subprocess.run(["php", "-r", 'exit(extension_loaded("delayq") ? 0 : 1);']).returncode == 0:
            sys.exit("php loads delayq outside its scan directory (php.ini?): leave it out there first")
        bench = run.Bench(quick=False)
        try:
            def measure(label: str) -> dict[str, float]:
                os.environ["DELAYQ_EXTENSION"] = str(Path(builds[label]).resolve())
                return {"rate": drain_once(bench, opts.n, opts.orders)}
            runs = run.in_turns(builds, measure, opts.rounds)
        finally:
            bench.redis.stop()
    lines = [
        f"# W2 drain from PHP with {len(builds)} builds of the extension, in turns, {time.strftime('%Y-%m-%d')}",
        "",
        f"Command: `python3 bench/php_drain_ab.py --n={opts.n} --rounds={opts.rounds} --orders={opts.orders} "
        + " ".join(f"{label}=…" for label in builds)
        + "` (4 PHP worker processes, a no-op handler, as `make bench`'s W2; medians, range in brackets).",
        "",
        *run.rate_rows(runs),
    ]
    run.write_results(f"-{opts.label}", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
