"""Close orders from Python: a worker pool that stops gracefully on Ctrl-C / SIGTERM.

    python worker.py [--until-empty]  (REDIS_URL defaults to redis://127.0.0.1:6379)
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

import delayq


def close_order(order_id: int) -> None:
    """Your business logic; keep it idempotent, since a message can run again after a crash."""


def main() -> None:
    queue = delayq.DelayQueue(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379"), "orders")
    lateness: list[float] = []

    with delayq.Worker(queue, threads=2, max_attempts=5, backoff_base=0.1, timeout=30.0) as worker:

        def handle(order: dict[str, Any], msg: delayq.Message) -> None:
            close_order(order["order_id"])
            lateness.append((time.time() - msg.due_at) * 1000)

        if "--until-empty" in sys.argv:

            def stop_when_empty() -> None:
                while True:
                    time.sleep(0.5)
                    s = queue.stats()
                    if s["scheduled"] + s["ready"] + s["inflight"] == 0:
                        worker.stop()
                        return

            threading.Thread(target=stop_when_empty, daemon=True).start()
        summary = worker.run(handle)

    lateness.sort()
    if lateness:
        p99 = lateness[int(len(lateness) * 0.99) - 1 if len(lateness) >= 100 else -1]
        print(f"closed {len(lateness)} orders; lateness p50 {lateness[len(lateness) // 2]:.1f} ms, p99 {p99:.1f} ms")
    print(f"stopped by {summary['stopped_by']}: {summary['acked']} acked, {summary['retried']} retried")


if __name__ == "__main__":
    main()
