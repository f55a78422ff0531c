"""Where consumer groups and the delay scheduler stand in their queues (``rmqstore offsets``;
mqadmin consumerProgress, offline): the offsets ``config/consumerOffset.json`` and
``config/delayOffset.json`` hold, against each queue's min and max offsets as a broker
computes them, with what is left to consume and the offsets a broker would find out of range.

An offset past its queue's end is what a recovery that cut a queue leaves (the group had
consumed messages the store no longer holds): a broker answers the group's pulls as out of
range, and messages stored again in that queue below the group's offset may never reach it.
An offset before the queue's start means messages were removed (expired files) before the
group consumed them; the broker moves the group on to the start."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from rmqstore.consumequeue import ROCKSDB_QUEUES_NOTE, ConsumeQueue, list_queues
from rmqstore.delay import DelayLevels
from rmqstore.errors import InputError, NotFoundError
from rmqstore.geometry import CONFIG_DIR
from rmqstore.offsetsconfig import (
    ConsumerOffsets,
    DelayOffsets,
    LoadedConfig,
    read_consumer_offsets,
    read_delay_offsets,
)
from rmqstore.store import CONSUMEQUEUE_DIR, Store
from rmqstore.topics import SCHEDULE_TOPIC
from rmqstore.wording import counted

IN_RANGE = "ok"
PAST_END = "past-end"  # the offset is beyond the queue's max offset
BEFORE_START = "before-start"  # the queue's first messages went before they were consumed
NO_QUEUE = "no-queue"  # the store has no consume queue for it
UNREADABLE = "unreadable"  # its consume queue does not load (a file of the wrong size)


@dataclass
class QueueOffsets:
    """One queue's bounds, read once however many groups consume it (None: no such queue)."""

    min_offset: int
    max_offset: int
    queue: ConsumeQueue


@dataclass
class OffsetsReport:
    """JSON-ready parts of ``rmqstore offsets``' answer, and what the user should hear."""

    consumers: dict[str, Any]
    scheduler: dict[str, Any]
    consumers_loaded: LoadedConfig
    scheduler_loaded: LoadedConfig
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"consumerOffsets": self.consumers, "delayOffsets": self.scheduler}


class _Queues:
    """The store's consume queues by (topic, queue id), each opened once when first asked."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._known: dict[tuple[str, int], QueueOffsets | None] = {}
        self.unreadable: dict[tuple[str, int], str] = {}  # why each queue does not load

    def get(self, topic: str, queue_id: int) -> QueueOffsets | None:
        key = (topic, queue_id)
        if key not in self._known:
            try:
                queue = self.store.consume_queue(topic, queue_id)
            except NotFoundError as exc:
                self._known[key] = None
                if self.store.queues_unread(topic) is not None:  # no queue end is known
                    self.unreadable[key] = str(exc)
            except InputError as exc:  # verify names its files' damage; the rest goes on
                self._known[key] = None
                self.unreadable[key] = str(exc)
            else:
                self._known[key] = QueueOffsets(queue.min_offset, queue.max_offset, queue)
        return self._known[key]

    def missing(self, topic: str, queue_id: int) -> str:
        """The state of an offset in a queue :meth:`get` gave None for."""
        return UNREADABLE if (topic, queue_id) in self.unreadable else NO_QUEUE

    def store_time(self, bounds: QueueOffsets, queue_offset: int) -> int:
        """The store time of the message at ``queue_offset`` (0 when there is none)."""
        if not bounds.min_offset <= queue_offset < bounds.max_offset:
            return 0
        unit = bounds.queue.read_unit(queue_offset)
        return self.store.commitlog.unit_store_time(unit.physical_offset, unit.size)

    def tags_code(self, bounds: QueueOffsets, queue_offset: int) -> int | None:
        if not bounds.min_offset <= queue_offset < bounds.max_offset:
            return None
        return bounds.queue.read_unit(queue_offset).tags_code


def offsets_report(
    store: Store,
    groups: Collection[str] = (),
    topics: Collection[str] = (),
    delay_levels: DelayLevels | None = None,
) -> OffsetsReport:
    """Each consumer group's offsets (only ``groups``' and ``topics``' when given) and the
    delay scheduler's against the store's consume queues. Reads the config files, each
    queue's bounds and one unit (and its record's store time) per offset."""
    queues = _Queues(store)
    config_dir = store.root / CONFIG_DIR
    consumers = read_consumer_offsets(config_dir)
    scheduler = read_delay_offsets(config_dir)
    report = OffsetsReport(
        _consumer_rows(queues, consumers, set(groups), set(topics)),
        _scheduler_rows(queues, scheduler, delay_levels),
        consumers.loaded,
        scheduler.loaded,
    )
    for loaded, left_out in (
        (consumers.loaded, consumers.left_out),
        (scheduler.loaded, scheduler.left_out),
    ):
        report.notes.extend(_load_notes(store, loaded, left_out))
    if store.queues_in_rocksdb:
        report.notes.append(
            f"{CONSUMEQUEUE_DIR}/ {ROCKSDB_QUEUES_NOTE}, which rmqstore does not read: no "
            "queue's bounds are known (every offset's state is unreadable)"
        )
    else:
        for (topic, queue_id), why in sorted(queues.unreadable.items()):
            report.notes.append(f"{topic}:{queue_id} left out (state unreadable): {why}")
    return report


def _consumer_rows(
    queues: _Queues, offsets: ConsumerOffsets, groups: set[str], topics: set[str]
) -> dict[str, Any]:
    by_group: dict[str, list[dict[str, Any]]] = {}
    for (topic, group), table in sorted(offsets.table.items()):
        if (groups and group not in groups) or (topics and topic not in topics):
            continue
        rows = by_group.setdefault(group, [])
        for queue_id, offset in sorted(table.items()):
            rows.append(
                {"topic": topic, "queueId": queue_id, **_position(queues, topic, queue_id, offset)}
            )
    return {
        "file": offsets.loaded.source_name(queues.store.root),
        "groups": [
            {"group": group, "lag": sum(row["lag"] for row in rows), "queues": rows}
            for group, rows in by_group.items()
        ],
    }


def _position(queues: _Queues, topic: str, queue_id: int, offset: int) -> dict[str, Any]:
    """A consumer offset against its queue: bounds, lag, the store time of the last message
    consumed (0: none in the store) and the state."""
    bounds = queues.get(topic, queue_id)
    if bounds is None:
        return {
            "consumerOffset": offset,
            "minOffset": None,
            "maxOffset": None,
            "lag": 0,
            "lastConsumed": 0,
            "state": queues.missing(topic, queue_id),
        }
    return {
        "consumerOffset": offset,
        "minOffset": bounds.min_offset,
        "maxOffset": bounds.max_offset,
        "lag": queue_lag(offset, bounds.min_offset, bounds.max_offset),
        "lastConsumed": queues.store_time(bounds, offset - 1),
        "state": _state(offset, bounds),
    }


def _state(offset: int, bounds: QueueOffsets) -> str:
    if offset > bounds.max_offset:
        return PAST_END
    if offset < bounds.min_offset:
        return BEFORE_START
    return IN_RANGE


def _scheduler_rows(
    queues: _Queues, offsets: DelayOffsets, levels: DelayLevels | None
) -> dict[str, Any]:
    """A row per delay level that has a recorded offset or a ``SCHEDULE_TOPIC_XXXX`` queue: the
    scheduler's offset (0 when none is recorded, as the scheduler starts), the messages still
    waiting and when the next of them is due (its unit's tagsCode, the deliver time)."""
    levels = levels or DelayLevels()
    present = {
        queue_id + 1
        for topic, queue_id in list_queues(queues.store.consumequeue_dir)
        if topic == SCHEDULE_TOPIC
    }
    rows = []
    for level in sorted(present | set(offsets.table)):
        recorded = level in offsets.table
        offset = offsets.table.get(level, 0)
        bounds = queues.get(SCHEDULE_TOPIC, level - 1)
        row: dict[str, Any] = {
            "level": level,
            "delayMillis": levels.millis[level - 1] if level <= levels.max_level else None,
            "offset": offset,
            "recorded": recorded,
            "minOffset": None,
            "maxOffset": None,
            "pending": 0,
            "nextDue": 0,
            "state": queues.missing(SCHEDULE_TOPIC, level - 1),
        }
        if bounds is not None:
            row.update(
                minOffset=bounds.min_offset,
                maxOffset=bounds.max_offset,
                pending=queue_lag(offset, bounds.min_offset, bounds.max_offset),
                nextDue=queues.tags_code(bounds, max(offset, bounds.min_offset)) or 0,
                state=_state(offset, bounds),
            )
        rows.append(row)
    return {"file": offsets.loaded.source_name(queues.store.root), "levels": rows}


def _load_notes(store: Store, loaded: LoadedConfig, left_out: list[str]) -> list[str]:
    name = loaded.path.relative_to(store.root).as_posix()
    failed = loaded.failure_text(store.root)
    notes = [failed] if failed else []
    if left_out:
        shown = "; ".join(left_out[:3]) + ("; ..." if len(left_out) > 3 else "")
        notes.append(
            f"{name}: {counted(len(left_out), 'entry', 'entries')} left out, not offsets: {shown}"
        )
    return notes


@dataclass(frozen=True)
class OffsetPastEnd:
    """A consumer group's (or, with ``group`` None, the delay scheduler's) offset past the
    end of its queue."""

    group: str | None
    topic: str
    queue_id: int
    offset: int
    queue_end: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "topic": self.topic,
            "queueId": self.queue_id,
            "offset": self.offset,
            "queueEnd": self.queue_end,
        }

    def describe(self, when: str = "") -> str:
        """What it is and what to do, in one sentence (``when``: " once recovered", say)."""
        if self.group is None:
            # ScheduleMessageService.correctDelayOffset, in later 4.9 releases (4.9.8 has it,
            # 4.9.0 does not) and in 5.x, sets such an offset to the queue's max at load
            return (
                f"the delay scheduler's offset for level {self.queue_id + 1} is "
                f"{self.offset}, past the end {self.queue_end} of its queue "
                f"{self.topic}:{self.queue_id}{when}: a 4.9.8 or 5.x broker sets it back to "
                "the end as it loads config/delayOffset.json; an older one delivers nothing "
                "delayed there again below it until the file is set right with the broker "
                "stopped"
            )
        return (
            f"group {self.group}'s offset {self.offset} in {self.topic}:{self.queue_id} is past "
            f"the queue's end {self.queue_end}{when}: messages stored there again below it may "
            "never be consumed; reset it (mqadmin resetOffsetByTime) before producers write"
        )


def past_end(
    consumers: ConsumerOffsets,
    scheduler: DelayOffsets | None,
    end_of: Callable[[str, int], int | None],
) -> list[OffsetPastEnd]:
    """Every offset of ``consumers`` (and of ``scheduler``) past the end of its queue,
    ``end_of(topic, queue id)`` giving each queue's max offset (None: not one to check)."""
    found = []
    entries = [
        (group, topic, queue_id, offset)
        for (topic, group), table in sorted(consumers.table.items())
        for queue_id, offset in sorted(table.items())
    ]
    if scheduler is not None:
        entries += [
            (None, SCHEDULE_TOPIC, level - 1, offset)
            for level, offset in sorted(scheduler.table.items())
        ]
    for group, topic, queue_id, offset in entries:
        end = end_of(topic, queue_id)
        if end is not None and offset > end:
            found.append(OffsetPastEnd(group, topic, queue_id, offset, end))
    return found


def offsets_past_end(
    store: Store, queue_ends: dict[tuple[str, int], int] | None = None
) -> list[OffsetPastEnd]:
    """Every offset of ``consumerOffset.json`` and ``delayOffset.json`` past the end of its
    queue, each queue ending where ``queue_ends`` says (a recovery's cuts) or where it ends
    now. Reads only the config files and the queues' bounds."""
    ends = queue_ends or {}
    queues = _Queues(store)

    def end_of(topic: str, queue_id: int) -> int | None:
        end = ends.get((topic, queue_id))
        if end is None:
            bounds = queues.get(topic, queue_id)
            end = None if bounds is None else bounds.max_offset
        return end

    config_dir = store.root / CONFIG_DIR
    return past_end(read_consumer_offsets(config_dir), read_delay_offsets(config_dir), end_of)


def queue_lag(offset: int, min_offset: int, max_offset: int) -> int:
    """The messages a consumer at ``offset`` has still to consume in a queue of these
    bounds (those before its start are gone)."""
    return max(0, max_offset - max(offset, min_offset))
