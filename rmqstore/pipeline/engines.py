"""Which engine runs a pipeline command when the user leaves it to rmqstore (``--engine
auto``): Spark pays for its start-up (seconds, a JVM) only on big stores, and cannot run
without pyspark and Java 17+."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from rmqstore.pipeline.location import StoreLocation

AUTO_SPARK_BYTES = 16 * 1024**3  # commit-log bytes from which auto picks Spark
# a commit-log file counts for at most the largest mappedFileSizeCommitLog (a Java int): a
# bigger one (a sparse file grown by mistake or damage) is refused by either engine, and
# should not start Spark first
LARGEST_FILE_BYTES = 2**31 - 1


@dataclass(frozen=True)
class EngineDecision:
    name: str  # "local" or "spark"
    reason: str


def choose_engine(store: str, *, spark_asked: bool, jobs: int) -> EngineDecision:
    """The engine ``--engine auto`` runs on ``store`` (a path or URI). ``spark_asked``: a
    Spark setting was given (``--master``, ``--spark-conf``); ``jobs``: the local worker
    processes asked for."""
    if jobs > 1:
        return EngineDecision("local", f"--jobs {jobs} asks for local worker processes")
    size = sum(
        min(size, LARGEST_FILE_BYTES) for _, size in StoreLocation(store).segments("commitlog")
    )
    if size < AUTO_SPARK_BYTES and not spark_asked:
        return EngineDecision(
            "local",
            f"a commit log of {_human(size)}, under the {_human(AUTO_SPARK_BYTES)} from which "
            "Spark's start-up pays off",
        )
    if importlib.util.find_spec("pyspark") is None:
        return EngineDecision("local", "pyspark is not installed (pip install 'rmqstore[spark]')")
    from rmqstore.spark.javacheck import JavaMissing, require_java

    try:
        require_java()
    except JavaMissing as exc:
        return EngineDecision("local", f"Spark cannot start: {exc}")
    if spark_asked:
        return EngineDecision("spark", "Spark settings (--master, --spark-conf) were given")
    return EngineDecision("spark", f"the commit log is {_human(size)}")


def _human(size: int) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size >= scale:
            return f"{size / scale:.1f}".removesuffix(".0") + f" {unit}"
    return f"{size} bytes"
