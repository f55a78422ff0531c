"""Rows of the pipeline: the columns of the ``rocketmq-commitlog`` and
``rocketmq-consumequeue`` sources and the functions producing them from one range or one
queue. Shared by the Spark data sources and the local engine of ``export``; pyarrow is
imported when batches are built, pyspark never.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from rmqstore import kernel
from rmqstore.consumequeue import PRE_BLANK_SIZE, UNIT, ChunkReader, file_chunks, valid_prefix
from rmqstore.delay import SCHEDULE_TOPIC, DelayLevels, unit_tags_code
from rmqstore.errors import InputError, RecordError, StoreIOError
from rmqstore.hashing import tags_code
from rmqstore.kernel import layout
from rmqstore.pipeline import arrowcalls, columns
from rmqstore.pipeline.filters import RowFilter, keep_mask
from rmqstore.pipeline.location import StoreLocation
from rmqstore.pipeline.ranges import FileRange, RangeScan
from rmqstore.properties import TAGS, decode_properties
from rmqstore.record import COMPRESSED_FLAG, inflate_body, record_item

EXPORT_BATCH_ROWS = 16384  # rows per Arrow batch (fewer when a window of the file ends)
# a kernel batch of fewer rows (the end of a range, a small file) is gathered with those after
# it into one Arrow batch, of at most EXPORT_BATCH_ROWS rows and GATHER_BYTES of records
GATHER_ROWS = EXPORT_BATCH_ROWS // 4
GATHER_BYTES = 8 * 1024 * 1024

# (column, Spark type, Arrow type name) of the commit-log source, in order
COMMITLOG_COLUMNS = [
    ("topic", "STRING", "string"),
    ("queueId", "INT", "int32"),
    ("queueOffset", "BIGINT", "int64"),
    ("body", "BINARY", "binary"),
    ("properties", "MAP<STRING,STRING>", "map"),
    ("bornTimestamp", "BIGINT", "int64"),
    ("storeTimestamp", "BIGINT", "int64"),
    ("flag", "INT", "int32"),
    ("commitLogOffset", "BIGINT", "int64"),
    ("storeSize", "INT", "int32"),
    ("msgSize", "INT", "int32"),  # = storeSize, under the name of design §3 / the connector
    ("bodyLength", "INT", "int32"),
    ("bodyCRC", "INT", "int32"),
    ("crcOk", "BOOLEAN", "bool"),
    ("sysFlag", "INT", "int32"),
    ("bornHost", "STRING", "string"),
    ("storeHost", "STRING", "string"),
    ("reconsumeTimes", "INT", "int32"),
    ("preparedTransactionOffset", "BIGINT", "int64"),
    ("tags", "STRING", "string"),
    ("tagsCode", "BIGINT", "int64"),
    ("keys", "STRING", "string"),
    ("uniqKey", "STRING", "string"),
    ("msgId", "STRING", "string"),
    ("version", "STRING", "string"),
    ("file", "STRING", "string"),
    ("bornTime", "TIMESTAMP", "timestamp"),  # bornTimestamp as a Spark timestamp (UTC)
    ("storeTime", "TIMESTAMP", "timestamp"),
]
CONSUMEQUEUE_COLUMNS = [
    ("topic", "STRING", "string"),
    ("queueId", "INT", "int32"),
    ("queueOffset", "BIGINT", "int64"),
    ("commitLogOffset", "BIGINT", "int64"),
    ("storeSize", "INT", "int32"),  # the record's size, as the commit-log source names it
    ("tagsCode", "BIGINT", "int64"),
    ("file", "STRING", "string"),
]


def ddl(columns: list[tuple[str, str, str]], not_null: Collection[str] = ()) -> str:
    """A Spark DDL schema string for ``columns``, those named in ``not_null`` NOT NULL."""
    return ", ".join(
        f"{name} {kind}" + (" NOT NULL" if name in not_null else "") for name, kind, _ in columns
    )


# text columns of few distinct values in a batch (its rows share one file; a record is V1 or
# V2; a store has few topics, hosts and tags): the Parquet export hands them to its writer as
# Arrow dictionaries, so the writer has nothing to hash (see ``MessageBatcher``'s ``coded``).
# The file, version and host columns are built as dictionaries (and decoded for other
# outputs), the topic and tags columns as strings (and encoded for the export)
CODED_TEXT = frozenset({"file", "version", "bornHost", "storeHost", "topic", "tags"})


# columns every message has a value in, whatever the options and however damaged its
# properties (the others are null: body without includeBody, crcOk unchecked, a property the
# record lacks, a tagsCode the dispatcher cannot compute, a time a timestamp cannot show)
ALWAYS_PRESENT = frozenset(
    {
        "topic",
        "queueId",
        "queueOffset",
        "properties",
        "bornTimestamp",
        "storeTimestamp",
        "flag",
        "commitLogOffset",
        "storeSize",
        "msgSize",
        "bodyLength",
        "bodyCRC",
        "sysFlag",
        "bornHost",
        "storeHost",
        "reconsumeTimes",
        "preparedTransactionOffset",
        "msgId",
        "version",
        "file",
    }
)


def present_columns(include_body: bool, check_crc: bool) -> frozenset[str]:
    """The commit-log columns no row leaves null under these options: the
    :data:`ALWAYS_PRESENT` ones, the body when bodies are read, the CRC verdict when CRCs
    are checked."""
    present = set(ALWAYS_PRESENT)
    if include_body:
        present.add("body")
    if check_crc:
        present.add("crcOk")
    return frozenset(present)


def arrow_schema(
    columns: list[tuple[str, str, str]], *, coded: bool = False, not_null: Collection[str] = ()
) -> Any:
    """The Arrow schema of ``columns``; with ``coded``, the :data:`CODED_TEXT` columns are
    dictionaries of strings (int32 indices); those named in ``not_null`` are declared not
    null (Parquet then stores no definition levels for them, and Spark reads them without
    testing each value for null)."""
    import pyarrow as pa

    types = {
        "string": pa.string(),
        "int32": pa.int32(),
        "int64": pa.int64(),
        "binary": pa.binary(),
        "bool": pa.bool_(),
        "map": pa.map_(pa.string(), pa.string()),
        "timestamp": pa.timestamp("us", tz="UTC"),  # what Spark's TimestampType is in Arrow
    }
    dictionary = pa.dictionary(pa.int32(), pa.string())
    return pa.schema(
        [
            pa.field(
                name,
                dictionary if coded and name in CODED_TEXT else types[kind],
                nullable=name not in not_null,
            )
            for name, _, kind in columns
        ]
    )


@dataclass(frozen=True)
class MessageRowOptions:
    include_body: bool = True
    check_crc: bool = False
    topics: frozenset[str] | None = None
    delay_levels: str | None = None  # messageDelayLevel, for SCHEDULE_TOPIC_XXXX tagsCode
    resync_last: bool = False  # the last file's end is known (file bounds): skip damage
    decompress: bool = False  # inflate ZLIB bodies of COMPRESSED records, as a consumer does
    filters: tuple[RowFilter, ...] = ()  # rows that fail one are left out before decoding
    columns: tuple[str, ...] | None = None  # the columns wanted, in order (None: all)
    not_null: frozenset[str] = frozenset()  # columns the batches declare not null (no row has one)

    def row_filters(self) -> tuple[RowFilter, ...]:
        """The filters, the ``topics`` option among them."""
        if self.topics is None:
            return self.filters
        return (RowFilter("topic", "in", tuple(sorted(self.topics))), *self.filters)


def commitlog_columns(names: tuple[str, ...] | None) -> list[tuple[str, str, str]]:
    """The :data:`COMMITLOG_COLUMNS` named (all when None), in the order named."""
    if names is None:
        return COMMITLOG_COLUMNS
    known = {column[0]: column for column in COMMITLOG_COLUMNS}
    return [known[name] for name in names]


class _Batch:
    """One kernel batch of rows and the columns built from it so far: each column is built
    once, when first asked for (by a filter or the output)."""

    def __init__(
        self,
        pa: Any,
        buf: Any,
        rows: Any,
        count: int,
        options: MessageRowOptions,
        levels: DelayLevels,
        runs: Sequence[tuple[str, int]],
        map_wanted: bool,
        integer_columns: tuple[tuple[int, int], ...] = (),
    ) -> None:
        self.pa, self.buf, self.rows, self.count = pa, buf, rows, count
        # (file label, rows): the rows' files, in order (one run, or small files gathered)
        self.options, self.levels, self.runs = options, levels, tuple(runs)
        self.map_wanted = map_wanted  # the properties column will be built: parse for it
        # the (row column, width) pairs the batch's columns take: copied out in one pass
        self.integer_columns = integer_columns
        self.row_integers: columns.RowIntegers | None = None
        self.built: dict[str, Any] = {}
        self.coded_built: dict[str, Any] = {}
        self.property_pairs: columns.PropertyPairs | None = None

    def column(self, name: str) -> Any:
        if name not in self.built:
            if name in _CODED_BUILDERS:
                self.built[name] = arrowcalls.dictionary_decode(self.coded(name))
            else:
                self.built[name] = _BUILDERS[name](self)
        return self.built[name]

    def coded(self, name: str) -> Any:
        """A :data:`CODED_TEXT` column as an Arrow dictionary array."""
        if name not in self.coded_built:
            build = _CODED_BUILDERS.get(name)
            self.coded_built[name] = (
                build(self)
                if build is not None
                else arrowcalls.dictionary_encode(self.column(name))
            )
        return self.coded_built[name]

    def integers(self, field: int, kind: Any = None) -> Any:
        """Row column ``field`` as Arrow int64, or int32 (or cast to another) ``kind``: from
        the batch's one pass over the rows, or (a column it did not copy) a pass of its own."""
        if self.row_integers is None:
            self.row_integers = columns.RowIntegers(
                self.pa, self.rows, self.count, self.integer_columns
            )
        found = self.row_integers.integers(field, kind)
        if found is None:
            return columns.integers(self.pa, self.rows, field, self.count, kind)
        return found

    def field(self, field: int) -> Any:
        return columns.binary(self.pa, self.buf, self.rows, self.count, field)

    def pairs(self, *, with_map: bool = False) -> columns.PropertyPairs:
        """The rows' property pairs, parsed once for the columns built from them (again if
        the map is wanted after a parse without it)."""
        if self.property_pairs is None or (with_map and not self.property_pairs.with_map):
            self.property_pairs = columns.PropertyPairs(
                self.pa,
                self.buf,
                self.rows,
                self.count,
                with_map=with_map or self.map_wanted,
                lengths=self.integers(layout.PROPERTIES_LENGTH),
            )
        return self.property_pairs

    def keep_only(self, keep: Any) -> None:
        """Drop the rows where ``keep`` (a boolean array without nulls) is false: from the
        kernel rows, so the columns still to be built are built for the kept rows only."""
        pa = self.pa
        width = layout.ROW_WIDTH
        flat = pa.Array.from_buffers(
            pa.int64(), self.count * width, [None, pa.py_buffer(self.rows)]
        )
        picked = arrowcalls.keep(pa.FixedSizeListArray.from_arrays(flat, width), keep).flatten()
        data = memoryview(picked.buffers()[1])[
            8 * picked.offset : 8 * (picked.offset + len(picked))
        ]
        self.rows = array("q", data.tobytes())
        self.count = len(picked) // width
        self.runs = _kept_runs(pa, self.runs, keep, self.count)
        self.built = {name: arrowcalls.keep(values, keep) for name, values in self.built.items()}
        self.coded_built = {
            name: arrowcalls.keep(values, keep) for name, values in self.coded_built.items()
        }
        self.property_pairs = None  # of the rows before
        self.row_integers = None


def _body(batch: _Batch) -> Any:
    pa, options = batch.pa, batch.options
    if not options.include_body:
        return pa.nulls(batch.count, pa.binary())
    bodies = batch.field(layout.FIELD_BODY)
    if options.decompress:
        bodies = _inflated(pa, bodies, batch.column("sysFlag"))
    return bodies


def _crc_ok(batch: _Batch) -> Any:
    pa = batch.pa
    if batch.options.check_crc:
        return columns.crc_verdicts(pa, batch.rows, batch.count)
    return pa.nulls(batch.count, pa.bool_())


def _properties(batch: _Batch) -> Any:
    pa = batch.pa
    return batch.pairs(with_map=True).map(pa.map_(pa.string(), pa.string()))


def _picked(field: int) -> Any:
    return lambda batch: batch.pairs().text(field)


def _version(batch: _Batch) -> Any:
    pa = batch.pa
    v2 = arrowcalls.call("equal", batch.integers(layout.VERSION), columns.constant(pa, 2))
    return columns.chosen(pa, v2, "V2", "V1")


def _int32(field: int) -> Any:
    return lambda batch: batch.integers(field, batch.pa.int32())


def _int64(field: int) -> Any:
    return lambda batch: batch.integers(field)


def _hosts(field: int) -> Any:
    return lambda batch: columns.hosts(batch.pa, batch.buf, batch.rows, batch.count, field)


def _timestamps(field: int) -> Any:
    return lambda batch: columns.timestamps(batch.pa, batch.integers(field))


_BUILDERS: dict[str, Any] = {
    "topic": lambda batch: columns.topics(batch.pa, batch.buf, batch.rows, batch.count),
    "queueId": _int32(layout.QUEUE_ID),
    "queueOffset": _int64(layout.QUEUE_OFFSET),
    "body": _body,
    "properties": _properties,
    "bornTimestamp": _int64(layout.BORN_TIMESTAMP),
    "storeTimestamp": _int64(layout.STORE_TIMESTAMP),
    "flag": _int32(layout.FLAG),
    "commitLogOffset": _int64(layout.PHYSICAL_OFFSET),
    "storeSize": _int32(layout.TOTAL_SIZE),
    "msgSize": lambda batch: batch.column("storeSize"),
    "bodyLength": _int32(layout.BODY_LENGTH),
    "bodyCRC": _int32(layout.BODY_CRC),
    "crcOk": _crc_ok,
    "sysFlag": _int32(layout.SYS_FLAG),
    "reconsumeTimes": _int32(layout.RECONSUME_TIMES),
    "preparedTransactionOffset": _int64(layout.PREPARED_OFFSET),
    "tags": _picked(layout.FIELD_TAGS),
    "tagsCode": lambda batch: _tags_codes_of(batch),
    "keys": _picked(layout.FIELD_KEYS),
    "uniqKey": _picked(layout.FIELD_UNIQ_KEY),
    "msgId": lambda batch: columns.message_ids(batch.pa, batch.buf, batch.rows, batch.count),
    "bornTime": _timestamps(layout.BORN_TIMESTAMP),
    "storeTime": _timestamps(layout.STORE_TIMESTAMP),
}


def message_batches(
    location: StoreLocation,
    parts: Sequence[FileRange],
    options: MessageRowOptions,
    *,
    coded: bool = False,
    gone: Callable[[FileRange], bool] | None = None,
) -> Iterator[Any]:
    """Arrow record batches of the messages starting in ``parts`` (consecutive ranges, in
    order) that pass the options' filters: a kernel batch of rows each, the small ones of
    consecutive ranges gathered into one (see :class:`BatchGatherer`). A range whose read
    fails for which ``gone`` says true (its file deleted meanwhile) ends with the messages
    read before the failure."""
    built: list[Any] = []
    gatherer = BatchGatherer(MessageBatcher(options, coded=coded), built.append)
    for part in parts:
        scan = RangeScan(
            location,
            part,
            options.check_crc,
            resync_last=options.resync_last,
            batch_rows=EXPORT_BATCH_ROWS,
        )
        label = f"commitlog/{part.name}"
        try:
            for buf, _, rows, count in scan.batches():
                gatherer.add(buf, rows, count, label)
                yield from built
                built.clear()
        except StoreIOError:
            if gone is None or not gone(part):
                raise
    gatherer.flush()
    yield from built


class MessageBatcher:
    """Kernel row batches (of the commit-log files their runs name) into Arrow record batches
    (see :mod:`rmqstore.pipeline.columns`): the columns ``options.columns`` names, or all of
    :data:`COMMITLOG_COLUMNS`, of the rows that pass the options' filters. A filter's column
    is built first, for every row; the others only for the rows that pass. With ``coded``
    (batches for the Parquet writer), the :data:`CODED_TEXT` columns stay Arrow dictionaries
    and the :data:`ALWAYS_PRESENT` ones are declared not null; without it, the options'
    ``not_null`` ones are."""

    def __init__(self, options: MessageRowOptions, *, coded: bool = False) -> None:
        import pyarrow as pa

        self.pa = pa
        self.options = options
        wanted = commitlog_columns(options.columns)
        not_null = ALWAYS_PRESENT if coded else options.not_null
        self.schema = arrow_schema(wanted, coded=coded, not_null=not_null)
        self.names = [name for name, _, _ in wanted]
        self.coded = CODED_TEXT if coded else frozenset()
        self.filters = options.row_filters()
        self.map_wanted = "properties" in self.names or any(
            row_filter.column == "properties" for row_filter in self.filters
        )
        self.integer_columns = tuple(
            dict.fromkeys(
                pair
                for name in [*self.names, *(row_filter.column for row_filter in self.filters)]
                for pair in _ROW_INTEGERS.get(name, ())
            )
        )
        self.levels = DelayLevels(options.delay_levels) if options.delay_levels else DelayLevels()

    def __call__(
        self, buf: Any, rows: Any, count: int, runs: Sequence[tuple[str, int]]
    ) -> tuple[Any | None, tuple[int, ...]]:
        """The record batch of ``count`` rows (None when no row passes the filters), whose
        files ``runs`` names (file label, rows) in order, and how many rows of each run it
        holds."""
        pa = self.pa
        batch = _Batch(
            pa,
            buf,
            rows,
            count,
            self.options,
            self.levels,
            runs,
            self.map_wanted,
            self.integer_columns,
        )
        if self.filters:
            keep = keep_mask(pa, self.filters, batch.column)
            kept = arrowcalls.total(arrowcalls.cast(keep, pa.int64()))
            if not kept:
                return None, (0,) * len(batch.runs)
            if kept < count:
                batch.keep_only(keep)
        arrays = [
            batch.coded(name) if name in self.coded else batch.column(name) for name in self.names
        ]
        kept_runs = tuple(kept for _, kept in batch.runs)
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema), kept_runs


class BatchGatherer:
    """Arrow batches from kernel batches of rows, in order, handed to ``emit``: a kernel
    batch of many rows is built as it is; one of few (the end of a range, a whole small
    file) is copied aside, records and rows, and built with those after it, up to
    :data:`EXPORT_BATCH_ROWS` rows or :data:`GATHER_BYTES` of records. A part of many small
    files is then a few batches, not one per file: each batch costs some 70 Arrow calls
    whatever its rows (0.7 ms a file, three quarters of an export of 4 KiB files). ``kept``:
    the rows each tag's kernel batches put in the emitted batches (those that pass the
    filters), complete after :meth:`flush`."""

    def __init__(self, batcher: MessageBatcher, emit: Callable[[Any], None]) -> None:
        self.batcher, self.emit = batcher, emit
        self.kept: dict[Any, int] = {}
        self._start()

    def _start(self) -> None:
        self.records = bytearray()  # a new one each time: built batches may share its memory
        self.rows = array("q")
        self.count = 0
        self.runs: list[tuple[str, int, Any]] = []

    def add(self, buf: Any, rows: Any, count: int, label: str, tag: Any = None) -> None:
        """The kernel batch of ``count`` rows of ``buf`` (records of the file ``label``
        names), its rows counted under ``tag``."""
        if not count:
            return
        width = layout.ROW_WIDTH
        first = rows[layout.POSITION]
        last = (count - 1) * width
        end = rows[last + layout.POSITION] + rows[last + layout.TOTAL_SIZE]
        if count >= GATHER_ROWS or end - first >= GATHER_BYTES:
            self.flush()
            self._build(buf, rows, count, [(label, count, tag)])
            return
        if self.count + count > EXPORT_BATCH_ROWS or len(self.records) + end - first > GATHER_BYTES:
            self.flush()
        shift = len(self.records) - first
        self.records += memoryview(buf)[first:end]
        copied = rows[: count * width]
        for column in (layout.POSITION, layout.TOPIC_AT, layout.PROPERTIES_AT):
            copied[column::width] = array("q", [at + shift for at in copied[column::width]])
        self.rows += copied
        self.count += count
        if self.runs and self.runs[-1][0] == label and self.runs[-1][2] == tag:
            self.runs[-1] = (label, self.runs[-1][1] + count, tag)
        else:
            self.runs.append((label, count, tag))

    def flush(self) -> None:
        """Build what was gathered."""
        if self.count:
            records, rows, count, runs = self.records, self.rows, self.count, self.runs
            self._start()
            self._build(records, rows, count, runs)

    def _build(self, buf: Any, rows: Any, count: int, runs: list[tuple[str, int, Any]]) -> None:
        batch, kept = self.batcher(buf, rows, count, [(label, n) for label, n, _ in runs])
        for (_, _, tag), rows_kept in zip(runs, kept, strict=True):
            self.kept[tag] = self.kept.get(tag, 0) + rows_kept
        if batch is not None:
            self.emit(batch)


def _kept_runs(
    pa: Any, runs: tuple[tuple[str, int], ...], keep: Any, kept: int
) -> tuple[tuple[str, int], ...]:
    """``runs`` (file label, rows) after the rows where ``keep`` is false are dropped."""
    if len(runs) == 1:
        return ((runs[0][0], kept),)
    # the kept rows up to each run's end, from one running sum (not a sum per run)
    running = arrowcalls.call("cumulative_sum", arrowcalls.cast(keep, pa.int64()))
    last_rows = array("q", accumulate(rows for _, rows in runs))
    for at, end in enumerate(last_rows):
        last_rows[at] = end - 1
    indices = pa.Array.from_buffers(pa.int64(), len(last_rows), [None, pa.py_buffer(last_rows)])
    kept_to_end = arrowcalls.take(running, indices).to_pylist()
    return tuple(
        (label, end - before)
        for (label, _), end, before in zip(runs, kept_to_end, [0, *kept_to_end], strict=False)
    )


def _inflated(pa: Any, bodies: Any, sys_flags: Any) -> Any:
    """``bodies`` with those of COMPRESSED records inflated (ZLIB, compression type 0 or 3,
    as :func:`rmqstore.record.decompress_body`); a body of another type, or one that does not
    inflate, stays as stored (``sysFlag`` still says it is compressed)."""
    call = arrowcalls.call
    compressed = call(
        "not_equal",
        call("bit_wise_and", sys_flags, columns.constant32(pa, COMPRESSED_FLAG)),
        columns.constant32(pa, 0),
    )
    if not call("any", compressed).as_py():
        return bodies
    flags = sys_flags.to_pylist()
    values = bodies.to_pylist()
    for row, flag in enumerate(flags):
        if values[row] and flag & COMPRESSED_FLAG:
            with suppress(InputError):  # one that does not inflate is kept as stored
                values[row] = inflate_body(values[row], flag, -1)
    return pa.array(values, type=pa.binary())


_PROPERTIES_LENGTH = ((layout.PROPERTIES_LENGTH, 8),)  # the property parse sizes its buffers by it
_ROW_INTEGERS: dict[str, tuple[tuple[int, int], ...]] = {  # (row column, width) a column takes
    "queueId": ((layout.QUEUE_ID, 4),),
    "queueOffset": ((layout.QUEUE_OFFSET, 8),),
    "properties": _PROPERTIES_LENGTH,
    "bornTimestamp": ((layout.BORN_TIMESTAMP, 8),),
    "storeTimestamp": ((layout.STORE_TIMESTAMP, 8),),
    "flag": ((layout.FLAG, 4),),
    "commitLogOffset": ((layout.PHYSICAL_OFFSET, 8),),
    "storeSize": ((layout.TOTAL_SIZE, 4),),
    "msgSize": ((layout.TOTAL_SIZE, 4),),
    "bodyLength": ((layout.BODY_LENGTH, 4),),
    "bodyCRC": ((layout.BODY_CRC, 4),),
    "sysFlag": ((layout.SYS_FLAG, 4),),
    "reconsumeTimes": ((layout.RECONSUME_TIMES, 4),),
    "preparedTransactionOffset": ((layout.PREPARED_OFFSET, 8),),
    "tags": _PROPERTIES_LENGTH,
    "tagsCode": _PROPERTIES_LENGTH,
    "keys": _PROPERTIES_LENGTH,
    "uniqKey": _PROPERTIES_LENGTH,
    "version": ((layout.VERSION, 8),),
    "bornTime": ((layout.BORN_TIMESTAMP, 8),),
    "storeTime": ((layout.STORE_TIMESTAMP, 8),),
}
_CODED_BUILDERS: dict[str, Any] = {  # columns built as dictionaries
    "version": _version,
    "file": lambda batch: columns.labels(batch.pa, batch.runs),
    "bornHost": _hosts(layout.FIELD_BORN_HOST),
    "storeHost": _hosts(layout.FIELD_STORE_HOST),
}
_MOST_DISTINCT_TAGS = 1024  # a batch with more is hashed by the kernel, row by row


def _tags_codes_of(batch: _Batch) -> Any:
    """The tagsCode of each row, from the batch's tags column: each distinct TAGS hashed
    once, as the dispatcher hashes it (a batch holds few). A batch with SCHEDULE_TOPIC_XXXX
    records (whose tagsCode is a deliver time) or very many distinct tags goes the
    dispatcher's way, row by row (:func:`_tags_codes`)."""
    call = arrowcalls.call
    pa = batch.pa
    scheduled = call("equal", batch.column("topic"), columns.strings(pa, [SCHEDULE_TOPIC])[0])
    encoded = batch.coded("tags")
    if call("any", scheduled).as_py() or len(encoded.dictionary) > _MOST_DISTINCT_TAGS:
        return _tags_codes(pa, batch.buf, batch.rows, batch.count, batch.levels)
    codes = array("q", [tags_code(tags) for tags in encoded.dictionary.to_pylist()])
    hashed = pa.Array.from_buffers(pa.int64(), len(codes), [None, pa.py_buffer(codes)])
    return call("coalesce", arrowcalls.take(hashed, encoded.indices), columns.constant(pa, 0))


def _tags_codes(pa: Any, buf: Any, rows: Any, count: int, levels: DelayLevels) -> Any:
    """The tagsCode of each row: the kernel's hash of TAGS, and for the rows it leaves to the
    reference (SCHEDULE_TOPIC_XXXX, text that is not ASCII) the dispatcher's own rule (null
    where a DELAY is not a number)."""
    width = layout.DISPATCH_WIDTH
    out = columns.scratch("dispatch", width * count)
    kernel.prepare_dispatch(buf, rows, 0, count, 0, out, bytearray())
    codes = out[layout.TAGS_CODE : width * count : width]
    flags = out[layout.DISPATCH_FLAGS : width * count : width]
    if flags.count(0) + flags.count(layout.HAS_COPIES) == count:  # none NEEDS_REFERENCE
        return pa.Array.from_buffers(pa.int64(), count, [None, pa.py_buffer(codes)])
    found: list[int | None] = list(codes)
    topic_names = layout.TopicNames()
    for row, flag in enumerate(flags):
        if flag & layout.NEEDS_REFERENCE:
            _, header, topic, props, _ = record_item(buf, rows, row, topic_names)
            properties = decode_properties(props)
            if topic == SCHEDULE_TOPIC:
                try:
                    found[row] = unit_tags_code(topic, properties, header.store_timestamp, levels)
                except RecordError:
                    found[row] = None
            else:
                found[row] = tags_code(properties.get(TAGS))
    return pa.array(found, type=pa.int64())


def queue_unit_batches(
    location: StoreLocation,
    queues: Sequence[tuple[str, int]],
    commitlog_min_offset: int,
    names: Sequence[str],
    not_null: Collection[str],
    file_size: int | None = None,
) -> Iterator[Any]:
    """Arrow batches of the columns ``names`` (of :data:`CONSUMEQUEUE_COLUMNS`, those in
    ``not_null`` declared not null; none holds a null) of the rows of consume ``queues``
    (topic, queue id), in order: each queue's units up to where a broker's recovery ends it
    (the first invalid unit, ``offset < 0 or size <= 0``, of its last three files, or a gap
    between files), leaving out pre-blank units, units of records in deleted commit-log
    files and invalid units before that end, as a broker's load does. A queue file of
    another size than ``file_size`` (None: than the queue's other files) is an error. Each
    file is read a chunk at a time (the last ones up to their first invalid unit: a queue's
    last file is mostly unwritten), and the units of small queues share batches."""
    import pyarrow as pa

    kinds = {name: arrow for name, _, arrow in CONSUMEQUEUE_COLUMNS}
    schema = pa.schema(
        [pa.field(name, pa.type_for_alias(kinds[name]), name not in not_null) for name in names]
    )
    pending = _PendingUnits()
    for topic, queue_id in queues:
        for piece in _queue_pieces(location, topic, queue_id, file_size):
            pending.add(piece)
            if pending.count >= _UNITS_PER_BATCH:
                yield from pending.batches(commitlog_min_offset, schema)
    yield from pending.batches(commitlog_min_offset, schema)


# units gathered before a batch is made of them (a chunk of a file is up to 209,715)
_UNITS_PER_BATCH = 65536
# the columns a piece of units holds one value in: the piece's attribute holding it
_PIECE_VALUES = {"topic": "topic", "queueId": "queue_id", "file": "file"}


@dataclass
class _UnitPiece:
    """Valid units of one queue file, read at once: ``data``, ``count`` of them (and no more
    bytes: a piece waiting for its batch keeps nothing of its chunk's unwritten rest), the
    first at ``first_queue_offset``."""

    topic: str
    queue_id: int
    file: str
    first_queue_offset: int
    data: bytes
    count: int


def _queue_pieces(
    location: StoreLocation, topic: str, queue_id: int, file_size: int | None = None
) -> Iterator[_UnitPiece]:
    """A queue's units, a chunk of a file at a time: every unit of the files before its
    last three, then (a broker's recovery walks only those) up to the first invalid unit;
    a gap between its files ends it too. A file of another size than ``file_size`` (None:
    than the queue's others) is refused, as a broker does not load it (the rest of the
    queue was left out in silence)."""
    relative = f"consumequeue/{topic}/{queue_id}"
    files = location.checked_segments(relative, "consume-queue", "its queue", file_size)
    walked = max(0, len(files) - 3)  # the first of the files recovery walks
    expected = None
    for number, (name, size) in enumerate(files):
        if expected is not None and int(name) != expected:
            return
        file = f"{relative}/{name}"
        first = int(name) // UNIT.size
        for position, data in _queue_chunks(location, file, size):
            units = len(data) // UNIT.size
            valid = units if number < walked else kernel.valid_units(data)
            if valid:
                offset = first + position // UNIT.size
                kept = data if valid * UNIT.size == len(data) else data[: valid * UNIT.size]
                yield _UnitPiece(topic, queue_id, file, offset, kept, valid)
            if valid < units:
                return
        expected = int(name) + size


class _PendingUnits:
    """Pieces of units waiting to be made one batch."""

    def __init__(self) -> None:
        self.pieces: list[_UnitPiece] = []
        self.count = 0

    def add(self, piece: _UnitPiece) -> None:
        self.pieces.append(piece)
        self.count += piece.count

    def batches(self, commitlog_min_offset: int, schema: Any) -> Iterator[Any]:
        """The pieces as one batch of ``schema``'s columns, pre-blank units, invalid ones and
        those below ``commitlog_min_offset`` left out (none when that leaves no row); then
        none pending."""
        import pyarrow as pa
        import pyarrow.compute as pc

        pieces, count = self.pieces, self.count
        self.pieces, self.count = [], 0
        if not pieces:
            return
        data = b"".join(piece.data for piece in pieces)
        offset_words, size_words, code_words = _unit_fields(data, count)
        offsets = pa.Array.from_buffers(pa.int64(), count, [None, pa.py_buffer(offset_words)])
        sizes = pa.Array.from_buffers(pa.int32(), count, [None, pa.py_buffer(size_words)])
        queue_offsets = array("q")
        for piece in pieces:
            first = piece.first_queue_offset
            queue_offsets.extend(range(first, first + piece.count))
        built = {
            "commitLogOffset": offsets,
            "storeSize": sizes,
            "tagsCode": pa.Array.from_buffers(pa.int64(), count, [None, pa.py_buffer(code_words)]),
            "queueOffset": pa.Array.from_buffers(
                pa.int64(), count, [None, pa.py_buffer(queue_offsets)]
            ),
        }
        for field in schema:
            if field.name not in built:  # topic, queueId, file: a value per piece
                attribute = _PIECE_VALUES[field.name]
                built[field.name] = pa.concat_arrays(
                    [
                        pa.repeat(pa.scalar(getattr(piece, attribute), field.type), piece.count)
                        for piece in pieces
                    ]
                )
        batch = pa.RecordBatch.from_arrays([built[field.name] for field in schema], schema=schema)
        pre_blank = pc.and_(pc.equal(offsets, 0), pc.equal(sizes, PRE_BLANK_SIZE))
        keep = pc.and_(pc.greater_equal(offsets, commitlog_min_offset), pc.invert(pre_blank))
        keep = pc.and_(keep, pc.greater(sizes, 0))  # invalid units before the walked files
        if not pc.all(keep).as_py():
            batch = batch.filter(keep)
        if batch.num_rows:
            yield batch


def _unit_fields(data: bytes, count: int) -> tuple[array, array, array]:
    """The commit-log offsets, sizes and tagsCodes of the first ``count`` units of ``data``
    (big-endian, 20 bytes each) as native int64, int32 and int64 values: the units read as
    32-bit words, each field's words taken a fifth at a time (C loops, not a Python object
    per unit)."""
    words = array(_WORD)
    words.frombytes(data[: count * UNIT.size])
    if sys.byteorder == "little":
        words.byteswap()
    return _long_of(words, 0, count), words[2::5], _long_of(words, 3, count)


def _long_of(words: array, at: int, count: int) -> array:
    """The 64-bit values whose high word is at ``at`` of every five ``words`` (native words
    of big-endian longs), as the native bytes of an int64 array (in 32-bit items)."""
    high, low = words[at::5], words[at + 1 :: 5]
    values = array(_WORD, bytes(8 * count))
    if sys.byteorder == "little":
        values[0::2], values[1::2] = low, high
    else:
        values[0::2], values[1::2] = high, low
    return values


_WORD = next(code for code in "IL" if array(code).itemsize == 4)  # an unsigned 32-bit item


def queue_unit_bytes(location: StoreLocation, topic: str, queue_id: int) -> int:
    """About how many bytes of units a consume queue holds, for planning: its files but the
    last whole, and the last one's up to its first invalid unit (read a chunk at a time)."""
    relative = f"consumequeue/{topic}/{queue_id}"
    files = location.segments(relative)
    if not files:
        return 0
    name, size = files[-1]
    total = sum(whole for _, whole in files[:-1])
    last = _reader(location, f"{relative}/{name}")
    return total + valid_prefix(last, size - size % UNIT.size)[0]


def _queue_chunks(location: StoreLocation, file: str, size: int) -> Iterator[tuple[int, bytes]]:
    """``(position, bytes)`` of the whole units of a queue file of ``size`` bytes, a chunk at
    a time from its start (:func:`rmqstore.consumequeue.file_chunks`: a caller stopping early
    reads little of a mostly unwritten file)."""
    return file_chunks(_reader(location, file), size - size % UNIT.size)


def _reader(location: StoreLocation, file: str) -> ChunkReader:
    """``read(position, length)``: the bytes of ``file`` (store-relative) there."""

    def read(position: int, length: int) -> bytes:
        with location.open_range(file, position, length) as (buf, _):
            return bytes(buf)

    return read
