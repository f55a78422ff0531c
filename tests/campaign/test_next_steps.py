"""Following verify's next step on damaged stores: real broker stores mutated (by hostile
hands, or by a disk's damage to commit-log and consume-queue files), then, as an operator
scripts it, ``verify --json``, run its ``nextStep``, verify again. The steps end (a step is
never given twice for the same findings; after a few the store is sound or verify names no
command), every command ends with a documented exit code and a one-line error, nothing is
written outside the store, and no record is lost: each CRC-valid record the commit-log files
held before is still at its offset, or its bytes are in quarantine."""

from __future__ import annotations

import json
import random
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from rmqstore.config import StoreConfig
from rmqstore.errors import RmqStoreError
from rmqstore.store import Store

from campaigns import (
    DOCUMENTED_EXIT_CODES,
    campaign_random,
    child_env,
    damage_segment,
    mutated_copy,
    rounds,
    seed_note,
    tree_state,
)
from support import ORACLE_CONFIG, ORACLE_OPTIONS, ORACLE_STORES

MUTANTS = rounds(short=2, long=60)  # per real store
DISK_COPIES = rounds(short=4, long=180)
MOST_STEPS = 5


def records_by_file(store: Path) -> dict[int, bytes]:
    """Each CRC-valid record of the commit log, by offset: every file walked from its start
    until a record fails (so records after damage in an earlier file count too); {} when
    the store cannot be opened."""
    found: dict[int, bytes] = {}
    try:
        with Store.open_read(store, StoreConfig(**ORACLE_CONFIG)) as opened:
            log = opened.commitlog
            for segment in list(log.queue.segments):
                end = segment.start + log.queue.file_size
                scan = log.scan(segment.start, check_crc=True, stop_on_crc_error=True)
                for offset, header, _, _, crc_ok in scan:
                    if offset >= end or crc_ok is False:
                        break
                    found[offset] = commitlog_bytes_at(
                        store, offset, header.total_size, log.queue.file_size
                    )
    except (RmqStoreError, OSError):
        return {}
    return found


def commitlog_bytes_at(store: Path, offset: int, length: int, file_size: int) -> bytes:
    """``length`` bytes at commit-log ``offset``, read from the file itself (b"" if absent)."""
    start = offset - offset % file_size
    path = store / "commitlog" / f"{start:020d}"
    if path.is_symlink() or not path.is_file():
        return b""
    with open(path, "rb") as handle:
        handle.seek(offset - start)
        return handle.read(length)


def quarantined(store: Path) -> list[bytes]:
    folder = store / "quarantine"
    if not folder.is_dir():
        return []
    return [p.read_bytes() for p in folder.rglob("*") if p.is_file() and not p.is_symlink()]


def rmqstore(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rmqstore", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_env(),
    )


def unclean(result: subprocess.CompletedProcess[str]) -> bool:
    errors = [line for line in result.stderr.splitlines() if line.startswith("rmqstore: error")]
    return (
        result.returncode not in DOCUMENTED_EXIT_CODES
        or "Traceback" in result.stderr
        or len(errors) > 1
    )


def follow_next_steps(store: Path) -> tuple[list[str], list[str]]:
    """Verify, then its next step, until none: (the steps run, the failures)."""
    steps: list[str] = []
    seen: set[tuple[str, str]] = set()
    for _ in range(MOST_STEPS + 1):
        verify = rmqstore(["verify", str(store), "--json", *ORACLE_OPTIONS])
        if unclean(verify):
            return steps, [f"verify: {verify.returncode} {verify.stderr[-500:]}"]
        try:
            report = json.loads(verify.stdout)
        except json.JSONDecodeError:
            return steps, []  # refused in one line (not a store any more): nothing to follow
        step = report.get("nextStep")
        if not step:
            return steps, []
        findings = json.dumps(sorted(json.dumps(f, sort_keys=True) for f in report["findings"]))
        if (step, findings) in seen:
            return steps, [f"{step} again for the same findings: it mends nothing"]
        seen.add((step, findings))
        steps.append(step)
        command = shlex.split(step)
        assert command[0] == "rmqstore", step
        result = rmqstore([*command[1:], *ORACLE_OPTIONS])
        if unclean(result):
            return steps, [f"{step}: {result.returncode} {result.stderr[-500:]}"]
    return steps, [f"still a next step after {MOST_STEPS}: {steps}"]


# the stores a disk may damage: every real-broker store, and the crashed one's torn copies
DISK_BASES = [(name, "store") for name in ORACLE_STORES] + [
    ("s2_crash", "store_torn_half_record"),
    ("s2_crash", "store_torn_random_garbage"),
]


def disk_damaged_copy(oracle, root: Path, rng: random.Random) -> tuple[Path, Path, str]:
    """A copy of a real store (one of :data:`DISK_BASES`) whose commit-log or consume-queue
    files a disk or a cut copy damaged one to three times (see :func:`damage_segment`)."""
    name, which = rng.choice(DISK_BASES)
    root.mkdir()
    outside = root / "outside"
    outside.mkdir()
    store = oracle(name).copy_to(root, which)
    done = [
        damage_segment(store, rng.choice(["commitlog", "commitlog", "consumequeue"]), rng)
        for _ in range(rng.randint(1, 3))
    ]
    number = root.name.removeprefix("m")
    return store, outside, f"{name}/{which} damaged copy {number} ({'; '.join(filter(None, done))})"


def followed(store: Path, outside: Path, where: str) -> list[str]:
    """Follow verify's next steps on ``store``: the failures, each prefixed by ``where``."""
    before = records_by_file(store)
    outside_before = tree_state(outside)
    steps, found = follow_next_steps(store)
    failures = [f"{where}: {failure}" for failure in found]
    kept = quarantined(store)
    file_size = ORACLE_CONFIG["commitlog_file_size"]
    for offset, data in before.items():
        if commitlog_bytes_at(store, offset, len(data), file_size) == data:
            continue
        if not any(data in blob for blob in kept):
            failures.append(f"{where}: after {steps}, the record at {offset} is lost")
            break
    if tree_state(outside) != outside_before:
        failures.append(f"{where}: something was written outside the store")
    return failures


@pytest.mark.campaign
@pytest.mark.parametrize("name", ["s1_multi", "s2_crash", "v533_s3_txn"])
def test_next_steps_on_mutated_stores_end_and_lose_no_record(
    oracle, tmp_path: Path, name: str
) -> None:
    rng = campaign_random(f"next-steps-{name}")
    failures = []
    for number in range(MUTANTS):
        failures += followed(*mutated_copy(oracle, name, tmp_path / f"m{number}", rng))
    assert not failures, seed_note() + "\n" + "\n".join(failures[:20])


@pytest.mark.campaign
def test_next_steps_on_disk_damaged_stores_end_and_lose_no_record(oracle, tmp_path: Path) -> None:
    rng = campaign_random("next-steps-disk")
    failures = []
    for number in range(DISK_COPIES):
        failures += followed(*disk_damaged_copy(oracle, tmp_path / f"m{number}", rng))
    assert not failures, seed_note() + "\n" + "\n".join(failures[:20])
