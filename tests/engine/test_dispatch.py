"""Dispatch rebuilds what the broker built: consume queues byte-identical, index files that
answer every manifest query the same, offsets by time, min/max offsets; idempotent and
resumable; torn tails and bad files handled."""

from __future__ import annotations

import hashlib
import itertools
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from rmqstore.checkpoint import write_checkpoint
from rmqstore.config import StoreConfig
from rmqstore.consumequeue import PRE_BLANK_UNIT, ConsumeQueue
from rmqstore.dispatch import Dispatcher, apply_rebuild, plan_dispatch, plan_rebuild
from rmqstore.errors import InputError, NotFoundError, StoreFormatError, StoreIOError
from rmqstore.hashing import tags_code
from rmqstore.indexfile import IndexService
from rmqstore.msgid import UniqKeyGenerator
from rmqstore.properties import KEYS, UNIQ_KEY
from rmqstore.reader import MessageReader
from rmqstore.record import TRANSACTION_PREPARED, TRANSACTION_ROLLBACK, Message
from rmqstore.segments import can_sync_file_system, remove_from_under_writers
from rmqstore.store import Store

from support import (
    ORACLE_CONFIG,
    compiled_pass_only,
    files_held,
    manifest_dump,
    recorded_calls,
    run_cli,
    sync_calls,
    tree_digest,
)

FULLY_DISPATCHED = [
    "s1_multi",
    "s3_txn_delay",
    "v533_s1_multi",
    "v533_s3_txn",
    "s4_recovered_from_torn_half_record",
]


def fixed_clock():
    counter = itertools.count(1_800_000_000_000, 7)
    return lambda: next(counter)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def dispatched_copy(oracle, name: str, tmp_path: Path, which: str = "store") -> Path:
    """A copy of an oracle store whose consume queues and index were deleted, then rebuilt
    by rmqstore dispatch."""
    store_dir = oracle(name).copy_to(tmp_path, which)
    shutil.rmtree(store_dir / "index", ignore_errors=True)
    with Store.open_write(store_dir, StoreConfig(**ORACLE_CONFIG)) as store:
        dispatcher = Dispatcher(store, clock=fixed_clock())
        dispatcher.run()
        dispatcher.close()
    return store_dir


@pytest.mark.parametrize("name", FULLY_DISPATCHED)
def test_consume_queues_are_byte_identical_to_the_brokers(
    oracle, tmp_path: Path, name: str
) -> None:
    store_dir = dispatched_copy(oracle, name, tmp_path)
    expected = {
        f["path"]: f["sha256"]
        for f in oracle(name).manifest["filesOnDisk"]
        if f["path"].startswith("consumequeue/")
    }
    written = {
        str(p.relative_to(store_dir)): sha(p)
        for p in (store_dir / "consumequeue").rglob("*")
        if p.is_file()
    }
    assert expected and written == expected


@pytest.mark.parametrize("name", FULLY_DISPATCHED)
def test_index_answers_every_query_like_the_broker(oracle, tmp_path: Path, name: str) -> None:
    store_dir = dispatched_copy(oracle, name, tmp_path)
    manifest = oracle(name).manifest
    index = IndexService(store_dir / "index", 1000, 2000)
    for query in manifest_dump(manifest)["queries"]:
        got = index.query(
            query["topic"], query["key"], query["maxNum"], query["begin"], query["end"]
        )
        assert got == query["indexService_queryOffset_phyOffsets"], query
    if not name.startswith("s4_"):  # S4's broker rebuilt part of its index after a crash
        theirs = sorted(
            f["sha256"] for f in manifest["filesOnDisk"] if f["path"].startswith("index/")
        )
        assert sorted(sha(f.path) for f in index.files) == theirs
    index.close()


@pytest.mark.parametrize("name", FULLY_DISPATCHED)
def test_queue_offsets_and_time_lookups_like_the_broker(oracle, tmp_path: Path, name: str) -> None:
    store_dir = dispatched_copy(oracle, name, tmp_path)
    dump = manifest_dump(oracle(name).manifest)
    rule = "5.x" if name.startswith("v533") else "4.x"
    with Store.open_read(store_dir, StoreConfig(**ORACLE_CONFIG)) as store:
        reader = MessageReader(store)
        for topic, queues in dump["consumeQueues"].items():
            for queue_id, expected in queues.items():
                if not (store.consumequeue_dir / topic / queue_id).exists():
                    # the broker lists empty queues it knows in memory; no files exist
                    assert expected["maxOffsetInQueue"] == 0 and not expected["entries"]
                    continue
                queue = store.consume_queue(topic, int(queue_id))
                assert queue.min_offset == expected["minOffsetInQueue"], (topic, queue_id)
                assert queue.max_offset == expected["maxOffsetInQueue"], (topic, queue_id)
                assert queue.max_physical_offset == expected["cqMaxPhysicOffset"]
                units = [
                    [u.queue_offset, u.physical_offset, u.size, u.tags_code] for u in queue.units()
                ]
                assert units == expected["entries"]
        for probe in dump["offsetInQueueByTime"]:
            if "timestamp" in probe and probe["offsetInQueueByTime"]:
                got = reader.offset_by_time(
                    probe["topic"], probe["queueId"], probe["timestamp"], rule=rule
                )
                assert got == probe["offsetInQueueByTime"], probe


def test_dispatching_the_crashed_store_reaches_what_broker_recovery_reached(
    oracle, tmp_path: Path
) -> None:
    """S2 halted with 300 messages not dispatched; the broker's recovery of it is S4. With
    'abort' there, dispatch starts where the broker's crash recovery does, at the file the
    checkpoint picks (here the first: the store's records are less than the 3 s margin
    older than it), skipping the 1,500 units the queues hold."""
    store_dir = oracle("s2_crash").copy_to(tmp_path)
    with Store.open_write(store_dir, StoreConfig(**ORACLE_CONFIG)) as store:
        replay = store.commitlog.recovery_start(store.checkpoint(), True)
        dispatcher = Dispatcher(store)
        result = dispatcher.run()
        dispatcher.close()
    assert result.from_offset == replay.start == 0
    assert (result.units_written, result.units_skipped) == (300, 1500)
    recovered = {
        f["path"]: f["sha256"]
        for f in oracle("s4_recovered_from_torn_half_record").manifest["filesOnDisk"]
        if f["path"].startswith("consumequeue/")
    }
    assert {p: sha(store_dir / p) for p in recovered} == recovered
    assert not (store_dir / "abort").exists()  # consistent now: no crash recovery needed


def test_dispatch_twice_or_resumed_gives_the_same_bytes(oracle, tmp_path: Path) -> None:
    once = dispatched_copy(oracle, "s1_multi", tmp_path / "once")
    digest = tree_digest(once)
    with Store.open_write(once, StoreConfig(**ORACLE_CONFIG)) as store:
        dispatcher = Dispatcher(store, clock=fixed_clock())
        again = dispatcher.run()
        dispatcher.close()
    assert (again.units_written, again.index_entries, again.records) == (0, 0, 0)
    assert tree_digest(once) == digest

    resumed = oracle("s1_multi").copy_to(tmp_path / "resumed")
    shutil.rmtree(resumed / "consumequeue")
    shutil.rmtree(resumed / "index")
    clock = fixed_clock()
    for limit in (1000, 17, 5000):
        with Store.open_write(resumed, StoreConfig(**ORACLE_CONFIG)) as store:
            dispatcher = Dispatcher(store, clock=clock)
            dispatcher.run(max_records=limit)
            dispatcher.close()
    assert tree_digest(resumed) == digest


def test_bytes_after_a_queues_end_go_to_quarantine_before_units_cover_them(
    oracle, tmp_path: Path
) -> None:
    """A consume queue ends at its first empty unit; a byte of junk further on (a torn unit
    write) is overwritten by the units dispatched there, as a broker overwrites it, but is
    copied to quarantine and zeroed first (it used to be overwritten: a byte lost)."""
    store_dir = oracle("s1_multi").copy_to(tmp_path)
    queue_file = store_dir / "consumequeue" / "TopicTest" / "0" / "00000000000000000000"
    data = bytearray(queue_file.read_bytes())
    units = 40  # keep the first 40 units: the rest are zeros, then a byte of junk
    junk = units * 20 + 20 * 5 + 3
    data[units * 20 :] = bytes(len(data) - units * 20)
    data[junk] = 0x5A
    queue_file.write_bytes(bytes(data))
    with Store.open_write(store_dir, StoreConfig(**ORACLE_CONFIG)) as store:
        dispatcher = Dispatcher(store, topics=["TopicTest"])
        dispatcher.run(from_offset=0)
        dispatcher.close()
        notes = list(store.notes)
    assert any("bytes after the valid end of consume queue TopicTest/0" in n for n in notes)
    (folder,) = (store_dir / "quarantine").glob("*-dispatch")
    copies = {str(p.relative_to(folder / "consumequeue")): p for p in folder.rglob("*.bin")}
    # the junk of the first file, and the later files' units the new ones are written over
    first = f"TopicTest/0/00000000000000000000.{units * 20}-{junk + 1}.bin"
    assert first in copies and len(copies) == 3
    assert copies[first].read_bytes() == bytes(data[units * 20 : junk + 1])
    broker = oracle("s1_multi").store / "consumequeue" / "TopicTest" / "0"
    for path in broker.iterdir():
        assert (queue_file.parent / path.name).read_bytes() == path.read_bytes()


def test_a_torn_tail_never_advances_the_cursor(oracle, tmp_path: Path) -> None:
    crash = oracle("s2_crash")
    store_dir = crash.copy_to(tmp_path, "store_torn_half_record")
    for _ in range(2):
        with Store.open_write(store_dir, StoreConfig(**ORACLE_CONFIG)) as store:
            dispatcher = Dispatcher(store)
            result = dispatcher.run()
            assert dispatcher.cursor() == crash.manifest["lastValidEnd"]
            dispatcher.close()
        assert result.log_end == crash.manifest["lastValidEnd"]
        assert (store_dir / "abort").exists()  # the torn bytes still need recovery


def test_pre_blank_units_when_a_queue_starts_above_zero(tmp_path: Path) -> None:
    config = StoreConfig(commitlog_file_size=4096, consumequeue_file_size=200)
    with Store.open_write(tmp_path / "s", config, create=True) as store:
        store.appender().append_many([Message(topic="T", body=b"x" * 700) for _ in range(12)])
    for old in (tmp_path / "s" / "commitlog").iterdir():
        if old.name == "00000000000000000000":
            old.unlink()  # the oldest file expired, as after a broker's cleanup
    with Store.open_write(tmp_path / "s", config) as store:
        first_offset = next(iter(store.commitlog.scan()))[1][5]
        dispatcher = Dispatcher(store)
        dispatcher.run()
        dispatcher.close()
    assert first_offset > 0
    queue = ConsumeQueue(tmp_path / "s" / "consumequeue", "T", 0, 200)
    queue.correct_min_offset(4096)
    data = (tmp_path / "s" / "consumequeue" / "T" / "0" / "00000000000000000000").read_bytes()
    assert data[: first_offset * 20] == PRE_BLANK_UNIT * first_offset
    assert (queue.min_offset, queue.max_offset) == (first_offset, 12)


def test_unsafe_topic_names_in_records_are_not_turned_into_paths(tmp_path: Path) -> None:
    """A record written by someone else with a topic a broker would never accept."""
    from rmqstore.record import encode_record

    store_dir = tmp_path / "s"
    with Store.open_write(store_dir, StoreConfig(commitlog_file_size=4096), create=True) as store:
        end = store.appender().append(Message(topic="Good", body=b"ok")).store_size
    with open(store_dir / "commitlog" / "00000000000000000000", "r+b") as handle:
        handle.seek(end)
        handle.write(encode_record(Message(topic="../evil", body=b"x", physical_offset=end)))
    with Store.open_write(store_dir) as store:
        dispatcher = Dispatcher(store)
        result = dispatcher.run()
        dispatcher.close()
    assert result.records == 2
    assert any("../evil" in problem for problem in result.problems)
    assert not (tmp_path / "evil").exists()
    assert [p.name for p in (store_dir / "consumequeue").iterdir()] == ["Good"]


def test_a_symlink_out_of_the_store_is_not_followed(tmp_path: Path) -> None:
    store_dir = tmp_path / "s"
    outside = tmp_path / "outside"
    outside.mkdir()
    with Store.open_write(store_dir, StoreConfig(commitlog_file_size=4096), create=True) as store:
        store.appender().append(Message(topic="Linked", body=b"x"))
    (store_dir / "consumequeue").mkdir()
    (store_dir / "consumequeue" / "Linked").symlink_to(outside)
    with Store.open_write(store_dir) as store:
        dispatcher = Dispatcher(store)
        result = dispatcher.run()
        dispatcher.close()
    assert list(outside.iterdir()) == []
    assert any("symbolic link" in problem for problem in result.problems)


def test_a_linked_queue_folder_is_not_written_and_leaves_no_work_behind(tmp_path: Path) -> None:
    """A topic folder that is a symbolic link, out of the store or into it, is not written
    through (list_queues leaves it out, so its units would be neither known nor checked);
    each dispatch names it, and when its records end the log a dispatch is not left with
    work it never does (the dry run said there was, at every run)."""
    store_dir = tmp_path / "s"
    with Store.open_write(store_dir, StoreConfig(commitlog_file_size=4096), create=True) as store:
        for topic in ("Plain", "Out", "In"):
            store.appender().append(Message(topic=topic, body=b"x"))
    outside, parked = tmp_path / "outside", store_dir / "parked"
    outside.mkdir()
    parked.mkdir()
    (store_dir / "consumequeue").mkdir()
    (store_dir / "consumequeue" / "Out").symlink_to(outside)
    (store_dir / "consumequeue" / "In").symlink_to(parked)
    for run in range(2):
        with Store.open_write(store_dir) as store:
            dispatcher = Dispatcher(store)
            result = dispatcher.run()
            dispatcher.close()
        assert result.records == (3 if run == 0 else 0)
        assert result.units_written == (1 if run == 0 else 0)
        linked = sorted(p.split(" is a symbolic link")[0] for p in result.problems)
        assert linked == [str(store_dir / "consumequeue" / name) for name in ("In", "Out")]
        with Store.open_read(store_dir) as store:
            start, end = plan_dispatch(store)
        assert start == end == result.log_end
    assert list(outside.iterdir()) == list(parked.iterdir()) == []


def test_bad_files(oracle, tmp_path: Path) -> None:
    store_dir = oracle("s1_multi").copy_to(tmp_path)
    queue_file = store_dir / "consumequeue" / "TopicTest" / "0" / "00000000000000000000"
    with open(queue_file, "r+b") as handle:
        handle.truncate(1990)
    with (
        pytest.raises(StoreFormatError, match="1990 bytes"),
        Store.open_read(store_dir, StoreConfig(**ORACLE_CONFIG)) as store,
    ):
        store.consume_queue("TopicTest", 0)
    with (
        pytest.raises(NotFoundError, match="no consume queue"),
        Store.open_read(store_dir, StoreConfig(**ORACLE_CONFIG)) as store,
    ):
        store.consume_queue("NoSuchTopic", 0)
    index_file = sorted((store_dir / "index").iterdir())[0]
    with open(index_file, "r+b") as handle:
        handle.seek(36)
        handle.write((999_999).to_bytes(4, "big"))
    with pytest.raises(StoreFormatError, match="corrupt header"):
        IndexService(store_dir / "index", 1000, 2000)
    with pytest.raises(StoreFormatError, match="maxHashSlotNum"):
        IndexService(store_dir / "index", 5_000_000, 20_000_000)


def test_units_pointing_past_the_log_are_refused(oracle, tmp_path: Path) -> None:
    store_dir = oracle("s1_multi").copy_to(tmp_path)
    last = sorted((store_dir / "commitlog").iterdir())[-1]
    last.unlink()  # the log now ends earlier than the consume queues
    before = tree_digest(store_dir)
    with Store.open_write(store_dir, StoreConfig(**ORACLE_CONFIG)) as store:
        dispatcher = Dispatcher(store)
        with pytest.raises(InputError, match="dispatch --rebuild"):
            dispatcher.run()
        dispatcher.close()
    after = tree_digest(store_dir)
    # abort (dispatch began) and the geometry the writer was given are all that is new
    new = {"abort", "config/rmqstore-geometry.json"}
    assert {k: v for k, v in after.items() if k not in new} == before


def test_rebuild_quarantines_and_reproduces(oracle, tmp_path: Path) -> None:
    store_dir = oracle("s1_multi").copy_to(tmp_path)
    queues_before = {
        str(p.relative_to(store_dir)): sha(p)
        for p in (store_dir / "consumequeue").rglob("*")
        if p.is_file()
    }
    with Store.open_write(store_dir, StoreConfig(**ORACLE_CONFIG)) as store:
        plan = plan_rebuild(store)
        assert plan.files == len(queues_before) + 4
        quarantine = apply_rebuild(store, plan)
        dispatcher = Dispatcher(store)
        dispatcher.run(plan.from_offset)
        dispatcher.close()
    assert quarantine is not None
    kept = {
        str(p.relative_to(quarantine / "consumequeue")): sha(p)
        for p in (quarantine / "consumequeue").rglob("*")
        if p.is_file()
    }
    assert {f"consumequeue/{name}": v for name, v in kept.items()} == queues_before
    rebuilt = {
        str(p.relative_to(store_dir)): sha(p)
        for p in (store_dir / "consumequeue").rglob("*")
        if p.is_file()
    }
    assert rebuilt == queues_before
    assert (quarantine / "manifest.json").exists()


@pytest.mark.parametrize("queue_offset", [-5, 2**62, 2**63 - 1])
def test_a_damaged_queue_offset_starts_no_queue_file_a_broker_cannot_name(
    tmp_path: Path, queue_offset: int
) -> None:
    """QUEUEOFFSET is not covered by any CRC. A record whose queue offset times 20 is no Java
    long made the dispatch create its queue's first file under a name such as
    -0000000000006000000 or 92233720368546000000, which a broker cannot parse (and verify
    called the store sound). Now no unit is written for it, the dispatch says why, and
    verify names the record."""
    from rmqstore.verify import verify_store

    store_dir = tmp_path / "store"
    config = StoreConfig(**ORACLE_CONFIG)
    with Store.open_write(store_dir, config, create=True) as store:
        appender = store.appender()
        appender.append(Message(topic="T", body=b"damaged"))
        appender.append(Message(topic="Other", body=b"fine"))
    log_file = store_dir / "commitlog" / "00000000000000000000"
    data = bytearray(log_file.read_bytes())
    data[20:28] = queue_offset.to_bytes(8, "big", signed=True)  # the first record's QUEUEOFFSET
    log_file.write_bytes(data)
    with Store.open_write(store_dir, config) as store:
        dispatcher = Dispatcher(store)
        try:
            result = dispatcher.run(0)
        finally:
            dispatcher.close()
    assert result.units_written == 1  # Other's
    assert any(f"queue offset {queue_offset} cannot start" in p for p in result.problems)
    assert not (store_dir / "consumequeue" / "T").exists()
    for path in (store_dir / "consumequeue").rglob("*"):
        assert not path.is_file() or 0 <= int(path.name) < 2**63, path
    with Store.open_read(store_dir, config) as store:
        report = verify_store(store)
    assert report.counts["record-queue-offset"] == 1 and not report.ok


def _dispatched(store_dir: Path, config: StoreConfig) -> tuple[int, int, int]:
    """(records walked, where a dispatch would start next, the log's valid end)."""
    with Store.open_write(store_dir, config) as store:
        dispatcher = Dispatcher(store)
        try:
            walked = dispatcher.run().records
            return walked, dispatcher.cursor(), store.log_end().offset
        finally:
            dispatcher.close()


@pytest.mark.parametrize(
    "last",
    [
        [],  # no record with a key at all: the index has no file
        [Message(topic="T", body=b"no key")],
        [
            Message(
                topic="T",
                body=b"prepared",
                sys_flag=TRANSACTION_PREPARED,
                properties={UNIQ_KEY: "AB01"},
            )
        ],
        [
            Message(
                topic="T",
                body=b"rolled back",
                sys_flag=TRANSACTION_ROLLBACK,
                properties={KEYS: "k9"},
            )
        ],
    ],
)
def test_records_a_dispatch_writes_nothing_for_are_not_left_behind(
    tmp_path: Path, last: list[Message]
) -> None:
    """A broker's index ends at the last record with keys and its queues at the last record
    they take: records after those that give them nothing (no UNIQ_KEY nor KEYS; PREPARED;
    ROLLBACK) are dispatched all the same. A dispatch used to start before them every time
    (before every keyless record of the log when none had keys), and its dry run called the
    store behind after each dispatch."""
    config = StoreConfig(commitlog_file_size=4096, consumequeue_file_size=200)
    store_dir = tmp_path / "s"
    keyed = [] if not last else [Message(topic="T", body=b"k", properties={KEYS: "k1"})]
    with Store.open_write(store_dir, config, create=True) as store:
        store.appender().append_many(
            [*keyed, *(Message(topic="T", body=b"x" * 100) for _ in range(4)), *last]
        )
    walked, cursor, end = _dispatched(store_dir, config)
    assert walked == len(keyed) + 4 + len(last) and cursor == end
    assert _dispatched(store_dir, config) == (0, end, end)
    with Store.open_read(store_dir, config) as store:
        assert plan_dispatch(store) == (end, end)


def test_records_with_keys_after_keyless_ones_are_still_indexed(tmp_path: Path) -> None:
    """The walk past records that give the index nothing stops at the first that gives it
    keys: an index deleted under full queues is built again from there."""
    config = StoreConfig(commitlog_file_size=4096, consumequeue_file_size=200)
    store_dir = tmp_path / "s"
    with Store.open_write(store_dir, config, create=True) as store:
        results = store.appender().append_many(
            [
                *(Message(topic="T", body=b"x") for _ in range(3)),
                Message(topic="T", body=b"k", properties={KEYS: "wanted"}),
                Message(topic="T", body=b"y"),
            ]
        )
    _dispatched(store_dir, config)
    shutil.rmtree(store_dir / "index")
    with Store.open_read(store_dir, config) as store:
        assert plan_dispatch(store)[0] == results[3].physical_offset
    walked, _, _ = _dispatched(store_dir, config)
    assert walked == 2
    index = IndexService(store_dir / "index", config.index_slots, config.index_entries)
    assert index.query("T", "wanted") == [results[3].physical_offset]


def test_a_last_file_with_no_record_after_a_blank_is_not_behind(tmp_path: Path) -> None:
    """A commit log whose last file holds no record (a recovery cut its only records) ends
    at that file's start: the BLANK before it is not left for the next dispatch."""
    config = StoreConfig(commitlog_file_size=4096, consumequeue_file_size=200)
    store_dir = tmp_path / "s"
    with Store.open_write(store_dir, config, create=True) as store:
        store.appender().append_many([Message(topic="T", body=b"x" * 700) for _ in range(7)])
    last = store_dir / "commitlog" / "00000000000000004096"
    last.write_bytes(bytes(4096))  # its records gone, as a recovery's cut leaves it
    walked, cursor, end = _dispatched(store_dir, config)
    assert (walked, cursor, end) == (5, 4096, 4096)
    with Store.open_read(store_dir, config) as store:
        assert plan_dispatch(store) == (4096, 4096)


@compiled_pass_only  # a real-broker store: a kernel corpus seed
def test_a_dispatch_into_many_queues_holds_few_maps_and_writes_the_same_bytes(
    oracle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each queue written kept its file mapped (and Python's map keeps a descriptor): a
    rebuild of a store of 1,000 topics of 4 queues stopped with "Too many open files" under a
    ulimit -n of 1024. Past WRITE_MAPS.limit the queue mapped longest ago lets its map go;
    the bytes are those of a dispatch holding every map (the real stores' 12 to 20 queues,
    here with room for 3)."""
    from rmqstore.consumequeue import WRITE_MAPS

    whole = dispatched_copy(oracle, "s1_multi", tmp_path / "whole")
    queues = whole / "consumequeue"
    assert len(list(queues.glob("*/*"))) > 10
    monkeypatch.setattr(WRITE_MAPS, "limit", 3)
    few = oracle("s1_multi").copy_to(tmp_path / "few")
    shutil.rmtree(few / "consumequeue")
    shutil.rmtree(few / "index")
    most = 0
    with Store.open_write(few, StoreConfig(**ORACLE_CONFIG)) as store:
        dispatcher = Dispatcher(store, clock=fixed_clock())
        while dispatcher.run(max_records=100).records:  # the files looked at in between
            most = max(most, files_held(few / "consumequeue"))
            assert len(WRITE_MAPS) <= 3
        dispatcher.close()
    assert 0 < most <= 3
    assert files_held(few / "consumequeue") == 0
    assert tree_digest(few) == tree_digest(whole)


def test_a_replay_over_units_already_there_moves_the_logics_time_as_a_broker_does(
    oracle, tmp_path: Path
) -> None:
    """A crash's replay puts every record again; a broker's put returns true for a unit
    the queue holds already and takes its record's time as logicsMsgTimestamp. A replay
    whose last units were all there (a power cut after the queues, before the checkpoint)
    used to leave the time where it was, short of what a run never cut writes."""
    built = dispatched_copy(oracle, "s1_multi", tmp_path / "built")
    with Store.open_read(built, StoreConfig(**ORACLE_CONFIG)) as store:
        uncut = store.checkpoint()
    assert uncut is not None and uncut.logics_msg_timestamp > 0
    write_checkpoint(built / "checkpoint", replace(uncut, logics_msg_timestamp=0))
    (built / "abort").write_bytes(b"")
    with Store.open_write(built, StoreConfig(**ORACLE_CONFIG)) as store:
        dispatcher = Dispatcher(store, clock=fixed_clock())
        result = dispatcher.run()
        dispatcher.close()
        assert result.units_written == 0 and result.units_skipped > 0
        after = store.checkpoint()
    assert after is not None and after.logics_msg_timestamp == uncut.logics_msg_timestamp


def test_cesu8_tags_and_keys_hash_as_a_brokers_java_strings_do(tmp_path: Path) -> None:
    """TAGS and KEYS written by a client in CESU-8 (a character beyond the BMP as two 3-byte
    halves of a surrogate pair, 0xED 0xA0..0xBF ...): a broker's Java decodes each half as
    one U+FFFD and hashes that text into the tagsCode and the index. Python's decoder made
    three of each, so dispatch wrote a tagsCode and index hashes no broker writes, and
    verify would have called a broker's own queues wrong. A dispatch (walk and rebuild in
    worker processes) and the broker's hashes agree; verify finds nothing wrong with the
    queues or the index (it warns of the properties) and a key lookup finds the messages."""
    store = tmp_path / "store"
    messages = [
        Message(topic="Chat", body=b"x" * 1500, properties={"TAGS": "t-AAAAAA", KEYS: "k-BBB k2"})
        for _ in range(4)
    ]
    small = StoreConfig(commitlog_file_size=1 << 20)
    with Store.open_write(store, small, create=True) as opened:
        opened.appender().append_many(messages)
    log = store / "commitlog" / "00000000000000000000"
    data = bytearray(log.read_bytes()[: 1 << 14])  # U+1F600 in CESU-8; 0xED 0xBF, then "A"
    data = data.replace(b"t-AAAAAA", b"t-\xed\xa0\xbd\xed\xb8\x80").replace(
        b"k-BBB", b"k-\xed\xbfA"
    )
    with log.open("r+b") as file:
        file.write(data)
    rebuilt = tmp_path / "rebuilt"
    shutil.copytree(store, rebuilt)
    assert run_cli("dispatch", store).exit_code == 0
    result = run_cli(
        "dispatch", rebuilt, "--rebuild", "--yes", "--jobs", "2", "--split-size", "4096"
    )
    assert result.exit_code == 0, result.stderr
    tags = "t-\ufffd\ufffd"  # as the broker's String holds it
    for root in (store, rebuilt):
        with Store.open_read(root, small) as opened:
            codes = {unit.tags_code for unit in opened.consume_queue("Chat", 0).units()}
        assert codes == {tags_code(tags)}
        verified = run_cli("verify", root, "--json")  # a warning of each record, no more
        kinds = [finding["kind"] for finding in json.loads(verified.stdout)["findings"]]
        assert kinds == ["record-properties"] * 4, verified.stdout
        found = run_cli("read", root, "--key", "k-\ufffdA", "--topic", "Chat", "--json")
        assert found.exit_code == 0, found.stderr
        assert len(json.loads(found.stdout)) == 4
        assert json.loads(found.stdout)[0]["tags"] == tags
    assert tree_digest(store / "consumequeue") == tree_digest(rebuilt / "consumequeue")


SHORT_QUEUES = StoreConfig(
    commitlog_file_size=4096, consumequeue_file_size=40, index_slots=4, index_entries=10
)  # two units a queue file


def _many_new_queues(root: Path, queues: int) -> None:
    """A store of ``queues`` topics of one message each (a queue a device, as LMQ stores
    are), but for T0's three, which take two queue files; not dispatched."""
    clock = itertools.count(1_700_000_000_000, 1000).__next__
    messages = [Message(topic=f"T{n}", body=b"x") for n in range(queues)]
    with Store.open_write(root, SHORT_QUEUES, create=True) as store:
        appender = store.appender(clock=clock, uniq_keys=UniqKeyGenerator())
        appender.append_many([*messages, Message(topic="T0", body=b"y"), messages[0]])


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_a_dispatch_into_many_new_queues_syncs_their_file_system_once(tmp_path: Path) -> None:
    """Each new queue cost three fsyncs of folders (its topic's, its own, the one it was
    made in) and an fdatasync of its file: a dispatch into 20,000 new LMQ queues made 80,000
    syncs, each flushing the disk's write cache (18 s of its 23 s here). The queues whose
    writes lie in one file, and their folders, are now made durable by one syncfs before
    the checkpoint (when there are SYNCFS_FROM_QUEUES of them or more); a queue of two files
    still goes file by file, in order."""
    if not can_sync_file_system(tmp_path):
        pytest.skip("syncfs is used on Linux 5.8 and later, on local file systems")
    root = tmp_path / "s"
    _many_new_queues(root, 300)
    geometry = ["--commitlog-file-size", "4096", "--consumequeue-file-size", "40",
                "--index-slots", "4", "--index-entries", "10"]  # fmt: skip
    counts = sync_calls(["dispatch", str(root), *geometry], tmp_path)
    assert len(list((root / "consumequeue" / "T0" / "0").iterdir())) == 2
    index_files = len(list((root / "index").iterdir()))
    assert counts["syncfs"] == 1
    # T0's names and two files; the index's files and folder; the checkpoint, the root, the
    # abort file: not 1,200 more for the queues
    assert counts["fsync"] + counts["fdatasync"] <= 4 + 3 + 2 * index_files + 2 + 6, counts
    assert run_cli("verify", root, *geometry).exit_code == 0

    # a few queues written (an append, then its dispatch): each synced on its own, as a
    # syncfs waits for every dirty page of the file system, other programs' too
    with Store.open_write(root, SHORT_QUEUES) as store:
        appender = store.appender(uniq_keys=UniqKeyGenerator())
        appender.append_many([Message(topic=f"T{n}", body=b"z") for n in range(1, 6)])
    counts = sync_calls(["dispatch", str(root), *geometry], tmp_path)
    assert counts["syncfs"] == 0 and counts["fdatasync"] >= 5, counts
    assert run_cli("verify", root, *geometry).exit_code == 0


def test_where_syncfs_cannot_be_trusted_a_dispatch_syncs_each_new_queue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before Linux 5.8 (or on NFS, FUSE, ...) each new queue's file and folders are synced
    on their own, as they were made."""
    import rmqstore.consumequeue as consumequeue_module
    import rmqstore.dispatch as dispatch_module
    import rmqstore.segments as segments_module

    root = tmp_path / "s"
    _many_new_queues(root, 20)
    monkeypatch.setattr(dispatch_module, "can_sync_file_system", lambda _folder: False)
    files = recorded_calls(monkeypatch, consumequeue_module, "sync_file_data")
    folders = recorded_calls(monkeypatch, segments_module, "fsync_directory")
    with Store.open_write(root, SHORT_QUEUES) as store:
        dispatcher = Dispatcher(store)
        dispatcher.run()
        dispatcher.close()
    queues = root / "consumequeue"
    assert sum(path.is_relative_to(queues) for path in files) == 20 + 1  # T0's two files
    # consumequeue/ as each topic's folder was made in it, each topic's folder as its
    # queue's was, each queue's folder as each of its files was renamed into place (T0's
    # twice)
    assert folders.count(queues) == 20
    assert sum(path.is_relative_to(queues) for path in folders) == 20 + 20 + 20 + 1
    assert run_cli("verify", root).exit_code == 0


def test_a_rebuild_writer_does_not_make_its_staging_folder_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Spark rebuild stopped by a Ctrl-C removes its staging folder while its cancelled
    tasks may still write: a writer making its next queue's folders (mkdir -p) made the
    staging folder again, and left it in the store's root with that queue in it. The
    writer makes folders below the staging folder only."""
    import rmqstore.dispatch as dispatch_module
    from rmqstore.dispatch import write_sorted_units

    stage = tmp_path / "stage"
    stage.mkdir()
    closed = dispatch_module._closed_for_one_sync

    def closed_then_removed(queue: ConsumeQueue, device: int | None) -> bool:
        waits = closed(queue, device)
        if queue.topic == "A":
            remove_from_under_writers(stage)  # the driver, as the task goes on to queue B
        return waits

    monkeypatch.setattr(dispatch_module, "_closed_for_one_sync", closed_then_removed)
    rows = [("A", 0, 0, 0, 100, 7, 0, 1_700_000_000_000, False),
            ("B", 0, 0, 100, 100, 7, 0, 1_700_000_000_001, False)]  # fmt: skip
    with pytest.raises(StoreIOError, match=r"stage/B/0.*: the folder written into is gone"):
        write_sorted_units(stage, 2 * 20, 0, rows)
    assert sorted(path.name for path in tmp_path.iterdir()) == []


@pytest.mark.parametrize("trusted", [True, False], ids=["syncfs", "file by file"])
def test_a_rebuild_writing_sorted_units_into_many_queues_syncs_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trusted: bool
) -> None:
    """The Spark rebuild's writers (write_sorted_units, into a staging folder) closed each
    queue with an fdatasync of its file and an fsync of each folder made for it: 80,000
    syncs for 20,000 new LMQ queues. The queues written in one file now wait for one syncfs
    of the staging folder's file system at the end, where flush trusts it (a queue that
    rolls syncs its earlier file first); where syncfs is not trusted each queue is synced
    as it is closed."""
    import rmqstore.consumequeue as consumequeue_module
    import rmqstore.dispatch as dispatch_module
    from rmqstore.dispatch import write_sorted_units

    if trusted and not can_sync_file_system(tmp_path):
        pytest.skip("syncfs is used on Linux 5.8 and later, on local file systems")
    if not trusted:
        monkeypatch.setattr(dispatch_module, "can_sync_file_system", lambda _folder: False)
    syncfs = recorded_calls(monkeypatch, consumequeue_module, "sync_file_system")
    files = recorded_calls(monkeypatch, consumequeue_module, "sync_file_data")
    rows = [(f"D{n}", 0, 0, n * 100, 100, 7, 0, 1_700_000_000_000 + n, False) for n in range(100)]
    rows += [("T", 0, n, 10_000 + n * 100, 100, 7, 0, 1_700_000_001_000, False) for n in range(3)]
    stage = tmp_path / "stage"
    stage.mkdir()
    outcome = write_sorted_units(stage, 2 * 20, 0, rows)
    assert outcome.units_written == 103
    assert syncfs == ([stage] if trusted else [])
    # T's first file before its second took a unit (the second waits for the syncfs too),
    # or every queue's files
    assert len(files) == (1 if trusted else 100 + 2)
    for n in range(100):
        queue = ConsumeQueue(stage, f"D{n}", 0, 40)
        assert [(u.physical_offset, u.size) for u in queue.units()] == [(n * 100, 100)]
    assert ConsumeQueue(stage, "T", 0, 40).max_offset == 3
