"""The worker options table of the core (`delayq.WORKER_OPTIONS`) against everything that
describes the options by hand: the Python signature and `delayq worker` flags, the `.pyi`,
the PHP stub and the options table in docs/workers.md."""

from __future__ import annotations

import argparse
import ast
import inspect
import pathlib
import re
from typing import Any

import delayq
import pytest
from delayq import __main__ as cli

ROOT = pathlib.Path(__file__).resolve().parents[2]
TABLE: dict[str, dict[str, Any]] = {o["name"]: o for o in delayq.WORKER_OPTIONS}
PHP_TYPES = {"count": "int", "seconds": "float", "flag": "bool", "callable": "callable"}


def python_options() -> dict[str, dict[str, Any]]:
    return {n: o for n, o in TABLE.items() if o["python"]}


def test_the_python_worker_takes_every_python_option_with_the_tables_default() -> None:
    params = inspect.signature(delayq.Worker.__init__).parameters
    keywords = {n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert keywords == set(python_options())
    for name, o in python_options().items():
        default = params[name].default
        if o["default"] is None:
            assert default in (None, ()), name
        else:
            assert default == o["default"] and type(default) is type(o["default"]), name


def test_the_pyi_states_the_same_defaults() -> None:
    tree = ast.parse((ROOT / "py-ext/delayq/__init__.pyi").read_text())
    worker = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Worker")
    init = next(n for n in worker.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    stated = {a.arg: d for a, d in zip(init.args.kwonlyargs, init.args.kw_defaults)}
    assert set(stated) == set(python_options())
    for name, o in python_options().items():
        node = stated[name]
        assert node is not None, name
        if o["default"] is None:
            assert isinstance(node, (ast.Constant, ast.Tuple)) and not getattr(node, "value", None), name
        else:
            assert isinstance(node, ast.Constant) and node.value == o["default"], (name, ast.dump(node))


def test_the_worker_command_flags_default_to_the_table() -> None:
    parser = cli._parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    worker = sub.choices["worker"]
    flags = {a.dest: a for a in worker._actions}
    checked = 0
    for name, o in TABLE.items():
        if name in flags and o["default"] is not None and o["kind"] in ("count", "seconds"):
            assert flags[name].default == o["default"], name
            checked += 1
    assert checked >= 10


def test_the_php_stub_lists_every_php_option_with_its_type() -> None:
    stub = (ROOT / "stubs/delayq.stub.php").read_text()
    block = stub[stub.index("final class DelayQueueWorker"):]
    shape = re.search(r"@param array\{(.*?)\} \$options", block, re.S)
    assert shape, "the stub's DelayQueueWorker options shape"
    listed = dict(
        (k.strip(), t.strip())
        for k, t in (item.split("?:") for item in re.sub(r"\s*\*\s*", " ", shape.group(1)).split(", "))
    )
    assert set(listed) == {n for n, o in TABLE.items() if o["php"]}
    for name, php_type in listed.items():
        kind = TABLE[name]["kind"]
        if kind in PHP_TYPES:
            assert php_type == PHP_TYPES[kind], (name, php_type)


def docs_rows() -> dict[str, list[str]]:
    text = (ROOT / "docs/workers.md").read_text()
    start = text.index("<!-- worker options: checked against delayq.WORKER_OPTIONS -->")
    rows = {}
    for line in text[start:].splitlines()[1:]:
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        name = cells[0].strip("`")
        if name in ("option", "---") or set(name) <= {"-"}:
            continue
        rows[name] = cells
    return rows


def shown_default(o: dict[str, Any]) -> str:
    d = o["default"]
    if d is None:
        return "none"
    if isinstance(d, bool):
        return "true" if d else "false"
    if isinstance(d, float):
        return f"{d:.0f} s" if d.is_integer() else f"{d:g} s"
    return str(d)


def shown_takers(o: dict[str, Any]) -> str:
    return {(True, True): "PHP, Python", (True, False): "PHP", (False, True): "Python"}[(o["php"], o["python"])]


def test_the_docs_table_is_the_table() -> None:
    rows = docs_rows()
    assert list(rows) == list(TABLE), "docs/workers.md lists the options in the table's order"
    for name, o in TABLE.items():
        assert rows[name][1:] == [o["kind"], shown_default(o), shown_takers(o), o["doc"]], name


# The queue's options table (`delayq.QUEUE_OPTIONS`) against the Python signature, the
# `.pyi`, the PHP stub and docs/php.md, and the records (`RECORD_SHAPES`) against the
# TypedDicts of `delayq.records` and the stub's array shapes.

QUEUE: dict[str, dict[str, Any]] = {o["name"]: o for o in delayq.QUEUE_OPTIONS}


def stub_text() -> str:
    return (ROOT / "stubs/delayq.stub.php").read_text()


def top_level_keys(shape: str) -> list[str]:
    """The keys of a PHP array shape's body, outside any nested shape."""
    keys, depth, item = [], 0, ""
    for ch in re.sub(r"\s*\*\s*", " ", shape) + ",":
        if ch in "{<":
            depth += 1
        elif ch in "}>":
            depth -= 1
        if ch == "," and depth == 0:
            keys.append(item.split(":")[0].strip().rstrip("?"))
            item = ""
        else:
            item += ch
    return keys


def shape_after(text: str, start: str) -> str:
    """The body of the first `array{...}` after `start`, nested shapes included."""
    at = text.index("array{", text.index(start)) + len("array{")
    depth = 1
    for i in range(at, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[at:i]
    raise AssertionError(f"no shape after {start}")


def test_the_python_queue_takes_every_python_option_with_the_tables_default() -> None:
    params = inspect.signature(delayq.DelayQueue).parameters
    keywords = [n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert keywords == [n for n, o in QUEUE.items() if o["python"]]
    for name in keywords:
        assert params[name].default == QUEUE[name]["default"], name


def test_the_pyi_states_the_same_queue_defaults() -> None:
    tree = ast.parse((ROOT / "py-ext/delayq/_delayq.pyi").read_text())
    queue = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DelayQueue")
    new = next(n for n in queue.body if isinstance(n, ast.FunctionDef) and n.name == "__new__")
    stated = {a.arg: d for a, d in zip(new.args.kwonlyargs, new.args.kw_defaults)}
    assert list(stated) == [n for n, o in QUEUE.items() if o["python"]]
    for name, node in stated.items():
        assert isinstance(node, ast.Constant) and node.value == QUEUE[name]["default"], (name, ast.dump(node))


def test_the_php_stub_lists_every_queue_option_with_its_type() -> None:
    shape = shape_after(stub_text(), "final class DelayQueue\n")
    listed = dict((k.strip(), t.strip()) for k, t in (i.split("?:") for i in re.sub(r"\s*\*\s*", " ", shape).split(", ")))
    assert set(listed) == {n for n, o in QUEUE.items() if o["php"]}
    for name, php_type in listed.items():
        o = QUEUE[name]
        expected = "|".join(f"'{c}'" for c in o["choices"]) or {"text": "string", **PHP_TYPES}[o["kind"]]
        assert php_type == expected, (name, php_type)


def test_the_docs_queue_table_is_the_table() -> None:
    text = (ROOT / "docs/php.md").read_text()
    start = text.index("<!-- queue options: checked against delayq.QUEUE_OPTIONS -->")
    rows = {}
    for line in text[start:].splitlines()[3:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = cells
    assert list(rows) == list(QUEUE), "docs/php.md lists the queue options in the table's order"
    for name, o in QUEUE.items():
        default = f"`{o['default']}`" if isinstance(o["default"], str) else shown_default(o)
        assert rows[name][1:] == [o["kind"], default, shown_takers(o), o["doc"]], name


@pytest.mark.parametrize("name", [n for n, o in QUEUE.items() if o["python"] and o["kind"] == "count"])
def test_a_count_out_of_its_range_is_refused_naming_the_option(name: str) -> None:
    low, high = int(QUEUE[name]["min"]), int(QUEUE[name]["max"])
    delayq.DelayQueue("redis://127.0.0.1:1", "q", **{name: high})
    for bad in (low - 1, high + 1):
        with pytest.raises(delayq.InvalidArgumentError, match=f"{name}: must be between {low} and {high}, got {bad}"):
            delayq.DelayQueue("redis://127.0.0.1:1", "q", **{name: bad})


def test_the_typed_dicts_are_the_records() -> None:
    for name, fields in delayq._delayq.RECORD_SHAPES.items():
        if name == "PoolSummary":
            continue  # PHP's supervised pool only: the stub's run() below
        typed = getattr(delayq.records, name)
        assert tuple(typed.__annotations__) == fields, name


STUB_RETURNS = {
    "public function get(": "MessageInfo",
    "public function waiting(": "MessageInfo",
    "public function inflight(": "MessageInfo",
    "public function find(": "MessageInfo",
    "public function findField(": "MessageInfo",
    "public function completed(": "MessageInfo",
    "public function stats(": "Stats",
    "public function deadLetters(": "DeadLetter",
    "public function workers(": "WorkerInfo",
    "public function repeats(": "Repeat",
    "public function rateLimit(": "RateLimit",
}


def test_the_php_stub_returns_the_records() -> None:
    stub = stub_text()
    shapes = delayq._delayq.RECORD_SHAPES
    for method, record in STUB_RETURNS.items():
        doc = stub[: stub.index(method)]
        doc = doc[doc.rindex("/**"):]
        assert top_level_keys(shape_after(doc, "@return")) == list(shapes[record]), method
    worker = stub[stub.index("final class DelayQueueWorker"):]
    run = worker[: worker.index("public function run(")]
    keys = top_level_keys(shape_after(run[run.rindex("/**"):], "@return"))
    assert keys == [*shapes["Summary"], *shapes["PoolSummary"]]


def test_the_commands_queue_flags_default_to_the_table() -> None:
    flags = {a.dest: a for a in cli._parser()._actions}
    for name in ("prefix", "partitions", "layout"):
        assert flags[name].default == QUEUE[name]["default"], name
    assert tuple(flags["layout"].choices or ()) == tuple(QUEUE["layout"]["choices"])
