from __future__ import annotations

import asyncio
import datetime
import os
import signal
import subprocess
import sys
import time

import pytest

import delayq
from harness import RedisServer


def test_push_and_get_round_trip_payloads_exactly(queue: delayq.DelayQueue) -> None:
    payload = {"order_id": 10086, "big": 2**63 - 1, "neg": -(2**63), "u": "日本語 ✓",
               "map": {"z": 1, "a": [1.5, None, True]}, "7": "str key", "empty": {}}
    msg_id = queue.push(payload, delay=60)
    info = queue.get(msg_id)
    assert info is not None
    assert info["id"] == msg_id
    assert info["state"] == "scheduled"
    assert info["payload"] == payload
    assert list(info["payload"]) == list(payload), "key order survives"
    assert info["attempts"] == 0 and info["last_error"] is None
    assert queue.get("no-such-id") is None
    assert queue.get(queue.push("now"))["state"] == "ready"  # type: ignore[index]


def test_scalars_and_tuples(queue: delayq.DelayQueue) -> None:
    for p in [None, True, 0, -7, 1.25, "text", [1, 2, 3]]:
        assert queue.get(queue.push(p))["payload"] == p  # type: ignore[index]
    assert queue.get(queue.push((1, "a")))["payload"] == [1, "a"]  # type: ignore[index]


def test_push_at_with_unix_seconds_and_datetimes(queue: delayq.DelayQueue) -> None:
    assert queue.get(queue.push_at("x", 4102444800.25))["due_at"] == 4102444800.25  # type: ignore[index]
    at = datetime.datetime(2100, 1, 1, 0, 0, 0, 500000, tzinfo=datetime.timezone.utc)
    assert queue.get(queue.push_at("y", at))["due_at"] == 4102444800.5  # type: ignore[index]
    assert queue.get(queue.push_at("past", 1))["state"] == "ready"  # type: ignore[index]


def test_an_id_makes_push_idempotent(queue: delayq.DelayQueue) -> None:
    first = queue.push({"v": 1}, 30, id="order-42-close", max_attempts=3)
    assert queue.push({"v": 2}, 90, id="order-42-close") == first == "order-42-close"
    info = queue.get(first)
    assert info is not None and info["payload"] == {"v": 1} and info["max_attempts"] == 3
    assert queue.stats()["pushed"] == 1


def test_a_replacing_push_debounces_a_waiting_message(queue: delayq.DelayQueue) -> None:
    queue.push({"v": 1}, 60, id="close-cart-7", replace=True)
    queue.push({"v": 2}, 1800, id="close-cart-7", replace=True, max_attempts=2)
    info = queue.get("close-cart-7")
    assert info is not None and (info["payload"], info["max_attempts"]) == ({"v": 2}, 2)
    assert info["due_at"] > time.time() + 1790, "the timer starts again"
    queue.push({"v": 3}, id="close-cart-7")
    assert (queue.get("close-cart-7") or {})["payload"] == {"v": 2}, "without replace it is kept"
    queue.push_at({"v": 4}, time.time() + 60, id="close-cart-7", replace=True)
    queue.push_many([{"payload": {"v": 5}, "id": "close-cart-7", "replace": True}])
    assert (queue.get("close-cart-7") or {})["payload"] == {"v": 5}
    stats = queue.stats()
    assert (stats["pushed"], stats["replaced"], stats["scheduled"] + stats["ready"]) == (1, 3, 1)
    with pytest.raises(delayq.InvalidArgumentError, match="replace"):
        queue.push({"v": 6}, replace=True)
    with pytest.raises(TypeError):
        queue.push_many([{"payload": {"v": 6}, "id": "close-cart-7", "replace": "yes"}])
    assert (queue.get("close-cart-7") or {})["payload"] == {"v": 5}, "refused pushes wrote nothing"


def test_push_many_tuples_and_dicts(queue: delayq.DelayQueue) -> None:
    ids = queue.push_many([({"i": i}, 0) for i in range(1200)])
    more = queue.push_many([{"payload": "later", "delay": 3600, "id": "fixed"}, {"payload": "at", "at": 4102444800}])
    assert len(ids) == 1200 and more[0] == "fixed"
    stats = queue.stats()
    assert stats["ready"] == 1200 and stats["scheduled"] == 2


def test_cancel_reschedule_purge_and_stats(queue: delayq.DelayQueue) -> None:
    msg_id = queue.push("x", 3600)
    assert queue.reschedule(msg_id, 0)
    assert queue.get(msg_id)["state"] == "ready"  # type: ignore[index]
    assert queue.cancel(msg_id) and not queue.cancel(msg_id)
    assert not queue.reschedule(msg_id, 5)
    queue.push(1)
    queue.push(2, 10)
    assert queue.purge() == 2
    stats = queue.stats()
    assert {k: stats[k] for k in ("scheduled", "ready", "inflight", "dead")} == dict.fromkeys(
        ("scheduled", "ready", "inflight", "dead"), 0)
    assert stats["cancelled"] == 1 and stats["next_due_at"] is None
    assert queue.name == "jobs" and queue.ping()


def nested(depth: int) -> list[object]:
    value: list[object] = []
    for _ in range(depth):
        value = [value]
    return value


BAD = [
    (lambda q: q.push(object()), TypeError, "payload is of type object"),
    (lambda q: q.push({"a": {1: 2}}), TypeError, "payload[\"a\"] has a key of type int"),
    (lambda q: q.push({"a": [set()]}), TypeError, "payload[\"a\"][0] is of type set"),
    (lambda q: q.push(float("nan")), delayq.PayloadError, "NaN"),
    (lambda q: q.push({"x": [float("-inf")]}), delayq.PayloadError, "payload[\"x\"][0] is -inf"),
    (lambda q: q.push(2**64), delayq.PayloadError, "64-bit"),
    (lambda q: q.push({"k": "\udcff"}), delayq.PayloadError, "payload[\"k\"] is a str that is not valid unicode"),
    (lambda q: q.push({"\ud800": 1}), delayq.PayloadError, "has a key that is not valid unicode"),
    (lambda q: q.push(b"\xff"), TypeError, "payload is of type bytes"),
    (lambda q: q.push(1, delay=float("nan")), delayq.InvalidArgumentError, "invalid delay"),
    (lambda q: q.push(1, delay=-1), ValueError, "must not be negative"),
    (lambda q: q.push(1, delay=float("inf")), ValueError, "must be finite"),
    (lambda q: q.push(1, delay="soon"), TypeError, "str"),
    (lambda q: q.push(1, id=""), delayq.InvalidArgumentError, "invalid id"),
    (lambda q: q.push(1, max_attempts=0), delayq.InvalidArgumentError, "max_attempts"),
    (lambda q: q.push(nested(200)), delayq.PayloadError, "nested deeper"),
    (lambda q: q.push_many([{"payload": 1}, {"payload": 2, "dleay": 1}]), delayq.InvalidArgumentError, "unknown key 'dleay'"),
    (lambda q: q.push_many([{"delay": 1}]), delayq.InvalidArgumentError, "has no 'payload'"),
    (lambda q: q.push_many([(1, 2, 3)]), TypeError, "pair"),
    (lambda q: q.push_many([{"payload": 1}, {"payload": {"a": float("nan")}}]), delayq.PayloadError,
     'push_many item 1 payload["a"] is NaN'),
    (lambda q: q.push_many([(1, 0), ([set()], 0)]), TypeError, "push_many item 1 payload[0] is of type set"),
    # Cut to its start and its end, not 200 segments.
    (lambda q: q.push(nested(200)), delayq.PayloadError, "payload" + "[0]" * 13 + "…" + "[0]" * 16 + " is nested"),
    (lambda q: q.push_at(1, "tomorrow"), TypeError, "at must be"),
    (lambda q: delayq.DelayQueue("http://127.0.0.1"), delayq.InvalidArgumentError, "invalid Redis URL"),
    (lambda q: delayq.DelayQueue("redis://127.0.0.1:1", "a{b"), delayq.InvalidArgumentError, "queue name"),
    (lambda q: delayq.DelayQueue("redis://127.0.0.1:1", layout="x"), delayq.InvalidArgumentError, "layout"),
    (lambda q: delayq.DelayQueue("redis://127.0.0.1:1", prefx="a"), TypeError, "prefx"),
    (lambda q: delayq.Worker(q, batch=5000), delayq.InvalidArgumentError, "batch"),
    (lambda q: delayq.Worker(q, concurrency=0), delayq.InvalidArgumentError, "concurrency"),
]


@pytest.mark.parametrize("call,exc,text", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_input_raises_a_named_error_and_writes_nothing(
    queue: delayq.DelayQueue, server: RedisServer, call, exc, text  # type: ignore[no-untyped-def]
) -> None:
    with pytest.raises(exc) as info:
        call(queue)
    assert text in str(info.value)
    assert server.keys() == []


def test_ints_outside_the_signed_64_bit_range_are_refused_with_their_path(queue: delayq.DelayQueue) -> None:
    # PHP and most JSON readers would get 2**63 and beyond as a rounded float.
    cases: list[tuple[object, str]] = [
        ({"n": 2**63}, 'payload["n"] is 9223372036854775808, outside the signed 64-bit range'),
        ({"n": 2**64 - 1}, 'payload["n"] is 18446744073709551615, outside the signed 64-bit range'),
        ([-(2**63) - 1], "payload[0] is -9223372036854775809, outside the signed 64-bit range"),
        ({"a": [1, {"b": 2**100}]}, 'payload["a"][1]["b"] is 1267650600228229401496703205376, outside'),
    ]
    for payload, text in cases:
        with pytest.raises(delayq.PayloadError) as caught:
            queue.push(payload)
        assert text in str(caught.value)
        with pytest.raises(delayq.PayloadError, match="outside the signed 64-bit range"):
            queue.push_many([{"payload": payload}])
        with pytest.raises(delayq.PayloadError, match="outside the signed 64-bit range"):
            queue.repeat("r", 60, payload)
    assert queue.stats()["pushed"] == 0
    edges = {"max": 2**63 - 1, "min": -(2**63), "list": [2**63 - 1, -(2**63)]}
    info = queue.get(queue.push(edges))
    assert info is not None and info["payload"] == edges
    assert type(info["payload"]["max"]) is int and info["payload"]["max"] == 9223372036854775807


def test_payload_limit(redis_url: str, server: RedisServer) -> None:
    q = delayq.DelayQueue(redis_url, "small", max_payload_bytes=16)
    with pytest.raises(delayq.PayloadError, match="over the limit of 16 bytes"):
        q.push("x" * 100)
    assert server.keys() == []


def test_connection_and_auth_errors(redis_url: str, server: RedisServer) -> None:
    from harness import free_port

    q = delayq.DelayQueue(f"redis://:secret@127.0.0.1:{free_port()}", retry_timeout=0.2)
    with pytest.raises(delayq.ConnectionError) as info:
        q.push(1)
    assert isinstance(info.value, ConnectionError) and "secret" not in str(info.value)
    server.cli("ACL", "SETUSER", "reader", "on", ">pw", "~*", "+ping")
    weak = delayq.DelayQueue(f"redis://reader:pw@127.0.0.1:{server.port}")
    with pytest.raises(delayq.AuthError, match="no permissions"):
        weak.push(1)
    wrong = delayq.DelayQueue(f"redis://reader:guess-0f-mine@127.0.0.1:{server.port}")
    with pytest.raises(delayq.AuthError, match='wrong password for user "reader"') as auth:
        wrong.push(1)
    assert "guess-0f-mine" not in str(auth.value), "the password is not echoed"
    # A worker fails at its start with the same error, instead of retrying.
    with pytest.raises(delayq.AuthError, match='wrong password for user "reader"'):
        delayq.Worker(wrong, stop_when_empty=True).run(lambda payload, msg: None)
    assert server.keys() == []


def test_a_queue_made_before_fork_works_in_parent_and_child(queue: delayq.DelayQueue) -> None:
    before = queue.push("before fork")
    pid = os.fork()
    if pid == 0:
        ok = queue.get(before) is not None and bool(queue.push("from child"))
        del queue
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert queue.stats()["ready"] == 2, "the child pushed through its own connection"
    assert queue.push("after fork")
    assert queue.stats()["ready"] == 3


def test_a_full_redis_refuses_pushes_with_their_own_error_and_workers_still_drain() -> None:
    full = RedisServer("--maxmemory-policy", "noeviction")
    try:
        q = delayq.DelayQueue(full.url, "full", keep_completed=5)
        q.push_many([{"payload": {"n": i, "pad": "x" * 200}} for i in range(2000)])
        used = int(full.cli("INFO", "memory").split("used_memory:")[1].split()[0])
        full.cli("CONFIG", "SET", "maxmemory", str(used - 100_000))
        with pytest.raises(delayq.OutOfMemoryError, match="nothing was written"):
            q.push({"n": -1})
        with pytest.raises(delayq.OutOfMemoryError, match="nothing was written"):
            q.push({"n": -1}, id="close-order-1")
        assert q.get("close-order-1") is None and q.stats()["pushed"] == 2000
        summary = delayq.Worker(q, stop_when_empty=True).run(lambda payload, message: None)
        assert (summary["acked"], summary["unwritten"]) == (2000, 0), summary
        assert q.push({"n": 2000}), "the drained queue left room"
    finally:
        full.stop()


def refused_after_its_first_script(server: RedisServer, q: delayq.DelayQueue, items: list[dict]) -> delayq.DelayQueueError:
    """Push ``items``, two scripts of 1 000, under maxmemory limits until one lets the
    first script in and refuses the second, and return that push's error. Each try
    starts from an empty server; one that wrote everything had too high a limit, one
    that wrote nothing too low. Searched for: what a script's arguments take while it
    runs differs between Redis versions."""

    def used() -> int:
        return int(server.cli("INFO", "memory").split("used_memory:")[1].split()[0])

    def empty() -> None:
        server.cli("CONFIG", "SET", "maxmemory", "0")
        server.cli("FLUSHALL")

    q.push_many(items[:10])
    empty()
    before = used()
    q.push_many(items[:1000])
    one = used() - before
    empty()
    low, high = before, before + 2 * one
    for _ in range(30):
        limit = low + (high - low) // 2
        server.cli("CONFIG", "SET", "maxmemory", str(limit))
        caught = None
        try:
            q.push_many(items)
        except delayq.DelayQueueError as e:
            caught = e
        server.cli("CONFIG", "SET", "maxmemory", "0")
        stored = int(server.cli("HLEN", "{dq:full}:messages"))
        if caught is not None and stored == 1000:
            return caught
        if caught is None:
            high = limit
        elif stored == 0:
            assert isinstance(caught, delayq.OutOfMemoryError), caught
            low = limit
        else:
            raise AssertionError(f"{stored} messages stored: {caught}")
        empty()
    raise AssertionError(f"no maxmemory between {low} and {high} lets one script of the batch in and not the other")


def test_a_streamed_batch_refused_for_memory_after_its_first_script_names_the_ids_it_wrote() -> None:
    full = RedisServer("--maxmemory-policy", "noeviction")
    try:
        q = delayq.DelayQueue(full.url, "full")
        items = [{"payload": {"i": i, "pad": "x" * 100}, "delay": 60} for i in range(2000)]
        e = refused_after_its_first_script(full, q, items)
        # Still the class it was, for code that catches that.
        assert isinstance(e, delayq.OutOfMemoryError) and isinstance(e, delayq.PartialPushError), type(e)
        assert "1000 of the batch's 2000 messages were written and the other 1000 were not" in str(e), str(e)
        assert "nothing was written" not in str(e)
        assert len(e.ids) == 2000
        assert e.written_ids == e.ids[:1000], "the first script's ids, in order"
        assert e.written == 1000 and e.unknown_ids == []
        assert sorted(full.cli("HKEYS", "{dq:full}:messages").split()) == sorted(e.written_ids)
        assert full.cli("HLEN", "{dq:full}:messages") == "1000"
        assert q.get(e.written_ids[999])["payload"] == {"i": 999, "pad": "x" * 100}  # type: ignore[index]
        # The whole batch again under those ids writes the rest, once.
        assert q.push_many([dict(item, id=given) for item, given in zip(items, e.ids)]) == e.ids
        assert full.cli("HLEN", "{dq:full}:messages") == "2000"
    finally:
        full.stop()


def test_errors_share_one_root() -> None:
    for e in (delayq.InvalidArgumentError, delayq.PayloadError, delayq.ConnectionError, delayq.TimeoutError,
              delayq.AuthError, delayq.LeaseLostError, delayq.OutOfMemoryError):
        assert issubclass(e, delayq.DelayQueueError)
    assert issubclass(delayq.TimeoutError, TimeoutError) and issubclass(delayq.InvalidArgumentError, ValueError)
    assert signal.SIGTERM  # the worker tests rely on it


def test_a_partitioned_queue_spreads_and_keyed_messages_stay_together(redis_url: str, server: RedisServer) -> None:
    q = delayq.DelayQueue(redis_url, "parts", partitions=3)
    ids = q.push_many([{"payload": {"n": i}, "delay": 60} for i in range(300)])
    # The queue's keys; the registry of queues (dq:queues) is none of them.
    tags = {k.split("}")[0] + "}" for k in server.keys() if k != "dq:queues"}
    assert len(tags) == 3, tags
    stats = q.stats()
    assert (stats["scheduled"], stats["partitions"]) == (300, 3)
    assert all(q.get(i)["state"] == "scheduled" for i in ids[:10])  # type: ignore[index]
    alice = [q.push({"step": s}, partition_key="alice") for s in range(5)]
    bob = q.push_at("bob", 4102444800.0, partition_key="bob")
    q.push_many([{"payload": "carol", "partition_key": "carol"}])
    assert q.cancel(bob) and q.reschedule(alice[0], delay=30)
    assert q.purge() == 306
    with pytest.raises(delayq.InvalidArgumentError, match="partition_key"):
        q.push(1, partition_key="")
    for bad in (0, 1025):
        with pytest.raises(delayq.InvalidArgumentError, match="partitions"):
            delayq.DelayQueue(redis_url, "parts", partitions=bad)
    with pytest.raises(delayq.InvalidArgumentError, match="partitions"):
        delayq.DelayQueue(redis_url, "parts", partitions=2, layout="seed")


def test_a_push_that_no_replica_confirms_raises_a_timeout(redis_url: str) -> None:
    q = delayq.DelayQueue(redis_url, "durable", wait_replicas=1, wait_timeout=0.1)
    with pytest.raises(delayq.TimeoutError, match="0 of 1 replicas"):
        q.push("must survive a failover", id="order-1")
    assert q.get("order-1")["state"] == "ready"  # type: ignore[index]


def test_the_asyncio_queue_makes_every_call_a_coroutine_with_the_same_errors(queue: delayq.DelayQueue) -> None:
    aq = delayq.AsyncDelayQueue(queue)
    assert aq.sync is queue and aq.name == queue.name

    async def main() -> None:
        ids = await asyncio.gather(*(aq.push({"n": i}, delay=60) for i in range(50)))
        assert len(set(ids)) == 50
        assert await aq.push_many(({"payload": {"n": i}} for i in range(50, 60))) != []
        info = await aq.get(ids[0])
        assert info is not None and info["payload"] == {"n": 0}
        assert (await aq.stats())["scheduled"] == 50
        assert len(await aq.waiting(1000)) == 60
        assert await aq.reschedule(ids[1], 0) and await aq.cancel(ids[2])
        assert await aq.pause() and await aq.is_paused() and await aq.resume()
        await aq.set_rate_limit(10, 2.0)
        assert await aq.rate_limit() == {"max": 10, "per": 2.0} and await aq.clear_rate_limit()
        with pytest.raises(delayq.InvalidArgumentError, match="delay"):
            await aq.push(1, delay=-1)
        with pytest.raises(TypeError, match=r'payload\["bad"\]'):
            await aq.push({"bad": object()})
        assert await aq.ping() and await aq.workers() == [] and await aq.dead_letters() == []
        assert await aq.inflight() == [] and await aq.requeue_dead() == 0 and await aq.delete_dead() == 0
        assert await aq.push_at({"n": "at"}, 1924992000.0) and await aq.purge() == 60

    asyncio.run(main())
    with pytest.raises(TypeError, match="wraps a delayq.DelayQueue"):
        delayq.AsyncDelayQueue("redis://127.0.0.1")  # type: ignore[arg-type]


def test_move_waiting_repartitions_a_queue_keeping_ids_payloads_due_times_and_limits(redis_url: str) -> None:
    old = delayq.DelayQueue(redis_url, "old")
    new = delayq.DelayQueue(redis_url, "new", partitions=3)
    ids = [old.push({"n": i, "text": "日本"}, delay=60 + i, max_attempts=2, id=f"order-{i}") for i in range(30)]
    before = {i: old.get(i) for i in ids}

    assert old.move_waiting(new) == 30

    for i in ids:
        moved, was = new.get(i), before[i]
        assert moved is not None and was is not None
        assert (moved["payload"], moved["due_at"], moved["max_attempts"]) == (
            was["payload"], was["due_at"], was["max_attempts"])
    assert old.stats()["moved"] == 30 and old.stats()["scheduled"] == 0
    assert {k: v for k, v in new.stats().items() if k in ("scheduled", "pushed")} == {"scheduled": 30, "pushed": 30}

    async def back() -> int:
        return await delayq.AsyncDelayQueue(new).move_waiting(delayq.AsyncDelayQueue(old))

    assert asyncio.run(back()) == 30 and old.stats()["scheduled"] == 30
    with pytest.raises(delayq.InvalidArgumentError, match="itself"):
        old.move_waiting(old)
    with pytest.raises(TypeError):
        old.move_waiting("new")  # type: ignore[arg-type]


def test_keep_completed_shows_what_ran_when_and_in_how_many_attempts(redis_url: str) -> None:
    q = delayq.DelayQueue(redis_url, "kept", keep_completed=2, keep_completed_for=3600)
    ids = [q.push({"n": n}, id=f"order-{n}") for n in range(3)]
    failed: list[int] = []
    done: list[int] = []
    # One claiming thread: two would each claim one message (the prefetch of one
    # handler), and hand them out, and complete them, in either order.
    worker = delayq.Worker(q, threads=1, backoff_base=0.01, backoff_max=0.01)

    def handle(payload: dict[str, Any], msg: delayq.Message) -> None:
        if payload["n"] == 2 and not failed:
            failed.append(2)
            raise RuntimeError("gateway down")
        done.append(payload["n"])
        if len(done) == 3:
            worker.stop()  # run() returns once the acknowledgements are written

    worker.run(handle)

    assert q.get(ids[0]) is None, "past keep_completed=2"
    last = q.get(ids[2])
    assert last is not None and (last["state"], last["attempts"], last["payload"]) == ("completed", 2, {"n": 2})
    assert last["completed_at"] >= last["due_at"] and last["last_error"] is None
    assert [m["id"] for m in q.completed()] == [ids[2], ids[1]], "latest first"
    assert q.stats()["completed"] == 2 and q.stats()["acked"] == 3

    async def listed() -> list[dict[str, Any]]:
        return await delayq.AsyncDelayQueue(q).completed(1)

    assert [m["id"] for m in asyncio.run(listed())] == [ids[2]]
    with pytest.raises(delayq.InvalidArgumentError, match="keep_completed"):
        delayq.DelayQueue(redis_url, "kept", keep_completed=1_000_001)
    with pytest.raises(delayq.InvalidArgumentError, match="keep_completed_for"):
        delayq.DelayQueue(redis_url, "kept", keep_completed=10, keep_completed_for=0.5)


def test_a_naive_datetime_is_local_time_and_an_aware_one_its_own(redis_url: str) -> None:
    # In a process whose local time is UTC+8 (no daylight saving there), as documented.
    code = (
        "import datetime, sys, delayq\n"
        "q = delayq.DelayQueue(sys.argv[1], 'jobs')\n"
        "naive = datetime.datetime(2030, 1, 1, 8, 0)\n"
        "aware = datetime.datetime(2030, 1, 1, 8, 0, tzinfo=datetime.timezone.utc)\n"
        "print(q.get(q.push_at(1, naive))['due_at'], q.get(q.push_at(2, aware))['due_at'])\n"
    )
    done = subprocess.run([sys.executable, "-c", code, redis_url], capture_output=True, text=True, check=True,
                          env={**os.environ, "TZ": "Asia/Shanghai"}, timeout=60)
    naive_due, aware_due = (float(x) for x in done.stdout.split())
    assert naive_due == 1893456000.0  # 2030-01-01 00:00 UTC
    assert aware_due == 1893484800.0  # 2030-01-01 08:00 UTC


@pytest.mark.parametrize("call,text", [
    (lambda q: q.push(1, id=42), "argument 'id' must be str, not int"),
    (lambda q: q.push(1, delay="5"), "argument 'delay' must be a number of seconds (int or float), not str"),
    (lambda q: q.push(1, max_attempts="3"), "argument 'max_attempts' must be int, not str"),
    (lambda q: q.push(1, partition_key=7), "argument 'partition_key' must be str, not int"),
    (lambda q: q.push(1, replace="yes"), "argument 'replace' must be bool, not str"),
    (lambda q: q.push(1, expire_after="1"), "argument 'expire_after' must be a number of seconds"),
    (lambda q: q.push_at(1, 0.0, serial_key=1), "argument 'serial_key' must be str, not int"),
    (lambda q: q.reschedule(5, 1), "argument 'id' must be str, not int"),
    (lambda q: q.get(None), "argument 'id' must be str, not NoneType"),
    (lambda q: q.find(10086), "argument 'text' must be str, not int"),
    (lambda q: q.waiting("10"), "argument 'limit' must be int, not str"),
    (lambda q: q.repeat("r", 60, {}, tz=8), "argument 'tz' must be str, not int"),
    (lambda q: q.set_rate_limit(1, per="1"), "argument 'per' must be a number of seconds"),
    (lambda q: delayq.Worker(q, threads="2"), "argument 'threads' must be int, not str"),
    (lambda q: delayq.Worker(q, lease="30"), "argument 'lease' must be a number of seconds"),
    (lambda q: delayq.Worker(q, max_attempts=2.5), "argument 'max_attempts' must be int, not float"),
    (lambda q: delayq.Worker(q, timeout="1"), "argument 'timeout' must be a number of seconds"),
    (lambda q: delayq.Worker(q, stop_when_empty="yes"), "argument 'stop_when_empty' must be bool, not str"),
])
def test_a_wrong_argument_type_is_named(queue: delayq.DelayQueue, server: RedisServer, call, text) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TypeError) as info:
        call(queue)
    assert text in str(info.value)
    assert server.keys() == []


def test_a_delay_may_be_any_real_number(queue: delayq.DelayQueue) -> None:
    import decimal
    import fractions
    for delay in (decimal.Decimal("60.5"), fractions.Fraction(121, 2)):
        info = queue.get(queue.push(1, delay))
        assert info is not None and info["state"] == "scheduled"


def test_queues_sharing_a_connection_are_one_client_with_their_own_options(redis_url: str) -> None:
    import redis

    r = redis.Redis.from_url(redis_url)
    base = delayq.DelayQueue(redis_url, "orders", prefix="shop", connect_timeout=0.5)
    wide = base.sharing_connection("emails", partitions=3)
    seed = base.sharing_connection("legacy", layout="seed", zset_key="old:zset", payload_key="old:payload")
    before = int(r.info("stats")["total_connections_received"])
    base.push({"n": 1})
    wide.push({"n": 2}, delay=60)
    seed.push({"n": 3}, delay=60)
    assert int(r.info("stats")["total_connections_received"]) - before == 1
    assert base.stats()["ready"] == 1 and wide.stats()["scheduled"] == 1 and seed.stats()["scheduled"] == 1
    # The prefix is the first queue's unless given.
    assert r.keys("{shop:orders}*") and r.keys("{shop:emails:p*") and not r.keys("{dq:*")
    assert base.sharing_connection("other", prefix="dq").push(1) and r.keys("{dq:other}*")
    with pytest.raises(delayq.InvalidArgumentError, match="queue name"):
        base.sharing_connection("bad{name")
    with pytest.raises(delayq.InvalidArgumentError, match="partitions"):
        base.sharing_connection("x", partitions=0)
    with pytest.raises(TypeError):
        base.sharing_connection("x", connect_timeout=1.0)  # type: ignore[call-arg]
    first, total = base.registered_queues_page(2)
    rest, _ = base.registered_queues_page(10, start=2)
    assert total == 3 and len(first) == 2 and len(rest) == 1
    assert sorted(e["name"] for e in first + rest) == ["emails", "legacy", "orders"]
