"""Consume-queue checks of ``verify``: each queue walked in step with its records (the unit
at a record's queue offset must carry its offset, size and tagsCode), then what no record
matched (orphan units, units past the end of the log, dispatch lag), and the files."""

from __future__ import annotations

import os
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import chain, islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rmqstore.commitlog import RecordLookup
from rmqstore.consumequeue import (
    CQ_UNIT_SIZE,
    LARGEST_QUEUE_OFFSET,
    PRE_BLANK_SIZE,
    ROCKSDB_QUEUES_NOTE,
    UNIT,
    ConsumeQueue,
    QueueBounds,
    Unit,
    is_ext_address,
    link_target,
    linked_queue,
    list_queues,
)
from rmqstore.delay import SCHEDULE_TOPIC, DelayLevels, unit_tags_code
from rmqstore.errors import NotFoundError, RecordError, RmqStoreError, StoreFormatError
from rmqstore.hashing import tags_code
from rmqstore.kernel import layout as kernel_layout
from rmqstore.multidispatch import record_units, stored_copies
from rmqstore.properties import TAGS
from rmqstore.record import (
    QUEUED_TRANSACTIONS,
    TRANSACTION_MASK,
    RecordHeader,
)
from rmqstore.segments import is_segment_name
from rmqstore.store import CONSUMEQUEUE_DIR, Store
from rmqstore.topics import is_path_safe
from rmqstore.topicsconfig import BATCH_CONSUMEQUEUE_DIR, batch_queues_note
from rmqstore.verify.findings import LIVE_DISPATCH, NOTE, WARNING, VerifyReport, report_shared
from rmqstore.verify.records import (
    UNWALKED_DAMAGE,
    RecordBatch,
    UnwalkedDamage,
    half_made,
    relative,
)
from rmqstore.windows import read_range
from rmqstore.wording import counted, quoted

if TYPE_CHECKING:
    from rmqstore.dispatch import LogDamage

# bytes of a consume-queue file read at a time, kept until the queue's next unit lies past
# them: 3,276 units, fewer when many queues share the budget (a broker may have tens of
# thousands of queues), but never fewer than 204 units
_CHUNK = 64 * 1024 // CQ_UNIT_SIZE * CQ_UNIT_SIZE
_SMALLEST_CHUNK = 4 * 1024 // CQ_UNIT_SIZE * CQ_UNIT_SIZE
_CHUNKS_BUDGET = 64 * 1024 * 1024  # the chunks of all queues together, while it holds
# how a pre-blank unit starts: physical offset 0, then size PRE_BLANK_SIZE
_PRE_BLANK_START = UNIT.pack(0, PRE_BLANK_SIZE, 0)[:12]
_ORPHAN_BLOCK = 4096  # units of a queue given a second look together
# where a run's width, first queue offset, units, first unit and last row are, in the
# kernel's runs of the records' own units and of their units in further queues
_RUN_COLUMNS = (
    kernel_layout.RUN_WIDTH,
    kernel_layout.RUN_FIRST_QUEUE_OFFSET,
    kernel_layout.RUN_UNITS,
    kernel_layout.RUN_UNITS_FROM,
    kernel_layout.RUN_LAST_ROW,
)
_COPY_RUN_COLUMNS = (
    kernel_layout.COPY_RUN_WIDTH,
    kernel_layout.COPY_RUN_FIRST_QUEUE_OFFSET,
    kernel_layout.COPY_RUN_UNITS,
    kernel_layout.COPY_RUN_UNITS_FROM,
    kernel_layout.COPY_RUN_LAST_ROW,
)


def chunk_size(queues: int) -> int:
    """Bytes of a queue file read at a time when ``queues`` queues are checked at once."""
    share = _CHUNKS_BUDGET // max(queues, 1) // CQ_UNIT_SIZE * CQ_UNIT_SIZE
    return max(_SMALLEST_CHUNK, min(_CHUNK, share))


_UNREAD = -3  # QueueChecks._reach (or _stop) not read yet
# the runs of matched queue offsets a queue keeps (16 bytes each): past this many, the
# second look at the queue reads every unit, as it did before the runs were kept
MATCHED_RUNS_KEPT = 4096


@dataclass
class _QueueState:
    queue: ConsumeQueue
    matched: int = 0
    # the queue offsets matched, as [start, end) pairs in one flat array (None: more runs
    # than MATCHED_RUNS_KEPT): the second look at a queue reads only the units between them
    matched_runs: array | None = field(default_factory=lambda: array("q"))
    lag: int = 0
    first_lag: int | None = None
    checked: int = 0  # units compared with their record
    # the queue's bounds (it does not change while verify reads it)
    min_offset: int = field(init=False)
    max_offset: int = field(init=False)
    # the chunk the last unit came from: its bytes and the logical offsets they hold
    buf: Any = None
    base: int = 0
    limit: int = -1

    def __post_init__(self) -> None:
        self.min_offset = self.queue.min_offset
        self.max_offset = self.queue.max_offset

    def note_matched(self, first: int, count: int) -> None:
        """``count`` units from queue offset ``first`` on matched their records."""
        self.matched += count
        runs = self.matched_runs
        if runs is None:
            return
        if runs and runs[-1] == first:
            runs[-1] = first + count
        elif len(runs) < 2 * MATCHED_RUNS_KEPT:
            runs.extend((first, first + count))
        else:
            self.matched_runs = None

    def unmatched_spans(self) -> list[tuple[int, int]] | None:
        """The [start, end) queue offsets of the queue's units no record matched, in order
        (None: not known, every unit may be one)."""
        if self.matched_runs is None:
            return None
        runs = _coalesced(self.matched_runs)
        spans = []
        at = self.min_offset
        for start, end in zip(runs[::2], runs[1::2], strict=True):
            if start > at:
                spans.append((at, min(start, self.max_offset)))
            at = max(at, end)
        if at < self.max_offset:
            spans.append((at, self.max_offset))
        return [(start, end) for start, end in spans if start < end]


def _coalesced(runs: array) -> array:
    """Flat [start, end) runs sorted, those that touch or overlap made one."""
    merged = array("q")
    for start, end in sorted(zip(runs[::2], runs[1::2], strict=True)):
        if merged and start <= merged[-1]:
            merged[-1] = max(merged[-1], end)
        else:
            merged.extend((start, end))
    return merged


@dataclass
class _DifferingRun:
    """A run of a clean batch whose stored units are there but not all as its records need
    them: its units (``expected``, as dispatch would write them) beside the stored ones,
    and the batch's offsets and store times (a matching unit's time is the record's)."""

    state: _QueueState
    key: tuple[str, int]
    first: int  # the queue offset of the run's first unit
    expected: bytes
    stored: bytes
    offsets: Any
    stamps: Any


@dataclass
class _BatchPlan:
    """A clean batch taken as a whole (see :meth:`QueueChecks.batch_check`)."""

    # queue, the first unit's queue offset, units, the newest one's store time
    matched: list[tuple[_QueueState, int, int, int]]
    differing: list[_DifferingRun]
    lagging: list[tuple[_QueueState, int, int]]  # queue, units past its end, the first's offset
    missing: list[tuple[tuple[str, int], int, int]]  # no such queue: units, the first's offset


def readable_checks(store: Store, report: VerifyReport, checks: frozenset[str]) -> frozenset[str]:
    """``checks`` (the files checked against the commit log) without the consume queues when
    they are a RocksDB database, which rmqstore does not read: ``report`` notes it, and the
    BatchCQ topics, whose queues :class:`QueueChecks` leaves out."""
    if "queues" not in checks:
        return checks
    if store.queues_in_rocksdb:
        report.add(
            "queues-rocksdb",
            f"{CONSUMEQUEUE_DIR}/ {ROCKSDB_QUEUES_NOTE}: the commit log"
            + (", the index" if "index" in checks else "")
            + " and the checkpoint are checked, not the consume queues",
            NOTE,
            file=CONSUMEQUEUE_DIR,
        )
        return checks - {"queues"}
    if store.batch_queue_topics:
        report.add(
            "queues-batchcq",
            f"{batch_queues_note(store.batch_queue_topics)}, which rmqstore does not read: "
            "not checked (the other topics' queues are)",
            NOTE,
            file=BATCH_CONSUMEQUEUE_DIR,
        )
    return checks


class QueueChecks:
    """A record-pass listener plus the per-queue structural checks. With ``structural`` off
    (a range of a parallel verify) queues are opened as records need them and only the
    per-record checks run; :meth:`partial` and :meth:`absorb` carry their counts over."""

    def __init__(
        self,
        store: Store,
        report: VerifyReport,
        topics: set[str] | None,
        *,
        structural: bool = True,
        bounds: dict[tuple[str, int], QueueBounds] | None = None,
        defer_scans: bool = False,
        excluded: frozenset[str] | None = None,
    ) -> None:
        self.store = store
        self._unwalked_damage = UnwalkedDamage(store)  # what no command mends
        self._bounds = bounds or {}
        self._defer_scans = defer_scans
        self._deferred: list[tuple[ConsumeQueue, str]] = []
        self.report = report
        self.topics = topics
        # BatchCQ topics: their queues are in batchconsumequeue/, which rmqstore does not read
        self.excluded = store.batch_queue_topics if excluded is None else excluded
        self.delay_levels = DelayLevels(store.config.message_delay_level)
        self.states: dict[tuple[str, int], _QueueState] = {}
        self.missing_queues: dict[tuple[str, int], int] = {}
        self.missing_first: dict[tuple[str, int], int] = {}  # their first record's offset
        # topics no consume-queue folder can be named by: [records, first record's offset]
        self.unsafe_topics: dict[str, list[int]] = {}
        self.last_queued_time = 0  # store time of the newest record found in a queue
        self.resume_without_index = False  # where a dispatch resumes was told without it
        self._reach: int | None = _UNREAD  # where the consume queues reach (_who_adds)
        self._stop: int | None = _UNREAD  # the first record a broker's dispatch stops at
        self._folders: dict[Path, str] = {}  # each queue's folder, as findings name it
        self._lookup: RecordLookup | None = None  # records where unmatched units point
        self._beyond_reported: set[Path] = set()  # queues said to point past the log
        linked: list[Path] = []
        queues = list_queues(store.consumequeue_dir, linked)
        # queue folders (or a topic's) that are symbolic links: not followed, so their
        # records are not counted as missing from a queue either
        links = [linked_queue(store.consumequeue_dir, link) for link in linked]
        self.linked_topics = frozenset(topic for topic, queue_id in links if queue_id is None)
        self.linked_queues = frozenset(
            (topic, queue_id) for topic, queue_id in links if queue_id is not None
        )
        self._known = {key for key in queues if self._checked(key[0])}
        self._chunk = chunk_size(len(self._known))
        if structural:
            for link in linked:
                self._report_link(link)
            for topic, queue_id in queues:
                if (topic, queue_id) in self._known:
                    self._load(topic, queue_id)

    def _report_link(self, link: Path) -> None:
        topic = link.name if link.parent == self.store.consumequeue_dir else link.parent.name
        if self.topics is not None and topic not in self.topics:
            return
        named = relative(self.store, link)
        self.report.add(
            "queue-link",
            f"{named} is a symbolic link (to {link_target(link)}): a broker reads and writes those "
            "queue files through it; rmqstore does not follow it, so its units are not "
            "checked (nor written: append refuses the store, dispatch leaves them out)",
            WARNING,
            file=named,
        )

    def _checked(self, topic: str) -> bool:
        """Whether the units of ``topic``'s queues are checked."""
        return (
            (self.topics is None or topic in self.topics)
            and topic not in self.excluded
            and topic not in self.linked_topics
        )

    def _open(self, topic: str, queue_id: int) -> ConsumeQueue:
        known = self._bounds.get((topic, queue_id))
        return ConsumeQueue(
            self.store.consumequeue_dir,
            topic,
            queue_id,
            self.store.consumequeue_file_size,
            strict=False,
            known=known,
            commitlog_min_offset=self.store.commitlog.min_offset if known is None else None,
            keep_first_file=True,
        )

    def _new_state(self, queue: ConsumeQueue) -> tuple[_QueueState, bytes | None]:
        """The state of a queue just opened, holding its units when its load read them all
        at once and they fit a chunk (a store of thousands of queues of a few units each:
        no queue file is read again for them), and those bytes of its first file."""
        state = _QueueState(queue)
        first_file = queue.take_first_file()
        if first_file and len(first_file) <= self._chunk:
            state.buf, state.base = first_file, queue.queue.segments[0].start
            state.limit = state.base + len(first_file)
        return state, first_file

    def bounds(self) -> dict[tuple[str, int], QueueBounds]:
        """What loading each queue found, for :class:`QueueChecks` of the ranges."""
        return {key: state.queue.bounds for key, state in self.states.items()}

    def _state(self, key: tuple[str, int]) -> _QueueState | None:
        state = self.states.get(key)
        if state is None and key in self._known:
            state = self.states[key] = self._new_state(self._open(*key))[0]
        return state

    def partial(self) -> dict[str, Any]:
        """The counts a range found, for :meth:`absorb` on the full checks."""
        return {
            "queues": {
                key: (state.matched, state.lag, state.first_lag, state.matched_runs)
                for key, state in self.states.items()
                if state.matched or state.lag
            },
            "missing": dict(self.missing_queues),
            "missingFirst": dict(self.missing_first),
            "unsafe": {topic: tuple(seen) for topic, seen in self.unsafe_topics.items()},
            "lastQueuedTime": self.last_queued_time,
        }

    def _unsafe(self, topic: str, count: int, first: int) -> None:
        seen = self.unsafe_topics.setdefault(topic, [0, first])
        seen[0] += count
        seen[1] = min(seen[1], first)

    def absorb(self, partial: dict[str, Any]) -> None:
        for key, (matched, lag, first_lag, runs) in partial["queues"].items():
            state = self._state(key)
            if state is None:
                continue
            state.matched += matched
            if state.matched_runs is not None and runs is not None:
                # one run per range of a sound queue: put together as they come, so the
                # runs stay as few as the queue's unmatched stretches, not the ranges
                state.matched_runs = _coalesced(state.matched_runs + runs)
            if runs is None or len(state.matched_runs or ()) > 2 * MATCHED_RUNS_KEPT:
                state.matched_runs = None
            state.lag += lag
            if state.first_lag is None or (first_lag is not None and first_lag < state.first_lag):
                state.first_lag = first_lag
        for key, count in partial["missing"].items():
            self.missing_queues[key] = self.missing_queues.get(key, 0) + count
        for key, first in partial["missingFirst"].items():
            self.missing_first[key] = min(first, self.missing_first.get(key, first))
        for topic, (count, first) in partial["unsafe"].items():
            self._unsafe(topic, count, first)
        self.last_queued_time = max(self.last_queued_time, partial["lastQueuedTime"])

    def close(self) -> None:
        units = 0
        for state in self.states.values():
            units, state.checked = units + state.checked, 0
        if units:
            self.report.checked["units"] += units
        for state in self.states.values():
            state.queue.close()
        self._unwalked_damage.close()

    def _load(self, topic: str, queue_id: int) -> None:
        queue = self._open(topic, queue_id)
        name = relative(self.store, queue.directory)
        for problem in queue.queue.problems:
            self.report.add("cq-file-size", problem, file=name, topic=topic, queue_id=queue_id)
        for path, links in queue.queue.shared:  # (a file's other hard links)
            report_shared(self.report, path, links, relative(self.store, path))
        for path in queue.queue.links:
            self.report.add(
                "file-link",
                f"a symbolic link (to {link_target(path)}): a broker reads and writes the "
                "queue's units through it, and rmqstore reads them, but its writers refuse the "
                "queue (rmqstore dispatch --rebuild --yes moves its files, the link among them, "
                "to quarantine and builds the queue in the store)",
                WARNING,
                file=relative(self.store, path),
                topic=topic,
                queue_id=queue_id,
            )
        for path in queue.queue.unexpected:
            if half_made(self.report, self.store, path):
                continue
            if is_segment_name(path.name):  # a folder (or the like) under a file's name
                self.report.add(
                    "cq-layout",
                    "not a regular file, under a consume-queue file's name (no unit can be "
                    "written there)",
                    file=relative(self.store, path),
                    topic=topic,
                    queue_id=queue_id,
                )
                continue
            self.report.add(
                "file-name",
                "a folder among the consume-queue files (a broker lists it with them)"
                if path.is_dir()
                else "not a consume-queue file",
                WARNING,
                file=relative(self.store, path),
            )
        for previous, following in queue.queue.gaps():
            self.report.add(
                "cq-file-gap",
                f"expected the next file at {previous.start + queue.file_size}",
                file=relative(self.store, following.path),
                topic=topic,
                queue_id=queue_id,
            )
        state, first_file = self._new_state(queue)
        if self._defer_scans:
            self._deferred.append((queue, name))
        else:
            self._check_pre_blank(queue, name, first_file)
        self.states[(topic, queue_id)] = state
        self.report.checked["consumeQueues"] += 1

    def run_deferred(self) -> None:
        """The whole-file scans put off with ``defer_scans`` (run while ranges are checked)."""
        for queue, name in self._deferred:
            self._check_pre_blank(queue, name)
        self._deferred.clear()

    def _check_pre_blank(
        self, queue: ConsumeQueue, name: str, first_file: bytes | None = None
    ) -> None:
        """Pre-blank units may only fill the start of a queue's first file. The units
        before the first real one are read one by one; after it, a pre-blank unit (offset
        0, size PRE_BLANK_SIZE) is searched for in the bytes. ``first_file``: the first
        file's bytes up to the queue's end, read already."""
        seen_real = False
        for number, segment in enumerate(queue.queue.segments):
            wanted = max(0, min(queue.end - segment.start, queue.file_size))
            if not wanted:
                continue  # none of the queue's units are in it
            if number == 0 and first_file is not None:
                buf = first_file
            else:
                buf = read_range(segment.path, 0, wanted)
            end = len(buf) // CQ_UNIT_SIZE * CQ_UNIT_SIZE
            position = 0
            while not seen_real and position < end:
                offset, size, _ = UNIT.unpack_from(buf, position)
                if offset == 0 and size == PRE_BLANK_SIZE:
                    position += CQ_UNIT_SIZE
                else:
                    seen_real = True
            found = buf.find(_PRE_BLANK_START, position, end)
            while found >= 0 and found % CQ_UNIT_SIZE:  # within two units: not one
                found = buf.find(_PRE_BLANK_START, found + 1, end)
            if found >= 0:
                queue_offset = (segment.start + found) // CQ_UNIT_SIZE
                self.report.add(
                    "cq-pre-blank",
                    f"pre-blank unit at queue offset {queue_offset} after real units",
                    file=relative(self.store, segment.path),
                    file_position=found,
                    topic=queue.topic,
                    queue_id=queue.queue_id,
                    queue_offset=queue_offset,
                )
                return

    def _unit(self, state: _QueueState, queue_offset: int) -> tuple[int, int, int] | None:
        position = queue_offset * CQ_UNIT_SIZE
        buf = state.buf
        if state.base <= position <= state.limit - CQ_UNIT_SIZE:
            return UNIT.unpack_from(buf, position - state.base)  # the chunk of the last unit
        segment = state.queue.queue.find(position)
        if segment is None:
            return None
        # the next units of this queue, a chunk at a time, up to the queue's valid end (units
        # past the configured size belong to no file): memory is one chunk per queue, never
        # mapped, and no more than the units it holds
        within = position - segment.start
        wanted = min(
            self._chunk, state.queue.file_size - within, state.max_offset * CQ_UNIT_SIZE - position
        )
        buf = read_range(segment.path, within, wanted)
        if len(buf) < CQ_UNIT_SIZE:
            return None
        state.buf, state.base, state.limit = buf, position, position + len(buf)
        within = 0
        return UNIT.unpack_from(buf, within)

    def batch_check(self, batch: RecordBatch) -> _BatchPlan | None:
        """A clean batch's runs of units, each compared with its queue's stored units in one
        comparison (changing nothing: another check may send the batch record by record);
        None when a queue file lacks units it should hold. What the records would find one
        by one is found run by run: units not dispatched yet (past the queue's end) are
        lag, units of a queue that does not exist are counted for it, expired units (before
        the queue's start) are not compared, and a run whose stored units differ is compared
        unit by unit when the plan is applied (a damaged or lagging queue does not send the
        whole batch, and the other checks, record by record). The runs of the records' units
        in further queues (``batch.copy_runs``) are taken the same way. The order of the
        comparisons does not matter: each unit is compared with the unit stored at its own
        position."""
        plan = _BatchPlan([], [], [], [])
        for key, first, count, start, last, units in _batch_runs(batch):
            if not self._checked(key[0]) or key in self.linked_queues:
                continue
            if first + count > LARGEST_QUEUE_OFFSET + 1:
                return None  # an offset no queue position can hold: reported record by record
            state = self.states.get(key) or self._state(key)  # a range opens it as needed
            if state is None:
                plan.missing.append((key, count, UNIT.unpack_from(units, start)[0]))
                continue
            # [low, high): the units the queue holds; before, expired; from high, lag
            low = min(max(first, state.min_offset), first + count)
            high = max(min(first + count, state.max_offset), low)
            if high < first + count:
                lag_from = start + (high - first) * CQ_UNIT_SIZE
                plan.lagging.append(
                    (state, first + count - high, UNIT.unpack_from(units, lag_from)[0])
                )
            if low == high:
                continue
            begin = start + (low - first) * CQ_UNIT_SIZE
            expected = bytes(units[begin : begin + (high - low) * CQ_UNIT_SIZE])
            stored = self._stored_units(state, low, high - low)
            if stored is None:
                return None
            if stored != expected:
                run = _DifferingRun(state, key, low, expected, stored, batch.offsets, batch.stamps)
                plan.differing.append(run)
                continue
            if high < first + count:  # the last unit compared is not the run's last
                last_offset = UNIT.unpack_from(expected, len(expected) - CQ_UNIT_SIZE)[0]
                last = bisect_left(batch.offsets, last_offset)
            plan.matched.append((state, low, high - low, batch.stamps[last]))
        return plan

    def batch_apply(self, plan: _BatchPlan) -> None:
        for state, first, count, newest in plan.matched:
            state.checked += count
            state.note_matched(first, count)
            if newest > self.last_queued_time:
                self.last_queued_time = newest
        for run in plan.differing:
            self._compare_run(run)
        for state, count, first_offset in plan.lagging:
            state.lag += count
            if state.first_lag is None:
                state.first_lag = first_offset
        for key, count, first_offset in plan.missing:
            if is_path_safe(key[0]):
                self.missing_queues[key] = self.missing_queues.get(key, 0) + count
                self.missing_first.setdefault(key, first_offset)
            else:
                self._unsafe(key[0], count, first_offset)

    def _compare_run(self, run: _DifferingRun) -> None:
        """Compare a differing run's units one by one, as :meth:`_compare_unit` compares a
        record's: a unit that differs only by a ConsumeQueueExt address for its tagsCode
        matches; each other is reported (once the report keeps no more findings, only
        counted: a queue shifted by one unit differs in every unit)."""
        state, expected, stored = run.state, run.expected, run.stored
        count = len(expected) // CQ_UNIT_SIZE
        state.checked += count
        newest_offset = None
        report = self.report
        for number in range(count):
            at = number * CQ_UNIT_SIZE
            if stored[at : at + CQ_UNIT_SIZE] == expected[at : at + CQ_UNIT_SIZE]:
                state.note_matched(run.first + number, 1)
                newest_offset = number
                continue
            want = UNIT.unpack_from(expected, at)
            unit = UNIT.unpack_from(stored, at)
            if unit[:2] == want[:2] and is_ext_address(unit[2]):
                state.note_matched(run.first + number, 1)
                newest_offset = number
                continue
            if not report.keeps():
                report.count("cq-unit")
                continue
            self._report_unit(state, run.key, run.first + number, unit, want)
        if newest_offset is not None:  # the newest matching unit's record: its store time
            offset = UNIT.unpack_from(expected, newest_offset * CQ_UNIT_SIZE)[0]
            stamp = run.stamps[bisect_left(run.offsets, offset)]
            if stamp > self.last_queued_time:
                self.last_queued_time = stamp

    def _stored_units(self, state: _QueueState, first: int, count: int) -> bytes | None:
        """The stored bytes of units ``[first, first + count)`` (None where a file lacks
        them)."""
        position = first * CQ_UNIT_SIZE
        end = (first + count) * CQ_UNIT_SIZE
        if state.base <= position and end <= state.limit:  # in the chunk of the last unit
            return bytes(state.buf[position - state.base : end - state.base])
        chunks = []
        file_size = state.queue.file_size
        while position < end:
            segment = state.queue.queue.find(position)
            if segment is None:
                return None
            within = position - segment.start
            wanted = min(end - position, file_size - within)
            chunk = read_range(segment.path, within, wanted)
            if len(chunk) < wanted:
                return None
            chunks.append(chunk)
            position += wanted
        return b"".join(chunks)

    def on_record(
        self,
        offset: int,
        header: RecordHeader,
        topic: str,
        properties: dict[str, str],
        stored: bytes,
    ) -> None:
        if header.sys_flag & TRANSACTION_MASK not in QUEUED_TRANSACTIONS:
            return
        # its units in LMQ queues too (spec 6.8)
        units = record_units(topic, header.queue_id, header.queue_offset, properties, stored)
        expected_tags: int | None = None
        tags_known = False
        for unit_topic, queue_id, queue_offset in units:
            state = self._due(unit_topic, queue_id, queue_offset, offset)
            if state is None:
                continue
            if not tags_known:
                expected_tags, tags_known = self._tags_code(topic, header, properties), True
            self._compare_unit(
                state,
                (unit_topic, queue_id),
                queue_offset,
                offset,
                header.total_size,
                header.store_timestamp,
                expected_tags,
            )

    def _due(
        self, unit_topic: str, queue_id: int, queue_offset: int, offset: int
    ) -> _QueueState | None:
        """The state of the queue where the record at ``offset`` has a unit at
        ``queue_offset`` when that unit is to be compared; None when it is not (a topic left
        out, an offset no queue holds, no such queue, the unit expired or not dispatched
        yet), each counted or reported as it must be."""
        if not self._checked(unit_topic):
            return None
        if not 0 <= queue_offset <= LARGEST_QUEUE_OFFSET:
            self.report.add(
                "record-queue-offset",
                f"the record at {offset} has queue offset {queue_offset} in "
                f"{unit_topic}:{queue_id}, which no consume-queue position can hold "
                "(a damaged QUEUEOFFSET?): dispatch leaves its unit out",
                commit_log_offset=offset,
                topic=unit_topic,
                queue_id=queue_id,
            )
            return None
        key = (unit_topic, queue_id)
        if key in self.linked_queues:
            return None
        state = self.states.get(key) or self._state(key)
        if state is None:
            if is_path_safe(unit_topic):
                self.missing_queues[key] = self.missing_queues.get(key, 0) + 1
                self.missing_first.setdefault(key, offset)
            else:
                self._unsafe(unit_topic, 1, offset)
            return None
        if queue_offset < state.min_offset:
            return None  # the unit expired with older files
        if queue_offset >= state.max_offset:
            state.lag += 1
            if state.first_lag is None:
                state.first_lag = offset
            return None
        return state

    def _tags_code(
        self, topic: str, header: RecordHeader, properties: dict[str, str]
    ) -> int | None:
        """The tagsCode a record's units carry (None: not known, its DELAY is bad)."""
        if topic != SCHEDULE_TOPIC:
            return tags_code(properties.get(TAGS))
        try:
            return unit_tags_code(topic, properties, header.store_timestamp, self.delay_levels)
        except RecordError:
            return None  # reported by the record checks

    def _compare_unit(
        self,
        state: _QueueState,
        key: tuple[str, int],
        queue_offset: int,
        offset: int,
        size: int,
        stamp: int,
        expected_tags: int | None,
    ) -> None:
        unit = self._unit(state, queue_offset)
        state.checked += 1
        if (
            unit is None
            or unit[0] != offset
            or unit[1] != size
            # a ConsumeQueueExt address stands for the tagsCode (enableConsumeQueueExt)
            or (
                expected_tags is not None
                and unit[2] != expected_tags
                and not is_ext_address(unit[2])
            )
        ):
            self._report_unit(state, key, queue_offset, unit, (offset, size, expected_tags))
        else:
            state.note_matched(queue_offset, 1)
            if stamp > self.last_queued_time:
                self.last_queued_time = stamp

    def _report_unit(
        self,
        state: _QueueState,
        key: tuple[str, int],
        queue_offset: int,
        unit: tuple[int, int, int] | None,
        expected: tuple[int, int, int | None],
    ) -> None:
        """A unit that is not what its record needs (``expected``: offset, size, tagsCode)."""
        self.report.add(
            "cq-unit",
            f"unit {queue_offset} of {key[0]}:{key[1]} is (offset, size, tagsCode) = "
            f"{unit}, but its record at {expected[0]} needs {expected}",
            **self._unit_place(state.queue, queue_offset),
            commit_log_offset=expected[0],
        )

    def finish(self, log_end: int) -> None:
        live = self.store.written_elsewhere  # a broker dispatches as it writes
        not_yet = _NotDispatchedYet()  # of a store being written, all its queues' lag
        resume = self._dispatch_resume() if self._lags() and not live else None
        blocked = replay_damage(self.store, resume)
        for (topic, queue_id), state in self.states.items():
            queue = state.queue
            name = relative(self.store, queue.directory)
            if state.lag and live:
                not_yet.add(state.lag, state.first_lag)
            elif (
                state.lag and state.first_lag is not None and _left_behind(state.first_lag, resume)
            ):
                self._report_hole(
                    f"{counted(state.lag, 'record')} of {topic}:{queue_id} from offset "
                    f"{state.first_lag} {'is' if state.lag == 1 else 'are'} not in the "
                    "consume queue",
                    state.first_lag,
                    resume,
                    file=name,
                    topic=topic,
                    queue_id=queue_id,
                    queue_offset=queue.max_offset,
                )
            elif state.lag:
                unreached = behind_damage(blocked, state.lag, state.first_lag)
                self.report.add(
                    "dispatch-lag",
                    f"{counted(state.lag, 'record')} of {topic}:{queue_id} from offset "
                    f"{state.first_lag} {'is' if state.lag == 1 else 'are'} not in the "
                    f"consume queue ({unreached or self._who_adds(state.lag, state.first_lag)})",
                    WARNING,
                    file=name,
                    commit_log_offset=state.first_lag,
                    topic=topic,
                    queue_id=queue_id,
                    queue_offset=queue.max_offset,
                    report_only=unreached is not None,
                )
            if state.matched < queue.max_offset - queue.min_offset:
                self._report_orphans(topic, queue_id, queue, log_end, state.unmatched_spans())
        for topic, (count, first) in sorted(self.unsafe_topics.items()):
            self.report.add(
                "queue-name-unsafe",
                f"{counted(count, 'record')} of topic {quoted(topic)} (its own or a further "
                "queue INNER_MULTI_DISPATCH names) cannot have a consume queue: the name is no "
                "folder inside the store (a broker would write outside consumequeue/); "
                "dispatch writes no unit for them",
                WARNING,
                commit_log_offset=first,
                topic=topic,
            )
        for (topic, queue_id), count in self.missing_queues.items():
            blocker = self._in_the_way(topic, queue_id)
            if blocker is not None:
                self.report.add(
                    "cq-layout",
                    f"not a directory, where the consume queue of {topic}:{queue_id} must be "
                    f"({counted(count, 'record')} of it in the commit log)",
                    file=relative(self.store, blocker),
                    topic=topic,
                    queue_id=queue_id,
                )
                continue
            text = (
                f"{counted(count, 'record')} of {topic}:{queue_id} "
                f"{'has' if count == 1 else 'have'} no consume queue at all"
            )
            first = self.missing_first.get((topic, queue_id))
            if live:
                not_yet.add(count, first)
                continue
            if first is not None and _left_behind(first, resume):
                self._report_hole(
                    text,
                    first,
                    resume,
                    file=f"consumequeue/{topic}/{queue_id}",
                    topic=topic,
                    queue_id=queue_id,
                )
                continue
            unreached = behind_damage(blocked, count, first)
            self.report.add(
                "dispatch-lag",
                f"{text} ({unreached or self._who_adds(count, first)})",
                WARNING,
                file=f"consumequeue/{topic}/{queue_id}",
                commit_log_offset=first,
                topic=topic,
                queue_id=queue_id,
                report_only=unreached is not None,
            )
        if not_yet.records:
            self.report.add(
                "dispatch-lag",
                f"{counted(not_yet.records, 'record')} of {counted(not_yet.queues, 'queue')} "
                f"from offset {not_yet.first} {'was' if not_yet.records == 1 else 'were'} not "
                f"in {'its consume queue' if not_yet.queues == 1 else 'their consume queues'} "
                f"yet ({LIVE_DISPATCH})",
                NOTE,
                file=relative(self.store, self.store.consumequeue_dir),
                commit_log_offset=not_yet.first,
            )
        self.close()

    def _who_adds(self, records: int, first: int | None) -> str:
        """Who puts ``records`` (from offset ``first``) after where a dispatch resumes into
        their queue (spec 10.2 to 10.4): rmqstore dispatch; after a crash ('abort' present) a
        broker's recovery at its start. After a clean stop a broker's start leaves out those
        before where the furthest consume queue ends (4.9 starts its reput there, 5.3.2 and
        later dispatch past it in their normal recovery, 4.3.1, 5.3.0 and 5.3.1 dispatch
        nothing); those past it a 4.9 broker's start dispatches, and a 5.x broker's only in
        part (its reput starts at the log's end unless recheckReputOffsetFromCq is set). A
        broker's dispatch adds none from a record it stops at (``dispatch-stop``)."""
        them = "it" if records == 1 else "them"
        stop = self._broker_stop()
        if stop is not None:
            return (
                f"rmqstore dispatch adds {them}; a broker's dispatch stops at the record at "
                f"{stop:,} (dispatch-stop) and adds none from there on"
            )
        if self.store.aborted:
            return f"rmqstore dispatch adds {them}, and so does a broker's crash recovery at start"
        reach = self._queue_reach()
        if first is not None and reach is not None and first < reach:
            left_out = "it out, as it lies" if records == 1 else "out those"
            return (
                f"rmqstore dispatch adds {them}; no 'abort', so a broker's start leaves "
                f"{left_out} before offset {reach:,}, where the furthest consume queue ends "
                "(4.9 dispatches only what follows it, 5.3.2 and later only what follows the "
                "record there, 4.3.1, 5.3.0 and 5.3.1 none)"
            )
        return (
            f"rmqstore dispatch adds {them}, and so does a 4.9 broker's start; no 'abort', so "
            "a 5.x broker's start may not: 5.3.0 and 5.3.1 dispatch none, 5.3.2 and later only "
            "records past the one at the furthest queue's end"
        )

    def _broker_stop(self) -> int | None:
        """The first record the record pass found a broker's dispatch stops at
        (``dispatch-stop``), looked up once; None when it found none."""
        if self._stop == _UNREAD:
            self._stop = min(
                (
                    finding.commit_log_offset
                    for finding in self.report.findings
                    if finding.kind == "dispatch-stop" and finding.commit_log_offset is not None
                ),
                default=None,
            )
        return self._stop

    def _queue_reach(self) -> int | None:
        """Where the consume queues reach (:func:`rmqstore.dispatch.queue_reach`), read once;
        None when a queue cannot be read."""
        if self._reach == _UNREAD:
            from rmqstore.dispatch import queue_reach

            self._reach = queue_reach(self.store)
        return self._reach

    def _lags(self) -> bool:
        return bool(self.missing_queues) or any(state.lag for state in self.states.values())

    def _dispatch_resume(self) -> int | None:
        """Where ``rmqstore dispatch`` (and a broker starting without ``abort``) would start:
        after the furthest consume queue's last record, or earlier where the index ends.
        None when that cannot be told (a queue or the index unreadable)."""
        from rmqstore.dispatch import plan_dispatch

        try:
            start, _ = plan_dispatch(self.store)
        except (RmqStoreError, OSError):
            try:  # the index unreadable (its geometry not known, say): the queues alone
                start, _ = plan_dispatch(self.store, build_index=False)
            except (RmqStoreError, OSError):
                return None
            self.resume_without_index = True
        return start

    def _report_hole(self, text: str, first: int, resume: int | None, **place: Any) -> None:
        """Records of a queue left behind where a dispatch resumes: neither a dispatch nor
        a broker's restart (without ``abort``) ever adds them, and the queue's next unit
        would take the queue offset of its first missing record."""
        where = (
            "not known: a consume queue is unreadable"
            if resume is None
            else f"{resume:,}, where the consume queues end: the index could not be read"
            if self.resume_without_index
            else f"{resume:,}"
        )
        self.report.add(
            "dispatch-hole",
            f"{text}, before where a dispatch resumes ({where}): neither rmqstore dispatch "
            "nor a broker's restart adds them (the queue's next unit would take the wrong "
            f"queue offset); rmqstore dispatch --from-offset {first} does, or --rebuild",
            commit_log_offset=first,
            **place,
        )

    def _in_the_way(self, topic: str, queue_id: int) -> Path | None:
        """A file where the folder of a queue (or of its topic) must be made, if one is."""
        topic_dir = self.store.consumequeue_dir / topic
        for path in (topic_dir, topic_dir / str(queue_id)):
            if path.exists() and not path.is_dir():
                return path
        return None

    def _report_orphans(
        self,
        topic: str,
        queue_id: int,
        queue: ConsumeQueue,
        log_end: int,
        spans: list[tuple[int, int]] | None,
    ) -> None:
        """Second look at a queue whose units were not all matched by records: say which
        units point past the log, or at something that is not their record. A block of
        units at a time: those plainly in place (each a whole record of the unit's size,
        queue and queue offset, found as ``read --topic`` finds them, by the reader's
        ``units_in_place``) are passed over; each other is looked up on its own. Units past
        the log's end are not read: the first is reported (once per queue), and the others
        add nothing to that. Only the units in ``spans`` (those no record matched, when
        known) are looked at: a matched unit is plainly in place."""
        from rmqstore.reader import MessageReader

        reader = MessageReader(self.store)
        looked_at = (
            queue.unit_values()
            if spans is None
            else chain.from_iterable(queue.unit_values(start, end - start) for start, end in spans)
        )
        for block in _blocks(looked_at, _ORPHAN_BLOCK):
            within = [values for values in block if values[1] + values[2] <= log_end]
            in_place = iter(reader.units_in_place(topic, queue_id, within) if within else ())
            beyond_said = queue.directory in self._beyond_reported
            units = []
            for values in block:
                if values[1] + values[2] > log_end:
                    if not beyond_said:
                        units.append(Unit(*values))
                elif not next(in_place, False):
                    units.append(Unit(*values))
            self._orphans_of(topic, queue_id, queue, log_end, units)

    def _orphans_of(
        self, topic: str, queue_id: int, queue: ConsumeQueue, log_end: int, units: list[Unit]
    ) -> None:
        """Report which of ``units`` (of a queue, in order) point past the log (from the
        first on, once per queue) or at something that is not their record."""
        lookup = self._lookup
        if lookup is None:
            lookup = self._lookup = RecordLookup(self.store.commitlog)
        report = self.report
        for unit in units:
            if unit.is_pre_blank:
                continue
            if unit.physical_offset + unit.size > log_end:
                if queue.directory not in self._beyond_reported:
                    self._beyond_reported.add(queue.directory)
                    self.report.add(
                        "cq-beyond-log",
                        f"units from queue offset {unit.queue_offset} point past the end of "
                        f"the commit log ({log_end}): a broker truncates them at recovery",
                        **self._unit_place(queue, unit.queue_offset),
                        commit_log_offset=unit.physical_offset,
                    )
                continue
            damaged = False
            try:
                holder = lookup.holder(unit.physical_offset)
            except (RecordError, StoreFormatError, NotFoundError) as exc:
                reason = f"no record starts there ({exc})"
                damaged = isinstance(exc, RecordError)
            else:
                place = (topic, queue_id, unit.queue_offset)
                if holder[:3] == place or place in stored_copies(
                    holder.topic, holder.queue_id, holder.properties_bytes
                ):
                    continue  # its record's, or the record's copy in an LMQ queue
                reason = (
                    f"the record there belongs to {holder.topic}:{holder.queue_id} at queue "
                    f"offset {holder.queue_offset}"
                )
            if not report.keeps():
                report.count("cq-unit-orphan")
                continue
            unmendable = damaged and self._unwalked_damage(unit.physical_offset)
            report.add(
                "cq-unit-orphan",
                f"unit {unit.queue_offset} of {topic}:{queue_id} points at offset "
                f"{unit.physical_offset}: {reason}"
                + (f": {UNWALKED_DAMAGE}" if unmendable else ""),
                **self._unit_place(queue, unit.queue_offset),
                commit_log_offset=unit.physical_offset,
                report_only=unmendable,
            )

    def _unit_place(self, queue: ConsumeQueue, queue_offset: int) -> dict[str, Any]:
        """The position fields of unit ``queue_offset`` of ``queue``: its queue, the file it
        is in (named by the file's first byte, as a broker names it) and its place there."""
        position = queue_offset * CQ_UNIT_SIZE
        start = position - position % queue.file_size
        folder = self._folders.get(queue.directory)
        if folder is None:  # (once per queue: a damaged queue can have a finding per unit)
            folder = self._folders[queue.directory] = relative(self.store, queue.directory)
        return {
            "file": os.path.join(folder, f"{start:020d}"),
            "file_position": position - start,
            "topic": queue.topic,
            "queue_id": queue.queue_id,
            "queue_offset": queue_offset,
        }


def _batch_runs(batch: RecordBatch) -> Iterator[tuple[tuple[str, int], int, int, int, int, Any]]:
    """Each run of a clean batch, its records' own units first, then their units in further
    queues: (its queue, first queue offset, units, where its units start in the bytes that
    hold them, the row of its last unit, those bytes)."""
    layout = kernel_layout
    for keys, runs, units, columns in (
        (batch.run_keys, batch.runs, batch.units, _RUN_COLUMNS),
        (batch.copy_run_keys, batch.copy_runs, batch.copy_units, _COPY_RUN_COLUMNS),
    ):
        width, first_at, count_at, from_at, last_at = columns
        for number, key in enumerate(keys):
            at = number * width
            yield (
                key,
                runs[at + first_at],
                runs[at + count_at],
                runs[at + from_at] * layout.UNIT_SIZE,
                runs[at + last_at],
                units,
            )


@dataclass
class _NotDispatchedYet:
    """The records a broker writing the store had not put in their queues yet."""

    records: int = 0
    queues: int = 0
    first: int | None = None  # the first one's offset

    def add(self, records: int, first: int | None) -> None:
        self.records += records
        self.queues += 1
        if first is not None and (self.first is None or first < self.first):
            self.first = first


def _blocks(values: Iterable[Any], size: int) -> Iterator[list[Any]]:
    """``values`` in lists of ``size`` (the last shorter)."""
    iterator = iter(values)
    while block := list(islice(iterator, size)):
        yield block


def replay_damage(store: Store, resume: int | None) -> LogDamage | None:
    """The damage a replay of the log from ``resume`` (where a dispatch starts) stops at
    before the log's valid end (None: none, or ``resume`` not known)."""
    if resume is None:
        return None
    from rmqstore.dispatch import log_damage_before_end

    try:
        return log_damage_before_end(store, resume)
    except (RmqStoreError, OSError):
        return None


def behind_damage(damage: LogDamage | None, records: int, first: int | None) -> str | None:
    """Why ``records`` from offset ``first``, lagging behind where a dispatch starts, are
    reached by no dispatch (they lie after ``damage``), or None."""
    if damage is None or first is None or first <= damage.offset:
        return None
    them = "it" if records == 1 else "them"
    return (
        f"after the damage at offset {damage.offset:,}, where a replay of the log stops "
        f"before its valid end: neither rmqstore dispatch nor a slave broker's reaches {them}, "
        "and a master broker's skips the rest of that file"
    )


def _left_behind(first: int, resume: int | None) -> bool:
    """Whether records from ``first`` on lie before where a dispatch resumes (or that is
    not known): then no dispatch from there adds them."""
    return resume is None or first < resume
