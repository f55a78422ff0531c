"""Dispatch (spec §9): replay the commit log into consume queues and the index.

An idempotent replay from a cursor: it starts where the consume queues and the index end (or
at ``from_offset``), walks the commit log to its valid end as recovery defines it, puts
NOT_TYPE/COMMIT records into their consume queue and indexes the keys of all but ROLLBACK
records. The broker's duplicate rules make re-running it a no-op, and an invalid record (a torn
tail) ends it without moving the cursor past it.
"""

from __future__ import annotations

import contextlib
import os
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rmqstore import kernel
from rmqstore.checkpoint import Checkpoint, write_checkpoint
from rmqstore.commitlog import LogEnd, LogScan
from rmqstore.consumequeue import (
    CQ_UNIT_SIZE,
    UNIT,
    ConsumeQueue,
    PutOutcome,
    link_target,
    linked_queue,
    list_queues,
    sync_queues_file_system,
)
from rmqstore.delay import DelayLevels, unit_tags_code
from rmqstore.errors import (
    InputError,
    NotFoundError,
    RecordError,
    RmqStoreError,
    StoreFormatError,
    UncleanStoreError,
)
from rmqstore.indexfile import IndexService
from rmqstore.kernel import layout as kernel_layout
from rmqstore.kernel.layout import ROW_WIDTH
from rmqstore.multidispatch import (
    CopyRunTables,
    dispatch_stop_problem,
    kernel_copy_rows,
    record_units,
)
from rmqstore.properties import KEYS, UNIQ_KEY, decode_properties, split_keys
from rmqstore.quarantine import Quarantine
from rmqstore.record import (
    QUEUED_TRANSACTIONS,
    TRANSACTION_MASK,
    TRANSACTION_ROLLBACK,
    BodyMode,
    ScanStop,
)
from rmqstore.segments import can_sync_file_system, remove_empty_directory
from rmqstore.stops import whole
from rmqstore.store import ZEROS_WHERE_RECORDS_GO_ON, Store
from rmqstore.topics import is_path_safe
from rmqstore.wording import quoted


@dataclass
class DispatchResult:
    """What one dispatch did (the JSON of ``rmqstore dispatch``)."""

    from_offset: int
    to_offset: int = 0  # the new cursor: where dispatched records end
    log_end: int = 0
    records: int = 0  # records walked
    units_written: int = 0
    units_skipped: int = 0  # already in their consume queue
    index_records: int = 0
    index_entries: int = 0
    queues_touched: int = 0
    stopped_by: str | None = None  # the invalid record that ends the log, if any
    problems: list[str] = field(default_factory=list)
    # where the replay stopped before the log's valid end (damage in a file a broker's
    # recovery does not walk): the records after it are in no queue nor the index
    damage: LogDamage | None = None
    # damage a crash's replay went past: the catch-up before it stopped there, and the
    # replay went on from where a broker's crash recovery starts (the second item)
    damage_skipped: tuple[LogDamage, int] | None = None

    def to_dict(self) -> dict[str, Any]:
        skipped = None
        if self.damage_skipped is not None:
            skipped = {**self.damage_skipped[0].to_dict(), "resumedAt": self.damage_skipped[1]}
        return {
            "fromOffset": self.from_offset, "toOffset": self.to_offset, "logEnd": self.log_end,
            "records": self.records, "unitsWritten": self.units_written,
            "unitsSkipped": self.units_skipped, "indexedRecords": self.index_records,
            "indexEntries": self.index_entries, "queuesTouched": self.queues_touched,
            "stoppedBy": self.stopped_by, "problems": list(self.problems),
            "damage": None if self.damage is None else self.damage.to_dict(),
            "damageSkipped": skipped,
        }  # fmt: skip

    def went_past_damage(self, damage: LogDamage, resumed_at: int) -> None:
        """The catch-up before a crash's replay stopped at ``damage``; the replay went on
        from ``resumed_at``, where a broker's crash recovery starts."""
        self.damage_skipped = (damage, resumed_at)
        self.problems.append(
            f"the commit log is damaged at offset {damage.offset:,} ({damage.reason}), in a "
            "file a broker's crash recovery does not walk: the replay went on from "
            f"{resumed_at:,}, where that recovery starts (a broker's dispatches every record "
            "from there), and the records in between that the consume queues and index did "
            f"not hold yet are left out ({resumed_at - damage.offset:,} bytes)"
        )

    def stopped_at_damage(self, damage: LogDamage) -> None:
        """The replay stopped at ``damage``, before the log's valid end."""
        self.damage = damage
        self.log_end = damage.log_end
        self.stopped_by = f"damage at offset {damage.offset}: {damage.reason}"
        self.problems.append(damage.describe(rebuilt=False))


_PUTS_ELSEWHERE = "a dispatch would put units where a broker puts none"


class Dispatcher:
    """Builds consume queues and the index of an opened, writable store."""

    def __init__(
        self,
        store: Store,
        *,
        topics: Iterable[str] | None = None,
        build_index: bool = True,
        build_queues: bool = True,
        clock: Callable[[], int] | None = None,
        utc_index_names: bool = False,
    ) -> None:
        if not store.writable:
            raise RuntimeError("dispatch needs a store opened for writing")
        self.store = store
        self._residue_quarantine: Quarantine | None = None  # made at the first residue
        self._on_residue = self._quarantine_residue  # each queue's on_residue
        self.topics = set(topics) if topics else None
        self.build_index = build_index and store.config.message_index_enable
        self.build_queues = build_queues  # off: the consume queues are written elsewhere
        # some topics' queues, or not the index: what is left out is not caught up by this
        # dispatch, and a broker starting without 'abort' would never dispatch what lies
        # before where the queues now reach (see queue_reach)
        self.partial = leaves_records_out(store, self.topics, build_index)
        if self.partial:
            remember_queue_reach(store)
        self.skips_records = False  # set by run: it starts past where queues and index end
        self.delay_levels = DelayLevels(store.config.message_delay_level)
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        # the device of the queues' file system when one syncfs makes the queues' writes
        # durable at the end (see _flush_queues); None: each queue flushes its own files
        self._synced_together = _one_sync_device(store.consumequeue_dir) if build_queues else None
        self._ends_at_open: dict[tuple[str, int], int] = {}  # each queue's end (changed())
        # what the store held at the open, so that a dispatch stopped before it changed
        # anything takes away the empty files and folders it made (_remove_made)
        self._files_at_open: dict[tuple[str, int], int] = {}  # each queue's file count
        self._folders_at_open = _folders_in(store)
        linked: list[Path] = []
        for topic, queue_id in list_queues(store.consumequeue_dir, linked) if build_queues else []:
            if self.topics is None or topic in self.topics:
                self.queues[(topic, queue_id)] = self._open_queue(topic, queue_id)
        # folders a broker writes through and rmqstore does not: said at every run, as the
        # walk does not reach their records when they end the log (see queue_written)
        linked = _of_topics(store, linked, self.topics)
        self._linked_topics = {linked_queue(store.consumequeue_dir, link)[0] for link in linked}
        self._link_problems = [linked_queue_problem(link) for link in linked]
        self.index = (
            IndexService(
                store.index_dir,
                store.config.index_slots,
                store.config.index_entries,
                writable=True,
                clock=clock,
                utc_names=utc_index_names,
            )
            if self.build_index
            else None
        )
        self._unsafe_topics: set[str] = set()
        self._unwritten: set[tuple[str, int]] = set()  # queues new_queue found unwritten
        self._index_at_open = self._index_mark()
        self._queues_at_open = set(self.queues)
        self._index_files_at_open = len(self.index.files) if self.index else 0

    def _open_queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        queue = ConsumeQueue(
            self.store.consumequeue_dir,
            topic,
            queue_id,
            self.store.consumequeue_file_size,
            commitlog_min_offset=self.store.commitlog.min_offset,
        )
        queue.refuse_until_rebuilt(_PUTS_ELSEWHERE)
        queue.defer_names = self._synced_together is not None
        queue.on_residue = self._on_residue  # one bound method for all (thousands of) queues
        self._ends_at_open[(topic, queue_id)] = queue.end
        self._files_at_open[(topic, queue_id)] = len(queue.queue.segments)
        return queue

    def _index_mark(self) -> int:
        """How many entries the index files hold."""
        return sum(f.header.index_count for f in self.index.files) if self.index else 0

    def changed(self) -> bool:
        """Whether this dispatch has changed the store's queues or index: a unit or entry
        put (the files are written through maps, what is put is there at the close), or junk
        after a queue's end moved to quarantine and zeroed. An empty queue or index file it
        made does not count (a broker takes it for one with nothing in it yet)."""
        return (
            self._residue_quarantine is not None
            or any(queue.end != self._ends_at_open[key] for key, queue in self.queues.items())
            or self._index_mark() != self._index_at_open
        )

    def _until_done(self) -> contextlib.AbstractContextManager[None]:
        """The store's :meth:`~Store.until_done` for this dispatch's work."""
        return self.store.until_done(
            "dispatch", self._where_residue_is, self.changed, self._remove_made
        )

    def _remove_made(self) -> None:
        """After a stop before this dispatch changed anything (see :meth:`changed`): remove
        the queue and index files it made, which hold nothing yet, and the folders it made
        for them, so that the store is left as it was found (a broker would take them for
        empty ones, but verify and an operator's listing would show them). What cannot be
        removed is left as it is."""
        store = self.store
        try:
            for key, queue in list(self.queues.items()):
                if not queue.remove_files_after(self._files_at_open[key]):
                    continue
                if key in self._queues_at_open:
                    continue
                del self.queues[key], self._ends_at_open[key], self._files_at_open[key]
                remove_empty_directory(queue.directory)
                if queue.directory.parent not in self._folders_at_open:
                    remove_empty_directory(queue.directory.parent)
            if self.index is not None:
                self.index.remove_files_after(self._index_files_at_open)
            for folder in (store.consumequeue_dir, store.index_dir):
                if folder not in self._folders_at_open:
                    remove_empty_directory(folder)
        except (OSError, RmqStoreError):
            pass  # left as a broker makes them: empty

    def _quarantine_residue(self, path: Path, start: int, end: int) -> None:
        """Non-zero bytes after a queue's valid end (in its file ``path``), about to be
        overwritten by its next units (a broker overwrites them): copied to quarantine and
        zeroed first."""
        queue = f"{path.parent.parent.name}/{path.parent.name}"  # topic/queue id
        if self._residue_quarantine is None:
            self._residue_quarantine = Quarantine.create(self.store.root, "dispatch")
        self._residue_quarantine.cut_region(
            path, start, end, f"bytes after the valid end of consume queue {queue}, overwritten"
        )
        self.store.notes.append(
            f"moved {end - start:,} bytes after the valid end of consume queue {queue} to "
            f"{self._residue_quarantine.directory} before writing there"
        )

    def _where_residue_is(self) -> str:
        if self._residue_quarantine is None:
            return ""
        return f"; the bytes it wrote over are kept in {self._residue_quarantine.directory}"

    def index_reaches(self, offset: int) -> bool:
        """Whether the index holds every record before ``offset`` (or is not built): a
        dispatch to there adds nothing to it."""
        if self.index is None:
            return True
        store = self.store
        index_from = _index_resume_offset(store, self.index, store.commitlog.min_offset)
        return _past_records_giving_nothing(store, index_from, offset, index_from, offset) >= offset

    def cursor(self) -> int:
        """Where dispatch resumes (see :func:`resume_offset`)."""
        return resume_offset(self.store, self.queues.values(), self.index, self.topics)

    def start_offset(self, from_offset: int | None = None) -> int:
        """Where :meth:`run` starts: ``from_offset``, else the cursor, or the start of a
        crash's replay (:func:`crash_replay_start`) when that is earlier and no run of this
        open has replayed it yet."""
        if from_offset is not None:
            return from_offset
        if self.store.crash_replayed:
            return self.cursor()
        return no_later_than_replay(self.store, self.cursor())

    def run(
        self,
        from_offset: int | None = None,
        *,
        max_records: int | None = None,
        until: int | None = None,
        progress: Callable[[int], None] | None = None,
        queued_time: int | None = None,
        no_later_than: int | None = None,
        check_start: bool = False,
        flushed_time: int | None = None,
    ) -> DispatchResult:
        """Dispatch from ``from_offset`` (default: :meth:`start_offset`: the cursor, or after
        a crash where its replay starts) to the log's valid end, or to ``until`` when the
        caller knows it (an appender that just wrote up to there, or a parallel rebuild that
        found the end). ``queued_time``: the store time of the newest record put into a
        consume queue elsewhere (for the checkpoint). ``no_later_than``: start there when the
        cursor is later (what the queues and index hold is skipped). ``check_start``:
        ``from_offset`` is a user's, refused (InputError) where no record starts before the
        log's valid end. ``flushed_time``: the caller (an appender) has just forced the log
        to disk up to ``until``, its last record stored at this time: the checkpoint's
        physicMsgTimestamp moves to it, as a broker's flush service moves it."""
        store = self.store
        log = store.commitlog
        # the rules the log's end is found by, as they are before this run begins writing
        # (it makes 'abort'): a walk that reaches the end finds it itself, so the end is
        # computed (a second read of the log) only when a branch below needs it
        rules = store.end_rules()
        cursor = self.cursor()
        start = self.start_offset(from_offset)
        # where this run replays a crash from (a broker's crash recovery), if it does
        crash_replay = None
        if from_offset is None and until is None and not store.crash_replayed:
            crash_replay = crash_replay_start(store)
        if no_later_than is not None:
            start = min(start, no_later_than)
        if start > cursor:  # --from-offset past where the queues and index end
            self.skips_records = True
            if not self.partial:
                self.partial = True
                remember_queue_reach(store)
        furthest = max(self.queues.values(), key=lambda q: q.max_physical_offset, default=None)
        ahead = -1 if furthest is None else furthest.max_physical_offset  # as opened
        result = DispatchResult(from_offset=start, to_offset=start)
        result.problems.extend(self._link_problems)
        if (until is not None and start >= until) or log.queue.find(start) is None:
            end = (
                LogEnd(until, None, None, None) if until is not None else store.log_end(rules=rules)
            )
            self._check_ahead(ahead, furthest, end.offset)
            if end.offset > start:
                raise InputError(f"offset {start} is outside the commit-log files")
            result.log_end = end.offset
            with self._until_done():
                store.begin_write()
                self._finish(result, last_time=queued_time, flushed_time=flushed_time)
            return result
        if self.partial:
            refuse_a_cutting_abort(store)
        # stopped by an error once it began (a full disk), it keeps 'abort': some queues may
        # then reach further than others or the index, and a broker starting without it
        # would leave out what lies behind (spec 10.4)
        with self._until_done():
            store.begin_write()
            walk, scan = self._walk(
                start,
                until,
                max_records,
                progress,
                queued_time,
                result,
                counted_from=cursor if from_offset is None else -1,
            )
        if (
            crash_replay is not None
            and start < crash_replay
            and walk.complete
            and result.stopped_by is None
            and (damage := self._damage_where(scan)) is not None
            and damage.offset < crash_replay
        ):
            # the catch-up before the crash's replay met damage in a file a broker's crash
            # recovery does not walk: the replay goes on where that recovery starts, as a
            # broker's dispatches every record from there whatever lies before
            walk, scan = self._replay_past(walk, result, crash_replay, progress, cursor)
            result.went_past_damage(damage, crash_replay)
        if until is not None:
            result.log_end = until
            if (
                walk.complete
                and result.stopped_by is None
                and scan.stop is ScanStop.BLANK
                and start <= scan.end_offset <= until
            ):
                # the last file ends with its BLANK, no file after it (a replica of a log
                # the broker was rolling, or whose next file is damaged): the records end at
                # the BLANK, as a broker's recovery finds the log's end
                result.log_end = scan.end_offset
                result.to_offset = max(result.to_offset, scan.end_offset)
        elif check_start and not walk.records and scan.end_offset == start:
            # the scan ended where --from-offset put it: at the log's valid end, past it, or
            # where no record starts (zeros inside a record read as the end of the data):
            # the end is the one a broker's recovery finds, not where this scan stopped
            result.log_end = store.log_end(rules=rules).offset
            if start < result.log_end:
                raise _no_record_at(start, result.log_end)
        elif walk.complete and result.stopped_by is None and (damage := self._damage_where(scan)):
            result.stopped_at_damage(damage)
        elif walk.complete and result.stopped_by is None:
            end = LogEnd(scan.end_offset, scan.stop, scan.error, scan.segment)
            store.remember_log_end(end)
            store.check_tail(end)
            result.log_end = end.offset
            # the walk reached the valid end: past a BLANK into an empty next file included
            result.to_offset = max(result.to_offset, end.offset)
            if end.error is not None:
                result.stopped_by = str(end.error)
        else:
            result.log_end = store.log_end(rules=rules).offset
        self._check_ahead(ahead, furthest, result.log_end)
        result.queues_touched = len(walk.touched)
        with self._until_done():
            self._finish(result, walk.last_time, flushed_time=flushed_time)
        return result

    def _walk(
        self,
        start: int,
        until: int | None,
        max_records: int | None,
        progress: Callable[[int], None] | None,
        queued_time: int | None,
        result: DispatchResult,
        *,
        counted_from: int,
    ) -> tuple[_BatchWalk, LogScan]:
        """Dispatch the records from ``start`` in batches, as far as ``until``, the log's
        valid end or ``max_records`` (records before ``counted_from``, a crash's replay up to
        where the queues end, not counted); ``result`` takes the counts."""
        store = self.store
        log = store.commitlog
        # one pass: the scan itself finds the end as recovery does (CRC checked in the
        # files recovery walks), so the log is not read twice
        check_crc = store.config.check_crc_on_recover and until is None
        crc_from = store.recovery_start_offset()  # as opened: before this 'abort' was made
        scan = log.scan(
            start,
            check_crc=check_crc,
            stop_on_crc_error=True,
            crc_from=crc_from or 0,
            property_crc=store.config.force_verify_prop_crc,
            check_delay=until is None,  # (a DELAY stops a walk before its end as well)
        )
        walk = _BatchWalk(self, result, queued_time, until, max_records, counted_from, progress)
        batches = scan.batches(ahead=True)
        try:
            for window, _window_start, rows, count in batches:
                # a stop waits for the batch: its units go in queue by queue, and a stop
                # between two queues left one queue behind the others (a hole where the
                # next dispatch resumes, which only a rebuild or a crash recovery fills,
                # and appends to the store refused until then)
                with whole():
                    going = walk.batch(window, rows, count)
                if not going:
                    break
        finally:
            batches.close()  # type: ignore[attr-defined]  # the reader stops before files change
        result.records += walk.records  # (a crash's replay past damage walks twice)
        result.to_offset = start if not walk.records else walk.to_offset
        result.units_written += walk.units_written
        result.units_skipped += walk.units_skipped
        result.index_records += walk.index_records
        result.index_entries += walk.index_entries
        return walk, scan

    def _replay_past(
        self,
        walk: _BatchWalk,
        result: DispatchResult,
        replay_start: int,
        progress: Callable[[int], None] | None,
        cursor: int,
    ) -> tuple[_BatchWalk, LogScan]:
        """Walk again from ``replay_start`` after ``walk`` stopped at damage before it;
        ``result`` counts both walks."""
        with self._until_done():
            replay, scan = self._walk(
                replay_start, None, None, progress, walk.last_time, result, counted_from=cursor
            )
        replay.touched |= walk.touched
        return replay, scan

    def _damage_where(self, scan: LogScan) -> LogDamage | None:
        """Where ``scan`` stopped, when that is damage before the log's valid end (see
        :func:`damage_before_end`): the scan's end is then not the log's."""
        error = None if scan.error is None else str(scan.error)
        return damage_before_end(self.store, scan.end_offset, error)

    @staticmethod
    def _check_ahead(ahead: int, furthest: ConsumeQueue | None, log_end: int) -> None:
        """Refuse queues that reached past the log's end when opened (``ahead``, by queue
        ``furthest``), naming that queue (one with a file that is a link was refused when
        opened: see :meth:`ConsumeQueue.refuse_until_rebuilt`)."""
        if furthest is None or ahead <= log_end:
            return
        name = f"{furthest.topic}:{furthest.queue_id}"
        raise InputError(
            f"consume queues point past the end of the commit log ({ahead} > {log_end}, "
            f"queue {name}): they were written by a broker that crashed or the log was cut; "
            "rebuild them with 'rmqstore dispatch --rebuild'"
        )

    def new_queue(self, topic: str, queue_id: int, problems: list[str]) -> ConsumeQueue | None:
        """Open (creating it on the first put) a queue not seen yet; None, and a problem the
        first time, for a queue no dispatch writes (see :func:`queue_written`; a linked
        folder was named when the dispatcher opened). A queue found unwritten is told again
        from a set: its folder is not looked at (resolved) for each of its records."""
        if (topic, queue_id) in self._unwritten:
            return None
        if not queue_written(self.store, topic, queue_id):
            self._unwritten.add((topic, queue_id))
            if topic not in self._unsafe_topics and topic not in self._linked_topics:
                self._unsafe_topics.add(topic)
                problems.append(unsafe_topic_problem(topic))
            return None
        queue = self._open_queue(topic, queue_id)
        self.queues[(topic, queue_id)] = queue
        return queue

    def _flush_queues(self) -> None:
        """Make the queues' units, files and folders durable. Where one syncfs(2) can
        (``_synced_together``), a queue whose writes lie in one file, on that file system,
        leaves them to one syncfs at the end (when there are SYNCFS_FROM_QUEUES of them or
        more); the others flush their files in order first.
        A dispatch into 20,000 new LMQ queues made 60,000 fsyncs of folders and 20,000
        fdatasyncs of files, each flushing the disk's write cache: 18 of its 23 s here."""
        together = self._synced_together
        deferred: list[ConsumeQueue] = []
        for queue in self.queues.values():
            if _waits_for_syncfs(queue, together):
                deferred.append(queue)
                continue
            queue.flush()
        if len(deferred) < SYNCFS_FROM_QUEUES:
            # a few queues (a dispatch after each append, a replica's round): each synced on
            # its own, as a syncfs would wait for every dirty page of the file system, other
            # programs' too
            for queue in deferred:
                queue.flush()
            return
        sync_queues_file_system(self.store.consumequeue_dir)
        for queue in deferred:
            queue.synced_by_file_system()

    def finish(self, result: DispatchResult, last_time: int | None) -> None:
        """Flush and record progress for work done elsewhere (a parallel rebuild)."""
        self._finish(result, last_time)

    def _finish(
        self, result: DispatchResult, last_time: int | None, *, flushed_time: int | None = None
    ) -> None:
        """Make the written files durable, then record progress in the checkpoint (never ahead
        of what is on disk: ``flushed_time``, the store time of the last record the caller
        forced to disk in the log), and tell the store how far the consume queues reach."""
        self._flush_queues()
        full_index_end = 0
        if self.index is not None:
            self.index.flush()
            full = [f for f in self.index.files if f.is_full]
            full_index_end = full[-1].header.end_timestamp if full else 0
        checkpoint = self.store.checkpoint() or Checkpoint()
        updated = checkpoint
        # logicsMsgTimestamp vouches for every consume queue: some topics' queues built leave
        # the others where they were, a start past the cursor the records before it (a
        # broker's crash recovery picks the file it replays from by this time)
        if (
            self.topics is None
            and not self.skips_records
            and last_time is not None
            and last_time > checkpoint.logics_msg_timestamp
        ):
            updated = replace(updated, logics_msg_timestamp=last_time)
        if full_index_end > checkpoint.index_msg_timestamp:
            updated = replace(updated, index_msg_timestamp=full_index_end)
        if flushed_time is not None and flushed_time > checkpoint.physic_msg_timestamp:
            updated = replace(updated, physic_msg_timestamp=flushed_time)
        if updated != checkpoint or (self.store.checkpoint() is None and last_time is not None):
            write_checkpoint(self.store.checkpoint_path, updated)
        if self.partial:  # does it leave records out before where the queues now reach?
            before, after = self.store.queue_reach_before, queue_reach(self.store)
            further = after is None or before in (None, _UNKNOWN_REACH) or after > before
            self.store.partial_dispatch_reaches_further = (
                bool(self.store.partial_dispatch_reaches_further) or further
            )
        elif result.to_offset >= result.log_end:
            self.store.dispatched_through = result.to_offset
        if result.to_offset >= result.log_end:
            self.store.crash_replayed = True  # later runs of this open resume at the cursor

    def close(self) -> None:
        for queue in self.queues.values():
            queue.close()
        if self.index is not None:
            self.index.close()


def _folders_in(store: Store) -> set[Path]:
    """The store's ``consumequeue/`` and ``index/`` folders and the topic folders under
    ``consumequeue/``, as far as they are there."""
    folders = {folder for folder in (store.consumequeue_dir, store.index_dir) if folder.is_dir()}
    if store.consumequeue_dir in folders:
        with contextlib.suppress(OSError):  # (the listing of the queues names it)
            folders.update(store.consumequeue_dir.iterdir())
    return folders


class _BatchWalk:
    """The per-batch work of :meth:`Dispatcher.run`: the record kernel prepares each batch of
    rows (tagsCodes and index key hashes) and gathers their units into runs per queue; a run goes
    into its queue in one write, and the keys into the index in one call. Rows the kernel flags (a
    SCHEDULE_TOPIC_XXXX record, text that is not ASCII) and the record the index ends with
    (a kill may have left some of its keys out) are prepared the reference way, in order."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        result: DispatchResult,
        queued_time: int | None,
        until: int | None,
        max_records: int | None,
        counted_from: int,
        progress: Callable[[int], None] | None,
    ) -> None:
        self.dispatcher = dispatcher
        self.result = result
        self.index = dispatcher.index
        self.until = until
        self.max_records = max_records
        self.counted_from = counted_from  # records before it do not count for max_records
        self.progress = progress
        self.last_time = queued_time
        self.records = self.units_written = self.units_skipped = 0
        self.index_records = self.index_entries = 0
        self.to_offset = 0
        self.complete = True
        self.touched: set[tuple[str, int]] = set()
        self.out = kernel_layout.new_dispatch_out(_BATCH_ROWS)
        self.keys = bytearray(kernel_layout.KEY_BUFFER_SIZE)
        self.units = bytearray(kernel_layout.UNIT_SIZE * _BATCH_ROWS)
        self.row_runs = kernel_layout.zeroed(_BATCH_ROWS)
        self.runs = kernel_layout.zeroed(kernel_layout.RUN_WIDTH * _RUNS)
        self.batch_offsets = array("q")
        # the commit-log offset of the newest unit put (written, or there already: a broker's
        # put returns true for a duplicate, and logicsMsgTimestamp takes its record's time)
        self.newest_queued = -1
        self.options = kernel_layout.INDEX_KEYS if self.index is not None else 0
        last = self.index.last_written if self.index is not None else None
        # records up to here may be partly indexed already: IndexService.build decides
        self.index_resumes_at = last.header.end_phy_offset if last is not None else -1
        self.topics = kernel_layout.TopicNames()
        self.queue_names: dict[bytes, str] = {}  # further queues' names (copy_run_keys)
        self.copy_tables = CopyRunTables()

    def batch(self, window: Any, rows: Any, count: int) -> bool:
        """Dispatch ``count`` rows of ``window``; False once the walk must stop."""
        if len(self.out) < count * kernel_layout.DISPATCH_WIDTH:
            self.out = kernel_layout.new_dispatch_out(count)
            self.units = bytearray(kernel_layout.UNIT_SIZE * count)
            self.row_runs = kernel_layout.zeroed(count)
        self.batch_offsets = rows[_OFFSET_COLUMN : count * ROW_WIDTH : ROW_WIDTH]
        first = 0
        while first < count:
            done, _entries = kernel.prepare_dispatch(
                window, rows, first, count, self.options, self.out, self.keys
            )
            offsets = self.batch_offsets[first:done]
            stop = done
            if self.until is not None:
                stop = first + bisect_left(offsets, self.until)
            if self.max_records is not None:
                # the rows of a crash's replay before where the queues ended are free
                self.max_records += bisect_left(offsets, self.counted_from)
                stop = min(stop, first + self.max_records - self.records)
            position = first
            special_rows, with_copies = self._special_rows(window, rows, offsets, first, stop)
            for special in [*special_rows, stop]:
                if position < special:
                    self._bulk(window, rows, position, special, with_copies)
                if special == stop:
                    break
                if not self._row(window, rows, special):
                    return False
                position = special + 1
            if self.max_records is not None and self.records >= self.max_records:
                self.complete = False
                return False
            if stop < done:  # reached ``until``
                return False
            first = done
        return True

    def _special_rows(
        self, window: Any, rows: Any, offsets: array, first: int, stop: int
    ) -> tuple[list[int], array]:
        """Rows taking the reference way: flagged by the kernel, or at or before where the
        index ends (some of their keys may be there already); and the kernel-prepared rows
        with units in further queues, which their bulk puts after its own units, gathered into
        runs by the kernel (:func:`kernel_copy_rows`)."""
        resumed = bisect_right(offsets, self.index_resumes_at, 0, stop - first)
        return kernel_copy_rows(
            self.copy_tables,
            window,
            rows,
            self.out,
            first,
            stop,
            set(range(first, first + resumed)),
            self.queue_names,
        )

    def _bulk(self, window: Any, rows: Any, first: int, stop: int, with_copies: array) -> None:
        """Rows ``[first, stop)`` the kernel prepared, as a whole: their units go into the
        consume queues run by run, then their units in further queues (of the rows among
        ``with_copies``) run by run, their keys into the index in one call."""
        out = self.out
        width = kernel_layout.DISPATCH_WIDTH
        if self.dispatcher.build_queues:
            position = first
            while position < stop:
                position, found = kernel.queue_runs(
                    window, rows, position, stop, out, self.units, self.runs, self.row_runs
                )
                problems: list[tuple[int, str]] = []
                for number in range(found):
                    self._put_units(window, rows, number, problems)
                # in log order, as one record after the other would have reported them
                problems.sort(key=lambda item: item[0])
                self.result.problems.extend(text for _, text in problems)
            numbers = with_copies[bisect_left(with_copies, first) : bisect_left(with_copies, stop)]
            if numbers:
                self._put_copy_runs(window, rows, numbers)
        if self.index is not None:
            keys_from = out[(first) * width + kernel_layout.KEYS_FROM]
            last = (stop - 1) * width
            keys_end = out[last + kernel_layout.KEYS_FROM] + out[last + kernel_layout.KEYS_COUNT]
            if keys_end > keys_from:
                size = kernel_layout.HASHED_KEY_SIZE
                with memoryview(self.keys) as keys:
                    indexed, written = self.index.build_hashed(
                        keys[keys_from * size : keys_end * size]
                    )
                self.index_records += indexed
                self.index_entries += written
        self.records += stop - first
        last_row = (stop - 1) * ROW_WIDTH
        self.to_offset = rows[last_row + _OFFSET_COLUMN] + rows[last_row + kernel_layout.TOTAL_SIZE]
        if self.progress is not None:
            self.progress(rows[last_row + _OFFSET_COLUMN])

    def _put_copy_runs(self, window: Any, rows: Any, numbers: array) -> None:
        """The further-queue units of kernel rows ``numbers`` (each its record's offset, size
        and the kernel's tagsCode), gathered per queue into runs of consecutive queue offsets
        in log order, each put as :meth:`_put_run` puts a run of own units (a queue's units in
        the order ``_row`` puts them one by one)."""
        _, found, keys = self.copy_tables.gathered_for(
            window, rows, numbers, self.out, self.queue_names
        )
        topics = self.dispatcher.topics
        runs = self.copy_tables.runs
        width = kernel_layout.COPY_RUN_WIDTH
        problems: list[tuple[int, str]] = []
        with memoryview(self.copy_tables.units) as units:
            for number in range(found):
                topic, queue_id = keys[number]
                if topics is not None and topic not in topics:
                    continue
                at = number * width
                start = runs[at + kernel_layout.COPY_RUN_UNITS_FROM] * CQ_UNIT_SIZE
                end = start + runs[at + kernel_layout.COPY_RUN_UNITS] * CQ_UNIT_SIZE
                first_offset = runs[at + kernel_layout.COPY_RUN_FIRST_QUEUE_OFFSET]
                self._put_run(rows, topic, queue_id, first_offset, units[start:end], problems)
        problems.sort(key=lambda item: item[0])  # in log order, as row by row
        self.result.problems.extend(text for _, text in problems)

    def _put_units(
        self, window: Any, rows: Any, number: int, problems: list[tuple[int, str]]
    ) -> None:
        """Put one run of units (see :func:`rmqstore.kernel.layout`) into its queue."""
        width = kernel_layout.RUN_WIDTH
        run = self.runs[number * width : (number + 1) * width]
        topic = self.topics.of(window, rows, run[kernel_layout.RUN_TOPIC_ROW])
        if self.dispatcher.topics is not None and topic not in self.dispatcher.topics:
            return
        count = run[kernel_layout.RUN_UNITS]
        start = run[kernel_layout.RUN_UNITS_FROM] * CQ_UNIT_SIZE
        with memoryview(self.units) as units:
            self._put_run(
                rows,
                topic,
                run[kernel_layout.RUN_QUEUE_ID],
                run[kernel_layout.RUN_FIRST_QUEUE_OFFSET],
                units[start : start + count * CQ_UNIT_SIZE],
                problems,
            )

    def _put_run(
        self,
        rows: Any,
        topic: str,
        queue_id: int,
        first_offset: int,
        data: Any,
        problems: list[tuple[int, str]],
    ) -> None:
        """Put packed units ``data`` (of records among ``rows``) into a queue from queue
        offset ``first_offset``: in one write when they continue the queue, else unit by
        unit as the broker would (problems with their record's offset)."""
        dispatcher = self.dispatcher
        key = (topic, queue_id)
        queue = dispatcher.queues.get(key)
        if queue is None:
            texts: list[str] = []
            queue = dispatcher.new_queue(topic, queue_id, texts)
            problems.extend((UNIT.unpack_from(data, 0)[0], text) for text in texts)
            if queue is None:
                return
        count = len(data) // CQ_UNIT_SIZE
        written = 0
        newest = -1
        last_offset, last_size, _code = UNIT.unpack_from(data, (count - 1) * CQ_UNIT_SIZE)
        if last_offset + last_size <= queue.max_physical_offset:
            self.units_skipped += count  # every unit is there: put would skip each
            newest = count - 1
        elif queue.put_run(first_offset, data, _unit_end(data)):
            written, newest = count, count - 1
        else:
            for number_in_run in range(count):
                offset, size, code = UNIT.unpack_from(data, number_in_run * CQ_UNIT_SIZE)
                queue_offset = first_offset + number_in_run
                outcome = queue.put(queue_offset, offset, size, code)
                if outcome is PutOutcome.DUPLICATE:
                    self.units_skipped += 1
                    newest = number_in_run
                    continue
                if outcome is PutOutcome.OUT_OF_RANGE:
                    problems.append(
                        (offset, out_of_range_problem(offset, queue_offset, topic, queue_id))
                    )
                    continue
                written += 1
                newest = number_in_run
                if outcome is PutOutcome.OUT_OF_ORDER:
                    text = out_of_order_problem(offset, queue_offset, topic, queue_id)
                    problems.append((offset, text))
                rest = data[(number_in_run + 1) * CQ_UNIT_SIZE :]
                if rest and queue.put_run(queue_offset + 1, rest, _unit_end(rest)):
                    written += count - number_in_run - 1
                    newest = count - 1
                    break
        if written:
            self.units_written += written
            self.touched.add(key)
        if newest >= 0:  # the queue holds it now, written or there already
            offset = UNIT.unpack_from(data, newest * CQ_UNIT_SIZE)[0]
            if offset > self.newest_queued:
                self.newest_queued = offset
                row = bisect_left(self.batch_offsets, offset)
                self.last_time = rows[row * ROW_WIDTH + kernel_layout.STORE_TIMESTAMP]

    def _row(self, window: Any, rows: Any, row: int) -> bool:
        at = row * ROW_WIDTH
        physical_offset = rows[at + kernel_layout.PHYSICAL_OFFSET]
        if self.until is not None and physical_offset >= self.until:
            return False
        dispatcher = self.dispatcher
        result = self.result
        size = rows[at + kernel_layout.TOTAL_SIZE]
        sys_flag = rows[at + kernel_layout.SYS_FLAG]
        transaction = sys_flag & TRANSACTION_MASK
        store_timestamp = rows[at + kernel_layout.STORE_TIMESTAMP]
        topic = self.topics.of(window, rows, row)
        # a row flagged by the kernel, or one the index may hold some keys of already
        properties_at = rows[at + kernel_layout.PROPERTIES_AT]
        properties_end = properties_at + rows[at + kernel_layout.PROPERTIES_LENGTH]
        stored = bytes(window[properties_at:properties_end])
        properties = decode_properties(stored)
        try:
            code = unit_tags_code(topic, properties, store_timestamp, dispatcher.delay_levels)
        except RecordError as exc:  # the broker treats it as an invalid record
            result.stopped_by = str(RecordError(exc.field, physical_offset, exc.reason))
            return False
        if dispatcher.build_queues and transaction in QUEUED_TRANSACTIONS:
            queue_id = rows[at + kernel_layout.QUEUE_ID]
            queue_offset = rows[at + kernel_layout.QUEUE_OFFSET]
            units = record_units(topic, queue_id, queue_offset, properties, stored)  # LMQ (6.8)
            for unit_topic, unit_queue_id, queue_offset in units:
                if (dispatcher.topics is None or unit_topic in dispatcher.topics) and self._put(
                    unit_topic, unit_queue_id, queue_offset, physical_offset, size, code
                ):
                    self.last_time = store_timestamp
            stop = dispatch_stop_problem(physical_offset, topic, queue_id, properties, stored)
            if stop is not None:
                result.problems.append(stop)
        if self.index is not None and transaction != TRANSACTION_ROLLBACK:
            uniq = properties.get(UNIQ_KEY)
            keys_text = properties.get(KEYS)
            keys = split_keys(keys_text) if keys_text else []
            if (uniq is not None or keys) and self.index.build(
                physical_offset, store_timestamp, topic, uniq, keys
            ):
                self.index_records += 1
                self.index_entries += len(keys) + (uniq is not None)
        self.records += 1
        self.to_offset = physical_offset + size
        if self.progress is not None and not self.records & 0xFFFF:
            self.progress(physical_offset)
        if self.max_records is not None and self.records >= self.max_records:
            self.complete = False
            return False
        return True

    def _put(
        self,
        topic: str,
        queue_id: int,
        queue_offset: int,
        physical_offset: int,
        size: int,
        code: int,
    ) -> bool:
        """One unit into its queue, as ``putMessagePositionInfo`` puts it; whether the queue
        holds it now (written, or there already: the broker's put returns true for both, and
        logicsMsgTimestamp takes the record's time)."""
        dispatcher = self.dispatcher
        key = (topic, queue_id)
        queue = dispatcher.queues.get(key)
        if queue is None:
            queue = dispatcher.new_queue(topic, queue_id, self.result.problems)
            if queue is None:
                return False
        outcome = queue.put(queue_offset, physical_offset, size, code)
        if outcome is PutOutcome.DUPLICATE:
            self.units_skipped += 1
            self.newest_queued = max(self.newest_queued, physical_offset)
            return True
        if outcome is PutOutcome.OUT_OF_RANGE:
            self.result.problems.append(
                out_of_range_problem(physical_offset, queue_offset, topic, queue_id)
            )
            return False
        self.units_written += 1
        self.touched.add(key)
        self.newest_queued = max(self.newest_queued, physical_offset)
        if outcome is PutOutcome.OUT_OF_ORDER:
            self.result.problems.append(
                out_of_order_problem(physical_offset, queue_offset, topic, queue_id)
            )
        return True


_BATCH_ROWS = 4096
_RUNS = 256  # runs of units gathered per kernel call
_OFFSET_COLUMN = kernel_layout.PHYSICAL_OFFSET


def _unit_end(units: Any) -> int:
    """Where the record of the first of packed ``units`` ends in the commit log."""
    offset, size, _code = UNIT.unpack_from(units, 0)
    return offset + size


def crash_replay_start(store: Store) -> int | None:
    """Where a broker's crash recovery dispatches from when ``store`` had 'abort' (spec
    10.3): the start of the file the checkpoint picks, every valid record from there put
    again (what the queues and index hold is skipped). That gives back units a queue lost
    while other queues kept theirs (a power loss with some of a queue's pages not on disk),
    which a dispatch from where the queues end would leave out. None for a store closed
    cleanly."""
    if not store.abort_existed:
        return None
    segment = store.commitlog.recovery_start(store.checkpoint(), True)
    return None if segment is None else segment.start


def no_later_than_replay(store: Store, start: int) -> int:
    """``start``, or where a crash's replay starts (:func:`crash_replay_start`) when that is
    earlier: where a dispatch of ``store`` begins, and what its dry run shows."""
    replay = crash_replay_start(store)
    return start if replay is None else min(start, replay)


def resume_offset(
    store: Store,
    queues: Iterable[ConsumeQueue],
    index: IndexService | None,
    topics: Collection[str] | None = None,
) -> int:
    """Where dispatch resumes: the earlier of where the consume queues end (the broker's
    ``max over queues of maxPhysicOffset``) and where the index ends (see
    :func:`_index_resume_offset`), then past the records that give neither anything (see
    :func:`_past_records_giving_nothing`; with ``topics``, a dispatch of those topics'
    queues only, another topic's record gives the queues nothing)."""
    start = store.commitlog.min_offset
    cq_end = max((queue.max_physical_offset for queue in queues), default=-1)
    queues_from = max(start, cq_end)
    index_from = None if index is None else _index_resume_offset(store, index, start)
    cursor = queues_from if index_from is None else max(start, min(queues_from, index_from))
    return _past_records_giving_nothing(store, cursor, queues_from, index_from, topics=topics)


def _index_resume_offset(store: Store, index: IndexService, start: int) -> int:
    """Where the index ends: after the record its last file ends with, or at that record
    when a kill kept some of its keys out of the index (:meth:`IndexService.build` then
    adds only those); ``start`` when it holds nothing."""
    last = index.last_written
    if last is None or (last.header.index_count <= 1 and last.header.end_phy_offset <= 0):
        return start
    offset = last.header.end_phy_offset
    try:
        record = store.commitlog.read(offset, body=BodyMode.SKIP)
    except (RecordError, NotFoundError):
        return offset  # not a record start any more: replay from there
    keys = record.properties.get(KEYS)
    wanted = len(split_keys(keys) if keys else []) + (UNIQ_KEY in record.properties)
    if index.entries_of(offset) < wanted:
        return offset
    return offset + record.store_size


def _past_records_giving_nothing(
    store: Store,
    offset: int,
    queues_from: int,
    index_from: int | None,
    until: int | None = None,
    *,
    topics: Collection[str] | None = None,
) -> int:
    """``offset`` (a record's start or the log's end), moved past each record a dispatch
    would write nothing for, to the first that gives the consume queues a unit (one at or
    after ``queues_from``, not PREPARED nor ROLLBACK, and of ``topics`` when they are
    given) or the index keys (one at or after ``index_from``, with UNIQ_KEY or KEYS, not
    ROLLBACK), or ``until``, or where the log's records end. A broker's index ends at the
    last record with keys and its queues at the last record they take, so records after
    those that have none are not behind: without this walk, a store ending with such
    records would be behind after every dispatch. The walk stops at a record whose CRC
    fails, as recovery may end the log there; one that reaches the log's end goes past a
    BLANK to the start of a last file with no record."""
    if until is not None and offset >= until:
        return offset
    written: dict[tuple[str, int], bool] = {}  # queue: whether a dispatch writes it
    scan = store.commitlog.scan(offset, check_crc=True)
    for physical_offset, header, topic, properties, crc_ok in scan:
        if (until is not None and physical_offset >= until) or crc_ok is False:
            return offset
        transaction = header.sys_flag & TRANSACTION_MASK
        if physical_offset >= queues_from and transaction in QUEUED_TRANSACTIONS:
            queue = (topic, header.queue_id)
            if queue not in written:
                written[queue] = (topics is None or topic in topics) and queue_written(
                    store, *queue
                )
            if written[queue]:
                return physical_offset
        if (
            index_from is not None
            and physical_offset >= index_from
            and transaction != TRANSACTION_ROLLBACK
        ):
            found = decode_properties(properties)
            if UNIQ_KEY in found or split_keys(found.get(KEYS)):
                return physical_offset
        offset = physical_offset + header.total_size
    return max(offset, scan.end_offset)


# how many queues to sync at the end of a dispatch make one syncfs worth it (see
# Dispatcher._flush_queues): fewer are synced file by file
SYNCFS_FROM_QUEUES = 64


def _one_sync_device(root: Path) -> int | None:
    """The device of the file system consume queues under ``root`` are written in, when one
    syncfs(2) makes them durable there (:func:`rmqstore.segments.can_sync_file_system`);
    else None. A ``root`` not made yet is made in its parent folder (the store's)."""
    folder = root if root.is_dir() else root.parent
    return _device(folder) if can_sync_file_system(folder) else None


def _device(folder: Path) -> int | None:
    """The device ``folder`` lies on (links followed, as the writes follow them); None
    when it cannot be told."""
    try:
        return os.stat(folder).st_dev
    except OSError:
        return None


def queue_reach(store: Store) -> int | None:
    """Where the store's consume queues reach: the end of the record the furthest of their
    last units points to (-1 without a unit; None when a queue cannot be read). A broker
    starting without ``abort`` dispatches only what follows it (4.9: its dispatcher starts
    there; 5.x: normal recovery dispatches past it, then the dispatcher starts at the log's
    end, spec 10.2 and 10.4)."""
    reach = -1
    for topic, queue_id in list_queues(store.consumequeue_dir):
        if not queue_written(store, topic, queue_id):
            continue  # no dispatch writes there, nor does a broker read it
        try:
            queue = ConsumeQueue(
                store.consumequeue_dir, topic, queue_id, store.consumequeue_file_size
            )
        except (InputError, OSError):
            return None
        try:
            reach = max(reach, queue.max_physical_offset)
        finally:
            queue.close()
    return reach


_UNKNOWN_REACH = -2  # a consume queue could not be read: how far they reach is not known


def remember_queue_reach(store: Store) -> None:
    """Before a dispatch that leaves records out changes anything: where the queues reach
    (:func:`queue_reach`), once per open of ``store``."""
    if store.queue_reach_before is None:
        reach = queue_reach(store)
        store.queue_reach_before = reach if reach is not None else _UNKNOWN_REACH


def _no_record_at(offset: int, log_end: int) -> InputError:
    return InputError(
        f"no record starts at offset {offset}; the log goes on to its valid end at {log_end} "
        f"(rmqstore read --from-offset {offset} --seek shows the next record)"
    )


def leaves_records_out(store: Store, topics: set[str] | None, build_index: bool) -> bool:
    """Whether a dispatch of only ``topics``' queues, or without the index, leaves records
    out of what it catches up (a ``--from-offset`` past where the queues and index end
    does too, found as it starts)."""
    return topics is not None or (store.config.message_index_enable and not build_index)


def refuse_a_cutting_abort(store: Store) -> None:
    """A dispatch that leaves records out keeps 'abort' when its queues then reach past
    them, so that a broker's crash recovery dispatches them: refused before it begins, on a
    store without 'abort', when that recovery would end the log early
    (:meth:`Store.crash_recovery_cut`)."""
    if store.aborted:
        return  # its start is a crash recovery whatever the dispatch leaves
    _refuse_a_cut(
        store.crash_recovery_cut(),
        "a dispatch that leaves records out (--topic, --no-index, --from-offset past where "
        "the queues end)",
        "run rmqstore dispatch without those options",
    )


def refuse_a_cutting_rebuild(store: Store, topics: set[str] | None, rebuild_index: bool) -> None:
    """A rebuild of some topics' queues (``topics``), or of the queues without the index,
    leaves records out as a partial dispatch does: it keeps 'abort' when the queues it
    builds reach past where the queues reached, and it resets the checkpoint's time for the
    queues (left at 0 by ``--topic``; ``--no-index`` sets it to the log's newest record's),
    which picks the file a broker's crash recovery walks from. Refused before it begins,
    on a store without 'abort' whose queues end before the log does, when that recovery
    would end the log early."""
    if store.aborted or not leaves_records_out(store, topics, rebuild_index):
        return
    end = store.log_end()
    reach = queue_reach(store)
    if reach is not None and reach >= end.offset:
        return  # the queues built cannot reach past where they reached: 'abort' goes
    checkpoint = store.checkpoint() or Checkpoint()
    if topics is None:
        # the newest record's store time, at least that of the first record of the file the
        # log ends in, taken here: an earlier time only moves the start earlier, so the check
        # errs towards refusing
        last = end.segment or (store.commitlog.segments or [None])[-1]
        newest = 0 if last is None else store.commitlog.first_record_store_timestamp(last) or 0
        after = replace(checkpoint, logics_msg_timestamp=newest)
    else:
        after = replace(checkpoint, logics_msg_timestamp=0)
    _refuse_a_cut(
        store.crash_recovery_cut(after),
        "a rebuild of some topics' queues (--topic) or without the index (--no-index)",
        "run rmqstore dispatch --rebuild without those options",
    )


def _refuse_a_cut(cut: tuple[int, str] | None, work: str, remedy: str) -> None:
    if cut is not None:
        raise UncleanStoreError(
            f"{work} leaves 'abort' for a broker's start to dispatch what it leaves out, and "
            f"a broker's crash recovery would then end the log at offset {cut[0]:,} "
            f"({cut[1]}), in a file its normal recovery does not walk, and delete the "
            f"records after it: {remedy} (the store is unchanged)"
        )


def plan_dispatch(
    store: Store,
    *,
    topics: Iterable[str] | None = None,
    build_index: bool = True,
    from_offset: int | None = None,
    linked: list[Path] | None = None,
) -> tuple[int, int]:
    """(where a dispatch would start, where the log's valid end is), reading only: a dry run
    opens nothing for writing. A ``from_offset`` before the end where no record starts is
    refused, as the dispatch itself refuses it, and so is a dispatch that leaves records out
    where the 'abort' it keeps would get the log cut (:func:`refuse_a_cutting_abort`).
    ``linked`` gets the selected topics' queue folders that are symbolic links, which the
    dispatch names and writes nothing through."""
    end = store.log_end().offset
    if from_offset is not None and from_offset < end:
        if store.commitlog.queue.find(from_offset) is None:
            raise InputError(f"offset {from_offset} is outside the commit-log files")
        first = next(iter(store.commitlog.scan(from_offset)), None)
        if first is None or first[0] != from_offset:
            raise _no_record_at(from_offset, end)
    selected = set(topics) if topics else None
    links: list[Path] = []
    queues = [
        ConsumeQueue(store.consumequeue_dir, topic, queue_id, store.consumequeue_file_size)
        for topic, queue_id in list_queues(store.consumequeue_dir, links)
        if selected is None or topic in selected
    ]
    if linked is not None:
        linked.extend(_of_topics(store, links, selected))
    for queue in queues:
        queue.refuse_until_rebuilt(_PUTS_ELSEWHERE)  # as the dispatch itself refuses it
    index = store.index_service() if build_index and store.config.message_index_enable else None
    try:
        if index is not None:
            index.refuse_links()  # as the dispatch itself refuses them
        cursor = resume_offset(store, queues, index, selected)
        start = no_later_than_replay(store, cursor) if from_offset is None else from_offset
        partial = leaves_records_out(store, selected, build_index) or start > cursor
        if partial and start < end:
            refuse_a_cutting_abort(store)  # as the dispatch itself refuses it
        return start, end
    finally:
        if index is not None:
            index.close()


@dataclass
class QueueRunOutcome:
    """What :func:`write_sorted_units` did (mergeable across parallel writers)."""

    records: int = 0
    units_written: int = 0
    units_skipped: int = 0
    touched: list[tuple[str, int]] = field(default_factory=list)
    last_written: tuple[int, int] | None = None  # (physical offset, store time)
    problems: list[tuple[int, str]] = field(default_factory=list)  # (record offset, text)
    unsafe_topics: dict[str, int] = field(default_factory=dict)  # topic: first record offset


def write_sorted_units(
    root: Path,
    file_size: int,
    commitlog_min_offset: int,
    rows: Iterable[tuple[str, int, int, int, int, int, int, int, bool]],
    topics: frozenset[str] | None = None,
) -> QueueRunOutcome:
    """Put units into consume queues under ``root`` (a ``consumequeue/`` directory or a
    staging copy of it) from rows ``(topic, queueId, queueOffset, commitLogOffset, size,
    tagsCode, sysFlag, storeTimestamp, copy)`` grouped by queue and ordered by offset within
    each: the same puts, in the same order per queue, as a dispatch walking the log makes.
    ``copy``: the unit of a record in a further queue (LMQ), not a record of its own. What
    it wrote is durable when it returns: where flush trusts syncfs(2), the queues written
    in one file, and the folders made for them, by one syncfs at the end. ``root`` is not
    made: when it is gone, StoreIOError."""
    outcome = QueueRunOutcome()
    current: tuple[str, int] | None = None
    queue: ConsumeQueue | None = None
    # the device of ``root``'s file system when one syncfs at the end makes the queues
    # written here durable (None: each queue flushes its files and folders as it is closed)
    device = _one_sync_device(root)
    unsynced = False  # queues closed for that syncfs to make durable
    try:
        for topic, queue_id, queue_offset, offset, size, code, sys_flag, stamp, copy in rows:
            outcome.records += not copy
            if sys_flag & TRANSACTION_MASK not in QUEUED_TRANSACTIONS:
                continue
            if topics is not None and topic not in topics:
                continue
            if not is_path_safe(topic):
                if offset < outcome.unsafe_topics.get(topic, offset + 1):
                    outcome.unsafe_topics[topic] = offset
                continue
            if (topic, queue_id) != current:
                if queue is not None:
                    unsynced |= _closed_for_one_sync(queue, device)
                current = (topic, queue_id)
                queue = ConsumeQueue(
                    root, topic, queue_id, file_size, commitlog_min_offset=commitlog_min_offset
                )
                queue.defer_names = device is not None
                queue.floor = root  # removed under a writer still running: not made again
            assert queue is not None
            put = queue.put(queue_offset, offset, size, code)
            if put is PutOutcome.DUPLICATE:
                outcome.units_skipped += 1
                continue
            if put is PutOutcome.OUT_OF_RANGE:
                outcome.problems.append(
                    (offset, out_of_range_problem(offset, queue_offset, topic, queue_id))
                )
                continue
            outcome.units_written += 1
            if not outcome.touched or outcome.touched[-1] != current:
                outcome.touched.append(current)
            if outcome.last_written is None or offset > outcome.last_written[0]:
                outcome.last_written = (offset, stamp)
            if put is PutOutcome.OUT_OF_ORDER:
                outcome.problems.append(
                    (offset, out_of_order_problem(offset, queue_offset, topic, queue_id))
                )
    finally:
        if queue is not None:
            unsynced |= _closed_for_one_sync(queue, device)
    if unsynced:
        sync_queues_file_system(root)
    return outcome


def _closed_for_one_sync(queue: ConsumeQueue, device: int | None) -> bool:
    """Close ``queue``; True when what it wrote is left to one syncfs(2) of ``device``'s file
    system (see :meth:`ConsumeQueue.sync_deferred`), False when it flushed it itself. A
    rebuild into 20,000 new LMQ queues made an fdatasync of each queue's file and an fsync
    of each folder made for it (80,000 syncs, each flushing the disk's write cache)."""
    if _waits_for_syncfs(queue, device):
        queue.close_unsynced()
        return True
    queue.close()
    return False


def _waits_for_syncfs(queue: ConsumeQueue, device: int | None) -> bool:
    """Whether what ``queue`` would flush can wait for one syncfs(2) of ``device``'s file
    system (None: no syncfs is made): it lies in one file (see
    :meth:`ConsumeQueue.sync_deferred`), in a folder of that file system."""
    return device is not None and queue.sync_deferred() and _device(queue.directory) == device


def out_of_order_problem(offset: int, queue_offset: int, topic: str, queue_id: int) -> str:
    return (
        f"record at {offset}: queue offset {queue_offset} leaves a gap in {topic}:{queue_id}; "
        "its unit was appended at the end of the queue, as a broker does"
    )


def out_of_range_problem(offset: int, queue_offset: int, topic: str, queue_id: int) -> str:
    return (
        f"record at {offset}: queue offset {queue_offset} cannot start the consume queue of "
        f"{topic}:{queue_id} (times 20 it is no file position a broker can name: a damaged "
        "QUEUEOFFSET?); its unit was not written"
    )


def unsafe_topic_problem(topic: str) -> str:
    return (
        f"topic {quoted(topic)} cannot name a consume-queue directory inside the store "
        "(unsafe name, or a symbolic link leading out); no unit was written in its queues"
    )


def linked_queue_problem(link: Path) -> str:
    return (
        f"{link} is a symbolic link (to {link_target(link)}), which rmqstore does not write "
        "through: the units of its queues are left out (a broker writes them there); "
        "rmqstore dispatch --rebuild --yes moves it to quarantine and rebuilds those queues "
        "in the store"
    )


def _of_topics(store: Store, links: list[Path], topics: Iterable[str] | None) -> list[Path]:
    """The ``links`` (found by ``list_queues``) that belong to ``topics`` (all when None)."""
    if topics is None:
        return links
    selected = set(topics)
    return [link for link in links if linked_queue(store.consumequeue_dir, link)[0] in selected]


def queue_written(store: Store, topic: str, queue_id: int) -> bool:
    """Whether a dispatch writes the consume queue of ``topic``:``queue_id``: not for a
    topic that cannot name a folder (:func:`is_path_safe`), nor through a topic or queue
    folder that is a symbolic link (``list_queues`` leaves those out, so the units there are
    neither known nor checked), nor where the folder resolves outside the store."""
    if not is_path_safe(topic):
        return False
    topic_folder = store.consumequeue_dir / topic
    folder = topic_folder / str(queue_id)
    return not topic_folder.is_symlink() and not folder.is_symlink() and store.inside(folder)


@dataclass
class RebuildPlan:
    """What ``dispatch --rebuild`` will do: move these to quarantine, reset the checkpoint's
    consume-queue/index times (a broker then replays everything if the rebuild is cut short),
    and dispatch from the first commit-log offset."""

    moves: list[Path]
    files: int
    reset_index: bool
    from_offset: int
    # what the rebuild makes (the folders it moves, and those it makes where there were none),
    # for a restore of its quarantine folder to set aside
    makes: list[Path] = field(default_factory=list)
    # where the replay stops before the log's valid end (damage in a file the log has gone
    # on from): the rebuilt queues and index would end there
    damage: LogDamage | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "quarantine": [str(path) for path in self.moves],
            "files": self.files,
            "resetCheckpoint": ["logicsMsgTimestamp"]
            + (["indexMsgTimestamp"] if self.reset_index else []),
            "dispatchFrom": self.from_offset,
            "damage": None if self.damage is None else self.damage.to_dict(),
        }


@dataclass(frozen=True, slots=True)
class LogDamage:
    """Where a replay of the whole commit log stops before the log's valid end: damage in a
    file before those a broker's recovery walks (which ignores it)."""

    offset: int
    reason: str
    log_end: int

    def to_dict(self) -> dict[str, Any]:
        return {"offset": self.offset, "reason": self.reason, "logEnd": self.log_end}

    def describe(self, *, rebuilt: bool = True) -> str:
        left_out = (
            "so the rebuilt consume queues and index would leave out"
            if rebuilt
            else "and the consume queues and index leave out"
        )
        return (
            f"the commit log is damaged at offset {self.offset:,} ({self.reason}), before its "
            f"valid end at {self.log_end:,} (a broker's recovery does not walk that file): a "
            f"replay stops there, {left_out} the {self.log_end - self.offset:,} bytes of "
            "records after it"
        )


def damage_before_end(store: Store, stopped_at: int, error: str | None) -> LogDamage | None:
    """The damage a replay of the log stopped at (``stopped_at``: the invalid record
    ``error`` says what is wrong with, or zeros), when that is in a file before those a
    broker's recovery walks and before the valid end it finds (a stop in the files it walks
    is where it ends the log)."""
    walked_from = store.recovery_start_offset()
    if walked_from is None or stopped_at >= walked_from:
        return None
    end = store.valid_end_as_opened()
    if stopped_at >= end:
        return None
    if error is None:
        return LogDamage(stopped_at, ZEROS_WHERE_RECORDS_GO_ON, end)
    return LogDamage(stopped_at, error.removeprefix(f"record at offset {stopped_at}: "), end)


def log_damage_before_end(store: Store, start: int | None = None) -> LogDamage | None:
    """Where a replay of the log from ``start`` (default: its first record, what a rebuild
    dispatches) stops before the valid end a broker's recovery finds, or None. Only the
    files before those recovery walks are scanned (CRCs not checked there, as the replay
    does not): in the files recovery walks, the replay ends where recovery ends the log."""
    log = store.commitlog
    first = log.min_offset if start is None else start
    walked_from = store.recovery_start_offset()
    if walked_from is None or first >= walked_from or log.queue.find(first) is None:
        return None  # the replay starts in the files recovery walks: it ends where recovery does
    scan = log.scan_short_of(first, walked_from, property_crc=store.config.force_verify_prop_crc)
    if scan is None:
        return None
    return damage_before_end(
        store, scan.end_offset, None if scan.error is None else str(scan.error)
    )


def plan_rebuild(
    store: Store,
    *,
    topics: Iterable[str] | None = None,
    rebuild_index: bool = True,
    up_to_damage: bool = False,
) -> RebuildPlan:
    """Plan a rebuild of the consume queues (of ``topics``, or all) and of the index. A log
    damaged before its valid end is refused (StoreFormatError), unless ``up_to_damage``:
    the plan then says where the rebuild will end."""
    damage = log_damage_before_end(store)
    if damage is not None and not up_to_damage:
        raise StoreFormatError(
            f"{damage.describe()}; nothing was changed (rmqstore verify names the damage; "
            "--up-to-damage rebuilds up to it all the same)"
        )
    selected = set(topics) if topics else None
    refuse_a_cutting_rebuild(store, selected, rebuild_index)
    if selected is None:
        makes = [store.consumequeue_dir]
    else:
        makes = [store.consumequeue_dir / topic for topic in sorted(selected)]
    if rebuild_index:
        makes.append(store.index_dir)
    moves = [path for path in makes if path.exists()]
    files = sum(1 for path in moves for item in _walk(path) if item.is_file())
    return RebuildPlan(moves, files, rebuild_index, store.commitlog.min_offset, makes, damage)


def _walk(path: Path) -> Iterable[Path]:
    if path.is_symlink() or not path.is_dir():
        return [path]
    return path.rglob("*")


@contextmanager
def rebuilding(store: Store, plan: RebuildPlan) -> Iterator[Path]:
    """:func:`apply_rebuild`, then the block replays the log (as the engine the user chose
    does it), given the quarantine folder. Stopped by an error once the old files began to
    move, the rebuild leaves ``abort`` in place (a broker starting on the store runs its
    crash recovery, which dispatches the log again), and what it raises says so."""
    folder: list[Path] = []
    with store.until_done("dispatch --rebuild", lambda: _where_old_files_are(folder)):
        yield apply_rebuild(store, plan, folder)


def _where_old_files_are(folder: list[Path]) -> str:
    return f"; the files it replaces are kept in {folder[0]}" if folder else ""


def apply_rebuild(store: Store, plan: RebuildPlan, made: list[Path] | None = None) -> Path:
    """Quarantine the old files (and a copy of the checkpoint and abort) and reset the
    checkpoint times, before a Dispatcher replays the log. Returns the quarantine folder
    (also added to ``made`` as soon as it exists)."""
    if store.consumequeue_dir not in plan.makes or (
        store.config.message_index_enable and not plan.reset_index
    ):
        remember_queue_reach(store)  # before some topics' queues are moved
    # a folder even when nothing is moved: its restore undoes the rebuild all the same; made
    # (with the checkpoint and abort as they were) before 'abort' is: a kill between the two
    # left an 'abort' no restore removed
    quarantine = Quarantine.create(store.root, "dispatch-rebuild")
    if made is not None:
        made.append(quarantine.directory)
    store.begin_write_keeping_state(quarantine)
    for path in plan.moves:
        quarantine.move_path(path, "replaced by dispatch --rebuild")
    quarantine.note_made(plan.makes, "rebuilt by dispatch --rebuild")
    checkpoint = store.checkpoint()
    if checkpoint is not None:
        reset = replace(checkpoint, logics_msg_timestamp=0)
        if plan.reset_index:
            reset = replace(reset, index_msg_timestamp=0)
        write_checkpoint(store.checkpoint_path, reset)
    return quarantine.directory
