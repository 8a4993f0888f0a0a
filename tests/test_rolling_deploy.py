"""A rolling deploy: PHP pools built from DEPLOY_FROM (tests/deploy_from.py) and pools of
this tree, PHP and Python, drain one queue together, fed by producers of both builds.
One old pool stops gracefully mid-run and the other is killed; the new pools take over
what they held. Each build runs messages the other pushed; nothing is lost, nothing
runs twice at the same time, and a message runs again only after a failure or a kill.
See docs/workers.md, "Restarting after a deploy"; DELAYQ_DEPLOY_FROM=<commit> tries a
deploy from another build."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import delayq
import pytest
from deploy_from import DEPLOY_FROM, extension_at, php_with
from harness import RedisServer, drained, wait_for
from phpcli import php_cmd

HERE = Path(__file__).resolve().parent
LEASE = 2.0
N = 200
SLOW = 1.25 * LEASE  # a slow message's first attempt: it lives on heartbeats
POOLS = ("old-stopped", "old-killed", "new-php", "new-python")


def payload(n: int) -> dict[str, Any]:
    # Every fifth fails its first attempt. Two in every ten are slow, side by side in
    # one due time (so in one claim, often), so that the kill finds runs in progress and
    # the pools must renew the leases of several messages of a claim.
    return {"n": n, "fail": n % 5 == 0, "sleep": SLOW if n % 10 in (3, 4) else 0.01}


def due(n: int) -> float:
    return 3.0 * (n - n % 20) / N


def pushed_by_old(n: int) -> bool:
    return n % 2 == 0


def start_pool(cmd: list[str], env: dict[str, str] | None, log: Path, options: dict[str, Any]) -> subprocess.Popen[bytes]:
    # Its own session: a kill reaches a PHP pool's forked children too.
    return subprocess.Popen([*cmd, str(log), json.dumps(options)], env=env, start_new_session=True)


def php_pool(cmd: list[str], env: dict[str, str] | None, url: str, log: Path) -> subprocess.Popen[bytes]:
    return start_pool([*cmd, str(HERE / "pools" / "span_pool.php"), url, "deploy"], env, log,
                      {"lease": LEASE, "processes": 2, "prefetch": 2, "backoff_base": 0.1})


Run = tuple[str, int, int, float, "float | None"]  # pool, attempt, pid, start, end


def runs(logs: dict[str, Path]) -> dict[int, list[Run]]:
    """Per message, its handler runs in order of their start."""
    found: dict[int, list[Run]] = defaultdict(list)
    for pool, log in logs.items():
        starts: dict[tuple[int, int, int], float] = {}
        ends: dict[tuple[int, int, int], float] = {}
        for line in log.read_text().splitlines(keepends=True):
            fields = line.split()
            if not line.endswith("\n") or len(fields) != 5:
                continue  # being written, or cut off by a kill
            key = (int(fields[0]), int(fields[1]), int(fields[2]))
            (starts if fields[3] == "start" else ends)[key] = float(fields[4])
        for (n, attempt, pid), start in starts.items():
            found[n].append((pool, attempt, pid, start, ends.get((n, attempt, pid))))
    return {n: sorted(r, key=lambda run: run[3]) for n, r in found.items()}


def ran_in(logs: dict[str, Path], pools: tuple[str, ...], old_pushed: bool) -> bool:
    """Whether any of `pools` ran a message that the old build (else the new) pushed."""
    return any(run[0] in pools and pushed_by_old(n) == old_pushed
               for n, message_runs in runs(logs).items() for run in message_runs)


def test_old_and_new_pools_drain_one_queue_through_a_rolling_deploy(redis_url: str, tmp_path: Path) -> None:
    old_cmd, old_env = php_with(extension_at(DEPLOY_FROM), tmp_path / "ini")
    queue = delayq.DelayQueue(redis_url, "deploy")
    logs = {name: tmp_path / f"{name}.log" for name in POOLS}
    for log in logs.values():
        log.touch()
    old = ("old-stopped", "old-killed")
    new = ("new-php", "new-python")

    pools = {name: php_pool(old_cmd, old_env, redis_url, logs[name]) for name in old}
    try:
        wait_for(30, "the old pools listed", lambda: len(queue.workers()) == 4)
        # Even numbers pushed by the old build, odd ones by this one, side by side in
        # due time over the next 3 s.
        items = [{"payload": payload(n), "delay": due(n)} for n in range(N) if pushed_by_old(n)]
        subprocess.run([*old_cmd, "-r", "(new DelayQueue($argv[1], 'deploy'))->pushMany(json_decode($argv[2], true));",
                        redis_url, json.dumps(items)], env=old_env, check=True, timeout=60)
        queue.push_many([{"payload": payload(n), "delay": due(n)} for n in range(N) if not pushed_by_old(n)])
        assert queue.stats()["pushed"] == N

        wait_for(30, "the old pools running messages of both builds",
                 lambda: ran_in(logs, old, True) and ran_in(logs, old, False))
        # The deploy: new pools start while the old ones run.
        pools["new-php"] = php_pool(php_cmd(), None, redis_url, logs["new-php"])
        pools["new-python"] = start_pool(
            [sys.executable, str(HERE / "pools" / "span_pool.py"), redis_url, "deploy"], None,
            logs["new-python"], {"lease": LEASE, "threads": 2, "prefetch": 2, "backoff_base": 0.1})
        wait_for(30, "the new pools listed", lambda: len(queue.workers()) == 4 + 2 + 1)
        wait_for(30, "the new pools running messages of the old build", lambda: ran_in(logs, new, True))

        # One old pool stops as a deploy stops it (its supervisor passes the signal on),
        # the other dies with what it holds.
        os.kill(pools["old-stopped"].pid, signal.SIGTERM)
        killed_at = time.time()
        os.killpg(pools["old-killed"].pid, signal.SIGKILL)
        pools["old-killed"].wait(30)
        assert pools["old-stopped"].wait(30) == 0

        wait_for(90, "every message acknowledged", lambda: drained(queue) and queue.stats()["acked"] == N)
    finally:
        for p in pools.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(30)

    by_message = runs(logs)
    assert sorted(by_message) == list(range(N)), f"lost: {sorted(set(range(N)) - set(by_message))}"
    killed_runs = again_after_kill = 0
    counted_before_the_last = 0
    for n, message_runs in by_message.items():
        # No two runs of one message at the same time: each starts after the one before
        # it ended, or after its pool was killed.
        for before, after in zip(message_runs, message_runs[1:]):
            assert after[3] >= (before[4] if before[4] is not None else killed_at), \
                f"message {n} ran twice at once: {message_runs}"
        # A run after another follows a failure (the first attempt of a failing message)
        # or a run of the killed pool: cut off, or ended with its outcome not yet
        # written when the pool died.
        for before, after in zip(message_runs, message_runs[1:]):
            if before[4] is None:
                assert before[0] == "old-killed", f"message {n}: a run of a live pool never ended: {message_runs}"
                killed_runs += 1
                again_after_kill += after[0] in new
            else:
                assert (payload(n)["fail"] and before[1] == 1) or before[0] == "old-killed", \
                    f"message {n} ran again after it succeeded: {message_runs}"
        last = message_runs[-1]
        assert last[4] is not None, f"message {n}: its last run did not end: {message_runs}"
        # Every earlier run of a live pool counted as an attempt. A run of the killed
        # pool counts only where its claim's expiry was charged: by an old pool's
        # reaper, or a new one's for a message claimed alone (a new reaper charges none
        # of an expired claim of several, see claim.lua); so may, at most once, a
        # delivery that the killed pool held without starting it. A graceful stop's
        # release does not count.
        earlier = message_runs[:-1]
        killed = sum(1 for run in earlier if run[0] == "old-killed")
        live = len(earlier) - killed
        assert live <= last[1] - 1 <= live + killed + 1, \
            f"message {n}: attempts not counted per delivery: {message_runs}"
        counted_before_the_last += last[1] - 1

    stats = queue.stats()
    assert (stats["acked"], stats["dead"], stats["died"]) == (N, 0, 0), stats
    # Every attempt before a message's last ended as a retry or an expired lease (not
    # every expired lease counts: see above).
    assert stats["retried"] + stats["expired"] >= counted_before_the_last, stats
    assert stats["retried"] <= sum(1 for n in range(N) if payload(n)["fail"]), stats
    assert stats["expired"] >= killed_runs, stats
    # Each build ran what the other pushed; every pool ran messages.
    assert ran_in(logs, old, False) and ran_in(logs, new, True)
    assert {run[0] for rs in by_message.values() for run in rs} == set(POOLS)
    assert killed_runs > 0 and again_after_kill > 0, \
        "the kill ended no run that a new pool took over: the test proves nothing"


# Cancel across builds. The build a deploy starts from has no cancel marks: its pools
# run a marked message to the end as if no cancel came, its retries and re-deliveries
# write a stamp without a mark (docs/php.md, "Cancelling a message that runs"), and its
# cancel() deletes waiting messages only. Three queues:
#   cancel-old     an old pool (stopped gracefully) runs a..d, this build cancels them
#                  (b and d with kill): the old pool acknowledges a and b, retries c and
#                  dead-letters d; this build requeues d; a new pool runs c to its end,
#                  and d until this build cancels it again.
#   cancel-killed  an old pool runs e, this build cancels it, the pool is killed: the
#                  new pool's reaper deletes e as cancelled, unrun.
#   cancel-new     a new pool runs f, g and h; the old build's cancel() leaves f alone
#                  (false) and refuses g's kill option (it takes one argument); this
#                  build's cancel ends h as cancelled.
# Each variant about 6 s; "functions" with this build's library installed (FCALL).
GATE_POOL = HERE / "pools" / "gate_pool.php"
Event = tuple[str, int, int, str, float, str]  # id, attempt, pid, start/end, time, outcome:cancelled


class GatePool:
    """A gate_pool.php process: each handler waits for the test's word on its outcome."""

    def __init__(self, cmd: list[str], env: dict[str, str] | None, url: str, queue: str, label: str,
                 tmp: Path, options: dict[str, Any]) -> None:
        self.label = label
        self.log = tmp / f"{label}.log"
        self.log.touch()
        self.proc = subprocess.Popen(
            [*cmd, str(GATE_POOL), url, queue, label, str(self.log), str(tmp / "gates"), json.dumps(options)],
            env=env, start_new_session=True)

    def events(self) -> list[Event]:
        found = []
        for line in self.log.read_text().splitlines(keepends=True):
            f = line.split()
            if line.endswith("\n") and len(f) == 6:
                found.append((f[0], int(f[1]), int(f[2]), f[3], float(f[4]), f[5]))
        return found

    def running(self) -> set[str]:
        """Ids whose latest run in this pool started and has not ended."""
        now: set[str] = set()
        for e in self.events():
            (now.add if e[3] == "start" else now.discard)(e[0])
        return now

    def ends(self, id: str) -> list[str]:
        return [e[5] for e in self.events() if e[0] == id and e[3] == "end"]


def open_gate(tmp: Path, id: str, **outcomes: str) -> None:
    """Tells the pools labelled as `outcomes` names how a run of `id` ends."""
    gate = tmp / "gates" / id
    gate.with_suffix(".part").write_text(json.dumps(outcomes))
    os.replace(gate.with_suffix(".part"), gate)


def stamp(server: RedisServer, queue: str, id: str) -> str:
    """The stamp at the front of a message's stored envelope: what a claim, a heartbeat
    and a completion read for a mark (lua/include/stamp.lua)."""
    envelope = server.cli("HGET", f"{{dq:{queue}}}:messages", id)
    return envelope[:envelope.index("]") + 1] if envelope else ""


@pytest.mark.parametrize("functions", [False, True], ids=["scripts", "functions"])
def test_a_cancel_of_either_build_leaves_a_message_the_other_runs_in_a_known_state(
        server: RedisServer, redis_url: str, tmp_path: Path, functions: bool) -> None:
    old_cmd, old_env = php_with(extension_at(DEPLOY_FROM), tmp_path / "ini")
    (tmp_path / "gates").mkdir()
    if functions and "unknown command" in server.cli("FUNCTION", "STATS").lower():
        pytest.skip("this Redis has no functions (7.0+)")
    if functions:
        # The upgrade order of docs/workers.md: the new build's library first; the old
        # build's processes keep calling their scripts.
        delayq.DelayQueue(redis_url, "cancel-old").install_functions()
    qa, qb, qc = (delayq.DelayQueue(redis_url, name) for name in ("cancel-old", "cancel-killed", "cancel-new"))
    options = {"lease": LEASE, "prefetch": 1, "backoff_base": 0.2, "max_attempts": 3}
    pools = {
        "old-a": GatePool(old_cmd, old_env, redis_url, "cancel-old", "old-a", tmp_path, {**options, "processes": 4}),
        "old-b": GatePool(old_cmd, old_env, redis_url, "cancel-killed", "old-b", tmp_path,
                          {**options, "processes": 1}),
        "new-c": GatePool(php_cmd(), None, redis_url, "cancel-new", "new-c", tmp_path, {**options, "processes": 3}),
    }

    def old_php(code: str, *args: str) -> Any:
        done = subprocess.run([*old_cmd, "-r", code, redis_url, *args], env=old_env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr + done.stdout
        return json.loads(done.stdout)

    try:
        # Of each queue's messages, some pushed by the old build, the others by this one.
        old_php("foreach (json_decode($argv[2], true) as $q => $ids) {"
                "  (new DelayQueue($argv[1], $q))"
                "    ->pushMany(array_map(fn($id) => ['payload' => [], 'id' => $id], $ids));"
                "} echo '[]';", json.dumps({"cancel-old": ["a", "b"], "cancel-new": ["f", "g"]}))
        qa.push({}, id="c")
        qa.push({}, id="d")
        qb.push({}, id="e")
        qc.push({}, id="h")
        wait_for(30, "every message running", lambda: pools["old-a"].running() == {"a", "b", "c", "d"}
                 and pools["old-b"].running() == {"e"} and pools["new-c"].running() == {"f", "g", "h"})
        old_pids = {e[2] for label in ("old-a", "old-b") for e in pools[label].events()}

        # This build cancels what the old pools run, b and d with kill: each is marked
        # (true), in its envelope's stamp.
        assert [qa.cancel("a"), qa.cancel("b", kill=True), qa.cancel("c"), qa.cancel("d", kill=True),
                qb.cancel("e")] == [True] * 5
        assert [stamp(server, "cancel-old", i)[:10] for i in "abcd"] == ['{"at":[-1,', '{"at":[-2,'] * 2
        # The old build's cancel deletes waiting messages only: f runs, false; it takes
        # no options, so the kill a caller of the new API asks for is refused whole.
        assert old_php("echo json_encode((new DelayQueue($argv[1], 'cancel-new'))->cancel('f'));") is False
        assert old_php("try { (new DelayQueue($argv[1], 'cancel-new'))->cancel('g', ['kill' => true]);"
                       "  echo json_encode('no error'); } catch (ArgumentCountError $e) {"
                       "  echo json_encode($e->getMessage()); }") == \
            "DelayQueue::cancel() expects exactly 1 argument, 2 given"
        assert qc.cancel("h")
        # The new pool ended h, which it learned was cancelled at a heartbeat (a third
        # of the lease). Two heartbeats later, the old pools, which cannot learn it,
        # still run theirs (nor did a kill come), and the new pool still runs f and g.
        wait_for(10, "h ended as cancelled", lambda: qc.stats()["cancelled"] == 1)
        assert pools["new-c"].ends("h") == ["ok:1"] and qc.get("h") is None
        time.sleep(LEASE * 2 / 3)
        assert pools["old-a"].running() == {"a", "b", "c", "d"} and pools["old-b"].running() == {"e"}
        assert pools["new-c"].running() == {"f", "g"}
        for pid in old_pids:
            os.kill(pid, 0)  # alive: the kill mark reached no old process
        assert {qa.get(i)["state"] for i in "abcd"} | {qb.get("e")["state"]} == {"inflight"}  # type: ignore[index]
        assert [stamp(server, "cancel-new", i)[:8] for i in "fg"] == ['{"at":[0'] * 2

        # The deploy: one old pool stops gracefully, its handlers ending as the test
        # says; the other dies with e.
        os.kill(pools["old-a"].proc.pid, signal.SIGTERM)
        os.killpg(pools["old-b"].proc.pid, signal.SIGKILL)
        for id, outcome in {"a": "ok", "b": "ok", "c": "fail", "d": "dead"}.items():
            open_gate(tmp_path, id, **{"old-a": outcome})
        for id in "fg":
            open_gate(tmp_path, id, **{"new-c": "ok"})
        open_gate(tmp_path, "e", **{"new-b": "ok"})
        assert pools["old-a"].proc.wait(30) == 0
        pools["old-b"].proc.wait(30)
        assert [pools["old-a"].ends(i) for i in "abcd"] == [["ok:-"], ["ok:-"], ["fail:-"], ["dead:-"]]

        # As its handler ended in the old build: a and b acknowledged, c retried, d dead.
        assert qa.get("a") is None and qa.get("b") is None
        c, d = qa.get("c"), qa.get("d")
        assert c is not None and c["state"] in ("scheduled", "ready") and c["attempts"] == 1, c
        assert d is not None and d["state"] == "dead", d
        # c's retry wrote a stamp without a mark in front of the envelope, and left the
        # marked one behind it (the old build's stamp pattern has no minus sign, so it
        # reads the envelope as one without a stamp): a stale mark, a second "at" field,
        # that this build must not read. d's dead letter keeps its mark: a requeue of
        # this build writes a fresh stamp in its place.
        envelope_c = server.cli("HGET", "{dq:cancel-old}:messages", "c")
        assert envelope_c.startswith('{"at":[0,') and envelope_c.count('"at":[-1,') == 1, envelope_c
        assert stamp(server, "cancel-old", "d").startswith('{"at":[-2,'), stamp(server, "cancel-old", "d")
        assert qa.requeue_dead("d") == 1
        assert stamp(server, "cancel-old", "d").startswith('{"at":[0,'), stamp(server, "cancel-old", "d")
        s = qa.stats()
        assert (s["pushed"], s["acked"], s["retried"], s["died"], s["requeued"], s["cancelled"]) \
            == (4, 2, 1, 1, 1, 0), s

        # The new pools take over. e, whose lease ends, is deleted as cancelled by the
        # new build's reaper, never run again. c and d run in a new pool; this build
        # cancels d there: the mark it writes now is one a heartbeat and an ack look
        # for (for two leases after it, see extend.lua), so c's heartbeats and ack
        # read the stamps of an envelope that an old retry left a mark behind; c must
        # run to its end as a message nobody cancelled.
        pools["new-a"] = GatePool(php_cmd(), None, redis_url, "cancel-old", "new-a", tmp_path,
                                  {**options, "processes": 2})
        pools["new-b"] = GatePool(php_cmd(), None, redis_url, "cancel-killed", "new-b", tmp_path,
                                  {**options, "processes": 1})
        wait_for(30, "c and d running in the new pool", lambda: pools["new-a"].running() == {"c", "d"})
        assert qa.cancel("d")
        wait_for(10, "d's handler told of its cancel", lambda: pools["new-a"].ends("d") != [])
        time.sleep(LEASE / 3 + 0.2)  # one heartbeat more, within the two leases
        assert pools["new-a"].running() == {"c"} and qa.get("c")["state"] == "inflight", \
            f"c, not cancelled in this build, ended as {pools['new-a'].ends('c')}: {qa.stats()}"
        open_gate(tmp_path, "c", **{"old-a": "fail", "new-a": "ok"})
        wait_for(30, "every queue drained", lambda: all(drained(q) for q in (qa, qb, qc))
                 and qa.stats()["acked"] == 3 and qc.stats()["acked"] == 2)
        wait_for(10, "e deleted as cancelled", lambda: qb.stats()["cancelled"] == 1)
    finally:
        for p in pools.values():
            if p.proc.poll() is None:
                os.killpg(p.proc.pid, signal.SIGTERM)
                p.proc.wait(30)
        if functions:
            server.cli("FUNCTION", "FLUSH")

    assert pools["new-a"].ends("c") == ["ok:0"] and pools["new-a"].ends("d") == ["ok:1"]
    assert pools["new-c"].ends("f") == ["ok:0"] and pools["new-c"].ends("g") == ["ok:0"]
    assert pools["new-b"].events() == [], "a message cancelled in a killed old pool ran again"
    assert qb.get("e") is None
    # Each message's runs one after another: a run starts after the one before ended.
    runs_of: dict[str, list[Event]] = defaultdict(list)
    for pool in pools.values():
        for e in pool.events():
            runs_of[e[0]].append(e)
    for id, events in runs_of.items():
        events.sort(key=lambda e: e[4])
        kinds = [e[3] for e in events]
        assert kinds == ["start", "end"] * (len(kinds) // 2) or (id == "e" and kinds == ["start"]), (id, events)
    # Every message pushed is accounted for: acknowledged, or deleted as cancelled.
    for q, (pushed, acked, cancelled) in ((qa, (4, 3, 1)), (qb, (1, 0, 1)), (qc, (3, 2, 1))):
        s = q.stats()
        assert (s["pushed"], s["acked"], s["cancelled"], s["dead"], s["scheduled"] + s["ready"] + s["inflight"]) \
            == (pushed, acked, cancelled, 0, 0), s
        assert s["expired"] == 0, s
    if functions:
        assert "cmdstat_fcall" in server.cli("INFO", "commandstats")


def test_a_queue_that_holds_groups_stops_the_build_before_them(redis_url: str, tmp_path: Path) -> None:
    """The build before groups would take a group for a serial key: once a queue holds
    one, it records format 2, and that build's producers and pools stop on it, naming
    the format, while this build's run it."""
    old_cmd, old_env = php_with(extension_at(DEPLOY_FROM), tmp_path / "ini")
    queue = delayq.DelayQueue(redis_url, "grouped")
    queue.push({"n": 1}, 0, group="tenant-1")
    pushed = subprocess.run(
        [*old_cmd, "-r", "try { (new DelayQueue($argv[1], 'grouped'))->push(['n' => 2]); }"
         " catch (Throwable $e) { fwrite(STDERR, $e->getMessage()); exit(3); }", redis_url],
        env=old_env, capture_output=True, text=True, timeout=60)
    assert pushed.returncode == 3, pushed
    assert "format 2" in pushed.stderr, pushed.stderr
    log = tmp_path / "old.log"
    log.touch()
    pool = subprocess.Popen([*old_cmd, str(HERE / "pools" / "span_pool.php"), redis_url, "grouped", str(log),
                             json.dumps({"lease": LEASE})],
                            env=old_env, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = pool.communicate(timeout=60)
    finally:
        if pool.poll() is None:
            os.killpg(pool.pid, signal.SIGKILL)
    assert pool.returncode != 0 and "format 2" in err, err
    assert log.read_text() == ""
    assert queue.stats()["pushed"] == 1
    seen: list[Any] = []
    worker = delayq.Worker(queue, stop_when_empty=True)
    worker.run(lambda payload, msg: seen.append((payload, msg.group)))
    assert seen == [({"n": 1}, "tenant-1")]
