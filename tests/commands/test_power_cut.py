"""A power cut right after a writer says it is done: the disk as the cut leaves it (a copy of
an ext4 image taken the moment the command returns, its journal replayed as at the next
start) holds all the command did, byte for byte. A kill cannot show this: the page cache
outlives the process, so a file or a rename left unsynced passes every kill campaign and is
lost here (root only: the disks are loop devices)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from support import failing_disk, mounted_copy, run_cli, tree_state

pytestmark = pytest.mark.plumbing

# a disk that does not fail: its device holds more than the file system's size
HEALTHY = {"holds": "160m", "size": "128m"}


def _lines(tmp_path: Path) -> Path:
    lines = tmp_path / "in.jsonl"
    if not lines.exists():
        with open(lines, "w", encoding="utf-8") as out:
            for number in range(300):
                message = {"topic": f"T{number % 3}", "keys": f"k{number}", "body": "x" * 1000}
                out.write(json.dumps(message) + "\n")
    return lines


def _store(tmp_path: Path, where: Path, *, dispatch: bool) -> Path:
    """300 messages in 64 KiB files: dispatched, or left undispatched under 'abort'."""
    store = where / "store"
    made = run_cli("append", store, "--create", "--commitlog-file-size", "65536",
                   "--input", _lines(tmp_path), *(["--dispatch"] if dispatch else []))  # fmt: skip
    assert made.exit_code == 0, made.stderr
    return store


def _torn(tmp_path: Path, where: Path) -> Path:
    """A crashed store with junk after its last record, for recover to cut."""
    store = _store(tmp_path, where, dispatch=False)
    last = max((store / "commitlog").iterdir())
    with open(last, "r+b") as handle:
        data = handle.read()
        handle.seek(len(data.rstrip(b"\0")))
        handle.write(bytes(range(1, 256)) * 20)
    return store


def _restore(tmp_path: Path, disk: Path) -> list:
    store = _torn(tmp_path, disk)
    assert run_cli("recover", store, "--yes").exit_code == 0
    (name,) = os.listdir(store / "quarantine")
    return ["quarantine", "restore", store, name, "--yes"]


def _purge(tmp_path: Path, disk: Path) -> list:
    store = _torn(tmp_path, disk)
    assert run_cli("recover", store, "--yes").exit_code == 0
    return ["quarantine", "purge", store, "--all", "--yes"]


# each: what is made before the cut is in question (synced), then the command
CASES: dict[str, Callable[[Path, Path], list]] = {
    "append --create": lambda tmp, disk: [
        "append", disk / "new", "--create", "--flush", "sync", "--input", _lines(tmp)
    ],
    "append --dispatch": lambda tmp, disk: [
        "append", _store(tmp, disk, dispatch=True), "--dispatch", "--input", _lines(tmp)
    ],
    "append --flush async": lambda tmp, disk: [
        "append", _store(tmp, disk, dispatch=False), "--flush", "async", "--input", _lines(tmp)
    ],
    "dispatch": lambda tmp, disk: ["dispatch", _store(tmp, disk, dispatch=False)],
    "dispatch --rebuild --jobs 2": lambda tmp, disk: [
        "dispatch", _store(tmp, disk, dispatch=False), "--rebuild", "--yes", "--jobs", "2"
    ],
    "dispatch --rebuild": lambda tmp, disk: [
        "dispatch", _store(tmp, disk, dispatch=False), "--rebuild", "--yes"
    ],
    "recover": lambda tmp, disk: ["recover", _torn(tmp, disk), "--yes"],
    "quarantine restore": _restore,
    "quarantine purge": _purge,
    "flush": lambda tmp, disk: ["flush", _store(tmp, disk, dispatch=False)],
    "fixtures generate": lambda tmp, disk: ["fixtures", "generate", "basic", disk / "fixture"],
    "replicate": lambda tmp, disk: [
        "replicate", _store(tmp, tmp / "source", dispatch=True), disk / "replica"
    ],
    "export": lambda tmp, disk: [
        "export", _store(tmp, tmp / "source", dispatch=True), "--engine", "local",
        "--format", "jsonl", "--to", disk / "export"
    ],
}  # fmt: skip


def _without_locks(state: dict[str, str]) -> dict[str, str]:
    """A lock file holds the process id of its last holder, which no one needs back."""
    return {path: what for path, what in state.items() if Path(path).name != "lock"}


@pytest.mark.parametrize("case", list(CASES))
def test_what_a_writer_did_outlives_a_power_cut_right_after(tmp_path: Path, case: str) -> None:
    with failing_disk(tmp_path, **HEALTHY) as (disk, image):
        command = CASES[case](tmp_path, disk)
        os.sync()  # what came before the command is not in question
        result = run_cli(*command)
        assert result.exit_code == 0, result.stderr
        done = _without_locks(tree_state(disk))
        with mounted_copy(image, tmp_path) as after_the_cut:
            assert _without_locks(tree_state(after_the_cut)) == done
