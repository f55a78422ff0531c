"""Consume queues (spec §6): ``consumequeue/<topic>/<queueId>/`` files of 20-byte units
``(commit-log offset, record size, tagsCode)``; queue offset q lives at byte q x 20.

This module owns unit positions: loading a queue (valid end, min/max offsets as the broker
computes them), reading units, appending with the broker's rules (pre-blank fill, duplicate
skips), and the two time lookups (4.x and 5.x rules).
"""

from __future__ import annotations

import functools
import mmap
import os
import struct
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from rmqstore import kernel
from rmqstore.errors import RebuildFirstError, StoreFormatError, StoreIOError
from rmqstore.javavalues import JAVA_INT_RANGE
from rmqstore.segments import (
    BY_NAME,
    Segment,
    SegmentQueue,
    fsync_directory,
    is_segment_name,
    link_target,
    map_writable,
    nonzero_extent,
    open_file_limit,
    reserve_range,
    sync_file_data,
    sync_file_system,
)
from rmqstore.windows import read_range

CQ_UNIT_SIZE = 20
_UNITS_LOOKED_AT = 64  # after a queue's end, for a unit it held past it
UNIT = struct.Struct(">qiq")
PRE_BLANK_SIZE = 0x7FFFFFFF  # size of the units filling a queue that starts above 0
PRE_BLANK_UNIT = UNIT.pack(0, PRE_BLANK_SIZE, 0)


class PutOutcome(Enum):
    WRITTEN = "written"
    DUPLICATE = "duplicate"  # already in the queue: skipped
    OUT_OF_ORDER = "out of order"  # written at the end, though its queue offset is further on
    # not written: the first unit of a queue at a queue offset whose file position is not a
    # Java long (negative, or past Long.MAX once times 20: a damaged QUEUEOFFSET), so its file
    # would get a name no broker loads
    OUT_OF_RANGE = "out of range"


@dataclass(frozen=True, slots=True)
class Unit:
    queue_offset: int
    physical_offset: int
    size: int
    tags_code: int

    @property
    def is_pre_blank(self) -> bool:
        return is_pre_blank(self.physical_offset, self.size)


def is_pre_blank(physical_offset: int, size: int) -> bool:
    """Whether a unit is one of the pre-blank units filling a queue that starts above 0."""
    return physical_offset == 0 and size == PRE_BLANK_SIZE


QueueBounds = tuple[int, int, int]


@dataclass(frozen=True)
class QueueTruncation:
    """What ``truncateDirtyLogicFiles(phy)`` removes from one queue: whole files at its end,
    and the bytes ``[cut_position, cut_end)`` of ``cut_file`` (units from the first one cut to
    the last non-zero byte). ``units_removed`` counts the valid units among them."""

    dropped_files: tuple[Path, ...]
    cut_file: Path | None
    cut_position: int
    cut_end: int
    units_removed: int


@dataclass(frozen=True, slots=True)
class QueueTip:
    """Where a queue ends: its max offset (the next queue offset) and the end of the record
    its last unit points to. :meth:`after_put` says where it ends after a put, by the rules of
    :meth:`ConsumeQueue.put`, without writing (how a writer learns the offsets a dispatch of
    the undispatched tail will give, as a broker does before it accepts a message)."""

    max_offset: int
    max_physical_offset: int

    @classmethod
    def of(cls, queue: ConsumeQueue) -> QueueTip | None:
        """None for a queue without files (its first put starts it at the unit's offset)."""
        return cls(queue.max_offset, queue.max_physical_offset) if queue.queue.segments else None

    @staticmethod
    def after_put(
        tip: QueueTip | None, queue_offset: int, physical_offset: int, size: int
    ) -> QueueTip:
        if tip is None:
            return QueueTip(queue_offset + 1, physical_offset + size)
        if physical_offset + size <= tip.max_physical_offset:
            return tip  # a duplicate
        if queue_offset != 0 and queue_offset < tip.max_offset:
            return tip  # "built repeatedly"
        return QueueTip(tip.max_offset + 1, physical_offset + size)


# how a queue file's mapping is read around a page fault: page by page, not a read-ahead
# window. The first write fault of a fresh (sparse) file with Linux's read-ahead costs 1.5
# ms on ext4, 0.05 ms without: a store of thousands of queues pays it per queue
_MADV_RANDOM = getattr(mmap, "MADV_RANDOM", None)

# disk blocks reserved ahead of the units written: a page at first, then as much again as
# the file holds reserved, up to 256 KiB a step. A broker's queue files are sparse, so a store
# of many short queues (LMQ, a queue per device) takes a page each on the broker's disk; a
# fixed 256 KiB step made a rebuild of 100,000 such queues need 25 GB
_RESERVE_FIRST = 4096
_RESERVE_STEP = 256 * 1024


# spec 6.6: with enableConsumeQueueExt a unit's tagsCode holds an address in
# consumequeue_ext/ (its offset there + Long.MIN_VALUE); a tag's hash code is a sign-extended
# int, so it never reaches this far down
_LARGEST_EXT_ADDRESS = -(2**31) - 1


_LARGEST_FILE_START = 2**63 - 1  # a file's name is its start, a Java long
# the largest queue offset whose unit has a file position (a damaged QUEUEOFFSET may be more)
LARGEST_QUEUE_OFFSET = _LARGEST_FILE_START // CQ_UNIT_SIZE


def is_ext_address(tags_code: int) -> bool:
    """``ConsumeQueueExt.isExtAddr``: whether a unit's tagsCode is a ConsumeQueueExt address."""
    return tags_code <= _LARGEST_EXT_ADDRESS


def is_valid_unit(physical_offset: int, size: int) -> bool:
    """The broker's test while recovering a queue: ``offset >= 0 && size > 0``."""
    return physical_offset >= 0 and size > 0


class ConsumeQueue:
    """One ``topic``/``queue_id`` consume queue. Loading finds the valid end exactly as the
    broker's recovery does; call :meth:`correct_min_offset` with the commit log's first
    offset to get the broker's min offset."""

    def __init__(
        self,
        root: Path,
        topic: str,
        queue_id: int,
        file_size: int,
        *,
        strict: bool = True,
        known: QueueBounds | None = None,
        commitlog_min_offset: int | None = None,
        keep_first_file: bool = False,
    ) -> None:
        """``known``: the bounds another load of the same, unchanged files found (a parallel
        verify loads each queue once, not once per range). ``commitlog_min_offset``: correct
        the min offset as :meth:`correct_min_offset` does, from the bytes the load read.
        ``keep_first_file``: keep what :meth:`take_first_file` gives."""
        self.topic = topic
        self.queue_id = queue_id
        self.file_size = file_size
        self.directory = root / topic / str(queue_id)
        self.queue = SegmentQueue.load(
            self.directory, file_size, strict=strict, kind="consume-queue"
        )
        self._write_map: mmap.mmap | None = None
        self._write_segment: Segment | None = None
        # called with (file, start, end) for non-zero bytes after the queue's valid end in a
        # file about to be written (a torn unit, junk): they must go to quarantine before a
        # unit overwrites them (the dispatcher sets it; None: not looked for)
        self.on_residue: Callable[[Path, int, int], None] | None = None
        # where the mapped file's units may be written, in logical bytes: [_write_base,
        # _write_limit), up to where its disk blocks are reserved (files are sparse, as a
        # broker's; blocks are reserved ahead of the writes, so a full disk is an error, not
        # a SIGBUS)
        self._write_base = 0
        self._write_limit = -1
        self._reserved = 0  # bytes of the mapped file with blocks reserved
        self._dirty: set[Path] = set()
        # set by a writer whose file system gets one syncfs when it is done (see
        # sync_deferred): the queue's first file, and the folders made for it, are created
        # without an fsync of their folders, which are listed in _unsynced_folders until a
        # flush (or a second file) makes them durable
        self.defer_names = False
        self._unsynced_folders: list[Path] = []
        self._made: Segment | None = None  # the file this object made last (all zero)
        # set by a writer into a folder it did not make (a staging folder): the queue's
        # folders are made below it, and it is not made again when it is gone
        self.floor: Path | None = None
        # the first chunk of each file the load's walk read, kept while the load lasts: the
        # last unit and the first file's units are read from it (a store of thousands of
        # queues holds thousands of queues of a unit or a few, one chunk each)
        self._heads: dict[Path, bytes] = {}
        self._first_file: bytes | None = None
        # the last valid unit as the load found it, not moved by writes (None: no unit past
        # the first file's start, or bounds ``known``)
        self.loaded_last_unit: Unit | None = None
        # where the file the load's walk found missing would start, files following it (a
        # broker's walk goes on to them: its next queue offset is past the last one's units);
        # None when the walk met no such gap, or bounds ``known``
        self.gap_at: int | None = None
        if known is not None:
            self.end, self.min_logic_offset, self.max_physical_offset = known
        else:
            self.end = self._find_end()  # logical byte offset after the last valid unit
            self.max_physical_offset = -1  # end (offset + size) of the last valid unit
            self.min_logic_offset = self.queue.min_offset or 0
            if self.end > self.min_logic_offset:
                last = self.read_unit((self.end - CQ_UNIT_SIZE) // CQ_UNIT_SIZE)
                self.max_physical_offset = last.physical_offset + last.size
                self.loaded_last_unit = last
        if commitlog_min_offset is not None:
            self.correct_min_offset(commitlog_min_offset)
        self._first_file = self._read_first_file() if keep_first_file else None
        self._heads.clear()
        # the end as of the last flush(): every write moves the end on, so a flush with the
        # end where it was and no file marked dirty has nothing to make durable
        self._synced_end = self.end

    def _read_first_file(self) -> bytes | None:
        """The first file's bytes up to the valid end, when the load's walk read them all
        as that file's first chunk."""
        segments = self.queue.segments
        if not segments:
            return None
        head = self._heads.get(segments[0].path)
        length = self.end - segments[0].start
        return head[:length] if head is not None and 0 <= length <= len(head) else None

    def take_first_file(self) -> bytes | None:
        """With ``keep_first_file``: the bytes of the queue's first file from its start up to
        the queue's valid end, when the load read them all at once (a queue of a few units:
        a broker's thousands of queues are mostly such), else None; given once (a queue kept
        open does not keep them)."""
        first, self._first_file = self._first_file, None
        return first

    @property
    def bounds(self) -> QueueBounds:
        """(end, min logical offset, max physical offset): what a load found."""
        return (self.end, self.min_logic_offset, self.max_physical_offset)

    # -- loading -----------------------------------------------------------------------------

    def _find_end(self) -> int:
        """Recovery's walk: from the third-last file, unit by unit, to the first unit with
        ``offset < 0 or size <= 0``."""
        segments = self.queue.segments
        if not segments:
            return 0
        end = segments[max(0, len(segments) - 3)].start
        for segment in segments[max(0, len(segments) - 3) :]:
            if segment.start != end:
                self.gap_at = end
                break  # a gap: the queue ends at the previous file
            valid, _, self._heads[segment.path] = _valid_prefix(segment.path, self.file_size)
            end = segment.start + valid
            if valid < self.file_size:  # a wrong-size file: no further
                break
        return end

    def refuse_until_rebuilt(
        self, consequence: str, then: str = "", *, writes: bool = True
    ) -> None:
        """RebuildFirstError when something under a queue file's name is not a regular file
        (a folder, a FIFO: the units there are unknown, and no unit can be written there), or
        when the load's walk met a missing file among the last three with files after it
        (:attr:`gap_at`): a broker's walk goes on past it, so its queue ends (and takes its
        next unit and next queue offset) after the last file's units, not where this one
        ends. ``writes``: the caller writes the queue (puts units, cuts it), so a queue file
        that is a symbolic link is refused too (no writer writes through one). ``consequence``
        says what writing would do; ``then`` what to run after the rebuild."""
        for path in self.queue.links[:1] if writes else []:
            raise RebuildFirstError(
                f"{path} is a symbolic link (to {link_target(path)}), which rmqstore's writers "
                f"do not write through, so the consume queue of {self.topic}:{self.queue_id} "
                f"is not written; run rmqstore dispatch --rebuild --yes first{then} (it moves "
                "the queue's files, the link among them, to quarantine and builds the queue in "
                "the store; rmqstore verify shows it: file-link)"
            )
        for path in self.queue.unexpected:
            if is_segment_name(path.name):
                raise RebuildFirstError(
                    f"{path} is not a regular file, under a consume-queue file's name: the "
                    f"units of {self.topic}:{self.queue_id} there are unknown and none can be "
                    f"written there, so {consequence}; run rmqstore dispatch --rebuild --yes "
                    f"first{then} (rmqstore verify shows it: cq-layout)"
                )
        if self.gap_at is not None:
            raise RebuildFirstError(
                f"the consume queue of {self.topic}:{self.queue_id} is missing its file "
                f"{self.gap_at:020d}, with files after it: a broker's load walks on past the "
                f"gap and ends the queue after the last file's units, not where it ends here, "
                f"so {consequence}; run rmqstore dispatch --rebuild --yes first{then} "
                "(rmqstore verify shows the gap)"
            )

    @property
    def max_offset(self) -> int:
        """``getMaxOffsetInQueue``: units up to the valid end (pre-blank units count)."""
        return self.end // CQ_UNIT_SIZE

    @property
    def min_offset(self) -> int:
        """``getMinOffsetInQueue`` (after :meth:`correct_min_offset`)."""
        return self.min_logic_offset // CQ_UNIT_SIZE

    def correct_min_offset(self, commitlog_min_offset: int) -> None:
        """``correctMinOffset``: the first unit of the first file whose record is still in the
        commit log (5.x: min = max when even the last unit points below it)."""
        segments = self.queue.segments
        if not segments:
            return
        first = segments[0]
        limit = max(min(self.file_size, self.end - first.start), 0)
        # a chunk at a time: the unit is most often the first (nothing expired), and a full
        # first file is megabytes (a broker with thousands of queues has thousands)
        for position, data in _file_chunks(first.path, limit, self._heads.get(first.path)):
            units = memoryview(data)[: len(data) // CQ_UNIT_SIZE * CQ_UNIT_SIZE]
            for index, (physical_offset, _size, _tags) in enumerate(UNIT.iter_unpack(units)):
                if physical_offset >= commitlog_min_offset:
                    self.min_logic_offset = first.start + position + index * CQ_UNIT_SIZE
                    return

    def files_after_end(self) -> list[Path]:
        """The files a broker's load deletes (``truncateDirtyFiles`` of the queue's valid
        end): those after the file where an invalid unit ends the queue. (After a missing
        file none: the walk here ends there, a broker's goes on.)"""
        holder = self._end_file()
        if holder is None:
            return []
        return [segment.path for segment in self.queue.segments if segment.start > holder.start]

    def _end_file(self) -> Segment | None:
        """The file where the queue's valid end lies (the load's walk ended there)."""
        return next(
            (s for s in self.queue.segments if s.start <= self.end < s.start + self.file_size),
            None,
        )

    def truncation_at(self, physical_offset: int) -> QueueTruncation | None:
        """``truncateDirtyLogicFiles``: keep exactly the units whose record starts below
        ``physical_offset``. From the last file back (of those the load keeps, see
        :meth:`files_after_end`): a file whose first unit is at or past it goes whole;
        otherwise the file ends before the first such unit. An empty unit ends the queue, and
        nothing after it is touched. None when nothing is removed."""
        dropped: list[Path] = []
        removed = 0
        after_end = set(self.files_after_end())  # gone at load: a broker truncates the rest
        for segment in reversed(self.queue.segments):
            if segment.path in after_end:
                continue
            _, data, _ = _valid_prefix(segment.path, self.file_size, keep=True)
            data = data[: len(data) // CQ_UNIT_SIZE * CQ_UNIT_SIZE]
            found = kernel.cut_index(data, physical_offset)
            cut_at = found if found >= 0 else None
            if cut_at == 0:
                dropped.append(segment.path)
                removed += _leading_valid_units(data)
                continue
            cut_file = None
            cut_position = cut_end = 0
            if cut_at is not None:
                cut_position = cut_at * CQ_UNIT_SIZE
                extent = nonzero_extent(segment.path, cut_position, self.file_size)
                cut_end = extent[1] if extent else cut_position
                cut_file = segment.path
                removed += _leading_valid_units(data[cut_position:])
            if not dropped and cut_file is None:
                return None
            return QueueTruncation(tuple(dropped), cut_file, cut_position, cut_end, removed)
        if not dropped:
            return None
        return QueueTruncation(tuple(dropped), None, 0, 0, removed)

    def reach_after(self, truncation: QueueTruncation | None) -> int:
        """Where the queue's last unit ends (``max_physical_offset``, as a load finds it)
        once ``truncation`` is carried out; -1 when no unit is left."""
        if truncation is None:
            return self.max_physical_offset
        if truncation.cut_file is not None:
            kept = int(truncation.cut_file.name) + truncation.cut_position
        else:
            kept = min(int(path.name) for path in truncation.dropped_files)
        try:
            unit = self.read_unit(kept // CQ_UNIT_SIZE - 1)
        except (IndexError, OSError, StoreIOError):
            return -1  # no unit before the cut (or its file is not there)
        return unit.physical_offset + unit.size if unit.size > 0 else -1

    # -- reading -----------------------------------------------------------------------------

    def read_unit(self, queue_offset: int) -> Unit:
        position = queue_offset * CQ_UNIT_SIZE
        segment = self.queue.find(position)
        if segment is None:
            raise IndexError(f"queue offset {queue_offset} is outside the files")
        within = position - segment.start
        head = self._heads.get(segment.path, b"")
        if within + CQ_UNIT_SIZE <= len(head):
            return Unit(queue_offset, *UNIT.unpack_from(head, within))
        data = read_range(segment.path, within, CQ_UNIT_SIZE)
        return Unit(queue_offset, *UNIT.unpack(data))

    def units_after_end(self, most: int = 8) -> list[Unit]:
        """Up to ``most`` units after the queue's valid end, in the file where the load's
        walk ended, that look valid (``offset >= 0 and size > 0``): units the queue held past
        the one that ends it (a unit overwritten in the middle of the queue), stale ones a
        broker's recovery left, or junk. Only the units within the first 64 after the first
        non-zero byte are looked at (a sparse file's holes are skipped), so a store of
        thousands of queues pays a page or so for each."""
        holder = self._end_file()
        if holder is None:
            return []
        within = self.end - holder.start
        extent = nonzero_extent(holder.path, within, min(holder.size, self.file_size))
        if extent is None:
            return []
        first = within + (extent[0] - within) // CQ_UNIT_SIZE * CQ_UNIT_SIZE
        data = read_range(holder.path, first, _UNITS_LOOKED_AT * CQ_UNIT_SIZE)
        found = []
        for index, (physical_offset, size, tags_code) in enumerate(
            UNIT.iter_unpack(data[: len(data) // CQ_UNIT_SIZE * CQ_UNIT_SIZE])
        ):
            if is_valid_unit(physical_offset, size):
                queue_offset = (holder.start + first) // CQ_UNIT_SIZE + index
                found.append(Unit(queue_offset, physical_offset, size, tags_code))
                if len(found) == most:
                    break
        return found

    def last_unit_in_log(self, log_end: int) -> Unit | None:
        """The queue's last unit when it points at bytes inside the log (which ends at
        ``log_end``) and is not a pre-blank placeholder: the newest record the queue holds."""
        if not 0 <= self.max_physical_offset <= log_end or self.max_offset <= self.min_offset:
            return None
        unit = self.read_unit(self.max_offset - 1)
        return None if unit.is_pre_blank else unit

    def units(self, start: int | None = None, count: int | None = None) -> Iterator[Unit]:
        """Units from queue offset ``start`` (default: min offset) to the valid end."""
        for values in self.unit_values(start, count):
            yield Unit(*values)

    def unit_values(
        self, start: int | None = None, count: int | None = None
    ) -> Iterator[tuple[int, int, int, int]]:
        """What :meth:`units` gives, as plain ``(queue offset, physical offset, size,
        tagsCode)`` tuples: no object per unit (a read of a million of them)."""
        offset = self.min_offset if start is None else max(start, 0)
        stop = self.max_offset if count is None else min(self.max_offset, offset + count)
        while offset < stop:
            position = offset * CQ_UNIT_SIZE
            segment = self.queue.find(position)
            if segment is None:
                return
            within = position - segment.start
            length = min(self.file_size - within, (stop - offset) * CQ_UNIT_SIZE)
            data = read_range(segment.path, within, length)
            whole = len(data) - len(data) % CQ_UNIT_SIZE
            for queue_offset, values in enumerate(UNIT.iter_unpack(data[:whole]), offset):
                yield (queue_offset, *values)
            offset += whole // CQ_UNIT_SIZE
            if len(data) < length:
                return  # a file shorter than the units after it say (cut): its whole units

    def offset_by_time(self, timestamp: int, store_time: Callable[[int, int], int]) -> int:
        """5.x ``getOffsetInQueueByTime`` (boundary LOWER): the first queue offset whose record
        was stored at or after ``timestamp``; the max offset when all are earlier.
        ``store_time(physical_offset, size)`` reads a record's store time (-1 if gone)."""
        files = self._files_with_units()
        if not files:
            return 0
        chosen = files[-1]
        for segment, count in files[:-1]:
            if self._time_of(segment, count - 1, store_time) >= timestamp:
                chosen = (segment, count)
                break
        segment, count = chosen
        floor = max(0, (self.min_logic_offset - segment.start) // CQ_UNIT_SIZE)
        base = segment.start // CQ_UNIT_SIZE
        if self._time_of(segment, count - 1, store_time) < timestamp:
            return base + count
        if self._time_of(segment, floor, store_time) > timestamp:
            return base
        low, high, target, right = floor, count - 1, -1, -1
        while high >= low:
            middle = (low + high) // 2
            stamp = self._time_of(segment, middle, store_time)
            if stamp < 0:
                return 0
            if stamp == timestamp:
                target = middle
                break
            if stamp > timestamp:
                high, right = middle - 1, middle
            else:
                low = middle + 1
        if target < 0:
            return base + right
        while target - 1 >= floor and self._time_of(segment, target - 1, store_time) == timestamp:
            target -= 1
        return base + target

    def offset_by_time_4x(
        self,
        timestamp: int,
        store_time: Callable[[int, int], int],
        file_time: Callable[[Segment], int],
        commitlog_min_offset: int = 0,
    ) -> int:
        """4.x ``getOffsetInQueueByTime``: the first file whose ``file_time`` (the broker uses
        the file's mtime) is at or after ``timestamp`` (else the last file), then the unit whose
        store time is nearest ``timestamp`` in that file."""
        files = self._files_with_units()
        if not files:
            return 0
        segment, count = next(((s, c) for s, c in files if file_time(s) >= timestamp), files[-1])
        low = max(0, (self.min_logic_offset - segment.start) // CQ_UNIT_SIZE)
        high = count - 1
        target = left = right = -1
        left_time = right_time = -1
        while high >= low:
            middle = (low + high) // 2
            unit = self._unit_in(segment, middle)
            if unit[0] < commitlog_min_offset:
                low, left = middle + 1, middle
                continue
            stamp = store_time(unit[0], unit[1])
            if stamp < 0:
                return 0
            if stamp == timestamp:
                target = middle
                break
            if stamp > timestamp:
                high, right, right_time = middle - 1, middle, stamp
            else:
                low, left, left_time = middle + 1, middle, stamp
        if target >= 0:
            chosen = target
        elif left_time == -1:
            chosen = right
        elif right_time == -1:
            chosen = left
        else:
            nearer_right = abs(timestamp - left_time) > abs(timestamp - right_time)
            chosen = right if nearer_right else left
        return (segment.start // CQ_UNIT_SIZE) + chosen

    def first_unit_store_time(self, segment: Segment, store_time: Callable[[int, int], int]) -> int:
        """Store time of the record of a file's first unit: the time a broker first wrote the
        file, which is its mtime for a single-page file (used as the 4.x file time)."""
        return self._time_of(segment, 0, store_time)

    def _files_with_units(self) -> list[tuple[Segment, int]]:
        """(segment, number of valid units in it) for files holding units."""
        files = []
        for segment in self.queue.segments:
            count = min(self.file_size, self.end - segment.start) // CQ_UNIT_SIZE
            if count > 0:
                files.append((segment, count))
        return files

    def _unit_in(self, segment: Segment, index: int) -> tuple[int, int, int]:
        return UNIT.unpack(read_range(segment.path, index * CQ_UNIT_SIZE, CQ_UNIT_SIZE))

    def _time_of(self, segment: Segment, index: int, store_time: Callable[[int, int], int]) -> int:
        physical_offset, size, _ = self._unit_in(segment, index)
        return store_time(physical_offset, size)

    # -- writing -----------------------------------------------------------------------------

    def put(self, queue_offset: int, physical_offset: int, size: int, tags_code: int) -> PutOutcome:
        """``putMessagePositionInfo``: append a unit at the end of the queue, or skip it as
        the broker would when it is already there."""
        if physical_offset + size <= self.max_physical_offset:
            return PutOutcome.DUPLICATE
        expected = queue_offset * CQ_UNIT_SIZE
        end = self.end
        if expected == end and self._write_base <= end <= self._write_limit - CQ_UNIT_SIZE:
            # the common case: the next unit, in the file mapped for the previous one
            UNIT.pack_into(
                self._write_map, end - self._write_base, physical_offset, size, tags_code
            )
            self.end = end + CQ_UNIT_SIZE
            self.max_physical_offset = physical_offset + size
            return PutOutcome.WRITTEN
        if not self.queue.segments:
            if not 0 <= queue_offset <= LARGEST_QUEUE_OFFSET:
                return PutOutcome.OUT_OF_RANGE
            self._start_with(expected, UNIT.pack(physical_offset, size, tags_code))
            self.max_physical_offset = physical_offset + size
            return PutOutcome.WRITTEN
        if queue_offset != 0 and expected < self.end:
            return PutOutcome.DUPLICATE  # "built repeatedly"
        outcome = PutOutcome.WRITTEN
        if queue_offset != 0 and expected > self.end:
            outcome = PutOutcome.OUT_OF_ORDER  # the broker logs a bug and appends anyway
        self._append(UNIT.pack(physical_offset, size, tags_code))
        self.max_physical_offset = physical_offset + size
        return outcome

    def put_run(self, queue_offset: int, units: bytes | memoryview, first_end: int) -> bool:
        """Append packed units for queue offsets ``queue_offset``, ``queue_offset + 1``, … in
        one write, when :meth:`put` would write each of them at the end of the queue: the
        queue has files, the run starts where it ends, and its first unit (ending at commit-log
        offset ``first_end``) is not already there. Units taken from one walk of the log end
        further on each time, so then none of them is a duplicate either. False (and nothing
        written) otherwise: the caller puts the units one by one."""
        if (
            not self.queue.segments
            or queue_offset * CQ_UNIT_SIZE != self.end
            or first_end <= self.max_physical_offset
        ):
            return False
        self._append(units)
        physical_offset, size, _ = UNIT.unpack_from(units, len(units) - CQ_UNIT_SIZE)
        self.max_physical_offset = physical_offset + size
        return True

    def _start_with(self, expected: int, unit: bytes) -> None:
        """The first file of a queue, holding ``unit`` at ``expected``: created at the file
        holding it and, when the queue does not start at the file's start, made with
        pre-blank units up to it and the unit after them, on the disk when the file appears
        under its name. A power cut that left such a file all zero would end the queue at
        the file's start, where the next put (a broker's too) would append its unit, at the
        wrong queue offset, with no fill before it; one that left only the fill would end
        the queue at a pre-blank unit, which a broker's load takes for a record ending at
        2 GiB (every later unit a duplicate)."""
        start = expected - expected % self.file_size
        filler = (expected - start) // CQ_UNIT_SIZE
        self.min_logic_offset = expected
        if filler:
            self._create(start, head=PRE_BLANK_UNIT * filler + unit)
            self.end = expected + CQ_UNIT_SIZE
        else:  # an all-zero file ends the queue at its start, where the unit goes again
            self._create(start)
            self.end = start
            self._append(unit)

    def _append(self, units: bytes) -> None:
        position = 0
        while position < len(units):
            segment = self.queue.find(self.end)
            if segment is None:
                segment = self._create(self.end)
            buf = self._writable(segment)
            within = self.end - segment.start
            length = min(len(units) - position, self.file_size - within)
            self._reserve(segment, within + length)
            buf[within : within + length] = units[position : position + length]
            position += length
            self.end += length

    def _create(self, start: int, head: bytes = b"") -> Segment:
        try:
            if self.queue.segments:
                # a later file: the earlier one's name durable first (its data is synced
                # before the new file is written, see _sync_files_before)
                self._sync_names()
            elif self.defer_names:
                self._made = self.queue.create(
                    start, head=head, unsynced_folders=self._unsynced_folders, floor=self.floor
                )
                return self._made
            # sparse: blocks are reserved as units are written
            self._made = self.queue.create(start, head=head, floor=self.floor)
            return self._made
        except OSError as exc:
            raise StoreIOError(f"cannot flush {self.directory}: {exc.strerror}") from None
        except StoreFormatError as exc:  # something stands where the queue's file must go
            raise StoreFormatError(
                f"{exc}; rmqstore dispatch --rebuild --yes moves the consume queues to "
                "quarantine and builds them anew"
            ) from None

    def _writable(self, segment: Segment) -> mmap.mmap:
        if self._write_segment is not segment:
            self._release()
            self._sync_files_before(segment)
            if self.on_residue is not None and segment is not self._made:
                # (a file made here holds nothing past the end: its head is before it)
                start = max(0, self.end - segment.start)
                extent = nonzero_extent(segment.path, start, self.file_size)
                if extent is not None:
                    self.on_residue(segment.path, start, extent[1])
            self._write_map = map_writable(segment.path)
            if _MADV_RANDOM is not None:
                self._write_map.madvise(_MADV_RANDOM)
            WRITE_MAPS.mapped(self)
            self._write_segment = segment
            self._write_base = segment.start
            self._reserved = 0
            self._reserve(segment, self.end - segment.start)  # what is written already
        self._dirty.add(segment.path)
        assert self._write_map is not None
        return self._write_map

    def _reserve(self, segment: Segment, end: int) -> None:
        """Reserve disk blocks of the mapped file up to ``end`` (a little further, so the
        fast path of :meth:`put` can go on) before units are written there."""
        assert self._write_map is not None
        if end <= self._reserved:
            return
        step = min(_RESERVE_STEP, max(_RESERVE_FIRST, self._reserved))
        target = min(len(self._write_map), self.file_size, max(end, self._reserved + step))
        reserve_range(segment.path, self._reserved, target - self._reserved)
        self._reserved = target
        self._write_limit = segment.start + target

    def _sync_files_before(self, segment: Segment) -> None:
        """Make the queue's files before ``segment`` durable before a unit is written there,
        as a broker's flush goes from file to file: the disk never holds a later file's units
        over an earlier file's lost ones (a power cut while the queue rolls), a hole a
        broker's recovery, walking the last three files, would not see, nor a replay fill."""
        earlier = sorted(path for path in self._dirty if path.name < segment.path.name)
        try:
            for path in earlier:
                sync_file_data(path)
                self._dirty.discard(path)
        except OSError as exc:
            raise StoreIOError(f"cannot flush {self.directory}: {exc.strerror}") from None

    def _release(self) -> None:
        """Let the mapped file go. What was written through the map stays in the page cache
        until :meth:`flush` syncs the file by name: the file is marked for it (units the
        fast path of :meth:`put` wrote since the last flush mark nothing), else a queue that
        rolled to its next file, or let its map go for another queue's, left the units the
        file took since the last flush out of the next one."""
        mapped = self._write_map
        if mapped is not None:
            if self._write_segment is not None and self.end != self._synced_end:
                self._dirty.add(self._write_segment.path)
            # the map let go of before it is closed, the fast path of put shut off first: a
            # Ctrl-C between the close and these left a closed map in use, and the rollback
            # after it ended in an internal error (TypeError from pack_into)
            self._write_limit = -1
            self._write_segment = None
            self._write_map = None
            WRITE_MAPS.released(self)
            mapped.close()

    def flush(self) -> None:
        """Make the units written since the last flush durable, file by file from the
        queue's first (fdatasync, which writes back what went through the map too): a power
        cut part way then leaves the queue's units on the disk up to some point, as a
        broker's recovery reads them (its walk ends the queue at the first unit that is not
        there, and the replay puts the rest again). The mapped file, the queue's last, used
        to be synced first (msync), which could leave it on the disk over an earlier file
        never written: a hole before the queue's end, which no replay fills. Names not made
        durable yet (see ``defer_names``) go first."""
        try:
            self._sync_names()
        except OSError as exc:
            raise StoreIOError(f"cannot flush {self.directory}: {exc.strerror}") from None
        if self.end == self._synced_end and not self._dirty:
            return
        if self._write_segment is not None:  # the fast path of put() does not mark it
            self._dirty.add(self._write_segment.path)
        try:
            for path in sorted(self._dirty):
                sync_file_data(path)
        except OSError as exc:
            raise StoreIOError(f"cannot flush {self.directory}: {exc.strerror}") from None
        self._dirty.clear()
        self._synced_end = self.end

    def _sync_names(self) -> None:
        """fsync the folders whose entries :meth:`_create` left unsynced, outermost first."""
        while self._unsynced_folders:
            fsync_directory(self._unsynced_folders[0])
            del self._unsynced_folders[0]

    def sync_deferred(self) -> bool:
        """Whether what :meth:`flush` would make durable can wait for one syncfs(2) of the
        queue's file system instead (:meth:`synced_by_file_system` after it): the units lie
        in one file, so there is no order of files to keep (with the names ``defer_names``
        left unsynced). False when there is nothing to sync, or more than one file to sync
        in order (flush then)."""
        dirty = set(self._dirty)
        if self._write_segment is not None and self.end != self._synced_end:
            dirty.add(self._write_segment.path)
        return len(dirty) == 1 or (not dirty and bool(self._unsynced_folders))

    def synced_by_file_system(self) -> None:
        """After a syncfs(2) of the queue's file system that succeeded: what
        :meth:`sync_deferred` let wait is durable."""
        self._unsynced_folders.clear()
        self._dirty.clear()
        self._synced_end = self.end

    def close(self) -> None:
        self.flush()
        self._release()

    def close_unsynced(self) -> None:
        """Let the mapped file go without a flush: what :meth:`sync_deferred` said may wait
        is made durable by the caller's syncfs(2) of the queue's file system."""
        self._release()

    def remove_files_after(self, count: int) -> bool:
        """Remove the queue's files after its first ``count`` (made by a dispatch that
        stopped before it put a unit there), closing the queue first; False, and nothing
        removed, when one of them holds a non-zero byte."""
        made = self.queue.segments[count:]
        if not made:
            return True
        self.close()
        if any(nonzero_extent(segment.path, 0, segment.size) for segment in made):
            return False
        for segment in made:
            segment.path.unlink(missing_ok=True)
        self.queue.forget_after(count)
        fsync_directory(self.directory)
        return True


class WriteMaps:
    """The consume queues of this process holding a file mapped for writing, oldest first,
    kept to a number the process's open-file limit allows: Python's mmap keeps a duplicate
    of the file's descriptor, so a dispatch into thousands of queues held one per queue, and
    a store of 1,000 topics of 4 queues stopped with "Too many open files" under the usual
    ``ulimit -n`` of 1024. Past the number, the queue mapped longest ago lets its map go (it
    maps its file again at its next unit)."""

    def __init__(self) -> None:
        # weakly: a queue dropped without its close lets its map go with it
        self._held: weakref.WeakKeyDictionary[ConsumeQueue, None] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self.limit = 0  # learnt at the first map

    def mapped(self, queue: ConsumeQueue) -> None:
        with self._lock:
            if not self.limit:
                self.limit = write_maps_allowed()
            held = self._held
            held.pop(queue, None)
            held[queue] = None
            evicted = []
            while len(held) > self.limit:
                oldest = next(iter(held))
                del held[oldest]
                evicted.append(oldest)
        for oldest in evicted:
            oldest._release()

    def released(self, queue: ConsumeQueue) -> None:
        with self._lock:
            self._held.pop(queue, None)

    def __len__(self) -> int:
        return len(self._held)


def sync_queues_file_system(root: Path) -> None:
    """One syncfs(2) of the file system of the consume queues under ``root`` (see
    :func:`rmqstore.segments.can_sync_file_system`), its failure a StoreIOError."""
    try:
        sync_file_system(root)
    except OSError as exc:
        raise StoreIOError(
            f"cannot flush the consume queues on the file system of {root}: {exc.strerror}"
        ) from None


def write_maps_allowed() -> int:
    """How many queue files may be mapped for writing at once: half the open-file limit
    (the other half for the commit log, the index, the interpreter and workers' pipes), at
    most 16,384 (a process may hold 65,530 maps in all, by Linux's default)."""
    limit = open_file_limit()
    return 512 if limit is None else max(8, min(limit // 2, 16_384))


WRITE_MAPS = WriteMaps()


# bytes of a queue file read at a time while its valid units are counted (multiples of the
# unit size): the first chunk is small, since a queue's last file is mostly unwritten (a
# broker with thousands of queues has thousands of them), and the chunks grow up to the last
# one for a file that is full. A page: reading 64 KiB of a sparse file's zeros cost 18 us
# against 6 us for 4 KiB (4,000 queue files here), and a full file takes two reads more
_FIRST_CHUNK = 4096 // CQ_UNIT_SIZE * CQ_UNIT_SIZE
_LARGEST_CHUNK = (4 * 1024 * 1024) // CQ_UNIT_SIZE * CQ_UNIT_SIZE
ChunkReader = Callable[[int, int], bytes]  # (position, length) -> a queue file's bytes


def _valid_prefix(path: Path, limit: int, *, keep: bool = False) -> tuple[int, bytes, bytes]:
    """:func:`valid_prefix` of a local queue file."""
    return valid_prefix(functools.partial(read_range, path), limit, keep=keep)


def valid_prefix(read: ChunkReader, limit: int, *, keep: bool = False) -> tuple[int, bytes, bytes]:
    """How many bytes of valid units the first ``limit`` bytes of a queue file start with
    (recovery's walk, unit by unit, to the first unit with ``offset < 0 or size <= 0``), with
    ``keep`` those bytes and the first invalid unit (what follows it cannot change a walk
    that stops there), and the file's first chunk as read (what :func:`file_chunks` takes
    as ``head``). Read (``read(position, length)``) a chunk at a time up to that unit: no
    more of the file is read than its units and one chunk after them."""
    valid = 0
    kept: list[bytes] = []
    head = b""
    for position, data in file_chunks(read, limit):
        if not position:
            head = data
        whole = kernel.valid_units(data) * CQ_UNIT_SIZE
        valid = position + whole
        if whole < len(data):  # an invalid unit, or a partial one at the file's end
            if keep:
                kept.append(data[: whole + CQ_UNIT_SIZE])
            break
        if keep:
            kept.append(data)
    return valid, b"".join(kept), head


def _file_chunks(path: Path, limit: int, head: bytes | None = None) -> Iterator[tuple[int, bytes]]:
    """:func:`file_chunks` of a local queue file."""
    return file_chunks(functools.partial(read_range, path), limit, head)


def file_chunks(
    read: ChunkReader, limit: int, head: bytes | None = None
) -> Iterator[tuple[int, bytes]]:
    """``(position, bytes)`` of the first ``limit`` bytes of a queue file (``read(position,
    length)`` gives its bytes, fewer at its end), a chunk at a time from its start (growing
    from _FIRST_CHUNK to _LARGEST_CHUNK: a caller that stops early reads little of a mostly
    unwritten file); a chunk shorter than asked is the file's end. ``head``: the file's
    first chunk, read already by a walk with a ``limit`` no smaller."""
    position, chunk = 0, _FIRST_CHUNK
    while position < limit:
        wanted = min(chunk, limit - position)
        data = read(position, wanted) if head is None or position else head[:wanted]
        yield position, data
        if len(data) < wanted:
            return
        position += wanted
        chunk = min(chunk * 4, _LARGEST_CHUNK)


def _leading_valid_units(data: bytes) -> int:
    """How many units at the start of ``data`` (a multiple of 20 bytes) are valid."""
    return kernel.valid_units(data)


ROCKSDB_QUEUES_NOTE = (
    "holds a RocksDB database (a RocketMQ 5 broker's storeType=defaultRocksDB), not consume-"
    "queue files"
)


def holds_rocksdb(root: Path) -> bool:
    """Whether ``root`` (``consumequeue/``) holds a RocksDB database instead of queue folders
    (spec §6.9): a regular file ``CURRENT`` beside a regular file ``MANIFEST-<number>``, as
    every RocksDB database has. Told from the names and kinds alone (nothing is read: a FIFO
    there is never opened); a topic may be named CURRENT, but its entry is a folder."""
    try:
        entries = list(os.scandir(root))
    except OSError:
        return False
    return rocksdb_names({entry.name for entry in entries if entry.is_file(follow_symlinks=False)})


def rocksdb_names(files: set[str]) -> bool:
    """Whether the names of a folder's regular ``files`` are a RocksDB database's."""
    numbers = (name.removeprefix("MANIFEST-") for name in files if name.startswith("MANIFEST-"))
    return "CURRENT" in files and any(number.isascii() and number.isdigit() for number in numbers)


def list_queues(
    root: Path, linked: list[Path] | None = None, *, topic: str | None = None
) -> list[tuple[str, int]]:
    """(topic, queue id) of every consume-queue directory under ``root`` (``consumequeue/``),
    or of ``topic``'s alone. Entries whose queue-id directory name is not an integer are
    ignored, as by the broker. Topic and queue directories that are symbolic links are left
    out (rmqstore never follows one there); ``linked`` gets them."""
    queues: list[tuple[str, int]] = []
    if not root.is_dir():
        return queues
    # DirEntry kinds come with the listing (no stat per entry): a broker's store has
    # thousands of queue folders, and every command that looks at the queues lists them.
    # A folder gone since it was listed (a rebuild beside the reader moved it) is not there.
    topics = sorted(_listing(root), key=BY_NAME)
    for topic_entry in topics if topic is None else [t for t in topics if t.name == topic]:
        if topic_entry.is_symlink():
            if linked is not None:
                linked.append(Path(topic_entry.path))
            continue
        if not topic_entry.is_dir():
            continue
        for queue_entry in sorted(_listing(Path(topic_entry.path)), key=BY_NAME):
            queue_id = queue_id_of(queue_entry.name)
            if queue_id is None:
                continue
            if queue_entry.is_symlink():
                if linked is not None:
                    linked.append(Path(queue_entry.path))
            elif queue_entry.is_dir():
                queues.append((topic_entry.name, queue_id))
    return queues


def _listing(folder: Path) -> list[os.DirEntry[str]]:
    """The entries of ``folder``; none when it is not there (any more)."""
    try:
        return list(os.scandir(folder))
    except FileNotFoundError:
        return []


def linked_queue(root: Path, link: Path) -> tuple[str, int | None]:
    """What a link ``list_queues`` found under ``root`` stands for: (topic, None) for a
    topic folder that is a link, (topic, queue id) for a queue folder that is one."""
    if link.parent == root:
        return link.name, None
    return link.parent.name, queue_id_of(link.name)


def queue_id_of(name: str) -> int | None:
    """The queue id a queue folder's ``name`` gives a broker, None when it gives none. The
    broker parses the name as a Java int, then opens the folder of that number: a name that
    is not the number as Java writes it (``+2``, ``007``, ``1_0``, `` 1``, other scripts'
    digits) names no queue, and one outside an int's range is skipped at load."""
    if not name.isascii():
        return None
    try:
        number = int(name)
    except ValueError:
        return None
    return number if str(number) == name and number in JAVA_INT_RANGE else None
