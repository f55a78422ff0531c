"""The commit log (spec §2, §5, §10): one byte stream of records cut into fixed-size files.

Reading: stream records from any record offset across files, read one record, and find the
valid end exactly as a broker's recovery would. Writing: :class:`CommitLogAppender` appends
with the broker's roll rule, queue offsets and timestamps, and can roll back to a savepoint.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple
from zlib import crc32  # BODYCRC (checksum.body_crc) inlined on the hot path

from rmqstore import kernel
from rmqstore.checkpoint import Checkpoint
from rmqstore.checksum import (
    CRC32_PROPERTY_NAME,
    CRC32_RESERVED_LEN,
    crc_property_bytes,
    record_crc,
)
from rmqstore.delay import (
    SCHEDULE_TOPIC,
    DelayLevels,
    check_scheduled_delay,
    level_to_queue_id,
)
from rmqstore.errors import (
    InputError,
    MessageTooLargeError,
    NotFoundError,
    RecordError,
    RmqStoreError,
    StoreIOError,
    read_failure,
)
from rmqstore.hosts import HostAddress
from rmqstore.javavalues import parse_java_int
from rmqstore.kernel import layout
from rmqstore.kernel.layout import PHYSICAL_OFFSET, ROW_WIDTH, TOTAL_SIZE
from rmqstore.messagebatch import BatchUnsupported, MessageBatch
from rmqstore.msgid import UniqKeyGenerator
from rmqstore.multidispatch import (
    DISPATCH_MARK,
    INNER_MULTI_DISPATCH,
    INNER_MULTI_QUEUE_OFFSET,
    LMQ_PREFIX,
    copy_queues,
    gets_no_copies,
)
from rmqstore.properties import (
    DELAY,
    JAVA_REPLACE,
    MAX_PROPERTIES_BYTES,
    REAL_QID,
    REAL_TOPIC,
    UNIQ_KEY,
    encode_properties,
)
from rmqstore.record import (
    _HEADERS,
    _HOST_FLAGS,
    _SIZE_AND_MAGIC,
    BLANK_MIN_LENGTH,
    BORNHOST_V6_FLAG,
    H_STORE_TIMESTAMP,
    MAGIC_BLANK,
    MAGIC_V1,
    MAGIC_V2,
    QUEUED_TRANSACTIONS,
    TRANSACTION_MASK,
    TRANSACTION_PREPARED,
    TRANSACTION_ROLLBACK,
    BodyMode,
    Message,
    RecordHeader,
    RegionScan,
    ScanStop,
    decode_message,
    header_struct,
    host_flags,
)
from rmqstore.segments import (
    Segment,
    SegmentQueue,
    data_end_estimate,
    file_reader,
    is_segment_name,
    map_writable,
    nonzero_extent,
    open_for_writing,
    release_range,
    settled_data_end,
    sync_directory,
    sync_file_data,
)
from rmqstore.topics import MAX_TOPIC_LENGTH, check_topic
from rmqstore.windows import FileWindows, read_ahead
from rmqstore.wording import quoted

ScanItem = tuple[int, RecordHeader, str, bytes, "bool | None"]
_OPEN_FILES = 8
_LONGEST_HEADER = 112  # a header with two IPv6 hosts
_RESERVE_CHUNK = 16 * 1024 * 1024
_RELEASE_CHUNK = 32 * 1024 * 1024  # the appender drops written pages in steps of this
_MOST_BATCH_QUEUES = 4096  # topics x queue ids a batch keeps offsets for (else one by one)
_PAGE = mmap.PAGESIZE


@dataclass(frozen=True, slots=True)
class LogEnd:
    """Where the valid records of the log end, and why."""

    offset: int
    stop: ScanStop | None
    error: RecordError | None
    segment: Segment | None


class CommitLog:
    """Read access to ``commitlog/``: file list, record scans and single reads."""

    def __init__(self, directory: Path, file_size: int, *, strict: bool = True) -> None:
        self.directory = directory
        self.file_size = file_size
        self.queue = SegmentQueue.load(directory, file_size, strict=strict, kind="commit-log")
        self._files: OrderedDict[Path, int] = OrderedDict()  # open descriptors for pread

    @property
    def segments(self) -> list[Segment]:
        return self.queue.segments

    def data_extent(self) -> int:
        """Roughly where the log's data ends (a physical offset): the zeros a broker
        pre-allocates at the end of the last file are left out, by a binary search of about
        15 small reads. For sizing progress bars and work plans, never as the log's end."""
        segments = self.segments
        if not segments:
            return 0
        last = segments[-1]
        return last.start + data_end_estimate(file_reader(last.path), last.size)

    @property
    def min_offset(self) -> int:
        return self.queue.min_offset or 0

    def last_data_segment(self) -> Segment | None:
        """The last file whose first bytes are not zeros (later ones are pre-allocated)."""
        for segment in reversed(self.segments):
            if nonzero_extent(segment.path, 0, min(8, segment.size)) is not None:
                return segment
        return None

    def live_end(self) -> int:
        """For a reader of a store another process holds (a broker writing it): where the
        log's data ends now (a physical offset), in its last file holding data, returned
        :data:`WRITE_SETTLE` after it was found, when a record a writer had begun is whole.
        The records starting before it are the log as it stood; those after were written
        since."""
        segment = self.last_data_segment()
        if segment is None:
            return self.min_offset
        return segment.start + settled_data_end(segment.path, segment.size)

    def pread(self, segment: Segment, position: int, length: int) -> bytes:
        """``length`` bytes of ``segment`` from ``position`` (fewer at the end of the file). A
        few files are kept open for repeated reads; nothing is mapped, so a file truncated
        underneath gives an error naming it, never a SIGBUS."""
        length = max(0, min(length, segment.size - position))
        fd = self._files.get(segment.path)
        if fd is None:
            try:
                fd = os.open(segment.path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as exc:
                raise read_failure(segment.path, exc) from None
            self._files[segment.path] = fd
            while len(self._files) > _OPEN_FILES:
                os.close(self._files.popitem(last=False)[1])
        else:
            self._files.move_to_end(segment.path)
        try:
            data = os.pread(fd, length, position)
        except OSError as exc:
            raise StoreIOError(f"cannot read {segment.path}: {exc.strerror}") from None
        if len(data) < length:
            more = os.pread(fd, length - len(data), position + len(data)) if data else b""
            data += more
            if len(data) < length:
                raise StoreIOError(
                    f"{segment.path} ended at byte {position + len(data)} while it was read "
                    f"(it was {segment.size} bytes when listed): another process truncated it"
                )
        return data

    def forget_maps(self) -> None:
        while self._files:
            os.close(self._files.popitem()[1])

    close = forget_maps

    def scan_short_of(
        self, start: int, boundary: int, *, check_crc: bool = False, property_crc: bool = False
    ) -> LogScan | None:
        """Walk from ``start`` as a recovery walks (a failed CRC stops it when ``check_crc``)
        until it reaches the file starting at ``boundary`` or stops: None when it reached that
        file, else the finished scan (its ``end_offset`` and ``error`` say where and why it
        stopped; only the files before ``boundary`` are read)."""
        scan = self.scan(
            start,
            check_crc=check_crc,
            stop_on_crc_error=check_crc,
            property_crc=property_crc,
            check_delay=True,
        )
        batches = scan.batches()
        try:
            for _ in batches:
                if scan.segment is not None and scan.segment.start >= boundary:
                    return None
        finally:
            batches.close()  # type: ignore[attr-defined]
        return scan

    def scan(
        self,
        start_offset: int | None = None,
        *,
        check_crc: bool = False,
        stop_on_crc_error: bool = False,
        first_segment: Segment | None = None,
        crc_from: int = 0,
        property_crc: bool = False,
        check_delay: bool = False,
    ) -> LogScan:
        """Stream records from ``start_offset`` (default: the first file) across files.
        ``check_crc`` applies to files starting at or after ``crc_from`` (recovery checks only
        the files it walks), and so does ``check_delay`` (a SCHEDULE_TOPIC_XXXX record whose
        DELAY a broker cannot parse ends the scan, as it ends a recovery's walk)."""
        return LogScan(
            self,
            self.min_offset if start_offset is None else start_offset,
            check_crc,
            stop_on_crc_error,
            first_segment,
            crc_from,
            property_crc,
            check_delay,
        )

    def uniq_keys(self, start: int, end: int) -> dict[int, str | None]:
        """The UNIQ_KEY of each record starting in ``[start, end)`` (``start`` a record's
        start, ``end`` a record's end), None where a record has none: read back from the
        files with the record kernel (just those bytes), so it is the key a record holds
        whoever generated it."""
        keys: dict[int, str | None] = {}
        for segment in self.segments:
            low = max(start, segment.start)
            high = min(end, segment.start + self.file_size)
            if low >= high:
                continue
            buf = self.pread(segment, low - segment.start, high - low)
            for window, _, rows, batch in RegionScan(buf, 0, len(buf), low).batches():
                spans = layout.zeroed(2 * batch)
                kernel.field_spans(window, rows, 0, batch, layout.FIELD_UNIQ_KEY, spans)
                for row in range(batch):
                    at, size = spans[2 * row], spans[2 * row + 1]
                    keys[rows[row * ROW_WIDTH + PHYSICAL_OFFSET]] = (
                        None
                        if size == layout.SPAN_ABSENT
                        else bytes(window[at : at + size]).decode("utf-8", JAVA_REPLACE)
                    )
        return keys

    def result_lines(self, start: int, end: int, style: int) -> Iterator[tuple[bytes, int]]:
        """What ``append`` reports of each record starting in ``[start, end)`` (``start`` a
        record's start), as text lines in ``style`` (LINES_JSONL or LINES_PLAIN of
        :mod:`rmqstore.kernel.layout`), read back from the files: ``(lines, how many)`` a
        scan batch at a time. The compiled kernel writes the lines of plain ASCII text and
        leaves any other to the reference, so the text is the same either way."""
        for window, _, rows, count in self.scan(start).batches():
            wanted = count
            while wanted and rows[(wanted - 1) * ROW_WIDTH + PHYSICAL_OFFSET] >= end:
                wanted -= 1
            out = bytearray()
            kernel.write_lines("result_lines", window, rows, wanted, out, style)
            if wanted:
                yield bytes(out), wanted
            if wanted < count:
                return
            last = (count - 1) * ROW_WIDTH
            if count and rows[last + PHYSICAL_OFFSET] + rows[last + TOTAL_SIZE] >= end:
                return

    def first_record_store_timestamp(self, segment: Segment) -> int | None:
        """Store time of the first record of a file if it starts with a message, else None."""
        buf = self.pread(segment, 0, _LONGEST_HEADER)
        if len(buf) < 8:
            return None
        magic = _SIZE_AND_MAGIC.unpack_from(buf, 0)[1]
        if magic not in (MAGIC_V1, MAGIC_V2):
            return None
        sys_flag = int.from_bytes(buf[36:40], "big")
        header = header_struct(sys_flag)
        if len(buf) < header.size:
            return None
        return header.unpack_from(buf, 0)[H_STORE_TIMESTAMP]

    def recovery_start(self, checkpoint: Checkpoint | None, abnormal: bool) -> Segment | None:
        """The file a broker's recovery starts from (spec §10.2/10.3)."""
        segments = self.segments
        if not segments:
            return None
        if not abnormal:
            return segments[max(0, len(segments) - 3)]
        limit = (checkpoint or Checkpoint()).min_timestamp
        for segment in reversed(segments):
            stamp = self.first_record_store_timestamp(segment)
            if stamp and stamp <= limit:
                return segment
        return segments[0]

    def valid_end(
        self,
        *,
        check_crc: bool = True,
        abnormal: bool = False,
        checkpoint: Checkpoint | None = None,
        progress: Callable[[int], None] | None = None,
        property_crc: bool = False,
        start: Segment | None = None,
    ) -> LogEnd:
        """The end of the last valid record as a broker's recovery computes it: walk from the
        recovery start file (``start``, else the one ``abnormal`` and ``checkpoint`` pick),
        follow BLANKs, stop at the first invalid record (a bad body CRC counts when
        ``check_crc``, as with ``checkCRCOnRecover``; with ``property_crc`` as well, 5.x
        ``forceVerifyPropCRC``, a missing or wrong ``__CRC32#`` counts instead).

        Without ``start`` or ``abnormal``, the end once a broker's later normal starts cut
        no more: a normal recovery deletes the files after the end it finds, so the next
        one walks the last three files left, earlier ones, and ends the log at the first
        invalid record there; and so on (:meth:`normal_walk_start`)."""
        settle = start is None and not abnormal
        if start is None:
            start = self.recovery_start(checkpoint, abnormal)
        if start is None:
            return LogEnd(0, None, None, None)
        scan = self._recovery_walk(start, check_crc, property_crc)
        for _window, _window_start, rows, count in scan.batches(ahead=True):
            if progress is not None:
                progress(rows[(count - 1) * ROW_WIDTH + PHYSICAL_OFFSET])
        end = LogEnd(scan.end_offset, scan.stop, scan.error, scan.segment)
        walked_from = start.start
        while settle:
            earlier = self.normal_walk_start(end.offset, walked_from)
            if earlier == walked_from:
                break
            short = self.scan_short_of(
                earlier, walked_from, check_crc=check_crc, property_crc=property_crc
            )
            walked_from = earlier
            if short is not None:
                end = LogEnd(short.end_offset, short.stop, short.error, short.segment)
        return end

    def ends_after(
        self,
        offset: int,
        *,
        check_crc: bool = True,
        abnormal: bool = False,
        checkpoint: Checkpoint | None = None,
        property_crc: bool = False,
    ) -> bool:
        """Whether :meth:`valid_end` (same rules) ends after ``offset``, found by walking only
        up to it, when that settles it: True once the walk has gone past ``offset`` (a valid
        record starts at or after it); False when the walk stops first (ask :meth:`valid_end`).
        A read of one record near a large file's start then reads the file up to that record,
        not to the log's end.

        Under a crash's rules the walk is the recovery's own, and no later walk moves its end
        back. Under a normal's, it starts at the third-last of the files up to ``offset``'s
        (the recovery's start when that is the last file): every walk a broker's normal starts
        make while the end lies past ``offset`` starts at or after that file
        (:meth:`normal_walk_start`); one starting after ``offset``'s file ends after it, and
        one starting at or before it passes ``offset`` as this one did, since a walk's course
        through a file does not depend on where it began (it enters each at its start). So
        the offset need not be in the last file: a broker's empty pre-made file may follow
        the last one holding data, or later files hold more."""
        segments = self.segments
        if abnormal:
            start = self.recovery_start(checkpoint, abnormal)
        else:
            upto = [segment for segment in segments if segment.start <= offset]
            start = upto[max(0, len(upto) - 3)] if upto else None
        if start is None or start.start > offset:
            return False
        batches = self._recovery_walk(start, check_crc, property_crc).batches()
        try:
            for _window, _window_start, rows, count in batches:
                if count and rows[(count - 1) * ROW_WIDTH + PHYSICAL_OFFSET] >= offset:
                    return True
        finally:
            batches.close()  # type: ignore[attr-defined]
        return False

    def _recovery_walk(self, start: Segment, check_crc: bool, property_crc: bool) -> LogScan:
        """A scan from ``start`` as a recovery walks: a failed CRC stops it when checked, a
        DELAY a broker cannot parse always (spec §2.7)."""
        return self.scan(
            start.start,
            check_crc=check_crc,
            stop_on_crc_error=check_crc,
            first_segment=start,
            property_crc=property_crc,
            check_delay=True,
        )

    def normal_walk_start(self, end_offset: int, walked_from: int) -> int:
        """Where the walks of a broker's normal recoveries start, the first having started
        at ``walked_from`` and ended the log at ``end_offset``: the third-last of the files
        a recovery ending there keeps (those starting at or before it), when that is an
        earlier file than ``walked_from``."""
        kept = [segment for segment in self.segments if segment.start <= end_offset]
        if not kept:
            return walked_from
        return min(walked_from, kept[max(0, len(kept) - 3)].start)

    def unit_store_time(self, offset: int, size: int) -> int:
        """The store time of the record a consume-queue unit (``offset``, ``size``) points
        at; 0 when no whole record of that size starts there (a crash's torn tail keeps a
        time in its header that no message has; a removed file has none; its body CRC is not
        checked: a bad body is still a message stored at its time)."""
        segments = self.segments
        end = segments[-1].start + segments[-1].size if segments else 0
        stored = max(0, self.store_timestamp_at(offset, size, end))
        if not stored:
            return 0
        try:
            whole = self.read(offset, body=BodyMode.SKIP).store_size == size
        except RmqStoreError:
            return 0
        return stored if whole else 0

    def store_timestamp_at(self, offset: int, size: int, end: int) -> int:
        """``pickupStoreTimestamp``: the store time of the record at ``offset``, or -1 when
        ``[offset, offset + size)`` is not inside ``[min offset, end)``."""
        if offset < self.min_offset or offset + size > end:
            return -1
        segment = self.queue.find(offset)
        if segment is None:
            return -1
        buf = self.pread(segment, offset - segment.start, 76)
        if len(buf) < 64:
            return -1
        sys_flag = int.from_bytes(buf[36:40], "big")
        at = 48 + (20 if sys_flag & BORNHOST_V6_FLAG else 8)
        if at + 8 > len(buf):
            return -1
        return int.from_bytes(buf[at : at + 8], "big", signed=True)

    def read(
        self, offset: int, *, body: BodyMode = BodyMode.READ, verify_property_crc: bool = False
    ) -> Message:
        """The message record starting at ``offset``."""
        segment = self.queue.find(offset)
        if segment is None:
            raise NotFoundError(f"offset {offset} is outside the commit log files")
        position = offset - segment.start
        buf = self.pread(segment, position, 8)
        if len(buf) == 8:
            total, magic = _SIZE_AND_MAGIC.unpack_from(buf)
            remaining = segment.size - position
            # only a message's bytes are read: a BLANK or bad magic fails on these 8
            if magic in (MAGIC_V1, MAGIC_V2) and total > 8:
                if total > remaining:
                    raise RecordError(
                        "TOTALSIZE",
                        offset,
                        f"{total} runs past the end of the data ({remaining} bytes remain)",
                    )
                buf += self.pread(segment, position + 8, total - 8)
        return decode_message(
            buf,
            0,
            physical_offset=offset,
            body=body,
            verify_property_crc=verify_property_crc,
        )


class RecordHolder(NamedTuple):
    """Whose record starts at an offset: its topic, queue and queue offset, its properties
    (undecoded: most lookups do not need them) and its size."""

    topic: str
    queue_id: int
    queue_offset: int
    properties_bytes: bytes
    store_size: int


_LOOKUP_WINDOW = 1 << 20


class RecordLookup:
    """The records at many offsets of a commit log, mostly ascending (the units of a
    queue): a window of the log is read once and each record in it taken from there by the
    record kernel, instead of two reads and a full decode per record. Anything the window
    does not hold as one whole, valid record goes through :meth:`CommitLog.read`, so the
    answer (or the error raised) is the one a single read gives."""

    def __init__(self, log: CommitLog, window: int = _LOOKUP_WINDOW) -> None:
        self.log = log
        self.window = window
        self.buf = b""
        self.start = 0  # the physical offset of the window's first byte
        self.rows = layout.new_rows(1)

    def holder(self, offset: int) -> RecordHolder:
        position = offset - self.start
        buf = self.buf
        if not 0 <= position <= len(buf) - 8:
            self._load(offset)
            buf, position = self.buf, 0
        total = _SIZE_AND_MAGIC.unpack_from(buf, position)[0] if len(buf) >= 8 else 0
        if position and position + total > len(buf) and total <= self.window:
            self._load(offset)  # the record runs past the window: a window from it
            buf, position = self.buf, 0
        rows = self.rows
        if 8 < total <= len(buf) - position:
            count = kernel.scan(buf, position, position + total, self.start, 0, 0, rows)[0]
            if count == 1:
                topic_at = rows[layout.TOPIC_AT]
                properties_at = rows[layout.PROPERTIES_AT]
                return RecordHolder(
                    bytes(buf[topic_at : topic_at + rows[layout.TOPIC_LENGTH]]).decode("utf-8"),
                    rows[layout.QUEUE_ID],
                    rows[layout.QUEUE_OFFSET],
                    bytes(buf[properties_at : properties_at + rows[layout.PROPERTIES_LENGTH]]),
                    total,
                )
        message = self.log.read(offset, body=BodyMode.SKIP)  # raises what is wrong
        return RecordHolder(
            message.topic,
            message.queue_id,
            message.queue_offset,
            message.properties_bytes,
            message.store_size,
        )

    def _load(self, offset: int) -> None:
        segment = self.log.queue.find(offset)
        if segment is None:
            self.buf, self.start = b"", offset
            return
        self.buf = self.log.pread(segment, offset - segment.start, self.window)
        self.start = offset


class LogScan:
    """Iterates a commit log from an offset; see :class:`rmqstore.record.RegionScan` for items.

    After iteration: ``end_offset`` (end of the last valid record, or a BLANK's position when
    the BLANK is in the last file), ``stop``, ``error`` and ``segment`` (where it ended);
    ``gaps``: the ``(start, end)`` offsets of missing files it went on past (from a file's
    BLANK to the next file there is, as a broker's own walk of its files does).
    """

    def __init__(
        self,
        log: CommitLog,
        start_offset: int,
        check_crc: bool,
        stop_on_crc_error: bool,
        first_segment: Segment | None,
        crc_from: int = 0,
        property_crc: bool = False,
        check_delay: bool = False,
    ) -> None:
        self.log = log
        self.property_crc = property_crc
        self.check_delay = check_delay
        self.start_offset = start_offset
        self.check_crc = check_crc
        self.crc_from = crc_from
        self.stop_on_crc_error = stop_on_crc_error
        self.end_offset = start_offset
        self.stop: ScanStop | None = None
        self.error: RecordError | None = None
        self.segment = first_segment
        self.crc_failures = 0
        self.gaps: list[tuple[int, int]] = []

    def __iter__(self) -> Iterator[ScanItem]:
        return self._walk(iter)

    def batches(self, *, ahead: bool = False) -> Iterator[tuple[Any, int, Any, int]]:
        """The scan as the kernel's row batches: ``(window, window_start, rows, count)`` as
        :meth:`RegionScan.batches` gives them, ``window_start`` a position in the file whose
        first byte is at physical offset ``rows``' PHYSICAL_OFFSET minus the row's position
        (:attr:`segment` during a walk that does not read ahead). With ``ahead``, a thread
        reads and scans the next batches while the caller works on this one (the windows and
        rows are then the caller's to keep); the scan's outcome is set once the batches end."""
        if not ahead:
            return self._walk(RegionScan.batches)
        return read_ahead(self._walk(_copied_batches, fresh_windows=True))

    def _walk(
        self, items_of: Callable[[RegionScan], Iterator[Any]], *, fresh_windows: bool = False
    ) -> Iterator[Any]:
        log = self.log
        segments = log.segments
        segment = self.segment or log.queue.find(self.start_offset)
        if segment is None:
            self.stop = ScanStop.END
            return
        index = segments.index(segment)
        position = self.start_offset - segment.start
        while True:
            self.segment = segment
            with FileWindows(segment.path, log.file_size, fresh=fresh_windows) as windows:
                region = RegionScan(
                    None,
                    position,
                    windows.limit,
                    segment.start,
                    self.check_crc and segment.start >= self.crc_from,
                    stop_on_crc_error=self.stop_on_crc_error,
                    property_crc=self.property_crc,
                    check_delay=self.check_delay and segment.start >= self.crc_from,
                    windows=windows,
                )
                items = items_of(region)
                try:
                    yield from items
                finally:
                    items.close()  # type: ignore[attr-defined]
                    self.crc_failures += region.crc_failures
            self.end_offset = segment.start + region.end_position
            self.stop, self.error = region.stop, region.error
            if region.stop is not ScanStop.BLANK or index + 1 >= len(segments):
                return
            index += 1
            following = segments[index]
            if following.start > segment.start + log.file_size:
                self.gaps.append((segment.start + log.file_size, following.start))
            segment = following
            position = 0


def _copied_batches(region: RegionScan) -> Iterator[tuple[Any, int, Any, int]]:
    """:meth:`RegionScan.batches` with each batch's rows copied (the scan reuses its own)."""
    for window, window_start, rows, count in region.batches():
        yield window, window_start, rows[: count * ROW_WIDTH], count


def _file_names(directory: Path) -> list[str]:
    """The names in ``directory`` (none when it is not there yet: a store being made)."""
    try:
        return os.listdir(directory)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise StoreIOError(f"cannot list {directory}: {exc.strerror}") from None


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError as exc:
        raise StoreIOError(f"cannot remove {path}: {exc.strerror}") from None


_FIELD_TYPES = (  # Message attribute, RocketMQ's name, bits of its (signed) Java type
    ("queue_id", "queueId", 32),
    ("flag", "flag", 32),
    ("sys_flag", "sysFlag", 32),
    ("born_timestamp", "bornTimestamp", 64),
    ("reconsume_times", "reconsumeTimes", 32),
    ("prepared_transaction_offset", "preparedTransactionOffset", 64),
)


def _field_problem(message: Message) -> str:
    """Which of ``message``'s numbers does not fit its field of the record."""
    for attribute, name, bits in _FIELD_TYPES:
        value = getattr(message, attribute)
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{name} must be an integer, not {quoted(value)}"
        if not -(1 << (bits - 1)) <= value < 1 << (bits - 1):
            return f"{name} {value} does not fit a {bits}-bit field of the record"
    return "a field of the message does not fit the record"


class AppendResult(NamedTuple):
    """What the store returned for one put. A tuple, so the append loop builds one with
    ``tuple.__new__`` (half the cost of a class instance)."""

    physical_offset: int
    queue_offset: int
    store_size: int
    store_timestamp: int
    topic: str
    queue_id: int
    store_host_field: bytes

    @property
    def msg_id(self) -> str:
        """The offset message id: store host field and physical offset, in hex."""
        return (self.store_host_field + self.physical_offset.to_bytes(8, "big")).hex().upper()

    def to_dict(self) -> dict[str, object]:
        return {
            "msgId": self.msg_id,
            "topic": self.topic,
            "queueId": self.queue_id,
            "commitLogOffset": self.physical_offset,
            "queueOffset": self.queue_offset,
            "storeSize": self.store_size,
            "storeTimestamp": self.store_timestamp,
        }


@dataclass(frozen=True, slots=True)
class Savepoint:
    offset: int
    segment_count: int
    queue_offsets: dict[tuple[str, int], int]
    last_store_timestamp: int
    appended: int


class BatchResults:
    """What the store returned for each message of a batch, as columns (``out``: RESULT_WIDTH
    integers a message); :meth:`results` gives them as :class:`AppendResult` tuples."""

    def __init__(self, batch: MessageBatch, out: array, store_host_field: bytes) -> None:
        self.batch = batch
        self.out = out
        self.store_host_field = store_host_field

    def __len__(self) -> int:
        return self.batch.count

    def results(self) -> list[AppendResult]:
        batch, out, width = self.batch, self.out, layout.RESULT_WIDTH
        rows, row_width = batch.rows, layout.PACK_WIDTH
        return [
            AppendResult(
                out[n * width + layout.RESULT_PHYSICAL_OFFSET],
                out[n * width + layout.RESULT_QUEUE_OFFSET],
                out[n * width + layout.RESULT_SIZE],
                out[n * width + layout.RESULT_STORE_TIMESTAMP],
                batch.topics[rows[n * row_width + layout.PACK_TOPIC]],
                rows[n * row_width + layout.PACK_QUEUE_ID],
                self.store_host_field,
            )
            for n in range(batch.count)
        ]


class CommitLogAppender:
    """Appends records the way ``CommitLog.DefaultAppendMessageCallback`` does.

    The caller holds the store lock. ``end`` is the valid end found at open; files after it
    must be all zeros (pre-allocated) and are reused. Writes go through a shared writable map
    whose disk blocks are reserved ahead with ``posix_fallocate``, so a full disk is an error
    before a byte is written rather than a SIGBUS.

    With ``transient`` (the broker's transientStorePoolEnable) records are staged instead in
    an anonymous page-aligned buffer the size of a file and written to the file with
    ``pwrite`` by :meth:`commit` (a full disk is then a write error): what is staged and not
    committed is not in the file, so a crash loses it, as a broker's does. ``preallocate``
    (warmMapedFileEnable) allocates every block of a new file when it is created.

    ``multi_dispatch`` (the broker's enableMultiDispatch): a queued message naming further
    queues in ``INNER_MULTI_DISPATCH`` gets the next offset of each in
    ``INNER_MULTI_QUEUE_OFFSET`` (replacing one it carries), and each of those queues moves
    on, as the broker's ``MultiDispatch`` does (spec §6.8); not for the topics a 5.x broker
    gives no copies (:func:`rmqstore.multidispatch.gets_no_copies`: ``%RETRY%`` and
    ``rmq_sys_`` topics; a DELAY message waiting in SCHEDULE_TOPIC_XXXX, whose copies
    belong to its delivery), but for them too without ``trailing_separator`` (nor the CRC
    property), which writes records as a 4.9 broker does, and a 4.9 broker gives every topic
    copies (:func:`rmqstore.multidispatch.written_by_49`).
    """

    def __init__(
        self,
        log: CommitLog,
        end_offset: int,
        queue_offsets: dict[tuple[str, int], int],
        *,
        store_host: HostAddress,
        max_message_size: int,
        delay_levels: DelayLevels,
        append_crc_property: bool = False,
        allow_v2: bool = True,
        clock: Callable[[], int] | None = None,
        uniq_keys: UniqKeyGenerator | None = None,
        last_store_timestamp: int = 0,
        trailing_separator: bool = True,
        transient: bool = False,
        preallocate: bool = False,
        refused_topics: Mapping[str, str] | None = None,
        multi_dispatch: bool = False,
    ) -> None:
        self.log = log
        self.multi_dispatch = multi_dispatch
        # the further queues and offsets prepare() gave the last message (multi_dispatch)
        self._copies_prepared: list[tuple[tuple[str, int], int]] | None = None
        self._copy_queues: set[tuple[str, int]] = set()  # LMQ queues copies moved on
        self.refused_topics = refused_topics or {}  # topic -> why its messages are refused
        self.transient = transient
        self.preallocate = preallocate
        self._committed = 0  # transient: the staged bytes below this are in the file
        self._flushed_offset = end_offset  # the physical offset up to which all is flushed
        # why a flush failed (fdatasync or msync): set, no later flush is trusted (see flush)
        self.flush_failure: str | None = None
        self.file_size = log.file_size
        self.queue_offsets = queue_offsets
        self._queue_offsets_at_start = dict(queue_offsets)
        self._delayed_queues: dict[str, int] = {}  # real topic -> queues, of DELAY messages
        self.store_host = store_host
        self._store_host_field = store_host.to_field()
        self.max_message_size = max_message_size
        self.delay_levels = delay_levels
        self.append_crc_property = append_crc_property
        self.trailing_separator = trailing_separator  # False: 4.9.x drops the final 0x02
        self._crc_reserve = CRC32_RESERVED_LEN if append_crc_property else 0
        self.allow_v2 = allow_v2
        self.clock = clock  # None: the wall clock in epoch milliseconds
        # the same clock's next readings at once, for batches (a fixture's ticking clock)
        self.clock_many: Callable[[int], array] | None = None
        self._now_ns = time.time_ns
        self.uniq_keys = uniq_keys
        self.last_store_timestamp = last_store_timestamp
        self.appended = 0
        self._last_properties: dict[str, str] | None = None  # a copy, compared by value
        self._last_properties_bytes = b""
        self._topic_fields: dict[str, tuple[bytes, int]] = {}  # topic -> (field, magic)
        # born host -> (field bytes, V6 sysFlag bits, header struct, header size)
        self._host_fields: dict[HostAddress, tuple[bytes, int, Any, int]] = {}
        self._record_structs: dict[tuple[Any, int, int, int], struct.Struct] = {}
        self._dirty_from = -1  # lowest unflushed position in the current file; -1 = clean
        self._dirty_files: set[Path] = set()  # earlier files with unflushed writes
        self._high_water: dict[Path, int] = {}  # how far this session wrote in rolled files
        self._segment: Segment | None = None
        self._segment_start = 0
        self._map: mmap.mmap | None = None
        self._position = 0
        self._reserved = 0
        self._released = 0
        self._created: list[Segment] = []
        # the commit-log files there before this session: any other is one it made
        self._files_at_start = frozenset(_file_names(log.directory))
        self._open_at(end_offset)

    # -- positions -------------------------------------------------------------------------

    @property
    def space_left(self) -> int:
        """Bytes left in the current file (a record of L bytes fits when L + 8 <= this)."""
        return self.file_size - self._position

    @property
    def end_offset(self) -> int:
        """Physical offset where the next record goes (the log's max offset)."""
        if self._segment is None:
            return self.log.min_offset
        return self._segment.start + self._position

    def _open_at(self, offset: int) -> None:
        segment = self.log.queue.find(offset)
        if segment is None:
            start = offset - offset % self.file_size
            if self.log.segments and start != self.log.segments[-1].start + self.file_size:
                raise InputError(
                    f"cannot append at {offset}: it does not follow the last commit-log file"
                )
            segment = self._create(start)
        self._switch_to(segment, offset - segment.start)

    def _create(self, start: int) -> Segment:
        segment = self.log.queue.create(start)
        self._created.append(segment)
        if self.preallocate:  # warmMapedFileEnable: every block of the file, now
            try:
                fd = open_for_writing(segment.path)
                try:
                    os.posix_fallocate(fd, 0, self.file_size)
                finally:
                    os.close(fd)
            except OSError as exc:
                raise StoreIOError(f"cannot allocate {segment.path}: {exc.strerror}") from None
        return segment

    def _switch_to(self, segment: Segment, position: int) -> None:
        self._release_map()
        self._dirty_from = -1
        self.log.forget_maps()
        self._segment = segment
        self._segment_start = segment.start
        self._position = position
        if self.transient:
            # staging for this file's new bytes: zero pages, allocated as they are written;
            # nothing to reserve, commits write the file with pwrite
            self._map = mmap.mmap(-1, self.file_size)
            self._reserved = self.file_size
            self._committed = position
        else:
            self._map = map_writable(segment.path)
            self._reserved = position
        self._released = position - position % _PAGE  # pages below are out of this process

    def _release_map(self) -> None:
        mapped, self._map = self._map, None  # let go of before it is closed (a signal between)
        if mapped is not None:
            mapped.close()

    def _reserve(self, end: int) -> None:
        """Allocate disk blocks up to ``end`` of the current file before writing there."""
        target = min(self.file_size, max(end, self._reserved + _RESERVE_CHUNK))
        assert self._segment is not None
        try:
            fd = open_for_writing(self._segment.path)
            try:
                os.posix_fallocate(fd, self._reserved, target - self._reserved)
            finally:
                os.close(fd)
        except OSError as exc:
            raise StoreIOError(
                f"cannot reserve space in {self._segment.path}: {exc.strerror}"
            ) from None
        self._reserved = target

    def _roll(self) -> None:
        """Fill the rest of the file with a BLANK and continue in the next file."""
        assert self._segment is not None and self._map is not None
        remaining = self.file_size - self._position
        if self._position + BLANK_MIN_LENGTH > self._reserved:
            self._reserve(self._position + BLANK_MIN_LENGTH)
        _SIZE_AND_MAGIC.pack_into(self._map, self._position, remaining, MAGIC_BLANK)
        if self.transient:
            self._commit_to(self._position + BLANK_MIN_LENGTH)
        self._dirty_files.add(self._segment.path)
        self._dirty_from = -1
        self._high_water[self._segment.path] = self._position + BLANK_MIN_LENGTH
        next_start = self._segment.start + self.file_size
        segment = self.log.queue.find(next_start) or self._create(next_start)
        self._switch_to(segment, 0)

    # -- appending ---------------------------------------------------------------------------

    def prepare(self, message: Message, now_millis: int | None = None) -> tuple[Message, bytes]:
        """Validate a message and apply the broker's rewrites (DELAY to SCHEDULE_TOPIC_XXXX,
        a generated UNIQ_KEY); returns it with its encoded properties. Raises before anything
        is written."""
        if message.topic not in self._topic_fields:
            self._learn_topic(message.topic)
        body = message.body
        if body is not None and len(body) > self.max_message_size:
            raise MessageTooLargeError(
                f"message body is {len(body)} bytes; maxMessageSize is {self.max_message_size}"
            )
        properties = message.properties
        check_scheduled_delay(message.topic, properties)
        if DELAY in properties and message.sys_flag & TRANSACTION_MASK in QUEUED_TRANSACTIONS:
            message, properties = self._schedule(message, properties)
            if message.topic not in self._topic_fields:
                self._learn_topic(message.topic)
        if self.append_crc_property and CRC32_PROPERTY_NAME in properties:
            properties = {k: v for k, v in properties.items() if k != CRC32_PROPERTY_NAME}
        if self.multi_dispatch:
            properties = self._with_copy_offsets(message, properties)
        if properties == self._last_properties:  # producers repeat tags/keys: reuse bytes
            props = self._last_properties_bytes
        else:
            props = encode_properties(properties, trailing_separator=self.trailing_separator)
            self._last_properties = dict(properties)
            self._last_properties_bytes = props
        if self.uniq_keys is not None and UNIQ_KEY not in properties:
            key = self.uniq_keys.next_key_ascii(now_millis)
            if self.trailing_separator:
                props = b"".join((props, b"UNIQ_KEY\x01", key, b"\x02"))
            else:
                props = b"".join((props, b"\x02UNIQ_KEY\x01" if props else b"UNIQ_KEY\x01", key))
        if self.append_crc_property and props and not props.endswith(b"\x02"):
            props += b"\x02"
        if len(props) + self._crc_reserve > MAX_PROPERTIES_BYTES:
            raise InputError(
                f"properties are {len(props) + self._crc_reserve} bytes; at most "
                f"{MAX_PROPERTIES_BYTES}"
            )
        return message, props

    def _with_copy_offsets(self, message: Message, properties: dict[str, str]) -> dict[str, str]:
        """``properties`` with the offsets the message's further queues give it (remembered
        for the append that follows), or as they are when it has none."""
        self._copies_prepared = None
        queues = properties.get(INNER_MULTI_DISPATCH)
        topic = message.topic
        as_49 = not (self.trailing_separator or self.append_crc_property)  # its record's end
        if (
            not queues
            or (gets_no_copies(topic) and not as_49)
            or message.sys_flag & TRANSACTION_MASK not in QUEUED_TRANSACTIONS
        ):
            return properties
        offsets = [
            (key, self.queue_offsets.get(key, 0))
            for key in copy_queues(topic, message.queue_id, queues)
        ]
        self._copies_prepared = offsets
        text = ",".join(str(offset) for _, offset in offsets)
        return {**properties, INNER_MULTI_QUEUE_OFFSET: text}

    def record_size(self, message: Message) -> int:
        """The size the record of ``message`` will have once appended."""
        prepared, props = self.prepare(message)
        topic_field, _ = self._topic_fields[prepared.topic]
        header = _HEADERS[host_flags(prepared.born_host, self.store_host) >> 4]
        return (
            header.size
            + len(prepared.body or b"")
            + len(topic_field)
            + 2
            + len(props)
            + self._crc_reserve
        )

    def _learn_topic(self, topic: str) -> None:
        """Check a topic once and remember its encoded TOPICLENGTH+TOPIC field and magic."""
        check_topic(topic, allow_v2=self.allow_v2)
        if topic in self.refused_topics:
            raise InputError(self.refused_topics[topic])
        encoded = topic.encode("utf-8")
        if len(topic) > MAX_TOPIC_LENGTH:  # 5.x writes V2 for topics over 127 chars
            self._topic_fields[topic] = (len(encoded).to_bytes(2, "big") + encoded, MAGIC_V2)
        else:
            self._topic_fields[topic] = (bytes([len(encoded)]) + encoded, MAGIC_V1)

    def _schedule(
        self, message: Message, properties: dict[str, str]
    ) -> tuple[Message, dict[str, str]]:
        """Store a delayed message in SCHEDULE_TOPIC_XXXX, queue level-1 (spec §2.11)."""
        try:
            level = parse_java_int(properties[DELAY])
        except ValueError:
            raise InputError(f"DELAY={quoted(properties[DELAY])} is not a delay level") from None
        if level <= 0:
            return message, properties
        level = self.delay_levels.clamp(level)
        rewritten = {
            **properties,
            DELAY: str(level),
            REAL_TOPIC: message.topic,
            REAL_QID: str(message.queue_id),
        }
        scheduled = replace(message, topic=SCHEDULE_TOPIC, queue_id=level_to_queue_id(level))
        known = self._delayed_queues.get(message.topic, 0)
        self._delayed_queues[message.topic] = max(known, message.queue_id + 1)
        return scheduled, rewritten

    def append(self, message: Message) -> AppendResult:
        """Append one message."""
        return self.append_many((message,))[0]

    def append_many(self, messages: Iterable[Message]) -> list[AppendResult]:
        """Append messages in order and return what the store returned for each. Each message
        is validated (:meth:`prepare`) just before it is written; on an error the messages
        before it stay appended (use :meth:`savepoint`/:meth:`rollback` for all-or-nothing).
        One loop with everything in locals: this is the hot path of every writer."""
        results: list[AppendResult] = []
        add_result = results.append
        new_result = tuple.__new__
        prepare = self.prepare
        topic_fields = self._topic_fields
        host_fields = self._host_fields
        queue_offsets = self.queue_offsets
        file_size = self.file_size
        crc_reserve = self._crc_reserve
        store_host_field = self._store_host_field
        clock = self.clock
        now_ns = self._now_ns
        not_queued = (TRANSACTION_PREPARED, TRANSACTION_ROLLBACK)
        record_structs = self._record_structs
        multi_dispatch = self.multi_dispatch
        last_born: HostAddress | None = None
        host: tuple[bytes, int, Any, int] = (b"", 0, None, 0)
        # the write state lives in locals and goes back to the appender in `finally`
        position = self._position
        reserved = self._reserved
        segment_start = self._segment_start
        buf = self._map
        dirty_from = self._dirty_from
        last_stamp = self.last_store_timestamp
        appended = self.appended
        try:
            for message in messages:
                now = now_ns() // 1_000_000 if clock is None else clock()
                message, props = prepare(message, now)
                copies = self._copies_prepared if multi_dispatch else None
                topic = message.topic
                topic_field, magic = topic_fields[topic]
                body = message.body or b""
                body_length = len(body)
                if message.born_host is not last_born:  # same object: skip hashing it again
                    last_born = message.born_host
                    host = host_fields.get(last_born) or self._learn_born_host(last_born)
                born_field, flags, header, header_size = host
                sys_flag = (message.sys_flag & ~_HOST_FLAGS) | flags
                props_length = len(props) + crc_reserve
                total = header_size + body_length + len(topic_field) + 2 + props_length
                if position + total + BLANK_MIN_LENGTH > file_size:
                    if total + BLANK_MIN_LENGTH > file_size:
                        raise MessageTooLargeError(
                            f"a {total}-byte record cannot fit in a commit-log file of "
                            f"{file_size} bytes"
                        )
                    self._position = position
                    self._roll()
                    position, reserved, dirty_from = 0, self._reserved, -1
                    segment_start, buf = self._segment_start, self._map
                if position + total > reserved:
                    self._reserve(position + total)
                    reserved = self._reserved
                queue_id = message.queue_id
                if sys_flag & TRANSACTION_MASK in not_queued:
                    queue_offset = 0
                else:
                    queue_key = (topic, queue_id)
                    queue_offset = queue_offsets.get(queue_key, 0)
                    queue_offsets[queue_key] = queue_offset + 1
                if now > last_stamp:  # the store time never decreases
                    last_stamp = now
                physical_offset = segment_start + position
                if dirty_from < 0:
                    self._dirty_from = dirty_from = position
                shape = (header, body_length, len(topic_field), len(props))
                record = record_structs.get(shape) or self._record_struct(shape)
                try:
                    record.pack_into(
                        buf, position, total, magic, crc32(body) & 0x7FFFFFFF, queue_id,
                        message.flag, queue_offset, physical_offset, sys_flag,
                        message.born_timestamp, born_field, last_stamp, store_host_field,
                        message.reconsume_times, message.prepared_transaction_offset,
                        body_length, body, topic_field, props_length, props,
                    )  # fmt: skip
                except (struct.error, OverflowError, TypeError):
                    # a field outside its Java type: the fields packed before it are undone,
                    # and so is the queue offset taken, so the log ends where it did
                    buf[position : position + total] = bytes(total)
                    if sys_flag & TRANSACTION_MASK not in not_queued:
                        if queue_offset:
                            queue_offsets[(topic, queue_id)] = queue_offset
                        else:
                            queue_offsets.pop((topic, queue_id), None)
                    raise InputError(_field_problem(message)) from None
                if crc_reserve:
                    self._write_crc_property(position, total)
                if copies:  # the further queues move on past the offsets given
                    for key, copy_offset in copies:
                        queue_offsets[key] = copy_offset + 1
                        if key[0].startswith(LMQ_PREFIX):
                            self._copy_queues.add(key)
                position += total
                appended += 1
                add_result(new_result(AppendResult, (physical_offset, queue_offset, total,
                                      last_stamp, topic, queue_id, store_host_field)))  # fmt: skip
        finally:
            self._position = position
            self.last_store_timestamp = last_stamp
            self.appended = appended
        if self._position - self._released >= _RELEASE_CHUNK:
            self._release_written()
        return results

    def append_batch(self, batch: MessageBatch) -> BatchResults:
        """Append a batch of messages in columns (:mod:`rmqstore.messagebatch`): the record
        kernel packs them, with the rules and bytes of :meth:`append_many` (which the tests
        hold it to). Validates the whole batch before the first byte; on an error after some
        records are written (a full disk), those stay appended, as with ``append_many``. Not
        for the ``__CRC32#`` property (``append_many`` writes it)."""
        if self.append_crc_property:
            raise BatchUnsupported("the __CRC32# property is written one record at a time")
        if self.multi_dispatch and DISPATCH_MARK in batch.props:
            raise BatchUnsupported("further queues' offsets are given one record at a time")
        if batch.trailing_separator != self.trailing_separator:
            raise ValueError("the batch's properties were encoded for another broker version")
        count = batch.count
        for topic in batch.topics:
            if topic not in self._topic_fields:
                self._learn_topic(topic)
        if batch.longest_body > self.max_message_size:
            raise MessageTooLargeError(
                f"message body is {batch.longest_body} bytes; maxMessageSize is "
                f"{self.max_message_size}"
            )
        key_length = self.uniq_keys.key_length if self.uniq_keys else 0
        if batch.longest_props + (key_length + 10 if key_length else 0) > MAX_PROPERTIES_BYTES:
            raise InputError(f"properties are longer than {MAX_PROPERTIES_BYTES} bytes")
        span = batch.queue_span
        if span * len(batch.topics) > _MOST_BATCH_QUEUES:
            raise BatchUnsupported("queue ids this high go one message at a time")
        topic_fields = bytearray()
        topic_rows = array("q")
        for topic in batch.topics:
            field, magic = self._topic_fields[topic]
            topic_rows.extend((len(topic_fields), len(field), magic))
            topic_fields += field
        host_fields = bytearray()
        host_rows = array("q")
        for host in batch.hosts:
            field = host.to_field()
            host_rows.extend((len(host_fields), len(field)))
            host_fields += field
        slots = layout.zeroed(span * len(batch.topics))
        for number, topic in enumerate(batch.topics):
            for queue_id in range(span):
                slots[number * span + queue_id] = self.queue_offsets.get((topic, queue_id), 0)
        before = array("q", slots)
        rows = batch.rows
        rows[layout.PACK_NOW :: layout.PACK_WIDTH] = self._clock_readings(count)
        if self.uniq_keys is None:
            rows[layout.PACK_UNIQ_KEY :: layout.PACK_WIDTH] = layout.zeroed(count)
        state = layout.zeroed(layout.KEY_STATE_WIDTH)
        prefix = b""
        if self.uniq_keys is not None and count:
            prefix, counter, month, following = self.uniq_keys.batch_state(rows[layout.PACK_NOW])
            state[layout.KEY_COUNTER] = counter
            state[layout.KEY_MONTH_START], state[layout.KEY_NEXT_MONTH] = month, following
        state[layout.KEY_LAST_STAMP] = self.last_store_timestamp
        state[layout.KEY_TRAILING_SEPARATOR] = 1 if self.trailing_separator else 0
        state[layout.KEY_QUEUE_SPAN] = span
        out = layout.zeroed(layout.RESULT_WIDTH * count)
        first = 0
        try:
            while first < count:
                if self._dirty_from < 0:
                    self._dirty_from = self._position
                following, position, stop, value = kernel.pack_records(
                    self._map, self._position, self.file_size, self._reserved,
                    self._segment_start, rows, first, count, batch.bodies, batch.body_spans,
                    batch.props, batch.prop_spans, topic_fields, topic_rows, host_fields,
                    host_rows, self._store_host_field, slots, prefix, state, out,
                )  # fmt: skip
                self._position = position
                self.appended += following - first
                first = following
                if stop == layout.NEEDS_ROLL:
                    if value + BLANK_MIN_LENGTH > self.file_size:
                        raise MessageTooLargeError(
                            f"a {value}-byte record cannot fit in a commit-log file of "
                            f"{self.file_size} bytes"
                        )
                    self._roll()
                elif stop == layout.NEEDS_RESERVE:
                    self._reserve(value)
                elif stop == layout.NEW_MONTH:
                    assert self.uniq_keys is not None
                    self.uniq_keys.resume(state[layout.KEY_COUNTER])
                    _, counter, month, following_month = self.uniq_keys.batch_state(value)
                    state[layout.KEY_MONTH_START] = month
                    state[layout.KEY_NEXT_MONTH] = following_month
        finally:
            for number, topic in enumerate(batch.topics):
                for queue_id in range(span):
                    slot = number * span + queue_id
                    if slots[slot] != before[slot]:
                        self.queue_offsets[(topic, queue_id)] = slots[slot]
            if self.uniq_keys is not None and count:
                self.uniq_keys.resume(state[layout.KEY_COUNTER])
            self.last_store_timestamp = state[layout.KEY_LAST_STAMP]
        if self._position - self._released >= _RELEASE_CHUNK:
            self._release_written()
        return BatchResults(batch, out, self._store_host_field)

    def _clock_readings(self, count: int) -> array:
        """The clock for ``count`` messages: one wall-clock reading for a whole batch (they
        are put within it), or the given clock's readings, taken ``clock_many`` at a time when
        it offers that (a fixture's ticking clock)."""
        if self.clock is None:
            return array("q", [time.time_ns() // 1_000_000]) * count
        if self.clock_many is not None:
            return self.clock_many(count)
        return array("q", (self.clock() for _ in range(count)))

    def _release_written(self) -> None:
        """Drop written pages from this process: they stay in the page cache (dirty ones are
        still written back and covered by flush), so resident memory stays flat however much
        is appended. Staged pages (transient) go only once committed to the file."""
        written = self._committed if self.transient else self._position
        upto = written - written % _PAGE
        if self._map is not None and upto > self._released:
            self._map.madvise(mmap.MADV_DONTNEED, self._released, upto - self._released)
            self._released = upto

    def _record_struct(self, shape: tuple[Any, int, int, int]) -> Any:
        """The layout of a whole record (all but a reserved __CRC32# property) of one shape:
        header layout and the lengths of body, topic field and properties. Records of a
        batch mostly share one shape, so one ``pack_into`` writes each."""
        header, body_length, topic_length, props_length = shape
        if len(self._record_structs) >= 256:
            self._record_structs.clear()
        layout = struct.Struct(f"{header.format}{body_length}s{topic_length}sH{props_length}s")
        self._record_structs[shape] = layout
        return layout

    def _learn_born_host(self, born_host: HostAddress) -> tuple[bytes, int, Any, int]:
        """Remember a born host's field bytes, V6 sysFlag bits and header layout."""
        flags = host_flags(born_host, self.store_host)
        header = _HEADERS[flags >> 4]
        host = (born_host.to_field(), flags, header, header.size)
        self._host_fields[born_host] = host
        return host

    def _write_crc_property(self, position: int, total: int) -> None:
        """Fill the reserved 20 bytes with the CRC of everything before them (spec §2.6)."""
        reserve = self._crc_reserve
        crc = record_crc(memoryview(self._map)[position : position + total - reserve])
        self._map[position + total - reserve : position + total] = crc_property_bytes(crc)

    # -- durability and rollback ---------------------------------------------------------------

    @property
    def unflushed_bytes(self) -> int:
        """Bytes appended since the last :meth:`flush`."""
        return self.end_offset - self._flushed_offset

    @property
    def uncommitted_bytes(self) -> int:
        """Transient: bytes staged and not yet written to the file (0 otherwise)."""
        return self._position - self._committed if self.transient else 0

    def commit(self) -> int:
        """Transient: write the staged bytes of the current file to it; returns how many."""
        if not self.transient or self._segment is None:
            return 0
        return self._commit_to(self._position)

    def _commit_to(self, end: int) -> int:
        start = self._committed
        if end <= start:
            return 0
        assert self._segment is not None and self._map is not None
        path = self._segment.path
        try:
            fd = open_for_writing(path)
            try:
                with memoryview(self._map) as staged:
                    done = start
                    while done < end:
                        done += os.pwrite(fd, staged[done:end], done)
            finally:
                os.close(fd)
        except OSError as exc:
            raise StoreIOError(f"cannot write {path}: {exc.strerror}") from None
        self._committed = end
        return end - start

    def flush(self) -> None:
        """Force everything appended so far to disk (fdatasync of rolled files, msync of the
        current file's dirty range; transient: commit, then fdatasync), like a broker flush
        with leastPages 0. Once one has failed every later one fails too: Linux reports a
        failed write-back once, marks the pages it could not write clean, and a second
        fdatasync or msync then succeeds whether or not they reached the disk."""
        if self.flush_failure is not None:
            raise StoreIOError(
                f"an earlier flush failed ({self.flush_failure}); flushing again would not "
                "tell whether its pages reached the disk"
            )
        try:
            if self.transient and self._dirty_from >= 0 and self._segment is not None:
                self.commit()
                self._dirty_files.add(self._segment.path)
                self._dirty_from = -1
            for path in sorted(self._dirty_files):
                sync_file_data(path)
                self._dirty_files.discard(path)
            if self._dirty_from >= 0 and self._map is not None:
                start = self._dirty_from - self._dirty_from % _PAGE
                self._map.flush(start, self._position - start)
                self._dirty_from = -1
        except OSError as exc:
            self.flush_failure = exc.strerror or str(exc)
            raise StoreIOError(f"flush failed: {self.flush_failure}") from None
        self._flushed_offset = self.end_offset

    def savepoint(self) -> Savepoint:
        return Savepoint(
            self.end_offset,
            len(self.log.segments),
            dict(self.queue_offsets),
            self.last_store_timestamp,
            self.appended,
        )

    def rollback(self, savepoint: Savepoint) -> None:
        """Undo every append after ``savepoint``: zero the bytes written since, remove files
        created since (they hold only those bytes) and restore queue offsets."""
        assert self._segment is not None
        # not below a mark already there: a roll stopped as it made the next file has
        # written its BLANK past the position it has not left yet
        path = self._segment.path
        self._high_water[path] = max(self._high_water.get(path, 0), self._position)
        if self._dirty_from >= 0:
            self._dirty_files.add(self._segment.path)
        self._release_map()
        self._segment = None
        later = self.log.segments[savepoint.segment_count :]
        self.log.queue.forget_after(savepoint.segment_count)
        removed = False
        for segment in later:
            self._dirty_files.discard(segment.path)
            # made by this session: listed as made, or not there when it began (a signal
            # between a file's making and its listing as made left it, zeroed, after the
            # files removed: a gap in the log)
            if segment in self._created or segment.path.name not in self._files_at_start:
                if segment in self._created:
                    self._created.remove(segment)
                self._high_water.pop(segment.path, None)
                _unlink(segment.path)
                removed = True
            else:
                self._zero(segment, 0)
        # a file this session made after the savepoint's that no list holds: a signal came
        # between its rename into place and its listing among the log's files
        kept = {segment.path.name for segment in self.log.segments[: savepoint.segment_count]}
        for name in _file_names(self.log.directory):
            made = is_segment_name(name) and name not in self._files_at_start
            if made and name not in kept and int(name) > savepoint.offset:
                _unlink(self.log.directory / name)
                removed = True
        if removed:
            sync_directory(self.log.directory)
        segment = self.log.queue.find(savepoint.offset)
        if segment is None:  # the savepoint was the very start of a new file
            segment = self._create(savepoint.offset - savepoint.offset % self.file_size)
        self._zero(segment, savepoint.offset - segment.start)
        self._switch_to(segment, savepoint.offset - segment.start)
        self.queue_offsets.clear()
        self.queue_offsets.update(savepoint.queue_offsets)
        self.last_store_timestamp = savepoint.last_store_timestamp
        self.appended = savepoint.appended
        self._flushed_offset = min(self._flushed_offset, self.end_offset)

    def _zero(self, segment: Segment, position: int) -> None:
        """Zero what this session wrote in ``segment`` from ``position`` on."""
        end = self._high_water.pop(segment.path, position)
        if end > position:
            buf = map_writable(segment.path)
            try:
                buf[position:end] = bytes(end - position)
                buf.flush()
            finally:
                buf.close()

    def queues_appended(self) -> dict[str, int]:
        """Topic to the number of queues its appended messages need (highest queue id + 1),
        for the topics this appender gave a message; with SCHEDULE_TOPIC_XXXX, the topics
        and queues its DELAY messages will be delivered to (REAL_TOPIC, REAL_QID). An LMQ
        queue that multi-dispatch copies went into is no topic a broker lists."""
        queues: dict[str, int] = {}
        started = self._queue_offsets_at_start
        for (topic, queue_id), offset in self.queue_offsets.items():
            if (topic, queue_id) in self._copy_queues:
                continue
            if started.get((topic, queue_id)) != offset:
                queues[topic] = max(queues.get(topic, 0), queue_id + 1)
        if SCHEDULE_TOPIC in queues:  # (a DELAY message prepared and not appended may count)
            for topic, count in self._delayed_queues.items():
                queues[topic] = max(queues.get(topic, 0), count)
        return queues

    def close(self) -> None:
        """Flush (unless a flush failed: see :meth:`flush`) and let the current file go."""
        if self.flush_failure is None:
            self.flush()
        self._release_map()
        segment = self._segment
        if segment is not None and segment in self._created and not self.preallocate:
            # the blocks reserved ahead of the end and never written go back to the disk
            # (only in files this appender created: a broker's warmed file stays as it is)
            start = -(-self._position // _PAGE) * _PAGE
            if self._reserved > start:
                release_range(segment.path, start, self._reserved - start)
