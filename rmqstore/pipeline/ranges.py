"""Cutting a commit log into byte ranges that are read independently, and putting the
results back together as one walk of the log would see it. No pyspark here: the data sources
and jobs build on it, and tests run it in-process.

A range holds the records that *start* in it. One that begins inside a file starts at the
first record at or after its start (magic code, stored physical offset equal to the
position, a record that decodes), the way a damaged region is skipped. Where a file ends
(a BLANK record, zeros, or, in the last file holding data, the first invalid record) only
one range can see: :func:`walk_summaries` keeps, per file, the ranges up to that one, and
:func:`file_bounds` turns them into the end of each file's records, which the row-reading
pass then respects.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import groupby
from typing import Any, TypeVar

from rmqstore import kernel
from rmqstore.config import DEFAULT_MAX_MESSAGE_SIZE
from rmqstore.delay import SCHEDULE_TOPIC, DelayLevels, unit_tags_code
from rmqstore.errors import RecordError
from rmqstore.kernel import layout
from rmqstore.multidispatch import copies_marked
from rmqstore.pipeline.location import StoreLocation
from rmqstore.properties import decode_properties
from rmqstore.record import (
    RecordHeader,
    RegionScan,
    ScanStop,
    find_next_record_in_file,
    record_item,
)

T = TypeVar("T")
DEFAULT_SPLIT = 32 * 1024 * 1024
_RECORD_SLACK = 64 * 1024 + 128  # topic (V2), properties and header beyond the body


def record_margin(max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE) -> int:
    """Bytes past a range's end that a record starting inside it may need."""
    return max_message_size + _RECORD_SLACK


@dataclass(frozen=True)
class FileRange:
    """Records starting in ``[start, stop)`` of one commit-log file (file positions)."""

    name: str
    file_start: int  # physical offset of the file's first byte
    start: int
    stop: int
    file_size: int
    last_file: bool  # the last file holding data: an invalid record ends the log
    margin: int = record_margin()
    record_start: bool = False  # ``start`` is known to be a record's first byte

    @property
    def at_record(self) -> bool:
        return self.start == 0 or self.record_start  # a file starts with a record


def last_data_file(location: StoreLocation, segments: list[tuple[str, int]]) -> str | None:
    """The last commit-log file whose first bytes are not zeros (later ones are
    pre-allocated)."""
    for name, size in reversed(segments):
        if size >= 8:
            with location.open_range(f"commitlog/{name}", 0, 8) as (buf, _):
                if any(buf[:8]):
                    return name
    return None


@dataclass(frozen=True)
class LogPlan:
    """Ranges planned over a commit log, with what the planning saw: ``segments``, the
    commit-log files then (name, size), and ``live_end``, the physical offset up to which a
    store whose lock another process held is read (None when nobody held it)."""

    ranges: list[FileRange]
    segments: list[tuple[str, int]]
    live_end: int | None = None


def plan_ranges(
    location: StoreLocation,
    split: int,
    *,
    split_last: bool,
    bounds: dict[str, int] | None = None,
    margin: int = record_margin(),
) -> list[FileRange]:
    """The ranges of :func:`plan_log`."""
    return plan_log(location, split, split_last=split_last, bounds=bounds, margin=margin).ranges


def plan_log(
    location: StoreLocation,
    split: int,
    *,
    split_last: bool,
    bounds: dict[str, int] | None = None,
    margin: int = record_margin(),
) -> LogPlan:
    """Ranges of ``split`` bytes (0: whole files) over the files up to the last one holding
    data. The last one is split only with ``split_last``; ``bounds`` (file name to the end
    of its records) clips the ranges, and a file not in it is left out. Without ``bounds``,
    a store another process is writing is read as it stood: up to where the last file's data
    ended (:meth:`StoreLocation.live_end`); the records a broker writes after are left out,
    and a record it was writing is read whole."""
    listed = location.segments("commitlog")
    segments = location.commitlog_segments(listed)
    last = last_data_file(location, segments)
    if last is None:
        return LogPlan([], listed)
    live_from = None
    if bounds is None:
        live_end = location.live_end(last, dict(segments)[last])
        if live_end is not None:
            bounds = {name: size for name, size in segments if name <= last}
            bounds[last] = live_end
            live_from = int(last) + live_end
    names = {int(name): name for name, _ in segments if name <= last}
    spans = plan_spans(
        [(int(name), size) for name, size in segments if name <= last],
        split,
        split_last=split_last,
        ends=None if bounds is None else {int(name): end for name, end in bounds.items()},
        data_end=lambda start, size: location.data_end(names[start], size),
    )
    ranges = [
        FileRange(names[file_start], file_start, start, stop, size, last_file, margin)
        for file_start, size, start, stop, last_file in spans
    ]
    return LogPlan(ranges, listed, live_from)


def plan_spans(
    files: list[tuple[int, int]],
    split: int,
    *,
    begin: int = 0,
    split_last: bool = True,
    ends: dict[int, int] | None = None,
    data_end: Callable[[int, int], int] | None = None,
) -> list[tuple[int, int, int, int, bool]]:
    """The one range planner (of the pipelines, ``verify`` and the streaming source):
    ``(file start, file size, start, stop, last file)`` per range of ``split`` bytes (0: whole
    files) over ``files`` (``(start offset, size)`` in log order, up to the last one holding
    data), from position ``begin`` of the first. The last file is split only with
    ``split_last``. ``ends`` (file start to where its records end) clips each file's ranges,
    and a file not in it is left out; without it, the last file's ranges stop being planned
    at ``data_end(start, size)`` (where its data seems to end: a pre-allocated file is mostly
    zeros), the last of them running to the file's end."""
    spans = []
    for number, (file_start, size) in enumerate(files):
        last = number == len(files) - 1
        end = size if ends is None else min(size, ends.get(file_start, -1))
        if end < 0:
            continue
        step = size if split <= 0 or (last and not split_last) else split
        planned = end
        if last and ends is None and data_end is not None:
            planned = data_end(file_start, size)
        first = begin if number == 0 else 0
        for start, stop in split_file(first, planned, end, step):
            spans.append((file_start, size, start, stop, last))
    return spans


def coalesce(ranges: list[FileRange], split: int) -> list[list[FileRange]]:
    """Consecutive ranges grouped into partitions of at most ``split`` bytes (a range larger
    than that alone), so a log of many small files is not a task per file."""
    return grouped(ranges, [part.stop - part.start for part in ranges], split)


def part_groups(ranges: list[FileRange], split: int) -> list[list[FileRange]]:
    """:func:`coalesce` for ranges not yet bounded by a walk (a one-pass export, ``stats``):
    only ranges that are the whole of their file's planned ranges are grouped, each such
    group up to ``split`` bytes; a file of several ranges keeps each alone. One walk of the
    log visits every range of a group (where such a file's records end is inside its only
    range, and nothing follows the last file's), so what is read of a group is kept whole,
    and a log of many small files is not a part file and a job per file."""
    per_file = Counter(part.name for part in ranges)
    groups: list[list[FileRange]] = []
    for whole, run in groupby(ranges, lambda part: per_file[part.name] == 1):
        parts = list(run)
        groups.extend(coalesce(parts, split) if whole else ([part] for part in parts))
    return groups


def grouped(items: list[Any], sizes: list[int], limit: int) -> list[list[Any]]:
    """Consecutive ``items`` grouped while their ``sizes`` add up to at most ``limit`` (an
    item larger than that alone; ``limit`` 0: each alone)."""
    groups: list[list[Any]] = []
    held = 0
    for item, size in zip(items, sizes, strict=True):
        if groups and limit > 0 and held + size <= limit:
            groups[-1].append(item)
            held += size
        else:
            groups.append([item])
            held = size
    return groups


# a file's last range may run up to a tenth over ``split`` rather than leave a sliver of data
# to a range of its own (Hadoop's FileInputFormat allows the same, its SPLIT_SLOP): each range
# is a task, and a task of a Python data source costs PySpark about 60 ms on this machine
# however little it reads, more than the sliver's own reading
SPLIT_SLOP = 1.1


def split_file(begin: int, planned: int, end: int, step: int) -> list[tuple[int, int]]:
    """The ranges ``(start, stop)`` of one commit-log file from position ``begin``: one every
    ``step`` bytes up to ``planned`` (where its data is thought to end), the last one running to
    ``end`` (the file's end, or where its records are known to end). A last range of at most a
    tenth of ``step`` up to ``planned`` joins the one before (:data:`SPLIT_SLOP`)."""
    starts = range(begin, max(planned, begin + 1), max(step, 1))
    if len(starts) > 1 and planned - starts[-1] <= (SPLIT_SLOP - 1) * step:
        starts = starts[:-1]
    return [
        (start, end if number == len(starts) - 1 else min(end, start + step))
        for number, start in enumerate(starts)
    ]


class RangeScan:
    """The records starting in one :class:`FileRange`, in kernel row batches
    (:meth:`batches`) or one by one (iterating). Damaged regions are skipped in files before
    the last; in the last file holding data (unless ``resync_last``) the first invalid record
    ends the log.

    Afterwards: ``outcome`` (``reached``: the next range's records follow; ``covered``: no
    record starts in the range; ``blank``, ``end``, ``invalid``: the file's records end
    here, at ``end``), ``blank_length``, ``invalid_regions``, ``first_invalid``, ``error``
    (the first invalid record's reason), ``first_zeros`` (the first run of zeros skipped:
    records follow it, in a file before the last), ``crc_failures`` and
    ``first_crc_failure`` (the physical offset of the first record whose CRC check
    failed)."""

    def __init__(
        self,
        location: StoreLocation,
        part: FileRange,
        check_crc: bool,
        *,
        resync_last: bool,
        batch_rows: int = 0,
    ) -> None:
        self.location = location
        self.batch_rows = batch_rows
        self.part = part
        self.check_crc = check_crc
        self.resync = resync_last or not part.last_file
        self.outcome = "reached"
        self.end: int | None = None
        self.blank_length = 0
        self.invalid_regions = 0
        self.first_invalid: int | None = None
        self.first_zeros: int | None = None  # zeros with records after them (not the end)
        self.error: str | None = None
        self.crc_failures = 0
        self.first_crc_failure: int | None = None

    def batches(self) -> Iterator[tuple[Any, int, Any, int]]:
        """``(buf, at, rows, count)`` per kernel call: ``count`` rows (see
        :mod:`rmqstore.kernel.layout`) of records starting in the range, their positions
        indexes into ``buf``, whose first byte is at file position ``at``. The file is read
        in windows: ``buf`` and the rows are reused by the next batch. ``invalid_regions``
        counts the damaged regions skipped before the batch's first record."""
        part = self.part
        relative = f"commitlog/{part.name}"
        # the file's bytes to its end: a record starting in the range is read whole however
        # long it is (a broker may allow larger records than the margin expects); windows
        # read ahead only to the margin past the range
        read_ahead = part.stop + 2 * part.margin
        with self.location.windows(relative, part.file_size, read_ahead=read_ahead) as windows:
            base = part.file_start
            position = part.start
            stop = part.stop
            if not part.at_record:
                found = find_next_record_in_file(windows, position, base, search_end=stop)
                if found is None:
                    self.outcome = "covered"
                    return
                position = found
            while True:
                region = RegionScan(
                    None,
                    position,
                    windows.limit,
                    base,
                    self.check_crc,
                    windows=windows,
                    batch_rows=self.batch_rows,
                )
                for window, window_start, rows, count in region.batches():
                    kept = layout.rows_before(rows, count, base + stop)
                    if kept:
                        self._count_failures(rows, kept)
                        yield window, window_start, rows, kept
                    if kept < count:
                        return  # reached the next range
                end = region.end_position
                self.end = end
                if region.stop is ScanStop.BLANK:
                    self.outcome, self.blank_length = "blank", region.blank_length
                    return
                if region.stop is ScanStop.END and (part.last_file or not self.resync):
                    self.outcome = "end"  # nothing more was written
                    return
                # (to the file's end, as a walk of the whole file does: a damaged region is
                # searched past once, by the range where it begins; the ranges inside it only
                # search their own bytes)
                resumed = find_next_record_in_file(windows, end, base) if self.resync else None
                if region.stop is ScanStop.END:
                    if resumed is None:
                        self.outcome = "end"  # zeros to the file's end
                        return
                    # zeros in a file the log has gone on from, with records after them: a
                    # run of zeros written over records, skipped as other damage is (where
                    # a dispatch still stops, as at zeros: first_zeros)
                    if self.first_zeros is None:
                        self.first_zeros = end
                elif self.first_invalid is None:
                    self.first_invalid = end
                    self.error = str(region.error)
                self.invalid_regions += 1
                if resumed is None:
                    self.outcome = "invalid"
                    return
                if resumed >= stop:
                    self.end = None
                    return  # the next range goes on from there
                position = resumed

    def _count_failures(self, rows: Any, count: int) -> None:
        if not self.check_crc:
            return
        statuses = rows[layout.CRC_STATUS : count * layout.ROW_WIDTH : layout.ROW_WIDTH]
        failed = statuses.count(layout.CRC_BAD)
        if failed:
            self.crc_failures += failed
            if self.first_crc_failure is None:
                at = statuses.index(layout.CRC_BAD) * layout.ROW_WIDTH
                self.first_crc_failure = rows[at + layout.PHYSICAL_OFFSET]

    def __iter__(self) -> Iterator[tuple[Any, int, int, RecordHeader, str, bytes, bool | None]]:
        """``(buf, at, physical_offset, header, topic, properties_bytes, crc_ok)`` per
        record (see :meth:`batches` for ``buf`` and ``at``; ``header`` indexed with the
        ``H_*`` constants)."""
        topics = layout.TopicNames()
        for buf, at, rows, count in self.batches():
            for row in range(count):
                yield (buf, at, *record_item(buf, rows, row, topics))


@dataclass
class RangeSummary:
    """What one range holds (a row of ``summary=files``)."""

    file: str
    start: int
    stop: int
    last_file: bool
    outcome: str
    end: int | None
    records: int
    bytes: int
    crc_failures: int
    blank_bytes: int
    invalid_regions: int
    first_invalid: int | None
    first_crc_failure: int | None  # physical offsets
    first_bad_delay: int | None
    error: str | None  # why the first invalid record is invalid
    delay_error: str | None = None  # why the first bad DELAY is bad
    # records that may have units in further (LMQ) queues: the times INNER_MULTI_QUEUE_OFFSET
    # is found among the range's records (a body may hold it too: an upper bound)
    queue_copies: int = 0
    # the file position of the first run of zeros skipped (records follow it in a file the
    # log has gone on from): a dispatch stops there, as at the end of what was written
    first_zeros: int | None = None


SUMMARY_FIELDS = [
    ("file", "STRING", "string"),
    ("start", "BIGINT", "int64"),
    ("stop", "BIGINT", "int64"),
    ("lastFile", "BOOLEAN", "bool"),
    ("outcome", "STRING", "string"),
    ("end", "BIGINT", "int64"),
    ("records", "BIGINT", "int64"),
    ("bytes", "BIGINT", "int64"),
    ("crcFailures", "BIGINT", "int64"),
    ("blankBytes", "BIGINT", "int64"),
    ("invalidRegions", "BIGINT", "int64"),
    ("firstInvalid", "BIGINT", "int64"),
    ("firstCrcFailure", "BIGINT", "int64"),
    ("firstBadDelay", "BIGINT", "int64"),
    ("error", "STRING", "string"),
    ("delayError", "STRING", "string"),
    ("queueCopies", "BIGINT", "int64"),
    ("firstZeros", "BIGINT", "int64"),
]


def summarize_range(
    location: StoreLocation,
    part: FileRange,
    *,
    check_crc: bool,
    delay_levels: DelayLevels,
    on_batch: Callable[[Any, Any, int], None] | None = None,
    batch_rows: int = 0,
    count_copies: bool = False,
) -> RangeSummary:
    """Count one range's records. CRCs are checked when asked; a SCHEDULE_TOPIC_XXXX record
    whose DELAY is not a number is noted (dispatch stops there, as a broker does);
    ``count_copies`` counts the records with units in further (LMQ) queues (a search of the
    range's bytes: a rebuild's walk asks for it, the other passes do not pay for it).
    ``on_batch(buf, rows, count)`` sees each batch of rows (of at most ``batch_rows``; 0: a
    window's) as well (another count or an export in the same pass)."""
    scan = RangeScan(location, part, check_crc, resync_last=False, batch_rows=batch_rows)
    tally = RangeTally()
    found = array("q")
    topics = layout.TopicNames()
    for buf, _, rows, count in scan.batches():
        if on_batch is not None:
            on_batch(buf, rows, count)
        tally.records += count
        tally.bytes += layout.rows_bytes(rows, count)
        if count_copies:
            tally.queue_copies += copies_marked(buf, rows, count)
        if tally.first_bad_delay is not None:
            continue
        if len(found) < count:
            found = layout.zeroed(count)
        # the SCHEDULE_TOPIC_XXXX rows
        looked = kernel.attention_rows(buf, rows, 0, count, -1, layout.SCHEDULED_ONLY, found)
        for row in found[:looked]:
            offset, header, _, props, _ = record_item(buf, rows, row, topics)
            if b"DELAY" in props:
                tally.check_delay(offset, header, decode_properties(props), delay_levels)
    tally.first_crc_failure = scan.first_crc_failure
    return tally.summary(scan)


@dataclass
class RangeTally:
    """What a pass over one range counts for its :class:`RangeSummary`."""

    records: int = 0
    bytes: int = 0
    queue_copies: int = 0
    first_crc_failure: int | None = None
    first_bad_delay: int | None = None
    delay_error: str | None = None

    def check_delay(
        self, offset: int, header: RecordHeader, properties: dict[str, str], levels: DelayLevels
    ) -> int | None:
        """The tagsCode of the SCHEDULE_TOPIC_XXXX record at ``offset``; None, and the
        record noted (the first such one), when its DELAY is not a number."""
        try:
            return unit_tags_code(SCHEDULE_TOPIC, properties, header.store_timestamp, levels)
        except RecordError as exc:
            if self.first_bad_delay is None:
                self.first_bad_delay = offset
                self.delay_error = str(RecordError(exc.field, offset, exc.reason))
            return None

    def summary(self, scan: RangeScan) -> RangeSummary:
        part = scan.part
        return RangeSummary(
            file=part.name,
            start=part.start,
            stop=part.stop,
            last_file=part.last_file,
            outcome=scan.outcome,
            end=scan.end,
            records=self.records,
            bytes=self.bytes,
            crc_failures=scan.crc_failures,
            blank_bytes=scan.blank_length if scan.outcome == "blank" else 0,
            invalid_regions=scan.invalid_regions,
            first_invalid=scan.first_invalid,
            first_crc_failure=self.first_crc_failure,
            first_bad_delay=self.first_bad_delay,
            error=scan.error,
            delay_error=self.delay_error,
            queue_copies=self.queue_copies,
            first_zeros=scan.first_zeros,
        )


@dataclass(frozen=True)
class SummaryJob:
    """One range to summarise: picklable, for an executor."""

    store: str
    part: FileRange
    check_crc: bool
    delay_levels: str | None
    count_copies: bool = False  # count the records with LMQ units (a rebuild's walk)


def summarize_job(
    job: SummaryJob, on_batch: Callable[[Any, Any, int], None] | None = None
) -> RangeSummary:
    levels = DelayLevels(job.delay_levels) if job.delay_levels else DelayLevels()
    return summarize_range(
        StoreLocation(job.store),
        job.part,
        check_crc=job.check_crc,
        delay_levels=levels,
        on_batch=on_batch,
        count_copies=job.count_copies,
    )


def summary_jobs(
    location: StoreLocation,
    split: int,
    *,
    check_crc: bool,
    crc_from: int = 0,
    delay_levels: str | None = None,
    margin: int = record_margin(),
    count_copies: bool = False,
    plan: LogPlan | None = None,
) -> list[SummaryJob]:
    """A summary job per range of the whole log, or of ``plan`` (CRCs checked in files from
    ``crc_from``)."""
    if plan is None:
        plan = plan_log(location, split, split_last=True, margin=margin)
    return [
        SummaryJob(
            location.uri,
            part,
            check_crc and part.file_start >= crc_from,
            delay_levels,
            count_copies,
        )
        for part in plan.ranges
    ]


_FILE_ENDS = ("blank", "end", "invalid")


def walk_summaries(summaries: list[RangeSummary]) -> list[RangeSummary]:
    """The ranges one walk of the log visits, in order: in each file those up to the range
    where the file's records end, and nothing after the end of the last file holding data."""
    ordered = sorted(summaries, key=lambda item: (item.file, item.start))
    return list(walk_in_order(ordered, lambda summary: summary))


def walk_in_order(items: Iterable[T], summary_of: Callable[[T], RangeSummary]) -> Iterator[T]:
    """:func:`walk_summaries` over items that carry a summary and come in log order (as
    they arrive from workers): it stops after the end of the last file holding data."""
    done_file = None
    for item in items:
        summary = summary_of(item)
        if summary.file == done_file:
            continue
        yield item
        if summary.outcome in _FILE_ENDS:
            done_file = summary.file
            if summary.last_file:
                return


def file_bounds(walked: list[RangeSummary]) -> dict[str, int]:
    """File name to the position where its walked records end (the file size when no range
    saw an end: the next file's records follow)."""
    bounds: dict[str, int] = {}
    for summary in walked:
        if summary.outcome in _FILE_ENDS and summary.end is not None:
            bounds[summary.file] = summary.end
        elif summary.file not in bounds or bounds[summary.file] < summary.stop:
            bounds[summary.file] = max(bounds.get(summary.file, 0), summary.stop)
    return bounds


@dataclass(frozen=True)
class WalkEnd:
    """Where a dispatch that walked the log would stop, and why."""

    cut: int  # physical offset: records from here on are not dispatched
    log_end: int  # the end of the log (the last file's records end)
    reason: str | None  # the invalid record / CRC failure / DELAY that stopped it
    kind: str  # "end", "invalid", "crc" or "delay"


def dispatch_end(
    walked: list[RangeSummary],
    *,
    next_file_start: int | None,
    crc_from: int | None,
    walked_from: int | None = None,
) -> WalkEnd:
    """The offset where dispatch stops (spec §9): the first invalid record or unwritten
    region anywhere, a bad body CRC in the files recovery checks (from ``crc_from``; None:
    none), a SCHEDULE_TOPIC_XXXX record with a DELAY that is not a number (an invalid
    record, the log's end, in the files recovery walks, from ``walked_from``); else the end
    of the log. ``next_file_start``: the file after the last one holding data, if any (a
    walk that leaves a BLANK there ends at its start)."""
    log_end = 0
    candidates: list[tuple[int, str | None, str]] = []
    for summary in walked:
        candidates.extend(_stops(summary, crc_from, walked_from))
        if summary.last_file and summary.outcome in _FILE_ENDS and summary.end is not None:
            log_end = int(summary.file) + summary.end
            if summary.outcome == "blank" and next_file_start is not None:
                log_end = next_file_start
    if walked and not any(s.last_file and s.outcome in _FILE_ENDS for s in walked):
        last = walked[-1]
        log_end = int(last.file) + (last.end if last.end is not None else last.stop)
    candidates.append((log_end, None, "end"))
    cut, reason, kind = min(candidates, key=lambda item: item[0])
    return WalkEnd(cut, log_end, reason, kind)


def stops_dispatch(summary: RangeSummary, crc_from: int | None) -> bool:
    """Dispatch walking the log stops inside (or at the end of) this range: records of
    later ranges are not dispatched (:func:`dispatch_end` picks the earliest such stop)."""
    return any(_stops(summary, crc_from))


def _stops(
    summary: RangeSummary, crc_from: int | None, walked_from: int | None = None
) -> Iterator[tuple[int, str | None, str]]:
    """Where, in one range, dispatch would stop, and why."""
    start = int(summary.file)
    if summary.first_invalid is not None:
        yield start + summary.first_invalid, summary.error, "invalid"
    if summary.outcome == "end" and summary.end is not None:
        yield start + summary.end, None, "end"
    if summary.first_zeros is not None:
        yield start + summary.first_zeros, None, "end"
    if summary.first_crc_failure is not None and crc_from is not None and start >= crc_from:
        reason = f"record at offset {summary.first_crc_failure}: BODYCRC does not match the body"
        yield summary.first_crc_failure, reason, "crc"
    if summary.first_bad_delay is not None:
        walked = walked_from is not None and start >= walked_from
        yield summary.first_bad_delay, summary.delay_error, "invalid" if walked else "delay"
