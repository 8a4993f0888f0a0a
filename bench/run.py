"""Side-by-side benchmark: delayq (PHP extension) against the seed recipe (PHP +
phpredis, as ../shared/seeds describes it), on one private redis-server.

Redis runs pinned to CPU 0 and every client to CPU 1 (taskset): on a 2-core machine
round-trip cost changes about 3x with placement, so only pinned ratios mean anything.
Each figure is measured 3 times and reported as median and range. Every consumer run is
checked from per-message records (lost and duplicated messages); a run that loses a
message is marked VOID. Writes bench/results/<date>.md and prints it.

    python3 bench/run.py [--quick] [--only=drain,...] [--systems=seed,delayq,...]

--only runs some workloads (push, ceiling, drain, lateness, idle, crash, memory) and
--systems some systems, for a side-by-side run of one change; the result is written
to bench/results/<date>-<workloads>.md instead.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import glob
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TypeVar

V = TypeVar("V")

ROOT = Path(__file__).resolve().parent.parent
PHP_DIR = ROOT / "bench" / "php"
PY_BENCH = ROOT / "bench" / "python" / "bench.py"
ARQ_BENCH = ROOT / "bench" / "python" / "arq_bench.py"
NODE_DIR = ROOT / "bench" / "node"
SYSTEMS = ["seed", "delayq", "python"]
# Other queues users run today, on the workloads they have an equivalent for.
OTHERS = ["bullmq", "arq", "laravel"]
LABEL = {"seed": "seed recipe (PHP + phpredis)", "delayq": "delayq (PHP extension)", "python": "delayq (Python module)",
         "rust": "delayq (Rust core)", "bullmq": "BullMQ (Node.js)", "arq": "arq (Python asyncio)",
         "laravel": "Laravel queue (PHP, Redis driver)"}
# Slow systems drain fewer messages, so that a run ends in minutes.
DRAIN_N = {"arq": 20000, "bullmq": 50000, "laravel": 50000}


def server_version(root: str | None = None) -> str:
    """The version of redis-server on PATH, or of the system in the chroot `root`."""
    cmd = ["chroot", root, "redis-server", "--version"] if root else ["redis-server", "--version"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return next(w[2:] for w in out.split() if w.startswith("v="))


def benchmark_rate(port: int, test: str, n: int, pipeline: int = 1, cpus: str = "1") -> float:
    """Requests a second of `redis-benchmark -c 1 -t <test>`, pinned as every client."""
    out = subprocess.run(
        ["taskset", "-c", cpus, "redis-benchmark", "-p", str(port), "-c", "1",
         "-n", str(n), "-P", str(pipeline), "-t", test, "--csv"],
        capture_output=True, text=True, check=True).stdout
    line = [row for row in out.splitlines() if row.startswith('"') and not row.startswith('"test"')][0]
    return float(line.split(",")[1].strip('"'))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Redis:
    """A private redis-server pinned to CPU 0; `extra` are more redis-server arguments.
    `launcher` runs it (a profiler, a chroot), `server_dir` is its --dir as it sees it
    (a chroot has its own /tmp), and it has `start_s` seconds to answer."""

    def __init__(self, *extra: str, launcher: Iterable[str] = (), server_dir: str | None = None,
                 start_s: float = 4.0) -> None:
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="delayq-bench-")
        self.proc = subprocess.Popen(
            ["taskset", "-c", "0", *launcher, "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", server_dir or self.dir, *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + start_s
        while time.monotonic() < deadline:
            if self.cli("PING") == "PONG":
                return
            time.sleep(0.02)
        raise RuntimeError("redis-server did not start")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def cli(self, *args: str) -> str:
        return subprocess.run(["redis-cli", "-p", str(self.port), *args], capture_output=True, text=True).stdout.strip()

    def used_memory(self) -> int:
        for line in self.cli("INFO", "memory").splitlines():
            if line.startswith("used_memory:"):
                return int(line.split(":")[1])
        return 0

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class CallgrindRedis(Redis):
    """Redis under callgrind; `instructions()` reads and zeroes its count. With `root`,
    the redis-server and valgrind of the system in that chroot (which must have
    valgrind installed), in its own /tmp."""

    def __init__(self, root: str | None = None) -> None:
        root = os.path.realpath(root) if root else None
        # Valgrind reads /proc/self: a chroot gets it for as long as this Redis runs.
        self.proc_mount = f"{root}/proc" if root and not os.path.ismount(f"{root}/proc") else None
        if self.proc_mount:
            subprocess.run(["mount", "-t", "proc", "proc", self.proc_mount], check=True)
        self.out = ""
        try:
            out_dir = tempfile.mkdtemp(prefix="delayq-callgrind-", dir=f"{root}/tmp" if root else None)
            self.out = f"{out_dir}/callgrind.out"
            inside = self.out.removeprefix(root) if root else self.out
            self.enter = ["chroot", root] if root else []
            super().__init__(launcher=[*self.enter, "valgrind", "--tool=callgrind", f"--callgrind-out-file={inside}"],
                             server_dir="/tmp" if root else None, start_s=30)
        except BaseException:
            # Nobody will stop a Redis that did not start: what was made for it goes now.
            if hasattr(self, "proc"):
                Redis.stop(self)
            self.release()
            raise

    def release(self) -> None:
        if self.out:
            shutil.rmtree(Path(self.out).parent, ignore_errors=True)
        if self.proc_mount:
            subprocess.run(["umount", self.proc_mount], check=True)

    def stop(self) -> None:
        super().stop()
        self.release()

    def instructions(self) -> int:
        """Instructions since the last call (a dump zeroes callgrind's counters)."""
        for old in glob.glob(self.out + "*"):
            os.unlink(old)
        subprocess.run([*self.enter, "callgrind_control", "--dump", str(self.proc.pid)], check=True,
                       capture_output=True)
        dumps = glob.glob(self.out + ".*")
        if not dumps:
            raise RuntimeError("callgrind wrote no dump")
        for line in Path(dumps[0]).read_text().splitlines():
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
        raise RuntimeError(f"{dumps[0]}: no totals")


LOGS = Path(tempfile.gettempdir()) / "delayq-bench-logs"


def client(cmd: list[str], background: bool = False) -> Any:
    """Run a benchmark client pinned to CPU 1: its stdout, or the process if `background`."""
    cmd = ["taskset", "-c", "1", *cmd]
    if background:
        # To a file, not a pipe: nobody reads a background client's output while it runs,
        # and a full pipe would stop the client at its next log line.
        LOGS.mkdir(exist_ok=True)
        with open(LOGS / f"client-{time.time_ns()}.log", "w") as log:
            return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[3:])}: {out.stderr or out.stdout}")
    return out.stdout


def php(script: str, *args: str, background: bool = False) -> Any:
    cmd = ["php"]
    if os.environ.get("DELAYQ_EXTENSION"):
        cmd += ["-d", f"extension={os.environ['DELAYQ_EXTENSION']}"]
    return client([*cmd, str(PHP_DIR / script), *args], background)


def python(*args: str, background: bool = False) -> Any:
    return client([sys.executable, str(PY_BENCH), *args], background)


def other(system: str, *args: str, background: bool = False) -> Any:
    if system == "bullmq":
        return client(["node", str(NODE_DIR / "bullmq.mjs"), *args], background)
    if system == "laravel":
        return php("laravel.php", *args, background=background)
    return client([sys.executable, str(ARQ_BENCH), *args], background)


def install_others() -> None:
    """BullMQ from npm, arq from PyPI and Laravel from Debian, on first use (they are not
    delayq's dependencies)."""
    if not Path("/usr/share/php/Illuminate/autoload.php").exists():
        subprocess.run(["apt-get", "install", "-y", "-q", "php-laravel-framework"], check=True,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    if not (NODE_DIR / "node_modules" / "bullmq").exists():
        subprocess.run(["npm", "install", "--silent", "--no-audit", "--no-fund"], cwd=NODE_DIR, check=True)
    try:
        import arq  # noqa: F401
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "arq"], check=True)


def fill(system: str, *args: str) -> None:
    if system in OTHERS:
        other(system, "fill", *args)
        return
    # delayq's queues are the same from every language: PHP fills them for Python too.
    php("fill.php", f"--system={'seed' if system == 'seed' else 'delayq'}", *args)


def read_records(records: Path) -> list[tuple[int, float]]:
    rows = []
    for f in records.iterdir():
        for line in f.read_text().splitlines():
            if line.strip():
                n, at = line.split()
                rows.append((int(n), float(at)))
    return rows


def verify(rows: list[tuple[int, float]], n: int) -> tuple[int, int]:
    seen = [r[0] for r in rows]
    distinct = set(seen)
    return n - len(distinct & set(range(n))), len(seen) - len(distinct)


def consume(redis: Redis, system: str, records: Path, until_empty: bool = True, *extra: str) -> subprocess.Popen[str]:
    args = [f"--url={redis.url}", f"--records={records}", *extra]
    if until_empty:
        args.append("--until-empty")
    if system == "python":
        return python("consume", *args, background=True)
    if system in OTHERS:
        return other(system, "consume", *args, background=True)
    return php("consume.php", f"--system={system}", *args, background=True)


def write_results(name: str, text: str) -> Path:
    """Saves a bench's report as bench/results/<today><name>.md and prints it."""
    out = ROOT / "bench" / "results" / f"{datetime.date.today().isoformat()}{name}.md"
    out.write_text(text)
    print(text)
    print(f"written to {out}")
    return out


def in_turns(variants: Iterable[V], measure: Callable[[V], dict[str, float]], runs: int,
             name: Callable[[V], str] = str) -> dict[V, list[dict[str, float]]]:
    """`runs` measurements of each variant, taken in turns so that every variant sees
    the machine in the same moods; printed as they come."""
    results: dict[V, list[dict[str, float]]] = {v: [] for v in variants}
    for _ in range(runs):
        for variant, found in results.items():
            m = measure(variant)
            print(f"{name(variant)}: {m}", flush=True)
            found.append(m)
    return results


def builds_given(parser: Any, given: list[str]) -> dict[str, str]:
    """The LABEL=PATH arguments of a side-by-side run of builds: label -> absolute path,
    each file present and each label once (else the parser's error)."""
    builds: dict[str, str] = {}
    for word in given:
        label, _, path = word.partition("=")
        if not (label and path):
            parser.error(f"{word!r}: a build is LABEL=PATH")
        if label in builds:
            parser.error(f"{label}: given twice")
        if not Path(path).is_file():
            parser.error(f"{label}: no file {path}")
        builds[label] = str(Path(path).resolve())
    return builds


def rate_rows(runs: dict[str, list[dict[str, float]]]) -> list[str]:
    """A side-by-side run's table: each build's messages/s and its ratio to the first's."""
    first = statistics.median(r["rate"] for r in next(iter(runs.values())))
    lines = ["| build | messages/s | vs the first |", "|---|---|---|"]
    for label, found in runs.items():
        rates = [r["rate"] for r in found]
        lines.append(f"| {label} | {cell(rates, ',.0f')} | {statistics.median(rates) / first:.2f}x |")
    return lines


def cell(values: list[float], fmt: str) -> str:
    """The median of the runs, their range in brackets."""
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}} .. {max(values):{fmt}})"


def med(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


@contextlib.contextmanager
def filled(bench: "Bench", system: str, n: int) -> Iterator[Path]:
    """A fresh Redis with N due messages for `system`; yields an empty records folder."""
    bench.fresh()
    with tempfile.TemporaryDirectory() as tmp:
        fill(system, f"--n={n}", f"--url={bench.redis.url}", f"--due-file={tmp}/due")
        records = Path(tmp) / "records"
        records.mkdir()
        yield records


class Bench:
    def __init__(self, quick: bool) -> None:
        self.quick = quick
        self.rows: list[dict[str, Any]] = []
        self.redis = Redis()
        # W3: every message's lateness in ms, all runs, per system (for the plot).
        self.late: dict[str, list[float]] = {}

    def fresh(self) -> None:
        self.redis.cli("FLUSHALL")

    def record(self, workload: str, system: str, unit: str, values: list[float], note: str = "",
               higher_is_better: bool = True) -> None:
        m, lo, hi = med(values)
        self.rows.append({"workload": workload, "system": system, "unit": unit, "median": m, "lo": lo, "hi": hi,
                          "note": note, "higher": higher_is_better})
        print(f"{workload:10} {system:8} {m:12.1f} {unit} [{lo:.1f} .. {hi:.1f}] {note}", flush=True)

    def repeat(self, fn: Callable[[], float]) -> list[float]:
        return [fn() for _ in range(3)]

    def push(self) -> None:
        n = 5000 if self.quick else 20000
        for mode, label in (("single", "W1 push"), ("bulk", "W1b bulk")):
            # arq and Laravel have no delayed bulk enqueue.
            for system in SYSTEMS + (OTHERS if mode == "single" else [s for s in OTHERS if s == "bullmq"]):
                def once() -> float:
                    self.fresh()
                    if system in OTHERS:
                        out = json.loads(other(system, "push", f"--mode={mode}", f"--n={n}", f"--url={self.redis.url}"))
                    elif system == "python":
                        out = json.loads(python("push", f"--mode={mode}", f"--n={n}", f"--url={self.redis.url}"))
                    else:
                        out = json.loads(php("push.php", f"--system={system}", f"--mode={mode}", f"--n={n}",
                                             f"--url={self.redis.url}"))
                    assert out["stored"] == n, out
                    return float(out["rate"])
                self.record(label, system, "msg/s", self.repeat(once))

    def ceiling(self) -> None:
        n = 20000
        for pipeline, label in ((1, "ceiling 1 client"), (50, "ceiling -P 50")):
            for test in ("zadd", "hset"):
                values = [benchmark_rate(self.redis.port, test, n, pipeline) for _ in range(3)]
                self.record(label, test.upper(), "req/s", values)

    def drain(self) -> None:
        for system in SYSTEMS + OTHERS:
            n = 20000 if self.quick else DRAIN_N.get(system, 200000)

            def once() -> float:
                with filled(self, system, n) as records:
                    start = time.time()
                    proc = consume(self.redis, system, records)
                    proc.wait(timeout=600)
                    rows = read_records(records)
                    lost, dups = verify(rows, n)
                    if lost:
                        print(f"VOID: {system} drain lost {lost} messages", flush=True)
                        return float("nan")
                    # Until the last message was handled: stop detection is not drain time.
                    return n / (max(at for _, at in rows) - start)
            workers = {"bullmq": "1 process, concurrency 4"}.get(system, "4 processes")
            self.record("W2 drain", system, "msg/s", self.repeat(once), f"N={n}, {workers}, verified")

        # The core alone (no PHP): tells the Redis-side cost from the binding's.
        subprocess.run(["cargo", "build", "-q", "--release", "-p", "delayq", "--example", "drain"], cwd=ROOT, check=True)
        binary = ROOT / "target" / "release" / "examples" / "drain"

        n = 20000 if self.quick else 200000

        def rust_once() -> float:
            self.fresh()
            out = subprocess.run(["taskset", "-c", "1", str(binary), self.redis.url, str(n)], capture_output=True,
                                 text=True, check=True).stdout
            result = json.loads(out)
            if result["acked"] != n or result["left"] != 0:
                print(f"VOID: rust drain {result}", flush=True)
                return float("nan")
            return float(result["rate"])
        self.record("W2 drain", "rust", "msg/s", self.repeat(rust_once), f"N={n}, 4 threads, summary-verified")

    def lateness(self) -> None:
        n, spread = 2000, 10.0
        if self.quick:
            spread = 3.0
        for system in SYSTEMS + OTHERS:
            p99s, earliest = [], []
            for _ in range(3):
                self.fresh()
                with tempfile.TemporaryDirectory() as tmp:
                    records = Path(tmp) / "records"
                    records.mkdir()
                    proc = consume(self.redis, system, records)
                    time.sleep(1.0)  # the consumers are up and idle
                    fill(system, f"--n={n}", f"--url={self.redis.url}", f"--spread={spread}",
                         f"--due-file={tmp}/due")
                    proc.wait(timeout=120)
                    due = dict(read_records_file(Path(tmp) / "due"))
                    rows = read_records(records)
                    lost, dups = verify(rows, n)
                    if lost:
                        print(f"VOID: {system} lateness lost {lost}", flush=True)
                        continue
                    late = sorted((at - due[i]) * 1000 for i, at in rows)
                    self.late.setdefault(system, []).extend(late)
                    p99s.append(late[int(len(late) * 0.99) - 1])
                    earliest.append(late[0])
            self.record("W3 p99", system, "ms late", p99s, f"{n} msgs over 0-{spread:g} s", higher_is_better=False)
            self.record("W3 earliest", system, "ms", earliest, "negative = early", higher_is_better=False)

    def idle(self) -> None:
        window = 3.0 if self.quick else 10.0
        for system in SYSTEMS:
            values = []
            for _ in range(3):
                self.fresh()
                with tempfile.TemporaryDirectory() as tmp:
                    records = Path(tmp) / "records"
                    records.mkdir()
                    proc = consume(self.redis, system, records, until_empty=False)
                    time.sleep(2.0)
                    # Client commands only: MONITOR marks those a Lua script runs "[n lua]".
                    # To a file: a pipe would fill with the recipe's long EVAL lines and stall.
                    with open(Path(tmp) / "monitor", "w") as sink:
                        mon = subprocess.Popen(["redis-cli", "-p", str(self.redis.port), "monitor"], stdout=sink)
                        time.sleep(window)
                        mon.terminate()
                        mon.wait()
                    out = (Path(tmp) / "monitor").read_text()
                    sent = [ln for ln in out.splitlines() if ln[:1].isdigit() and " lua]" not in ln]
                    values.append(len(sent) / window / 4)
                    proc.terminate()
                    proc.wait(timeout=60)
            self.record("W5 idle", system, "cmd/s per worker", values, f"4 idle workers, {window:g} s",
                        higher_is_better=False)

    def crash(self) -> None:
        """W4: kill -9 of one of the 4 worker processes 1 s into a drain with a 1 ms handler."""
        n = 4000 if self.quick else 20000
        for system in SYSTEMS:
            lost_runs, dup_runs = [], []
            for _ in range(3):
                with filled(self, system, n) as records:
                    # A 5 s lease: what the victim held comes back within the run.
                    proc = consume(self.redis, system, records, True, "--sleep-ms=1", "--lease=5")
                    time.sleep(1.0)
                    victims = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                             text=True).stdout.split()
                    if not victims:
                        raise RuntimeError(f"{system}: no worker process to kill")
                    os.kill(int(victims[0]), 9)
                    proc.wait(timeout=600)
                    lost, dups = verify(read_records(records), n)
                    lost_runs.append(float(lost))
                    dup_runs.append(float(dups))
            note = f"N={n}, 1 ms handler, 1 of 4 processes killed at 1 s"
            self.record("W4 lost", system, "messages", lost_runs, note, higher_is_better=False)
            self.record("W4 duplicates", system, "messages", dup_runs, note, higher_is_better=False)

    def memory(self) -> None:
        """W6: Redis memory per stored message; worker RSS before and after a long drain."""
        n = 50000 if self.quick else 200000
        for system in ("seed", "delayq"):
            def per_message() -> float:
                self.fresh()
                before = self.redis.used_memory()
                with tempfile.TemporaryDirectory() as tmp:
                    fill(system, f"--n={n}", f"--url={self.redis.url}", f"--due-file={tmp}/due")
                return (self.redis.used_memory() - before) / n
            self.record("W6 Redis memory", system, "bytes/message", self.repeat(per_message), f"{n:,} stored",
                        higher_is_better=False)
        big = 100000 if self.quick else 1000000
        for system in SYSTEMS:
            starts, growths = [], []
            for _ in range(3):
                with filled(self, system, big) as records:
                    proc = consume(self.redis, system, records, True, "--stream-records")
                    samples = []
                    while proc.poll() is None:
                        time.sleep(0.25)
                        samples.append(tree_rss_kib(proc.pid))
                    proc.wait()
                    lost, _ = verify(read_records(records), big)
                    if lost:
                        print(f"VOID: {system} memory run lost {lost}", flush=True)
                        continue
                    # Only samples with every process up: the first and the last one, before
                    # the pool winds down and processes exit.
                    full = max(c for c, _ in samples)
                    settled = [kib for c, kib in samples if c == full]
                    starts.append(settled[0] / 1024)
                    growths.append((settled[-1] - settled[0]) / 1024)
            note = f"sum over the worker processes, {big:,} messages drained"
            self.record("W6 worker RSS at start", system, "MiB", starts, note, higher_is_better=False)
            self.record("W6 worker RSS growth", system, "MiB", growths, note, higher_is_better=False)

    def plot_lateness(self, path: Path) -> None:
        """W3 as a picture: the share of messages handled by a given lateness."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(9, 5))
        for system, late in self.late.items():
            xs = sorted(late)
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            ax.step(xs, ys, where="post", label=LABEL.get(system, system))
        ax.set_xscale("symlog", linthresh=1.0)
        ax.axvline(0, color="black", linewidth=0.8)
        ax.axvline(5, color="grey", linestyle=":", linewidth=0.8)
        ax.set_xlabel("handled time - requested due time (ms; negative = early; symlog scale)")
        ax.set_ylabel("share of messages")
        ax.set_title("W3 lateness: 2 000 messages due over 10 s, 3 runs each (dotted: 5 ms)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="lower right")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)

    def report(self, args: list[str], plot: str | None) -> str:
        seed = {(r["workload"]): r["median"] for r in self.rows if r["system"] == "seed"}
        lines = [
            f"# delayq benchmark, {datetime.date.today().isoformat()}",
            "",
            f"Command: `python3 bench/run.py{' ' + ' '.join(args) if args else ''}` (Redis pinned to CPU 0,",
            "clients to CPU 1; median of 3 runs, range in brackets).",
            "",
            "| workload | system | median | range | vs seed recipe | notes |",
            "|---|---|---|---|---|---|",
        ]
        for r in self.rows:
            ratio = ""
            base = seed.get(r["workload"])
            if r["system"] != "seed" and base and r["unit"].endswith("/s") and r["workload"].startswith("W"):
                ratio = f"{r['median'] / base:.2f}x"
            lines.append(f"| {r['workload']} | {LABEL.get(r['system'], r['system'])} | {r['median']:,.1f} {r['unit']} "
                         f"| {r['lo']:,.1f} .. {r['hi']:,.1f} | {ratio} | {r['note']} |")
        lines += [
            "",
            "## How to read these numbers",
            "",
            "- W1: one call per message (the recipe needs HSET + ZADD, two round trips; delayq one).",
            "  W1b: batches (the recipe hand-pipelined by 50 HSET + ZADD pairs, delayq `pushMany` by 1000).",
            "- W2: 4 worker processes drain already-due messages with a no-op handler. The recipe's",
            "  pop deletes each payload before the handler runs, so a worker that dies loses what",
            "  it popped; delayq keeps each message under a lease until it is acknowledged. Time",
            "  runs to the last handled message; every message is checked handled exactly once.",
            "- W3: handled time minus requested due time. The recipe scores whole seconds",
            "  (`time() + delay`) and polls every 200 ms, so it runs messages up to a second",
            "  early and late; negative `earliest` means early."
            + (f" The whole distributions:\n  [{plot}]({plot}).\n\n![W3 lateness]({plot})" if plot else ""),
            "",
            "- W5: commands per second that each idle worker sends Redis (from MONITOR, not",
            "  counting the commands a Lua script runs).",
            "- Ceiling: `redis-benchmark` on the same pinned Redis, one client.",
            "- W2 \"Rust core\" runs the core alone (4 handler threads in one process), to separate",
            "  the Redis-side cost from the binding's.",
            "- W4: one of the 4 worker processes is killed with SIGKILL 1 s into a drain whose",
            "  handler takes 1 ms; each process appends a record as soon as it handled a",
            "  message, so a killed process keeps its records. \"lost\" counts messages that never",
            "  ran. The recipe loses the rest of the batch its killed process had popped; delayq",
            "  runs the killed process's deliveries again after their lease (5 s here), so a",
            "  message that ran just before the kill may run twice.",
            "- W6: Redis `used_memory` growth per stored message; worker RSS summed over the",
            "  consumer's processes at the first full sample and growth until the last.",
            "- \"delayq (Python module)\" drains with 4 processes of `delayq.Worker` (2 I/O threads",
            "  each), filled by the PHP script: the queues are the same from every language.",
            "- BullMQ (npm `bullmq`, Node.js 20): delayed jobs (`delay`, `addBulk` for W1b),",
            "  `removeOnComplete`; one Worker process with concurrency 4. arq (PyPI): jobs",
            "  deferred with `_defer_by`, 4 worker processes polling every 10 ms (`poll_delay`;",
            "  its default is 0.5 s), no bulk enqueue (no W1b). Both drain fewer messages (see",
            "  N in the notes) so that a run takes minutes; each run is verified the same way.",
            "- Laravel (Debian's `php-laravel-framework` 8.83, Illuminate\\Queue\\Capsule standalone,",
            "  phpredis): `later()` jobs of a `Class@method` handler; 4 forked processes running",
            "  Laravel's `Worker::runNextJob` loop with `sleep` 0.1 s (the CLI default is 3 s).",
            "  `later()` keeps whole seconds of the due time, so it can run early, like the recipe.",
            "  Laravel has no delayed bulk push (no W1b).",
        ]
        return "\n".join(lines) + "\n"


def tree_rss_kib(pid: int) -> tuple[int, int]:
    """(processes, resident KiB) of a process and all its descendants."""
    count, total, todo = 0, 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                total += next((int(line.split()[1]) for line in f if line.startswith("VmRSS:")), 0)
            count += 1
        except OSError:
            continue
        todo += [int(c) for c in subprocess.run(["pgrep", "-P", str(p)], capture_output=True,
                                                text=True).stdout.split()]
    return count, total


def read_records_file(path: Path) -> list[tuple[int, float]]:
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            n, at = line.split()
            rows.append((int(n), float(at)))
    return rows


WORKLOADS = ["push", "ceiling", "drain", "lateness", "idle", "crash", "memory"]


def main() -> None:
    global SYSTEMS, OTHERS
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="smaller runs, for a smoke test")
    parser.add_argument("--only", help=f"comma-separated workloads of {', '.join(WORKLOADS)}")
    parser.add_argument("--systems", help=f"comma-separated systems of {', '.join(SYSTEMS + OTHERS)}")
    parser.add_argument("--functions", action="store_true",
                        help="install delayq's library of functions first (Redis 7): delayq's calls go as FCALL")
    opts = parser.parse_args()
    workloads = opts.only.split(",") if opts.only else WORKLOADS
    systems = opts.systems.split(",") if opts.systems else SYSTEMS + OTHERS
    for name, wanted, known in (("workload", workloads, WORKLOADS), ("system", systems, SYSTEMS + OTHERS)):
        if unknown := [w for w in wanted if w not in known]:
            parser.error(f"unknown {name} {', '.join(unknown)}: choose from {', '.join(known)}")
    SYSTEMS = [s for s in SYSTEMS if s in systems]
    OTHERS = [s for s in OTHERS if s in systems]
    for tool in ("taskset", "redis-server", "redis-benchmark", "php", "node", "npm"):
        if not shutil.which(tool):
            sys.exit(f"{tool} not found: run scripts/setup.sh first")
    if OTHERS:
        install_others()
    bench = Bench(opts.quick)
    if opts.functions:
        # FLUSHALL between runs leaves functions in place.
        import delayq
        delayq.DelayQueue(bench.redis.url, "bench").install_functions()
    try:
        for workload in workloads:
            getattr(bench, workload)()
    finally:
        bench.redis.stop()
    suffix = "-quick" if opts.quick else ""
    if opts.only or opts.systems:
        suffix += "-" + "-".join(workloads)
    if opts.functions:
        suffix += "-functions"
    out = ROOT / "bench" / "results" / f"{datetime.date.today().isoformat()}{suffix}.md"
    plot = out.with_name(out.stem + "-lateness.png") if "lateness" in workloads else None
    if plot:
        bench.plot_lateness(plot)
    text = bench.report(sys.argv[1:], plot.name if plot else None)
    out.write_text(text)
    print(text)
    print(f"written to {out}")


if __name__ == "__main__":
    main()
