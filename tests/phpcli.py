"""Running PHP from the cross-language tests: the installed extension, or the one
DELAYQ_EXTENSION names (scripts/test.sh sets it when none is installed)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path


def php_cmd() -> list[str]:
    cmd = ["php"]
    ext = os.environ.get("DELAYQ_EXTENSION")
    if ext:
        cmd += ["-d", f"extension={ext}"]
    return cmd


def php(code: str, *args: str) -> str:
    """Run `php -r CODE ARGS...`, fail the test unless it exits 0, return its stdout."""
    out = subprocess.run([*php_cmd(), "-r", code, *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr + out.stdout
    return out.stdout


def scan_dir_without_delayq(into: Path) -> Path:
    """A copy of PHP's scan directories in `into`, without the ini that loads this
    machine's delayq: with PHP_INI_SCAN_DIR set to it, `-d extension=` loads another
    build of delayq alone."""
    out = subprocess.run(["php", "--ini"], capture_output=True, text=True, check=True).stdout
    scan = next(line.split(": ", 1)[1].strip() for line in out.splitlines() if line.startswith("Scan for"))
    into.mkdir(parents=True, exist_ok=True)
    for folder in scan.split(":"):
        for ini in Path(folder).glob("*.ini"):
            if "delayq" not in ini.read_text():
                shutil.copy(ini, into / ini.name)
    return into
