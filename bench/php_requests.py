"""What one push costs a PHP-FPM request, with and without a persistent connection.

A private redis-server pinned to CPU 0; `bench/php/requests.php` pinned to CPU 1 makes
its producer anew for each of 2000 "requests" (as PHP-FPM does) and pushes once: the
recipe's phpredis producer with `connect` and with `pconnect`, and `DelayQueue` without
and with `'persistent' => true`. Three runs each, in turns; writes
bench/results/<date>-php-requests.md.

    python3 bench/php_requests.py
"""

from __future__ import annotations

import datetime
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import run  # noqa: E402

VARIANTS = ["recipe", "recipe-pconnect", "delayq", "delayq-persistent"]
RUNS = 3


def main() -> None:
    redis = run.Redis()
    results: dict[str, list[float]] = {v: [] for v in VARIANTS}
    try:
        for _ in range(RUNS):
            for variant in VARIANTS:
                out = subprocess.run(
                    ["taskset", "-c", "1", "php", str(ROOT / "bench" / "php" / "requests.php"),
                     f"--variant={variant}", "--n=2000", f"--url={redis.url}"],
                    capture_output=True, text=True, check=True).stdout
                results[variant].append(json.loads(out.splitlines()[-1])["us_per_request"])
                redis.cli("FLUSHALL")
    finally:
        redis.stop()
    lines = [
        f"# A push per PHP-FPM request, {datetime.date.today()}",
        "",
        "Command: `make bench-php-requests` (`python3 bench/php_requests.py`). A private",
        "redis-server pinned to CPU 0, PHP pinned to CPU 1, loopback; each \"request\" makes",
        "its producer anew and pushes one message (the producer is dropped at its end, as",
        "PHP-FPM drops a request's objects). Microseconds per request, 2000 requests a run.",
        "",
        "| producer | run 1 | run 2 | run 3 | median |",
        "|---|---|---|---|---|",
    ]
    names = {
        "recipe": "recipe: phpredis `connect`, HSET + ZADD, `close`",
        "recipe-pconnect": "recipe: phpredis `pconnect`, HSET + ZADD",
        "delayq": "`new DelayQueue(...)`, `push`",
        "delayq-persistent": "`new DelayQueue(..., ['persistent' => true])`, `push`",
    }
    for variant in VARIANTS:
        values = results[variant]
        lines.append(f"| {names[variant]} | " + " | ".join(f"{v:.1f}" for v in values)
                     + f" | {statistics.median(values):.1f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    out = ROOT / "bench" / "results" / f"{datetime.date.today()}-php-requests.md"
    out.write_text(text)


if __name__ == "__main__":
    main()
