"""Incremental, byte-identical copies of a store's commit log (``rmqstore replicate``).

A replica's commit log is SOURCE's, byte for byte, up to the copied end: the same files and
names, records, BLANKs and the bytes after them. Only whole, CRC-valid records are copied
(SOURCE may be a store a live broker is writing), file by file, from where DEST's valid end
is: a second run copies only what is new. DEST's consume queues and index are then
dispatched from the copied records, as a slave's reput does, and its checkpoint updated, so
DEST is a sound store after every round.

Before a byte is written DEST must be a prefix of SOURCE: its valid end inside SOURCE's
files, the bytes of its last 64 MiB before that end equal to SOURCE's, and any bytes after
that end (a copy a kill interrupted) equal to SOURCE's at the same offsets. Otherwise nothing
changes and :class:`NotAPrefixError` says where they differ.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

from rmqstore.checkpoint import Checkpoint, write_checkpoint
from rmqstore.config import StoreConfig
from rmqstore.dispatch import Dispatcher
from rmqstore.errors import InputError, StoreFormatError, StoreIOError, read_failure
from rmqstore.kernel.layout import PHYSICAL_OFFSET, ROW_WIDTH, TOTAL_SIZE
from rmqstore.record import BLANK_MIN_LENGTH, RegionScan, ScanStop
from rmqstore.segments import (
    WRITE_SETTLE,
    Segment,
    fsync_directory,
    nonzero_extent,
    open_for_writing,
)
from rmqstore.store import Store
from rmqstore.windows import FileWindows

_COMPARED = 64 * 1024 * 1024  # how much of DEST before its end is compared with SOURCE
_CHUNK = 8 * 1024 * 1024  # bytes read and written at a time


class NotAPrefixError(InputError):
    """DEST holds bytes SOURCE does not have at the same offsets: it is not a copy of it."""


@dataclass
class ReplicationRound:
    """What one round copied and dispatched."""

    from_offset: int
    to_offset: int
    source_end: int  # where SOURCE's whole records end (or --until)
    bytes_copied: int = 0
    files_created: list[str] = field(default_factory=list)
    records_dispatched: int = 0
    until_reached: bool = False  # DEST holds every record that ends by --until, and no more

    def to_dict(self) -> dict[str, Any]:
        return {
            "fromOffset": self.from_offset,
            "toOffset": self.to_offset,
            "sourceEnd": self.source_end,
            "bytesCopied": self.bytes_copied,
            "filesCreated": self.files_created,
            "recordsDispatched": self.records_dispatched,
        }


def source_geometry(source: Path, config: StoreConfig) -> StoreConfig:
    """The configuration to open DEST with: SOURCE's geometry (commit-log and consume-queue
    file sizes, index slots and entries: a replica's files must be the same), and whatever
    else was given."""
    with Store.open_read(source, config) as opened:
        _refuse_foreign_source(opened)
        resolved = opened.config
        return config.with_overrides(
            commitlog_file_size=opened.commitlog_file_size,
            consumequeue_file_size=opened.consumequeue_file_size,
            index_slots=resolved.index_slots,
            index_entries=resolved.index_entries,
        )


def _refuse_foreign_source(source: Store) -> None:
    """A SOURCE whose log or queues rmqstore does not keep is refused before DEST is made:
    without its commit-log folder (or with a DLedger log) there is no log to copy, and a
    replica's consume queues, dispatched as a slave broker does, would not be the ones its
    broker reads when SOURCE's broker keeps them in a RocksDB database or in
    batchconsumequeue/ (a slave broker started on such a replica would not dispatch the
    records again, or would refuse to start on queue folders of the wrong type)."""
    if source.foreign_log is not None:
        raise StoreFormatError(f"SOURCE: {source.foreign_log}; there is no log to replicate")
    what = source.foreign_queues()
    if what is not None:
        raise StoreFormatError(
            f"SOURCE: {what}, and a replica's consume queues would not be the ones its broker "
            "reads: nothing was replicated (let a slave broker replicate it, or copy the store "
            "with its broker stopped)"
        )


def replicate_round(
    source: Path,
    dest: Store,
    config: StoreConfig,
    *,
    until: int | None = None,
    dest_end: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> ReplicationRound:
    """Copy SOURCE's whole records after DEST's end (``dest_end``, else DEST's valid end,
    checked to be a prefix of SOURCE first), up to ``until``; then dispatch them in DEST."""
    with Store.open_read(source, config) as opened:
        log = opened.commitlog
        if log.file_size != dest.commitlog_file_size:
            raise InputError(
                f"SOURCE's commit-log files are {log.file_size} bytes and DEST's "
                f"{dest.commitlog_file_size}: a replica needs the same size"
            )
        segments = list(log.segments)
        if dest_end is None:
            dest_end = _check_prefix(opened, dest)
        start = dest_end if dest.commitlog.segments else (segments[0].start if segments else 0)
        outcome = ReplicationRound(start, start, start)
        position = start
        pieces: list[tuple[Segment, int, int]] = []
        for segment in segments:
            if segment.start + log.file_size <= position:
                continue
            if segment.start > position:
                raise StoreFormatError(
                    f"SOURCE has no commit-log file at {position} (its next file starts at "
                    f"{segment.start}): the log has a gap"
                )
            end, complete, past_until = whole_records_end(
                segment, position - segment.start, until=until
            )
            outcome.until_reached = past_until
            if complete:  # the BLANK and the bytes after it go too
                end = log.file_size
            if end > position - segment.start or complete:
                pieces.append((segment, position - segment.start, end))
            position = segment.start + end if not complete else segment.start + log.file_size
            if not complete:
                break
    # 'abort' before a byte is copied, as a slave broker has it while it runs, and kept if
    # the round stops before its records are dispatched: a broker starting on DEST then
    # dispatches them in its crash recovery (a 5.x broker's normal start may not)
    with dest.until_done("replicate"):
        if pieces:
            time.sleep(WRITE_SETTLE)
            dest.begin_write()
        for segment, begin, end in pieces:
            _copy(segment, begin, end, dest, outcome)
            if progress is not None:
                progress(segment.start + end - start)
        outcome.source_end = position
        outcome.to_offset = position
        if until is not None and position >= until:
            outcome.until_reached = True
        _make_durable(dest, outcome)
        outcome.records_dispatched = dispatch_copied(dest, position)
    return outcome


def _check_prefix(source: Store, dest: Store) -> int:
    """DEST's valid end, once DEST is known to be a prefix of SOURCE (see the module doc)."""
    log = source.commitlog
    dest_log = dest.commitlog
    if not dest_log.segments:
        return log.min_offset
    end = confirmed_end(dest)
    if source.commitlog.segments and end < log.min_offset:
        raise NotAPrefixError(
            f"DEST ends at {end}, before SOURCE's first commit-log file ({log.min_offset}): "
            "the records between are no longer in SOURCE"
        )
    compare_from = max(end - _COMPARED, log.min_offset, dest_log.min_offset)
    _compare(source, dest, compare_from, end, "its records")
    residue = dest.residue_after(dest.log_end())
    for path, begin, stop in residue.pieces:
        base = int(path.name)
        _compare(source, dest, base + begin, base + stop, "the bytes after its valid end")
    dest.tail_verified = True  # what follows DEST's end is SOURCE's: the next copy overwrites it
    return end


def confirmed_end(dest: Store) -> int:
    """Where a replica's confirmed records end: the earlier of its log's valid end and where
    its dispatch resumes. A copy killed between writing bytes and dispatching them can leave
    a record whose tail never arrived, and such a record can pass the record checks (zeros
    where its properties belong, which the body CRC does not cover): the next copy starts
    here and writes over it."""
    end = dest.log_end().offset
    dispatcher = Dispatcher(dest)
    try:
        return min(end, dispatcher.cursor())
    finally:
        dispatcher.close()


def _compare(source: Store, dest: Store, begin: int, end: int, what: str) -> None:
    """Refuse when DEST's bytes in ``[begin, end)`` differ from SOURCE's."""
    position = begin
    while position < end:
        length = min(_CHUNK, end - position)
        mine = _read(dest, position, length)
        theirs = _read(source, position, length)
        if mine != theirs:
            at = next(
                (i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b),
                min(len(mine), len(theirs)),
            )
            raise NotAPrefixError(
                f"DEST is not a copy of SOURCE: {what} differ at offset {position + at}; "
                "nothing was changed"
            )
        position += length


def _read(store: Store, offset: int, length: int) -> bytes:
    """``length`` bytes of ``store``'s commit log from ``offset`` (fewer past its files)."""
    log = store.commitlog
    data = bytearray()
    while length > 0:
        segment = log.queue.find(offset)
        if segment is None:
            break
        chunk = log.pread(segment, offset - segment.start, min(length, log.file_size))
        if not chunk:
            break
        data += chunk
        offset += len(chunk)
        length -= len(chunk)
    return bytes(data)


def readable_end(store_root: Path, config: StoreConfig, known: int = 0) -> int:
    """Where a reader of a store directory, one a broker may be writing, may read up to: the
    end of its whole, CRC-valid records (a completed file counts to its end, BLANK and padding
    included), looked for from ``known`` on (an end found before). Bytes up to it are read
    :data:`WRITE_SETTLE` after it was found (``serve-ha --follow``, the streaming source)."""
    with Store.open_read(store_root, config) as store:
        log = store.commitlog
        position = max(known, log.min_offset)
        for segment in log.segments:
            if segment.start + log.file_size <= position:
                continue
            end, complete, _ = whole_records_end(segment, max(0, position - segment.start))
            position = segment.start + (log.file_size if complete else end)
            if not complete:
                break
        return position


class RecordsEnd(NamedTuple):
    """Where a file's whole records end, as :func:`whole_records_end` finds it."""

    end: int  # a file position
    complete: bool  # a BLANK closes the file at ``end``
    past_until: bool = False  # a record (or the BLANK) there runs past ``until``


def whole_records_end(
    segment: Segment,
    position: int,
    *,
    received: int | None = None,
    until: int | None = None,
    at_least_one: bool = False,
) -> RecordsEnd:
    """Where the whole, CRC-valid records of ``segment`` from ``position`` end (a file
    position), and whether a BLANK closes the file there (the end is then the BLANK's
    position; the file is complete). ``received``: only the file's bytes before this file
    position count (a record whose tail is still zeros can pass the checks: its properties
    are outside the body CRC). ``until``: only records that end by this physical offset; the
    answer then says whether the next record (or the BLANK) runs past it, so no record that
    ends by ``until`` can come later. ``at_least_one``: the first whole record, or a BLANK at
    ``position``, counts even when it runs past ``until`` (a reader bounded by ``until``
    still moves on)."""
    limit = until - segment.start if until is not None else None
    windows = FileWindows(segment.path, segment.size if received is None else received)
    try:
        region = RegionScan(
            None, position, windows.limit, segment.start, True,
            stop_on_crc_error=True, windows=windows,
        )  # fmt: skip
        end = position
        for _window, _start, rows, count in region.batches():
            offsets = rows[PHYSICAL_OFFSET : count * ROW_WIDTH : ROW_WIDTH]
            sizes = rows[TOTAL_SIZE : count * ROW_WIDTH : ROW_WIDTH]
            last_end = offsets[-1] - segment.start + sizes[-1]
            if limit is not None and last_end > limit:  # the records that end by the limit
                for offset, size in zip(offsets, sizes, strict=True):
                    if offset - segment.start + size > limit and not (
                        at_least_one and end == position
                    ):
                        return RecordsEnd(end, False, True)
                    end = offset - segment.start + size
            end = last_end
        if region.stop is ScanStop.BLANK:
            if limit is None or limit >= segment.size or (at_least_one and end == position):
                return RecordsEnd(region.end_position, True)
            return RecordsEnd(end, False, True)  # the BLANK runs past the limit
        return RecordsEnd(region.end_position if limit is None else end, False)
    finally:
        windows.close()


def _copy(segment: Segment, begin: int, end: int, dest: Store, outcome: ReplicationRound) -> None:
    """Write SOURCE's bytes ``[begin, end)`` of ``segment`` into DEST's file of the same name
    (created first when new). A completed file's zeros after its BLANK are left as the holes
    of DEST's new file: only non-zero bytes are copied past the BLANK."""
    log = dest.commitlog
    target = log.queue.find(segment.start)
    if target is None:
        target = log.queue.create(segment.start)
        outcome.files_created.append(target.name)
    stop = end
    if end == segment.size:  # a completed file: up to the BLANK and any non-zero bytes after
        data_end = nonzero_extent(segment.path, begin, end)
        stop = max(begin + BLANK_MIN_LENGTH, data_end[1]) if data_end else begin
        stop = min(stop, end)
    try:
        source_fd = os.open(segment.path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise read_failure(segment.path, exc) from None
    target_fd = open_for_writing(target.path)
    try:
        in_kernel = hasattr(os, "copy_file_range")
        position = begin
        while position < stop:
            length = min(_CHUNK, stop - position)
            if in_kernel:  # the kernel copies (or shares the blocks): no trip through Python
                try:
                    copied = os.copy_file_range(source_fd, target_fd, length, position, position)
                except OSError as exc:
                    if exc.errno not in _NO_COPY_FILE_RANGE:
                        raise
                    in_kernel = False
                    continue
            else:
                copied = _copy_through_memory(source_fd, target_fd, position, length)
            if not copied:
                raise StoreIOError(f"{segment.path} ended at {position} while it was copied")
            position += copied
            outcome.bytes_copied += copied
        os.fdatasync(target_fd)
    except OSError as exc:
        raise StoreIOError(f"cannot copy into {target.path}: {exc.strerror}") from None
    finally:
        os.close(source_fd)
        os.close(target_fd)


# copy_file_range refused: across file systems on old kernels, not supported by the file system
_NO_COPY_FILE_RANGE = {errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM}


def _copy_through_memory(source_fd: int, target_fd: int, position: int, length: int) -> int:
    chunk = os.pread(source_fd, length, position)
    view = memoryview(chunk)
    while view:
        written = os.pwrite(target_fd, view, position + len(chunk) - len(view))
        view = view[written:]
    return len(chunk)


def _make_durable(dest: Store, outcome: ReplicationRound) -> None:
    if outcome.files_created:
        fsync_directory(dest.commitlog_dir)
    dest.commitlog.forget_maps()


def dispatch_copied(dest: Store, end: int) -> int:
    """Dispatch DEST's records up to ``end`` (its consume queues and index), as a slave's
    reput does, and move the checkpoint's physic time with them."""
    dispatcher = Dispatcher(dest)
    try:
        result = dispatcher.run(until=end)
    finally:
        dispatcher.close()
    checkpoint = dest.checkpoint() or Checkpoint()
    if checkpoint.logics_msg_timestamp > checkpoint.physic_msg_timestamp:
        write_checkpoint(
            dest.checkpoint_path,
            replace(checkpoint, physic_msg_timestamp=checkpoint.logics_msg_timestamp),
        )
    return result.records


def follow(
    source: Path,
    dest: Store,
    config: StoreConfig,
    *,
    interval: float,
    should_stop: Callable[[], bool],
    on_round: Callable[[ReplicationRound], None],
    until: int | None = None,
) -> int:
    """Rounds of :func:`replicate_round` every ``interval`` seconds until ``should_stop``
    (checked between rounds, so DEST is sound whenever it stops) or ``until`` is reached;
    returns DEST's end."""
    end: int | None = None
    while True:
        outcome = replicate_round(source, dest, config, until=until, dest_end=end)
        end = outcome.to_offset
        on_round(outcome)
        if outcome.until_reached:
            return end
        deadline = time.monotonic() + interval
        while time.monotonic() < deadline:
            if should_stop():
                return end
            time.sleep(min(0.05, interval))
        if should_stop():
            return end
