"""delayq's operator tool: look into a queue and act on its dead letters without
writing code. The same queues from PHP, Python or Rust.

    delayq --queue orders stats
    delayq --queue orders workers
    delayq --queue orders watch        # a line a second: depth, messages a second, lag
    delayq --queue orders waiting --limit 20
    delayq --queue orders inflight
    delayq --queue orders completed --limit 20   # with keep_completed
    delayq --queue orders find 10086   # the messages whose payload holds it (or whose id it is), in any state
    delayq --queue orders find 10086 --field order_id   # those whose order_id is 10086 exactly
    delayq --queue orders dead --limit 20
    delayq --queue orders requeue-dead --all
    delayq --queue orders reschedule close-order-10086 --delay 0   # run it now
    delayq --queue orders pause        # every worker pool stops taking messages
    delayq --queue orders repeat nightly-report --cron "0 2 * * *" --tz Asia/Shanghai '{}'
    delayq --queue orders resume
    delayq --queue orders rate-limit 100 --per 60   # at most 100 a minute, over every pool
    delayq --queue orders group-limit merchant-42 --concurrency 3   # at most 3 of its messages at once
    delayq --queue orders restart-workers   # after a deploy: running pools stop, to be started anew
    delayq --queue orders acl --user app    # the ACL SETUSER line for it; replace PASSWORD
    delayq serve-metrics orders payments --listen :9808   # for Prometheus to scrape
    delayq dashboard orders payments            # a web page for people: http://127.0.0.1:9809/
    delayq --url redis://10.0.0.5:6379 --queue orders --json get close-order-10086
    delayq --queue orders worker myapp.tasks:close_order --processes 4   # run a handler

Exit status: 0 done, 1 nothing matched (an unknown id, a message that is not in the
state the command needs), 2 bad usage or input (a payload JSON cannot hold, a bad
option), 3 Redis could not be reached or refused (for `worker`: its processes kept
dying at their start), 141 the output was closed before it was all written (as for a
program that SIGPIPE ends).
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Mapping
from typing import Any, Callable, Optional, Sequence, TextIO, Union

from . import DelayQueue, DelayQueueError, InvalidArgumentError, PayloadError, __version__, _two_arguments
from ._delayq import QUEUE_OPTIONS, WORKER_OPTIONS, _report_done, _report_hook_failed, _Scaler, _stop_with_supervisor

# Defaults of the worker's flags, from the core's one options table.
_DEFAULT: dict[str, Any] = {o["name"]: o["default"] for o in WORKER_OPTIONS}
# The queue's, from its table: defaults and the layouts there are.
_QUEUE: dict[str, dict[str, Any]] = {o["name"]: o for o in QUEUE_OPTIONS}
_LAYOUTS: tuple[str, ...] = tuple(_QUEUE["layout"]["choices"])

NOT_FOUND = 1
FAILED = 3
# As a program killed by SIGPIPE, which Python turns into BrokenPipeError.
CLOSED = 128 + signal.SIGPIPE


def _label(name: str, layout: str, zset_key: Optional[str], payload_key: Optional[str]) -> str:
    """How messages name a queue: a seed-layout queue by the recipe's keys, which is
    what its users know it by (its name is not in them)."""
    if layout == "seed":
        return f"seed queue {zset_key or 'delay_queue:zset'} + {payload_key or 'delay_queue:payload'}"
    return f"queue {name}"


def _when(seconds: Optional[float]) -> str:
    if seconds is None:
        return "-"
    t = datetime.datetime.fromtimestamp(seconds, tz=datetime.timezone.utc)
    return t.strftime("%Y-%m-%d %H:%M:%S.") + f"{t.microsecond // 1000:03d} UTC"


# Longest payload or error a listing shows of each message (`get` shows them whole).
CLIP = 160


def _clip(text: str, width: int = CLIP) -> str:
    # Blanks fold into one space; a text far longer than shown is not folded whole.
    cut = len(text) > 4 * width
    text = " ".join(text[: 4 * width].split())
    return text if len(text) <= width and not cut else text[: width - 1] + "…"


def _payload(value: Any, width: Optional[int] = None) -> str:
    """A payload as JSON: whole, or (with `width`) its first characters, without
    serialising the rest of a huge one."""
    if width is None:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    from .dashboard import _clipped

    shown, cut = _clipped(value, width, compact=True, strings=True)
    return _clip(shown + ("…" if cut else ""), width)


def _listed_payload(record: Mapping[str, Any]) -> str:
    """A listed message's payload as `_payload` clips it, or the note that the listing
    left it out (a stored message past the listings' bound: `get` shows it whole)."""
    omitted = record.get("payload_omitted_bytes")
    if omitted is not None:
        return f"<payload omitted: {omitted} bytes>"
    return _payload(record["payload"], CLIP)


# What a terminal would act on rather than show: C0 controls but tab (line feed
# too: one stored text must not forge lines), DEL, C1 controls (0x9b is CSI on some
# terminals) and the bidirectional overrides that reorder what is shown.
_UNPRINTABLE = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)] if c != 0x09}
_UNPRINTABLE.update({c: f"\\u{c:04x}" for c in [0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]})
# In JSON, C0 controls are escaped already; the others are escaped as JSON does (same value).
_UNPRINTABLE_JSON = {c: f"\\u{c:04x}" for c in _UNPRINTABLE if c >= 0x7F}


def _printable(line: str) -> str:
    """`line` with every control character written as an escape (ESC as \\x1b)."""
    return line.translate(_UNPRINTABLE)


class _Output:
    def __init__(self, as_json: bool, out: TextIO) -> None:
        self.as_json = as_json
        self.out = out

    def emit(self, value: Any, human: Callable[[], Sequence[str]]) -> None:
        if self.as_json:
            text = json.dumps(value, ensure_ascii=False, indent=2).translate(_UNPRINTABLE_JSON)
            self.out.write(text + "\n")
        else:
            for line in human():
                self.out.write(_printable(line) + "\n")


DEPTH = ("scheduled", "ready", "inflight", "dead", "completed")
NOT_COUNTERS = {*DEPTH, "held", "next_due_at", "paused_at", "rate_limit", "partitions"}


def _rate(limit: Optional[Mapping[str, Any]]) -> str:
    if limit is None:
        return "none"
    return f"at most {limit['max']} messages per {limit['per']:g} s"


def _stats(q: DelayQueue, out: _Output, args: argparse.Namespace) -> int:
    s: dict[str, Any] = dict(q.stats())

    def human() -> list[str]:
        depth = ", ".join(f"{s[k]} {k}" for k in DEPTH)
        if s["held"]:
            depth += f" ({s['held']} of the scheduled held in their serial key's or group's line)"
        counters = "  ".join(f"{k} {v}" for k, v in s.items() if k not in NOT_COUNTERS)
        return [
            f"{args.label}: {depth}",
            f"next due: {_when(s['next_due_at'])}",
            "consumption: " + ("running" if s["paused_at"] is None else f"paused since {_when(s['paused_at'])}"),
            f"rate limit: {_rate(s['rate_limit'])}",
            f"partitions: {s['partitions']}",
            f"since created: {counters}",
        ]

    out.emit(s, human)
    return 0


def _get(q: DelayQueue, out: _Output, args: argparse.Namespace) -> int:
    info = q.get(args.id)
    if info is None:
        sys.stderr.write(f"delayq: no message {args.id!r} in {args.label}\n")
        return NOT_FOUND

    def human() -> list[str]:
        trace = info.get("error_trace")
        # Last, whole and indented: the frames are what someone asking for one message reads.
        trace_lines = ["error trace:"] + ["    " + line for line in trace.splitlines()] if trace else []
        return [
            f"id:           {info['id']}",
            f"state:        {info['state']}" + (" (cancelled)" if info["cancelled"] else ""),
            f"due at:       {_when(info['due_at'])}",
            f"attempts:     {info['attempts']}"
            + (f" of {info['max_attempts']}" if info["max_attempts"] is not None else ""),
            f"last error:   {info['last_error'] or '-'}",
            f"dead since:   {_when(info['dead_at'])}",
            f"lease until:  {_when(info['lease_until'])}",
            f"completed at: {_when(info['completed_at'])}",
            f"created at:   {_when(info['created_at'])}",
            f"serial key:   {info['serial_key'] or '-'}",
            f"group:        {info['group'] or '-'}",
        ] + ([f"held:         {info['held']}"] if info["held"] else []) + [
            f"payload:      {_payload(info['payload'])}",
        ] + trace_lines

    out.emit(info, human)
    return 0


def _field_value(text: str) -> Union[str, int, float, bool, None]:
    """A value to compare a payload field with: TEXT as JSON when it is a JSON scalar,
    else the string itself."""
    try:
        value = json.loads(text, parse_constant=_not_json)
    except ValueError:
        return text
    return value if isinstance(value, (str, int, float, bool)) or value is None else text


def _listing(q: DelayQueue, out: _Output, args: argparse.Namespace) -> int:
    if args.command == "find" and args.field is not None:
        messages = q.find_field(args.field, _field_value(args.text), args.limit)
    elif args.command == "find":
        messages = q.find(args.text, args.limit)
    else:
        messages = {"inflight": q.inflight, "waiting": q.waiting, "completed": q.completed}[args.command](args.limit)

    def human() -> list[str]:
        if not messages:
            if args.command == "find" and args.field is not None:
                return [f"{args.label}: no message has {args.field} = {args.text}"]
            if args.command == "find":
                return [f"{args.label}: no message holds {args.text!r}"]
            kind = {"inflight": "running", "waiting": "waiting", "completed": "kept completed"}[args.command]
            return [f"{args.label}: no {kind} messages"]
        now = time.time()
        lines = []
        for m in messages:
            if m["state"] == "completed":
                head = (f"{m['id']}  completed {_when(m['completed_at'])}  due {_when(m['due_at'])}"
                        f"  in {m['attempts']} attempt{'' if m['attempts'] == 1 else 's'}")
            elif m["state"] == "dead":
                head = f"{m['id']}  dead since {_when(m['dead_at'])}  after {m['attempts']} attempts"
            elif m["state"] == "inflight":
                left = (m["lease_until"] if m["lease_until"] is not None else now) - now
                lease = f"lease ends in {left:.1f} s" if left >= 0 else f"LEASE EXPIRED {-left:.1f} s ago"
                head = f"{m['id']}  running  attempt {m['attempts']}  {lease}"
            else:
                head = f"{m['id']}  {m['state']:9}  due {_when(m['due_at'])}"
                if m["attempts"]:
                    head += f"  after {m['attempts']} failed attempt{'' if m['attempts'] == 1 else 's'}"
            if m.get("serial_key"):
                head += f"  serial key {m['serial_key']}"
            if m.get("group"):
                head += f"  group {m['group']}"
            lines.append(head)
            if m["last_error"]:
                lines.append(f"    error:   {_clip(m['last_error'])}")
            lines.append(f"    payload: {_listed_payload(m)}")
        return lines

    out.emit(messages, human)
    # As grep: a search that found nothing says so in its status.
    return NOT_FOUND if args.command == "find" and not messages else 0


def _dead(q: DelayQueue, out: _Output, args: argparse.Namespace) -> int:
    letters = q.dead_letters(args.limit)

    def human() -> list[str]:
        if not letters:
            return [f"{args.label}: no dead letters"]
        lines = []
        for d in letters:
            lines.append(f"{d['id']}  died {_when(d['dead_at'])}  after {d['attempts']} attempts")
            lines.append(f"    error:   {_clip(d['last_error'])}")
            lines.append(f"    payload: {_listed_payload(d)}")
        return lines

    out.emit(letters, human)
    return 0


def _on_dead(verb: str, act: Callable[[DelayQueue, Optional[str]], int],
             act_matching: Callable[[DelayQueue, str], int]) -> Callable[..., int]:
    def run(q: DelayQueue, out: _Output, args: argparse.Namespace) -> int:
        n = act_matching(q, args.error) if args.error is not None else act(q, None if args.all else args.id)
        out.emit({verb: n}, lambda: [f"{verb} {n} dead letter{'' if n == 1 else 's'}"])
        if args.id is not None and n == 0:
            sys.stderr.write(f"delayq: {args.id!r} is not a dead letter of {args.label}\n")
            return NOT_FOUND
        return 0

    return run


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def _recent(w: Mapping[str, Any]) -> str:
    text = ""
    if w["lateness_max"] is not None:
        text += (f"  started {w['started_recently']} lately, late by {w['lateness_avg'] * 1000:.1f} ms on average, "
                 f"{w['lateness_max'] * 1000:.0f} ms at most")
    if w["handler_avg"] is not None:
        text += f"  handler {w['handler_avg'] * 1000:.1f} ms"
    return text


# The counters `watch` shows as rates, in this order.
WATCHED = ("pushed", "delivered", "acked", "retried", "died")


def _watch(q: DelayQueue, out: _Output, args: argparse.Namespace) -> int:
    if args.every <= 0:
        raise _BadUsage(f"--every must be more than 0 seconds, got {args.every:g}")
    before: dict[str, Any] = dict(q.stats())
    s: dict[str, Any]
    since = time.monotonic()
    shown = 0
    try:
        while args.count is None or shown < args.count:
            time.sleep(max(0.0, since + args.every - time.monotonic()))
            now, s = time.monotonic(), dict(q.stats())
            elapsed = now - since
            rates = {k: round((s[k] - before[k]) / elapsed, 1) for k in WATCHED}
            lag = max(0.0, time.time() - s["next_due_at"]) if s["next_due_at"] is not None else 0.0
            sample = {"at": round(time.time(), 3), **{k: s[k] for k in DEPTH}, "per_second": rates,
                      "lag": round(lag, 3)}
            if out.as_json:
                # One object a line (JSON Lines): a stream, not one document.
                out.out.write(json.dumps(sample) + "\n")
            else:
                clock = datetime.datetime.now(datetime.timezone.utc).strftime("%H:%M:%S")
                depth = "  ".join(f"{k} {s[k]}" for k in DEPTH)
                per_s = "  ".join(f"{k} {v:g}" for k, v in rates.items())
                out.out.write(f"{clock}  {depth}  | per s: {per_s}  | lag {lag:.1f} s\n")
            out.out.flush()
            before, since, shown = s, now, shown + 1
    except KeyboardInterrupt:
        pass
    return 0


def _workers(q: DelayQueue, out: _Output, args: argparse.Namespace) -> int:
    pools = q.workers()

    def human() -> list[str]:
        now = time.time()
        lines = [f"{args.label}: {len(pools)} pool{'' if len(pools) == 1 else 's'} alive"]
        for w in pools:
            lines.append(
                f"{w['id']}  up {_age(now - w['started_at'])}  seen {_age(now - w['last_seen'])} ago  "
                f"{w['handlers']} handlers  handled {w['handled']} (acked {w['acked']}, failed {w['failed']})  "
                f"holding {w['holding']}" + _recent(w)
            )
        return lines

    out.emit(pools, human)
    return 0


def _cancel(q: DelayQueue, out: _Output, args: argparse.Namespace) -> int:
    cancelled = q.cancel(args.id, kill=args.kill)
    out.emit({"cancelled": cancelled}, lambda: [f"cancelled {args.id}" if cancelled else f"{args.id} not cancelled"])
    if not cancelled:
        sys.stderr.write(f"delayq: {args.id!r} is not cancelled in {args.label}: it is unknown, completed or "
                         "dead (or runs in the seed layout, which cannot mark it)\n")
        return NOT_FOUND
    return 0


def _exit_status(cut: SystemExit) -> int:
    return cut.code if isinstance(cut.code, int) else 1


class _HookFailed(Exception):
    """on_start or on_stop raised in a process of a supervised pool."""

    def __init__(self, hook: str, what: str) -> None:
        super().__init__(f"{hook} failed: {what}")
        self.hook, self.what = hook, what


class _BadUsage(Exception):
    """Bad command-line input that argparse cannot see: exit status 2."""


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON (Python's json module reads it, JSON does not)")


def _json_payload(text: str) -> Any:
    try:
        return json.loads(text, parse_constant=_not_json)
    except ValueError as e:
        raise _BadUsage(f"the payload is not JSON: {e}") from e


def _push(q: DelayQueue, out: _Output, args: argparse.Namespace) -> int:
    payload = _json_payload(args.payload)
    msg_id = q.push(payload, args.delay, id=args.id, max_attempts=args.max_attempts,
                    partition_key=args.partition_key, replace=args.replace, expire_after=args.expire_after,
                    serial_key=args.serial_key, group=args.group)
    out.emit({"id": msg_id}, lambda: [msg_id])
    return 0


def _reschedule(q: DelayQueue, out: _Output, args: argparse.Namespace) -> int:
    moved = q.reschedule(args.id, args.delay)
    out.emit({"rescheduled": moved},
             lambda: [f"{args.id} due in {args.delay:g} s" if moved else f"{args.id} not rescheduled"])
    if not moved:
        sys.stderr.write(f"delayq: {args.id!r} is not waiting in {args.label} (unknown, running or dead)\n")
        return NOT_FOUND
    return 0


def _repeats(q: DelayQueue, out: _Output, args: argparse.Namespace) -> int:
    repeats = q.repeats()

    def human() -> list[str]:
        if not repeats:
            return [f"{args.label}: no repeating messages"]
        lines = []
        for r in repeats:
            every = (f"every {r['schedule']:g} s" if r["tz"] is None
                     else f"cron '{r['schedule']}' in {r['tz']}")
            limits = "".join([
                f"  max {r['max_attempts']} attempts" if r["max_attempts"] is not None else "",
                f"  expires {r['expire_after']:g} s after due" if r["expire_after"] is not None else "",
            ])
            lines.append(f"{r['name']}  {every}{limits}  next {_when(r['next_due_at'])}")
            lines.append(f"    payload: {_payload(r['payload'], CLIP)}")
        return lines

    out.emit(repeats, human)
    return 0


def _repeat(q: DelayQueue, out: _Output, args: argparse.Namespace) -> int:
    payload = _json_payload(args.payload)
    schedule: Union[str, float] = float(args.every) if args.every is not None else args.cron
    due = q.repeat(args.name, schedule, payload, tz=args.tz, max_attempts=args.max_attempts,
                   expire_after=args.expire_after)
    out.emit({"name": args.name, "next_due_at": due}, lambda: [f"{args.name}: next at {_when(due)}"])
    return 0


def _unrepeat(q: DelayQueue, out: _Output, args: argparse.Namespace) -> int:
    removed = q.unrepeat(args.name)
    out.emit({"removed": removed}, lambda: [f"{args.name} stopped" if removed else f"no repeat {args.name}"])
    if not removed:
        sys.stderr.write(f"delayq: {args.label} has no repeating message {args.name!r}\n")
        return NOT_FOUND
    return 0


def _purge(q: DelayQueue, out: _Output, args: argparse.Namespace) -> int:
    if not args.yes:
        sys.stderr.write(f"delayq: purge deletes every message of {args.label}; add --yes to do it\n")
        return 2
    n = q.purge()
    out.emit({"purged": n}, lambda: [f"purged {n} messages from {args.label}"])
    return 0


def _move_waiting(q: DelayQueue, out: _Output, args: argparse.Namespace) -> int:
    # The target shares the source's Redis and prefix unless --to-url / --to-prefix say
    # otherwise; it is a native queue of one partition unless told.
    to = DelayQueue(args.to_url or args.url, args.to, prefix=args.to_prefix or args.prefix,
                    partitions=args.to_partitions or _QUEUE["partitions"]["default"], layout=args.to_layout,
                    zset_key=args.to_zset_key, payload_key=args.to_payload_key)
    n = q.move_waiting(to)
    to_label = _label(to.name, args.to_layout, args.to_zset_key, args.to_payload_key)
    out.emit({"moved": n}, lambda: [f"moved {n} waiting messages from {args.label} to {to_label}"])
    return 0


def _pause(q: DelayQueue, out: _Output, args: argparse.Namespace) -> int:
    changed = q.pause()
    out.emit({"paused": True, "changed": changed},
             lambda: [f"{args.label} paused" if changed else f"{args.label} was paused already"])
    return 0


def _resume(q: DelayQueue, out: _Output, args: argparse.Namespace) -> int:
    changed = q.resume()
    out.emit({"paused": False, "changed": changed},
             lambda: [f"{args.label} resumed" if changed else f"{args.label} was not paused"])
    return 0


def _group_limit(q: DelayQueue, out: _Output, args: argparse.Namespace) -> int:
    group: Optional[str] = None if args.default else args.group
    whose = "groups without limits of their own" if group is None else f"group {group}"
    if args.clear:
        if args.concurrency is not None or args.max is not None or args.per is not None:
            raise _BadUsage("give limits or --clear, not both")
        had = q.set_group_limit(group)
        out.emit({"group": group, "concurrency": None, "rate_limit": None, "had_limits": had},
                 lambda: [f"{args.label}: {whose}: limits cleared" if had else f"{args.label}: {whose} had no limits"])
        return 0
    if args.concurrency is None and args.max is None and args.per is None:
        raise _BadUsage("give --concurrency, --max (with --per) or --clear; a group's limits are not read back")
    had = q.set_group_limit(group, concurrency=args.concurrency, max=args.max, per=args.per)
    rate = None if args.max is None else {"max": args.max, "per": 1.0 if args.per is None else args.per}
    shown = ([] if args.concurrency is None else [f"at most {args.concurrency} running at once"]) + (
        [] if rate is None else [_rate(rate)])
    out.emit({"group": group, "concurrency": args.concurrency, "rate_limit": rate, "had_limits": had},
             lambda: [f"{args.label}: {whose}: " + ", ".join(shown) + (" (replacing its limits)" if had else "")])
    return 0


def _rate_limit(q: DelayQueue, out: _Output, args: argparse.Namespace) -> int:
    if args.clear:
        if args.max is not None:
            raise _BadUsage("give a MAX or --clear, not both")
        changed = q.clear_rate_limit()
        out.emit({"rate_limit": None, "changed": changed},
                 lambda: [f"{args.label}: rate limit lifted" if changed else f"{args.label} had no rate limit"])
        return 0
    if args.max is not None:
        q.set_rate_limit(args.max, 1.0 if args.per is None else args.per)
    elif args.per is not None:
        raise _BadUsage("--per goes with a MAX, e.g. rate-limit 100 --per 60")
    limit = q.rate_limit()
    out.emit({"rate_limit": limit}, lambda: [f"{args.label}: rate limit: {_rate(limit)}"])
    return 0


def _restart_workers(q: DelayQueue, out: _Output, args: argparse.Namespace) -> int:
    n = q.restart_workers()
    out.emit({"pools": n}, lambda: [
        f"{args.label}: asked {n} worker pool{'' if n == 1 else 's'} to stop after their running handlers "
        "(their process manager starts them anew)"])
    return 0


def _acl(q: DelayQueue, out: _Output, args: argparse.Namespace) -> int:
    rule = q.acl_rule(args.user, preloaded_scripts=args.preloaded_scripts, functions=args.functions)
    out.emit({"rule": rule}, lambda: [rule])
    return 0


def _load_scripts(q: DelayQueue, out: _Output, args: argparse.Namespace) -> int:
    n = q.load_scripts()
    out.emit({"loaded": n}, lambda: [f"{n} scripts of delayq loaded"])
    return 0


def _install_functions(q: DelayQueue, out: _Output, args: argparse.Namespace) -> int:
    name = q.install_functions()
    out.emit({"library": name}, lambda: [
        f"library {name} installed: users made with `acl --functions` call it from their next connection; "
        "an older build's library (FUNCTION LIST LIBRARYNAME delayq_) can go (FUNCTION DELETE) once none "
        "of its processes runs"])
    return 0


def _metrics_queues(q: DelayQueue, args: argparse.Namespace) -> list[DelayQueue]:
    return [args.make_queue(name) for name in args.queues] if args.queues else [q]


def _metrics(q: DelayQueue, out: _Output, args: argparse.Namespace) -> int:
    from .metrics import render

    out.out.write(render(_metrics_queues(q, args)))
    return 0


def _serve(args: argparse.Namespace, what: str, path: str, make: Callable[[str, int], Any]) -> int:
    """Serve until SIGINT on --listen; `make(host, port)` builds the server."""
    from .metrics import Exposed

    host, _, port = args.listen.rpartition(":")
    if not port.isascii() or not port.isdigit() or int(port) > 65535:
        sys.stderr.write(f"delayq: --listen wants HOST:PORT, got {args.listen!r}\n")
        return 2
    try:
        server = make(host.strip("[]") or "0.0.0.0", int(port))
    except Exposed as e:
        raise _BadUsage(f"{what} will not listen on {e.host} without credentials: it is not a loopback address, "
                        "so anyone who reaches it could read it; give --auth USER:PASSWORD (or "
                        "DELAYQ_DASHBOARD_AUTH), or --insecure-listen to serve them all the same") from None
    except OSError as e:
        sys.stderr.write(f"delayq: cannot listen on {args.listen}: {e.strerror}\n")
        return FAILED
    unguarded = " to anyone who reaches it, without credentials (--insecure-listen)" if args.insecure_listen else ""
    sys.stderr.write(f"delayq: serving {what} on http://{args.listen}{path}{unguarded}\n")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def _auth(args: argparse.Namespace) -> Optional[str]:
    """--auth, else $DELAYQ_DASHBOARD_AUTH (which keeps the password out of `ps`)."""
    auth: Optional[str] = args.auth or os.environ.get("DELAYQ_DASHBOARD_AUTH") or None
    if auth is not None:
        user, colon, password = auth.partition(":")
        if not colon or not user or not password:
            raise _BadUsage("--auth (or DELAYQ_DASHBOARD_AUTH) wants USER:PASSWORD, neither of them empty")
        if args.insecure_listen:
            raise _BadUsage("--insecure-listen and --auth (or DELAYQ_DASHBOARD_AUTH) contradict each other: give one")
    return auth


def _allowed_hosts(args: argparse.Namespace) -> list[str]:
    names = [name.strip() for names in args.allowed_hosts for name in names.split(",")]
    if any(not name or "/" in name or " " in name for name in names):
        raise _BadUsage(f"--allowed-hosts wants host names separated by commas, got {','.join(args.allowed_hosts)!r}")
    return names


def _serve_metrics(q: DelayQueue, out: _Output, args: argparse.Namespace) -> int:
    from .metrics import make_server

    queues = _metrics_queues(q, args)
    auth = _auth(args)
    hosts = _allowed_hosts(args)
    return _serve(args, "metrics", "/metrics",
                  lambda host, port: make_server(queues, host, port, auth, args.insecure_listen, hosts))


def _dashboard(q: DelayQueue, out: _Output, args: argparse.Namespace) -> int:
    from . import dashboard

    if not args.refresh >= 0:
        raise _BadUsage(f"--refresh must be 0 (never) or more seconds, got {args.refresh}")
    auth = _auth(args)
    hosts = _allowed_hosts(args)
    if args.allow_actions and auth is None:
        raise _BadUsage("--allow-actions needs --auth USER:PASSWORD (or DELAYQ_DASHBOARD_AUTH): without it any "
                        "web page the browser opens could requeue and delete")
    # A page must not wait for a Redis that is down: one short try per read. Every
    # queue of the page shares the first one's connection (and so do those of the
    # registry), so the dashboard is one client of Redis however many it shows.
    first: list[DelayQueue] = []

    def make_queue(name: str, partitions: int, layout: str, zset_key: Optional[str],
                   payload_key: Optional[str]) -> DelayQueue:
        if first:
            return first[0].sharing_connection(name, partitions=partitions, layout=layout, zset_key=zset_key,
                                               payload_key=payload_key)
        first.append(DelayQueue(args.url, name, prefix=args.prefix, partitions=partitions, layout=layout,
                                zset_key=zset_key, payload_key=payload_key, connect_timeout=0.5, read_timeout=2.0,
                                retry_timeout=0.0))
        return first[0]

    queues = [make_queue(name, args.partitions, args.layout, args.zset_key, args.payload_key)
              for name in (args.queues or ([] if args.seed_queue else [args.queue]))]
    queues += [make_queue(name, 1, "seed", zset_key, payload_key) for name, zset_key, payload_key in args.seed_queue]
    names = [q.name for q in queues]
    if len(set(names)) < len(names):
        raise _BadUsage(f"a queue is named twice: {', '.join(sorted({n for n in names if names.count(n) > 1}))}")
    # The seed keys the operator named: only registry entries on these keys are opened.
    seed_keys = [(zset_key, payload_key) for _, zset_key, payload_key in args.seed_queue]
    if args.layout == "seed" and (args.queues or not args.seed_queue):
        seed_keys.append((args.zset_key or "delay_queue:zset", args.payload_key or "delay_queue:payload"))
    registry = dashboard.Registry(queues[0], seed_keys=seed_keys)

    return _serve(args, "the dashboard", "/",
                  lambda host, port: dashboard.make_server(queues, host, port, args.refresh, auth,
                                                           args.allow_actions, registry=registry,
                                                           insecure_listen=args.insecure_listen, allowed_hosts=hosts))


def _worker(q: DelayQueue, out: _Output, args: argparse.Namespace) -> int:
    from . import _command as supervisor
    from ._delayq import _Slot, _Supervisor

    if args.processes < 1:
        raise _BadUsage(f"--processes must be at least 1, got {args.processes}")
    if args.min_processes is not None and not 1 <= args.min_processes <= args.processes:
        raise _BadUsage(f"--min-processes must be between 1 and --processes ({args.processes}), "
                        f"got {args.min_processes}")
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(name)s[%(process)d] %(levelname)s: %(message)s")
    if out.as_json and args.report_fd is None:
        # What handlers print must not corrupt the JSON summary: from here on stdout (and
        # that of the worker processes, which inherit it) is stderr, with the logs.
        sys.stdout.flush()
        out = _Output(True, os.fdopen(os.dup(1), "w"))
        os.dup2(2, 1)
    try:
        handler = supervisor.load_handler(args.handler)
        on_dead = supervisor.load_handler(args.on_dead) if args.on_dead else None
        on_failure = supervisor.load_handler(args.on_failure) if args.on_failure else None
        on_start = supervisor.load_handler(args.on_start) if args.on_start else None
        on_stop = supervisor.load_handler(args.on_stop) if args.on_stop else None
        no_retry = [supervisor.load_exception(name) for name in args.no_retry]
    except supervisor.HandlerNotFound as e:
        raise _BadUsage(str(e)) from e
    try:
        # The handler's signature, checked once here as `Worker.run` checks it: a
        # handler that needs more than (payload, message) is refused before any
        # process starts, not by each process that the supervisor starts again.
        _two_arguments(handler)
    except TypeError as e:
        raise _BadUsage(f"{args.handler}: {e}") from e
    lower = [args.make_queue(name) for name in args.lower_queue]
    # Made in the supervisor too: bad options fail here, once, before any process starts.
    worker = supervisor.worker_from_args(q, lower, args, on_dead, no_retry, on_failure)
    scaler = _Scaler(args.min_processes or args.processes, args.processes, args.scale_cooldown)
    if args.report_fd is not None:
        # A process of a supervised pool: the supervisor prints the pool's summary.
        _stop_with_supervisor(os.getppid())

        def stop(signum: int, frame: object) -> None:
            # A signal, as the run's own handlers say it: the supervisor stops the
            # whole pool on a handler's stop(), and only this process on a signal (the
            # scaler's, say, while on_start runs).
            worker._worker.stop("signal")

        # While the pool runs, its own handlers take the signals. Before, a stop makes
        # the run return at once; after, when the run restores these, the stop that a
        # supervisor sends as another process ran out of work must not kill this one
        # by default before it wrote its report (its counts would be lost).
        for s in (signal.SIGTERM, signal.SIGINT):
            signal.signal(s, stop)
        status = 0

        def hook(name: str, call: Optional[Callable[[], Any]]) -> Optional[Callable[[], Any]]:
            if call is None:
                return None

            def run() -> Any:
                try:
                    return call()
                except Exception as e:
                    raise _HookFailed(name, repr(e)) from e

            return run

        try:
            slot = None if args.slot_file is None else _Slot(args.slot_file, args.slot_index)
            summary: dict[str, Any] = dict(
                supervisor.run_one(worker, handler, slot, hook("on_start", on_start), hook("on_stop", on_stop)))
        except _HookFailed as e:
            # The pool cannot go on without it (PHP's does the same): a fatal report stops
            # it, instead of a process that dies and is started again for ever.
            logging.getLogger("delayq").error("%s", e, exc_info=e.__cause__)
            with os.fdopen(args.report_fd, "w") as report:
                report.write(_report_hook_failed(e.hook, e.what))
            return FAILED
        except (KeyboardInterrupt, SystemExit) as cut:
            # A second stop signal, or a handler's sys.exit(): what the process did until
            # then still counts.
            status = 128 + signal.SIGINT if isinstance(cut, KeyboardInterrupt) else _exit_status(cut)
            if worker._last_summary is None:
                return status
            by_signal = status in (128 + signal.SIGINT, 128 + signal.SIGTERM)
            summary = {**worker._last_summary, "stopped_by": "signal" if by_signal else "exit"}
        with os.fdopen(args.report_fd, "w") as report:
            report.write(_report_done(summary))
        return status
    # A thread cannot be stopped, nor a coroutine that blocks its event loop cancelled; a
    # process can: a handler with a timeout runs supervised even alone, as PHP's does.
    if not _Supervisor.needed(args.processes, args.timeout):
        try:
            summary, ran_as_asked = dict(supervisor.run_one(worker, handler, None, on_start, on_stop)), True
        except KeyboardInterrupt:  # a second Ctrl+C: stopped at once, logged
            return 128 + signal.SIGINT
    else:
        command = [sys.executable, "-m", "delayq", *args.argv, "--processes", "1"]
        pool = _Supervisor(command, args.processes, args.timeout, scaler, [q, *lower])

        def passed_on(signum: int, frame: object) -> None:
            pool.signal(signum)

        previous = {s: signal.signal(s, passed_on) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            summary, ran_as_asked = pool.run()
        finally:
            for s, before in previous.items():
                signal.signal(s, before)

    def human() -> list[str]:
        line = (f"pool stopped ({summary['stopped_by']}): {summary['handled']} handled, {summary['acked']} acked, "
                f"{summary['retried']} retried, {summary['dead']} dead")
        if "processes" in summary:
            line += (f"; {summary['processes']} processes, {summary['restarts']} restarts, "
                     f"{summary['killed_hung']} killed hung")
            if summary["scaled_up"] or summary["scaled_down"]:
                line += f", {summary['scaled_up']} added and {summary['scaled_down']} let go"
        return [line]

    out.emit(summary, human)
    out.out.flush()
    return 0 if ran_as_asked else FAILED


def _ping(q: DelayQueue, out: _Output, args: argparse.Namespace) -> int:
    q.ping()
    out.emit({"ok": True}, lambda: ["ok"])
    return 0


def _count(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number, 0 or more: {text!r}")
    return n


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="delayq",
        description="Look into a delayq queue, pause, resume or rate-limit it, and act on its dead letters.",
        epilog="Exit status: 0 done, 1 nothing matched, 2 bad usage, 3 Redis unreachable or refused.",
    )
    p.add_argument("--version", action="version", version=f"delayq {__version__}")
    p.add_argument("--url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379"),
                   help="Redis URL: redis://, rediss://, redis+cluster://h1,h2, redis+sentinel://h1,h2/master "
                        "(default: $REDIS_URL, else redis://127.0.0.1:6379)")
    p.add_argument("--queue", "-q", default=os.environ.get("DELAYQ_QUEUE", "default"),
                   help="queue name (default: $DELAYQ_QUEUE, else 'default')")
    p.add_argument("--prefix", default=_QUEUE["prefix"]["default"], help="key prefix (default: %(default)s)")
    p.add_argument("--partitions", type=int, default=_QUEUE["partitions"]["default"],
                   help="as the queue was made with (default: %(default)s)")
    p.add_argument("--layout", choices=_LAYOUTS, default=_QUEUE["layout"]["default"])
    p.add_argument("--zset-key", help="with --layout seed: the recipe's ZSET (default: delay_queue:zset)")
    p.add_argument("--payload-key", help="with --layout seed: the recipe's HASH (default: delay_queue:payload)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sub.add_parser("stats", help="depth by state and lifetime counters").set_defaults(run=_stats)
    c = sub.add_parser("watch", help="a line every --every seconds: depth, messages a second, lag (Ctrl-C ends it)")
    c.add_argument("--every", type=float, default=1.0, help="seconds between lines (default: 1)")
    c.add_argument("--count", type=_count, help="stop after this many lines (default: never)")
    c.set_defaults(run=_watch)
    sub.add_parser("workers", help="the consumer pools alive, from every host and language").set_defaults(
        run=_workers)
    g = sub.add_parser("get", help="everything known about one message")
    g.add_argument("id")
    g.set_defaults(run=_get)
    for name, what in (("waiting", "the next messages due, earliest first (scheduled and ready)"),
                       ("inflight", "the messages running now, earliest lease deadline first"),
                       ("completed", "completed messages kept by keep_completed, latest first")):
        w = sub.add_parser(name, help=what)
        w.add_argument("--limit", type=_count, default=20, help="at most this many, up to 1000 (default: 20)")
        w.set_defaults(run=_listing)
    f = sub.add_parser("find", help="the messages whose payload holds TEXT (or whose id it is), in any state (scans the queue)")
    f.add_argument("text")
    f.add_argument("--field", help="only payloads whose FIELD equals TEXT exactly (TEXT read as JSON if it is: "
                                   "10086 is a number, '\"10086\"' a string), not TEXT anywhere")
    f.add_argument("--limit", type=_count, default=20, help="at most this many, up to 1000 (default: 20)")
    f.set_defaults(run=_listing)
    d = sub.add_parser("dead", help="dead letters, newest first")
    d.add_argument("--limit", type=_count, default=20, help="at most this many (default: 20)")
    d.set_defaults(run=_dead)
    for name, verb, act, act_matching, what in (
        ("requeue-dead", "requeued", DelayQueue.requeue_dead, DelayQueue.requeue_dead_with_error,
         "run dead letters again, due now"),
        ("delete-dead", "deleted", DelayQueue.delete_dead, DelayQueue.delete_dead_with_error,
         "delete dead letters for good"),
    ):
        c = sub.add_parser(name, help=what)
        which = c.add_mutually_exclusive_group(required=True)
        which.add_argument("id", nargs="?", help="one dead letter")
        which.add_argument("--all", action="store_true", help="every dead letter of the queue")
        which.add_argument("--error", metavar="TEXT",
                           help="the dead letters whose last error contains TEXT (after the fix of one failure)")
        c.set_defaults(run=_on_dead(verb, act, act_matching))
    c = sub.add_parser("push", help="schedule a message (a JSON payload), e.g. to try a worker out")
    c.add_argument("payload", help='JSON, e.g. \'{"order_id": 10086}\'')
    c.add_argument("--delay", type=float, default=0.0, help="seconds from now (default: 0)")
    c.add_argument("--id", help="an id of your own: pushing it again creates nothing")
    c.add_argument("--max-attempts", type=int, help="deliveries before the dead-letter set")
    c.add_argument("--partition-key", help="on a partitioned queue: keeps related messages together")
    c.add_argument("--serial-key", help="messages sharing it never run at the same time, and start in due order")
    c.add_argument("--group", help="its group (a tenant, a merchant): it counts against the group's limits "
                   "(see group-limit)")
    c.add_argument("--replace", action="store_true",
                   help="with --id: replace a waiting (or dead) message of that id instead of keeping it")
    c.add_argument("--expire-after", type=float, metavar="SECONDS",
                   help="not to be started later than this after its due time (else: dead letter, unrun)")
    c.set_defaults(run=_push)
    c = sub.add_parser("reschedule", help="move a waiting message to a new due time (--delay 0: run it now)")
    c.add_argument("id")
    c.add_argument("--delay", type=float, required=True, help="seconds from now")
    c.set_defaults(run=_reschedule)
    sub.add_parser("repeats", help="the repeating messages and their next occurrence").set_defaults(run=_repeats)
    c = sub.add_parser("repeat", help="define or change a repeating message")
    c.add_argument("name")
    when = c.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", help='a cron pattern, e.g. "0 2 * * *" (6 fields: seconds first)')
    when.add_argument("--every", type=float, help="an interval in seconds (at least 1)")
    c.add_argument("--tz", help="the cron pattern's IANA time zone (default: UTC)")
    c.add_argument("--max-attempts", type=int, help="deliveries of each occurrence before the dead-letter set")
    c.add_argument("--expire-after", type=float, metavar="SECONDS",
                   help="an occurrence not started this long after its due time goes to the dead-letter set unrun")
    c.add_argument("payload", help="JSON")
    c.set_defaults(run=_repeat)
    c = sub.add_parser("unrepeat", help="stop a repeating message (its waiting occurrence is cancelled)")
    c.add_argument("name")
    c.set_defaults(run=_unrepeat)
    c = sub.add_parser("cancel", help="cancel a message: one that waits is deleted, one that runs is marked "
                       "cancelled (its handler sees it; it is deleted when the handler ends)")
    c.add_argument("id")
    c.add_argument("--kill", action="store_true",
                   help="a supervised worker process (--processes) that runs it is killed, as at its --timeout")
    c.set_defaults(run=_cancel)
    c = sub.add_parser("purge", help="delete every message of the queue")
    c.add_argument("--yes", action="store_true", help="really")
    c.set_defaults(run=_purge)
    c = sub.add_parser("move-waiting", help="move every waiting message to another queue (e.g. out of the seed layout)")
    c.add_argument("--to", required=True, metavar="QUEUE", help="the target queue's name")
    c.add_argument("--to-url", help="its Redis (default: --url)")
    c.add_argument("--to-prefix", help="its key prefix (default: --prefix)")
    c.add_argument("--to-partitions", type=int, help=f"its partitions (default: {_QUEUE['partitions']['default']})")
    c.add_argument("--to-layout", choices=_LAYOUTS, default=_QUEUE["layout"]["default"],
                   help="its layout (default: %(default)s)")
    c.add_argument("--to-zset-key", help="with --to-layout seed: its ZSET")
    c.add_argument("--to-payload-key", help="with --to-layout seed: its HASH")
    c.set_defaults(run=_move_waiting)
    sub.add_parser("pause", help="stop every worker pool taking messages (pushes go on)").set_defaults(
        run=_pause)
    sub.add_parser("resume", help="undo pause").set_defaults(run=_resume)
    sub.add_parser("restart-workers", help="every worker pool running now stops gracefully (after a deploy)").set_defaults(
        run=_restart_workers)
    c = sub.add_parser("rate-limit", help="show, set (MAX [--per SECONDS]) or --clear the queue's rate limit")
    c.add_argument("max", nargs="?", type=int, help="messages handed to workers in any window of --per seconds")
    c.add_argument("--per", type=float, help="the window in seconds (default: 1)")
    c.add_argument("--clear", action="store_true", help="lift the limit; held-back workers start at once")
    c.set_defaults(run=_rate_limit)
    c = sub.add_parser("group-limit", help="set (--concurrency N, --max M [--per SECONDS]) or --clear a group's "
                       "limits, or with --default those of every group without limits of its own")
    whose = c.add_mutually_exclusive_group(required=True)
    whose.add_argument("group", nargs="?", help="the group, as pushed (--group)")
    whose.add_argument("--default", action="store_true", help="the default of every group without limits of its own")
    c.add_argument("--concurrency", type=int, help="at most this many of its messages run at once")
    c.add_argument("--max", type=int, help="at most this many of its messages start in any window of --per seconds")
    c.add_argument("--per", type=float, help="that window in seconds (default: 1)")
    c.add_argument("--clear", action="store_true", help="lift its limits (a group's own: the default applies again)")
    c.set_defaults(run=_group_limit)
    c = sub.add_parser("acl", help="the ACL SETUSER line granting --user exactly this queue (replace PASSWORD "
                                   "with the user's password before running it)")
    c.add_argument("--user", required=True, help="the Redis ACL user name")
    rights = c.add_mutually_exclusive_group()
    rights.add_argument("--preloaded-scripts", action="store_true",
                        help="without SCRIPT LOAD (with it the user may run any Lua): an admin runs "
                             "`delayq load-scripts` after each restart, failover or SCRIPT FLUSH")
    rights.add_argument("--functions", action="store_true",
                        help="Redis 7.0+: FCALL of delayq's functions instead of EVALSHA and SCRIPT LOAD (the user "
                             "runs no Lua of its own): an admin runs `delayq install-functions` once per build")
    c.set_defaults(run=_acl)
    c = sub.add_parser("load-scripts", help="load delayq's scripts on the server, as an admin, for users "
                                            "made with `acl --preloaded-scripts`")
    c.set_defaults(run=_load_scripts)
    c = sub.add_parser("install-functions", help="install this build's library of functions (Redis 7.0+), as an "
                                                 "admin, for users made with `acl --functions`")
    c.set_defaults(run=_install_functions)
    m = sub.add_parser("metrics", help="Prometheus text format, once (cron, node_exporter's textfile collector)")
    m.add_argument("queues", nargs="*", metavar="QUEUE", help="queues to report (default: --queue)")
    m.set_defaults(run=_metrics)
    m = sub.add_parser("serve-metrics", help="an HTTP endpoint for Prometheus to scrape: GET /metrics")
    m.add_argument("queues", nargs="*", metavar="QUEUE", help="queues to report (default: --queue)")
    m.add_argument("--listen", default="127.0.0.1:9808",
                   help="HOST:PORT (default: 127.0.0.1:9808; :9808 for all, with --auth or --insecure-listen)")
    _guard_arguments(m)
    m.set_defaults(run=_serve_metrics)
    m = sub.add_parser("dashboard", help="a web page of the queues for people: GET / (read-only unless "
                                         "--allow-actions)")
    m.add_argument("queues", nargs="*", metavar="QUEUE",
                   help="queues shown in full on the first page (default: --queue); the queues that pools or "
                        "producers registered under --prefix are listed, with a page of its own (a seed-layout "
                        "one only on keys named by --seed-queue)")
    m.add_argument("--listen", default="127.0.0.1:9809",
                   help="HOST:PORT (default: 127.0.0.1:9809; the page shows payloads: keep it private)")
    m.add_argument("--refresh", type=float, default=5.0, help="seconds between reloads of the page (0: never)")
    m.add_argument("--seed-queue", nargs=3, action="append", default=[], metavar=("NAME", "ZSET_KEY", "PAYLOAD_KEY"),
                   help="a seed-layout queue on these keys, shown in full with the named queues (repeatable); a "
                        "registered seed-layout queue is opened only on keys named so (or by --layout seed)")
    _guard_arguments(m)
    m.add_argument("--allow-actions", action="store_true",
                   help="buttons to requeue and delete dead letters and to pause and resume queues (needs --auth)")
    m.set_defaults(run=_dashboard)
    sub.add_parser("ping", help="check that Redis answers").set_defaults(run=_ping)
    w = sub.add_parser("worker", help="run a handler function on the queue's messages, in one process or several",
                       description="Consume --queue with HANDLER(payload, message) until SIGTERM or SIGINT "
                                   "(running handlers finish; a second signal stops at once and gives every "
                                   "held message back): returning acknowledges a message, raising retries it "
                                   "with backoff. Logs go to stderr; the run's summary to stdout at the end.")
    w.add_argument("handler", metavar="HANDLER",
                   help="module:function, imported with the current directory first on sys.path; "
                        "a coroutine function runs on an asyncio loop, --concurrency at a time")
    w.add_argument("--processes", type=int, default=_DEFAULT["processes"],
                   help="worker processes under one supervisor that replaces those that die, kills those whose "
                        "handler runs past --timeout and sums their counts (default: 1, supervised only with "
                        "--timeout)")
    w.add_argument("--min-processes", type=int, metavar="N",
                   help="balance the pool between N and --processes: one more process while messages wait, "
                        "an idle one let go while none wait (default: always --processes)")
    w.add_argument("--scale-cooldown", type=float, default=_DEFAULT["scale_cooldown"], metavar="SECONDS",
                   help="at most one change of the pool per this many seconds with --min-processes (default: %(default)s)")
    w.add_argument("--threads", type=int, default=_DEFAULT["threads"], help="Redis I/O threads per process (default: %(default)s)")
    w.add_argument("--concurrency", type=int, default=_DEFAULT["concurrency"], help="async handlers at once per process (default: %(default)s)")
    w.add_argument("--batch", type=int, default=_DEFAULT["batch"], help="messages claimed per Redis call (default: %(default)s)")
    w.add_argument("--prefetch", type=int, default=_DEFAULT["prefetch"], help="deliveries held ahead (default: 0, sized by itself)")
    w.add_argument("--lease", type=float, default=_DEFAULT["lease"],
                   help="seconds before a dead process's message is delivered again (default: %(default)s)")
    w.add_argument("--max-attempts", type=int, default=_DEFAULT["max_attempts"], help="deliveries before the dead-letter set (default: %(default)s)")
    w.add_argument("--keep-completed", type=int, default=0, metavar="N",
                   help="keep the latest N acknowledged messages for `get` and `completed` to show (default: 0)")
    w.add_argument("--keep-completed-for", type=float, default=86400.0, metavar="SECONDS",
                   help="and for at most this long (default: 86400)")
    w.add_argument("--backoff-base", type=float, default=_DEFAULT["backoff_base"], help="first retry delay in seconds (default: %(default)s)")
    w.add_argument("--backoff-max", type=float, default=_DEFAULT["backoff_max"], help="longest retry delay in seconds (default: %(default)s)")
    w.add_argument("--timeout", type=float,
                   help="seconds a handler may run: past it a plain function's process is killed and replaced "
                        "(its message fails at once), a coroutine is cancelled (its "
                        "delivery fails at once); a process whose event loop a coroutine blocks is killed "
                        "2 s later")
    w.add_argument("--idle-check", type=float, default=_DEFAULT["idle_check"], help="seconds between an idle pool's looks (default: %(default)s)")
    w.add_argument("--stop-when-empty", action="store_true", help="return once nothing is due and nothing runs")
    w.add_argument("--max-trace-bytes", type=int, default=_DEFAULT["max_trace_bytes"], metavar="N",
                   help="keep up to N bytes of a failure's traceback with the message (0: none)")
    w.add_argument("--max-payload-bytes", type=int, default=_DEFAULT["max_payload_bytes"], metavar="N",
                   help="dead-letter a message whose payload is larger than N bytes, unread")
    w.add_argument("--no-retry", action="append", default=[], metavar="MODULE:CLASS",
                   help="an exception of this class sends its message to the dead-letter set at once, without "
                        "retries (repeatable; builtins:ValueError for a built-in one)")
    w.add_argument("--max-jobs", type=int, metavar="N",
                   help="a process ends after N messages (with --processes above 1: a fresh one takes its place)")
    w.add_argument("--max-time", type=float, metavar="SECONDS", help="a process ends after that long (as --max-jobs)")
    w.add_argument("--max-memory-mb", type=int, metavar="MB",
                   help="a process ends once it holds that much resident memory (as --max-jobs)")
    w.add_argument("--lower-queue", action="append", default=[], metavar="QUEUE",
                   help="also consume QUEUE, only when the queues before it have nothing due (repeatable)")
    w.add_argument("--on-start", metavar="MODULE:FUNCTION",
                   help="called with no arguments in each worker process before it consumes: open its database "
                        "connections there, not at import")
    w.add_argument("--on-stop", metavar="MODULE:FUNCTION",
                   help="called in each worker process after its run ended and every acknowledgement is written")
    w.add_argument("--on-dead", metavar="MODULE:FUNCTION",
                   help="called as FUNCTION(payload, message, error) after a failure sent a message to the "
                        "dead-letter set: an alert (what it raises is logged)")
    w.add_argument("--on-failure", metavar="MODULE:FUNCTION",
                   help="called as FUNCTION(payload, message, exception) after each exception a handler raised: "
                        "a report to an error tracker (what it raises is logged)")
    w.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"),
                   help="what reaches stderr (default: warning)")
    # Set by the supervisor for its worker processes.
    w.add_argument("--report-fd", type=int, help=argparse.SUPPRESS)
    w.add_argument("--slot-file", help=argparse.SUPPRESS)
    w.add_argument("--slot-index", type=int, default=0, help=argparse.SUPPRESS)
    w.set_defaults(run=_worker)
    return p


def _guard_arguments(m: argparse.ArgumentParser) -> None:
    """Who may reach serve-metrics and the dashboard: the same options for both."""
    m.add_argument("--auth", metavar="USER:PASSWORD",
                   help="ask for these HTTP Basic credentials (default: $DELAYQ_DASHBOARD_AUTH, else none)")
    m.add_argument("--insecure-listen", action="store_true",
                   help="serve without credentials on an address that is not loopback (refused otherwise): "
                        "anyone who reaches it reads it")
    m.add_argument("--allowed-hosts", metavar="NAME[,NAME...]", action="append", default=[],
                   help="host names a request may give besides IP addresses, localhost and the --listen host "
                        "(other names are refused, against DNS rebinding); for a DNS name or a proxy's Host")


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    args.argv = argv

    def make_queue(name: str) -> DelayQueue:
        # Retention is applied as workers acknowledge: only `worker` has the options.
        return DelayQueue(args.url, name, prefix=args.prefix, partitions=args.partitions, layout=args.layout,
                          zset_key=args.zset_key, payload_key=args.payload_key,
                          keep_completed=getattr(args, "keep_completed", 0),
                          keep_completed_for=getattr(args, "keep_completed_for", 86400.0))

    args.make_queue = make_queue
    args.label = _label(args.queue, args.layout, args.zset_key, args.payload_key)
    try:
        q = make_queue(args.queue)
        code: int = args.run(q, _Output(args.json, sys.stdout), args)
        # Here, where a closed pipe is caught, not at exit.
        sys.stdout.flush()
        return code
    except (InvalidArgumentError, PayloadError, _BadUsage) as e:
        sys.stderr.write(f"delayq: {e}\n")
        return 2
    except DelayQueueError as e:
        sys.stderr.write(f"delayq: {e}\n")
        return FAILED
    except BrokenPipeError:
        # The reader went away (`delayq stats | head -1`): no traceback, and nothing
        # more to write; the flush at exit must not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return CLOSED


if __name__ == "__main__":
    sys.exit(main())
