"""Hostile stores: real broker stores mutated (bit flips, truncations, length fields of
0/-1/2^31-1, deleted, junk, empty and grown files, a directory where a file should be, links
out of the store, a topic that climbs out) and every command run on each (export and stats
with the local engine; the Spark engine runs the same readers on executors). No traceback, no
hang, only documented exit codes, no change by a read-only command, nothing written outside
the store, memory capped at 4 GiB. And a master serving each mutant over the HA protocol to
an rmqstore slave: the same, the master's store unchanged."""

from __future__ import annotations

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
    rounds,
    run_commands,
    seed_note,
    tree_state,
)
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
    ["read", "{store}", "--topic", "TopicTest", "--queue", "1", "--time", "1700000000000"],
    ["read", "{store}", "--uniq-key", "7F0000010001000000000000", "--begin", "0", "--json"],
    ["read", "{store}", "--from-offset", "100", "--seek", "--count", "50", "--csv"],
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
        for outcome in outcomes:
            if not outcome.clean:
                failures.append(f"{where}: {outcome.command[0]}: {outcome.code} {outcome.stderr}")
        if tree_state(store) != before:
            failures.append(f"{where}: serving the store changed it")
    assert not failures, seed_note() + "\n" + "\n".join(failures[:20])
