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
import functools
import os
import re
import shlex
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from rmqstore.errors import InputError, RmqStoreError
from rmqstore.wording import quoted

DEFAULT_MASTER = "local[*]"
_PACKAGE = Path(__file__).resolve().parent.parent
_LOG_CONFIG = Path(__file__).with_name("log4j2.properties")


class SparkUnavailable(RmqStoreError):
    """Spark cannot run here: pyspark or a Java 17+ is missing, or the session failed."""


PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
# false: the workers' Python has rmqstore installed (with its compiled kernel); do not ship the
# pure-Python package, which would come first on their path
SHIP_CONF = "spark.rmqstore.shipPackage"


def register(spark: Any, pushdown: bool = False) -> None:
    """Register rmqstore's data sources with a SparkSession. With ``pushdown`` the session's
    :data:`PUSHDOWN_CONF` is turned on and the sources take the filters Spark pushes down;
    without it (the default) they take none (Spark refuses a source that would take them
    while that setting is off).

    Pushdown is not the default because of a defect of Spark 4.1-4.3: a DataFrame from one
    ``load()`` keeps the read planned for its last query whose conditions were pushed, and a
    later query on it with no condition to push reuses that read, pushed conditions and all
    (``df.where("tags IS NULL").count()`` then ``df.count()`` counts the first again). With
    pushdown on, ``load()`` a DataFrame for each query."""
    from rmqstore.spark.sources import data_sources

    if pushdown:
        spark.conf.set(PUSHDOWN_CONF, "true")
    for source in data_sources(pushdown):
        spark.dataSource.register(source)


def spark_session(
    master: str = DEFAULT_MASTER, conf: dict[str, str] | None = None, app_name: str = "rmqstore"
) -> Any:
    """A SparkSession with the data sources registered. Local masters run executors on this
    interpreter; other masters get the rmqstore package shipped as a zip
    (:func:`package_archive`) unless ``conf`` sets :data:`SHIP_CONF` to false. The JVM's own
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
    if local and "PYSPARK_PYTHON" not in os.environ:
        os.environ["PYSPARK_PYTHON"] = worker_python()
    ship = (conf or {}).get(SHIP_CONF, "true").strip().lower() != "false"
    shipped = {"spark.submit.pyFiles": _with_package(conf or {})} if ship and not local else {}
    launching = SparkContext._active_spark_context is None
    archive_option, archive_written = class_archive_options() if launching else ("", None)
    java_options = (
        f"-Dlog4j.configurationFile={_LOG_CONFIG}",
        *ARROW_JAVA_OPTIONS,
        archive_option,
        (conf or {}).get("spark.driver.extraJavaOptions", ""),
    )
    settings = {
        "spark.app.name": app_name,
        "spark.master": master,
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "8" if local else "200",
        **({"spark.ui.enabled": "false"} if local else {}),
        **_worker_memory_pool(),
        **(conf or {}),
        "spark.driver.extraJavaOptions": " ".join(option for option in java_options if option),
        **shipped,
    }
    log_path = spark_log_path()
    _leave(log_path)
    logged_before = log_path.stat().st_size if log_path.is_file() else 0
    try:
        if launching:
            spark_conf = SparkConf(loadDefaults=False).setAll(list(settings.items()))
            with open(log_path, "ab") as log:
                gateway = launch_gateway(spark_conf, popen_kwargs={"stderr": log})
            if archive_written is not None:
                atexit.register(_install_class_archive, gateway.proc, *archive_written)
            SparkContext(conf=spark_conf, gateway=gateway)
        spark = SparkSession.builder.getOrCreate()
    except Exception as exc:  # the JVM failed to start: one sentence, no stack trace
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        first = launch_failure(log_path, logged_before) or first
        raise SparkUnavailable(
            f"Spark did not start ({master}): {first} (JVM log: {log_path}); or run without "
            "Spark: --engine local"
        ) from None
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def _log_text(log_path: Path, start: int | None, size: int) -> str | None:
    """At most ``size`` bytes of a JVM log from byte ``start`` (None: its last ``size``
    bytes), as text; None when the log cannot be read."""
    try:
        with open(log_path, "rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - size) if start is None else start)
            return log.read(size).decode("utf-8", "replace")
    except OSError:
        return None


_MAIN_THREAD_DIED = re.compile(
    r'Exception in thread "[^"]*" (?P<kind>[\w.$]+)(?::\s*(?P<message>.*))?$'
)
_FAILURE_READ = 1 << 16  # bytes of the log read for the reason


def launch_failure(log_path: Path, since: int) -> str | None:
    """Why a session's JVM stopped before PySpark could talk to it, as its log says after
    byte ``since`` (PySpark itself only says that the gateway exited): the message of the
    exception that ended its main thread (a master URL Spark does not know, a class it
    cannot find), else the first line the JVM wrote that is not a warning (a JVM refusing
    one of its options names it there); None when the log holds neither."""
    text = _log_text(log_path, since, _FAILURE_READ)
    if text is None:
        return None
    lines = [line.strip() for line in text.splitlines()]
    for line in lines:
        died = _MAIN_THREAD_DIED.match(line)
        if died is not None:
            return (died.group("message") or died.group("kind")).strip()[:300]
    for line in lines:
        if line and not line.startswith(("WARNING", "at ", "Picked up ")):
            return line[:300]
    return None


# the line a Python traceback ends with: the exception's type (dotted) and its message
_PYTHON_ERROR = re.compile(r"^(?P<kind>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)): ")
_WORKER_READ = 1 << 18  # bytes of the log's end read for a worker's last error


def worker_failure(log_path: Path) -> str | None:
    """The last error a Python process of a session wrote to its JVM's log (``kind:
    message`` ending a traceback): Spark reports a worker that died before it could send
    its error back (an import that failed) as having "crashed", and the reason is only in
    the log. None when the log holds no traceback."""
    text = _log_text(log_path, None, _WORKER_READ)
    if text is None:
        return None
    lines = text.splitlines()
    found = None
    for number, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last):"):
            for ending in lines[number + 1 :]:
                if _PYTHON_ERROR.match(ending):
                    found = ending.strip()[:300]
                    break
    return found


WORKER_POOL_CONF = "spark.executorEnv.ARROW_DEFAULT_MEMORY_POOL"


def _worker_memory_pool() -> dict[str, str]:
    """The Arrow memory pool of the Python workers of the sessions rmqstore starts: the C
    library's allocator, unless this process's environment names one. In a Python worker
    Arrow's default (mimalloc) made the first range each worker exported cost 0.2-0.4 s
    more than the next ones (its first allocations of each size), and a session's first
    export of the 1M store took 0.75-0.89 s against 0.64-0.70 s with the system allocator
    (four alternating sessions each, local[2]); later exports, and the local engine, the
    same or a little faster. ``conf`` (or ``--spark-conf``) may set :data:`WORKER_POOL_CONF`
    to another pool."""
    if os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        return {}
    return {WORKER_POOL_CONF: "system"}


# Spark reads the Arrow batches of a Python data source through ArrowColumnVector, where by
# default every null test and value read checks the buffer's bounds and reference count: 17%
# of the JVM's samples in a count() of every commit-log column. The sources validate each
# batch in full before Spark gets it (:func:`rmqstore.spark.sources.checked`), so in the
# sessions rmqstore starts the JVM skips those checks: count() of the 1M store on local[2]
# 0.90-1.08 s instead of 1.10-1.21 s. Options in the conf's spark.driver.extraJavaOptions come
# after these, so they can turn the checks back on
ARROW_JAVA_OPTIONS = (
    "-Darrow.enable_unsafe_memory_access=true",
    "-Darrow.enable_null_check_for_get=false",
)
CLASS_ARCHIVE_ENV = "RMQSTORE_SPARK_CLASS_ARCHIVE"


def class_archive_options() -> tuple[str, tuple[Path, Path] | None]:
    """The driver JVM's option for the class archive :data:`CLASS_ARCHIVE_ENV` names, and,
    when the JVM is to write one, (where it writes, where the archive goes); ("", None) when
    no archive is named.

    With Java's class data sharing a JVM maps the classes an earlier JVM loaded from one
    archive instead of reading each from its jar: a local session here started in 3.1 s
    instead of 4.8-5.3 s and answered its first query about 1 s sooner. An archive fits one
    Java and one set of jars (Spark's make it about 170 MB); a JVM that finds it does not fit
    runs without it. When the file is missing, this session's JVM writes it as it exits
    (once: that process took 22.6 s instead of 7.7 s, slower while recording and about 10 s
    writing), under a temporary name that :func:`_install_class_archive` renames into place
    once that JVM has exited."""
    named = os.environ.get(CLASS_ARCHIVE_ENV, "").strip()
    if not named:
        return "", None
    archive = Path(named).expanduser().absolute()
    # what the JVM says of the classes it cannot archive (hundreds of lines) goes to its log
    # (stderr), with its other warnings, not to the terminal (its stdout)
    logging = "-Xlog:disable -Xlog:all=warning:stderr:uptime,level,tags"
    if archive.is_file():
        return f"{logging} -XX:SharedArchiveFile={archive}", None
    partial = archive.with_name(f".{archive.name}.{os.getpid()}.partial")
    return f"{logging} -XX:ArchiveClassesAtExit={partial}", (partial, archive)


def _install_class_archive(jvm: Any, partial: Path, archive: Path) -> None:
    """At this process's exit: stop the session, end its JVM (it exits when its stdin
    closes, and writes the class archive as it does), wait for it, and put the archive in
    place unless another process did first."""
    with contextlib.suppress(Exception):
        from pyspark import SparkContext

        if SparkContext._active_spark_context is not None:  # its threads expect the JVM
            SparkContext._active_spark_context.stop()
    with contextlib.suppress(Exception):
        if jvm.stdin is not None:
            jvm.stdin.close()
        jvm.wait(timeout=120)
    with contextlib.suppress(OSError):
        if partial.is_file() and partial.stat().st_size and not archive.exists():
            os.replace(partial, archive)
    with contextlib.suppress(OSError):
        partial.unlink()


@functools.cache  # one launcher a process
def worker_python() -> str:
    """What to set ``PYSPARK_PYTHON`` to for a local session: this interpreter, through a
    launcher when PySpark was installed by pip.

    Spark puts PySpark's own ``pyspark.zip`` first on the path of every Python process it
    starts. Python compiles each module it imports from an archive anew, and every such
    process pays for it: each kind of planning step and of task gets its own daemon, which
    imports PySpark before forking workers that import more of it (about 0.4 s a process
    here). Where the archive sits inside the pyspark package this interpreter imports (a pip
    install), it holds the same code, which pip compiled once. The launcher (a shell script,
    removed when the process ends) drops that one entry from ``PYTHONPATH`` and runs this
    interpreter. A first data-source query of a session then answered in 7.7 s from the
    session's start instead of 9.8-10.0 s. Anywhere else this returns the interpreter
    itself."""
    archive = _installed_pyspark_archive()
    if archive is None:
        return sys.executable
    folder = Path(tempfile.mkdtemp(prefix="rmqstore-python-"))
    _leave(folder)
    launcher = folder / "python"
    launcher.write_text(
        "#!/bin/sh\n"
        "# rmqstore: this interpreter without PySpark's pyspark.zip on PYTHONPATH (see\n"
        "# rmqstore.spark.worker_python)\n"
        "set -f\n"
        f"archive={shlex.quote(str(archive))}\n"
        "kept=\n"
        "first=1\n"
        "IFS=:\n"
        "for entry in ${PYTHONPATH-}; do\n"
        '  if [ "$entry" != "$archive" ]; then\n'
        '    if [ -n "$first" ]; then kept=$entry; first=; else kept=$kept:$entry; fi\n'
        "  fi\n"
        "done\n"
        "unset IFS\n"
        "PYTHONPATH=$kept\n"
        "export PYTHONPATH\n"
        f'exec {shlex.quote(sys.executable)} "$@"\n'
    )
    launcher.chmod(0o700)
    return str(launcher)


def _installed_pyspark_archive() -> Path | None:
    """PySpark's ``python/lib/pyspark.zip`` when it lies inside the pyspark package this
    interpreter imports from a folder, as a pip install has it; None otherwise (a Spark
    distribution's own layout, no PySpark)."""
    try:
        import pyspark
    except ImportError:
        return None
    package = Path(pyspark.__file__).parent
    archive = package / "python" / "lib" / "pyspark.zip"
    if ".zip" in str(package) or not archive.is_file():
        return None
    return archive


# the per-run files a session leaves (its JVM log, the shipped package's folder): removed when
# the process ends, unless keep_log() was called because something failed
_LEFT_BEHIND: list[Path] = []
_KEEP = False


def _leave(path: Path) -> None:
    """Remove ``path`` when the process ends (see :func:`keep_log`)."""
    _LEFT_BEHIND.append(path)
    if len(_LEFT_BEHIND) == 1:
        atexit.register(_clean_up)


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


def package_archive() -> Path:
    """The rmqstore package (its Python modules) as a zip for executors' ``sys.path``: what
    ``--py-files`` takes. Removed when the process ends. Executors importing it run the
    pure-Python record kernel (a compiled module cannot be imported from a zip)."""
    folder = Path(tempfile.mkdtemp(prefix="rmqstore-"))
    _leave(folder)
    archive = folder / "rmqstore.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as bundle:
        for path in sorted(_PACKAGE.rglob("*.py")):
            bundle.write(path, Path("rmqstore") / path.relative_to(_PACKAGE))
    return archive


def _with_package(conf: dict[str, str]) -> str:
    """``spark.submit.pyFiles`` with the package archive added: set before the context
    starts, it reaches the executors and the driver's own Python workers (those that plan a
    data source's reads), which a later ``addPyFile`` does not."""
    given = conf.get("spark.submit.pyFiles", "")
    return ",".join(item for item in (given, str(package_archive())) if item)


def parse_conf(items: tuple[str, ...] | list[str]) -> dict[str, str]:
    """``k=v`` strings (``--spark-conf``) as a dict."""
    conf = {}
    for item in items:
        key, separator, value = item.partition("=")
        if not separator or not key:
            raise InputError(f"--spark-conf {quoted(item)} is not KEY=VALUE")
        conf[key.strip()] = value.strip()
    return conf
