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
from bisect import bisect_left
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

from rmqstore import kernel
from rmqstore.commitlog import LogEnd
from rmqstore.consumequeue import CQ_UNIT_SIZE, UNIT, ConsumeQueue, PutOutcome
from rmqstore.delay import SCHEDULE_TOPIC, DelayLevels
from rmqstore.dispatch import (
    Dispatcher,
    DispatchResult,
    damage_before_end,
    out_of_order_problem,
    out_of_range_problem,
)
from rmqstore.hashing import index_key_hash_with_prefix, java_string_hash, tags_code
from rmqstore.indexfile import HASHED_KEY
from rmqstore.kernel import layout
from rmqstore.multidispatch import (
    CopyRunTables,
    dispatch_stop_problem,
    kernel_copy_rows,
    record_units,
)
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
    QUEUED_TRANSACTIONS,
    TRANSACTION_MASK,
    TRANSACTION_ROLLBACK,
    ScanStop,
    record_item,
)
from rmqstore.stops import whole
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
    # records a broker's dispatch stops at (multidispatch.dispatch_stop_problem): (offset, text)
    problems: list[tuple[int, str]] = field(default_factory=list)


def prepare_range(job: DispatchJob) -> PreparedRange:
    """Read one range and prepare its units and index entries (runs in a worker)."""
    scan = RangeScan(StoreLocation(job.store), job.part, job.check_crc, resync_last=False)
    preparer = _RangePreparer(job)
    for buf, _, rows, count in scan.batches():
        preparer.batch(buf, rows, count, damaged_before=scan.invalid_regions > 0)
    tally = preparer.tally
    tally.first_crc_failure = scan.first_crc_failure
    return PreparedRange(
        tally.summary(scan), preparer.records, preparer.runs, preparer.index, preparer.problems
    )


_RUN_CAPACITY = 1024  # runs gathered per kernel call


class _RangePreparer:
    """What :func:`prepare_range` collects, batch by batch: the kernel prepares the rows
    (tagsCodes, index key hashes) and gathers their units into runs per queue; the rows it
    leaves to the reference (a SCHEDULE_TOPIC_XXXX record, text that is not ASCII) are
    prepared one by one, in order. Collecting stops at the first record dispatch would stop
    at (a damaged region skipped before it, a failed CRC check, a DELAY that is not a
    number); the rest of the range is only counted."""

    def __init__(self, job: DispatchJob) -> None:
        self.levels = DelayLevels(job.delay_levels) if job.delay_levels else DelayLevels()
        self.topics = job.topics
        self.build_index = job.build_index
        self.options = layout.INDEX_KEYS if job.build_index else 0
        self.tally = RangeTally()
        self.collecting = True
        self.records = 0
        self.open_runs: dict[tuple[str, int], UnitRun] = {}
        self.runs: list[UnitRun] = []
        self.index = bytearray()
        self.problems: list[tuple[int, str]] = []  # records a broker's dispatch stops at
        self.prefixes: dict[str, int] = {}
        self.names = layout.TopicNames()
        self.queue_names: dict[bytes, str] = {}  # further queues' names (copy_run_keys)
        self.copy_tables = CopyRunTables()
        self.record_offsets = self.record_stamps = array("q")  # the batch's (see _collect)
        self.keys = bytearray(layout.KEY_BUFFER_SIZE)
        self.run_table = layout.zeroed(layout.RUN_WIDTH * _RUN_CAPACITY)
        self.out = layout.new_dispatch_out(0)
        self.units = bytearray()
        self.row_runs = array("q")
        self.found = array("q")

    def batch(self, buf: Any, rows: Any, count: int, *, damaged_before: bool) -> None:
        tally = self.tally
        tally.records += count
        tally.bytes += layout.rows_bytes(rows, count)
        collect = 0
        if self.collecting and damaged_before:
            self.collecting = False  # a damaged region was skipped: dispatch stopped before it
        if self.collecting:
            collect = count
            statuses = rows[layout.CRC_STATUS : count * _WIDTH : _WIDTH]
            if statuses.count(layout.CRC_BAD):
                collect = statuses.index(layout.CRC_BAD)
            collect = self._collect(buf, rows, collect)
            if collect < count:
                self.collecting = False
        if tally.first_bad_delay is None and collect < count:
            self._check_delays(buf, rows, collect, count)

    def _collect(self, buf: Any, rows: Any, count: int) -> int:
        """Collect rows ``[0, count)``; returns how many were collected before a stop."""
        if len(self.out) < count * layout.DISPATCH_WIDTH:
            self.out = layout.new_dispatch_out(count)
            self.units = bytearray(layout.UNIT_SIZE * count)
            self.row_runs = layout.zeroed(count)
        # the batch's records' offsets and store times, by row (for their further-queue units)
        self.record_offsets = rows[layout.PHYSICAL_OFFSET : count * _WIDTH : _WIDTH]
        self.record_stamps = rows[layout.STORE_TIMESTAMP : count * _WIDTH : _WIDTH]
        first = 0
        while first < count:
            done, _entries = kernel.prepare_dispatch(
                buf, rows, first, count, self.options, self.out, self.keys
            )
            special, with_copies = kernel_copy_rows(
                self.copy_tables, buf, rows, self.out, first, done, set(), self.queue_names
            )
            position = first
            for row in [*special, done]:
                if position < row:
                    self._bulk(buf, rows, position, row)
                    copies = with_copies[
                        bisect_left(with_copies, position) : bisect_left(with_copies, row)
                    ]
                    if copies:
                        self._add_copy_runs(buf, rows, copies)
                if row == done:
                    break
                if not self._row(buf, rows, row):
                    return row
                position = row + 1
            first = done
        return count

    def _add_copy_runs(self, buf: Any, rows: Any, numbers: array) -> None:
        """The further-queue units of kernel rows ``numbers``, gathered per queue into runs by
        the kernel (:func:`kernel_copy_rows`), each added as :meth:`_add_unit` adds them one by
        one, with each unit's store time (its record's, found by its physical offset)."""
        _, found, keys = self.copy_tables.gathered_for(
            buf, rows, numbers, self.out, self.queue_names
        )
        stamp_of = dict(
            zip(
                map(self.record_offsets.__getitem__, numbers),
                map(self.record_stamps.__getitem__, numbers),
                strict=True,
            )
        )
        runs = self.copy_tables.runs
        width = layout.COPY_RUN_WIDTH
        size = layout.UNIT_SIZE
        units = self.copy_tables.units
        for number in range(found):
            topic, queue_id = keys[number]
            if self.topics is not None and topic not in self.topics:
                continue
            at = number * width
            start = runs[at + layout.COPY_RUN_UNITS_FROM] * size
            chunk = units[start : start + runs[at + layout.COPY_RUN_UNITS] * size]
            offsets = list(map(_FIRST_FIELD, UNIT.iter_unpack(chunk)))
            key = (topic, queue_id)
            queue_offset = runs[at + layout.COPY_RUN_FIRST_QUEUE_OFFSET]
            current = self.open_runs.get(key)
            if current is None or current.next_offset != queue_offset:
                current = self.open_runs[key] = UnitRun(topic, queue_id, queue_offset, offsets[0])
                self.runs.append(current)
            current.units += chunk
            current.stamps.extend(array("q", map(stamp_of.__getitem__, offsets)))

    def _add_unit(
        self, topic: str, queue_id: int, queue_offset: int, offset: int, unit: bytes, stamp: int
    ) -> None:
        """Add ``unit`` (of the record at ``offset``) at ``queue_offset`` of a queue: to its
        open run when it continues it, else as a new run."""
        if self.topics is not None and topic not in self.topics:
            return
        key = (topic, queue_id)
        run = self.open_runs.get(key)
        if run is None or run.next_offset != queue_offset:
            run = self.open_runs[key] = UnitRun(topic, queue_id, queue_offset, offset)
            self.runs.append(run)
        run.units += unit
        run.stamps.append(stamp)

    def _bulk(self, buf: Any, rows: Any, first: int, stop: int) -> None:
        """Rows ``[first, stop)`` as the kernel prepared them: units run by run, keys whole."""
        out = self.out
        width = layout.DISPATCH_WIDTH
        position = first
        while position < stop:
            following, found = kernel.queue_runs(
                buf, rows, position, stop, out, self.units, self.run_table, self.row_runs
            )
            self._add_runs(buf, rows, position, following, found)
            position = following
        if self.build_index:
            keys_from = out[first * width + layout.KEYS_FROM]
            last = (stop - 1) * width
            keys_end = out[last + layout.KEYS_FROM] + out[last + layout.KEYS_COUNT]
            size = layout.HASHED_KEY_SIZE
            self.index += self.keys[keys_from * size : keys_end * size]
        self.records += stop - first

    def _add_runs(self, buf: Any, rows: Any, first: int, stop: int, found: int) -> None:
        """Append the ``found`` runs of rows ``[first, stop)`` to the range's runs."""
        if not found:
            return
        run_of = self.row_runs[first:stop]
        order = sorted(range(stop - first), key=run_of.__getitem__)  # rows grouped by run
        stamps = rows[layout.STORE_TIMESTAMP + first * _WIDTH : stop * _WIDTH : _WIDTH]
        unit_stamps = array("q", map(stamps.__getitem__, order[run_of.count(-1) :]))
        size = layout.UNIT_SIZE
        for number in range(found):
            run = self.run_table[number * layout.RUN_WIDTH : (number + 1) * layout.RUN_WIDTH]
            topic = self.names.of(buf, rows, run[layout.RUN_TOPIC_ROW])
            if self.topics is not None and topic not in self.topics:
                continue
            units_from, units = run[layout.RUN_UNITS_FROM], run[layout.RUN_UNITS]
            key = (topic, run[layout.RUN_QUEUE_ID])
            current = self.open_runs.get(key)
            queue_offset = run[layout.RUN_FIRST_QUEUE_OFFSET]
            if current is None or current.next_offset != queue_offset:
                first_record = rows[run[layout.RUN_TOPIC_ROW] * _WIDTH + layout.PHYSICAL_OFFSET]
                current = self.open_runs[key] = UnitRun(topic, key[1], queue_offset, first_record)
                self.runs.append(current)
            current.units += self.units[units_from * size : (units_from + units) * size]
            current.stamps.extend(unit_stamps[units_from : units_from + units])

    def _row(self, buf: Any, rows: Any, row: int) -> bool:
        """One row the reference way; False when dispatch stops at it (a bad DELAY)."""
        offset, header, topic, props, _ = record_item(buf, rows, row, self.names)
        properties = decode_properties(props)
        store_timestamp = header.store_timestamp
        if topic == SCHEDULE_TOPIC:
            code = self.tally.check_delay(offset, header, properties, self.levels)
            if code is None:
                return False
        else:
            code = tags_code(properties.get(TAGS))
        transaction = header.sys_flag & TRANSACTION_MASK
        size = header.total_size
        if transaction in QUEUED_TRANSACTIONS:
            units = record_units(topic, header.queue_id, header.queue_offset, properties, props)
            unit = UNIT.pack(offset, size, code)
            for unit_topic, queue_id, queue_offset in units:  # LMQ queues too (spec 6.8)
                self._add_unit(unit_topic, queue_id, queue_offset, offset, unit, store_timestamp)
            stop = dispatch_stop_problem(offset, topic, header.queue_id, properties, props)
            if stop is not None:
                self.problems.append((offset, stop))
        if self.build_index and transaction != TRANSACTION_ROLLBACK:
            self._index_row(offset, store_timestamp, topic, properties)
        self.records += 1
        return True

    def _index_row(
        self, offset: int, store_timestamp: int, topic: str, properties: dict[str, str]
    ) -> None:
        uniq = properties.get(UNIQ_KEY)
        keys_text = properties.get(KEYS)
        keys = split_keys(keys_text) if keys_text else []
        if uniq is None and not keys:
            return
        prefix = self.prefixes.get(topic)
        if prefix is None:
            prefix = self.prefixes[topic] = java_string_hash(f"{topic}#")
        first = 1
        for key in [uniq, *keys] if uniq is not None else keys:
            hashed = index_key_hash_with_prefix(prefix, key)
            self.index += HASHED_KEY.pack(offset, store_timestamp, hashed, first)
            first = 0

    def _check_delays(self, buf: Any, rows: Any, first: int, count: int) -> None:
        """Note the first SCHEDULE_TOPIC_XXXX record of rows ``[first, count)`` whose DELAY
        is not a number (the summary says dispatch stops there)."""
        if len(self.found) < count:
            self.found = layout.zeroed(count)
        looked = kernel.attention_rows(buf, rows, first, count, -1, 0, self.found)
        for row in self.found[:looked]:
            if self.names.of(buf, rows, row) != SCHEDULE_TOPIC:
                continue
            offset, header, _, props, _ = record_item(buf, rows, row, self.names)
            if b"DELAY" in props:
                self.tally.check_delay(offset, header, decode_properties(props), self.levels)
                if self.tally.first_bad_delay is not None:
                    return


_WIDTH = layout.ROW_WIDTH
_FIRST_FIELD = itemgetter(0)  # a unit's commit-log offset, of UNIT.iter_unpack's tuples


class _Applier:
    """Puts prepared ranges into the dispatcher's queues and index, in log order."""

    def __init__(self, dispatcher: Dispatcher, result: DispatchResult) -> None:
        self.dispatcher = dispatcher
        self.result = result
        self.touched: set[tuple[str, int]] = set()
        # (physical offset, store time) of the newest unit put, written or there already (a
        # broker's put takes the time of a duplicate's record too, see Dispatcher)
        self.newest: tuple[int, int] | None = None

    def apply(self, prepared: PreparedRange) -> None:
        result = self.result
        result.records += prepared.records
        problems = list(prepared.problems)
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
        if self._put_rest(queue, run, units, 0):
            return
        for number in range(count):  # as a walk puts them: duplicates skipped, gaps told
            offset, size, code = UNIT.unpack_from(units, number * CQ_UNIT_SIZE)
            outcome = queue.put(run.queue_offset + number, offset, size, code)
            if outcome is PutOutcome.DUPLICATE:  # there already: its time counts as put
                self.result.units_skipped += 1
                self._wrote(offset, run.stamps[number])
                continue
            if outcome is PutOutcome.OUT_OF_RANGE:
                text = out_of_range_problem(
                    offset, run.queue_offset + number, run.topic, run.queue_id
                )
                problems.append((offset, text))
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
            if number + 1 < count and self._put_rest(queue, run, units, number + 1):
                return  # this unit started the queue (or filled its gap): the rest continue it

    def _put_rest(self, queue: ConsumeQueue, run: UnitRun, units: memoryview, first: int) -> bool:
        """Put the units of ``run`` from its ``first`` in one write when they continue the
        queue (:meth:`ConsumeQueue.put_run`); False (nothing written) otherwise."""
        at = first * CQ_UNIT_SIZE
        offset, size, _ = UNIT.unpack_from(units, at)
        if not queue.put_run(run.queue_offset + first, units[at:], offset + size):
            return False
        self.result.units_written += len(run.stamps) - first
        self.touched.add((run.topic, run.queue_id))
        self._wrote(UNIT.unpack_from(units, len(units) - CQ_UNIT_SIZE)[0], run.stamps[-1])
        return True

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
                    with whole():  # a stop waits for the range: no queue left behind
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
    recovery = store.recovery_start_offset()  # as opened: before the rebuild reset it
    return recovery if recovery is not None and store.config.check_crc_on_recover else None


def walk_end(store: Store, walked: list[RangeSummary], crc_from: int | None) -> WalkEnd:
    """:func:`dispatch_end` of a walk of ``store``'s log."""
    data_files = {summary.file for summary in walked}
    later = [s.start for s in store.commitlog.segments if s.name > max(data_files, default="")]
    return dispatch_end(
        walked,
        next_file_start=later[0] if later else None,
        crc_from=crc_from,
        walked_from=store.recovery_start_offset(),
    )


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
    if end.kind in ("invalid", "end") and (damage := damage_before_end(store, end.cut, end.reason)):
        result.stopped_at_damage(damage)  # the log goes on: its end is not the walk's
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
