"""The Spark pipeline for very large stores: Python Data Sources (``rocketmq-commitlog``,
``rocketmq-consumequeue``) over the shared engine, and the jobs built on them.

Usable from any PySpark program::

    from rmqstore.spark import register
    register(spark)
    spark.read.format("rocketmq-commitlog").load("/data/store")

This module imports pyspark only when a session is needed, so the engine and CLI work
without it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from rmqstore.errors import InputError, RmqStoreError

DEFAULT_MASTER = "local[*]"
_PACKAGE = Path(__file__).resolve().parent.parent
_LOG_CONFIG = Path(__file__).with_name("log4j2.properties")


class SparkUnavailable(RmqStoreError):
    """Spark cannot run here: pyspark or a Java 17+ is missing, or the session failed."""


def register(spark: Any) -> None:
    """Register rmqstore's data sources with a SparkSession."""
    from rmqstore.spark.sources import CommitLogDataSource, ConsumeQueueDataSource

    spark.dataSource.register(CommitLogDataSource)
    spark.dataSource.register(ConsumeQueueDataSource)


def spark_session(
    master: str = DEFAULT_MASTER, conf: dict[str, str] | None = None, app_name: str = "rmqstore"
) -> Any:
    """A SparkSession with the data sources registered. Local masters run executors on this
    interpreter; other masters get the rmqstore package shipped as a zip. The JVM's own
    output goes to a log file (:func:`spark_log_path`), not to the terminal."""
    from rmqstore.spark.javacheck import JavaMissing, require_java

    try:
        require_java()
    except JavaMissing as exc:
        raise SparkUnavailable(f"{exc}; or run without Spark: --engine local") from None
    try:
        from pyspark import SparkConf, SparkContext
        from pyspark.java_gateway import launch_gateway
        from pyspark.sql import SparkSession
    except ImportError:
        raise SparkUnavailable(
            "the Spark pipeline needs pyspark and pyarrow: pip install 'rmqstore[spark]'; or "
            "run without Spark: --engine local"
        ) from None
    local = master.startswith("local")
    if local:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    settings = {
        "spark.app.name": app_name,
        "spark.master": master,
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.extraJavaOptions": f"-Dlog4j.configurationFile={_LOG_CONFIG}",
        "spark.sql.shuffle.partitions": "8" if local else "200",
        **({"spark.ui.enabled": "false"} if local else {}),
        **(conf or {}),
    }
    log_path = spark_log_path()
    _LEFT_BEHIND.append(log_path)
    if len(_LEFT_BEHIND) == 1:
        atexit.register(_clean_up)
    try:
        if SparkContext._active_spark_context is None:
            spark_conf = SparkConf(loadDefaults=False).setAll(list(settings.items()))
            with open(log_path, "ab") as log:
                gateway = launch_gateway(spark_conf, popen_kwargs={"stderr": log})
            SparkContext(conf=spark_conf, gateway=gateway)
        spark = SparkSession.builder.getOrCreate()
    except Exception as exc:  # the JVM failed to start: one sentence, no stack trace
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SparkUnavailable(
            f"Spark did not start ({master}): {first} (JVM log: {log_path}); or run without "
            "Spark: --engine local"
        ) from None
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    if not local:
        ship_package(spark)
    return spark


# the per-run files a session leaves (its JVM log, the shipped package's folder): removed when
# the process ends, unless keep_log() was called because something failed
_LEFT_BEHIND: list[Path] = []
_KEEP = False


def keep_log() -> None:
    """Something failed: leave this run's JVM log in place (an error message names it)."""
    global _KEEP
    _KEEP = True


def _clean_up() -> None:
    for path in _LEFT_BEHIND:
        if _KEEP and path.suffix == ".log":
            continue
        with contextlib.suppress(OSError):
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()


def spark_log_path() -> Path:
    """Where the JVM of this process's Spark session writes its output."""
    return Path(tempfile.gettempdir()) / f"rmqstore-spark-{os.getpid()}.log"


def ship_package(spark: Any) -> Path:
    """Add the rmqstore package (pure Python) to the executors' path."""
    folder = Path(tempfile.mkdtemp(prefix="rmqstore-"))
    _LEFT_BEHIND.append(folder)
    archive = folder / "rmqstore.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as bundle:
        for path in sorted(_PACKAGE.rglob("*.py")):
            bundle.write(path, Path("rmqstore") / path.relative_to(_PACKAGE))
    spark.sparkContext.addPyFile(str(archive))
    return archive


def parse_conf(items: tuple[str, ...] | list[str]) -> dict[str, str]:
    """``k=v`` strings (``--spark-conf``) as a dict."""
    conf = {}
    for item in items:
        key, separator, value = item.partition("=")
        if not separator or not key:
            raise InputError(f"--spark-conf {item!r} is not KEY=VALUE")
        conf[key.strip()] = value.strip()
    return conf
