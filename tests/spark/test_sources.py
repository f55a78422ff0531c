"""The commit-log source's options, as a user gives them to a read: refused with a message
naming the option when they cannot mean anything, and never a reason to leave records out."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from rmqstore.config import StoreConfig
from rmqstore.errors import InputError
from rmqstore.fixtures import generate
from rmqstore.record import Message
from rmqstore.spark.sources import CommitLogReader


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"splitSize": "-5"}, "splitSize='-5' is less than 0"),
        ({"splitSize": "1"}, "splitSize=1 is less than 4096 (0: a partition per file)"),
        ({"maxMessageSize": "0"}, "maxMessageSize='0' is less than 1"),
        ({"maxMessageSize": str(2**31)}, "maxMessageSize='2147483648' is more than 2147483647"),
        ({"fileBounds": "[1, 2]"}, "fileBounds is not a JSON object of offsets"),
        ({"fileBounds": '{"00000000000000000000": "x"}'}, "not a JSON object of offsets"),
        ({"fileBounds": '{"../../etc/passwd": 5}'}, "'../../etc/passwd' is not a commit-log file"),
        ({"fileBounds": '{"00000000000000000000": -7}'}, "ends at -7, before its start"),
        ({"fileBounds": '{"00000000000000000000": Infinity}'}, "not a JSON object of offsets"),
        ({"fileBounds": '{"00000000000000000000": 5.7}'}, "not a JSON object of offsets"),
        ({"fileBounds": '{"00000000000000000000": true}'}, "not a JSON object of offsets"),
        ({"fileBounds": '{"00000000000000000000": 1e30}'}, "not a JSON object of offsets"),
        ({"fileBounds": '{"00000000000000000000": 9223372036854775808}'}, "past any commit-log"),
        # a typo is not quietly false, a window that holds nothing is not an empty read
        ({"includeBody": "ture"}, "includeBody='ture' is not true or false"),
        ({"verifyCrc": "on"}, "verifyCrc='on' is not true or false"),
        ({"summary": "file"}, "summary='file' is not files (a row per range)"),
        ({"startingOffset": "-1"}, "startingOffset='-1' is less than 0"),
        (
            {"startingOffset": "10", "endingOffset": "5"},
            "endingOffset=5 is before startingOffset=10",
        ),
        ({"topics": "Orders,../../etc"}, "topics: topic '../../etc' contains a path separator"),
        (
            {"messageDelayLevel": "1s 5x"},
            "messageDelayLevel item '5x' is not a number plus s/m/h/d",
        ),
        ({"crcFrom": "-1"}, "crcFrom='-1' is less than 0"),
    ],
)
def test_options_that_cannot_mean_anything_are_refused(
    tmp_path: Path, options: dict[str, str], message: str
) -> None:
    generate("basic", tmp_path / "store")
    with pytest.raises(InputError, match=re.escape(message)):
        CommitLogReader({"path": str(tmp_path / "store"), **options})


def _big_store(root: Path) -> list[int]:
    """A store whose records are longer than a small maxMessageSize lets a reader expect (a
    broker configured to allow more): their lengths."""
    from rmqstore.store import Store

    bodies = [bytes([n]) * (120_000 + n) for n in range(5)]
    with Store.open_write(root, StoreConfig(commitlog_file_size=1024 * 1024), create=True) as store:
        store.appender().append_many(Message(topic="Big", body=body) for body in bodies)
    return [len(body) for body in bodies]


def test_records_longer_than_max_message_size_are_all_read(tmp_path: Path) -> None:
    lengths = _big_store(tmp_path / "store")
    for split in ("50000", "4096", "0"):
        reader = CommitLogReader(
            {"path": str(tmp_path / "store"), "splitSize": split, "maxMessageSize": "1"}
        )
        read = [
            length
            for partition in reader.partitions()
            for batch in reader.read(partition)
            for length in batch.column("bodyLength").to_pylist()
        ]
        assert read == lengths


@pytest.mark.spark
def test_a_spark_read_of_long_records_in_small_splits_counts_them_all(
    spark: Any, tmp_path: Path
) -> None:
    lengths = _big_store(tmp_path / "store")
    frame = (
        spark.read.format("rocketmq-commitlog")
        .option("splitSize", "50000")
        .option("maxMessageSize", "1024")
        .load(str(tmp_path / "store"))
    )
    assert frame.rdd.getNumPartitions() > 1
    assert sorted(row.bodyLength for row in frame.select("bodyLength").collect()) == lengths


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("", "no store given"),
        ("file", "is a file, not a store directory"),
        ("missing", "no such directory"),
        ("empty", "is not a RocketMQ store (no commitlog/ directory)"),
    ],
)
def test_a_read_of_what_is_not_a_store_says_what_it_is(
    tmp_path: Path, path: str, message: str
) -> None:
    from rmqstore.errors import NotAStoreError
    from rmqstore.spark.sources import ConsumeQueueReader

    (tmp_path / "file").write_text("x")
    (tmp_path / "empty").mkdir()
    where = str(tmp_path / path) if path else ""
    for reader in (CommitLogReader, ConsumeQueueReader):
        with pytest.raises(NotAStoreError, match=re.escape(message)):
            reader({"path": where}).partitions()


def test_a_store_with_a_commit_log_file_cut_short_is_refused(tmp_path: Path) -> None:
    """A broker does not load such a store, and every rmqstore command refuses it: the source
    did read it, as a file that ends early, losing the records past its end in silence."""
    from rmqstore.errors import StoreFormatError

    store = tmp_path / "store"
    generate("multi", store)
    files = sorted((store / "commitlog").iterdir())
    os.truncate(files[1], 5000)
    for options in ({}, {"splitSize": "4096"}):
        with pytest.raises(StoreFormatError, match=f"{files[1].name} is 5000 bytes"):
            CommitLogReader({"path": str(store), **options}).partitions()


def _queue_of_four_files(tmp_path: Path) -> Path:
    """A store whose queue T/0 is four files of 10, 10, 10 and 5 units."""
    from rmqstore.dispatch import Dispatcher
    from rmqstore.store import Store

    config = StoreConfig(commitlog_file_size=4096, consumequeue_file_size=200)
    store = tmp_path / "store"
    with Store.open_write(store, config, create=True) as opened:
        opened.appender().append_many([Message(topic="T", body=b"x" * 100) for _ in range(35)])
        Dispatcher(opened).run()
    assert len(list((store / "consumequeue" / "T" / "0").iterdir())) == 4
    return store


def test_a_queue_with_a_file_cut_short_is_refused(tmp_path: Path) -> None:
    """The consume-queue source read such a queue up to the cut and left out the rest of it
    (its next file does not follow on) without a word; a queue of one file cut short was
    read as one that ends there, where every command refuses the store."""
    from rmqstore.errors import StoreFormatError
    from rmqstore.geometry import geometry_path
    from rmqstore.spark.sources import ConsumeQueueReader

    store = _queue_of_four_files(tmp_path)
    folder = store / "consumequeue" / "T" / "0"
    files = sorted(folder.iterdir())
    (folder / f"{int(files[-1].name) + 200:020d}").touch()  # as a broker makes its next file
    reader = ConsumeQueueReader({"path": str(store)})
    assert [row[2] for row in _queue_rows(reader)] == list(range(35))
    os.truncate(files[1], 100)
    refused = f"{files[1].name} is 100 bytes; the configured size is 200: a broker does not"
    with pytest.raises(StoreFormatError, match=refused):
        _queue_rows(reader)
    for name in files[2:]:
        (folder / name).unlink()
    with pytest.raises(StoreFormatError, match=refused):  # the last file of the queue
        _queue_rows(ConsumeQueueReader({"path": str(store)}))
    geometry_path(store).unlink()  # a broker's store: its queues' usual size
    with pytest.raises(StoreFormatError, match=refused):
        _queue_rows(ConsumeQueueReader({"path": str(store)}))
    (folder / "00000000000000000000").unlink()  # no other queue: the queue's own files
    assert [row[2] for row in _queue_rows(ConsumeQueueReader({"path": str(store)}))] == list(
        range(10, 15)
    )


def test_a_queue_goes_on_past_an_invalid_unit_before_its_last_three_files(tmp_path: Path):
    """A broker's recovery looks for a queue's end in its last three files only: a unit that
    points nowhere before them is a hole its consumers skip, and the units after it are the
    queue's. The source ended the queue there, leaving out every later unit; it now leaves
    out only that unit, as the engine's read of the queue does. In the last three files an
    invalid unit still ends the queue."""
    import struct

    from rmqstore.spark.sources import ConsumeQueueReader
    from rmqstore.store import Store

    store = _queue_of_four_files(tmp_path)
    folder = store / "consumequeue" / "T" / "0"
    files = sorted(folder.iterdir())
    for file, unit, value in (
        (files[0], 3, bytes(20)),
        (files[0], 7, struct.pack(">qiq", -1, 9, 0)),
    ):
        with open(file, "r+b") as handle:
            handle.seek(unit * 20)
            handle.write(value)
    rows = _queue_rows(ConsumeQueueReader({"path": str(store)}))
    assert [row[2] for row in rows] == [n for n in range(35) if n not in (3, 7)]
    with Store.open_read(store) as opened:
        queue = opened.consume_queue("T", 0)
        engine = [unit for unit in queue.units() if unit.size > 0 and unit.physical_offset >= 0]
    assert [row[2:6] for row in rows] == [
        (unit.queue_offset, unit.physical_offset, unit.size, unit.tags_code) for unit in engine
    ]
    with open(files[2], "r+b") as handle:
        handle.seek(4 * 20)  # unit 24, in the last three files
        handle.write(bytes(20))
    rows = _queue_rows(ConsumeQueueReader({"path": str(store)}))
    assert [row[2] for row in rows] == [n for n in range(24) if n not in (3, 7)]


def test_the_consume_queue_source_refuses_queues_kept_in_rocksdb(tmp_path: Path) -> None:
    """A 5.x store with storeType=defaultRocksDB: its consume queues are a RocksDB database,
    not folders, so the source read no queue and gave an empty table without a word."""
    from rmqstore.spark.sources import ConsumeQueueReader

    store = tmp_path / "store"
    generate("basic", store)
    assert len(ConsumeQueueReader({"path": str(store)}).partitions()) == 1
    queues = store / "consumequeue"
    (queues / "CURRENT").write_text("MANIFEST-000005\n")
    (queues / "MANIFEST-000005").write_bytes(b"\0" * 64)
    with pytest.raises(InputError, match="consumequeue holds a RocksDB database"):
        ConsumeQueueReader({"path": str(store)}).partitions()
    assert len(CommitLogReader({"path": str(store)}).partitions()) == 1  # the log reads


def test_the_consume_queue_source_names_batchcq_topics_asked_for(tmp_path: Path) -> None:
    """A BatchCQ topic (5.x queue.type=BatchCQ) keeps its queues in batchconsumequeue/, which
    the source does not read: asked for by the topics option, it gave an empty table."""
    from rmqstore.spark.sources import ConsumeQueueReader

    store = tmp_path / "store"
    generate("basic", store)
    (store / "batchconsumequeue" / "Batched" / "0").mkdir(parents=True)
    assert len(ConsumeQueueReader({"path": str(store)}).partitions()) == 1
    with pytest.raises(InputError, match="topic Batched keeps its queues in batchconsumequeue/"):
        ConsumeQueueReader({"path": str(store), "topics": "BasicTopic,Batched"}).partitions()


def _queue_rows(reader: Any) -> list[tuple]:
    """Every row the consume-queue ``reader`` gives, partition by partition, as Spark's tasks
    would read them (its Arrow batches, row by row)."""
    return [
        tuple(row.values())
        for partition in reader.partitions()
        for batch in reader.read(partition)
        for row in batch.to_pylist()
    ]


def test_the_consume_queue_source_shares_partitions_among_small_queues(tmp_path: Path) -> None:
    """A store of many small queues is a few partitions of about splitSize bytes of units
    (one per core while there is little), not a task per queue: every queue once, in order,
    the same rows as a partition per queue (splitSize 0) and as the engine reads them; a queue
    larger than splitSize is a partition alone."""
    import json
    import os
    import subprocess
    import sys

    from rmqstore.consumequeue import list_queues
    from rmqstore.pipeline.location import StoreLocation
    from rmqstore.pipeline.rows import queue_unit_bytes
    from rmqstore.spark.sources import ConsumeQueueReader
    from rmqstore.store import Store

    store = tmp_path / "store"
    lines = [
        {"topic": f"T{number % 300}", "queueId": number // 300 % 2, "body": "x"}
        for number in range(900)
    ]
    lines += [{"topic": "Big", "queueId": 0, "body": "y"} for _ in range(3000)]  # 60,000 bytes
    subprocess.run(
        [sys.executable, "-m", "rmqstore", "append", str(store), "--create", "--dispatch",
         "--input", "-"],
        input="".join(json.dumps(line) + "\n" for line in lines).encode(),
        check=True,
        capture_output=True,
    )  # fmt: skip
    with Store.open_read(store) as opened:
        queues = list_queues(opened.consumequeue_dir)
        expected = [
            (topic, queue_id, unit.queue_offset, unit.physical_offset, unit.size, unit.tags_code)
            for topic, queue_id in queues
            for unit in opened.consume_queue(topic, queue_id).units()
        ]
    assert len(queues) == 601
    one_each = ConsumeQueueReader({"path": str(store), "splitSize": "0"})
    assert len(one_each.partitions()) == 601
    shared = ConsumeQueueReader({"path": str(store)})
    partitions = shared.partitions()
    assert len(partitions) <= (os.cpu_count() or 1)  # 63,900 bytes of units: one per core
    assert [queue for part in partitions for queue in part.value[0]] == queues
    for reader in (one_each, shared):
        rows = _queue_rows(reader)
        assert [row[:6] for row in rows] == expected
    small = ConsumeQueueReader({"path": str(store), "splitSize": "2000"})
    groups = [part.value[0] for part in small.partitions()]
    assert [("Big", 0)] in groups  # 60,000 bytes: alone
    location = StoreLocation(str(store))
    for group in groups:
        held = sum(queue_unit_bytes(location, *queue) for queue in group)
        assert held <= 2000 or group == [("Big", 0)], group
    assert len(groups) >= 10  # 900 units of small queues, 18,000 bytes
    assert [row[:6] for row in _queue_rows(small)] == expected


def test_the_consume_queue_source_reads_a_queue_file_to_its_first_invalid_unit(
    tmp_path: Path,
) -> None:
    """A queue file is read a chunk at a time (a page, then four times more each time) up to
    its first invalid unit, wherever it falls; the planner's size of a queue is its units'."""
    import struct

    from rmqstore.consumequeue import _FIRST_CHUNK
    from rmqstore.geometry import read_geometry, write_geometry
    from rmqstore.pipeline.location import StoreLocation
    from rmqstore.pipeline.rows import queue_unit_bytes
    from rmqstore.spark.sources import ConsumeQueueReader

    store = tmp_path / "store"
    generate("basic", store)
    # a store of 600,000-byte queue files (the broker's default size)
    write_geometry(store, {**read_geometry(store), "consumequeue_file_size": 600_000})
    folder = store / "consumequeue" / "Many" / "0"
    folder.mkdir(parents=True)
    unit = struct.Struct(">qiq")
    boundary = _FIRST_CHUNK // 20
    for stop in (0, 1, boundary - 1, boundary, boundary + 1, 5 * boundary + 3, 30_000):
        units = b"".join(unit.pack(100 * n, 100, n) for n in range(30_000))
        body = bytearray(units + bytes(600_000 - len(units)))
        if stop < 30_000:
            struct.pack_into(">qiq", body, stop * 20, -1, 100, 0)  # an invalid unit
        (folder / "00000000000000000000").write_bytes(body)
        location = StoreLocation(str(store))
        assert queue_unit_bytes(location, "Many", 0) == stop * 20
        reader = ConsumeQueueReader({"path": str(store), "topics": "Many"})
        rows = _queue_rows(reader)
        assert [row[2:6] for row in rows] == [(n, 100 * n, 100, n) for n in range(stop)]


def test_the_consume_queue_source_leaves_out_pre_blank_and_expired_units(tmp_path: Path) -> None:
    """A queue whose records' first commit-log files were deleted, dispatched again: its
    first units are pre-blank, and others point below the log's first offset, in its first
    file and the next (a broker's min offset looks at the first file only, so the engine's
    units start at 0 here); the source leaves both kinds out, over every file of the queue."""
    from rmqstore.consumequeue import PRE_BLANK_UNIT, list_queues
    from rmqstore.dispatch import Dispatcher
    from rmqstore.spark.sources import ConsumeQueueReader
    from rmqstore.store import Store

    config = StoreConfig(commitlog_file_size=4096, consumequeue_file_size=200)
    store = tmp_path / "store"
    with Store.open_write(store, config, create=True) as opened:
        opened.appender().append_many([Message(topic="T", body=b"x" * 700) for _ in range(40)])
    (store / "commitlog" / "00000000000000000000").unlink()  # expired
    with Store.open_write(store, config) as opened:
        dispatcher = Dispatcher(opened)
        dispatcher.run()
        dispatcher.close()
    first = store / "consumequeue" / "T" / "0" / "00000000000000000000"
    assert first.read_bytes().startswith(PRE_BLANK_UNIT)
    (store / "commitlog" / "00000000000000004096").unlink()  # expired after the dispatch
    with Store.open_read(store, config) as opened:
        minimum = opened.commitlog.min_offset
        expected = [
            (topic, queue_id, unit.queue_offset, unit.physical_offset, unit.size, unit.tags_code)
            for topic, queue_id in list_queues(opened.consumequeue_dir)
            for unit in opened.consume_queue(topic, queue_id).units()
            if unit.physical_offset >= minimum and not unit.is_pre_blank
        ]
    assert minimum == 8192 and [row[2] for row in expected] == list(range(10, 40))
    for split in ("0", "4096"):
        reader = ConsumeQueueReader({"path": str(store), "splitSize": split})
        assert [row[:6] for row in _queue_rows(reader)] == expected


def test_boolean_options_take_the_usual_words_and_topics_their_spaces(tmp_path: Path) -> None:
    generate("multi", tmp_path / "store")
    store = str(tmp_path / "store")
    for word, value in (("TRUE", True), ("1", True), ("yes", True), ("False", False), ("0", False)):
        assert CommitLogReader({"path": store, "includeBody": word}).rows.include_body is value
    spaced = CommitLogReader({"path": store, "topics": " TopicTest , Other,"})
    assert spaced.rows.topics == frozenset({"TopicTest", "Other"})


def test_a_load_of_several_stores_says_to_union_them(tmp_path: Path) -> None:
    """``load([A, B])`` reaches a source as a JSON list (option paths): it used to read as
    no store given."""
    import json

    from rmqstore.spark.sources import ConsumeQueueReader

    generate("multi", tmp_path / "store")
    store = str(tmp_path / "store")
    for reader in (CommitLogReader, ConsumeQueueReader):
        with pytest.raises(InputError, match=r"reads one store a load\(\), not 2: .*unionByName"):
            reader({"paths": json.dumps([store, store])})
        assert reader({"paths": json.dumps([store])}).partitions()  # one is that store
