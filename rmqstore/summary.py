"""A one-screen summary of a store (``rmqstore info``), as a JSON-ready dict."""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from rmqstore import kernel
from rmqstore.checkpoint import read_checkpoint_file
from rmqstore.consumequeue import QueueTip, link_target, list_queues
from rmqstore.consumerprogress import past_end, queue_lag
from rmqstore.errors import NotFoundError, RmqStoreError
from rmqstore.geometry import CONFIG_DIR
from rmqstore.indexfile import read_index_headers
from rmqstore.kernel import layout as kernel_layout
from rmqstore.kernel.layout import ROW_WIDTH
from rmqstore.lockfile import LockState
from rmqstore.multidispatch import LMQ_PREFIX
from rmqstore.offsetsconfig import read_consumer_offsets
from rmqstore.record import (
    TRANSACTION_MASK,
    TRANSACTION_PREPARED,
    TRANSACTION_ROLLBACK,
    BodyMode,
    ScanStop,
)
from rmqstore.store import Store
from rmqstore.wording import quoted


class _QueueStats:
    __slots__ = ("messages", "min_offset", "not_queued")

    def __init__(self) -> None:
        self.messages = 0
        self.not_queued = 0  # PREPARED/ROLLBACK records: no consume-queue unit
        self.min_offset: int | None = None


class QueueTable(NamedTuple):
    """What :func:`consume_queue_table` reads of every consume queue, in one load of each."""

    rows: list[dict[str, Any]]  # each queue's min/max offsets, as the broker computes them
    cursor: int  # the end of the last record in any consume queue (-1 when there are none)
    tips: dict[tuple[str, int], QueueTip]
    last_units: dict[tuple[str, int], tuple[int, int]]  # (offset, size) of a queue's last unit
    # the topic and queue folders that are symbolic links (not read), and where each leads:
    # a broker reads and writes those queues through them
    links: list[dict[str, str]]


def consume_queue_table(store: Store) -> QueueTable:
    """Each consume queue's min/max offsets as the broker computes them, the dispatch cursor,
    each queue's tip and the last unit of each queue that has units."""
    table = []
    cursor = -1
    tips: dict[tuple[str, int], QueueTip] = {}
    last_units: dict[tuple[str, int], tuple[int, int]] = {}
    linked: list[Path] = []
    for topic, queue_id in list_queues(store.consumequeue_dir, linked):
        queue = store.listed_queue(topic, queue_id)
        unit = queue.loaded_last_unit
        if unit is not None and queue.max_offset > queue.min_offset:
            last_units[(topic, queue_id)] = (unit.physical_offset, unit.size)
        table.append(
            {
                "topic": topic,
                "queueId": queue_id,
                "minOffset": queue.min_offset,
                "maxOffset": queue.max_offset,
                "maxPhysicalOffset": queue.max_physical_offset,
            }
        )
        tip = QueueTip.of(queue)
        if tip is not None:
            tips[(topic, queue_id)] = tip
        cursor = max(cursor, queue.max_physical_offset)
    links = [
        {"folder": link.relative_to(store.root).as_posix(), "target": link_target(link)}
        for link in linked
    ]
    return QueueTable(table, cursor, tips, last_units, links)


def topic_status(store: Store, topic: str) -> dict[str, Any]:
    """mqadmin topicStatus, offline: each consume queue of ``topic`` with its min and max
    offsets and the store time of its last message (``lastUpdated``, 0 when the queue is
    empty or its last unit points at no record). Reads no more of the commit log than those
    last records."""
    log = store.commitlog
    queues = []
    linked: list[Path] = []
    for name, queue_id in list_queues(store.consumequeue_dir, linked, topic=topic):
        queue = store.listed_queue(name, queue_id)
        last_updated = 0
        unit = queue.loaded_last_unit
        if unit is not None and queue.max_offset > queue.min_offset:
            last_updated = log.unit_store_time(unit.physical_offset, unit.size)
        queues.append(
            {
                "queueId": queue_id,
                "minOffset": queue.min_offset,
                "maxOffset": queue.max_offset,
                "lastUpdated": last_updated,
            }
        )
    if not queues:
        unread = store.queues_unread(topic)
        if unread is not None:
            raise NotFoundError(f"topic {quoted(topic)} has no consume-queue files: {unread}")
        if linked:  # its folder (or each queue's) is a link, which rmqstore does not follow
            link = linked[0]
            raise NotFoundError(
                f"topic {quoted(topic)} has no consume queues rmqstore reads: "
                f"{link.relative_to(store.root).as_posix()} is a symbolic link (to "
                f"{link_target(link)}), which it does not follow"
            )
        raise NotFoundError(f"topic {quoted(topic)} has no consume queues")
    return {"topic": topic, "queues": queues}


def index_summary(store: Store) -> dict[str, Any]:
    headers = [header for _, header in read_index_headers(store.index_dir)]
    last = headers[-1] if headers else None
    return {
        "files": len(headers),
        "entries": sum(header.index_count - 1 for header in headers),
        "endOffset": last.end_phy_offset if last else -1,
        "endTimestamp": last.end_timestamp if last else 0,
    }


class _SummaryWalk:
    """Counts what ``info`` shows of the records, a batch of kernel rows at a time: the
    queued rows of a batch through the kernel's queue runs, the others (PREPARED and
    ROLLBACK records, and the rows past the dispatch cursor) one by one."""

    def __init__(
        self,
        queues: dict[tuple[str, int], _QueueStats],
        tips: dict[tuple[str, int], QueueTip],
        dispatch_from: int,
    ) -> None:
        self.queues = queues
        self.tips = tips
        self.dispatch_from = dispatch_from
        self.records = self.behind_records = 0
        # the first record at or after dispatch_from that a queue takes: where the lag
        # starts (records no queue takes, PREPARED and ROLLBACK, are not behind before it)
        self.lag_from: int | None = None
        self.first_time = self.last_time = 0
        self.last_offset = 0
        self.topics = kernel_layout.TopicNames()
        self.no_dispatch = kernel_layout.new_dispatch_out(0)
        self.units = bytearray()
        self.row_runs = array("q")
        self.runs = kernel_layout.zeroed(kernel_layout.RUN_WIDTH * 256)

    def batch(self, window: Any, rows: Any, count: int) -> None:
        if len(self.row_runs) < count:
            self.no_dispatch = kernel_layout.new_dispatch_out(count)
            self.units = bytearray(kernel_layout.UNIT_SIZE * count)
            self.row_runs = kernel_layout.zeroed(count)
        end = count * ROW_WIDTH
        offsets = rows[kernel_layout.PHYSICAL_OFFSET : end : ROW_WIDTH]
        stamps = rows[kernel_layout.STORE_TIMESTAMP : end : ROW_WIDTH]
        self.records += count
        if not self.first_time:
            self.first_time = next((stamp for stamp in stamps if stamp), 0)
        self.last_time = stamps[-1]
        self.last_offset = offsets[-1]
        behind_from = bisect_left(offsets, self.dispatch_from)
        if self.lag_from is None and behind_from < count:
            not_queued = set(_not_queued_rows(rows, count))
            lag_row = behind_from
            while lag_row in not_queued:
                lag_row += 1
            if lag_row < count:
                self.lag_from = offsets[lag_row]
                self.behind_records += count - lag_row
        elif self.lag_from is not None:
            self.behind_records += count - behind_from
        position = 0
        while position < count:  # queued rows, run by run
            position, found = kernel.queue_runs(
                window,
                rows,
                position,
                count,
                self.no_dispatch,
                self.units,
                self.runs,
                self.row_runs,
            )
            for number in range(found):
                at = number * kernel_layout.RUN_WIDTH
                row = self.runs[at + kernel_layout.RUN_TOPIC_ROW]
                stats = self._stats(window, rows, row)
                stats.messages += self.runs[at + kernel_layout.RUN_UNITS]
                first = self.runs[at + kernel_layout.RUN_FIRST_QUEUE_OFFSET]
                if stats.min_offset is None or first < stats.min_offset:
                    stats.min_offset = first
        for row in _not_queued_rows(rows, count):
            stats = self._stats(window, rows, row)
            stats.messages += 1
            stats.not_queued += 1
        for row in range(behind_from, count):  # where the broker's dispatch would put them
            at = row * ROW_WIDTH
            if rows[at + kernel_layout.SYS_FLAG] & TRANSACTION_MASK in _NOT_QUEUED:
                continue
            key = self._key(window, rows, row)
            self.tips[key] = QueueTip.after_put(
                self.tips.get(key),
                rows[at + kernel_layout.QUEUE_OFFSET],
                offsets[row],
                rows[at + kernel_layout.TOTAL_SIZE],
            )

    def _key(self, window: Any, rows: Any, row: int) -> tuple[str, int]:
        return self.topics.of(window, rows, row), rows[row * ROW_WIDTH + kernel_layout.QUEUE_ID]

    def _stats(self, window: Any, rows: Any, row: int) -> _QueueStats:
        key = self._key(window, rows, row)
        stats = self.queues.get(key)
        if stats is None:
            stats = self.queues[key] = _QueueStats()
        return stats


_NOT_QUEUED = (TRANSACTION_PREPARED, TRANSACTION_ROLLBACK)
# a row's sysFlag, an int64 of the rows buffer: where its low byte (the transaction bits'
# byte) lies among the int64's bytes, and each low byte mapped to 1 for a record no queue
# holds (PREPARED, ROLLBACK), else 0
_LOW_BYTE = 0 if sys.byteorder == "little" else 7
_NOT_QUEUED_MARKS = bytes(int(value & TRANSACTION_MASK in _NOT_QUEUED) for value in range(256))


def _not_queued_rows(rows: Any, count: int) -> Iterator[int]:
    """The rows among the first ``count`` whose record no consume queue holds (PREPARED and
    ROLLBACK), found by byte operations rather than a Python test per row (most logs have
    none: a summary of 4M records spent a third of its time testing each row's flag)."""
    width = ROW_WIDTH * 8
    view = memoryview(rows).cast("B")
    low_bytes = view[kernel_layout.SYS_FLAG * 8 + _LOW_BYTE : count * width : width]
    marks = low_bytes.tobytes().translate(_NOT_QUEUED_MARKS)
    row = marks.find(1)
    while row >= 0:
        yield row
        row = marks.find(1, row + 1)


def summarize(
    store: Store, progress: Callable[[int], None] | None = None, *, deep: bool = False
) -> dict[str, Any]:
    """Files, offsets, topics/queues, consume queues, index, dispatch lag, checkpoint and
    abort/lock state of ``store``.

    By default without reading the whole log: the valid end as a broker's recovery finds it
    (its last files), the consume queues' offsets, and a walk of only the records after the
    point where the consume queues end. ``deep`` counts every record of the log instead
    (``messages`` and each queue's ``notQueued``, which the quick summary leaves null)."""
    log = store.commitlog
    checkpoint_file = read_checkpoint_file(store.checkpoint_path)
    checkpoint = checkpoint_file.checkpoint if checkpoint_file else None
    consume_queues, cursor, tips, last_units, links = consume_queue_table(store)
    queue_minima = {(q["topic"], q["queueId"]): q["minOffset"] for q in consume_queues}
    units = {(q["topic"], q["queueId"]): q["maxOffset"] - q["minOffset"] for q in consume_queues}
    index = index_summary(store)
    dispatch_from = max(cursor, log.min_offset)
    segments = log.segments
    if not deep and not _record_ends_at(store, dispatch_from, last_units):
        deep = True  # the consume queues end where no record does: count it all
    rocksdb = store.queues_in_rocksdb
    # no queue files to count (all, or the BatchCQ topics') from: the whole log is walked
    deep = deep or rocksdb or bool(store.batch_queue_topics)
    walk_from = log.min_offset if deep else dispatch_from
    queues: dict[tuple[str, int], _QueueStats] = {}
    scan = log.scan(walk_from)
    walk = _SummaryWalk(queues, tips, dispatch_from)
    for window, _window_start, rows, count in scan.batches():
        walk.batch(window, rows, count)
        if progress is not None:
            progress(walk.last_offset - walk_from)
    stopped = scan
    end_offset = scan.end_offset
    # where a dispatch would add something to a queue: past records no queue takes, and
    # past a BLANK to the start of a last file with no record
    lag_from = walk.lag_from if walk.lag_from is not None else max(dispatch_from, end_offset)
    last_time = (
        walk.last_time if walk.records else _newest_queued_time(store, end_offset, last_units)
    )
    first_segment = segments[0] if segments else None
    data_after_end = [
        segment.name
        for segment in segments
        if stopped.segment is not None
        and segment.start > stopped.segment.start
        and log.first_record_store_timestamp(segment) is not None
    ]
    # commit-log files missing between two that are there (each file starts where the one
    # before it ends): a broker loads the rest, and the messages in the gap are lost
    file_gaps = [
        {
            "from": f"{previous.start + log.file_size:020d}",
            "to": f"{following.start - log.file_size:020d}",
            "files": max(0, (following.start - previous.start) // log.file_size - 1),
        }
        for previous, following in log.queue.gaps()
    ]
    end_state = "clean" if stopped.stop in (ScanStop.END, ScanStop.BLANK, None) else "invalid"
    topics: dict[str, list[dict[str, Any]]] = {}
    # LMQ queues hold other topics' records (spec 6.8): their consume queues tell, even deep
    lmq = {key for key in queue_minima if key[0].startswith(LMQ_PREFIX)}
    keys = set(queues) | (lmq if deep else set(queue_minima))
    for topic, queue_id in sorted(keys):
        stats = queues.get((topic, queue_id)) or _QueueStats()
        if deep and (topic, queue_id) in lmq and (topic, queue_id) not in queues:
            stats.messages = units[(topic, queue_id)]
        tip = tips.get((topic, queue_id))
        minimum = queue_minima.get((topic, queue_id), stats.min_offset)
        minimum = minimum if minimum is not None else 0
        maximum = tip.max_offset if tip is not None else 0
        topics.setdefault(topic, []).append(
            {
                "queueId": queue_id,
                # deep: every record of the queue in the log; quick: the consume queue's
                # units and the records after the point where the consume queues end
                "messages": stats.messages
                if deep
                else stats.messages + units.get((topic, queue_id), 0),
                "minOffset": minimum,
                "maxOffset": maximum,
                "notQueued": stats.not_queued if deep else None,
            }
        )
    config = store.config
    return {
        "store": str(store.root),
        "kernel": kernel.NAME,
        "deep": deep,
        # a boolean beside abort's; lockHolder says who when it is held
        "locked": (lock := store.lock_state()) is not LockState.FREE,
        "lockHolder": {
            LockState.FREE: None,
            LockState.HELD: "another process",
            LockState.HELD_HERE: "this process",
        }[lock],
        "abort": store.aborted,
        "checkpoint": checkpoint.to_dict() if checkpoint else None,
        # the checkpoint file's size: 4096, fewer when a crash cut it short, null when absent
        "checkpointBytes": checkpoint_file.size if checkpoint_file else None,
        "geometry": {
            "commitLogFileSize": store.commitlog_file_size,
            "consumeQueueFileSize": store.consumequeue_file_size,
            "indexHashSlots": config.index_slots,
            "indexEntries": config.index_entries,
            "sources": {_json_name(name): source for name, source in config.sources.items()},
        },
        "commitLog": {
            "directory": str(store.commitlog_dir),
            "files": len(segments),
            "firstFile": segments[0].name if segments else None,
            "lastFile": segments[-1].name if segments else None,
            "minOffset": log.min_offset,
            "maxOffset": end_offset if segments else 0,
            "messages": walk.records if deep else None,
            "firstStoreTimestamp": walk.first_time
            if deep
            else (log.first_record_store_timestamp(first_segment) or 0)
            if first_segment is not None
            else 0,
            "lastStoreTimestamp": last_time,
            "end": end_state,
            "endError": str(stopped.error) if stopped.error else None,
            "filesWithDataAfterEnd": data_after_end,
            "missingFiles": file_gaps,
        },
        "topics": [{"topic": topic, "queues": items} for topic, items in topics.items()],
        "consumeQueues": consume_queues,
        # where the broker keeps its consume queues: "files", or "rocksdb" (a 5.x broker's
        # storeType=defaultRocksDB), which rmqstore does not read (no dispatch lag then)
        "consumeQueueStore": "rocksdb" if rocksdb else "files",
        # topics whose queues are in batchconsumequeue/ (queue.type BatchCQ), not read
        "batchQueueTopics": sorted(store.batch_queue_topics),
        # topic or queue folders of consumequeue/ that are symbolic links, not read
        "linkedQueueFolders": [] if rocksdb else links,
        "index": index,
        "consumerOffsets": consumer_summary(
            store, {key: (lowest, units[key] + lowest) for key, lowest in queue_minima.items()}
        ),
        "dispatch": None
        if rocksdb
        else {
            "cursor": lag_from,
            "behindBytes": max(0, end_offset - lag_from) if segments else 0,
            "behindRecords": walk.behind_records,
        },
    }


def consumer_summary(
    store: Store, bounds: dict[tuple[str, int], tuple[int, int]]
) -> dict[str, Any] | None:
    """``info``'s line on consumer groups: how many, their lag in all, and how many of their
    offsets are past their queue's end, from ``consumerOffset.json`` and the queues' (min,
    max) offsets in ``bounds``; None when the store has no such file (nor a ``.bak``)."""
    offsets = read_consumer_offsets(store.root / CONFIG_DIR)
    loaded = offsets.loaded
    if loaded.document is None and not loaded.failures:
        return None
    lag = sum(
        queue_lag(offset, *bounds[(topic, queue_id)])
        for (topic, _group), table in offsets.table.items()
        for queue_id, offset in table.items()
        if (topic, queue_id) in bounds
    )
    ends = {key: max_offset for key, (_min_offset, max_offset) in bounds.items()}
    past = past_end(offsets, None, lambda topic, queue_id: ends.get((topic, queue_id)))
    return {
        "file": loaded.source_name(store.root),
        "groups": len({group for _topic, group in offsets.table}),
        "lag": lag,
        "pastEnd": len(past),
    }


def _record_ends_at(
    store: Store, offset: int, last_units: dict[tuple[str, int], tuple[int, int]]
) -> bool:
    """Whether ``offset`` is the log's first offset or the end of the record the consume
    queues point to last (so a walk of the log's tail can start there); ``last_units``: each
    queue's last unit (see :class:`QueueTable`)."""
    log = store.commitlog
    if offset <= log.min_offset:
        return True
    for physical_offset, size in last_units.values():
        if physical_offset + size != offset:
            continue
        try:
            record = log.read(physical_offset, body=BodyMode.SKIP)
        except RmqStoreError:
            return False
        return record.store_size == size
    return False


def _newest_queued_time(
    store: Store, end: int, last_units: dict[tuple[str, int], tuple[int, int]]
) -> int:
    """The store time of the newest record a consume queue points to (0 when none): each
    queue's last unit, read where it points."""
    log = store.commitlog
    newest = 0
    for physical_offset, size in last_units.values():
        newest = max(newest, log.store_timestamp_at(physical_offset, size, end))
    return newest


# settings under the names the geometry above uses; the others in camelCase
_SETTING_NAMES = {
    "commitlog_file_size": "commitLogFileSize",
    "consumequeue_file_size": "consumeQueueFileSize",
    "index_slots": "indexHashSlots",
    "index_entries": "indexEntries",
}


def _json_name(setting: str) -> str:
    """A store setting's name in JSON output (camelCase, as every key there)."""
    if setting in _SETTING_NAMES:
        return _SETTING_NAMES[setting]
    first, *rest = setting.split("_")
    return first + "".join(part.capitalize() for part in rest)
