"""How fast messages drain when they share serial keys: the price of running one key's
messages one at a time.

A private redis-server pinned to CPU 0; N messages due at once, spread evenly over
K serial keys (K = 1, 10, 100, and no key at all); one Python worker process pinned to
CPU 1 with an asyncio handler that does nothing, `concurrency=8`. With one key the
drain is a chain: each message starts only once the one before it was acknowledged
(its acknowledgement frees the key and wakes the next in line), so its rate is the
round trip of one message. More keys run side by side. Reported: messages a second
over the whole drain, and the handler's start-to-start gap within one key (median).
Writes bench/results/<date>-serial-keys.md, or <date>-serial-keys-<label>.md with
`--label` (to keep a run of another build, e.g. one installed under PYTHONPATH).

    python3 bench/serial_keys.py [--label LABEL]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import run  # noqa: E402

N = 3000
KEYS = [1, 10, 100, None]
RUNS = 3

# The worker: drains the queue, then writes when each message started, by key.
WORKER = """
import json, sys, time, delayq
url, out = sys.argv[1], sys.argv[2]
starts = {}
async def handle(payload, msg):
    starts.setdefault(msg.serial_key or "", []).append(time.monotonic())
worker = delayq.Worker(delayq.DelayQueue(url, "serial"), concurrency=8, stop_when_empty=True)
began = time.monotonic()
summary = worker.run(handle)
with open(out, "w") as f:
    json.dump({"seconds": time.monotonic() - began, "acked": summary["acked"], "starts": starts}, f)
"""


def measure(keys: int | None) -> dict[str, float]:
    import delayq

    redis = run.Redis()
    try:
        q = delayq.DelayQueue(redis.url, "serial")
        for start in range(0, N, 1000):
            q.push_many([{"payload": {"n": i}, **({"serial_key": f"order:{i % keys}"} if keys else {})}
                         for i in range(start, min(start + 1000, N))])
        with tempfile.TemporaryDirectory() as tmp:
            out = f"{tmp}/out.json"
            done = subprocess.run(["taskset", "-c", "1", sys.executable, "-c", WORKER, redis.url, out], timeout=600)
            if done.returncode != 0:
                sys.exit(f"the worker failed with status {done.returncode}")
            got = json.loads(Path(out).read_text())
        if got["acked"] != N:
            sys.exit(f"{got['acked']} of {N} acknowledged: the run is void")
        gaps = [b - a for starts in got["starts"].values() for a, b in zip(starts, starts[1:])]
        return {"rate": N / got["seconds"], "gap_ms": statistics.median(gaps) * 1000}
    finally:
        redis.stop()


def command(label: str | None) -> str:
    path = os.environ.get("PYTHONPATH")
    return (f"PYTHONPATH={path} " if path else "") + "python3 bench/serial_keys.py" + (
        f" --label {label}" if label else "")


def label(keys: int | None) -> str:
    return "no serial key" if keys is None else f"{keys} key{'s' if keys > 1 else ''}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--label", help="kept in the file name and the heading: which build ran")
    args = parser.parse_args()
    results = run.in_turns(KEYS, measure, RUNS, label)
    day = datetime.date.today().isoformat()
    lines = [
        f"# Draining messages that share serial keys, {day}" + (f" ({args.label})" if args.label else ""),
        "",
        f"Command: `{command(args.label)}` (a private Redis pinned to CPU 0; one Python worker "
        f"process pinned to CPU 1, an asyncio handler that does nothing, `concurrency=8`; {N} messages due "
        f"at once, spread evenly over the keys; {RUNS} runs per row, in turns; medians of the runs, the "
        "range in brackets).",
        "",
        "| messages spread over | drain rate | start-to-start within one key, median |",
        "|---|---|---|",
    ]
    for keys, ms in results.items():
        lines.append(f"| {label(keys)} | {run.cell([m['rate'] for m in ms], ',.0f')} msg/s "
                     f"| {run.cell([m['gap_ms'] for m in ms], '.2f')} ms |")
    lines += [
        "",
        "With one key the drain is a chain: a message starts once the one before it was acknowledged,",
        "whose acknowledgement frees the key and makes the next in line due at once. Its rate is one",
        "message's round trip (acknowledgement, wake-up, claim, hand-out), not a lease or a poll.",
        "Without keys, the gap is between any two messages.",
    ]
    suffix = f"-{args.label}" if args.label else ""
    out = ROOT / "bench" / "results" / f"{day}-serial-keys{suffix}.md"
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
