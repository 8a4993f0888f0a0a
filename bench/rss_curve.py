"""Worker memory over a long drain: is W6's "RSS growth" a leak or a warm-up?

W6 (bench/run.py) reports growth from the first to the last sample of a 1M-message
drain, which includes the pools' warm-up (buffers and maps reaching their working
size). This drains more messages through the same consumer (bench/php/consume.php, 4
processes; or bench/python) and prints the summed resident memory every few seconds:
a leak grows in step with the messages, a warm-up flattens out. Writes
bench/results/<date>-rss-<system>.md and prints it.

    python3 bench/rss_curve.py [--system delayq|python|seed] [--n 10000000]
"""

from __future__ import annotations

import argparse
import datetime
import time

import run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--system", default="delayq", choices=run.SYSTEMS)
    parser.add_argument("--n", type=int, default=10_000_000)
    opts = parser.parse_args()
    bench = run.Bench(quick=False)
    try:
        with run.filled(bench, opts.system, opts.n) as records:
            proc = run.consume(bench.redis, opts.system, records, True, "--stream-records")
            start = time.time()
            samples: list[tuple[float, int, int]] = []
            while proc.poll() is None:
                time.sleep(0.5)
                count, kib = run.tree_rss_kib(proc.pid)
                samples.append((time.time() - start, count, kib))
            lost, dups = run.verify(run.read_records(records), opts.n)
    finally:
        bench.redis.stop()
    # Only samples with every process up (not the start-up and the wind-down).
    full = max(c for _, c, _ in samples)
    settled = [(t, kib) for t, c, kib in samples if c == full]
    step = max(1, len(settled) // 20)
    shown = settled[::step] + ([settled[-1]] if (len(settled) - 1) % step else [])
    lines = [
        f"# Worker RSS over a drain, {datetime.date.today().isoformat()}",
        "",
        f"Command: `python3 bench/rss_curve.py --system {opts.system} --n {opts.n}`: {opts.n:,} due messages",
        f"drained by {run.LABEL[opts.system]} (4 processes, Redis pinned to CPU 0, clients to CPU 1),",
        f"resident memory summed over the worker processes. Lost {lost}, duplicated {dups}.",
        "",
        "| seconds into the drain | RSS (MiB) |",
        "|---|---|",
        *[f"| {t:.1f} | {kib / 1024:.1f} |" for t, kib in shown],
        "",
    ]
    run.write_results(f"-rss-{opts.system}", "\n".join(lines))


if __name__ == "__main__":
    main()
