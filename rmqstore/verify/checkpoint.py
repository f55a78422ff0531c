"""The last checks of ``verify``: checkpoint times against the data they vouch for, and
``abort`` (spec §8.1, §13)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rmqstore.checkpoint import CHECKPOINT_FILE_SIZE, CheckpointFile, read_checkpoint_file
from rmqstore.consumequeue import ConsumeQueue
from rmqstore.errors import RmqStoreError, StoreFormatError, StoreIOError
from rmqstore.store import Store, normal_recovery_cut_text
from rmqstore.topics import is_path_safe
from rmqstore.verify.findings import NOTE, WARNING, VerifyReport
from rmqstore.verify.index import IndexChecks
from rmqstore.verify.queues import QueueChecks
from rmqstore.verify.records import LogFacts


@dataclass(frozen=True)
class StoreState:
    """The checkpoint and ``abort`` as verify found them before reading the data: a broker
    writing the store updates the checkpoint after the data it vouches for, so read first
    it vouches only for data read after it."""

    checkpoint: CheckpointFile | None  # None: no checkpoint file
    checkpoint_error: str | None  # not a checkpoint a broker leaves (checkpoint-size)
    aborted: bool


def read_store_state(store: Store) -> StoreState:
    """Read the checkpoint and look for ``abort`` (before the queues, index and log)."""
    try:
        found = read_checkpoint_file(store.checkpoint_path)
    except StoreFormatError as exc:
        return StoreState(None, str(exc), store.aborted)
    return StoreState(found, None, store.aborted)


def check_checkpoint_and_abort(
    store: Store,
    report: VerifyReport,
    facts: LogFacts,
    queues: QueueChecks | None,
    index: IndexChecks | None,
    state: StoreState,
    from_offset: int | None = None,
) -> None:
    _check_checkpoint(store, report, facts, queues, index, state, from_offset)
    if state.aborted and store.written_elsewhere:
        report.add(
            "abort-present",
            "the store's lock is held by a running process (a broker?), which keeps 'abort' "
            "while it runs",
            NOTE,
            file="abort",
        )
    elif state.aborted:
        cut = _normal_recovery_cut(store)
        kept = (
            ""
            if cut is None
            else f"; recover and dispatch keep it: {normal_recovery_cut_text(*cut)}, which "
            "its crash recovery keeps"
        )
        report.add(
            "abort-present",
            "the store was not closed cleanly (a broker is running, crashed, or "
            "consume queues were left behind): a broker runs crash recovery at start" + kept,
            WARNING,
            file="abort",
            report_only=cut is not None,
        )


def _normal_recovery_cut(store: Store) -> tuple[int, str] | None:
    try:
        return store.normal_recovery_cut()
    except (RmqStoreError, OSError):
        return None  # the record checks report what stops the walk


def _check_checkpoint(
    store: Store,
    report: VerifyReport,
    facts: LogFacts,
    queues: QueueChecks | None,
    index: IndexChecks | None,
    state: StoreState,
    from_offset: int | None = None,
) -> None:
    """Checkpoint times may not be ahead of the data they vouch for (spec §8.1, §13). A walk
    from ``from_offset`` saw the log's newest records (the rest are older) only if it saw
    records, and the newest queued one only if it saw one queued: else there is nothing to
    compare a time with."""
    if state.checkpoint_error is not None:
        report.add("checkpoint-size", state.checkpoint_error, file="checkpoint")
        return
    found = state.checkpoint
    if found is None:
        return
    if found.short:
        report.add(
            "checkpoint-short",
            f"{store.checkpoint_path} is {found.size} bytes, not {CHECKPOINT_FILE_SIZE} (cut "
            "short by a crash): a broker reads the missing bytes as zeros, so its times are "
            "no later than those written",
            file="checkpoint",
        )
    checkpoint = found.checkpoint
    part_walked = from_offset is not None and from_offset > store.commitlog.min_offset
    # (field, its byte position in the checkpoint file, value, limit, what the limit is)
    limits: Iterable[tuple[str, int, int, int, str]] = []
    if facts.records or not part_walked:
        limits = [
            (
                "physicMsgTimestamp",
                0,
                checkpoint.physic_msg_timestamp,
                facts.last_store_timestamp,
                "the newest record of the commit log",
            )
        ]
    # logicsMsgTimestamp vouches for every consume queue: checked against the newest record
    # of all of them, so not when --topic (or BatchCQ topics, or queue folders that are
    # links, which are not read) left queues out (the newest of those checked is older, and
    # a sound store would be reported as ahead)
    if (
        queues is not None
        and queues.topics is None
        and not queues.excluded
        and not queues.linked_topics
        and not queues.linked_queues
        and (queues.last_queued_time or not part_walked)
    ):
        limits = [
            *limits,
            (
                "logicsMsgTimestamp",
                8,
                checkpoint.logics_msg_timestamp,
                max(queues.last_queued_time, _gapped_queues_newest(store, report, facts)),
                "the newest record in a consume queue",
            ),
        ]
    if index is not None and not index.unchecked:
        limits = [
            *limits,
            (
                "indexMsgTimestamp",
                16,
                checkpoint.index_msg_timestamp,
                index.last_full_end_timestamp,
                "the end of the last full index file",
            ),
        ]
    for name, position, value, limit, what in limits:
        if value > limit:
            report.add(
                "checkpoint-future",
                f"{name} {value} is after the store time of {what} ({limit}): a broker's "
                "crash recovery would start too late and skip data",
                file="checkpoint",
                file_position=position,
            )


def _gapped_queues_newest(store: Store, report: VerifyReport, facts: LogFacts) -> int:
    """The store time of the newest record that the last unit of a queue with a
    queue-offset gap points at. Such a queue's units after the gap sit where a broker appended
    them, not at their records' queue offsets, so the queue checks match none of them; the
    queue holds those records all the same, and flush vouches for them."""
    newest = 0
    gapped = {
        (finding.topic, finding.queue_id)
        for finding in report.findings
        if finding.kind == "queue-offset-gap"
    }
    for topic, queue_id in sorted(gapped, key=str):
        if topic is None or queue_id is None or not is_path_safe(topic):
            continue
        if not store.inside(store.consumequeue_dir / topic / str(queue_id)):
            continue
        try:
            queue = ConsumeQueue(
                store.consumequeue_dir, topic, queue_id, store.consumequeue_file_size
            )
            unit = queue.last_unit_in_log(facts.end_offset)
        except (StoreFormatError, StoreIOError, OSError, IndexError):
            continue  # the queue checks report what is wrong with its files
        if unit is not None:
            stamp = store.commitlog.store_timestamp_at(
                unit.physical_offset, unit.size, facts.end_offset
            )
            newest = max(newest, stamp)
    return newest
