"""``rmqstore verify`` from the command line."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from support import ORACLE_OPTIONS, lock_held_elsewhere, run_cli


def test_sound_store_exits_0_with_the_documented_json(oracle) -> None:
    result = run_cli("verify", oracle("v533_s1_multi").store, "--json", *ORACLE_OPTIONS)
    assert result.exit_code == 0, result.stdout
    report = json.loads(result.stdout)
    assert report["ok"] is True and report["findings"] == []
    assert report["checked"]["records"] == 3002 and report["checked"]["units"] == 3002
    assert report["checked"]["indexedRecords"] == 3002
    assert set(report) == {
        "ok", "nextStep", "rebuildRefusedAt", "recoverRefused", "findings", "findingsByKind",
        "truncated", "checked"
    }  # fmt: skip
    assert report["nextStep"] is None and report["rebuildRefusedAt"] is None


def test_findings_exit_1_and_name_kind_and_position(oracle) -> None:
    crash = oracle("s2_crash")
    result = run_cli("verify", crash.root / "store_torn_half_record", "--json", *ORACLE_OPTIONS)
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    torn = [f for f in report["findings"] if f["kind"] == "torn-tail"]
    assert torn == [
        {
            "kind": "torn-tail",
            "severity": "error",
            "file": "commitlog/00000000000001900544",
            "filePosition": crash.manifest["lastValidEnd"] - 1900544,
            "commitLogOffset": crash.manifest["lastValidEnd"],
            "topic": None,
            "queueId": None,
            "queueOffset": None,
            "message": torn[0]["message"],
            "fix": f"rmqstore recover {crash.root / 'store_torn_half_record'} --yes",
        }
    ]
    assert report["nextStep"] == torn[0]["fix"]
    human = run_cli("verify", crash.root / "store_torn_half_record", *ORACLE_OPTIONS)
    assert human.exit_code == 1 and "torn-tail" in human.stdout
    assert f"next step: {torn[0]['fix']}" in human.stdout


def test_commitlog_only_and_topic_selection(oracle) -> None:
    crash = oracle("s2_crash")
    only = json.loads(
        run_cli("verify", crash.store, "--json", "--commitlog-only", *ORACLE_OPTIONS).stdout
    )
    assert set(only["findingsByKind"]) == {"abort-present"}
    one = json.loads(
        run_cli("verify", crash.store, "--json", "--topic", "TopicTest", *ORACLE_OPTIONS).stdout
    )
    lag = [f for f in one["findings"] if f["kind"] == "dispatch-lag"]
    assert len(lag) == 4 and all("TopicTest" in f["file"] for f in lag)


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_topic_selection_of_a_sound_store_is_sound(tmp_path: Path, jobs: str) -> None:
    """The checkpoint's consume-queue time vouches for every queue: with --topic it was
    compared with the newest record of the chosen topics' queues alone, so a sound store
    was reported as having a checkpoint ahead of its data (exit 1, next step flush)."""
    from rmqstore.fixtures import generate

    store = tmp_path / "store"
    manifest = generate("multi", store)
    topics = sorted({message["topic"] for message in manifest["messages"]})
    assert len(topics) == 3
    for topic in topics:
        result = run_cli("verify", store, "--topic", topic, "--jobs", jobs, "--json")
        assert result.exit_code == 0, result.stdout
        assert json.loads(result.stdout)["checked"]["consumeQueues"] == 4
    typo = run_cli("verify", store, "--topic", "NoSuch", "--topic", "Other", "--jobs", jobs)
    assert typo.exit_code == 0, typo.stdout
    assert "consume queues  none of topics 'NoSuch', 'Other'" in typo.stdout
    index_only = run_cli("verify", store, "--only", "index", "--topic", topics[0], "--jobs", jobs)
    assert index_only.exit_code == 0, index_only.stdout
    assert "consume queues" not in index_only.stdout  # not checked: not said to be missing
    # a checkpoint that is ahead is still found: of the commit log with --topic, of the
    # consume queues without
    stale = tmp_path / "stale"
    generate("stale-checkpoint", stale)
    chosen = json.loads(
        run_cli("verify", stale, "--topic", topics[0], "--jobs", jobs, "--json").stdout
    )
    assert [f["filePosition"] for f in chosen["findings"] if f["kind"] == "checkpoint-future"] == [
        0
    ]
    whole = json.loads(run_cli("verify", stale, "--jobs", jobs, "--json").stdout)
    ahead = [f["filePosition"] for f in whole["findings"] if f["kind"] == "checkpoint-future"]
    assert 0 in ahead and 8 in ahead


def test_a_store_held_by_a_broker_is_verified_with_a_warning(oracle, tmp_path: Path) -> None:
    store = oracle("s1_multi").copy_to(tmp_path)
    with lock_held_elsewhere(store / "lock"):
        result = run_cli("verify", store, *ORACLE_OPTIONS)
    assert result.exit_code == 0
    assert "locked" in result.stderr


def _verify_json(store: Path, *options: str) -> tuple[int, dict]:
    result = run_cli("verify", store, "--json", *options)
    return result.exit_code, json.loads(result.stdout)


def test_a_store_a_writer_takes_while_verify_runs_names_verify_again_as_the_next_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's lock was free when verify began; an append then wrote a record (here
    run in verify's own process as its pass reads the log, as one of another process
    would): verify says the store changed and names no repair (a record half written would
    read as a torn tail, for recover to cut), but verify again."""
    import contextlib

    from rmqstore.commands import verify

    store = tmp_path / "store"
    lines = "".join(json.dumps({"topic": "T0", "body": "x" * 900}) + "\n" for _ in range(200))
    created = run_cli("append", store, "--create", "--dispatch", "--input", "-",
                      "--commitlog-file-size", "65536", input=lines)  # fmt: skip
    assert created.exit_code == 0, created.stderr

    @contextlib.contextmanager
    def writing_beside(*_: object) -> Iterator[Callable[[int], None]]:
        written = []

        def update(_: int) -> None:
            if not written:
                written.append(run_cli("append", store, "--topic", "T1", "--body", "y"))

        yield update
        assert written and written[0].exit_code == 0, written

    monkeypatch.setattr(verify, "progress_bar", writing_beside)
    result = run_cli("verify", store)
    assert result.exit_code == 1
    assert "store-changed" in result.stdout
    assert "next step: verify again once no other process writes the store" in result.stdout
    monkeypatch.undo()
    exit_code, report = _verify_json(store)  # at rest: the append left 'abort' (no dispatch)
    assert exit_code == 1 and "store-changed" not in report["findingsByKind"]
    assert report["nextStep"] == f"rmqstore recover {store} --yes"


@pytest.mark.plumbing
def test_a_store_a_writer_appends_to_is_checked_as_it_stood_and_sound(tmp_path: Path) -> None:
    """A real writer (append, with its dispatch) holds the lock and writes while verify
    runs again and again, whole and in ranges: what a running broker has by design is a
    note, never a problem, and each run checks more records."""
    store = tmp_path / "store"
    created = run_cli("append", store, "--create", "--dispatch", "--topic", "T0",
                      "--body", "first", "--commitlog-file-size", str(4 << 20))  # fmt: skip
    assert created.exit_code == 0, created.stderr
    writer = subprocess.Popen(
        [sys.executable, "-m", "rmqstore", "append", str(store), "--input", "-", "--dispatch",
         "--flush", "async", "--flush-interval", "20"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    assert writer.stdin is not None
    stop = threading.Event()

    def feed() -> None:
        number = 0
        while not stop.is_set():
            for _ in range(50):
                line = {"topic": f"T{number % 3}", "queueId": number % 4, "keys": f"k{number}",
                        "tags": "a", "body": "x" * (40 + number % 700)}  # fmt: skip
                writer.stdin.write((json.dumps(line) + "\n").encode())
                number += 1
            writer.stdin.flush()
            time.sleep(0.005)

    feeder = threading.Thread(target=feed)
    feeder.start()
    checked = []
    try:
        # the writer is up (it makes 'abort' as it starts writing, once it has learnt the
        # queue offsets: a second or more on a loaded machine) and rolling files
        deadline = time.monotonic() + 60
        while not (store / "abort").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)
        for options in [(), ("--jobs", "2", "--split-size", str(1 << 20))] * 3:
            exit_code, report = _verify_json(store, *options)
            problems = [f for f in report["findings"] if f["severity"] != "note"]
            assert exit_code == 0 and report["ok"] and not problems, problems
            assert report["findingsByKind"]["store-live"] == 1
            assert report["findingsByKind"]["abort-present"] == 1
            checked.append(report["checked"]["records"])
    finally:
        stop.set()
        feeder.join()
        writer.stdin.close()
        assert writer.wait(timeout=120) == 0
    assert checked == sorted(checked) and checked[-1] > checked[0]
    exit_code, report = _verify_json(store)  # the writer has stopped: checked whole
    assert exit_code == 0 and report["findings"] == []
    assert report["checked"]["records"] > checked[-1]


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_damage_in_a_store_a_broker_holds_is_found_and_the_next_step_waits_for_it(
    oracle, tmp_path: Path, jobs: str
) -> None:
    """With the lock held, the log's data ends where its last non-zero byte was when verify
    began: a record damaged before that (here a body byte of the last file's first record)
    is damage, not the end of what a broker wrote, and the records after it are checked."""
    store = oracle("s1_multi").copy_to(tmp_path)
    last_file = sorted((store / "commitlog").iterdir())[-1]
    with open(last_file, "r+b") as handle:  # its first record's body is 2,818 bytes
        byte = os.pread(handle.fileno(), 1, 1000)
        os.pwrite(handle.fileno(), bytes([byte[0] ^ 0xFF]), 1000)
    split = ("--split-size", "65536") if jobs == "2" else ()
    with lock_held_elsewhere(store / "lock"):
        result = run_cli("verify", store, *ORACLE_OPTIONS, "--jobs", jobs, *split)
        exit_code, report = _verify_json(store, *ORACLE_OPTIONS, "--jobs", jobs, *split)
    assert result.exit_code == exit_code == 1
    kinds = report["findingsByKind"]
    assert kinds.get("record-body-crc", 0) + kinds.get("record-invalid", 0) >= 1, kinds
    assert kinds["store-live"] == 1
    assert "stop the process that holds the store's lock, then rmqstore" in result.stdout


def test_a_torn_tail_under_a_held_lock_is_damage_not_a_record_being_written(
    tmp_path: Path,
) -> None:
    generated = run_cli("fixtures", "generate", "torn-tail", tmp_path / "torn")
    assert generated.exit_code == 0, generated.stderr
    store = tmp_path / "torn"
    with lock_held_elsewhere(store / "lock"):
        exit_code, report = _verify_json(store)
    assert exit_code == 1
    invalid = [f for f in report["findings"] if f["kind"] == "record-invalid"]
    assert invalid and "drop what the broker has written after it" in invalid[0]["message"]


def test_stores_written_by_append_dispatch_pass_the_broker_checks(tmp_path: Path) -> None:
    store = tmp_path / "store"
    lines = "".join(
        json.dumps(
            {
                "topic": ["A", "B", "%RETRY%" + "g" * 130][i % 3],
                "queueId": i % 3,
                "keys": f"k{i} shared",
                "tags": ["x", "y"][i % 2],
                "body": "b" * (i % 300),
                **({"properties": {"DELAY": "2"}} if i % 17 == 0 else {}),
            }
        )
        + "\n"
        for i in range(600)
    )
    result = run_cli(
        "append",
        store,
        "--create",
        "--commitlog-file-size",
        "16384",
        "--consumequeue-file-size",
        "400",
        "--index-slots",
        "64",
        "--index-entries",
        "256",
        "--input",
        "-",
        "--dispatch",
        input=lines,
    )
    assert result.exit_code == 0, result.stderr
    report = run_cli("verify", store, "--json", "--index-slots", "64", "--index-entries", "256")
    document = json.loads(report.stdout)
    assert report.exit_code == 0, document["findings"]
    assert document["checked"]["indexFiles"] > 1 and document["checked"]["commitLogFiles"] > 5
    assert (store / "consumequeue" / "SCHEDULE_TOPIC_XXXX" / "1").is_dir()


def test_damage_is_reported_through_the_cli(oracle, tmp_path: Path) -> None:
    store = oracle("s1_multi").copy_to(tmp_path)
    put = oracle("s1_multi").manifest["puts"][1500]
    path = store / "commitlog" / f"{put['physicalOffset'] - put['physicalOffset'] % 65536:020d}"
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, struct.pack(">i", put["bodyCRC"] ^ 7), put["physicalOffset"] % 65536 + 8)
    finally:
        os.close(fd)
    result = run_cli("verify", store, "--json", *ORACLE_OPTIONS)
    assert result.exit_code == 1
    (finding,) = json.loads(result.stdout)["findings"]
    assert (finding["kind"], finding["commitLogOffset"]) == (
        "record-body-crc",
        put["physicalOffset"],
    )
    assert run_cli("verify", store, "--no-crc", *ORACLE_OPTIONS).exit_code == 0


def test_damage_where_recovery_does_not_walk_sends_to_no_command(oracle, tmp_path: Path) -> None:
    """Damage in a commit-log file before those a broker's recovery walks (the first of 52)
    is cut by no recovery, rmqstore's included, and a replay of the log stops at it. verify
    named `recover` as the fix, and after it `recover` again, and so on; the records after
    it that no dispatch reaches were lags `dispatch` was said to add. They are named for
    what they are, with no command to run."""
    import shutil

    store = oracle("s1_multi").copy_to(tmp_path)
    with open(store / "commitlog" / "00000000000000000000", "r+b") as log_file:
        log_file.seek(31261)  # a record's TOTALSIZE
        log_file.write(struct.pack(">i", -(2**31)))
    result = run_cli("verify", store, "--json", *ORACLE_OPTIONS)
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    (damage,) = [f for f in report["findings"] if f["kind"] == "record-invalid"]
    assert damage["commitLogOffset"] == 31261 and damage["fix"] == "none: report only"
    assert "a broker's recovery does not walk" in damage["message"]
    assert report["nextStep"] is None  # the broker's queues hold the records after it

    shutil.rmtree(store / "consumequeue")
    shutil.rmtree(store / "index")
    recovered = run_cli("recover", store, "--yes", *ORACLE_OPTIONS)
    assert recovered.exit_code == 1 and "damaged at offset 31,261" in recovered.stderr
    report = json.loads(run_cli("verify", store, "--json", *ORACLE_OPTIONS).stdout)
    lags = [f for f in report["findings"] if f["kind"] in ("dispatch-lag", "index-lag")]
    assert lags and all(f["fix"] == "none: report only" for f in lags)
    assert all("after the damage at offset 31,261" in f["message"] for f in lags)
    assert report["nextStep"] is None
    human = run_cli("verify", store, *ORACLE_OPTIONS)
    assert "none of these is mended by a command" in human.stdout

    # a body CRC that fails where recovery does not walk: the broker keeps the record
    flipped = oracle("s1_multi").copy_to(tmp_path / "crc")
    put = oracle("s1_multi").manifest["puts"][3]
    with open(flipped / "commitlog" / "00000000000000000000", "r+b") as log_file:
        log_file.seek(put["physicalOffset"] + 8)
        log_file.write(struct.pack(">i", put["bodyCRC"] ^ 7))
    report = json.loads(run_cli("verify", flipped, "--json", *ORACLE_OPTIONS).stdout)
    (crc,) = report["findings"]
    assert crc["kind"] == "record-body-crc" and crc["fix"] == "none: report only"
    assert report["nextStep"] is None


def _spoil_the_last_units_tags_code(store: Path) -> int:
    """Change the tagsCode of the last unit of TopicTest:0; returns its queue offset."""
    newest = max((store / "consumequeue" / "TopicTest" / "0").iterdir())
    data = newest.read_bytes()
    units = len(data.rstrip(b"\0")) // 20 + (len(data.rstrip(b"\0")) % 20 > 0)
    with open(newest, "r+b") as queue_file:
        queue_file.seek((units - 1) * 20 + 12)
        queue_file.write(struct.pack(">q", 12345))
    return int(newest.name) // 20 + units - 1


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_what_only_a_rebuild_mends_sends_to_no_command_when_the_rebuild_refuses(
    oracle, tmp_path: Path, jobs: str
) -> None:
    """A consume-queue unit only a rebuild mends, in a log whose replay stops at damage in
    a file a broker's recovery does not walk: the rebuild refuses that log, so verify named
    a command that only failed (recover, then dispatch --rebuild, then an error)."""
    spoilt = oracle("s1_multi").copy_to(tmp_path / "queue")
    unit = _spoil_the_last_units_tags_code(spoilt)
    report = json.loads(run_cli("verify", spoilt, "--json", *ORACLE_OPTIONS).stdout)
    assert report["nextStep"].endswith("--rebuild --yes") and report["rebuildRefusedAt"] is None

    store = oracle("s1_multi").copy_to(tmp_path / "both")
    assert _spoil_the_last_units_tags_code(store) == unit
    with open(store / "commitlog" / "00000000000000000000", "r+b") as log_file:
        log_file.seek(31261)  # a record's TOTALSIZE
        log_file.write(struct.pack(">i", -(2**31)))
    result = run_cli("verify", store, "--json", "--jobs", jobs, *ORACLE_OPTIONS)
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["nextStep"] is None and report["rebuildRefusedAt"] == 31261
    (spoilt_unit,) = [f for f in report["findings"] if f["kind"] == "cq-unit"]
    assert (spoilt_unit["topic"], spoilt_unit["queueOffset"]) == ("TopicTest", unit)
    assert spoilt_unit["fix"] == "none: report only"
    human = run_cli("verify", store, "--jobs", jobs, *ORACLE_OPTIONS)
    assert "dispatch --rebuild refuses the log (a replay of it stops at the damage at " in (
        human.stdout
    )
    refused = run_cli("dispatch", store, "--rebuild", "--yes", *ORACLE_OPTIONS)
    assert refused.exit_code == 2 and "damaged at offset 31,261" in refused.stderr


@pytest.mark.parametrize("damaged", ["consumequeue/TopicTest/0/00000000000000000000", "index"])
def test_a_file_of_the_wrong_size_sends_to_a_rebuild_before_recover(
    oracle, tmp_path: Path, damaged: str
) -> None:
    """A crashed store (torn tail, 'abort') with a consume-queue or index file cut short:
    recover refuses such a store, and verify named recover; the rebuild comes first now,
    recover's refusal names it, and following the next steps ends with a sound store."""
    store = oracle("s2_crash").copy_to(tmp_path, "store_torn_half_record")
    target = min((store / damaged).iterdir()) if damaged == "index" else store / damaged
    os.truncate(target, 345)
    refused = run_cli("recover", store, "--yes", *ORACLE_OPTIONS)
    assert refused.exit_code == 2 and "dispatch --rebuild --yes builds the" in refused.stderr
    steps = []
    for _ in range(4):
        report = json.loads(run_cli("verify", store, "--json", *ORACLE_OPTIONS).stdout)
        if report["nextStep"] is None:
            break
        steps.append(report["nextStep"].split()[1])
        done = run_cli(*report["nextStep"].split()[1:], *ORACLE_OPTIONS)
        assert done.exit_code in (0, 1), done.stderr
    assert steps == ["dispatch", "recover"] and report["ok"], report["findingsByKind"]


def test_every_queue_or_index_file_one_wrong_size_sends_to_no_rebuild(oracle) -> None:
    """Sizes given that are not the broker's make every file the wrong size: a rebuild
    would write every queue, or the index, again in those sizes."""
    store = oracle("s1_multi").store
    for wrong in (["--consumequeue-file-size", "4000"], ["--index-slots", "100"]):
        options = [*ORACLE_OPTIONS, *wrong]  # the later option counts
        report = json.loads(run_cli("verify", store, "--json", *options).stdout)
        sized = [f for f in report["findings"] if f["kind"].endswith("file-size")]
        assert sized and all(f["fix"] == "none: report only" for f in sized)
        assert report["nextStep"] is None


def test_a_property_crc_recovery_does_not_check_sends_to_no_command(tmp_path: Path) -> None:
    """A 5.x record whose __CRC32# property does not match it, in a file recovery walks: a
    broker's recovery cuts the log there only with forceVerifyPropCRC=true. verify named
    `recover` for it whatever the setting, and after it `recover` again (found by a fuzzer
    that follows verify's next step on mutated stores)."""
    from rmqstore.fixtures import generate

    store = tmp_path / "store"
    generate("v2", store)
    last = sorted((store / "commitlog").iterdir())[-1]
    data = last.read_bytes()
    at = data.index(b"__CRC32#\x01") + 9
    with open(last, "r+b") as log_file:
        log_file.seek(at)
        log_file.write(b"9" if data[at : at + 1] != b"9" else b"8")
    report = json.loads(run_cli("verify", store, "--json").stdout)
    (finding,) = report["findings"]
    assert finding["kind"] == "record-property-crc" and finding["fix"] == "none: report only"
    assert "forceVerifyPropCRC=true" in finding["message"] and report["nextStep"] is None
    config = tmp_path / "broker.conf"
    config.write_text("forceVerifyPropCRC=true\n")
    forced = json.loads(run_cli("verify", store, "--json", "--broker-config", config).stdout)
    assert [f["kind"] for f in forced["findings"]] == ["record-property-crc"]
    assert forced["nextStep"] == f"rmqstore recover {store} --yes"


def test_queue_findings_after_a_gap_in_the_logs_queue_offsets_send_to_no_command(
    oracle, tmp_path: Path
) -> None:
    """A record whose QUEUEOFFSET was damaged (no CRC covers it): its queue's offsets in the
    log have a gap, and the unit the broker wrote for it no longer matches it. verify named
    `dispatch --rebuild`, which writes the same unit there (a broker, and a rebuild, append
    each unit at the end of its queue), and then named it again (found by a fuzzer that
    follows verify's next step on mutated stores). The queue's findings are report only."""
    store = oracle("s1_multi").copy_to(tmp_path)
    put = oracle("s1_multi").manifest["puts"][2990]
    offset = put["physicalOffset"]
    with open(store / "commitlog" / f"{offset - offset % 65536:020d}", "r+b") as log_file:
        log_file.seek(offset % 65536 + 20)  # QUEUEOFFSET
        log_file.write(struct.pack(">q", put["queueOffset"] + 1000))
    report = json.loads(run_cli("verify", store, "--json", *ORACLE_OPTIONS).stdout)
    assert report["findingsByKind"] == {
        "cq-unit-orphan": 1,
        "dispatch-hole": 1,
        "queue-offset-gap": 1,
    }
    assert all(f["fix"] == "none: report only" for f in report["findings"])
    assert report["nextStep"] is None
    (gap,) = [f for f in report["findings"] if f["kind"] == "queue-offset-gap"]
    assert "append each unit at the end of the queue" in gap["message"]
    ranged = run_cli("verify", store, "--json", "--jobs", "2", "--split-size", "20000",
                     *ORACLE_OPTIONS)  # fmt: skip
    findings = json.loads(ranged.stdout)["findings"]
    assert sorted(map(str, findings)) == sorted(map(str, report["findings"]))


def test_a_flushed_checkpoint_vouches_for_the_units_after_a_queue_offset_gap(
    tmp_path: Path,
) -> None:
    """A record of the newest record's queue whose topic was damaged (no CRC covers it)
    leaves a gap in that queue's offsets: a rebuild appends the units after it at the end of
    the queue, so none of them matches its record's queue offset. flush sets
    logicsMsgTimestamp to the newest record the queues hold, which is in that queue; verify
    counted only matching units, reported the checkpoint ahead of the queues and named
    `flush`, then again (found by a fuzzer that follows verify's next step). A checkpoint
    that is truly ahead is still reported."""
    from rmqstore.checkpoint import read_checkpoint, write_checkpoint
    from rmqstore.fixtures import generate

    store = tmp_path / "store"
    generate("multi", store)
    listing = run_cli("read", store, "--from-offset", "0", "--jsonl").stdout
    records = [json.loads(line) for line in listing.splitlines()]
    newest = records[-1]
    queue = [
        r for r in records if (r["topic"], r["queueId"]) == (newest["topic"], newest["queueId"])
    ]
    damaged = queue[-3]
    files = sorted((store / "commitlog").iterdir())
    file_size = files[0].stat().st_size
    log_file = files[damaged["commitLogOffset"] // file_size]
    data = bytearray(log_file.read_bytes())
    topic = damaged["topic"].encode()
    at = data.index(topic, damaged["commitLogOffset"] % file_size + 60) + len(topic) - 1
    data[at] ^= 1
    log_file.write_bytes(bytes(data))
    for command in (("dispatch", "--rebuild", "--yes"), ("flush",)):
        assert run_cli(command[0], store, *command[1:]).exit_code == 0
    assert read_checkpoint(store / "checkpoint").logics_msg_timestamp == newest["storeTimestamp"]
    for options in ((), ("--jobs", "2", "--split-size", "20000")):
        report = json.loads(run_cli("verify", store, "--json", *options).stdout)
        assert "queue-offset-gap" in report["findingsByKind"], options
        assert "checkpoint-future" not in report["findingsByKind"], options
        assert report["nextStep"] is None, options
    ahead = read_checkpoint(store / "checkpoint")
    write_checkpoint(
        store / "checkpoint",
        replace(ahead, logics_msg_timestamp=newest["storeTimestamp"] + 1),
    )
    report = json.loads(run_cli("verify", store, "--json").stdout)
    assert report["findingsByKind"]["checkpoint-future"] == 1
    assert report["nextStep"] == f"rmqstore flush {store}"


def test_records_the_index_skipped_inside_its_range_send_to_a_rebuild(tmp_path: Path) -> None:
    """An index that holds the records from some offset on but not those before it (a
    broker's crash recovery with messageIndexSafe=false loses entries so; here a dispatch
    --from-offset into an empty index). verify reported them as index-lag with `dispatch`
    as the next step, which resumes where the index ends and adds nothing, then named it
    again. They are index-hole now, mended by a rebuild, on every engine."""
    from rmqstore.fixtures import generate

    store = tmp_path / "store"
    generate("multi", store)
    shutil.rmtree(store / "index")
    listing = run_cli("read", store, "--from-offset", "0", "--jsonl").stdout.splitlines()
    middle = json.loads(listing[len(listing) // 2])["commitLogOffset"]
    assert run_cli("dispatch", store, "--from-offset", middle).exit_code == 0
    for options in ((), ("--jobs", "2", "--split-size", "65536")):
        report = json.loads(run_cli("verify", store, "--json", *options).stdout)
        assert report["findingsByKind"] == {"index-hole": 1}, options
        assert report["nextStep"] == f"rmqstore dispatch {store} --rebuild --yes"
    assert run_cli("dispatch", store, "--dry-run", "--json").exit_code == 0  # nothing to do
    assert run_cli("dispatch", store, "--rebuild", "--yes").exit_code == 0
    assert json.loads(run_cli("verify", store, "--json").stdout)["ok"]


def test_queues_that_end_past_a_file_cut_short_are_findings_not_an_internal_error(
    oracle, tmp_path: Path
) -> None:
    """A crashed real broker's store with a middle commit-log file deleted and a later one
    cut short, so the consume queues end past that file's bytes: verify's look for where a
    dispatch resumes scanned from there and stopped with an internal error (found by the
    mutant campaign, seed 20261226). Now a scan from past a file's bytes finds no record,
    and verify reports the store on every engine."""
    store = oracle("s2_crash").copy_to(tmp_path)
    (store / "commitlog" / f"{1179648:020d}").unlink()
    os.truncate(store / "commitlog" / f"{1572864:020d}", 31330)
    reports = [
        run_cli("verify", store, "--json", *ORACLE_OPTIONS, *more)
        for more in ((), ("--jobs", "2", "--split-size", "65536"))
    ]
    for report in reports:
        assert report.exit_code == 1, report.stderr
        kinds = json.loads(report.stdout)["findingsByKind"]
        assert {"file-gap", "file-size"} <= set(kinds)
    one, two = (sorted(map(str, json.loads(r.stdout)["findings"])) for r in reports)
    assert one == two


def test_a_commit_log_file_cut_short_is_a_finding_not_an_error(oracle, tmp_path: Path) -> None:
    """A copy of a real broker's store whose middle commit-log file was cut short (a copy
    that stopped, a full disk): verify reports it (file-size, an error a broker does not
    start with) and what follows from it, on every engine; it used to stop with exit 2
    before checking anything. Commands that read or write the store refuse it, naming the
    file."""
    store = oracle("s1_multi").copy_to(tmp_path)
    files = sorted((store / "commitlog").iterdir())
    os.truncate(files[10], 30000)
    reports = [
        run_cli("verify", store, "--json", *ORACLE_OPTIONS, *more)
        for more in ((), ("--jobs", "2", "--split-size", "65536"))
    ]
    for report in reports:
        assert report.exit_code == 1, report.stderr
        document = json.loads(report.stdout)
        sizes = [f for f in document["findings"] if f["kind"] == "file-size"]
        assert len(sizes) == 1 and sizes[0]["severity"] == "error"
        assert (
            f"{files[10].name} is 30000 bytes; the configured size is 65536"
            in (sizes[0]["message"])
        )
        assert "record-invalid" in document["findingsByKind"]  # the record the cut tore
    one, two = (json.loads(report.stdout)["findings"] for report in reports)
    assert sorted(map(str, one)) == sorted(map(str, two))
    human = run_cli("verify", store, *ORACLE_OPTIONS)
    assert human.exit_code == 1 and "file-size" in human.stdout
    for command in (("info",), ("read", "--from-offset", "0"), ("recover", "--dry-run")):
        refused = run_cli(*command[:1], store, *command[1:], *ORACLE_OPTIONS)
        assert refused.exit_code == 2
        assert f"{files[10].name} is 30000 bytes" in refused.stderr


def test_bad_input(tmp_path: Path, oracle) -> None:
    assert run_cli("verify", tmp_path / "missing").exit_code == 2
    result = run_cli("verify", oracle("s1_multi").store, "--from-offset", "7", *ORACLE_OPTIONS)
    assert result.exit_code == 2 and "no record starts at offset 7" in result.stderr


def test_an_index_of_unknown_geometry_does_not_turn_a_lag_into_a_hole(oracle) -> None:
    """A real broker's crashed store whose last records were never dispatched, verified
    without its index geometry: the index cannot be read, and where a dispatch resumes was
    taken as not known, so each queue's lag was reported as a dispatch-hole (an error, with
    dispatch --rebuild as its fix). Where the consume queues end tells it."""
    crash = oracle("s2_crash")
    result = run_cli("verify", crash.root / "store", "--json")
    kinds = json.loads(result.stdout)["findingsByKind"]
    assert kinds == {"abort-present": 1, "dispatch-lag": 12, "index-unchecked": 1}
    known = run_cli("verify", crash.root / "store", "--json", *ORACLE_OPTIONS)
    assert json.loads(known.stdout)["findingsByKind"]["dispatch-lag"] == 12


def test_worker_processes_give_the_same_report(oracle, tmp_path: Path) -> None:
    store_dir = oracle("s2_crash").copy_to(tmp_path)  # torn tail, abort, lag: findings
    args = ("verify", store_dir, "--json", "--split-size", "65536", *ORACLE_OPTIONS)
    single, parallel = run_cli(*args), run_cli(*args, "--jobs", "2")
    assert single.exit_code == parallel.exit_code == 1
    one, two = json.loads(single.stdout), json.loads(parallel.stdout)
    assert one["checked"] == two["checked"] and one["findingsByKind"] == two["findingsByKind"]
    assert sorted(map(str, one["findings"])) == sorted(map(str, two["findings"]))


def test_an_unknown_index_geometry_is_a_note_not_an_error(oracle, tmp_path: Path) -> None:
    store = oracle("s1_multi").copy_to(tmp_path)
    bare = run_cli("verify", store, "--json")
    assert bare.exit_code == 0, bare.stdout
    report = json.loads(bare.stdout)
    kinds = {finding["kind"]: finding for finding in report["findings"]}
    assert set(kinds) == {"index-unchecked"} and kinds["index-unchecked"]["severity"] == "note"
    assert "--index-slots" in kinds["index-unchecked"]["message"]
    # a geometry that is given and wrong is still an error
    wrong = run_cli("verify", store, "--json", "--index-slots", "999", "--index-entries", "2000")
    assert wrong.exit_code == 1
    assert "index-file-size" in {f["kind"] for f in json.loads(wrong.stdout)["findings"]}
    # a broker.properties left in STORE/config gives the geometry: the index is checked
    (store / "config").mkdir(exist_ok=True)
    (store / "config" / "broker.properties").write_text(
        "mappedFileSizeCommitLog=65536\nmappedFileSizeConsumeQueue=2000\n"
        "maxHashSlotNum=1000\nmaxIndexNum=2000\n"
    )
    configured = run_cli("verify", store, "--json")
    assert configured.exit_code == 0
    assert json.loads(configured.stdout)["findings"] == []
    assert json.loads(configured.stdout)["checked"]["indexEntries"] > 0


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_only_some_checks(tmp_path: Path, jobs: str) -> None:
    from rmqstore.fixtures import generate

    for scenario, failing, passing in (
        ("cq-truncated", "queues", "index"),
        ("index-broken-chain", "index", "queues"),
    ):
        store = tmp_path / scenario
        generate(scenario, store)
        args = ("verify", store, "--json", "--jobs", jobs, "--split-size", "8192")
        bad = run_cli(*args, "--only", failing)
        good = run_cli(*args, "--only", passing)
        assert bad.exit_code == 1, (scenario, bad.stdout)
        assert good.exit_code == 0, (scenario, good.stdout)
        assert run_cli(*args, "--only", "commitlog").exit_code == 0
    misuse = run_cli("verify", store, "--only", "commitlog", "--only", "index")
    assert misuse.exit_code == 2 and "give it alone" in misuse.stderr
    for args, needle in (
        (["--commitlog-only", "--only", "index"], "does not go with --only index"),
        (["--commitlog-only", "--topic", "A"], "--topic picks the consume queues"),
        (["--only", "commitlog", "--topic", "A"], "--topic picks the consume queues"),
        (["--master", "local[2]"], "--master is for --engine spark"),
        (["--spark-conf", "a=b"], "--spark-conf is for --engine spark"),
    ):
        refused = run_cli("verify", store, *args)
        assert refused.exit_code == 2 and needle in refused.stderr, args


@pytest.mark.parametrize(
    "scenario",
    ["torn-tail", "crc-flip", "garbage-after-end", "cq-truncated", "cq-wrong-size",
     "index-broken-chain", "stale-checkpoint", "short-checkpoint", "abort-left",
     "missing-file"],
)  # fmt: skip
def test_the_next_step_mends_what_verify_found(tmp_path: Path, scenario: str) -> None:
    import shlex

    from rmqstore.fixtures import generate

    store = tmp_path / "store"
    generate(scenario, store)
    for _ in range(3):  # a fix may leave a next one (the log first, then what is built on it)
        report = json.loads(run_cli("verify", store, "--json").stdout)
        if report["ok"]:
            break
        assert all(f["fix"] for f in report["findings"])
        step = report["nextStep"]
        if step is None:
            assert scenario == "missing-file"  # a lost file: nothing mends it
            assert {f["fix"] for f in report["findings"]} >= {"none: report only"}
            return
        command = shlex.split(step)
        assert command[0] == "rmqstore" and command[2] == str(store)
        done = run_cli(*command[1:])
        assert done.exit_code in (0, 1), done.stderr
    assert json.loads(run_cli("verify", store, "--json").stdout)["ok"], scenario
    human = run_cli("verify", store)
    assert "next step" not in human.stdout


def test_findings_and_stats_as_csv(tmp_path: Path) -> None:
    import csv
    import io

    from rmqstore.fixtures import generate

    store = tmp_path / "store"
    generate("cq-truncated", store)
    report = json.loads(run_cli("verify", store, "--json").stdout)
    table = run_cli("verify", store, "--csv")
    assert table.exit_code == 1
    rows = list(csv.DictReader(io.StringIO(table.stdout)))
    assert [row["kind"] for row in rows] == [f["kind"] for f in report["findings"]]
    assert [row["fix"] for row in rows] == [f["fix"] for f in report["findings"]]
    stats = json.loads(run_cli("stats", store, "--engine", "local", "--json").stdout)
    tsv = run_cli(
        "stats", store, "--engine", "local", "--tsv", "--fields", "topic,queueId,messages"
    )
    lines = [line.split("\t") for line in tsv.stdout.splitlines()]
    assert lines[0] == ["topic", "queueId", "messages"]
    assert lines[1:] == [
        [q["topic"], str(q["queueId"]), str(q["messages"])] for q in stats["queues"]
    ]
