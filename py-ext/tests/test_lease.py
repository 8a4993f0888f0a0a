"""The edges of a lease, with worker processes: a pool frozen past its lease starts none
of what it prefetched, and a message that kills its worker takes no other message with
it when the worker is started again after each death."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import delayq
import pytest
from harness import HERE, drained, wait_for


@pytest.fixture
def log() -> Iterator[str]:
    with tempfile.TemporaryDirectory() as d:
        yield os.path.join(d, "runs")


def start_worker(url: str, log: str, **options: object) -> subprocess.Popen[bytes]:
    script = os.path.join(HERE, "lease_worker.py")
    return subprocess.Popen([sys.executable, script, url, "jobs", log, json.dumps(options)])


def runs(log: str) -> list[tuple[int, int, int, float]]:
    try:
        with open(log) as f:
            lines = [line.split() for line in f if line.strip()]
    except FileNotFoundError:
        return []
    return [(int(n), int(attempt), int(pid), float(start)) for n, attempt, pid, start in lines]


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.terminate()
    for p in procs:
        p.wait(timeout=20)


@pytest.mark.parametrize("concurrency", [None, 4], ids=["sync", "asyncio-4"])
def test_a_pool_frozen_past_its_lease_starts_none_of_its_prefetched_deliveries(
    queue: delayq.DelayQueue, redis_url: str, log: str, concurrency: int | None
) -> None:
    queue.push_many([{"payload": {"n": n}} for n in range(3000)])
    options: dict[str, object] = {"lease": 1.0, "batch": 20, "prefetch": 20, "_sleep": 0.002}
    if concurrency:
        # Received on a thread, started when the event loop gets to the task: a freeze
        # between the two must not start it either.
        options.update(concurrency=concurrency, _async=True)
    frozen = start_worker(redis_url, log, **options)
    procs = [frozen]
    try:
        wait_for(20, "a full prefetch", lambda: len(runs(log)) >= 100 and queue.stats()["inflight"] >= 10)
        # A VM pause or a long GC: longer than the lease, while another pool goes on.
        frozen.send_signal(signal.SIGSTOP)
        procs.append(start_worker(redis_url, log, **options))
        time.sleep(3)
        resumed = time.time()
        frozen.send_signal(signal.SIGCONT)
        wait_for(60, "the queue to drain", lambda: drained(queue))
    finally:
        stop_all(procs)
    all_runs = runs(log)
    elsewhere = {n for n, _, pid, _ in all_runs if pid != frozen.pid}
    assert elsewhere, "the other pool ran messages"
    twice = [n for n, _, pid, start in all_runs if pid == frozen.pid and start >= resumed and n in elsewhere]
    assert twice == [], "started by the frozen pool after their lease passed to the other"
    assert len({n for n, *_ in all_runs}) == 3000, "every message ran"


@pytest.mark.parametrize("concurrency", [None, 4], ids=["sync", "asyncio-4"])
def test_a_poison_message_takes_no_other_with_it_when_its_worker_is_restarted(
    queue: delayq.DelayQueue, redis_url: str, log: str, concurrency: int | None
) -> None:
    queue.push_many([{"payload": {"n": n, "kill": n == 7}, "id": f"m{n}"} for n in range(31)])
    options: dict[str, object] = {"lease": 1.0, "max_attempts": 3, "_sleep": 0.02}
    if concurrency:
        # Handlers of one process run side by side: those beside the poison when it
        # kills the process come back uncharged too.
        options.update(concurrency=concurrency, _async=True)
    # Started again after each death, as systemd or supervisord would.
    deadline = time.monotonic() + 90
    proc = start_worker(redis_url, log, **options)
    procs, starts = [proc], 1
    try:
        while not drained(queue):
            assert time.monotonic() < deadline, f"not drained after {starts} starts"
            if proc.poll() is not None:
                proc = start_worker(redis_url, log, **options)
                procs.append(proc)
                starts += 1
            time.sleep(0.02)
    finally:
        stop_all(procs)
    assert [d["id"] for d in queue.dead_letters()] == ["m7"], "the poison alone is buried"
    first: dict[int, int] = {}
    for n, attempt, _, _ in runs(log):
        first.setdefault(n, attempt)
    others = {n: a for n, a in first.items() if n != 7}
    assert len(others) == 30, "every other message ran"
    assert others == {n: 1 for n in others}, "each other first ran as attempt 1"
    assert queue.stats()["acked"] == 30


def stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def test_an_asyncio_pool_frozen_between_a_tasks_steps_starts_no_delivery_whose_lease_ended(
    queue: delayq.DelayQueue, redis_url: str, log: str
) -> None:
    # With a timeout, a coroutine handler runs in a task of its own: a freeze between the
    # worker's step that takes the next delivery and the step that starts its handler.
    queue.push({"n": 0, "freeze": True})
    options: dict[str, object] = {"lease": 1.0, "timeout": 30.0, "concurrency": 2, "_async": True, "_sleep": 0.002}
    frozen = start_worker(redis_url, log, _freeze=True, **options)
    procs = [frozen]
    try:
        wait_for(20, "the freezing handler to start", lambda: len(runs(log)) == 1)
        # Pushed now, so that the freezing handler sees its task created.
        queue.push({"n": 1})
        wait_for(20, "the pool to stop itself", lambda: stopped(frozen.pid))
        procs.append(start_worker(redis_url, log, **options))
        wait_for(20, "the other pool to run both", lambda: {n for n, _, pid, _ in runs(log) if pid != frozen.pid} == {0, 1})
        resumed = time.time()
        frozen.send_signal(signal.SIGCONT)
        wait_for(20, "the queue to drain", lambda: drained(queue))
        # Time for a delivery started late to show in the log.
        time.sleep(0.5)
    finally:
        stop_all(procs)
    late = [n for n, _, pid, start in runs(log) if pid == frozen.pid and start >= resumed]
    assert late == [], "started by the frozen pool after its lease passed to the other"
