"""``verify``: is a store sound, and exactly where is it not? Read-only.

One streaming pass over the commit log checks every record and, in step, the consume queues
and the index; then the checkpoint and ``abort`` are weighed against the data. Findings have a
kind (see :data:`KINDS`), a file, an offset and a message.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rmqstore.store import Store
from rmqstore.verify.checkpoint import check_checkpoint_and_abort
from rmqstore.verify.findings import ERROR, KINDS, NOTE, WARNING, Finding, VerifyReport
from rmqstore.verify.index import IndexChecks
from rmqstore.verify.queues import QueueChecks
from rmqstore.verify.records import RecordListener, RecordPass

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
    check_checkpoint_and_abort(store, report, facts, queues, index)
    return report
