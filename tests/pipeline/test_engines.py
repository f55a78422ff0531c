"""``--engine auto``: the engine a pipeline command runs when the user leaves it to rmqstore,
and why."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from rmqstore.fixtures import generate
from rmqstore.pipeline import engines
from rmqstore.spark import javacheck

from support import run_cli


@pytest.fixture
def store(tmp_path: Path) -> str:
    generate("basic", tmp_path / "store")
    return str(tmp_path / "store")


def test_a_small_store_runs_here(store: str) -> None:
    decision = engines.choose_engine(store, spark_asked=False, jobs=1)
    assert decision.name == "local" and "under the 16 GiB" in decision.reason


def test_worker_processes_are_the_local_engine(store: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(engines, "AUTO_SPARK_BYTES", 1)
    decision = engines.choose_engine(store, spark_asked=True, jobs=3)
    assert decision == engines.EngineDecision("local", "--jobs 3 asks for local worker processes")


def test_a_big_store_runs_on_spark_when_spark_can_start(store: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(engines, "AUTO_SPARK_BYTES", 1024)
    monkeypatch.setattr(javacheck, "require_java", lambda: "/usr/bin/java")
    real_find_spec = importlib.util.find_spec
    installed = real_find_spec("pyspark") is not None
    decision = engines.choose_engine(store, spark_asked=False, jobs=1)
    assert decision.name == ("spark" if installed else "local")

    def no_pyspark(name: str, *args):  # type: ignore[no-untyped-def]
        return None if name == "pyspark" else real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", no_pyspark)
    decision = engines.choose_engine(store, spark_asked=False, jobs=1)
    assert decision.name == "local" and "pyspark is not installed" in decision.reason


def test_without_java_auto_stays_here(store: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    if importlib.util.find_spec("pyspark") is None:
        pytest.skip("pyspark is not installed: the pyspark rule decides first")

    def missing() -> str:
        raise javacheck.JavaMissing("no java here")

    monkeypatch.setattr(javacheck, "require_java", missing)
    decision = engines.choose_engine(store, spark_asked=True, jobs=1)
    assert decision == engines.EngineDecision("local", "Spark cannot start: no java here")


def test_a_commit_log_file_grown_past_any_brokers_size_does_not_start_spark(store: str) -> None:
    """A file of 20 GiB (sparse: grown by mistake or damage) counts as the largest file a
    broker writes, 2 GiB: auto stays here, and the command's one-line error about the file
    comes at once (it came after Spark's start-up, 13.6 s, as `stats` picked Spark for a
    20 GiB commit log)."""
    last = sorted((Path(store) / "commitlog").iterdir())[-1]
    os.truncate(last, 20 * 1024**3)
    decision = engines.choose_engine(store, spark_asked=False, jobs=1)
    assert decision.name == "local" and "a commit log of 2 GiB" in decision.reason
    done = run_cli("stats", store)
    assert done.exit_code == 2, done.stderr
    assert "engine: local" in done.stderr and "is 21474836480 bytes" in done.stderr
