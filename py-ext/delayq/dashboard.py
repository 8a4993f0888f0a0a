"""A web page of queues for people, for `delayq dashboard` (what Laravel Horizon's
dashboard shows): depth and backlog age, pause and rate limit, charts of the last hour
(messages handled and failed a minute, how late handlers started, the backlog; from the
per-minute records that the pools write, see `DelayQueue.minutes`), the consumer pools
alive on every host and in every language, what runs now, what comes next and the
latest dead letters with their errors. The page reloads itself; every figure is read
from Redis afresh for each request.

`/` lists the queues named and those that pools or producers registered
(`DelayQueue.registered_queues_page`, a page at a time) as far as it may open them
(see `Registry`: the registry is not trusted: what it reads, renders and opens is
bounded, and its queues share one connection), and shows the named ones in full; `/queue?name=NAME` is one queue's page, with its waiting, running, dead and
completed messages a page at a time and a search. The charts are inline SVG: the page
needs nothing from outside. A Redis that does not answer makes the page say so at once
rather than wait (see `Reachability`).

It is read-only unless started with actions (`--allow-actions`, which needs `--auth`):
then it has buttons to requeue or delete a dead letter, requeue them all, and pause or
resume a queue, as Horizon's retry buttons. Each is a POST carrying a token that only
the page holds (a form on another site cannot forge one), behind HTTP Basic auth (a
page that another site reaches through DNS rebinding has no credentials).

Payloads and errors are the queue's own data, shown escaped and cut short; the page
holds them, so serve it where only operators can reach it: the default listens on
127.0.0.1, and any other address needs `--auth` (or `--insecure-listen`, said on purpose). A
request whose Host header names another site is refused (DNS rebinding), and the page
may not be framed; see `metrics.PageServer`.
"""

from __future__ import annotations

import datetime
import hmac
import html
import json
import re
import secrets
import threading
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Callable, Optional, Union

from . import DelayQueue, DelayQueueError
from .errors import ConnectionError as RedisUnreachable
from .metrics import BadRequest, NotFound, PageServer, Refused

# How many rows each list shows; the command line shows more.
ROWS = 10
# Longest payload, error or id shown in a row; the rest is cut (an ellipsis says so).
SHOWN_CHARS = 160
# Longest error trace shown; a note says how much more there is.
SHOWN_TRACE_CHARS = 8000

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.3em}h2{font-size:1.15em;margin-top:1.8em;border-bottom:1px solid #ccc}
h3{font-size:1em;margin:1.2em 0 .3em}
table{border-collapse:collapse;margin:.2em 0 .8em}
td,th{padding:.2em .7em;border-bottom:1px solid #eee;text-align:left;vertical-align:top}
th{font-weight:600;background:#f6f6f6}td.n{text-align:right;font-variant-numeric:tabular-nums}
code{font-size:.92em}.bad{color:#b00020;font-weight:600}.quiet{color:#777}
form.act{display:inline;margin-right:.3em}.done{background:#e8f5e9;padding:.3em .6em}
.charts{display:flex;flex-wrap:wrap;gap:1em}figure.chart{margin:.3em 0}
figure.chart svg{border:1px solid #eee;background:#fcfcfc;display:block}
.axis{display:flex;justify-content:space-between;font-size:.8em;color:#777;width:360px}
summary{cursor:pointer}pre.trace{font-size:.85em;max-width:70em;overflow-x:auto;background:#f6f6f6;padding:.4em}
"""


class _Full(Exception):
    """`_clipped` has what it shows."""


def _clipped(value: Any, limit: int, compact: bool = False, strings: bool = False) -> tuple[str, bool]:
    """`value` as shown (a string as it is unless `strings`, anything else as JSON,
    `compact` without blanks), at most `limit` characters, and whether it was cut. A
    huge payload is not serialised whole to show its start: the walk stops once
    `limit` is reached (the command line's listings use it too)."""
    comma, colon = (",", ":") if compact else (", ", ": ")
    if isinstance(value, str) and not strings:
        return (value, False) if len(value) <= limit else (value[:limit], True)
    parts: list[str] = []
    size = 0

    def put(text: str) -> None:
        nonlocal size
        parts.append(text)
        size += len(text)
        if size > limit:
            raise _Full

    def walk(v: Any) -> None:
        if isinstance(v, dict):
            put("{")
            for i, (k, item) in enumerate(v.items()):
                put((comma if i else "") + json.dumps(str(k)[:limit], ensure_ascii=False) + colon)
                walk(item)
            put("}")
        elif isinstance(v, (list, tuple)):
            put("[")
            for i, item in enumerate(v):
                if i:
                    put(comma)
                walk(item)
            put("]")
        elif isinstance(v, str):
            # One character more than the limit tells that it was cut.
            put(json.dumps(v[:limit + 1], ensure_ascii=False))
        else:
            put(json.dumps(v))

    try:
        walk(value)
    except _Full:
        return "".join(parts)[:limit], True
    return "".join(parts), False


def _text(value: Any, limit: int = SHOWN_CHARS) -> str:
    shown, cut = _clipped(value, limit)
    return html.escape(shown) + ("…" if cut else "")


def _id(m: dict[str, Any]) -> str:
    """A message's id, with its serial key or group when it has one (what a waiting
    message may wait for), and why it waits."""
    key, group, held = m.get("serial_key"), m.get("group"), m.get("held")
    return f"<code>{_text(m['id'])}</code>" + (f"<br><small>serial key {_text(key)}</small>" if key else "") + (
        f"<br><small>group {_text(group)}</small>" if group else "") + (
        f"<br><small>held: {_text(held)}</small>" if held else "")


def _error(m: Mapping[str, Any], css: str = "") -> str:
    """The last error, which unfolds into its trace when it came with one (cut at
    `SHOWN_TRACE_CHARS`, saying how much more there is)."""
    if not m["last_error"]:
        return ""
    shown = f'<span class="{css}">{_text(m["last_error"])}</span>' if css else _text(m["last_error"])
    trace = m.get("error_trace")
    if not trace:
        return shown
    more = len(trace) - SHOWN_TRACE_CHARS
    rest = (f'\n<span class="quiet cut">… {more} more characters not shown: <code>delayq get '
            f'{_text(m["id"])}</code> shows the whole trace</span>') if more > 0 else ""
    return (f'<details><summary>{shown}</summary><pre class="trace">{html.escape(trace[:SHOWN_TRACE_CHARS])}'
            f'{rest}</pre></details>')


def _payload(m: Mapping[str, Any]) -> str:
    """A listed message's payload, or the note that the listing left it out (a stored
    message past the listings' bound: `delayq get` shows it whole)."""
    omitted = m.get("payload_omitted_bytes")
    if omitted is not None:
        return f'<span class="quiet">&lt;payload omitted: {omitted} bytes&gt;</span>'
    return _text(m["payload"])


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


# The charts: the last hour, a point per minute.
CHART_MINUTES = 60
_CHART_W, _CHART_H, _CHART_PAD = 360, 110, 4


def _number(value: float) -> str:
    return f"{value:.0f}" if value >= 10 or float(value).is_integer() else f"{value:.2g}"


def _chart(name: str, title: str, minutes: list[dict[str, Any]],
           series: list[tuple[str, str, Callable[[dict[str, Any]], Optional[float]]]], unit: str = "") -> str:
    """An inline SVG line chart of `minutes` (oldest first): one polyline per run of
    minutes that have a value, per series (label, colour, value of a minute). No
    script and no outside file, so the page works offline."""
    values = [[pick(m) for m in minutes] for _, _, pick in series]
    top = max([v for vs in values for v in vs if v is not None] + [0.0])
    scale = top if top > 0 else 1.0
    n = max(len(minutes) - 1, 1)
    inner_w, inner_h = _CHART_W - 2 * _CHART_PAD, _CHART_H - 2 * _CHART_PAD
    lines = []
    for (label, colour, _), vs in zip(series, values):
        run: list[str] = []
        runs: list[list[str]] = []
        for i, v in enumerate(vs):
            if v is None:
                if run:
                    runs.append(run)
                run = []
                continue
            x = _CHART_PAD + inner_w * i / n
            y = _CHART_PAD + inner_h * (1 - v / scale)
            run.append(f"{x:.1f},{y:.1f}")
        if run:
            runs.append(run)
        for r in runs:
            # A lone minute is drawn as a dot: a polyline of one point has no length.
            points, width = (r, 1.5) if len(r) > 1 else (r + r, 5)
            lines.append(f'<polyline class="series" data-series="{html.escape(label)}" fill="none" '
                         f'stroke="{colour}" stroke-width="{width}" stroke-linecap="round" points="{" ".join(points)}"/>')
    legend = " ".join(f'<span style="color:{colour}">&#9632; {html.escape(label)}</span>' for label, colour, _ in series)
    first = _when(minutes[0]["at"]) if minutes else ""
    grid = (f'<line x1="{_CHART_PAD}" y1="{_CHART_H - _CHART_PAD}" x2="{_CHART_W - _CHART_PAD}" '
            f'y2="{_CHART_H - _CHART_PAD}" stroke="#ccc"/>'
            f'<line x1="{_CHART_PAD}" y1="{_CHART_PAD}" x2="{_CHART_W - _CHART_PAD}" y2="{_CHART_PAD}" '
            'stroke="#eee"/>')
    svg = (f'<svg class="chart" data-chart="{name}" width="{_CHART_W}" height="{_CHART_H}" '
           f'viewBox="0 0 {_CHART_W} {_CHART_H}" role="img" aria-label="{html.escape(title)}">'
           f"<title>{html.escape(title)}</title>{grid}{''.join(lines)}</svg>")
    return (f'<figure class="chart"><figcaption><b>{html.escape(title)}</b> '
            f'<span class="quiet">(top {_number(top)}{unit})</span><br>{legend}</figcaption>{svg}'
            f'<div class="axis"><span>{first}</span><span>now</span></div></figure>')


def _charts(minutes: list[dict[str, Any]]) -> str:
    """Messages handled and failed, lateness and backlog over the last hour."""
    if not minutes:
        return ""

    def ms(key: str) -> Callable[[dict[str, Any]], Optional[float]]:
        return lambda m: None if m[key] is None else m[key] * 1000

    return '<div class="charts">' + "".join([
        _chart("throughput", "messages a minute", minutes,
               [("handled", "#1565c0", lambda m: m["handled"]), ("failed", "#c62828", lambda m: m["failed"])]),
        _chart("lateness", "started late", minutes,
               [("p50", "#2e7d32", ms("lateness_p50")), ("p99", "#ef6c00", ms("lateness_p99"))], " ms"),
        _chart("backlog", "backlog", minutes,
               [("scheduled", "#6a1b9a", lambda m: m["scheduled"]), ("ready", "#ef6c00", lambda m: m["ready"]),
                ("in flight", "#1565c0", lambda m: m["inflight"])]),
    ]) + "</div>"


def _found_section(q: DelayQueue, text: str) -> str:
    title = f"<h2>queue <code>{html.escape(q.name)}</code>: messages holding <code>{_text(text)}</code></h2>"
    try:
        found = q.find(text, ROWS)
    except DelayQueueError as e:
        return f'{title}<p class="bad">{_text(str(e))}</p>'
    return title + _table(
        ["id", "state", "due", "attempts", "last error", "payload"],
        [[f"<code>{_text(m['id'])}</code>", m["state"], _when(m["due_at"]), str(m["attempts"]),
          _error(m), _payload(m)] for m in found],
        frozenset({3}),
    )


def _button(token: str, queue: str, do: str, label: str, id: str = "", back: str = "") -> str:
    """A form that POSTs one action: the page's token proves it came from this page."""
    fields = {"token": token, "queue": queue, "do": do, "id": id, "back": back}
    hidden = "".join(f'<input type="hidden" name="{k}" value="{html.escape(v)}">' for k, v in fields.items())
    return (f'<form method="post" action="/action" class="act" data-do="{html.escape(do)}" '
            f'data-id="{html.escape(id)}">{hidden}<button>{label}</button></form>')


def _queue_section(q: DelayQueue, now: float, token: Optional[str] = None,
                   health: Optional[Reachability] = None, lists: bool = True) -> str:
    """A queue's state, charts and pools, and (with `lists`) the first rows of its lists."""
    title = f"<h2>queue <code>{html.escape(q.name)}</code></h2>"

    def read() -> tuple[Any, ...]:
        few = ROWS if lists else 0
        return (q.stats(), q.workers(), q.inflight(few) if few else [], q.waiting(few) if few else [],
                q.dead_letters(few) if few else [], q.repeats(), q.completed(few) if few else [],
                q.minutes(CHART_MINUTES))

    got, trouble = (health or Reachability()).read(_key(q), read)
    if got is None:
        return f"{title}{trouble}"
    stats, pools, running, waiting, dead, repeating, done, minutes = got
    next_due = stats["next_due_at"]
    lag = max(0.0, now - next_due) if next_due is not None and stats["ready"] > 0 else 0.0
    state = []
    if stats["paused_at"] is not None:
        state.append(f'<span class="bad">paused</span> since {_when(stats["paused_at"])}')
    if stats["rate_limit"] is not None:
        limit = stats["rate_limit"]
        state.append(f"rate limit {limit['max']} per {limit['per']:g} s")
    if stats["held"]:
        state.append(f"{stats['held']} scheduled held in their serial key's or group's line")
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
          _payload(m)] for m in running],
        frozenset({1}),
    )
    upcoming = _table(
        ["id", "due", "attempts", "last error", "payload"],
        [[_id(m), _when(m["due_at"]), str(m["attempts"]),
          _error(m), _payload(m)] for m in waiting],
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
          _payload(m)] for m in done],
        frozenset({3}),
    )
    letters = _table(
        ["id", "died", "attempts", "last error", "payload"] + (["act"] if token else []),
        [[f"<code>{_text(m['id'])}</code>", _when(m["dead_at"]), str(m["attempts"]),
          _error(m, "bad"), _payload(m)]
         + ([_button(token, q.name, "requeue", "requeue", m["id"]) + _button(token, q.name, "delete", "delete", m["id"])]
            if token else []) for m in dead],
        frozenset({2}),
    )
    if token:
        paused = stats["paused_at"] is not None
        # The queue's own page (no lists here) comes back to itself after an action.
        back = "" if lists else "queue"
        title += ('<p>' + _button(token, q.name, "resume" if paused else "pause", "resume" if paused else "pause",
                                  back=back)
                  + (_button(token, q.name, "requeue", f"requeue all {stats['dead']} dead letters", back=back)
                     if stats["dead"] else "") + "</p>")
    return (
        title
        + (f"<p>{' · '.join(state)}</p>" if state else "")
        + depth
        + f"<h3>the last hour</h3>{_charts(minutes)}"
        + f"<h3>worker pools ({len(pools)})</h3>{workers}"
        + (f"<h3>running (first {ROWS} by lease)</h3>{inflight}"
           + f"<h3>next due (first {ROWS})</h3>{upcoming}" if lists else "")
        + (f"<h3>repeating messages ({len(repeating)})</h3>{schedules}" if repeating else "")
        + (f"<h3>completed (latest {ROWS} of {stats['completed']} kept)</h3>{completed}" if done else "")
        + ((f"<h3>dead letters (latest {ROWS})</h3>" if token else
            f"<h3>dead letters (latest {ROWS}; <code>delayq --queue {html.escape(q.name)} requeue-dead</code>)</h3>")
           + letters if lists else "")
        + f"<h3>lifetime counters</h3>{counters}"
    )


class Reachability:
    """Which queues' Redis failed to answer, and since when. A page does not wait for a
    Redis that failed a moment ago: for `RECHECK` seconds it says so at once, then
    tries again (the queues of the dashboard connect with short timeouts too)."""

    RECHECK = 5.0

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.down: dict[str, tuple[float, float, str]] = {}  # key -> (since, tried at, error)

    def read(self, key: str, read: Callable[[], Any]) -> tuple[Any, Optional[str]]:
        """`read()`, or None and why not (HTML) when its Redis is unreachable."""
        now = self.clock()
        known = self.down.get(key)
        if known is not None and now - known[1] < self.RECHECK:
            return None, self._notice(*known, now)
        try:
            value = read()
        except RedisUnreachable as e:
            since = known[0] if known is not None else now
            self.down[key] = (since, now, str(e))
            return None, self._notice(since, now, str(e), now)
        except DelayQueueError as e:
            self.down.pop(key, None)
            return None, f'<p class="bad">Redis refused: {_text(str(e))}</p>'
        self.down.pop(key, None)
        return value, None

    def _notice(self, since: float, tried: float, error: str, now: float) -> str:
        again = max(0.0, tried + self.RECHECK - now)
        return (f'<p class="bad down">Redis unreachable since {_when(since)} (for {_span(now - since)}): '
                f'{_text(error)}</p><p class="quiet">tried last at {_when(tried)}; '
                f"the next page tries again{f' in {_span(again)}' if again > 0 else ''}</p>")


def _key(q: DelayQueue) -> str:
    return q.name


#: Registry entries the front page lists (a page at a time, the most recently seen
#: first; the rest are counted), and partitions it reads over them: a registry that
#: anyone with write access to `<prefix>:queues` can fill must not make the page slow
#: or large.
LISTED = 50
LISTED_PARTITIONS = 256
#: How many of the registry's entries, the most recently seen, a queue's page looks
#: through for its name (one bounded read), besides the handles it keeps.
FOUND_WITHIN = 1000
#: Handles on registered queues kept between pages. They share the connection of the
#: registry's source (`DelayQueue.sharing_connection`), so a handle costs Redis nothing.
KEPT_HANDLES = 256


class Registry:
    """The queues that pools and producers registered (`DelayQueue.registered_queues`
    on `source`), opened with `open(entry)` as far as this dashboard may open them.

    The registry is written by plain commands that any Redis user with write access to
    `<prefix>:queues` can send (an application's own user may have it), while the
    dashboard reads with the operator's credentials. So an entry names only what the
    dashboard may look at: a native entry's keys are under the prefix's hash tag of its
    name (the name cannot hold braces), whatever its partitions; a seed-layout entry
    names any two keys, so it is opened only when the operator named those keys
    (`seed_keys`: the `(zset_key, payload_key)` of the seed queues on the command line).

    Unless `open` says otherwise, each is opened on `source`'s connection (with its
    prefix and timeouts): a registry of any size costs Redis that one client. At most
    `KEPT_HANDLES` handles are kept between pages."""

    def __init__(self, source: DelayQueue, open: Optional[Callable[[Mapping[str, Any]], DelayQueue]] = None,
                 seed_keys: Sequence[tuple[str, str]] = ()) -> None:
        self.source = source
        self.open_entry = open or self._on_source_connection
        self.seed_keys = set(seed_keys)
        self.kept: OrderedDict[tuple[Any, ...], DelayQueue] = OrderedDict()
        self.lock = threading.Lock()

    def _on_source_connection(self, entry: Mapping[str, Any]) -> DelayQueue:
        return self.source.sharing_connection(entry["name"], layout=entry["layout"], zset_key=entry["zset_key"],
                                              payload_key=entry["payload_key"], partitions=entry["partitions"])

    def page(self, start: int = 0, limit: int = LISTED) -> tuple[list[Mapping[str, Any]], int]:
        """Entries `start..start + limit`, the most recently seen first, and how many
        the registry holds: one bounded read however many entries it holds."""
        entries, total = self.source.registered_queues_page(limit, start=start)
        return list(entries), total

    def refusal(self, entry: Mapping[str, Any]) -> Optional[str]:
        """Why `entry` is not opened (plain text), or None."""
        if entry["layout"] == "native":
            return None
        keys = (entry["zset_key"], entry["payload_key"])
        if keys in self.seed_keys:
            return None
        return (f"not opened: a {entry['layout']}-layout queue on keys {keys[0]!r} and {keys[1]!r}, outside the "
                "prefix; the registry does not vouch for them: name it with "
                f"--seed-queue {entry['name']} {keys[0]} {keys[1]}")

    def open(self, entry: Mapping[str, Any]) -> Union[DelayQueue, str]:
        """The queue of `entry`, or why it is not opened (plain text)."""
        why = self.refusal(entry)
        if why is not None:
            return why
        how = (entry["name"], entry["layout"], entry["zset_key"], entry["payload_key"], entry["partitions"])
        with self.lock:
            q = self.kept.get(how)
            if q is not None:
                self.kept.move_to_end(how)
                return q
        try:
            q = self.open_entry(entry)
        except (DelayQueueError, ValueError, TypeError) as e:
            return f"not opened: {e}"
        with self.lock:
            self.kept[how] = q
            while len(self.kept) > KEPT_HANDLES:
                self.kept.popitem(last=False)
        return q

    def find(self, name: str) -> Union[DelayQueue, str, None]:
        """The registered queue `name`, why it is not opened, or None when not registered:
        a handle kept since a page listed it, else among the `FOUND_WITHIN` entries seen
        most recently."""
        with self.lock:
            kept = next((q for q in reversed(self.kept.values()) if q.name == name), None)
        if kept is not None:
            return kept
        try:
            entries, _ = self.page(0, FOUND_WITHIN)
        except DelayQueueError:
            return None
        entry = next((e for e in entries if e["name"] == name), None)
        return None if entry is None else self.open(entry)


def _overview(queues: list[DelayQueue], health: Reachability, registry: Optional[Registry] = None,
              registry_start: int = 0) -> str:
    """One line per queue, each a link to its page: depth, pools, and the last hour. The
    named queues first, then the registry's `LISTED` entries from `registry_start`,
    reading at most `LISTED_PARTITIONS` partitions of them."""
    rows = []
    blank = ["", "", "", "", "", ""]

    def row(q: DelayQueue) -> list[str]:
        link = f'<a href="/queue?{html.escape(urllib.parse.urlencode({"name": q.name}))}"><code>{_text(q.name)}</code></a>'

        def read() -> tuple[dict[str, Any], int, list[dict[str, Any]]]:
            return dict(q.stats()), len(q.workers()), [dict(m) for m in q.minutes(CHART_MINUTES)]

        got, down = health.read(_key(q), read)
        if got is None:
            return [link, '<span class="bad">unreachable</span>', *blank]
        stats, pools, minutes = got
        state = '<span class="bad">paused</span>' if stats["paused_at"] is not None else "running"
        return [link, state, str(stats["scheduled"]), str(stats["ready"]), str(stats["inflight"]),
                str(stats["dead"]), str(pools), str(sum(m["handled"] for m in minutes))]

    for q in queues:
        rows.append(row(q))
    note = ""
    if registry is not None:
        named = {q.name for q in queues}
        try:
            listed, total = registry.page(registry_start)
            entries = [e for e in listed if e["name"] not in named]
        except DelayQueueError as e:
            entries, total = [], 0
            note = f'<p class="bad">the registry of queues could not be read: {_text(str(e))}</p>'
        budget = LISTED_PARTITIONS
        for entry in entries:
            name = f"<code>{_text(entry['name'])}</code>"
            # Checked before opening: making a queue of many partitions costs time too.
            opened = registry.refusal(entry) or (
                "" if not isinstance(entry["partitions"], int) or entry["partitions"] > budget
                else registry.open(entry))
            if isinstance(opened, str) and opened:
                rows.append([name, f'<span class="quiet unopened">{_text(opened, 400)}</span>', *blank])
            elif isinstance(opened, str):
                link = (f'<a href="/queue?{html.escape(urllib.parse.urlencode({"name": entry["name"]}))}">'
                        f"{name}</a>")
                rows.append([link, f'<span class="quiet">not read here: {_text(entry["partitions"])} partitions, '
                                   f"over what this page reads ({LISTED_PARTITIONS} in all); its page shows it</span>",
                             *blank])
            else:
                budget -= entry["partitions"]
                rows.append(row(opened))
        pages = []
        if registry_start > 0:
            pages.append(f'<a class="page" href="/?registry_start={max(0, registry_start - LISTED)}">'
                         f"&larr; seen more recently</a>")
        if registry_start + LISTED < total:
            pages.append(f'<a class="page" href="/?registry_start={registry_start + LISTED}">seen earlier &rarr;</a>')
        shown = f"entries {registry_start + 1} to {min(total, registry_start + LISTED)} of the registry"
        if total > LISTED or registry_start > 0:
            note += (f'<p class="quiet more">{max(0, total - LISTED)} more registered queues not shown here '
                     f"({shown}, the most recently seen first): {' · '.join(pages)}</p>")
    return "<h2>queues</h2>" + _table(
        ["queue", "state", "scheduled", "ready", "in flight", "dead", "pools", "handled in the last hour"], rows,
        frozenset({2, 3, 4, 5, 6, 7})) + note


def _page(title: str, body: str, refresh: float, again: str, at: float) -> str:
    reload = f'<meta http-equiv="refresh" content="{refresh:g}; url={html.escape(again)}">' if refresh > 0 else ""
    return (
        "<!doctype html><html><head><meta charset=\"utf-8\">"
        f"<title>{html.escape(title)}</title>{reload}"
        f"<style>{_STYLE}</style></head><body>"
        f"<h1><a href=\"/\">delayq</a></h1><p class=\"quiet\">read at {_when(at)}"
        + (f", again every {refresh:g} s" if refresh > 0 else "")
        + f"</p>{body}</body></html>"
    )


def render_html(queues: list[DelayQueue], refresh: float = 5.0, now: Optional[Callable[[], float]] = None,
                find: str = "", token: Optional[str] = None, done: str = "",
                registry: Optional[Registry] = None, health: Optional[Reachability] = None,
                registry_start: int = 0) -> str:
    """The page for `queues`. A queue whose Redis fails says so; the others still show.
    With `find`, the messages of each queue whose payload holds it (or whose id it is) come first.
    With `token`, the page has action buttons (see the module); `done` says what the last one did.
    `registry` adds a table of the queues, those it found too (its entries from
    `registry_start`), each a link to its page."""
    clock = now or time.time
    at = clock()
    health = health or Reachability(clock)
    search = (f'<form method="get"><input name="find" value="{html.escape(find)}" '
              'placeholder="an order number, an id, any text of a payload"> <button>find</button></form>')
    found = "".join(_found_section(q, find) for q in queues) if find else ""
    notice = f'<p class="done">{_text(done)}</p>' if done else ""
    overview = _overview(queues, health, registry, registry_start) if registry is not None else ""
    sections = notice + search + found + overview + "".join(_queue_section(q, at, token, health) for q in queues)
    # A reload must not repeat the notice of an action.
    kept = {**({"find": find} if find else {}), **({"registry_start": str(registry_start)} if registry_start else {})}
    again = "/?" + urllib.parse.urlencode(kept) if kept else "/"
    return _page(f"delayq: {', '.join(q.name for q in queues)}", sections, refresh, again, at)


#: Messages a page of a list shows, and how deep paging goes (the listings' limit).
PAGE_ROWS = 20
# The deepest a page may start (the core's MAX_PAGE_START).
MAX_PAGED = 100_000

_LISTS = ("waiting", "running", "dead", "completed")


def _paged(q: DelayQueue, which: str, page: int) -> tuple[list[dict[str, Any]], bool]:
    """The messages of `which` on `page` (0 first), and whether a next page exists."""
    start = min(page * PAGE_ROWS, MAX_PAGED)
    read: dict[str, Callable[..., Sequence[Mapping[str, Any]]]] = {
        "waiting": q.waiting, "running": q.inflight, "dead": q.dead_letters, "completed": q.completed}
    # One row more than shown tells whether a next page exists.
    rows = [dict(r) for r in read[which](PAGE_ROWS + 1, start=start)]
    return rows[:PAGE_ROWS], len(rows) > PAGE_ROWS and start + PAGE_ROWS <= MAX_PAGED


def render_queue(q: DelayQueue, refresh: float = 5.0, now: Optional[Callable[[], float]] = None,
                 find: str = "", token: Optional[str] = None, done: str = "", pages: Optional[dict[str, int]] = None,
                 health: Optional[Reachability] = None) -> str:
    """The page of one queue: its charts and pools as on the overview, and its waiting,
    running, dead and completed messages a page at a time (`pages`: list -> page, 0
    first), or those holding `find`."""
    clock = now or time.time
    at = clock()
    health = health or Reachability(clock)
    pages = pages or {}
    base = {"name": q.name, **{f"{k}_page": str(v) for k, v in pages.items() if v}}
    search = ('<form method="get" action="/queue">'
              f'<input type="hidden" name="name" value="{html.escape(q.name)}">'
              f'<input name="find" value="{html.escape(find)}" placeholder="search this queue"> '
              "<button>find</button></form>")
    notice = f'<p class="done">{_text(done)}</p>' if done else ""
    body = notice + search + (_found_section(q, find) if find else "")
    body += _queue_section(q, at, token, health, lists=False)
    if _key(q) not in health.down:
        for which in _LISTS:
            page = max(0, pages.get(which, 0))
            try:
                rows, more = _paged(q, which, page)
            except DelayQueueError as e:
                body += f'<p class="bad">{_text(str(e))}</p>'
                break
            body += f'<h3 id="{which}">{which} (page {page + 1})</h3>' + _message_table(q, which, rows, at, token)

            def link(to: int, label: str, which: str = which) -> str:
                query = urllib.parse.urlencode({**base, f"{which}_page": str(to)})
                return f'<a class="page" data-list="{which}" href="/queue?{html.escape(query)}#{which}">{label}</a>'

            nav = ([link(page - 1, "&larr; newer" if which in ("dead", "completed") else "&larr; earlier")]
                   if page > 0 else []) + (
                [link(page + 1, "older &rarr;" if which in ("dead", "completed") else "later &rarr;")] if more else [])
            if nav:
                body += "<p>" + " · ".join(nav) + "</p>"
    again = "/queue?" + urllib.parse.urlencode({**base, **({"find": find} if find else {})})
    return _page(f"delayq: {q.name}", body, refresh, again, at)


def _message_table(q: DelayQueue, which: str, rows: list[dict[str, Any]], now: float, token: Optional[str]) -> str:
    if which == "running":
        return _table(
            ["id", "attempt", "lease until", "payload"],
            [[_id(m), str(m["attempts"]),
              _when(m["lease_until"]) + (' <span class="bad">expired</span>'
                                         if m["lease_until"] is not None and m["lease_until"] < now else ""),
              _payload(m)] for m in rows],
            frozenset({1}))
    if which == "waiting":
        return _table(
            ["id", "due", "attempts", "last error", "payload"],
            [[_id(m), _when(m["due_at"]), str(m["attempts"]), _error(m), _payload(m)] for m in rows],
            frozenset({2}))
    if which == "completed":
        return _table(
            ["id", "completed", "due", "attempts", "payload"],
            [[f"<code>{_text(m['id'])}</code>", _when(m["completed_at"]), _when(m["due_at"]), str(m["attempts"]),
              _payload(m)] for m in rows],
            frozenset({3}))
    return _table(
        ["id", "died", "attempts", "last error", "payload"] + (["act"] if token else []),
        [[f"<code>{_text(m['id'])}</code>", _when(m["dead_at"]), str(m["attempts"]), _error(m, "bad"),
          _payload(m)]
         + ([_button(token, q.name, "requeue", "requeue", m["id"], back="queue")
             + _button(token, q.name, "delete", "delete", m["id"], back="queue")] if token else [])
         for m in rows],
        frozenset({2}))


def _actions(lookup: Callable[[str], Optional[DelayQueue]], token: str) -> Callable[[dict[str, str]], str]:
    """What a button does; returns the page to show next, which says what was done."""

    def act(form: dict[str, str]) -> str:
        if not hmac.compare_digest(form.get("token", "").encode(), token.encode()):
            raise Refused("this form is not from this dashboard (reload the page)")
        q = lookup(form.get("queue", ""))
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
        if form.get("back") == "queue":
            return "/queue?" + urllib.parse.urlencode({"name": q.name, "done": done})
        return "/?" + urllib.parse.urlencode({"done": done})

    return act


def make_server(queues: list[DelayQueue], host: str, port: int, refresh: float = 5.0,
                auth: Optional[str] = None, actions: bool = False,
                registry: Optional[Registry] = None, insecure_listen: bool = False,
                allowed_hosts: Sequence[str] = ()) -> PageServer:
    """A server of the page for `queues` at `/` on `host:port`; call `serve_forever()`.
    `auth` ("user:password") asks every request for HTTP Basic credentials; `actions`
    (only with `auth`) adds the buttons and `POST /action`. `registry` (see `Registry`)
    adds the queues found in the registry: `/` lists them after those of `queues`, and
    `/queue?name=NAME` shows any of them that it may open. Without `auth` it serves only
    a loopback address unless `insecure_listen`; `allowed_hosts` are the names besides
    localhost that a request's Host header may give (see `PageServer`)."""
    if actions and auth is None:
        raise ValueError("dashboard actions need auth: without it any page the browser opens could use them")
    token = secrets.token_urlsafe(24) if actions else None
    health = Reachability()

    def find(name: str) -> Union[DelayQueue, str, None]:
        named = next((q for q in queues if q.name == name), None)
        if named is not None or registry is None:
            return named
        return registry.find(name)

    def lookup(name: str) -> Optional[DelayQueue]:
        q = find(name)
        return q if isinstance(q, DelayQueue) else None

    def page(query: dict[str, str]) -> str:
        raw = query.get("registry_start", "0")
        if not re.fullmatch(r"[0-9]{1,9}", raw):
            raise BadRequest(f"registry_start must be an entry of the registry, from 0, got {raw!r}")
        return render_html(queues, refresh, find=query.get("find", ""), token=token, done=query.get("done", ""),
                           registry=registry, health=health, registry_start=int(raw))

    def queue_page(query: dict[str, str]) -> str:
        q = find(query.get("name", ""))
        if not isinstance(q, DelayQueue):
            raise NotFound(f"no queue {query.get('name', '')!r} on this dashboard"
                           + (f" (registered, {q})" if q is not None else ""))
        pages: dict[str, int] = {}
        for which in _LISTS:
            raw = query.get(f"{which}_page", "0")
            # ASCII digits only: str.isdigit() takes "²", which int() refuses.
            if not re.fullmatch(r"[0-9]{1,6}", raw) or int(raw) > MAX_PAGED // PAGE_ROWS:
                raise BadRequest(f"{which}_page must be a page number from 0 to {MAX_PAGED // PAGE_ROWS}, "
                                 f"got {raw!r}")
            pages[which] = int(raw)
        return render_queue(q, refresh, find=query.get("find", ""), token=token, done=query.get("done", ""),
                            pages=pages, health=health)

    html_type = "text/html; charset=utf-8"
    return PageServer((host, port), {"/": (html_type, page), "/queue": (html_type, queue_page)},
                      actions={"/action": _actions(lookup, token)} if token else None, auth=auth, insecure_listen=insecure_listen,
                      allowed_hosts=allowed_hosts)
