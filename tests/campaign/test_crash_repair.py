"""SIGKILL (or SIGTERM, SIGINT) during ``recover``, ``dispatch --rebuild`` and ``quarantine
restore``: running the command again reaches the same files, byte for byte, as a run that was
never interrupted."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rmqstore.fixtures import FixtureOptions, generate
from rmqstore.store import Store

from campaigns import (
    campaign_random,
    child_env,
    repair_outcome,
    rounds,
    seed_note,
    sigint_delivered,
    stop_signal,
)
from support import run_cli, tree_state

KILLS = rounds(short=1, long=30)
MESSAGES = 20_000


def run_and_kill(command: list[str], after: float, rng: random.Random) -> None:
    """``rmqstore COMMAND``, stopped after ``after`` seconds (see :func:`stop_signal`)."""
    child = subprocess.Popen(
        [sys.executable, "-m", "rmqstore", *command],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=child_env(),
        preexec_fn=sigint_delivered,
    )
    time.sleep(after)
    child.send_signal(stop_signal(rng))
    child.wait(timeout=300)


@pytest.mark.campaign
@pytest.mark.parametrize(
    ("scenario", "command"),
    [("multi", ["dispatch", "--rebuild", "--yes"]), ("abort-left", ["recover", "--yes"])],
)
def test_a_killed_repair_run_again_gives_the_same_files(
    tmp_path: Path, scenario: str, command: list[str]
) -> None:
    source = tmp_path / "source"
    generate(scenario, source, FixtureOptions(seed=3, messages=MESSAGES))
    reference = tmp_path / "reference"
    shutil.copytree(source, reference)
    started = time.monotonic()
    done = run_cli(command[0], reference, *command[1:])
    duration = time.monotonic() - started
    assert done.exit_code == 0, done.stderr
    expected = repair_outcome(reference)
    rng = campaign_random(f"crash-repair-{scenario}")
    for kill in range(KILLS):
        store = tmp_path / f"killed-{kill}"
        shutil.copytree(source, store)
        run_and_kill([command[0], str(store), *command[1:]], rng.uniform(0.3, 0.3 + duration), rng)
        again = run_cli(command[0], store, *command[1:])
        assert again.exit_code == 0, f"kill {kill}{seed_note()}: {again.stderr}"
        got = repair_outcome(store)
        assert got == expected, (
            f"kill {kill}{seed_note()}: {sorted(set(got.items()) ^ set(expected.items()))[:4]}"
        )
        shutil.rmtree(store)


QUEUED_TOPICS = rounds(short=300, long=1_000)
INDEX_OPTIONS = ("--index-slots", "1000", "--index-entries", "4000")


def torn_store_of_many_queues(root: Path, messages_file: Path) -> None:
    """A topic per queue, two messages each, then a crash that lost the last two thirds of
    the log: ``recover`` cuts a unit from most queues (a piece each) and rebuilds the index."""
    with messages_file.open("w") as out:
        for round_number in range(2):
            for topic in range(QUEUED_TOPICS):
                out.write(
                    json.dumps({"topic": f"T{topic}", "body": "x" * 50, "keys": f"k{round_number}"})
                    + "\n"
                )
    geometry = (
        "--consumequeue-file-size",
        "2000",
        "--index-slots",
        "1000",
        "--index-entries",
        "4000",
    )
    made = run_cli("append", root, "--create", "--input", messages_file, "--dispatch", *geometry)
    assert made.exit_code == 0, made.stderr
    log = sorted((root / "commitlog").iterdir())[0]
    with Store.open_read(root) as store:
        end = store.log_end().offset
    with open(log, "r+b") as handle:
        handle.seek(end // 3)
        handle.write(bytes(end - end // 3))
    (root / "abort").touch()


@pytest.mark.campaign
def test_a_killed_restore_run_again_gives_the_store_before_the_recovery(tmp_path: Path) -> None:
    """SIGKILL at a random moment of ``quarantine restore`` of a recovery that cut a piece from
    hundreds of queues (and rebuilt the index): running the restore again leaves the commit
    log, consume queues, index and checkpoint as they were before the recovery, byte for
    byte, and 'abort' there again."""

    def undone(store: Path) -> dict[str, str]:
        return {**repair_outcome(store), "abort": str((store / "abort").exists())}

    source = tmp_path / "source"
    torn_store_of_many_queues(source, tmp_path / "messages.jsonl")
    expected = undone(source)
    assert expected["abort"] == "True"
    assert run_cli("recover", source, "--yes", *INDEX_OPTIONS).exit_code == 0
    (folder,) = json.loads(run_cli("quarantine", "list", source, "--json").stdout)["folders"]
    assert folder["pieces"] >= QUEUED_TOPICS // 2
    restore = ["quarantine", "restore", None, folder["name"], "--yes"]
    reference = tmp_path / "reference"
    shutil.copytree(source, reference)
    started = time.monotonic()
    done = run_cli(*restore[:2], reference, *restore[3:])
    duration = time.monotonic() - started
    assert done.exit_code == 0, done.stderr
    assert undone(reference) == expected
    rng = campaign_random("crash-restore")
    for kill in range(KILLS):
        store = tmp_path / f"killed-{kill}"
        shutil.copytree(source, store)
        run_and_kill(
            [*restore[:2], str(store), *restore[3:]], rng.uniform(0.3, 0.3 + duration), rng
        )
        if (store / "quarantine" / folder["name"]).exists():  # else the kill came after it
            again = run_cli(*restore[:2], store, *restore[3:])
            assert again.exit_code == 0, f"kill {kill}{seed_note()}: {again.stderr}"
        got = undone(store)
        assert got == expected, (
            f"kill {kill}{seed_note()}: {sorted(set(got.items()) ^ set(expected.items()))[:4]}"
        )
        assert not (store / "quarantine" / folder["name"]).exists()
        shutil.rmtree(store)


@pytest.mark.campaign
@pytest.mark.parametrize(
    ("scenario", "command"),
    [("torn-tail", ["recover", "--yes"]), ("multi", ["dispatch", "--rebuild", "--yes"])],
)
def test_a_killed_repair_is_undone_by_its_restore(
    tmp_path: Path, scenario: str, command: list[str]
) -> None:
    """SIGKILL at a random moment of ``recover`` of a torn store whose every index file is
    rebuilt (the checkpoint's index time zeroed), or of ``dispatch --rebuild``, then
    ``quarantine restore`` of the folder it made: the commit log, consume queues, index,
    checkpoint and abort are as they were before, byte for byte, whatever the kill
    interrupted (what it made is set aside: each index file recover makes is listed as made
    before it is made, the folders a rebuild makes before it makes them)."""

    def state(store: Path) -> dict[str, str]:
        kept = tree_state(store)
        return {
            path: digest
            for path, digest in kept.items()
            if path.split("/")[0] in ("commitlog", "consumequeue", "index", "checkpoint", "abort")
        }

    source = tmp_path / "source"
    generate(scenario, source, FixtureOptions(seed=3, messages=MESSAGES))
    with open(source / "checkpoint", "r+b") as checkpoint:
        checkpoint.seek(16)  # indexMsgTimestamp: a recovery rebuilds every index file
        checkpoint.write(bytes(8))
    expected = state(source)
    reference = tmp_path / "reference"
    shutil.copytree(source, reference)
    started = time.monotonic()
    done = run_cli(command[0], reference, *command[1:], "--json")
    duration = time.monotonic() - started
    assert done.exit_code == 0, done.stderr
    if command[0] == "recover":
        assert json.loads(done.stdout)["plan"]["indexFilesRebuilt"] == len(
            list((source / "index").iterdir())
        )
    rng = campaign_random(f"crash-undo-{scenario}")
    for kill in range(KILLS):
        store = tmp_path / f"killed-{kill}"
        shutil.copytree(source, store)
        run_and_kill([command[0], str(store), *command[1:]], rng.uniform(0.25, 0.3 + duration), rng)
        # as an operator finds them: a folder the kill caught being made (no manifest in it
        # yet, under a hidden temporary name) is none, and nothing had moved
        listed = run_cli("quarantine", "list", store, "--json")
        assert listed.exit_code == 0, f"kill {kill}{seed_note()}: {listed.stderr}"
        folders = [f["name"] for f in json.loads(listed.stdout)["folders"]]
        for folder in folders:  # none: the kill came before the repair changed anything
            restored = run_cli("quarantine", "restore", store, folder, "--yes")
            assert restored.exit_code == 0, f"kill {kill}{seed_note()}: {restored.stderr}"
        got = state(store)
        assert got == expected, (
            f"kill {kill}{seed_note()}: {sorted(set(got.items()) ^ set(expected.items()))[:4]}"
        )
        shutil.rmtree(store)
