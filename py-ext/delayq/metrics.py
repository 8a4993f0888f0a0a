"""Queue metrics in the Prometheus text format, for `delayq metrics` (one shot: cron
and node_exporter's textfile collector) and `delayq serve-metrics` (an HTTP endpoint
to scrape). Every figure comes from `DelayQueue.stats()` and `workers()`, so PHP,
Python and Rust consumers of the same queue show up alike.
"""

from __future__ import annotations

import base64
import hmac
import http.server
import ipaddress
import socketserver
import sys
import threading
import time
import urllib.parse
from typing import Any, Callable, Iterable, Optional

from . import DelayQueue, DelayQueueError

DEPTH = ("scheduled", "ready", "inflight", "dead", "completed")
# The stats() keys that are lifetime counters (the rest are depths and settings).
NOT_EVENTS = {*DEPTH, "held", "next_due_at", "paused_at", "rate_limit", "partitions"}

_HELP = {
    "delayq_up": ("gauge", "1 if the queue's Redis answered this scrape, 0 if not."),
    "delayq_messages": ("gauge", "Messages in the queue by state."),
    "delayq_held_messages": (
        "gauge",
        "Scheduled messages, due already, that wait in their serial key's or group's line "
        "(counted in delayq_messages as scheduled).",
    ),
    "delayq_lag_seconds": (
        "gauge",
        "How long the earliest due message has waited past its due time (0 when none is due): "
        "the backlog's age, the figure to alert on.",
    ),
    "delayq_next_due_timestamp_seconds": ("gauge", "Due time of the earliest waiting message (Unix seconds)."),
    "delayq_paused": ("gauge", "1 while consumption is paused (see pause()), else 0."),
    "delayq_rate_limit_messages_per_second": (
        "gauge",
        "The queue's rate limit (see set_rate_limit()) as max / per; absent when none is set.",
    ),
    "delayq_workers": ("gauge", "Consumer pools alive on the queue, from every host and language."),
    "delayq_worker_handlers": ("gauge", "Handlers of the pools alive: deliveries they work on at once."),
    "delayq_worker_holding": ("gauge", "Deliveries the pools alive hold, running or prefetched."),
    "delayq_start_lateness_seconds": (
        "gauge",
        "How late handlers started after their messages' due time, over the pools' last heartbeat "
        "(stat avg or max); absent when none started.",
    ),
    "delayq_handler_seconds": ("gauge", "Moving average of one handler call, averaged over the pools alive."),
    "delayq_events_total": ("counter", "Lifetime counts by event: pushed, delivered, acked, retried, died, ..."),
}


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def render(queues: Iterable[DelayQueue], now: Optional[Callable[[], float]] = None) -> str:
    """The metrics of `queues`, one scrape. A queue whose Redis fails shows `delayq_up 0`
    and nothing else, so one unreachable Redis does not hide the others."""
    clock = now or time.time
    samples: dict[str, list[str]] = {name: [] for name in _HELP}

    def add(metric: str, labels: dict[str, str], value: float) -> None:
        text = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
        samples[metric].append(f"{metric}{{{text}}} {_number(value)}")

    for q in queues:
        queue = {"queue": q.name}
        try:
            # Read by key names from tables: plain dicts for the type checker.
            stats: dict[str, Any] = dict(q.stats())
            pools: list[dict[str, Any]] = [dict(p) for p in q.workers()]
        except DelayQueueError:
            add("delayq_up", queue, 0)
            continue
        add("delayq_up", queue, 1)
        for state in DEPTH:
            add("delayq_messages", {**queue, "state": state}, stats[state])
        add("delayq_held_messages", queue, stats["held"])
        next_due = stats["next_due_at"]
        add("delayq_lag_seconds", queue, max(0.0, clock() - next_due) if next_due is not None else 0)
        if next_due is not None:
            add("delayq_next_due_timestamp_seconds", queue, next_due)
        add("delayq_paused", queue, 0 if stats["paused_at"] is None else 1)
        limit = stats["rate_limit"]
        if limit is not None:
            add("delayq_rate_limit_messages_per_second", queue, limit["max"] / limit["per"])
        add("delayq_workers", queue, len(pools))
        add("delayq_worker_handlers", queue, sum(p["handlers"] for p in pools))
        add("delayq_worker_holding", queue, sum(p["holding"] for p in pools))
        started = [p for p in pools if p["lateness_max"] is not None and p["started_recently"] > 0]
        if started:
            count = sum(p["started_recently"] for p in started)
            add("delayq_start_lateness_seconds", {**queue, "stat": "avg"},
                sum(p["lateness_avg"] * p["started_recently"] for p in started) / count)
            add("delayq_start_lateness_seconds", {**queue, "stat": "max"}, max(p["lateness_max"] for p in started))
        timed = [p["handler_avg"] for p in pools if p["handler_avg"] is not None]
        if timed:
            add("delayq_handler_seconds", queue, sum(timed) / len(timed))
        for event, count in stats.items():
            if event not in NOT_EVENTS:
                add("delayq_events_total", {**queue, "event": event}, count)

    lines: list[str] = []
    for metric, (kind, text) in _HELP.items():
        if samples[metric]:
            lines += [f"# HELP {metric} {text}", f"# TYPE {metric} {kind}", *samples[metric]]
    return "\n".join(lines) + "\n"


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Refused(Exception):
    """An action the server will not run: answered 403 with this text."""


class NotFound(Exception):
    """A page of something that is not there: answered 404 with this text."""


#: Largest form an action takes (a few hidden fields).
MAX_FORM_BYTES = 16 * 1024
#: Connections served at once, each by a thread of its own; one more is answered 503
#: at once, so that no number of clients makes the others wait in line.
MAX_CONNECTIONS = 32
#: Seconds a connection may send nothing (or take nothing of the answer) before it is
#: closed: a client that sends half a request and waits holds one thread that long.
READ_TIMEOUT = 10.0
# Sent with every answer: no page of ours in a frame of another site (clickjacking),
# nothing loaded or run that the page does not hold (it needs only its inline style),
# forms posted only to this server, and no guessing of a content type.
SECURITY_HEADERS = (
    ("X-Frame-Options", "DENY"),
    ("Content-Security-Policy",
     "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"),
    ("X-Content-Type-Options", "nosniff"),
)


class Exposed(ValueError):
    """A server without credentials asked to listen on an address other than loopback:
    anyone who reaches the address would read it (or act, with actions)."""

    def __init__(self, host: str) -> None:
        super().__init__(f"will not serve without credentials on {host}, which is not a loopback address: "
                         "give auth, or insecure_listen=True to serve anyone who reaches it")
        self.host = host


def _ip(name: str) -> Optional[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def _host_name(header: str) -> str:
    """The name of a Host header, without its port and brackets, lower case."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].partition("]")[0]
    name, _, port = header.rpartition(":")
    return (name if name and port.isdigit() else header).rstrip(".")


class PageServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    """Answers `GET` of each path in `pages` (path -> (content type, render)) with a
    fresh rendering of the request's query (the last value of each name); 404 for any
    other path. `POST` to a path of `actions` (path -> run) runs it with the form's
    fields and redirects (303) to the page it returns; an action that raises `Refused`
    is answered 403. With `auth` ("user:password") every request needs those HTTP Basic
    credentials.

    Without `auth` it listens only on a loopback address unless `insecure_listen` says to serve
    anyone (else `Exposed`). Every request must name in its Host header an IP address,
    localhost (or a name under .localhost), the host it listens on as given, or one of
    `allowed_hosts`; any other name is answered 421, so that a site whose name resolves
    to this server (DNS rebinding) reads nothing through a visitor's browser. Each
    connection has a thread of its own (at most `MAX_CONNECTIONS`) and `READ_TIMEOUT`."""

    daemon_threads = True  # a client that stalls must not delay the process's exit

    def __init__(self, address: tuple[str, int],
                 pages: dict[str, tuple[str, Callable[[dict[str, str]], str]]],
                 actions: Optional[dict[str, Callable[[dict[str, str]], str]]] = None,
                 auth: Optional[str] = None, insecure_listen: bool = False,
                 allowed_hosts: Iterable[str] = ()) -> None:
        if auth is not None:
            user, colon, password = auth.partition(":")
            if not colon or not user or not password:
                raise ValueError("auth wants USER:PASSWORD, both not empty")
            if insecure_listen:
                raise ValueError("auth and insecure_listen contradict each other: give one")
        super().__init__(address, _Handler, bind_and_activate=False)
        try:
            self.server_bind()
            bound = _ip(str(self.server_address[0]))
            if auth is None and not insecure_listen and not (bound is not None and bound.is_loopback):
                raise Exposed(str(self.server_address[0]))
            self.server_activate()
        except BaseException:
            self.server_close()
            raise
        self.pages = pages
        self.actions = actions or {}
        self.expected_auth = None if auth is None else "Basic " + base64.b64encode(auth.encode()).decode()
        named = {address[0], *allowed_hosts}
        self.allowed_hosts = frozenset(_host_name(h) for h in named if h and _ip(h) is None)
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def host_allowed(self, header: Optional[str]) -> bool:
        """Whether a request with this Host header may be answered (see the class)."""
        if header is None:
            return True  # not a browser: every browser sends one
        name = _host_name(header)
        return (_ip(name) is not None or name == "localhost" or name.endswith(".localhost")
                or name in self.allowed_hosts)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            busy = f"{MAX_CONNECTIONS} connections are open already: try again".encode()
            head = "".join(f"{k}: {v}\r\n" for k, v in SECURITY_HEADERS)
            try:
                request.setblocking(False)  # a few bytes into a fresh socket; never wait for this one
                request.send(b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
                             + head.encode() + f"Content-Length: {len(busy)}\r\n\r\n".encode() + busy)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that went away or stalled is not news; anything else keeps its traceback.
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class MetricsServer(PageServer):
    """Answers `GET /metrics` (and `/`) with `render(queues)`, reading Redis afresh for
    each scrape; see `make_server`."""

    def __init__(self, address: tuple[str, int], queues: list[DelayQueue], auth: Optional[str] = None,
                 insecure_listen: bool = False, allowed_hosts: Iterable[str] = ()) -> None:
        page = (CONTENT_TYPE, lambda query: render(queues))
        super().__init__(address, {"/": page, "/metrics": page}, auth=auth, insecure_listen=insecure_listen,
                         allowed_hosts=allowed_hosts)
        self.queues = queues


class BadRequest(Exception):
    """A request the server cannot read (a bad query value, say): answered 400 with this text."""


class _Handler(http.server.BaseHTTPRequestHandler):
    server: PageServer
    timeout = READ_TIMEOUT

    def end_headers(self) -> None:
        for name, value in SECURITY_HEADERS:
            self.send_header(name, value)
        super().end_headers()

    def send_error(self, code: int, message: Optional[str] = None, explain: Optional[str] = None) -> None:
        """The status's own reason phrase, and `message` as the body in plain UTF-8 text:
        the stdlib puts it in the status line, which holds Latin-1 only (a queue name
        in another script failed there)."""
        body = (message or self.responses.get(code, ("",))[0]).encode() + b"\n"
        self.send_response(code)
        self.send_header("Connection", "close")
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _admitted(self) -> bool:
        """Whether the Host header names this server and the credentials are right;
        if not, the answer is sent."""
        host = self.headers.get("Host")
        if not self.server.host_allowed(host):
            self.send_error(421, f"this server does not answer for the host {host!r} (names other than its own "
                                 "are refused, against DNS rebinding): open it by its IP address or localhost, "
                                 "or list the name in --allowed-hosts")
            return False
        expected = self.server.expected_auth
        if expected is None:
            return True
        given = self.headers.get("Authorization", "")
        if hmac.compare_digest(given.encode(), expected.encode()):
            return True
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Basic realm="delayq", charset="UTF-8"')
        self.send_header("Content-Length", "0")
        self.end_headers()
        return False

    def _url(self) -> Optional[urllib.parse.SplitResult]:
        try:
            return urllib.parse.urlsplit(self.path)
        except ValueError as e:
            self.send_error(400, f"cannot read the path {self.path!r}: {e}")
            return None

    def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
        if not self._admitted():
            return
        url = self._url()
        if url is None:
            return
        run = self.server.actions.get(url.path)
        if run is None:
            self.send_error(405 if url.path in self.server.pages else 404, "no action here")
            return
        raw = self.headers.get("Content-Length") or "0"
        if not (raw.isascii() and raw.isdigit()):
            self.send_error(400, f"Content-Length must be a number of bytes, got {raw!r}")
            return
        if int(raw) > MAX_FORM_BYTES:
            self.send_error(413, f"a form of at most {MAX_FORM_BYTES} bytes")
            return
        form = dict(urllib.parse.parse_qsl(self.rfile.read(int(raw)).decode("utf-8", "replace")))
        try:
            location = run(form)
        except Refused as e:
            self.send_error(403, str(e))
            return
        self.send_response(303)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        if not self._admitted():
            return
        url = self._url()
        if url is None:
            return
        page = self.server.pages.get(url.path)
        if page is None:
            self.send_error(404, f"only {', '.join(sorted(self.server.pages))} is served here")
            return
        content_type, make = page
        try:
            body = make(dict(urllib.parse.parse_qsl(url.query))).encode()
        except BadRequest as e:
            self.send_error(400, str(e))
            return
        except NotFound as e:
            self.send_error(404, str(e))
            return
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # a scrape every 15 s is not news


def make_server(queues: list[DelayQueue], host: str, port: int, auth: Optional[str] = None,
                insecure_listen: bool = False, allowed_hosts: Iterable[str] = ()) -> MetricsServer:
    """A server for `queues` on `host:port`; call `serve_forever()` on it. With `auth`
    ("user:password"), a scrape needs those HTTP Basic credentials; without it, only a
    loopback address is served unless `insecure_listen` (see `PageServer`)."""
    return MetricsServer((host, port), queues, auth, insecure_listen, allowed_hosts)
