"""SIGKILL during ``recover`` and ``dispatch --rebuild``: running the command again reaches the
same files, byte for byte, as a run that was never interrupted."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rmqstore.fixtures import FixtureOptions, generate

from campaigns import campaign_random, child_env, rounds, seed_note, tree_state
from support import run_cli

KILLS = rounds(short=2, long=30)
MESSAGES = 20_000


def outcome(store: Path) -> dict[str, str]:
    """What the command is meant to produce: the commit log, consume queues and checkpoint by
    path, and the index files' contents in name order (their names come from the clock)."""
    state = tree_state(store)
    kept = {
        path: digest
        for path, digest in state.items()
        if path.split("/")[0] in ("commitlog", "consumequeue", "checkpoint")
    }
    index = [digest for path, digest in sorted(state.items()) if path.startswith("index/")]
    kept["index files, in order"] = ",".join(index)
    return kept


def run_and_kill(command: list[str], after: float) -> None:
    child = subprocess.Popen(
        [sys.executable, "-m", "rmqstore", *command],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=child_env(),
    )
    time.sleep(after)
    child.kill()
    child.wait()


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
    expected = outcome(reference)
    rng = campaign_random(f"crash-repair-{scenario}")
    for kill in range(KILLS):
        store = tmp_path / f"killed-{kill}"
        shutil.copytree(source, store)
        run_and_kill([command[0], str(store), *command[1:]], rng.uniform(0.3, 0.3 + duration))
        again = run_cli(command[0], store, *command[1:])
        assert again.exit_code == 0, f"kill {kill}{seed_note()}: {again.stderr}"
        got = outcome(store)
        assert got == expected, (
            f"kill {kill}{seed_note()}: {sorted(set(got.items()) ^ set(expected.items()))[:4]}"
        )
        shutil.rmtree(store)
