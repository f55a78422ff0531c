"""verify on real-broker stores: clean ones are sound; each kind of damage is reported with
the right kind and offset (one test per scenario)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
from dataclasses import replace
from pathlib import Path

import pytest

from rmqstore.checkpoint import read_checkpoint, write_checkpoint
from rmqstore.config import StoreConfig
from rmqstore.dispatch import Dispatcher
from rmqstore.record import header_struct
from rmqstore.store import Store
from rmqstore.verify import NOTE, VerifyOptions, VerifyReport, verify_store

from support import ORACLE_CONFIG, run_cli, tree_digest

FILE = 65536
CLEAN = [
    "s1_multi",
    "s3_txn_delay",
    "v533_s1_multi",
    "v533_s3_txn",
    "s4_recovered_from_torn_half_record",
]


def run(store_dir: Path, **options: object):
    with Store.open_read(store_dir, StoreConfig(**ORACLE_CONFIG)) as store:
        return verify_store(store, VerifyOptions(**options))


def kinds(report) -> set[str]:
    return {f.kind for f in report.findings if f.severity != NOTE}


def at(report, kind: str, where: str = "commit_log_offset") -> list[int | None]:
    """The ``where`` position field of each finding of ``kind``."""
    return [getattr(f, where) for f in report.findings if f.kind == kind]


def patch(store_dir: Path, offset: int, data: bytes) -> None:
    """Overwrite bytes at a physical offset of the commit log."""
    path = store_dir / "commitlog" / f"{offset - offset % FILE:020d}"
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, data, offset % FILE)
    finally:
        os.close(fd)


def middle_put(oracle, predicate=lambda put: True) -> dict:
    puts = [p for p in oracle("s1_multi").manifest["puts"] if predicate(p)]
    return puts[len(puts) // 2]


@pytest.mark.parametrize("name", CLEAN)
def test_clean_broker_stores_are_sound(oracle, name: str) -> None:
    report = run(oracle(name).store)
    assert report.ok, report.findings
    assert report.checked["records"] == len(
        oracle(name).manifest.get("puts") or []
    ) or name.startswith(("s3_", "s4_"))


def test_flipped_body_byte(oracle, tmp_path: Path) -> None:
    store_dir = oracle("s1_multi").copy_to(tmp_path)
    put = middle_put(oracle, lambda p: p["storedBodyLength"] > 10)
    header = header_struct(put["sysFlag"]).size
    patch(store_dir, put["physicalOffset"] + header + 3, b"\x00\xff")
    report = run(store_dir)
    assert kinds(report) == {"record-body-crc"}
    assert at(report, "record-body-crc") == [put["physicalOffset"]]
    assert run(store_dir, check_crc=False).ok  # --no-crc does not look


def test_flipped_crc(oracle, tmp_path: Path) -> None:
    store_dir = oracle("s1_multi").copy_to(tmp_path)
    put = middle_put(oracle, lambda p: p["storedBodyLength"] > 0)
    patch(store_dir, put["physicalOffset"] + 8, struct.pack(">i", put["bodyCRC"] ^ 0x1234))
    report = run(store_dir)
    assert kinds(report) == {"record-body-crc"}
    assert at(report, "record-body-crc") == [put["physicalOffset"]]


def test_record_cut_in_half_at_the_tail(oracle, tmp_path: Path) -> None:
    store_dir = oracle("s1_multi").copy_to(tmp_path)
    last = oracle("s1_multi").manifest["puts"][-1]
    half = last["size"] // 2
    patch(store_dir, last["physicalOffset"] + half, bytes(last["size"] - half))
    (store_dir / "abort").touch()
    report = run(store_dir)
    assert at(report, "torn-tail") == [last["physicalOffset"]]
    assert "cq-beyond-log" in kinds(report)  # its consume-queue unit points past the end


def test_record_cut_in_half_in_an_older_file(oracle, tmp_path: Path) -> None:
    store_dir = oracle("s1_multi").copy_to(tmp_path)
    put = middle_put(oracle, lambda p: p["size"] > 400)
    half = put["size"] // 2
    patch(store_dir, put["physicalOffset"] + half, bytes(put["size"] - half))
    report = run(store_dir)
    assert at(report, "record-invalid") == [put["physicalOffset"]]
    # the pass resynchronised: every other record was still checked
    assert report.checked["records"] == 3001


def test_a_blank_of_the_wrong_size_is_reported_not_sent_to_recover(oracle, tmp_path: Path) -> None:
    """A BLANK closing the first file whose size field says 0 (a broker writes the rest of
    the file there): a broker's walk, and rmqstore's readers, go on to the next file whatever
    it declares, and no command rewrites it. verify named recover, which left it, and then
    recover again; it is report only, and every record is still checked."""
    store_dir = oracle("s1_multi").copy_to(tmp_path)
    first = (store_dir / "commitlog" / f"{0:020d}").read_bytes()
    blank = first.rindex(struct.pack(">i", -875286124))  # BLANK_MAGIC_CODE, 0xcbd43194
    patch(store_dir, blank - 4, struct.pack(">i", 0))  # its TOTALSIZE
    report = run(store_dir)
    (finding,) = [f for f in report.findings if f.kind == "blank-size"]
    assert finding.commit_log_offset == blank - 4
    assert kinds(report) == {"blank-size"} and report.checked["records"] == 3002
    assert report.next_step(str(store_dir)) is None
    assert report.to_dict(str(store_dir))["findings"][0]["fix"] == "none: report only"


@pytest.mark.parametrize("aborted", [True, False])
def test_garbage_after_the_last_record(oracle, tmp_path: Path, aborted: bool) -> None:
    store_dir = oracle("s1_multi").copy_to(tmp_path)
    end = 3346149
    patch(store_dir, end, os.urandom(300))
    if aborted:
        (store_dir / "abort").touch()
        report = run(store_dir)
        assert at(report, "torn-tail") == [end]
    else:
        report = run(store_dir)
        assert report.ok  # what a broker's recovery leaves behind: a note only
        assert at(report, "stale-bytes-after-end") == [end]


def test_wrong_stored_physical_offset(oracle, tmp_path: Path) -> None:
    store_dir = oracle("s1_multi").copy_to(tmp_path)
    put = middle_put(oracle)
    patch(store_dir, put["physicalOffset"] + 28, struct.pack(">q", put["physicalOffset"] + 8))
    report = run(store_dir)
    assert at(report, "record-physical-offset") == [put["physicalOffset"]]


def test_missing_middle_commitlog_file(oracle, tmp_path: Path) -> None:
    store_dir = oracle("s1_multi").copy_to(tmp_path)
    files = sorted((store_dir / "commitlog").iterdir())
    files[10].unlink()
    report = run(store_dir)
    assert at(report, "file-gap") == [int(files[11].name)]
    assert {"cq-unit-orphan", "index-entry", "queue-offset-gap"} <= kinds(report)  # into the gap


def test_consume_queue_unit_with_the_wrong_size(oracle, tmp_path: Path) -> None:
    store_dir = oracle("s1_multi").copy_to(tmp_path)
    path = store_dir / "consumequeue" / "TopicTest" / "2" / "00000000000000002000"
    position = 37 * 20  # queue offset 137
    fd = os.open(path, os.O_RDWR)
    try:
        size = struct.unpack(">i", os.pread(fd, 4, position + 8))[0]
        os.pwrite(fd, struct.pack(">i", size + 4), position + 8)
    finally:
        os.close(fd)
    report = run(store_dir)
    assert kinds(report) == {"cq-unit"}
    assert at(report, "cq-unit", "queue_offset") == [137]
    assert at(report, "cq-unit", "file") == [str(path.relative_to(store_dir))]
    assert at(report, "cq-unit", "file_position") == [position]


def test_truncated_consume_queue(oracle, tmp_path: Path) -> None:
    store_dir = oracle("s1_multi").copy_to(tmp_path)
    last = store_dir / "consumequeue" / "TopicTest" / "3" / "00000000000000004000"
    data = last.read_bytes()
    units = 250 - 200  # TopicTest:3 holds 250 units; this file, the third, has 200..249
    last.write_bytes(data[: (units - 5) * 20].ljust(len(data), b"\0"))  # last 5 units gone
    report = run(store_dir)
    # other queues reach past those records: a dispatch (or a broker's restart) resumes
    # there, so they are a hole no dispatch from its cursor fills, not a lag
    assert kinds(report) == {"dispatch-hole"}
    (finding,) = [f for f in report.findings if f.kind == "dispatch-hole"]
    assert "5 records of TopicTest:3" in finding.message
    assert report.next_step(str(store_dir)).endswith("--rebuild --yes")
    first = finding.commit_log_offset
    assert f"rmqstore dispatch --from-offset {first} does" in finding.message
    copy = tmp_path / "copy"
    shutil.copytree(store_dir, copy)
    with Store.open_write(copy, StoreConfig(**ORACLE_CONFIG)) as opened:  # as the message says
        dispatcher = Dispatcher(opened)
        try:
            assert dispatcher.cursor() > first
            assert dispatcher.run(first).units_written == 5
        finally:
            dispatcher.close()
    assert run(copy).ok
    with open(last, "r+b") as handle:
        handle.truncate(1000)  # and a file cut short
    assert "cq-file-size" in kinds(run(store_dir))


def test_broken_index_chain(oracle, tmp_path: Path) -> None:
    store_dir = oracle("s1_multi").copy_to(tmp_path)
    index_file = sorted((store_dir / "index").iterdir())[1]
    entry = 40 + 1000 * 4 + 700 * 20
    fd = os.open(index_file, os.O_RDWR)
    try:
        os.pwrite(fd, struct.pack(">i", 699), entry + 16)  # entry 700 now links to 699
    finally:
        os.close(fd)
    report = run(store_dir)
    assert "index-chain" in kinds(report)
    assert entry in at(report, "index-chain", "file_position")


def test_checkpoint_from_the_future(oracle, tmp_path: Path) -> None:
    store_dir = oracle("s1_multi").copy_to(tmp_path)
    checkpoint = read_checkpoint(store_dir / "checkpoint")
    assert checkpoint is not None
    write_checkpoint(
        store_dir / "checkpoint",
        checkpoint.updated(physic_msg_timestamp=checkpoint.physic_msg_timestamp + 3_600_000),
    )
    report = run(store_dir)
    assert kinds(report) == {"checkpoint-future"}
    assert "physicMsgTimestamp" in report.findings[0].message


@pytest.mark.parametrize("copy", ["store_torn_half_record", "store_torn_random_garbage"])
def test_torn_copies_are_reported_at_the_last_valid_end(oracle, copy: str) -> None:
    crash = oracle("s2_crash")
    report = run(crash.root / copy)
    assert at(report, "torn-tail") == [crash.manifest["lastValidEnd"]]
    assert {"abort-present", "dispatch-lag", "index-lag"} <= kinds(report)


def test_dispatch_lag_says_which_broker_start_would_dispatch_the_records(
    oracle, tmp_path: Path
) -> None:
    """The real broker's crashed store, 300 records never dispatched: under 'abort' a
    broker's crash recovery at its start dispatches them; without it, a 4.9 broker's start
    does and a 5.x broker's may not (its reput starts at the log's end, and its normal
    recovery dispatches none of them or only those past the furthest queue's end)."""
    store_dir = oracle("s2_crash").copy_to(tmp_path)
    lagging = [f.message for f in run(store_dir).findings if f.kind == "dispatch-lag"]
    assert lagging and all(
        text.endswith("and so does a broker's crash recovery at start)") for text in lagging
    ), lagging
    (store_dir / "abort").unlink()
    lagging = [f.message for f in run(store_dir).findings if f.kind == "dispatch-lag"]
    assert lagging and all(
        "and so does a 4.9 broker's start; no 'abort', so a 5.x broker's start may not: 5.3.0 "
        "and 5.3.1 dispatch none, 5.3.2 and later only records past the one at the furthest "
        "queue's end)" in text
        for text in lagging
    ), lagging


def test_dispatch_lag_before_the_furthest_queue_end_is_no_broker_start_s(
    oracle, tmp_path: Path
) -> None:
    """The real 4.9.8 store stopped cleanly, without its index and one queue's files:
    rmqstore dispatch resumes at the log's start (the index's), so the queue's records are
    dispatch-lag, not holes; but a broker's start resumes where the furthest queue ends (4.9)
    or dispatches past it (5.3.2 and later), and leaves out every one of them before it. The
    finding used to say a 4.x broker's start dispatched them."""
    manifest = oracle("s1_multi").manifest
    store_dir = oracle("s1_multi").copy_to(tmp_path)
    (store_dir / "abort").unlink(missing_ok=True)
    shutil.rmtree(store_dir / "index")
    shutil.rmtree(store_dir / "consumequeue" / "TopicTest" / "1")
    reach = max(
        put["physicalOffset"] + put["size"]
        for put in manifest["puts"]
        if (put["topic"], put["queueId"]) != ("TopicTest", 1)
    )
    lagging = [f for f in run(store_dir).findings if f.kind == "dispatch-lag"]
    assert [(f.topic, f.queue_id) for f in lagging] == [("TopicTest", 1)], lagging
    assert lagging[0].message.endswith(
        "have no consume queue at all (rmqstore dispatch adds them; no 'abort', so a broker's "
        f"start leaves out those before offset {reach:,}, where the furthest consume queue "
        "ends (4.9 dispatches only what follows it, 5.3.2 and later only what follows the "
        "record there, 4.3.1, 5.3.0 and 5.3.1 none))"
    ), lagging[0].message


def test_verify_never_writes(oracle, tmp_path: Path) -> None:
    store_dir = oracle("s2_crash").copy_to(tmp_path, "store_torn_random_garbage")
    before = tree_digest(store_dir)
    run(store_dir)
    assert tree_digest(store_dir) == before


def test_max_findings_counts_everything(oracle, tmp_path: Path) -> None:
    store_dir = oracle("s1_multi").copy_to(tmp_path)
    for put in oracle("s1_multi").manifest["puts"][100:140]:
        patch(store_dir, put["physicalOffset"] + 8, struct.pack(">i", put["bodyCRC"] ^ 1))
    report = run(store_dir, max_findings=5)
    assert len(report.findings) == 5 and report.truncated
    assert report.counts["record-body-crc"] == sum(
        1 for p in oracle("s1_multi").manifest["puts"][100:140] if p["storedBodyLength"]
    )


def test_bytes_past_a_consume_queue_files_size_are_not_units(oracle, tmp_path: Path) -> None:
    # a broker maps only the configured size: units 100.. of TopicTest:3 are in the next file,
    # whatever the first file holds past its 2000 bytes
    store_dir = oracle("s1_multi").copy_to(tmp_path)
    first = store_dir / "consumequeue" / "TopicTest" / "3" / "00000000000000000000"
    with open(first, "ab") as handle:
        handle.write(struct.pack(">qiq", 12345, 67, 89))
    report = run(store_dir)
    assert kinds(report) == {"cq-file-size"}
    assert report.checked["units"] == 3002


def test_queue_chunks_share_a_budget() -> None:
    from rmqstore.verify.queues import _CHUNK, _CHUNKS_BUDGET, _SMALLEST_CHUNK, chunk_size

    assert chunk_size(1) == chunk_size(0) == _CHUNK
    assert chunk_size(4000) * 4000 <= _CHUNKS_BUDGET and chunk_size(4000) % 20 == 0
    assert chunk_size(1_000_000) == _SMALLEST_CHUNK


def test_queue_chunks_hold_no_more_than_the_queue_units(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each queue keeps the chunk of units it read last: for a queue of few units that is
    its units, not a chunk's worth of the empty file after them (a broker's thousands of
    queues held 64 KiB each)."""
    from rmqstore.consumequeue import list_queues
    from rmqstore.fixtures import generate
    from rmqstore.verify import queues as queue_checks

    store_dir = tmp_path / "store"
    generate("cq-truncated", store_dir)  # its records past the queue's end go one by one
    reads: list[tuple[Path, int, int]] = []
    real_read_range = queue_checks.read_range

    def recording(path: Path, start: int, length: int) -> bytes:
        reads.append((Path(path), start, length))
        return real_read_range(path, start, length)

    monkeypatch.setattr(queue_checks, "read_range", recording)
    with Store.open_read(store_dir) as store:
        report = verify_store(store, VerifyOptions())
        valid_ends = {}
        for topic, queue_id in list_queues(store.consumequeue_dir):
            queue = store.consume_queue(topic, queue_id)
            for segment in queue.queue.segments:
                valid_ends[segment.path] = queue.end - segment.start
        # the units a queue's load read at once are kept as its first chunk: no more either
        checks = queue_checks.QueueChecks(store, VerifyReport(), None)
        seeded = [state for state in checks.states.values() if state.buf is not None]
        checks.close()
    assert "dispatch-hole" in kinds(report)  # records missing from the queue
    for path, start, length in reads:
        assert start + length <= valid_ends[path], (path, start, length)
    assert seeded
    for state in seeded:
        first = state.queue.queue.segments[0]
        assert state.base == first.start and len(state.buf) == state.limit - state.base
        assert len(state.buf) == state.queue.end - first.start <= valid_ends[first.path]


def test_a_folder_under_a_commit_log_file_name_is_named_as_such(tmp_path: Path) -> None:
    """A folder where a commit-log file belongs: its name parses, but a broker cannot load it
    (4.9 refuses a store file of the wrong size); a stray name is one it cannot parse."""
    from rmqstore.fixtures import generate
    from rmqstore.segments import segment_name

    store_dir = tmp_path / "store"
    generate("basic", store_dir)
    (store_dir / "commitlog" / segment_name(1 << 40)).mkdir()
    (store_dir / "commitlog" / "notes.txt").write_text("kept by an operator")
    (store_dir / "commitlog" / "backup").mkdir()  # a folder is listed with the files too
    queue = next((store_dir / "consumequeue").iterdir()) / "0"
    (queue / "old").mkdir()
    with Store.open_read(store_dir) as store:
        report = verify_store(store, VerifyOptions())
    messages = {
        finding.file: finding.message for finding in report.findings if finding.kind == "file-name"
    }
    assert messages == {
        f"commitlog/{segment_name(1 << 40)}": "not a regular file, under a commit-log file's "
        "name (a broker cannot load it)",
        "commitlog/notes.txt": "not a commit-log file (a broker cannot parse its name)",
        "commitlog/backup": "a folder among the commit-log files (a broker lists it with them "
        "and cannot parse its name)",
        f"consumequeue/{queue.parent.name}/0/old": "a folder among the consume-queue files (a "
        "broker lists it with them)",
    }


def test_topics_json_that_leaves_out_a_topic_or_queue_is_noted(tmp_path: Path) -> None:
    """A broker serves only the topics config/topics.json lists, and its consumers balance
    over readQueueNums queues: a topic with units the file leaves out, or a queue past the
    count, is a note (verify stays sound). The broker's own SCHEDULE_TOPIC_XXXX, empty
    queues and stores without the file (store code alone) are not; an unparseable file is
    read from its .bak, as a broker does."""
    import json

    from rmqstore.consumequeue import list_queues
    from rmqstore.fixtures import generate

    store_dir = tmp_path / "store"
    generate("delay", store_dir)
    topics = store_dir / "config" / "topics.json"
    document = json.loads(topics.read_text())
    assert "SCHEDULE_TOPIC_XXXX" in document["topicConfigTable"]
    with Store.open_read(store_dir) as store:
        assert verify_store(store).counts["topic-unlisted"] == 0
    del document["topicConfigTable"]["SCHEDULE_TOPIC_XXXX"]
    (real,) = [name for name in document["topicConfigTable"] if not name.startswith("%")][:1]
    document["topicConfigTable"][real]["readQueueNums"] = 1
    topics.write_text(json.dumps(document))
    with Store.open_read(store_dir) as store:
        report = verify_store(store)
    noted = [f for f in report.findings if f.kind == "topic-unlisted"]
    assert report.ok and noted and all(f.severity == NOTE for f in noted)
    assert {(f.topic, f.queue_id) for f in noted} == {
        (real, queue_id)
        for topic, queue_id in list_queues(store_dir / "consumequeue")
        if topic == real and queue_id >= 1
    }
    (store_dir / "config" / "topics.json.bak").write_text(topics.read_text())
    topics.write_text("{broken")  # the broker loads the .bak: the same notes
    with Store.open_read(store_dir) as store:
        again = [f for f in verify_store(store).findings if f.kind == "topic-unlisted"]
    assert [f.message.replace(".bak", "") for f in again] == [f.message for f in noted]
    with Store.open_read(store_dir) as store:  # the .bak loaded: nothing is unreadable
        assert verify_store(store).counts["config-unreadable"] == 0
    (store_dir / "config" / "topics.json.bak").unlink()  # no table at all: a warning
    with Store.open_read(store_dir) as store:
        report = verify_store(store)
    (unreadable,) = [f for f in report.findings if f.kind == "config-unreadable"]
    assert unreadable.severity == "warning" and unreadable.file == "config/topics.json"
    assert unreadable.message.startswith("config/topics.json does not load (topics.json: not JSON")
    assert "a broker loads no topic table from it" in unreadable.message
    topics.unlink()
    with Store.open_read(store_dir) as store:
        report = verify_store(store)
        assert report.counts["topic-unlisted"] == report.counts["config-unreadable"] == 0


def test_a_consume_queue_ext_address_stands_for_the_tags_code(tmp_path: Path) -> None:
    """A broker with enableConsumeQueueExt writes an address in consumequeue_ext/ (its
    position there + Long.MIN_VALUE) as a unit's tagsCode (spec 6.6): verify called every
    such unit broken and sent the operator to dispatch --rebuild. A tagsCode that is not an
    address (Integer.MIN_VALUE is still an int) is compared as before."""
    from rmqstore.fixtures import FixtureOptions, generate

    store = tmp_path / "store"
    generate("basic", store, FixtureOptions())
    queue_file = store / "consumequeue" / "BasicTopic" / "0" / "00000000000000000000"
    units = bytearray(queue_file.read_bytes())
    for number in (0, 5, 19):
        offset, size, _ = struct.unpack_from(">qiq", units, number * 20)
        struct.pack_into(">qiq", units, number * 20, offset, size, -(2**63) + 48 * number)
    queue_file.write_bytes(units)
    with Store.open_read(store) as opened:  # both kernels: make test runs each
        report = verify_store(opened)
    assert report.ok and report.checked["units"] == 20, report.counts
    offset, size, _ = struct.unpack_from(">qiq", units, 40)
    struct.pack_into(">qiq", units, 40, offset, size, -(2**31))
    queue_file.write_bytes(units)
    with Store.open_read(store) as opened:
        assert verify_store(opened).counts["cq-unit"] == 1


def test_pre_blank_units_only_at_the_start_of_a_queue(tmp_path: Path) -> None:
    """A queue starting above 0 (its first units pre-blank) is sound; a pre-blank unit after
    a real unit is named at its queue offset, in the first file or a later one, in one
    process and in ranges; the same bytes straddling two units are not one."""
    from rmqstore.consumequeue import PRE_BLANK_UNIT
    from rmqstore.record import Message
    from rmqstore.verify.ranges import RangedVerify

    config = StoreConfig(commitlog_file_size=4096, consumequeue_file_size=200)
    store_dir = tmp_path / "s"
    with Store.open_write(store_dir, config, create=True) as store:
        store.appender().append_many([Message(topic="T", body=b"x" * 700) for _ in range(40)])
    (store_dir / "commitlog" / "00000000000000000000").unlink()  # expired, queue starts above 0
    with Store.open_write(store_dir, config) as store:
        dispatcher = Dispatcher(store)
        dispatcher.run()
        dispatcher.close()
    queue_dir = store_dir / "consumequeue" / "T" / "0"
    first = queue_dir / "00000000000000000000"
    assert first.read_bytes().startswith(PRE_BLANK_UNIT)  # pre-blank units, then real ones

    def pre_blank_findings() -> list[tuple[int | None, int | None]]:
        reports = []
        with Store.open_read(store_dir, config) as store:
            reports.append(verify_store(store))
        with Store.open_read(store_dir, config) as store:
            settings = dict(check_crc=True, commitlog_only=False, topics=None, from_offset=None)
            ranged = RangedVerify(store, range_size=3000, max_findings=None, **settings)
            reports.append(ranged.run())
        found = [
            [(f.queue_offset, f.file_position) for f in report.findings if f.kind == "cq-pre-blank"]
            for report in reports
        ]
        assert found[0] == found[1]
        return found[0]

    assert pre_blank_findings() == []
    units = bytearray(first.read_bytes())
    # a unit's tagsCode of zeros, then 0x7FFFFFFF starting the next unit's offset: the bytes
    # of a pre-blank unit's start, across units 8 and 9
    units[8 * 20 + 12 : 8 * 20 + 24] = bytes(8) + b"\x7f\xff\xff\xff"
    first.write_bytes(units)
    second = queue_dir / "00000000000000000200"
    later = bytearray(second.read_bytes())
    later[3 * 20 : 4 * 20] = PRE_BLANK_UNIT
    second.write_bytes(later)
    assert pre_blank_findings() == [(13, 60)]
    units[9 * 20 : 10 * 20] = PRE_BLANK_UNIT
    first.write_bytes(units)
    assert pre_blank_findings() == [(9, 180)]


def _shift_units(path: Path, first: int, last: int) -> None:
    """Move units ``[first + 1, last]`` of a queue file one place down (unit ``last`` then
    appears twice): from ``first`` on, each unit names the next record of its queue."""
    units = bytearray(path.read_bytes())
    units[first * 20 : last * 20] = units[(first + 1) * 20 : (last + 1) * 20]
    path.write_bytes(units)


def run_default(store_dir: Path, **options: object):
    with Store.open_read(store_dir) as store:
        return verify_store(store, VerifyOptions(**options))


def _findings(report) -> list[tuple]:
    return sorted(
        (f.kind, f.severity, f.file or "", f.file_position or -1, f.commit_log_offset or -1,
         f.topic or "", -1 if f.queue_id is None else f.queue_id, f.queue_offset or -1,
         f.message)
        for f in report.findings
    )  # fmt: skip


@pytest.mark.parametrize("max_findings", [None, 4])
def test_a_damaged_queue_is_judged_unit_by_unit_inside_clean_batches(
    oracle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, max_findings: int | None
) -> None:
    """A clean batch whose run of units differs from the stored units no longer goes record
    by record as a whole (a queue shifted by one unit made a 1M-message verify 20x slower):
    the differing run is compared unit by unit, the rest of the batch taken whole. The
    findings and counts are the ones the record-by-record walk gives."""
    from rmqstore.fixtures import FixtureOptions, generate
    from rmqstore.verify.queues import QueueChecks

    store_dir = tmp_path / "store"  # 4 queues round robin, 600 units per queue file
    options = FixtureOptions(
        messages=6000, commitlog_file_size=512 * 1024, consumequeue_file_size=600 * 20
    )
    generate("large", store_dir, options)
    queues = store_dir / "consumequeue" / "BenchmarkTopic"
    _shift_units(queues / "0" / "00000000000000000000", 10, 560)  # shifted in one file
    wrong = queues / "1" / "00000000000000000000"  # in the second batch (the index checks
    # take the first record by record: they have not started on the index's entries)
    units = bytearray(wrong.read_bytes())
    offset, size, code = struct.unpack_from(">qiq", units, 507 * 20)
    struct.pack_into(">qiq", units, 507 * 20, offset, size + 1, code)
    offset, size, code = struct.unpack_from(">qiq", units, 508 * 20)
    struct.pack_into(">qiq", units, 508 * 20, offset, size, code ^ 1)
    offset, size, _ = struct.unpack_from(">qiq", units, 509 * 20)  # an ext address: sound
    struct.pack_into(">qiq", units, 509 * 20, offset, size, -(2**63) + 96)
    offset, size, code = struct.unpack_from(">qiq", units, 511 * 20)  # mid-record
    struct.pack_into(">qiq", units, 511 * 20, offset + 4, size, code)
    wrong.write_bytes(units)
    compared = []
    compare_run = QueueChecks._compare_run

    def counted_compare_run(self, run) -> None:
        compared.append(run.key)
        compare_run(self, run)

    monkeypatch.setattr(QueueChecks, "_compare_run", counted_compare_run)
    batched = run_default(store_dir, max_findings=max_findings)
    assert ("BenchmarkTopic", 0) in compared and ("BenchmarkTopic", 1) in compared
    monkeypatch.setattr(QueueChecks, "batch_check", lambda self, batch: None)
    one_by_one = run_default(store_dir, max_findings=max_findings)
    assert batched.counts["cq-unit"] == 550 + 3 and batched.counts["cq-unit-orphan"] > 0
    assert batched.counts == one_by_one.counts
    assert batched.problems == one_by_one.problems
    assert batched.checked == one_by_one.checked
    if max_findings is None:
        assert _findings(batched) == _findings(one_by_one)
    else:
        assert len(batched.findings) == max_findings and batched.truncated


def _generated_queues(tmp_path: Path) -> Path:
    """The benchmark's shape, small: one topic, 4 queues round robin, 1,500 units each in
    files of 600 units, commit-log files of 512 KiB (a kernel batch each)."""
    from rmqstore.fixtures import FixtureOptions, generate

    store_dir = tmp_path / "store"
    options = FixtureOptions(
        messages=6000, commitlog_file_size=512 * 1024, consumequeue_file_size=600 * 20
    )
    generate("large", store_dir, options)
    return store_dir


def _each_way(store_dir: Path, monkeypatch: pytest.MonkeyPatch) -> tuple:
    """The report of a verify taking clean batches as a whole, the plans its queue and index
    checks applied, and the report of a verify taking every record one by one."""
    from rmqstore.verify.index import IndexChecks
    from rmqstore.verify.queues import QueueChecks
    from rmqstore.verify.records import RecordPass

    plans: list = []
    for checks in (QueueChecks, IndexChecks):
        apply = checks.batch_apply

        def recorded(self, plan, apply=apply) -> None:
            plans.append(plan)
            apply(self, plan)

        monkeypatch.setattr(checks, "batch_apply", recorded)
    batched = run_default(store_dir)
    monkeypatch.undo()
    monkeypatch.setattr(RecordPass, "_clean_batch", lambda *args: False)
    one_by_one = run_default(store_dir)
    monkeypatch.undo()
    return batched, plans, one_by_one


@pytest.mark.parametrize(
    "case", ["appended", "queues-dispatched", "queues-cut", "no-queue", "expired"]
)
def test_lag_missing_queues_and_expired_units_are_counted_run_by_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """Records past a queue's end or the index's end (a crash before dispatch: the common
    state verify meets after an incident), records of a queue that does not exist and
    units expired with old files are counted for a clean batch's runs as a whole, not
    record by record (a 40% dispatch lag made a 1M-message verify 4x slower): the same
    report as the records one by one."""
    from rmqstore.dispatch import Dispatcher
    from rmqstore.record import Message
    from rmqstore.verify.index import _IndexPlan

    store_dir = _generated_queues(tmp_path)
    queues = store_dir / "consumequeue" / "BenchmarkTopic"
    if case in ("appended", "queues-dispatched"):  # 3,000 messages past the index and queues
        with Store.open_write(store_dir) as store:
            store.appender().append_many(
                Message(topic="BenchmarkTopic", body=b"x" * 100, queue_id=number % 4,
                        properties={"KEYS": f"key-{number}"})
                for number in range(3000)
            )  # fmt: skip
        if case == "queues-dispatched":  # then the queues caught up, not the index
            with Store.open_write(store_dir) as store:
                dispatcher = Dispatcher(store, build_index=False)
                dispatcher.run()
                dispatcher.close()
    elif case == "queues-cut":  # each queue's last file gone, the one before cut short
        for queue in queues.iterdir():
            (queue / f"{2 * 600 * 20:020d}").unlink()
            os.truncate(queue / f"{600 * 20:020d}", (100 + queue_number(queue)) * 20)
    elif case == "no-queue":
        shutil.rmtree(queues / "3")
    else:  # queue 2's first file expired
        (queues / "2" / f"{0:020d}").unlink()
    batched, plans, one_by_one = _each_way(store_dir, monkeypatch)
    assert batched.ok == (case == "expired")  # expired units are no problem, not compared
    assert batched.counts == one_by_one.counts
    assert batched.problems == one_by_one.problems
    assert batched.checked == one_by_one.checked
    assert _findings(batched) == _findings(one_by_one)
    index_lag = [plan for plan in plans if isinstance(plan, _IndexPlan) and plan.lag]
    queue_plans = [plan for plan in plans if not isinstance(plan, _IndexPlan)]
    if case in ("appended", "queues-dispatched"):
        assert index_lag
    if case in ("appended", "queues-cut"):
        assert any(plan.lagging for plan in queue_plans)
    if case == "no-queue":
        assert any(plan.missing for plan in queue_plans)
    assert len(queue_plans) >= 2


def queue_number(queue: Path) -> int:
    return int(queue.name)


@pytest.mark.parametrize("seed", range(10))
def test_batches_and_records_one_by_one_agree_on_randomly_damaged_queues_and_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """Bytes flipped in units and index entries, queue files cut, deleted or grown: the
    verify that takes clean batches run by run reports what the records one by one find."""
    import random

    rng = random.Random(seed)
    store_dir = _generated_queues(tmp_path)
    queue_files = sorted(path for path in (store_dir / "consumequeue").rglob("*") if path.is_file())
    index_file = next((store_dir / "index").iterdir())  # 5M slots, then the 6,000 entries
    entries_at, entries_end = 40 + 5_000_000 * 4, 40 + 5_000_000 * 4 + 6001 * 20
    for _ in range(rng.randrange(1, 6)):
        action = rng.choice(["flip", "flip", "flip-index", "cut", "delete", "grow"])
        if action == "flip-index":
            at = rng.randrange(entries_at, entries_end)
            with open(index_file, "r+b") as handle:
                handle.seek(at)
                byte = handle.read(1)[0]
                handle.seek(at)
                handle.write(bytes([byte ^ 1 << rng.randrange(8)]))
            continue
        path = rng.choice(queue_files)
        if not path.exists():
            continue
        data = bytearray(path.read_bytes())
        if action == "flip" and data:
            at = rng.randrange(0, len(data))
            at -= at % 20 if rng.random() < 0.5 else 0  # a unit's offset
            data[at] ^= 1 << rng.randrange(8)
        elif action == "cut":
            del data[rng.randrange(0, len(data) + 1) :]
        elif action == "grow":
            data += struct.pack(">qiq", rng.randrange(0, 2_000_000), 279, rng.randrange(1000))
        if action == "delete":
            path.unlink()
        else:
            path.write_bytes(bytes(data))
    batched, plans, one_by_one = _each_way(store_dir, monkeypatch)
    assert plans  # some batches were taken whole
    assert batched.counts == one_by_one.counts
    assert batched.checked == one_by_one.checked
    assert _findings(batched) == _findings(one_by_one)


def test_the_second_look_at_a_queue_passes_over_units_plainly_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queue with one unit pointing at another queue's record is given a second look: the
    units plainly in place are passed over a block at a time, and only the others are
    looked up one by one (one bad unit made verify re-read every record of its queue)."""
    from rmqstore.commitlog import RecordLookup

    store_dir = _generated_queues(tmp_path)
    queues = store_dir / "consumequeue" / "BenchmarkTopic"
    path = queues / "2" / f"{0:020d}"
    units = bytearray(path.read_bytes())
    neighbour = struct.unpack_from(">qiq", (queues / "1" / f"{0:020d}").read_bytes(), 100 * 20)
    struct.pack_into(">qiq", units, 300 * 20, *neighbour)  # queue 1's record 100
    path.write_bytes(units)
    last = queues / "3" / f"{2 * 600 * 20:020d}"
    with open(last, "r+b") as handle:  # its last unit points past the end of the log
        handle.seek(299 * 20)
        handle.write(struct.pack(">qiq", 10**9, 279, 0))
    looked_up = []
    holder = RecordLookup.holder

    def counted_holder(self, offset: int):
        looked_up.append(offset)
        return holder(self, offset)

    monkeypatch.setattr(RecordLookup, "holder", counted_holder)
    report = run_default(store_dir)
    assert looked_up == [neighbour[0]]
    queue_findings = [f for f in report.findings if f.kind.startswith("cq-")]
    assert sorted((f.kind, f.topic, f.queue_id, f.queue_offset) for f in queue_findings) == [
        ("cq-beyond-log", "BenchmarkTopic", 3, 1499),
        ("cq-unit", "BenchmarkTopic", 2, 300),
        ("cq-unit", "BenchmarkTopic", 3, 1499),
        ("cq-unit-orphan", "BenchmarkTopic", 2, 300),
    ]
    orphan = next(f for f in report.findings if f.kind == "cq-unit-orphan")
    assert "belongs to BenchmarkTopic:1 at queue offset 100" in orphan.message


@pytest.mark.parametrize("seed", range(6))
def test_units_in_lmq_queues_are_taken_run_by_run_as_record_by_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """The units a batch's records have in further (LMQ) queues go into runs in the kernel
    (copy_runs) and are taken run by run, like the records' own: sound, with bits flipped in
    LMQ units, an LMQ queue cut short, grown or deleted, the report is the one the records
    one by one give."""
    import random

    from rmqstore import multidispatch
    from rmqstore.fixtures import FixtureOptions, generate
    from rmqstore.verify import records

    rng = random.Random(seed)
    store_dir = tmp_path / "store"
    generate("lmq", store_dir, FixtureOptions(messages=4000, commitlog_file_size=256 * 1024))
    lmq_files = sorted(
        path
        for path in (store_dir / "consumequeue").rglob("*")
        if path.is_file() and "%LMQ%" in str(path)
    )
    assert lmq_files
    for _ in range(seed % 3 + (seed > 0)):
        path = rng.choice(lmq_files)
        if not path.exists():
            continue
        data = bytearray(path.read_bytes())
        action = rng.choice(["flip", "cut", "grow", "delete"])
        if action == "flip" and data:
            at = rng.randrange(len(data))
            data[at] ^= 1 << rng.randrange(8)
        elif action == "cut":
            del data[rng.randrange(len(data) + 1) :]
        elif action == "grow":
            data += struct.pack(">qiq", rng.randrange(10**6), rng.randrange(1000), 0)
        if action == "delete":
            path.unlink()
        else:
            path.write_bytes(bytes(data))
    gathered = []
    keys = multidispatch.copy_run_keys

    def counted_keys(*args: object) -> list:
        found = keys(*args)  # type: ignore[arg-type]
        gathered.extend(found)
        return found

    monkeypatch.setattr(records, "copy_run_keys", counted_keys)
    batched, plans, one_by_one = _each_way(store_dir, monkeypatch)
    assert plans and any(name.startswith("%LMQ%") for name, _ in gathered)
    assert batched.counts == one_by_one.counts
    assert batched.checked == one_by_one.checked
    assert _findings(batched) == _findings(one_by_one)
    assert batched.ok == (seed == 0)


def test_an_lmq_offset_no_queue_position_can_hold_is_reported_as_record_by_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record whose INNER_MULTI_QUEUE_OFFSET is past what a consume-queue position can hold
    (and its neighbours') gets the same report with batches taken whole as record by record:
    its batch goes record by record, where the offset is named (record-queue-offset)."""
    from rmqstore.record import Message

    store_dir = _generated_queues(tmp_path)
    with Store.open_write(store_dir) as store:
        store.appender().append_many(
            Message(
                topic="BenchmarkTopic", body=b"x" * 100, queue_id=number % 4,
                properties={"INNER_MULTI_DISPATCH": "%LMQ%far",
                            "INNER_MULTI_QUEUE_OFFSET": str(2**63 - 2 + number)},
            )
            for number in range(2)
        )  # fmt: skip
    batched, _plans, one_by_one = _each_way(store_dir, monkeypatch)
    assert batched.counts["record-queue-offset"] == 2
    assert batched.counts == one_by_one.counts
    assert _findings(batched) == _findings(one_by_one)


def test_a_store_whose_broker_indexes_nothing_has_no_index_lag(oracle, tmp_path: Path) -> None:
    """A broker with messageIndexEnable=false writes no index: verify told so finds no
    index-lag (it used to report every record as not indexed yet, and recover's check then
    sent the operator to a dispatch that indexes nothing either). With the index on, the
    same store lags by every record."""
    store_dir = oracle("s1_multi").copy_to(tmp_path)
    shutil.rmtree(store_dir / "index")
    checkpoint = read_checkpoint(store_dir / "checkpoint")  # (such a broker leaves it 0)
    write_checkpoint(store_dir / "checkpoint", replace(checkpoint, index_msg_timestamp=0))
    without_index = StoreConfig(**{**ORACLE_CONFIG, "message_index_enable": False})
    with Store.open_read(store_dir, without_index) as store:
        report = verify_store(store, VerifyOptions())
    assert report.findings == [], report.findings
    assert at(run(store_dir), "index-lag") == [0]


def test_queue_folders_that_are_links_are_named_not_followed(tmp_path: Path) -> None:
    """A topic's (or a queue's) folder in consumequeue/ that is a symbolic link: a broker
    reads and writes through it; rmqstore follows no link there. verify names each one (a
    warning, mended by dispatch --rebuild) and does not call its topic's records missing
    from their queues, in one process and in ranges; recover's plan says it leaves them
    alone, and neither touches the files they lead to."""
    from rmqstore.fixtures import generate
    from rmqstore.recovery import apply_recovery, plan_recovery
    from rmqstore.verify.ranges import RangedVerify

    store_dir = tmp_path / "store"
    generate("multi", store_dir)
    outside = tmp_path / "outside"
    outside.mkdir()
    queues = store_dir / "consumequeue"
    shutil.move(queues / "TopicTest", outside / "TopicTest")
    (queues / "TopicTest").symlink_to(outside / "TopicTest")
    shutil.move(queues / "Orders-EU_west" / "1", outside / "orders-1")
    (queues / "Orders-EU_west" / "1").symlink_to(outside / "orders-1")
    # the newest record is %RETRY%group_a's: with its queue a link too, logicsMsgTimestamp
    # (its store time) is not compared with the newest record of the queues read
    retry = "%RETRY%group_a"
    shutil.move(queues / retry, outside / retry)
    (queues / retry).symlink_to(outside / retry)
    before = tree_digest(outside)

    reports = []
    with Store.open_read(store_dir) as store:
        reports.append(verify_store(store))
    with Store.open_read(store_dir) as store:
        settings = dict(check_crc=True, commitlog_only=False, topics=None, from_offset=None)
        reports.append(RangedVerify(store, range_size=70_000, max_findings=None, **settings).run())
    for report in reports:
        assert kinds(report) == {"queue-link"}, [f.to_dict() for f in report.findings]
        linked = sorted(f.file for f in report.findings if f.kind == "queue-link")
        assert linked == [
            f"consumequeue/{retry}",
            "consumequeue/Orders-EU_west/1",
            "consumequeue/TopicTest",
        ]
        assert all(f.severity == "warning" for f in report.findings if f.kind == "queue-link")
    with Store.open_read(store_dir) as store:  # only the topics asked for
        report = verify_store(store, VerifyOptions(topics=("TopicTest",)))
        assert [f.file for f in report.findings if f.kind == "queue-link"] == [
            "consumequeue/TopicTest"
        ]

    (store_dir / "abort").touch()  # a crashed store: recovery looks at every queue
    with Store.open_write(store_dir) as store:
        plan = plan_recovery(store)
        assert [s for s in plan.skipped if "symbolic link to queue files" in s] == [
            f"{queues / retry}: a symbolic link to queue files (not followed: not recovered)",
            f"{queues / 'Orders-EU_west' / '1'}: a symbolic link to queue files (not followed: "
            "not recovered)",
            f"{queues / 'TopicTest'}: a symbolic link to queue files (not followed: not recovered)",
        ]
        apply_recovery(store, plan)
    assert tree_digest(outside) == before


def test_past_the_logs_end_units_are_not_read_and_a_full_report_words_no_more_entries(
    oracle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A log that ends early (a record of its last file damaged, as a bit flip after an
    incident leaves it): the consume-queue units past the end are not read back (the first
    of each queue is the finding), and once the report is full the index entries past the
    end are counted without a message each. On a 1,000,000-message store so damaged a
    third of the way in, verify took 5.7 s, against 0.9 s for the sound store; now 2.4 s."""
    from rmqstore.reader import MessageReader
    from rmqstore.verify.index import IndexChecks

    store_dir = oracle("s1_multi").copy_to(tmp_path)
    last = sorted((store_dir / "commitlog").iterdir())[-1]
    puts = [p for p in oracle("s1_multi").manifest["puts"] if p["physicalOffset"] >= int(last.name)]
    end = puts[len(puts) // 3]["physicalOffset"]  # its MAGICCODE flipped: the log ends here
    patch(store_dir, end + 4, b"\x00")
    full = run(store_dir, max_findings=None)
    beyond = [f for f in full.findings if f.kind == "cq-beyond-log"]
    assert beyond and all(f.commit_log_offset >= end for f in beyond)
    assert full.counts["index-entry"] > 3

    furthest: list[int] = []
    units_in_place = MessageReader.units_in_place
    worded: list[int] = []
    orphan = IndexChecks._orphan

    def reading(self, topic, queue_id, units):  # type: ignore[no-untyped-def]
        furthest.extend(offset + size for _, offset, size, *_ in units)
        return units_in_place(self, topic, queue_id, units)

    def wording(self, entry, reason):  # type: ignore[no-untyped-def]
        worded.append(entry[3])
        return orphan(self, entry, reason)

    monkeypatch.setattr(MessageReader, "units_in_place", reading)
    monkeypatch.setattr(IndexChecks, "_orphan", wording)
    short = run(store_dir, max_findings=3)
    assert short.counts == full.counts and short.problems == full.problems
    assert short.findings == full.findings[:3]
    assert all(unit_end <= end for unit_end in furthest)  # none past the end read back
    assert len(worded) <= 3


def test_the_second_look_at_a_queue_reads_only_the_units_no_record_matched(
    oracle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A damaged region of the log (a record's bytes overwritten in a file a broker does not
    walk): the units of its records are looked at again, the units matched in the walk are
    not. The findings are those of a second look at every unit, which verify still takes
    for a queue whose matched units are split into more runs than it keeps. On a
    1,000,000-message store with 1 MB so overwritten, verify took 3.1 s, now 1.3 s."""
    from rmqstore.reader import MessageReader
    from rmqstore.verify import queues as queue_checks

    store_dir = oracle("s1_multi").copy_to(tmp_path)
    put = middle_put(oracle)
    patch(store_dir, put["physicalOffset"], b"\xff" * 600)
    looked_at: list[int] = []
    units_in_place = MessageReader.units_in_place

    def reading(self, topic, queue_id, units):  # type: ignore[no-untyped-def]
        looked_at.extend(queue_offset for queue_offset, *_ in units)
        return units_in_place(self, topic, queue_id, units)

    monkeypatch.setattr(MessageReader, "units_in_place", reading)
    spans_kept = run(store_dir, max_findings=None)
    assert "cq-unit-orphan" in kinds(spans_kept)
    assert 0 < len(looked_at) <= 20
    looked_at.clear()
    monkeypatch.setattr(queue_checks, "MATCHED_RUNS_KEPT", 0)  # every unit looked at again
    every_unit = run(store_dir, max_findings=None)
    assert len(looked_at) > 500  # the damaged queue, 751 units
    assert every_unit.findings == spans_kept.findings
    assert every_unit.counts == spans_kept.counts


def test_the_matched_runs_of_a_queue_checked_in_many_ranges_are_put_together(oracle) -> None:
    """Each range of a sound store matches a run of each queue's units: the checks that
    take the ranges in keep one run per queue, not one per range (a store of many ranges
    and queues would otherwise hold a run for each pair)."""
    from rmqstore.verify.ranges import RangedVerify

    with Store.open_read(oracle("s1_multi").store, StoreConfig(**ORACLE_CONFIG)) as store:
        settings = dict(check_crc=True, commitlog_only=False, topics=None, from_offset=None)
        ranged = RangedVerify(store, range_size=70_000, max_findings=None, **settings)
        report = ranged.run()
        assert kinds(report) == set()
        assert ranged.queues is not None
        states = list(ranged.queues.states.values())
        assert len(states) > 10
        for state in states:
            assert list(state.matched_runs) == [state.min_offset, state.max_offset]
            assert state.unmatched_spans() == []


def _append_with_keys(store_dir: Path, first: int, count: int, *options: str) -> None:
    """``count`` messages of three keys each (a record's index entries can straddle two
    index files), appended by the append command with ``options``."""
    import json

    from support import run_cli

    messages = [
        {"topic": f"T{n % 3}", "queueId": n % 2, "keys": f"a{n} b{n}", "body": "x" * (n % 900)}
        for n in range(first, first + count)
    ]
    lines = "".join(json.dumps(message) + "\n" for message in messages)
    result = run_cli("append", store_dir, "--input", "-", *options, input=lines)
    assert result.exit_code == 0, result.stderr


# small files, for stores that roll their log, queue and index files within a few hundred
# messages: as append's options, and as the store's configuration
SMALL_GEOMETRY = ("--commitlog-file-size", "65536", "--consumequeue-file-size", "400",
                  "--index-slots", "64", "--index-entries", "256")  # fmt: skip
SMALL_CONFIG = StoreConfig(
    commitlog_file_size=65536, consumequeue_file_size=400, index_slots=64, index_entries=256
)


@pytest.mark.parametrize("ranged", [False, True])
def test_a_store_written_while_verify_runs_is_checked_as_it_stood(
    tmp_path: Path, ranged: bool
) -> None:
    """A store whose lock another process holds: what that process writes after verify
    began (records, units, index entries and files, a roll of the log) is not looked at,
    whenever it comes: here right after the ranges are planned, or while the pass reads the
    log. Among it, the dispatch of records there were (a broker's dispatch catching up): the
    ranges look at the index as it was when verify began, or they would take those
    records' entries for a hole. The report has notes only, and counts exactly the records
    there were."""
    from rmqstore.verify.ranges import RangedVerify

    from support import run_cli

    geometry, config = SMALL_GEOMETRY, SMALL_CONFIG
    store_dir = tmp_path / "store"
    store_dir.mkdir()
    _append_with_keys(store_dir, 0, 300, "--create", "--dispatch", *geometry)
    _append_with_keys(store_dir, 300, 200, *geometry)  # not dispatched yet
    written: list[int] = []

    def write_more(_: int = 0) -> None:
        if not written:
            written.append(1)
            assert run_cli("dispatch", store_dir, *geometry[2:]).exit_code == 0
            _append_with_keys(store_dir, 500, 300, "--dispatch", *geometry)

    with Store.open_read(store_dir, config) as store:
        store.held_elsewhere = True  # as open_read finds it when a broker holds the lock
        if ranged:
            settings = dict(check_crc=True, commitlog_only=False, topics=None, from_offset=None)
            open_files = len(os.listdir("/proc/self/fd"))
            checks = RangedVerify(store, range_size=20_000, max_findings=None, **settings)
            write_more()
            report = checks.run()
            assert len(os.listdir("/proc/self/fd")) == open_files  # the ranges close theirs
        else:
            report = verify_store(store, VerifyOptions(max_findings=None), progress=write_more)
    assert written
    assert kinds(report) == set(), [f.to_dict() for f in report.findings]
    assert report.counts["store-live"] == 1
    assert report.counts["dispatch-lag"] == report.counts["index-lag"] == 1  # notes
    assert report.checked["records"] == 500
    with Store.open_read(store_dir, config) as store:  # at rest: all of it, sound
        report = verify_store(store, VerifyOptions(max_findings=None))
    assert report.findings == [] and report.checked["records"] == 800


@pytest.mark.parametrize("ranged", [False, True])
@pytest.mark.parametrize("writer", ["append", "lock"])
def test_a_store_written_while_verify_runs_with_its_lock_free_is_said_to_have_changed(
    tmp_path: Path, ranged: bool, writer: str
) -> None:
    """A store at rest when verify began (its lock free), which another process then
    writes (an append run beside it, a broker starting), or only takes the lock of: what
    verify read may be a write half done (a torn tail, units missing), so it says the store
    changed and names no command (nor a fix per finding) until it runs again. Run again at
    rest, it finds what the append left (no store-changed)."""
    from rmqstore.verify.findings import REPORT_ONLY
    from rmqstore.verify.ranges import RangedVerify

    from support import lock_held_elsewhere

    geometry, config = SMALL_GEOMETRY, SMALL_CONFIG
    store_dir = tmp_path / "store"
    store_dir.mkdir()
    _append_with_keys(store_dir, 0, 300, "--create", "--dispatch", *geometry)
    with contextlib.ExitStack() as held:

        def write(_: int = 0) -> None:
            if writer == "append":  # not dispatched: abort stays, the queues lag
                _append_with_keys(store_dir, 300, 50, *geometry)
            else:
                held.enter_context(lock_held_elsewhere(store_dir / "lock"))

        with Store.open_read(store_dir, config) as store:
            assert not store.written_elsewhere
            if ranged:
                settings = dict(check_crc=True, commitlog_only=False, topics=None, from_offset=None)
                checks = RangedVerify(store, range_size=20_000, max_findings=None, **settings)
                write()
                report = checks.run()
            else:
                written = []
                report = verify_store(
                    store,
                    VerifyOptions(max_findings=None),
                    progress=lambda _: written or written.append(write()),
                )
    assert report.counts["store-changed"] == 1
    assert report.next_step(str(store_dir)) is None
    fixes = {f["fix"] for f in report.to_dict(str(store_dir))["findings"]}
    assert fixes == {REPORT_ONLY}
    with Store.open_read(store_dir, config) as store:  # at rest
        report = verify_store(store, VerifyOptions(max_findings=None))
    assert report.counts["store-changed"] == 0
    if writer == "append":
        assert kinds(report) == {"abort-present", "dispatch-lag", "index-lag"}
        assert report.next_step(str(store_dir)) == f"rmqstore recover {store_dir} --yes"
    else:
        assert report.findings == []


def test_a_report_saved_in_the_store_root_while_verify_runs_is_no_change(tmp_path: Path) -> None:
    """``rmqstore verify STORE | tee STORE/report.txt``: the file tee makes in the root as
    verify runs is not a write of the store (verify would say it changed, and name no
    step)."""
    store_dir = tmp_path / "store"
    _append_with_keys(store_dir, 0, 600, "--create", "--dispatch", "--commitlog-file-size",
                      "65536")  # fmt: skip
    report_file = store_dir / "report.txt"
    with Store.open_read(store_dir) as store:
        report = verify_store(store, progress=lambda _: report_file.write_text("verifying"))
    assert report_file.exists() and report.findings == []


def test_a_log_file_a_broker_deletes_while_verify_reads_its_store_is_said_so(
    tmp_path: Path,
) -> None:
    """A broker's retention deletes the oldest commit-log files while it runs: a verify of
    its store that reaches one after it was deleted says so, and to run verify again."""
    from rmqstore.errors import StoreIOError

    store_dir = tmp_path / "store"
    _append_with_keys(store_dir, 0, 600, "--create", "--commitlog-file-size", "65536")
    files = sorted((store_dir / "commitlog").iterdir())
    assert len(files) >= 4
    later = files[2]

    def broker_deletes(_: int) -> None:
        if later.exists():
            later.unlink()

    with Store.open_read(store_dir) as store:
        store.held_elsewhere = True  # as open_read finds it when a broker holds the lock
        with pytest.raises(StoreIOError, match="was deleted while verify read the store"):
            verify_store(store, VerifyOptions(), progress=broker_deletes)


def test_records_a_brokers_crash_recovery_indexes_again_are_a_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A power cut left the last index file all zero (a broker flushes an index file only
    once it is full); the broker's crash recovery takes its end offset of 0 and indexes into
    it every record from where its replay starts, some of which the files before index
    already. verify said each such entry "points between records" (errors, exit 1); it is a
    note on the file now, and the entries after the files before it end are checked as ever."""
    from rmqstore.indexfile import IndexHeader
    from rmqstore.msgid import UniqKeyGenerator
    from rmqstore.record import Message

    config = StoreConfig(commitlog_file_size=FILE, index_slots=50, index_entries=300)
    root = tmp_path / "store"
    with Store.open_write(root, config, create=True) as store:
        appender = store.appender(uniq_keys=UniqKeyGenerator())
        appender.append_many(
            [
                Message(topic="T", body=b"x" * 300, queue_id=n % 2, properties={"KEYS": f"k{n}"})
                for n in range(400)
            ]
        )
        dispatcher = Dispatcher(store)
        dispatcher.run()
        dispatcher.close()
    last = sorted((root / "index").iterdir())[-1]
    last.write_bytes(bytes(last.stat().st_size))  # the power cut
    (root / "abort").write_bytes(b"")
    monkeypatch.setattr(IndexHeader, "carry_end_of", lambda _header, _previous: None)  # a broker
    with Store.open_write(root, config) as store:
        dispatcher = Dispatcher(store)
        dispatcher.run()
        dispatcher.close()
    monkeypatch.undo()
    with Store.open_read(root, config) as store:
        report = verify_store(store, VerifyOptions())
    again = [f for f in report.findings if f.kind == "index-again"]
    assert again and all(f.severity == NOTE for f in again)
    assert report.ok, [(f.kind, f.message) for f in report.findings][:3]
    assert report.counts["index-entry"] == 0
    for jobs in ("1", "2"):  # and in ranges of worker processes
        done = run_cli("verify", root, "--jobs", jobs, "--split-size", "65536", "--json")
        assert done.exit_code == 0, done.stdout[-2000:]
        assert json.loads(done.stdout)["findingsByKind"].get("index-again", 0) == len(again)

    # the newest entry, past where any file before it ends, is still checked
    newest = sorted((root / "index").iterdir())[-1]
    data = bytearray(newest.read_bytes())
    count = struct.unpack_from(">i", data, 36)[0]  # indexCount
    at = 40 + 50 * 4 + (count - 1) * 20 + 4  # its physical offset
    struct.pack_into(">q", data, at, struct.unpack_from(">q", data, at)[0] + 1)
    newest.write_bytes(bytes(data))
    with Store.open_read(root, config) as store:
        report = verify_store(store, VerifyOptions())
    assert report.counts["index-entry"] >= 1 and not report.ok
