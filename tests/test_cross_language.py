"""PHP pushes and Python consumes, Python pushes and PHP consumes: payloads with
unicode, nested maps and 64-bit integers arrive equal, on the same keys."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import delayq
import pytest
from harness import drained, wait_for
from phpcli import php, php_cmd

PAYLOADS: list[Any] = [
    {"order_id": 10086, "action": "close", "note": "日本語 ✓ \u00e9\n\t\"quoted\""},
    {"big": 9223372036854775807, "neg": -9223372036854775808, "float": 1.5, "exp": 1e-300},
    {"z": {"y": {"x": [1, {"w": None}, True, False]}}, "a": [], "7": "numeric-looking key"},
    [1, "two", [3]],
    "plain string",
    # Text that would be code to unserialize(), pickle or a script built by splicing:
    # it must arrive as the same text, and nothing may run.
    {"php": 'O:8:"stdClass":1:{s:1:"a";i:1;}', "pickle": "cos\nsystem\n(S'echo pwned'\ntR.",
     "lua": "']]) redis.call('FLUSHALL') --"},
    42,
    None,
]


def test_php_pushes_and_python_consumes(queue: delayq.DelayQueue, redis_url: str) -> None:
    ids = json.loads(php(
        """
        $q = new DelayQueue($argv[1], 'jobs');
        $ids = [];
        foreach (json_decode($argv[2], true, 512, JSON_BIGINT_AS_STRING) as $i => $p) {
            $ids[] = $q->push($p, 0.05 * $i, ['max_attempts' => 7]);
        }
        echo json_encode($ids);
        """,
        redis_url,
        json.dumps(PAYLOADS),
    ))
    got: dict[str, Any] = {}
    worker = delayq.Worker(queue)

    def handle(payload: Any, msg: delayq.Message) -> None:
        got[msg.id] = payload
        assert msg.max_attempts == 7 and msg.attempt == 1
        if len(got) == len(PAYLOADS):
            worker.stop()

    worker.run(handle)
    assert [got[i] for i in ids] == PAYLOADS
    assert [list(p) for p in (got[ids[0]], got[ids[2]])] == [list(PAYLOADS[0]), list(PAYLOADS[2])], "key order"
    assert drained(queue)


def test_python_pushes_and_php_consumes(queue: delayq.DelayQueue, redis_url: str) -> None:
    ids = [queue.push(p, i * 0.05) for i, p in enumerate(PAYLOADS)]
    out = php(
        """
        $q = new DelayQueue($argv[1], 'jobs');
        $got = [];
        $w = new DelayQueueWorker($q);
        $w->run(function ($payload, DelayQueueMessage $m) use (&$got, $w, $argv) {
            $got[$m->id] = $payload;
            if (count($got) === (int) $argv[2]) { $w->stop(); }
        });
        echo json_encode($got, JSON_UNESCAPED_UNICODE | JSON_PRESERVE_ZERO_FRACTION);
        """,
        redis_url,
        str(len(PAYLOADS)),
    )
    got = json.loads(out)
    assert [got[i] for i in ids] == PAYLOADS
    assert list(got[ids[2]]) == list(PAYLOADS[2]), "key order"
    assert drained(queue)


def test_both_languages_see_the_same_state(queue: delayq.DelayQueue, redis_url: str) -> None:
    msg_id = queue.push({"k": 1}, 3600, id="shared-1")
    info = json.loads(php("echo json_encode((new DelayQueue($argv[1], 'jobs'))->get('shared-1'));", redis_url))
    mine = queue.get(msg_id)
    assert mine is not None
    assert {k: info[k] for k in ("id", "state", "payload", "attempts")} == {
        k: mine[k] for k in ("id", "state", "payload", "attempts")}
    assert abs(info["due_at"] - mine["due_at"]) < 1e-6
    assert php("var_export((new DelayQueue($argv[1], 'jobs'))->cancel('shared-1'));", redis_url) == "true"
    assert queue.get(msg_id) is None


def test_a_php_failure_shows_its_stack_trace_in_python_and_back(queue: delayq.DelayQueue, redis_url: str) -> None:
    from_php = queue.push({"who": "php"}, id="fails-in-php")
    php("""
        $w = new DelayQueueWorker(new DelayQueue($argv[1], 'jobs'), ['max_attempts' => 1, 'stop_when_empty' => true]);
        $w->run(function ($payload) { throw new LogicException("order {$payload['who']} is gone"); });
    """, redis_url)
    info = queue.get(from_php)
    assert info is not None and info["state"] == "dead"
    assert info["last_error"].startswith("LogicException: order php is gone in ")
    assert info["error_trace"].startswith("LogicException: order php is gone in ")
    assert "\nStack trace:\n#0 " in info["error_trace"] and info["error_trace"].endswith("{main}")

    from_python = queue.push({"who": "python"}, id="fails-in-python")

    def fail(payload: Any, msg: delayq.Message) -> None:
        raise LookupError(f"order {payload['who']} is gone")

    delayq.Worker(queue, max_attempts=1, stop_when_empty=True).run(fail)
    seen = json.loads(php("echo json_encode((new DelayQueue($argv[1], 'jobs'))->get('fails-in-python'));", redis_url))
    assert seen["last_error"] == "LookupError: order python is gone"
    assert seen["error_trace"].startswith("Traceback (most recent call last):\n")
    assert seen["error_trace"].endswith("LookupError: order python is gone\n")
    assert seen["error_trace"] == queue.get(from_python)["error_trace"]  # type: ignore[index]


def test_an_empty_object_reaches_php_as_an_empty_array(queue: delayq.DelayQueue, redis_url: str) -> None:
    # PHP arrays cannot tell {} from [] apart: json_decode($json, true) gives [] for
    # both, and so does delayq. Everything else about the payload is unchanged.
    msg_id = queue.push({"m": {}, "l": []})
    out = php("echo json_encode((new DelayQueue($argv[1], 'jobs'))->get($argv[2])['payload']);", redis_url, msg_id)
    assert json.loads(out) == {"m": [], "l": []}


def test_a_pause_from_php_holds_python_workers_until_php_resumes(queue: delayq.DelayQueue, redis_url: str) -> None:
    assert php("var_export((new DelayQueue($argv[1], 'jobs'))->pause());", redis_url) == "true"
    assert queue.is_paused()
    ids = [queue.push({"n": i}) for i in range(3)]
    listed = json.loads(php("echo json_encode((new DelayQueue($argv[1], 'jobs'))->waiting());", redis_url))
    assert [(m["id"], m["state"]) for m in listed] == [(m["id"], m["state"]) for m in queue.waiting()]
    assert [m["id"] for m in listed] == ids
    seen: list[int] = []
    # Longer than the test: only the wake-up that PHP's resume() publishes starts the work.
    worker = delayq.Worker(queue, idle_check=600)

    def handle(payload: dict[str, int], msg: delayq.Message) -> None:
        seen.append(payload["n"])
        if len(seen) == 3:
            worker.stop()

    runner = threading.Thread(target=worker.run, args=(handle,))
    runner.start()
    try:
        wait_for(10, "the Python pool listed", lambda: bool(queue.workers()))
        time.sleep(0.5)
        assert seen == [], "a Python pool took messages while PHP had paused the queue"
        assert php("var_export((new DelayQueue($argv[1], 'jobs'))->resume());", redis_url) == "true"
        runner.join(20)
    finally:
        worker.stop()
        runner.join()
    assert sorted(seen) == [0, 1, 2] and drained(queue)


def test_a_rate_limit_set_from_php_holds_a_python_pool_and_python_lifts_it(
    queue: delayq.DelayQueue, redis_url: str
) -> None:
    php("(new DelayQueue($argv[1], 'jobs'))->setRateLimit(2, 3600);", redis_url)
    assert queue.rate_limit() == {"max": 2, "per": 3600.0}
    for i in range(4):
        queue.push({"n": i})
    seen: list[int] = []
    # Longer than the test: only the wake-up that clearing publishes lets the rest through.
    worker = delayq.Worker(queue, idle_check=600)

    def handle(payload: dict[str, int], msg: delayq.Message) -> None:
        seen.append(payload["n"])
        if len(seen) == 4:
            worker.stop()

    runner = threading.Thread(target=worker.run, args=(handle,))
    runner.start()
    try:
        wait_for(10, "the two messages the limit lets through", lambda: len(seen) >= 2)
        time.sleep(0.5)
        assert len(seen) == 2, f"2 per hour, PHP said; the Python pool ran {len(seen)}"
        limit = json.loads(php("echo json_encode((new DelayQueue($argv[1], 'jobs'))->stats()['rate_limit']);",
                               redis_url))
        assert limit == queue.stats()["rate_limit"] == {"max": 2, "per": 3600.0}
        assert queue.clear_rate_limit()
        runner.join(20)
    finally:
        worker.stop()
        runner.join()
    assert sorted(seen) == [0, 1, 2, 3] and drained(queue)
    assert php("var_export((new DelayQueue($argv[1], 'jobs'))->rateLimit());", redis_url) == "NULL"


def test_a_restart_requested_from_php_stops_a_python_pool(queue: delayq.DelayQueue, redis_url: str) -> None:
    worker = delayq.Worker(queue, idle_check=600)
    result: list[dict[str, Any]] = []
    runner = threading.Thread(target=lambda: result.append(worker.run(lambda payload, msg: None)))
    runner.start()
    try:
        wait_for(10, "the Python pool listed", lambda: bool(queue.workers()))
        assert php("echo (new DelayQueue($argv[1], 'jobs'))->restartWorkers();", redis_url) == "1"
        runner.join(10)
        assert not runner.is_alive(), "the Python pool did not stop"
    finally:
        worker.stop()
        runner.join()
    assert result[0]["stopped_by"] == "restart"


def test_a_repeat_defined_from_php_runs_in_a_python_worker(queue: delayq.DelayQueue, redis_url: str) -> None:
    due = float(php("echo (new DelayQueue($argv[1], 'jobs'))->repeat('tick', 1, ['n' => '日本']);", redis_url))
    assert queue.repeats()[0]["next_due_at"] == due
    seen: list[tuple[str, Any]] = []
    worker = delayq.Worker(queue)

    def handle(payload: Any, msg: delayq.Message) -> None:
        seen.append((msg.id, payload))
        if len(seen) == 2:
            worker.stop()

    worker.run(handle)
    first = round(due * 1000)
    assert seen == [(f"repeat:tick:{first}", {"n": "日本"}), (f"repeat:tick:{first + 1000}", {"n": "日本"})]
    assert php("var_export((new DelayQueue($argv[1], 'jobs'))->unrepeat('tick'));", redis_url) == "true"


def test_priority_queues_filled_from_the_other_language(queue: delayq.DelayQueue, redis_url: str) -> None:
    """PHP fills a queue and its lower-priority queue for a Python worker; Python fills
    them for a PHP worker. Both run every message of the higher queue first."""
    low = delayq.DelayQueue(redis_url, "jobs-low")
    php(
        """
        foreach (['jobs-low', 'jobs'] as $name) {
            (new DelayQueue($argv[1], $name))->pushMany(array_map(fn ($n) => ['payload' => $n], range(0, 49)));
        }
        """,
        redis_url,
    )
    order: list[str] = []
    summary = delayq.Worker(queue, lower_queues=[low], stop_when_empty=True).run(
        lambda n, msg: order.append(msg.queue)
    )
    assert summary["acked"] == 100 and sorted(order) == ["jobs"] * 50 + ["jobs-low"] * 50
    assert order[: len(order) - order[::-1].index("jobs")].count("jobs-low") <= 2

    low.push_many([{"payload": n} for n in range(50)])
    queue.push_many([{"payload": n} for n in range(50)])
    out = php(
        """
        $q = new DelayQueue($argv[1], 'jobs');
        $w = new DelayQueueWorker($q, ['lower_queues' => [new DelayQueue($argv[1], 'jobs-low')],
            'stop_when_empty' => true]);
        $order = [];
        $summary = $w->run(function ($n, DelayQueueMessage $m) use (&$order) { $order[] = $m->queue; });
        echo json_encode([$summary['acked'], $order]);
        """,
        redis_url,
    )
    acked, php_order = json.loads(out)
    assert acked == 100 and sorted(php_order) == ["jobs"] * 50 + ["jobs-low"] * 50
    assert php_order[: len(php_order) - php_order[::-1].index("jobs")].count("jobs-low") <= 2
    assert drained(queue) and drained(low)


def test_php_pushes_and_the_delayq_worker_command_consumes(
    queue: delayq.DelayQueue, redis_url: str, tmp_path: Path
) -> None:
    """The migration's usual second step: PHP producers stay, a Python handler module
    runs under `delayq worker --processes 2`."""
    (tmp_path / "tasks.py").write_text(
        "import json, os\n"
        "def handle(payload, msg):\n"
        "    with open('handled.jsonl', 'a') as f:\n"
        "        f.write(json.dumps([msg.id, payload, os.getpid()], ensure_ascii=False) + '\\n')\n"
    )
    ids = json.loads(php(
        """
        $q = new DelayQueue($argv[1], 'jobs');
        echo json_encode(array_map(fn ($p) => $q->push($p, 0.0), json_decode($argv[2], true, 512, JSON_BIGINT_AS_STRING)));
        """,
        redis_url,
        json.dumps(PAYLOADS),
    ))
    done = subprocess.run(
        [sys.executable, "-m", "delayq", "--url", redis_url, "--queue", "jobs", "--json", "worker", "tasks:handle",
         "--processes", "2", "--stop-when-empty"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["acked"] == len(PAYLOADS)
    lines = [json.loads(line) for line in (tmp_path / "handled.jsonl").read_text().splitlines()]
    got = {msg_id: payload for msg_id, payload, _ in lines}
    assert len(lines) == len(PAYLOADS) and [got[i] for i in ids] == PAYLOADS
    assert drained(queue)


def test_the_examples_php_producer_and_python_handler_module(redis_url: str) -> None:
    """examples/php/producer.php schedules orders; examples/python/tasks.py closes them
    under `delayq worker`, run as its docstring says."""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "REDIS_URL": redis_url}
    produced = subprocess.run([*php_cmd(), str(root / "examples/php/producer.php"), "200"], env=env,
                              capture_output=True, text=True, timeout=60, check=False)
    assert produced.returncode == 0, produced.stderr
    done = subprocess.run(
        [sys.executable, "-m", "delayq", "--queue", "orders", "--json", "worker", "tasks:close_order",
         "--on-start", "tasks:connect", "--on-dead", "tasks:alert", "--on-failure", "tasks:report",
         "--max-jobs", "200", "--log-level", "info"],
        cwd=root / "examples/python", env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert (summary["acked"], summary["dead"], summary["stopped_by"]) == (200, 0, "max_jobs"), summary
    assert done.stderr.count("closed order") == 200 and "closed order 20199 (attempt 1" in done.stderr
    stats = delayq.DelayQueue(redis_url, "orders").stats()
    assert stats["scheduled"] + stats["ready"] + stats["inflight"] == 0



def test_a_serial_key_held_by_a_php_worker_holds_a_python_worker_back(
    queue: delayq.DelayQueue, redis_url: str, tmp_path: Path
) -> None:
    """A PHP worker runs the first message of order 10086 until told to stop; a Python
    worker meanwhile runs a message without a key, but not the order's second one,
    which starts only once the first ended, in whichever language."""
    log = tmp_path / "spans"
    php(
        """
        $q = new DelayQueue($argv[1], 'jobs');
        $q->pushMany([
            ['payload' => ['n' => 0], 'serial_key' => 'order:10086'],
            ['payload' => ['n' => 1], 'delay' => 0.001, 'serial_key' => 'order:10086'],
        ]);
        """,
        redis_url,
    )
    php_worker = threading.Thread(target=php, args=(
        """
        $w = new DelayQueueWorker(new DelayQueue($argv[1], 'jobs'), ['stop_when_empty' => true]);
        $w->run(function ($p) use ($argv) {
            $start = microtime(true);
            if ($p['n'] === 0) {
                touch($argv[2] . '.holding');
                while (!file_exists($argv[2] . '.release')) {
                    usleep(10000);
                }
            }
            file_put_contents($argv[2], sprintf("%d %.6f %.6f php\\n", $p['n'], $start, microtime(true)), FILE_APPEND);
        });
        """,
        redis_url,
        str(log),
    ))
    php_worker.start()
    wait_for(20, "the PHP worker running the first", lambda: (tmp_path / "spans.holding").exists())
    queue.push({"n": 2})
    worker = delayq.Worker(queue, stop_when_empty=True)

    def handle(payload: dict[str, int], msg: delayq.Message) -> None:
        start = time.time()
        if payload["n"] == 2:
            # The order's second message waits meanwhile, due but held back.
            time.sleep(0.3)
            second = queue.get(next(m["id"] for m in queue.waiting(10) if m["payload"] == {"n": 1}))
            assert second is not None and second["state"] == "ready", second
            (tmp_path / "spans.release").touch()
        with open(log, "a") as f:
            f.write(f"{payload['n']} {start:.6f} {time.time():.6f} python\n")

    summary = worker.run(handle)
    php_worker.join(60)
    rows = {int(r[0]): r for r in (line.split() for line in log.read_text().splitlines())}
    assert sorted(rows) == [0, 1, 2] and rows[0][3] == "php" and rows[2][3] == "python", rows
    assert float(rows[1][1]) >= float(rows[0][2]), "the second started once the first ended"
    assert summary["acked"] >= 1 and drained(queue)


def test_a_group_limit_set_from_php_holds_a_python_worker_to_it(queue: delayq.DelayQueue, redis_url: str) -> None:
    """PHP pushes two groups' messages and limits one to 2 at once; a Python worker of 6
    handlers drains them, never running more than 2 of that group, and sees each
    message's group."""
    said = json.loads(php(
        """
        $q = new DelayQueue($argv[1], 'jobs');
        $before = $q->setGroupLimit('merchant-42', 2);
        $items = [];
        for ($n = 0; $n < 10; $n++) {
            $items[] = ['payload' => ['n' => $n, 'group' => 'merchant-42'], 'delay' => $n / 1000, 'group' => 'merchant-42'];
        }
        for ($n = 0; $n < 4; $n++) {
            $items[] = ['payload' => ['n' => $n, 'group' => 'merchant-7'], 'delay' => 0.005, 'group' => 'merchant-7'];
        }
        $ids = $q->pushMany($items);
        echo json_encode(['before' => $before, 'group' => $q->get($ids[0])['group']]);
        """,
        redis_url,
    ))
    assert said == {"before": False, "group": "merchant-42"}
    running: dict[str, int] = {}
    peak: dict[str, int] = {}
    worker = delayq.Worker(queue, concurrency=6, lease=60, stop_when_empty=True)

    async def handle(payload: dict[str, Any], msg: delayq.Message) -> None:
        group = msg.group or "none"
        assert group == payload["group"]
        running[group] = running.get(group, 0) + 1
        peak[group] = max(peak.get(group, 0), running[group])
        await asyncio.sleep(0.03)
        running[group] -= 1

    done = threading.Timer(30, worker.stop)
    done.start()
    try:
        summary = worker.run(handle)
    finally:
        done.cancel()
    assert summary["acked"] == 14 and summary["stopped_by"] == "empty", summary
    assert peak["merchant-42"] == 2, peak
    assert peak["merchant-7"] > 1, "the other group has no limit"
    assert drained(queue) and queue.stats()["held"] == 0


def test_a_payload_at_the_depth_limit_crosses_both_ways_and_one_past_it_is_refused_in_both(
    queue: delayq.DelayQueue, redis_url: str
) -> None:
    depth = 128  # delayq::MAX_DEPTH, the same in every language

    def nested(levels: int) -> Any:
        value: Any = 1
        for _ in range(levels):
            value = [value]
        return value

    # PHP pushes at the limit, Python's worker receives it; Python pushes, PHP's worker.
    php("""
        $v = 1;
        for ($i = 0; $i < (int) $argv[2]; $i++) { $v = [$v]; }
        (new DelayQueue($argv[1], 'jobs'))->push($v, 0, ['id' => 'from-php']);
    """, redis_url, str(depth))
    got: list[Any] = []
    delayq.Worker(queue, stop_when_empty=True).run(lambda payload, msg: got.append(payload))
    assert got == [nested(depth)]
    queue.push(nested(depth), id="from-python")
    out = php("""
        $got = null;
        $w = new DelayQueueWorker(new DelayQueue($argv[1], 'jobs'), ['stop_when_empty' => true]);
        $w->run(function ($payload) use (&$got) { $got = $payload; });
        $d = 0;
        while (is_array($got)) { $got = $got[0]; $d++; }
        echo $d;
    """, redis_url)
    assert out == str(depth)
    assert queue.stats()["dead"] == 0

    # One level deeper: refused at push in both languages, nothing written.
    with pytest.raises(delayq.PayloadError, match="deeper than 128|the limit is 128"):
        queue.push(nested(depth + 1))
    refused = php("""
        $v = 1;
        for ($i = 0; $i < (int) $argv[2]; $i++) { $v = [$v]; }
        try { (new DelayQueue($argv[1], 'jobs'))->push($v); echo 'pushed'; }
        catch (DelayQueuePayloadException $e) { echo 'refused: ', $e->getMessage(); }
    """, redis_url, str(depth + 1))
    assert refused.startswith("refused: ") and "128" in refused, refused
    assert queue.stats()["scheduled"] + queue.stats()["ready"] == 0


def test_every_read_call_shows_the_same_record_in_both_languages(
    queue: delayq.DelayQueue, redis_url: str, server: Any
) -> None:
    # The core builds each record once (delayq::records): same keys, order and values
    # from PHP and Python, a payload that is not JSON shown as its text in both.
    queue.push({"k": [1, 2]}, 3600, id="waits", max_attempts=3, serial_key="order-1")
    queue.push("fails", id="fails")
    queue.repeat("nightly", "0 2 * * *", {"report": True}, tz="Asia/Shanghai")
    queue.repeat("often", 90.5, [1])
    queue.set_rate_limit(100, 60)

    def fail(payload: Any, msg: delayq.Message) -> None:
        raise LookupError("gone")

    delayq.Worker(queue, max_attempts=1, stop_when_empty=True).run(fail)
    server.cli("HSET", "delay_queue:payload", "raw-1", "not json {", "raw-2", "[unreadable")
    server.cli("ZADD", "delay_queue:zset", "1", "raw-2")
    legacy = delayq.DelayQueue(redis_url, "legacy", layout="seed")
    delayq.Worker(legacy, stop_when_empty=True).run(fail)  # raw-2: unreadable, dead-lettered
    server.cli("ZADD", "delay_queue:zset", "4102444800", "raw-1")

    php_side = json.loads(php(
        """
        $q = new DelayQueue($argv[1], 'jobs');
        $legacy = new DelayQueue($argv[1], 'legacy', ['layout' => 'seed']);
        echo json_encode([
            'get' => $q->get('waits'), 'waiting' => $q->waiting(), 'stats' => $q->stats(),
            'dead' => $q->deadLetters(), 'repeats' => $q->repeats(), 'limit' => $q->rateLimit(),
            'raw' => $legacy->get('raw-1'), 'raw_dead' => $legacy->deadLetters(),
        ], JSON_PRESERVE_ZERO_FRACTION);
        """,
        redis_url,
    ))
    python_side = {
        "get": queue.get("waits"), "waiting": queue.waiting(), "stats": queue.stats(),
        "dead": queue.dead_letters(), "repeats": queue.repeats(), "limit": queue.rate_limit(),
        "raw": legacy.get("raw-1"), "raw_dead": legacy.dead_letters(),
    }
    for call, mine in python_side.items():
        theirs = php_side[call]
        assert json.dumps(theirs) == json.dumps(mine), call  # keys in the same order, values equal
    shapes = delayq._delayq.RECORD_SHAPES
    assert list(python_side["get"] or {}) == list(shapes["MessageInfo"])
    assert list(python_side["stats"]) == list(shapes["Stats"])
    assert list(python_side["dead"][0]) == list(shapes["DeadLetter"])
    assert [r["schedule"] for r in python_side["repeats"]] == ["0 2 * * *", 90.5]
    assert [r["tz"] for r in python_side["repeats"]] == ["Asia/Shanghai", None]
    assert python_side["limit"] == {"max": 100, "per": 60.0}
    assert (python_side["raw"] or {})["payload"] == "not json {"
    assert [d["payload"] for d in python_side["raw_dead"]] == ["[unreadable"]
