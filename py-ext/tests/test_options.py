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
        return f"{d:g} s"
    return str(d)


def shown_takers(o: dict[str, Any]) -> str:
    return {(True, True): "PHP, Python", (True, False): "PHP", (False, True): "Python"}[(o["php"], o["python"])]


def test_the_docs_table_is_the_table() -> None:
    rows = docs_rows()
    assert list(rows) == list(TABLE), "docs/workers.md lists the options in the table's order"
    for name, o in TABLE.items():
        assert rows[name][1:] == [o["kind"], shown_default(o), shown_takers(o), o["doc"]], name
