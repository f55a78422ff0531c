"""rmqstore recover and rmqstore flush from the command line: plan, exit codes, refusals."""

from __future__ import annotations

import json
import os
import shutil
import struct
from dataclasses import replace
from pathlib import Path

import pytest

from rmqstore.checkpoint import read_checkpoint, write_checkpoint
from rmqstore.fixtures import FixtureOptions, generate
from rmqstore.lockfile import StoreLock

from support import ORACLE_OPTIONS, run_cli, small_filesystem, stops_on_a_full_disk, tree_digest


def fixture(tmp_path: Path, name: str) -> Path:
    out = tmp_path / name
    generate(name, out, FixtureOptions())
    return out


def test_dry_run_shows_the_plan_and_changes_nothing(tmp_path: Path) -> None:
    store = fixture(tmp_path, "torn-tail")
    before = tree_digest(store)
    result = run_cli("recover", store, "--dry-run", "--json")
    assert result.exit_code == 1  # work to do
    plan = json.loads(result.stdout)["plan"]
    assert plan["mode"] == "abnormal"
    assert (
        plan["logEnd"]
        == json.loads((store / "fixture.json").read_text())["expect"]["recovery"]["validEnd"]
    )
    assert plan["bytesCut"] > 0 and plan["unitsRemoved"] == 1
    assert tree_digest(store) == before
    assert run_cli("recover", store, "--dry-run").exit_code == 1


def test_recover_then_verify_is_sound(tmp_path: Path) -> None:
    store = fixture(tmp_path, "garbage-after-end")
    result = run_cli("recover", store, "--yes", "--json")
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["abortRemoved"] is True
    assert Path(document["quarantine"]).is_dir()
    assert run_cli("verify", store).exit_code == 0
    again = run_cli("recover", store, "--dry-run")
    assert again.exit_code == 0 and "nothing to recover" in again.stdout


def test_the_check_after_recovery_reads_the_store_before_another_writer_may_take_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """recover keeps the store's lock until its check has read what it left: an append
    another process starts then is refused (exit 3), and the check reports the recovery's
    own result. recover used to let the lock go before its check: such an append got in,
    and the check reported its messages (not dispatched) as problems of the recovery."""
    import subprocess
    import sys

    from rmqstore.commands import recover
    from rmqstore.verify import verify_store

    store = fixture(tmp_path, "garbage-after-end")
    tried = []

    def check_with_a_writer_beside(*args, **kwargs):
        append = [sys.executable, "-m", "rmqstore", "append", str(store), "--topic", "T9",
                  "--body", "beside"]  # fmt: skip
        tried.append(subprocess.run(append, capture_output=True, text=True))
        return verify_store(*args, **kwargs)

    monkeypatch.setattr(recover, "verify_store", check_with_a_writer_beside)
    result = run_cli("recover", store, "--yes")
    assert tried and tried[0].returncode == 3, tried[0].stderr
    assert "is locked by another process" in tried[0].stderr
    assert result.exit_code == 0, result.stderr
    monkeypatch.undo()
    assert run_cli("append", store, "--topic", "T9", "--body", "after").exit_code == 0


def test_cutting_without_yes_off_a_terminal_is_refused(tmp_path: Path) -> None:
    store = fixture(tmp_path, "crc-flip")
    before = tree_digest(store)
    result = run_cli("recover", store)
    assert result.exit_code == 2
    assert "add --yes to confirm" in result.stderr.strip().splitlines()[-1]
    assert tree_digest(store) == before


def test_what_recovery_cannot_mend_is_exit_1(tmp_path: Path) -> None:
    store = fixture(tmp_path, "missing-file")
    result = run_cli("recover", store, "--yes")
    assert result.exit_code == 1
    assert "missing" in result.stderr


def test_a_wrong_size_queue_file_stops_before_anything_changes(tmp_path: Path) -> None:
    store = fixture(tmp_path, "cq-wrong-size")
    before = tree_digest(store)
    result = run_cli("recover", store, "--yes")
    assert result.exit_code == 2 and "configured size" in result.stderr
    assert tree_digest(store) == before


def test_a_held_lock_or_no_store_is_refused(tmp_path: Path) -> None:
    store = fixture(tmp_path, "torn-tail")
    before = tree_digest(store)
    lock = StoreLock(store / "lock")
    lock.acquire()
    try:
        for command in (["recover", store, "--yes"], ["flush", store]):
            result = run_cli(*command)
            assert result.exit_code == 3 and "locked" in result.stderr
    finally:
        lock.release()
    assert tree_digest(store) == before
    for command in ("recover", "flush"):
        result = run_cli(command, tmp_path / "nothing")
        assert result.exit_code == 2 and "no such directory" in result.stderr


def test_flush_writes_the_checkpoint_and_leaves_abort(tmp_path: Path) -> None:
    store = fixture(tmp_path, "abort-left")
    (store / "checkpoint").unlink()
    result = run_cli("flush", store, "--json")
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["checkpointBefore"] is None and document["abortPresent"] is True
    # 'abort' there: the times stay where a crash recovery replays from (none: the start)
    assert document["checkpoint"]["physicMsgTimestamp"] == 0
    assert document["checkpoint"]["logicsMsgTimestamp"] == 0
    assert "run rmqstore recover" in result.stderr
    assert (store / "abort").exists() and (store / "checkpoint").stat().st_size == 4096
    human = run_cli("flush", store)
    assert human.exit_code == 0 and "physicMsgTimestamp" in human.stdout
    assert run_cli("recover", store, "--yes").exit_code == 0
    recovered = json.loads(run_cli("flush", store, "--json").stdout)
    last = json.loads((store / "fixture.json").read_text())["messages"][-1]
    assert recovered["checkpoint"]["physicMsgTimestamp"] == last["storeTimestamp"]


def test_damage_recovery_does_not_mend_is_named_and_exits_1(tmp_path: Path) -> None:
    from rmqstore.fixtures import generate

    store = tmp_path / "store"
    generate("index-broken-chain", store)
    result = run_cli("recover", store, "--yes", "--json")
    assert result.exit_code == 1, result.stderr
    remaining = json.loads(result.stdout)["remaining"]
    assert remaining["ok"] is False and "index-chain" in remaining["findingsByKind"]
    assert remaining["nextStep"] == f"rmqstore dispatch {store} --rebuild --yes"
    assert "after recovery, verify still finds index-chain" in result.stderr
    unchecked = run_cli("recover", store, "--yes", "--no-check", "--json")
    assert unchecked.exit_code == 0 and json.loads(unchecked.stdout)["remaining"] is None
    assert run_cli("dispatch", store, "--rebuild", "--yes").exit_code == 0
    again = run_cli("recover", store, "--yes", "--json")
    assert again.exit_code == 0 and json.loads(again.stdout)["remaining"]["ok"] is True


def test_a_short_checkpoint_is_read_as_zeros_beyond_its_bytes_and_flush_makes_it_whole(
    tmp_path: Path,
) -> None:
    store = fixture(tmp_path, "short-checkpoint")
    size = (store / "checkpoint").stat().st_size
    info = json.loads(run_cli("info", store, "--json").stdout)
    assert info["checkpointBytes"] == size < 4096
    assert "cut short" in run_cli("info", store).stdout
    verified = json.loads(run_cli("verify", store, "--json").stdout)
    assert verified["findingsByKind"] == {"checkpoint-short": 1, "abort-present": 1}
    flushed = run_cli("flush", store, "--json")
    assert flushed.exit_code == 0, flushed.stderr
    assert (store / "checkpoint").stat().st_size == 4096
    assert json.loads(run_cli("info", store, "--json").stdout)["checkpointBytes"] == 4096
    after = json.loads(run_cli("verify", store, "--json").stdout)
    assert after["findingsByKind"] == {"abort-present": 1}


def test_a_longer_checkpoint_is_reported_and_no_writer_touches_the_store(tmp_path: Path) -> None:
    store = fixture(tmp_path, "abort-left")
    with open(store / "checkpoint", "ab") as checkpoint:
        checkpoint.write(b"\1" * 100)
    verified = json.loads(run_cli("verify", store, "--json").stdout)
    (finding,) = [f for f in verified["findings"] if f["kind"] == "checkpoint-size"]
    assert finding["fix"] == "none: report only" and "4196 bytes" in finding["message"]
    # and no command is the next step (it named recover, which refuses the store)
    assert verified["nextStep"] is None
    assert "next step: move the checkpoint aside" in run_cli("verify", store).stdout
    before = tree_digest(store)
    for command in (["flush"], ["recover", "--yes"], ["dispatch"]):
        result = run_cli(*command, store)
        assert result.exit_code == 2, (command, result.stderr)
        assert "4196 bytes; a checkpoint is 4096" in result.stderr
        assert "move it aside" in result.stderr and len(result.stderr.splitlines()) == 1
    assert tree_digest(store) == before


def test_a_crash_recovery_gives_back_units_a_queue_lost_while_others_kept_theirs(
    tmp_path: Path,
) -> None:
    """A power loss can leave one queue without its last units while other queues reach past
    them ('abort' present: the broker was running). A broker's crash recovery dispatches
    every valid record from the file its checkpoint picks, so the units come back; recover
    dispatched only from where the queues end, past them, and put the queue's next record at
    the wrong queue offset (verify then found dispatch-hole and cq-unit-orphan). verify
    calls the missing units a hole without 'abort' (no start of a broker adds them) and lag
    with it (its crash recovery does, and so does rmqstore dispatch)."""
    store = tmp_path / "store"
    generate("cq-truncated", store)
    assert (
        "dispatch-hole" in json.loads(run_cli("verify", store, "--json").stdout)["findingsByKind"]
    )
    (store / "abort").touch()
    lagging = [
        finding["message"]
        for finding in json.loads(run_cli("verify", store, "--json").stdout)["findings"]
        if finding["kind"] == "dispatch-lag"
    ]
    assert lagging and all("so does a broker's crash recovery at start" in m for m in lagging)
    result = run_cli("recover", store, "--yes", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(run_cli("verify", store, "--json").stdout)["ok"]
    assert not (store / "abort").exists()


def test_a_recover_a_full_disk_stops_says_how_far_it_got_and_keeps_abort(tmp_path: Path) -> None:
    """A full disk stopping a recover (a normal one: 'abort' is its own) at each point in
    turn: one line that says whether it changed the store. Before it did, the store is as
    it was; after, 'abort' stays (a broker starting on the store runs its crash recovery,
    as after a crash) and the line names the quarantine folder. Run again with room, the
    recover finishes: the records the fixture promises, every one in its queue."""
    with small_filesystem(tmp_path, "4m") as disk:
        base = disk / "base"
        generate("garbage-after-end", base, FixtureOptions())
        (base / "abort").unlink()
        kept = json.loads((base / "fixture.json").read_text())["expect"]["recovery"]
        rooms = range(0, 48 << 10, 4 << 10)
        said = "what it cut or moved so far is kept in"
        for store in stops_on_a_full_disk(disk, base, "recover", ("--yes",), rooms, said):
            again = run_cli("recover", store, "--yes")
            assert again.exit_code == 0, again.stderr
            checked = json.loads(run_cli("verify", store, "--json").stdout)
            assert checked["ok"], checked["findings"]
            assert checked["checked"]["records"] == kept["recordsKept"]
            assert checked["checked"]["units"] == kept["recordsKept"]


def test_a_queue_folder_that_is_a_link_is_left_alone_and_said_so(tmp_path: Path) -> None:
    """recover follows no link out of the store: a topic's queue folder that is one is left
    as it is, and both the plan and the result say so (the result called the store
    consistent without a word of it); the verify after it names the link (exit 1)."""
    store = tmp_path / "store"
    generate("multi", store)
    (store / "abort").touch()
    elsewhere = tmp_path / "elsewhere"
    (store / "consumequeue" / "TopicTest").rename(elsewhere)
    (store / "consumequeue" / "TopicTest").symlink_to(elsewhere)
    before = tree_digest(elsewhere)
    planned = run_cli("recover", store, "--dry-run")
    said = f"left alone: {store / 'consumequeue' / 'TopicTest'}: a symbolic link to queue files"
    assert said in planned.stdout, planned.stdout
    done = run_cli("recover", store, "--yes")
    assert done.exit_code == 1, done.stderr  # completed; verify still finds the link
    assert "left alone" in done.stdout and "consistent, but for what was left alone" in done.stdout
    assert "verify still finds queue-link: 1; next step: rmqstore dispatch" in done.stderr
    assert tree_digest(elsewhere) == before


def test_a_crash_replay_goes_on_past_damage_in_a_file_crash_recovery_does_not_walk(
    oracle, tmp_path: Path
) -> None:
    """A real broker's crashed store (abort) whose index is gone and whose first file (of
    52) holds a damaged record; the checkpoint makes a broker's crash recovery walk only the
    last file. recover's replay catches the index up from the log's start and stopped at the
    damage: 'abort' stayed, the records a broker's crash recovery dispatches were left out of
    the index, verify named recover again, and each recover did the same (found by a fuzzer
    that runs recover twice on mutated stores). Now the replay goes on from where the crash
    recovery starts, as a broker's does, says so, and the store is settled."""
    source = oracle("s1_multi")
    store = source.copy_to(tmp_path)
    puts = source.manifest["puts"]
    damaged = puts[20]["physicalOffset"]
    with open(store / "commitlog" / f"{damaged - damaged % 65536:020d}", "r+b") as log_file:
        log_file.seek(damaged % 65536)
        log_file.write(struct.pack(">i", 1 << 30))  # TOTALSIZE out of bounds
    shutil.rmtree(store / "index")
    (store / "abort").write_bytes(b"")
    last_file = puts[-1]["physicalOffset"] // 65536 * 65536
    first_there = min(p["storeTimestamp"] for p in puts if p["physicalOffset"] >= last_file)
    checkpoint = read_checkpoint(store / "checkpoint")
    recovery_time = first_there + 3000  # a crash recovery starts 3 s before the checkpoint
    write_checkpoint(
        store / "checkpoint",
        replace(
            checkpoint,
            physic_msg_timestamp=recovery_time,
            logics_msg_timestamp=recovery_time,
            index_msg_timestamp=0,
        ),
    )
    result = run_cli("recover", store, "--yes", "--json", *ORACLE_OPTIONS)
    assert result.exit_code == 1, result.stderr
    document = json.loads(result.stdout)
    skipped = document["dispatch"]["damageSkipped"]
    assert (skipped["offset"], skipped["resumedAt"]) == (damaged, last_file)
    assert f"the replay went on from {last_file:,}, where that recovery starts" in result.stderr
    assert document["abortRemoved"] and not (store / "abort").exists()
    assert document["remaining"]["nextStep"] is None
    assert document["remaining"]["findingsByKind"]["index-hole"] == 1
    newest = puts[-1]
    found = run_cli("read", store, "--topic", newest["topic"], "--key",
                    newest["keys"].split()[0], "--json", *ORACLE_OPTIONS)  # fmt: skip
    assert newest["physicalOffset"] in [m["commitLogOffset"] for m in json.loads(found.stdout)]
    again = json.loads(run_cli("recover", store, "--dry-run", "--json", *ORACLE_OPTIONS).stdout)
    assert not again["plan"]["cuts"] and not again["plan"]["moves"]
    planned = run_cli("dispatch", store, "--dry-run", "--json", *ORACLE_OPTIONS)
    assert json.loads(planned.stdout)["behindBytes"] == 0
    reports = [
        json.loads(run_cli("verify", store, "--json", *ORACLE_OPTIONS, *more).stdout)
        for more in ((), ("--jobs", "2", "--split-size", "200000"))
    ]
    for report in reports:  # the records between the damage and that file: no rebuild adds them
        (hole,) = [f for f in report["findings"] if f["kind"] == "index-hole"]
        assert hole["fix"] == "none: report only" and f"{damaged:,}" in hole["message"]
        assert report["nextStep"] is None
    one, two = (sorted(map(str, report["findings"])) for report in reports)
    assert one == two


def test_abort_stays_where_a_normal_recovery_would_cut_what_the_crash_recovery_keeps(
    oracle, tmp_path: Path
) -> None:
    """A real broker's crashed store of two commit-log files whose first file holds a
    damaged record: its crash recovery starts at the second file and keeps every record, but
    without 'abort' a broker runs its normal recovery over the last three files, ends the
    log at the damage and deletes the second file. recover removed 'abort' (then verify
    named recover, which cut there). Now 'abort' stays, says why, and verify reports it
    with no next step."""
    source = oracle("s3_txn_delay")
    store = source.copy_to(tmp_path)
    puts = [p for p in source.manifest["puts"] if "physicalOffset" in p]
    damaged = max(p["physicalOffset"] for p in puts if p["physicalOffset"] < 65536)
    with open(store / "commitlog" / f"{0:020d}", "r+b") as log_file:
        log_file.seek(damaged)
        log_file.write(struct.pack(">i", 1 << 30))  # TOTALSIZE out of bounds
    (store / "abort").write_bytes(b"")
    result = run_cli("recover", store, "--yes", "--json", *ORACLE_OPTIONS)
    assert result.exit_code == 1, result.stderr
    document = json.loads(result.stdout)
    assert not document["plan"]["cuts"] and not document["plan"]["moves"][1:]  # the index tail
    assert not document["abortRemoved"] and (store / "abort").exists()
    assert (
        f"'abort' is kept: without it a broker's next start runs its normal recovery, which "
        f"walks the last three commit-log files, ends the log at offset {damaged:,}"
    ) in result.stderr
    assert document["remaining"]["nextStep"] is None
    report = json.loads(run_cli("verify", store, "--json", *ORACLE_OPTIONS).stdout)
    (abort,) = [f for f in report["findings"] if f["kind"] == "abort-present"]
    assert (
        abort["fix"] == "none: report only" and "recover and dispatch keep it" in abort["message"]
    )
    assert report["nextStep"] is None
    assert len(list((store / "commitlog").iterdir())) == 2


def test_queue_files_after_an_invalid_unit_go_as_a_brokers_load_deletes_them(
    oracle, tmp_path: Path
) -> None:
    """A crashed real broker's store whose queue TopicTest:0 has, in the first of its two
    files, a unit pointing far past the log and then an empty unit: a broker's load ends the
    queue at the empty unit and deletes the second file, and its recovery cuts the queue
    before the unit past the log. recover read the second file as the queue's last, cut
    nothing of the first, and its dispatch then refused the queue as pointing past the log
    (exit 2, 'abort' kept: verify named recover again)."""
    store = oracle("s2_crash").copy_to(tmp_path, "store_torn_half_record")
    queue = store / "consumequeue" / "TopicTest" / "0"
    with open(queue / "00000000000000000000", "r+b") as first:
        first.seek(20 * 20)
        first.write(struct.pack(">qiq", 10**12, 100, 0) + bytes(20))
    second = (queue / "00000000000000002000").read_bytes()
    plan = json.loads(run_cli("recover", store, "--dry-run", "--json", *ORACLE_OPTIONS).stdout)
    moved = [m for m in plan["plan"]["moves"] if m["file"].endswith("0/00000000000000002000")]
    assert len(moved) == 1 and "invalid unit" in moved[0]["why"]
    result = run_cli("recover", store, "--yes", *ORACLE_OPTIONS)
    assert result.exit_code in (0, 1), result.stderr
    kept = list((store / "quarantine").glob("*/consumequeue/TopicTest/0/00000000000000002000"))
    assert [path.read_bytes() for path in kept] == [second]
    units = (queue / "00000000000000000000").read_bytes()
    assert struct.pack(">q", 10**12) not in units  # cut; the crash replay put the rest back
    steps = []
    for _ in range(3):  # what verify then names mends the store
        report = json.loads(run_cli("verify", store, "--json", *ORACLE_OPTIONS).stdout)
        if report["nextStep"] is None:
            break
        steps.append(report["nextStep"])
        assert run_cli(*report["nextStep"].split()[1:], *ORACLE_OPTIONS).exit_code in (0, 1)
    assert report["ok"], (steps, report["findingsByKind"])


def test_a_queue_file_that_is_a_link_and_reaches_past_the_cut_is_named(
    oracle, tmp_path: Path
) -> None:
    """A real broker's store whose log recover cuts short (a body CRC fails in its first
    file), with the queue file of SCHEDULE_TOPIC_XXXX:17 a link out of the store: recover
    does not cut through the link, and refuses before it changes anything, naming that
    queue and the link (it said only that the consume queues point past the log; later it
    refused part way, with some cut already); what is outside is left alone. verify names
    the link (file-link) and the rebuild as the next step, after which recover cuts."""
    store = oracle("s3_txn_delay").copy_to(tmp_path)
    queue_file = store / "consumequeue" / "SCHEDULE_TOPIC_XXXX" / "17" / "00000000000000000000"
    outside = tmp_path / "outside-unit-file"
    queue_file.rename(outside)
    queue_file.symlink_to(outside)
    before = outside.read_bytes()
    with open(store / "commitlog" / "00000000000000000000", "r+b") as log_file:
        log_file.seek(47625)
        byte = log_file.read(1)[0]
        log_file.seek(47625)
        log_file.write(bytes([byte ^ 4]))
    unchanged = tree_digest(store)
    refused = run_cli("recover", store, "--yes", *ORACLE_OPTIONS)
    assert refused.exit_code == 2 and refused.stderr.count("\n") == 1
    assert f"{queue_file} is a symbolic link (to {outside})" in refused.stderr
    assert "consume queue of SCHEDULE_TOPIC_XXXX:17 is not written" in refused.stderr
    assert "run rmqstore dispatch --rebuild --yes first, then recover" in refused.stderr
    assert tree_digest(store) == unchanged and outside.read_bytes() == before
    report = json.loads(run_cli("verify", store, "--json", *ORACLE_OPTIONS).stdout)
    links = [f["file"] for f in report["findings"] if f["kind"] == "file-link"]
    assert links == ["consumequeue/SCHEDULE_TOPIC_XXXX/17/00000000000000000000"]
    assert report["nextStep"] == f"rmqstore dispatch {store} --rebuild --yes"
    assert run_cli("dispatch", store, "--rebuild", "--yes", *ORACLE_OPTIONS).exit_code == 0
    assert run_cli("recover", store, "--yes", *ORACLE_OPTIONS).exit_code in (0, 1)
    assert outside.read_bytes() == before


def rebuild_then_recover_ends_sound(store: Path) -> None:
    """The steps verify names for a store recover refused until a rebuild: the rebuild,
    then recover; verify finds it sound after them."""
    assert run_cli("dispatch", store, "--rebuild", "--yes", *ORACLE_OPTIONS).exit_code == 0
    assert run_cli("recover", store, "--yes", *ORACLE_OPTIONS).exit_code == 0
    assert json.loads(run_cli("verify", store, "--json", *ORACLE_OPTIONS).stdout)["ok"]


@pytest.mark.parametrize("what", ["fifo", "folder"])
def test_what_is_not_a_file_under_a_queue_files_name_stops_recover_before_it_changes_anything(
    oracle, tmp_path: Path, what: str
) -> None:
    """A crashed real broker's store ('abort') with a FIFO or a folder under the name of a
    queue's second file: recover stopped part way (what it cut already in quarantine) when
    its replay came to make that file, and verify named recover again and again. Now
    recover refuses before it changes anything, and verify names the rebuild first; after
    it, recover and verify end sound."""
    store = oracle("s2_crash").copy_to(tmp_path)
    second = store / "consumequeue" / "TopicTest" / "1" / "00000000000000002000"
    second.unlink()
    if what == "fifo":
        os.mkfifo(second)
    else:
        second.mkdir()
    before = tree_digest(store)
    refused = run_cli("recover", store, "--yes", *ORACLE_OPTIONS)
    assert refused.exit_code == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert f"{second} is not a regular file" in refused.stderr
    assert "run rmqstore dispatch --rebuild --yes first, then recover" in refused.stderr
    assert tree_digest(store) == before
    report = json.loads(run_cli("verify", store, "--json", *ORACLE_OPTIONS).stdout)
    assert (
        report["findingsByKind"]["cq-layout"] == 1 and "abort-present" in report["findingsByKind"]
    )
    assert report["nextStep"] == f"rmqstore dispatch {store} --rebuild --yes"
    rebuild_then_recover_ends_sound(store)


def test_an_index_file_that_is_a_link_stops_recover_before_it_changes_anything(
    oracle, tmp_path: Path
) -> None:
    """A crashed real broker's store ('abort') whose last index file is a link out of the
    store: recover stopped part way when its dispatch came to write the index (some already
    cut to quarantine), and verify named recover again. Now every writer refuses before it
    changes anything, verify reports file-link and names the rebuild first, and after it
    recover and verify end sound; the file outside is never written."""
    store = oracle("s2_crash").copy_to(tmp_path)
    last = sorted((store / "index").iterdir())[-1]
    outside = tmp_path / "outside-index-file"
    last.rename(outside)
    last.symlink_to(outside)
    before, kept = tree_digest(store), outside.read_bytes()
    for command in (["recover", "--yes"], ["dispatch"], ["recover", "--dry-run"]):
        refused = run_cli(*command, store, *ORACLE_OPTIONS)
        assert refused.exit_code == 2 and refused.stderr.count("\n") == 1, refused.stderr
        assert f"{last} is a symbolic link (to {outside})" in refused.stderr
    assert tree_digest(store) == before
    report = json.loads(run_cli("verify", store, "--json", *ORACLE_OPTIONS).stdout)
    assert [f["file"] for f in report["findings"] if f["kind"] == "file-link"] == [
        f"index/{last.name}"
    ]
    assert report["nextStep"] == f"rmqstore dispatch {store} --rebuild --yes"
    rebuild_then_recover_ends_sound(store)
    assert outside.read_bytes() == kept


def test_a_kept_unit_longer_than_the_log_stops_recover_before_it_changes_anything(
    oracle, tmp_path: Path
) -> None:
    """A crashed real broker's store whose recovery cuts the log at a damaged record, and a
    consume-queue unit before the cut whose size a disk damaged (2^30): the truncation keeps
    it (its record starts before the cut), and the re-dispatch after the cuts refused the
    queue for reaching past the log, so recover stopped part way, and verify named recover
    again and again (the next-steps campaign, seed 7). Now recover's plan refuses it before
    anything changes, verify names the rebuild (recoverRefused says why), and after it
    recover and verify end sound."""
    store = oracle("s2_crash").copy_to(tmp_path)
    with open(store / "commitlog" / "00000000000001245184", "r+b") as log_file:
        log_file.seek(7890)
        log_file.write(bytes(59))  # in the body of the record at 1,252,900
    queue_file = store / "consumequeue" / "TopicTest" / "0" / "00000000000000000000"
    data = bytearray(queue_file.read_bytes())
    units = [struct.unpack_from(">qiq", data, at) for at in range(0, len(data), 20)]
    last = max(n for n, (offset, size, _) in enumerate(units) if size > 0 and offset < 1252900)
    struct.pack_into(">i", data, last * 20 + 8, 1 << 30)
    queue_file.write_bytes(bytes(data))
    before = tree_digest(store)
    refused = run_cli("recover", store, "--yes", *ORACLE_OPTIONS)
    assert refused.exit_code == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "the consume queue of TopicTest:0 would still reach past the log's valid end" in (
        refused.stderr
    )
    assert tree_digest(store) == before
    for jobs in ([], ["--jobs", "2", "--split-size", "300000"]):
        report = json.loads(run_cli("verify", store, "--json", *jobs, *ORACLE_OPTIONS).stdout)
        assert report["nextStep"] == f"rmqstore dispatch {store} --rebuild --yes"
        assert "TopicTest:0 would still reach past" in report["recoverRefused"]
    rebuild_then_recover_ends_sound(store)


def test_a_recovery_that_deletes_files_cuts_where_the_next_start_would_cut(
    oracle, tmp_path: Path
) -> None:
    """A real broker's store, no 'abort', with a damaged record in the third-last commit-log
    file (where a normal recovery starts walking) and one in the file before it. A broker's
    start ends the log at the first and deletes the last two files; its next start walks the
    last three files left, meets the second, ends the log there and deletes the files after
    it (with whatever was appended between the two starts). recover cut at the first only: a
    second recover cut again, and verify named recover again. Now the first recover cuts at
    the earlier damage, into quarantine, and leaves a store no broker start cuts."""
    source = oracle("s1_multi")
    store = source.copy_to(tmp_path)
    size = 65536
    starts = sorted(int(path.name) for path in (store / "commitlog").iterdir())
    puts = [put["physicalOffset"] for put in source.manifest["puts"] if "physicalOffset" in put]
    later = max(offset for offset in puts if starts[-3] <= offset < starts[-3] + size)
    earlier = max(offset for offset in puts if starts[-4] <= offset < starts[-4] + size)
    for offset, start in ((later, starts[-3]), (earlier, starts[-4])):
        with open(store / "commitlog" / f"{start:020d}", "r+b") as log_file:
            log_file.seek(offset - start)
            log_file.write(struct.pack(">i", 1 << 30))  # TOTALSIZE out of bounds
    report = json.loads(run_cli("verify", store, "--json", *ORACLE_OPTIONS).stdout)
    assert report["nextStep"] == f"rmqstore recover {store} --yes"
    planned = run_cli("recover", store, "--dry-run", "--json", *ORACLE_OPTIONS)
    plan = json.loads(planned.stdout)["plan"]
    assert plan["logEnd"] == earlier
    moved = sorted(Path(move["file"]).name for move in plan["moves"] if "commitlog" in move["file"])
    assert moved == [f"{start:020d}" for start in starts[-3:]]
    gone = {start: (store / "commitlog" / f"{start:020d}").read_bytes() for start in starts[-3:]}
    result = run_cli("recover", store, "--yes", "--json", *ORACLE_OPTIONS)
    assert result.exit_code in (0, 1), result.stderr
    assert json.loads(result.stdout)["abortRemoved"] and not (store / "abort").exists()
    for start, data in gone.items():  # whole, in quarantine
        (kept,) = (store / "quarantine").glob(f"*/commitlog/{start:020d}")
        assert kept.read_bytes() == data
    again = json.loads(run_cli("recover", store, "--dry-run", "--json", *ORACLE_OPTIONS).stdout)
    assert not again["plan"]["cuts"] and not again["plan"]["moves"]
    for more in ((), ("--jobs", "2", "--split-size", "200000")):
        report = json.loads(run_cli("verify", store, "--json", *ORACLE_OPTIONS, *more).stdout)
        assert report["ok"], report["findings"]
