"""A full disk stopping rmqstore's writers at random points: ``recover``, ``dispatch`` (and
``--rebuild``, here or in worker processes), ``append`` (with ``--dispatch`` or not),
``flush``, ``quarantine restore`` and ``fixtures generate --force`` over the store, on
copies of every real-broker store (torn ones too, some also damaged as a disk damages
files, or mutated by hostile hands as the mutants campaign mutates them) on a small file
system (a tmpfs, or ext4 with ``RMQSTORE_CAMPAIGN_FS=ext4``) left with a random few
kilobytes free, or room for a few more files. Each command ends with a documented exit
code; a stop is exit 4 in one line naming the full disk, and one that says it stopped
"before it changed the store" left the store as it was. Then, with room again, verify's
next steps are followed as a recovery script follows them (but after a fixture, which has a
geometry of its own): they end, nothing is written outside the store, no record is lost
(each CRC-valid record is still at its offset, or its bytes are in quarantine), and every
message ``append`` acknowledged is in the log with its body."""

from __future__ import annotations

import json
import os
import random
import shutil
from collections import Counter
from pathlib import Path

import pytest

from campaigns import (
    DISK_BASES,
    FILESYSTEM,
    LONG,
    campaign_random,
    damage_segment,
    first_lost_record,
    follow_next_steps,
    mutated_copy,
    records_by_file,
    rmqstore,
    rounds,
    seed_note,
    unclean,
)
from support import (
    ORACLE_OPTIONS,
    disk_left_with,
    inodes_left_with,
    outside_quarantine,
    small_filesystem,
    tree_state,
)

ROUNDS = rounds(short=4, long=150)
OPERATIONS = [
    "recover", "dispatch", "rebuild", "rebuild-jobs", "append", "restore", "flush", "generate"
]  # fmt: skip
FULL = "No space left on device"
BEFORE = "stopped before it changed the store"


def _prepared(oracle, disk: Path, rng: random.Random) -> tuple[Path, Path | None, str]:
    """A copy, on ``disk``, of a real store (one of :data:`DISK_BASES`), sometimes damaged
    as a disk damages files, or a mutant of one (with the folder beside it that its links
    may lead to); and what it is."""
    for old in ("store", "store_torn_half_record", "store_torn_random_garbage", "mutant"):
        shutil.rmtree(disk / old, ignore_errors=True)
    if rng.random() < 0.3:
        name = rng.choice(["s1_multi", "s2_crash", "v533_s3_txn"])
        return mutated_copy(oracle, name, disk / "mutant", rng)
    name, which = rng.choice(DISK_BASES)
    store = oracle(name).copy_to(disk, which)
    damage = ""
    if rng.random() < 0.3:
        damage = damage_segment(store, rng.choice(["commitlog", "consumequeue"]), rng)
    return store, None, f"{name}/{which}" + (f" ({damage})" if damage else "")


def _messages(path: Path, rng: random.Random, label: str) -> list[str]:
    """An ``append --input`` file of JSON lines (to a few topics, the real stores' own
    among them); returns the bodies in order."""
    bodies = []
    with open(path, "w") as lines:
        for number in range(rng.randint(1, 400)):
            body = f"{label}-{number}-" + "y" * rng.randint(0, 2000)
            bodies.append(body)
            topic = rng.choice(["TopicTest", "FullDiskA", "FullDiskB"])
            line = {"topic": topic, "queueId": rng.randint(0, 3), "keys": f"fd{number}"}
            lines.write(json.dumps({**line, "body": body}) + "\n")
    return bodies


def _command(
    operation: str, store: Path, work: Path, rng: random.Random, label: str
) -> tuple[list[str] | None, list[str] | None]:
    """The command line the full disk stops, after what it needs is set up (with room):
    queues and index to dispatch again, a crash to recover, a recovery to restore; and the
    bodies of the messages an append is given. No command when there is nothing to restore."""
    options = ORACLE_OPTIONS
    if operation == "recover":
        (store / "abort").touch()
        return ["recover", str(store), "--yes", *options], None
    if operation == "dispatch":
        shutil.rmtree(store / "index", ignore_errors=True)
        topics = sorted(p for p in (store / "consumequeue").glob("*") if p.is_dir())
        for topic in rng.sample(topics, rng.randint(0, len(topics))):
            if topic.is_symlink():  # a mutant's topic folder moved out and linked
                topic.unlink()
            else:
                shutil.rmtree(topic)
        return ["dispatch", str(store), *options], None
    if operation in ("rebuild", "rebuild-jobs"):
        jobs = ["--jobs", "2", "--split-size", "65536"] if operation == "rebuild-jobs" else []
        return ["dispatch", str(store), "--rebuild", "--yes", *jobs, *options], None
    if operation == "append":
        bodies = _messages(work / "input.jsonl", rng, label)
        dispatch = ["--dispatch"] if rng.random() < 0.7 else []
        command = ["append", str(store), *dispatch, "--input", str(work / "input.jsonl")]
        return [*command, "--jsonl", *options], bodies
    if operation == "flush":
        return ["flush", str(store), *options], None
    if operation == "generate":  # over the store: it goes to quarantine first
        scenario = rng.choice(["multi", "v2", "torn-tail", "lmq"])
        return ["fixtures", "generate", scenario, str(store), "--force"], None
    assert operation == "restore"
    (store / "abort").touch()
    recovered = rmqstore(["recover", str(store), "--yes", "--json", *options])
    if recovered.returncode not in (0, 1):
        return None, None  # a recovery refused: nothing to restore
    folders = sorted((store / "quarantine").glob("*-recover"))
    if not folders:
        return None, None
    return ["quarantine", "restore", str(store), folders[-1].name, "--yes"], None


def _acknowledged(stdout: str, bodies: list[str]) -> dict[int, str]:
    """commitLogOffset -> body of each message ``append --jsonl`` reported stored (a line
    each, in input order, once it is durable)."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    return {json.loads(line)["commitLogOffset"]: bodies[n] for n, line in enumerate(lines)}


def _folders(store: Path) -> list[str]:
    """The quarantine folders ``quarantine list`` shows."""
    base = store / "quarantine"
    return (
        sorted(p.name for p in base.iterdir() if not p.name.startswith("."))
        if base.is_dir()
        else []
    )


def _one_round(  # type: ignore[no-untyped-def]
    oracle, disk: Path, work: Path, rng: random.Random, number: int, outcomes: Counter[str]
) -> list[str]:
    """One command stopped (or not) by the full disk, then verify's steps with room again:
    the failures found; ``outcomes`` counts how the command ended."""
    store, outside, what = _prepared(oracle, disk, rng)
    outside_before = None if outside is None else tree_state(outside)
    operation = rng.choice(OPERATIONS)
    before = records_by_file(store)
    command, bodies = _command(operation, store, work, rng, f"r{number}")
    if command is None:
        return []
    if rng.random() < 0.25:  # room for a few more files and folders, not bytes
        room = rng.randrange(0, 12)
        full, left = inodes_left_with(disk, room), f"room for {room} more files"
    else:
        room = rng.choice([rng.randrange(0, 64 << 10, 4 << 10), rng.randrange(0, 1 << 20, 4 << 10)])
        full, left = disk_left_with(disk, room), f"{room:,} bytes free"
    where = f"round {number}: {operation} of {what} with {left}"
    state, folders = outside_quarantine(tree_state(store)), _folders(store)
    kept_before = work / "before"  # the store as the command found it, kept on a failure
    shutil.rmtree(kept_before, ignore_errors=True)
    shutil.copytree(store, kept_before, symlinks=True, copy_function=_copy_regular)
    with full:
        result = rmqstore(command)
    if unclean(result):
        failure = f"{where}: {result.returncode} {result.stderr[-600:]}"
        return _store_kept([failure], kept_before, number)
    failures = []
    errors = [line for line in result.stderr.splitlines() if line.startswith("rmqstore: error")]
    if result.returncode != 4:
        outcomes["done" if result.returncode in (0, 1) else "refused"] += 1
    else:
        outcomes["before" if errors and errors[0].endswith(BEFORE) else "part way"] += 1
        if not errors or FULL not in errors[0]:
            failures.append(f"{where}: exit 4 without a full disk named: {result.stderr[-600:]}")
        elif errors[0].endswith(BEFORE) and (changed := _changes(state, store)):
            failures.append(f"{where}: said {BEFORE!r}, but it changed {changed}")
        elif errors[0].endswith(BEFORE) and _folders(store) != folders:
            failures.append(f"{where}: said {BEFORE!r}, but left a quarantine folder")
    acknowledged = _acknowledged(result.stdout, bodies) if bodies else {}
    steps: list[str] = []
    if operation != "generate":  # a fixture has a geometry of its own
        steps, found = follow_next_steps(store)
        failures += [f"{where}: {failure}" for failure in found]
    if (lost := first_lost_record(store, before)) is not None:
        failures.append(f"{where}: after {steps}, the record at {lost} is lost")
    if acknowledged:
        now = records_by_file(store)
        for offset, body in acknowledged.items():
            if body.encode() not in now.get(offset, b""):
                failures.append(f"{where}: after {steps}, acknowledged message at {offset} lost")
                break
    if outside is not None and tree_state(outside) != outside_before:
        failures.append(f"{where}: after {steps}, something was written outside the store")
    return _store_kept(failures, kept_before, number)


def _copy_regular(source: str, target: str) -> None:
    """Copy a regular file (a mutant's FIFO is left out: opening it would wait for ever)."""
    if os.path.isfile(source):
        shutil.copy2(source, target)


def _store_kept(failures: list[str], kept_before: Path, number: int) -> list[str]:
    """``failures``, the first naming where the store the failed command found is kept."""
    if failures:
        kept = kept_before.rename(kept_before.with_name(f"failed-{number}"))
        failures[0] += f" (the store it found: {kept})"
    return failures


def _changes(state: dict[str, str], store: Path) -> list[str]:
    """The paths outside quarantine whose state differs from ``state`` (a few), folders
    included: a dispatch stopped before it put anything takes away the empty files and
    folders it made."""
    now = outside_quarantine(tree_state(store))
    return sorted(k for k in state.keys() | now.keys() if state.get(k) != now.get(k))[:3]


def _campaign(  # type: ignore[no-untyped-def]
    label: str, size: str, count: int, one_round, oracle, tmp_path: Path
) -> Counter[str]:
    """``count`` rounds of ``one_round`` on a small file system of ``size``: how they ended
    (printed); any failure fails the test, naming the seed."""
    rng = campaign_random(label)
    work = tmp_path / "work"
    work.mkdir()
    failures: list[str] = []
    outcomes: Counter[str] = Counter()
    with small_filesystem(tmp_path, size, FILESYSTEM) as disk:
        for number in range(count):
            failures += one_round(oracle, disk, work, rng, number, outcomes)
    print(f"{label} outcomes: {dict(outcomes)}")
    assert not failures, seed_note() + "\n" + "\n".join(failures[:20])
    return outcomes


@pytest.mark.campaign
def test_a_full_disk_stops_each_writer_cleanly_and_loses_nothing(oracle, tmp_path: Path) -> None:
    outcomes = _campaign("full-disk", "24m", ROUNDS, _one_round, oracle, tmp_path)
    if LONG:  # the disk stopped commands before they changed the store, and part way
        assert outcomes["before"] and outcomes["part way"] and outcomes["done"], outcomes


REPLICA_ROUNDS = rounds(short=3, long=60)


def _log_prefix_differs(dest: Path, source: Path, end: int) -> str | None:
    """Where ``dest``'s commit log is not ``source``'s up to offset ``end`` (a file
    missing, or differing bytes), or None."""
    for path in sorted((source / "commitlog").iterdir()):
        start = int(path.name)
        if start >= end:
            break
        length = min(path.stat().st_size, end - start)
        copy = dest / "commitlog" / path.name
        if not copy.is_file():
            return f"{copy} missing"
        with open(path, "rb") as original, open(copy, "rb") as replica:
            if original.read(length) != replica.read(length):
                return f"{copy} differs from the source's before offset {end}"
    return None


def _replica_round(  # type: ignore[no-untyped-def]
    oracle, disk: Path, work: Path, rng: random.Random, number: int, outcomes: Counter[str]
) -> list[str]:
    """``replicate SOURCE DEST``, DEST on the full disk (new, empty, or a replica an
    earlier full disk stopped), SOURCE a real store elsewhere (torn ones too, some also
    disk-damaged): a clean end (exit 4 in one line naming the full disk when stopped); the
    source untouched; run again with room, the replica is SOURCE's log up to its valid
    end, byte for byte, sound by verify, without 'abort', and nothing else is on the disk."""
    shutil.rmtree(work / "source", ignore_errors=True)
    shutil.rmtree(disk / "replica", ignore_errors=True)
    name, which = rng.choice(DISK_BASES)
    source = oracle(name).copy_to(work / "source", which)
    what = f"{name}/{which}"
    if rng.random() < 0.3:
        what += f" ({damage_segment(source, 'commitlog', rng)})"
    dest = disk / "replica"
    start = rng.choice(["new", "empty", "stopped before"])
    if start == "empty":
        dest.mkdir()
    elif start == "stopped before":
        with disk_left_with(disk, rng.randrange(0, 1 << 20, 4 << 10)):
            earlier = rmqstore(["replicate", str(source), str(dest)])
        if unclean(earlier):
            return [f"round {number}: a first replicate of {what}: {earlier.stderr[-600:]}"]
    source_state = tree_state(source)
    dest_state = tree_state(dest) if dest.exists() else None
    if rng.random() < 0.25:
        room = rng.randrange(0, 12)
        full, left = inodes_left_with(disk, room), f"room for {room} more files"
    else:  # a replica of a real store takes about 22 MiB, 21 of them the index's slots
        room = rng.choice(
            [rng.randrange(0, 1 << 20, 4 << 10), rng.randrange(0, 32 << 20, 256 << 10)]
        )
        full, left = disk_left_with(disk, room), f"{room:,} bytes free"
    where = f"round {number}: replicate of {what} into a {start} replica with {left}"
    with full:
        result = rmqstore(["replicate", str(source), str(dest), "--json"])
    if unclean(result):
        return [f"{where}: {result.returncode} {result.stderr[-600:]}"]
    failures = []
    errors = [line for line in result.stderr.splitlines() if line.startswith("rmqstore: error")]
    if result.returncode == 4:
        if not errors or FULL not in errors[0] or len(errors) > 1:
            failures.append(f"{where}: exit 4 without one line naming the full disk")
        elif errors[0].endswith("replicate stopped before it changed the store") and (
            dest_state != (tree_state(dest) if dest.exists() else None)
        ):
            failures.append(f"{where}: said it changed nothing, but it did")
        outcomes["stopped"] += 1
    else:
        outcomes["done" if result.returncode == 0 else "refused"] += 1
    again = rmqstore(["replicate", str(source), str(dest), "--json"])
    if unclean(again) or (
        # a stop may come before SOURCE is looked at far enough to be refused
        again.returncode != result.returncode
        and not (result.returncode == 4 and again.returncode in (0, 2))
    ):
        return [*failures, f"{where}: run again with room: {again.returncode} {again.stderr}"]
    if tree_state(source) != source_state:
        failures.append(f"{where}: the source changed")
    if again.returncode == 0:
        end = json.loads(again.stdout)["sourceEnd"]
        if (differs := _log_prefix_differs(dest, source, end)) is not None:
            failures.append(f"{where}: then {differs}")
        # sound: nothing for a command to mend (damage the body CRC does not cover, as in
        # properties, is copied as it is, and reported only)
        checked = rmqstore(["verify", str(dest), "--json"])
        report = json.loads(checked.stdout) if checked.returncode in (0, 1) else None
        if report is None or report["nextStep"] is not None or (dest / "abort").exists():
            found = checked.stderr if report is None else report["findings"]
            failures.append(f"{where}: then verify: {checked.returncode} {found}")
    elsewhere = sorted(p.name for p in disk.iterdir() if p.name != "replica")
    if elsewhere:
        failures.append(f"{where}: left {elsewhere} on the disk")
    return failures


@pytest.mark.campaign
def test_a_full_disk_stops_replicate_cleanly_and_a_rerun_makes_the_replica(
    oracle, tmp_path: Path
) -> None:
    outcomes = _campaign(
        "full-disk-replica", "64m", REPLICA_ROUNDS, _replica_round, oracle, tmp_path
    )
    if LONG:
        assert outcomes["stopped"] and outcomes["done"], outcomes
