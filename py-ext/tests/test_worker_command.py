"""`delayq worker module:function`: a handler run from the command line, in one process
or in a supervised pool of them, against a real redis-server."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import delayq
from delayq import _command
from delayq._delayq import _Slot, _SlotTable
from harness import wait_for

TASKS = '''
import json, os, signal, sys, time

LOG = os.environ["TASKS_LOG"]

def handle(payload, msg):
    # Once each, on whichever delivery comes first (an earlier one may have been in a
    # process that the other one ended).
    if payload.get("hang_always"):
        time.sleep(3600)
    if payload.get("exit_always"):
        raise SystemExit(3)
    if payload.get("hang") and not os.path.exists(LOG + ".hung"):
        open(LOG + ".hung", "w").close()
        time.sleep(3600)
    if payload.get("hold"):
        open(LOG + ".holding", "w").close()
        while True:
            time.sleep(0.05)
    if payload.get("until_cancelled"):
        # Stops at the mark, a moment after its process got ready for the kill.
        open(LOG + ".holding." + str(payload["n"]), "w").close()
        while not msg.cancelled:
            time.sleep(0.005)
        time.sleep(0.04)
        return
    if payload.get("crash") and not os.path.exists(LOG + ".crashed"):
        open(LOG + ".crashed", "w").close()
        os._exit(9)
    if payload.get("exit") and not os.path.exists(LOG + ".exited"):
        open(LOG + ".exited", "w").close()
        raise SystemExit(3)
    if payload.get("kill"):
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(payload.get("sleep", 0.002))
    with open(LOG, "a") as f:
        f.write(json.dumps([payload["n"], msg.attempt, os.getpid()]) + "\\n")

async def handle_async(payload, msg):
    handle(payload, msg)

async def wait_then_handle(payload, msg):
    # Awaits first, so that a later handler can block the event loop under it.
    import asyncio
    await asyncio.sleep(payload.get("wait", 0))
    handle(payload, msg)

async def hold_async(payload, msg):
    import asyncio
    with open(LOG + ".holding", "a") as f:
        f.write(str(payload["n"]) + "\\n")
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        await asyncio.sleep(0.1)  # its clean-up
        raise

def report(payload, msg, exc):
    with open(LOG + ".failures", "a") as f:
        f.write(json.dumps([payload["n"], msg.attempt, type(exc).__name__, str(exc), os.getpid()]) + "\\n")

def alert(payload, msg, error):
    with open(LOG + ".dead", "a") as f:
        f.write(json.dumps([payload, msg.id, error, os.getpid()]) + "\\n")

def opened():
    with open(LOG + ".starts", "a") as f:
        f.write(f"{os.getpid()}\\n")

def closed():
    with open(LOG + ".stops", "a") as f:
        f.write(f"{os.getpid()}\\n")

def chatty(payload, msg):
    print("closing order", payload["n"])
    handle(payload, msg)

def fail(payload, msg):
    raise ValueError(f"cannot close order {payload['n']}")

def fork_then_handle(payload, msg):
    # Side work in a child, which returns from the handler or exits; the parent waits
    # for it (at most 5 s, then kills it), notes how it ended, and handles the message.
    pid = os.fork()
    if pid == 0:
        if payload.get("child") == "exit":
            sys.exit(7)
        return
    deadline = time.monotonic() + 5
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    if done[0] == pid:
        ended = os.waitstatus_to_exitcode(done[1])
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        ended = "alive"
    with open(LOG + ".children", "a") as f:
        f.write(json.dumps([payload["n"], ended]) + "\\n")
    handle(payload, msg)

def fork_sleeper_then_handle(payload, msg):
    # Side work that outlives the handler: a child holding every descriptor its parent
    # had, the report pipe's write end among them.
    pid = os.fork()
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    with open(LOG + ".sleepers", "a") as f:
        f.write(f"{pid}\\n")
    handle(payload, msg)

def fail_start():
    raise RuntimeError("no database")

def payload_only(payload):
    with open(LOG, "a") as f:
        f.write(json.dumps([payload["n"], 0, os.getpid()]) + "\\n")

def three(payload, msg, extra):
    pass

not_callable = 42
'''


@pytest.fixture
def tasks(tmp_path: Path) -> Path:
    (tmp_path / "tasks.py").write_text(TASKS)
    return tmp_path


def command(redis_url: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "delayq", "--url", redis_url, "--queue", "jobs", "--json", "worker", *args]


def environment(tasks: Path) -> dict[str, str]:
    return {**os.environ, "TASKS_LOG": str(tasks / "handled.log")}


def handled(tasks: Path) -> list[tuple[int, int, int]]:
    log = tasks / "handled.log"
    if not log.exists():
        return []
    return [tuple(json.loads(line)) for line in log.read_text().splitlines() if line]  # type: ignore[misc]


def run(redis_url: str, tasks: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command(redis_url, *args), cwd=tasks, env=environment(tasks), capture_output=True,
                          text=True, timeout=60, check=False)


def children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (FileNotFoundError, ProcessLookupError):
                pass
    return found


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    """Pools started by a test; whatever of them still runs afterwards is killed, so
    that a failed test leaves no consumer behind to take the next test's messages."""
    pools: list[subprocess.Popen[str]] = []
    yield pools
    for pool in pools:
        if pool.poll() is None:
            for child in children_of(pool.pid):
                os.kill(child, signal.SIGKILL)
            pool.kill()
            pool.communicate(timeout=10)


def start(started: list[subprocess.Popen[str]], redis_url: str, tasks: Path, *args: str) -> subprocess.Popen[str]:
    # The log goes to a file: a pipe nobody reads while the pool runs would fill up and
    # block the processes that write to it.
    with open(tasks / "stderr.log", "w") as log:
        pool = subprocess.Popen(command(redis_url, *args), cwd=tasks, env=environment(tasks),
                                stdout=subprocess.PIPE, stderr=log, text=True)
    started.append(pool)
    return pool


def finish(pool: subprocess.Popen[str], tasks: Path) -> tuple[str, str]:
    """SIGTERM, then the summary it printed and what it logged."""
    pool.send_signal(signal.SIGTERM)
    out, _ = pool.communicate(timeout=30)
    return out, (tasks / "stderr.log").read_text()


def push_numbered(queue: delayq.DelayQueue, n: int, **extra: Any) -> None:
    queue.push_many([{"payload": {"n": i, **extra}} for i in range(n)])


def drained(queue: delayq.DelayQueue) -> bool:
    s = queue.stats()
    return s["scheduled"] + s["ready"] + s["inflight"] == 0


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("handler", ["tasks:handle", "tasks:handle_async"])
def test_one_process_runs_a_handler_until_the_queue_is_empty(
    queue: delayq.DelayQueue, redis_url: str, tasks: Path, handler: str
) -> None:
    push_numbered(queue, 20)
    done = run(redis_url, tasks, handler, "--stop-when-empty")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert (summary["stopped_by"], summary["acked"], summary["dead"]) == ("empty", 20, 0)
    assert sorted(n for n, _, _ in handled(tasks)) == list(range(20))
    assert drained(queue)


def test_a_supervised_pool_replaces_crashed_and_hung_processes_and_loses_nothing(
    queue: delayq.DelayQueue, redis_url: str, tasks: Path, started: list[subprocess.Popen[str]]
) -> None:
    push_numbered(queue, 300, sleep=0.005)
    queue.push({"n": 300, "hang": True})
    queue.push({"n": 301, "crash": True})
    pool = start(started, redis_url, tasks, "tasks:handle", "--processes", "3", "--timeout", "0.5", "--lease", "1",
                 "--log-level", "info")
    wait_for(60, "every message handled", lambda: len({n for n, _, _ in handled(tasks)}) == 302 and drained(queue))
    out, err = finish(pool, tasks)
    assert pool.returncode == 0, err
    summary = json.loads(out)
    assert (summary["stopped_by"], summary["processes"], summary["killed_hung"]) == ("signal", 3, 1), summary
    assert summary["restarts"] >= 2, err
    assert "its handler ran past the 0.5 s timeout and was killed" in err
    assert "exited with status 9; starting another" in err
    runs = Counter(n for n, _, _ in handled(tasks))
    # At least once: what ran again is what the dead processes ran without their
    # acknowledgement written yet (acks go in batches).
    again = [n for n, count in runs.items() if count > 1]
    assert len(again) <= 20, again
    attempts = {n: attempt for n, attempt, _ in handled(tasks)}
    assert attempts[300] >= 2 and attempts[301] >= 2, "each delivered again after its lease"
    assert len({pid for _, _, pid in handled(tasks)}) >= 3


def test_worker_processes_stop_gracefully_when_their_supervisor_is_killed(
    queue: delayq.DelayQueue, redis_url: str, tasks: Path, started: list[subprocess.Popen[str]]
) -> None:
    push_numbered(queue, 2000, sleep=0.01)
    pool = start(started, redis_url, tasks, "tasks:handle", "--processes", "2")
    wait_for(30, "both processes busy", lambda: len({pid for _, _, pid in handled(tasks)}) == 2)
    pids = {pid for _, _, pid in handled(tasks)}
    pool.kill()
    pool.wait(timeout=10)
    wait_for(30, "the orphaned processes to stop", lambda: all(gone(pid) for pid in pids))
    pool.communicate(timeout=10)
    stats = queue.stats()
    assert stats["inflight"] == 0, "their prefetched messages went back at once"
    assert stats["ready"] + stats["acked"] == 2000, stats


def test_a_restart_request_ends_the_whole_pool(
    queue: delayq.DelayQueue, redis_url: str, tasks: Path, started: list[subprocess.Popen[str]]
) -> None:
    push_numbered(queue, 10)
    pool = start(started, redis_url, tasks, "tasks:handle", "--processes", "2")
    wait_for(30, "the first messages handled", lambda: len(handled(tasks)) == 10)
    wait_for(10, "both pools registered", lambda: len(queue.workers()) == 2)
    assert queue.restart_workers() == 2
    out, _ = pool.communicate(timeout=30)
    assert pool.returncode == 0, (tasks / "stderr.log").read_text()
    summary = json.loads(out)
    assert (summary["stopped_by"], summary["restarts"], summary["acked"]) == ("restart", 0, 10)


def test_on_start_and_on_stop_run_once_in_each_worker_process(
    queue: delayq.DelayQueue, redis_url: str, tasks: Path
) -> None:
    push_numbered(queue, 100, sleep=0.01)
    done = run(redis_url, tasks, "tasks:handle", "--on-start", "tasks:opened", "--on-stop", "tasks:closed",
               "--processes", "2", "--stop-when-empty")
    assert done.returncode == 0, done.stderr
    starts = (tasks / "handled.log.starts").read_text().split()
    stops = (tasks / "handled.log.stops").read_text().split()
    handlers = {str(pid) for _, _, pid in handled(tasks)}
    assert len(starts) == 2 and sorted(starts) == sorted(stops), (starts, stops)
    assert handlers <= set(starts) and str(os.getpid()) not in starts, "in the worker processes, not the supervisor"


def test_on_dead_runs_in_the_worker_process_after_a_message_died(
    queue: delayq.DelayQueue, redis_url: str, tasks: Path
) -> None:
    doomed = queue.push({"n": 7}, max_attempts=1)
    done = run(redis_url, tasks, "tasks:fail", "--on-dead", "tasks:alert", "--processes", "2", "--stop-when-empty")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["dead"] == 1
    [line] = (tasks / "handled.log.dead").read_text().splitlines()
    payload, msg_id, error, pid = json.loads(line)
    assert (payload, msg_id, error) == ({"n": 7}, doomed, "ValueError: cannot close order 7")
    assert pid != os.getpid()


@pytest.mark.parametrize("args, text", [
    (["nosuch:handle"], "cannot import 'nosuch': ModuleNotFoundError"),
    (["tasks:missing"], "tasks has no attribute 'missing'"),
    (["tasks:not_callable"], "is not callable but int"),
    (["tasks"], "module:function"),
    (["tasks:handle", "--processes", "0"], "--processes must be at least 1"),
    (["tasks:handle", "--max-attempts", "0"], "max_attempts"),
    (["tasks:handle", "--processes", "2", "--lease", "-1"], "lease"),
    (["tasks:handle", "--on-dead", "tasks:nothing"], "tasks has no attribute 'nothing'"),
    (["tasks:handle", "--no-retry", "builtins:len"], "'builtins:len' is not an exception class"),
    (["tasks:handle", "--no-retry", "ValueError"], "must be given as module:Class"),
    (["tasks:handle", "--processes", "2", "--min-processes", "3"], "--min-processes must be between 1 and"),
    (["tasks:handle", "--processes", "2", "--min-processes", "0"], "--min-processes must be between 1 and"),
    (["tasks:handle", "--processes", "2", "--min-processes", "1", "--scale-cooldown", "0.01"], "scale_cooldown"),
    # Refused once, before any process starts (not by each one the supervisor starts).
    (["tasks:three", "--processes", "2"], "tasks:three: handler three needs 3 arguments"),
    (["tasks:three"], "a worker calls it with (payload, message)"),
])
def test_bad_usage_exits_2_and_consumes_nothing(
    queue: delayq.DelayQueue, redis_url: str, tasks: Path, args: list[str], text: str
) -> None:
    queue.push({"n": 1})
    done = run(redis_url, tasks, *args)
    assert done.returncode == 2 and text in done.stderr, done.stderr
    assert queue.stats()["ready"] == 1 and handled(tasks) == []


def test_a_handler_of_the_payload_alone_runs_under_the_command(
    queue: delayq.DelayQueue, redis_url: str, tasks: Path
) -> None:
    for n in range(4):
        queue.push({"n": n})
    done = run(redis_url, tasks, "tasks:payload_only", "--processes", "2", "--stop-when-empty")
    assert done.returncode == 0, done.stderr
    assert sorted(n for n, _, _ in handled(tasks)) == [0, 1, 2, 3]
    assert json.loads(done.stdout)["acked"] == 4


def test_a_pool_whose_processes_keep_dying_at_their_start_gives_up(
    queue: delayq.DelayQueue, redis_url: str, tasks: Path
) -> None:
    (tasks / "flaky.py").write_text(
        'import sys\n'
        'if "--report-fd" in sys.argv:  # only in the worker processes\n'
        '    raise RuntimeError("no database here")\n'
        'def handle(payload, msg):\n'
        '    pass\n'
    )
    queue.push({"n": 1})
    done = run(redis_url, tasks, "flaky:handle", "--processes", "2")
    assert done.returncode == 3, done.stderr
    assert "RuntimeError: no database here" in done.stderr
    assert "worker processes in a row ended within 2 s of their start; giving up" in done.stderr
    assert json.loads(done.stdout)["stopped_by"] == "error"
    assert queue.stats()["ready"] == 1


def test_handlers_that_kill_their_own_process_fail_their_messages_and_the_pool_goes_on(
    queue: delayq.DelayQueue, redis_url: str, tasks: Path, started: list[subprocess.Popen[str]]
) -> None:
    # Issue 51 (3): a death in a handler fails its message, counted as an attempt, and is
    # not counted toward giving up. What the dead process's claims held besides comes back
    # uncharged when their lease ends (quarantined, see claim.lua).
    poison = [7, 27, 47, 67, 87]
    ids = queue.push_many([{"payload": {"n": n, "kill": n in poison}} for n in range(100)])
    pool = start(started, redis_url, tasks, "tasks:handle", "--processes", "2", "--max-attempts", "3",
                 "--lease", "1")
    wait_for(120, "the others acked and the poison dead, or the pool gone",
             lambda: pool.poll() is not None or (drained(queue) and queue.stats()["dead"] == 5))
    assert pool.poll() is None, (tasks / "stderr.log").read_text()
    out, err = finish(pool, tasks)
    assert pool.returncode == 0, err
    summary = json.loads(out)
    assert summary["stopped_by"] == "signal", summary
    assert summary["restarts"] == 15, "each kill replaced, 3 for each poison message"
    for n, id in enumerate(ids):
        info = queue.get(id)
        if n in poison:
            assert (info["state"], info["attempts"]) == ("dead", 3), info
            assert "was killed by signal 9" in info["last_error"], info
            assert "gave up after 3 attempts" in info["last_error"], info
        else:
            assert info is None, f"message {n} acked"
    assert queue.stats()["dead"] == 5
    assert {n for n, _, _ in handled(tasks)} == set(range(100)) - set(poison)
    assert "giving up" not in err
    assert "the next starts in" not in err, "replaced at once, no back-off"


def test_max_jobs_recycles_the_processes_of_a_pool_and_loses_nothing(
    queue: delayq.DelayQueue, redis_url: str, tasks: Path, started: list[subprocess.Popen[str]]
) -> None:
    push_numbered(queue, 200)
    pool = start(started, redis_url, tasks, "tasks:handle", "--processes", "2", "--max-jobs", "25",
                 "--log-level", "info")
    wait_for(60, "every message handled", lambda: len(handled(tasks)) >= 200 and drained(queue))
    out, err = finish(pool, tasks)
    assert pool.returncode == 0, err
    summary = json.loads(out)
    assert summary["acked"] == 200 and summary["restarts"] >= 6, summary
    assert "recycled (max_jobs); starting another" in err
    assert "starting another" not in err.replace("recycled (max_jobs); starting another", ""), "no death"
    assert sorted(n for n, _, _ in handled(tasks)) == list(range(200)), "each once: recycling is a graceful stop"
    assert len({pid for _, _, pid in handled(tasks)}) >= 8


def test_on_failure_reports_each_exception_from_the_worker_processes(
    queue: delayq.DelayQueue, redis_url: str, tasks: Path
) -> None:
    queue.push({"n": 7}, max_attempts=1)
    queue.push({"n": 8}, max_attempts=1)
    done = run(redis_url, tasks, "tasks:fail", "--on-failure", "tasks:report", "--processes", "2",
               "--stop-when-empty")
    assert done.returncode == 0, done.stderr
    reports = [json.loads(line) for line in (tasks / "handled.log.failures").read_text().splitlines()]
    assert sorted(r[:4] for r in reports) == [[7, 1, "ValueError", "cannot close order 7"],
                                              [8, 1, "ValueError", "cannot close order 8"]]
    assert str(os.getpid()) not in {str(r[4]) for r in reports}, "in the worker processes"


def test_no_retry_names_exception_classes_that_are_not_retried(
    queue: delayq.DelayQueue, redis_url: str, tasks: Path
) -> None:
    failing = queue.push({"n": 7})
    done = run(redis_url, tasks, "tasks:fail", "--no-retry", "builtins:LookupError", "--no-retry",
               "builtins:ValueError", "--stop-when-empty", "--max-attempts", "5")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["dead"] == 1
    info = queue.get(failing)
    assert info is not None and (info["state"], info["attempts"]) == ("dead", 1)
    assert info["last_error"] == "ValueError: cannot close order 7"


def test_min_processes_grows_the_pool_with_the_backlog_and_lets_idle_processes_go(
    queue: delayq.DelayQueue, redis_url: str, tasks: Path, started: list[subprocess.Popen[str]]
) -> None:
    pool = start(started, redis_url, tasks, "tasks:handle", "--processes", "3", "--min-processes", "1",
                 "--scale-cooldown", "0.3", "--lease", "2", "--log-level", "info")
    wait_for(30, "the first process listed", lambda: len(queue.workers()) == 1)
    # 1500 messages of 10 ms: 15 s for one process, so a backlog for a while, even if a
    # new process takes seconds to start on a loaded machine.
    messages = 1500
    push_numbered(queue, messages, sleep=0.01)
    wait_for(30, "three processes", lambda: len(queue.workers()) == 3)
    wait_for(60, "every message handled", lambda: drained(queue))
    wait_for(30, "back to one process", lambda: len(queue.workers()) == 1)
    out, err = finish(pool, tasks)
    assert pool.returncode == 0, err
    summary = json.loads(out)
    assert summary["processes"] == 3 and summary["restarts"] == 0, summary
    assert summary["scaled_up"] >= 2 and summary["scaled_down"] >= 2, summary
    assert summary["acked"] == messages
    # A process let go stops gracefully: nothing lost, nothing run twice.
    assert sorted(n for n, _, _ in handled(tasks)) == list(range(messages))
    assert len({pid for _, _, pid in handled(tasks)}) >= 3
    assert "messages are waiting: 3 worker processes (at most 3)" in err
    assert "nothing waiting: 1 worker processes (at least 1)" in err
    assert "starting another" not in err, "a process let go is not replaced"


@pytest.mark.parametrize("handler", ["tasks:handle", "tasks:handle_async"])
def test_a_timeout_supervises_even_one_process(
    queue: delayq.DelayQueue, redis_url: str, tasks: Path, started: list[subprocess.Popen[str]], handler: str
) -> None:
    # A thread cannot be stopped; nor can a coroutine be cancelled while it blocks its
    # event loop (handle_async calls the blocking handle(), whose time.sleep(3600)
    # does): only the supervisor can end either.
    queue.push({"n": 99, "hang": True})
    push_numbered(queue, 5)
    pool = start(started, redis_url, tasks, handler, "--timeout", "0.3", "--lease", "1")
    wait_for(30, "every message handled", lambda: len({n for n, _, _ in handled(tasks)}) == 6 and drained(queue))
    out, err = finish(pool, tasks)
    assert pool.returncode == 0, err
    summary = json.loads(out)
    assert (summary["processes"], summary["killed_hung"], summary["restarts"]) == (1, 1, 1), summary
    assert "its handler ran past the 0.3 s timeout and was killed" in err
    attempts = [attempt for n, attempt, _ in handled(tasks) if n == 99]
    if handler == "tasks:handle":
        assert attempts == [2]
    else:
        # Killed 2 s after its timeout (a coroutine is given the time to be cancelled
        # first): with a 1 s lease, which the pool stops extending at the timeout, the
        # blocked process may have claimed it once more before it was killed.
        assert len(attempts) == 1 and attempts[0] >= 2, attempts


def test_a_coroutine_that_blocks_the_event_loop_is_the_one_failed_at_the_timeout(
    queue: delayq.DelayQueue, redis_url: str, tasks: Path, started: list[subprocess.Popen[str]]
) -> None:
    # The oldest running coroutine awaits; the next one blocks the loop under it. The
    # blocker's message fails at the timeout; the other one goes back at once,
    # uncounted (the 60 s lease would otherwise hold both up).
    waiting = queue.push({"n": 1, "wait": 0.5})
    time.sleep(0.01)
    blocking = queue.push({"n": 2, "hang": True})
    pool = start(started, redis_url, tasks, "tasks:wait_then_handle", "--concurrency", "2", "--timeout", "1",
                 "--lease", "60")
    wait_for(30, "both handled", lambda: {n for n, _, _ in handled(tasks)} == {1, 2} and drained(queue))
    out, err = finish(pool, tasks)
    assert pool.returncode == 0, err
    summary = json.loads(out)
    assert (summary["killed_hung"], summary["failed"], summary["acked"]) == (1, 1, 2), summary
    attempts = {n: attempt for n, attempt, _ in handled(tasks)}
    assert attempts == {1: 1, 2: 2}, (attempts, waiting, blocking)
    assert "its handler ran past the 1 s timeout and was killed (it blocked the other handlers of the process, " \
        "whose messages went back to the queue); its message is due again at once" in err, err


@pytest.mark.parametrize("how", [["tasks:handle"], ["tasks:handle_async"], ["tasks:handle", "--processes", "2"]])
def test_a_second_stop_signal_stops_at_once_and_gives_the_running_message_back(
    queue: delayq.DelayQueue, redis_url: str, tasks: Path, started: list[subprocess.Popen[str]], how: list[str]
) -> None:
    held = queue.push({"n": 1, "hold": True})
    later = queue.push({"n": 2})
    # A long lease: what comes back at once was released, not left to expire.
    pool = start(started, redis_url, tasks, *how, "--lease", "60", "--batch", "10", "--log-level", "info")
    wait_for(30, "the handler running", lambda: (tasks / "handled.log.holding").exists())
    pool.send_signal(signal.SIGTERM)
    time.sleep(1)
    assert pool.poll() is None, "a first signal waits for the running handler"
    pool.send_signal(signal.SIGTERM)
    out, _ = pool.communicate(timeout=30)
    err = (tasks / "stderr.log").read_text()
    assert "SIGTERM again: stopping now" in err, err
    if "--processes" in how:
        # The supervisor's summary keeps the counts of the process that ended at once:
        # the held message was handed to its handler and released.
        summary = json.loads(out)
        assert summary["handled"] == len(handled(tasks)) + 1, summary
        assert summary["released"] >= 1, summary
    # The other one may have run before the signals (and gone: nothing is kept).
    states = {info["state"] for info in (queue.get(held), queue.get(later)) if info is not None}
    assert queue.get(held) is not None and states == {"ready"}, states
    assert queue.stats()["inflight"] == 0, "released at once, not after the lease"
    assert 1 not in {n for n, _, _ in handled(tasks)}


def test_a_handler_that_calls_sys_exit_stops_the_pool_and_its_message_ends_in_the_dead_letters(
    queue: delayq.DelayQueue, redis_url: str, tasks: Path
) -> None:
    # Issue 28 (a): with processes as with one, sys.exit() in a handler stops the whole
    # pool; its message is due again at once, counted, so it ends in the dead letters.
    exiting = queue.push({"n": 99, "exit_always": True})
    for n in range(1, 5):
        queue.push({"n": n})
    options = ("--processes", "2", "--max-attempts", "2", "--stop-when-empty", "--lease", "60")
    info: Any = None
    for _ in range(3):
        done = run(redis_url, tasks, "tasks:handle", *options)
        assert done.returncode == 0, done.stderr
        summary = json.loads(done.stdout)
        assert (summary["stopped_by"], summary["restarts"]) == ("exit", 0), summary
        assert summary["failed"] >= 1, summary
        info = queue.get(exiting)
        # The other process may take it too before it is told to stop (and exit too).
        assert info["state"] in ("ready", "dead"), "due again at once, not after the 60 s lease"
        if info["state"] == "ready":
            assert info["attempts"] == 1, info
        assert "SystemExit: 3" in info["last_error"], info
        if info["state"] == "dead":
            break
    assert (info["state"], info["attempts"]) == ("dead", 2), info
    assert "gave up after 2 attempts" in info["last_error"]
    done = run(redis_url, tasks, "tasks:handle", *options)
    assert json.loads(done.stdout)["stopped_by"] == "empty", done.stderr
    assert sorted(n for n, _, _ in handled(tasks)) == [1, 2, 3, 4]
    stats = queue.stats()
    assert (stats["dead"], stats["ready"], stats["inflight"]) == (1, 0, 0), stats


def test_a_child_forked_by_a_supervised_handler_ends_and_leaves_the_hung_handler_clock_alone(
    queue: delayq.DelayQueue, redis_url: str, tasks: Path, started: list[subprocess.Popen[str]]
) -> None:
    # The parent of the first child hangs after its child returned: only the clock the
    # supervisor reads finds it, and a child that cleared it would hide the hang.
    queue.push({"n": 99, "hang": True, "child": "return"})
    push_numbered(queue, 4, child="exit")
    pool = start(started, redis_url, tasks, "tasks:fork_then_handle", "--timeout", "0.5", "--lease", "5")
    wait_for(30, "every message handled", lambda: len({n for n, _, _ in handled(tasks)}) == 5 and drained(queue))
    out, err = finish(pool, tasks)
    assert pool.returncode == 0, err
    summary = json.loads(out)
    assert (summary["killed_hung"], summary["acked"]) == (1, 5), summary
    children = sorted(json.loads(line) for line in (tasks / "handled.log.children").read_text().splitlines())
    assert children == [[0, 7], [1, 7], [2, 7], [3, 7], [99, 0], [99, 0]], "each child ended by itself"
    assert "panic" not in err, err


def test_a_handler_that_calls_sys_exit_in_one_process_counts_the_attempt(
    queue: delayq.DelayQueue, redis_url: str, tasks: Path
) -> None:
    exiting = queue.push({"n": 99, "exit_always": True})
    done = run(redis_url, tasks, "tasks:handle", "--lease", "60")
    assert done.returncode == 3, done.stderr
    info = queue.get(exiting)
    assert (info["state"], info["attempts"]) == ("ready", 1), info


def test_a_handler_killed_at_its_timeout_fails_its_message_at_once_and_keeps_the_counts(
    queue: delayq.DelayQueue, redis_url: str, tasks: Path
) -> None:
    # Issue 28 (d). Hangs on every attempt: killed twice, then dead; hangs once: acked
    # on its second. A lease far past the run's patience: what comes back in time was
    # failed by the supervisor, not left to expire; stop_when_empty must wait for it.
    always = queue.push({"n": 0, "hang_always": True})
    once = queue.push({"n": 1, "hang": True})
    for n in range(2, 5):
        queue.push({"n": n})
    done = run(redis_url, tasks, "tasks:handle", "--processes", "2", "--timeout", "1", "--lease", "60",
               "--max-attempts", "2", "--stop-when-empty", "--backoff-base", "30", "--log-level", "info")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert (summary["stopped_by"], summary["killed_hung"]) == ("empty", 3), summary
    counts = {k: summary[k] for k in ("handled", "acked", "failed", "retried", "dead")}
    assert counts == {"handled": 7, "acked": 4, "failed": 3, "retried": 2, "dead": 1}, \
        "the killed processes' counts are in the summary"
    info = queue.get(always)
    assert (info["state"], info["attempts"], info["last_error"]) == (
        "dead", 2, "handler exceeded its 1 s timeout; process killed (gave up after 2 attempts)")
    assert queue.get(once) is None
    assert [(n, attempt) for n, attempt, _ in handled(tasks) if n == 1] == [(1, 2)], "ran again at once"
    assert sorted(n for n, _, _ in handled(tasks)) == [1, 2, 3, 4]
    assert done.stderr.count("its handler ran past the 1 s timeout and was killed") == 3, done.stderr


def test_the_timeout_error_and_the_attempts_agree(queue: delayq.DelayQueue, redis_url: str, tasks: Path) -> None:
    hung = queue.push({"n": 0, "hang_always": True})
    done = run(redis_url, tasks, "tasks:handle", "--processes", "2", "--timeout", "2", "--lease", "60",
               "--max-attempts", "1", "--stop-when-empty")
    assert done.returncode == 0, done.stderr
    info = queue.get(hung)
    assert (info["state"], info["attempts"], info["last_error"]) == (
        "dead", 1, "handler exceeded its 2 s timeout; process killed")
    summary = json.loads(done.stdout)
    assert [summary[k] for k in ("stopped_by", "killed_hung", "handled", "failed", "dead")] == ["empty", 1, 1, 1, 1]


def test_a_process_tells_its_supervisor_which_message_its_handler_holds(queue: delayq.DelayQueue) -> None:
    # What the supervisor reads to keep a busy process when it balances, to find a hung
    # one, and to fail the message of one it killed.
    table = _SlotTable(2)
    seen: list[dict[str, Any]] = []

    def handle(payload: Any, msg: delayq.Message) -> None:
        seen.append({**table.view(1), "id": msg.id, "attempt": msg.attempt})

    async def handle_async(payload: Any, msg: delayq.Message) -> None:
        handle(payload, msg)
        await asyncio.sleep(0.05)

    for handler, concurrency in ((handle, 1), (handle_async, 1), (handle_async, 3)):
        seen.clear()
        push_numbered(queue, 6)
        worker = delayq.Worker(queue, stop_when_empty=True, concurrency=concurrency)
        summary = _command.run_one(worker, handler, _Slot(table.path, 1))
        assert summary["acked"] == 6
        assert len(seen) == 6 and all(v["busy"] for v in seen), seen
        if concurrency == 1:
            assert all(v["held_id"] == v["id"] and v["held_attempt"] == v["attempt"] for v in seen), seen
        view = table.view(1)
        assert not view["busy"], "idle again once the last one ended"
        assert view["handled"] == 6, "the run's counts are published"
        assert table.view(0)["starts"] == 0, "the other slot untouched"


@pytest.mark.parametrize("timeout", [0.3, 30.0])
def test_the_loop_watch_names_a_blocker_past_its_timeout_else_the_oldest(
    queue: delayq.DelayQueue, timeout: float
) -> None:
    # A handler blocks the event loop. Past its own timeout it is the one named (its
    # message fails at the kill); younger, the oldest running handler is, which the
    # supervisor times. Either way the slot says the others may go back at once, and
    # once the loop runs again it names the oldest, in the same busy period.
    table = _SlotTable(1)
    slot = _Slot(table.path, 0)
    oldest_id, blocker_id = queue.push({"n": 1}), queue.push({"n": 2})
    consumer = delayq.Worker(queue)._worker.start(2)
    got = {d.message.id: d for d in (consumer.recv(5.0), consumer.recv(5.0)) if d is not None}
    assert set(got) == {oldest_id, blocker_id}
    oldest, blocker = got[oldest_id], got[blocker_id]
    seen: dict[str, Any] = {}

    async def run() -> None:
        loop = asyncio.get_running_loop()
        slot.started(oldest, 0.0)
        watch = delayq._LoopWatch(loop, slot, timeout, lambda: oldest)

        async def blocking_handler() -> None:
            time.sleep(1.5)
            seen["while"] = table.view(0)

        # Registered before its first step runs, as _bounded does; started 1 s ago.
        task = loop.create_task(blocking_handler())
        watch.handlers[task] = (blocker, time.monotonic() - 1.0)
        await task
        await asyncio.sleep(0.3)
        seen["after"] = table.view(0)
        watch.close()

    asyncio.run(run())
    named = blocker_id if timeout < 1.0 else oldest_id
    assert (seen["while"]["held_id"], seen["while"]["blocking"]) == (named, True), seen
    assert (seen["after"]["held_id"], seen["after"]["blocking"]) == (oldest_id, False), seen
    assert seen["after"]["starts"] == seen["while"]["starts"] == 1, "one busy period throughout"
    for d in (oldest, blocker):
        consumer.release(d)
    consumer.stop()
    consumer.finish(None)


def test_keep_completed_lets_the_commands_show_what_ran(
    queue: delayq.DelayQueue, redis_url: str, tasks: Path
) -> None:
    push_numbered(queue, 5)
    done = run(redis_url, tasks, "tasks:handle", "--processes", "2", "--stop-when-empty", "--keep-completed", "3")
    assert done.returncode == 0, done.stderr
    assert queue.stats()["completed"] == 3
    listed = subprocess.run([*command(redis_url)[:-1], "completed"], capture_output=True, text=True, check=True)
    kept = json.loads(listed.stdout)
    assert len(kept) == 3 and all(m["state"] == "completed" and m["attempts"] == 1 for m in kept)
    shown = subprocess.run([*command(redis_url)[:-2], "get", kept[0]["id"]], capture_output=True, text=True,
                           check=True)
    assert "state:        completed" in shown.stdout and "completed at: 20" in shown.stdout, shown.stdout


@pytest.mark.parametrize("processes", ["1", "2"])
def test_what_handlers_print_goes_to_stderr_and_leaves_the_json_summary_whole(
    queue: delayq.DelayQueue, redis_url: str, tasks: Path, processes: str
) -> None:
    (tasks / "tasks.py").write_text('print("imported")\n' + TASKS)
    push_numbered(queue, 20)
    done = run(redis_url, tasks, "tasks:chatty", "--processes", processes, "--stop-when-empty")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["acked"] == 20
    assert done.stderr.count("closing order") == 20 and "imported" in done.stderr


def test_a_child_the_handler_leaves_running_does_not_hold_the_supervisor_up(
    queue: delayq.DelayQueue, redis_url: str, tasks: Path
) -> None:
    # Each process is recycled after one message while the child it forked lives on:
    # a supervisor that read a report to its end would wait for each child (30 s).
    push_numbered(queue, 4)
    try:
        done = run(redis_url, tasks, "tasks:fork_sleeper_then_handle", "--processes", "2", "--max-jobs", "1",
                   "--stop-when-empty")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["stopped_by"] == "empty", done.stdout
        assert sorted(n for n, _, _ in handled(tasks)) == [0, 1, 2, 3]
    finally:
        sleepers = tasks / "handled.log.sleepers"
        for pid in sleepers.read_text().split() if sleepers.exists() else []:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_an_on_start_that_fails_stops_a_supervised_pool_at_once(
    queue: delayq.DelayQueue, redis_url: str, tasks: Path
) -> None:
    # As PHP's does: not a process that dies at its start and is started again.
    done = run(redis_url, tasks, "tasks:handle", "--processes", "2", "--on-start", "tasks:fail_start")
    assert done.returncode == 3, done.stderr
    assert "on_start failed: RuntimeError('no database')" in done.stderr, done.stderr
    assert "starting another" not in done.stderr, done.stderr


def test_a_cancel_with_kill_ends_the_process_whose_handler_ignores_it(
    queue: delayq.DelayQueue, redis_url: str, tasks: Path, started: list[subprocess.Popen[str]]
) -> None:
    queue.push({"n": 0, "hold": True}, id="held")
    pool = start(started, redis_url, tasks, "tasks:handle", "--processes", "2", "--lease", "0.6",
                 "--log-level", "info")
    wait_for(30, "a handler holding it", lambda: (tasks / "handled.log.holding").exists())
    assert queue.cancel("held", kill=True)
    wait_for(10, "the message deleted as cancelled", lambda: queue.stats()["cancelled"] == 1 and drained(queue))
    queue.push({"n": 1})
    wait_for(30, "the next message handled", lambda: len(handled(tasks)) == 1)
    out, err = finish(pool, tasks)
    assert pool.returncode == 0, err
    assert "killed, as asked by a cancel with kill" in err, err
    summary = json.loads(out)
    assert summary["killed_hung"] == 0 and summary["restarts"] >= 1, summary
    stats = queue.stats()
    assert (stats["cancelled"], stats["retried"], stats["died"]) == (1, 0, 0), stats


def test_a_handler_that_stops_at_a_cancel_with_kill_before_the_kill_costs_the_pool_nothing(
    queue: delayq.DelayQueue, redis_url: str, tasks: Path, started: list[subprocess.Popen[str]]
) -> None:
    # Its process stopped its pool to be killed; the handler returned first, so no kill
    # came: the supervisor starts another process as after a kill, not as after a death
    # it cannot explain (whose backoff, repeated, gives the pool up).
    pool = start(started, redis_url, tasks, "tasks:handle", "--processes", "2", "--lease", "0.6",
                 "--log-level", "info")
    for n in range(5):
        queue.push({"n": n, "until_cancelled": True}, id=f"c{n}")
        wait_for(30, f"the handler of c{n}", lambda: (tasks / f"handled.log.holding.{n}").exists())
        assert queue.cancel(f"c{n}", kill=True)
        wait_for(10, f"c{n} deleted as cancelled", lambda: queue.stats()["cancelled"] == n + 1)
    queue.push({"n": 99})
    wait_for(30, "the next message handled", lambda: len(handled(tasks)) == 1)
    out, err = finish(pool, tasks)
    assert pool.returncode == 0, err
    assert "without a reason" not in err, err
    stats = queue.stats()
    assert (stats["cancelled"], stats["acked"], stats["retried"], stats["died"]) == (5, 1, 0, 0), stats


def test_a_cancel_with_kill_of_a_coroutine_is_a_plain_cancel(
    queue: delayq.DelayQueue, redis_url: str, tasks: Path, started: list[subprocess.Popen[str]]
) -> None:
    # One supervised process runs both coroutines: a kill for the older one's cancel
    # would end the other with it.
    pool = start(started, redis_url, tasks, "tasks:hold_async", "--processes", "1", "--timeout", "60",
                 "--lease", "0.6", "--log-level", "info")
    holding = tasks / "handled.log.holding"
    queue.push({"n": 0}, id="a0")
    wait_for(30, "a0 running", lambda: holding.exists() and holding.read_text().split() == ["0"])
    queue.push({"n": 1}, id="a1")
    wait_for(30, "a1 running beside it", lambda: holding.read_text().split() == ["0", "1"])
    assert queue.cancel("a0", kill=True)
    wait_for(10, "a0 deleted as cancelled", lambda: queue.stats()["cancelled"] == 1)
    time.sleep(0.5)  # what a kill would take, and a lease more for a1 to come back
    assert queue.get("a1")["state"] == "inflight"  # type: ignore[index]
    assert queue.cancel("a1")
    wait_for(10, "a1 deleted as cancelled", lambda: queue.stats()["cancelled"] == 2)
    out, err = finish(pool, tasks)
    assert pool.returncode == 0, err
    assert "killed" not in err, err
    assert holding.read_text().split() == ["0", "1"], "each ran once"
    summary = json.loads(out)
    assert (summary["restarts"], summary["cancelled"]) == (0, 2), summary
