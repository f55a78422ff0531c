"""Python Data Sources for Spark 4 (``pyspark.sql.datasource``) over the shared engine codec.

``rocketmq-commitlog``: one row per message (:data:`~rmqstore.pipeline.rows.COMMITLOG_COLUMNS`).
Partitions are byte ranges of the commit-log files (``splitSize``, default 32 MiB; see
:mod:`rmqstore.pipeline.ranges`): a range starting inside a file begins at its next record, and
damaged regions of completed files are skipped. The last file holding data is read as one
partition, so that its first invalid record ends the log as recovery sees it, unless
``fileBounds`` (from a ``summary=files`` read, as the rmqstore jobs do) says where each file's
records end. ``read()`` yields Arrow record batches. With ``summary=files`` it yields one row
per range instead (:data:`~rmqstore.pipeline.ranges.SUMMARY_FIELDS`).

``rocketmq-consumequeue``: one row per consume-queue unit, one partition per queue.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import astuple
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from rmqstore.config import DEFAULT_MAX_MESSAGE_SIZE
from rmqstore.delay import DelayLevels
from rmqstore.errors import InputError
from rmqstore.pipeline.location import StoreLocation
from rmqstore.pipeline.ranges import (
    DEFAULT_SPLIT,
    SUMMARY_FIELDS,
    FileRange,
    plan_ranges,
    record_margin,
    summarize_range,
)
from rmqstore.pipeline.rows import (
    COMMITLOG_COLUMNS,
    CONSUMEQUEUE_COLUMNS,
    MessageRowOptions,
    ddl,
    message_batches,
    queue_units,
)


def _option(options: dict[str, str], name: str, default: str | None = None) -> str | None:
    for key in (name, name.lower()):
        if key in options:
            return options[key]
    return default


def _flag(options: dict[str, str], name: str, default: bool) -> bool:
    value = _option(options, name)
    return default if value is None else value.strip().lower() in ("1", "true", "yes")


def _int_option(options: dict[str, str], name: str, default: int) -> int:
    value = _option(options, name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise InputError(f"option {name}={value!r} is not an integer") from None


def _topics(options: dict[str, str]) -> frozenset[str] | None:
    topics = _option(options, "topics") or _option(options, "topic") or ""
    return frozenset(t for t in topics.split(",") if t) or None


class CommitLogReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.location = StoreLocation(str(_option(options, "path", "")))
        self.split = _int_option(options, "splitSize", DEFAULT_SPLIT)
        self.margin = record_margin(
            _int_option(options, "maxMessageSize", DEFAULT_MAX_MESSAGE_SIZE)
        )
        self.summary = (_option(options, "summary") or "") == "files"
        self.crc_from = _int_option(options, "crcFrom", 0)
        bounds = _option(options, "fileBounds")
        try:
            self.bounds = (
                {str(k): int(v) for k, v in json.loads(bounds).items()} if bounds else None
            )
        except (ValueError, AttributeError):
            raise InputError("option fileBounds is not a JSON object of offsets") from None
        self.rows = MessageRowOptions(
            include_body=_flag(options, "includeBody", True),
            check_crc=_flag(options, "verifyCrc", False),
            topics=_topics(options),
            delay_levels=_option(options, "messageDelayLevel"),
            resync_last=self.bounds is not None,
        )

    def partitions(self) -> list[InputPartition]:
        self.location.check_store()
        ranges = plan_ranges(
            self.location,
            self.split,
            split_last=self.summary or self.bounds is not None,
            bounds=self.bounds,
            margin=self.margin,
        )
        return [InputPartition(part) for part in ranges]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        part: FileRange = partition.value
        if not self.summary:
            yield from message_batches(self.location, part, self.rows)
            return
        levels = self.rows.delay_levels
        summary = summarize_range(
            self.location,
            part,
            check_crc=self.rows.check_crc and part.file_start >= self.crc_from,
            delay_levels=DelayLevels(levels) if levels else DelayLevels(),
        )
        yield astuple(summary)


class CommitLogDataSource(DataSource):
    """``spark.read.format("rocketmq-commitlog").load(STORE)``: one row per message.

    Options: includeBody (true), verifyCrc (false: crcOk is null), topics (comma-separated),
    splitSize (bytes, 33554432; 0 for one partition per file), messageDelayLevel (for the
    deliver-time tagsCode of SCHEDULE_TOPIC_XXXX), maxMessageSize (4194304), fileBounds
    (JSON: file name to where its records end), summary=files (one row per range; with
    crcFrom, CRCs are checked in the files from that offset on)."""

    @classmethod
    def name(cls) -> str:
        return "rocketmq-commitlog"

    def schema(self) -> str:
        summary = (_option(self.options, "summary") or "") == "files"
        return ddl(SUMMARY_FIELDS if summary else COMMITLOG_COLUMNS)

    def reader(self, schema: Any) -> DataSourceReader:
        return CommitLogReader(dict(self.options))


class ConsumeQueueReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.location = StoreLocation(str(_option(options, "path", "")))
        self.topics = _topics(options)

    def partitions(self) -> list[InputPartition]:
        self.location.check_store()
        segments = self.location.segments("commitlog")
        minimum = int(segments[0][0]) if segments else 0
        parts = []
        for topic in self.location.directories("consumequeue"):
            if self.topics is not None and topic not in self.topics:
                continue
            for queue in self.location.directories(f"consumequeue/{topic}"):
                if queue.lstrip("-").isdigit():
                    parts.append(InputPartition((topic, int(queue), minimum)))
        return parts

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        topic, queue_id, minimum = partition.value
        yield from queue_units(self.location, topic, queue_id, minimum)


class ConsumeQueueDataSource(DataSource):
    """``spark.read.format("rocketmq-consumequeue").load(STORE)``: one row per unit.

    Options: topics (comma-separated)."""

    @classmethod
    def name(cls) -> str:
        return "rocketmq-consumequeue"

    def schema(self) -> str:
        return ddl(CONSUMEQUEUE_COLUMNS)

    def reader(self, schema: Any) -> DataSourceReader:
        return ConsumeQueueReader(dict(self.options))
