"""``verify``: is a store sound, and exactly where is it not? Read-only.

One streaming pass over the commit log checks every record and, in step, the consume queues
and the index; then the checkpoint and ``abort`` are weighed against the data. Findings have a
kind (see :data:`KINDS`), a file, an offset and a message.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rmqstore.commitlog import CommitLog
from rmqstore.consumequeue import link_target
from rmqstore.errors import RebuildFirstError, RmqStoreError
from rmqstore.store import COMMITLOG_DIR, Store, misplaced_files
from rmqstore.verify.checkpoint import check_checkpoint_and_abort, read_store_state
from rmqstore.verify.config import check_config_files
from rmqstore.verify.findings import (
    ERROR,
    KINDS,
    NOTE,
    WARNING,
    Finding,
    VerifyReport,
    report_shared,
)
from rmqstore.verify.index import IndexChecks
from rmqstore.verify.queues import QueueChecks, readable_checks, replay_damage
from rmqstore.verify.records import LogFacts, RecordListener, RecordPass, relative

__all__ = [
    "CROSS_CHECKS",
    "ERROR",
    "KINDS",
    "NOTE",
    "WARNING",
    "Finding",
    "VerifyOptions",
    "VerifyReport",
    "note_changed",
    "verify_store",
    "weigh_rebuild",
    "weigh_recover",
    "write_marks",
]


CROSS_CHECKS = frozenset({"queues", "index"})  # what is checked against the commit log


@dataclass(frozen=True)
class VerifyOptions:
    check_crc: bool = True
    commitlog_only: bool = False
    topics: frozenset[str] | None = None  # limit consume-queue (and index) checks to these
    from_offset: int | None = None
    max_findings: int | None = 1000
    checks: frozenset[str] = CROSS_CHECKS  # "queues", "index": the commit log is always checked

    @property
    def cross_checks(self) -> frozenset[str]:
        """The files checked against the commit log (none with ``commitlog_only``)."""
        return frozenset() if self.commitlog_only else self.checks & CROSS_CHECKS


def check_layout(store: Store, report: VerifyReport) -> None:
    """Files where store folders should be, and a commit log that is not where rmqstore reads
    it (no commit-log folder, a DLedger log): every unit would point past its end, and no
    command mends that (``store-layout`` stops the next step)."""
    for name, message in misplaced_files(store.root):
        report.add("store-layout", message, file=name)
    if store.foreign_log is not None:
        report.add("store-layout", store.foreign_log, file=COMMITLOG_DIR)
    if store.config.duplication_enable:
        report.add(
            "store-dup-info",
            "the broker config says duplicationEnable=true: a 5.x broker's recovery then ends "
            "the log at a record without a DUP_INFO property of two parts, which this verify "
            "does not check; rmqstore's writers (recover, dispatch, flush, append) leave the "
            "store to the broker",
            NOTE,
        )
    for link in store.links_out():
        report.add(
            "store-link",
            f"{link} is a symbolic link leading out of the store (to {link_target(link)}): a "
            "broker reads and writes through it, and rmqstore reads through it, but its "
            "writers (recover, dispatch, flush, append) refuse the store: put the real file "
            "or folder there",
            WARNING,
            file=relative(store, link),
        )


def check_shared(store: Store, report: VerifyReport) -> None:
    """Store files a writer writes in place that have other hard links (a copy made with
    ``cp -al``): writing them would change another path's bytes, so the writers refuse.
    The commit log's, the index's and the checkpoint; the consume queues' are reported as
    each queue is loaded (:class:`QueueChecks`: a store of 100,000 LMQ queues took 3 s to
    list them all once more, a fifth of its verify)."""
    for path, links in store.shared_files():
        report_shared(report, path, links, relative(store, path))


def settle_live_end(store: Store) -> None:
    """Of a store another process holds (a broker writing it), once its queues and index
    are loaded: where its log's data ends now (:meth:`CommitLog.live_end`, of the files
    there now), which the checks stop at; what a running broker writes after is not looked
    at."""
    if store.held_elsewhere and store.live_end is None:
        log = CommitLog(store.commitlog_dir, store.commitlog_file_size, strict=False)
        try:
            store.live_end = log.live_end()
        finally:
            log.close()


def note_live(store: Store, report: VerifyReport, facts: LogFacts) -> None:
    """Say, for a store being written, how far it was checked."""
    if store.live_end is None:
        return
    report.add(
        "store-live",
        "the store's lock is held by a running process (a broker?): it was checked as it "
        f"stood when verify began, up to offset {facts.end_offset:,}; what was written after "
        "is not checked, and what a running broker has by design ('abort', records not "
        "dispatched or indexed yet) is a note, not a problem",
        NOTE,
        commit_log_offset=facts.end_offset,
    )


def write_marks(store: Store) -> tuple | None:
    """What a writer of ``store`` would change (:meth:`Store.write_marks`), taken as a check
    begins; None for a store another process held as it was opened (a live store, checked
    up to where its log ended then: :func:`note_live`)."""
    return None if store.written_elsewhere else store.write_marks()


def note_changed(store: Store, report: VerifyReport, marks: tuple | None) -> None:
    """Say so when another process wrote the store while it was checked (its lock free when
    the check began: a broker starting on it, an append or dispatch run beside): a record
    half written then reads as a torn tail, units and index entries as missing, and no
    command is named until a verify of the store at rest (:attr:`VerifyReport.unsettled`)."""
    if marks is None or store.write_marks() == marks:
        return
    report.add(
        "store-changed",
        "another process took the store's lock or wrote the store while verify read it (the lock "
        "was free when verify began: a broker starting, an append or dispatch running beside): "
        "what was found may be a write half done; verify again once the store is at rest",
        WARNING,
    )


def weigh_rebuild(store: Store, report: VerifyReport, index: IndexChecks | None) -> None:
    """When something only ``dispatch --rebuild`` mends was found, look for damage a
    replay of the whole log stops at before its valid end (in a file a broker's recovery
    does not walk; the index checks may have looked for it already): the rebuild refuses
    such a log, so those findings are left to the operator (the damage's own finding says
    why) instead of naming a rebuild as the next step."""
    if not report.needs_rebuild():
        return
    try:
        damage = (
            index.damage_a_rebuild_stops_at()
            if index is not None
            else replay_damage(store, store.commitlog.min_offset)
        )
    except (RmqStoreError, OSError):
        return  # a log that does not open: its own findings say so
    if damage is not None:
        report.rebuild_refused_at = damage.offset


def weigh_recover(store: Store, report: VerifyReport) -> None:
    """When recover would be the next step, ask its plan (it reads only) whether it takes
    the store: a plan that refuses it (a queue file a rebuild must replace first, say) would
    make recover the next step again and again, so its refusal is kept
    (``recover_refused``) and the rebuild it asks for, or no command, is named instead."""
    if store.held_elsewhere or not report.recover_is_next():
        return
    from rmqstore.recovery import plan_recovery  # (recover's planning: only when asked)

    try:
        plan_recovery(store)
    except RmqStoreError as refusal:
        report.recover_refused = str(refusal)
        report.rebuild_before_recover = isinstance(refusal, RebuildFirstError)
    except OSError:
        return  # a file that does not read: its own findings say so


def verify_store(
    store: Store,
    options: VerifyOptions = VerifyOptions(),
    progress: Callable[[int], None] | None = None,
) -> VerifyReport:
    """Check ``store`` (opened read-only) and return the report."""
    report = VerifyReport(max_findings=options.max_findings)
    marks = write_marks(store)
    check_layout(store, report)
    check_shared(store, report)
    state = read_store_state(store)  # before the data it vouches for
    queues = index = None
    topics = set(options.topics) if options.topics else None
    checks = readable_checks(store, report, options.cross_checks)
    if "queues" in checks:
        queues = QueueChecks(store, report, topics)
    if "index" in checks:
        index = IndexChecks(store, report, topics)
    listeners: list[RecordListener] = [c for c in (queues, index) if c is not None]
    settle_live_end(store)
    facts = RecordPass(
        store, report, check_crc=options.check_crc, listeners=listeners, progress=progress
    ).run(options.from_offset)
    note_live(store, report, facts)
    check_checkpoint_and_abort(store, report, facts, queues, index, state, options.from_offset)
    check_config_files(store, report, queues)
    note_changed(store, report, marks)
    weigh_rebuild(store, report, index)
    weigh_recover(store, report)
    return report
