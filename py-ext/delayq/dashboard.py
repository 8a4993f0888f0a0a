"""A web page of queues for people, for `delayq dashboard` (what Laravel Horizon's
dashboard shows): depth and backlog age, pause and rate limit, the consumer pools alive
on every host and in every language, what runs now, what comes next and the latest dead
letters with their errors. The page reloads itself; every figure is read from Redis
afresh for each request.

It is read-only unless started with actions (`--allow-actions`, which needs `--auth`):
then it has buttons to requeue or delete a dead letter, requeue them all, and pause or
resume a queue, as Horizon's retry buttons. Each is a POST carrying a token that only
the page holds (a form on another site cannot forge one), behind HTTP Basic auth (a
page that another site reaches through DNS rebinding has no credentials).

Payloads and errors are the queue's own data, shown escaped and cut short; the page
holds them, so serve it where only operators can reach it (the default listens on
127.0.0.1), with `--auth` beyond one machine.
"""

from __future__ import annotations

import datetime
import hmac
import html
import json
import secrets
import time
import urllib.parse
from typing import Any, Callable, Optional

from . import DelayQueue, DelayQueueError
from .metrics import PageServer, Refused

# How many rows each list shows; the command line shows more.
ROWS = 10
# Longest payload or error text shown; the rest is cut.
SHOWN_CHARS = 160

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.3em}h2{font-size:1.15em;margin-top:1.8em;border-bottom:1px solid #ccc}
h3{font-size:1em;margin:1.2em 0 .3em}
table{border-collapse:collapse;margin:.2em 0 .8em}
td,th{padding:.2em .7em;border-bottom:1px solid #eee;text-align:left;vertical-align:top}
th{font-weight:600;background:#f6f6f6}td.n{text-align:right;font-variant-numeric:tabular-nums}
code{font-size:.92em}.bad{color:#b00020;font-weight:600}.quiet{color:#777}
form.act{display:inline;margin-right:.3em}.done{background:#e8f5e9;padding:.3em .6em}
summary{cursor:pointer}pre.trace{font-size:.85em;max-width:70em;overflow-x:auto;background:#f6f6f6;padding:.4em}
"""


def _text(value: Any) -> str:
    shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    if len(shown) > SHOWN_CHARS:
        shown = shown[:SHOWN_CHARS] + "…"
    return html.escape(shown)


def _id(m: dict[str, Any]) -> str:
    """A message's id, with its serial key when it has one (what a waiting message may
    wait for)."""
    key = m.get("serial_key")
    return f"<code>{_text(m['id'])}</code>" + (f"<br><small>serial key {_text(key)}</small>" if key else "")


def _error(m: dict[str, Any], css: str = "") -> str:
    """The last error, which unfolds into its whole trace when it came with one."""
    if not m["last_error"]:
        return ""
    shown = f'<span class="{css}">{_text(m["last_error"])}</span>' if css else _text(m["last_error"])
    trace = m.get("error_trace")
    if not trace:
        return shown
    return f'<details><summary>{shown}</summary><pre class="trace">{html.escape(trace)}</pre></details>'


def _when(seconds: Optional[float]) -> str:
    if seconds is None:
        return '<span class="quiet">-</span>'
    utc = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
    return utc.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def _span(seconds: Optional[float]) -> str:
    if seconds is None:
        return '<span class="quiet">-</span>'
    if abs(seconds) < 1:
        return f"{seconds * 1000:.1f} ms"
    if abs(seconds) < 120:
        return f"{seconds:.1f} s"
    if abs(seconds) < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _table(headers: list[str], rows: list[list[str]], numeric: frozenset[int] = frozenset()) -> str:
    if not rows:
        return '<p class="quiet">none</p>'
    head = "".join(f"<th>{h}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f'<td class="n">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in enumerate(r))
        + "</tr>"
        for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _found_section(q: DelayQueue, text: str) -> str:
    title = f"<h2>queue <code>{html.escape(q.name)}</code>: messages holding <code>{_text(text)}</code></h2>"
    try:
        found = q.find(text, ROWS)
    except DelayQueueError as e:
        return f'{title}<p class="bad">{_text(str(e))}</p>'
    return title + _table(
        ["id", "state", "due", "attempts", "last error", "payload"],
        [[f"<code>{_text(m['id'])}</code>", m["state"], _when(m["due_at"]), str(m["attempts"]),
          _error(m), _text(m["payload"])] for m in found],
        frozenset({3}),
    )


def _button(token: str, queue: str, do: str, label: str, id: str = "") -> str:
    """A form that POSTs one action: the page's token proves it came from this page."""
    fields = {"token": token, "queue": queue, "do": do, "id": id}
    hidden = "".join(f'<input type="hidden" name="{k}" value="{html.escape(v)}">' for k, v in fields.items())
    return f'<form method="post" action="/action" class="act">{hidden}<button>{label}</button></form>'


def _queue_section(q: DelayQueue, now: float, token: Optional[str] = None) -> str:
    title = f"<h2>queue <code>{html.escape(q.name)}</code></h2>"
    try:
        stats = q.stats()
        pools = q.workers()
        running = q.inflight(ROWS)
        waiting = q.waiting(ROWS)
        dead = q.dead_letters(ROWS)
        repeating = q.repeats()
        done = q.completed(ROWS)
    except DelayQueueError as e:
        return f'{title}<p class="bad">Redis did not answer: {_text(str(e))}</p>'
    next_due = stats["next_due_at"]
    lag = max(0.0, now - next_due) if next_due is not None and stats["ready"] > 0 else 0.0
    state = []
    if stats["paused_at"] is not None:
        state.append(f'<span class="bad">paused</span> since {_when(stats["paused_at"])}')
    if stats["rate_limit"] is not None:
        limit = stats["rate_limit"]
        state.append(f"rate limit {limit['max']} per {limit['per']:g} s")
    if stats["held"]:
        state.append(f"{stats['held']} scheduled held for their serial key")
    if not pools:
        state.append('<span class="bad">no worker pool alive</span>' if stats["ready"] else "no worker pool alive")
    depth = _table(
        ["scheduled", "ready", "in flight", "dead", "backlog age", "next due"],
        [[str(stats["scheduled"]), str(stats["ready"]), str(stats["inflight"]), str(stats["dead"]), _span(lag),
          _when(next_due)]],
        frozenset({0, 1, 2, 3}),
    )
    events = {k: v for k, v in stats.items() if isinstance(v, int) and k not in
              {"scheduled", "ready", "inflight", "dead", "completed", "held", "partitions"}}
    counters = _table(list(events), [[str(v) for v in events.values()]], frozenset(range(len(events))))
    workers = _table(
        ["host", "pid", "up for", "last seen", "handlers", "holding", "handled", "failed", "started late (avg / max)",
         "handler call"],
        [[html.escape(str(p["host"])), str(p["pid"]), _span(now - p["started_at"]), _span(now - p["last_seen"]) + " ago",
          str(p["handlers"]), str(p["holding"]), str(p["handled"]), str(p["failed"]),
          f"{_span(p['lateness_avg'])} / {_span(p['lateness_max'])}", _span(p["handler_avg"])]
         for p in pools],
        frozenset({1, 4, 5, 6, 7}),
    )
    inflight = _table(
        ["id", "attempt", "lease until", "payload"],
        [[_id(m), str(m["attempts"]),
          _when(m["lease_until"]) + (' <span class="bad">expired</span>'
                                     if m["lease_until"] is not None and m["lease_until"] < now else ""),
          _text(m["payload"])] for m in running],
        frozenset({1}),
    )
    upcoming = _table(
        ["id", "due", "attempts", "last error", "payload"],
        [[_id(m), _when(m["due_at"]), str(m["attempts"]),
          _error(m), _text(m["payload"])] for m in waiting],
        frozenset({2}),
    )
    schedules = _table(
        ["name", "schedule", "next due", "max attempts", "expire after", "payload"],
        [[f"<code>{_text(r['name'])}</code>",
          f"every {_span(r['schedule'])}" if r["tz"] is None else f"<code>{_text(r['schedule'])}</code> in {_text(r['tz'])}",
          _when(r["next_due_at"]), "" if r["max_attempts"] is None else str(r["max_attempts"]),
          "" if r["expire_after"] is None else _span(r["expire_after"]), _text(r["payload"])] for r in repeating],
        frozenset({3}),
    )
    completed = _table(
        ["id", "completed", "due", "attempts", "payload"],
        [[f"<code>{_text(m['id'])}</code>", _when(m["completed_at"]), _when(m["due_at"]), str(m["attempts"]),
          _text(m["payload"])] for m in done],
        frozenset({3}),
    )
    letters = _table(
        ["id", "died", "attempts", "last error", "payload"] + (["act"] if token else []),
        [[f"<code>{_text(m['id'])}</code>", _when(m["dead_at"]), str(m["attempts"]),
          _error(m, "bad"), _text(m["payload"])]
         + ([_button(token, q.name, "requeue", "requeue", m["id"]) + _button(token, q.name, "delete", "delete", m["id"])]
            if token else []) for m in dead],
        frozenset({2}),
    )
    if token:
        paused = stats["paused_at"] is not None
        title += ('<p>' + _button(token, q.name, "resume" if paused else "pause", "resume" if paused else "pause")
                  + (_button(token, q.name, "requeue", f"requeue all {stats['dead']} dead letters")
                     if stats["dead"] else "") + "</p>")
    return (
        title
        + (f"<p>{' · '.join(state)}</p>" if state else "")
        + depth
        + f"<h3>worker pools ({len(pools)})</h3>{workers}"
        + f"<h3>running (first {ROWS} by lease)</h3>{inflight}"
        + f"<h3>next due (first {ROWS})</h3>{upcoming}"
        + (f"<h3>repeating messages ({len(repeating)})</h3>{schedules}" if repeating else "")
        + (f"<h3>completed (latest {ROWS} of {stats['completed']} kept)</h3>{completed}" if done else "")
        + (f"<h3>dead letters (latest {ROWS})</h3>" if token else
           f"<h3>dead letters (latest {ROWS}; <code>delayq --queue {html.escape(q.name)} requeue-dead</code>)</h3>")
        + letters
        + f"<h3>lifetime counters</h3>{counters}"
    )


def render_html(queues: list[DelayQueue], refresh: float = 5.0, now: Optional[Callable[[], float]] = None,
                find: str = "", token: Optional[str] = None, done: str = "") -> str:
    """The page for `queues`. A queue whose Redis fails says so; the others still show.
    With `find`, the messages of each queue whose payload holds it (or whose id it is) come first.
    With `token`, the page has action buttons (see the module); `done` says what the last one did."""
    clock = now or time.time
    at = clock()
    search = (f'<form method="get"><input name="find" value="{html.escape(find)}" '
              'placeholder="an order number, an id, any text of a payload"> <button>find</button></form>')
    found = "".join(_found_section(q, find) for q in queues) if find else ""
    notice = f'<p class="done">{_text(done)}</p>' if done else ""
    sections = notice + search + found + "".join(_queue_section(q, at, token) for q in queues)
    # A reload must not repeat the notice of an action.
    again = "/?" + urllib.parse.urlencode({"find": find}) if find else "/"
    reload = f'<meta http-equiv="refresh" content="{refresh:g}; url={html.escape(again)}">' if refresh > 0 else ""
    return (
        "<!doctype html><html><head><meta charset=\"utf-8\">"
        f"<title>delayq: {html.escape(', '.join(q.name for q in queues))}</title>{reload}"
        f"<style>{_STYLE}</style></head><body>"
        f"<h1>delayq</h1><p class=\"quiet\">read at {_when(at)}"
        + (f", again every {refresh:g} s" if refresh > 0 else "")
        + f"</p>{sections}</body></html>"
    )


def _actions(queues: list[DelayQueue], token: str) -> Callable[[dict[str, str]], str]:
    """What a button does; returns the page to show next, which says what was done."""
    by_name = {q.name: q for q in queues}

    def act(form: dict[str, str]) -> str:
        if not hmac.compare_digest(form.get("token", "").encode(), token.encode()):
            raise Refused("this form is not from this dashboard (reload the page)")
        q = by_name.get(form.get("queue", ""))
        if q is None:
            raise Refused(f"no queue {form.get('queue', '')!r} on this dashboard")
        do, id = form.get("do", ""), form.get("id") or None
        if do == "requeue":
            n = q.requeue_dead(id)
            done = f"requeued {n} dead letter{'' if n == 1 else 's'} of {q.name}"
        elif do == "delete":
            if id is None:
                raise Refused("delete takes one dead letter at a time")
            n = q.delete_dead(id)
            done = f"deleted {n} dead letter{'' if n == 1 else 's'} of {q.name}"
        elif do == "pause":
            q.pause()
            done = f"paused {q.name}"
        elif do == "resume":
            q.resume()
            done = f"resumed {q.name}"
        else:
            raise Refused(f"no action {do!r}")
        return "/?" + urllib.parse.urlencode({"done": done})

    return act


def make_server(queues: list[DelayQueue], host: str, port: int, refresh: float = 5.0,
                auth: Optional[str] = None, actions: bool = False) -> PageServer:
    """A server of the page for `queues` at `/` on `host:port`; call `serve_forever()`.
    `auth` ("user:password") asks every request for HTTP Basic credentials; `actions`
    (only with `auth`) adds the buttons and `POST /action`."""
    if actions and auth is None:
        raise ValueError("dashboard actions need auth: without it any page the browser opens could use them")
    token = secrets.token_urlsafe(24) if actions else None

    def page(query: dict[str, str]) -> str:
        return render_html(queues, refresh, find=query.get("find", ""), token=token, done=query.get("done", ""))

    return PageServer((host, port), {"/": ("text/html; charset=utf-8", page)},
                      actions={"/action": _actions(queues, token)} if token else None, auth=auth)
