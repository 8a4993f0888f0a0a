"""The dashboard's charts, its registry of queues, the page of one queue with paging,
and its answer when Redis is down (the browser test drives the whole of it)."""

from __future__ import annotations

import base64
import re
import threading
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import pytest
import redis

import delayq
from delayq.dashboard import LISTED, PAGE_ROWS, Reachability, Registry, make_server, render_html
from harness import RedisServer, free_port, wait_for
from test_untrusted_data import dashboard, register


def test_minutes_count_what_pools_did_and_refuse_a_bad_span(queue: delayq.DelayQueue) -> None:
    for i in range(6):
        queue.push({"i": i})
    queue.push({"later": True}, delay=3600)
    worker = delayq.Worker(queue, lease=3, max_attempts=1)

    def handle(payload: Any, msg: delayq.Message) -> None:
        if payload.get("i") == 0:
            raise ValueError("no")

    runner = threading.Thread(target=worker.run, args=(handle,))
    runner.start()
    try:
        wait_for(30, "a backlog sample", lambda: any(m["scheduled"] is not None for m in queue.minutes(5)))
        wait_for(30, "the handled messages", lambda: sum(m["handled"] for m in queue.minutes(5)) == 6)
    finally:
        worker.stop()
        runner.join(30)
    minutes = queue.minutes()
    assert len(minutes) == 60 and minutes == sorted(minutes, key=lambda m: m["at"])
    assert sum(m["failed"] for m in minutes) == 1
    assert {m["scheduled"] for m in minutes if m["scheduled"] is not None} == {1}
    busy = [m for m in minutes if m["handled"]]
    assert busy and all(0 <= m["lateness_p50"] <= m["lateness_p99"] < 30 for m in busy)
    assert all(m["lateness_p50"] is None for m in minutes if not m["handled"])
    for bad in (0, 91):
        with pytest.raises(delayq.InvalidArgumentError, match="span"):
            queue.minutes(bad)
    with pytest.raises(TypeError, match="span"):
        queue.minutes("5")  # type: ignore[arg-type]


def test_the_charts_are_svg_with_a_point_per_minute_and_the_page_needs_nothing_outside(
    queue: delayq.DelayQueue
) -> None:
    queue.push({"n": 1})
    worker = delayq.Worker(queue, lease=3)
    runner = threading.Thread(target=worker.run, args=(lambda payload, msg: None,))
    runner.start()
    try:
        wait_for(30, "a backlog sample", lambda: any(m["scheduled"] is not None for m in queue.minutes(5)))
    finally:
        worker.stop()
        runner.join(30)
    page = render_html([queue], refresh=0)
    for chart in ("throughput", "lateness", "backlog"):
        svg = re.search(rf'<svg class="chart" data-chart="{chart}".*?</svg>', page)
        assert svg is not None, chart
        points = sum(len(line.split()) for line in re.findall(r'points="([^"]*)"', svg.group(0)))
        assert points > 0, chart
    # Handled runs through every minute of the hour, zeros included.
    throughput = re.search(r'data-chart="throughput".*?</svg>', page)
    assert throughput is not None
    handled = re.search(r'data-series="handled"[^>]*points="([^"]*)"', throughput.group(0))
    assert handled is not None and len(handled.group(1).split()) == 60
    assert "http://" not in page and "https://" not in page and "<script" not in page


def test_a_page_answers_at_once_while_redis_is_down_and_tries_again_later() -> None:
    closed = delayq.DelayQueue(f"redis://127.0.0.1:{free_port()}", "elsewhere", connect_timeout=0.2,
                               retry_timeout=0)
    clock = [1_900_000_000.0]
    health = Reachability(lambda: clock[0])
    first = render_html([closed], refresh=0, now=lambda: clock[0], health=health)
    assert "Redis unreachable since 2030-03-17 17:46:40.000 UTC" in first
    assert "tried last at 2030-03-17 17:46:40.000 UTC" in first
    clock[0] += 2
    # Within the recheck time the page does not try: it says when it last did.
    second = render_html([closed], refresh=0, now=lambda: clock[0], health=health)
    assert "tried last at 2030-03-17 17:46:40.000 UTC" in second and "for 2.0 s" in second
    assert "tries again in 3.0 s" in second
    clock[0] += Reachability.RECHECK
    third = render_html([closed], refresh=0, now=lambda: clock[0], health=health)
    assert "since 2030-03-17 17:46:40.000 UTC" in third and "tried last at 2030-03-17 17:46:47.000 UTC" in third


def test_the_dashboard_command_answers_when_redis_is_down() -> None:
    import subprocess
    import sys

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "delayq", "--url", f"redis://127.0.0.1:{free_port()}",
                             "--queue", "orders", "dashboard", "--listen", f"127.0.0.1:{port}"],
                            stderr=subprocess.DEVNULL)
    try:
        def page() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as r:
                return str(r.read().decode())

        def answers() -> bool:
            try:
                page()
                return True
            except OSError:
                return False

        wait_for(20, "the dashboard", answers)
        text = page()
        assert "queue <code>orders</code>" in text and "Redis unreachable since" in text
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/queue?name=orders", timeout=10) as r:
            assert "Redis unreachable since" in r.read().decode()
    finally:
        proc.terminate()
        proc.wait(10)


def test_queues_are_found_in_the_registry_and_each_has_a_paged_page(redis_url: str) -> None:
    named = delayq.DelayQueue(redis_url, "named")
    unnamed = delayq.DelayQueue(redis_url, "found-by-push")
    seed = delayq.DelayQueue(redis_url, "legacy", layout="seed", zset_key="old:zset", payload_key="old:payload")
    pooled = delayq.DelayQueue(redis_url, "found-by-pool", partitions=2)
    ids = [unnamed.push({"n": n}, delay=60 + n, id=f"m-{n:02d}") for n in range(2 * PAGE_ROWS + 5)]
    seed.push({"legacy": True}, delay=60)
    worker = delayq.Worker(pooled, lease=3)
    runner = threading.Thread(target=worker.run, args=(lambda payload, msg: None,))
    runner.start()
    try:
        wait_for(30, "the pool's registration",
                 lambda: "found-by-pool" in [q["name"] for q in named.registered_queues()])
    finally:
        worker.stop()
        runner.join(30)
    registered = {q["name"]: q for q in named.registered_queues()}
    assert sorted(registered) == ["found-by-pool", "found-by-push", "legacy"]
    assert registered["legacy"]["layout"] == "seed" and registered["legacy"]["zset_key"] == "old:zset"
    assert registered["found-by-pool"]["partitions"] == 2 and registered["found-by-push"]["zset_key"] is None
    assert delayq.DelayQueue(redis_url, "x", prefix="other").registered_queues() == []

    def open(q: Any) -> delayq.DelayQueue:
        return delayq.DelayQueue(redis_url, q["name"], layout=q["layout"], zset_key=q["zset_key"],
                                 payload_key=q["payload_key"], partitions=q["partitions"])

    # The operator named the seed queue's keys: the registry's entry on them is opened.
    registry = Registry(named, open, seed_keys=[("old:zset", "old:payload")])
    server = make_server([named], "127.0.0.1", 0, refresh=0, auth="ops:pw", actions=True, registry=registry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    auth = "Basic " + base64.b64encode(b"ops:pw").decode()

    def get(path: str) -> tuple[int, str]:
        req = urllib.request.Request(f"http://127.0.0.1:{server.server_address[1]}{path}",
                                     headers={"Authorization": auth})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    try:
        status, overview = get("/")
        assert status == 200
        for name in ("named", "found-by-push", "found-by-pool", "legacy"):
            assert f'href="/queue?name={name}"' in overview, name
        assert "queue <code>named</code></h2>" in overview and "queue <code>legacy</code></h2>" not in overview

        status, first = get("/queue?name=found-by-push")
        assert status == 200 and "<h3 id=\"waiting\">waiting (page 1)</h3>" in first
        assert ids[0] in first and ids[PAGE_ROWS - 1] in first and ids[PAGE_ROWS] not in first
        later = re.search(r'<a class="page" data-list="waiting" href="([^"]*)"', first)
        assert later is not None and "waiting_page=1" in later.group(1)
        status, second = get(later.group(1).replace("&amp;", "&").split("#")[0])
        assert ids[PAGE_ROWS] in second and ids[2 * PAGE_ROWS - 1] in second and ids[0] not in second
        status, last = get("/queue?name=found-by-push&waiting_page=2")
        assert ids[-1] in last and "later &rarr;" not in last and "&larr; earlier" in last
        status, found = get("/queue?name=found-by-push&find=m-07")
        assert "messages holding <code>m-07</code>" in found and "<code>m-07</code></td><td>scheduled" in found

        status, legacy = get("/queue?name=legacy")
        assert status == 200 and "{&quot;legacy&quot;: true}" in legacy

        status, text = get("/queue?name=nowhere")
        assert status == 404 and "no queue" in text
        # A registered queue takes actions too.
        token = overview.split('name="token" value="', 1)[1].split('"', 1)[0]
        form = urllib.parse.urlencode({"token": token, "queue": "found-by-push", "do": "pause", "back": "queue"})
        req = urllib.request.Request(f"http://127.0.0.1:{server.server_address[1]}/action", data=form.encode(),
                                     headers={"Authorization": auth})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert "paused found-by-push" in r.read().decode() and "/queue?name=found-by-push" in r.url
        assert unnamed.is_paused()
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("partitions", [1, 3])
def test_pages_reach_past_the_first_thousand_messages(redis_url: str, partitions: int) -> None:
    q = delayq.DelayQueue(redis_url, f"deep-{partitions}", partitions=partitions)
    n = 1_050
    ids = q.push_many([{"payload": {"n": i}, "delay": 60 + i, "id": f"p-{i:04d}"} for i in range(n)])
    assert [m["id"] for m in q.waiting(30, start=1_020)] == ids[1_020:1_050]
    assert q.waiting(10, start=n) == []
    with pytest.raises(delayq.InvalidArgumentError, match="start"):
        q.waiting(10, start=100_001)
    with pytest.raises(TypeError, match="start"):
        q.waiting(10, start="1")  # type: ignore[arg-type]

    server = make_server([q], "127.0.0.1", 0, refresh=0, auth=None, actions=False)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        def get(page: int) -> str:
            url = f"http://127.0.0.1:{server.server_address[1]}/queue?name={q.name}&waiting_page={page}"
            with urllib.request.urlopen(url, timeout=10) as r:
                return str(r.read().decode())

        deep = get(1_020 // PAGE_ROWS)
        assert ids[1_020] in deep and ids[1_020 + PAGE_ROWS - 1] in deep and ids[1_019] not in deep
        assert "later &rarr;" in deep
        last = get(n // PAGE_ROWS)
        assert ids[-1] in last and "later &rarr;" not in last
    finally:
        server.shutdown()


def test_a_dashboard_of_many_registered_queues_is_one_client_of_redis() -> None:
    server = RedisServer("--maxclients", "100")
    try:
        r = redis.Redis(port=server.port)
        register(r, *({"name": f"spam{i:03d}", "layout": "native", "partitions": 1} for i in range(150)))
        app = delayq.DelayQueue(server.url, "orders")
        app.ping()

        def accepted() -> int:
            return int(r.info("stats")["total_connections_received"])

        before = accepted()
        with dashboard(server.url, "orders", "audit") as get:
            pages = {}
            for path in ("/", "/?registry_start=50", "/?registry_start=100", "/queue?name=spam149",
                         "/queue?name=spam000", "/queue?name=audit", "/"):
                status, page = get(path)
                assert status == 200 and "unreachable" not in page and "refused" not in page.lower(), (path, page)
                pages[path] = page
            opened = accepted() - before
            # The named queues and every registered one read, on one connection.
            assert opened == 1, f"the dashboard opened {opened} connections"
            front, later = pages["/"], pages["/?registry_start=50"]
            assert front.count('href="/queue?name=spam') == LISTED and front.count("<td>running</td>") >= LISTED
            assert "spam149" in front and "spam099" in later and "spam099" not in front
            assert "100 more registered queues not shown here" in front and "registry_start=50" in front
            assert "spam000" in pages["/?registry_start=100"] and "seen earlier" not in pages["/?registry_start=100"]
            # Redis still takes the application's pushes.
            app.push({"order_id": 1})
            assert app.stats()["ready"] == 1
            assert get("/?registry_start=x")[0] == 400
    finally:
        server.stop()


def test_a_registry_of_a_hundred_thousand_entries_costs_one_bounded_read_a_page(redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    entries = [{"name": f"spam{i:06d}", "layout": "native", "partitions": 1} for i in range(100_000)]
    for at in range(0, len(entries), 10_000):
        register(r, *entries[at:at + 10_000])
    with dashboard(redis_url, "orders") as get:
        r.config_resetstat()
        status, front = get("/")
        sent = int(r.info("stats")["total_net_output_bytes"])
        assert status == 200 and front.count('href="/queue?name=spam') == 50
        assert "99950 more registered queues not shown here" in front
        # The whole registry is some 6 MB; a page of it and its fifty queues a fraction.
        assert sent < 300_000, f"Redis sent {sent} bytes for the page"
        r.config_resetstat()
        status, page = get("/queue?name=spam099900")
        sent = int(r.info("stats")["total_net_output_bytes"])
        assert status == 200 and "queue <code>spam099900</code>" in page
        assert sent < 300_000, f"Redis sent {sent} bytes for a queue's page"
