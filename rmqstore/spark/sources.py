"""Python Data Sources for Spark 4 (``pyspark.sql.datasource``) over the shared engine codec.

``rocketmq-commitlog``: one row per message (:data:`~rmqstore.pipeline.rows.COMMITLOG_COLUMNS`).
Partitions are byte ranges of the commit-log files (``splitSize``, default 128 MiB; see
:mod:`rmqstore.pipeline.ranges`): a range starting inside a file begins at its next record, and
damaged regions of completed files are skipped. The last file holding data is split too: the
driver first finds where its records end (one scan of that file, as the rmqstore jobs' walk
finds it), so its first invalid record still ends the log as recovery sees it; ``fileBounds``
(from a ``summary=files`` read) gives every file's end instead. Ranges of small files are
coalesced, up to ``splitSize`` bytes a partition. ``read()`` yields Arrow record batches.
With ``summary=files`` it yields one row per range instead, a range a partition
(:data:`~rmqstore.pipeline.ranges.SUMMARY_FIELDS`).

``rocketmq-consumequeue``: one row per consume-queue unit, one partition per queue.

Both take the columns of a schema given to the read (``.schema("topic STRING, queueId
INT")``: only those columns are built) and, registered with pushdown
(:func:`rmqstore.spark.register`), the filters Spark pushes down: conditions on the topic,
queue id, offsets, sizes, flags, tags, keys and the like are applied to each kernel batch of
rows before the other columns are built, a ``commitLogOffset`` window leaves out the ranges
outside it, and topic and queue-id conditions leave out the consume queues they exclude.
Timestamp conditions are applied too but also handed back to Spark, which checks them again.
"""

from __future__ import annotations

import calendar
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import astuple, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringContains,
    StringEndsWith,
    StringStartsWith,
)

try:  # Spark 4.2+: read limits and Trigger.AvailableNow for Python streaming sources
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadMaxBytes,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # Spark 4.1: every micro-batch reads all that is there
    ReadAllAvailable = ReadMaxBytes = None  # type: ignore[assignment,misc]

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Stands in for Spark 4.2's mixin: 4.1 runs AvailableNow as one batch."""


from rmqstore.config import BROKER_INT_BOUNDS, DEFAULT_MAX_MESSAGE_SIZE, SMALLEST_SPLIT_SIZE
from rmqstore.consumequeue import ROCKSDB_QUEUES_NOTE, queue_id_of
from rmqstore.delay import DelayLevels
from rmqstore.errors import InputError, RmqStoreError, StoreIOError, TopicError
from rmqstore.geometry import store_queue_file_size
from rmqstore.jsontext import parse_json
from rmqstore.pipeline.filters import COMPARISONS, RowFilter, holds_for, offset_window
from rmqstore.pipeline.location import StoreLocation
from rmqstore.pipeline.ranges import (
    SUMMARY_FIELDS,
    FileRange,
    coalesce,
    grouped,
    plan_ranges,
    plan_spans,
    record_margin,
    summarize_range,
)
from rmqstore.pipeline.rows import (
    COMMITLOG_COLUMNS,
    CONSUMEQUEUE_COLUMNS,
    MessageRowOptions,
    ddl,
    message_batches,
    present_columns,
    queue_unit_batches,
    queue_unit_bytes,
)
from rmqstore.record import next_record_in_segment
from rmqstore.replication import whole_records_end
from rmqstore.segments import WRITE_SETTLE, Segment
from rmqstore.topics import check_topic_path_safe
from rmqstore.topicsconfig import batch_queues_note
from rmqstore.windows import read_range
from rmqstore.wording import quoted

# bytes of commit log per partition of a load() that does not say (option splitSize): what
# Spark's own file sources take (spark.sql.files.maxPartitionBytes), since each task of a
# Python data source costs PySpark about 65 ms on this 2-core machine even when it reads
# nothing (the rmqstore jobs pass --split-size, 32 MiB by default)
SOURCE_SPLIT = 128 * 1024 * 1024
# bytes of consume-queue units per partition of rocketmq-consumequeue (option splitSize; 0: a
# partition per queue): about as many rows as the commit-log source's partition, and a store
# of thousands of small queues is a few tasks, not one per queue
QUEUE_SOURCE_SPLIT = 16 * 1024 * 1024
# the least units a partition gets while queues are shared among the cores
_SMALLEST_QUEUE_SHARE = 1024 * 1024


def _option(options: dict[str, str], name: str, default: str | None = None) -> str | None:
    for key in (name, name.lower()):
        if key in options:
            return options[key]
    return default


def _store_path(options: dict[str, str], source: str) -> str:
    """The store a read is of: ``load(STORE)``'s path. ``load([A, B])`` reaches the source as
    a JSON list of paths (``paths``): one is that store, more is an error saying how to read
    several stores."""
    path = _option(options, "path")
    if path:
        return path
    listed = _option(options, "paths")
    if listed:
        try:
            paths = parse_json(listed)
        except ValueError:
            paths = None
        if isinstance(paths, list) and len(paths) == 1 and isinstance(paths[0], str):
            return paths[0]
        if isinstance(paths, list) and len(paths) > 1:
            raise InputError(
                f"{source} reads one store a load(), not {len(paths)}: load each store and "
                "union the DataFrames (DataFrame.unionByName)"
            )
    return ""


_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no")


def _flag(options: dict[str, str], name: str, default: bool) -> bool:
    """A boolean option: true/false (or 1/0, yes/no, any case); another value is an error
    rather than false, so a typo does not quietly read without what it asked for."""
    value = _option(options, name)
    if value is None:
        return default
    word = value.strip().lower()
    if word not in _TRUE + _FALSE:
        raise InputError(f"option {name}={quoted(value)} is not true or false")
    return word in _TRUE


def _int_option(
    options: dict[str, str],
    name: str,
    default: int,
    minimum: int | None = None,
    maximum: int | None = None,
) -> int:
    value = _option(options, name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise InputError(f"option {name}={quoted(value)} is not an integer") from None
    if minimum is not None and number < minimum:
        raise InputError(f"option {name}={quoted(value)} is less than {minimum}")
    if maximum is not None and number > maximum:
        raise InputError(f"option {name}={quoted(value)} is more than {maximum}")
    return number


def _split_option(options: dict[str, str]) -> int:
    """splitSize: 0 (a partition per file) or at least :data:`SMALLEST_SPLIT_SIZE` bytes."""
    split = _int_option(options, "splitSize", SOURCE_SPLIT, minimum=0)
    if 0 < split < SMALLEST_SPLIT_SIZE:
        raise InputError(
            f"option splitSize={split} is less than {SMALLEST_SPLIT_SIZE} (0: a partition per file)"
        )
    return split


def _margin_option(options: dict[str, str]) -> int:
    """The read-ahead past a range for records starting in it (maxMessageSize, a Java int on
    the broker); a longer record is still read whole."""
    smallest, largest = BROKER_INT_BOUNDS["maxMessageSize"]  # as in a broker.conf
    return record_margin(
        _int_option(options, "maxMessageSize", DEFAULT_MAX_MESSAGE_SIZE, smallest, largest)
    )


def _file_bounds(options: dict[str, str]) -> dict[str, int] | None:
    """Option fileBounds: commit-log file name to where its records end."""
    text = _option(options, "fileBounds")
    if not text:
        return None
    try:
        found = parse_json(text)
    except ValueError:
        found = None
    if not isinstance(found, dict) or not all(
        isinstance(end, int) and not isinstance(end, bool) for end in found.values()
    ):  # whole numbers only: not 5.7, "5", true or Infinity
        raise InputError("option fileBounds is not a JSON object of offsets")
    bounds: dict[str, int] = found
    for name, end in bounds.items():
        if not (len(name) == 20 and name.isascii() and name.isdigit()):
            raise InputError(f"option fileBounds: {quoted(name)} is not a commit-log file name")
        if end < 0:
            raise InputError(f"option fileBounds: {name} ends at {end}, before its start")
        if end >= 1 << 63:
            raise InputError(f"option fileBounds: {name} ends at {end}, past any commit-log offset")
    return bounds


def _topics(options: dict[str, str]) -> frozenset[str] | None:
    """Option topics (or topic): comma-separated names, spaces around each dropped; a name
    no topic of a store can have (a path: its consume queues' folder is named after it) is
    an error rather than a read that quietly finds nothing."""
    text = _option(options, "topics") or _option(options, "topic") or ""
    topics = frozenset(item.strip() for item in text.split(",") if item.strip())
    for topic in sorted(topics):
        try:
            check_topic_path_safe(topic)
        except TopicError as exc:
            raise InputError(f"option topics: {exc}") from None
    return topics or None


def _summary_option(options: dict[str, str]) -> bool:
    """Option summary: ``files`` (a row per range), or not given."""
    value = _option(options, "summary")
    if value is None or not value.strip():
        return False
    if value.strip().lower() != "files":
        raise InputError(f"option summary={quoted(value)} is not files (a row per range)")
    return True


def _delay_levels_option(options: dict[str, str]) -> str | None:
    """Option messageDelayLevel, checked here (when the read is planned) rather than in
    each task."""
    levels = _option(options, "messageDelayLevel")
    if levels:
        DelayLevels(levels)
    return levels


def _option_filters(options: dict[str, str]) -> tuple[RowFilter, ...]:
    """The row filters options ask for, which work whether or not Spark pushes filters down:
    ``startingOffset``/``endingOffset`` (a commit-log offset window, the end excluded: the
    ranges outside it are not read) and ``queueIds`` (comma-separated)."""
    found = []
    window = {}
    for name, operator in (("startingOffset", "ge"), ("endingOffset", "lt")):
        if _option(options, name) is not None:
            window[name] = _int_option(options, name, 0, minimum=0)
            found.append(RowFilter("commitLogOffset", operator, window[name]))
    if window.get("endingOffset", 1 << 63) < window.get("startingOffset", 0):
        raise InputError(
            f"option endingOffset={window['endingOffset']} is before startingOffset="
            f"{window['startingOffset']}"
        )
    queues = _option(options, "queueIds")
    if queues is not None:
        try:
            wanted = tuple(int(item) for item in queues.split(",") if item.strip())
        except ValueError:
            raise InputError(
                f"option queueIds={quoted(queues)} is not a list of integers"
            ) from None
        found.append(RowFilter("queueId", "in", wanted))
    return tuple(found)


_OPERATORS: dict[type, str] = {
    EqualTo: "eq",
    GreaterThan: "gt",
    GreaterThanOrEqual: "ge",
    LessThan: "lt",
    LessThanOrEqual: "le",
    In: "in",
    StringStartsWith: "starts_with",
    StringEndsWith: "ends_with",
    StringContains: "contains",
    IsNull: "is_null",
    IsNotNull: "is_not_null",
}
_DAY_MICROS = 86_400_000_000


def row_filter(pushed: Filter, kinds: dict[str, str]) -> tuple[RowFilter | None, bool]:
    """``pushed`` as a :class:`RowFilter` over columns of the Arrow ``kinds`` given, and
    whether it is exact (else Spark is to check it again); None when it cannot be applied."""
    negated = isinstance(pushed, Not)
    inner = pushed.child if negated else pushed
    operator = _OPERATORS.get(type(inner))
    attribute = getattr(inner, "attribute", ())
    if operator is None or len(attribute) != 1 or attribute[0] not in kinds:
        return None, False
    column, kind = attribute[0], kinds[attribute[0]]
    if operator in ("is_null", "is_not_null"):
        return RowFilter(column, operator, negated=negated), True
    value = inner.value
    if kind == "timestamp":
        return _time_filter(column, operator, value, negated), False
    if kind == "string":
        accepted: Any = str
    elif kind in ("int32", "int64") and operator in (*COMPARISONS, "in"):
        accepted = int
    else:
        return None, False
    values = tuple(value) if operator == "in" else (value,)
    known = tuple(item for item in values if item is not None)
    if any(isinstance(item, bool) or not isinstance(item, accepted) for item in known):
        return None, False
    if len(known) < len(values) and (operator != "in" or negated):
        return None, False  # x IN (.., NULL) holds as x IN (..); NOT of it never holds
    return RowFilter(column, operator, known if operator == "in" else value, negated), True


def _time_filter(column: str, operator: str, value: Any, negated: bool) -> RowFilter | None:
    """A timestamp comparison in epoch microseconds, loosened by a day when the literal has
    no time zone (Spark checks it again)."""
    if negated or operator not in ("gt", "ge", "lt", "le") or not isinstance(value, datetime):
        return None
    aware = value.tzinfo is not None
    moment = value.astimezone(timezone.utc) if aware else value
    micros = calendar.timegm(moment.timetuple()) * 1_000_000 + moment.microsecond
    if not aware:
        micros += -_DAY_MICROS if operator in ("gt", "ge") else _DAY_MICROS
    return RowFilter(column, operator, micros)


def push(
    filters: list[Filter], kinds: dict[str, str]
) -> tuple[tuple[RowFilter, ...], list[Filter]]:
    """The filters as row filters, and those Spark is still to apply (by reference)."""
    taken: list[RowFilter] = []
    left: list[Filter] = []
    for pushed in filters:
        found, exact = row_filter(pushed, kinds)
        if found is not None:
            taken.append(found)
        if not exact:
            left.append(pushed)
    return tuple(taken), left


def requested_columns(
    schema: Any, columns: list[tuple[str, str, str]], source: str
) -> tuple[str, ...] | None:
    """The columns of the schema a read was given, when it is not the source's own: each
    one of the source's columns, of its type. None for the source's schema."""
    fields = [(field.name, field.dataType.simpleString()) for field in schema.fields]
    known = {name: spark.lower() for name, spark, _ in columns}
    if [name for name, _ in fields] == list(known):
        return None
    for name, kind in fields:
        if name not in known:
            raise InputError(
                f"{source} has no column {quoted(name)} (its columns: {', '.join(known)})"
            )
        if kind != known[name]:
            raise InputError(f"{source} column {name} is {known[name].upper()}, not {kind.upper()}")
    return tuple(name for name, _ in fields)


def declared_not_null(schema: Any, present: frozenset[str], source: str) -> frozenset[str]:
    """The columns the schema a read was given declares NOT NULL, each one that no row
    leaves null (``present``): Spark reads such a column without testing its values for
    null, so a null there would read as some other value."""
    declared = frozenset(field.name for field in schema.fields if not field.nullable)
    for name in sorted(declared - present):
        raise InputError(
            f"{source} column {name} can be null with these options: declare it without NOT NULL"
        )
    return declared


def _present(options: dict[str, str]) -> frozenset[str]:
    """The commit-log columns no row leaves null under the read's options."""
    return present_columns(_flag(options, "includeBody", True), _flag(options, "verifyCrc", False))


def _columns_read(
    schema: Any, options: dict[str, str]
) -> tuple[tuple[str, ...] | None, frozenset[str]]:
    """The commit-log columns a read builds (None: all) and those its batches declare not
    null: the source's own when no schema was given, else the given schema's (checked)."""
    present = _present(options)
    if schema is None:
        return None, present
    source = "rocketmq-commitlog"
    return (
        requested_columns(schema, COMMITLOG_COLUMNS, source),
        declared_not_null(schema, present, source),
    )


_COMMITLOG_KINDS = {name: kind for name, _, kind in COMMITLOG_COLUMNS}
_QUEUE_KINDS = {"topic": "string", "queueId": "int32"}


class CommitLogReader(DataSourceReader):
    def __init__(self, options: dict[str, str], schema: Any = None) -> None:
        self.location = StoreLocation(_store_path(options, "rocketmq-commitlog"))
        self.split = _split_option(options)
        self.margin = _margin_option(options)
        self.summary = _summary_option(options)
        self.crc_from = _int_option(options, "crcFrom", 0, minimum=0)
        self.bounds = _file_bounds(options)
        columns, not_null = _columns_read(None if self.summary else schema, options)
        self.rows = MessageRowOptions(
            include_body=_flag(options, "includeBody", True),
            check_crc=_flag(options, "verifyCrc", False),
            topics=_topics(options),
            delay_levels=_delay_levels_option(options),
            resync_last=self.bounds is not None,
            decompress=_flag(options, "decompress", False),
            filters=_option_filters(options),
            columns=columns,
            not_null=not_null,
        )

    def partitions(self) -> list[InputPartition]:
        self.location.check_store()
        bounds, rows = self.bounds, self.rows
        if not self.summary and bounds is None and self.split > 0:
            bounds = self._bounds_with_last_end()
            rows = replace(rows, resync_last=True)
        ranges = plan_ranges(
            self.location,
            self.split,
            split_last=self.summary or bounds is not None,
            bounds=bounds,
            margin=self.margin,
        )
        if self.summary:
            return [InputPartition(([part], rows)) for part in ranges]
        low, high = offset_window(rows.filters, "commitLogOffset")
        ranges = [
            part
            for part in ranges
            if part.file_start + part.stop > low and part.file_start + part.start < high
        ]
        return [InputPartition((group, rows)) for group in coalesce(ranges, self.split)]

    def _bounds_with_last_end(self) -> dict[str, int] | None:
        """Every file's end: completed files whole, the last file where its records end (a
        scan of that file here, on the driver). None when the log holds no data."""
        whole = plan_ranges(self.location, 0, split_last=False, margin=self.margin)
        if not whole:
            return None
        last = whole[-1]
        summary = summarize_range(self.location, last, check_crc=False, delay_levels=DelayLevels())
        bounds = {part.name: part.file_size for part in whole[:-1]}
        bounds[last.name] = summary.end if summary.end is not None else last.stop
        return bounds

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if partition.value is None:
            return  # no partitions planned (nothing to read): Spark reads one empty one
        parts: list[FileRange]
        parts, rows = partition.value
        if not self.summary:
            yield from checked(message_batches(self.location, parts, rows))
            return
        (part,) = parts
        levels = self.rows.delay_levels
        summary = summarize_range(
            self.location,
            part,
            check_crc=self.rows.check_crc and part.file_start >= self.crc_from,
            delay_levels=DelayLevels(levels) if levels else DelayLevels(),
            count_copies=True,  # its queueCopies column says how many, not 0 for not counted
        )
        yield astuple(summary)


class PushdownCommitLogReader(CommitLogReader):
    """The commit-log reader taking the filters Spark pushes down."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        if self.summary:
            return filters
        taken, left = push(filters, _COMMITLOG_KINDS)
        self.rows = replace(self.rows, filters=self.rows.filters + taken)
        return left


def checked(batches: Iterable[Any]) -> Iterator[Any]:
    """The Arrow batches, each validated before Spark's JVM reads them, which in the sessions
    rmqstore starts it does without bounds checks (:data:`rmqstore.spark.ARROW_JAVA_OPTIONS`),
    and a column declared not null without testing for null: every buffer's layout in full
    (offsets in order and within their buffers, lengths), and no null in a column declared
    not null. Text is validated as bytes: its UTF-8 was checked as the columns were built
    (:mod:`rmqstore.pipeline.columns`), and checking it again took three quarters of the
    validation's time (about 50 ms per million rows of every column); the layout, which is
    what the JVM's unchecked reads depend on, takes about 15 ms."""
    for batch in batches:
        batch.validate()
        for field, column in zip(batch.schema, batch.columns, strict=True):
            as_bytes = _bytes_layout(field.type)
            (column if as_bytes is None else column.view(as_bytes)).validate(full=True)
            if not field.nullable and column.null_count:
                raise ValueError(f"column {field.name} is declared not null but has nulls")
        yield batch


def _bytes_layout(kind: Any) -> Any:
    """The Arrow type with ``kind``'s layout and its text as binary (None: no text in it)."""
    import pyarrow as pa

    if pa.types.is_string(kind):
        return pa.binary()
    if pa.types.is_large_string(kind):
        return pa.large_binary()
    if pa.types.is_map(kind):
        keys, items = _bytes_layout(kind.key_type), _bytes_layout(kind.item_type)
        if keys is None and items is None:
            return None
        return pa.map_(keys or kind.key_type, items or kind.item_type)
    return None


class CommitLogDataSource(DataSource):
    """``spark.read.format("rocketmq-commitlog").load(STORE)``: one row per message.

    Options: includeBody (true), decompress (false: ZLIB bodies of COMPRESSED records as
    stored), verifyCrc (false: crcOk is null), topics and queueIds (comma-separated),
    startingOffset and endingOffset (a commit-log offset window, the end excluded),
    splitSize (bytes, 134217728, a file's last range up to a tenth over; 0 for one partition
    per file), messageDelayLevel (for the deliver-time tagsCode of SCHEDULE_TOPIC_XXXX),
    maxMessageSize (4194304: how far a range reads ahead past its end; a longer record is
    still read whole), fileBounds (JSON: file name to where its records end),
    summary=files (one row per range; with crcFrom, CRCs are checked in the files from that
    offset on)."""

    @classmethod
    def name(cls) -> str:
        return "rocketmq-commitlog"

    def schema(self) -> str:
        if _summary_option(self.options):
            return ddl(SUMMARY_FIELDS)
        return ddl(COMMITLOG_COLUMNS, _present(self.options))

    def reader(self, schema: Any) -> DataSourceReader:
        return CommitLogReader(dict(self.options), schema)

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        try:
            return CommitLogStreamReader(dict(self.options), schema)
        except RmqStoreError as exc:
            return RefusedStreamReader(exc)


class RefusedStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The stream reader of a query whose options or store were refused: it raises that
    error from the first call Spark makes. PySpark 4.3 loses an error raised while the
    reader is made (its runner then stops a reader it never got, and the query fails with
    "UnboundLocalError: cannot access local variable 'reader'")."""

    def __init__(self, error: RmqStoreError) -> None:
        self.error = error

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise self.error

    initialOffset = latestOffset = partitions = read = commit = _refuse  # type: ignore[assignment]
    getDefaultReadLimit = reportLatestOffset = prepareForTriggerAvailableNow = _refuse  # type: ignore[assignment]

    def stop(self) -> None:
        pass


class PushdownCommitLogDataSource(CommitLogDataSource):
    """``rocketmq-commitlog`` taking pushed-down filters (the session's
    ``spark.sql.python.filterPushdown.enabled`` must be on)."""

    def reader(self, schema: Any) -> DataSourceReader:
        return PushdownCommitLogReader(dict(self.options), schema)


class CommitLogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("rocketmq-commitlog")``: the messages a store gains, batch
    after batch. Offsets are commit-log physical offsets (``{"offset": N}``): a micro-batch
    reads the records in ``[start, end)``, both record boundaries, so a query restarted from
    its checkpoint resumes exactly where it stopped. The end of a batch is where the store's
    whole, CRC-valid records end (a completed file to its end), found the way ``serve-ha
    --follow`` finds it, and its bytes are read at least 50 ms later, when a record a broker
    was writing is complete. Files a broker deleted are skipped (their messages are gone); a
    file rolled to is read from its start. A batch with nothing to read runs one task that
    reads nothing, which starts the executors' Python workers while the store is idle.

    Spark 4.2+: ``maxBytesPerTrigger`` bounds a micro-batch to the whole records within that
    many commit-log bytes of its start (one record at least, so the query always moves on:
    a backlog is read in batches of about that size; without ``splitSize`` a batch is split
    into a partition per core of this machine), and ``Trigger.AvailableNow`` reads what the
    store holds when the query starts, in such batches, then stops."""

    def __init__(self, options: dict[str, str], schema: Any = None) -> None:
        path = _store_path(options, "rocketmq-commitlog")
        self.location = StoreLocation(path)
        if self.location.remote:
            raise InputError("the streaming source reads a store directory on this machine")
        self.root = Path(path)
        self.split = _split_option(options)
        self.margin = _margin_option(options)
        self.starting = (_option(options, "startingOffsets") or "earliest").strip().lower()
        if self.starting not in ("earliest", "latest") and not (
            self.starting.isascii() and self.starting.isdigit()
        ):
            raise InputError(
                f"option startingOffsets={quoted(self.starting)}: earliest, latest or an offset"
            )
        self.max_bytes: int | None = None  # maxBytesPerTrigger
        if _option(options, "maxBytesPerTrigger") is not None:
            if ReadMaxBytes is None:
                raise InputError(
                    "option maxBytesPerTrigger needs Spark 4.2 or later (read limits of Python "
                    "streaming sources)"
                )
            self.max_bytes = _int_option(options, "maxBytesPerTrigger", 0, minimum=1)
            if _option(options, "splitSize") is None:
                # the store is on this machine: a bounded batch is spread over its cores (one
                # partition of it ran on one core while the others waited)
                share = -(-self.max_bytes // (os.cpu_count() or 1))
                self.split = max(SMALLEST_SPLIT_SIZE, min(self.split, share))
        self.target: int | None = None  # Trigger.AvailableNow: where the store ended at start
        self.reported: int | None = None  # where the records ended at the last report
        columns, not_null = _columns_read(schema, options)
        self.rows = MessageRowOptions(
            include_body=_flag(options, "includeBody", True),
            check_crc=_flag(options, "verifyCrc", False),
            topics=_topics(options),
            delay_levels=_delay_levels_option(options),
            resync_last=True,
            decompress=_flag(options, "decompress", False),
            columns=columns,
            not_null=not_null,
        )
        self.location.check_store()

    def initialOffset(self) -> dict:
        if self.starting == "latest":  # from the last file a record begins: no full walk
            last = self._last_written_file()
            return {"offset": 0 if last is None else self._end(last)}
        if self.starting.isascii() and self.starting.isdigit():
            return {"offset": int(self.starting)}
        segments = self.location.segments("commitlog")
        return {"offset": int(segments[0][0]) if segments else 0}

    def getDefaultReadLimit(self) -> Any:
        if self.max_bytes is None:
            return ReadAllAvailable() if ReadAllAvailable is not None else None
        return ReadMaxBytes(self.max_bytes)

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: the query reads up to where the whole records end now (in
        the last file holding one: the ones before it are complete) and no further."""
        last = self._last_written_file()
        self.target = 0 if last is None else self._end(last)

    def reportLatestOffset(self) -> dict | None:
        """Where the store's whole records end now, shown in a query's progress beside the
        batch's end (how far a bounded query is behind; Spark 4.2+). Each report looks from
        where the last one ended (the first from the last file holding a record), so it
        reads only what the store gained."""
        since = self._last_written_file() if self.reported is None else self.reported
        if since is None:
            return None
        self.reported = self._end(since)
        return {"offset": self.reported}

    def _last_written_file(self) -> int | None:
        """The start of the last commit-log file a record begins, by its first bytes (a
        broker creates its next file ahead, all zeros), else of the first file; None
        without files."""
        segments = self.location.segments("commitlog")
        for name, _size in reversed(segments):
            try:
                if any(read_range(self.root / "commitlog" / name, 0, 8)):
                    return int(name)
            except StoreIOError:
                continue  # deleted by the broker meanwhile
        return int(segments[0][0]) if segments else None

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        known = int(start["offset"]) if start else 0
        until = self.target
        if until is not None and known >= until:
            return {"offset": known}  # AvailableNow: all that was there is read
        if ReadMaxBytes is not None and isinstance(limit, ReadMaxBytes):
            bound = known + limit.max_bytes
            until = bound if until is None else min(until, bound)
        found = self._end(known, until)
        if self.target is not None:
            found = min(found, self.target)
        time.sleep(WRITE_SETTLE)  # a record a writer had begun is whole when it is read
        return {"offset": max(found, known)}

    def _end(self, known: int, until: int | None = None) -> int:
        """Where the whole, CRC-valid records end, looked for from ``known`` on; with
        ``until``, the last that ends by it, or the first after ``known`` when none does.
        Damage in a file before the last one a record begins (the broker has moved on from
        it) does not end them: they go on from the next record after it, and the batch's
        ranges skip the damage, as the batch source does (the query stopped there for
        good, without a word)."""
        position = known
        last = self._last_written_file()
        for name, size in self.location.commitlog_segments():
            start = int(name)
            if start + size <= position:
                continue
            position = max(position, start)
            segment = Segment(start, self.root / "commitlog" / name, size)
            while True:
                end, complete, past_until = whole_records_end(
                    segment, position - start, until=until, at_least_one=position == known
                )
                if complete:
                    position = start + size
                    break
                position = start + end
                if past_until or last is None or start >= last:
                    return position  # the batch's bound, or where the log ends now
                resumed = next_record_in_segment(segment.path, size, start, end + 1)
                if resumed is None:  # no record after the damage: the file's next one
                    position = start + size
                    break
                position = start + resumed
                if until is not None and position >= until:
                    return position
        return position

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        begin, stop = int(start["offset"]), int(end["offset"])
        if begin >= stop:
            # an empty batch (a query's first, on a store nothing is appended to) still gets
            # one task reading nothing: it starts an executor's Python worker and warms the
            # sink's write path, so the first messages appended after it do not wait for that
            # (about a second, measured in bench/streaming.py)
            return [InputPartition(None)]
        names: dict[int, str] = {}
        files: list[tuple[int, int]] = []  # the files holding part of [begin, stop)
        for name, size in self.location.commitlog_segments():
            if int(name) < stop and begin < int(name) + size:
                names[int(name)] = name
                files.append((int(name), size))
        if not files:
            return []
        first = max(begin, files[0][0]) - files[0][0]  # where the last batch ended: a record
        ends = {start: min(stop, start + size) - start for start, size in files}
        # zeros in a file before the last one a record begins are damage the ranges skip,
        # as _end found; in that last one they are where the log ends now
        last = self._last_written_file()
        ranges = [  # a range that begins a file's part of the batch begins at a record
            FileRange(
                names[start], start, lower, upper, size, last is None or start >= last,
                self.margin, record_start=lower == (first if start == files[0][0] else 0),
            )
            for start, size, lower, upper, _ in plan_spans(
                files, self.split, begin=first, ends=ends
            )
        ]  # fmt: skip
        return [InputPartition((group, self.rows)) for group in coalesce(ranges, self.split)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if partition.value is None:
            return
        parts, rows = partition.value
        yield from checked(message_batches(self.location, parts, rows, gone=self._deleted))

    def _deleted(self, part: FileRange) -> bool:
        """Whether the broker deleted the range's file after this batch was planned: its
        messages are gone, as they are for a consumer."""
        return not (self.root / "commitlog" / part.name).exists()

    def commit(self, end: dict) -> None:
        pass  # the store is only read: nothing to release


class ConsumeQueueReader(DataSourceReader):
    def __init__(self, options: dict[str, str], schema: Any = None) -> None:
        self.location = StoreLocation(_store_path(options, "rocketmq-consumequeue"))
        self.topics = _topics(options)
        self.filters: tuple[RowFilter, ...] = ()
        names = (
            None
            if schema is None
            else requested_columns(schema, CONSUMEQUEUE_COLUMNS, "rocketmq-consumequeue")
        )
        everything = [name for name, _, _ in CONSUMEQUEUE_COLUMNS]
        self.names = everything if names is None else list(names)
        # the columns the batches declare not null: as the schema Spark was given says (every
        # one for the source's own: each unit has a value in each)
        self.not_null = (
            frozenset(everything)
            if schema is None
            else declared_not_null(schema, frozenset(everything), "rocketmq-consumequeue")
        )
        self.split = _int_option(options, "splitSize", QUEUE_SOURCE_SPLIT, minimum=0)

    def partitions(self) -> list[InputPartition]:
        self.location.check_store()
        if self.location.queues_in_rocksdb():
            raise InputError(
                f"{self.location.uri.rstrip('/')}/consumequeue {ROCKSDB_QUEUES_NOTE}: the "
                "rocketmq-consumequeue source reads consume-queue files (rocketmq-commitlog "
                "reads this store's messages)"
            )
        batch = self.topics & self.location.batch_queue_topics() if self.topics else None
        if batch:
            raise InputError(
                f"{batch_queues_note(batch)}: the rocketmq-consumequeue source reads "
                "consume-queue files (rocketmq-commitlog reads their messages)"
            )
        segments = self.location.segments("commitlog")
        minimum = int(segments[0][0]) if segments else 0
        queues = []
        for topic in self.location.directories("consumequeue"):
            if self.topics is not None and topic not in self.topics:
                continue
            for queue in self.location.directories(f"consumequeue/{topic}"):
                queue_id = queue_id_of(queue)
                if queue_id is not None and self._wanted(topic, queue_id):
                    queues.append((topic, queue_id))
        # the queue-file size the commands take (None for a store by URI: each queue's files
        # are held to their own size)
        size = None if self.location.remote else store_queue_file_size(Path(self.location.uri))
        return [InputPartition((group, minimum, size)) for group in self._groups(queues)]

    def _groups(self, queues: list[tuple[str, int]]) -> list[list[tuple[str, int]]]:
        """Consecutive queues sharing partitions of about ``splitSize`` bytes of units, and
        the cores while there are fewer (a queue larger than that alone; ``splitSize`` 0: a
        partition per queue). A task costs PySpark about 50 ms however little it reads."""
        if self.split <= 0:
            return [[queue] for queue in queues]
        sizes = [queue_unit_bytes(self.location, *queue) for queue in queues]
        share = max(-(-sum(sizes) // (os.cpu_count() or 1)), _SMALLEST_QUEUE_SHARE)
        return grouped(queues, sizes, min(self.split, share))

    def _wanted(self, topic: str, queue_id: int) -> bool:
        values = {"topic": topic, "queueId": queue_id}
        return all(holds_for(found, values[found.column]) for found in self.filters)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if partition.value is None:
            return
        queues, minimum, size = partition.value
        batches = queue_unit_batches(
            self.location, queues, minimum, self.names, self.not_null, size
        )
        yield from checked(batches)


class PushdownConsumeQueueReader(ConsumeQueueReader):
    """The consume-queue reader taking the topic and queue-id filters Spark pushes down:
    the queues they exclude are not read."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        taken, left = push(filters, _QUEUE_KINDS)
        self.filters += taken
        return left


class ConsumeQueueDataSource(DataSource):
    """``spark.read.format("rocketmq-consumequeue").load(STORE)``: one row per unit.

    Options: topics (comma-separated), splitSize (bytes of units a partition holds,
    16777216; queues share partitions, a larger queue is one alone; 0: a partition per
    queue)."""

    @classmethod
    def name(cls) -> str:
        return "rocketmq-consumequeue"

    def schema(self) -> str:
        return ddl(CONSUMEQUEUE_COLUMNS, [name for name, _, _ in CONSUMEQUEUE_COLUMNS])

    def reader(self, schema: Any) -> DataSourceReader:
        return ConsumeQueueReader(dict(self.options), schema)


class PushdownConsumeQueueDataSource(ConsumeQueueDataSource):
    """``rocketmq-consumequeue`` taking pushed-down filters."""

    def reader(self, schema: Any) -> DataSourceReader:
        return PushdownConsumeQueueReader(dict(self.options), schema)


def data_sources(pushdown: bool) -> list[type[DataSource]]:
    """The sources to register: those taking pushed-down filters, or not."""
    if pushdown:
        return [PushdownCommitLogDataSource, PushdownConsumeQueueDataSource]
    return [CommitLogDataSource, ConsumeQueueDataSource]
