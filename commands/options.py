"""Option bundles shared by the commands (the sqlite-utils style: one decorator per bundle)."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from rmqstore.commands.output import note
from rmqstore.config import (
    JAVA_INT_MAX,
    LARGEST_CONSUMEQUEUE_FILE_SIZE,
    SMALLEST_COMMITLOG_FILE_SIZE,
    SMALLEST_INDEX_ENTRIES,
    SMALLEST_INDEX_SLOTS,
    SMALLEST_SPLIT_SIZE,
    StoreConfig,
    check_index_geometry,
    left_broker_config,
    load_broker_config,
    round_consumequeue_size,
)
from rmqstore.errors import TopicError
from rmqstore.topics import check_topic_path_safe

F = Callable[..., Any]

_EMPTY = "is empty (an unset variable?): give a path; . names the current directory"


_DIGIT_GROUPS = re.compile(r"-?\d{1,3}(?:,\d{3})+")


class Number(click.IntRange):
    """An integer option in a range that also takes a number written as rmqstore shows
    numbers, in groups of three digits (``1,073,741,824``), so a size or an offset copied
    from ``info`` or ``stats`` goes back into an option as it is."""

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if isinstance(value, str) and _DIGIT_GROUPS.fullmatch(value.strip()):
            value = value.replace(",", "")
        return super().convert(value, param, ctx)


class GivenPath(click.Path):
    """``click.Path`` refusing an empty string, which would name the current directory: a
    script's ``rmqstore recover "$STORE" --yes`` with STORE unset must not recover the
    store it happens to run in."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and value == "":
            self.fail(_EMPTY, param, ctx)
        return super().convert(value, param, ctx)


def refuse_empty(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """A callback refusing an empty string for a path or URI given as text."""
    if value == "":
        raise click.BadParameter(_EMPTY, ctx=ctx, param=param)
    return value


def refuse_empty_text(what: str) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """A callback refusing an empty string (one value or one of several) where ``what``
    (a topic name, a key, ...) is wanted: a script's ``--topic "$TOPIC"`` with TOPIC unset
    would otherwise count, export or check no message and report success."""

    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value == "" or (isinstance(value, tuple) and "" in value):
            raise click.BadParameter(f"is empty (an unset variable?): give {what}", ctx, param)
        return value

    return callback


def _topic_names(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """``--topic`` values: none empty, and each one a name a topic can have in a store (its
    consume queues' folder name: no path separator, not ``.`` or ``..``)."""
    value = refuse_empty_text("a topic name")(ctx, param, value)
    for topic in value:
        try:
            check_topic_path_safe(topic)
        except TopicError as exc:
            raise click.BadParameter(str(exc), ctx, param) from None
    return value


def topics_option(help: str) -> Callable[[F], F]:
    """``--topic T`` (repeatable) into ``topics``: an empty one, or one no topic of a store
    can be named (a path), is refused."""
    return click.option(
        "--topic",
        "topics",
        multiple=True,
        metavar="T",
        callback=_topic_names,
        help=help,
    )


store_argument = click.argument(
    "store", type=GivenPath(path_type=Path, file_okay=True, dir_okay=True), metavar="STORE"
)

# a store the Spark pipeline reads: a path, or a pyarrow URI (s3://, hdfs://, gs://, file://)
store_location_argument = click.argument("store", metavar="STORE", callback=refuse_empty)

_CONFIG_OPTIONS = [
    click.option(
        "--broker-config",
        type=GivenPath(path_type=Path, dir_okay=False),
        help="Read store settings (file sizes, index geometry, CRC switches, "
        "storePathCommitLog, ...) from the broker's broker.conf, as the broker reads it "
        "(ISO 8859-1; a value the broker would ignore or read as false is refused).",
    ),
    click.option(
        "--commitlog-file-size",
        type=Number(min=SMALLEST_COMMITLOG_FILE_SIZE, max=JAVA_INT_MAX),
        metavar="BYTES",
        help="Commit-log file size (mappedFileSizeCommitLog); default: the size of "
        "the existing files, else 1073741824.",
    ),
    click.option(
        "--consumequeue-file-size",
        type=Number(min=20, max=LARGEST_CONSUMEQUEUE_FILE_SIZE),
        metavar="BYTES",
        help="Consume-queue file size (mappedFileSizeConsumeQueue), rounded up to a "
        "multiple of 20; default: existing files, else 6000000.",
    ),
    click.option(
        "--index-slots",
        type=Number(min=SMALLEST_INDEX_SLOTS, max=JAVA_INT_MAX),
        metavar="N",
        help="Index hash slots per file (maxHashSlotNum); default 5000000. Writers take "
        "at most 1,024 an entry (--index-entries): they reserve a file's slots whole.",
    ),
    click.option(
        "--index-entries",
        type=Number(min=SMALLEST_INDEX_ENTRIES, max=JAVA_INT_MAX),
        metavar="N",
        help="Index entries per file (maxIndexNum); default 20000000.",
    ),
]


def store_config_options(func: F) -> F:
    """Adds ``--broker-config`` and the geometry overrides; passes ``config: StoreConfig``."""

    @functools.wraps(func)
    def wrapper(**kwargs: Any) -> Any:
        broker_config = kwargs.pop("broker_config")
        store = kwargs.get("store")
        local_root = Path(store) if store is not None and "://" not in str(store) else None
        if broker_config is None and local_root is not None:
            broker_config = left_broker_config(local_root)
        config = load_broker_config(broker_config, local_root) if broker_config else StoreConfig()
        cq_size = kwargs.pop("consumequeue_file_size")
        config = config.with_overrides(
            commitlog_file_size=kwargs.pop("commitlog_file_size"),
            consumequeue_file_size=round_consumequeue_size(cq_size) if cq_size else None,
            index_slots=kwargs.pop("index_slots"),
            index_entries=kwargs.pop("index_entries"),
        )
        check_index_geometry(config.index_slots, config.index_entries)
        kwargs["config"] = config
        return func(**kwargs)

    for option in reversed(_CONFIG_OPTIONS):
        wrapper = option(wrapper)
    return wrapper


def json_option(func: F) -> F:
    return click.option(
        "--json", "as_json", is_flag=True, help="Print one JSON document instead of tables."
    )(func)


def jsonl_option(func: F) -> F:
    return click.option(
        "--jsonl", "as_jsonl", is_flag=True, help="Stream one JSON object per line (per message)."
    )(func)


def progress_option(func: F) -> F:
    return click.option(
        "--no-progress", is_flag=True, help="Do not show a progress bar on a terminal."
    )(func)


RANGE_JOBS_HELP = (
    "With --engine local: work on the ranges of the commit log (--split-size) in N "
    "worker processes of this machine (1: in this process)."
)


class StoreTime(click.ParamType):
    """A store time: epoch milliseconds, ISO-8601, mqadmin's yyyy-MM-dd#HH:mm:ss:SSS, or a
    time as rmqstore shows one (see :func:`rmqstore.times.parse_store_time`)."""

    name = "time"

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        if isinstance(value, int):
            return value
        from rmqstore.errors import InputError
        from rmqstore.times import parse_store_time

        try:
            return parse_store_time(str(value))
        except InputError as exc:
            self.fail(str(exc), param, ctx)


STORE_TIME = StoreTime()


def jobs_option(help_text: str = RANGE_JOBS_HELP) -> Callable[[F], F]:
    """``--jobs N`` (at least 1, default 1) with the command's own help text; more than the
    CPUs this process may use is lowered to them, with a note."""
    return click.option(
        "--jobs",
        type=Number(min=1),
        default=1,
        show_default=True,
        metavar="N",
        callback=_usable_jobs,
        help=help_text + " At most the CPUs this process may use: a larger N is lowered to "
        "them (the work is CPU-bound, and each worker holds its own memory).",
    )


def _usable_jobs(ctx: click.Context, param: click.Parameter, value: int) -> int:
    from rmqstore.workers import usable_cpus

    cpus = usable_cpus()
    if value > cpus:
        cpus_text = "1 CPU" if cpus == 1 else f"{cpus} CPUs"
        workers = "in this process alone" if cpus == 1 else f"{cpus} worker processes"
        note(f"--jobs {value}: this process may use {cpus_text}; running {workers}")
        return cpus
    return value


ENGINES = ("local", "spark")


def engine_options(default: str) -> Callable[[F], F]:
    """``--engine``, ``--master``, ``--spark-conf`` and ``--split-size``; passes
    ``engine: EngineChoice``. A command whose default is ``auto`` offers it (and calls
    :meth:`EngineChoice.resolve`)."""
    choices = ("auto", *ENGINES) if default == "auto" else ENGINES
    engine_help = (
        "Run here in this process (local), as a Spark job (spark: needs pyspark and Java "
        "17+), or let rmqstore pick (auto: Spark only for a commit log of 16 GiB or more, or "
        "with --master/--spark-conf, and when Spark can start; the choice and its reason go "
        "to stderr)."
        if default == "auto"
        else "Run here in this process (local) or as a Spark job (spark: needs pyspark and "
        "Java 17+)."
    ) + (
        " A Spark session that does not start is exit 2, naming the reason its JVM gave "
        "and the JVM's log, which the failed run keeps."
    )

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def wrapper(**kwargs: Any) -> Any:
            kwargs["engine"] = EngineChoice(
                kwargs.pop("engine_name"),
                kwargs.pop("master"),
                tuple(kwargs.pop("spark_conf")),
                kwargs.pop("split_size"),
            )
            return func(**kwargs)

        options = [
            click.option(
                "--engine",
                "engine_name",
                type=click.Choice(choices),
                default=default,
                show_default=True,
                help=engine_help,
            ),
            click.option(
                "--master",
                default=None,
                metavar="URL",
                help="Spark master for --engine spark: local[N], spark://HOST:PORT, yarn, "
                "k8s://... (the store path must then be the same on every executor).  "
                "[default: local[*]]",
            ),
            click.option(
                "--spark-conf",
                multiple=True,
                metavar="K=V",
                help="A Spark setting for --engine spark (repeatable), e.g. "
                "spark.executor.memory=4g.",
            ),
            click.option(
                "--split-size",
                type=Number(min=SMALLEST_SPLIT_SIZE),
                default=32 * 1024 * 1024,
                show_default=True,
                metavar="BYTES",
                help="Bytes of commit log per range of the pipeline (a file's last range "
                "may run a tenth over rather than leave a sliver; on Spark, consecutive "
                "ranges share a task of about 128 MiB).",
            ),
        ]
        for option in reversed(options):
            wrapper = option(wrapper)
        return wrapper

    return decorate


class EngineChoice:
    """Which engine runs a command, and how to start Spark when it is Spark."""

    def __init__(
        self, name: str, master: str | None, spark_conf: tuple[str, ...], split: int
    ) -> None:
        self.name = name
        self.spark_asked = master is not None or bool(spark_conf)
        if name == "local" and self.spark_asked:
            given = "--master" if master is not None else "--spark-conf"
            raise click.UsageError(
                f"{given} is for --engine spark, and this run's engine is local "
                "(add --engine spark to run it on Spark)"
            )
        self.master = master or "local[*]"
        self.spark_conf = spark_conf
        self.split = split

    @property
    def spark(self) -> bool:
        return self.name == "spark"

    def resolve(self, store: str, jobs: int) -> None:
        """Settle ``--engine auto`` for ``store`` and say on stderr which engine runs and why;
        then check ``--jobs`` against the engine."""
        if self.name == "auto":
            if jobs > 1 and self.spark_asked:
                raise click.UsageError(
                    "--jobs asks for local worker processes and --master/--spark-conf for "
                    "Spark; give one of them"
                )
            from rmqstore.pipeline.engines import choose_engine

            decision = choose_engine(store, spark_asked=self.spark_asked, jobs=jobs)
            self.name = decision.name
            note(f"engine: {decision.name} ({decision.reason})")
        self.check_jobs(jobs)

    def check_jobs(self, jobs: int) -> None:
        if jobs > 1 and self.spark:
            raise click.UsageError(
                "--jobs is for --engine local; Spark's parallelism comes from --master "
                "(local[N], or the cluster's executors)"
            )

    def session(self) -> Any:
        """Start (or reuse) the Spark session; a one-line error when it cannot start."""
        from rmqstore.commands.signals import keep_first_stop_only
        from rmqstore.spark import parse_conf, spark_session

        quiet_root_logger()
        session = spark_session(self.master, parse_conf(self.spark_conf))
        keep_first_stop_only()  # PySpark's SIGINT handler, set as the session started
        return session


def quiet_root_logger() -> None:
    """Give the root logger a handler that drops what it is given (unless it has one): py4j
    logs an interruption (Ctrl-C, SIGTERM, SIGHUP) met while it waits on the JVM, traceback
    and all, through ``logging.exception``, which with no handler prints it on stderr beside
    the command's own one line."""
    import logging

    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(logging.NullHandler())
