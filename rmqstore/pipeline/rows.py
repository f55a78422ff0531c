"""Rows of the pipeline: the columns of the ``rocketmq-commitlog`` and
``rocketmq-consumequeue`` sources and the functions producing them from one range or one
queue. Shared by the Spark data sources and the local engine of ``export``; pyarrow is
imported when batches are built, pyspark never.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rmqstore.consumequeue import PRE_BLANK_SIZE, UNIT
from rmqstore.delay import SCHEDULE_TOPIC, DelayLevels
from rmqstore.dispatch import unit_tags_code
from rmqstore.errors import RecordError
from rmqstore.hashing import tags_code
from rmqstore.hosts import HostAddress
from rmqstore.pipeline.location import StoreLocation
from rmqstore.pipeline.ranges import FileRange, RangeScan
from rmqstore.properties import KEYS, TAGS, UNIQ_KEY, decode_properties
from rmqstore.record import (
    H_BODY_CRC,
    H_BODY_LENGTH,
    H_BORN_HOST,
    H_BORN_TIMESTAMP,
    H_FLAG,
    H_MAGIC,
    H_PREPARED_OFFSET,
    H_QUEUE_ID,
    H_QUEUE_OFFSET,
    H_RECONSUME_TIMES,
    H_STORE_HOST,
    H_STORE_TIMESTAMP,
    H_SYS_FLAG,
    H_TOTAL_SIZE,
    MAGIC_V2,
    header_struct,
)

BATCH_ROWS = 4096

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
]
CONSUMEQUEUE_COLUMNS = [
    ("topic", "STRING", "string"),
    ("queueId", "INT", "int32"),
    ("queueOffset", "BIGINT", "int64"),
    ("commitLogOffset", "BIGINT", "int64"),
    ("size", "INT", "int32"),
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
    }
    return pa.schema([(name, types[kind]) for name, _, kind in columns])


@dataclass(frozen=True)
class MessageRowOptions:
    include_body: bool = True
    check_crc: bool = False
    topics: frozenset[str] | None = None
    delay_levels: str | None = None  # messageDelayLevel, for SCHEDULE_TOPIC_XXXX tagsCode
    resync_last: bool = False  # the last file's end is known (file bounds): skip damage


def message_batches(
    location: StoreLocation, part: FileRange, options: MessageRowOptions
) -> Iterator[Any]:
    """Arrow record batches (:data:`COMMITLOG_COLUMNS`) of the messages starting in ``part``."""
    import pyarrow as pa

    schema = arrow_schema(COMMITLOG_COLUMNS)
    levels = DelayLevels(options.delay_levels) if options.delay_levels else DelayLevels()
    topics = options.topics
    include_body = options.include_body
    columns: list[list[Any]] = [[] for _ in COMMITLOG_COLUMNS]
    adds = [column.append for column in columns]
    file_label = f"commitlog/{part.name}"
    hosts: dict[bytes, str] = {}
    scan = RangeScan(location, part, options.check_crc, resync_last=options.resync_last)
    for buf, at, offset, header, topic, props, crc_ok in scan:
        if topics is not None and topic not in topics:
            continue
        properties = decode_properties(props)
        tags = properties.get(TAGS)
        if topic == SCHEDULE_TOPIC:
            try:
                code = unit_tags_code(topic, properties, header[H_STORE_TIMESTAMP], levels)
            except RecordError:
                code = None
        else:
            code = tags_code(tags)
        body = None
        if include_body:
            body_at = offset - part.file_start - at + header_struct(header[H_SYS_FLAG]).size
            body = bytes(buf[body_at : body_at + header[H_BODY_LENGTH]])
        born_host = header[H_BORN_HOST]
        store_host = header[H_STORE_HOST]
        born = hosts.get(born_host)
        if born is None:
            born = hosts[born_host] = str(HostAddress.from_field(born_host))
        stored = hosts.get(store_host)
        if stored is None:
            stored = hosts[store_host] = str(HostAddress.from_field(store_host))
        for add, value in zip(
            adds,
            (
                topic,
                header[H_QUEUE_ID],
                header[H_QUEUE_OFFSET],
                body,
                list(properties.items()),
                header[H_BORN_TIMESTAMP],
                header[H_STORE_TIMESTAMP],
                header[H_FLAG],
                offset,
                header[H_TOTAL_SIZE],
                header[H_TOTAL_SIZE],
                header[H_BODY_LENGTH],
                header[H_BODY_CRC],
                crc_ok,
                header[H_SYS_FLAG],
                born,
                stored,
                header[H_RECONSUME_TIMES],
                header[H_PREPARED_OFFSET],
                tags,
                code,
                properties.get(KEYS),
                properties.get(UNIQ_KEY),
                (store_host + offset.to_bytes(8, "big")).hex().upper(),
                "V2" if header[H_MAGIC] == MAGIC_V2 else "V1",
                file_label,
            ),
            strict=True,
        ):
            add(value)
        if len(columns[0]) >= BATCH_ROWS:
            yield _batch(pa, columns, schema)
            for column in columns:
                column.clear()
    if columns[0]:
        yield _batch(pa, columns, schema)


def _batch(pa: Any, columns: list[list[Any]], schema: Any) -> Any:
    return pa.RecordBatch.from_arrays(
        [pa.array(column, type=field.type) for column, field in zip(columns, schema, strict=True)],
        schema=schema,
    )


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
