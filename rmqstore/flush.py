"""Flush a store (spec §8.1, §11): force every commit-log, consume-queue and index file to disk,
then write a checkpoint that says what is on disk.

The checkpoint is written only after the files it describes are durable, so it is never ahead
of the data: ``physicMsgTimestamp`` is the store time of the last valid record of the commit log,
``logicsMsgTimestamp`` that of the newest record the consume queues hold, and
``indexMsgTimestamp`` the end time of the last full index file (as a broker sets them after a
thorough flush). Fields 24 and 32 (5.x master flushed and confirm offsets) are kept. With
'abort' present the three times do not move forward (see :func:`flush_store`).
"""

from __future__ import annotations

import os
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rmqstore.checkpoint import Checkpoint, write_checkpoint
from rmqstore.consumequeue import ConsumeQueue, list_queues, sync_queues_file_system
from rmqstore.errors import StoreIOError
from rmqstore.indexfile import read_index_headers
from rmqstore.kernel.layout import PHYSICAL_OFFSET, ROW_WIDTH, STORE_TIMESTAMP
from rmqstore.segments import BY_NAME, can_sync_file_system, sync_directory
from rmqstore.store import Store


@dataclass
class FlushResult:
    files: int
    bytes: int
    log_end: int
    checkpoint_before: Checkpoint | None
    checkpoint_after: Checkpoint
    abort_present: bool

    def to_dict(self) -> dict[str, Any]:
        before = self.checkpoint_before
        return {
            "files": self.files,
            "bytes": self.bytes,
            "logEnd": self.log_end,
            "checkpointBefore": before.to_dict() if before else None,
            "checkpoint": self.checkpoint_after.to_dict(),
            "abortPresent": self.abort_present,
        }


def flush_store(
    store: Store, *, replayed: bool = False, queues: Iterable[ConsumeQueue] | None = None
) -> FlushResult:
    """Force the store's files to disk and write its checkpoint (the caller holds the lock).

    On a store that had 'abort' (a crash, or records not dispatched yet), the times are kept
    where they were, lowered only where the files now hold less: a broker's crash recovery
    (and rmqstore's) replays from the file they pick, which gives back consume-queue units
    and index entries a crash lost, so moving them forward to what the queues hold would
    vouch for units that may be missing. ``replayed``: that replay has been done (recover),
    so the times may move forward. ``queues``: every consume queue of the store, as the
    dispatch that just wrote them holds them (closed): their last units are read from them,
    not from a load of each queue again (a store of 100,000 LMQ queues loads them in about
    4 s)."""
    if not store.writable:
        raise RuntimeError("flush needs a store opened for writing")
    files, size = _sync_tree(store)
    end = store.log_end().offset
    before = store.checkpoint()
    # each queue read once, for both times
    last_units = _last_units(store, end, queues)
    physic = last_record_timestamp(store, end, last_units)
    logics = _newest_queued_timestamp(store, end, last_units)
    index = _full_index_end_timestamp(store)
    if store.abort_existed and not replayed:
        kept = before or Checkpoint()
        physic = min(physic, kept.physic_msg_timestamp)
        logics = min(logics, kept.logics_msg_timestamp)
        index = min(index, kept.index_msg_timestamp)
    after = replace(
        before or Checkpoint(),
        physic_msg_timestamp=physic,
        logics_msg_timestamp=logics,
        index_msg_timestamp=index,
    )
    write_checkpoint(store.checkpoint_path, after)
    return FlushResult(files, size, end, before, after, store.aborted)


def _sync_tree(store: Store) -> tuple[int, int]:
    """fsync every regular file under commitlog/, consumequeue/ and index/ and their
    directories (links are not followed: what they point at is not the store's). Each
    folder's files go in name order, which is offset (or time) order: a power cut part way
    leaves the earlier files of a log or queue on the disk before the later ones, never a
    later file's data over an earlier one's hole (the order a folder lists its files in,
    which it used to follow, is the file system's own). The commit log goes first, then the
    index, then the consume queues.

    A consume queue of one file has no order to keep, nor have the queues' folders: on Linux
    5.8 and later, on a local file system (:func:`rmqstore.segments.can_sync_file_system`),
    those are made durable last, by one syncfs(2) of their file system instead of an fsync
    each, which flushed the disk's write cache each time (three of them a queue: a store of
    20,000 LMQ queues took 60,000 fsyncs: up to 4.6 s of a 14 s ``recover`` here, and a
    minute on a disk whose cache flush takes a millisecond)."""
    files = size = 0
    for top in (store.commitlog_dir, store.index_dir, store.consumequeue_dir):
        if not top.is_dir() or top.is_symlink():
            continue
        # the queues' file system, when one syncfs makes them durable (None: file by file)
        together = (
            _status(top).st_dev
            if top == store.consumequeue_dir and can_sync_file_system(top)
            else None
        )
        # (folder, its device), walked with the kinds the listing gives (no stat of each
        # path: it made three of each file, and a store of LMQ queues has tens of thousands)
        pending = [(str(top), _status(top).st_dev)]
        while pending:
            folder, device = pending.pop()
            try:
                entries = sorted(os.scandir(folder), key=BY_NAME)
            except OSError:
                continue  # gone (or unreadable) since it was found: as os.walk passed it
            regular = [entry for entry in entries if entry.is_file(follow_symlinks=False)]
            # (a folder of another file system mounted in there goes file by file)
            deferred = together is not None and device == together
            for entry in regular:
                if deferred and len(regular) == 1:
                    size += _entry_status(entry).st_size
                else:
                    size += _fsync(Path(entry.path))
                files += 1
            if not deferred:
                sync_directory(Path(folder))
            pending.extend(
                (entry.path, _entry_status(entry).st_dev)
                for entry in reversed(entries)
                if entry.is_dir(follow_symlinks=False)
            )
        if together is not None:
            sync_queues_file_system(top)
    sync_directory(store.root)
    return files, size


def _entry_status(entry: os.DirEntry[str]) -> os.stat_result:
    """A listed entry's status, without following a link (:func:`_status` of a listing's
    entry: its stat is kept with it)."""
    try:
        return entry.stat(follow_symlinks=False)
    except OSError as exc:
        raise StoreIOError(f"cannot flush {entry.path}: {exc.strerror}") from None


def _status(path: Path) -> os.stat_result:
    """``path``'s status, without following a link."""
    try:
        return path.lstat()
    except OSError as exc:
        raise StoreIOError(f"cannot flush {path}: {exc.strerror}") from None


def _fsync(path: Path) -> int:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            os.fsync(fd)
            return os.fstat(fd).st_size
        finally:
            os.close(fd)
    except OSError as exc:
        raise StoreIOError(f"cannot flush {path}: {exc.strerror}") from None


def _queues(store: Store) -> Iterator[ConsumeQueue]:
    """Each consume queue, loaded as it comes (a store may have thousands)."""
    for topic, queue_id in list_queues(store.consumequeue_dir):
        yield ConsumeQueue(store.consumequeue_dir, topic, queue_id, store.consumequeue_file_size)


def _last_units(
    store: Store, end: int, queues: Iterable[ConsumeQueue] | None = None
) -> list[tuple[int, int]]:
    """(physical offset, size) of each queue's last unit that lies inside the log: of
    ``queues`` when given, else of each queue loaded from its files."""
    units = []
    for queue in _queues(store) if queues is None else queues:
        unit = queue.last_unit_in_log(end)
        if unit is not None:
            units.append((unit.physical_offset, unit.size))
    return units


def _newest_queued_timestamp(store: Store, end: int, units: list[tuple[int, int]]) -> int:
    """The store time of the newest record a queue's last unit (``units``, see
    :func:`_last_units`) points to."""
    if not units:
        return 0
    offset, size = max(units)
    return max(0, store.commitlog.store_timestamp_at(offset, size, end))


def last_record_timestamp(
    store: Store, end: int, last_units: list[tuple[int, int]] | None = None
) -> int:
    """The store time of the last record before ``end`` (0 for an empty log). The walk starts
    at the newest record a consume queue points to when there is one (``last_units``: each
    queue's last unit, when at hand; see :func:`_last_units`), so a dispatched store reads only
    its undispatched tail; otherwise at the start of the file that ends the log."""
    log = store.commitlog
    if end <= log.min_offset:
        return 0
    if last_units is None:
        last_units = _last_units(store, end)
    starts = [offset for offset, _ in last_units if offset < end]
    last_file = log.queue.find(end - 1)
    if last_file is not None:
        starts.append(last_file.start)
    for start in sorted(set(starts), reverse=True):
        stamp = 0
        for _window, _window_start, rows, count in log.scan(start).batches():
            offsets = rows[PHYSICAL_OFFSET : count * ROW_WIDTH : ROW_WIDTH]
            kept = bisect_left(offsets, end)
            if kept:
                stamp = rows[(kept - 1) * ROW_WIDTH + STORE_TIMESTAMP]
            if kept < count:
                break
        if stamp:
            return stamp
    return 0


def _full_index_end_timestamp(store: Store) -> int:
    full = [
        header
        for _path, header in read_index_headers(store.index_dir)
        if header.index_count >= store.config.index_entries
    ]
    return full[-1].end_timestamp if full else 0
