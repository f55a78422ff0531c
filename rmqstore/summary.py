"""A one-screen summary of a store (``rmqstore info``), as a JSON-ready dict."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rmqstore import kernel
from rmqstore.consumequeue import QueueTip, list_queues
from rmqstore.indexfile import read_index_headers
from rmqstore.record import (
    H_QUEUE_ID,
    H_QUEUE_OFFSET,
    H_STORE_TIMESTAMP,
    H_SYS_FLAG,
    H_TOTAL_SIZE,
    TRANSACTION_MASK,
    TRANSACTION_PREPARED,
    TRANSACTION_ROLLBACK,
    ScanStop,
)
from rmqstore.store import Store


class _QueueStats:
    __slots__ = ("messages", "min_offset", "not_queued")

    def __init__(self) -> None:
        self.messages = 0
        self.not_queued = 0  # PREPARED/ROLLBACK records: no consume-queue unit
        self.min_offset: int | None = None


def consume_queue_table(
    store: Store,
) -> tuple[list[dict[str, Any]], int, dict[tuple[str, int], QueueTip]]:
    """Each consume queue's min/max offsets as the broker computes them, the dispatch cursor
    (the end of the last record in any consume queue, -1 when there are none) and each
    queue's tip."""
    table = []
    cursor = -1
    tips: dict[tuple[str, int], QueueTip] = {}
    for topic, queue_id in list_queues(store.consumequeue_dir):
        queue = store.consume_queue(topic, queue_id)
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
    return table, cursor, tips


def index_summary(store: Store) -> dict[str, Any]:
    headers = [header for _, header in read_index_headers(store.index_dir)]
    last = headers[-1] if headers else None
    return {
        "files": len(headers),
        "entries": sum(header.index_count - 1 for header in headers),
        "endOffset": last.end_phy_offset if last else -1,
        "endTimestamp": last.end_timestamp if last else 0,
    }


def summarize(store: Store, progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Files, offsets, topics/queues, consume queues, index, dispatch lag, checkpoint and
    abort/lock state of ``store``."""
    log = store.commitlog
    checkpoint = store.checkpoint()
    consume_queues, cursor, tips = consume_queue_table(store)
    queue_minima = {(q["topic"], q["queueId"]): q["minOffset"] for q in consume_queues}
    index = index_summary(store)
    dispatch_from = max(cursor, log.min_offset)
    behind_records = 0
    queues: dict[tuple[str, int], _QueueStats] = {}
    scan = log.scan()
    records = 0
    first_time = last_time = 0
    for count, (offset, header, topic, _props, _crc) in enumerate(scan, 1):
        if progress is not None and not count & 0x3FFF:
            progress(offset - log.min_offset)
        records += 1
        if offset >= dispatch_from:
            behind_records += 1
        key = (topic, header[H_QUEUE_ID])
        stats = queues.get(key)
        if stats is None:
            stats = queues[key] = _QueueStats()
        stats.messages += 1
        stamp = header[H_STORE_TIMESTAMP]
        if not first_time:
            first_time = stamp
        last_time = stamp
        if header[H_SYS_FLAG] & TRANSACTION_MASK in (TRANSACTION_PREPARED, TRANSACTION_ROLLBACK):
            stats.not_queued += 1
            continue
        queue_offset = header[H_QUEUE_OFFSET]
        if stats.min_offset is None or queue_offset < stats.min_offset:
            stats.min_offset = queue_offset
        if offset >= dispatch_from:  # where the broker's dispatch would put it
            tips[key] = QueueTip.after_put(
                tips.get(key), queue_offset, offset, header[H_TOTAL_SIZE]
            )
    segments = log.segments
    data_after_end = [
        segment.name
        for segment in segments
        if scan.segment is not None
        and segment.start > scan.segment.start
        and log.first_record_store_timestamp(segment) is not None
    ]
    end_state = "clean" if scan.stop in (ScanStop.END, ScanStop.BLANK, None) else "invalid"
    topics: dict[str, list[dict[str, Any]]] = {}
    for (topic, queue_id), stats in sorted(queues.items()):
        tip = tips.get((topic, queue_id))
        minimum = queue_minima.get((topic, queue_id), stats.min_offset)
        topics.setdefault(topic, []).append(
            {
                "queueId": queue_id,
                "messages": stats.messages,
                "minOffset": minimum if minimum is not None else 0,
                "maxOffset": tip.max_offset if tip is not None else 0,
                "notQueued": stats.not_queued,
            }
        )
    config = store.config
    return {
        "store": str(store.root),
        "kernel": kernel.NAME,
        "lock": store.lock_state().value,
        "abort": store.aborted,
        "checkpoint": checkpoint.to_dict() if checkpoint else None,
        "geometry": {
            "commitLogFileSize": store.commitlog_file_size,
            "consumeQueueFileSize": store.consumequeue_file_size,
            "indexHashSlots": config.index_slots,
            "indexEntries": config.index_entries,
            "sources": dict(config.sources),
        },
        "commitLog": {
            "directory": str(store.commitlog_dir),
            "files": len(segments),
            "firstFile": segments[0].name if segments else None,
            "lastFile": segments[-1].name if segments else None,
            "minOffset": log.min_offset,
            "maxOffset": scan.end_offset if segments else 0,
            "messages": records,
            "firstStoreTimestamp": first_time,
            "lastStoreTimestamp": last_time,
            "end": end_state,
            "endError": str(scan.error) if scan.error else None,
            "filesWithDataAfterEnd": data_after_end,
        },
        "topics": [{"topic": topic, "queues": items} for topic, items in topics.items()],
        "consumeQueues": consume_queues,
        "index": index,
        "dispatch": {
            "cursor": dispatch_from,
            "behindBytes": max(0, scan.end_offset - dispatch_from) if segments else 0,
            "behindRecords": behind_records,
        },
    }
