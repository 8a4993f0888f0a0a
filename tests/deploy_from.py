"""The build a rolling deploy starts from: delayq.so of an earlier commit, for pools that
run beside this tree's on one queue (test_rolling_deploy.py).

DEPLOY_FROM is the last commit that landed before the stored format or a script's
contract changes: a change to either moves it to the commit before the change, so that
the test runs the workers users would still have running during the deploy."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# 03fc171: the last commit that landed before the stop at which this test came in.
# DELAYQ_DEPLOY_FROM names another, to try a deploy from it.
DEPLOY_FROM = os.environ.get("DELAYQ_DEPLOY_FROM", "03fc171c284ba29df4cd92e8350e493563a5ff15")


def extension_at(commit: str = DEPLOY_FROM) -> Path:
    """delayq.so built from `commit`'s tree (git archive, its own target directory, so
    that it never shares build artifacts with this tree's), kept under target/ for
    later runs."""
    cache = ROOT / "target" / "deploy-from" / commit
    built = cache / "delayq.so"
    if built.exists():
        return built
    src = cache / "src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True)
    subprocess.run(["cargo", "build", "-q", "-p", "delayq-php"], cwd=src, check=True,
                   env={**os.environ, "CARGO_TARGET_DIR": str(cache / "target")})
    partial = cache / "delayq.so.partial"
    shutil.copy(cache / "target" / "debug" / "libdelayq_php.so", partial)
    partial.rename(built)
    return built


def php_with(extension: Path) -> tuple[list[str], dict[str, str]]:
    """A php command and environment that load `extension` and no other delayq: PHP's
    scan directory copied without the ini that loads this machine's delayq."""
    out = subprocess.run(["php", "--ini"], capture_output=True, text=True, check=True).stdout
    scan = next(line.split(": ", 1)[1].strip() for line in out.splitlines() if line.startswith("Scan for"))
    into = Path(tempfile.mkdtemp(prefix="delayq-deploy-ini-"))
    for ini in Path(scan).glob("*.ini"):
        if "delayq" not in ini.read_text():
            shutil.copy(ini, into / ini.name)
    env = {**os.environ, "PHP_INI_SCAN_DIR": str(into)}
    env.pop("DELAYQ_EXTENSION", None)
    cmd = ["php", "-d", f"extension={extension}"]
    loaded = subprocess.run([*cmd, "-r", "echo phpversion('delayq') === false ? 'no' : 'yes';"],
                            capture_output=True, text=True, env=env, check=True).stdout
    assert loaded == "yes", f"php does not load {extension}"
    return cmd, env
