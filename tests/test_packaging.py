"""A non-editable install into a fresh virtualenv works: ``rmqstore --help``, the
``rmqstore.commands`` mapping of the top-level commands/ folder, the compiled kernel built by
the install, and an install with no C compiler running on the pure-Python kernel."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from support import REPO

pytestmark = pytest.mark.install


@pytest.mark.long
@pytest.mark.slow
def test_wheel_installs_into_a_fresh_virtualenv(tmp_path: Path) -> None:
    wheel = _build_wheel(REPO, tmp_path / "wheels")
    environment = _install(wheel, tmp_path / "venv")
    python = environment / "bin" / "python"
    result = subprocess.run(
        [str(environment / "bin" / "rmqstore"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "Commands:" in result.stdout and "append" in result.stdout
    located = subprocess.run(
        [str(python), "-c", "import rmqstore.commands.main as m; print(m.__file__)"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=True,
    )
    assert str(environment) in located.stdout  # the installed copy, not the checkout
    shipped = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.resources as r; "
            "print(r.files('rmqstore.spark').joinpath('log4j2.properties').is_file())",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=True,
    )
    assert shipped.stdout.strip() == "True"  # Spark's logging setup travels with the wheel
    version = subprocess.run(
        [str(environment / "bin" / "rmqstore"), "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=True,
        env=_without_kernel_choice(),
    )
    assert "record kernel: native (compiled)" in version.stdout


@pytest.mark.slow
def test_without_a_compiler_the_install_succeeds_on_the_reference_kernel(tmp_path: Path) -> None:
    """A machine with no C compiler (CC fails): the wheel builds without the compiled kernel,
    installs, says so, and works."""
    source = tmp_path / "source"
    files = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    for name in files:  # a clean tree: no compiled kernel or build/ left by another build
        target = source / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target)
    env = {**os.environ, "CC": "/bin/false"}
    env.pop("RMQSTORE_REQUIRE_NATIVE", None)
    wheel = _build_wheel(source, tmp_path / "wheels", env)
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert "rmqstore/kernel/reference.py" in names
    assert not [name for name in names if name.endswith(".so")]
    environment = _install(wheel, tmp_path / "venv")
    rmqstore = str(environment / "bin" / "rmqstore")
    clean_env = _without_kernel_choice()
    version = subprocess.run(
        [rmqstore, "--version"], capture_output=True, text=True, cwd=tmp_path, env=clean_env
    )
    assert "record kernel: python (pure-Python reference" in version.stdout, version.stderr
    store = tmp_path / "store"
    for command in (["fixtures", "generate", "basic", str(store)], ["verify", str(store)]):
        done = subprocess.run(
            [rmqstore, *command], capture_output=True, text=True, cwd=tmp_path, env=clean_env
        )
        assert done.returncode == 0, done.stderr
    # installed without extras: what needs one says which, never an internal error
    for command in (
        ["stats", str(store)],
        ["export", str(store), "--to", str(tmp_path / "out"), "--format", "jsonl"],
        ["export", str(store), "--to", str(tmp_path / "out2"), "--engine", "spark"],
    ):
        done = subprocess.run(
            [rmqstore, *command], capture_output=True, text=True, cwd=tmp_path, env=clean_env
        )
        assert done.returncode in (0, 2), (command, done.stderr)
        if done.returncode == 2:
            assert "rmqstore[spark]" in done.stderr, (command, done.stderr)
    # the man pages install with the package, where man(1) finds them from PATH
    assert (environment / "share" / "man" / "man1" / "rmqstore-read.1").is_file()
    assert (environment / "share" / "man" / "man5" / "rmqstore-store.5").is_file()
    if shutil.which("man"):
        found = subprocess.run(
            ["man", "-w", "rmqstore-read"],
            capture_output=True,
            text=True,
            env={**clean_env, "PATH": f"{environment / 'bin'}:{os.environ['PATH']}"},
        )
        assert found.stdout.strip().endswith("rmqstore-read.1"), found.stderr


def _build_wheel(source: Path, wheels: Path, env: dict[str, str] | None = None) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(source)],
        check=True,
        timeout=600,
        env=env,
    )
    (wheel,) = wheels.glob("rmqstore-*.whl")
    return wheel


def _install(wheel: Path, environment: Path) -> Path:
    """A fresh virtualenv at ``environment`` with ``wheel`` installed."""
    venv.create(environment, with_pip=True)
    python = environment / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", str(wheel)], check=True, timeout=600
    )
    return environment


def _without_kernel_choice() -> dict[str, str]:
    """The environment without RMQSTORE_KERNEL (make test's second pass sets it)."""
    return {name: value for name, value in os.environ.items() if name != "RMQSTORE_KERNEL"}
