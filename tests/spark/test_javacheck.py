"""Without a Java 17+ the Spark engine says what to install, in one line, and exits 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rmqstore.fixtures import generate
from rmqstore.spark import launch_failure, worker_failure


def run_without_java(tmp_path: Path, java: str | None, *args: str) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if java is not None:
        fake = bin_dir / "java"
        fake.write_text(f"#!/bin/sh\necho '{java}' >&2\n")
        fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "SPARK_HOME")}
    env["PATH"] = str(bin_dir)
    return subprocess.run(
        [sys.executable, "-m", "rmqstore", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_no_java(tmp_path: Path) -> None:
    generate("basic", tmp_path / "store")
    store = str(tmp_path / "store")
    result = run_without_java(tmp_path, None, "export", store, "--to", "x", "--engine", "spark")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "Java 17 or newer" in result.stderr and "JAVA_HOME" in result.stderr
    assert "--engine local" in result.stderr
    assert not (tmp_path / "x").exists()
    # left to rmqstore, a small store runs here without asking for Java
    auto = run_without_java(tmp_path, None, "export", store, "--to", str(tmp_path / "y"))
    assert auto.returncode == 0, auto.stderr
    assert "engine: local (a commit log of" in auto.stderr
    # Spark settings ask for Spark; without Java auto says so and runs here
    asked = run_without_java(tmp_path, None, "stats", store, "--master", "local[2]")
    assert asked.returncode == 0, asked.stderr
    assert "engine: local (Spark cannot start: Spark needs Java 17" in asked.stderr


def test_an_old_java(tmp_path: Path) -> None:
    generate("basic", tmp_path / "store")
    old = 'openjdk version "11.0.22" 2024-01-16'
    result = run_without_java(tmp_path, old, "verify", str(tmp_path / "store"), "--engine", "spark")
    assert result.returncode == 2 and "is Java 11" in result.stderr


def test_the_local_engine_needs_no_java(tmp_path: Path) -> None:
    generate("basic", tmp_path / "store")
    out = tmp_path / "out"
    result = run_without_java(
        tmp_path, None, "export", str(tmp_path / "store"), "--to", str(out), "--engine", "local"
    )
    assert result.returncode == 0, result.stderr
    assert (out / "part-00000.parquet").is_file()


def failed_spark_stats(tmp_path: Path, master: str, **env: str) -> tuple[str, Path]:
    """``rmqstore stats --engine spark`` of a small store, expected to fail (exit 2): its
    stderr, and the JVM log it kept (in a TMPDIR of its own)."""
    generate("basic", tmp_path / "store")
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    failed = subprocess.run(
        [
            sys.executable, "-m", "rmqstore", "stats", str(tmp_path / "store"),
            "--engine", "spark", "--master", master,
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "TMPDIR": str(temporary), **env},
        timeout=300,
    )  # fmt: skip
    assert failed.returncode == 2, failed.stderr
    kept = list(temporary.glob("rmqstore-spark-*.log"))
    assert len(kept) == 1 and str(kept[0]) in failed.stderr
    return failed.stderr, kept[0]


@pytest.mark.spark
def test_a_failed_spark_run_keeps_its_log(tmp_path: Path) -> None:
    """(A run that succeeds leaves nothing behind: tests/spark/test_cluster.py.)"""
    stderr, kept = failed_spark_stats(tmp_path, "nonsense://nowhere")
    # the reason is the JVM's own, read from that log, not PySpark's "the gateway exited"
    said = stderr.split("Spark did not start (nonsense://nowhere): ", 1)[1]
    reason = said.split(" (JVM log: ", 1)[0]
    assert "GATEWAY" not in reason and "Master" in reason and reason in kept.read_text()


@pytest.mark.spark
def test_a_worker_python_without_pyarrow_is_named_with_the_error_it_ended_with(
    tmp_path: Path,
) -> None:
    """Spark only says such a worker "crashed"; what it wrote before dying is in the log."""
    bare = tmp_path / "bare-python"  # this Python without its site-packages: no pyarrow
    bare.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    bare.chmod(0o755)
    stderr, _ = failed_spark_stats(tmp_path, "local[1]", PYSPARK_PYTHON=str(bare))
    assert stderr.count("\n") == 1 and "Traceback" not in stderr
    assert "a Python worker ended with ModuleNotFoundError: No module named 'pyarrow'" in stderr
    assert f"the workers run {bare} (PYSPARK_PYTHON)" in stderr


def test_a_workers_last_error_is_read_from_the_log(tmp_path: Path) -> None:
    log = tmp_path / "spark.log"
    log.write_text(
        "Traceback (most recent call last):\n"
        '  File "x.py", line 1, in <module>\n'
        "ValueError: an earlier one\n"
        "WARNING: something else\n"
        "Traceback (most recent call last):\n"
        '  File "daemon.py", line 84, in worker\n'
        "    import pyarrow as pa\n"
        "ModuleNotFoundError: No module named 'pyarrow'\n"
        "25/11/28 ERROR Executor: Exception in task 0.0\n"
    )
    assert worker_failure(log) == "ModuleNotFoundError: No module named 'pyarrow'"
    log.write_text("Traceback (most recent call last):\n  File ...\n")  # cut short
    assert worker_failure(log) is None
    assert worker_failure(tmp_path / "missing.log") is None


def test_the_reason_a_jvm_did_not_start_is_read_from_its_log(tmp_path: Path) -> None:
    log = tmp_path / "spark.log"
    earlier = 'Exception in thread "main" java.lang.IllegalStateException: an earlier run\n'
    log.write_text(earlier)
    since = log.stat().st_size
    with log.open("a") as out:  # what a JVM whose main thread died writes
        out.write(
            "WARNING: Using incubator modules: jdk.incubator.vector\n"
            'Exception in thread "main" org.apache.spark.SparkException: Master must be local\n'
            "\tat org.apache.spark.deploy.SparkSubmit.error(SparkSubmit.scala:1068)\n"
        )
    assert launch_failure(log, since) == "Master must be local"
    assert launch_failure(log, 0) == "an earlier run"  # only what follows `since` counts
    log.write_text('WARNING: x\nException in thread "main" java.lang.NoClassDefFoundError\n')
    assert launch_failure(log, 0) == "java.lang.NoClassDefFoundError"  # no message: its kind
    log.write_text("Picked up JAVA_TOOL_OPTIONS: -Xss1m\nInvalid maximum heap size: -Xmxabc\n")
    assert launch_failure(log, 0) == "Invalid maximum heap size: -Xmxabc"  # JVM refused it
    log.write_text("WARNING: only warnings\n\n")
    assert launch_failure(log, 0) is None
    assert launch_failure(tmp_path / "missing.log", 0) is None
