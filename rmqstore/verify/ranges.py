"""``verify`` in ranges: the commit log cut into byte ranges that are checked independently
(in parallel, on Spark) and merged into the report one pass over the store gives.

A range knows only its own records. What spans ranges is finished when merging: the first
record of a range against the last of the one before (store-time order, queue-offset
density), the counts of the consume-queue and index checks, and the end of the log. A range
starting inside a file begins at the first record at or after its start, found as a damaged
region is skipped (magic code, stored physical offset, a record that decodes).

Which ranges count is decided afterwards, as a single pass would have walked: in each file,
the ranges up to the one where the file ends (a BLANK record, zeros, or, in the last file
holding data, the first invalid record), and no file after the end of the log.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rmqstore.config import StoreConfig
from rmqstore.errors import InputError, RecordError, RmqStoreError, StoreFormatError
from rmqstore.indexfile import IndexHeader
from rmqstore.pipeline.ranges import plan_spans
from rmqstore.segments import data_end_estimate, file_reader
from rmqstore.store import Store
from rmqstore.verify import (
    CROSS_CHECKS,
    VerifyOptions,
    check_layout,
    check_shared,
    note_changed,
    note_live,
    settle_live_end,
    weigh_rebuild,
    weigh_recover,
    write_marks,
)
from rmqstore.verify.checkpoint import check_checkpoint_and_abort, read_store_state
from rmqstore.verify.config import check_config_files
from rmqstore.verify.findings import NOTE, WARNING, VerifyReport
from rmqstore.verify.index import EntryPosition, IndexChecks
from rmqstore.verify.queues import QueueChecks, readable_checks
from rmqstore.verify.records import (
    GAP_CONSEQUENCE,
    FileScan,
    LogFacts,
    RangeEdges,
    RecordListener,
    RecordPass,
    log_place,
)
from rmqstore.workers import Runner, run_here

DEFAULT_RANGE_SIZE = 32 * 1024 * 1024


@dataclass(frozen=True)
class VerifyRange:
    """One range of one commit-log file, with what its checks need to know."""

    number: int
    segment_start: int
    start: int  # file position
    stop: int  # file position: records starting here belong to the next range
    is_last: bool  # in the last file holding data (an invalid record ends the log)
    exact_start: bool  # a record starts at ``start`` (a file's start, or the pass's first)
    from_offset: int | None
    entries_from: EntryPosition  # index entries this range compares with records
    entries_to_range: EntryPosition  # ... up to the next range's
    entries_to_file: EntryPosition  # ... up to the next file's (when the file ends here)


@dataclass(frozen=True)
class RangeJob:
    """Everything an executor needs to check one range: picklable, no open files."""

    root: str
    config: StoreConfig
    check_crc: bool
    checks: frozenset[str]  # "queues", "index": checked against the records
    topics: frozenset[str] | None
    max_findings: int | None
    range: VerifyRange
    queue_bounds: dict[tuple[str, int], tuple[int, int, int]] | None = None
    # the BatchCQ topics, found once (not from config/topics.json again for every range)
    batch_topics: frozenset[str] = frozenset()
    live_end: int | None = None  # of a store being written: see Store.live_end
    # of a store being written, the index files' headers as the driver read them
    index_view: dict[str, IndexHeader] | None = None


@dataclass
class RangeOutcome:
    number: int
    scan: FileScan
    report: VerifyReport
    facts: LogFacts
    edges: RangeEdges
    end_segment: int | None  # start of the file the range's walk ended in
    queues: dict[str, Any] | None
    index: dict[str, Any] | None
    error: tuple[type[RmqStoreError], str] | None = None


def check_range(job: RangeJob) -> RangeOutcome:
    """Check one range (runs on an executor). Engine errors come back in the outcome."""
    part = job.range
    report = VerifyReport(max_findings=job.max_findings)
    store: Store | None = None
    try:
        store = Store.open_read(job.root, job.config)
        store.live_end = job.live_end
        queues = index = None
        topics = set(job.topics) if job.topics else None
        if "queues" in job.checks:
            queues = QueueChecks(
                store,
                report,
                topics,
                structural=False,
                bounds=job.queue_bounds,
                excluded=job.batch_topics,
            )
        if "index" in job.checks:
            index = IndexChecks(
                store,
                report,
                topics,
                structural=False,
                entries_from=part.entries_from,
                after_records=part.number > 0,
                view=job.index_view,
            )
        listeners: list[RecordListener] = [c for c in (queues, index) if c is not None]
        record_pass = RecordPass(store, report, check_crc=job.check_crc, listeners=listeners)
        scan = record_pass.scan_range(
            part.segment_start,
            part.start,
            part.stop,
            is_last=part.is_last,
            exact_start=part.exact_start,
            from_offset=part.from_offset,
        )
        if index is not None:
            if scan is FileScan.LOG_ENDED:
                index.drain(None, record_pass.facts.end_offset)
            else:
                index.drain(
                    part.entries_to_range if scan is FileScan.RANGE_DONE else part.entries_to_file
                )
            index.close()
        if queues is not None:
            queues.close()
        record_pass.log.close()
        end_segment = record_pass.end_segment
        return RangeOutcome(
            part.number,
            scan,
            report,
            record_pass.facts,
            record_pass.edges,
            end_segment.start if end_segment is not None else None,
            queues.partial() if queues is not None else None,
            index.partial() if index is not None else None,
        )
    except RmqStoreError as exc:
        kind = StoreFormatError if isinstance(exc, RecordError) else type(exc)
        return RangeOutcome(
            part.number,
            FileScan.RANGE_DONE,
            report,
            LogFacts(),
            RangeEdges(),
            None,
            None,
            None,
            (kind, str(exc)),
        )
    finally:
        if store is not None:
            store.close()


class RangedVerify:
    """Plans the ranges of a store, has a runner check them, and merges the outcomes."""

    def __init__(
        self,
        store: Store,
        *,
        check_crc: bool,
        commitlog_only: bool,
        topics: frozenset[str] | None,
        from_offset: int | None,
        max_findings: int | None,
        range_size: int = DEFAULT_RANGE_SIZE,
        checks: frozenset[str] = CROSS_CHECKS,
    ) -> None:
        if range_size <= 0:
            raise InputError(f"range size {range_size} must be positive")
        self.store = store
        self.check_crc = check_crc
        self.topics = topics
        self.from_offset = from_offset
        self.range_size = range_size
        self.report = VerifyReport(max_findings=max_findings)
        self.marks = write_marks(store)
        check_layout(store, self.report)
        checks = frozenset() if commitlog_only else checks
        check_shared(store, self.report)
        self.state = read_store_state(store)  # before the data it vouches for
        self.checks = readable_checks(store, self.report, checks)
        self.queues: QueueChecks | None = None
        self.index: IndexChecks | None = None
        selected = set(topics) if topics else None
        if "queues" in self.checks:
            self.queues = QueueChecks(store, self.report, selected, defer_scans=True)
        if "index" in self.checks:
            self.index = IndexChecks(store, self.report, selected, defer_scans=True)
        settle_live_end(store)
        self.record_pass = RecordPass(store, self.report, check_crc=check_crc)

    @classmethod
    def for_options(
        cls, store: Store, options: VerifyOptions, range_size: int = DEFAULT_RANGE_SIZE
    ) -> RangedVerify:
        """The ranged verify of what ``verify_store(store, options)`` checks."""
        return cls(
            store,
            check_crc=options.check_crc,
            commitlog_only=options.commitlog_only,
            checks=options.cross_checks,
            topics=options.topics,
            from_offset=options.from_offset,
            max_findings=options.max_findings,
            range_size=range_size,
        )

    def plan(self) -> list[VerifyRange]:
        """The ranges from the first record checked to the end of the last file holding
        data (empty when there is nothing to walk: :meth:`run` then walks it here)."""
        log = self.record_pass.log
        segments = log.segments
        start = log.min_offset if self.from_offset is None else self.from_offset
        first = log.queue.find(start) if segments else None
        last_data = self.record_pass.last_data_segment()
        if first is None or last_data is None or first.start > last_data.start:
            return []
        walked = segments[segments.index(first) : segments.index(last_data) + 1]
        spans = [
            (file_start, position, stop, last)
            for file_start, _, position, stop, last in plan_spans(
                [(segment.start, segment.size) for segment in walked],
                self.range_size,
                begin=start - first.start,
                data_end=lambda _, size: (
                    data_end_estimate(file_reader(last_data.path), size)
                    if self.store.live_end is None
                    else min(size, self.store.live_end - last_data.start)
                ),
            )
        ]
        next_file: dict[int, int] = {}
        for segment in walked:
            following = segments.index(segment) + 1
            next_file[segment.start] = (
                segments[following].start
                if following < len(segments)
                else segment.start + segment.size
            )
        offsets = [segment_start + position for segment_start, position, _, _ in spans]
        file_ends = [next_file[segment_start] for segment_start, _, _, _ in spans]
        if self.index is not None:
            wanted = sorted(set(offsets) | set(file_ends))  # one pass over the entries
            found = dict(zip(wanted, self.index.positions_of(wanted), strict=True))
            entry_starts = [found[offset] for offset in offsets]
            entry_file_ends = [found[offset] for offset in file_ends]
            stream_end = self.index.stream_end()
        else:
            entry_starts = [(0, 1)] * len(spans)
            entry_file_ends = [(0, 1)] * len(spans)
            stream_end = (0, 1)
        ranges = []
        for number, (segment_start, position, stop, is_last) in enumerate(spans):
            following = entry_starts[number + 1] if number + 1 < len(spans) else stream_end
            ranges.append(
                VerifyRange(
                    number=number,
                    segment_start=segment_start,
                    start=position,
                    stop=stop,
                    is_last=is_last,
                    exact_start=number == 0 or position == 0,
                    from_offset=self.from_offset if number == 0 else None,
                    entries_from=(0, 1) if number == 0 else entry_starts[number],
                    entries_to_range=following,
                    entries_to_file=entry_file_ends[number],
                )
            )
        return ranges

    def jobs(self, ranges: list[VerifyRange]) -> list[RangeJob]:
        bounds = self.queues.bounds() if self.queues is not None else None
        being_written = self.store.live_end is not None
        index_view = self.index.view() if being_written and self.index is not None else None
        return [
            RangeJob(
                str(Path(self.store.root).resolve()),
                self.store.config,
                self.check_crc,
                self.checks,
                self.topics,
                self.report.max_findings,
                part,
                bounds,
                self.store.batch_queue_topics,
                self.store.live_end,
                index_view,
            )
            for part in ranges
        ]

    def run(self, runner: Runner = run_here) -> VerifyReport:
        self.record_pass.check_files()
        ranges = self.plan()
        if not ranges:
            self._run_deferred()
            listeners = [c for c in (self.queues, self.index) if c is not None]
            self.record_pass.listeners = listeners
            facts = self.record_pass.walk(self.from_offset)
            return self._conclude(facts)
        jobs = self.jobs(ranges)
        with ThreadPoolExecutor(max_workers=1) as pool:
            checked = pool.submit(lambda: list(runner(check_range, jobs)))
            self._run_deferred()  # the whole-file scans, while the ranges are checked
            outcomes = sorted(checked.result(), key=lambda outcome: outcome.number)
        return self._merge(ranges, outcomes)

    def _run_deferred(self) -> None:
        for checks in (self.queues, self.index):
            if checks is not None:
                checks.run_deferred()

    def _merge(self, ranges: list[VerifyRange], outcomes: list[RangeOutcome]) -> VerifyReport:
        kept = _walked(ranges, outcomes)
        for outcome in kept:
            if outcome.error is not None:
                kind, message = outcome.error
                raise kind(message)
        report = self.report
        facts = self.record_pass.facts
        previous_time: int | None = None
        queue_next: dict[tuple[str, int], int] = {}
        end_segment = None
        for outcome in kept:
            edges = outcome.edges
            first = edges.first_record
            if first is not None and previous_time is not None and first[1] < previous_time:
                report.add(
                    "store-time-order",
                    f"store time {first[1]} is earlier than the previous record's {previous_time}",
                    NOTE,
                    **log_place(first[2], first[0]),
                )
            if edges.last_store_timestamp is not None:
                previous_time = edges.last_store_timestamp
            for key, (queue_offset, offset, file) in edges.queue_first.items():
                expected = queue_next.get(key)
                if expected is not None and queue_offset != expected:
                    report.add(
                        "queue-offset-gap",
                        f"queue offset {queue_offset} of {key[0]}:{key[1]} follows {expected - 1}"
                        + GAP_CONSEQUENCE,
                        WARNING,
                        **log_place(file, offset),
                        topic=key[0],
                        queue_id=key[1],
                        queue_offset=queue_offset,
                    )
            queue_next.update(edges.queue_next)
            report.absorb(outcome.report)
            facts.records += outcome.facts.records
            facts.last_store_timestamp = max(
                facts.last_store_timestamp, outcome.facts.last_store_timestamp
            )
            if outcome.scan is not FileScan.RANGE_DONE:
                facts.end_offset = outcome.facts.end_offset
            end_segment = outcome.end_segment
            if self.queues is not None and outcome.queues is not None:
                self.queues.absorb(outcome.queues)
            if self.index is not None and outcome.index is not None:
                self.index.absorb(outcome.index)
        record_pass = self.record_pass
        record_pass.end_segment = record_pass.log.queue.find(
            facts.min_offset if end_segment is None else end_segment
        )
        if kept[-1].scan is not FileScan.LOG_ENDED and record_pass.end_segment is not None:
            record_pass.continue_after(record_pass.end_segment)  # pre-allocated files
        if self.index is not None:
            ended = kept[-1].scan is FileScan.LOG_ENDED
            self.index.skip_to(self.index.stream_end() if ended else ranges[-1].entries_to_file)
        return self._conclude(facts)

    def _conclude(self, facts: LogFacts) -> VerifyReport:
        finished = [c for c in (self.queues, self.index) if c is not None]
        self.record_pass.listeners = []
        self.record_pass.finish_log(finished)
        note_live(self.store, self.report, facts)
        check_checkpoint_and_abort(
            self.store, self.report, facts, self.queues, self.index, self.state, self.from_offset
        )
        check_config_files(self.store, self.report, self.queues)
        note_changed(self.store, self.report, self.marks)
        weigh_rebuild(self.store, self.report, self.index)
        weigh_recover(self.store, self.report)
        return self.report


def _walked(ranges: list[VerifyRange], outcomes: list[RangeOutcome]) -> list[RangeOutcome]:
    """The outcomes of the ranges a single pass walks: in each file up to the range where
    the file ends, and none after the range where the log ends."""
    kept = []
    done_file = None
    for part, outcome in zip(ranges, outcomes, strict=True):
        if part.segment_start == done_file:
            continue
        kept.append(outcome)
        if outcome.error is not None or outcome.scan is FileScan.LOG_ENDED:
            break
        if outcome.scan is FileScan.FILE_DONE:
            done_file = part.segment_start
    return kept
