"""The Python a local session gives its workers (:func:`rmqstore.spark.worker_python`): this
interpreter, importing the pip-installed PySpark rather than compiling it anew from
``pyspark.zip`` in every process Spark starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rmqstore.fixtures import FixtureOptions, generate
from rmqstore.spark import _installed_pyspark_archive, worker_python

# as the run started (modules are collected before any session starts)
PRESET = os.environ.get("PYSPARK_PYTHON")
PROBE = "import os, sys, pyspark; print(pyspark.__file__); print(os.environ.get('PYTHONPATH'))"


def test_the_launcher_drops_only_pysparks_own_archive(tmp_path: Path) -> None:
    archive = _installed_pyspark_archive()
    assert archive is not None  # PySpark is installed by pip here
    launcher = worker_python()
    assert launcher != sys.executable and worker_python() == launcher  # written once
    odd = [str(tmp_path / "a b"), str(tmp_path / "*"), f"{archive}x", "", str(tmp_path / "c")]
    for entries in ([str(archive), *odd], [*odd[:2], str(archive), *odd[2:], str(archive)], []):
        done = subprocess.run(
            [launcher, "-c", PROBE],
            env={**os.environ, "PYTHONPATH": os.pathsep.join(entries)},
            capture_output=True,
            text=True,
            check=True,
        )
        imported, path = done.stdout.splitlines()
        assert Path(imported).parent == archive.parent.parent.parent  # the installed package
        assert path == os.pathsep.join(entry for entry in entries if entry != str(archive))
    run = subprocess.run(
        [launcher, "-c", "import sys; print(sys.executable, sys.argv[1:])", "x y", "*"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert run.stdout.split(" ", 1) == [sys.executable, "['x y', '*']\n"]


@pytest.mark.spark
def test_a_local_sessions_workers_import_the_installed_pyspark(spark: Any, tmp_path: Path) -> None:
    if PRESET is not None:
        pytest.skip("PYSPARK_PYTHON was set before the session started: its workers use that")
    assert os.environ["PYSPARK_PYTHON"] == worker_python()
    archive = _installed_pyspark_archive()
    found = (
        spark.sparkContext.parallelize([0], 1)
        .map(lambda _: (__import__("pyspark").__file__, os.environ.get("PYTHONPATH", "")))
        .first()
    )
    assert archive is not None and Path(found[0]).parent == archive.parent.parent.parent
    assert str(archive) not in found[1].split(os.pathsep)
    # the data source's planning and reading processes start through it too
    manifest = generate("basic", tmp_path / "store", FixtureOptions())
    rows = (
        spark.read.format("rocketmq-commitlog").schema("file STRING").load(str(tmp_path / "store"))
    )
    assert rows.count() == manifest["messageCount"]
