"""The jobs of the Spark engine: ``export``, ``stats``, ``verify`` and ``dispatch --rebuild``
on a SparkSession, over the same range functions the local engine runs
(:class:`rmqstore.pipeline.local.Pipeline`; here :meth:`SparkPipeline.run` sends them to
executors, consecutive ranges sharing a task up to about 128 MiB).

- export: each range (small files' ranges grouped, up to the split size) written to its
  own part file by the executor that reads it, and summarised in the same pass; the parts
  of ranges past where a file's records end are dropped after (:meth:`Pipeline.export`).
  An export to a URI summarises the ranges first.
- stats: the summaries, and Spark aggregations over the ``rocketmq-commitlog`` rows read with
  those ``fileBounds``.
- verify: :class:`rmqstore.verify.ranges.RangedVerify` with the ranges checked on executors;
  the store must be on a file system every executor sees at the same path.
- rebuild: the summaries say where dispatch stops; executors write the consume queues
  (partitioned by topic and queue, ordered by offset) into a staging directory inside the
  store, renamed into ``consumequeue/`` on commit; the index, one chain of files, is built
  on the driver.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from rmqstore.dispatch import (
    Dispatcher,
    DispatchResult,
    QueueRunOutcome,
    unsafe_topic_problem,
    write_sorted_units,
)
from rmqstore.errors import InputError, RmqStoreError, StoreIOError
from rmqstore.multidispatch import INNER_MULTI_QUEUE_OFFSET
from rmqstore.pipeline.local import (
    TOP_TAGS,
    Pipeline,
    PipelineOptions,
    QueueStats,
    StoreStats,
    file_stats,
)
from rmqstore.pipeline.ranges import (
    RangeSummary,
    file_bounds,
)
from rmqstore.pipeline.rebuild import crc_checked_from, settle_walk_end, walk_end
from rmqstore.record import QUEUED_TRANSACTIONS, TRANSACTION_MASK
from rmqstore.segments import fsync_directory, remove_from_under_writers
from rmqstore.spark import SparkUnavailable, spark_log_path, worker_failure
from rmqstore.spark.sources import SOURCE_SPLIT
from rmqstore.store import Store
from rmqstore.verify import VerifyOptions, VerifyReport
from rmqstore.verify.ranges import DEFAULT_RANGE_SIZE, RangedVerify

_UNIT_COLUMNS = [
    "topic",
    "queueId",
    "queueOffset",
    "commitLogOffset",
    "msgSize",
    "tagsCode",
    "sysFlag",
    "storeTimestamp",
]


def spark_errors(function: Any) -> Any:
    """Turn what a Spark job raises into one engine error (no JVM stack traces)."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except RmqStoreError:
            raise
        except Exception as exc:
            interrupted = _interruption(exc)
            if interrupted is not None:
                raise interrupted.with_traceback(interrupted.__traceback__) from None
            if type(exc).__module__.startswith(("pyspark", "py4j")):
                raise SparkUnavailable(f"the Spark job failed: {_reason(exc)}") from None
            raise

    wrapper.__name__ = function.__name__
    wrapper.__doc__ = function.__doc__
    return wrapper


def _interruption(exc: BaseException) -> KeyboardInterrupt | None:
    """The interruption (Ctrl-C, or a SIGTERM or SIGHUP the command made one) that ``exc``
    was raised while handling, if any: PySpark leaving a job, or py4j cleaning up, talks to
    the JVM, which got the same signal (a terminal's process group, a service manager's
    unit) and may be gone already, and the py4j error then took the interruption's place:
    "the Spark job failed: Answer from Java side is empty", exit 2, for a command stopped by
    a hangup (in two runs of four)."""
    seen: set[int] = set()
    context = exc.__context__
    while context is not None and id(context) not in seen:
        if isinstance(context, KeyboardInterrupt):
            return context
        seen.add(id(context))
        context = context.__context__
    return None


def _reason(exc: BaseException) -> str:
    """What a failed job's error says, in a line; for a Python worker Spark calls crashed,
    the error the worker wrote to the JVM's log, and which Python workers run."""
    said = _first_line(exc)
    if "worker exited unexpectedly" not in said:
        return said
    log_path = spark_log_path()
    ended = worker_failure(log_path)
    if ended is None:
        return said
    python = os.environ.get("PYSPARK_PYTHON") or "python3"
    hint = (
        f"; the workers run {python} (PYSPARK_PYTHON): it needs rmqstore and pyarrow"
        if ended.startswith(("ModuleNotFoundError", "ImportError"))
        else ""
    )
    return f"a Python worker ended with {ended} (JVM log: {log_path}){hint}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    for line in text.splitlines():
        line = line.strip()
        if "Error:" in line or "Exception:" in line:
            return _JAVA_EXCEPTION.sub("", line.lstrip(": "))[:300]
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


# the Java exception's class that py4j puts before its message (": org.apache...Exception: ")
_JAVA_EXCEPTION = re.compile(r"^(?:[a-z]\w*\.)+[A-Z]\w*(?:Exception|Error): ")


class SparkPipeline(Pipeline):
    """The jobs on one SparkSession (see the module docstring)."""

    def __init__(self, spark: Any, store: str, options: PipelineOptions) -> None:
        super().__init__(store, options)
        self.spark = spark

    @spark_errors
    def run(self, function: Callable[[Any], Any], jobs: list) -> list:
        """``function`` over ``jobs`` (ranges of the split size) on the executors, in order
        (walk, export and verify go through here, so their Spark failures become one engine
        error). Consecutive jobs share a task up to about :data:`SOURCE_SPLIT` bytes, with at
        least one task per core: a task costs PySpark 45-60 ms here however little it does,
        and nine 32 MiB exports of the 1M store took 0.53-0.64 s as nine tasks, 0.34-0.49 s
        as two (each range, or group of small files, still its own part file)."""
        if not jobs:
            return []
        context = self.spark.sparkContext
        return (
            context.parallelize(
                jobs, task_count(len(jobs), self.options.split, context.defaultParallelism)
            )
            .map(function)
            .collect()
        )

    def _reader(self, **options: str) -> Any:
        reader = self.spark.read.format("rocketmq-commitlog")
        settings = {
            "splitSize": str(self.options.split),
            "maxMessageSize": str(self.options.max_message_size),
            **(
                {"messageDelayLevel": self.options.delay_levels}
                if self.options.delay_levels
                else {}
            ),
            **options,
        }
        for key, value in settings.items():
            reader = reader.option(key, value)
        return reader

    def messages(
        self, walked: list[RangeSummary], *, include_body: bool, topics: frozenset[str] | None
    ) -> Any:
        """A DataFrame of the messages one walk of the log visits."""
        options = {
            "fileBounds": json.dumps(file_bounds(walked)),
            "includeBody": str(include_body).lower(),
        }
        if topics:
            options["topics"] = ",".join(sorted(topics))
        return self._reader(**options).load(self.location.uri)

    @spark_errors
    def stats(self, *, topics: frozenset[str] | None = None) -> StoreStats:
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        plan = self.plan()
        walked = self.walk(check_crc=True, plan=plan)
        frame = self.messages(walked, include_body=False, topics=topics)
        grouped = frame.groupBy("topic", "queueId").agg(
            F.count(F.lit(1)).alias("messages"),
            F.sum("msgSize").alias("bytes"),
            F.min("queueOffset").alias("minQueueOffset"),
            F.max("queueOffset").alias("maxQueueOffset"),
            F.min("storeTimestamp").alias("first"),
            F.max("storeTimestamp").alias("last"),
            F.countDistinct("tags").alias("distinctTags"),
        )
        tag_counts = (
            frame.where(F.col("tags").isNotNull())
            .groupBy("topic", "queueId", "tags")
            .count()
            .withColumn(
                "rank",
                F.row_number().over(
                    Window.partitionBy("topic", "queueId").orderBy(F.desc("count"), "tags")
                ),
            )
            .where(F.col("rank") <= TOP_TAGS)
        )
        queues: dict[tuple[str, int], QueueStats] = {}
        for row in grouped.collect():
            queues[(row.topic, row.queueId)] = QueueStats(
                row.topic,
                row.queueId,
                row.messages,
                row.bytes,
                row.minQueueOffset,
                row.maxQueueOffset,
                row.first,
                row.last,
                distinct_tags=row.distinctTags,
            )
        for row in tag_counts.collect():
            queues[(row.topic, row.queueId)].tags[row.tags] = row["count"]
        return StoreStats(list(queues.values()), file_stats(walked, plan), plan.live_end)

    def verify(self, store: Store, options: VerifyOptions) -> VerifyReport:
        """The same findings as the local engine, the record ranges checked on executors."""
        ranged = RangedVerify.for_options(store, options, self.options.split or DEFAULT_RANGE_SIZE)
        return ranged.run(self.run)

    @spark_errors
    def rebuild(
        self,
        store: Store,
        *,
        from_offset: int,
        topics: frozenset[str] | None,
        build_index: bool,
        clock: Callable[[], int] | None = None,
    ) -> DispatchResult:
        """Dispatch the whole log into empty consume queues (and index) of ``store``, opened
        for writing with the old files moved to quarantine: what ``Dispatcher.run`` does,
        the consume queues written in parallel. ``clock`` names new index files (tests)."""
        crc_from = crc_checked_from(store)
        walked = self.walk(
            check_crc=crc_from is not None, crc_from=crc_from or 0, count_copies=True
        )
        end = walk_end(store, walked, crc_from)
        result = DispatchResult(from_offset=from_offset, to_offset=from_offset)
        _remove_abandoned_stagings(store)
        staging = store.root / f"{_STAGING_PREFIX}{uuid.uuid4().hex[:12]}"
        try:
            outcomes = self._write_queues(walked, end.cut, staging, store, topics)
            last_time = _merge_queue_outcomes(result, outcomes)
            _commit_staging(store, staging)
        finally:
            # the executors' writers may still be at it (tasks cancelled by a Ctrl-C)
            remove_from_under_writers(staging)
        settle_walk_end(store, result, walked, end, from_offset)
        dispatcher = Dispatcher(
            store, topics=topics, build_index=build_index, build_queues=False, clock=clock
        )
        try:
            if dispatcher.build_index:
                indexed = dispatcher.run(from_offset, until=end.cut, queued_time=last_time)
                result.index_records = indexed.index_records
                result.index_entries = indexed.index_entries
                # the index pass took the cut for the end of the log; where the local walk
                # ends beyond the last record (past a final BLANK) it is not caught up either
                if result.to_offset < result.log_end:
                    store.dispatched_through = None
            else:
                dispatcher.finish(result, last_time)
        finally:
            dispatcher.close()
        return result

    def _write_queues(
        self,
        walked: list[RangeSummary],
        cut: int,
        staging: Path,
        store: Store,
        topics: frozenset[str] | None,
    ) -> list[QueueRunOutcome]:
        from pyspark.sql import functions as F

        staging.mkdir()
        root = str(staging.resolve())
        file_size = store.consumequeue_file_size
        min_offset = store.commitlog.min_offset
        rows = (
            self.messages(walked, include_body=False, topics=None)
            .where(F.col("commitLogOffset") < F.lit(cut))
            .select(*_UNIT_COLUMNS, F.lit(False).alias("copy"), _no_problem())
        )
        # the units records have in further (LMQ) queues (spec 6.8), as rows of their own: a
        # second read, of only the files where the walk found such records
        marked = {summary.file for summary in walked if summary.queue_copies}
        if marked:
            bounds = {name: end for name, end in file_bounds(walked).items() if name in marked}
            copies = (
                self._reader(fileBounds=json.dumps(bounds), includeBody="false")
                .load(self.location.uri)
                .where(F.col("commitLogOffset") < F.lit(cut))
                .where(F.col("properties").getItem(INNER_MULTI_QUEUE_OFFSET).isNotNull())
                .select(*_UNIT_COLUMNS, "properties", "file")
                .mapInArrow(partial(_copy_rows, self.location.uri), _UNIT_SCHEMA)
            )
            rows = rows.unionByName(copies)
        partitions = max(1, self.spark.sparkContext.defaultParallelism)
        ordered = rows.repartition(partitions, "topic", "queueId").sortWithinPartitions(
            "topic", "queueId", "commitLogOffset"
        )

        def write(frames: Any) -> Any:
            import pyarrow as pa

            problems: list[tuple[int, str]] = []

            def units() -> Any:
                for batch in frames:
                    columns = [batch.column(i).to_pylist() for i in range(9)]
                    if batch.column(9).null_count == batch.num_rows:  # units only
                        yield from zip(*columns, strict=True)
                        continue
                    texts = batch.column(9).to_pylist()
                    for *unit, problem in zip(*columns, texts, strict=True):
                        if problem is None:
                            yield unit
                        else:  # a record a broker's dispatch stops at, not a unit
                            problems.append((unit[3], problem))

            outcome = write_sorted_units(Path(root), file_size, min_offset, units(), topics)
            outcome.problems.extend(problems)
            yield pa.RecordBatch.from_pylist([{"outcome": _encode(outcome)}])

        written = ordered.mapInArrow(write, "outcome STRING").collect()
        return [_decode(row.outcome) for row in written]


_UNIT_SCHEMA = (
    "topic STRING, queueId INT, queueOffset BIGINT, commitLogOffset BIGINT, msgSize INT, "
    "tagsCode BIGINT, sysFlag INT, storeTimestamp BIGINT, copy BOOLEAN, problem STRING"
)


def _no_problem() -> Any:
    """The ``problem`` column of unit rows: null (a row naming a record a broker's dispatch
    stops at carries its text instead, and is no unit: :func:`_copy_rows`)."""
    from pyspark.sql import functions as F

    return F.lit(None).cast("string").alias("problem")


def _copy_rows(uri: str, frames: Any) -> Any:
    """A unit row for each of the further queues each record names (runs on executors), as
    the broker that wrote the record dispatched them: for a topic a 5.x broker gives none,
    the record's last byte (the end of its properties) tells a 4.9 broker's record, which
    has them. A record a broker's dispatch stops at gets a row of its own too, no unit: its
    ``problem`` says so (:func:`rmqstore.multidispatch.dispatch_stop_problem`)."""
    import pyarrow as pa

    from rmqstore.multidispatch import dispatch_stop_problem, gets_no_copies, queue_copies
    from rmqstore.pipeline.location import StoreLocation

    location = StoreLocation(uri)
    schema = None
    for batch in frames:
        if schema is None:
            schema = batch.schema
            for name in ("properties", "file"):
                schema = schema.remove(schema.get_field_index(name))
            schema = schema.append(pa.field("copy", pa.bool_()))
            schema = schema.append(pa.field("problem", pa.string()))
        found = []
        for row in batch.to_pylist():
            properties = dict(row.pop("properties"))
            file = row.pop("file")
            stored = b""
            if gets_no_copies(row["topic"]):
                stored = _record_end(location, file, row["commitLogOffset"] + row["msgSize"])
            for topic, queue_id, queue_offset in queue_copies(
                row["topic"], row["queueId"], properties, stored
            ):
                found.append(
                    row
                    | {"topic": topic, "queueId": queue_id, "queueOffset": queue_offset}
                    | {"copy": True, "problem": None}
                )
            if row["sysFlag"] & TRANSACTION_MASK in QUEUED_TRANSACTIONS:
                problem = dispatch_stop_problem(
                    row["commitLogOffset"],
                    row["topic"],
                    row["queueId"],
                    properties,
                    stored,
                )
                if problem is not None:
                    found.append(row | {"copy": True, "problem": problem})
        if found:
            yield pa.RecordBatch.from_pylist(found, schema=schema)


def _record_end(location: Any, file: str, end: int) -> bytes:
    """The last byte of the record ending at log offset ``end`` in ``file`` (the source's
    ``commitlog/<name>``): the last of its properties, which it has when it names copies."""
    start = int(file.rsplit("/", 1)[-1])
    with location.open_range(file, end - 1 - start, 1) as (buf, _start):
        return bytes(buf)


def task_count(jobs: int, split: int, cores: int) -> int:
    """How many tasks ``jobs`` ranges of ``split`` bytes each (0: whole files, a task each)
    are spread over: about :data:`SOURCE_SPLIT` bytes a task, at least ``cores`` of them,
    never more than the jobs."""
    if split <= 0:
        return jobs
    return max(1, min(jobs, max(cores, round(jobs * split / SOURCE_SPLIT))))


def _encode(outcome: QueueRunOutcome) -> str:
    return json.dumps(
        {
            "records": outcome.records,
            "written": outcome.units_written,
            "skipped": outcome.units_skipped,
            "touched": outcome.touched,
            "last": outcome.last_written,
            "problems": outcome.problems,
            "unsafe": outcome.unsafe_topics,
        }
    )


def _decode(text: str) -> QueueRunOutcome:
    data = json.loads(text)
    return QueueRunOutcome(
        records=data["records"],
        units_written=data["written"],
        units_skipped=data["skipped"],
        touched=[tuple(key) for key in data["touched"]],
        last_written=tuple(data["last"]) if data["last"] else None,
        problems=[tuple(problem) for problem in data["problems"]],
        unsafe_topics=data["unsafe"],
    )


def _merge_queue_outcomes(result: DispatchResult, outcomes: list[QueueRunOutcome]) -> int | None:
    """Add up the writers' outcomes; the store time of the newest unit written."""
    problems: list[tuple[int, str]] = []
    unsafe: dict[str, int] = {}
    touched: set[tuple[str, int]] = set()
    last: tuple[int, int] | None = None
    for outcome in outcomes:
        result.records += outcome.records
        result.units_written += outcome.units_written
        result.units_skipped += outcome.units_skipped
        touched.update(outcome.touched)
        problems.extend(outcome.problems)
        for topic, offset in outcome.unsafe_topics.items():
            unsafe[topic] = min(offset, unsafe.get(topic, offset))
        if outcome.last_written is not None and (last is None or outcome.last_written > last):
            last = outcome.last_written
    problems.extend((offset, unsafe_topic_problem(topic)) for topic, offset in unsafe.items())
    result.problems = [text for _, text in sorted(problems, key=lambda item: item[0])]
    result.queues_touched = len(touched)
    return last[1] if last is not None else None


# the folder in the store's root the Spark rebuild writes the consume queues into
_STAGING_PREFIX = ".consumequeue.rebuild-"


def _remove_abandoned_stagings(store: Store) -> None:
    """Remove the staging folders of rebuilds that were killed (or cut off by a power cut)
    before they removed them: the rebuild holds the store's lock, so no other is writing
    one. They hold consume queues built from the commit log, which this rebuild builds
    again."""
    try:
        entries = [
            entry
            for entry in os.scandir(store.root)
            if entry.name.startswith(_STAGING_PREFIX) and entry.is_dir(follow_symlinks=False)
        ]
    except OSError:
        return
    for entry in entries:
        remove_from_under_writers(Path(entry.path))


def _commit_staging(store: Store, staging: Path) -> None:
    """Move the queues written under ``staging`` into ``consumequeue/``."""
    target_root = store.consumequeue_dir
    try:
        target_root.mkdir(exist_ok=True)
        for topic_dir in sorted(staging.iterdir()):
            target = target_root / topic_dir.name
            if not store.inside(target):
                raise InputError(f"{target} leads out of the store; not writing there")
            if target.exists():
                raise InputError(f"{target} exists; the rebuild expected it in quarantine")
            os.replace(topic_dir, target)
        fsync_directory(target_root)
        fsync_directory(store.root)
    except OSError as exc:
        raise StoreIOError(f"cannot move rebuilt consume queues: {exc.strerror}") from None


__all__ = ["SparkPipeline", "spark_errors"]
