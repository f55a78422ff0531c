"""The commit-log pass of ``verify``: files, then every record once, front to back.

Each valid message is checked on its own (CRCs, stored offset, properties, queue-offset
density, store-time order) and handed to listeners that compare it with the consume queues and
the index. In a file that is not the last, an invalid record is reported and the pass
resynchronises on the next record; in the last file holding data it is the end of the log, and
what follows it is a torn tail or stale bytes.

The pass can also run over one range of one file (:meth:`RecordPass.scan_range`), so that
ranges can be checked in parallel and merged (:mod:`rmqstore.verify.ranges`); what a range
cannot know on its own (the record before it) it leaves in :class:`RangeEdges`.
"""

from __future__ import annotations

import os
from array import array
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path, PurePath
from typing import Any, Protocol

from rmqstore import kernel
from rmqstore.commitlog import CommitLog
from rmqstore.delay import SCHEDULE_TOPIC
from rmqstore.errors import InputError, RecordError, RmqStoreError, StoreIOError
from rmqstore.javavalues import parse_java_int
from rmqstore.kernel import layout as kernel_layout
from rmqstore.kernel.layout import ROW_WIDTH
from rmqstore.multidispatch import (
    COPIES_MARK,
    CopyRunTables,
    copy_run_keys,
    dispatch_stop,
)
from rmqstore.properties import DELAY, decode_properties
from rmqstore.record import (
    QUEUED_TRANSACTIONS,
    TRANSACTION_MASK,
    BodyMode,
    RecordHeader,
    RegionScan,
    ScanStop,
    data_ends_at,
    find_next_record_in_file,
    property_crc_status,
)
from rmqstore.segments import (
    Segment,
    is_creating_name,
    is_segment_name,
    nonzero_extent,
)
from rmqstore.store import Store
from rmqstore.verify.findings import ERROR, NOTE, WARNING, VerifyReport
from rmqstore.windows import FileWindows
from rmqstore.wording import quoted

_CRC_NAME = b"__CRC32#"
_OFFSET_COLUMN = kernel_layout.PHYSICAL_OFFSET
_ERROR_KINDS = {"PHYSICALOFFSET": "record-physical-offset", "BODYCRC": "record-body-crc"}
_UNWALKED = "in a file a broker's recovery does not walk"
GAP_CONSEQUENCE = (
    ": the queue's units from there on cannot all match their records' queue offsets (a "
    "broker, and a rebuild, append each unit at the end of the queue), so its consume-queue "
    "findings are report only"
)
_REPLAY_STOPS = (
    "a replay of the log stops here: dispatch does not reach the records after it, nor a "
    "slave broker's, and dispatch --rebuild refuses"
)
UNWALKED_DAMAGE = (
    "the record there is damaged, in a file a broker's recovery does not walk: no command "
    "mends it (dispatch --rebuild refuses the log), and the broker serves what is there"
)


def half_made(report: VerifyReport, store: Store, path: Path) -> bool:
    """Whether ``path`` is a file under the temporary name rmqstore's writers make files
    under before renaming them into place: one another process writing the store is making
    (no finding), else one a killed writer left (``file-half-made``: it holds nothing a
    broker reads, and recover moves it to quarantine)."""
    if not is_creating_name(path.name) or not path.is_file():
        return False
    if not store.written_elsewhere:
        report.add(
            "file-half-made",
            "a file a killed writer was still making, under its temporary name (it holds "
            "nothing a broker reads; rmqstore recover moves it to quarantine)",
            WARNING,
            file=relative(store, path),
        )
    return True


def recovery_walks_from(log: CommitLog, store: Store) -> int:
    """Where a broker's recovery walks ``log`` (the files of ``store`` as verify reads them)
    from: the third-last file, or after a crash the one the checkpoint picks. Without
    'abort', an earlier file when the files after the log's end go: the next normal start
    walks the last three left (see :meth:`CommitLog.valid_end`)."""
    start = log.recovery_start(store.checkpoint(), store.aborted)
    if start is None:
        return 0
    if store.aborted:
        return start.start
    try:
        end = store.log_end().offset
    except RmqStoreError:  # files a broker does not load (of a wrong size): no recovery runs
        return start.start
    return log.normal_walk_start(end, start.start)


class UnwalkedDamage:
    """Whether the record at an offset is damaged (it does not decode), in a commit-log file
    before those a broker's recovery walks: a unit or index entry pointing at it is left so
    by every command. The files as verify reads them (of any size), listed once."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._log: CommitLog | None = None
        self._walked_from = 0

    def __call__(self, offset: int) -> bool:
        try:
            if self._log is None:
                store = self.store
                self._log = CommitLog(store.commitlog_dir, store.commitlog_file_size, strict=False)
                self._walked_from = recovery_walks_from(self._log, store)
            if offset >= self._walked_from:
                return False
            self._log.read(offset, body=BodyMode.SKIP)
        except RecordError:
            return True
        except (RmqStoreError, OSError):
            return False
        return False

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def __getstate__(self) -> dict[str, Any]:
        return {"store": self.store, "_log": None, "_walked_from": 0}  # no open files


_HAS_COPIES = kernel_layout.HAS_COPIES


@dataclass
class RecordBatch:
    """A batch of kernel rows a record pass found clean (nothing to look at one by one, queue
    offsets dense), with what the kernel prepared for dispatch: each row's tagsCode and index
    keys, and its consume-queue units gathered into runs (see :mod:`rmqstore.kernel.layout`)."""

    window: Any
    rows: Any
    count: int
    offsets: Any  # the rows' physical offsets
    stamps: Any  # their store times
    dispatch_out: Any
    keys: Any  # HASHED_KEY entries of the rows, in order
    key_count: int
    runs: Any
    run_keys: list[tuple[str, int]]  # (topic, queue id) of each run
    units: Any
    # the rows' units in further queues (spec 6.8), gathered into runs as the kernel's
    # copy_runs describes them, each run's (queue, queue id), and the units the runs hold
    copy_runs: Any
    copy_run_keys: list[tuple[str, int]]
    copy_units: Any


class RecordListener(Protocol):
    def on_record(
        self,
        offset: int,
        header: RecordHeader,
        topic: str,
        properties: dict[str, str],
        stored: bytes,
    ) -> None:
        """A record taken on its own: ``properties`` decoded from ``stored``, its stored
        properties."""

    def batch_check(self, batch: RecordBatch) -> Any:
        """What taking the clean ``batch`` as a whole would do (changing nothing), or None
        when its records must go one by one through :meth:`on_record`."""

    def batch_apply(self, plan: Any) -> None: ...

    def finish(self, log_end: int) -> None: ...


@dataclass
class LogFacts:
    """What the record pass learned, for the other checks."""

    min_offset: int = 0
    end_offset: int = 0  # end of the last valid record of the log
    records: int = 0
    last_store_timestamp: int = 0  # the newest store time seen


class FileScan(Enum):
    """How the walk of a file (or of a range of it) ended."""

    RANGE_DONE = "range"  # reached a record at or after the end of the range
    FILE_DONE = "file"  # a BLANK record, or zeros / damage with nothing after in the file
    LOG_ENDED = "log"  # the end of the log (in the last file holding data)


@dataclass
class RangeEdges:
    """What a range's neighbours need to finish the checks that span ranges: its first
    record (store-time order) and, per queue, the first and the next queue offset."""

    first_record: tuple[int, int, str] | None = None  # (offset, store time, file)
    last_store_timestamp: int | None = None
    queue_first: dict[tuple[str, int], tuple[int, int, str]] = field(default_factory=dict)
    queue_next: dict[tuple[str, int], int] = field(default_factory=dict)


def log_place(file: str, offset: int) -> dict[str, Any]:
    """The position fields of commit-log ``offset`` in the commit-log ``file`` (store-relative;
    a commit-log file's name is the offset of its first byte)."""
    return {
        "file": file,
        "file_position": offset - int(PurePath(file).name),
        "commit_log_offset": offset,
    }


def relative(store: Store, path: Any) -> str:
    """``path`` as findings name it: relative to the store root when it is below it."""
    root, text = str(store.root), str(path)
    if text.startswith(root) and text[len(root) : len(root) + 1] == os.sep:
        return text[len(root) + 1 :]  # (a store of thousands of queues names each one)
    try:
        return str(path.relative_to(store.root))
    except ValueError:
        return text


class RecordPass:
    """Runs the commit-log checks; see the module docstring."""

    def __init__(
        self,
        store: Store,
        report: VerifyReport,
        *,
        check_crc: bool,
        listeners: Sequence[RecordListener] = (),
        progress: Callable[[int], None] | None = None,
    ) -> None:
        self.store = store
        self.report = report
        self.check_crc = check_crc
        self.listeners = listeners
        self.progress = progress
        self.log = CommitLog(store.commitlog_dir, store.commitlog_file_size, strict=False)
        self.facts = LogFacts(min_offset=self.log.min_offset)
        self.edges = RangeEdges()
        self.end_segment: Segment | None = None  # the file the log ends in
        self._walked_from: int | None = None  # where a broker's recovery walks from
        self._previous_time: int | None = None
        self._range_stop = 0  # physical offset: records starting here belong to the next range
        self._stopped_at = 0  # physical offset: the first record of the next range met
        # buffers of the kernel calls that check whole batches
        self._attention = array("q")
        self._no_dispatch = array("q")  # nothing flagged: every row is a queue candidate
        self._dispatch_out = array("q")
        self._keys = bytearray()  # sized at the first batch the listeners check
        self._units = bytearray()
        self._row_runs = array("q")
        self._runs = kernel_layout.zeroed(kernel_layout.RUN_WIDTH * 256)
        self._topics = kernel_layout.TopicNames()
        self._queue_names: dict[bytes, str] = {}  # further queues' names (copy_run_keys)
        self._copies = CopyRunTables()  # (a batch whose units do not fit goes record by record)

    def last_data_segment(self) -> Segment | None:
        """The last commit-log file whose first bytes are not zeros; of a store being
        written (``store.live_end``), the one its data ended in when verify began."""
        live_end = self.store.live_end
        if live_end is None:
            return self.log.last_data_segment()
        before = [segment for segment in self.log.segments if segment.start < live_end]
        return before[-1] if before else None

    def run(self, from_offset: int | None = None) -> LogFacts:
        """Check the files, walk the log, then what follows its end; finish the listeners."""
        self.check_files()
        self.walk(from_offset)
        self.finish_log([])
        return self.facts

    def walk(self, from_offset: int | None = None) -> LogFacts:
        """Walk every record from ``from_offset`` (default: the first) to the end of the log."""
        segments = self.log.segments
        start = self.log.min_offset if from_offset is None else from_offset
        first = self.log.queue.find(start) if segments else None
        if first is None:
            if from_offset is not None:
                raise InputError(f"offset {from_offset} is outside the commit-log files")
            self.facts.end_offset = start
            return self.facts
        last_data = self.last_data_segment()
        position = start - first.start
        for segment in segments[segments.index(first) :]:
            if self._written_since(segment):
                break
            self.end_segment = segment
            is_last = last_data is None or segment.start >= last_data.start
            ended = self._scan_file(segment, position, is_last, from_offset)
            from_offset = None
            position = 0
            if ended is FileScan.LOG_ENDED:
                break
        return self.facts

    def continue_after(self, segment: Segment) -> None:
        """Walk the files after ``segment`` (pre-allocated ones after the last file holding
        data) until the log ends, as :meth:`run` would."""
        segments = self.log.segments
        for following in segments[segments.index(segment) + 1 :]:
            if self._written_since(following):
                return
            self.end_segment = following
            if self._scan_file(following, 0, True, None) is FileScan.LOG_ENDED:
                return

    def _written_since(self, segment: Segment) -> bool:
        """Whether ``segment`` was made after verify began on a store being written."""
        live_end = self.store.live_end
        return live_end is not None and segment.start >= live_end

    def _damage_before_live_end(self, segment: Segment, position: int) -> bool:
        """Whether the log of a store being written, found to end at ``position`` of its
        last file, has data after it that was there when verify began: what stops the walk
        is then damage inside what the writer had written, not the end."""
        live_end = self.store.live_end
        if live_end is None or segment.start + position >= live_end:
            return False
        return nonzero_extent(segment.path, position, live_end - segment.start) is not None

    def finish_log(self, finished: Sequence[RecordListener]) -> None:
        """After the last record: what follows the end, then the listeners' own checks."""
        self._check_after_end(self.end_segment, self.facts.end_offset)
        for listener in [*self.listeners, *finished]:
            listener.finish(self.facts.end_offset)
        self.log.close()

    def scan_range(
        self,
        segment_start: int,
        start: int,
        stop: int,
        *,
        is_last: bool,
        exact_start: bool,
        from_offset: int | None = None,
    ) -> FileScan:
        """Check the records starting in ``[start, stop)`` of one file. Unless
        ``exact_start`` (the log's first record, or ``from_offset``), the range begins at the
        first record at or after ``start``."""
        segment = self.log.queue.find(segment_start)
        if segment is None:
            raise InputError(f"no commit-log file starts at {segment_start}")
        self.end_segment = segment
        if not exact_start:
            with FileWindows(segment.path, segment.size) as windows:
                found = find_next_record_in_file(windows, start, segment.start, search_end=stop)
            if found is None or found >= stop:
                return FileScan.RANGE_DONE  # the record before covers the range
            start = found
        return self._scan_file(segment, start, is_last, from_offset, stop)

    def check_files(self) -> None:
        report = self.report
        for problem in self.log.queue.problems:
            report.add("file-size", problem, file=relative(self.store, self.store.commitlog_dir))
        for path in self.log.queue.unexpected:
            if half_made(report, self.store, path):
                continue
            if is_segment_name(path.name):
                said = (
                    "not a regular file, under a commit-log file's name (a broker cannot load it)"
                )
            elif path.is_dir():
                said = (
                    "a folder among the commit-log files (a broker lists it with them and "
                    "cannot parse its name)"
                )
            else:
                said = "not a commit-log file (a broker cannot parse its name)"
            report.add("file-name", said, WARNING, file=relative(self.store, path))
        for previous, following in self.log.queue.gaps():
            report.add(
                "file-gap",
                f"expected the next file at {previous.start + self.log.file_size}",
                **log_place(relative(self.store, following.path), following.start),
            )
        report.checked["commitLogFiles"] += len(self.log.segments)

    def _scan_file(
        self,
        segment: Segment,
        position: int,
        is_last: bool,
        from_offset: int | None,
        stop: int | None = None,
    ) -> FileScan:
        """Walk one file from ``position``, up to the records starting at ``stop``."""
        try:
            windows = FileWindows(segment.path, segment.size)
        except StoreIOError:
            if self.store.written_elsewhere and not os.path.lexists(segment.path):
                raise StoreIOError(
                    f"{relative(self.store, segment.path)} was deleted while verify read the "
                    "store (a broker deletes its oldest commit-log files as they expire): run "
                    "verify again"
                ) from None
            raise
        file_size = windows.limit
        self._range_stop = segment.start + (file_size if stop is None else stop)
        live_end = self.store.live_end
        at_live_end = live_end is not None and live_end <= self._range_stop
        if at_live_end:  # records starting past where the data ended were written since
            self._range_stop = live_end
        name = relative(self.store, segment.path)
        try:
            while True:
                region = RegionScan(
                    None, position, file_size, segment.start, self.check_crc, windows=windows
                )
                if self._walk(region, segment):
                    if at_live_end:
                        self.facts.end_offset = self._stopped_at
                        return FileScan.LOG_ENDED
                    return FileScan.RANGE_DONE
                if (
                    from_offset is not None
                    and region.end_position == position
                    and region.stop is ScanStop.INVALID
                ):
                    raise InputError(f"no record starts at offset {from_offset}: {region.error}")
                if (
                    from_offset is not None
                    and region.end_position == position
                    and region.stop is ScanStop.END
                    and not data_ends_at(
                        windows.read, position, file_size, self.store.config.max_message_size
                    )
                ):
                    raise InputError(
                        f"no record starts at offset {from_offset}: it holds zeros, and the "
                        "file's data goes on after it"
                    )
                from_offset = None
                end = segment.start + region.end_position
                if region.stop is ScanStop.BLANK:
                    if region.blank_length != file_size - region.end_position:
                        self.report.add(
                            "blank-size",
                            f"BLANK declares {region.blank_length} bytes but "
                            f"{file_size - region.end_position} remain (damage: a broker "
                            "writes a BLANK over the rest of its file; its walk, and rmqstore's "
                            "readers, go on to the next file whatever it declares, and no "
                            "command rewrites it)",
                            **log_place(name, end),
                        )
                    self.facts.end_offset = end
                    return FileScan.FILE_DONE
                damage_before_live_end = is_last and self._damage_before_live_end(
                    segment, region.end_position
                )
                if is_last and not damage_before_live_end:
                    self.facts.end_offset = end
                    return FileScan.LOG_ENDED
                if region.stop is ScanStop.END and not damage_before_live_end:
                    unwalked = self._unwalked(segment)
                    self.report.add(
                        "file-incomplete",
                        "the file ends here without a BLANK record although later files hold "
                        + (
                            f"data ({_UNWALKED}: it keeps the later files, as rmqstore recover "
                            f"does; {_REPLAY_STOPS})"
                            if unwalked
                            else "data: a broker's recovery would cut the log at this offset"
                        ),
                        **log_place(name, end),
                        report_only=unwalked,
                    )
                    self.facts.end_offset = end
                    return FileScan.FILE_DONE
                resumed = find_next_record_in_file(windows, region.end_position, segment.start)
                skipped = (resumed if resumed is not None else file_size) - region.end_position
                unwalked = self._unwalked(segment)
                error = region.error
                if error is None:  # zeros, with data the writer had written after them
                    kind, what = "record-invalid", "zeros where a record should begin"
                else:
                    kind = _ERROR_KINDS.get(error.field, "record-invalid")
                    what = f"{error.field} {error.reason}"
                if unwalked:
                    consequence = (
                        f"{_UNWALKED}: it keeps the log past here, as rmqstore recover does; "
                        f"{_REPLAY_STOPS}"
                    )
                elif damage_before_live_end:
                    consequence = (
                        "a broker's recovery would cut the log here and drop what the broker "
                        "has written after it"
                    )
                else:
                    consequence = (
                        "a broker's recovery would cut the log here and drop every later file"
                    )
                self.report.add(
                    kind,
                    f"{what}; {skipped} bytes skipped ({consequence})",
                    **log_place(name, end),
                    report_only=unwalked,
                )
                if resumed is None:
                    self.facts.end_offset = end
                    return FileScan.LOG_ENDED if is_last else FileScan.FILE_DONE
                if segment.start + resumed >= self._range_stop:
                    if at_live_end:
                        self.facts.end_offset = segment.start + resumed
                        return FileScan.LOG_ENDED
                    return FileScan.RANGE_DONE
                position = resumed
        finally:
            windows.close()

    def _walk(self, region: RegionScan, segment: Segment) -> bool:
        """Check each record of a region; True when it reached a record of the next range.
        Without listeners a batch of rows with nothing to look at one by one (the record
        kernel's ``attention_rows``, consecutive queue offsets) is taken as a whole; any other
        batch goes record by record through :meth:`_walk_records`."""
        range_stop = self._range_stop
        for window, window_start, rows, count in region.batches():
            offsets = rows[_OFFSET_COLUMN : count * ROW_WIDTH : ROW_WIDTH]
            wanted = bisect_left(offsets, range_stop)
            if wanted and not self._clean_batch(window, rows, wanted, offsets, segment):
                self._walk_records(
                    region, segment, region.items(window, window_start, rows, wanted)
                )
            if wanted < count:
                self._stopped_at = offsets[wanted]
                return True  # reached a record of the next range
        return False

    def _clean_batch(
        self, window: Any, rows: Any, count: int, offsets: Any, segment: Segment
    ) -> bool:
        """Take rows ``[0, count)`` as a whole when none needs a look of its own; False (and
        nothing changed) otherwise."""
        if len(self._attention) < count:
            self._attention = kernel_layout.zeroed(count)
            self._no_dispatch = kernel_layout.new_dispatch_out(count)
            self._dispatch_out = kernel_layout.new_dispatch_out(count)
            self._units = bytearray(kernel_layout.UNIT_SIZE * count)
            self._row_runs = kernel_layout.zeroed(count)
        previous = self._previous_time
        options = kernel_layout.FORCE_PROPERTY_CRC if self.store.config.force_verify_prop_crc else 0
        if kernel.attention_rows(
            window, rows, 0, count, -1 if previous is None else previous, options, self._attention
        ):
            return False
        dispatch_out, key_count = self._no_dispatch, 0
        copies: tuple[Any, list[tuple[str, int]]] = (self._copies.runs, [])
        if self.listeners:  # they compare tagsCodes and index keys: prepare them
            dispatch_out = self._dispatch_out
            if not self._keys:
                self._keys = bytearray(kernel_layout.KEY_BUFFER_SIZE)
            done, key_count = kernel.prepare_dispatch(
                window, rows, 0, count, kernel_layout.INDEX_KEYS, dispatch_out, self._keys
            )
            width = kernel_layout.DISPATCH_WIDTH
            flags = dispatch_out[kernel_layout.DISPATCH_FLAGS : count * width : width]
            clean = flags.count(0)
            if done < count or clean + flags.count(_HAS_COPIES) != count:
                return False
            if clean < count:
                gathered = self._gather_copies(window, rows, flags, dispatch_out)
                if gathered is None:
                    return False
                copies = gathered
        done, found = kernel.queue_runs(
            window, rows, 0, count, dispatch_out, self._units, self._runs, self._row_runs
        )
        if done < count:
            return False  # more queues than the run table holds
        queue_next = self.edges.queue_next
        runs = self._runs
        width = kernel_layout.RUN_WIDTH
        started = []
        for number in range(found):
            at = number * width
            topic_row = runs[at + kernel_layout.RUN_TOPIC_ROW] * ROW_WIDTH
            topic = self._topics.of(window, rows, runs[at + kernel_layout.RUN_TOPIC_ROW])
            key = (topic, runs[at + kernel_layout.RUN_QUEUE_ID])
            expected = queue_next.get(key)
            first = runs[at + kernel_layout.RUN_FIRST_QUEUE_OFFSET]
            if (expected is not None and expected != first) or any(
                key == other for other, *_ in started
            ):
                return False  # a gap: reported record by record
            started.append((key, first, runs[at + kernel_layout.RUN_UNITS], topic_row))
        stamps = rows[kernel_layout.STORE_TIMESTAMP : count * ROW_WIDTH : ROW_WIDTH]
        plans = []
        if self.listeners:
            batch = RecordBatch(
                window,
                rows,
                count,
                offsets,
                stamps,
                dispatch_out,
                self._keys,
                key_count,
                runs,
                [key for key, *_ in started],
                self._units,
                copies[0],
                copies[1],
                self._copies.units,
            )
            for listener in self.listeners:
                check = getattr(listener, "batch_check", None)
                plan = check(batch) if check is not None else None
                if plan is None:
                    return False
                plans.append(plan)
        for listener, plan in zip(self.listeners, plans, strict=True):
            listener.batch_apply(plan)
        name = None
        for key, first, units, topic_row in started:
            if key not in queue_next:
                name = name or relative(self.store, segment.path)
                self.edges.queue_first[key] = (first, rows[topic_row + _OFFSET_COLUMN], name)
            queue_next[key] = first + units
        if previous is None and self.edges.first_record is None:
            self.edges.first_record = (offsets[0], stamps[0], relative(self.store, segment.path))
        self._previous_time = self.edges.last_store_timestamp = stamps[-1]
        facts = self.facts
        facts.last_store_timestamp = max(facts.last_store_timestamp, max(stamps))
        facts.records += count
        self.report.checked["records"] += count
        sizes = rows[kernel_layout.TOTAL_SIZE : count * ROW_WIDTH : ROW_WIDTH]
        self.report.checked["recordBytes"] += sum(sizes)
        if self.progress is not None:
            self.progress(offsets[count - 1])
        return True

    def _gather_copies(
        self, window: Any, rows: Any, flags: Any, dispatch_out: Any
    ) -> tuple[Any, list[tuple[str, int]]] | None:
        """The further-queue units of the rows flagged HAS_COPIES (queued records only, as a
        broker puts them) gathered into runs by the kernel (``copy_runs``, their tagsCode the
        one it prepared), and each run's queue; None when they do not fit its tables, or when
        a broker's dispatch throws at one of the rows (``copy_stops``)."""
        numbers = array("q", (number for number, flag in enumerate(flags) if flag))
        if kernel.copy_stops(window, rows, numbers, self._copies.scratch_for(len(numbers))):
            return None  # a record a broker's dispatch stops at: one by one, to name it
        found = self._copies.gather(window, rows, numbers, dispatch_out)
        if found is None:
            return None
        runs = self._copies.runs
        return runs, copy_run_keys(window, runs, found, self._queue_names)

    def _walk_records(self, region: RegionScan, segment: Segment, items: Any) -> bool:
        """Check each record of ``items`` (from ``region``); True when it reached a record
        of the next range. The common path is a handful of local operations; anything found
        goes through :meth:`_found`."""
        facts = self.facts
        edges = self.edges
        listeners = self.listeners
        queue_next = edges.queue_next
        previous_time = self._previous_time
        newest_time = facts.last_store_timestamp
        force_property_crc = self.store.config.force_verify_prop_crc
        progress = self.progress
        range_stop = self._range_stop
        records = facts.records
        record_bytes = 0
        reached_stop = False
        for offset, header, topic, props, crc_ok in items:
            if offset >= range_stop:
                reached_stop = True
                break
            if crc_ok is False:
                unwalked = self._unwalked(segment)
                self._found(
                    segment,
                    "record-body-crc",
                    offset,
                    f"BODYCRC {header[2]} does not match the body; "
                    + (
                        f"{_UNWALKED}: it keeps the record whatever checkCRCOnRecover says, "
                        "as rmqstore recover does"
                        if unwalked
                        else "recovery with checkCRCOnRecover cuts the log here"
                    ),
                    report_only=unwalked,
                )
            if force_property_crc or (props[-20:-12] == _CRC_NAME and props[-1:] == b"\x02"):
                self._check_property_crc(region, segment, offset, header.total_size)
            properties = None
            if not props.isascii():
                try:
                    props.decode("utf-8")
                except UnicodeDecodeError:
                    self._found(
                        segment,
                        "record-properties",
                        offset,
                        "properties are not valid UTF-8 (a broker reads them with "
                        "replacement characters)",
                        WARNING,
                    )
            if listeners or topic == SCHEDULE_TOPIC:
                properties = decode_properties(props)
                if topic == SCHEDULE_TOPIC and DELAY in properties:
                    self._check_delay(segment, offset, properties[DELAY])
                if listeners and COPIES_MARK in props:
                    self._check_copies(segment, offset, header, topic, properties, props)
            stamp = header.store_timestamp
            if previous_time is None:
                if edges.first_record is None:
                    edges.first_record = (offset, stamp, relative(self.store, segment.path))
            elif stamp < previous_time:
                self._found(
                    segment,
                    "store-time-order",
                    offset,
                    f"store time {stamp} is earlier than the previous record's {previous_time}",
                    NOTE,
                )
            previous_time = stamp
            if stamp > newest_time:
                newest_time = stamp
            if header.sys_flag & TRANSACTION_MASK in QUEUED_TRANSACTIONS:
                key = (topic, header.queue_id)
                expected = queue_next.get(key)
                queue_offset = header.queue_offset
                if expected is None:
                    edges.queue_first[key] = (
                        queue_offset,
                        offset,
                        relative(self.store, segment.path),
                    )
                elif queue_offset != expected:
                    self._found(
                        segment,
                        "queue-offset-gap",
                        offset,
                        f"queue offset {queue_offset} of {topic}:{key[1]} follows {expected - 1}"
                        + GAP_CONSEQUENCE,
                        WARNING,
                        topic=topic,
                        queue_id=key[1],
                        queue_offset=queue_offset,
                    )
                queue_next[key] = queue_offset + 1
            for listener in listeners:
                listener.on_record(offset, header, topic, properties, props)
            records += 1
            record_bytes += header.total_size
            if progress is not None and not records & 0x3FFF:
                progress(offset)
        self.report.checked["records"] += records - facts.records
        self.report.checked["recordBytes"] += record_bytes
        facts.records = records
        facts.last_store_timestamp = newest_time
        self._previous_time = edges.last_store_timestamp = previous_time
        return reached_stop

    def _found(
        self,
        segment: Segment,
        kind: str,
        offset: int,
        message: str,
        severity: str = ERROR,
        *,
        report_only: bool = False,
        **queue: Any,
    ) -> None:
        """Report a finding about the record at ``offset`` of ``segment`` (``queue``: its
        topic/queue_id/queue_offset position fields, where they matter)."""
        self.report.add(
            kind,
            message,
            severity,
            **log_place(relative(self.store, segment.path), offset),
            **queue,
            report_only=report_only,
        )

    def _unwalked(self, segment: Segment) -> bool:
        """Whether ``segment`` lies before the files a broker's recovery walks (from the
        third-last, or after a crash from the one the checkpoint picks): damage there is
        neither cut by recovery (nor rmqstore recover) nor ends the log."""
        if self._walked_from is None:
            self._walked_from = recovery_walks_from(self.log, self.store)
        return segment.start < self._walked_from

    def _check_property_crc(
        self, region: RegionScan, segment: Segment, offset: int, size: int
    ) -> None:
        position = offset - segment.start - region.window_start
        status = property_crc_status(region.window, position, size)
        forced = self.store.config.force_verify_prop_crc
        unwalked = self._unwalked(segment)
        # recovery cuts the log at it only with forceVerifyPropCRC, in the files it walks
        kept = (
            f"; {_UNWALKED}: it keeps the record, as rmqstore recover does"
            if unwalked
            else "; recovery with forceVerifyPropCRC cuts the log here"
            if forced
            else "; a broker keeps the record (its recovery checks the property only with "
            "forceVerifyPropCRC=true), as rmqstore recover does"
        )
        if status is False:
            self._found(
                segment,
                "record-property-crc",
                offset,
                f"the __CRC32# property does not match the record{kept}",
                report_only=unwalked or not forced,
            )
        elif status is None and forced:
            self._found(
                segment,
                "record-property-crc",
                offset,
                f"the __CRC32# property is missing (forceVerifyPropCRC){kept}",
                report_only=unwalked,
            )

    def _check_delay(self, segment: Segment, offset: int, level: str) -> None:
        """A SCHEDULE_TOPIC_XXXX record whose DELAY a broker cannot parse is an invalid record
        to it (spec §2.7): its recovery cuts the log there, rmqstore recover too, in the files
        it walks; before them it keeps the record, and its dispatch stops at it."""
        try:
            parse_java_int(level)
        except ValueError:
            unwalked = self._unwalked(segment)
            consequence = (
                f" ({_UNWALKED}: it keeps the record, as rmqstore recover does; {_REPLAY_STOPS})"
                if unwalked
                else ": its recovery cuts the log here, and its dispatch stops here"
            )
            self._found(
                segment,
                "record-invalid",
                offset,
                f"DELAY={quoted(level)} is not a number, so a broker finds the record invalid"
                + consequence,
                report_only=unwalked,
            )

    def _check_copies(
        self,
        segment: Segment,
        offset: int,
        header: RecordHeader,
        topic: str,
        properties: dict[str, str],
        stored: bytes,
    ) -> None:
        """A queued record whose further queues' offsets hold a piece a broker's
        ``Long.parseLong`` refuses: the broker's dispatch throws there, over and over
        (:func:`rmqstore.multidispatch.dispatch_stop`)."""
        if header.sys_flag & TRANSACTION_MASK not in QUEUED_TRANSACTIONS:
            return
        stop = dispatch_stop(topic, header.queue_id, properties, stored)
        if stop is None:
            return
        self._found(
            segment,
            "dispatch-stop",
            offset,
            f"piece {stop.number + 1} of INNER_MULTI_QUEUE_OFFSET, {quoted(stop.piece)} "
            f"(for {quoted(stop.queue)}), is no number to a broker: its dispatch writes the "
            "units before it, throws, and tries the record again for ever, so no later "
            "record reaches a consume queue or the index, and a crash recovery that "
            "dispatches it fails the broker's start-up (rmqstore dispatch writes those "
            "units and goes on)",
            topic=topic,
            queue_id=header.queue_id,
            queue_offset=header.queue_offset,
        )

    def _check_after_end(self, end_segment: Segment | None, end: int) -> None:
        """What follows the valid end: a torn tail after a crash (abort present), stale bytes
        a broker's recovery left (no abort), or whole files of data a broker would delete."""
        if end_segment is None or self.store.live_end is not None:
            return  # (a store being written: what follows is what its writer adds)
        aborted = self.store.aborted
        for segment in self.log.segments:
            if segment.start < end_segment.start:
                continue
            start = end - segment.start if segment is end_segment else 0
            extent = nonzero_extent(segment.path, max(start, 0), segment.size)
            if extent is None:
                continue
            name = relative(self.store, segment.path)
            count = extent[1] - max(start, 0)
            if segment is not end_segment:
                self.report.add(
                    "data-after-end",
                    f"{count} bytes of data in a file after the end of the log at "
                    f"{end} (a broker's recovery deletes this file)",
                    **log_place(name, segment.start + extent[0]),
                )
            elif aborted:
                self.report.add(
                    "torn-tail",
                    f"{count} non-zero bytes after the last valid record and the "
                    "store was not closed cleanly: a torn write that recovery cuts",
                    **log_place(name, end),
                )
            else:
                self.report.add(
                    "stale-bytes-after-end",
                    f"{count} non-zero bytes after the last valid record, as a "
                    "broker's recovery leaves them; ignored by brokers",
                    NOTE,
                    **log_place(name, end),
                )
