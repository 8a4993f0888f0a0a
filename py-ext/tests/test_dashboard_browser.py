"""`delayq dashboard` in a real browser: Debian's Chromium, headless, driven over the
DevTools protocol on its pipe (no package beyond the standard library, no download).
A queue with traffic from a real worker pool, the overview and the queue's page, the
charts' points counted in the DOM, requeue and pause clicked through the page with
Basic auth, and screenshots saved under the test's tmp_path."""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Optional

import delayq
from harness import free_port, wait_for

CHROMIUM = shutil.which("chromium")
AUTH = "ops:s3cret"


class Browser:
    """Chromium with `--remote-debugging-pipe`: it reads DevTools commands on its fd 3
    and writes replies and events on its fd 4, each a JSON text ended by a NUL byte."""

    def __init__(self, profile: Path, log: Path) -> None:
        assert CHROMIUM is not None
        to_browser, self._commands = os.pipe()
        self._replies, from_browser = os.pipe()
        self._log = open(log, "wb")
        # bash puts the pipes at the numbers Chromium reads and writes, then becomes it.
        self.proc = subprocess.Popen(
            ["bash", "-c", f'exec "$0" "$@" 3<&{to_browser} 4>&{from_browser}', CHROMIUM,
             "--headless", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
             f"--user-data-dir={profile}", "--window-size=1400,1000", "about:blank"],
            pass_fds=(to_browser, from_browser), stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log)
        os.close(to_browser)
        os.close(from_browser)
        self._buffer = b""
        self._next_id = 0
        self.session = ""

    def call(self, method: str, timeout: float = 30.0, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if self.session and not method.startswith("Target."):
            message["sessionId"] = self.session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._receive(deadline, method)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise AssertionError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply["result"]
                return result

    def _receive(self, deadline: float, waiting_for: str) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._replies], [], [], left)[0]:
                raise AssertionError(f"Chromium did not answer {waiting_for}")
            chunk = os.read(self._replies, 1 << 20)
            if not chunk:
                raise AssertionError(f"Chromium closed its DevTools pipe (exit {self.proc.poll()})")
            self._buffer += chunk
        text, _, self._buffer = self._buffer.partition(b"\0")
        message: dict[str, Any] = json.loads(text)
        return message

    def open_tab(self) -> None:
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.enable")
        self.call("Network.enable")
        header = "Basic " + base64.b64encode(AUTH.encode()).decode()
        self.call("Network.setExtraHTTPHeaders", headers={"Authorization": header})

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    def loaded(self, url_part: str) -> bool:
        state = self.evaluate("[document.readyState, location.href]")
        return bool(state[0] == "complete" and url_part in state[1])

    def go(self, url: str) -> None:
        self.call("Page.navigate", url=url)
        wait_for(20, f"{url} to load", lambda: self.loaded(url.split("://", 1)[1]))

    def click(self, selector: str) -> None:
        """A real click (mouse down and up where the element is), as a person's."""
        box = self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return null;"
            " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
            " return [r.x + r.width / 2, r.y + r.height / 2]; })()")
        assert box is not None, f"nothing on the page matches {selector}"
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1)

    def screenshot(self, path: Path) -> Path:
        shot = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(shot["data"]))
        print(f"screenshot: {path}")
        return path

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=5)
        except (AssertionError, OSError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._commands, self._replies):
            os.close(fd)
        self._log.close()


def points(browser: Browser, chart: str) -> int:
    """The points of a chart's lines, as the browser parsed them."""
    n = browser.evaluate(
        f"Array.from(document.querySelectorAll('svg.chart[data-chart={chart}] polyline'))"
        ".reduce((n, line) => n + line.points.numberOfItems, 0)")
    return int(n)


def traffic(queue: delayq.DelayQueue) -> list[str]:
    """Messages a real pool handles (a fifth fail for good), until the per-minute
    records hold them and a backlog sample; returns the dead letters' ids."""
    ids = [queue.push({"order_id": i, "fail": i % 5 == 0}, id=f"order-{i}") for i in range(40)]
    for i in range(6):
        queue.push({"later": i}, delay=3600)
    worker = delayq.Worker(queue, lease=3, max_attempts=1)  # a heartbeat a second

    def handle(payload: Any, msg: delayq.Message) -> None:
        if payload.get("fail"):
            raise ValueError(f"order {payload['order_id']} cannot be closed")

    runner = threading.Thread(target=worker.run, args=(handle,))
    runner.start()
    try:
        def recorded() -> bool:
            minutes = queue.minutes(60)
            return (sum(m["handled"] for m in minutes) == 40 and sum(m["failed"] for m in minutes) == 8
                    and any(m["scheduled"] is not None for m in minutes))

        wait_for(60, "the pool's per-minute records", recorded)
    finally:
        worker.stop()
        runner.join(30)
    return [i for n, i in enumerate(ids) if n % 5 == 0]


def test_the_dashboard_in_chromium_charts_the_traffic_and_acts_with_auth(
    redis_url: str, tmp_path: Path
) -> None:
    assert CHROMIUM is not None, "no chromium on PATH: scripts/setup.sh installs Debian's chromium package"
    queue = delayq.DelayQueue(redis_url, "shop")
    dead = traffic(queue)
    assert queue.stats()["dead"] == len(dead)

    port = free_port()
    dashboard = subprocess.Popen(
        [sys.executable, "-m", "delayq", "--url", redis_url, "--queue", "shop", "dashboard", "--allow-actions",
         "--auth", AUTH, "--refresh", "0", "--listen", f"127.0.0.1:{port}"],
        stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        try:
            urllib.request.urlopen(base + "/", timeout=2)
        except urllib.error.HTTPError as e:
            return e.code == 401
        except OSError:
            return False
        return True

    browser: Optional[Browser] = None
    try:
        wait_for(20, "the dashboard", answers)
        browser = Browser(tmp_path / "profile", tmp_path / "chromium.log")
        browser.open_tab()

        browser.go(base + "/")
        assert browser.evaluate("document.title").startswith("delayq")
        assert browser.evaluate("document.querySelector('a[href=\"/queue?name=shop\"]') !== null")
        for chart in ("throughput", "lateness", "backlog"):
            assert points(browser, chart) > 0, f"the overview's {chart} chart has no points"
        # The page's Content-Security-Policy lets its own inline style through.
        assert browser.evaluate("getComputedStyle(document.querySelector('th')).backgroundColor") == \
            "rgb(246, 246, 246)"
        assert browser.evaluate("getComputedStyle(document.querySelector('figcaption span[style]')).color") == \
            "rgb(21, 101, 192)"
        browser.screenshot(tmp_path / "overview.png")

        browser.click('a[href="/queue?name=shop"]')
        wait_for(20, "the queue's page", lambda: browser is not None and browser.loaded("/queue?name=shop"))
        for chart in ("throughput", "lateness", "backlog"):
            assert points(browser, chart) > 0, f"the queue page's {chart} chart has no points"
        assert browser.evaluate("document.querySelectorAll('#dead + table tr').length") == len(dead) + 1
        browser.screenshot(tmp_path / "queue.png")

        # Requeue one dead letter by its button; the page comes back saying so.
        browser.click(f'form[data-do="requeue"][data-id="{dead[0]}"] button')
        wait_for(20, "the requeue's answer", lambda: browser is not None and "requeued 1 dead letter of shop"
                 in browser.evaluate("document.body ? document.body.innerText : ''"))
        info = queue.get(dead[0])
        assert info is not None and info["state"] in ("ready", "scheduled"), info
        assert queue.stats()["dead"] == len(dead) - 1

        browser.click('form[data-do="pause"] button')
        wait_for(20, "the pause's answer", lambda: browser is not None and "paused shop"
                 in browser.evaluate("document.body ? document.body.innerText : ''"))
        assert queue.is_paused()
        assert browser.evaluate("document.querySelector('form[data-do=\"resume\"]') !== null")
        browser.screenshot(tmp_path / "after-actions.png")
    finally:
        if browser is not None:
            browser.close()
        dashboard.send_signal(signal.SIGINT)
        assert dashboard.wait(10) == 0
        assert dashboard.stderr is not None
        dashboard.stderr.close()
