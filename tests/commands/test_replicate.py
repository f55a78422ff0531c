"""``rmqstore replicate SOURCE DEST``: byte-identical commit logs, consume queues as SOURCE's,
incremental runs, a refused DEST that is not a prefix, a live SOURCE followed, kills."""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rmqstore.fixtures import SCENARIOS, FixtureOptions, generate

from support import (
    ORACLE_OPTIONS,
    full_disk_stop,
    log_bytes,
    queue_files,
    replicate,
    run_cli,
    small_filesystem,
    torn_replica,
    tree_digest,
)

pytestmark = pytest.mark.plumbing

CLEAN = sorted(n for n in SCENARIOS if n != "large" and SCENARIOS[n].damage is None)


@pytest.mark.parametrize("name", CLEAN)
def test_a_replica_of_each_fixture_is_byte_identical(tmp_path: Path, name: str) -> None:
    source = tmp_path / "source"
    generate(name, source, FixtureOptions())
    done = replicate(source, tmp_path / "dest")
    assert done["bytesCopied"] > 0 and done["filesCreated"]
    assert log_bytes(tmp_path / "dest") == log_bytes(source)
    assert queue_files(tmp_path / "dest") == queue_files(source)
    assert run_cli("verify", tmp_path / "dest").exit_code == 0
    again = replicate(source, tmp_path / "dest")
    assert again["bytesCopied"] == 0 and again["fromOffset"] == done["toOffset"]


def test_a_copy_killed_inside_a_records_properties_is_written_over(tmp_path: Path) -> None:
    source = tmp_path / "source"
    generate("multi", source, FixtureOptions())
    dest = tmp_path / "dest"
    torn_replica(source, dest)
    replicate(source, dest)
    assert log_bytes(dest) == log_bytes(source)
    assert queue_files(dest) == queue_files(source)
    assert run_cli("verify", dest).exit_code == 0


def test_where_the_kernel_will_not_copy_bytes_go_through_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """copy_file_range is refused across file systems on older kernels and by some file
    systems; the copy then reads and writes the bytes itself, to the same replica."""
    source = tmp_path / "source"
    generate("multi", source, FixtureOptions())
    refused = []

    def refuse(*_args: object) -> int:
        refused.append(True)
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr("os.copy_file_range", refuse)
    replicate(source, tmp_path / "dest")
    assert refused
    assert log_bytes(tmp_path / "dest") == log_bytes(source)
    assert run_cli("verify", tmp_path / "dest").exit_code == 0


@pytest.mark.parametrize("name", ["s1_multi", "s3_txn_delay", "v533_s1_multi", "v533_s3_txn"])
def test_a_replica_of_a_broker_store(oracle, tmp_path: Path, name: str) -> None:
    store = oracle(name).store
    dest = tmp_path / "dest"
    replicate(store, dest, *ORACLE_OPTIONS)
    assert log_bytes(dest) == log_bytes(store)
    assert queue_files(dest) == queue_files(store)  # dispatched as the broker did
    assert run_cli("verify", dest, *ORACLE_OPTIONS).exit_code == 0


def test_an_index_geometry_that_would_fill_the_disk_is_refused(oracle, tmp_path: Path) -> None:
    """``--index-entries 2`` with the default 5,000,000 slots: each index file reserves
    20 MB for two entries, and a replica of a 3,000-message store filled 75 GB of disk in a
    minute (the options campaign, seed 25). Refused in one line, DEST not made."""
    dest = tmp_path / "dest"
    options = ["--commitlog-file-size", "65536", "--consumequeue-file-size", "2000"]
    refused = run_cli("replicate", oracle("s1_multi").store, dest, *options, "--index-entries", "2")
    assert refused.exit_code == 2
    assert refused.stderr.count("\n") == 1 and "would reserve 20,000,080 bytes" in refused.stderr
    assert not dest.exists()


def test_a_torn_source_is_copied_up_to_its_valid_end(oracle, tmp_path: Path) -> None:
    crash = oracle("s2_crash")
    dest = tmp_path / "dest"
    done = replicate(crash.root / "store_torn_half_record", dest, *ORACLE_OPTIONS)
    end = crash.manifest["lastValidEnd"]
    assert done["toOffset"] == end
    assert log_bytes(dest) == log_bytes(crash.root / "store_torn_half_record", end)
    assert run_cli("verify", dest, *ORACLE_OPTIONS).exit_code == 0


def test_an_interrupted_copy_resumes_where_dest_ends(tmp_path: Path) -> None:
    source = tmp_path / "source"
    generate("multi", source, FixtureOptions())
    dest = tmp_path / "dest"
    first = replicate(source, dest, "--until", "200000")
    assert 0 < first["toOffset"] <= 200000
    assert run_cli("verify", dest).exit_code == 0  # sound after every round
    second = replicate(source, dest)
    # from DEST's valid end: the BLANK of its last complete file, copied again as it is
    assert 0 < second["fromOffset"] <= first["toOffset"]
    assert log_bytes(dest) == log_bytes(source)
    assert queue_files(dest) == queue_files(source)


def test_follow_until_an_offset_no_record_ends_at_stops(tmp_path: Path) -> None:
    """``--follow --until N`` once polled for ever when no record ends exactly at N (N inside
    a record, or inside the BLANK that closes a file): no later record can end by N, so the
    copy is complete."""
    source = tmp_path / "source"
    generate("multi", source, FixtureOptions())
    first = sorted((source / "commitlog").iterdir())[0]
    items = [json.loads(line) for line in run_cli("dump", first, "--jsonl").stdout.splitlines()]
    records = [item for item in items if item["type"] == "record"]
    (blank,) = [item for item in items if item["type"] == "blank"]
    inside_record = records[3]["commitLogOffset"] + 10
    inside_blank = blank["commitLogOffset"] + 10
    for until, expected_end in (
        (inside_record, records[3]["commitLogOffset"]),
        (inside_blank, blank["commitLogOffset"]),
    ):
        dest = tmp_path / f"dest-{until}"
        args = ["replicate", source, dest, "--follow", "--interval", "10", "--until", until]
        done = subprocess.run(  # a process, so that polling for ever fails the test
            [sys.executable, "-m", "rmqstore", *map(str, args), "--json"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        rounds = [json.loads(line) for line in done.stdout.splitlines()]
        assert len(rounds) == 1 and rounds[-1]["toOffset"] == expected_end
        assert f"every record that ends by --until {until}" in done.stderr
        assert run_cli("verify", dest).exit_code == 0


def test_a_dest_that_is_not_a_prefix_is_refused_unchanged(tmp_path: Path) -> None:
    source = tmp_path / "source"
    generate("multi", source, FixtureOptions())
    dest = tmp_path / "dest"
    replicate(source, dest, "--until", "300000")
    first = sorted((dest / "commitlog").iterdir())[-1]
    with open(first, "r+b") as handle:  # one byte of a record body DEST holds
        handle.seek(200)
        byte = handle.read(1)
        handle.seek(200)
        handle.write(bytes([byte[0] ^ 0xFF]))
    before = tree_digest(dest)
    refused = run_cli("replicate", source, dest)
    assert refused.exit_code == 2 and "not a copy of SOURCE" in refused.stderr
    assert tree_digest(dest) == before
    other = tmp_path / "other"
    generate("basic", other, FixtureOptions())
    assert run_cli("replicate", other, dest).exit_code == 2


def test_a_dest_inside_source_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "source"
    generate("basic", source, FixtureOptions())
    before = tree_digest(source)
    for dest, said in (
        (source / "commitlog" / "copy", "is inside the store"),
        (source / "backup", "is inside the store"),
        (source, "is the store"),
    ):
        refused = run_cli("replicate", source, dest)
        assert refused.exit_code == 2 and said in refused.stderr, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
    assert tree_digest(source) == before


@pytest.mark.campaign
def test_kills_at_random_points_then_a_rerun_reach_the_same_replica(tmp_path: Path) -> None:
    source = tmp_path / "source"
    generate("large", source, FixtureOptions(messages=100_000, commitlog_file_size=1 << 22))
    clean = tmp_path / "clean"
    replicate(source, clean)
    rng = random.Random(7)
    dest = tmp_path / "dest"
    for _ in range(3):
        child = subprocess.Popen(
            [sys.executable, "-m", "rmqstore", "replicate", str(source), str(dest)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(rng.uniform(0.2, 0.8))
        child.send_signal(signal.SIGKILL)
        child.wait()
    replicate(source, dest)
    assert log_bytes(dest) == log_bytes(clean) == log_bytes(source)
    assert queue_files(dest) == queue_files(clean)
    assert run_cli("verify", dest).exit_code == 0


def test_follow_copies_a_store_while_it_is_written(tmp_path: Path) -> None:
    source = tmp_path / "source"
    created = run_cli("append", source, "--create", "--topic", "T", "--body", "first",
                      "--commitlog-file-size", "65536")  # fmt: skip
    assert created.exit_code == 0, created.stderr
    dest = tmp_path / "dest"
    follower = subprocess.Popen(
        [sys.executable, "-m", "rmqstore", "replicate", str(source), str(dest), "--follow",
         "--interval", "50", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    assert follower.stdout is not None
    # its first round (the first message) before anything more is written: the writer
    # then lands in later rounds however slowly the follower starts on a loaded machine
    first_round = follower.stdout.readline()
    writer = subprocess.Popen(
        [sys.executable, "-m", "rmqstore", "append", str(source), "--input", "-", "--flush",
         "sync", "--jsonl"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    assert writer.stdin is not None and writer.stdout is not None
    acknowledged = []
    for number in range(400):
        line = {"topic": f"T{number % 3}", "body": f"m{number}-" + "x" * (number % 500)}
        writer.stdin.write((json.dumps(line) + "\n").encode())
        writer.stdin.flush()
        if number % 20 == 0:
            time.sleep(0.02)
    writer.stdin.close()
    acknowledged = [json.loads(line)["msgId"] for line in writer.stdout]
    assert writer.wait() == 0 and len(acknowledged) == 400
    time.sleep(1.0)  # a few rounds after the last message
    follower.send_signal(signal.SIGTERM)
    out, err = follower.communicate(timeout=60)
    assert follower.returncode == 0, err
    assert b"stopped by SIGTERM" in err
    rounds = [json.loads(line) for line in [first_round, *out.splitlines()]]
    assert len(rounds) > 1 and rounds[-1]["toOffset"] == rounds[-1]["sourceEnd"]
    reads = run_cli("read", dest, "--from-offset", "0", "--jsonl", "--body", "none")
    held = {json.loads(line)["msgId"] for line in reads.stdout.splitlines()}
    assert set(acknowledged) <= held
    assert log_bytes(dest) == log_bytes(source)
    assert run_cli("verify", dest).exit_code == 0


@pytest.mark.parametrize("nohup", [False, True])
def test_a_hangup_stops_a_follow_after_its_round_unless_run_under_nohup(
    tmp_path: Path, nohup: bool
) -> None:
    """SIGHUP (its terminal or ssh session gone) stops replicate --follow as SIGTERM does:
    after the round in progress, DEST sound, exit 0. It used to end the process on the
    spot. Started with SIGHUP ignored (nohup), the hangup is not a request to stop."""
    source = tmp_path / "source"
    created = run_cli("append", source, "--create", "--topic", "T", "--body", "first")
    assert created.exit_code == 0, created.stderr
    dest = tmp_path / "dest"
    ignore = (lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN)) if nohup else None
    follower = subprocess.Popen(
        [sys.executable, "-m", "rmqstore", "replicate", str(source), str(dest), "--follow",
         "--interval", "50", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=ignore,
    )  # fmt: skip
    assert follower.stdout is not None
    assert json.loads(follower.stdout.readline())["toOffset"] > 0  # its first round done
    follower.send_signal(signal.SIGHUP)
    if nohup:
        time.sleep(0.5)
        assert follower.poll() is None  # still following
        follower.send_signal(signal.SIGTERM)
    _out, err = follower.communicate(timeout=60)
    assert follower.returncode == 0, err
    assert (b"stopped by SIGTERM" if nohup else b"stopped by SIGHUP") in err
    assert run_cli("verify", dest).exit_code == 0


def test_a_rerun_ending_where_a_file_ends_settles_the_abort_a_stopped_run_left(
    tmp_path: Path,
) -> None:
    """SOURCE's records end where a file ends (its BLANK, then a file whose first record a
    broker is still writing: zeros in its length field), and DEST is a replica an earlier
    run left with 'abort' (killed, or stopped by a full disk part way). Run again, replicate
    copies up to that file's end and removes 'abort', as an uninterrupted run does: verify
    finds the replica sound. It kept 'abort' (its dispatch, told to go as far as the file's
    end, stopped at the BLANK and did not count itself caught up), and verify then took the
    BLANK for a torn tail (an error, with recover as the next step)."""
    source = tmp_path / "source"
    generate("multi", source, FixtureOptions())
    rolled = source / "commitlog" / f"{4 * 65536:020d}"
    with open(rolled, "r+b") as handle:
        handle.write(bytes(4))
    dest = tmp_path / "dest"
    first = run_cli("replicate", source, dest, "--until", "100000")
    assert first.exit_code == 0, first.stderr
    (dest / "abort").touch()  # as the run stopped part way leaves it
    done = replicate(source, dest)
    assert done["toOffset"] == done["sourceEnd"] == 4 * 65536
    assert not (dest / "abort").exists()
    assert log_bytes(dest) == log_bytes(source, 4 * 65536)
    checked = run_cli("verify", dest, "--json")
    assert checked.exit_code == 0, checked.stdout


def test_a_replica_a_full_disk_stops_keeps_abort_and_a_second_run_finishes(
    tmp_path: Path,
) -> None:
    """A full disk stopping a replicate at each point in turn: exit 4 and one line. A new
    DEST it could not even lock is left out entirely; one it began copying into keeps
    'abort' (records copied but not dispatched go to a broker's crash recovery: a 5.x
    broker's normal start may not dispatch them) and the line says to run it again, which
    with room gives the byte-identical replica, sound and without 'abort'."""
    source = tmp_path / "source"
    generate("multi", source, FixtureOptions())
    with small_filesystem(tmp_path, "4m") as disk:
        dest = disk / "dest"
        outcomes = set()
        for room in range(0, 780 << 10, 60 << 10):
            shutil.rmtree(dest, ignore_errors=True)
            line = full_disk_stop(disk, room, "replicate", source, dest)
            if line is None:
                outcomes.add("done")
                continue
            if not dest.exists():
                outcomes.add("not made")
            else:
                outcomes.add("part way")
                assert line.endswith(
                    "; replicate stopped part way and left 'abort' in place (a broker starting "
                    "on the store runs its crash recovery); run rmqstore replicate again once "
                    "the cause is mended"
                ), line
                assert (dest / "abort").exists()
            replicate(source, dest)
            assert log_bytes(dest) == log_bytes(source)
            assert queue_files(dest) == queue_files(source)
            assert not (dest / "abort").exists()
            assert run_cli("verify", dest).exit_code == 0
        assert outcomes == {"not made", "part way", "done"}


def test_a_source_whose_only_log_file_is_cut_short_is_refused_not_copied_with_its_size(
    oracle, tmp_path: Path
) -> None:
    """A source whose one commit-log file was cut to 1,457 bytes: its file size was taken
    from that file, and the replica remembered 1,457 in its geometry, a size no broker
    configures, so every command refused the replica (exit 2). The size of a store's files
    is now told only from sizes a broker can configure (4,096 bytes or more for the commit
    log): the cut file is one of the wrong size, as in a log of several files, the source
    is refused in one line naming it, and verify reports it (file-size)."""
    source = oracle("v533_s3_txn").copy_to(tmp_path)
    log_file = source / "commitlog" / f"{0:020d}"
    os.truncate(log_file, 1457)
    refused = run_cli("replicate", source, tmp_path / "replica")
    assert refused.exit_code == 2
    assert refused.stderr.count("\n") == 1 and str(log_file) in refused.stderr
    assert "is 1457 bytes" in refused.stderr
    assert not (tmp_path / "replica" / "config").exists()
    checked = run_cli("verify", source, "--json")
    assert checked.exit_code == 1
    assert "file-size" in json.loads(checked.stdout)["findingsByKind"]
