"""Crash recovery as a broker's start-up does it (spec §10), offline: plan, then apply.

:func:`plan_recovery` only reads. It finds the valid end of the commit log with the broker's
rules (normal or abnormal by ``abort``, CRCs checked in the files recovery walks when
``checkCRCOnRecover``), and lists what the broker would cut: the bytes after the last valid
record, the commit-log files that start after it, each consume queue's units whose record starts
at or after it (``truncateDirtyLogicFiles``) and, after a crash, the index files newer than the
checkpoint's ``indexMsgTimestamp``.

:func:`apply_recovery` copies every byte it cuts into ``quarantine/`` before zeroing it, and
moves whole files there instead of deleting them. Then it dispatches the log from where the
consume queues and index now end to the valid end (the broker's re-dispatch), flushes, writes the
checkpoint, and the store's close removes ``abort``: the store is consistent and a broker starts
it with a normal recovery. Two deliberate differences from a broker: the cut bytes are zeroed (a
broker leaves them past its write position, so tools and a later crash would see them again),
and the index is rebuilt from where the kept index files end rather than from the recovery start
file, so no index entry is lost.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rmqstore.checkpoint import Checkpoint
from rmqstore.commitlog import LogEnd
from rmqstore.consumequeue import ConsumeQueue, list_queues
from rmqstore.consumerprogress import OffsetPastEnd, offsets_past_end
from rmqstore.dispatch import Dispatcher, DispatchResult
from rmqstore.errors import RebuildFirstError, RmqStoreError
from rmqstore.flush import FlushResult, flush_store
from rmqstore.indexfile import IndexFile, IndexHeader, read_index_headers
from rmqstore.quarantine import Quarantine
from rmqstore.segments import creating_name, is_creating_name, nonzero_extent, refuse_shared
from rmqstore.store import Store


@dataclass(frozen=True)
class ByteCut:
    """Bytes ``[start, end)`` of ``path`` to copy into quarantine, then zero."""

    path: Path
    start: int
    end: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"file": str(self.path), "start": self.start, "end": self.end, "why": self.reason}


@dataclass(frozen=True)
class FileMove:
    """A whole file to move into quarantine (what a broker deletes)."""

    path: Path
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"file": str(self.path), "why": self.reason}


@dataclass
class RecoveryPlan:
    abnormal: bool  # abort present: the last exit was a crash
    log_end: int
    stopped_by: str | None  # why the valid records end there (None: zeros or the last file)
    cuts: list[ByteCut] = field(default_factory=list)
    moves: list[FileMove] = field(default_factory=list)
    units_removed: int = 0
    queues_truncated: int = 0
    index_files_rebuilt: int = 0
    skipped: list[str] = field(default_factory=list)  # paths left alone, and why
    warnings: list[str] = field(default_factory=list)  # what recovery cannot mend
    # consumer groups' and the delay scheduler's offsets past their queue's end once the
    # queues are cut: recovery leaves them (a broker's does too), the operator resets them
    offsets_past_end: list[OffsetPastEnd] = field(default_factory=list)
    queue_ends: dict[tuple[str, int], int] = field(default_factory=dict)  # after the cuts

    @property
    def bytes_cut(self) -> int:
        return sum(cut.end - cut.start for cut in self.cuts)

    @property
    def has_work(self) -> bool:
        """Whether applying it would change anything beyond a dispatch catching up."""
        return bool(self.cuts or self.moves or self.abnormal)

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": "abnormal" if self.abnormal else "normal",
            "logEnd": self.log_end,
            "stoppedBy": self.stopped_by,
            "cuts": [cut.to_dict() for cut in self.cuts],
            "moves": [move.to_dict() for move in self.moves],
            "bytesCut": self.bytes_cut,
            "unitsRemoved": self.units_removed,
            "queuesTruncated": self.queues_truncated,
            "indexFilesRebuilt": self.index_files_rebuilt,
            "skipped": self.skipped,
            "warnings": self.warnings,
            "offsetsPastEnd": [offset.to_dict() for offset in self.offsets_past_end],
        }


@dataclass
class RecoveryResult:
    """What recovery did. ``abort`` goes when the store is closed, if the dispatch reached the
    valid end (check ``store.abort_path`` after closing)."""

    plan: RecoveryPlan
    quarantine: Path | None
    dispatch: DispatchResult
    flush: FlushResult

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan": self.plan.to_dict(),
            "quarantine": str(self.quarantine) if self.quarantine else None,
            "dispatch": self.dispatch.to_dict(),
            "checkpoint": self.flush.checkpoint_after.to_dict(),
        }


_AFTER_INVALID_UNIT = (
    "consume-queue file after an invalid unit that ends its queue: a broker deletes it as it "
    "loads the queue"
)
_EMPTY_LAST = "an empty file at the end of the queue of files (a kill between create and size)"


def plan_recovery(store: Store, progress: Callable[[int], None] | None = None) -> RecoveryPlan:
    """What recovery would do to ``store``; reads only."""
    end = store.log_end(progress)
    plan = RecoveryPlan(
        abnormal=store.aborted,
        log_end=end.offset,
        stopped_by=str(end.error) if end.error else None,
    )
    _plan_commitlog(store, end, plan)
    queue_folders = _plan_queues(store, end.offset, plan)
    if store.config.message_index_enable:
        index = store.index_service()  # index files of another geometry stop recovery here
        try:
            index.refuse_links(", then recover")  # and so do links among them
        finally:
            index.close()
        _plan_index(store, plan)
    _plan_leftovers(store, plan, queue_folders)
    _note_missing_files(store, plan)
    plan.offsets_past_end = offsets_past_end(store, plan.queue_ends)
    return plan


def _plan_leftovers(store: Store, plan: RecoveryPlan, queue_folders: list[Path]) -> None:
    """Files a killed writer left half made: a zero-length last commit-log file (skipped at
    load; a 5.x broker deletes it; the queues' own are planned with them) and files still
    under their temporary name. They hold nothing, but are moved to quarantine all the same."""
    if store.commitlog.queue.empty_last is not None:
        _move(store, plan, store.commitlog.queue.empty_last, _EMPTY_LAST)
    for folder in [store.commitlog_dir, store.index_dir, store.root, *queue_folders]:
        if not folder.is_dir():
            continue
        for entry in sorted(os.scandir(folder), key=lambda entry: entry.name):
            if is_creating_name(entry.name) and entry.is_file(follow_symlinks=False):
                _move(store, plan, Path(entry.path), "a file a killed writer was still making")


def _plan_commitlog(store: Store, end: LogEnd, plan: RecoveryPlan) -> None:
    log = store.commitlog
    for segment in log.segments:
        if segment.start > end.offset:
            _move(store, plan, segment.path, "commit-log file after the valid end")
        elif segment.start + log.file_size > end.offset:
            position = end.offset - segment.start
            extent = nonzero_extent(segment.path, position, log.file_size)
            if extent is not None:
                reason = plan.stopped_by or "bytes after the last valid record"
                _cut(store, plan, segment.path, position, extent[1], reason)


def _plan_queues(store: Store, end_offset: int, plan: RecoveryPlan) -> list[Path]:
    """Plan each queue's truncation (and the move of an empty last file); returns the queue
    folders inside the store."""
    folders = []
    linked: list[Path] = []
    queues = list_queues(store.consumequeue_dir, linked)
    for link in linked:  # a broker would recover through it; rmqstore follows no link
        plan.skipped.append(f"{link}: a symbolic link to queue files (not followed: not recovered)")
    for topic, queue_id in queues:
        directory = store.consumequeue_dir / topic / str(queue_id)
        if not store.inside(directory):
            plan.skipped.append(f"{directory}: leads out of the store")
            continue
        folders.append(directory)
        # strict: a file of the wrong size stops recovery here, before anything changed
        queue = ConsumeQueue(store.consumequeue_dir, topic, queue_id, store.consumequeue_file_size)
        queue.refuse_until_rebuilt(
            "its replay would put units where a broker puts none", ", then recover"
        )
        if queue.queue.empty_last is not None:
            _move(store, plan, queue.queue.empty_last, _EMPTY_LAST)
        for path in queue.files_after_end():
            _move(store, plan, path, _AFTER_INVALID_UNIT)
        truncation = queue.truncation_at(end_offset)
        reach = queue.reach_after(truncation)
        if reach > end_offset:  # the re-dispatch would refuse it, after the cuts
            raise RebuildFirstError(
                f"the consume queue of {topic}:{queue_id} would still reach past the log's "
                f"valid end after recovery ({reach:,} > {end_offset:,}): its last unit kept "
                "points at a record before the end but is longer than the log (no unit a "
                "broker writes: a damaged queue file); run rmqstore dispatch --rebuild --yes "
                "first, then recover (rmqstore verify shows the damaged units)"
            )
        if truncation is None:
            continue
        plan.queues_truncated += 1
        plan.units_removed += truncation.units_removed
        plan.queue_ends[(topic, queue_id)] = queue.max_offset - truncation.units_removed
        reason = f"units of {topic}/{queue_id} for records at or after {end_offset}"
        for path in truncation.dropped_files:
            _move(store, plan, path, reason)
        if truncation.cut_file is not None:
            start, stop = truncation.cut_position, truncation.cut_end
            _cut(store, plan, truncation.cut_file, start, stop, reason)
    return folders


def _plan_index(store: Store, plan: RecoveryPlan) -> None:
    """Index files to rebuild: after a crash those newer than indexMsgTimestamp, as a broker
    deletes them at load (§7.6); in any mode those holding entries for records that are cut
    (a broker leaves them, pointing at bytes the next appends overwrite). They form the tail
    of the index, which the re-dispatch rebuilds from where the files kept end. A kept file
    whose last record has keys in the first file rebuilt goes too, so no record is left with
    part of its keys."""
    limit = (store.checkpoint() or Checkpoint()).index_msg_timestamp
    files = read_index_headers(store.index_dir)
    first = len(files)
    for number, (_path, header) in enumerate(files):
        newer = plan.abnormal and header.end_timestamp > limit
        if newer or (header.index_count > 1 and header.end_phy_offset >= plan.log_end):
            first = number
            break
    while 0 < first < len(files) and _keys_span(store, files[first - 1], files[first]):
        first -= 1
    for path, _header in files[first:]:
        if _move(store, plan, path, "index tail, rebuilt from the commit log"):
            plan.index_files_rebuilt += 1


def _keys_span(
    store: Store, kept: tuple[Path, IndexHeader], rebuilt: tuple[Path, IndexHeader]
) -> bool:
    """Whether the first entry of ``rebuilt`` belongs to the last record of ``kept``."""
    if rebuilt[1].index_count <= 1 or kept[1].index_count <= 1:
        return False
    config = store.config
    index = IndexFile.open(rebuilt[0], config.index_slots, config.index_entries)
    try:
        return index.entry(1)[1] == kept[1].end_phy_offset
    finally:
        index.close()


def _note_missing_files(store: Store, plan: RecoveryPlan) -> None:
    log = store.commitlog
    for previous, following in zip(log.segments, log.segments[1:], strict=False):
        if previous.start + log.file_size != following.start:
            plan.warnings.append(
                f"commit-log files between {previous.start + log.file_size} and "
                f"{following.start} are missing; recovery cannot bring them back"
            )


def _move(store: Store, plan: RecoveryPlan, path: Path, reason: str) -> bool:
    if path.is_symlink() or not store.inside(path):
        plan.skipped.append(f"{path}: a link, left alone")
        return False
    plan.moves.append(FileMove(path, reason))
    return True


def _cut(store: Store, plan: RecoveryPlan, path: Path, start: int, end: int, reason: str) -> None:
    if path.is_symlink() or not store.inside(path):
        plan.skipped.append(f"{path}: a link, left alone")
        return
    refuse_shared(path)  # a cut there would cut another path's bytes too: refused before any
    plan.cuts.append(ByteCut(path, start, end, reason))


def apply_recovery(
    store: Store, plan: RecoveryPlan, progress: Callable[[int], None] | None = None
) -> RecoveryResult:
    """Carry out ``plan`` on ``store`` (opened for writing, the plan just made from it).
    Stopped by an error once it has begun changing the store, it leaves ``abort`` in place
    (a broker starting on the store runs its crash recovery), and what it raises says so."""
    kept: list[Quarantine] = []
    with store.until_done("recover", lambda: _where_cuts_are(kept)):
        return _recover(store, plan, kept, progress)


def _where_cuts_are(kept: list[Quarantine]) -> str:
    return f"; what it cut or moved so far is kept in {kept[0].directory}" if kept else ""


def _recover(
    store: Store,
    plan: RecoveryPlan,
    kept: list[Quarantine],
    progress: Callable[[int], None] | None,
) -> RecoveryResult:
    quarantine = None
    if plan.cuts or plan.moves:
        # made (with the checkpoint and abort as they were) before 'abort' is: a kill between
        # the two left an 'abort' no restore removed
        quarantine = Quarantine.create(store.root, "recover")
        kept.append(quarantine)
        store.begin_write_keeping_state(quarantine)
    else:
        store.begin_write()
    if quarantine is not None:
        for cut in plan.cuts:
            quarantine.cut_region(cut.path, cut.start, cut.end, cut.reason)
        try:
            for move in plan.moves:
                quarantine.move_path(move.path, move.reason, list_later=True)
        except BaseException:  # what was moved is listed if it can be (else found by path)
            with contextlib.suppress(RmqStoreError, OSError):
                quarantine.list_pending()
            raise
        quarantine.list_pending()
        # a queue file moved here (after a unit that is not valid, or past the valid end)
        # may be made again under its name by the replay: listed as made before it is, so
        # the restore sets it aside and puts the moved one back (it refused, its place taken)
        made_again = [
            path
            for move in plan.moves
            if move.path.is_relative_to(store.consumequeue_dir)
            and not is_creating_name(move.path.name)
            for path in (move.path.with_name(creating_name(move.path.name)), move.path)
        ]
        if made_again:
            quarantine.note_made(made_again, "consume-queue file the replay made again")
        store.reload_files()
    dispatcher = Dispatcher(store)
    try:
        if quarantine is not None and dispatcher.index is not None:
            # each index file listed as made (and the temporary name it is made under)
            # before it is made, so a restore of a recovery stopped at any point (a kill
            # too) sets aside the ones it made
            listing = quarantine
            dispatcher.index.on_create = lambda path: listing.note_made(
                [path.with_name(creating_name(path.name)), path], "index file rebuilt by recover"
            )
            last = dispatcher.index.last
            if (
                last is not None
                and not last.is_full
                and all(c.path != last.path for c in plan.cuts)
                and not dispatcher.index_reaches(plan.log_end)
            ):
                # the dispatch adds entries to it in place (an index behind the log of a
                # store without 'abort'): kept as it is, for a restore to give back
                quarantine.keep_copy(last.path, True, "the last index file")
        dispatched = dispatcher.run(progress=progress)  # after a crash: from its replay start
    finally:
        dispatcher.close()
    store.check_tail(store.log_end())  # zeros after the end now: close may remove abort
    # the crash's replay was just dispatched, into every queue of the store, which the
    # dispatcher loaded (their last units are read from them, not from a load again)
    flushed = flush_store(store, replayed=True, queues=dispatcher.queues.values())
    return RecoveryResult(plan, quarantine.directory if quarantine else None, dispatched, flushed)
