"""`delayq dashboard` and `delayq serve-metrics` as servers, run as real processes and
reached over real sockets: a stalled or idle connection holds no other request, an
address other than loopback needs credentials or --insecure-listen said on purpose, a Host
header naming another site is refused (DNS rebinding), every answer forbids framing
and sniffing, and a query value the page cannot use is answered 400 or 404 with a
plain text, never a dropped connection and a traceback."""

from __future__ import annotations

import base64
import contextlib
import http.client
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from typing import Optional

import pytest

import delayq
from delayq.metrics import MAX_CONNECTIONS
from harness import free_port, wait_for

COMMANDS = ["dashboard", "serve-metrics"]


def start(redis_url: str, *args: str, host: str = "127.0.0.1",
          env: Optional[dict[str, str]] = None) -> tuple[subprocess.Popen[bytes], int]:
    """`delayq ... ARGS --listen HOST:PORT` on a free port, its stderr kept for the test to read."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "delayq", "--url", redis_url, "--queue", "jobs", *args,
         "--listen", f"{host}:{port}"],
        stderr=subprocess.PIPE, env={**os.environ, **(env or {})})
    return proc, port


def fetch(port: int, path: str = "/", headers: Optional[dict[str, str]] = None, method: str = "GET",
          body: Optional[bytes] = None, timeout: float = 5.0) -> tuple[http.client.HTTPResponse, str]:
    """One request on a connection of its own: the answer and its body."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response, response.read().decode()
    finally:
        conn.close()


def refused(redis_url: str, *args: str, host: str = "127.0.0.1", env: Optional[dict[str, str]] = None) -> str:
    """The stderr of `delayq ... ARGS`, which must refuse to start (status 2)."""
    proc, _ = start(redis_url, *args, host=host, env=env)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError(f"delayq {' '.join(args)} on {host!r} started serving") from None
    assert proc.returncode == 2 and err.startswith(b"delayq: ") and b"Traceback" not in err, (args, err)
    return err.decode()


@contextlib.contextmanager
def serving(redis_url: str, *args: str, host: str = "127.0.0.1") -> Iterator[tuple[int, list[str]]]:
    """The server until the block ends, then SIGINT; yields its port and a list that
    holds its stderr once stopped: it must hold no traceback."""
    proc, port = start(redis_url, *args, host=host)
    errors: list[str] = []

    def answers() -> bool:
        try:
            fetch(port, timeout=2)
            return True
        except OSError:
            return False

    try:
        wait_for(20, f"delayq {args[0]} to answer", answers)
        yield port, errors
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 0
        assert proc.stderr is not None
        errors.append(proc.stderr.read().decode())
        proc.stderr.close()
    assert "Traceback" not in errors[0], errors[0]


@pytest.mark.parametrize("command", COMMANDS)
def test_a_stalled_connection_holds_no_other_request(redis_url: str, command: str) -> None:
    with serving(redis_url, command) as (port, _):
        # What Chromium leaves open for the next request: a connection that says nothing.
        idle = socket.create_connection(("127.0.0.1", port))
        half = socket.create_connection(("127.0.0.1", port))
        half.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        try:
            began = time.monotonic()
            response, _ = fetch(port)
            assert response.status == 200 and time.monotonic() - began < 3
        finally:
            idle.close()
            half.close()

        # One connection more than the server serves at once is told so at once.
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(MAX_CONNECTIONS)]
        try:
            response, body = fetch(port)
            assert response.status == 503 and f"{MAX_CONNECTIONS} connections are open already" in body
            assert response.headers["X-Frame-Options"] == "DENY"
        finally:
            for s in held:
                s.close()
        wait_for(10, "the slots freed", lambda: fetch(port)[0].status == 200)


@pytest.mark.parametrize("command", COMMANDS)
def test_an_address_beyond_loopback_needs_credentials_or_insecure_listen(redis_url: str, command: str) -> None:
    for host in ("0.0.0.0", ""):
        err = refused(redis_url, command, host=host)
        assert "not a loopback address" in err and "--auth" in err and "--insecure-listen" in err, err
    wrong = [
        ["--auth", "ops:"], ["--auth", ":pw"], ["--auth", "ops"], ["--auth", "ops:pw", "--insecure-listen"],
        ["--allowed-hosts", "a b"],
    ]
    if command == "dashboard":
        wrong += [["--auth", "ops:", "--allow-actions"], ["--allow-actions", "--insecure-listen"]]
    for args in wrong:
        refused(redis_url, command, *args)
    assert "neither of them empty" in refused(redis_url, command, env={"DELAYQ_DASHBOARD_AUTH": "ops:"})

    with serving(redis_url, command, "--insecure-listen", host="0.0.0.0") as (port, errors):
        assert fetch(port)[0].status == 200
    assert "without credentials (--insecure-listen)" in errors[0]
    with serving(redis_url, command, "--auth", "ops:pw", host="0.0.0.0") as (port, _):
        assert fetch(port)[0].status == 401
        auth = "Basic " + base64.b64encode(b"ops:pw").decode()
        assert fetch(port, headers={"Authorization": auth})[0].status == 200


@pytest.mark.parametrize("command", COMMANDS)
def test_a_host_header_naming_another_site_is_refused(redis_url: str, command: str) -> None:
    with serving(redis_url, command) as (port, _):
        for host in ("evil.example", f"evil.example:{port}", "localhost.evil.example", "dq.internal"):
            response, body = fetch(port, headers={"Host": host})
            assert response.status == 421, host
            assert repr(host) in body and "DNS rebinding" in body and "--allowed-hosts" in body, body
            assert response.headers["Content-Type"] == "text/plain; charset=utf-8"
        for host in (f"127.0.0.1:{port}", "localhost", f"LOCALHOST:{port}", "app.localhost", f"[::1]:{port}",
                     "10.1.2.3"):
            assert fetch(port, headers={"Host": host})[0].status == 200, host
    with serving(redis_url, command, "--allowed-hosts", "dq.internal,ops.example", "--allowed-hosts",
                 "third.example") as (port, _):
        for host in ("dq.internal", f"DQ.Internal.:{port}", "ops.example", "third.example"):
            assert fetch(port, headers={"Host": host})[0].status == 200, host
        for host in ("evil.example", "dq.internal.evil.example"):
            assert fetch(port, headers={"Host": host})[0].status == 421, host
    # The --listen host, when a name, is one of them.
    with serving(redis_url, command, host="localhost") as (port, _):
        assert fetch(port, headers={"Host": f"localhost:{port}"})[0].status == 200
    # With credentials too: a rebinding page would otherwise get the login prompt.
    with serving(redis_url, command, "--auth", "ops:pw") as (port, _):
        assert fetch(port, headers={"Host": "evil.example"})[0].status == 421


def test_every_answer_forbids_framing_and_sniffing(redis_url: str) -> None:
    auth = {"Authorization": "Basic " + base64.b64encode(b"ops:pw").decode()}
    with serving(redis_url, "dashboard", "--auth", "ops:pw", "--allow-actions") as (port, _):
        answers = [
            fetch(port, headers=auth), fetch(port), fetch(port, "/nowhere", headers=auth),
            fetch(port, "/queue?name=nowhere", headers=auth), fetch(port, headers={"Host": "evil.example"}),
            fetch(port, "/action", headers=auth, method="POST", body=b"do=pause"),
            fetch(port, "/queue?name=jobs&waiting_page=x", headers=auth),
        ]
        assert [r.status for r, _ in answers] == [200, 401, 404, 404, 421, 403, 400]
        for response, _ in answers:
            assert response.headers["X-Frame-Options"] == "DENY"
            assert "frame-ancestors 'none'" in response.headers["Content-Security-Policy"]
            assert response.headers["X-Content-Type-Options"] == "nosniff"
    with serving(redis_url, "serve-metrics") as (port, _):
        response, body = fetch(port, "/metrics")
        assert response.status == 200 and "delayq_up" in body
        assert response.headers["X-Frame-Options"] == "DENY" and response.headers["X-Content-Type-Options"] == "nosniff"


def test_a_query_value_the_page_cannot_use_is_answered_in_plain_text(redis_url: str) -> None:
    delayq.DelayQueue(redis_url, "中").push({"n": 1}, id="han-1")
    auth = {"Authorization": "Basic " + base64.b64encode(b"ops:pw").decode()}
    with serving(redis_url, "dashboard", "--auth", "ops:pw", "--allow-actions") as (port, _):
        response, body = fetch(port, "/queue?name=%E4%B8%AD", headers=auth)
        assert response.status == 200 and "queue <code>中</code>" in body and "han-1" in body
        response, body = fetch(port, "/queue?name=%E5%9B%BD", headers=auth)
        assert response.status == 404 and body == "no queue '国' on this dashboard\n"
        assert response.headers["Content-Type"] == "text/plain; charset=utf-8"
        for value in ("%C2%B2", "-1", "x", "1.5", "5001", "99999999999999999999999"):
            response, body = fetch(port, f"/queue?name=jobs&waiting_page={value}", headers=auth)
            assert response.status == 400, value
            shown = repr(urllib.parse.unquote(value))
            assert body == f"waiting_page must be a page number from 0 to 5000, got {shown}\n", body
        assert fetch(port, "/queue?name=jobs&dead_page=5000", headers=auth)[0].status == 200
        # A request target that urllib cannot split (http.client will not send it).
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            raw.sendall(f"GET http://[/ HTTP/1.0\r\nAuthorization: {auth['Authorization']}\r\n\r\n".encode())
            answer = b"".join(iter(lambda: raw.recv(65536), b"")).decode()
        assert answer.startswith("HTTP/1.0 400 ") and "cannot read the path 'http://[/'" in answer, answer
        response, body = fetch(port, "/action", headers={**auth, "Content-Length": "²"}, method="POST")
        assert response.status == 400 and body == "Content-Length must be a number of bytes, got '²'\n", body
