"""What a push costs the PHP client, in instructions, with two or more builds of the
extension: `pushMany` of 1 000 messages and `push` of one, each counted by callgrind
inside the extension's method only (the conversion of the PHP values, the JSON text,
the envelope and the script call; not the PHP that builds the arrays). Instructions,
not seconds: the same build gives the same count, so one run per build is enough.

Payloads: the W1 payload (two fields) and, with --orders=K, one that also holds a list
of K orders (bench/get_payload.py's shape), where the JSON text is most of the work.

    python3 bench/php_push_ab.py [--n=20000] [--orders=100] [--label=NAME] LABEL=PATH.so ...
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import run  # noqa: E402
from php_drain_ab import ini_dir_without_delayq  # noqa: E402

METHODS = {"pushMany": "delayq_php::queue::PhpDelayQueue::push_many", "push": "delayq_php::queue::PhpDelayQueue::push"}

SCRIPT = r"""
$a = [];
foreach (array_slice($argv, 1) as $arg) { [$k, $v] = explode('=', $arg, 2); $a[$k] = $v; }
$q = new DelayQueue($a['url'], 'bench');
$orders = [];
for ($i = 0; $i < (int) $a['orders']; $i++) {
    $orders[] = ['order_id' => 10086 + $i, 'action' => 'close', 'amount' => 12.5, 'tags' => ['a', 'b']];
}
$n = (int) $a['n'];
$payload = function (int $i) use ($orders): array {
    $p = ['order_id' => $i, 'action' => 'close'];
    if ($orders) { $p['orders'] = $orders; }
    return $p;
};
if ($a['method'] === 'pushMany') {
    for ($i = 0; $i < $n; $i += 1000) {
        $items = [];
        for ($j = $i; $j < min($n, $i + 1000); $j++) { $items[] = ['payload' => $payload($j), 'delay' => 60]; }
        $q->pushMany($items);
    }
} else {
    for ($i = 0; $i < $n; $i++) { $q->push($payload($i), 60); }
}
if ($q->stats()['pushed'] !== $n) { fwrite(STDERR, "not all stored\n"); exit(1); }
"""


def counted(function: str, cmd: list[str], tmp: str, env: dict[str, str] | None = None) -> int:
    """Instructions inside `function` while `cmd` runs, by callgrind."""
    out = f"{tmp}/cg.out"
    for old in glob.glob(out + "*"):
        os.unlink(old)
    done = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--collect-atstart=no",
                           f"--toggle-collect={function}", *cmd], capture_output=True, text=True, timeout=1800, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr[-2000:]}")
    for line in Path(out).read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise RuntimeError(f"{out}: no totals")


def count(so: str, redis: run.Redis, method: str, n: int, orders: int, tmp: str) -> int:
    """Instructions inside `method` for n messages."""
    redis.cli("FLUSHALL")
    script = f"{tmp}/push.php"
    Path(script).write_text("<?php\n" + SCRIPT)
    return counted(METHODS[method], ["php", "-d", f"extension={so}", script, f"url={redis.url}", f"method={method}",
                                     f"n={n}", f"orders={orders}"], tmp)


def parse(doc: str, build: str, label: str, is_build: Callable[[Path], bool]) -> tuple[argparse.Namespace, dict[str, str]]:
    """The options and the builds (label: path) of an A/B of pushes; `build` names a build's
    form for the help and the errors."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("builds", nargs="+", help=f"LABEL={build}")
    parser.add_argument("--n", type=int, default=20000, help="messages per batched count (one at a time: a tenth)")
    parser.add_argument("--orders", type=int, default=100)
    parser.add_argument("--label", default=label)
    opts = parser.parse_args()
    builds: dict[str, str] = {}
    for given in opts.builds:
        name, _, path = given.partition("=")
        if not (name and path) or not is_build(Path(path)):
            parser.error(f"{given!r}: a build is LABEL={build}, which must exist")
        builds[name] = str(Path(path).resolve())
    return opts, builds


Count = Callable[[str, "run.Redis", str, int, int, str], int]


def compare(client: str, script: str, calls: tuple[str, str], opts: argparse.Namespace, builds: dict[str, str],
            count: Count, tmp: str) -> None:
    """Counts `calls` (batched, one at a time) with each build, and writes the report."""
    batched, single = calls
    cases = [(batched, opts.n, 0), (batched, opts.n, opts.orders), (single, opts.n // 10, 0),
             (single, opts.n // 10, opts.orders)]
    rows: dict[tuple[str, int], dict[str, float]] = {}
    redis = run.Redis()
    try:
        for method, n, orders in cases:
            for label, build in builds.items():
                per = count(build, redis, method, n, orders, tmp) / n
                print(f"{method} orders={orders} {label}: {per:,.0f} instructions a message", flush=True)
                rows.setdefault((method, orders), {})[label] = per
    finally:
        redis.stop()
    first = next(iter(builds))
    lines = [
        f"# What a push costs the {client} client, {len(builds)} builds, {time.strftime('%Y-%m-%d')}",
        "",
        f"Command: `python3 bench/{script} --n={opts.n} --orders={opts.orders} "
        + " ".join(f"{label}=…" for label in builds) + "`: callgrind's count inside the binding's",
        f"method, per message; {batched} in batches of 1 000 ({opts.n} messages), {single} one at a time ({opts.n // 10}).",
        "",
        "| call | payload | " + " | ".join(builds) + " |",
        "|---|---|" + "---|" * len(builds),
    ]
    for (method, orders), found in rows.items():
        shape = f"{orders} orders" if orders else "two fields"
        cells = [f"{found[label]:,.0f}" + ("" if label == first else f" ({found[label] / found[first]:.2f}x)")
                 for label in builds]
        lines.append(f"| {method} | {shape} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Builds: " + ", ".join(f"{label} = {build}" for label, build in builds.items()) + ".")
    run.write_results(f"-{opts.label}", "\n".join(lines) + "\n")


def main() -> None:
    opts, builds = parse(__doc__ or "", "PATH.so", "php-push-ab", Path.is_file)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["PHP_INI_SCAN_DIR"] = str(ini_dir_without_delayq(Path(tmp) / "conf.d"))
        if subprocess.run(["php", "-r", 'exit(extension_loaded("delayq") ? 0 : 1);']).returncode == 0:
            sys.exit("php loads delayq outside its scan directory (php.ini?): leave it out there first")
        compare("PHP", "php_push_ab.py", ("pushMany", "push"), opts, builds, count, tmp)


if __name__ == "__main__":
    main()
