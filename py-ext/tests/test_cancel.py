"""`DelayQueue.cancel` of a message that runs, through the binding: ``message.cancelled``
turns true in a thread's handler, an asyncio handler's task is cancelled, and the
message ends as cancelled whatever the handler does (the policy is the core's, tested
in core/tests/cancel_running.rs)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import delayq
from harness import wait_for

LEASE = 0.6


def test_a_thread_handler_sees_the_cancel_and_its_failure_is_not_retried(queue: delayq.DelayQueue) -> None:
    queue.push({"n": 1}, id="o-1")
    seen: list[float] = []
    at_start: list[bool] = []
    started = threading.Event()

    def handle(payload: Any, msg: delayq.Message) -> None:
        at_start.append(msg.cancelled)  # (an assert here would only fail the delivery)
        started.set()
        deadline = time.monotonic() + 5
        while not msg.cancelled and time.monotonic() < deadline:
            time.sleep(0.005)
        seen.append(time.monotonic())
        raise RuntimeError("fails after the cancel")

    def cancel() -> None:
        started.wait(10)
        infos.append(queue.get("o-1"))
        seen.append(time.monotonic())
        answers.append(queue.cancel("o-1"))
        infos.append(queue.get("o-1"))

    answers: list[bool] = []
    infos: list[Any] = []
    canceller = threading.Thread(target=cancel)
    canceller.start()
    summary = delayq.Worker(queue, threads=1, lease=LEASE, stop_when_empty=True).run(handle)
    canceller.join()
    assert answers == [True], "a running message is cancelled (asserted here: a thread's assert fails nothing)"
    assert [(i["state"], i["cancelled"]) for i in infos] == [("inflight", False), ("inflight", True)], infos
    assert all(type(i["cancelled"]) is bool for i in infos), infos
    assert at_start == [False]
    cancelled_at, seen_at = seen
    assert seen_at - cancelled_at < LEASE / 3 + 0.2, "within a heartbeat"
    assert (summary["retried"], summary["dead"], summary["cancelled"]) == (0, 0, 1), summary
    stats = queue.stats()
    assert (stats["cancelled"], stats["retried"], stats["died"]) == (1, 0, 0), stats
    assert queue.get("o-1") is None


def test_an_asyncio_handlers_task_is_cancelled(queue: delayq.DelayQueue) -> None:
    queue.push({"n": 1}, id="o-1")
    queue.push({"n": 2}, id="o-2")
    events: list[str] = []

    async def handle(payload: Any, msg: delayq.Message) -> None:
        if payload["n"] == 1:
            events.append("started")
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                events.append(f"cancelled {msg.cancelled}")
                raise
        else:
            events.append("other")

    def cancel() -> None:
        wait_for(10, "the handler to start", lambda: "started" in events)
        answers.append(queue.cancel("o-1"))

    answers: list[bool] = []
    canceller = threading.Thread(target=cancel)
    canceller.start()
    t = time.monotonic()
    summary = delayq.Worker(queue, threads=2, lease=LEASE, stop_when_empty=True).run(handle)
    canceller.join()
    assert answers == [True], "a running message is cancelled (asserted here: a thread's assert fails nothing)"
    assert time.monotonic() - t < 5, "not the 10 s sleep"
    assert "cancelled True" in events and "other" in events, events
    stats = queue.stats()
    assert (stats["cancelled"], stats["acked"], stats["retried"], stats["died"]) == (1, 1, 0, 0), (stats, summary)


def test_a_handler_that_ignores_the_cancel_ends_normally(queue: delayq.DelayQueue) -> None:
    queue.push({"n": 1}, id="o-1")
    started = threading.Event()

    def handle(payload: Any, msg: delayq.Message) -> None:
        started.set()
        time.sleep(LEASE * 2)

    def cancel() -> None:
        started.wait(10)
        answers.append(queue.cancel("o-1"))

    answers: list[bool] = []
    canceller = threading.Thread(target=cancel)
    canceller.start()
    summary = delayq.Worker(queue, threads=1, lease=LEASE, stop_when_empty=True).run(handle)
    canceller.join()
    assert answers == [True], "a running message is cancelled (asserted here: a thread's assert fails nothing)"
    assert (summary["handled"], summary["acked"], summary["cancelled"]) == (1, 0, 1), summary
    stats = queue.stats()
    assert (stats["cancelled"], stats["acked"]) == (1, 0), stats


def test_cancel_keeps_its_answer_for_waiting_and_unknown_messages(queue: delayq.DelayQueue) -> None:
    queue.push({"n": 1}, delay=60, id="later")
    assert queue.cancel("later") is True
    assert queue.cancel("later") is False
    assert queue.cancel("nobody", kill=True) is False
