"""Schedule "close this unpaid order" jobs from Python (PHP workers can run them too).

    python producer.py [count]      (REDIS_URL defaults to redis://127.0.0.1:6379)
"""

from __future__ import annotations

import os
import sys

import delayq


def main() -> None:
    queue = delayq.DelayQueue(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379"), "orders")
    # Close order 10086 in 30 minutes unless it is paid; the id makes a retried request harmless.
    msg_id = queue.push({"order_id": 10086, "action": "close"}, delay=30 * 60, id="close-order-10086")
    print(f"scheduled order 10086 to close in 30 minutes as {msg_id}")
    queue.cancel(msg_id)  # paid after all

    count = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    queue.push_many(({"order_id": 20000 + i, "action": "close"}, 1.0 + 2.0 * i / count) for i in range(count))
    stats = queue.stats()
    print(f"scheduled {count} orders due in 1 to 3 s; {stats['scheduled']} scheduled, {stats['ready']} ready")


if __name__ == "__main__":
    main()
