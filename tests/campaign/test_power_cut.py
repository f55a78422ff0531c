"""A power cut in the middle of ``recover``, ``dispatch --rebuild``, ``quarantine restore``,
``replicate`` (from a directory and over HA), ``dispatch`` and ``append --dispatch`` (each
flush policy): the command is killed as it enters its n-th fsync, fdatasync, msync or syncfs
(strace's syscall injection) and the disk image copied at once. The file system is mounted with
``commit=300`` and a run lasts less than the 30 s after which Linux writes dirty pages back
on its own, so nothing the command did not sync reached the image: the copy is what a power
cut at that sync leaves. On the copy (its journal replayed, as at the next start) the
command run again gives the files of a run never cut, byte for byte, and no message an
append reported is lost. A kill alone cannot show this: the page cache outlives a process,
so a write made durable in the wrong order passes every kill campaign and is lost here."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import pytest

from rmqstore.dispatch import queue_reach
from rmqstore.fixtures import FixtureOptions, generate
from rmqstore.store import Store

from campaigns import campaign_random, child_env, repair_outcome, rounds, seed_note
from support import assert_reported_are_stored, failing_disk, mounted_copy, run_cli, serving

CUTS = rounds(short=2, long=40)
SYNCS = ("fsync", "fdatasync", "msync", "syncfs")
DISK = {"holds": "200m", "size": "160m", "options": "commit=300"}  # a disk that does not fail

pytestmark = pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")


def sync_counts(command: list[str], where: Path) -> dict[str, int]:
    """How many times ``rmqstore COMMAND`` calls each sync (``strace -c``), run in full."""
    summary = where / "syncs.txt"
    done = subprocess.run(
        ["strace", "-f", "-qq", "-c", "-o", str(summary), "-e", f"trace={','.join(SYNCS)}",
         sys.executable, "-m", "rmqstore", *command],
        capture_output=True, env=child_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    counts = {}
    for line in summary.read_text().splitlines():
        fields = line.split()
        if fields and fields[-1] in SYNCS:
            counts[fields[-1]] = int(fields[3])
    return counts


def cut_at(command: list[str], sync: str, number: int, stdout: Path | None = None) -> None:
    """``rmqstore COMMAND`` killed as it enters its ``number``-th call of ``sync``."""
    with open(stdout or "/dev/null", "wb") as out:
        subprocess.run(
            ["strace", "-f", "-qq", "-o", "/dev/null", "-e", f"trace={sync}",
             "-e", f"inject={sync}:signal=KILL:when={number}",
             sys.executable, "-m", "rmqstore", *command],
            stdout=out, stderr=subprocess.DEVNULL, env=child_env(), timeout=300,
        )  # fmt: skip


def choose_cut(counts: dict[str, int], rng) -> tuple[str, int]:
    sync = rng.choice(sorted(counts))
    return sync, rng.randint(1, counts[sync])


def cuts_run_again_give_the_uncut_outcome(
    tmp_path: Path,
    source: Path,
    command: Callable[[Path], list[str]],
    outcome: Callable[[Path], dict[str, str]],
    label: str,
    finished: Callable[[Path], bool] = lambda _store: False,
    *,
    broker_starts: bool = False,
) -> dict[str, str]:
    """``command`` on copies of ``source`` (none when it does not exist: the command makes
    the store), each cut at one of its syncs; on the disk each cut leaves, the command run
    again (unless ``finished`` says the cut came after it) gives the ``outcome`` of a run
    never cut, which is returned.

    ``broker_starts``: on the disk each cut leaves, a broker's start puts back every unit
    that is not there (see :func:`_a_broker_start_puts_back_what_is_missing`). Run again,
    a dispatch resumes from what the queue files hold, whatever the checkpoint says: that
    alone did not tell a checkpoint made durable before the units it vouches for."""
    rng = campaign_random(label)
    with failing_disk(tmp_path, **DISK) as (disk, image):
        reference = disk / "reference"
        if source.exists():
            shutil.copytree(source, reference)
        counts = sync_counts(command(reference), tmp_path)
        expected = outcome(reference)
        for cut in range(CUTS):
            store = disk / f"cut-{cut}"
            if source.exists():
                shutil.copytree(source, store)
            subprocess.run(["sync"], check=True)  # the store before the command: not in question
            sync, number = choose_cut(counts, rng)
            cut_at(command(store), sync, number)
            where = f"cut {cut} at {sync} {number}{seed_note()}"
            with mounted_copy(image, tmp_path) as after:
                kept = after / store.name
                if broker_starts:
                    _a_broker_start_puts_back_what_is_missing(kept, where)
                if not finished(kept):
                    again = run_cli(*command(kept))
                    assert again.exit_code == 0, f"{where}: {again.stderr}"
                got = outcome(kept)
                assert got == expected, (
                    f"{where}: {sorted(set(got.items()) ^ set(expected.items()))[:4]}"
                )
            shutil.rmtree(store, ignore_errors=True)
    return expected


def _a_broker_start_puts_back_what_is_missing(store: Path, where: str) -> None:
    """With 'abort', a broker's crash recovery dispatches the commit log again from the file
    the checkpoint picks; without, it dispatches only what follows the queues' reach. A
    record before that point whose units are not on the disk (``dispatch-lag`` or
    ``dispatch-hole`` at its offset) has lost them for good: its checkpoint or its 'abort'
    was made durable before them."""
    with Store.open_read(store) as opened:
        if opened.aborted:
            start = opened.commitlog.recovery_start(opened.checkpoint(), True)
            replayed_from = start.start if start is not None else 0
        else:
            replayed_from = max(0, queue_reach(opened) or 0)
    checked = run_cli("verify", store, "--json", "--max-findings", "1000000")
    lost = [
        finding
        for finding in json.loads(checked.stdout)["findings"]
        if finding["kind"] in ("dispatch-lag", "dispatch-hole")
        and finding["commitLogOffset"] is not None
        and finding["commitLogOffset"] < replayed_from
    ]
    assert not lost, f"{where}: a broker replays from {replayed_from}: {lost[:2]}"


@pytest.mark.campaign
@pytest.mark.parametrize(
    ("scenario", "command"),
    [("multi", ["dispatch", "--rebuild", "--yes"]), ("abort-left", ["recover", "--yes"])],
)
def test_a_repair_cut_by_a_power_cut_run_again_gives_the_same_files(
    tmp_path: Path, scenario: str, command: list[str]
) -> None:
    source = tmp_path / "source"
    generate(scenario, source, FixtureOptions(seed=3, messages=5_000))
    cuts_run_again_give_the_uncut_outcome(
        tmp_path,
        source,
        lambda store: [command[0], str(store), *command[1:]],
        repair_outcome,
        f"power-cut-{scenario}",
    )


@pytest.mark.campaign
def test_a_dispatch_cut_by_a_power_cut_run_again_gives_the_same_files(tmp_path: Path) -> None:
    """``dispatch`` of a store appended to without ``--dispatch`` (12 queues of small files,
    so they roll, 400 LMQ queues of a file each, made durable by one syncfs where it is
    trusted, and small index files), cut at one of its syncs: on the copy, dispatch run
    again gives the consume queues, index and checkpoint a run never cut gives."""
    source = tmp_path / "source"
    # two appends 3.5 s apart: the second commit-log file starts with records of the first,
    # stored more than the 3 s a broker's recovery allows before the checkpoint's times, so
    # once the dispatch's checkpoint is on the disk a broker replays only the second file
    for first, last in ((0, 3_700), (3_700, 4_000)):
        lines = tmp_path / f"in-{first}.jsonl"
        with open(lines, "w", encoding="utf-8") as out:
            for number in range(first, last):
                copies = {"INNER_MULTI_DISPATCH": f"%LMQ%d{number % 400}"}
                message = {"topic": f"T{number % 3}", "queueId": number % 4,
                           "keys": f"k{number}", "body": f"{number:06d}" + "y" * 200,
                           "properties": copies}  # fmt: skip
                out.write(json.dumps(message) + "\n")
        if first:
            time.sleep(3.5)
        made = run_cli("append", source, "--create", "--multi-dispatch",
                       "--commitlog-file-size", str(1 << 20),
                       "--consumequeue-file-size", "2000", "--index-slots", "100",
                       "--index-entries", "400", "--input", lines)  # fmt: skip
        assert made.exit_code == 0, made.stderr
    assert len(list((source / "commitlog").iterdir())) == 2
    cuts_run_again_give_the_uncut_outcome(
        tmp_path,
        source,
        lambda store: ["dispatch", str(store), "--index-slots", "100", "--index-entries", "400"],
        repair_outcome,
        "power-cut-dispatch",
        broker_starts=True,
    )


@pytest.mark.campaign
@pytest.mark.parametrize(
    "policy",
    [
        ["--flush", "sync"],
        ["--flush", "async", "--flush-interval", "20"],
        ["--flush", "async", "--transient-store-pool", "--commit-interval", "10"],
    ],
    ids=["sync", "async", "transient"],
)
def test_no_reported_message_is_lost_to_a_power_cut_during_append(
    tmp_path: Path, policy: list[str]
) -> None:
    """``append --dispatch`` cut at one of its syncs: on the copy ``recover`` makes the store
    sound, what it holds is the input's first messages in order (no hole, nothing out of
    order, whatever the flush policy), and with ``--flush sync`` every message reported."""
    lines = tmp_path / "in.jsonl"
    with open(lines, "w", encoding="utf-8") as out:
        for number in range(3_000):
            out.write(json.dumps({"topic": "T", "body": f"{number:06d}" + "x" * 500}) + "\n")
    rng = campaign_random(f"power-cut-append-{'-'.join(policy)}")
    with failing_disk(tmp_path, **DISK) as (disk, image):

        def append(store: Path) -> list[str]:
            return ["append", str(store), "--create", "--commitlog-file-size", str(1 << 20),
                    *policy, "--dispatch", "--input", str(lines), "--jsonl"]  # fmt: skip

        counts = sync_counts(append(disk / "reference"), tmp_path)
        for cut in range(CUTS):
            store = disk / f"cut-{cut}"
            sync, number = choose_cut(counts, rng)
            reported_file = tmp_path / f"reported-{cut}.jsonl"
            cut_at(append(store), sync, number, reported_file)
            reported = [json.loads(line) for line in reported_file.read_text().splitlines()
                        if line.endswith("}")]  # fmt: skip
            where = f"cut {cut} at {sync} {number}, {len(reported)} reported{seed_note()}"
            with mounted_copy(image, tmp_path) as after:
                kept = after / store.name
                if not reported and not (kept / "commitlog").is_dir():
                    continue  # cut before the store was made
                recovered = run_cli("recover", kept, "--yes")
                assert recovered.exit_code == 0, f"{where}: {recovered.stderr}"
                if "sync" in policy:
                    assert_reported_are_stored(kept, reported, where)
                read = run_cli("read", kept, "--from-offset", "0", "--jsonl", "--body", "text")
                numbers = [int(json.loads(line)["body"][:6]) for line in read.stdout.splitlines()]
                assert numbers == list(range(len(numbers))), where
            shutil.rmtree(store, ignore_errors=True)


@pytest.mark.campaign
def test_a_restore_cut_by_a_power_cut_run_again_gives_the_store_before_the_recovery(
    tmp_path: Path,
) -> None:
    """``quarantine restore`` of a recovery that cut a torn tail, cut at one of its syncs:
    on the copy, the restore run again (unless the cut came after it) leaves the commit log,
    consume queues, index and checkpoint as before the recovery, and 'abort' there again."""

    def undone(store: Path) -> dict[str, str]:
        return {**repair_outcome(store), "abort": str((store / "abort").exists())}

    source = tmp_path / "source"
    generate("torn-tail", source, FixtureOptions(seed=3, messages=5_000))
    expected = undone(source)
    assert run_cli("recover", source, "--yes").exit_code == 0
    (folder,) = json.loads(run_cli("quarantine", "list", source, "--json").stdout)["folders"]

    def restore(store: Path) -> list[str]:
        return ["quarantine", "restore", str(store), folder["name"], "--yes"]

    uncut = cuts_run_again_give_the_uncut_outcome(
        tmp_path,
        source,
        restore,
        undone,
        "power-cut-restore",
        finished=lambda store: not (store / "quarantine" / folder["name"]).exists(),
    )
    assert uncut == expected


@pytest.mark.campaign
@pytest.mark.parametrize("over", ["directory", "ha"])
def test_a_replicate_cut_by_a_power_cut_run_again_gives_the_same_replica(
    tmp_path: Path, over: str
) -> None:
    """``replicate`` into a new replica, from a store directory or over HA from ``serve-ha``,
    cut at one of its syncs: on the copy, replicate run again gives the replica a run never
    cut gives (commit log, consume queues, index, checkpoint), and no 'abort' left."""
    master = tmp_path / "master"
    generate("multi", master, FixtureOptions(seed=3, messages=5_000))

    def replica(store: Path) -> dict[str, str]:
        return {**repair_outcome(store), "abort": str((store / "abort").exists())}

    with serving(master) if over == "ha" else nullcontext(str(master)) as source:
        cuts_run_again_give_the_uncut_outcome(
            tmp_path,
            tmp_path / "no such store",
            lambda dest: ["replicate", source, str(dest), "--commitlog-file-size", "65536"],
            replica,
            f"power-cut-replicate-{over}",
        )
