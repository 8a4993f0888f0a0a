"""arq side of bench/run.py, with the same protocol as bench/php/*.php:

    python3 arq_bench.py push --mode=single --n=N --url=redis://host:port
    python3 arq_bench.py fill --n=N --url=... [--spread=10] --due-file=F
    python3 arq_bench.py consume --url=... --records=DIR [--until-empty] [--sleep-ms=0]

Jobs are deferred with `_defer_by`; `consume` runs four arq worker processes polling every 10 ms (`poll_delay`, arq's default is 0.5 s) with
results not kept. arq has no bulk enqueue, so it has no W1b figure.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from arq import create_pool
from arq.connections import RedisSettings
from arq.worker import Worker, func


def parse(argv: list[str]) -> dict[str, str]:
    out = {}
    for a in argv:
        k, _, v = a.removeprefix("--").partition("=")
        out[k] = v or "1"
    return out


def settings(url: str) -> RedisSettings:
    return RedisSettings.from_dsn(url)


async def push(a: dict[str, str]) -> None:
    pool = await create_pool(settings(a["url"]))
    n = int(a["n"])
    start = time.perf_counter()
    for i in range(n):
        await pool.enqueue_job("handle", {"order_id": i, "action": "close"}, _defer_by=timedelta(seconds=60))
    rate = n / (time.perf_counter() - start)
    stored = await pool.zcard("arq:queue")
    await pool.aclose()
    print(json.dumps({"rate": rate, "stored": stored}))


async def fill(a: dict[str, str]) -> None:
    pool = await create_pool(settings(a["url"]))
    n, spread = int(a["n"]), float(a.get("spread", "0"))
    lines = []
    for i in range(n):
        delay = spread * i / n
        # arq computes the score the same way, on the same clock, in the call below.
        lines.append(f"{i} {time.time() + delay}")
        await pool.enqueue_job("handle", {"order_id": i, "action": "close"}, _defer_by=timedelta(seconds=delay))
    Path(a["due-file"]).write_text("\n".join(lines))
    await pool.set("bench:filled", "1")
    await pool.aclose()


def consume(a: dict[str, str]) -> None:
    logging.basicConfig(level=logging.WARNING)
    seen: list[str] = []
    sleep_ms = float(a.get("sleep-ms", "0"))
    path = Path(a["records"]) / str(os.getpid())

    async def handle(ctx: dict[str, Any], payload: dict[str, Any]) -> None:
        if sleep_ms:
            await asyncio.sleep(sleep_ms / 1000)
        line = f"{payload['order_id']} {time.time()}"
        if sleep_ms:
            with path.open("a") as f:
                f.write(line + "\n")
        else:
            seen.append(line)

    async def main() -> None:
        pool = await create_pool(settings(a["url"]))
        worker = Worker(functions=[func(handle, name="handle")], redis_pool=pool, poll_delay=0.01, keep_result=0,
                        handle_signals=False, max_jobs=10)
        task = asyncio.ensure_future(worker.async_run())
        stopping = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
        if "until-empty" in a:
            # A job leaves arq's queue only once it has finished.
            while not (await pool.exists("bench:filled") and await pool.zcard("arq:queue") == 0):
                await asyncio.sleep(0.05)
        else:
            await stopping.wait()
        await worker.close()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(main())
    if seen:
        path.write_text("\n".join(seen))


def consume_in_processes(argv: list[str], processes: int = 4) -> None:
    """Four worker processes, as the other systems run; SIGTERM stops them all."""
    children = [subprocess.Popen([sys.executable, __file__, "consume-one", *argv]) for _ in range(processes)]
    signal.signal(signal.SIGTERM, lambda *_: [c.terminate() for c in children])
    for c in children:
        c.wait()


if __name__ == "__main__":
    command, args = sys.argv[1], parse(sys.argv[2:])
    if command == "consume":
        consume_in_processes(sys.argv[2:])
    elif command == "consume-one":
        consume(args)
    else:
        asyncio.run({"push": push, "fill": fill}[command](args))
