"""Issue 54's target 3 priced lever by lever: Redis bytes per waiting message
(`used_memory` after `MEMORY PURGE`, over the same server's when empty) for the
recipe's producer (HSET + ZADD, PHP `uniqid('msg_', true)` ids), for delayq as it
stores today (the real `delayq` module's `push` and `push_many`), and for hand-written
layouts that write the same two keys with redis-py (ZADD scheduled + HSET messages, no
delayq code), each taking one more thing away, so that each lever gets its own price:

  a  the envelope without "id" (the hash field holds it)
  b  also without "v" (the stored format's version kept once, in the queue's :control)
  c  also without "created_ms" (a UUIDv7 id carries its creation time to the ms)
  d  the stamp "at":[0,S] as "at":S, or dropped (the schedule's score has S while the
     message waits)
  e  ids of 22 characters (base64url of the 16-byte UUIDv7) and of the 16 bytes raw,
     for the 36-character text
  f  the envelopes bucketed into small hashes that Redis keeps as listpacks
     (`{dq:b}:m:<crc32(id) mod B>`, B chosen for about 90 fields a hash, within the
     issue's 128, and for about 400, within Redis 7.0's default hash-max-listpack-entries
     of 512), with the server's default hash-max-listpack-value (64) and with it raised
     where the envelopes are longer
  g  the lowest combination, and the lowest that keeps ids as 36-character text

Also delayq today with the messages in flight (pushed due, then claimed by delayq's own
claim.lua, as composed by the crate: `cargo run --example scripts`, in claims of 1000)
and dead (a real `delayq.Worker`, max_attempts=1, whose handler raises), each with its
bytes split by key (`MEMORY USAGE`); and the main rows again with a 1 KB payload.
Every row is the median of --rounds rounds, a fresh private Redis each
(bench/run.py's `Redis`, pinned to CPU 0), all on the same redis-server in one run.

    CARGO_TARGET_DIR=... taskset -c 1 python3 bench/memory_layouts.py [--n=100000] [--rounds=3] [--label=memory-layouts]
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import re
import statistics
import sys
import time
import uuid
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import redis as redis_py

import delayq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import run  # noqa: E402
from push_server_time import KB_PAYLOAD, PAYLOAD, fill_recipe  # noqa: E402
from script_cost import composed  # noqa: E402

QUEUE = "b"
TAG = "{dq:" + QUEUE + "}"
SPAN = 4096  # include/base.lua's SEQ_SPAN: a score is due_ms * SPAN + the place in the ms
# Mean fields a bucket: the issue's 128 is zset-max-listpack-entries; Redis 7.0's
# hash-max-listpack-entries is 512 (the rows "~400 fields a bucket" use that room).
BUCKET_FILL = 90
CHUNK = 1000
RECIPE = "recipe: HSET + ZADD, uniqid ids (27 chars)"


def uuid7() -> bytes:
    """16 bytes of a UUIDv7 as delayq makes them (core/src/fork.rs): ms, version,
    random bits (the counter within the ms costs no bytes, so it is left random)."""
    ms = int(time.time() * 1000)
    bits = (ms << 80) | (0x7 << 76) | (int.from_bytes(os.urandom(10), "big") & ((1 << 76) - 1))
    bits = (bits & ~(0b11 << 62)) | (0b10 << 62)
    return bits.to_bytes(16, "big")


ID_FORMS: dict[str, Callable[[bytes], bytes]] = {
    "text36": lambda b: str(uuid.UUID(bytes=b)).encode(),
    "b64_22": lambda b: base64.urlsafe_b64encode(b).rstrip(b"="),
    "raw16": lambda b: b,
}


@dataclass(frozen=True)
class Layout:
    """A hand-written layout: what its envelope holds and how its ids and hashes are."""

    id_in_env: bool = True
    v: bool = True
    created: bool = True
    at: str = "pair"  # "pair" {"at":[0,S]}, "score" {"at":S}, "none"
    ids: str = "text36"
    buckets: bool = False
    bare: bool = False  # no envelope: the payload's JSON alone (the seed layout's form)
    fill: int = 0  # mean fields a bucket, 0 for BUCKET_FILL
    config: tuple[str, ...] = field(default=())

    def envelope(self, mid: bytes, score: int, created_ms: int, payload: str) -> bytes:
        if self.bare:
            return payload.encode()
        parts = []
        if self.at == "pair":
            parts.append(f'"at":[0,{score}]')
        elif self.at == "score":
            parts.append(f'"at":{score}')
        if self.v:
            parts.append('"v":1')
        if self.id_in_env:
            # Only text ids go in an envelope (the rows that shorten ids drop "id").
            parts.append(f'"id":"{mid.decode()}"')
        if self.created:
            parts.append(f'"created_ms":{created_ms}')
        parts.append(f'"payload":{payload}')
        return ("{" + ",".join(parts) + "}").encode()


TODAY = Layout()
A = Layout(id_in_env=False)
B = Layout(id_in_env=False, v=False)
C = Layout(id_in_env=False, v=False, created=False)
D_SCORE = Layout(id_in_env=False, v=False, created=False, at="score")
D_NONE = Layout(id_in_env=False, v=False, created=False, at="none")
E22 = Layout(id_in_env=False, v=False, created=False, at="score", ids="b64_22")
E16 = Layout(id_in_env=False, v=False, created=False, at="score", ids="raw16")
E16_NONE = Layout(id_in_env=False, v=False, created=False, at="none", ids="raw16")
E22_NONE = Layout(id_in_env=False, v=False, created=False, at="none", ids="b64_22")
BARE_16 = Layout(bare=True, ids="raw16")
F_SCORE = Layout(id_in_env=False, v=False, created=False, at="score", buckets=True)
F_SCORE_128 = Layout(id_in_env=False, v=False, created=False, at="score", buckets=True,
                     config=("--hash-max-listpack-value", "128"))
F_NONE = Layout(id_in_env=False, v=False, created=False, at="none", buckets=True)
G_LOW = Layout(id_in_env=False, v=False, created=False, at="none", ids="raw16", buckets=True)
G_LOW_SCORE = Layout(id_in_env=False, v=False, created=False, at="score", ids="raw16", buckets=True)
G_BARE = Layout(bare=True, ids="raw16", buckets=True)
G_TEXT_BARE = Layout(bare=True, buckets=True)
G_22 = Layout(id_in_env=False, v=False, created=False, at="none", ids="b64_22", buckets=True)
G_22_BARE = Layout(bare=True, ids="b64_22", buckets=True)
F_NONE_400 = Layout(id_in_env=False, v=False, created=False, at="none", buckets=True, fill=400)
G_LOW_400 = Layout(id_in_env=False, v=False, created=False, at="none", ids="raw16", buckets=True, fill=400)
G_22_400 = Layout(id_in_env=False, v=False, created=False, at="none", ids="b64_22", buckets=True, fill=400)
NO_BUCKET_1K = Layout(id_in_env=False, v=False, created=False, at="none", ids="raw16")
F_NONE_1K = Layout(id_in_env=False, v=False, created=False, at="none", ids="raw16", buckets=True,
                   config=("--hash-max-listpack-value", "1100"))


@dataclass
class Measured:
    per_msg: float
    by_key: dict[str, float]  # role -> bytes a message (MEMORY USAGE, summed over its keys)
    note: str = ""


def role(key: str) -> str:
    """`{dq:b}:m:17` -> "m:*": bucketed hashes summed as one role."""
    name = key.split("}:", 1)[1] if "}:" in key else key
    return "m:*" if name.startswith("m:") else name


def measure(n: int, fill: Callable[[redis_py.Redis, run.Redis], str], config: tuple[str, ...] = ()) -> Measured:
    """A fresh Redis, `fill` run on it; bytes a message over the empty server's."""
    server = run.Redis(*config)
    try:
        r = redis_py.Redis(port=server.port)
        r.memory_purge()
        empty = int(r.info("memory")["used_memory"])
        note = fill(r, server)
        r.memory_purge()
        used = int(r.info("memory")["used_memory"])
        by_key: dict[str, float] = {}
        for key in r.scan_iter(count=1000):
            size = r.memory_usage(key, samples=0) or 0
            k = role(key.decode(errors="replace"))
            by_key[k] = by_key.get(k, 0) + size / n
        per_msg = (used - empty) / n
        # The rest: the server's own (script cache, client buffers, the keyspace's table).
        by_key["(outside keys)"] = per_msg - sum(by_key.values())
        return Measured(per_msg, by_key, note)
    finally:
        server.stop()


def recipe(n: int, payload: dict[str, Any]) -> Callable[[redis_py.Redis, run.Redis], str]:
    """The recipe's producer, as push_server_time.py's memory() runs it."""
    def fill(r: redis_py.Redis, server: run.Redis) -> str:
        mid = fill_recipe(r, n, payload)
        return f"id e.g. `{mid}` ({len(mid)} chars)"
    return fill


def delayq_push(n: int, payload: dict[str, Any], many: bool) -> Callable[[redis_py.Redis, run.Redis], str]:
    def fill(r: redis_py.Redis, server: run.Redis) -> str:
        q = delayq.DelayQueue(server.url, QUEUE)
        if many:
            for start in range(0, n, CHUNK):
                q.push_many([(payload, 3600)] * min(CHUNK, n - start))
        else:
            for _ in range(n):
                q.push(payload, 3600)
        mid = r.zrange(f"{TAG}:scheduled", 0, 0)[0]
        stored = r.hget(f"{TAG}:messages", mid)
        shown = re.sub(r"x{20,}", lambda m: f"x…({len(m.group())} x)", stored.decode())
        return f"`HGET {TAG}:messages {mid.decode()}` = `{shown}` ({len(stored)} bytes)"
    return fill


def hand(n: int, payload: dict[str, Any], layout: Layout) -> Callable[[redis_py.Redis, run.Redis], str]:
    """ZADD scheduled + HSET messages (or the bucket) with redis-py, as `layout` stores."""
    body = json.dumps(payload, separators=(",", ":"))
    buckets = max(1, round(n / (layout.fill or BUCKET_FILL)))

    def fill(r: redis_py.Redis, server: run.Redis) -> str:
        due_ms = int(time.time() * 1000) + 3_600_000
        pipe = r.pipeline(transaction=False)
        for start in range(0, n, CHUNK):
            members: dict[bytes, int] = {}
            fields: dict[bytes, dict[bytes, bytes]] = {}
            for i in range(start, min(n, start + CHUNK)):
                raw = uuid7()
                mid = ID_FORMS[layout.ids](raw)
                score = (due_ms + i // 100) * SPAN + i % 100
                members[mid] = score
                key = f"{TAG}:m:{zlib.crc32(mid) % buckets}" if layout.buckets else f"{TAG}:messages"
                fields.setdefault(key.encode(), {})[mid] = layout.envelope(mid, score, due_ms - 3_600_000, body)
            pipe.zadd(f"{TAG}:scheduled", members)
            for key, mapping in fields.items():
                pipe.hset(key, mapping=mapping)
            pipe.execute()
        sample = layout.envelope(mid, score, due_ms - 3_600_000, body)
        note = f"envelope {len(sample)} bytes, id {len(mid)} bytes"
        if layout.buckets:
            sizes, table = [], 0
            for key in r.scan_iter(match=f"{TAG}:m:*", count=1000):
                sizes.append(r.hlen(key))
                table += r.object("encoding", key) == b"hashtable"
            note += (f"; {len(sizes)} buckets of {min(sizes)}..{max(sizes)} fields, "
                     f"{len(sizes) - table} listpack, {table} hashtable")
        return note
    return fill


def hand_inflight(n: int, payload: dict[str, Any], layout: Layout,
                  score_in_lease: bool) -> Callable[[redis_py.Redis, run.Redis], str]:
    """In flight as claim.lua leaves a message, written by hand: its envelope stays in
    messages and a lease names its claim's token (one a 1000), followed by ":<score>"
    where the envelope has no stamp to give it (as the seed layout's leases are). The
    claims' own records (claims, claim_ids) are left out."""
    body = json.dumps(payload, separators=(",", ":"))

    def fill(r: redis_py.Redis, server: run.Redis) -> str:
        due_ms = int(time.time() * 1000)
        pipe = r.pipeline(transaction=False)
        for start in range(0, n, CHUNK):
            envelopes: dict[bytes, bytes] = {}
            leases: dict[bytes, str] = {}
            token = str(start // CHUNK + 1)
            for i in range(start, min(n, start + CHUNK)):
                mid = ID_FORMS[layout.ids](uuid7())
                score = (due_ms + i // 100) * SPAN + i % 100
                envelopes[mid] = layout.envelope(mid, score, due_ms, body)
                leases[mid] = f"{token}:{score}" if score_in_lease else token
            pipe.hset(f"{TAG}:messages", mapping=envelopes)
            pipe.hset(f"{TAG}:leases", mapping=leases)
            pipe.execute()
        return f"envelope {len(envelopes[mid])} bytes, lease `{leases[mid]}`"
    return fill


def inflight(n: int, payload: dict[str, Any]) -> Callable[[redis_py.Redis, run.Redis], str]:
    """Pushed due now by delayq, then claimed by delayq's claim.lua in claims of 1000
    (a pool's batch) with a long lease, and left in flight."""
    script = composed(ROOT / "core" / "src" / "lua")["claim"]

    def fill(r: redis_py.Redis, server: run.Redis) -> str:
        q = delayq.DelayQueue(server.url, QUEUE)
        for start in range(0, n, CHUNK):
            q.push_many([(payload, 0)] * min(CHUNK, n - start))
        time.sleep(0.01)
        claim = r.register_script(script["lua"])
        keys = [f"{TAG}:{k}" for k in script["keys"]]
        claimed = 0
        while claimed < n:
            reply = claim(keys=keys, args=["native", f"{TAG}:wake", CHUNK, 3_600_000, 1_000_000, 86_400_000, "0"])
            got = len(reply[1])
            if got == 0:
                sys.exit(f"in flight: {claimed} of {n} claimed, then none")
            claimed += got
        if r.zcard(f"{TAG}:scheduled") or r.hlen(f"{TAG}:leases") != n:
            sys.exit("in flight: not every message holds a lease")
        mid = r.hkeys(f"{TAG}:leases")[0]
        return f"a lease: `HGET {TAG}:leases {mid.decode()}` = `{r.hget(f'{TAG}:leases', mid).decode()}`"
    return fill


def dead(n: int, payload: dict[str, Any]) -> Callable[[redis_py.Redis, run.Redis], str]:
    """Pushed due now by delayq, then run by a delayq.Worker whose handler raises, one
    attempt allowed: every message dead (dead_max raised above n)."""
    def fill(r: redis_py.Redis, server: run.Redis) -> str:
        q = delayq.DelayQueue(server.url, QUEUE, dead_max=10 * n)
        for start in range(0, n, CHUNK):
            q.push_many([(payload, 0)] * min(CHUNK, n - start))

        # One warning a dead message otherwise.
        logging.getLogger("delayq").setLevel(logging.ERROR)

        def handler(body: Any) -> None:
            raise ValueError("order could not be closed")

        worker = delayq.Worker(q, max_attempts=1, stop_when_empty=True, batch=CHUNK, lease=600.0)
        worker.run(handler)
        if r.zcard(f"{TAG}:dead") != n:
            sys.exit(f"dead: {r.zcard(f'{TAG}:dead')} of {n} dead")
        mid = r.zrange(f"{TAG}:dead", 0, 0)[0]
        err = r.hget(f"{TAG}:errors", mid)
        trace = r.hget(f"{TAG}:traces", mid)
        return (f"error `{err.decode() if err else None}`, trace {len(trace) if trace else 0} bytes, "
                f"attempts `{r.hget(f'{TAG}:attempts', mid)}`")
    return fill


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=100000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--label", default="memory-layouts")
    args = p.parse_args()
    n = args.n
    rows: list[tuple[str, str, Callable[[redis_py.Redis, run.Redis], str], tuple[str, ...]]] = []

    def add(group: str, name: str, fill: Callable[[redis_py.Redis, run.Redis], str],
            config: tuple[str, ...] = ()) -> None:
        rows.append((group, name, fill, config))

    for group, payload in (("36 B", PAYLOAD), ("1 KB", KB_PAYLOAD)):
        add(group, RECIPE, recipe(n, payload))
        add(group, "delayq today, `push`", delayq_push(n, payload, False))
        add(group, "delayq today, `push_many`", delayq_push(n, payload, True))
        add(group, "hand-written copy of today's layout", hand(n, payload, TODAY))
    p36 = PAYLOAD
    ladder = [
        ("a: envelope without \"id\"", A),
        ("b: a, without \"v\"", B),
        ("c: b, without \"created_ms\"", C),
        ("d1: c, stamp \"at\":S for \"at\":[0,S]", D_SCORE),
        ("d2: c, no stamp", D_NONE),
        ("e1: d1, ids of 22 chars (base64url)", E22),
        ("e2: d1, ids of 16 raw bytes", E16),
        ("e3: d2, ids of 22 chars, one hash", E22_NONE),
        ("e4: d2, ids of 16 raw bytes, one hash", E16_NONE),
        ("e5: bare payload (no envelope), ids of 16 raw bytes, one hash", BARE_16),
        ("f1: d1, bucketed (default hash-max-listpack-value 64)", F_SCORE),
        ("f2: d1, bucketed, hash-max-listpack-value 128", F_SCORE_128),
        ("f3: d2, bucketed (default config)", F_NONE),
        ("g1: d1 + 16-byte ids + buckets (default config)", G_LOW_SCORE),
        ("g2: d2 + 16-byte ids + buckets", G_LOW),
        ("g3: bare payload (no envelope) + 16-byte ids + buckets", G_BARE),
        ("g4: bare payload + 36-char text ids + buckets", G_TEXT_BARE),
        ("g5: d2 + 22-char ids + buckets", G_22),
        ("g6: bare payload + 22-char ids + buckets", G_22_BARE),
        ("f3 with ~400 fields a bucket", F_NONE_400),
        ("g2 with ~400 fields a bucket", G_LOW_400),
        ("g5 with ~400 fields a bucket", G_22_400),
    ]
    for name, layout in ladder:
        add("36 B", name, hand(n, p36, layout), layout.config)
    add("1 KB", "c: envelope of payload and stamp only", hand(n, KB_PAYLOAD, C))
    add("1 KB", "d2 + 16-byte ids, one hash", hand(n, KB_PAYLOAD, NO_BUCKET_1K))
    add("1 KB", "g2: d2 + 16-byte ids + buckets (default config)", hand(n, KB_PAYLOAD, G_LOW))
    add("1 KB", "g2 with hash-max-listpack-value 1100", hand(n, KB_PAYLOAD, F_NONE_1K), F_NONE_1K.config)
    add("in flight", "delayq today, claimed (36 B payload)", inflight(n, p36))
    add("in flight", "delayq today, claimed (1 KB payload)", inflight(n, KB_PAYLOAD))
    add("in flight", "hand-written: today's envelope, lease = token (no claim records)",
        hand_inflight(n, p36, TODAY, False))
    add("in flight", "hand-written: d1 (stamp \"at\":S), lease = token", hand_inflight(n, p36, D_SCORE, False))
    add("in flight", "hand-written: d2 (no stamp), lease = token:score", hand_inflight(n, p36, D_NONE, True))
    add("dead", "delayq today, dead after 1 attempt (36 B payload)", dead(n, p36))
    add("dead", "delayq today, dead after 1 attempt (1 KB payload)", dead(n, KB_PAYLOAD))

    found: dict[tuple[str, str], list[Measured]] = {}
    for rnd in range(args.rounds):
        for group, name, fill, config in rows:
            m = measure(n, fill, config)
            found.setdefault((group, name), []).append(m)
            print(f"round {rnd + 1} | {group} | {name} | {m.per_msg:.1f} B/msg | {m.note}", flush=True)

    version = run.server_version()
    lines = [
        f"# Redis bytes per message, layout by layout ({version})",
        "",
        f"Command: `taskset -c 1 python3 bench/memory_layouts.py --n={n} --rounds={args.rounds} --label={args.label}` "
        f"(`used_memory` after `MEMORY PURGE`, over the same fresh server's when empty, divided by {n:,} "
        "messages; median of the rounds, range in brackets; each row on a fresh private redis-server "
        f"{version} with default settings unless the row says otherwise). Payloads: `{json.dumps(PAYLOAD)}` "
        "(36 bytes) and a 1 KB one (`\"note\"` of 1000 x). Rows a..g are written by hand with redis-py "
        f"(ZADD `{TAG}:scheduled` + HSET `{TAG}:messages` or `{TAG}:m:<crc32(id) mod B>`), each from the "
        "row named in it; the hand-written copy of today's layout checks the method against delayq's own "
        "rows.",
        "",
    ]
    for group in ("36 B", "1 KB", "in flight", "dead"):
        base = statistics.median(m.per_msg for m in found[(group if group in ("36 B", "1 KB") else "36 B",
                                                           RECIPE)])
        if group in ("in flight", "dead"):
            title = f"## {group.capitalize()} (x of the recipe's waiting message with the same payload)"
            base_kb = statistics.median(m.per_msg for m in found[("1 KB", RECIPE)])
        else:
            title = f"## Waiting, {group} payload"
            base_kb = base
        lines += [title, "", "| row | B/msg | x recipe | bytes a message by key (MEMORY USAGE) | note (last round) |",
                  "|---|---|---|---|---|"]
        for (g, name), ms in found.items():
            if g != group:
                continue
            vals = [m.per_msg for m in ms]
            ref = base_kb if "1 KB" in name else base
            keys = ", ".join(f"{k} {v:.0f}" for k, v in sorted(ms[-1].by_key.items(), key=lambda kv: -kv[1]) if v >= 0.5)
            lines.append(f"| {name} | {run.cell(vals, '.0f')} | {statistics.median(vals) / ref:.2f}x | {keys} | "
                         f"{ms[-1].note.replace('|', '/')} |")
        lines.append("")
    run.write_results(f"-{args.label}", "\n".join(lines))


if __name__ == "__main__":
    main()
