"""What the core logs reaches Python's `logging`, under the `delayq` logger, on a
Python thread: from the pool's threads between deliveries, from a producer's call
when it returns."""

from __future__ import annotations

import logging
import threading
import time

import pytest

import delayq
from harness import RedisServer, wait_for


def delayq_records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("delayq") and r.levelno == level]


def test_a_poison_message_is_logged_as_an_error_while_the_worker_runs(
    queue: delayq.DelayQueue, server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    poison = queue.push({"n": 1})
    server.cli("HSET", "{dq:jobs}:messages", poison, "{not json")
    caplog.set_level(logging.WARNING, logger="delayq")
    seen_by: list[str] = []

    with delayq.Worker(queue, threads=1) as worker:

        def stop_once_logged() -> None:
            try:
                wait_for(10, "the error logged", lambda: bool(delayq_records(caplog, logging.ERROR)))
                seen_by.append("running")
            finally:
                worker.stop()

        threading.Thread(target=stop_once_logged).start()
        worker.run(lambda payload, msg: pytest.fail("a poison message reached the handler"))

    assert seen_by == ["running"], "logged while the worker ran, not only when it stopped"
    [record] = delayq_records(caplog, logging.ERROR)
    assert record.name == "delayq.worker"
    assert poison in record.getMessage() and "unreadable" in record.getMessage()
    assert record.threadName == threading.main_thread().name, "emitted on the Python thread"
    assert queue.stats()["dead"] == 1


def test_a_message_that_dies_is_logged_as_a_warning_with_its_error(
    queue: delayq.DelayQueue, caplog: pytest.LogCaptureFixture
) -> None:
    doomed = queue.push({"n": 1}, max_attempts=1)
    caplog.set_level(logging.WARNING, logger="delayq")
    worker = delayq.Worker(queue)

    def fail(payload: object, msg: delayq.Message) -> None:
        worker.stop()
        raise LookupError("order 7 not found")

    worker.run(fail)
    [record] = delayq_records(caplog, logging.WARNING)
    assert record.getMessage() == (
        f"delayq[jobs]: message {doomed} moved to the dead-letter set: LookupError: order 7 not found"
    )


def test_a_busy_drain_with_frequent_heartbeats_warns_of_nothing(
    queue: delayq.DelayQueue, caplog: pytest.LogCaptureFixture
) -> None:
    # Acks written while a heartbeat is on its way must not read as lost leases.
    n = 20000
    queue.push_many([{"payload": {"n": i}} for i in range(n)])
    caplog.set_level(logging.WARNING, logger="delayq")
    worker = delayq.Worker(queue, lease=0.3)  # a heartbeat every 0.1 s
    handled = []

    def handle(payload: dict[str, int], msg: delayq.Message) -> None:
        handled.append(payload["n"])
        if len(handled) == n:
            worker.stop()

    summary = worker.run(handle)
    assert summary["acked"] == n
    assert [r.getMessage() for r in caplog.records if r.name.startswith("delayq")] == []


def test_an_evicting_redis_is_reported_once_as_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    evicting = RedisServer("--maxmemory-policy", "allkeys-lru")
    try:
        caplog.set_level(logging.WARNING, logger="delayq")
        q = delayq.DelayQueue(evicting.url, "jobs")
        q.push({"n": 1})
        q.push({"n": 2})
        [record] = delayq_records(caplog, logging.WARNING)
        assert record.name == "delayq.conn"
        assert "maxmemory-policy is allkeys-lru" in record.getMessage()
    finally:
        evicting.stop()


def test_the_delayq_loggers_level_decides_what_is_kept(
    queue: delayq.DelayQueue, caplog: pytest.LogCaptureFixture
) -> None:
    # A producer's reconnect attempts are logged at debug level only.
    caplog.set_level(logging.DEBUG, logger="delayq")
    unreachable = RedisServer()
    url = unreachable.url
    unreachable.stop()
    q = delayq.DelayQueue(url, "jobs", retry_timeout=0.3, connect_timeout=0.1)
    with pytest.raises(delayq.ConnectionError):
        q.push({"n": 1})
    debug = delayq_records(caplog, logging.DEBUG)
    assert debug and all(r.name.startswith("delayq.") for r in debug), caplog.records
    assert any("retrying in" in r.getMessage() for r in debug)

    caplog.clear()
    caplog.set_level(logging.WARNING, logger="delayq")
    q = delayq.DelayQueue(url, "jobs", retry_timeout=0.3, connect_timeout=0.1)
    with pytest.raises(delayq.ConnectionError):
        q.push({"n": 1})
    assert delayq_records(caplog, logging.DEBUG) == []


def test_a_pool_on_a_paused_queue_says_so_once_and_again_when_resumed(
    queue: delayq.DelayQueue, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="delayq")
    queue.pause()
    queue.push({"n": 1})
    worker = delayq.Worker(queue, idle_check=0.1)
    handled: list[int] = []

    def handle(payload: dict[str, int], msg: delayq.Message) -> None:
        handled.append(payload["n"])
        worker.stop()

    def resume_once_warned() -> None:
        try:
            wait_for(10, "the pause logged", lambda: bool(delayq_records(caplog, logging.WARNING)))
            time.sleep(0.5)  # several more looks at the paused queue (idle_check 0.1 s): still one line
            queue.resume()
        except BaseException:
            worker.stop()
            raise

    helper = threading.Thread(target=resume_once_warned)
    helper.start()
    worker.run(handle)
    helper.join()
    assert handled == [1]
    [paused] = delayq_records(caplog, logging.WARNING)
    assert "paused" in paused.getMessage() and "resume()" in paused.getMessage()
    assert any("resumed" in r.getMessage() for r in delayq_records(caplog, logging.INFO))


def test_a_failed_attempt_that_will_be_retried_is_logged_once_as_a_warning(
    queue: delayq.DelayQueue, caplog: pytest.LogCaptureFixture
) -> None:
    msg_id = queue.push({"n": 1}, max_attempts=3)
    caplog.set_level(logging.WARNING, logger="delayq")
    worker = delayq.Worker(queue, backoff_base=60)

    def fail(payload: object, msg: delayq.Message) -> None:
        worker.stop()
        raise LookupError("order 7 not found")

    worker.run(fail)
    [record] = delayq_records(caplog, logging.WARNING)
    message = record.getMessage()
    assert message.startswith(f"delayq[jobs]: message {msg_id} failed, retrying in "), message
    assert message.endswith(": LookupError: order 7 not found"), message
