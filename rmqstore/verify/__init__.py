"""``verify``: is a store sound, and exactly where is it not? Read-only.

One streaming pass over the commit log checks every record and, in step, the consume queues
and the index; then the checkpoint and ``abort`` are weighed against the data. Findings have a
kind (see :data:`KINDS`), a file, an offset and a message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from rmqstore.checkpoint import read_checkpoint
from rmqstore.errors import StoreFormatError
from rmqstore.store import Store
from rmqstore.verify.findings import ERROR, KINDS, NOTE, WARNING, Finding, VerifyReport
from rmqstore.verify.index import IndexChecks
from rmqstore.verify.queues import QueueChecks
from rmqstore.verify.records import LogFacts, RecordListener, RecordPass

__all__ = [
    "ERROR",
    "KINDS",
    "NOTE",
    "WARNING",
    "Finding",
    "VerifyOptions",
    "VerifyReport",
    "verify_store",
]


@dataclass(frozen=True)
class VerifyOptions:
    check_crc: bool = True
    commitlog_only: bool = False
    topics: frozenset[str] | None = None  # limit consume-queue (and index) checks to these
    from_offset: int | None = None
    max_findings: int | None = 1000


def verify_store(
    store: Store,
    options: VerifyOptions = VerifyOptions(),
    progress: Callable[[int], None] | None = None,
) -> VerifyReport:
    """Check ``store`` (opened read-only) and return the report."""
    report = VerifyReport(max_findings=options.max_findings)
    listeners: list[RecordListener] = []
    queues = index = None
    if not options.commitlog_only:
        topics = set(options.topics) if options.topics else None
        queues = QueueChecks(store, report, topics)
        index = IndexChecks(store, report, topics)
        listeners = [queues, index]
    facts = RecordPass(
        store, report, check_crc=options.check_crc, listeners=listeners, progress=progress
    ).run(options.from_offset)
    _check_checkpoint(store, report, facts, queues, index)
    if store.abort_path.exists():
        report.add(
            "abort-present",
            "abort",
            None,
            "the store was not closed cleanly (a broker is running, crashed, or "
            "consume queues were left behind): a broker runs crash recovery at start",
            WARNING,
        )
    return report


def _check_checkpoint(
    store: Store,
    report: VerifyReport,
    facts: LogFacts,
    queues: QueueChecks | None,
    index: IndexChecks | None,
) -> None:
    """Checkpoint times may not be ahead of the data they vouch for (spec §8.1, §13)."""
    try:
        checkpoint = read_checkpoint(store.checkpoint_path)
    except StoreFormatError as exc:
        report.add("checkpoint-size", "checkpoint", None, str(exc))
        return
    if checkpoint is None:
        return
    limits: Iterable[tuple[str, int, int, str]] = [
        (
            "physicMsgTimestamp",
            checkpoint.physic_msg_timestamp,
            facts.last_store_timestamp,
            "the newest record of the commit log",
        )
    ]
    if queues is not None:
        limits = [
            *limits,
            (
                "logicsMsgTimestamp",
                checkpoint.logics_msg_timestamp,
                queues.last_queued_time,
                "the newest record in a consume queue",
            ),
        ]
    if index is not None:
        limits = [
            *limits,
            (
                "indexMsgTimestamp",
                checkpoint.index_msg_timestamp,
                index.last_full_end_timestamp,
                "the end of the last full index file",
            ),
        ]
    for name, value, limit, what in limits:
        if value > limit:
            report.add(
                "checkpoint-future",
                "checkpoint",
                None,
                f"{name} {value} is after the store time of {what} ({limit}): a broker's "
                "crash recovery would start too late and skip data",
            )
