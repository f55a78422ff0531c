"""Hostile stores and a hostile machine: links out of the store, FIFOs and huge files where
store files should be, a full disk, a store a broker holds. Each ends in a one-line error and a
documented exit code, with nothing written outside the store."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rmqstore.fixtures import FixtureOptions, generate

from support import (
    assert_reported_are_stored,
    disk_left_with,
    failing_disk,
    inodes_left_with,
    lock_held_elsewhere,
    mounted_copy,
    peak_rss_mib,
    run_cli,
    small_filesystem,
    tree_digest,
)


def small_store(tmp_path: Path, count: int = 20, *, dispatch: bool = True) -> Path:
    store = tmp_path / "store"
    lines = tmp_path / "in.jsonl"
    lines.write_text((json.dumps({"topic": "T", "keys": "k", "body": "x" * 200}) + "\n") * count)
    args = ["append", store, "--create", "--commitlog-file-size", "4096", "--input", lines]
    result = run_cli(*args, *(["--dispatch"] if dispatch else []))
    assert result.exit_code == 0, result.stderr
    return store


def one_line_error(result, code: int) -> None:
    assert result.exit_code == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("rmqstore: error: "), result.stderr
    assert "Traceback" not in result.stderr


def writers_refuse(store: Path, topic: str, said: str) -> None:
    """Every writer, and every dry run, exits 2 in one line saying ``said``; so does a
    replication from the store, before it makes its DEST."""
    replica = store.parent / f"{store.name}-replica"
    for command in (
        ["replicate", store, replica],
        ["append", store, "--topic", topic, "--body", "y"],
        ["dispatch", store],
        ["dispatch", store, "--dry-run"],
        ["dispatch", store, "--rebuild", "--yes"],
        ["dispatch", store, "--rebuild", "--dry-run"],
        ["recover", store, "--yes"],
        ["recover", store, "--dry-run"],
        ["flush", store],
    ):
        result = run_cli(*command)
        one_line_error(result, 2)
        assert said in result.stderr, command
    assert not replica.exists()


@pytest.mark.parametrize("what", ["segment", "checkpoint", "abort", "index", "consumequeue"])
def test_writers_refuse_links_leading_out_of_the_store(tmp_path: Path, what: str) -> None:
    store = small_store(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    if what == "segment":
        last = sorted((store / "commitlog").iterdir())[-1]
        (outside / last.name).write_bytes(last.read_bytes())
        last.unlink()
        last.symlink_to(outside / last.name)
    elif what == "abort":
        (store / "abort").symlink_to(outside / "abort")  # dangling: it would be created there
    elif what == "checkpoint":
        (outside / "checkpoint").write_bytes((store / "checkpoint").read_bytes())
        (store / "checkpoint").unlink()
        (store / "checkpoint").symlink_to(outside / "checkpoint")
    else:
        (store / what).rename(outside / what)
        (store / what).symlink_to(outside / what)
    before = tree_digest(outside)
    for command in (["append", store, "--topic", "T", "--body", "y"], ["dispatch", store],
                    ["recover", store, "--yes"], ["flush", store]):  # fmt: skip
        result = run_cli(*command)
        one_line_error(result, 2)
        assert "symbolic link" in result.stderr
    # verify names the link and gives no command as the next step (it named recover or
    # dispatch, which refuse the store: a script following it ran them for ever)
    report = json.loads(run_cli("verify", store, "--json").stdout)
    links = [f for f in report["findings"] if f["kind"] == "store-link"]
    assert [(f["severity"], f["fix"]) for f in links] == [("warning", "none: report only")]
    assert report["nextStep"] is None
    plain = run_cli("verify", store)
    assert (
        "next step: put the real file or folder where each store-link finding names a link "
        "(rmqstore's writers refuse the store until then); verify again"
        in plain.stdout.replace("\n", " ")
    )
    assert tree_digest(outside) == before
    assert not (outside / "abort").exists()


@pytest.mark.plumbing
def test_writers_refuse_a_store_sharing_its_files_by_hard_links(tmp_path: Path) -> None:
    """A copy made with ``cp -al`` shares every file's bytes with the store it was made from:
    a recover of the copy used to truncate the other store's commit log and index too (its
    cut bytes quarantined only in the copy). Every writer now refuses it in one line before
    anything changes, on either side; verify names each shared file and no command."""
    original = tmp_path / "original"
    generate("torn-tail", original, FixtureOptions(seed=2))
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-al", str(original), str(copy)], check=True)
    before, copy_before = tree_digest(original), tree_digest(copy)
    source = tmp_path / "source"
    shutil.copytree(original, source)
    for command in (
        ["recover", copy, "--yes"],
        ["recover", copy, "--dry-run"],
        ["dispatch", copy],
        ["dispatch", copy, "--rebuild", "--yes"],
        ["flush", copy],
        ["append", copy, "--topic", "TopicTest", "--body", "y"],
        ["replicate", source, copy],
    ):
        result = run_cli(*command)
        one_line_error(result, 2)
        assert "hard links" in result.stderr and "cp -a" in result.stderr, command
    assert tree_digest(original) == before and tree_digest(copy) == copy_before
    report = json.loads(run_cli("verify", copy, "--json").stdout)
    shared = {f["file"] for f in report["findings"] if f["kind"] == "store-shared"}
    assert {"checkpoint", "commitlog/00000000000000000000"} <= shared
    assert any(name.startswith("consumequeue/") for name in shared)
    assert any(name.startswith("index/") for name in shared)
    assert report["nextStep"] is None
    # given files of its own (cp -a), the copy recovers, and the original is as it was
    fresh = tmp_path / "fresh"
    shutil.copytree(original, fresh)
    assert run_cli("recover", fresh, "--yes").exit_code == 0
    assert tree_digest(original) == before


@pytest.mark.plumbing
def test_a_consume_queue_file_shared_by_a_hard_link_is_never_written(tmp_path: Path) -> None:
    """Consume-queue files are not looked at when a writer opens the store (a store may hold
    thousands): one with another hard link is refused by the plans of recover and of
    quarantine restore, before anything changes, and where a dispatch is about to write it,
    with nothing written there. A shared checkpoint is refused on opening (flush)."""
    store = tmp_path / "store"
    generate("torn-tail", store, FixtureOptions(seed=2))
    outside = tmp_path / "outside"
    outside.mkdir()
    report = json.loads(run_cli("verify", store, "--json").stdout)
    (beyond,) = [f["file"] for f in report["findings"] if f["kind"] == "cq-beyond-log"]
    queue_file = store / beyond.split("@")[0]  # holding the torn record's unit: cut by recover
    os.link(queue_file, outside / "linked")
    before = tree_digest(tmp_path)
    result = run_cli("recover", store, "--yes")
    one_line_error(result, 2)
    assert f"{queue_file} has 2 hard links" in result.stderr
    assert tree_digest(tmp_path) == before
    # a dispatch writing the queue's last unit again: refused there, the shared file unchanged
    unlinked = tmp_path / "unlinked"
    shutil.copytree(store, unlinked)
    assert run_cli("recover", unlinked, "--yes").exit_code == 0
    os.link(unlinked / "checkpoint", outside / "checkpoint")
    one_line_error(run_cli("flush", unlinked), 2)  # the checkpoint, looked at on opening
    os.unlink(outside / "checkpoint")
    relinked = unlinked / queue_file.relative_to(store)
    # the recover's quarantine going back: its cut of the queue file would be written back
    (folder,) = os.listdir(unlinked / "quarantine")
    os.link(relinked, outside / "relinked")
    restoring = tree_digest(tmp_path)
    result = run_cli("quarantine", "restore", unlinked, folder, "--yes")
    one_line_error(result, 2)
    assert f"{relinked} has 2 hard links" in result.stderr
    assert tree_digest(tmp_path) == restoring
    os.unlink(outside / "relinked")
    units = relinked.read_bytes()
    last_unit = max(at for at in range(0, len(units), 20) if any(units[at : at + 20]))
    with open(relinked, "r+b") as handle:  # the queue one unit behind the log
        handle.seek(last_unit)
        handle.write(bytes(20))
    os.link(relinked, outside / "relinked")
    (unlinked / "abort").touch()  # as a crash leaves it: the replay starts before the unit
    shared_before = relinked.read_bytes()
    result = run_cli("dispatch", unlinked)
    one_line_error(result, 2)
    assert f"{relinked} has 2 hard links" in result.stderr
    assert (outside / "relinked").read_bytes() == shared_before
    os.unlink(outside / "relinked")  # its own again: the dispatch puts the unit back
    assert run_cli("dispatch", unlinked).exit_code == 0
    assert relinked.read_bytes() == units


@pytest.mark.parametrize("what", ["topic", "queue"])
def test_append_refuses_a_linked_queue_whose_offsets_it_cannot_learn(
    tmp_path: Path, what: str
) -> None:
    """A topic's or queue's consume-queue folder that is a link: append cannot learn that
    queue's next offset (rmqstore follows no link there), so it refuses before writing (it
    used to start the queue again at offset 0, a second record at each offset); the rebuild
    moves the link to quarantine, and appending then continues the queue."""
    store = small_store(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    moved = store / "consumequeue" / "T" if what == "topic" else store / "consumequeue" / "T" / "0"
    moved.rename(outside / "moved")
    moved.symlink_to(outside / "moved")
    before, outside_before = tree_digest(store), tree_digest(outside)
    result = run_cli("append", store, "--topic", "T", "--body", "y", "--dispatch")
    one_line_error(result, 2)
    assert "is a symbolic link" in result.stderr and "--rebuild" in result.stderr
    assert tree_digest(store) == before and tree_digest(outside) == outside_before
    assert run_cli("dispatch", store, "--rebuild", "--yes").exit_code == 0
    appended = run_cli("append", store, "--topic", "T", "--body", "y", "--dispatch", "--json")
    assert appended.exit_code == 0, appended.stderr
    assert json.loads(appended.stdout)["messages"][0]["queueOffset"] == 20
    assert run_cli("verify", store).exit_code == 0
    assert tree_digest(outside) == outside_before


def test_fixtures_force_refuses_a_held_store_and_quarantines_what_it_replaces(
    tmp_path: Path,
) -> None:
    out = tmp_path / "fixture"
    assert run_cli("fixtures", "generate", "multi", out).exit_code == 0
    before = tree_digest(out)
    with lock_held_elsewhere(out / "lock"):
        held = run_cli("fixtures", "generate", "multi", out, "--force")
    one_line_error(held, 3)
    assert tree_digest(out) == before
    replaced = run_cli("fixtures", "generate", "txn", out, "--force")
    assert replaced.exit_code == 0, replaced.stderr
    (moved,) = (out / "quarantine").iterdir()
    kept = tree_digest(moved)
    for name, digest in before.items():  # every file of the old store, as it was
        assert (out / name if name == "lock" else moved / name).exists()  # the lock stays
        assert name == "lock" or kept[name] == digest


@pytest.mark.plumbing
def test_a_fifo_checkpoint_does_not_hang_any_command(tmp_path: Path) -> None:
    store = small_store(tmp_path)
    (store / "checkpoint").unlink()
    os.mkfifo(store / "checkpoint")
    for command in (["info", store], ["verify", store], ["recover", store, "--dry-run"],
                    ["append", store, "--topic", "T", "--body", "y"]):  # fmt: skip
        result = subprocess.run(
            [sys.executable, "-m", "rmqstore", *map(str, command)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode in (1, 2), result.stderr
        assert "not a regular file" in result.stderr or result.returncode == 1


def test_huge_sparse_files_are_not_read_whole(tmp_path: Path) -> None:
    """An 8 GiB sparse checkpoint and a 4 GiB consume-queue file: a clear error or finding,
    in memory that does not grow with the file."""
    store = small_store(tmp_path)
    with open(store / "checkpoint", "r+b") as handle:
        handle.truncate(8 << 30)
    code, peak = peak_rss_mib(["info", str(store)])
    assert code == 2 and peak < 300
    with open(store / "checkpoint", "r+b") as handle:
        handle.truncate(4096)
    (queue_file,) = (store / "consumequeue" / "T" / "0").iterdir()
    with open(queue_file, "r+b") as handle:
        handle.truncate(4 << 30)
    code, peak = peak_rss_mib(["verify", str(store)])
    assert code in (1, 2) and peak < 300


def test_inputs_that_never_end_are_read_no_further_than_a_message_takes(
    tmp_path: Path,
) -> None:
    """/dev/zero as a body file, an input of one endless line, a broker config: exit 2 in
    one line once more than a message (or a config) can take has been read, in memory that
    does not grow with the input, the store unchanged (they used to be read until memory ran
    out: exit 70, or a hang)."""
    store = small_store(tmp_path)
    before = tree_digest(store)
    for command, said in (
        (["append", str(store), "--topic", "T", "--body-file", "/dev/zero"], "more than 4194304"),
        (["append", str(store), "--input", "/dev/zero"], "/dev/zero line 1: longer than"),
        (["info", str(store), "--broker-config", "/dev/zero"], "longer than 4194304 bytes"),
    ):
        code, peak = peak_rss_mib(command)
        assert code == 2 and peak < 300, (command, code, peak)
        result = run_cli(*command)
        one_line_error(result, 2)
        assert said in result.stderr, result.stderr
    conf = tmp_path / "broker.conf"
    conf.write_text("maxMessageSize=1024\n")
    long_line = tmp_path / "long.jsonl"  # a whole line, but more than 1024 bytes take as JSON
    long_line.write_text(json.dumps({"topic": "T", "body": "x" * (2 << 20)}) + "\n")
    for flush in ("sync", "async"):
        result = run_cli("append", store, "--broker-config", conf, "--flush", flush,
                         "--input", long_line)  # fmt: skip
        one_line_error(result, 2)
        assert "long.jsonl line 1: longer than 1054720 bytes" in result.stderr, result.stderr
    assert tree_digest(store) == before


@pytest.mark.plumbing
def test_store_manifests_that_are_fifos_or_not_objects_are_refused(tmp_path: Path) -> None:
    store = small_store(tmp_path)
    folder = store / "quarantine" / "20240101T000000-recover"
    folder.mkdir(parents=True)
    os.mkfifo(folder / "manifest.json")
    listed = subprocess.run(
        [sys.executable, "-m", "rmqstore", "quarantine", "list", str(store), "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert listed.returncode == 0 and not json.loads(listed.stdout)["folders"][0]["manifestOk"]
    fixture = tmp_path / "fixture"
    fixture.mkdir()
    os.mkfifo(fixture / "fixture.json")
    for command in (["quarantine", "restore", str(store), folder.name, "--yes"],
                    ["fixtures", "describe", "basic", str(fixture)]):  # fmt: skip
        result = subprocess.run(
            [sys.executable, "-m", "rmqstore", *command], capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    (folder / "manifest.json").unlink()
    for pieces in ([5], "abc", {"a": 1}, [{"copy": "commitlog/x.7-3.bin"}]):
        (folder / "manifest.json").write_text(json.dumps({"pieces": pieces}))
        one_line_error(run_cli("quarantine", "restore", store, folder.name, "--yes"), 2)
    (fixture / "fixture.json").unlink()
    (fixture / "fixture.json").write_text("[1]")
    one_line_error(run_cli("fixtures", "describe", "basic", fixture), 2)


@pytest.mark.plumbing
def test_a_full_disk_is_exit_4_not_a_bus_error(tmp_path: Path) -> None:
    """Groups of 1024 messages are fsynced, dispatched and acknowledged until the 4 MiB disk
    is full: the command ends with exit 4, and recovery keeps every acknowledged message."""
    with small_filesystem(tmp_path, "4m") as disk:
        store = disk / "store"
        lines = tmp_path / "in.jsonl"
        lines.write_text((json.dumps({"topic": "T", "body": "x" * 1000}) + "\n") * 6000)
        result = subprocess.run(
            [sys.executable, "-m", "rmqstore", "append", str(store), "--create",
             "--commitlog-file-size", "262144", "--consumequeue-file-size", "20000",
             "--index-slots", "1000", "--index-entries", "4000",
             "--input", str(lines), "--flush", "sync", "--jsonl", "--dispatch"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert result.returncode == 4, result.stderr
        assert "Traceback" not in result.stderr and "No space left" in result.stderr
        acknowledged = [json.loads(line) for line in result.stdout.splitlines()]
        assert acknowledged  # some groups made it before the disk filled
        recovered = subprocess.run(
            [sys.executable, "-m", "rmqstore", "recover", str(store), "--yes"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert recovered.returncode in (0, 1, 4), recovered.stderr
        assert "Traceback" not in recovered.stderr
        read = subprocess.run(
            [sys.executable, "-m", "rmqstore", "read", str(store), "--from-offset", "0",
             "--jsonl"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        stored = {json.loads(line)["msgId"] for line in read.stdout.splitlines()}
        assert {ack["msgId"] for ack in acknowledged} <= stored  # no acknowledged loss


def test_append_dispatch_stopped_after_the_records_does_not_call_the_store_unchanged(
    tmp_path: Path,
) -> None:
    """``append --dispatch`` whose records are durable but whose dispatch cannot make a queue
    file (no file left to make on the disk): the error ended "dispatch stopped before it
    changed the store", though the append had (found by the full-disk campaign, seed 8). It
    now says the dispatch changed nothing more; the records are there, under 'abort' for a
    broker's start (or rmqstore dispatch) to put into the queues."""
    with small_filesystem(tmp_path, "8m") as disk:
        store = disk / "store"
        created = run_cli(
            "append", store, "--create", "--commitlog-file-size", "65536", "--topic", "Old",
            "--body", "x",
        )  # fmt: skip
        assert created.exit_code == 0, created.stderr
        lines = tmp_path / "in.jsonl"
        lines.write_text((json.dumps({"topic": "New", "body": "y" * 100}) + "\n") * 10)
        with inodes_left_with(disk, 0):
            result = run_cli("append", store, "--dispatch", "--input", lines, "--jsonl")
        one_line_error(result, 4)
        assert "No space left" in result.stderr and "/consumequeue/" in result.stderr
        assert result.stderr.strip().endswith(
            "(10 more were stored durably but not reported (find them with rmqstore read)); "
            "dispatch stopped before it changed anything more"
        ), result.stderr
        assert (store / "abort").exists()
        read = run_cli("read", store, "--from-offset", "0", "--jsonl")
        assert [json.loads(line)["topic"] for line in read.stdout.splitlines()] == [
            "Old", *["New"] * 10
        ]  # fmt: skip


@pytest.mark.plumbing
def test_a_fixture_that_fills_the_disk_is_exit_4_and_leaves_nothing(tmp_path: Path) -> None:
    """A generation stopped by a full disk took OUT to the last byte and left it there (a
    half-made store, no manifest); it is removed, the folders made for OUT with it, and an
    empty OUT is empty again. A count whose records alone cannot fit is refused before
    anything is made (--messages 9223372036854775808 wrote on until the disk was full)."""
    with small_filesystem(tmp_path, "8m") as disk:
        for out in (disk / "made" / "store", disk / "empty"):
            if out.name == "empty":
                out.mkdir()
            result = run_cli("fixtures", "generate", "multi", out, "--messages", "70000")
            one_line_error(result, 4)
            assert "No space left" in result.stderr
            assert sorted(p.name for p in disk.iterdir()) == (
                ["empty"] if out.name == "empty" else []
            )
            assert not out.exists() or not any(out.iterdir())
        huge = run_cli("fixtures", "generate", "multi", disk / "huge", "--messages", str(2**63))
        one_line_error(huge, 2)
        assert "needs at least" in huge.stderr and not (disk / "huge").exists()
        made = run_cli("fixtures", "generate", "multi", disk / "fits", "--messages", "100")
        assert made.exit_code == 0, made.stderr


@pytest.mark.plumbing
@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_an_export_to_a_full_disk_is_exit_4_and_leaves_nothing(tmp_path: Path, fmt: str) -> None:
    """Part files that do not fit: one line naming the destination and the full disk, exit
    4, and no destination or staging directory left behind; the store is untouched."""
    store = tmp_path / "store"
    lines = tmp_path / "in.jsonl"
    with lines.open("w") as out:
        for _ in range(3000):  # bodies that do not compress: 3 MB against a 256 KiB disk
            out.write(json.dumps({"topic": "T", "body": os.urandom(500).hex()}) + "\n")
    created = run_cli("append", store, "--create", "--commitlog-file-size", str(1 << 20),
                      "--input", lines)  # fmt: skip
    assert created.exit_code == 0, created.stderr
    before = tree_digest(store)
    with small_filesystem(tmp_path, "256k") as disk:
        result = subprocess.run(
            [sys.executable, "-m", "rmqstore", "export", str(store), "--to", str(disk / "out"),
             "--format", fmt, "--engine", "local"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert result.returncode == 4, result.stderr
        error = result.stderr.strip().splitlines()[-1]
        assert error.startswith(f"rmqstore: error: cannot write {disk / 'out'}"), error
        assert "No space left" in error and "Traceback" not in result.stderr
        assert list(disk.iterdir()) == []
    assert tree_digest(store) == before


@pytest.mark.plumbing
@pytest.mark.parametrize("unbuffered", [False, True])
def test_output_a_full_disk_cuts_short_is_exit_4_in_one_line(
    tmp_path: Path, unbuffered: bool
) -> None:
    """stdout redirected to a file on a disk that fills up: exit 4 in one line naming the
    full disk, for output written in lines (``read --jsonl``) and documents printed whole
    (``info --json``, ``stats --json``, ``dump``), and under PYTHONUNBUFFERED too (many
    container images set it). ``info --json`` and ``stats --json`` exited 0 with their
    first 4 KiB under it, and 120 after Python's "Exception ignored" lines without it."""
    store = tmp_path / "store"
    generate("multi", store)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    commands = [
        ["info", store, "--json"],
        ["stats", store, "--json", "--engine", "local"],
        ["dump", next((store / "commitlog").iterdir())],
        ["read", store, "--from-offset", "0", "--jsonl"],
        ["read", store, "--from-offset", "0", "--json"],
        ["verify", "--help"],
    ]
    for command in commands:  # each writes more than the disk will take
        whole = subprocess.run(
            [sys.executable, "-m", "rmqstore", *map(str, command)], capture_output=True, env=env
        )
        assert whole.returncode == 0 and len(whole.stdout) > 4096, command
    with small_filesystem(tmp_path, "4k") as disk:
        for command in commands:
            with open(disk / "out", "wb") as out:
                done = subprocess.run(
                    [sys.executable, "-m", "rmqstore", *map(str, command)],
                    stdout=out, stderr=subprocess.PIPE, text=True, env=env, timeout=120,
                )  # fmt: skip
            lines = [line for line in done.stderr.splitlines() if "engine: local" not in line]
            assert done.returncode == 4, (command, done.stderr)
            assert len(lines) == 1 and lines[0].startswith("rmqstore: error: I/O failure"), (
                command,
                done.stderr,
            )
            assert "No space left on device" in lines[0]
            (disk / "out").unlink()


def test_a_command_started_with_its_output_closed_runs_with_it_discarded(tmp_path: Path) -> None:
    """stdout or stderr closed by the caller (``>&-``): the command runs, its output
    discarded, with its exit code, no traceback, and no file of the store opened where the
    output goes; stdin closed reads as empty. ``info`` and ``read`` were an internal error
    (exit 70), ``--version`` a traceback, ``append --input -`` an internal error."""
    store = small_store(tmp_path)

    def run(*args: str | Path, closed: int) -> subprocess.CompletedProcess[str]:
        kept = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
        kept.pop({0: "stdin", 1: "stdout", 2: "stderr"}[closed], None)
        return subprocess.run(
            [sys.executable, "-m", "rmqstore", *map(str, args)],
            preexec_fn=lambda: os.close(closed), text=True, timeout=120, **kept,
        )  # fmt: skip

    for args in [["info", store, "--json"], ["info", store], ["--version"],
                 ["read", store, "--from-offset", "0", "--jsonl"],
                 ["stats", store, "--json", "--engine", "local"]]:  # fmt: skip
        done = run(*args, closed=1)
        assert done.returncode == 0 and "Traceback" not in done.stderr, (args, done.stderr)
    appended = run("append", tmp_path / "new", "--create", "--topic", "T", "--body", "x", closed=1)
    assert appended.returncode == 0, appended.stderr
    read = run_cli("read", tmp_path / "new", "--offset", "0", "--json")
    assert read.exit_code == 0 and json.loads(read.stdout)["body"] == "x", read.stderr
    assert run("read", store, "--offset", "99999999", closed=2).returncode == 2
    # stdin closed: an input of no messages, as an empty one
    nothing = run("append", tmp_path / "none", "--create", "--topic", "T", "--input", "-", closed=0)
    assert nothing.returncode == 0 and "appended 0 messages" in nothing.stderr, nothing.stderr
    assert run("info", store, "--json", closed=2).stdout.startswith("{")


def test_every_writer_refuses_a_held_store_and_changes_nothing(tmp_path: Path) -> None:
    store = small_store(tmp_path, dispatch=False)
    before = tree_digest(store)
    writers = [
        ["append", store, "--topic", "T", "--body", "y"],
        ["dispatch", store],
        ["dispatch", store, "--rebuild", "--yes"],
        ["recover", store, "--yes"],
        ["flush", store],
    ]
    with lock_held_elsewhere(store / "lock"):
        for command in writers:
            one_line_error(run_cli(*command), 3)
    assert tree_digest(store) == before


@pytest.mark.plumbing
@pytest.mark.parametrize("command", [["dispatch", "--rebuild", "--yes"], ["recover", "--yes"]])
def test_a_full_disk_during_dispatch_and_recover_is_exit_4(
    tmp_path: Path, command: list[str]
) -> None:
    """The consume queues and index are rebuilt on a disk with no room for them: exit 4 and
    a one-line error; once there is room again, the same command finishes the job."""
    with small_filesystem(tmp_path, "4m") as disk:
        store = disk / "store"
        lines = tmp_path / "in.jsonl"
        lines.write_text((json.dumps({"topic": "T", "body": "x" * 500}) + "\n") * 1000)
        made = run_cli(
            "append", store, "--create", "--commitlog-file-size", "1048576",
            "--consumequeue-file-size", "200000", "--index-slots", "1000",
            "--index-entries", "4000", "--input", lines,
        )  # fmt: skip
        assert made.exit_code == 0, made.stderr
        filler = disk / "filler"
        free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
        filler.write_bytes(bytes(max(0, free - 8192)))
        result = run_cli(command[0], store, *command[1:])
        one_line_error(result, 4)
        assert "No space left" in result.stderr
        filler.unlink()
        again = run_cli(command[0], store, *command[1:])
        assert again.exit_code == 0, again.stderr
        assert run_cli("verify", store).exit_code == 0


@pytest.mark.plumbing
def test_permission_denied_is_exit_4_for_writers_and_nothing_for_readers(tmp_path: Path) -> None:
    """Read-only store files, and a child without root's power to ignore permissions
    (setpriv drops CAP_DAC_OVERRIDE): a writer exits 4 with one line and changes nothing;
    readers are unaffected."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv to take away the power to ignore permissions")
    store = small_store(tmp_path)
    for path in [*store.rglob("*"), store]:
        path.chmod(0o555 if path.is_dir() else 0o444)
    before = tree_digest(store)

    def run_without_override(*command: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [setpriv, "--bounding-set=-dac_override,-dac_read_search", sys.executable, "-m",
             "rmqstore", *command],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    try:
        for command in (["append", str(store), "--topic", "T", "--body", "y"],
                        ["dispatch", str(store)], ["recover", str(store), "--yes"]):  # fmt: skip
            result = run_without_override(*command)
            assert result.returncode == 4, result.stderr
            assert "Permission denied" in result.stderr and "Traceback" not in result.stderr
        assert tree_digest(store) == before
        assert run_without_override("verify", str(store)).returncode == 0
    finally:
        for path in [store, *store.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)


@pytest.mark.plumbing
def test_a_store_on_a_read_only_mount_is_read_in_full_and_written_by_nothing(
    tmp_path: Path,
) -> None:
    """A disk image mounted read-only to look into an incident: every reader and dry run
    works as on a writable disk (none opens ``lock`` or anything else for writing; a
    replica or an export is made elsewhere); every writer exits 4 in one line naming the
    read-only file system."""
    with small_filesystem(tmp_path, "16m") as disk:
        store, lines = disk / "store", tmp_path / "in.jsonl"
        lines.write_text((json.dumps({"topic": "T", "keys": "k", "body": "x" * 200}) + "\n") * 20)
        made = run_cli("append", store, "--create", "--commitlog-file-size", "4096",
                       "--index-slots", "1000", "--index-entries", "2000", "--input", lines,
                       "--dispatch")  # fmt: skip
        assert made.exit_code == 0, made.stderr
        assert subprocess.run(["mount", "-o", "remount,ro", str(disk)]).returncode == 0
        for command in (["info", store, "--json"], ["verify", store],
                        ["read", store, "--from-offset", "0", "--jsonl"],
                        ["read", store, "--topic", "T", "--key", "k"],
                        ["stats", store, "--engine", "local"],
                        ["export", store, "--engine", "local", "--to", tmp_path / "out"],
                        ["recover", store, "--dry-run"], ["dispatch", store, "--dry-run"],
                        ["dispatch", store, "--rebuild", "--dry-run"],
                        ["replicate", store, tmp_path / "replica"]):  # fmt: skip
            result = run_cli(*command)
            wanted = {0, 1} if "--rebuild" in command else {0}  # a rebuild's plan: exit 1
            assert result.exit_code in wanted, (command, result.stderr)
        assert run_cli("quarantine", "list", store).exit_code == 0
        assert (tmp_path / "out").is_dir()
        assert run_cli("verify", tmp_path / "replica").exit_code == 0
        for command in (["append", store, "--topic", "T", "--body", "y"], ["dispatch", store],
                        ["dispatch", store, "--rebuild", "--yes"], ["recover", store, "--yes"],
                        ["flush", store], ["quarantine", "restore", store, "any"]):  # fmt: skip
            result = run_cli(*command)
            one_line_error(result, 4)
            assert "Read-only file system" in result.stderr, (command, result.stderr)


@pytest.mark.plumbing
def test_a_disk_going_bad_under_append_loses_no_reported_message(tmp_path: Path) -> None:
    """The disk fails under a sync append (its device takes no more writes: msync and
    fsync fail, then the file system goes read-only): exit 4 in one line that names the
    failed flush, not what failed after it (the rollback, the checkpoint), and says how far
    the append got; no message reported that was not flushed; 'abort' kept and no
    checkpoint written, where a flush again would have 'succeeded' over lost pages. The
    disk as a crash then leaves it holds every reported message, and recover makes it
    sound without losing one."""
    lines = tmp_path / "in.jsonl"
    with open(lines, "w", encoding="utf-8") as out:
        for number in range(12_000):
            out.write(json.dumps({"topic": "T", "body": f"{number:06d}" + "x" * 1000}) + "\n")
    with failing_disk(tmp_path) as (disk, image):
        store = disk / "store"
        # one commit-log file larger than the device takes: the disk fails at a flush, not
        # at the creation of a file (which a roll would make)
        result = run_cli("append", store, "--create", "--commitlog-file-size", str(32 << 20),
                         "--flush", "sync", "--input", lines, "--jsonl")  # fmt: skip
        one_line_error(result, 4)
        reported = [json.loads(line) for line in result.stdout.splitlines()]
        assert 1_000 < len(reported) < 12_000, result.stderr
        assert "flush failed" in result.stderr, result.stderr
        assert f"{len(reported)} messages were stored and reported" in result.stderr
        assert "'abort' stays and the checkpoint is not moved" in result.stderr
        assert (store / "abort").exists() and not (store / "checkpoint").exists()
        with mounted_copy(image, tmp_path) as crashed:
            kept = crashed / "store"
            for step in (None, ["recover", kept, "--yes"]):
                if step is not None:
                    recovered = run_cli(*step)
                    assert recovered.exit_code == 0, recovered.stderr
                    assert run_cli("verify", kept).exit_code == 0
                assert_reported_are_stored(kept, reported)


@pytest.mark.plumbing
@pytest.mark.parametrize("room", [300_000, 1_200_000])  # in the cut's copy; in the index
def test_a_disk_going_bad_under_recover_loses_nothing(tmp_path: Path, room: int) -> None:
    """The disk fails under ``recover --yes`` of a crashed store with 600 KB of junk after
    its last record (its device takes ``room`` more bytes): exit 4 in one line.
    The disk as a crash then leaves it keeps every message and the junk (in the log or in
    quarantine, whole), and recover run again there makes it sound with both kept."""
    lines = tmp_path / "in.jsonl"
    with open(lines, "w", encoding="utf-8") as out:
        for number in range(3_000):
            message = {"topic": f"T{number % 3}", "keys": f"k{number}", "body": "x" * 1000}
            out.write(json.dumps(message) + "\n")
    junk = bytes(range(1, 256)) * 2_400  # 612,000 bytes, none of them zero
    with failing_disk(tmp_path, holds="64m", size="128m") as (disk, image):
        store = disk / "store"
        made = run_cli("append", store, "--create", "--commitlog-file-size", str(1 << 20),
                       "--input", lines, "--dispatch")  # fmt: skip
        assert made.exit_code == 0, made.stderr
        read = run_cli("read", store, "--from-offset", "0", "--jsonl", "--body", "none")
        messages = [json.loads(line) for line in read.stdout.splitlines()]
        end = messages[-1]["commitLogOffset"] + messages[-1]["storeSize"]
        last = max((store / "commitlog").iterdir())
        with open(last, "r+b") as handle:
            handle.seek(end - int(last.name))
            handle.write(junk)
        (store / "abort").touch()
        os.sync()
        with disk_left_with(image.parent, room):
            result = run_cli("recover", store, "--yes")
        one_line_error(result, 4)
        with mounted_copy(image, tmp_path) as crashed:
            kept = crashed / "store"
            again = run_cli("recover", kept, "--yes")
            assert again.exit_code == 0, again.stderr
            assert run_cli("verify", kept).exit_code == 0
            read = run_cli("read", kept, "--from-offset", "0", "--jsonl", "--body", "none")
            assert [json.loads(line) for line in read.stdout.splitlines()] == messages
            pieces = (kept / "quarantine").glob("*/commitlog/*.bin")
            assert any(piece.read_bytes() == junk for piece in pieces)


@pytest.mark.plumbing
def test_a_flush_the_disk_fails_under_says_so_in_one_line(tmp_path: Path) -> None:
    """``flush`` makes a store's one-file queues and the queues' folders durable with one
    syncfs of their file system (Linux 5.8 and later; an fsync each elsewhere): pages of
    such queues the disk then fails to take are exit 4 in one line naming the flush, and
    the checkpoint is not written over them. (Here the write-back fails as the first sync
    forces a journal commit, which writes the queues' pages first in ext4's ordered mode;
    ``tests/engine/test_flush.py`` counts the syncs.)"""
    lines = "".join(json.dumps({"topic": f"T{n}", "body": "x"}) + "\n" for n in range(40))
    with failing_disk(tmp_path, holds="64m", size="128m") as (disk, image):
        store = disk / "store"
        made = run_cli("append", store, "--create", "--input", "-", "--dispatch", input=lines)
        assert made.exit_code == 0, made.stderr
        os.sync()
        checkpoint = (store / "checkpoint").read_bytes()
        for number in range(4):  # past each queue's one unit, bytes that are no unit
            with open(store / "consumequeue" / f"T{number}" / "0" / f"{0:020d}", "r+b") as file:
                file.seek(4096)
                file.write(b"\xff" * (2 << 20))
        with disk_left_with(image.parent, 0):
            result = run_cli("flush", store)
        one_line_error(result, 4)
        assert "cannot flush" in result.stderr, result.stderr
        assert (store / "checkpoint").read_bytes() == checkpoint


@pytest.mark.plumbing
@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_an_export_is_on_the_disk_when_it_says_it_is_done(tmp_path: Path, fmt: str) -> None:
    """``export --engine local`` onto a disk going bad (its device takes no more writes):
    exit 4 in one line and no export, even after a crash; onto one that takes it, exit 0
    and a crash right after leaves the whole export, byte for byte (it used to say it was
    done with its files still in memory only: a crash lost the export, or left it short)."""
    pytest.importorskip("pyarrow")
    store = small_store(tmp_path, count=1_000, dispatch=False)
    expected = tmp_path / "expected"
    done = run_cli("export", store, "--engine", "local", "--format", fmt, "--to", expected)
    assert done.exit_code == 0, done.stderr
    for room, code in ((0, 4), (40 << 20, 0)):
        with failing_disk(tmp_path, holds="64m", size="128m") as (disk, image):
            with disk_left_with(image.parent, room):
                result = run_cli("export", store, "--engine", "local", "--format", fmt,
                                 "--to", disk / "out")  # fmt: skip
            if code:
                one_line_error(result, code)
            else:
                assert result.exit_code == 0, result.stderr
            with mounted_copy(image, tmp_path) as crashed:
                if code:
                    assert not (crashed / "out").exists()
                    continue
                assert sorted(path.name for path in (crashed / "out").iterdir()) == sorted(
                    path.name for path in expected.iterdir()
                )
                for path in expected.iterdir():
                    assert (crashed / "out" / path.name).read_bytes() == path.read_bytes()


@pytest.mark.parametrize("what", ["consumequeue", "index", "config", "abort", "lock"])
def test_a_file_where_a_folder_should_be_is_refused_before_anything_changes(
    tmp_path: Path, what: str
) -> None:
    """consumequeue/, index/ or config/ a file, abort or lock a folder: every writer says so
    in one line (exit 2) before it writes, where it used to fail part way (exit 4, or a path
    "already exists" inside the file); verify names it and gives no command as the next step."""
    store = small_store(tmp_path)
    (store / "abort").touch()  # a crashed store: recover would cut, dispatch and flush
    folder = store / what
    if folder.is_dir():
        shutil.rmtree(folder)
    elif folder.exists():
        folder.unlink()
    if what in ("abort", "lock"):
        folder.mkdir()
    else:
        folder.write_text("not a folder\n")
    before = tree_digest(store)
    for command in (["append", store, "--topic", "T", "--body", "y"], ["dispatch", store],
                    ["dispatch", store, "--rebuild", "--yes"], ["recover", store, "--yes"],
                    ["flush", store]):  # fmt: skip
        result = run_cli(*command)
        one_line_error(result, 2)
        assert f"{folder} is not a" in result.stderr, (command, result.stderr)
    assert tree_digest(store) == before
    verified = run_cli("verify", store, "--json")
    if what == "lock":
        one_line_error(verified, 2)  # readers check the lock too
        return
    report = json.loads(verified.stdout)
    assert verified.exit_code == 1 and report["nextStep"] is None
    (finding,) = [f for f in report["findings"] if f["kind"] == "store-layout"]
    assert finding["file"] == what and finding["fix"] == "none: report only"
    assert run_cli("info", store).exit_code == 0  # reading the log needs none of them


@pytest.mark.parametrize("what", ["topic", "queue", "segment"])
def test_a_file_in_the_way_of_a_consume_queue_is_named_and_rebuilt_around(
    tmp_path: Path, what: str
) -> None:
    """A file where a queue's topic or queue folder must be, or a folder under a queue
    file's name: verify reports cq-layout with the rebuild as the next step; dispatch exits 2
    naming what is in the way (it used to say the queue file "already exists"); the rebuild
    moves it to quarantine and the store verifies sound."""
    store = small_store(tmp_path)
    queue = store / "consumequeue" / "T" / "0"
    blocker = {"topic": queue.parent, "queue": queue, "segment": queue / f"{0:020d}"}[what]
    shutil.rmtree(queue.parent)
    if what == "segment":
        blocker.mkdir(parents=True)
    else:
        blocker.parent.mkdir(parents=True, exist_ok=True)
        blocker.write_text("in the way\n")
    report = json.loads(run_cli("verify", store, "--json").stdout)
    (finding,) = [f for f in report["findings"] if f["kind"] == "cq-layout"]
    assert finding["file"] == str(blocker.relative_to(store))
    assert report["nextStep"] == f"rmqstore dispatch {store} --rebuild --yes"
    before = tree_digest(store)
    result = run_cli("dispatch", store)
    one_line_error(result, 2)
    assert str(blocker) in result.stderr and "dispatch --rebuild --yes" in result.stderr
    assert tree_digest(store) == before
    assert run_cli("dispatch", store, "--rebuild", "--yes").exit_code == 0
    assert json.loads(run_cli("verify", store, "--json").stdout)["ok"] is True
    kept = list((store / "quarantine").rglob(blocker.name))
    assert kept, "the blocker is kept in quarantine"


def test_a_folder_under_an_index_files_name_is_said_to_be_one(tmp_path: Path) -> None:
    store = small_store(tmp_path)
    (store / "index" / "20231115221320020").mkdir()
    (store / "index" / "junk").write_text("x\n")
    findings = json.loads(run_cli("verify", store, "--json").stdout)["findings"]
    messages = {f["file"]: f["message"] for f in findings if f["kind"] == "file-name"}
    assert messages == {
        "index/20231115221320020": "not a regular file, under an index file's name (a broker "
        "cannot load it)",
        "index/junk": "not an index file (names are 17-digit creation times)",
    }


@pytest.mark.parametrize(
    "settings",
    [
        ["--broker-config", "mappedFileSizeCommitLog=0"],  # was an internal error (exit 70)
        ["--broker-config", "mappedFileSizeCommitLog=-4096"],  # was exit 4 after a mkdir
        ["--broker-config", "maxIndexNum=200000000"],  # a 4 GB index file no broker maps
        ["--index-entries", "200000000"],
        ["--commitlog-file-size", "4294967296"],
    ],
)
def test_geometry_no_broker_takes_is_refused_before_anything_is_made(
    tmp_path: Path, settings: list[str]
) -> None:
    option, value = settings
    if option == "--broker-config":
        (tmp_path / "broker.conf").write_text(value + "\n")
        value = str(tmp_path / "broker.conf")
    store = tmp_path / "store"
    for command in (
        ["append", store, "--create", "--topic", "T", "--body", "x", "--dispatch"],
        ["fixtures", "generate", "basic", store],
    ):
        if command[0] == "fixtures" and option == "--broker-config":
            continue  # fixtures take the sizes as options only
        refused = run_cli(*command, option, value)
        assert refused.exit_code == 2, refused.stderr
        last = refused.stderr.strip().splitlines()[-1]  # (a usage error shows the usage first)
        assert "error" in last.lower() and "Traceback" not in refused.stderr
        assert not store.exists()


def test_an_empty_path_is_refused_not_taken_for_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``rmqstore recover "$STORE" --yes`` with STORE unset must not recover the store the
    script runs in: an empty STORE (or SOURCE, DEST, OUT, FILE, --to, --input,
    --broker-config) is a usage error, exit 2, and nothing is read or written."""
    store = tmp_path / "store"
    generate("torn-tail", store)
    before = tree_digest(store)
    monkeypatch.chdir(store)
    for command in (
        ["recover", "", "--yes"],
        ["dispatch", "", "--rebuild", "--yes"],
        ["info", ""],
        ["verify", ""],
        ["stats", ""],
        ["export", "", "--to", str(tmp_path / "out")],
        ["export", ".", "--to", ""],
        ["replicate", "", str(tmp_path / "copy")],
        ["replicate", ".", ""],
        ["fixtures", "generate", "basic", ""],
        ["dump", ""],
        ["append", ".", "--input", ""],
        ["info", ".", "--broker-config", ""],
        ["quarantine", "purge", "", "--all", "--yes"],
    ):
        result = run_cli(*command)
        assert result.exit_code == 2, (command, result.stderr)
        assert "is empty (an unset variable?)" in result.stderr, command
    assert tree_digest(store) == before
    assert not (tmp_path / "out").exists() and not (tmp_path / "copy").exists()


def test_a_path_that_leads_nowhere_is_an_input_error_naming_it(tmp_path: Path) -> None:
    """A path too long for the file system, through a file, or through a loop of links is
    the input given being wrong (exit 2, one line naming the path), as a missing one is, not
    an I/O failure of the machine (exit 4); nothing is made or changed."""
    store = tmp_path / "store"
    generate("torn-tail", store)
    before = tree_digest(store)
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    too_long = str(tmp_path / ("x" * 300))
    through_a_file = str(store / "checkpoint" / "store")
    looping = str(tmp_path / "loop" / "store")
    for path in (too_long, through_a_file, looping):
        for command in (
            ["info", path],
            ["verify", path],
            ["append", path, "--create", "--topic", "T", "--body", "b"],
            ["export", str(store), "--to", path, "--engine", "local"],
            ["fixtures", "generate", "basic", path],
            ["replicate", str(store), path],
        ):
            result = run_cli(*command)
            assert result.exit_code == 2, (command, result.stderr)
            assert result.stderr.splitlines()[-1].startswith("rmqstore: error: "), command
            named = path[-20:] in result.stderr or str(Path(path).parent) in result.stderr
            assert "I/O failure" not in result.stderr and named, command
    assert tree_digest(store) == before
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["loop", "store"]


def test_an_empty_topic_or_key_is_refused_not_matched_against_nothing(tmp_path: Path) -> None:
    """``--topic "$TOPIC"`` with TOPIC unset used to count, export, check or build nothing
    and exit 0 (``append`` said no topic was given, ``read --key`` found no message): an
    empty --topic, --key, --uniq-key or --msg-id is a usage error, exit 2, naming the
    option, and nothing is written."""
    store = tmp_path / "store"
    generate("multi", store)
    before = tree_digest(store)
    for command in (
        ["read", store, "--topic", "", "--queue", "0"],
        ["read", store, "--key", ""],
        ["read", store, "--uniq-key", ""],
        ["read", store, "--msg-id", ""],
        ["stats", store, "--topic", "TopicTest", "--topic", ""],
        ["export", store, "--to", tmp_path / "out", "--topic", ""],
        ["verify", store, "--topic", ""],
        ["dispatch", store, "--topic", ""],
        ["info", store, "--topic", ""],
        ["append", store, "--topic", "", "--body", "x"],
    ):
        result = run_cli(*command)
        assert result.exit_code == 2, (command, result.stdout, result.stderr)
        option = next(
            str(word) for word in command if str(word).startswith("--") and word != "--to"
        )
        assert f"Invalid value for '{option}': is empty (an unset variable?)" in result.stderr
    assert tree_digest(store) == before
    assert not (tmp_path / "out").exists()


def test_a_topic_no_store_can_hold_is_refused_not_matched_against_nothing(
    tmp_path: Path,
) -> None:
    """A topic's consume queues are a folder named after it, so a --topic holding a path
    separator (or being . or ..) names no topic of any store: exit 2 naming it."""
    store = tmp_path / "store"
    generate("multi", store)
    before = tree_digest(store)
    for command in (
        ["stats", store, "--topic", "../../etc"],
        ["export", store, "--to", tmp_path / "out", "--topic", "TopicTest", "--topic", "a/b"],
        ["verify", store, "--topic", ".."],
        ["dispatch", store, "--topic", "x\\y"],
    ):
        result = run_cli(*command)
        assert result.exit_code == 2, (command, result.stdout, result.stderr)
        assert "Invalid value for '--topic'" in result.stderr, result.stderr
    assert tree_digest(store) == before
    assert not (tmp_path / "out").exists()


def test_a_new_store_is_not_made_inside_another(tmp_path: Path) -> None:
    """A store made in a folder of another (fixtures generate, append --create, replicate's
    DEST) would leave a folder a broker of the outer store lists: a 4.x broker refuses to
    start with a folder in its commit-log directory. Refused, exit 2, the outer store as it
    was; a store beside it, under the same parent, is made."""
    store = small_store(tmp_path)
    (store / "commitlog" / "empty").mkdir()  # an empty folder there is the user's to remove
    before = tree_digest(store)
    for command in (
        ["fixtures", "generate", "basic", store / "commitlog" / "new"],
        ["fixtures", "generate", "basic", store / "commitlog" / "empty"],
        ["append", store / "consumequeue" / "T" / "9", "--create", "--topic", "T", "--body", "x"],
        ["replicate", store, store / "index" / "copy"],
        ["fixtures", "generate", "basic", store / "backup"],
    ):
        result = run_cli(*command)
        one_line_error(result, 2)
        assert f"is inside the store {store.resolve()}" in result.stderr, command
    assert tree_digest(store) == before
    beside = run_cli("fixtures", "generate", "basic", tmp_path / "beside")
    assert beside.exit_code == 0, beside.stderr


def test_a_new_store_path_through_dotdot_or_failing_part_way_leaves_nothing(
    tmp_path: Path,
) -> None:
    """``new/..`` names the folder above ``new``, which exists only once ``new`` is made: the
    writers made ``new``, then failed with "File exists" (exit 4), leaving it behind. Such a
    path is refused (exit 2) before anything is made; and a path whose folders are made part
    way before one cannot be (its name too long: exit 2) has those folders removed again."""
    source = small_store(tmp_path)
    for command in (
        ["fixtures", "generate", "basic", tmp_path / "new1" / ".."],
        ["append", tmp_path / "new2" / "..", "--create", "--topic", "T", "--body", "x"],
        ["replicate", source, tmp_path / "new3" / ".."],
    ):
        result = run_cli(*command)
        one_line_error(result, 2)
        assert "cannot pass through '..'" in result.stderr, command
    too_long = tmp_path / "new4" / "deeper" / ("x" * 300)
    result = run_cli("fixtures", "generate", "basic", too_long)
    one_line_error(result, 2)  # the path given is wrong: an input error
    assert not any(entry.name.startswith("new") for entry in tmp_path.iterdir())


def test_json_files_nested_too_deeply_or_holding_huge_numbers_are_named(tmp_path: Path) -> None:
    """Every JSON file rmqstore reads from a store or a fixture folder, nested deeper than
    Python parses or holding a number of thousands of digits: each was an internal error
    (RecursionError), or a message with Python's advice about its integer limits. Now each is
    a file that does not load, said as it is for any other text that is not JSON."""
    nested = "[" * 20_000 + "]" * 20_000  # 40 KB: under every file's size bound
    huge = '{"offsetTable": {"T@g": {"0": ' + "9" * 5000 + "}}}"
    store = small_store(tmp_path)
    config = store / "config"
    for text, said in ((nested, "nested too deeply"), (huge, "a number of 5000 digits")):
        (config / "consumerOffset.json").write_text(text)
        result = run_cli("offsets", store)
        assert result.exit_code == 0, result.stderr
        assert said in result.stderr and "consumerOffset.json does not load" in result.stderr
        assert "internal error" not in result.stderr
        result = run_cli("verify", store, "--json")
        assert "internal error" not in result.stderr, result.stderr
        problems = json.loads(result.stdout)["findings"]
        assert [problem["kind"] for problem in problems] == ["config-unreadable"], problems
    (config / "consumerOffset.json").unlink()

    (config / "topics.json").write_text(nested)
    result = run_cli("append", store, "--topic", "T", "--body", "kept")
    assert result.exit_code == 0 and "internal error" not in result.stderr, result.stderr
    assert (config / "topics.json").read_text() == nested  # left alone, with a note
    (config / "topics.json").unlink()

    (config / "rmqstore-geometry.json").write_text(nested)
    one_line_error(run_cli("verify", store), 2)

    folder = store / "quarantine" / "20240101T000000-recover"
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(nested)
    (config / "rmqstore-geometry.json").unlink()
    listed = run_cli("quarantine", "list", store, "--json")
    assert listed.exit_code == 0, listed.stderr
    assert not json.loads(listed.stdout)["folders"][0]["manifestOk"]
    one_line_error(run_cli("quarantine", "restore", store, folder.name, "--yes"), 2)

    fixture = tmp_path / "fixture"
    fixture.mkdir()
    (fixture / "fixture.json").write_text(nested)
    one_line_error(run_cli("fixtures", "describe", "basic", fixture), 2)


def test_a_store_whose_consume_queues_are_rocksdb_is_read_and_never_written(
    tmp_path: Path,
) -> None:
    """A 5.x broker with storeType=defaultRocksDB keeps its consume queues in a RocksDB
    database under consumequeue/ (spec §6.9). rmqstore took it for a store with no queues:
    verify called every record undispatched, dispatch planned queue folders inside the
    database (--rebuild moved the database to quarantine), and append started every queue
    again at offset 0. Now the readers read the commit log and say the queues are not read;
    every writer refuses before changing anything."""
    store = small_store(tmp_path)
    queues = store / "consumequeue"
    shutil.rmtree(queues)
    queues.mkdir()
    (queues / "CURRENT").write_text("MANIFEST-000005\n")
    (queues / "MANIFEST-000005").write_bytes(os.urandom(256))
    (queues / "000004.log").write_bytes(os.urandom(1024))
    (queues / "LOCK").write_bytes(b"")
    before = tree_digest(store)

    for ranged in ((), ("--jobs", "2")):  # one pass, and the ranged one (as on Spark)
        result = run_cli("verify", store, "--json", *ranged)
        assert result.exit_code == 0, result.stdout + result.stderr
        report = json.loads(result.stdout)
        assert [f["kind"] for f in report["findings"]] == ["queues-rocksdb"]
        assert report["nextStep"] is None
    info = json.loads(run_cli("info", store, "--json").stdout)
    assert info["consumeQueueStore"] == "rocksdb" and info["dispatch"] is None
    assert info["topics"][0]["queues"][0]["messages"] == 20  # counted from the log
    assert "not read" in run_cli("info", store).stdout
    lines = run_cli("read", store, "--from-offset", "0", "--jsonl").stdout.splitlines()
    assert len(lines) == 20
    one_line_error(run_cli("read", store, "--topic", "T", "--queue", "0"), 2)
    writers_refuse(store, "T", "holds a RocksDB database")
    assert tree_digest(store) == before


def test_a_store_with_batchcq_topics_is_read_and_never_written(tmp_path: Path) -> None:
    """A 5.x topic with the attribute queue.type=BatchCQ keeps its queues in
    batchconsumequeue/ (spec §6.7), which rmqstore does not read. verify called its records
    undispatched, and dispatch (or recover) would write consume-queue files for it that its
    broker does not read, or cut the log under its batch queues; append would start its
    queues again at offset 0. Now verify checks the other topics' queues and notes
    queues-batchcq; every writer refuses before changing anything, but for appending (no
    dispatch) to the other topics."""
    store = tmp_path / "store"
    lines = tmp_path / "in.jsonl"
    lines.write_text(
        "".join(json.dumps({"topic": topic, "body": "x" * 50}) + "\n" for topic in "ABAB")
    )
    result = run_cli("append", store, "--create", "--dispatch", "--input", lines)
    assert result.exit_code == 0, result.stderr
    topics = store / "config" / "topics.json"
    document = json.loads(topics.read_text())
    document["topicConfigTable"]["B"]["attributes"] = {"queue.type": "BatchCQ"}
    topics.write_text(json.dumps(document))
    shutil.rmtree(store / "consumequeue" / "B")
    before = tree_digest(store)

    for ranged in ((), ("--jobs", "2")):
        result = run_cli("verify", store, "--json", *ranged)
        assert result.exit_code == 0, result.stdout + result.stderr
        report = json.loads(result.stdout)
        assert [f["kind"] for f in report["findings"]] == ["queues-batchcq"]
        assert report["checked"]["units"] == 2  # topic A's
        assert report["nextStep"] is None
    info = json.loads(run_cli("info", store, "--json").stdout)
    counts = {t["topic"]: t["queues"][0]["messages"] for t in info["topics"]}
    assert counts == {"A": 2, "B": 2}  # from the log, every record
    assert info["batchQueueTopics"] == ["B"]
    assert "batch queues" in run_cli("info", store).stdout
    result = run_cli("read", store, "--topic", "B", "--queue", "0")
    one_line_error(result, 2)
    assert "batchconsumequeue/" in result.stderr
    assert run_cli("read", store, "--topic", "A", "--queue", "0", "--jsonl").exit_code == 0
    writers_refuse(store, "B", "topic B keeps its queues in batchconsumequeue/")
    assert tree_digest(store) == before

    # appending (no dispatch) to the other topics goes on, their queue offsets known
    result = run_cli("append", store, "--topic", "A", "--body", "later", "--jsonl")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["queueOffset"] == 2
    assert "or run rmqstore dispatch" not in result.stderr  # refused here
    one_line_error(run_cli("append", store, "--topic", "A", "--body", "y", "--dispatch"), 2)

    # a folder in batchconsumequeue/ says so too, whatever topics.json says
    topics.write_text(json.dumps({"topicConfigTable": {}}))
    (store / "batchconsumequeue" / "C" / "0").mkdir(parents=True)
    one_line_error(run_cli("dispatch", store), 2)


def test_queue_folders_of_the_other_queue_type_are_errors(tmp_path: Path) -> None:
    """A 5.x broker loads consumequeue/ expecting ordinary topics and batchconsumequeue/
    expecting BatchCQ ones, and refuses to start on a queue folder of the other type (its
    ConsumeQueueStore: "The queue type of topic ... should be ..."). Such a store (an
    ordinary queue left for a topic made BatchCQ, batch queues of a topic topics.json does
    not make BatchCQ) is now a queue-type error, without the advice to start the broker."""
    store = small_store(tmp_path)
    topics = store / "config" / "topics.json"
    topics.write_text(
        json.dumps(
            {"topicConfigTable": {"T": {"topicName": "T", "attributes": {"queue.type": "BatchCQ"}}}}
        )
    )
    (store / "batchconsumequeue" / "U" / "0").mkdir(parents=True)
    result = run_cli("verify", store, "--json")
    assert result.exit_code == 1, result.stdout
    report = json.loads(result.stdout)
    wrong = sorted(f["file"] for f in report["findings"] if f["kind"] == "queue-type")
    assert wrong == ["batchconsumequeue/U", "consumequeue/T"]
    text = run_cli("verify", store).stdout
    assert "start its broker" not in text and "a 5.x broker does not start" in text


def test_queue_folders_a_broker_reads_as_no_queue_are_left_alone(tmp_path: Path) -> None:
    """Copies of a queue under names Python's int() reads and a broker does not take for
    that queue (``0_0``, `` 1``, ``+2``: the broker parses the name, then opens the folder of
    the number): verify counted each as another queue and info failed (no consume queue for
    queue 1). Now they are not queues, as for a broker."""
    store = small_store(tmp_path)
    queue = store / "consumequeue" / "T" / "0"
    for name in ("0_0", " 1", "+2", "\u0663"):
        shutil.copytree(queue, queue.with_name(name))
    result = run_cli("verify", store, "--json")
    assert result.exit_code == 0, result.stdout
    assert json.loads(result.stdout)["checked"]["units"] == 20
    info = run_cli("info", store, "--json")
    assert info.exit_code == 0, info.stderr
    assert [(q["topic"], q["queueId"]) for q in json.loads(info.stdout)["consumeQueues"]] == [
        ("T", 0)
    ]


def test_a_store_whose_commit_log_is_elsewhere_or_dledger_is_never_written(
    tmp_path: Path,
) -> None:
    """A store whose commitlog/ is not there (a broker's storePathCommitLog points elsewhere,
    or its log is a DLedger one in dledger-<id>/): rmqstore took the log as empty, so
    `recover --yes` cut every consume queue and the index (to quarantine) and verify's next
    step was `dispatch --rebuild --yes`, which moved them all away. Now every writer refuses,
    verify names the missing log as a store-layout error with no next step, and with the
    broker's config giving the log's folder everything works."""
    store = small_store(tmp_path)
    elsewhere = tmp_path / "data2" / "commitlog"
    elsewhere.parent.mkdir()
    (store / "commitlog").rename(elsewhere)
    before = tree_digest(store)
    writers_refuse(store, "T", "commitlog does not exist: the commit log is elsewhere")
    assert tree_digest(store) == before
    result = run_cli("verify", store, "--json")
    report = json.loads(result.stdout)
    assert report["findingsByKind"]["store-layout"] == 1 and report["nextStep"] is None
    assert "does not exist" in run_cli("info", store).stderr

    config = tmp_path / "broker.conf"
    config.write_text(f"storePathCommitLog={elsewhere}\n")
    result = run_cli("verify", store, "--broker-config", config)
    assert result.exit_code == 0, result.stdout
    result = run_cli("append", store, "--broker-config", config, "--topic", "T", "--body", "z")
    assert result.exit_code == 0, result.stderr

    (store / "commitlog").mkdir()  # an empty log: taken as one, as a broker takes it
    (store / "dledger-n0" / "data").mkdir(parents=True)
    writers_refuse(store, "T", "dledger-n0 holds a DLedger commit log")
    report = json.loads(run_cli("verify", store, "--json").stdout)
    assert report["findingsByKind"]["store-layout"] == 1 and report["nextStep"] is None


def test_digits_of_other_kinds_are_not_numbers(tmp_path: Path) -> None:
    """``str.isdigit()`` is true for '²' and other digits ``int()`` refuses: a time, a port
    or a queue folder's name made of them was an internal error (exit 70)."""
    store = tmp_path / "store"
    generate("multi", store)
    for command in (
        ["read", store, "--time", "\u00b2"],
        ["serve-ha", store, "--listen", "127.0.0.1:\u00b2"],
        ["replicate", "ha://127.0.0.1:\u00b2", tmp_path / "copy"],
    ):
        result = run_cli(*command)
        assert result.exit_code == 2, (command, result.stdout, result.stderr)
        assert "internal error" not in result.stderr
    folder = store / "consumequeue" / "TopicTest" / "\u00b2"  # names no queue (a broker's view)
    shutil.copytree(store / "consumequeue" / "TopicTest" / "0", folder)
    dumped = run_cli("dump", next(folder.iterdir()))
    assert dumped.exit_code in (0, 1), dumped.stderr
    assert "internal error" not in dumped.stderr
    assert not (tmp_path / "copy").exists()


@pytest.mark.plumbing
def test_a_store_of_more_index_files_than_descriptors_allowed_is_dispatched_and_read(
    tmp_path: Path,
) -> None:
    """Index files of a small geometry run to thousands in a large store; each was held open,
    so under a ulimit of 1024 (here 32, over 187 files) `dispatch --rebuild` and `recover`
    stopped with "Too many open files" (exit 4, 'abort' left) and verify and key look-ups
    could not open them. Now a few are held and the others opened again when read: 64 at
    most, fewer under a low limit (64 held made verify fail under a ulimit of 64)."""
    import resource

    store = tmp_path / "store"
    manifest = generate(
        "multi",
        store,
        FixtureOptions(messages=600, index_slots=4, index_entries=8),
    )
    assert len(list((store / "index").iterdir())) > 100
    geometry = ["--index-slots", "4", "--index-entries", "8"]
    oldest = manifest["messages"][0]

    def few_descriptors() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (32, 32))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "rmqstore", *args, *geometry],
            capture_output=True,
            text=True,
            preexec_fn=few_descriptors,
            timeout=300,
        )

    for command in (
        ["dispatch", str(store), "--rebuild", "--yes"],
        ["dispatch", str(store), "--rebuild", "--yes", "--jobs", "2"],
        ["verify", str(store)],
        ["read", str(store), "--topic", oldest["topic"], "--uniq-key", oldest["uniqKey"], "--json"],
        ["recover", str(store), "--yes"],
        ["verify", str(store), "--jobs", "2"],
        ["stats", str(store)],
        ["info", str(store), "--deep"],
    ):
        done = run(*command)
        assert done.returncode == 0, (command, done.stderr)
        if command[0] == "read":
            (found,) = json.loads(done.stdout)
            assert found["commitLogOffset"] == oldest["commitLogOffset"]
    assert not (store / "abort").exists()


@pytest.mark.plumbing
def test_a_store_of_more_queues_than_descriptors_allowed_is_written_and_rebuilt(
    tmp_path: Path,
) -> None:
    """Each consume queue written held a descriptor (Python's map of its file keeps one), so
    `dispatch --rebuild` of a store of 1,000 topics of 4 queues stopped with "Too many open
    files" (exit 4) under the usual ulimit -n of 1024. Here 300 queues under a hard limit of
    100: `append --dispatch`, `dispatch --rebuild`, `recover` and `verify` finish, the queues
    the bytes a run without the limit writes. A soft limit under the hard one is raised to it."""
    import resource

    lines = tmp_path / "in.jsonl"
    lines.write_text(
        "".join(
            json.dumps({"topic": f"Q{number % 150}", "queueId": number // 150 % 2, "body": "x"})
            + "\n"
            for number in range(600)
        )
    )

    def few_descriptors() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (100, 100))

    def run(*args: str | Path, limited: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "rmqstore", *map(str, args)],
            capture_output=True,
            text=True,
            preexec_fn=few_descriptors if limited else None,
            timeout=300,
        )

    stores = {}
    for limited in (True, False):
        store = tmp_path / f"store-{limited}"
        made = run("append", store, "--create", "--input", lines, "--dispatch", limited=limited)
        assert made.returncode == 0, made.stderr
        assert len(list((store / "consumequeue").glob("*/*"))) == 300
        rebuilt = run("dispatch", store, "--rebuild", "--yes", limited=limited)
        assert rebuilt.returncode == 0, rebuilt.stderr
        (store / "abort").touch()
        recovered = run("recover", store, "--yes", limited=limited)
        assert recovered.returncode == 0, recovered.stderr
        stores[limited] = {
            name: digest
            for name, digest in tree_digest(store).items()
            if name.startswith("consumequeue/")  # (the log's store times differ)
        }
        verified = run("verify", store, limited=limited)
        assert verified.returncode == 0, verified.stdout + verified.stderr
    assert len(stores[True]) == 300 and stores[True] == stores[False]

    raised = subprocess.run(
        [sys.executable, "-c",
         "import resource; from rmqstore.commands.main import _raise_open_file_limit; "
         "_raise_open_file_limit(); print(*resource.getrlimit(resource.RLIMIT_NOFILE))"],
        capture_output=True, text=True, timeout=60,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (64, 4096)),
    )  # fmt: skip
    assert raised.stdout.split() == ["4096", "4096"], raised.stderr
