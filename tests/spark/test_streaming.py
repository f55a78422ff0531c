"""The streaming source on a real local Spark session: a query tails a store while an
``append`` process writes to it, into a Parquet sink with a checkpoint; every message arrives
once, also across a restart of the query and the roll to new commit-log files."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from rmqstore.errors import InputError

from support import run_cli, streamed_offsets

pytestmark = pytest.mark.spark

FILE = 65536


def append(store: Path, first: int, count: int) -> None:
    """``count`` messages numbered from ``first``, by an append process of their own."""
    lines = "".join(
        json.dumps({"topic": f"T{n % 3}", "body": f"message-{n}", "keys": f"k{n}"}) + "\n"
        for n in range(first, first + count)
    )
    subprocess.run(
        [sys.executable, "-m", "rmqstore", "append", str(store), "--input", "-", "--jsonl"],
        input=lines, text=True, check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip


def sink_bodies(spark: Any, sink: Path) -> list[str]:
    """The bodies of the sink's committed files (Spark reads its metadata log)."""
    if not (sink / "_spark_metadata").is_dir():
        return []
    frame = spark.read.schema("body BINARY").parquet(str(sink))
    return [row.body.decode() for row in frame.collect()]


def start(spark: Any, store: Path, sink: Path, checkpoint: Path, **options: str) -> Any:
    reader = spark.readStream.format("rocketmq-commitlog")
    for key, value in options.items():
        reader = reader.option(key, value)
    return (
        reader.load(str(store))
        .select("body", "commitLogOffset", "topic")
        .writeStream.format("parquet")
        .option("path", str(sink))
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="500 milliseconds")
        .start()
    )


def wait_for(spark: Any, sink: Path, count: int, seconds: float = 90) -> list[str]:
    deadline = time.monotonic() + seconds
    bodies = sink_bodies(spark, sink)
    while len(bodies) < count and time.monotonic() < deadline:
        time.sleep(0.5)
        bodies = sink_bodies(spark, sink)
    return bodies


def test_a_query_tails_a_store_being_written_once_per_message(spark: Any, tmp_path: Path):
    store, sink, checkpoint = tmp_path / "store", tmp_path / "sink", tmp_path / "checkpoint"
    created = run_cli("append", store, "--create", "--topic", "T0", "--body", "message-0",
                      "--commitlog-file-size", str(FILE))  # fmt: skip
    assert created.exit_code == 0, created.stderr
    query = start(spark, store, sink, checkpoint)
    try:
        sent = 1
        for _ in range(6):  # several micro-batches, files rolled on the way
            append(store, sent, 400)
            sent += 400
            time.sleep(0.3)
        bodies = wait_for(spark, sink, sent)
    finally:
        query.stop()
    assert sorted(bodies) == sorted(f"message-{n}" for n in range(sent))
    assert len(list((store / "commitlog").iterdir())) > 3

    append(store, sent, 500)  # while no query runs
    sent += 500
    query = start(spark, store, sink, checkpoint)  # resumes from its checkpoint
    try:
        bodies = wait_for(spark, sink, sent)
        time.sleep(1.5)  # a few more triggers: nothing is read twice
        bodies = sink_bodies(spark, sink)
    finally:
        query.stop()
    assert sorted(bodies) == sorted(f"message-{n}" for n in range(sent))


def test_starting_offsets_and_a_bad_option(spark: Any, tmp_path: Path) -> None:
    store = tmp_path / "store"
    run_cli("append", store, "--create", "--topic", "T0", "--body", "old")
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
    query = start(spark, store, sink, checkpoint, startingOffsets="latest")
    try:
        time.sleep(3)  # the query has started at the end of the store
        append(store, 1, 10)
        bodies = wait_for(spark, sink, 10)
    finally:
        query.stop()
    assert sorted(bodies) == sorted(f"message-{n}" for n in range(1, 11))

    from rmqstore.spark.sources import CommitLogStreamReader

    with pytest.raises(InputError, match="startingOffsets"):
        CommitLogStreamReader({"path": str(store), "startingOffsets": "tomorrow"})
    with pytest.raises(InputError, match="startingOffsets"):  # a digit, but not 0-9
        CommitLogStreamReader({"path": str(store), "startingOffsets": "\u00b2"})
    # a query given a bad option fails with that option's error: PySpark loses an error the
    # source raises while its reader is made ("UnboundLocalError: ... 'reader'")
    for options, said in (
        ({"splitSize": "-5"}, "option splitSize='-5' is less than 0"),
        ({"startingOffsets": "tomorrow"}, "option startingOffsets='tomorrow'"),
    ):
        refused = (
            spark.readStream.format("rocketmq-commitlog")
            .options(**options)
            .load(str(store))
            .writeStream.format("noop")
            .trigger(availableNow=True)
            .start()
        )
        with pytest.raises(Exception, match=re.escape(said)) as raised:
            refused.awaitTermination(120)
        assert "UnboundLocalError" not in str(raised.value)


def test_files_a_broker_deleted_are_skipped(tmp_path: Path) -> None:
    """A broker deletes its oldest commit-log files: an offset inside them moves on to the
    first file left, and a file deleted after a micro-batch was planned is read as empty
    (its messages are gone), not as a failed query. No session is needed: the reader's own
    calls, as Spark makes them."""
    from rmqstore.spark.sources import CommitLogStreamReader

    store = tmp_path / "store"
    created = run_cli("append", store, "--create", "--topic", "T", "--body", "first",
                      "--commitlog-file-size", "4096")  # fmt: skip
    assert created.exit_code == 0, created.stderr
    append(store, 1, 250)  # about 12 files of 4 KiB
    names = sorted(path.name for path in (store / "commitlog").iterdir())
    assert len(names) > 6
    reader = CommitLogStreamReader({"path": str(store)})
    start = reader.initialOffset()
    assert start == {"offset": 0}
    for name in names[:2]:  # the broker's clean-up, before the query's next batch
        (store / "commitlog" / name).unlink()
    end = reader.latestOffset(start)
    partitions = reader.partitions(start, end)
    read = run_cli("read", store, "--from-offset", names[2].lstrip("0"), "--jsonl")
    gone = range(int(names[-2]), int(names[-1]))
    expected = [
        message["body"]
        for message in map(json.loads, read.stdout.splitlines())
        if message["commitLogOffset"] not in gone
    ]
    (store / "commitlog" / names[-2]).unlink()  # and one more while the batch runs
    got = [
        body.decode()
        for partition in partitions
        for batch in reader.read(partition)
        for body in batch.column("body").to_pylist()
    ]
    assert got == expected and len(expected) > 100
    assert end["offset"] > int(names[-1])


def test_a_new_empty_file_is_read_past_and_a_file_cut_short_stops_the_query(
    tmp_path: Path,
) -> None:
    """A broker makes its next commit-log file empty and then sets its size: the query reads
    on. A file of another size than the others (cut short under the broker) is an error
    naming it, not a query that stops advancing at the cut without a word."""
    from rmqstore.errors import StoreFormatError
    from rmqstore.spark.sources import CommitLogStreamReader

    store = tmp_path / "store"
    created = run_cli("append", store, "--create", "--topic", "T", "--body", "first",
                      "--commitlog-file-size", "4096")  # fmt: skip
    assert created.exit_code == 0, created.stderr
    append(store, 1, 120)
    names = sorted(path.name for path in (store / "commitlog").iterdir())
    (store / "commitlog" / f"{int(names[-1]) + 4096:020d}").touch()
    reader = CommitLogStreamReader({"path": str(store)})
    start = reader.initialOffset()
    end = reader.latestOffset(start)
    bodies = [
        body
        for partition in reader.partitions(start, end)
        for batch in reader.read(partition)
        for body in batch.column("body").to_pylist()
    ]
    assert len(bodies) == 121
    os.truncate(store / "commitlog" / names[1], 100)
    with pytest.raises(StoreFormatError, match=f"{names[1]} is 100 bytes"):
        reader.latestOffset(start)


def test_damage_in_a_file_the_broker_moved_on_from_is_skipped(oracle, tmp_path: Path) -> None:
    """A record whose magic code is gone, in an early file of a real broker's store: the
    query read up to it and then stopped for good, without a word (an AvailableNow export
    ended there). The records after it are read, as the batch source reads them. In the last
    file a record begins, damage is where the log ends now, as before."""
    from rmqstore.spark.sources import CommitLogReader

    source = oracle("s1_multi")
    store = source.copy_to(tmp_path)
    puts = source.manifest["puts"]

    def damage(put: dict) -> None:
        position = put["physicalOffset"]
        with open(store / "commitlog" / f"{position - position % 65536:020d}", "r+b") as file:
            file.seek(position % 65536 + 4)
            file.write(bytes(4))  # MAGICCODE

    def batch_offsets() -> list[int]:
        reader = CommitLogReader({"path": str(store)})
        return [
            offset
            for partition in reader.partitions()
            for batch in reader.read(partition)
            for offset in batch.column("commitLogOffset").to_pylist()
        ]

    damage(puts[100])
    offsets, end = streamed_offsets(store, splitSize="16384")
    assert offsets == batch_offsets() and len(offsets) == len(puts) - 1
    assert puts[101]["physicalOffset"] in offsets
    damage(puts[-3])  # in the last file
    offsets, end = streamed_offsets(store, splitSize="16384")
    assert end == puts[-3]["physicalOffset"]
    assert offsets == [offset for offset in batch_offsets() if offset < end]


@pytest.mark.parametrize("split", [0, 97, 5000])
def test_a_batch_reads_each_message_once_whatever_the_split(tmp_path: Path, split: int) -> None:
    """Micro-batches between offsets inside files, over file rolls: every message once, in
    order, whatever ``splitSize`` (0: a partition per file). The reader's own calls."""
    from rmqstore.spark.sources import CommitLogStreamReader

    store = tmp_path / "store"
    created = run_cli("append", store, "--create", "--topic", "T", "--body", "message-0",
                      "--commitlog-file-size", "4096")  # fmt: skip
    assert created.exit_code == 0, created.stderr
    append(store, 1, 120)  # about 6 files of 4 KiB
    offsets = [
        json.loads(line)["commitLogOffset"]
        for line in run_cli("read", store, "--from-offset", "0", "--jsonl").stdout.splitlines()
    ]
    reader = CommitLogStreamReader({"path": str(store), "splitSize": str(max(split, 4096))})
    reader.split = split  # ranges of 97 bytes, under the option's 4096, put many in a file
    end = reader.latestOffset(reader.initialOffset())
    edges = [0, offsets[7], offsets[60], offsets[61], end["offset"]]  # inside files, and not
    got = []
    for begin, stop in pairwise(edges):
        for partition in reader.partitions({"offset": begin}, {"offset": stop}):
            for batch in reader.read(partition):
                got.extend(batch.column("body").to_pylist())
    empty = reader.partitions({"offset": offsets[9]}, {"offset": offsets[9]})
    assert len(empty) == 1 and list(reader.read(empty[0])) == []  # a task that reads nothing
    assert [body.decode() for body in got] == [f"message-{n}" for n in range(121)]


def _batches(reader: Any, start: dict, limit: Any) -> list[tuple[int, int]]:
    """The micro-batches (start, end) a query makes from ``start`` until the reader offers
    nothing more under ``limit``, as Spark asks for them."""
    made = []
    while True:
        end = reader.latestOffset(start, limit)
        if end["offset"] == start["offset"]:
            return made
        made.append((start["offset"], end["offset"]))
        start = end


def _bodies(reader: Any, begin: int, stop: int) -> list[str]:
    return [
        body.decode()
        for partition in reader.partitions({"offset": begin}, {"offset": stop})
        for batch in reader.read(partition)
        for body in batch.column("body").to_pylist()
    ]


def test_max_bytes_per_trigger_reads_a_backlog_in_bounded_batches(tmp_path: Path) -> None:
    """maxBytesPerTrigger (Spark 4.2+): each micro-batch ends at the last whole record
    within that many bytes of its start, over file rolls and BLANKs; a record longer than the
    bound is a batch of its own (the query always moves on); every message is read once, in
    order. Without a limit (Trigger.AvailableNow's ReadAllAvailable) one batch takes all."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes

    from rmqstore.spark.sources import CommitLogStreamReader

    store = tmp_path / "store"
    created = run_cli("append", store, "--create", "--topic", "T", "--body", "message-0",
                      "--commitlog-file-size", "4096")  # fmt: skip
    assert created.exit_code == 0, created.stderr
    append(store, 1, 60)
    big = run_cli("append", store, "--topic", "T", "--body", "x" * 1500)
    assert big.exit_code == 0, big.stderr
    append(store, 61, 60)
    documents = [
        json.loads(line)
        for line in run_cli("read", store, "--from-offset", "0", "--jsonl").stdout.splitlines()
    ]
    ends = {d["commitLogOffset"] + d["storeSize"] for d in documents}
    reader = CommitLogStreamReader({"path": str(store), "maxBytesPerTrigger": "600"})
    limit = reader.getDefaultReadLimit()
    assert limit == ReadMaxBytes(600)
    batches = _batches(reader, reader.initialOffset(), limit)
    got = []
    for begin, stop in batches:
        read = _bodies(reader, begin, stop)
        got += read
        within = stop - begin <= 600 or len(read) == 1 or stop % 4096 == 0
        assert within, (begin, stop, len(read))  # one long record, or a BLANK crossed
        assert stop in ends or stop % 4096 == 0
    assert got == [d["body"] for d in documents] and len(batches) > 15
    assert any(len(_bodies(reader, *b)) == 1 and b[1] - b[0] > 600 for b in batches)
    everything = _batches(reader, reader.initialOffset(), ReadAllAvailable())
    assert len(everything) == 1 and everything[0][1] == batches[-1][1]

    for bad in ("0", "-5", "lots"):
        with pytest.raises(InputError, match="maxBytesPerTrigger"):
            CommitLogStreamReader({"path": str(store), "maxBytesPerTrigger": bad})
    # a bounded batch is spread over the machine's cores, unless splitSize says otherwise
    bounded = {"path": str(store), "maxBytesPerTrigger": str(64 << 20)}
    cores = os.cpu_count() or 1
    assert CommitLogStreamReader(bounded).split == min(128 << 20, -(-(64 << 20) // cores))
    assert CommitLogStreamReader({**bounded, "splitSize": "8192"}).split == 8192


def test_available_now_reads_what_was_there_when_the_query_started(tmp_path: Path) -> None:
    """Trigger.AvailableNow (Spark 4.2+): the reader stops where the store's records ended
    when the query started, however much is appended later, with or without a read limit,
    also when the broker has made its next file ahead (all zeros) and the one being written
    is not full; the progress report and startingOffsets=latest say where the records end,
    from the same file."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes

    from rmqstore.spark.sources import CommitLogStreamReader

    store = tmp_path / "store"
    created = run_cli("append", store, "--create", "--topic", "T", "--body", "message-0",
                      "--commitlog-file-size", "4096")  # fmt: skip
    assert created.exit_code == 0, created.stderr
    append(store, 1, 80)
    there = [f"message-{n}" for n in range(81)]
    counts = []
    for first, limit in ((1000, ReadAllAvailable()), (2000, ReadMaxBytes(1000))):
        files = sorted((store / "commitlog").iterdir())
        ahead = store / "commitlog" / f"{int(files[-1].name) + 4096:020d}"
        ahead.write_bytes(bytes(4096))  # the next file, made ahead as a broker does
        reader = CommitLogStreamReader({"path": str(store)})
        reader.prepareForTriggerAvailableNow()
        reported = reader.reportLatestOffset()
        latest = CommitLogStreamReader({"path": str(store), "startingOffsets": "latest"})
        assert latest.initialOffset() == reported
        append(store, first, 30)  # after the query started: not read
        batches = _batches(reader, reader.initialOffset(), limit)
        got = [body for batch in batches for body in _bodies(reader, *batch)]
        assert got == there, limit
        assert reported == {"offset": batches[-1][1]}
        counts.append(len(batches))
        there += [f"message-{n}" for n in range(first, first + 30)]
    assert counts[0] == 1 and counts[1] > 5  # ReadMaxBytes(1000): bounded batches


def test_an_available_now_query_exports_a_backlog_in_batches_and_stops(
    spark: Any, tmp_path: Path
) -> None:
    """A scheduled incremental export, as a data engineer writes it: Trigger.AvailableNow
    with maxBytesPerTrigger and a checkpoint. Each run reads what was appended since the last
    one in bounded micro-batches and stops by itself; every message lands in the sink once."""
    store, sink, checkpoint = tmp_path / "store", tmp_path / "sink", tmp_path / "checkpoint"
    created = run_cli("append", store, "--create", "--topic", "T0", "--body", "message-0",
                      "--commitlog-file-size", str(FILE))  # fmt: skip
    assert created.exit_code == 0, created.stderr
    append(store, 1, 1999)

    def run_once() -> list[Any]:
        query = (
            spark.readStream.format("rocketmq-commitlog")
            .option("maxBytesPerTrigger", "40000")
            .load(str(store))
            .select("body", "commitLogOffset")
            .writeStream.format("parquet")
            .option("path", str(sink))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(120), "the AvailableNow query did not stop"
        return [progress for progress in query.recentProgress if progress["numInputRows"]]

    batches = run_once()
    assert len(batches) >= 4  # about 130 bytes a record: some 300 records a batch
    assert max(b["numInputRows"] for b in batches) <= 40000 // 100
    # each batch's progress shows where the store's records end: how far behind it is
    sources = [b["sources"][0] for b in batches]
    assert {json.loads(s["latestOffset"])["offset"] for s in sources} == {
        json.loads(sources[-1]["endOffset"])["offset"]
    }
    assert sorted(sink_bodies(spark, sink)) == sorted(f"message-{n}" for n in range(2000))
    append(store, 2000, 500)
    batches = run_once()
    assert 1 <= len(batches) <= 3 and sum(b["numInputRows"] for b in batches) == 500
    assert sorted(sink_bodies(spark, sink)) == sorted(f"message-{n}" for n in range(2500))
