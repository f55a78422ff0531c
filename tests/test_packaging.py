"""A non-editable install into a fresh virtualenv works: ``rmqstore --help`` and the
``rmqstore.commands`` mapping of the top-level commands/ folder."""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest

from support import REPO


@pytest.mark.slow
def test_wheel_installs_into_a_fresh_virtualenv(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--quiet",
            "-w",
            str(wheels),
            str(REPO),
        ],
        check=True,
        timeout=600,
    )
    (wheel,) = wheels.glob("rmqstore-*.whl")
    environment = tmp_path / "venv"
    venv.create(environment, with_pip=True)
    python = environment / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", str(wheel)], check=True, timeout=600
    )
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
