"""What the dashboard and the command line make of data that someone else wrote: the
registry of queues (`<prefix>:queues`, writable by any user with access to the
prefix), huge texts and payloads, and texts holding terminal escapes. Real
redis-server, real `python -m delayq` processes."""

from __future__ import annotations

import base64
import contextlib
import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any, Callable

import redis

import delayq
from harness import RedisServer, free_port, wait_for

AUTH = "ops:pw"
Get = Callable[..., tuple[int, str]]


@contextlib.contextmanager
def dashboard(url: str, *args: str) -> Iterator[Get]:
    """`delayq dashboard ARGS` with actions and credentials, until the block ends;
    yields `get(path, form=None) -> (status, body)` (a form is POSTed)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "delayq", "--url", url, "dashboard", "--listen",
                             f"127.0.0.1:{port}", "--auth", AUTH, "--allow-actions", "--refresh", "0", *args],
                            stderr=subprocess.PIPE)
    header = {"Authorization": "Basic " + base64.b64encode(AUTH.encode()).decode()}

    def get(path: str, form: dict[str, str] | None = None, timeout: float = 60) -> tuple[int, str]:
        data = urllib.parse.urlencode(form).encode() if form is not None else None
        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, headers=header)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def answers() -> bool:
        try:
            get("/ping-nothing", timeout=5)
            return True
        except OSError:
            return False

    try:
        wait_for(20, "the dashboard", answers)
        yield get
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(20)
        assert proc.stderr is not None
        proc.stderr.close()


def register(r: redis.Redis, *entries: dict[str, Any]) -> None:
    """Write registry entries as a user with write access to `dq:queues` can."""
    now_ms = int(time.time() * 1000)
    r.zadd("dq:queues", {json.dumps(e): now_ms for e in entries})


def token_of(page: str) -> str:
    return page.split('name="token" value="', 1)[1].split('"', 1)[0]


def test_a_registry_entry_cannot_point_the_dashboard_at_keys_outside_its_queue(redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    r.hset("victim:h", "secret-field", '"the victim\'s secret"')
    # A seed-layout entry whose hash is someone else's, with the victim's field due.
    r.zadd("dq:mal:z", {"secret-field": int(time.time()) - 10})
    register(r, {"name": "mal", "layout": "seed", "zset_key": "dq:mal:z", "payload_key": "victim:h",
                 "partitions": 1})
    delayq.DelayQueue(redis_url, "orders").push({"n": 1})
    with dashboard(redis_url, "orders") as get:
        status, page = get("/queue?name=mal")
        assert status == 404 and "secret" not in page and "not opened" in page, page
        status, front = get("/")
        assert status == 200
        assert "secret" not in front
        assert "<code>mal</code>" in front and "not opened" in front and "--seed-queue mal dq:mal:z victim:h" in front
        # The operator's delete of that row: no queue of that name to act on.
        form = {"token": token_of(front), "queue": "mal", "do": "delete", "id": "secret-field", "back": "queue"}
        status, answer = get("/action", form)
        assert status == 403 and "no queue 'mal'" in answer, (status, answer)
        form["do"] = "requeue"
        assert get("/action", form)[0] == 403
    assert r.hget("victim:h", "secret-field") == b'"the victim\'s secret"'

    # Named by the operator, a seed queue is shown, and so is a registry entry on its keys.
    r.hset("old:payload", "m1", '{"legacy": 1}')
    r.zadd("old:zset", {"m1": int(time.time()) + 600})
    register(r, {"name": "legacy", "layout": "seed", "zset_key": "old:zset", "payload_key": "old:payload",
                 "partitions": 1})
    with dashboard(redis_url, "orders", "--seed-queue", "recipe", "old:zset", "old:payload") as get:
        status, front = get("/")
        assert status == 200 and "queue <code>recipe</code></h2>" in front
        assert 'href="/queue?name=legacy"' in front and 'href="/queue?name=mal"' not in front
        status, page = get("/queue?name=legacy")
        assert status == 200 and "{&quot;legacy&quot;: 1}" in page
        assert get("/queue?name=mal")[0] == 404


def test_native_entries_stay_under_the_prefix_whatever_their_fields(redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    r.hset("victim:h", "x", "1")
    register(r,
             {"name": "a}b", "layout": "native", "partitions": 1},  # a brace would end the hash tag
             {"name": "ok", "layout": "native", "partitions": 3},
             {"name": "big", "layout": "native", "partitions": 100000},
             {"name": "odd", "layout": "other", "zset_key": "victim:h", "payload_key": "victim:h",
              "partitions": 1})
    before = {str(k) for k in r.keys("*")}
    with dashboard(redis_url, "orders") as get:
        status, front = get("/")
        assert status == 200
        for name in ("a}b", "odd"):
            row = front.split(f"<code>{name}</code>", 1)[1].split("</tr>", 1)[0]
            assert "not opened" in row, (name, row)
        assert "not read here: 100000 partitions" in front
        status, page = get("/queue?name=big")
        assert status == 404 and "not opened" in page and "partitions" in page, page
        assert 'href="/queue?name=ok"' in front
        assert get("/queue?name=ok")[0] == 200
    touched = {str(k) for k in r.keys("*")} - before
    assert all(k.startswith(("{dq:ok", "{dq:orders", "dq:queues")) for k in touched), touched


def test_registry_spam_neither_exhausts_redis_nor_the_page() -> None:
    server = RedisServer("--maxclients", "100")
    try:
        r = redis.Redis(port=server.port)
        register(r, *({"name": f"spam{i:03d}", "layout": "native", "partitions": 1} for i in range(150)))
        with dashboard(server.url, "orders") as get:
            for _ in range(3):
                status, front = get("/")
                assert status == 200 and "unreachable" not in front and "refused" not in front.lower()
            assert "more registered queues not shown" in front
            assert front.count('href="/queue?name=spam') <= 50
            status, page = get("/queue?name=spam149")
            assert status == 200, page
            clients = int(r.info("clients")["connected_clients"])
            assert clients <= 30, f"{clients} connections open"
            assert server.cli("PING") == "PONG"
    finally:
        server.stop()


def test_partitions_of_registry_entries_are_read_within_a_budget(redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    register(r, *({"name": f"wide{i:02d}", "layout": "native", "partitions": 1024} for i in range(40)))
    with dashboard(redis_url, "orders") as get:
        started = time.monotonic()
        status, front = get("/")
        took = time.monotonic() - started
        assert status == 200 and took < 5, f"took {took:.1f} s"
        assert "not read here: 1024 partitions" in front and len(front) < 200_000


def _dead_letter(redis_url: str, error: str, trace: str, payload: Any) -> None:
    """A dead letter of queue jobs, then its stored error and trace replaced as a
    producer or worker with access to the queue's keys could write them."""
    q = delayq.DelayQueue(redis_url, "jobs", max_payload_bytes=64 << 20)
    q.push(payload, id="m1", max_attempts=1)

    def fail(payload: Any, message: delayq.Message) -> None:
        raise RuntimeError("boom")

    delayq.Worker(q, stop_when_empty=True).run(fail)
    assert q.stats()["dead"] == 1
    r = redis.Redis.from_url(redis_url)
    r.hset("{dq:jobs}:errors", "m1", error)
    r.hset("{dq:jobs}:traces", "m1", trace)


def test_huge_texts_are_cut_on_the_page_and_in_listings(redis_url: str) -> None:
    trace = "Traceback (most recent call last):\n" + "  frame\n" * 300_000  # 2.4 MB
    _dead_letter(redis_url, "E" * 1_000_000, trace, {"blob": "x" * 5_000_000})
    q = delayq.DelayQueue(redis_url, "jobs", max_payload_bytes=64 << 20)
    q.push({"blob": "y" * 5_000_000}, delay=600, id="w1")
    with dashboard(redis_url, "jobs") as get:
        for path in ("/", "/queue?name=jobs"):
            status, page = get(path)
            assert status == 200 and len(page) < 100_000, (path, len(page))
            assert "more characters not shown" in page and "<code>delayq get m1</code> shows the whole trace" in page
    for command in (["dead"], ["waiting"], ["find", "m1"], ["find", "w1"]):
        done = subprocess.run([sys.executable, "-m", "delayq", "--url", redis_url, "--queue", "jobs", *command],
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0 and len(done.stdout) < 2_000, (command, len(done.stdout))
        # The error is cut; the payloads, past the listings' bound, are not even fetched.
        assert "<payload omitted: " in done.stdout
        if command in (["dead"], ["find", "m1"]):
            assert "…" in done.stdout, "the error is cut"


ESCAPES = "\x1b[2J\x1b]0;owned\x07\x9b31m\u202e\r"


def test_stored_texts_with_terminal_escapes_are_printed_escaped(redis_url: str) -> None:
    _dead_letter(redis_url, f"bad{ESCAPES}error\nforged line", f"Traceback{ESCAPES}\n  frame", {"s": ESCAPES})
    delayq.DelayQueue(redis_url, "jobs").push({"w": ESCAPES}, delay=600, id="w1")

    def run(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "delayq", "--url", redis_url, "--queue", "jobs", *args],
                              capture_output=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        out = done.stdout.decode()
        for raw in ("\x1b", "\x9b", "\x07", "\u202e", "\r"):
            assert raw not in out, (args, raw, out)
        return out

    for args in (["dead"], ["get", "m1"], ["waiting"], ["find", "w"], ["get", "w1"]):
        out = run(*args)
        # Shown escaped: as \x1b, or as \u001b within a payload's JSON.
        assert ("\\x1b[2J" in out or "\\u001b[2J" in out) and "\\x9b" in out and "\\u202e" in out, (args, out)
    assert "error\\x0aforged line" in run("get", "m1")
    assert "forged line" not in run("get", "m1").splitlines()[0]
    # JSON stays JSON, with the same values.
    letters = json.loads(run("--json", "dead"))
    assert letters[0]["last_error"] == f"bad{ESCAPES}error\nforged line" and letters[0]["payload"] == {"s": ESCAPES}
    info = json.loads(run("--json", "get", "m1"))
    assert info["error_trace"] == f"Traceback{ESCAPES}\n  frame"
