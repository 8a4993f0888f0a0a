"""Running PHP from the cross-language tests: the installed extension, or the one
DELAYQ_EXTENSION names (scripts/test.sh sets it when none is installed)."""

from __future__ import annotations

import os
import subprocess


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
