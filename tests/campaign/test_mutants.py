"""Hostile stores: real broker stores mutated (bit flips, truncations, length fields of
0/-1/2^31-1, deleted, junk, empty and grown files, a directory where a file should be, links
out of the store, a topic that climbs out) and every command run on each (export and stats
with the local engine; the Spark engine runs the same readers on executors). No traceback, no
hang, only documented exit codes, no change by a read-only command, nothing written outside
the store, memory capped at 4 GiB."""

from __future__ import annotations

from pathlib import Path

import pytest

from campaigns import campaign_random, mutate, rounds, run_commands, seed_note, tree_state
from support import ORACLE_OPTIONS

MUTANTS = rounds(short=4, long=100)  # per real store; 3 stores
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
    ["dump", "{store}/commitlog/00000000000000000000", "--json"],
    ["dump", "{index_file}", "--json"],
    ["dump", "{queue_file}", "--json"],
    ["quarantine", "list", "{store}", "--json"],
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


@pytest.mark.campaign
@pytest.mark.parametrize("name", ["s1_multi", "s2_crash", "v533_s3_txn"])
def test_every_command_on_mutated_real_stores(oracle, tmp_path: Path, name: str) -> None:
    rng = campaign_random(f"mutants-{name}")
    failures = []
    for number in range(MUTANTS):
        root = tmp_path / f"m{number}"
        root.mkdir()
        outside = root / "outside"
        outside.mkdir()
        store = oracle(name).copy_to(root)
        done = [mutate(store, outside, rng) for _ in range(rng.randint(1, 3))]
        where = f"{name} mutant {number} ({'; '.join(done)})"

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
        for outcome in run_commands(lines(READ_ONLY)):
            if not outcome.clean:
                failures.append(f"{where}: {outcome.command[0]}: {outcome.code} {outcome.stderr}")
        if tree_state(store) != store_before:
            failures.append(f"{where}: a read-only command changed the store")
        for outcome in run_commands(lines(WRITERS)):
            if not outcome.clean:
                failures.append(f"{where}: {outcome.command[0]}: {outcome.code} {outcome.stderr}")
        if tree_state(outside) != outside_before:
            failures.append(f"{where}: something was written outside the store")
    assert not failures, seed_note() + "\n" + "\n".join(failures[:20])
