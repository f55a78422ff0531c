"""Rows of the pipeline: the columns of the ``rocketmq-commitlog`` and
``rocketmq-consumequeue`` sources and the functions producing them from one range or one
queue. Shared by the Spark data sources and the local engine of ``export``; pyarrow is
imported when batches are built, pyspark never.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from rmqstore import kernel
from rmqstore.consumequeue import PRE_BLANK_SIZE, UNIT
from rmqstore.delay import SCHEDULE_TOPIC, DelayLevels
from rmqstore.dispatch import unit_tags_code
from rmqstore.errors import InputError, RecordError
from rmqstore.hashing import tags_code
from rmqstore.kernel import layout
from rmqstore.kernel.layout import new_dispatch_out
from rmqstore.pipeline import columns
from rmqstore.pipeline.location import StoreLocation
from rmqstore.pipeline.ranges import FileRange, RangeScan
from rmqstore.properties import TAGS, decode_properties
from rmqstore.record import COMPRESSED_FLAG, inflate_body, record_item

EXPORT_BATCH_ROWS = 16384  # rows per Arrow batch (fewer when a window of the file ends)

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


def ddl(columns: list[tuple[str, str, str]]) -> str:
    """A Spark DDL schema string for ``columns``."""
    return ", ".join(f"{name} {kind}" for name, kind, _ in columns)


def arrow_schema(columns: list[tuple[str, str, str]]) -> Any:
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
    return pa.schema([(name, types[kind]) for name, _, kind in columns])


@dataclass(frozen=True)
class MessageRowOptions:
    include_body: bool = True
    check_crc: bool = False
    topics: frozenset[str] | None = None
    delay_levels: str | None = None  # messageDelayLevel, for SCHEDULE_TOPIC_XXXX tagsCode
    resync_last: bool = False  # the last file's end is known (file bounds): skip damage
    decompress: bool = False  # inflate ZLIB bodies of COMPRESSED records, as a consumer does


def message_batches(
    location: StoreLocation, part: FileRange, options: MessageRowOptions
) -> Iterator[Any]:
    """Arrow record batches (:data:`COMMITLOG_COLUMNS`) of the messages starting in ``part``,
    one per kernel batch of rows (see :mod:`rmqstore.pipeline.columns`)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    schema = arrow_schema(COMMITLOG_COLUMNS)
    properties_type = schema.field("properties").type
    levels = DelayLevels(options.delay_levels) if options.delay_levels else DelayLevels()
    wanted = None if options.topics is None else columns.strings(pa, sorted(options.topics))
    file_label = f"commitlog/{part.name}"
    scan = RangeScan(
        location,
        part,
        options.check_crc,
        resync_last=options.resync_last,
        batch_rows=EXPORT_BATCH_ROWS,
    )
    for buf, _, rows, count in scan.batches():
        topic = columns.topics(pa, buf, rows, count)
        keep = None
        if wanted is not None:
            keep = pc.is_in(topic, value_set=wanted)
            if not pc.any(keep).as_py():
                continue
        crc_ok = (
            columns.crc_verdicts(pa, rows, count)
            if options.check_crc
            else pa.nulls(count, pa.bool_())
        )
        size = columns.integers(pa, rows, layout.TOTAL_SIZE, count, pa.int32())
        arrays = [
            topic,
            columns.integers(pa, rows, layout.QUEUE_ID, count, pa.int32()),
            columns.integers(pa, rows, layout.QUEUE_OFFSET, count),
            (
                columns.binary(pa, buf, rows, count, layout.FIELD_BODY)
                if options.include_body
                else pa.nulls(count, pa.binary())
            ),
            columns.properties(pa, buf, rows, count, properties_type),
            columns.integers(pa, rows, layout.BORN_TIMESTAMP, count),
            columns.integers(pa, rows, layout.STORE_TIMESTAMP, count),
            columns.integers(pa, rows, layout.FLAG, count, pa.int32()),
            columns.integers(pa, rows, layout.PHYSICAL_OFFSET, count),
            size,
            size,
            columns.integers(pa, rows, layout.BODY_LENGTH, count, pa.int32()),
            columns.integers(pa, rows, layout.BODY_CRC, count, pa.int32()),
            crc_ok,
            columns.integers(pa, rows, layout.SYS_FLAG, count, pa.int32()),
            columns.hosts(pa, buf, rows, count, layout.FIELD_BORN_HOST),
            columns.hosts(pa, buf, rows, count, layout.FIELD_STORE_HOST),
            columns.integers(pa, rows, layout.RECONSUME_TIMES, count, pa.int32()),
            columns.integers(pa, rows, layout.PREPARED_OFFSET, count),
            columns.text(pa, columns.binary(pa, buf, rows, count, layout.FIELD_TAGS)),
            _tags_codes(pa, buf, rows, count, levels),
            columns.text(pa, columns.binary(pa, buf, rows, count, layout.FIELD_KEYS)),
            columns.text(pa, columns.binary(pa, buf, rows, count, layout.FIELD_UNIQ_KEY)),
            columns.message_ids(pa, buf, rows, count),
            columns.chosen(
                pa,
                pc.equal(
                    columns.integers(pa, rows, layout.VERSION, count), columns.constant(pa, 2)
                ),
                "V2",
                "V1",
            ),
            columns.repeated(pa, file_label, count),
            columns.timestamps(pa, rows, layout.BORN_TIMESTAMP, count),
            columns.timestamps(pa, rows, layout.STORE_TIMESTAMP, count),
        ]
        if options.decompress and options.include_body:
            arrays[3] = _inflated(pa, arrays[3], arrays[14])
        batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
        yield batch if keep is None else batch.filter(keep)


def _inflated(pa: Any, bodies: Any, sys_flags: Any) -> Any:
    """``bodies`` with those of COMPRESSED records inflated (ZLIB, compression type 0 or 3,
    as :func:`rmqstore.record.decompress_body`); a body of another type, or one that does not
    inflate, stays as stored (``sysFlag`` still says it is compressed)."""
    import pyarrow.compute as pc

    compressed = pc.not_equal(
        pc.bit_wise_and(sys_flags, columns.constant32(pa, COMPRESSED_FLAG)),
        columns.constant32(pa, 0),
    )
    if not pc.any(compressed).as_py():
        return bodies
    flags = sys_flags.to_pylist()
    values = bodies.to_pylist()
    for row, flag in enumerate(flags):
        if values[row] and flag & COMPRESSED_FLAG:
            with suppress(InputError):  # one that does not inflate is kept as stored
                values[row] = inflate_body(values[row], flag, -1)
    return pa.array(values, type=pa.binary())


def _tags_codes(pa: Any, buf: Any, rows: Any, count: int, levels: DelayLevels) -> Any:
    """The tagsCode of each row: the kernel's hash of TAGS, and for the rows it leaves to the
    reference (SCHEDULE_TOPIC_XXXX, text that is not ASCII) the dispatcher's own rule (null
    where a DELAY is not a number)."""
    out = new_dispatch_out(count)
    kernel.prepare_dispatch(buf, rows, 0, count, 0, out, bytearray())
    codes = out[layout.TAGS_CODE :: layout.DISPATCH_WIDTH]
    flags = out[layout.DISPATCH_FLAGS :: layout.DISPATCH_WIDTH]
    if not flags.count(layout.NEEDS_REFERENCE):
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


def queue_units(
    location: StoreLocation, topic: str, queue_id: int, commitlog_min_offset: int
) -> Iterator[tuple]:
    """Rows (:data:`CONSUMEQUEUE_COLUMNS`) of one consume queue: units up to the first invalid
    one (``offset < 0 or size <= 0``, or a gap between files), leaving out pre-blank units and
    units of records in deleted commit-log files, as a broker's load does."""
    relative = f"consumequeue/{topic}/{queue_id}"
    expected = None
    for name, size in location.segments(relative):
        if expected is not None and int(name) != expected:
            return
        with location.open_range(f"{relative}/{name}", 0, size) as (buf, _):
            data = bytes(buf[: size - size % UNIT.size])
        for index, (offset, unit_size, code) in enumerate(UNIT.iter_unpack(data)):
            if offset < 0 or unit_size <= 0:
                return
            if unit_size == PRE_BLANK_SIZE and offset == 0:
                continue
            if offset >= commitlog_min_offset:
                yield (
                    topic,
                    queue_id,
                    (int(name) // UNIT.size) + index,
                    offset,
                    unit_size,
                    code,
                    f"{relative}/{name}",
                )
        expected = int(name) + size
