"""Following verify's next step on damaged stores: real broker stores mutated (by hostile
hands, or by a disk's damage to commit-log and consume-queue files), then, as an operator
scripts it, ``verify --json``, run its ``nextStep``, verify again. The steps end (a step is
never given twice for the same findings; after a few the store is sound or verify names no
command), every command ends with a documented exit code and a one-line error, nothing is
written outside the store, and no record is lost: each CRC-valid record the commit-log files
held before is still at its offset, or its bytes are in quarantine."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from campaigns import (
    DISK_BASES,
    campaign_random,
    damage_segment,
    first_lost_record,
    follow_next_steps,
    mutated_copy,
    records_by_file,
    rounds,
    seed_note,
)
from support import tree_state

MUTANTS = rounds(short=2, long=60)  # per real store
DISK_COPIES = rounds(short=2, long=180)


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
    if (lost := first_lost_record(store, before)) is not None:
        failures.append(f"{where}: after {steps}, the record at {lost} is lost")
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
