"""Findings and the report ``rmqstore verify`` prints (and exits 1 on)."""

from __future__ import annotations

import shlex
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ERROR = "error"
WARNING = "warning"
NOTE = "note"  # worth knowing, not a problem (does not fail verify)

# every finding kind, with what it means (documented in rmqstore-verify(1))
KINDS = {
    "file-size": "a store file's size differs from the configured size",
    "file-name": "a file whose name a broker cannot parse, or an unexpected file",
    "file-half-made": "a file a killed rmqstore writer was still making, under its temporary "
    "name (.NAME.creating): it holds nothing a broker reads",
    "store-layout": "a file where a store folder should be, an abort that is not a file, or "
    "a commit log not where rmqstore reads it (no commitlog/ folder, a DLedger log)",
    "store-link": "a store file or folder a writer writes through (a commit-log file, a store "
    "folder, checkpoint, abort) that is a symbolic link leading out of the store: a broker "
    "writes through it, rmqstore's writers refuse the store",
    "store-shared": "a store file a writer writes in place (a commit-log, index or "
    "consume-queue file, checkpoint) that has other hard links: another path holds the same "
    "bytes, rmqstore's writers refuse to change them",
    "file-gap": "commit-log files are not contiguous",
    "file-incomplete": "a commit-log file ends without a BLANK record but later files hold data",
    "data-after-end": "a commit-log file after the end of the log holds data",
    "record-invalid": "bytes that are not a valid record (magic, length, topic length, ...), "
    "or a record a broker finds invalid (a SCHEDULE_TOPIC_XXXX record whose DELAY is not a "
    "number)",
    "record-physical-offset": "a record's stored PHYSICALOFFSET differs from its position",
    "record-body-crc": "a record's BODYCRC does not match its body",
    "record-property-crc": "a record's 5.x __CRC32# property does not match the record",
    "record-properties": "a record's properties are not valid UTF-8",
    "blank-size": "a BLANK record does not reach the end of its file",
    "store-time-order": "store timestamps decrease along the log",
    "queue-offset-gap": "a queue's offsets in the commit log are not dense",
    "record-queue-offset": "a record's QUEUEOFFSET no consume-queue position can hold",
    "queue-name-unsafe": "records of a topic (or of a further queue INNER_MULTI_DISPATCH "
    "names) that cannot name a consume-queue folder: no unit is written for them",
    "dispatch-stop": "a record whose INNER_MULTI_QUEUE_OFFSET holds a piece a broker's "
    "Long.parseLong refuses: the broker's dispatch stops at it for ever, and a crash recovery "
    "through it fails its start-up",
    "torn-tail": "non-zero bytes after the valid end of the log of a store not closed cleanly",
    "stale-bytes-after-end": "non-zero bytes after the valid end (left by a broker's recovery)",
    "cq-file-size": "a consume-queue file has the wrong size",
    "cq-file-gap": "consume-queue files are not contiguous",
    "cq-unit": "a consume-queue unit does not match the record it should point at",
    "cq-unit-orphan": "a consume-queue unit with no record of its queue at that queue offset",
    "cq-beyond-log": "consume-queue units point past the end of the commit log",
    "cq-pre-blank": "pre-blank units after the start of a queue",
    "cq-layout": "a file where a consume-queue folder must be, or a folder for a queue file",
    "dispatch-lag": "records in the commit log missing from their consume queue",
    "dispatch-hole": "records missing from their consume queue before where a dispatch resumes",
    "index-file-size": "an index file's size does not match the slot and entry counts",
    "index-unchecked": "the index was not checked: its hash-slot and entry counts are unknown",
    "index-header": "an index file's header disagrees with its entries",
    "index-chain": "an index hash chain that leaves the file or does not terminate",
    "index-entry": "an index entry that does not match the keys of its record",
    "index-again": "an index file whose entries begin before the files before it end: records "
    "indexed again, as a broker's crash recovery does when a power cut left its last index "
    "file's header unwritten (a note)",
    "index-lag": "records whose keys are missing from the index",
    "index-hole": "records inside the indexed range whose keys have no entries (before where "
    "a dispatch resumes)",
    "checkpoint-future": "a checkpoint time ahead of the data it vouches for",
    "checkpoint-short": "the checkpoint file is shorter than 4096 bytes (a crash cut it short)",
    "checkpoint-size": "the checkpoint is longer than 4096 bytes, or not a regular file",
    "abort-present": "the store was not closed cleanly (a broker was running or crashed)",
    "topic-unlisted": "a topic (or queue) with units that config/topics.json leaves out",
    "offset-past-end": "a consumer group's or the delay scheduler's offset past its queue's end",
    "config-unreadable": "config/topics.json, consumerOffset.json or delayOffset.json does not "
    "load (nor its .bak)",
    "queues-rocksdb": "consumequeue/ holds a RocksDB database: consume queues not checked",
    "queues-batchcq": "BatchCQ topics keep their queues in batchconsumequeue/: not checked",
    "store-dup-info": "the broker config says duplicationEnable=true (5.x): its recovery ends "
    "the log at a record without DUP_INFO, which rmqstore does not check; its writers leave "
    "such a store to the broker (a note)",
    "queue-link": "a topic's or queue's folder in consumequeue/ that is a symbolic link: a "
    "broker reads and writes through it, rmqstore does not (not checked, nor written)",
    "file-link": "a consume-queue or index file that is a symbolic link: a broker reads and "
    "writes through it; rmqstore reads through it, its writers refuse the store until a rebuild",
    "queue-type": "a topic's queue folders where its queue type (BatchCQ or not) does not keep "
    "them: a 5.x broker does not start",
    "store-live": "the store's lock is held (a broker writing it): checked as it stood when "
    "verify began; what was written after is not checked",
    "store-changed": "another process took the store's lock or wrote the store while verify "
    "read it (the lock was free when verify began): what was found may be a write half done; "
    "verify again once the store is at rest",
}

# why records a broker running on the store has not dispatched yet are no problem
LIVE_DISPATCH = "the broker writing the store dispatches records as it goes"

REPORT_ONLY = "none: report only"
_RECOVER = "rmqstore recover {store} --yes"
_REBUILD = "rmqstore dispatch {store} --rebuild --yes"
_DISPATCH = "rmqstore dispatch {store}"
_FLUSH = "rmqstore flush {store}"

# the command that mends each kind ({store}: the store), or REPORT_ONLY; in the order a
# store is best mended in (the log first, then what is built from it, then the checkpoint)
FIXES = {
    "torn-tail": _RECOVER,
    "abort-present": _RECOVER,
    "record-invalid": _RECOVER,
    "record-physical-offset": _RECOVER,
    "record-body-crc": _RECOVER,
    "record-property-crc": _RECOVER,
    "blank-size": REPORT_ONLY,  # a broker's walk goes on to the next file whatever it says
    "file-incomplete": _RECOVER,
    "data-after-end": _RECOVER,
    "file-half-made": _RECOVER,
    "cq-file-size": _REBUILD,
    "cq-file-gap": _REBUILD,
    "cq-unit": _REBUILD,
    "cq-unit-orphan": _REBUILD,
    "cq-beyond-log": _REBUILD,
    "cq-pre-blank": _REBUILD,
    "cq-layout": _REBUILD,
    "index-file-size": _REBUILD,
    "index-header": _REBUILD,
    "index-chain": _REBUILD,
    "index-entry": _REBUILD,
    "index-again": REPORT_ONLY,
    "dispatch-hole": _REBUILD,
    "dispatch-lag": _DISPATCH,
    "index-lag": _DISPATCH,
    "index-hole": _REBUILD,
    "checkpoint-future": _FLUSH,
    "checkpoint-short": _FLUSH,
    "file-size": REPORT_ONLY,
    "file-name": REPORT_ONLY,
    "store-layout": REPORT_ONLY,
    "store-link": REPORT_ONLY,
    "store-shared": REPORT_ONLY,
    "file-gap": REPORT_ONLY,
    "record-properties": REPORT_ONLY,
    "store-time-order": REPORT_ONLY,
    "queue-offset-gap": REPORT_ONLY,
    "record-queue-offset": REPORT_ONLY,
    "queue-name-unsafe": REPORT_ONLY,
    "dispatch-stop": REPORT_ONLY,  # the record is as its producer and broker made it
    "stale-bytes-after-end": REPORT_ONLY,
    "index-unchecked": REPORT_ONLY,
    "checkpoint-size": REPORT_ONLY,
    "topic-unlisted": REPORT_ONLY,
    "offset-past-end": REPORT_ONLY,
    "config-unreadable": REPORT_ONLY,
    "queues-rocksdb": REPORT_ONLY,
    "store-dup-info": REPORT_ONLY,
    "queues-batchcq": REPORT_ONLY,
    "queue-type": REPORT_ONLY,
    "queue-link": _REBUILD,
    "file-link": _REBUILD,
    "store-live": REPORT_ONLY,
    "store-changed": REPORT_ONLY,
}
assert set(FIXES) == set(KINDS)


# found, these leave nothing a command can mend (the log has a hole, files of another store,
# or a file where a folder should be)
_BLOCKING = frozenset({"file-gap", "file-size", "store-layout"})
# found, the report may show a write half done: no command is named until verify runs again
_UNSETTLED = "store-changed"
# files of the wrong size, what is not a file where a queue file or folder must be, and queue
# files that are links, which make recover (and dispatch) refuse the store and which a
# rebuild replaces: a rebuild comes first then
_REBUILD_FIRST = frozenset({"cq-file-size", "index-file-size", "cq-layout", "file-link"})
# consume-queue findings that follow from a gap in a queue's offsets in the log itself
_GAP_FOLLOWERS = frozenset({"cq-unit", "cq-unit-orphan", "dispatch-hole"})
# found, rmqstore's writers refuse the store until the operator puts these right by hand:
# what to do, in words (the findings' messages say it of each)
_MENDED_BY_HAND = {
    "store-link": "put the real file or folder where each store-link finding names a link",
    "store-shared": "give each file a store-shared finding names a copy of its own (cp -a "
    "the store, or cp each file and mv the copy over it)",
    "checkpoint-size": "move the checkpoint aside (rmqstore flush then writes a new one)",
}
# noted, these leave nothing for rmqstore to mend: its writers refuse a store whose consume
# queues are a RocksDB database, or with BatchCQ topics (its broker recovers it at start-up),
# and one with what must be mended by hand first
_WRITERS_REFUSED = ("queues-rocksdb", "queues-batchcq", "store-dup-info", *_MENDED_BY_HAND)


def report_shared(report: VerifyReport, path: Path, links: int, name: str) -> None:
    """A ``store-shared`` finding: ``path`` (named ``name``) has ``links`` hard links."""
    report.add(
        "store-shared",
        f"{path} has {links} hard links: another path holds the same bytes, which a "
        "broker would write through, and rmqstore's writers (recover, dispatch, flush, "
        "append) refuse to change: give the file a copy of its own",
        WARNING,
        file=name,
    )


def fix_for(kind: str, store: str) -> str:
    """The command that mends a finding of ``kind`` in ``store``, or REPORT_ONLY."""
    template = FIXES[kind]
    return template if template == REPORT_ONLY else template.format(store=shlex.quote(store))


@dataclass(frozen=True, slots=True)
class Finding:
    """One finding and where it is. Each position field means one thing in every kind:
    ``file`` is the store-relative file (or directory) the finding is about,
    ``file_position`` a byte position inside that file, ``commit_log_offset`` a commit-log
    physical offset (a record's start, or where the log stops being valid), and
    ``topic``/``queue_id``/``queue_offset`` a consume-queue unit or queue. Unknown or not
    applicable is None."""

    kind: str
    message: str
    severity: str = ERROR
    file: str | None = None
    file_position: int | None = None
    commit_log_offset: int | None = None
    topic: str | None = None
    queue_id: int | None = None
    queue_offset: int | None = None
    # no command mends this one, whatever mends its kind elsewhere (damage in a commit-log
    # file a broker's recovery, and so rmqstore recover, does not walk)
    report_only: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "severity": self.severity,
            "file": self.file,
            "filePosition": self.file_position,
            "commitLogOffset": self.commit_log_offset,
            "topic": self.topic,
            "queueId": self.queue_id,
            "queueOffset": self.queue_offset,
            "message": self.message,
        }

    def where(self) -> str:
        """The position fields in one short line, for human output."""
        return where_text(self.to_dict())


def where_text(document: dict[str, Any]) -> str:
    """The position fields (camelCase, as in a finding's JSON) of ``document`` in one short
    line: ``file@filePosition``, ``log commitLogOffset``, ``topic:queueId#queueOffset``."""
    parts = []
    if document.get("file") is not None:
        at = document.get("filePosition")
        parts.append(document["file"] + ("" if at is None else f"@{at}"))
    if document.get("commitLogOffset") is not None:
        parts.append(f"log {document['commitLogOffset']}")
    if document.get("topic") is not None:
        queue = document["topic"]
        if document.get("queueId") is not None:
            queue += f":{document['queueId']}"
        if document.get("queueOffset") is not None:
            queue += f"#{document['queueOffset']}"
        parts.append(queue)
    return " ".join(parts)


@dataclass
class VerifyReport:
    """Findings (up to ``max_findings`` kept; all counted) and what was checked."""

    max_findings: int | None = 1000
    findings: list[Finding] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)  # by kind, all severities
    problems: int = 0  # errors and warnings, counted beyond max_findings too
    checked: Counter = field(default_factory=Counter)
    # where the damage is that makes dispatch --rebuild refuse the log (a replay of it stops
    # there before its valid end), when there are findings only a rebuild mends: then no
    # command mends them (see :func:`rmqstore.verify.weigh_rebuild`)
    rebuild_refused_at: int | None = None
    # why recover's plan refuses the store, when recover would be the next step (see
    # :func:`rmqstore.verify.weigh_recover`): then it is not named, but the rebuild is when
    # the refusal asks for it first (``rebuild_before_recover``)
    recover_refused: str | None = None
    rebuild_before_recover: bool = False

    def add(
        self,
        kind: str,
        message: str,
        severity: str = ERROR,
        *,
        file: str | None = None,
        file_position: int | None = None,
        commit_log_offset: int | None = None,
        topic: str | None = None,
        queue_id: int | None = None,
        queue_offset: int | None = None,
        report_only: bool = False,
    ) -> None:
        """Count a finding and keep it (up to ``max_findings``); see :class:`Finding`."""
        assert kind in KINDS, kind
        self.counts[kind] += 1
        if severity != NOTE:
            self.problems += 1
        if self.max_findings is None or len(self.findings) < self.max_findings:
            self.findings.append(
                Finding(
                    kind,
                    message,
                    severity,
                    file,
                    file_position,
                    commit_log_offset,
                    topic,
                    queue_id,
                    queue_offset,
                    report_only,
                )
            )

    def keeps(self) -> bool:
        """Whether :meth:`add` would keep a finding now (not only count it)."""
        return self.max_findings is None or len(self.findings) < self.max_findings

    def count(self, kind: str, severity: str = ERROR) -> None:
        """Count a finding :meth:`add` would not keep (the report is full), without
        building its message."""
        assert kind in KINDS, kind
        self.counts[kind] += 1
        if severity != NOTE:
            self.problems += 1

    def absorb(self, other: VerifyReport) -> None:
        """Add the findings and counts of a report made over another part of the store."""
        room = None if self.max_findings is None else self.max_findings - len(self.findings)
        self.findings.extend(other.findings if room is None else other.findings[: max(room, 0)])
        self.counts.update(other.counts)
        self.problems += other.problems
        self.checked.update(other.checked)

    def _sizes_disagree(self) -> bool:
        """Whether every consume queue checked has a file of the wrong size (more than one
        queue): more likely the sizes given are not the broker's than all those files
        damaged, and a rebuild would write every queue again in the sizes given."""
        queues = {(f.topic, f.queue_id) for f in self.findings if f.kind == "cq-file-size"}
        return len(queues) > 1 and len(queues) >= self.checked["consumeQueues"]

    def needs_rebuild(self) -> bool:
        """Whether a finding that only ``dispatch --rebuild`` mends is here, and mendable
        otherwise."""
        mendable = self._mendable()
        return any(
            f.severity != NOTE and FIXES[f.kind] == _REBUILD and mendable(f) for f in self.findings
        )

    def _mendable(self) -> Callable[[Finding], bool]:
        """Whether a command mends a finding: not one found so (damage no recovery cuts),
        nor one only a rebuild mends when the rebuild refuses the log, nor a consume-queue
        finding of a queue whose records' queue offsets have a gap in
        the log itself (a record lost its QUEUEOFFSET, or its topic, to damage): a rebuild
        appends the units after the gap at the end of the queue, as a broker does, so no
        rebuild makes that queue's units match their records (it would shift the units a
        broker wrote in place)."""
        gapped = {(f.topic, f.queue_id) for f in self.findings if f.kind == "queue-offset-gap"}
        refused = self.rebuild_refused_at is not None
        sizes_disagree = self._sizes_disagree()

        def mendable(finding: Finding) -> bool:
            if finding.report_only or (refused and FIXES[finding.kind] == _REBUILD):
                return False
            if sizes_disagree and finding.kind == "cq-file-size":
                return False
            return finding.kind not in _GAP_FOLLOWERS or (
                (finding.topic, finding.queue_id) not in gapped
            )

        return mendable

    @property
    def writers_refused(self) -> bool:
        """Whether rmqstore's writers refuse the store (no command of it mends anything)."""
        return any(self.counts[kind] for kind in _WRITERS_REFUSED)

    @property
    def unsettled(self) -> bool:
        """Whether the store changed while it was checked: nothing found is mended by a
        command until a verify of the store at rest finds it again."""
        return self.counts[_UNSETTLED] > 0

    @property
    def by_hand(self) -> str | None:
        """What the operator must put right by hand before rmqstore's writers take the store
        (None when nothing), in words."""
        steps = [step for kind, step in _MENDED_BY_HAND.items() if self.counts[kind]]
        return "; ".join(steps) or None

    @property
    def ok(self) -> bool:
        return self.problems == 0

    def next_step(self, store: str) -> str | None:
        """The first command to run to mend what was found (errors and warnings), in the
        order of :data:`FIXES`; None when nothing found can be mended by a command. Not
        recover when its plan refuses the store (:attr:`recover_refused`): then the rebuild
        the refusal asks for first, or none."""
        template = self._next_template()
        if template == _RECOVER and self.recover_refused is not None:
            rebuild = self.rebuild_before_recover and self.rebuild_refused_at is None
            template = _REBUILD if rebuild else None
        return None if template is None else template.format(store=shlex.quote(store))

    def recover_is_next(self) -> bool:
        """Whether the findings make recover the next step (before its plan is asked)."""
        return self._next_template() == _RECOVER

    def _next_template(self) -> str | None:
        found = {f.kind for f in self.findings if f.severity != NOTE}
        if found & _BLOCKING or self.writers_refused or self.unsettled:
            return None  # a missing or foreign file, or a moving store: no command mends it
        mendable = self._mendable()
        wrong_sizes = {f.kind for f in self.findings if f.severity != NOTE} & _REBUILD_FIRST
        found = {f.kind for f in self.findings if f.severity != NOTE and mendable(f)}
        if wrong_sizes:  # recover refuses the store until a rebuild replaces those files
            rebuild = wrong_sizes & found
            return FIXES[min(rebuild)] if rebuild else None
        for kind, template in FIXES.items():
            if kind in found and template != REPORT_ONLY:
                return template
        return None

    def no_step_reason(self) -> str:
        """Why no command mends what was found (when :meth:`next_step` is None), in words."""
        if self.recover_refused is not None and self.recover_is_next():
            return (
                "none of these is mended by a command now: recover refuses the store "
                f"({self.recover_refused})"
            )
        if self.rebuild_refused_at is None:
            return "none of these is mended by a command"
        return (
            "none of these is mended by a command: those a rebuild would mend are left, as "
            "dispatch --rebuild refuses the log (a replay of it stops at the damage at offset "
            f"{self.rebuild_refused_at:,}, before its valid end)"
        )

    @property
    def truncated(self) -> bool:
        return sum(self.counts.values()) > len(self.findings)

    def to_dict(self, store: str | None = None) -> dict[str, Any]:
        """The JSON report; with ``store``, each finding's ``fix`` and the ``nextStep``."""
        findings = [finding.to_dict() for finding in self.findings]
        if store is not None:
            # no command of rmqstore mends anything then
            refused = self.writers_refused or self.unsettled
            mendable = self._mendable()
            for finding, document in zip(self.findings, findings, strict=True):
                document["fix"] = (
                    fix_for(finding.kind, store)
                    if not refused and mendable(finding)
                    else REPORT_ONLY
                )
        return {
            "ok": self.ok,
            **({"nextStep": self.next_step(store)} if store is not None else {}),
            "rebuildRefusedAt": self.rebuild_refused_at,
            "recoverRefused": self.recover_refused,
            "findings": findings,
            "findingsByKind": dict(sorted(self.counts.items())),
            "truncated": self.truncated,
            "checked": dict(sorted(self.checked.items())),
        }
