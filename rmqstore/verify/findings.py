"""Findings and the report ``rmqstore verify`` prints (and exits 1 on)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

ERROR = "error"
WARNING = "warning"
NOTE = "note"  # worth knowing, not a problem (does not fail verify)

# every finding kind, with what it means (documented in rmqstore-verify(1))
KINDS = {
    "file-size": "a store file's size differs from the configured size",
    "file-name": "a file whose name a broker cannot parse, or an unexpected file",
    "file-gap": "commit-log files are not contiguous",
    "file-incomplete": "a commit-log file ends without a BLANK record but later files hold data",
    "data-after-end": "a commit-log file after the end of the log holds data",
    "record-invalid": "bytes that are not a valid record (magic, length, topic length, ...)",
    "record-physical-offset": "a record's stored PHYSICALOFFSET differs from its position",
    "record-body-crc": "a record's BODYCRC does not match its body",
    "record-property-crc": "a record's 5.x __CRC32# property does not match the record",
    "record-properties": "a record's properties do not decode (invalid UTF-8, bad DELAY)",
    "blank-size": "a BLANK record does not reach the end of its file",
    "store-time-order": "store timestamps decrease along the log",
    "queue-offset-gap": "a queue's offsets in the commit log are not dense",
    "torn-tail": "non-zero bytes after the valid end of the log of a store not closed cleanly",
    "stale-bytes-after-end": "non-zero bytes after the valid end (left by a broker's recovery)",
    "cq-file-size": "a consume-queue file has the wrong size",
    "cq-file-gap": "consume-queue files are not contiguous",
    "cq-unit": "a consume-queue unit does not match the record it should point at",
    "cq-unit-orphan": "a consume-queue unit with no record of its queue at that queue offset",
    "cq-beyond-log": "consume-queue units point past the end of the commit log",
    "cq-pre-blank": "pre-blank units after the start of a queue",
    "dispatch-lag": "records in the commit log missing from their consume queue",
    "index-file-size": "an index file's size does not match the slot and entry counts",
    "index-unchecked": "the index was not checked: its hash-slot and entry counts are unknown",
    "index-header": "an index file's header disagrees with its entries",
    "index-chain": "an index hash chain that leaves the file or does not terminate",
    "index-entry": "an index entry that does not match the keys of its record",
    "index-lag": "records whose keys are missing from the index",
    "checkpoint-future": "a checkpoint time ahead of the data it vouches for",
    "checkpoint-size": "the checkpoint file is not 4096 bytes",
    "abort-present": "the store was not closed cleanly (a broker was running or crashed)",
}


@dataclass(frozen=True, slots=True)
class Finding:
    kind: str
    file: str | None
    offset: int | None
    message: str
    severity: str = ERROR

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "severity": self.severity,
            "file": self.file,
            "offset": self.offset,
            "message": self.message,
        }


@dataclass
class VerifyReport:
    """Findings (up to ``max_findings`` kept; all counted) and what was checked."""

    max_findings: int | None = 1000
    findings: list[Finding] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)  # by kind, all severities
    problems: int = 0  # errors and warnings, counted beyond max_findings too
    checked: Counter = field(default_factory=Counter)

    def add(
        self, kind: str, file: str | None, offset: int | None, message: str, severity: str = ERROR
    ) -> None:
        assert kind in KINDS, kind
        self.counts[kind] += 1
        if severity != NOTE:
            self.problems += 1
        if self.max_findings is None or len(self.findings) < self.max_findings:
            self.findings.append(Finding(kind, file, offset, message, severity))

    def absorb(self, other: VerifyReport) -> None:
        """Add the findings and counts of a report made over another part of the store."""
        room = None if self.max_findings is None else self.max_findings - len(self.findings)
        self.findings.extend(other.findings if room is None else other.findings[: max(room, 0)])
        self.counts.update(other.counts)
        self.problems += other.problems
        self.checked.update(other.checked)

    @property
    def ok(self) -> bool:
        return self.problems == 0

    @property
    def truncated(self) -> bool:
        return sum(self.counts.values()) > len(self.findings)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "findings": [finding.to_dict() for finding in self.findings],
            "findingsByKind": dict(sorted(self.counts.items())),
            "truncated": self.truncated,
            "checked": dict(sorted(self.checked.items())),
        }
