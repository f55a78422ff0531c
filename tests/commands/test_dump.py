"""``rmqstore dump FILE`` on real-broker files, on damaged files and on bad input."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pytest

from support import manifest_dump, run_cli


def items(*args: object) -> tuple[int, list[dict]]:
    result = run_cli("dump", *args, "--jsonl")
    return result.exit_code, [json.loads(line) for line in result.stdout.splitlines()]


@pytest.mark.parametrize("name", ["s1_multi", "v533_s1_multi"])
def test_commit_log_files_list_what_the_broker_scanned(oracle, name: str) -> None:
    store = oracle(name)
    scanned = manifest_dump(store.manifest)["commitLogScan"]["records"]
    dumped = []
    for path in sorted((store.store / "commitlog").iterdir()):
        code, listed = items(path)
        assert code == 0
        assert listed[-1]["type"] in ("blank", "end")
        dumped += [item for item in listed if item["type"] in ("record", "blank")]
    assert [
        (item["commitLogOffset"], "MESSAGE" if item["type"] == "record" else "BLANK")
        for item in dumped
    ] == [(record["offset"], record["type"]) for record in scanned]
    for item, record in zip(dumped, scanned, strict=True):
        if item["type"] == "record":
            assert item["bodyCrcOk"] is True
            assert (item["topic"], item["queueId"], item["queueOffset"], item["storeSize"]) == (
                record["topic"],
                record["queueId"],
                record["queueOffset"],
                record["size"],
            )
            assert (item["storeTimestamp"], item["sysFlag"]) == (
                record["storeTimestamp"],
                record["sysFlag"],
            )
            assert item["version"] == (2 if record["magic"] == "0xDAA320AB" else 1)


def test_consume_queue_units_match_the_broker_and_their_records(oracle) -> None:
    store = oracle("s1_multi")
    queues = manifest_dump(store.manifest)["consumeQueues"]
    checked = expected = 0
    for topic, by_queue in queues.items():
        for queue_id, queue in by_queue.items():
            directory = store.store / "consumequeue" / topic / queue_id
            expected += len(queue["entries"])
            if not directory.is_dir():
                continue
            units = []
            for path in sorted(directory.iterdir()):
                code, listed = items(path)
                assert code == 0, listed
                units += [item for item in listed if item["type"] == "unit"]
            assert [
                [u["queueOffset"], u["commitLogOffset"], u["size"], u["tagsCode"]] for u in units
            ] == queue["entries"]
            assert {u["record"] for u in units} <= {"ok"}
            checked += len(units)
    assert checked == expected > 3000


def test_a_unit_pointing_at_the_wrong_record_is_named(oracle, tmp_path: Path) -> None:
    root = oracle("s1_multi").copy_to(tmp_path)
    path = root / "consumequeue" / "TopicTest" / "2" / "00000000000000002000"
    fd = os.open(path, os.O_RDWR)
    try:
        size = struct.unpack(">i", os.pread(fd, 4, 37 * 20 + 8))[0]
        os.pwrite(fd, struct.pack(">i", size + 4), 37 * 20 + 8)
    finally:
        os.close(fd)
    code, listed = items(path)
    assert code == 1
    bad = [item for item in listed if item.get("record") not in (None, "ok")]
    assert [(item["queueOffset"], item["filePosition"], item["record"]) for item in bad] == [
        (137, 37 * 20, "differs")
    ]
    code, listed = items(path, "--no-check")
    assert code == 0 and {item.get("record") for item in listed} == {"unchecked", None}


def test_lmq_units_are_their_records_copies(tmp_path: Path) -> None:
    """A unit of an LMQ queue points at a record of another topic that names the queue in
    INNER_MULTI_DISPATCH (spec 6.8): dump called each such unit's record "differs" and the
    broker's LMQ queue files not sound (exit 1)."""
    from rmqstore.fixtures import FixtureOptions, generate

    generate("lmq", tmp_path / "lmq", FixtureOptions())
    folder = tmp_path / "lmq" / "consumequeue" / "%LMQ%room-1" / "0"
    paths = sorted(folder.iterdir())
    units = []
    for path in paths:
        code, listed = items(path)
        assert code == 0, listed
        units += [item for item in listed if item["type"] == "unit"]
    assert len(units) == 34 and {u["record"] for u in units} == {"ok"}
    assert all(u["recordNote"].startswith("a copy of MqttTopic:") for u in units)
    result = run_cli("dump", paths[0])
    assert result.exit_code == 0 and "record ok (a copy of MqttTopic:" in result.stdout
    # a unit pointing at a record that names no such copy still differs
    data = bytearray(paths[0].read_bytes())
    data[0:8] = struct.pack(">q", units[1]["commitLogOffset"])
    data[8:12] = struct.pack(">i", units[1]["size"])
    paths[0].write_bytes(bytes(data))
    code, listed = items(paths[0])
    assert code == 1 and listed[0]["record"] == "differs"


def test_a_consume_queue_file_of_a_part_unit_is_dumped_to_its_last_whole_unit(
    oracle, tmp_path: Path
) -> None:
    """A queue file that is not a whole number of units (a write torn by a crash, a file
    grown by hand): its units, a note, and the part unit as non-zero bytes after the end
    (it used to end the dump with an internal error, exit 70, half a JSON document)."""
    root = oracle("s1_multi").copy_to(tmp_path)
    path = root / "consumequeue" / "TopicTest" / "2" / "00000000000000002000"
    whole = items(path)[1]
    units = [item for item in whole if item["type"] == "unit"]
    assert path.stat().st_size == len(units) * 20  # a full file
    os.truncate(path, len(units) * 20 - 13)  # its last unit cut to 7 bytes
    with open(path, "r+b") as handle:
        handle.seek(len(units) * 20 - 20)
        handle.write(b"\x01" * 7)
    code, listed = items(path)
    assert code == 1
    assert "not a whole number of 20-byte units: its last 7 bytes" in listed[0]["message"]
    assert [item for item in listed if item["type"] == "unit"] == units[:-1]
    assert listed[-1] == {"type": "end", "queueOffset": units[-1]["queueOffset"],
                          "filePosition": len(units) * 20 - 20, "nonZeroBytesAfter": 7}  # fmt: skip


def test_torn_tail_shows_where_records_stop(oracle) -> None:
    crash = oracle("s2_crash")
    store = crash.root / "store_torn_half_record"
    end = crash.manifest["lastValidEnd"]
    last = store / "commitlog" / f"{end - end % 65536:020d}"
    code, listed = items(last)
    assert code == 1
    tail = listed[-1]
    assert tail["commitLogOffset"] == crash.manifest["lastValidEnd"]
    assert tail["type"] in ("invalid", "end")
    if tail["type"] == "end":
        assert tail["nonZeroBytesAfter"] > 0
    human = run_cli("dump", last)
    assert human.exit_code == 1
    assert f"offset {crash.manifest['lastValidEnd']} " in human.stdout
    assert "not sound" in human.stdout


def test_index_file_header_slots_and_entries(oracle) -> None:
    store = oracle("s1_multi")
    path = sorted((store.store / "index").iterdir())[0]
    code, listed = items(path, "--slots", "--index-slots", "1000", "--index-entries", "2000")
    assert code == 0
    header = listed[0]
    assert header["type"] == "header"
    entries = [item for item in listed if item["type"] == "entry"]
    slots = [item for item in listed if item["type"] == "slot"]
    assert len(entries) == header["indexCount"] - 1
    assert len(slots) == header["hashSlotCount"]
    assert {slot["entry"] for slot in slots} <= {entry["entry"] for entry in entries}
    for entry in entries:
        assert entry["previous"] < entry["entry"]
        assert entry["slot"] == entry["keyHash"] % 1000
    geometry = ("--index-slots", "1000", "--index-entries", "2000")
    document = json.loads(run_cli("dump", path, *geometry, "--json", "--count", "3").stdout)
    assert document["kind"] == "index" and document["problems"] == 0
    assert [item["type"] for item in document["items"]] == ["header", "entry", "entry", "entry"]


def test_a_file_outside_a_store_needs_its_kind(oracle, tmp_path: Path) -> None:
    source = sorted((oracle("s1_multi").store / "commitlog").iterdir())[0]
    copy = tmp_path / source.name
    shutil.copyfile(source, copy)
    result = run_cli("dump", copy)
    assert result.exit_code == 2 and "--kind" in result.stderr
    code, listed = items(copy, "--kind", "commitlog", "--count", "2")
    assert code == 0
    assert [item["type"] for item in listed] == ["record", "record"]


@pytest.mark.parametrize(
    "target, message",
    [("missing", "does not exist"), ("dir", "is not a file"), ("lock", "--kind")],
)
def test_bad_input_is_one_line_and_exit_2(oracle, target: str, message: str) -> None:
    store = oracle("s1_multi").store
    path = {
        "missing": store / "nope",
        "dir": store / "commitlog",
        "lock": store / "lock",
    }
    result = run_cli("dump", path[target])
    assert result.exit_code == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("file", "flag", "needle"),
    [
        ("commitlog/00000000000000000000", "--slots", "--slots goes with an index file"),
        ("commitlog/00000000000000000000", "--no-check", "goes with a consume-queue file"),
        ("consumequeue/TopicTest/0/00000000000000000000", "--no-crc", "goes with a commit-log"),
        ("consumequeue/TopicTest/0/00000000000000000000", "--slots", "is a consume-queue file"),
    ],
)
def test_an_option_for_another_kind_of_file_is_refused(
    oracle, file: str, flag: str, needle: str
) -> None:
    result = run_cli("dump", oracle("s1_multi").store / file, flag)
    assert result.exit_code == 2 and needle in result.stderr and result.stdout == ""


@pytest.mark.parametrize("name", ["s1_multi", "v533_s1_multi"])
def test_the_checkpoint_is_what_the_broker_wrote(oracle, tmp_path: Path, name: str) -> None:
    """A real broker's checkpoint, in its store and copied out of it (--kind checkpoint): the
    fields its manifest says are on the disk and the times a crash's recovery derives from
    them; a copy a crash cut short is read zero-filled, as a broker maps it, and not sound."""
    found = oracle(name)
    on_disk = found.manifest["checkpointFileOnDisk"]
    code, listed = items(found.store / "checkpoint")
    assert code == 0 and [item["type"] for item in listed] == ["checkpoint"]
    (checkpoint,) = listed
    assert {key: checkpoint[key] for key in on_disk} == on_disk
    assert checkpoint["shortBy"] == 0
    assert (
        checkpoint["minTimestamp"]
        == min(on_disk["physicMsgTimestamp"], on_disk["logicsMsgTimestamp"]) - 3000
    )
    table = run_cli("dump", found.store / "checkpoint")
    assert table.exit_code == 0 and f"physicMsgTimestamp   {on_disk['physicMsgTimestamp']}" in (
        table.stdout
    )
    short = tmp_path / "checkpoint.copy"
    short.write_bytes((found.store / "checkpoint").read_bytes()[:12])
    assert run_cli("dump", short).exit_code == 2  # where it sits says nothing
    code, listed = items(short, "--kind", "checkpoint")
    assert code == 1 and [item["type"] for item in listed] == ["checkpoint", "note"]
    assert listed[0]["physicMsgTimestamp"] == on_disk["physicMsgTimestamp"]
    assert listed[0]["logicsMsgTimestamp"] < on_disk["logicsMsgTimestamp"]  # half its bytes
    assert listed[0]["indexMsgTimestamp"] == 0 and listed[0]["shortBy"] == 4096 - 12
