"""`python -m delayq` (installed as `delayq`): the operator's view of a queue."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, Callable

import pytest

import delayq
from harness import RedisServer, free_port, wait_for


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "delayq", "--url", url, "--queue", "jobs", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )


def cli_json(url: str, *args: str) -> Any:
    done = cli(url, "--json", *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def make_dead(queue: delayq.DelayQueue, n: int) -> list[str]:
    ids = [queue.push({"doomed": i, "text": "ünïcode"}, max_attempts=1) for i in range(n)]
    worker = delayq.Worker(queue)
    calls: list[str] = []

    def fail(payload: Any, msg: delayq.Message) -> None:
        calls.append(msg.id)
        if len(calls) == n:
            worker.stop()
        raise ValueError(f"cannot close order {payload['doomed']}")

    worker.run(fail)
    assert queue.stats()["dead"] == n
    return ids


def test_stats_get_and_dead_letters_read_what_the_api_reads(queue: delayq.DelayQueue, redis_url: str) -> None:
    [dead] = make_dead(queue, 1)
    waiting = queue.push({"later": True}, delay=3600, id="close-order-1")

    stats = cli_json(redis_url, "stats")
    assert stats == queue.stats()
    assert (stats["scheduled"], stats["dead"], stats["died"]) == (1, 1, 1)
    text = cli(redis_url, "stats").stdout
    assert "queue jobs: 1 scheduled, 0 ready, 0 inflight, 1 dead" in text

    assert cli_json(redis_url, "get", waiting) == queue.get(waiting)
    text = cli(redis_url, "get", dead).stdout
    assert "state:        dead" in text and "ValueError: cannot close order 0" in text
    # The traceback closes the page, each line indented under its heading.
    assert "\nerror trace:\n    Traceback (most recent call last):\n" in text
    assert text.rstrip().endswith("    ValueError: cannot close order 0"), text
    assert '"text":"ünïcode"' in text

    assert cli_json(redis_url, "dead") == queue.dead_letters(20)
    text = cli(redis_url, "dead").stdout
    assert text.startswith(f"{dead}  died ") and "after 1 attempts" in text

    missing = cli(redis_url, "get", "no-such-id")
    assert missing.returncode == 1 and "no message 'no-such-id'" in missing.stderr


def test_dead_letters_are_requeued_and_deleted_one_or_all(queue: delayq.DelayQueue, redis_url: str) -> None:
    ids = make_dead(queue, 4)
    assert cli_json(redis_url, "requeue-dead", ids[0]) == {"requeued": 1}
    info = queue.get(ids[0])
    assert info is not None and info["state"] == "ready"

    not_dead = cli(redis_url, "delete-dead", ids[0])
    assert not_dead.returncode == 1 and "is not a dead letter" in not_dead.stderr
    assert queue.get(ids[0]) is not None, "a waiting message is not touched"

    assert cli_json(redis_url, "delete-dead", ids[1]) == {"deleted": 1}
    assert queue.get(ids[1]) is None
    assert cli(redis_url, "delete-dead", "--all").stdout == "deleted 2 dead letters\n"
    assert queue.stats()["dead"] == 0

    usage = cli(redis_url, "delete-dead")
    assert usage.returncode == 2 and "one of the arguments id --all --error is required" in usage.stderr
    assert cli(redis_url, "requeue-dead", "--all").stdout == "requeued 0 dead letters\n"


def test_dead_letters_are_requeued_and_deleted_by_the_text_of_their_error(
    queue: delayq.DelayQueue, redis_url: str
) -> None:
    ids = make_dead(queue, 4)  # "ValueError: cannot close order <i>"
    assert cli_json(redis_url, "requeue-dead", "--error", "close order 1") == {"requeued": 1}
    assert queue.get(ids[1])["state"] == "ready"  # type: ignore[index]
    assert cli(redis_url, "delete-dead", "--error", "order 2").stdout == "deleted 1 dead letter\n"
    assert queue.get(ids[2]) is None
    assert queue.requeue_dead_with_error("no such text") == 0
    assert queue.delete_dead_with_error("ValueError") == 2 and queue.stats()["dead"] == 0

    async def requeue() -> int:
        return await delayq.AsyncDelayQueue(queue).requeue_dead_with_error("ValueError")

    assert asyncio.run(requeue()) == 0
    with pytest.raises(delayq.InvalidArgumentError, match="text"):
        queue.requeue_dead_with_error("")
    bad = cli(redis_url, "requeue-dead", "--error", "")
    assert bad.returncode == 2 and "text" in bad.stderr


def test_workers_lists_the_pools_alive(queue: delayq.DelayQueue, redis_url: str) -> None:
    assert cli(redis_url, "workers").stdout == "queue jobs: 0 pools alive\n"
    worker = delayq.Worker(queue, threads=2)
    runner = threading.Thread(target=worker.run, args=(lambda payload, msg: None,))
    runner.start()
    try:
        wait_for(10, "the pool to register", lambda: len(queue.workers()) == 1)
        [pool] = cli_json(redis_url, "workers")
        assert (pool["pid"], pool["threads"]) == (os.getpid(), 2)
        text = cli(redis_url, "workers").stdout
        assert text.startswith("queue jobs: 1 pool alive\n") and pool["id"] in text
    finally:
        worker.stop()
        runner.join()
    assert cli_json(redis_url, "workers") == []


def test_cancel_and_purge(queue: delayq.DelayQueue, redis_url: str) -> None:
    a = queue.push({"n": 1}, delay=60)
    queue.push({"n": 2}, delay=60)
    assert cli_json(redis_url, "cancel", a) == {"cancelled": True}
    again = cli(redis_url, "cancel", a)
    assert again.returncode == 1 and "is not cancelled in" in again.stderr

    refused = cli(redis_url, "purge")
    assert refused.returncode == 2 and "add --yes" in refused.stderr
    assert queue.stats()["scheduled"] == 1, "nothing deleted without --yes"
    assert cli_json(redis_url, "purge", "--yes") == {"purged": 1}
    assert queue.stats()["scheduled"] == 0


def test_cancel_marks_a_running_message_and_with_kill_too(queue: delayq.DelayQueue, redis_url: str) -> None:
    ids = [queue.push({"n": n}) for n in range(2)]
    started: list[str] = []
    seen: list[str] = []

    def handle(payload: Any, msg: delayq.Message) -> None:
        started.append(msg.id)
        wait_for(10, "the cancel", lambda: msg.cancelled)
        seen.append(msg.id)

    worker = delayq.Worker(queue, threads=1, lease=0.6, stop_when_empty=True)
    runner = threading.Thread(target=worker.run, args=(handle,))
    runner.start()
    try:
        wait_for(10, "the first handler running", lambda: len(started) == 1)
        assert cli_json(redis_url, "cancel", started[0]) == {"cancelled": True}
        wait_for(10, "the second handler running", lambda: len(started) == 2)
        assert cli(redis_url, "cancel", "--kill", started[1]).stdout == f"cancelled {started[1]}\n"
    finally:
        runner.join(20)
    assert sorted(seen) == sorted(ids)
    stats = queue.stats()
    assert (stats["cancelled"], stats["acked"], stats["retried"]) == (2, 0, 0), stats


def test_bad_input_and_an_unreachable_redis_have_their_own_exit_status(redis_url: str) -> None:
    bad = cli(redis_url, "get", "")
    assert bad.returncode == 2 and "id" in bad.stderr

    mixed = cli(redis_url, "--zset-key", "my:zset", "stats")
    assert mixed.returncode == 2 and "applies only with layout 'seed'" in mixed.stderr

    gone = RedisServer()
    url = gone.url
    gone.stop()
    down = cli(url, "ping")
    assert down.returncode == 3 and "cannot connect to Redis" in down.stderr


def test_move_waiting_takes_the_recipes_messages_to_the_native_layout(server: RedisServer, redis_url: str) -> None:
    # What the recipe's phpredis producer writes: HSET the payload, ZADD the due second.
    now = int(server.cli("TIME").split()[0])
    for i, due in enumerate((now - 1, now + 3600)):
        server.cli("HSET", "delay_queue:payload", f"msg_{i}", json.dumps({"order_id": i}))
        server.cli("ZADD", "delay_queue:zset", str(due), f"msg_{i}")
    seed = ("--layout", "seed")
    assert cli_json(redis_url, *seed, "move-waiting", "--to", "orders") == {"moved": 2}
    assert server.cli("EXISTS", "delay_queue:zset", "delay_queue:payload") == "0"
    native = delayq.DelayQueue(redis_url, "orders")
    later = native.get("msg_1")
    assert later is not None and (later["payload"], later["due_at"]) == ({"order_id": 1}, float(now + 3600))
    # Named by its keys: its name ("jobs") is in none of them.
    assert cli(redis_url, *seed, "move-waiting", "--to", "orders").stdout == (
        "moved 0 waiting messages from seed queue delay_queue:zset + delay_queue:payload to queue orders\n")
    assert cli(redis_url, *seed, "--zset-key", "z", "--payload-key", "h", "stats").stdout.startswith(
        "seed queue z + h: 0 scheduled")

    native.push("remind", delay=60, expire_after=30, id="reminder-1")
    refused = cli(redis_url, "--queue", "orders", "move-waiting", "--to", "x", "--to-layout", "seed")
    assert refused.returncode == 2 and '"reminder-1"' in refused.stderr, refused.stderr
    assert native.get("reminder-1") is not None and server.cli("EXISTS", "delay_queue:zset") == "0"


def test_watch_prints_depth_and_rates_a_line_per_interval(queue: delayq.DelayQueue, redis_url: str) -> None:
    watch = subprocess.Popen(
        [sys.executable, "-m", "delayq", "--url", redis_url, "--queue", "jobs", "--json", "watch", "--every", "0.5",
         "--count", "2"], stdout=subprocess.PIPE, text=True)
    assert watch.stdout is not None
    first = json.loads(watch.stdout.readline())
    queue.push_many([{"payload": {"n": i}} for i in range(50)])
    second = json.loads(watch.stdout.readline())
    assert watch.wait(10) == 0 and watch.stdout.read() == ""
    assert (first["ready"], first["per_second"]["pushed"]) == (0, 0)
    assert second["ready"] == 50 and second["per_second"]["pushed"] > 0 and second["lag"] >= 0
    assert set(second["per_second"]) == {"pushed", "delivered", "acked", "retried", "died"}

    line = cli(redis_url, "watch", "--every", "0.1", "--count", "1").stdout
    assert "scheduled 0  ready 50  inflight 0  dead 0  completed 0  | per s: pushed 0" in line, line
    assert cli(redis_url, "watch", "--every", "0").returncode == 2


def test_find_shows_the_messages_holding_a_text_in_any_state(queue: delayq.DelayQueue, redis_url: str) -> None:
    queue.push_many([{"payload": {"order_id": 20000 + i}, "delay": 3600} for i in range(1500)])
    later = queue.push({"order_id": 10086, "step": "remind"}, delay=600)
    [dead] = make_dead(queue, 1)
    text = cli(redis_url, "find", "10086").stdout
    assert f"{later}  scheduled" in text and '"step":"remind"' in text, text
    assert [m["id"] for m in cli_json(redis_url, "find", "doomed")] == [dead]
    assert [m["state"] for m in queue.find("doomed")] == ["dead"]

    async def found() -> list[dict[str, Any]]:
        return await delayq.AsyncDelayQueue(queue).find("10086", limit=5)

    assert [m["id"] for m in asyncio.run(found())] == [later]
    nothing = cli(redis_url, "find", "no such order")
    assert nothing.returncode == 1 and nothing.stdout == "queue jobs: no message holds 'no such order'\n"
    with pytest.raises(delayq.InvalidArgumentError, match="text"):
        queue.find("")


def test_find_field_matches_a_payload_field_exactly(queue: delayq.DelayQueue, redis_url: str) -> None:
    order = queue.push({"order_id": 10086}, delay=600)
    as_text = queue.push({"order_id": "10086"}, delay=600)
    for other in ({"order_id": 100861}, {"sub_order_id": 10086}, {"nested": {"order_id": 10086}}):
        queue.push(other, delay=600)
    assert len(queue.find("10086")) == 5
    assert [m["id"] for m in queue.find_field("order_id", 10086)] == [order]
    assert [m["id"] for m in queue.find_field("order_id", "10086")] == [as_text]

    async def found() -> list[dict[str, Any]]:
        return await delayq.AsyncDelayQueue(queue).find_field("order_id", 10086)

    assert [m["id"] for m in asyncio.run(found())] == [order]
    assert [m["id"] for m in cli_json(redis_url, "find", "10086", "--field", "order_id")] == [order]
    assert [m["id"] for m in cli_json(redis_url, "find", '"10086"', "--field", "order_id")] == [as_text]
    nothing = cli(redis_url, "find", "1", "--field", "order_id")
    assert nothing.returncode == 1 and nothing.stdout == "queue jobs: no message has order_id = 1\n"
    with pytest.raises(delayq.InvalidArgumentError, match="value"):
        queue.find_field("order_id", [10086])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="argument 'field' must be str"):
        queue.find_field(1, 1)  # type: ignore[arg-type]


def test_pause_and_resume(queue: delayq.DelayQueue, redis_url: str) -> None:
    assert "consumption: running" in cli(redis_url, "stats").stdout
    assert cli_json(redis_url, "pause") == {"paused": True, "changed": True}
    assert queue.is_paused()
    assert cli(redis_url, "pause").stdout == "queue jobs was paused already\n"
    assert "consumption: paused since 20" in cli(redis_url, "stats").stdout
    assert cli_json(redis_url, "resume") == {"paused": False, "changed": True}
    assert not queue.is_paused()
    assert cli(redis_url, "resume").stdout == "queue jobs was not paused\n"


def test_restart_workers_reports_the_pools_asked(queue: delayq.DelayQueue, redis_url: str) -> None:
    assert cli_json(redis_url, "restart-workers") == {"pools": 0}
    worker = delayq.Worker(queue, idle_check=600)
    result: list[dict[str, Any]] = []
    runner = threading.Thread(target=lambda: result.append(worker.run(lambda payload, msg: None)))
    runner.start()
    try:
        wait_for(10, "the pool listed", lambda: len(queue.workers()) == 1)
        done = cli(redis_url, "restart-workers")
        assert done.stdout == ("queue jobs: asked 1 worker pool to stop after their running handlers "
                               "(their process manager starts them anew)\n")
        runner.join(10)
        assert not runner.is_alive()
    finally:
        worker.stop()
        runner.join()
    assert result[0]["stopped_by"] == "restart"


def test_rate_limit_is_shown_set_and_cleared(queue: delayq.DelayQueue, redis_url: str) -> None:
    assert cli(redis_url, "rate-limit").stdout == "queue jobs: rate limit: none\n"
    assert cli_json(redis_url, "rate-limit", "100", "--per", "60") == {"rate_limit": {"max": 100, "per": 60.0}}
    assert queue.rate_limit() == {"max": 100, "per": 60.0}
    assert cli(redis_url, "rate-limit").stdout == "queue jobs: rate limit: at most 100 messages per 60 s\n"
    assert "rate limit: at most 100 messages per 60 s" in cli(redis_url, "stats").stdout
    assert cli_json(redis_url, "rate-limit", "5") == {"rate_limit": {"max": 5, "per": 1.0}}, "per defaults to 1 s"
    for bad, says in [(["0"], "max"), (["5", "--per", "0"], "per"), (["5", "--clear"], "not both"),
                      (["--per", "3"], "goes with a MAX"), (["many"], "invalid int")]:
        done = cli(redis_url, "rate-limit", *bad)
        assert done.returncode == 2 and says in done.stderr, (bad, done.stderr)
    assert queue.rate_limit() == {"max": 5, "per": 1.0}, "a refused change leaves the limit alone"
    assert cli_json(redis_url, "rate-limit", "--clear") == {"rate_limit": None, "changed": True}
    assert cli(redis_url, "rate-limit", "--clear").stdout == "queue jobs had no rate limit\n"
    assert queue.rate_limit() is None


def test_group_limit_sets_and_clears_a_groups_limits_and_the_default(
    queue: delayq.DelayQueue, redis_url: str
) -> None:
    assert cli_json(redis_url, "group-limit", "merchant-42", "--concurrency", "3") == {
        "group": "merchant-42", "concurrency": 3, "rate_limit": None, "had_limits": False}
    assert cli(redis_url, "group-limit", "merchant-42", "--concurrency", "2", "--max", "10", "--per", "60").stdout == (
        "queue jobs: group merchant-42: at most 2 running at once, at most 10 messages per 60 s"
        " (replacing its limits)\n")
    assert cli_json(redis_url, "group-limit", "--default", "--max", "5") == {
        "group": None, "concurrency": None, "rate_limit": {"max": 5, "per": 1.0}, "had_limits": False}
    for bad, says in [(["merchant-42", "--concurrency", "0"], "concurrency"), (["merchant-42", "--max", "0"], "max"),
                      (["merchant-42", "--per", "60"], "per"), (["merchant-42", "--clear", "--max", "1"], "not both"),
                      (["merchant-42"], "--clear"), (["--concurrency", "1"], "group"),
                      (["merchant-42", "--default", "--clear"], "not allowed with"), (["", "--concurrency", "1"], "group")]:
        done = cli(redis_url, "group-limit", *bad)
        assert done.returncode == 2 and says in done.stderr, (bad, done.stderr)
    assert cli(redis_url, "group-limit", "merchant-42", "--clear").stdout == (
        "queue jobs: group merchant-42: limits cleared\n"), "a refused change left the limits alone"
    assert cli_json(redis_url, "group-limit", "merchant-42", "--clear")["had_limits"] is False
    assert cli(redis_url, "group-limit", "--default", "--clear").stdout == (
        "queue jobs: groups without limits of their own: limits cleared\n")
    assert queue.set_group_limit(None) is False


def test_push_takes_a_group_and_get_shows_it_and_why_it_waits(queue: delayq.DelayQueue, redis_url: str) -> None:
    queue.set_group_limit("merchant-42", concurrency=1)
    first = cli_json(redis_url, "push", '{"n": 1}', "--group", "merchant-42")["id"]
    second = cli_json(redis_url, "push", '{"n": 2}', "--delay", "0.001", "--group", "merchant-42")["id"]
    assert queue.get(first)["group"] == "merchant-42"  # type: ignore[index]
    assert "  group merchant-42\n" in cli(redis_url, "waiting").stdout
    release = threading.Event()
    worker = delayq.Worker(queue, concurrency=2, lease=60)

    async def hold_the_group(payload: Any, msg: delayq.Message) -> None:
        while not release.is_set():
            await asyncio.sleep(0.01)

    runner = threading.Thread(target=worker.run, args=(hold_the_group,))
    runner.start()
    try:
        # The second handler is idle: the pool claims the group's second message, which waits.
        wait_for(10, "the second message held", lambda: queue.stats()["held"] == 1)
        text = cli(redis_url, "get", second).stdout
        info = cli_json(redis_url, "get", second)
        running = cli(redis_url, "get", first).stdout
    finally:
        release.set()
        worker.stop()
        runner.join()
    assert "group:        merchant-42\n" in text
    assert 'held:         group "merchant-42" runs 1 of its concurrency limit of 1\n' in text
    assert info["held"] == 'group "merchant-42" runs 1 of its concurrency limit of 1'
    assert "state:        inflight" in running and "held:" not in running
    bad = cli(redis_url, "push", "1", "--group", "g", "--serial-key", "k")
    assert bad.returncode == 2 and "group" in bad.stderr


def test_waiting_and_inflight_list_what_the_api_lists(queue: delayq.DelayQueue, redis_url: str) -> None:
    queue.push({"n": 1}, delay=60)
    queue.push({"n": 2}, serial_key="order:2")
    assert cli_json(redis_url, "waiting") == queue.waiting(20)
    text = cli(redis_url, "waiting", "--limit", "1").stdout
    assert "  ready      due " in text and '{"n":2}' in text and '{"n":1}' not in text
    assert "  serial key order:2\n" in text
    assert cli(redis_url, "inflight").stdout == "queue jobs: no running messages\n"
    bad = cli(redis_url, "waiting", "--limit", "-1")
    assert bad.returncode == 2 and "0 or more" in bad.stderr
    too_many = cli(redis_url, "waiting", "--limit", "5000")
    assert too_many.returncode == 2 and "at most 1000" in too_many.stderr


def test_listings_show_the_size_of_a_payload_they_leave_out(queue: delayq.DelayQueue, redis_url: str) -> None:
    # Within the producer's limit, past the listings' bound: shown as its size, not read.
    big = {"n": "big", "pad": "x" * 200_000}
    big_id = queue.push(big, delay=60)
    queue.push({"n": "small"}, delay=30)
    listed = {m["id"]: m for m in queue.waiting(10)}
    size = listed[big_id]["payload_omitted_bytes"]
    assert isinstance(size, int) and size > 200_000 and listed[big_id]["payload"] is None
    assert [m["payload_omitted_bytes"] for m in listed.values() if m["id"] != big_id] == [None]
    text = cli(redis_url, "waiting").stdout
    assert f"    payload: <payload omitted: {size} bytes>\n" in text
    assert '    payload: {"n":"small"}\n' in text
    assert "xxxx" not in text
    assert cli_json(redis_url, "waiting")[0]["payload_omitted_bytes"] is None
    # One message asked for by its id comes whole.
    assert (queue.get(big_id) or {})["payload"] == big
    assert (queue.get(big_id) or {})["payload_omitted_bytes"] is None

    from delayq.dashboard import render_html

    page = render_html([queue], refresh=0)
    assert f"&lt;payload omitted: {size} bytes&gt;" in page and "xxxx" not in page


def metrics(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_in_the_prometheus_format(queue: delayq.DelayQueue, redis_url: str) -> None:
    other = delayq.DelayQueue(redis_url, "other")
    queue.push({"n": 1}, delay=60)
    queue.push({"n": 2})
    other.pause()
    other.set_rate_limit(30, per=60)
    time.sleep(0.05)
    done = cli(redis_url, "metrics", "jobs", "other")
    assert done.returncode == 0, done.stderr
    m = metrics(done.stdout)
    jobs, oth = (("queue", "jobs"),), (("queue", "other"),)
    assert m[("delayq_up", jobs)] == 1 and m[("delayq_up", oth)] == 1
    assert m[("delayq_messages", (("queue", "jobs"), ("state", "ready")))] == 1
    assert m[("delayq_messages", (("queue", "jobs"), ("state", "scheduled")))] == 1
    assert m[("delayq_events_total", (("event", "pushed"), ("queue", "jobs")))] == 2
    assert m[("delayq_messages", (("queue", "jobs"), ("state", "completed")))] == 0
    assert ("delayq_events_total", (("event", "completed"), ("queue", "jobs"))) not in m, "a depth, not an event"
    assert m[("delayq_lag_seconds", jobs)] >= 0.05, "a due message waits with no worker"
    assert m[("delayq_lag_seconds", oth)] == 0 and ("delayq_next_due_timestamp_seconds", oth) not in m
    assert (m[("delayq_paused", jobs)], m[("delayq_paused", oth)]) == (0, 1)
    assert m[("delayq_workers", jobs)] == 0
    assert m[("delayq_rate_limit_messages_per_second", oth)] == 0.5
    assert ("delayq_rate_limit_messages_per_second", jobs) not in m, "no limit, no sample"
    # Without queue names: --queue's.
    assert ("delayq_up", oth) not in metrics(cli(redis_url, "metrics").stdout)


def test_metrics_report_how_late_handlers_started(queue: delayq.DelayQueue, redis_url: str) -> None:
    worker = delayq.Worker(queue, lease=3.0)  # renewed every second, each renewal reporting its starts
    runner = threading.Thread(target=worker.run, args=(lambda payload, msg: time.sleep(0.01),))
    runner.start()
    try:
        wait_for(10, "the pool listed", lambda: len(queue.workers()) == 1)
        # The command reads one renewal, which stands for a second: on a slow machine the
        # next one (reporting no starts) can come between it and the pool's record read
        # beside it, so the whole round is tried again, a few times at most.
        pushed = 0
        for _ in range(5):
            for i in range(3):
                queue.push({"n": i})
            pushed += 3
            wait_for(10, "a renewal that reports the starts", lambda: queue.workers()[0]["started_recently"] > 0)
            before = queue.workers()[0]
            m = metrics(cli(redis_url, "metrics").stdout)
            pool = queue.workers()[0]
            if pool == before:
                break
    finally:
        worker.stop()
        runner.join()
    late = {stat: m[("delayq_start_lateness_seconds", (("queue", "jobs"), ("stat", stat)))] for stat in ("avg", "max")}
    assert 0 <= late["avg"] <= late["max"] < 1, late
    assert late["max"] == pool["lateness_max"] and 1 <= pool["started_recently"] <= pushed
    assert m[("delayq_handler_seconds", (("queue", "jobs"),))] >= 0.01


def test_a_message_held_for_its_serial_key_shows_in_stats_metrics_and_the_dashboard(
    queue: delayq.DelayQueue, redis_url: str
) -> None:
    from delayq.dashboard import render_html

    queue.push_many([{"payload": n, "serial_key": "order:1"} for n in range(2)])
    release = threading.Event()
    worker = delayq.Worker(queue, concurrency=2, lease=60)

    async def hold_the_key(payload: int, msg: delayq.Message) -> None:
        while not release.is_set():
            await asyncio.sleep(0.01)

    runner = threading.Thread(target=worker.run, args=(hold_the_key,))
    runner.start()
    try:
        # The second handler is idle: the pool claims the key's second message, which waits.
        wait_for(10, "the second message held", lambda: queue.stats()["held"] == 1)
        text = cli(redis_url, "stats").stdout
        m = metrics(cli(redis_url, "metrics").stdout)
        page = render_html([queue], refresh=5)
    finally:
        release.set()
        worker.stop()
        runner.join()
    assert "(1 of the scheduled held in their serial key's or group's line)" in text
    assert "held" not in text.split("since created:")[1], "a depth, not a counter"
    assert m[("delayq_held_messages", (("queue", "jobs"),))] == 1
    assert ("delayq_events_total", (("event", "held"), ("queue", "jobs"))) not in m
    assert "1 scheduled held in their serial key's or group's line" in page
    assert queue.stats()["held"] == 0
    assert "held in their" not in cli(redis_url, "stats").stdout


def test_metrics_of_an_unreachable_redis_say_so(redis_url: str) -> None:
    done = cli(f"redis://127.0.0.1:{free_port()}", "metrics")
    assert done.returncode == 0, done.stderr
    assert metrics(done.stdout) == {("delayq_up", (("queue", "jobs"),)): 0}


@contextlib.contextmanager
def serving(redis_url: str, *command: str) -> Iterator[Callable[[str], tuple[str, str]]]:
    """Run `delayq COMMAND --listen` on a free port until the block ends (then SIGINT,
    which must end it cleanly); yields `get(path) -> (content type, body)`, once the
    server answers. A path it does not serve must get 404."""
    import urllib.error
    import urllib.request

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "delayq", "--url", redis_url, "--queue", "jobs", *command,
                             "--listen", f"127.0.0.1:{port}"], stderr=subprocess.PIPE)

    def get(path: str) -> tuple[str, str]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return str(r.headers["Content-Type"]), str(r.read().decode())

    def answers() -> bool:
        try:
            get("/")
            return True
        except OSError:
            return False

    try:
        wait_for(20, f"delayq {command[0]} to answer", answers)
        yield get
        try:
            get("/other")
            raise AssertionError("served a path it should not")
        except urllib.error.HTTPError as e:
            assert e.code == 404
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 0
        assert proc.stderr is not None
        proc.stderr.close()


def test_serve_metrics_answers_scrapes(queue: delayq.DelayQueue, redis_url: str) -> None:
    queue.push({"n": 1})
    with serving(redis_url, "serve-metrics") as get:
        def scrape() -> str:
            content_type, body = get("/metrics")
            assert content_type.startswith("text/plain; version=0.0.4")
            return body

        assert metrics(scrape())[("delayq_messages", (("queue", "jobs"), ("state", "ready")))] == 1
        queue.push({"n": 2})
        assert metrics(scrape())[("delayq_messages", (("queue", "jobs"), ("state", "ready")))] == 2, "read afresh"
    taken = cli(redis_url, "serve-metrics", "--listen", "nonsense")
    assert taken.returncode == 2 and "HOST:PORT" in taken.stderr


def test_push_and_reschedule(queue: delayq.DelayQueue, redis_url: str) -> None:
    pushed = cli_json(redis_url, "push", '{"order_id": 10086}', "--delay", "3600", "--id", "close-order-10086")
    assert pushed == {"id": "close-order-10086"}
    info = queue.get("close-order-10086")
    assert info is not None and info["payload"] == {"order_id": 10086} and info["state"] == "scheduled"
    assert cli(redis_url, "push", "[1]").stdout.strip() != ""
    assert cli_json(redis_url, "reschedule", "close-order-10086", "--delay", "0") == {"rescheduled": True}
    info = queue.get("close-order-10086")
    assert info is not None and info["state"] == "ready"
    gone = cli(redis_url, "reschedule", "no-such-id", "--delay", "0")
    assert gone.returncode == 1 and "is not waiting" in gone.stderr
    for bad, text in ((["push", "{nope"], "not JSON"), (["push", "1", "--delay", "-1"], "negative"),
                      (["reschedule", "close-order-10086", "--delay", "nan"], "delay")):
        done = cli(redis_url, *bad)
        assert done.returncode == 2 and text in done.stderr, (bad, done.stderr)
    assert queue.stats()["pushed"] == 2, "nothing written by bad input"
    cli_json(redis_url, "push", '{"order_id": 10087}', "--delay", "60", "--id", "close-order-10086", "--replace")
    info = queue.get("close-order-10086")
    assert info is not None and info["payload"] == {"order_id": 10087} and info["state"] == "scheduled"
    alone = cli(redis_url, "push", "1", "--replace")
    assert alone.returncode == 2 and "replace" in alone.stderr
    keyed = cli_json(redis_url, "push", '{"order_id": 10088}', "--serial-key", "order:10088")["id"]
    assert "serial key:   order:10088" in cli(redis_url, "get", keyed).stdout


def test_repeat_repeats_and_unrepeat(queue: delayq.DelayQueue, redis_url: str) -> None:
    done = cli_json(redis_url, "repeat", "nightly", "--cron", "0 2 * * *", "--tz", "Asia/Shanghai", '{"r": 1}')
    assert done["name"] == "nightly" and done["next_due_at"] == queue.repeats()[0]["next_due_at"]
    assert cli_json(redis_url, "repeat", "tick", "--every", "60", "--expire-after", "2.5", "[1]")["next_due_at"] > time.time()
    assert cli_json(redis_url, "repeats") == queue.repeats()
    assert [r["expire_after"] for r in queue.repeats()] == [None, 2.5]
    text = cli(redis_url, "repeats").stdout
    assert "nightly  cron '0 2 * * *' in Asia/Shanghai  next " in text
    assert "tick  every 60 s  expires 2.5 s after due  next " in text
    assert cli_json(redis_url, "unrepeat", "tick") == {"removed": True}
    gone = cli(redis_url, "unrepeat", "tick")
    assert gone.returncode == 1 and "no repeating message 'tick'" in gone.stderr
    bad = cli(redis_url, "repeat", "x", "--cron", "61 * * * *", "1")
    assert bad.returncode == 2 and "not a cron pattern" in bad.stderr
    assert [r["name"] for r in queue.repeats()] == ["nightly"]


def test_the_dashboard_shows_each_queue_escaped_and_survives_a_dead_redis(
    queue: delayq.DelayQueue, redis_url: str
) -> None:
    from delayq.dashboard import ROWS, render_html

    hostile = "<script>alert('x')</script>"
    queue.push({"note": hostile}, delay=3600, id="later-1", serial_key=hostile)
    queue.push({"n": 1}, id="poison")
    worker = delayq.Worker(queue, max_attempts=1)

    def fail(payload: Any, msg: delayq.Message) -> None:
        worker.stop()
        raise ValueError(hostile)

    runner = threading.Thread(target=worker.run, args=(fail,))
    runner.start()
    runner.join(20)
    wait_for(10, "the dead letter", lambda: queue.stats()["dead"] == 1)
    queue.pause()
    queue.repeat("sync-rates", 300, {"source": "ecb"}, max_attempts=3, expire_after=60)
    closed = delayq.DelayQueue(f"redis://127.0.0.1:{free_port()}", "elsewhere", connect_timeout=0.2,
                               retry_timeout=0.2)
    page = render_html([queue, closed], refresh=2, now=lambda: 1_900_000_000.0)
    assert "<script>" not in page and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert '<meta http-equiv="refresh" content="2; url=/">' in page
    assert "queue <code>jobs</code>" in page and "later-1" in page and "poison" in page
    assert "<code>later-1</code><br><small>serial key &lt;script&gt;" in page, "its serial key, escaped"
    assert "ValueError: &lt;script&gt;" in page, "the dead letter's error"
    # The error unfolds into its traceback, escaped too.
    assert '<details><summary><span class="bad">ValueError: &lt;script&gt;' in page
    assert '<pre class="trace">Traceback (most recent call last):\n' in page
    assert "raise ValueError(hostile)\nValueError: &lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;\n</pre>" in page
    assert '<span class="bad">paused</span>' in page
    assert ("<h3>repeating messages (1)</h3>" in page and "<td><code>sync-rates</code></td><td>every 5.0 min</td>" in page
            and "<td>60.0 s</td>" in page)
    assert "queue <code>elsewhere</code>" in page and "Redis unreachable since" in page
    assert "read at 2030-03-17 17:46:40.000 UTC" in page
    assert "<h3>completed" not in page, "nothing kept, no section"

    kept = delayq.DelayQueue(redis_url, "kept", keep_completed=5)
    kept.push({"note": hostile}, id="done-1")
    keeper = delayq.Worker(kept)
    keeper.run(lambda payload, msg: keeper.stop())
    page = render_html([kept])
    assert f"<h3>completed (latest {ROWS} of 1 kept)</h3>" in page and "<code>done-1</code>" in page
    assert "<script>" not in page


def test_dashboard_actions_need_credentials_and_the_page_s_token(
    queue: delayq.DelayQueue, redis_url: str
) -> None:
    import base64
    import urllib.error
    import urllib.parse
    import urllib.request

    from delayq.dashboard import make_server

    doomed, kept, third = make_dead(queue, 3)
    server = make_server([queue], "127.0.0.1", 0, refresh=0, auth="ops:s3cret", actions=True)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    good = "Basic " + base64.b64encode(b"ops:s3cret").decode()

    def request(path: str, form: dict[str, str] | None = None, auth: str | None = good) -> tuple[int, str]:
        data = None if form is None else urllib.parse.urlencode(form).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data)
        if auth:
            req.add_header("Authorization", auth)
        try:
            with urllib.request.urlopen(req, timeout=5) as r:  # follows the 303 to the page
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    try:
        # No credentials, or wrong ones: nothing, neither the page nor an action.
        assert request("/", auth=None)[0] == 401
        assert request("/", auth="Basic " + base64.b64encode(b"ops:guess").decode())[0] == 401
        status, page = request("/")
        assert status == 200
        token = page.split('name="token" value="', 1)[1].split('"', 1)[0]
        assert len(token) >= 32 and f'name="id" value="{doomed}"' in page and "requeue all 3 dead letters" in page

        def act(do: str, id: str = "", **extra: str) -> tuple[int, str]:
            return request("/action", {"token": token, "queue": "jobs", "do": do, "id": id, **extra})

        # A form from another site has credentials (the browser adds them) but no token.
        assert act("requeue", doomed, token="forged")[0] == 403
        assert request("/action", {"queue": "jobs", "do": "requeue", "id": doomed})[0] == 403
        assert request("/action", {"token": token, "queue": "jobs", "do": "requeue"}, auth=None)[0] == 401
        assert queue.stats()["dead"] == 3, "refused actions change nothing"

        status, page = act("requeue", doomed)
        assert status == 200 and "requeued 1 dead letter of jobs" in page
        assert queue.get(doomed)["state"] == "ready"  # type: ignore[index]
        status, page = act("delete", kept)
        assert "deleted 1 dead letter of jobs" in page and queue.get(kept) is None
        assert act("delete")[0] == 403, "delete takes one id, never all"
        assert act("pause")[0] == 200 and queue.is_paused()
        assert "resume</button>" in request("/")[1]
        assert act("resume")[0] == 200 and not queue.is_paused()
        status, page = act("requeue")
        assert "requeued 1 dead letter of jobs" in page and queue.get(third)["state"] == "ready"  # type: ignore[index]
        assert act("requeue", queue="elsewhere")[0] == 403
        assert act("drop-everything")[0] == 403
        assert queue.stats()["ready"] == 2
    finally:
        server.shutdown()
        server.server_close()

    readonly = make_server([queue], "127.0.0.1", 0, refresh=0)
    threading.Thread(target=readonly.serve_forever, daemon=True).start()
    port = readonly.server_address[1]
    try:
        status, page = request("/", auth=None)
        assert status == 200 and 'name="token"' not in page
        assert request("/action", {"queue": "jobs", "do": "pause"}, auth=None)[0] == 404
        assert request("/", {"queue": "jobs", "do": "pause"}, auth=None)[0] == 405
        assert not queue.is_paused()
    finally:
        readonly.shutdown()
        readonly.server_close()
    with pytest.raises(ValueError, match="need auth"):
        make_server([queue], "127.0.0.1", 0, actions=True)
    for args in (["--allow-actions"], ["--auth", "nocolon"]):
        bad = cli(redis_url, "dashboard", *args)
        assert bad.returncode == 2 and "--auth" in bad.stderr, bad.stderr


def test_serve_metrics_can_ask_for_credentials(queue: delayq.DelayQueue) -> None:
    import base64
    import urllib.error
    import urllib.request

    from delayq.metrics import make_server

    server = make_server([queue], "127.0.0.1", 0, auth="prometheus:scrape")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    try:
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, timeout=5)
        assert refused.value.code == 401 and refused.value.headers["WWW-Authenticate"].startswith("Basic ")
        req = urllib.request.Request(url, headers={
            "Authorization": "Basic " + base64.b64encode(b"prometheus:scrape").decode()})
        with urllib.request.urlopen(req, timeout=5) as r:
            assert "delayq_messages" in r.read().decode()
    finally:
        server.shutdown()
        server.server_close()


def test_the_dashboard_command_serves_the_page(queue: delayq.DelayQueue, redis_url: str) -> None:
    queue.push({"n": 1}, id="first")
    with serving(redis_url, "dashboard") as get:
        content_type, page = get("/")
        assert content_type == "text/html; charset=utf-8"
        assert "first" in page and "second" not in page
        queue.push({"n": 2}, id="second")
        assert "second" in get("/")[1], "read afresh"
        queue.push({"order_id": 10086, "note": "<b>"}, delay=60, id="close-10086")
        found = get("/?find=10086")[1]
        assert ("messages holding <code>10086</code></h2>" in found and "<code>close-10086</code></td><td>scheduled"
                in found and "&lt;b&gt;" in found and 'value="10086"' in found), found
        hostile = get("/?find=%3Cscript%3E")[1]
        assert "<script>" not in hostile and "holding <code>&lt;script&gt;</code>" in hostile
        assert "messages holding" not in get("/")[1], "no search, no results section"
        try:
            get("/metrics")
            raise AssertionError("served metrics as well")
        except OSError as e:
            assert getattr(e, "code", None) == 404
    bad = cli(redis_url, "dashboard", "--refresh", "-1")
    assert bad.returncode == 2 and "--refresh" in bad.stderr


def test_acl_rule_grants_a_user_exactly_the_queue(server: RedisServer, redis_url: str) -> None:
    done = subprocess.run([sys.executable, "-m", "delayq", "--url", redis_url, "--queue", "orders", "acl",
                           "--user", "app"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ACL SETUSER app on >PASSWORD resetkeys ~{dq:orders}:*")
    assert done.stdout.count("\n") == 1
    rule = delayq.DelayQueue(redis_url, "orders").acl_rule("app")
    assert done.stdout == rule + "\n"
    words = rule.replace(">PASSWORD", ">s3cret").split()
    assert words[0] == "ACL"
    try:
        assert server.cli("ACL", *words[1:]) == "OK"
        q = delayq.DelayQueue(f"redis://app:s3cret@127.0.0.1:{server.port}", "orders")
        msg_id = q.push({"order_id": 1}, 60)
        assert q.get(msg_id)["state"] == "scheduled"  # type: ignore[index]
        assert q.stats()["scheduled"] == 1
    finally:
        server.cli("ACL", "DELUSER", "app")
    with pytest.raises(delayq.InvalidArgumentError, match="user"):
        delayq.DelayQueue(redis_url, "orders").acl_rule("")


def test_a_rule_without_script_load_works_once_an_admin_loaded_the_scripts(
        server: RedisServer, redis_url: str) -> None:
    done = subprocess.run([sys.executable, "-m", "delayq", "--url", redis_url, "--queue", "orders", "acl",
                           "--user", "strict", "--preloaded-scripts"], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert "+evalsha" in done.stdout and "script|load" not in done.stdout
    words = done.stdout.strip().replace(">PASSWORD", ">s3cret").split()
    try:
        assert server.cli("ACL", *words[1:]) == "OK"
        server.cli("SCRIPT", "FLUSH")
        q = delayq.DelayQueue(f"redis://strict:s3cret@127.0.0.1:{server.port}", "orders")
        with pytest.raises(delayq.AuthError, match="delayq load-scripts"):
            q.push({"order_id": 1})
        loaded = subprocess.run([sys.executable, "-m", "delayq", "--url", redis_url, "--queue", "orders",
                                 "load-scripts"], capture_output=True, text=True, timeout=60, check=False)
        assert loaded.returncode == 0, loaded.stderr
        assert loaded.stdout.endswith("scripts of delayq loaded\n"), loaded.stdout
        assert q.get(q.push({"order_id": 2}))["state"] in ("ready", "scheduled")  # type: ignore[index]
    finally:
        server.cli("ACL", "DELUSER", "strict")


def test_a_rule_for_functions_works_once_an_admin_installed_them(server: RedisServer, redis_url: str) -> None:
    done = subprocess.run([sys.executable, "-m", "delayq", "--url", redis_url, "--queue", "orders", "acl",
                           "--user", "fn", "--functions"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "+fcall" in done.stdout and "+evalsha" not in done.stdout and "script|load" not in done.stdout
    words = done.stdout.strip().replace(">PASSWORD", ">s3cret").split()
    both = subprocess.run([sys.executable, "-m", "delayq", "--url", redis_url, "--queue", "orders", "acl",
                           "--user", "fn", "--functions", "--preloaded-scripts"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert both.returncode == 2, both
    with pytest.raises(delayq.InvalidArgumentError, match="give one"):
        delayq.DelayQueue(redis_url, "orders").acl_rule("fn", preloaded_scripts=True, functions=True)
    try:
        assert server.cli("ACL", *words[1:]) == "OK"
        server.cli("FUNCTION", "FLUSH")
        q = delayq.DelayQueue(f"redis://fn:s3cret@127.0.0.1:{server.port}", "orders")
        with pytest.raises(delayq.AuthError, match="delayq install-functions"):
            q.push({"order_id": 1})
        installed = subprocess.run([sys.executable, "-m", "delayq", "--url", redis_url, "--queue", "orders",
                                    "--json", "install-functions"], capture_output=True, text=True, timeout=60,
                                   check=False)
        assert installed.returncode == 0, installed.stderr
        name = json.loads(installed.stdout)["library"]
        assert name.startswith("delayq_") and name == delayq.DelayQueue(redis_url, "orders").install_functions()
        assert q.get(q.push({"order_id": 2}))["state"] in ("ready", "scheduled")  # type: ignore[index]
        assert "cmdstat_fcall" in server.cli("INFO", "commandstats")
    finally:
        server.cli("ACL", "DELUSER", "fn")
        server.cli("FUNCTION", "FLUSH")


def test_a_payload_json_cannot_hold_is_bad_input_and_writes_nothing(server: RedisServer, redis_url: str) -> None:
    for payload, reason in [('{"a":NaN}', "NaN is not JSON"), ("[Infinity]", "Infinity is not JSON"),
                            ("{", "the payload is not JSON")]:
        done = cli(redis_url, "push", payload)
        assert done.returncode == 2, (payload, done.returncode, done.stderr)
        assert reason in done.stderr and "Traceback" not in done.stderr, done.stderr
    # Refused by push itself (nested past the limit): bad input too.
    deep = cli(redis_url, "push", "[" * 129 + "]" * 129)
    assert deep.returncode == 2 and "the limit is 128" in deep.stderr, deep.stderr
    assert server.keys() == []


def test_output_closed_early_ends_quietly(redis_url: str) -> None:
    # More than a pipe holds, so that the writer is still writing when the reader leaves.
    delayq.DelayQueue(redis_url, "jobs").push_many([{"payload": {"n": i, "text": "x" * 200}, "delay": 60}
                                                   for i in range(2000)])
    # `delayq waiting | head -1`: the reader leaves after one line.
    shell = (f"{sys.executable} -m delayq --url {redis_url} --queue jobs waiting --limit 1000 | head -1; "
             "echo \"status ${PIPESTATUS[0]}\" >&2")
    done = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=60, check=False)
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr
    assert done.stdout.count("\n") == 1
    assert "status 0" in done.stderr or "status 141" in done.stderr, done.stderr
