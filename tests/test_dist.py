"""The packages as users receive them: `make dist`'s wheel and sdist, `make php-dist`'s
extension package, and the Composer package (its metadata, and the docs' snippet that
requires it, installed by Composer).

The wheel goes into a fresh virtual environment whose PATH holds no Rust toolchain,
and a push, a worker and the `delayq` command run from there; the PHP package's
install.sh installs into directories of the test's own and PHP loads the extension
from them. Both meet a real redis-server (tests/conftest.py). The packages themselves
are built once per run by scripts/test.sh (`make dist php-dist`): a release build
takes minutes, too long to repeat per test."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYTHON_DIST = ROOT / "dist" / "python"
PHP_DIST = ROOT / "dist" / "php"
# What the fresh environment runs with: its own bin, and the system's for redis-server.
SYSTEM_PATH = "/usr/bin:/bin"


def only(pattern: str, where: Path, how: str) -> Path:
    found = sorted(where.glob(pattern))
    if len(found) != 1:
        pytest.fail(f"expected one {pattern} in {where}, found {[p.name for p in found]}: run {how} first")
    return found[0]


def run(args: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=120, env=env, cwd=cwd, check=False)


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A fresh venv (no system site-packages) holding only the wheel, and the
    environment to run it with: a PATH with no cargo, rustc or maturin on it."""
    wheel = only("delayq-*.whl", PYTHON_DIST, "make dist")
    venv = tmp_path_factory.mktemp("wheel") / "venv"
    path = f"{venv / 'bin'}:{SYSTEM_PATH}"
    for tool in ("cargo", "rustc", "maturin"):
        assert shutil.which(tool, path=path) is None, f"{tool} is on the test's PATH {path}"
    env = {"PATH": path, "HOME": str(venv.parent), "LANG": "C.UTF-8"}
    made = run([sys.executable, "-m", "venv", str(venv)], env=env)
    assert made.returncode == 0, made.stderr
    installed = run([str(venv / "bin" / "python"), "-m", "pip", "install", "--no-index", "--no-deps",
                     "--disable-pip-version-check", str(wheel)], env=env)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return env


def test_the_wheel_is_abi3_for_cpython_3_10_and_later() -> None:
    wheel = only("delayq-*.whl", PYTHON_DIST, "make dist")
    assert re.fullmatch(r"delayq-[^-]+-cp310-abi3-[a-z0-9_.]+\.whl", wheel.name), wheel.name


def test_a_push_and_a_worker_run_from_the_wheel(wheel_env: dict[str, str], redis_url: str, tmp_path: Path) -> None:
    script = tmp_path / "push_and_work.py"
    script.write_text(
        "import json, sys\n"
        "import delayq\n"
        "queue = delayq.DelayQueue(sys.argv[1], 'dist-wheel')\n"
        "queue.push({'order_id': 10086}, 0)\n"
        "seen = []\n"
        "with delayq.Worker(queue, threads=1, stop_when_empty=True) as worker:\n"
        "    summary = worker.run(lambda payload, message: seen.append(payload))\n"
        "print(json.dumps({'module': delayq.__file__, 'prefix': sys.prefix, 'seen': seen,\n"
        "                  'acked': summary['acked'], 'stats': queue.stats()}))\n"
    )
    # Run from the test's own directory, so nothing of the source tree is importable.
    out = run([shutil.which("python", path=wheel_env["PATH"]) or "python", str(script), redis_url],
              env=wheel_env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["module"].startswith(result["prefix"] + "/lib/"), result["module"]
    assert result["seen"] == [{"order_id": 10086}]
    assert result["acked"] == 1
    assert result["stats"]["scheduled"] + result["stats"]["ready"] + result["stats"]["inflight"] == 0


def test_the_delayq_command_runs_from_the_wheel(wheel_env: dict[str, str], redis_url: str, tmp_path: Path) -> None:
    command = shutil.which("delayq", path=wheel_env["PATH"])
    assert command is not None and command.startswith(wheel_env["PATH"].split(":")[0])
    base = [command, "--url", redis_url, "--queue", "dist-cli", "--json"]

    pushed = run([*base, "push", '{"order_id": 7}'], env=wheel_env, cwd=tmp_path)
    assert pushed.returncode == 0, pushed.stderr
    message_id = json.loads(pushed.stdout)["id"]
    stats = run([*base, "stats"], env=wheel_env, cwd=tmp_path)
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["ready"] + json.loads(stats.stdout)["scheduled"] == 1

    (tmp_path / "dist_handlers.py").write_text(
        "import json\n"
        "def record(payload, message):\n"
        "    with open('handled.json', 'a') as f:\n"
        "        f.write(json.dumps({'id': message.id, 'payload': payload}) + '\\n')\n"
    )
    worked = run([*base, "worker", "dist_handlers:record", "--stop-when-empty"], env=wheel_env, cwd=tmp_path)
    assert worked.returncode == 0, worked.stderr
    handled = [json.loads(line) for line in (tmp_path / "handled.json").read_text().splitlines()]
    assert handled == [{"id": message_id, "payload": {"order_id": 7}}]
    after = json.loads(run([*base, "stats"], env=wheel_env, cwd=tmp_path).stdout)
    assert after["scheduled"] + after["ready"] + after["inflight"] == 0


def test_the_sdist_holds_every_source_the_build_needs() -> None:
    sdist = only("delayq-*.tar.gz", PYTHON_DIST, "make dist")
    with tarfile.open(sdist) as archive:
        names = archive.getnames()
    top = names[0].split("/")[0]
    held = {name[len(top) + 1:] for name in names}
    tracked = run(["git", "ls-files", "core/src", "core/Cargo.toml", "py-ext/src", "py-ext/Cargo.toml",
                   "py-ext/delayq"], cwd=ROOT)
    assert tracked.returncode == 0, tracked.stderr
    # The Python package sits at the sdist's top, as pyproject.toml's python-source
    # makes py-ext/ the top; the Rust crates keep their workspace paths.
    needed = {path.removeprefix("py-ext/") if path.startswith("py-ext/delayq/") else path
              for path in tracked.stdout.splitlines() if path}
    assert {"core/src/lib.rs", "delayq/__init__.py", "py-ext/src/lib.rs"} <= needed
    assert needed - held == set(), f"{sdist.name} lacks these sources"
    assert {"pyproject.toml", "Cargo.lock", "Cargo.toml"} <= held, sorted(held)


def test_the_sdist_unpacks_into_a_workspace_cargo_can_resolve(tmp_path: Path) -> None:
    sdist = only("delayq-*.tar.gz", PYTHON_DIST, "make dist")
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path, filter="data")
    (top,) = tmp_path.iterdir()
    shipped = locked_versions(top / "Cargo.lock")
    assert any(name == "pyo3" for name, _ in shipped), "no pyo3 in the shipped Cargo.lock"
    resolved = run(["cargo", "metadata", "--offline", "--format-version", "1",
                    "--manifest-path", str(top / "py-ext" / "Cargo.toml")])
    assert resolved.returncode == 0, resolved.stderr
    packages = {p["name"] for p in json.loads(resolved.stdout)["packages"]}
    assert {"delayq", "delayq-py", "pyo3"} <= packages
    # Resolving may drop the PHP extension's entries from the shipped lock file (the
    # sdist leaves that crate out), but must pin nothing the lock file did not.
    assert locked_versions(top / "Cargo.lock") - shipped == set()


def locked_versions(lock_file: Path) -> set[tuple[str, str]]:
    return set(re.findall(r'(?m)^name = "([^"]+)"\nversion = "([^"]+)"$', lock_file.read_text()))


def php_config_value(option: str) -> str:
    out = run(["php-config", option])
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.fixture
def php_package() -> Path:
    version = ".".join(php_config_value("--version").split(".")[:2])
    package = PHP_DIST / version
    for part in ("delayq.so", "delayq.ini", "install.sh", "build-info"):
        if not (package / part).is_file():
            pytest.fail(f"{package / part} is missing: run make php-dist first")
    return package


def php_with(scan_dir: Path, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """PHP reading its ini files from scan_dir only, not from the system's conf.d."""
    return run(["php", "-r", code, "--", *args], env={**os.environ, "PHP_INI_SCAN_DIR": str(scan_dir)})


def test_the_php_package_installs_and_the_extension_runs(php_package: Path, redis_url: str, tmp_path: Path) -> None:
    extension_dir, ini_dir = tmp_path / "extensions", tmp_path / "conf.d"
    ini_dir.mkdir()
    loaded = 'exit(class_exists("DelayQueue") ? 0 : 1);'
    assert php_with(ini_dir, loaded).returncode == 1, "delayq loads before the install: the test would prove nothing"

    installed = run([str(php_package / "install.sh"), "--extension-dir", str(extension_dir), "--ini-dir", str(ini_dir)])
    assert installed.returncode == 0, installed.stderr
    assert (extension_dir / "delayq.so").read_bytes() == (php_package / "delayq.so").read_bytes()
    ini = (ini_dir / "30-delayq.ini").read_text()
    assert f"extension={extension_dir}/delayq.so" in ini.splitlines()

    pushed = php_with(ini_dir, '$q = new DelayQueue($argv[1], "dist-php"); $q->push(["order_id" => 1], 60);'
                               'echo json_encode($q->stats());', redis_url)
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    assert json.loads(pushed.stdout)["scheduled"] == 1


def test_the_php_package_refuses_another_php_and_writes_nothing(php_package: Path, tmp_path: Path) -> None:
    other = tmp_path / "package"
    shutil.copytree(php_package, other)
    (other / "build-info").write_text(
        re.sub(r"(?m)^extension_build=.*$", "extension_build=API20990101,NTS",
               re.sub(r"(?m)^php_version=.*$", "php_version=9.9", (other / "build-info").read_text())))
    extension_dir, ini_dir = tmp_path / "extensions", tmp_path / "conf.d"

    refused = run([str(other / "install.sh"), "--extension-dir", str(extension_dir), "--ini-dir", str(ini_dir)])
    assert refused.returncode == 1
    this_build = run(["php", "-n", "-i"]).stdout
    build = re.search(r"(?m)^PHP Extension Build => (.*)$", this_build)
    assert build is not None
    assert "built for PHP 9.9 (API20990101,NTS)" in refused.stderr, refused.stderr
    assert f"({build.group(1)})" in refused.stderr, refused.stderr
    assert not extension_dir.exists() and not ini_dir.exists()


def test_the_php_package_leaves_an_ini_that_loads_another_delayq_so_alone(php_package: Path,
                                                                         tmp_path: Path) -> None:
    extension_dir, ini_dir = tmp_path / "extensions", tmp_path / "conf.d"
    ini_dir.mkdir()
    ini = ini_dir / "30-delayq.ini"
    theirs = "extension=/opt/other-php/delayq.so\n"
    ini.write_text(theirs)
    install = [str(php_package / "install.sh"), "--extension-dir", str(extension_dir), "--ini-dir", str(ini_dir)]

    refused = run(install)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert (f"{ini} already exists with 'extension=/opt/other-php/delayq.so', "
            f"not 'extension={extension_dir}/delayq.so': nothing installed.") in refused.stderr, refused.stderr
    assert f"--ini-dir DIR to put the ini somewhere else, or --force to replace {ini}" in refused.stderr
    assert ini.read_text() == theirs
    assert not extension_dir.exists()

    forced = run([*install, "--force"])
    assert forced.returncode == 0, forced.stderr
    assert f"--force: replacing {ini}, which existed with 'extension=/opt/other-php/delayq.so'" in forced.stdout
    assert ini.read_text().splitlines()[-1] == f"extension={extension_dir}/delayq.so"

    # The ini now loads the file this install writes: installing again (an upgrade in
    # place) rewrites it without --force.
    again = run(install)
    assert again.returncode == 0, again.stderr
    assert "replacing" not in again.stdout


def in_mount_namespace(binds: dict[str, Path], args: list[str]) -> subprocess.CompletedProcess[str]:
    """Run args in a mount namespace of their own, where each directory of `binds`
    stands in for the system path it is keyed by. The script under test runs unchanged
    on the paths it hardcodes, and the machine's own directories there are neither read
    nor written: the mounts end with the namespace, and none propagates out of it."""
    mounts = [part for real, fake in binds.items() for part in (str(fake), real)]
    script = 'while [ "$1" != -- ]; do mount --bind "$1" "$2" || exit 1; shift 2; done; shift; exec "$@"'
    return run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *mounts, "--", *args])


def test_on_debian_the_php_package_leaves_the_system_ini_for_another_delayq_so_alone(
        php_package: Path, tmp_path: Path) -> None:
    """install.sh's Debian branch (mods-available and phpenmod) on a copy of the
    layout: /etc/php, /var/lib/php (phpenmod's state) and PHP's extension_dir are
    directories of the test's own, in a mount namespace."""
    if shutil.which("phpenmod") is None or not Path("/var/lib/php").is_dir():
        pytest.skip("not Debian's PHP layout (phpenmod, /var/lib/php)")
    if (probe := run(["unshare", "--mount", "true"])).returncode != 0:
        pytest.skip(f"no mount namespace for the test: {probe.stderr.strip()}")
    version = php_package.name
    etc_php, var_lib_php, php_extension_dir = tmp_path / "etc-php", tmp_path / "var-lib-php", tmp_path / "php-ext"
    mods = etc_php / version / "mods-available"
    mods.mkdir(parents=True)
    (etc_php / version / "cli" / "conf.d").mkdir(parents=True)
    var_lib_php.mkdir()
    php_extension_dir.mkdir()
    binds = {"/etc/php": etc_php, "/var/lib/php": var_lib_php, php_config_value("--extension-dir"): php_extension_dir}
    system_ini = mods / "delayq.ini"
    system_ini.write_text("extension=delayq.so\n")  # as `make php` (scripts/php-install.sh) writes it
    real_ini = Path(f"/etc/php/{version}/mods-available/delayq.ini")
    real_before = real_ini.read_bytes() if real_ini.exists() else None
    elsewhere = tmp_path / "extensions"

    # --extension-dir alone: the system PHP's ini loads another file, and stays so.
    refused = in_mount_namespace(binds, [str(php_package / "install.sh"), "--extension-dir", str(elsewhere)])
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert (f"/etc/php/{version}/mods-available/delayq.ini already exists with 'extension=delayq.so', "
            f"not 'extension={elsewhere}/delayq.so': nothing installed.") in refused.stderr, refused.stderr
    assert "--ini-dir DIR to put the ini somewhere else, or --force to replace" in refused.stderr
    assert system_ini.read_text() == "extension=delayq.so\n"
    assert not elsewhere.exists() and not any(php_extension_dir.iterdir())

    # Into PHP's own extension_dir, over `make php`'s install: the same file, so an
    # upgrade in place, and phpenmod enables it.
    upgraded = in_mount_namespace(binds, [str(php_package / "install.sh")])
    assert upgraded.returncode == 0, upgraded.stdout + upgraded.stderr
    assert system_ini.read_text().splitlines()[-1] == "extension=delayq"
    assert (php_extension_dir / "delayq.so").read_bytes() == (php_package / "delayq.so").read_bytes()
    link = etc_php / version / "cli" / "conf.d" / "20-delayq.ini"
    assert os.readlink(link) == f"/etc/php/{version}/mods-available/delayq.ini"
    assert (real_ini.read_bytes() if real_ini.exists() else None) == real_before


def test_the_php_install_script_refuses_an_unknown_argument(php_package: Path) -> None:
    out = run([str(php_package / "install.sh"), "--extension-dri", "/tmp"])
    assert out.returncode == 2
    assert "unknown argument: --extension-dri" in out.stderr


def test_the_php_tarball_holds_the_package(php_package: Path) -> None:
    tarball = only(f"delayq-*-php{php_package.name}-*-linux.tar.gz", PHP_DIST, "make php-dist")
    with tarfile.open(tarball) as archive:
        members = {m.name.split("/", 1)[1]: m for m in archive.getmembers() if "/" in m.name}
    assert {"delayq.so", "delayq.ini", "install.sh", "build-info"} <= set(members), sorted(members)
    assert members["install.sh"].mode & 0o111


def test_the_php_tarball_ships_delayq_so_without_debug_info(php_package: Path, tmp_path: Path) -> None:
    tarball = only(f"delayq-*-php{php_package.name}-*-linux.tar.gz", PHP_DIST, "make php-dist")
    with tarfile.open(tarball) as archive:
        archive.extractall(tmp_path, filter="data")
    (top,) = tmp_path.iterdir()
    shipped = top / "delayq.so"
    assert not (top / "delayq.so.debug").exists(), "the debug info belongs beside the package, not in it"
    sections = run(["readelf", "--section-headers", "--wide", str(shipped)])
    assert sections.returncode == 0, sections.stderr
    assert ".debug_info" not in sections.stdout
    modules = run(["php", "-n", "-d", f"extension={shipped}", "-m"])
    assert modules.returncode == 0 and "delayq" in modules.stdout.splitlines(), modules.stdout + modules.stderr
    assert "Warning" not in modules.stdout + modules.stderr

    # The debug info stays in dist/, and the shipped file's .gnu_debuglink names it
    # with its CRC, as gdb checks it.
    debug = php_package / "delayq.so.debug"
    debug_sections = run(["readelf", "--section-headers", "--wide", str(debug)])
    assert ".debug_info" in debug_sections.stdout, debug_sections.stdout
    dumped = run(["objcopy", "--dump-section", f".gnu_debuglink={tmp_path / 'debuglink'}", str(shipped),
                  str(tmp_path / "scratch.so")])
    assert dumped.returncode == 0, dumped.stderr
    link = (tmp_path / "debuglink").read_bytes()
    assert link[:link.index(b"\0")] == b"delayq.so.debug"
    assert int.from_bytes(link[-4:], "little") == zlib.crc32(debug.read_bytes())


def composer_snippet() -> str:
    """The composer.json that docs/install.md's Composer section gives an application."""
    text = (ROOT / "docs" / "install.md").read_text()
    section = text[text.index("## The Composer package"):]
    found = re.search(r"(?s)^```json\n(.*?)^```$", section, re.MULTILINE)
    assert found is not None, "no json block in docs/install.md's Composer section"
    return found.group(1)


def test_the_docs_composer_snippet_installs_with_the_default_minimum_stability(tmp_path: Path) -> None:
    composer = shutil.which("composer")
    if composer is None:
        pytest.skip("composer is not installed (Debian: apt-get install composer)")
    manifest = json.loads(composer_snippet())
    assert "minimum-stability" not in manifest and "prefer-stable" not in manifest
    (repository,) = manifest["repositories"]
    assert repository["type"] == "path"
    repository["url"] = str(ROOT / "php")
    # No Composer registry is reachable here: with packagist.org off, a constraint the
    # path repository cannot meet fails with Composer's reason, not a DNS error.
    manifest["repositories"].append({"packagist.org": False})
    app = tmp_path / "app"
    app.mkdir()
    (app / "composer.json").write_text(json.dumps(manifest, indent=4))
    env = {**os.environ, "COMPOSER_HOME": str(tmp_path / "composer-home"), "COMPOSER_ALLOW_SUPERUSER": "1",
           "COMPOSER_NO_INTERACTION": "1"}

    installed = run([composer, "install", "--no-progress", "--ignore-platform-req=ext-delayq"], env=env, cwd=app)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    packages = json.loads((app / "vendor" / "composer" / "installed.json").read_text())["packages"]
    assert [package["name"] for package in packages] == ["delayq/delayq"]
    assert (app / "vendor" / "delayq" / "delayq" / "src").resolve() == (ROOT / "php" / "src").resolve()


def test_frameworks_md_gives_the_same_composer_snippet_as_install_md() -> None:
    text = (ROOT / "docs" / "frameworks.md").read_text()
    found = re.search(r"(?s)^```json\n(.*?)^```$", text, re.MULTILINE)
    assert found is not None, "no json block in docs/frameworks.md"
    assert json.loads(found.group(1)) == json.loads(composer_snippet())


def test_the_composer_package_ships_the_stub_and_maps_its_classes() -> None:
    package = ROOT / "php"
    manifest = json.loads((package / "composer.json").read_text())
    # The stub lives inside the package (one installed from php/ alone cannot reach
    # ../stubs); stubs/delayq.stub.php, which the extension's tests read, links to it.
    shipped = package / "stubs" / "delayq.stub.php"
    assert shipped.is_file() and not shipped.is_symlink()
    assert (ROOT / "stubs" / "delayq.stub.php").resolve() == shipped.resolve(), \
        "stubs/delayq.stub.php should be a link to php/stubs/delayq.stub.php"
    # Never autoloaded: with the extension loaded, declaring its classes again is fatal.
    assert "files" not in manifest["autoload"] and "classmap" not in manifest["autoload"]
    for include in manifest["extra"]["phpstan"]["includes"]:
        neon = (package / include).read_text()
        for scanned in re.findall(r"(?m)^\s*-\s*(\S+\.php)\s*$", neon):
            assert (package / include).parent.joinpath(scanned).is_file(), scanned

    # PSR-4: every class file under src/ declares the namespace its path gives.
    ((prefix, directory),) = manifest["autoload"]["psr-4"].items()
    sources = sorted((package / directory).rglob("*.php"))
    assert sources
    for source in sources:
        relative = source.relative_to(package / directory).with_suffix("")
        namespace = (prefix + "\\".join(relative.parts[:-1])).rstrip("\\")
        text = source.read_text()
        assert re.search(rf"(?m)^namespace {re.escape(namespace)};$", text), f"{source}: not in {namespace}"
        assert re.search(rf"(?m)^(final |abstract )?(class|interface|trait|enum) {relative.name}\b", text), source
