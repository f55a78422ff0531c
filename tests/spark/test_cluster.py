"""A job whose Spark workers run a Python without rmqstore, as on a cluster: with the package
shipped as ``--py-files`` ships it (``spark.submit.pyFiles``,
:func:`rmqstore.spark.package_archive`), the data source is planned and read there and gives
what the local engine gives. In a process of its own: a worker's Python is fixed when a
session starts."""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from rmqstore.store import Store

from support import TEST_JVM_OPTIONS

pytestmark = pytest.mark.spark

JOB = """
import json, sys
from rmqstore.spark import package_archive, spark_session
conf = {"spark.submit.pyFiles": str(package_archive())}
conf["spark.driver.extraJavaOptions"] = sys.argv[2]
spark = spark_session("local[1]", conf=conf)
workers = spark.sparkContext.parallelize([0], 1).map(lambda _: __import__("sys").executable)
frame = spark.read.format("rocketmq-commitlog").load(sys.argv[1])
counts = sorted(map(list, frame.groupBy("topic").count().collect()))
print(json.dumps({"worker": workers.first(), "counts": counts}))
"""


def bare_python(root: Path) -> Path:
    """A Python with pyarrow and pyspark (this environment's site-packages, by a .pth line)
    but not rmqstore: an editable install is found through a .pth of its own, which a
    directory added that way does not run."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    packages = subprocess.run(
        [str(python), "-c", "import site; print(site.getsitepackages()[0])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(packages, "outer.pth").write_text(site.getsitepackages()[0] + "\n")
    return python


@pytest.mark.long
@pytest.mark.slow
def test_workers_without_rmqstore_read_with_the_package_shipped(oracle, tmp_path: Path) -> None:
    python = bare_python(tmp_path / "bare")
    probe = "import pyarrow, pyspark\ntry:\n import rmqstore\nexcept ImportError: print('no')"
    tried = subprocess.run([str(python), "-c", probe], cwd=tmp_path, capture_output=True, text=True)
    assert tried.stdout == "no\n", tried.stderr
    store = oracle("v533_s1_multi").store
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", JOB, str(store), TEST_JVM_OPTIONS],
        env={  # the workers' kernel is the zip's reference, whatever this pass requires
            **{key: value for key, value in os.environ.items() if key != "RMQSTORE_KERNEL"},
            "PYSPARK_PYTHON": str(python),
            "TMPDIR": str(temporary),
        },
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["worker"] == str(python)
    left = [path.name for path in temporary.iterdir() if path.name.startswith("rmqstore-")]
    assert not left  # the run's JVM log and the package it shipped are removed when it ends
    with Store.open_read(store) as opened:
        expected: dict[str, int] = {}
        for _offset, _header, topic, *_ in opened.commitlog.scan():
            expected[topic] = expected.get(topic, 0) + 1
    assert dict(map(tuple, found["counts"])) == expected


def test_a_session_on_a_cluster_master_ships_the_package_unless_told_not_to() -> None:
    from rmqstore.spark import _with_package

    given = _with_package({"spark.submit.pyFiles": "deps.zip"}).split(",")
    assert given[0] == "deps.zip" and given[1].endswith("rmqstore.zip")
    with zipfile.ZipFile(given[1]) as bundle:
        names = set(bundle.namelist())
    assert {
        "rmqstore/__init__.py",
        "rmqstore/spark/sources.py",
        "rmqstore/kernel/reference.py",
    } <= names
    assert not any(name.endswith(".so") for name in names)  # the zip's kernel is the reference
