"""Groups through the Python module: the ``group`` push option, ``set_group_limit``,
``Message.group`` and ``get()``'s ``group`` and ``held`` (the policy is the core's,
tested in core/tests/groups.rs)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Callable

import delayq
import pytest
from delayq.aio import AsyncDelayQueue


def test_a_group_is_kept_with_the_message_of_every_push(queue: delayq.DelayQueue) -> None:
    pushed = queue.push({"n": 1}, 60, group="merchant-42")
    at = queue.push_at({"n": 2}, time.time() + 60, group="merchant-42")
    many, plain = queue.push_many([{"payload": {"n": 3}, "delay": 60, "group": "merchant-7"},
                                   {"payload": {"n": 4}, "delay": 60}])
    infos = [queue.get(i) for i in (pushed, at, many, plain)]
    assert [i["group"] for i in infos if i] == ["merchant-42", "merchant-42", "merchant-7", None]
    assert infos[0] and infos[0]["held"] is None, "not due: not held"
    listed = {m["id"]: m["group"] for m in queue.waiting(10)}
    assert listed[many] == "merchant-7"


def test_set_group_limit_says_whether_limits_were_in_force(queue: delayq.DelayQueue) -> None:
    assert queue.set_group_limit("merchant-42", concurrency=3) is False
    assert queue.set_group_limit("merchant-42", concurrency=2, max=10, per=60) is True
    assert queue.set_group_limit("merchant-42") is True, "clearing"
    assert queue.set_group_limit("merchant-42") is False, "cleared"
    assert queue.set_group_limit(None, max=5) is False, "the default"
    assert asyncio.run(AsyncDelayQueue(queue).set_group_limit(None)) is True


def test_a_group_never_runs_more_than_its_limit_while_others_go_on(queue: delayq.DelayQueue) -> None:
    queue.set_group_limit("merchant-42", concurrency=2)
    queue.push_many([{"payload": {"n": n, "group": "merchant-42"}, "delay": n / 1000, "group": "merchant-42"}
                     for n in range(8)]
                    + [{"payload": {"n": n, "group": "merchant-7"}, "delay": 0.01, "group": "merchant-7"}
                       for n in range(4)])
    ids = [m["id"] for m in queue.waiting(20)]
    running: dict[str, int] = {}
    peak: dict[str, int] = {}
    seen: list[str] = []
    held: list[str] = []
    worker = delayq.Worker(queue, concurrency=6, lease=60, stop_when_empty=True)

    async def handle(payload: dict[str, Any], msg: delayq.Message) -> None:
        group = msg.group or ""
        assert group == payload["group"]
        running[group] = running.get(group, 0) + 1
        peak[group] = max(peak.get(group, 0), running[group])
        seen.append(group)
        if group == "merchant-42" and not held:
            # Idle handlers meanwhile claimed the group's next messages, which wait.
            await asyncio.sleep(0.02)
            held.extend(h for i in ids if (info := queue.get(i)) and (h := info["held"]))
        await asyncio.sleep(0.04)
        running[group] -= 1

    done = threading.Timer(30, worker.stop)
    done.start()
    try:
        summary = worker.run(handle)
    finally:
        done.cancel()
    assert summary["acked"] == 12 and summary["stopped_by"] == "empty", summary
    assert peak["merchant-42"] == 2, "at most the limit of merchant-42 ran at once"
    assert peak["merchant-7"] > 1, "merchant-7 has no limit"
    assert seen.index("merchant-7") < len(seen) - 4, "merchant-7 went on beside merchant-42's backlog"
    assert 'group "merchant-42" runs 2 of its concurrency limit of 2' in held
    assert queue.stats()["held"] == 0


def test_the_handler_sees_its_messages_group(queue: delayq.DelayQueue) -> None:
    queue.push_many([{"payload": "grouped", "group": "merchant-42"}, {"payload": "plain"}])
    groups: dict[str, str | None] = {}

    def handle(payload: str, msg: delayq.Message) -> None:
        groups[payload] = msg.group

    summary = delayq.Worker(queue, stop_when_empty=True).run(handle)
    assert groups == {"grouped": "merchant-42", "plain": None}
    assert summary["acked"] == 2


BAD_CALLS: dict[str, tuple[Callable[[delayq.DelayQueue], object], str]] = {
    "a group and a serial key": (lambda q: q.push(1, group="g", serial_key="k"), "group"),
    "an empty group": (lambda q: q.push(1, group=""), "group"),
    "a push_many item with both": (
        lambda q: q.push_many([{"payload": 1}, {"payload": 2, "group": "g", "serial_key": "k"}]), "group"),
    "a concurrency of 0": (lambda q: q.set_group_limit("g", concurrency=0), "concurrency"),
    "a negative concurrency": (lambda q: q.set_group_limit("g", concurrency=-1), "concurrency"),
    "a max of 0": (lambda q: q.set_group_limit("g", max=0), "max"),
    "per without max": (lambda q: q.set_group_limit("g", concurrency=2, per=60), "per"),
    "an empty group limited": (lambda q: q.set_group_limit("", concurrency=2), "group"),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_bad_input_is_refused_naming_it_and_writes_nothing(queue: delayq.DelayQueue, case: str) -> None:
    call, named = BAD_CALLS[case]
    with pytest.raises(delayq.InvalidArgumentError, match=named):
        call(queue)
    assert queue.stats()["pushed"] == 0
    assert queue.set_group_limit("g") is False, "no limits were written"


def test_wrong_types_are_type_errors_naming_the_argument(queue: delayq.DelayQueue) -> None:
    for call, named in [(lambda: queue.push(1, group=42), "group"),  # type: ignore[arg-type]
                        (lambda: queue.set_group_limit("g", concurrency="2"), "concurrency"),  # type: ignore[arg-type]
                        (lambda: queue.set_group_limit("g", max=1, per="1"), "per")]:  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=named):
            call()


def test_the_seed_layout_refuses_groups(redis_url: str) -> None:
    seed = delayq.DelayQueue(redis_url, "tenants", layout="seed")
    for call in (lambda: seed.push(1, group="g"), lambda: seed.set_group_limit("g", concurrency=1)):
        with pytest.raises(delayq.InvalidArgumentError, match="seed layout"):
            call()
