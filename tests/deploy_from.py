"""The build a rolling deploy starts from: delayq.so of an earlier commit, for pools that
run beside this tree's on one queue (test_rolling_deploy.py).

DEPLOY_FROM is the last commit that landed before the stored format or a script's
contract changes: a change to either moves it to the commit before the change, so that
the test runs the workers users would still have running during the deploy."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from phpcli import scan_dir_without_delayq

ROOT = Path(__file__).resolve().parent.parent

# b5e050d: the last commit that landed before a running message could be marked
# cancelled (a stamp's "at" of -1 or -2, which extend, ack, nack, release and the
# reaper read as "delete it as cancelled") and before the scripts became functions of a
# library (FCALL): its workers neither write nor read the mark. DELAYQ_DEPLOY_FROM names
# another, to try a deploy from it.
DEPLOY_FROM = os.environ.get("DELAYQ_DEPLOY_FROM", "b5e050dc9e02b856bc40ff2a3d3b5d7d4bd84206")


def commit_of(name: str) -> str:
    """The full hash of `name`, with a clear error where the clone lacks it."""
    found = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{name}^{{commit}}"],
                           capture_output=True, text=True)
    assert found.returncode == 0, (
        f"commit {name} is not in this clone (a shallow clone? `git fetch --unshallow`): "
        "the rolling-deploy test builds the extension from it")
    return found.stdout.strip()


def extension_at(name: str = DEPLOY_FROM) -> Path:
    """delayq.so built from the commit `name`'s tree (git archive, a target directory of
    its own, so that it never shares build artifacts with this tree's), kept under
    target/deploy-from/<hash> for later runs. Runs that build at once take turns."""
    commit = commit_of(name)
    cache = ROOT / "target" / "deploy-from" / commit
    built = cache / "delayq.so"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if built.exists():
            return built
        src = cache / "src"
        shutil.rmtree(src, ignore_errors=True)
        src.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True)
        subprocess.run(["cargo", "build", "--locked", "-q", "-p", "delayq-php"], cwd=src, check=True,
                       env={**os.environ, "CARGO_TARGET_DIR": str(cache / "target")})
        with tempfile.NamedTemporaryFile(dir=cache, delete=False) as partial:
            shutil.copyfileobj(open(cache / "target" / "debug" / "libdelayq_php.so", "rb"), partial)
        os.rename(partial.name, built)
        # Its sources would be collected as tests by a pytest run from the top.
        shutil.rmtree(src)
        return built


def php_with(extension: Path, ini_dir: Path) -> tuple[list[str], dict[str, str]]:
    """A php command and environment that load `extension` and no other delayq: PHP's
    scan directories copied into `ini_dir` without the ini that loads this machine's
    delayq. Checked in a php process: the one delayq library mapped is `extension`."""
    env = {**os.environ, "PHP_INI_SCAN_DIR": str(scan_dir_without_delayq(ini_dir))}
    env.pop("DELAYQ_EXTENSION", None)
    cmd = ["php", "-d", f"extension={extension}"]
    maps = subprocess.run([*cmd, "-r", "echo file_get_contents('/proc/self/maps');"],
                          capture_output=True, text=True, env=env, check=True).stdout
    mapped = {line.split()[-1] for line in maps.splitlines() if "delayq" in line and line.split()[-1].startswith("/")}
    assert mapped == {str(extension)}, f"php maps {mapped}, not only {extension}"
    return cmd, env
