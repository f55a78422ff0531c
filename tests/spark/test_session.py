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
from rmqstore.spark import ARROW_JAVA_OPTIONS, _installed_pyspark_archive, worker_python
from rmqstore.spark.sources import checked

from support import TEST_JVM_OPTIONS

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


@pytest.mark.spark
def test_a_session_reads_arrow_unchecked_and_the_sources_validate_each_batch(spark: Any) -> None:
    import pyarrow as pa

    system = spark.sparkContext._jvm.java.lang.System
    for option in ARROW_JAVA_OPTIONS:
        name, value = option.removeprefix("-D").split("=")
        assert system.getProperty(name) == value
    good = pa.record_batch([pa.array(["a", "bc"]), pa.array([1, 2])], names=["s", "n"])
    assert list(checked([good])) == [good]
    # the second string ends before it starts (a length of -1 for the JVM to copy): Arrow's
    # quick validation, which from_buffers runs, looks only at the last offset
    offsets = b"".join(number.to_bytes(4, "little") for number in (0, 2, 1))
    backwards = pa.Array.from_buffers(
        pa.string(), 2, [None, pa.py_buffer(offsets), pa.py_buffer(b"xy")]
    )
    with pytest.raises(pa.ArrowInvalid):
        list(checked([good, pa.record_batch([backwards, pa.array([1, 2])], names=["s", "n"])]))
    # the same in the keys of a map (the properties column)
    keys = pa.Array.from_buffers(pa.string(), 2, [None, pa.py_buffer(offsets), pa.py_buffer(b"xy")])
    pairs = pa.MapArray.from_arrays(pa.array([0, 2], pa.int32()), keys, pa.array(["v", "w"]))
    with pytest.raises(pa.ArrowInvalid):
        list(checked([pa.record_batch([pairs], names=["m"])]))
    fine = pa.MapArray.from_arrays(pa.array([0, 2], pa.int32()), ["k", "l"], ["v", "w"])
    assert list(checked([pa.record_batch([fine], names=["m"])]))
    # a null where the schema says there is none: the JVM would read it as a value
    schema = pa.schema([pa.field("s", pa.string(), nullable=False)])
    assert list(checked([pa.record_batch([pa.array(["a"])], schema=schema)]))
    with pytest.raises(ValueError, match="column s is declared not null but has nulls"):
        list(checked([pa.record_batch([pa.array(["a", None])], schema=schema)]))


ARCHIVED_JOB = """
import sys
from rmqstore.spark import spark_session
conf = {"spark.driver.extraJavaOptions": sys.argv[2]} if sys.argv[2] else {}
spark = spark_session("local[1]", conf)
print(spark.read.format("rocketmq-commitlog").load(sys.argv[1]).count())
"""


@pytest.mark.long
@pytest.mark.spark
@pytest.mark.slow
def test_a_class_archive_is_written_once_then_mapped(tmp_path: Path) -> None:
    """RMQSTORE_SPARK_CLASS_ARCHIVE: the first session's JVM writes the archive as the
    process ends (put in place whole, nothing said on the terminal); the next one loads
    Spark's classes from it."""
    manifest = generate("basic", tmp_path / "store", FixtureOptions())
    archive = tmp_path / "cache" / "spark.jsa"
    archive.parent.mkdir()
    env = {**os.environ, "RMQSTORE_SPARK_CLASS_ARCHIVE": str(archive)}

    def job(java_options: str = "") -> subprocess.CompletedProcess:
        done = subprocess.run(
            [sys.executable, "-c", ARCHIVED_JOB, str(tmp_path / "store"), java_options],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.split() == [str(manifest["messageCount"])], done.stdout[-3000:]
        assert "Traceback" not in done.stderr, done.stderr[-3000:]
        return done

    job(TEST_JVM_OPTIONS)
    assert archive.is_file() and archive.stat().st_size > 0
    assert [path.name for path in archive.parent.iterdir()] == ["spark.jsa"]  # no partial left
    loaded = tmp_path / "classes.log"
    job(f"{TEST_JVM_OPTIONS} -Xlog:class+load=info:file={loaded}")
    spark_lines = [line for line in loaded.read_text().splitlines() if "org.apache.spark." in line]
    shared = [line for line in spark_lines if "shared objects file (top)" in line]
    assert spark_lines and len(shared) > len(spark_lines) // 2, spark_lines[:5]


@pytest.mark.spark
def test_a_sessions_workers_use_the_c_librarys_allocator_for_arrow(spark: Any) -> None:
    """The sessions rmqstore starts give their Python workers (tasks, and data-source reads)
    Arrow's system memory pool, unless this process's environment names one."""
    named = os.environ.get("ARROW_DEFAULT_MEMORY_POOL")
    expected = named or "system"
    pools = (
        spark.sparkContext.parallelize([0, 1], 2)
        .map(lambda _: __import__("pyarrow").default_memory_pool().backend_name)
        .collect()
    )
    assert pools == [expected, expected]
    if named is None:
        assert spark.conf.get("spark.executorEnv.ARROW_DEFAULT_MEMORY_POOL") == "system"
