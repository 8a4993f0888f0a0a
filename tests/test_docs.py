"""The docs a newcomer follows must work: every relative link (and `#anchor`) in
README.md and docs/**/*.md resolves, and every fenced code example is checked by the
word after its fence:

- `php`: `php -l` (a `<?php` line is put first when the block has none).
- `php run`: also run as a whole script against this suite's redis-server.
- `python`: `compile()`, top-level `await` allowed (the asyncio examples).
- `python run`: also `mypy --strict`, then run as `php run` blocks are.
- `rust`: parsed by rustfmt, inside a `fn main` when the block has none. Compiling
  it would need a crate around every fragment; the crate's own API is compiled by its
  doc tests and `cargo test`, so here a block only has to be Rust.
- `sh`, `bash`: `bash -n`. `ini` (systemd units): configparser. `json`, `yaml`,
  `toml`: parsed.
- `dockerfile`: every instruction is one Docker knows (no parser ships here).
- `text`: output or an error message shown as it prints; nothing to check.

A fence in any other language fails, so that no example goes unchecked. A `run`
block gets `REDIS_URL`; one still running once a consumer pool registered on that
Redis (a worker) is stopped with SIGTERM, and must then stop by itself with status 0,
without a PHP warning or a Python traceback.
"""

from __future__ import annotations

import ast
import configparser
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from harness import RedisServer
from phpcli import php_cmd

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])

FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[^`]*)$")
LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
INLINE_CODE = re.compile(r"`+[^`]*`+")
HEADING = re.compile(r"^(#{1,6})\s+(?P<text>.+?)\s*#*\s*$")
PHP_COMPLAINT = re.compile(r"^(PHP )?(Warning|Notice|Deprecated|Fatal error|Parse error):", re.MULTILINE)


@dataclass
class Block:
    path: Path
    line: int
    info: str
    code: str

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}:{self.info or '(none)'}"


def split(path: Path) -> tuple[list[Block], list[tuple[int, str]]]:
    """The fenced blocks of a Markdown file, and its other lines with their numbers."""
    blocks: list[Block] = []
    prose: list[tuple[int, str]] = []
    lines = path.read_text(encoding="utf-8").split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            prose.append((i + 1, lines[i]))
            i += 1
            continue
        indent = len(m.group("indent"))
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        assert i < len(lines), f"{path.relative_to(ROOT)}:{start + 1}: a code fence that never closes"
        blocks.append(Block(path, start + 1, m.group("info").strip(), "\n".join(body) + "\n"))
        i += 1
    return blocks, prose


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link texts kept, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    for _, line in split(path)[1]:
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group("text"))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(path: Path) -> list[str]:
    problems: list[str] = []
    for number, line in split(path)[1]:
        for m in LINK.finditer(INLINE_CODE.sub("", line)):
            target = m.group("target")
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue  # an absolute URL: not this repository's to keep
            file_part, _, anchor = target.partition("#")
            where = f"{path.relative_to(ROOT)}:{number}: {target}"
            dest = (path.parent / file_part).resolve() if file_part else path
            if ROOT not in dest.parents and dest != ROOT:
                problems.append(f"{where}: points outside the repository")
            elif not dest.exists():
                problems.append(f"{where}: {dest.relative_to(ROOT)} does not exist")
            elif anchor:
                if dest.suffix != ".md":
                    problems.append(f"{where}: an anchor into a file that is not Markdown")
                elif anchor not in anchors(dest):
                    problems.append(f"{where}: no heading of {dest.relative_to(ROOT)} has the anchor #{anchor}")
    return problems


BLOCKS = [b for p in DOCS for b in split(p)[0]]


def test_the_docs_are_found() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in DOCS}
    assert {"README.md", "docs/php.md", "docs/python.md", "docs/zh/quickstart.md"} <= names
    assert len(BLOCKS) > 20, "the code blocks were not found"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path: Path) -> None:
    assert broken_links(path) == []


def checked(cmd: list[str], code: str, suffix: str, what: str) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=suffix, encoding="utf-8") as f:
        f.write(code)
        f.flush()
        out = subprocess.run([*cmd, f.name], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"{what} refused the example:\n{out.stdout}{out.stderr}"


def php_source(code: str) -> str:
    return code if code.lstrip().startswith("<?php") else "<?php\n" + code


def rust_parses(code: str) -> None:
    if not re.search(r"^\s*(pub\s+)?fn\s+main\b", code, re.MULTILINE):
        code = "fn main() -> Result<(), Box<dyn std::error::Error>> {\n" + code + "Ok(())\n}\n"
    out = subprocess.run(
        ["rustfmt", "--edition", "2021", "--emit", "stdout"], input=code, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, f"rustfmt cannot parse the example:\n{out.stderr}"


def toml_parses(code: str) -> None:
    import tomllib  # Python 3.11 and later; only a toml block needs it

    tomllib.loads(code)


DOCKERFILE_INSTRUCTIONS = {
    "ADD", "ARG", "CMD", "COPY", "ENTRYPOINT", "ENV", "EXPOSE", "FROM", "HEALTHCHECK", "LABEL",
    "MAINTAINER", "ONBUILD", "RUN", "SHELL", "STOPSIGNAL", "USER", "VOLUME", "WORKDIR",
}


def dockerfile_parses(code: str) -> None:
    logical = re.sub(r"\\\n", " ", code)
    for line in logical.split("\n"):
        word = line.strip().split(" ", 1)[0]
        if word and not word.startswith("#"):
            assert word.upper() in DOCKERFILE_INSTRUCTIONS, f"not a Dockerfile instruction: {line.strip()}"


def ini_parses(code: str) -> None:
    configparser.ConfigParser(interpolation=None).read_string(code)


CHECKS = {
    "php": lambda b: checked(["php", "-n", "-l"], php_source(b.code), ".php", "php -l"),
    "python": lambda b: compile(b.code, b.name, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT),
    "rust": lambda b: rust_parses(b.code),
    "sh": lambda b: checked(["bash", "-n"], b.code, ".sh", "bash -n"),
    "bash": lambda b: checked(["bash", "-n"], b.code, ".sh", "bash -n"),
    "ini": lambda b: ini_parses(b.code),
    "json": lambda b: json.loads(b.code),
    "yaml": lambda b: yaml.safe_load(b.code),
    "toml": lambda b: toml_parses(b.code),
    "dockerfile": lambda b: dockerfile_parses(b.code),
    # PHPStan's NEON, in the YAML subset the docs use.
    "neon": lambda b: yaml.safe_load(b.code),
    "xml": lambda b: xml.etree.ElementTree.fromstring(b.code),
    "text": lambda b: None,
}


def language(block: Block) -> tuple[str, bool]:
    words = block.info.split()
    lang = words[0] if words else ""
    assert lang in CHECKS, (
        f"{block.name}: a code block in a language this test does not check "
        f"(known: {', '.join(sorted(CHECKS))}); give it one of those, or teach the test"
    )
    extra = words[1:]
    assert extra in ([], ["run"]), f"{block.name}: unknown words after the language: {extra}"
    assert not extra or lang in ("php", "python"), f"{block.name}: only php and python blocks can run"
    return lang, extra == ["run"]


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.name)
def test_every_example_parses(block: Block) -> None:
    lang, _ = language(block)
    CHECKS[lang](block)


RUNNABLE = [b for b in BLOCKS if b.info.split()[1:] == ["run"]]


def a_pool_registered(server: RedisServer) -> bool:
    return any(key.endswith(":workers") and server.cli("HLEN", key) not in ("", "0") for key in server.keys())


@pytest.mark.parametrize("block", RUNNABLE, ids=lambda b: b.name)
def test_runnable_examples_run(block: Block, server: RedisServer, redis_url: str) -> None:
    lang, _ = language(block)
    with tempfile.TemporaryDirectory(prefix="delayq-docs-") as tmp:
        if lang == "php":
            script = Path(tmp, "example.php")
            script.write_text(php_source(block.code), encoding="utf-8")
            cmd = [*php_cmd(), "-d", "display_errors=stderr", "-d", "error_reporting=-1", str(script)]
        else:
            script = Path(tmp, "example.py")
            script.write_text(block.code, encoding="utf-8")
            checked([sys.executable, "-m", "mypy", "--strict", "--no-incremental"], block.code, ".py", "mypy --strict")
            cmd = [sys.executable, str(script)]
        proc = subprocess.Popen(
            cmd, cwd=tmp, env={**os.environ, "REDIS_URL": redis_url}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        deadline = time.monotonic() + 60
        while proc.poll() is None and not a_pool_registered(server):
            assert time.monotonic() < deadline, f"{block.name}: neither ended nor started a pool"
            time.sleep(0.05)
        stopped = proc.poll() is None
        if stopped:
            proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    how = "after SIGTERM " if stopped else ""
    assert proc.returncode == 0, f"{block.name} exited {how}with {proc.returncode}:\n{out}{err}"
    assert not PHP_COMPLAINT.search(err), f"{block.name}: PHP complained:\n{err}"
    assert "Traceback" not in err, f"{block.name}: Python raised:\n{err}"
