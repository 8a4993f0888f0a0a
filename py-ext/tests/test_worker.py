from __future__ import annotations

import asyncio
import atexit
import datetime
import functools
import json
import os
import signal
import subprocess
import sys
import logging
import threading
import time
from collections import Counter
from typing import Any

import pytest

import delayq
from harness import HERE, drained, wait_for


def fill(q: delayq.DelayQueue, n: int, extra: dict[int, dict[str, Any]] | None = None) -> None:
    q.push_many([{"payload": {"n": i, **(extra or {}).get(i, {})}} for i in range(n)])


def handled(log: str) -> list[tuple[int, int, int]]:
    try:
        with open(log) as f:
            return [tuple(int(x) for x in line.split()) for line in f if line.strip()]  # type: ignore[misc]
    except FileNotFoundError:
        return []


def start_worker(url: str, log: str, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, os.path.join(HERE, "worker_process.py"), url, "jobs", log, *extra])


def assert_all_handled(log: str, n: int, max_duplicates: int) -> None:
    counts = Counter(h[0] for h in handled(log))
    assert sorted(set(range(n)) - set(counts)) == [], "lost messages"
    duplicates = sum(counts.values()) - len(counts)
    assert duplicates <= max_duplicates, f"{duplicates} duplicates"


def test_failures_retry_with_backoff_then_dead_letter(queue: delayq.DelayQueue) -> None:
    bad = queue.push({"bad": True})
    good = queue.push({"bad": False})
    attempts: list[int] = []
    worker = delayq.Worker(queue, max_attempts=3, backoff_base=0.05, backoff_max=0.2)

    def handle(payload: dict[str, bool], msg: delayq.Message) -> None:
        assert time.time() + 0.002 >= msg.due_at, "never early"
        assert msg.queue == "jobs"
        if payload["bad"]:
            attempts.append(msg.attempt)
            if msg.attempt == 3:
                worker.stop()
            raise LookupError(f"cannot close order (attempt {msg.attempt})")

    summary = worker.run(handle)
    assert attempts == [1, 2, 3]
    assert {k: summary[k] for k in ("handled", "acked", "failed", "retried", "dead")} == {
        "handled": 4, "acked": 1, "failed": 3, "retried": 2, "dead": 1}
    assert summary["stopped_by"] == "stop"
    info = queue.get(bad)
    assert info is not None and info["state"] == "dead" and info["attempts"] == 3
    assert info["last_error"].startswith("LookupError: cannot close order (attempt 3)")
    assert queue.get(good) is None
    [dead] = queue.dead_letters()
    assert dead["payload"] == {"bad": True}
    assert queue.requeue_dead() == 1


def close_order(payload: dict[str, int]) -> None:
    try:
        raise ConnectionError("MySQL server has gone away")
    except ConnectionError as e:
        raise RuntimeError(f"cannot close order {payload['order']}") from e


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_failure_keeps_its_traceback_with_the_chained_cause(queue: delayq.DelayQueue, kind: str) -> None:
    id = queue.push({"order": 10086})

    def handle(payload: dict[str, int], msg: delayq.Message) -> None:
        close_order(payload)

    async def handle_async(payload: dict[str, int], msg: delayq.Message) -> None:
        await asyncio.sleep(0)
        close_order(payload)

    worker = delayq.Worker(queue, max_attempts=1, stop_when_empty=True)
    worker.run(handle if kind == "sync" else handle_async)
    info = queue.get(id)
    assert info is not None and info["state"] == "dead"
    assert info["last_error"] == "RuntimeError: cannot close order 10086"
    trace = info["error_trace"]
    assert trace.startswith("Traceback (most recent call last):\n"), trace
    assert "ConnectionError: MySQL server has gone away" in trace
    assert "The above exception was the direct cause of the following exception" in trace
    assert f'File "{__file__}"' in trace and "in close_order" in trace
    assert ("in handle\n" if kind == "sync" else "in handle_async\n") in trace
    assert trace.endswith("RuntimeError: cannot close order 10086\n"), trace
    [dead] = queue.dead_letters()
    assert dead["error_trace"] == trace
    assert queue.get(queue.push({"order": 1}))["error_trace"] is None  # type: ignore[index]


def test_a_long_traceback_is_cut_to_max_trace_bytes_and_zero_keeps_none(queue: delayq.DelayQueue) -> None:
    def deep(n: int) -> None:
        if n == 0:
            raise ValueError("bottom of the stack")
        deep(n - 1)

    for max_bytes in (400, 0):
        id = queue.push({"max": max_bytes})
        delayq.Worker(queue, max_attempts=1, stop_when_empty=True, max_trace_bytes=max_bytes).run(
            lambda payload, msg: deep(50))
        info = queue.get(id)
        assert info is not None and info["last_error"] == "ValueError: bottom of the stack"
        if max_bytes:
            trace = info["error_trace"]
            assert len(trace.encode()) <= max_bytes
            assert trace.startswith("Traceback (most recent call last):\n")
            assert "bytes left out" in trace
            assert trace.endswith("ValueError: bottom of the stack\n")
        else:
            assert info["error_trace"] is None


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_no_retry_classes_go_to_the_dead_letters_at_once(queue: delayq.DelayQueue, kind: str) -> None:
    invalid = queue.push({"kind": "invalid"})
    flaky = queue.push({"kind": "flaky"})
    calls: list[str] = []

    def handle(payload: dict[str, str], msg: delayq.Message) -> None:
        calls.append(payload["kind"])
        if msg.attempt == 3:
            worker.stop()  # the last attempt of the other one: every failure is in
        if payload["kind"] == "invalid":
            raise KeyError("customer")  # a LookupError
        raise TimeoutError("gateway")

    async def handle_async(payload: dict[str, str], msg: delayq.Message) -> None:
        handle(payload, msg)

    worker = delayq.Worker(queue, max_attempts=3, backoff_base=0.01, backoff_max=0.01,
                           no_retry=[LookupError, UnicodeError])
    summary = worker.run(handle if kind == "sync" else handle_async)
    assert calls.count("invalid") == 1, "not retried"
    assert calls.count("flaky") == 3, "retried as usual"
    assert summary["dead"] == 2
    info = queue.get(invalid)
    assert info is not None and (info["state"], info["attempts"]) == ("dead", 1)
    assert info["last_error"] == "KeyError: 'customer'"
    assert info["error_trace"].endswith("KeyError: 'customer'\n")
    assert "gave up after 3 attempts" in queue.get(flaky)["last_error"]  # type: ignore[index]


@pytest.mark.parametrize("bad", [["ValueError"], [ValueError()], [int]])
def test_no_retry_takes_exception_classes_only(queue: delayq.DelayQueue, bad: list[Any]) -> None:
    with pytest.raises(TypeError, match="no_retry must hold exception classes"):
        delayq.Worker(queue, no_retry=bad)


def test_a_payload_past_max_payload_bytes_is_dead_lettered_unread(queue: delayq.DelayQueue) -> None:
    small = queue.push({"order": 1})
    big = queue.push({"blob": "x" * 10_000})
    seen: list[str] = []
    summary = delayq.Worker(queue, stop_when_empty=True, max_payload_bytes=1000).run(
        lambda payload, msg: seen.append(msg.id))
    assert seen == [small], "the handler never got the big one"
    assert (summary["handled"], summary["failed"]) == (1, 0)
    [dead] = queue.dead_letters()
    assert dead["id"] == big
    assert dead["last_error"].endswith("bytes is past this worker's max_payload_bytes (1000): not loaded")
    # The default bound hands it out.
    queue.requeue_dead(big)
    delayq.Worker(queue, stop_when_empty=True).run(lambda payload, msg: seen.append(msg.id))
    assert seen == [small, big]


@pytest.mark.parametrize("bad", [0, 512 * 1024 * 1024 + 1])
def test_a_bad_max_payload_bytes_is_refused_by_name(queue: delayq.DelayQueue, bad: int) -> None:
    with pytest.raises(delayq.InvalidArgumentError, match="max_payload_bytes"):
        delayq.Worker(queue, max_payload_bytes=bad)


@pytest.mark.parametrize("bad", [-1, 1048577])
def test_a_bad_max_trace_bytes_is_refused_by_name(queue: delayq.DelayQueue, bad: int) -> None:
    with pytest.raises(delayq.InvalidArgumentError, match="max_trace_bytes"):
        delayq.Worker(queue, max_trace_bytes=bad)


def test_dead_letters_are_deleted_one_or_all_and_nothing_else_is_touched(queue: delayq.DelayQueue) -> None:
    doomed = [queue.push({"doomed": i}, max_attempts=1) for i in range(3)]
    waiting = queue.push({"later": True}, delay=3600)
    worker = delayq.Worker(queue)
    calls = []

    # Failures are written before run() returns, so all three are dead by then.
    def fail(payload: Any, msg: delayq.Message) -> None:
        calls.append(msg.id)
        if len(calls) == 3:
            worker.stop()
        raise RuntimeError("boom")

    worker.run(fail)
    assert queue.stats()["dead"] == 3
    assert queue.delete_dead(doomed[1]) == 1
    assert queue.get(doomed[1]) is None, "gone, payload and all"
    assert queue.delete_dead(doomed[1]) == 0
    assert queue.delete_dead(waiting) == 0, "not a dead letter"
    with pytest.raises(delayq.InvalidArgumentError, match="id"):
        queue.delete_dead("")
    assert queue.delete_dead() == 2
    s = queue.stats()
    assert (s["dead"], s["scheduled"], s["discarded"]) == (0, 1, 3)
    info = queue.get(waiting)
    assert info is not None and info["state"] == "scheduled"


def test_a_handler_decides_when_to_retry_or_to_give_up(queue: delayq.DelayQueue) -> None:
    later = queue.push({"kind": "later"})
    hopeless = queue.push({"kind": "hopeless"})
    raised = queue.push({"kind": "raised"})
    handled: list[tuple[str, int, float]] = []
    misuse: list[str] = []
    # A backoff of at least 15 s: a retry within seconds can only be retry_later's.
    worker = delayq.Worker(queue, max_attempts=5, backoff_base=30.0, backoff_max=60.0)

    def handle(payload: dict[str, str], msg: delayq.Message) -> None:
        kind = payload["kind"]
        handled.append((kind, msg.attempt, time.time()))
        if kind == "later":
            if msg.attempt == 1:
                with pytest.raises(delayq.InvalidArgumentError, match="delay"):
                    msg.retry_later(-1.0)
                msg.retry_later(0.3, "rate limited")
                with pytest.raises(delayq.InvalidArgumentError, match="already"):
                    msg.dead_letter()
                misuse.append("refused")
            else:
                worker.stop()
        elif kind == "hopeless":
            msg.dead_letter("order 42 no longer exists")  # and returns: not an ack
        else:
            msg.retry_later(3600)
            raise RuntimeError("boom")  # the decision wins over the exception

    summary = worker.run(handle)
    assert misuse == ["refused"]
    tries = [(a, t) for k, a, t in handled if k == "later"]
    assert [a for a, _ in tries] == [1, 2]
    assert tries[1][1] - tries[0][1] >= 0.3 - 0.002
    assert tries[1][1] - tries[0][1] < 10, "its own delay, not the worker's backoff"
    assert {k: summary[k] for k in ("acked", "failed", "retried", "dead")} == {
        "acked": 1, "failed": 3, "retried": 2, "dead": 1}

    info = queue.get(hopeless)
    assert info is not None
    assert (info["state"], info["attempts"], info["last_error"]) == ("dead", 1, "order 42 no longer exists")
    info = queue.get(raised)
    assert info is not None
    assert (info["state"], info["attempts"], info["last_error"]) == (
        "scheduled", 1, "retry requested by the handler")
    assert 3590 < info["due_at"] - time.time() <= 3600
    assert queue.get(later) is None


def test_a_running_pool_is_listed_with_its_counters(queue: delayq.DelayQueue) -> None:
    fill(queue, 3)
    seen: list[list[dict[str, Any]]] = []
    worker = delayq.Worker(queue, lease=0.6)  # renewed every 0.2 s

    def handle(payload: dict[str, int], msg: delayq.Message) -> None:
        if payload["n"] == 2:
            wait_for(5, "a renewal that counts two handled", lambda: queue.workers()[0]["handled"] >= 2)
            seen.append(queue.workers())
            worker.stop()

    worker.run(handle)
    [[pool]] = seen
    assert pool["pid"] == os.getpid() and pool["handlers"] == 1
    assert pool["holding"] >= 1, "the running delivery"
    assert {"started_recently", "lateness_avg", "lateness_max", "handler_avg"} <= set(pool)
    if pool["started_recently"]:
        assert 0 <= pool["lateness_avg"] <= pool["lateness_max"] < 5
    assert queue.workers() == [], "a stopped pool leaves the list"


def test_retry_later_past_max_attempts_and_from_an_async_handler(queue: delayq.DelayQueue) -> None:
    once = queue.push({"n": 1}, max_attempts=1)
    worker = delayq.Worker(queue)

    async def handle(payload: dict[str, int], msg: delayq.Message) -> None:
        msg.retry_later(0.1, "still busy")
        worker.stop()

    worker.run(handle)
    info = queue.get(once)
    assert info is not None
    assert (info["state"], info["last_error"]) == ("dead", "still busy")


def test_stop_from_another_thread_and_context_manager(queue: delayq.DelayQueue) -> None:
    fill(queue, 50)
    seen: list[int] = []
    with delayq.Worker(queue) as worker:
        threading.Timer(5, worker.stop).start()  # a safety net; the handler stops it first

        def handle(payload: dict[str, int], msg: delayq.Message) -> None:
            seen.append(payload["n"])
            if len(seen) == 50:
                threading.Thread(target=worker.stop).start()

        summary = worker.run(handle)
    assert sorted(seen) == list(range(50))
    assert summary["acked"] == 50 and drained(queue)


def test_async_handlers_run_concurrently(queue: delayq.DelayQueue) -> None:
    fill(queue, 40)
    seen: list[int] = []
    running = 0
    peak = 0
    worker = delayq.Worker(queue, concurrency=8)

    async def handle(payload: dict[str, int], msg: delayq.Message) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.05)
        running -= 1
        if payload["n"] == 7:
            raise ValueError("seven")
        seen.append(payload["n"])
        if len(seen) == 39:
            worker.stop()

    summary = worker.run(handle)
    assert sorted(seen) == [n for n in range(40) if n != 7]
    assert peak > 1, "handlers overlapped"
    assert summary["acked"] == 39 and summary["failed"] >= 1
    assert summary["stopped_by"] == "stop"
    assert queue.stats()["inflight"] == 0


def test_messages_sharing_a_serial_key_never_run_at_once(queue: delayq.DelayQueue) -> None:
    # Every other message belongs to order 10086; the rest to no key. A lease far
    # longer than the run: waiting out a lease would not finish in time.
    queue.push_many([{"payload": {"n": n}, "delay": n / 1000, **({"serial_key": "order:10086"} if n % 2 == 0 else {})}
                     for n in range(16)])
    assert queue.waiting(1)[0]["serial_key"] == "order:10086"
    spans: list[tuple[int, float, float]] = []
    running, peak, held = 0, 0, 0
    worker = delayq.Worker(queue, concurrency=4, lease=60, stop_when_empty=True)

    async def handle(payload: dict[str, int], msg: delayq.Message) -> None:
        nonlocal running, peak, held
        running += 1
        peak = max(peak, running)
        started = time.monotonic()
        await asyncio.sleep(0.03)
        if msg.serial_key is not None:
            # Idle handlers meanwhile claimed the key's next message, which waits.
            held = max(held, queue.stats()["held"])
        running -= 1
        spans.append((payload["n"], started, time.monotonic()))

    done = threading.Timer(30, worker.stop)
    done.start()
    try:
        summary = worker.run(handle)
    finally:
        done.cancel()
    assert summary["acked"] == 16 and summary["stopped_by"] == "empty", summary
    mine = sorted((s for s in spans if s[0] % 2 == 0), key=lambda s: s[1])
    assert [s[0] for s in mine] == list(range(0, 16, 2)), "in due order"
    for earlier, later in zip(mine, mine[1:]):
        assert earlier[2] <= later[1], f"{later[0]} started before {earlier[0]} ended"
    assert peak > 1, "the other messages ran beside them"
    assert held >= 1, "stats() showed a message held for its key"
    assert queue.stats()["held"] == 0


def test_the_handler_sees_its_messages_serial_key(queue: delayq.DelayQueue) -> None:
    queue.push_many([{"payload": "keyed", "serial_key": "order:10086"}, {"payload": "plain"}])
    keys: dict[str, str | None] = {}

    def handle(payload: str, msg: delayq.Message) -> None:
        keys[payload] = msg.serial_key

    summary = delayq.Worker(queue, stop_when_empty=True).run(handle)
    assert keys == {"keyed": "order:10086", "plain": None}
    assert summary["acked"] == 2


def test_an_ack_does_not_wait_for_a_receive_in_progress(queue: delayq.DelayQueue) -> None:
    # The asyncio runner receives on an executor thread while its handlers acknowledge
    # on the event loop's: an ack that waited for the receive would hold up the next
    # message of a serial key (the only one due) for the receive's whole timeout.
    queue.push("first")
    consumer = delayq.Worker(queue)._worker.start(2)
    delivery = consumer.recv(5.0)
    assert delivery is not None
    received: list[Any] = []
    receiving = threading.Thread(target=lambda: received.append(consumer.recv(5.0)))
    receiving.start()
    time.sleep(0.2)  # it waits: nothing else is due
    consumer.settle(delivery)
    acked_while_receiving = receiving.is_alive()
    consumer.stop()
    receiving.join()
    consumer.finish(None)
    assert acked_while_receiving, "the ack waited until the receive gave up"
    assert received == [None] and queue.stats()["acked"] == 1


def test_finish_waits_for_a_receive_in_progress_and_keeps_its_counts(queue: delayq.DelayQueue) -> None:
    # finish() needs the consumer whole: it waits until a receive on another thread
    # (the asyncio runner's executor) has returned, then writes and counts everything.
    queue.push("first")
    consumer = delayq.Worker(queue)._worker.start(2)
    delivery = consumer.recv(5.0)
    assert delivery is not None
    consumer.settle(delivery)
    returned_at: list[float] = []
    receiving_now = threading.Event()

    def receive() -> None:
        receiving_now.set()
        assert consumer.recv(0.6) is None
        returned_at.append(time.monotonic())

    receiving = threading.Thread(target=receive)
    receiving.start()
    assert receiving_now.wait(10)
    time.sleep(0.2)  # the receive waits: nothing else is due
    consumer.stop()
    summary = consumer.finish(None)
    finished_at = time.monotonic()
    receiving.join()
    assert returned_at and finished_at >= returned_at[0], "finish did not wait for the receive"
    assert summary["handled"] == 1 and summary["acked"] == 1
    assert queue.stats()["acked"] == 1

def test_bad_serial_keys_are_refused_and_write_nothing(queue: delayq.DelayQueue) -> None:
    for bad in ["", "order\n1", "k" * 1000]:
        with pytest.raises(delayq.InvalidArgumentError, match="serial_key"):
            queue.push(1, serial_key=bad)
    with pytest.raises(delayq.InvalidArgumentError, match="partition_key"):
        queue.push_many([{"payload": 1, "serial_key": "a", "partition_key": "b"}])
    assert queue.stats()["pushed"] == 0
    msg_id = queue.push(1, serial_key="order:1")
    assert queue.get(msg_id)["serial_key"] == "order:1"  # type: ignore[index]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_a_worker_process_gracefully_and_loses_nothing(
    queue: delayq.DelayQueue, redis_url: str, tmp_path: Any, sig: signal.Signals
) -> None:
    log = str(tmp_path / "log")
    fill(queue, 400)
    proc = start_worker(redis_url, log)
    wait_for(20, "some handled", lambda: len(handled(log)) >= 50)
    proc.send_signal(sig)
    assert proc.wait(20) == 0
    with open(log + ".summary") as f:
        summary = json.load(f)
    assert summary["stopped_by"] == "signal"
    done = len(handled(log))
    assert summary["acked"] == done, "every handled message was acknowledged"
    stats = queue.stats()
    assert stats["inflight"] == 0, "prefetched messages went back at once"
    assert stats["ready"] == 400 - done
    proc = start_worker(redis_url, log)
    wait_for(30, "the rest handled", lambda: drained(queue))
    proc.terminate()
    proc.wait(20)
    assert_all_handled(log, 400, 0)


def test_a_worker_killed_with_sigkill_loses_nothing(queue: delayq.DelayQueue, redis_url: str, tmp_path: Any) -> None:
    log = str(tmp_path / "log")
    fill(queue, 1000)
    victim = start_worker(redis_url, log)
    wait_for(20, "some handled", lambda: len(handled(log)) >= 200)
    victim.kill()
    victim.wait()
    inflight = queue.stats()["inflight"]
    assert inflight > 0
    proc = start_worker(redis_url, log)
    wait_for(30, "the rest handled", lambda: drained(queue))
    proc.terminate()
    proc.wait(20)
    assert_all_handled(log, 1000, inflight)
    assert queue.stats()["expired"] >= inflight


def test_a_hung_handler_loses_its_lease_and_another_worker_gets_the_message(
    queue: delayq.DelayQueue, redis_url: str, tmp_path: Any
) -> None:
    log = str(tmp_path / "log")
    fill(queue, 1, {0: {"hang": True}})
    hung = start_worker(redis_url, log, "0.2")
    wait_for(10, "the hung worker to take it", lambda: queue.stats()["inflight"] == 1)
    other = start_worker(redis_url, log + ".other")
    wait_for(20, "the message handled elsewhere", lambda: drained(queue))
    [(n, attempt, pid)] = handled(log + ".other")
    assert (n, attempt) == (0, 2) and pid == other.pid
    for p in (hung, other):
        p.kill()
        p.wait()


def test_a_paused_queue_is_not_consumed_until_resumed(queue: delayq.DelayQueue) -> None:
    assert queue.pause() is True and queue.pause() is False
    assert queue.is_paused() and queue.stats()["paused_at"] is not None
    fill(queue, 5)
    seen: list[int] = []
    # Longer than the test: only the wake-up that resume() publishes can start the work.
    worker = delayq.Worker(queue, idle_check=600)

    def handle(payload: dict[str, int], msg: delayq.Message) -> None:
        seen.append(payload["n"])
        if len(seen) == 5:
            worker.stop()

    runner = threading.Thread(target=worker.run, args=(handle,))
    runner.start()
    try:
        wait_for(10, "the pool to register", lambda: len(queue.workers()) == 1)
        time.sleep(1)
        assert seen == [] and queue.stats()["ready"] == 5, "nothing runs while paused"
        assert queue.resume() is True and queue.resume() is False
        assert not queue.is_paused() and queue.stats()["paused_at"] is None
        runner.join(20)
    finally:
        worker.stop()
        runner.join()
    assert sorted(seen) == list(range(5)) and drained(queue)


def test_a_rate_limit_paces_the_handlers_of_every_thread(queue: delayq.DelayQueue) -> None:
    queue.set_rate_limit(5, per=0.5)
    assert queue.rate_limit() == {"max": 5, "per": 0.5} == queue.stats()["rate_limit"]
    fill(queue, 20)
    starts: list[float] = []
    # Longer than the test: the pool must sleep just until the window has room.
    worker = delayq.Worker(queue, threads=4, idle_check=600)

    def handle(payload: dict[str, int], msg: delayq.Message) -> None:
        starts.append(time.monotonic())
        if len(starts) == 20:
            worker.stop()

    runner = threading.Thread(target=worker.run, args=(handle,))
    runner.start()
    runner.join(30)
    worker.stop()
    runner.join()
    assert len(starts) == 20 and drained(queue)
    starts.sort()
    # The cap is on claims; a handler starts a little after its claim (up to 0.2 s on
    # a loaded machine), never before.
    tightest = min(b - a for a, b in zip(starts, starts[5:]))
    assert tightest >= 0.3, f"6 handlers started within {tightest:.3f} s: more than 5 per 0.5 s"
    assert queue.clear_rate_limit() is True and queue.clear_rate_limit() is False
    assert queue.rate_limit() is None and queue.stats()["rate_limit"] is None


def test_a_bad_rate_limit_is_refused_and_writes_nothing(queue: delayq.DelayQueue, redis_url: str) -> None:
    for max_, per, culprit in [(0, 1.0, "max"), (-1, 1.0, "max"), (2**32, 1.0, "max"), (5, 0.0, "per"),
                               (5, float("nan"), "per"), (5, -2.0, "per"), (5, 40 * 86400.0, "per")]:
        with pytest.raises(delayq.InvalidArgumentError, match=culprit):
            queue.set_rate_limit(max_, per)
    with pytest.raises(ValueError):
        queue.set_rate_limit(0)
    assert queue.rate_limit() is None
    split = delayq.DelayQueue(redis_url, "split", partitions=3)
    with pytest.raises(delayq.InvalidArgumentError, match="3 partitions"):
        split.set_rate_limit(2)
    assert split.rate_limit() is None
    split.set_rate_limit(7, per=60)
    assert split.rate_limit() == {"max": 7, "per": 60.0}
    assert split.clear_rate_limit()


def test_waiting_and_running_messages_are_listed(queue: delayq.DelayQueue) -> None:
    late = queue.push({"n": "late"}, delay=3600)
    first = queue.push({"n": "first"})
    assert [m["id"] for m in queue.waiting()] == [first, late]
    [ready] = queue.waiting(1)
    assert (ready["state"], ready["payload"], ready["attempts"], ready["lease_until"]) == ("ready", {"n": "first"}, 0, None)
    assert queue.inflight() == [] and queue.waiting(0) == []
    with pytest.raises(delayq.InvalidArgumentError, match="at most 1000"):
        queue.waiting(1001)

    seen: list[list[dict[str, Any]]] = []
    worker = delayq.Worker(queue)

    def handle(payload: dict[str, str], msg: delayq.Message) -> None:
        seen.append(queue.inflight())
        worker.stop()
        msg.retry_later(600, "gateway down")

    worker.run(handle)
    [[running]] = seen
    assert (running["id"], running["state"], running["attempts"]) == (first, "inflight", 1)
    assert running["lease_until"] > time.time()
    assert queue.inflight() == []
    retry = queue.waiting()[0]
    assert (retry["id"], retry["state"], retry["attempts"], retry["last_error"]) == (first, "scheduled", 1, "gateway down")


def test_an_async_handler_past_its_timeout_is_cancelled_and_its_message_retried_at_once(
    queue: delayq.DelayQueue,
) -> None:
    msg_id = queue.push({"n": 1})
    attempts: list[int] = []
    cancelled: list[bool] = []
    worker = delayq.Worker(queue, timeout=0.3, backoff_base=0.05, lease=30.0)

    async def handle(payload: Any, msg: delayq.Message) -> None:
        attempts.append(msg.attempt)
        if msg.attempt == 1:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.append(True)
                raise
        worker.stop()

    started = time.monotonic()
    summary = worker.run(handle)
    assert attempts == [1, 2] and cancelled == [True]
    assert time.monotonic() - started < 10, "retried after its backoff, not after its 30 s lease"
    assert (summary["failed"], summary["retried"], summary["acked"]) == (1, 1, 1), summary
    assert queue.get(msg_id) is None
    stats = queue.stats()
    assert stats["retried"] == 1 and stats["acked"] == 1

    doomed = queue.push({"n": 2}, max_attempts=1)

    async def hang(payload: Any, msg: delayq.Message) -> None:
        await asyncio.sleep(60)

    delayq.Worker(queue, timeout=0.2, stop_when_empty=True).run(hang)
    [dead] = queue.dead_letters()
    assert dead["id"] == doomed
    assert dead["last_error"] == "handler exceeded its 0.2 s timeout; coroutine cancelled"


def test_a_coroutine_that_swallows_its_cancellation_does_not_hold_its_message(
    queue: delayq.DelayQueue, caplog: pytest.LogCaptureFixture
) -> None:
    queue.push({"n": 1})
    worker = delayq.Worker(queue, timeout=0.2, backoff_base=0.01, backoff_max=0.01)
    retried = asyncio.Event()
    attempts: list[int] = []

    async def stubborn(payload: Any, msg: delayq.Message) -> None:
        attempts.append(msg.attempt)
        if msg.attempt == 1:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                pass  # swallowed
            await retried.wait()  # and holds on until its message ran again
            return
        retried.set()
        worker.stop()

    summary: list[dict[str, Any]] = []
    with caplog.at_level(logging.ERROR, logger="delayq.worker"):
        runner = threading.Thread(target=lambda: summary.append(worker.run(stubborn)), daemon=True)
        runner.start()
        runner.join(20)
        assert not runner.is_alive(), "the first delivery held its message: no retry"
    assert attempts == [1, 2] and (summary[0]["retried"], summary[0]["acked"]) == (1, 1)
    assert "ignored its cancellation" in caplog.text


def test_max_jobs_ends_the_run_after_that_many_messages_and_gives_the_rest_back(queue: delayq.DelayQueue) -> None:
    queue.push_many([(i, 0.0) for i in range(10)])
    seen: list[int] = []
    summary = delayq.Worker(queue, max_jobs=3).run(lambda payload, msg: seen.append(payload))
    assert (summary["stopped_by"], summary["acked"], len(seen)) == ("max_jobs", 3, 3)
    stats = queue.stats()
    assert (stats["ready"], stats["inflight"]) == (7, 0), "prefetched messages went back at once"


def test_max_jobs_counts_async_handlers_too(queue: delayq.DelayQueue) -> None:
    queue.push_many([(i, 0.0) for i in range(10)])

    async def handle(payload: int, msg: delayq.Message) -> None:
        await asyncio.sleep(0)

    summary = delayq.Worker(queue, max_jobs=4, concurrency=1).run(handle)
    assert (summary["stopped_by"], summary["acked"]) == ("max_jobs", 4)


def test_max_time_ends_an_idle_run(queue: delayq.DelayQueue) -> None:
    started = time.monotonic()
    summary = delayq.Worker(queue, max_time=0.3).run(lambda payload, msg: None)
    assert summary["stopped_by"] == "max_time" and time.monotonic() - started >= 0.3


def test_max_memory_ends_the_run_once_the_process_holds_that_much(queue: delayq.DelayQueue) -> None:
    queue.push_many([(i, 0.0) for i in range(200)])
    with open("/proc/self/statm") as f:
        resident_mb = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20
    hoard: list[bytes] = []

    def handle(payload: int, msg: delayq.Message) -> None:
        hoard.append(b"x" * (1 << 20))

    summary = delayq.Worker(queue, max_memory_mb=resident_mb + 30).run(handle)
    assert summary["stopped_by"] == "max_memory"
    assert 20 <= summary["acked"] <= 60, summary


@pytest.mark.parametrize("kwargs", [
    {"max_jobs": 0}, {"max_time": 0}, {"max_time": float("nan")}, {"max_time": float("inf")},
    {"max_memory_mb": -1}, {"max_memory_mb": 1 << 31}, {"concurrency": 0},
])
def test_bad_limits_are_refused(queue: delayq.DelayQueue, kwargs: dict[str, Any]) -> None:
    with pytest.raises(delayq.InvalidArgumentError, match=next(iter(kwargs))):
        delayq.Worker(queue, **kwargs)


@pytest.mark.parametrize("kwargs", [{"max_jobs": 1.5}, {"max_jobs": True}, {"max_time": "1"}, {"threads": 1.5}])
def test_limits_of_a_wrong_type_are_refused_as_every_option(queue: delayq.DelayQueue, kwargs: dict[str, Any]) -> None:
    # The limits are read as the other options are (the core's table): a wrong type is a TypeError.
    with pytest.raises(TypeError, match=f"argument '{next(iter(kwargs))}' must be"):
        delayq.Worker(queue, **kwargs)


def test_a_repeating_message_runs_once_per_occurrence(queue: delayq.DelayQueue) -> None:
    due = queue.repeat("tick", 1, {"n": 1})
    assert due > time.time() and queue.repeat("tick", 1, {"n": 1}) == due, "the same definition changes nothing"
    assert queue.repeats() == [{"name": "tick", "schedule": 1.0, "tz": None, "payload": {"n": 1},
                                "max_attempts": None, "expire_after": None, "next_due_at": due}]
    seen: list[str] = []
    worker = delayq.Worker(queue)

    def handle(payload: dict[str, int], msg: delayq.Message) -> None:
        seen.append(msg.id)
        if len(seen) == 2:
            worker.stop()

    worker.run(handle)
    first = round(due * 1000)
    assert seen == [f"repeat:tick:{first}", f"repeat:tick:{first + 1000}"]
    assert queue.unrepeat("tick") and queue.repeats() == [] and not queue.unrepeat("tick")

    nxt = queue.repeat("nightly", "0 2 * * *", {"report": True}, tz="Asia/Shanghai", max_attempts=2, expire_after=600)
    [nightly] = queue.repeats()
    assert (nightly["schedule"], nightly["tz"], nightly["max_attempts"], nightly["expire_after"]) == (
        "0 2 * * *", "Asia/Shanghai", 2, 600.0)
    at = datetime.datetime.fromtimestamp(nightly["next_due_at"], datetime.timezone.utc)
    assert (at.hour, at.minute) == (18, 0), "02:00 in Shanghai"
    occurrence = queue.get(f"repeat:nightly:{round(nxt * 1000)}")
    assert occurrence is not None and occurrence["expires_at"] == pytest.approx(nxt + 600, abs=0.0005)


@pytest.mark.parametrize("args, kwargs, error, text", [
    (("x", "61 * * * *", 1), {}, delayq.InvalidArgumentError, "not a cron pattern"),
    (("x", "0 2 * * *", 1), {"tz": "Mars/Base"}, delayq.InvalidArgumentError, "IANA time zone"),
    (("x", 60, 1), {"tz": "UTC"}, delayq.InvalidArgumentError, "cron patterns, not to intervals"),
    (("x", 0.5, 1), {}, delayq.InvalidArgumentError, "1 second"),
    (("x", True, 1), {}, TypeError, "schedule"),
    (("", 60, 1), {}, delayq.InvalidArgumentError, "repeat name"),
    (("x", 60, object()), {}, TypeError, "payload"),
    (("x", 60, 1), {"expire_after": 0}, delayq.InvalidArgumentError, "expire_after"),
    (("x", 60, 1), {"expire_after": float("nan")}, delayq.InvalidArgumentError, "expire_after"),
])
def test_bad_repeats_are_refused_and_write_nothing(
    queue: delayq.DelayQueue, args: tuple[Any, ...], kwargs: dict[str, Any], error: type[Exception], text: str
) -> None:
    with pytest.raises(error, match=text):
        queue.repeat(*args, **kwargs)
    assert queue.repeats() == [] and queue.stats()["pushed"] == 0


def test_restart_workers_stops_the_running_pools_and_says_so(queue: delayq.DelayQueue) -> None:
    # Longer than the test: only the wake-up that the request publishes reaches idle pools.
    sync_worker = delayq.Worker(queue, idle_check=600)
    async_worker = delayq.Worker(queue, idle_check=600)
    summaries: list[dict[str, Any]] = []

    async def handle_async(payload: Any, msg: delayq.Message) -> None:
        pass

    runners = [
        threading.Thread(target=lambda: summaries.append(sync_worker.run(lambda payload, msg: None))),
        threading.Thread(target=lambda: summaries.append(asyncio.run(async_worker.run_async(handle_async)))),
    ]
    for r in runners:
        r.start()
    try:
        wait_for(10, "both pools listed", lambda: len(queue.workers()) == 2)
        assert queue.restart_workers() == 2
        for r in runners:
            r.join(10)
        assert not any(r.is_alive() for r in runners), "a pool did not stop"
    finally:
        sync_worker.stop()
        async_worker.stop()
        for r in runners:
            r.join()
    assert [s["stopped_by"] for s in summaries] == ["restart", "restart"]
    # A pool started after the request runs on.
    later = delayq.Worker(queue)
    seen: list[int] = []

    def handle(payload: dict[str, int], msg: delayq.Message) -> None:
        seen.append(payload["n"])
        later.stop()

    queue.push({"n": 7})
    assert later.run(handle)["stopped_by"] == "stop" and seen == [7]


def test_stop_when_empty_returns_once_nothing_is_due_and_leaves_later_messages(queue: delayq.DelayQueue) -> None:
    later = queue.push({"n": "later"}, delay=3600)
    fill(queue, 5)
    seen: list[int] = []
    summary = delayq.Worker(queue, stop_when_empty=True).run(lambda payload, msg: seen.append(payload["n"]))
    assert sorted(seen) == list(range(5)) and summary["stopped_by"] == "empty" and summary["acked"] == 5
    info = queue.get(later)
    assert info is not None and info["state"] == "scheduled"

    async def handle(payload: dict[str, int], msg: delayq.Message) -> None:
        seen.append(payload["n"])

    fill(queue, 3)
    summary = delayq.Worker(queue, stop_when_empty=True).run(handle)
    assert summary["stopped_by"] == "empty" and summary["acked"] == 3 and len(seen) == 8


def test_on_dead_alerts_for_each_message_sent_to_the_dead_letters(
    queue: delayq.DelayQueue, caplog: pytest.LogCaptureFixture
) -> None:
    for kind in ("fine", "broken", "gone", "alarm"):
        queue.push({"kind": kind})
    deaths: list[tuple[str, int, str]] = []

    def on_dead(payload: dict[str, str], msg: delayq.Message, error: str) -> None:
        deaths.append((payload["kind"], msg.attempt, error))
        if payload["kind"] == "alarm":
            raise RuntimeError("the pager is down")

    def handle(payload: dict[str, str], msg: delayq.Message) -> None:
        if payload["kind"] == "gone":
            msg.dead_letter("order 42 no longer exists")
        elif payload["kind"] != "fine":
            raise ValueError(f"cannot handle {payload['kind']}")

    worker = delayq.Worker(queue, max_attempts=1, stop_when_empty=True, on_dead=on_dead)
    summary = worker.run(handle)
    assert summary["dead"] == 3 and summary["acked"] == 1 and summary["stopped_by"] == "empty"
    assert sorted(deaths) == [("alarm", 1, "ValueError: cannot handle alarm"),
                              ("broken", 1, "ValueError: cannot handle broken"),
                              ("gone", 1, "order 42 no longer exists")]
    assert "on_dead raised RuntimeError: the pager is down" in caplog.text, "logged, and the pool went on"

    async def handle_async(payload: dict[str, str], msg: delayq.Message) -> None:
        handle(payload, msg)

    async def on_dead_async(payload: dict[str, str], msg: delayq.Message, error: str) -> None:
        deaths.append((payload["kind"], msg.attempt, error))

    deaths.clear()
    queue.push({"kind": "broken"})
    queue.push({"kind": "fine"})
    delayq.Worker(queue, max_attempts=1, stop_when_empty=True, on_dead=on_dead_async).run(handle_async)
    assert deaths == [("broken", 1, "ValueError: cannot handle broken")]


def test_on_failure_gets_each_exception_a_handler_raised(
    queue: delayq.DelayQueue, caplog: pytest.LogCaptureFixture
) -> None:
    for kind in ("fine", "broken", "gone", "alarm"):
        queue.push({"kind": kind})
    reports: list[tuple[str, int, BaseException]] = []

    def on_failure(payload: dict[str, str], msg: delayq.Message, exc: BaseException) -> None:
        reports.append((payload["kind"], msg.attempt, exc))
        if payload["kind"] == "alarm":
            raise RuntimeError("the error tracker is down")

    def handle(payload: dict[str, str], msg: delayq.Message) -> None:
        if payload["kind"] == "gone":
            msg.dead_letter("order 42 no longer exists")
        elif payload["kind"] != "fine":
            raise ValueError(f"cannot handle {payload['kind']}")

    summary = delayq.Worker(queue, max_attempts=1, stop_when_empty=True, on_failure=on_failure).run(handle)
    assert (summary["dead"], summary["acked"], summary["stopped_by"]) == (3, 1, "empty")
    # The exception itself, as raised; a decision without one (dead_letter) is no report.
    assert sorted((kind, attempt, type(exc), str(exc)) for kind, attempt, exc in reports) == [
        ("alarm", 1, ValueError, "cannot handle alarm"),
        ("broken", 1, ValueError, "cannot handle broken"),
    ]
    assert all(exc.__traceback__ is not None for _, _, exc in reports)
    assert "on_failure raised RuntimeError: the error tracker is down" in caplog.text, "logged; the pool went on"

    async def handle_async(payload: dict[str, str], msg: delayq.Message) -> None:
        if payload["kind"] == "slow":
            await asyncio.sleep(10)
        handle(payload, msg)

    async def on_failure_async(payload: dict[str, str], msg: delayq.Message, exc: BaseException) -> None:
        reports.append((payload["kind"], msg.attempt, exc))

    reports.clear()
    for kind in ("broken", "fine", "slow"):
        queue.push({"kind": kind})
    delayq.Worker(queue, max_attempts=1, stop_when_empty=True, timeout=0.2,
                  on_failure=on_failure_async).run(handle_async)
    raised = {kind: exc for kind, _, exc in reports}
    assert sorted(raised) == ["broken", "slow"]
    assert isinstance(raised["broken"], ValueError)
    assert isinstance(raised["slow"], TimeoutError), "cancelled at its timeout"


def test_lower_queues_run_only_when_the_higher_ones_have_nothing_due(queue: delayq.DelayQueue, redis_url: str) -> None:
    bulk, reports = delayq.DelayQueue(redis_url, "bulk"), delayq.DelayQueue(redis_url, "reports")
    # The lower queues' messages are older: priority, not due time, decides.
    for q in (reports, bulk, queue):
        q.push_many([{"payload": n} for n in range(100)])
    order: list[tuple[str, int]] = []

    def handle(n: int, msg: delayq.Message) -> None:
        order.append((msg.queue, n))
        time.sleep(0.0001)

    summary = delayq.Worker(queue, lower_queues=[bulk, reports], stop_when_empty=True).run(handle)
    assert (summary["stopped_by"], summary["handled"], summary["acked"]) == ("empty", 300, 300)
    names = [name for name, _ in order]

    def last(name: str) -> int:
        return len(names) - 1 - names[::-1].index(name)

    # Only what a lower pool claimed in the first instant may run ahead.
    assert names[: last("jobs")].count("bulk") + names[: last("jobs")].count("reports") <= 2
    assert names[: last("bulk")].count("reports") <= 2
    for name, q in (("jobs", queue), ("bulk", bulk), ("reports", reports)):
        assert sorted(n for q_name, n in order if q_name == name) == list(range(100)), f"{name}: each once"
        assert q.stats()["acked"] == 100, f"{name}: acknowledged in its own queue"


def test_an_async_worker_takes_the_higher_queue_first_too(queue: delayq.DelayQueue, redis_url: str) -> None:
    low = delayq.DelayQueue(redis_url, "low")
    low.push_many([{"payload": n} for n in range(50)])
    queue.push_many([{"payload": n} for n in range(50)])
    order: list[str] = []

    async def handle(n: int, msg: delayq.Message) -> None:
        order.append(msg.queue)
        await asyncio.sleep(0.001)

    summary = delayq.Worker(queue, lower_queues=(low,), stop_when_empty=True, concurrency=4).run(handle)
    assert summary["acked"] == 100 and sorted(order) == ["jobs"] * 50 + ["low"] * 50
    # With 4 handlers at once, up to one claim per idle handler may slip in early.
    assert order[: len(order) - order[::-1].index("jobs")].count("low") <= 8


def test_bad_lower_queues_are_refused_naming_the_problem(queue: delayq.DelayQueue, redis_url: str) -> None:
    with pytest.raises(TypeError):
        delayq.Worker(queue, lower_queues=["bulk"])  # type: ignore[list-item]
    with pytest.raises(delayq.InvalidArgumentError, match="lower_queues.*listed twice"):
        delayq.Worker(queue, lower_queues=[delayq.DelayQueue(redis_url, "jobs")])
    with pytest.raises(delayq.InvalidArgumentError, match="at most 16 queues"):
        delayq.Worker(queue, lower_queues=[delayq.DelayQueue(redis_url, f"q{i}") for i in range(16)])


def test_a_message_past_its_expire_after_is_dead_lettered_unrun(queue: delayq.DelayQueue) -> None:
    # A window wide enough for a new pool to start within it on a loaded machine: the
    # requeue below needs that.
    stale = queue.push("stale", expire_after=0.9)
    queue.push_many([{"payload": "fresh", "expire_after": 60}, ("plain", 0)])
    info = queue.get(stale)
    assert info is not None and info["expires_at"] - info["due_at"] == pytest.approx(0.9, abs=0.0005)
    time.sleep(1.2)  # no worker runs for a while
    seen: list[str] = []
    deadlines: dict[str, float | None] = {}

    def handle(payload: str, msg: delayq.Message) -> None:
        seen.append(payload)
        deadlines[payload] = None if msg.expires_at is None else round(msg.expires_at - msg.due_at, 3)

    summary = delayq.Worker(queue, stop_when_empty=True).run(handle)
    assert sorted(seen) == ["fresh", "plain"] and summary["handled"] == 2
    assert deadlines == {"fresh": 60.0, "plain": None}
    dead = queue.dead_letters()
    assert [d["id"] for d in dead] == [stale]
    assert dead[0]["last_error"].startswith("expired: not started within 900 ms of its due time")
    assert queue.requeue_dead(stale) == 1  # a fresh deadline: it runs
    seen.clear()
    delayq.Worker(queue, stop_when_empty=True).run(lambda payload, msg: seen.append(payload))
    assert seen == ["stale"] and drained(queue)


def test_a_bad_expire_after_is_refused_and_writes_nothing(queue: delayq.DelayQueue) -> None:
    for bad in (0, -1, float("nan"), 0.0001):
        with pytest.raises(ValueError, match="expire_after"):
            queue.push("x", expire_after=bad)
    with pytest.raises(ValueError, match="expire_after of item 1"):
        queue.push_many([("a", 0), {"payload": "b", "expire_after": 0}])
    assert queue.stats()["pushed"] == 0


def test_a_handler_of_one_parameter_gets_the_payload_and_one_that_needs_more_is_refused_at_start(
    queue: delayq.DelayQueue,
) -> None:
    queue.push({"n": 1})
    seen: list[Any] = []
    summary = delayq.Worker(queue, stop_when_empty=True).run(lambda payload: seen.append(payload))
    assert seen == [{"n": 1}] and summary["acked"] == 1

    def three(payload: Any, message: delayq.Message, extra: Any) -> None: ...

    queue.push({"n": 2})
    with pytest.raises(TypeError, match="handler .*three needs 3 arguments"):
        delayq.Worker(queue, stop_when_empty=True).run(three)
    assert queue.stats()["ready"] == 1, "refused before anything was claimed"


def test_awaitables_a_sync_looking_handler_returns_are_awaited(queue: delayq.DelayQueue) -> None:
    ran: list[str] = []

    class Handler:
        async def __call__(self, payload: Any, message: delayq.Message) -> None:
            await asyncio.sleep(0)
            ran.append(f"call {payload['n']}")

    async def body(payload: Any) -> None:
        await asyncio.sleep(0)
        ran.append(f"lambda {payload['n']}")

    async def two(payload: Any, message: delayq.Message) -> None:
        ran.append(f"partial {payload['n']}")

    for n, handler in enumerate([Handler(), lambda payload, msg: body(payload), functools.partial(two)]):
        queue.push({"n": n})
        summary = delayq.Worker(queue, stop_when_empty=True).run(handler)
        assert summary["acked"] == 1
    assert ran == ["call 0", "lambda 1", "partial 2"]


def wait_child(pid: int, limit: float) -> str:
    """How `pid` ended ("exit N", "signal N"), or "alive" if it still ran after `limit`
    seconds (then it is killed): a child that hangs fails the test, not the suite."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return f"exit {os.WEXITSTATUS(status)}" if os.WIFEXITED(status) else f"signal {os.WTERMSIG(status)}"
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return "alive"


def test_a_child_forked_by_a_handler_ends_when_it_returns_or_exits_and_the_parent_goes_on(
    queue: delayq.DelayQueue, redis_url: str, capfd: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    children = {0: "return", 1: "exit", 3: "raise", 4: "return"}
    pool_pid = os.getpid()
    atexit_ran = tmp_path / "atexit-ran"
    queue.push_many([{"payload": {"n": n, "child": children.get(n)}} for n in range(6)])
    ended: dict[int, str] = {}

    def handler(payload: Any, message: delayq.Message) -> None:
        n, child = payload["n"], payload["child"]
        if child is None:
            ended[n] = "plain"
            return
        pid = os.fork()
        if pid == 0:
            # Side work with a queue of its own, then back into the worker.
            delayq.DelayQueue(redis_url, "side").push({"from_child": n})
            atexit.register(atexit_ran.touch)
            if child == "exit":
                sys.exit(7)
            if child == "raise":
                raise LookupError(f"the side work of {n} failed")
            return
        ended[n] = wait_child(pid, 5)

    summary = delayq.Worker(queue, stop_when_empty=True).run(handler)
    if os.getpid() != pool_pid:
        os._exit(99)  # a child that got this far must not run the rest of the suite
    assert not atexit_ran.exists(), "a child runs no atexit hook"
    assert ended == {0: "exit 0", 1: "exit 7", 2: "plain", 3: "exit 1", 4: "exit 0", 5: "plain"}, \
        "each child ended by itself, with the status Python gives its ending"
    err = capfd.readouterr().err
    assert err.count("a process forked by a handler ended with an uncaught exception") == 1, err
    assert "LookupError: the side work of 3 failed" in err, err
    counts = {k: summary[k] for k in ("handled", "acked", "failed", "released", "lease_lost", "gone", "unwritten")}
    assert counts == {"handled": 6, "acked": 6, "failed": 0, "released": 0, "lease_lost": 0, "gone": 0,
                      "unwritten": 0}, summary
    assert summary["stopped_by"] == "empty"
    stats = queue.stats()
    assert (stats["delivered"], stats["acked"], stats.get("released", 0), stats["inflight"]) == (6, 6, 0, 0), \
        "acknowledged once each, by the parent"
    assert delayq.DelayQueue(redis_url, "side").stats()["ready"] == 4, "each child did its side work"


class _Permanent(Exception):
    pass


@pytest.mark.parametrize("act", ["return", "raise", "no_retry", "decide", "exit"])
def test_the_sync_and_the_asyncio_path_settle_alike(redis_url: str, act: str) -> None:
    """One run policy: each way a handler can end leaves its message, the hooks and the
    summary the same whether the handler is a function or a coroutine."""

    def body(payload: Any, msg: delayq.Message) -> None:
        if act == "raise":
            raise ValueError("boom")
        if act == "no_retry":
            raise _Permanent("gone for good")
        if act == "decide":
            msg.retry_later(60, "rate limited")
            raise ValueError("ignored: the decision wins")
        if act == "exit":
            sys.exit(3)

    async def coroutine(payload: Any, msg: delayq.Message) -> None:
        body(payload, msg)

    seen: list[tuple[Any, ...]] = []
    for name, handler in (("sync", body), ("async", coroutine)):
        q = delayq.DelayQueue(redis_url, f"same-{act}-{name}")
        mid = q.push({"n": 1})
        worker = delayq.Worker(q, backoff_base=30, no_retry=(_Permanent,), stop_when_empty=True,
                               on_failure=lambda p, m, e: failures.append(type(e).__name__),
                               on_dead=lambda p, m, error: deaths.append(error))
        failures: list[str] = []
        deaths: list[str] = []
        if act == "exit":
            with pytest.raises(SystemExit):
                worker.run(handler)
            summary = worker._last_summary
            assert summary is not None
        else:
            summary = worker.run(handler)
        info = q.get(mid)
        state = None if info is None else (info["state"], info["attempts"], info["last_error"])
        counts = {k: summary[k] for k in ("handled", "acked", "failed", "retried", "dead", "stopped_by")}
        seen.append((state, failures, deaths, counts))
        q.purge()
    assert seen[0] == seen[1], seen
    state = seen[0][0]
    expected = {
        "return": None,
        "raise": ("scheduled", 1, "ValueError: boom"),
        "no_retry": ("dead", 1, "_Permanent: gone for good"),
        "decide": ("scheduled", 1, "rate limited"),
        "exit": ("ready", 1, "the handler raised SystemExit: 3, which stopped the worker"),
    }[act]
    assert state == expected
