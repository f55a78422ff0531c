"""``dispatch --rebuild --jobs N``: the rebuild of consume queues and index with the reading of
the commit log in worker processes. No pyspark here.

Each worker reads one range of the log (:mod:`rmqstore.pipeline.ranges`) and does all the work
that depends only on the record: properties, tagsCode (the deliver time for
SCHEDULE_TOPIC_XXXX), the packed 20-byte units of each queue and the Java hashes of the index
keys. It also summarises its range, as the summary pass of the other pipelines does, and stops
collecting at the first record where dispatch would stop (an invalid record, a CRC failure
where recovery checks CRCs, a DELAY that is not a number).

This process takes the ranges back in log order and applies them with the broker's put rules:
the units of a queue in one write where they continue it, one by one (duplicates skipped,
gaps reported) where they do not, and the index entries chained into the files in order. Once a
range says dispatch stops there, later ranges are not applied; at the end the walk's
summaries give the cut, the new cursor and the log end exactly as the Spark rebuild and a
walk in one process find them. At most two ranges per worker are in flight, so memory does not
grow with the store.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field

from rmqstore.commitlog import LogEnd
from rmqstore.consumequeue import CQ_UNIT_SIZE, UNIT, PutOutcome
from rmqstore.delay import SCHEDULE_TOPIC, DelayLevels
from rmqstore.dispatch import Dispatcher, DispatchResult, out_of_order_problem
from rmqstore.hashing import index_key_hash_with_prefix, java_string_hash, tags_code
from rmqstore.indexfile import HASHED_KEY
from rmqstore.pipeline.location import StoreLocation
from rmqstore.pipeline.ranges import (
    FileRange,
    RangeScan,
    RangeSummary,
    RangeTally,
    WalkEnd,
    dispatch_end,
    plan_ranges,
    record_margin,
    stops_dispatch,
    walk_in_order,
)
from rmqstore.properties import KEYS, TAGS, UNIQ_KEY, decode_properties, split_keys
from rmqstore.record import (
    H_QUEUE_ID,
    H_QUEUE_OFFSET,
    H_STORE_TIMESTAMP,
    H_SYS_FLAG,
    H_TOTAL_SIZE,
    QUEUED_TRANSACTIONS,
    TRANSACTION_MASK,
    TRANSACTION_ROLLBACK,
    ScanStop,
)
from rmqstore.store import Store
from rmqstore.workers import process_map


@dataclass(frozen=True)
class DispatchJob:
    """One range to prepare for dispatch: picklable, for a worker process."""

    store: str
    part: FileRange
    check_crc: bool
    delay_levels: str | None
    topics: frozenset[str] | None  # the consume queues rebuilt (None: all)
    build_index: bool


@dataclass(slots=True)
class UnitRun:
    """Units of one queue for consecutive queue offsets from ``queue_offset``, packed as they
    go into the file, with the store time of each record."""

    topic: str
    queue_id: int
    queue_offset: int
    first_record: int  # physical offset of the first record (for problems)
    units: bytearray = field(default_factory=bytearray)
    stamps: array = field(default_factory=lambda: array("q"))

    @property
    def next_offset(self) -> int:
        return self.queue_offset + len(self.stamps)


@dataclass
class PreparedRange:
    """What a worker sends back for one range."""

    summary: RangeSummary
    records: int  # records to dispatch (before the range's first stop)
    runs: list[UnitRun]  # in the order they were started
    index: bytearray  # the keys to index, packed with HASHED_KEY, in log order


def prepare_range(job: DispatchJob) -> PreparedRange:
    """Read one range and prepare its units and index entries (runs in a worker)."""
    levels = DelayLevels(job.delay_levels) if job.delay_levels else DelayLevels()
    scan = RangeScan(StoreLocation(job.store), job.part, job.check_crc, resync_last=False)
    tally = RangeTally()
    topics = job.topics
    build_index = job.build_index
    open_runs: dict[tuple[str, int], UnitRun] = {}
    runs: list[UnitRun] = []
    index = bytearray()
    pack_key = HASHED_KEY.pack
    prefixes: dict[str, int] = {}
    pack_unit = UNIT.pack
    walked = total = records = 0
    collecting = True
    for _, _, offset, header, topic, props, crc_ok in scan:
        walked += 1
        size = header[H_TOTAL_SIZE]
        total += size
        if crc_ok is False and tally.first_crc_failure is None:
            tally.first_crc_failure = offset
            collecting = False
        if collecting and scan.invalid_regions:
            collecting = False  # a damaged region was skipped: dispatch stopped before it
        if not collecting:
            if topic == SCHEDULE_TOPIC and tally.first_bad_delay is None and b"DELAY" in props:
                tally.check_delay(offset, header, decode_properties(props), levels)
            continue
        properties = decode_properties(props)
        store_timestamp = header[H_STORE_TIMESTAMP]
        if topic == SCHEDULE_TOPIC:
            code = tally.check_delay(offset, header, properties, levels)
            if code is None:
                collecting = False
                continue
        else:
            code = tags_code(properties.get(TAGS))
        transaction = header[H_SYS_FLAG] & TRANSACTION_MASK
        if transaction in QUEUED_TRANSACTIONS and (topics is None or topic in topics):
            key = (topic, header[H_QUEUE_ID])
            queue_offset = header[H_QUEUE_OFFSET]
            run = open_runs.get(key)
            if run is None or run.next_offset != queue_offset:
                run = open_runs[key] = UnitRun(topic, key[1], queue_offset, offset)
                runs.append(run)
            run.units += pack_unit(offset, size, code)
            run.stamps.append(store_timestamp)
        if build_index and transaction != TRANSACTION_ROLLBACK:
            uniq = properties.get(UNIQ_KEY)
            keys_text = properties.get(KEYS)
            keys = split_keys(keys_text) if keys_text else []
            if uniq is not None or keys:
                prefix = prefixes.get(topic)
                if prefix is None:
                    prefix = prefixes[topic] = java_string_hash(f"{topic}#")
                if uniq is not None and not keys:
                    index += pack_key(
                        offset, store_timestamp, index_key_hash_with_prefix(prefix, uniq), 1
                    )
                else:
                    first = 1
                    for key in [uniq, *keys] if uniq is not None else keys:
                        hashed = index_key_hash_with_prefix(prefix, key)
                        index += pack_key(offset, store_timestamp, hashed, first)
                        first = 0
        records += 1
    tally.records, tally.bytes = walked, total
    return PreparedRange(tally.summary(scan), records, runs, index)


class _Applier:
    """Puts prepared ranges into the dispatcher's queues and index, in log order."""

    def __init__(self, dispatcher: Dispatcher, result: DispatchResult) -> None:
        self.dispatcher = dispatcher
        self.result = result
        self.touched: set[tuple[str, int]] = set()
        self.newest: tuple[int, int] | None = None  # (physical offset, store time) written

    def apply(self, prepared: PreparedRange) -> None:
        result = self.result
        result.records += prepared.records
        problems: list[tuple[int, str]] = []
        for run in prepared.runs:
            self._put_run(run, problems)
        result.problems.extend(text for _, text in sorted(problems, key=lambda item: item[0]))
        index = self.dispatcher.index
        if index is not None and prepared.index:
            indexed, entries = index.build_hashed(prepared.index)
            result.index_records += indexed
            result.index_entries += entries

    def _put_run(self, run: UnitRun, problems: list[tuple[int, str]]) -> None:
        dispatcher = self.dispatcher
        key = (run.topic, run.queue_id)
        queue = dispatcher.queues.get(key)
        if queue is None:
            texts: list[str] = []
            queue = dispatcher.new_queue(run.topic, run.queue_id, texts)
            problems.extend((run.first_record, text) for text in texts)
            if queue is None:
                return
        units = memoryview(run.units)
        count = len(run.stamps)
        first, first_size, _ = UNIT.unpack_from(units, 0)
        if queue.put_run(run.queue_offset, units, first + first_size):
            self.result.units_written += count
            self.touched.add(key)
            self._wrote(UNIT.unpack_from(units, len(units) - CQ_UNIT_SIZE)[0], run.stamps[-1])
            return
        for number in range(count):  # as a walk puts them: duplicates skipped, gaps told
            offset, size, code = UNIT.unpack_from(units, number * CQ_UNIT_SIZE)
            outcome = queue.put(run.queue_offset + number, offset, size, code)
            if outcome is PutOutcome.DUPLICATE:
                self.result.units_skipped += 1
                continue
            self.result.units_written += 1
            self.touched.add(key)
            self._wrote(offset, run.stamps[number])
            if outcome is PutOutcome.OUT_OF_ORDER:
                problems.append(
                    (
                        offset,
                        out_of_order_problem(
                            offset, run.queue_offset + number, run.topic, run.queue_id
                        ),
                    )
                )

    def _wrote(self, offset: int, stamp: int) -> None:
        if self.newest is None or offset > self.newest[0]:
            self.newest = (offset, stamp)


def rebuild_in_workers(
    store: Store,
    *,
    from_offset: int,
    topics: frozenset[str] | None,
    build_index: bool,
    workers: int,
    split: int,
    clock: Callable[[], int] | None = None,
    utc_index_names: bool = False,
    progress: Callable[[int], None] | None = None,
) -> DispatchResult:
    """Dispatch the whole log into the empty consume queues (and index) of ``store``, opened
    for writing with the old files moved to quarantine, reading it in ``workers`` processes:
    the same files and result as ``Dispatcher.run``. ``clock`` and ``utc_index_names`` name
    new index files (tests, fixtures); ``progress`` gets the end of each range applied."""
    config = store.config
    crc_from = crc_checked_from(store)
    location = StoreLocation(str(store.root))
    dispatcher = Dispatcher(
        store,
        topics=topics,
        build_index=build_index,
        clock=clock,
        utc_index_names=utc_index_names,
    )
    try:
        jobs = [
            DispatchJob(
                location.uri,
                part,
                crc_from is not None and part.file_start >= crc_from,
                config.message_delay_level,
                topics,
                dispatcher.build_index,
            )
            for part in plan_ranges(
                location, split, split_last=True, margin=record_margin(config.max_message_size)
            )
        ]
        if len(jobs) <= 1:  # nothing to share out
            return dispatcher.run(from_offset, progress=progress)
        store.begin_write()
        result = DispatchResult(from_offset=from_offset, to_offset=from_offset)
        applier = _Applier(dispatcher, result)
        walked: list[RangeSummary] = []
        stopped = False
        with closing(process_map(workers, prepare_range, jobs)) as prepared_ranges:
            for prepared in walk_in_order(prepared_ranges, lambda item: item.summary):
                walked.append(prepared.summary)
                if not stopped:
                    applier.apply(prepared)
                    stopped = stops_dispatch(prepared.summary, crc_from)
                if progress is not None:
                    progress(int(prepared.summary.file) + prepared.summary.stop)
        end = walk_end(store, walked, crc_from)
        settle_walk_end(store, result, walked, end, from_offset)
        result.queues_touched = len(applier.touched)
        dispatcher.finish(result, applier.newest[1] if applier.newest else None)
        return result
    finally:
        dispatcher.close()


def crc_checked_from(store: Store) -> int | None:
    """Where a rebuild checks body CRCs from, as recovery would (None: nowhere)."""
    recovery = store.commitlog.recovery_start(store.checkpoint(), store.aborted)
    return recovery.start if recovery is not None and store.config.check_crc_on_recover else None


def walk_end(store: Store, walked: list[RangeSummary], crc_from: int | None) -> WalkEnd:
    """:func:`dispatch_end` of a walk of ``store``'s log."""
    data_files = {summary.file for summary in walked}
    later = [s.start for s in store.commitlog.segments if s.name > max(data_files, default="")]
    return dispatch_end(walked, next_file_start=later[0] if later else None, crc_from=crc_from)


def settle_walk_end(
    store: Store, result: DispatchResult, walked: list[RangeSummary], end: WalkEnd, from_offset: int
) -> None:
    """Set the new cursor, the log end and what stopped a rebuild from the walk's summaries,
    and tell the store where its log ends (it notes bytes left after it)."""
    result.to_offset = _end_of_last_record(walked, end.cut, from_offset, result.records)
    if end.kind == "delay":
        result.log_end = store.log_end().offset
        result.stopped_by = end.reason
        return
    result.log_end = end.cut
    stop = ScanStop.END if end.kind == "end" else ScanStop.INVALID
    log_end = LogEnd(end.cut, stop, None, store.commitlog.queue.find(end.cut))
    store.remember_log_end(log_end)
    store.check_tail(log_end)
    result.stopped_by = end.reason


def _end_of_last_record(
    walked: list[RangeSummary], cut: int, from_offset: int, records: int
) -> int:
    """Where the last record before ``cut`` ends: ``cut`` itself inside a file (records are
    back to back), else where the records of the file before end."""
    if records == 0:
        return from_offset
    ends: dict[int, int] = {}
    for summary in walked:
        start = int(summary.file)
        if summary.records and start < cut:
            limit = summary.end if summary.end is not None else summary.stop
            ends[start] = max(ends.get(start, 0), start + limit)
    holders = [start for start in ends if start < cut]
    if not holders:
        return from_offset
    last_file = max(holders)
    return cut if cut <= ends[last_file] else ends[last_file]
