"""Hostile stores: real broker stores mutated (bit flips, truncations, length fields of
0/-1/2^31-1, deleted, junk, empty and grown files, a directory where a file should be, links
out of the store, hard links to paths outside it, a topic that climbs out) and every command
run on each (export and stats with the local engine; the Spark engine runs the same readers on
executors). No traceback, no hang, only documented exit codes, no change by a read-only
command, nothing written outside the store, memory capped at 4 GiB. And a master serving each
mutant over the HA protocol to an rmqstore slave: the same, the master's store unchanged."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from campaigns import (
    Outcome,
    campaign_random,
    child_env,
    mutate,
    mutated_copy,
    rounds,
    run_commands,
    seed_note,
)
from support import ORACLE_OPTIONS, tree_state

MUTANTS = rounds(short=2, long=100)  # per real store; 3 stores
READ_ONLY = [
    ["info", "{store}", "--json"],
    ["verify", "{store}", "--json"],
    ["read", "{store}", "--from-offset", "0", "--jsonl"],
    ["read", "{store}", "--topic", "TopicTest", "--key", "KEY1", "--jsonl"],
    ["recover", "{store}", "--dry-run"],
    ["dispatch", "{store}", "--dry-run"],
    ["stats", "{store}", "--engine", "local", "--json"],
    ["export", "{store}", "--engine", "local", "--format", "jsonl", "--to", "{export}"],
    ["info", "{store}", "--deep", "--json"],
    ["read", "{store}", "--topic", "TopicTest", "--queue", "0", "--jsonl"],
    ["read", "{store}", "--topic", "TopicTest", "--queue", "1", "--time", "1700000000000"],
    ["read", "{store}", "--uniq-key", "7F0000010001000000000000", "--begin", "0", "--json"],
    ["read", "{store}", "--from-offset", "100", "--seek", "--count", "50", "--csv"],
    ["read", "{store}", "--from-offset", "0", "--count", "300"],  # the table, as lines
    ["read", "{store}", "--topic", "TopicTest", "--tags", "TagA||TagB", "--begin", "1", "--tsv"],
    ["dump", "{store}/commitlog/00000000000000000000", "--json"],
    ["dump", "{index_file}", "--json"],
    ["dump", "{queue_file}", "--json"],
    ["dump", "{store}/checkpoint", "--json"],
    ["quarantine", "list", "{store}", "--json"],
    ["offsets", "{store}", "--json"],
    # a read of the store, whatever it writes to the replica beside it
    ["replicate", "{store}", "{replica}"],
]
WRITERS = [
    ["append", "{store}", "--topic", "TopicTest", "--body", "after", "--dispatch"],
    ["recover", "{store}", "--yes"],
    ["dispatch", "{store}"],
    ["flush", "{store}"],
    ["dispatch", "{store}", "--rebuild", "--yes"],
    ["verify", "{store}"],
]


def unclean(where: str, outcomes: list[Outcome]) -> list[str]:
    """A failure line for each outcome that ended without a documented exit code and a
    one-line error."""
    return [
        f"{where}: {outcome.command[0]}: {outcome.code} {outcome.stderr}"
        for outcome in outcomes
        if not outcome.clean
    ]


@pytest.mark.campaign
@pytest.mark.parametrize("name", ["s1_multi", "s2_crash", "v533_s3_txn"])
def test_every_command_on_mutated_real_stores(oracle, tmp_path: Path, name: str) -> None:
    rng = campaign_random(f"mutants-{name}")
    failures = []
    for number in range(MUTANTS):
        store, outside, where = mutated_copy(oracle, name, tmp_path / f"m{number}", rng)

        def lines(commands: list[list[str]], store: Path = store) -> list[list[str]]:
            beside = {"export": store.parent / "export", "replica": store.parent / "replica"}
            files = {  # the first of each, or a path that is not there (one more error case)
                f"{kind}_file": min((store / folder).glob("*"), default=store / folder)
                for kind, folder in (("index", "index"), ("queue", "consumequeue/TopicTest/0"))
            }
            return [  # export and replicate write only beside the store
                [part.format(store=store, **beside, **files) for part in c]
                + (ORACLE_OPTIONS if c[0] != "quarantine" else [])
                for c in commands
            ]

        outside_before = tree_state(outside)
        store_before = tree_state(store)
        failures += unclean(where, run_commands(lines(READ_ONLY)))
        if tree_state(store) != store_before:
            failures.append(f"{where}: a read-only command changed the store")
        failures += unclean(where, run_commands(lines(WRITERS)))
        if tree_state(outside) != outside_before:
            failures.append(f"{where}: something was written outside the store")
    assert not failures, seed_note() + "\n" + "\n".join(failures[:20])


HA_MUTANTS = rounds(short=2, long=50)  # per real store


@pytest.mark.campaign
@pytest.mark.parametrize("name", ["s1_multi", "s2_crash", "v533_s3_txn"])
def test_serve_ha_on_mutated_real_stores(oracle, tmp_path: Path, name: str) -> None:
    """A master serving a mutated store over the HA protocol, and an rmqstore slave
    replicating from it: both end with a documented exit code, no traceback and no hang,
    and the master's store is only read."""
    rng = campaign_random(f"ha-mutants-{name}")
    failures = []
    for number in range(HA_MUTANTS + 1):
        root = tmp_path / f"m{number}"
        root.mkdir()
        outside = root / "outside"
        outside.mkdir()
        store = oracle(name).copy_to(root)
        # the store as the broker left it first: the harness must see a slave catch up
        done = [mutate(store, outside, rng) for _ in range(rng.randint(1, 3))] if number else []
        where = f"{name} mutant {number} ({'; '.join(done) or 'not mutated'})"
        before = tree_state(store)
        master = subprocess.Popen(
            [sys.executable, "-m", "rmqstore", "serve-ha", str(store), "--listen",
             "127.0.0.1:0", *ORACLE_OPTIONS],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=child_env(),
        )  # fmt: skip
        assert master.stderr is not None
        said = ""  # "serving ... on HOST:PORT", or the error it ends with
        if select.select([master.stderr], [], [], 30)[0]:
            said = master.stderr.readline()
        else:
            failures.append(f"{where}: the master said nothing in time")
        port = re.search(r" on 127\.0\.0\.1:(\d+);", said)
        slave = None
        if port is not None:
            try:
                slave = subprocess.run(
                    [sys.executable, "-m", "rmqstore", "replicate",
                     f"ha://127.0.0.1:{port.group(1)}", str(root / "dest"), *ORACLE_OPTIONS],
                    capture_output=True, text=True, timeout=60, env=child_env(),
                )  # fmt: skip
            except subprocess.TimeoutExpired:
                failures.append(f"{where}: the slave did not end in time")
            master.send_signal(signal.SIGINT)
        try:
            master.wait(timeout=30)
        except subprocess.TimeoutExpired:
            master.kill()
            failures.append(f"{where}: the master did not end in time")
        said += master.stderr.read()
        if not number and (slave is None or slave.returncode != 0):
            failures.append(f"{where}: no slave caught up ({said}{slave and slave.stderr})")
        outcomes = [Outcome(["serve-ha"], master.returncode, said)]
        if slave is not None:
            outcomes.append(Outcome(["replicate"], slave.returncode, slave.stderr))
        failures += unclean(where, outcomes)
        if tree_state(store) != before:
            failures.append(f"{where}: serving the store changed it")
    assert not failures, seed_note() + "\n" + "\n".join(failures[:20])


UNDONE_MUTANTS = rounds(short=3, long=100)  # per real store
# the store's own bookkeeping (the writers' lock, the quarantine, the geometry a writer
# remembers for the commands after it, in a config folder it may make)
_NOT_UNDONE = ("lock", "quarantine", "config")


def _store_bytes(store: Path) -> dict[str, bytes | str]:
    """The commit log, consume queues, index, checkpoint and abort: each file's bytes, each
    link's target."""
    held: dict[str, bytes | str] = {}
    for path in sorted(store.rglob("*")):
        key = str(path.relative_to(store))
        if key.split("/")[0] in _NOT_UNDONE:
            continue
        if path.is_symlink():
            held[key] = f"link:{os.readlink(path)}"
        elif path.is_file():
            held[key] = path.read_bytes()
        elif not path.is_dir():
            held[key] = "special"
    return held


def _kept_ranges(store: Path) -> dict[str, list[tuple[int, bytes]]]:
    """The byte ranges the quarantine folders hold copies of, by store-relative file: where
    they start, and the bytes."""
    kept: dict[str, list[tuple[int, bytes]]] = {}
    for folder in (store / "quarantine").glob("*"):
        for copy in folder.rglob("*.bin"):
            matched = re.fullmatch(r"(.*)\.(\d+)-(\d+)\.bin", str(copy.relative_to(folder)))
            if matched:
                kept.setdefault(matched[1], []).append((int(matched[2]), copy.read_bytes()))
    return kept


def _not_given_back(
    before: dict[str, bytes | str], after: dict[str, bytes | str], kept: dict
) -> list[str]:
    """What of ``before`` a restore did not give back: every path is there again, with the
    same bytes, except where the recovery dispatched units into consume-queue space that was
    zeros (they index records the log holds; a restore leaves them) or over bytes it copied
    to a quarantine folder of their own first (which holds them)."""
    missing = []
    for key, held in before.items():
        now = after.get(key)
        if isinstance(held, str) or isinstance(now, str) or now is None:
            if now != held:
                missing.append(key)
            continue
        if now == held:
            continue
        if not key.startswith("consumequeue/") or len(now) < len(held):
            missing.append(key)
            continue
        copies = kept.get(key, [])
        for position, (old, new) in enumerate(zip(held, now, strict=False)):
            if not old or old == new:
                continue
            if not any(
                start <= position < start + len(data) and data[position - start] == old
                for start, data in copies
            ):
                missing.append(f"{key}@{position}")
                break
    made = [key for key in after if key not in before and not key.startswith("consumequeue/")]
    return missing + [f"{key} (made)" for key in made]


@pytest.mark.campaign
@pytest.mark.parametrize("name", ["s1_multi", "s2_crash", "v533_s3_txn"])
def test_a_recovery_of_a_mutant_is_undone_by_its_restore(oracle, tmp_path: Path, name: str) -> None:
    """``recover --yes`` on a mutated real store, then ``quarantine restore`` of the folder it
    made (also when the recovery stopped at something in its way after it had begun): the
    commit log, consume queues, index, checkpoint and abort are the mutant's again (the units
    the recovery dispatched after where queues ended aside), or the restore refuses in one
    line, changing nothing. Nothing is written outside."""
    rng = campaign_random(f"undo-mutants-{name}")
    failures = []
    restores = shared = 0
    for number in range(UNDONE_MUTANTS):
        store, outside, where = mutated_copy(oracle, name, tmp_path / f"m{number}", rng)
        outside_before = tree_state(outside)
        before = _store_bytes(store)
        (recovered,) = run_commands([["recover", str(store), "--yes", *ORACLE_OPTIONS]])
        shared += recovered.code == 2 and "hard links" in recovered.stderr
        folders = sorted(p.name for p in (store / "quarantine").glob("*-recover*"))
        if not recovered.clean or not folders:  # a refused recovery may have begun: undo it
            continue
        restore = ["quarantine", "restore", str(store), folders[-1], "--yes"]
        undone = _store_bytes(store)
        (restored,) = run_commands([restore])
        after = _store_bytes(store)
        restores += restored.code == 0
        if not restored.clean:
            failures += unclean(where, [restored])
        elif restored.code == 0 and (lost := _not_given_back(before, after, _kept_ranges(store))):
            failures.append(f"{where}: the restore did not give back {lost[:4]}")
        elif restored.code != 0 and after != undone:
            failures.append(f"{where}: a refused restore changed the store")
        if tree_state(outside) != outside_before:
            failures.append(f"{where}: something was written outside the store")
    assert not failures, seed_note() + "\n" + "\n".join(failures[:20])
    # a crash store's recovery always has a folder, unless it was refused for a hard link
    assert restores or name != "s2_crash" or shared == UNDONE_MUTANTS
