"""Damaged stores read two ways that must agree: the Spark data sources' readers (called as
Spark's tasks call them, in-process: no session) against the local engine. Copies of real
broker stores and fixtures get one damage each (a flipped bit, zeros, an int field, a file
cut short, deleted or overwritten in part); then
- the commit-log source, whole files and 4 KiB ranges, reads the messages ``export --engine
  local`` writes, or both refuse the store;
- its topic, queue and offset-window options read the rows a full read holds;
- the consume-queue source reads each queue's units as the engine's queue read gives them
  (up to where a broker's recovery ends the queue, its holes and pre-blank units left out);
- the streaming source (Trigger.AvailableNow) reads the batch read's messages up to where it
  ends, each once.

Each found a source reading less than the engine, or more, with no error, before it was
fixed."""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rmqstore.config import StoreConfig
from rmqstore.consumequeue import list_queues
from rmqstore.errors import RmqStoreError
from rmqstore.fixtures import generate
from rmqstore.pipeline.local import LocalPipeline, PipelineOptions
from rmqstore.record import Message
from rmqstore.store import Store
from rmqstore.topics import is_path_safe

from campaigns import campaign_random, damage_segment, rounds, seed_note
from support import mutate_units, streamed_offsets

MUTANTS = rounds(short=2, long=150)  # per comparison
BROKER_STORES = ("s1_multi", "s2_crash", "v533_s1_multi", "s3_txn_delay")


@pytest.fixture(scope="module")
def stores(oracle, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Undamaged stores: real brokers' and fixtures (file rolls, transactions, LMQ, V2
    records), and one whose queues are many files of 10 units."""
    root = tmp_path_factory.mktemp("bases")
    found = [oracle(name).store for name in BROKER_STORES]
    for name in ("multi", "txn", "lmq", "v2"):
        generate(name, root / name)
        found.append(root / name)
    config = StoreConfig(commitlog_file_size=16384, consumequeue_file_size=200)
    with Store.open_write(root / "small-queues", config, create=True) as opened:
        opened.appender().append_many(
            [Message(topic=f"T{n % 2}", queue_id=n % 3, body=b"x" * (n % 50)) for n in range(400)]
        )
    from rmqstore.dispatch import Dispatcher

    with Store.open_write(root / "small-queues", config) as opened:
        Dispatcher(opened).run()
    found.append(root / "small-queues")
    return found


def mutants(
    stores: list[Path], tmp_path: Path, label: str, damage: Callable[[Path, random.Random], str]
):
    """``(store, what was done)``: a damaged copy of one of ``stores`` at a time."""
    rng = campaign_random(label)
    for number in range(MUTANTS):
        copy = tmp_path / f"mutant-{number}"
        shutil.copytree(rng.choice(stores), copy, symlinks=True)
        done = damage(copy, rng)
        yield copy, f"{done or 'nothing done'}{seed_note()}"
        shutil.rmtree(copy)


def outcome(read: Callable[[], list]) -> Any:
    """What a read gives: its rows, or that it refused the store (the error's first words:
    the engine and the sources name the same file)."""
    try:
        return sorted(read())
    except RmqStoreError as exc:
        return ("refused", str(exc).split(" is ")[0])


def commitlog_rows(store: Path, **options: str) -> list[tuple]:
    from rmqstore.spark.sources import CommitLogReader

    reader = CommitLogReader({"path": str(store), **options})
    rows = []
    for partition in reader.partitions():
        for batch in reader.read(partition):
            columns = batch.to_pydict()
            rows.extend(
                zip(
                    columns["commitLogOffset"],
                    columns["msgId"],
                    columns["topic"],
                    columns["queueId"],
                    columns["queueOffset"],
                    strict=True,
                )
            )
    return rows


def exported_rows(store: Path, destination: Path) -> list[tuple]:
    with Store.open_read(store) as opened:
        options = PipelineOptions.for_config(opened.config)
    LocalPipeline(str(store), options).export(str(destination), "jsonl")
    rows = []
    for part in sorted(destination.glob("*.jsonl")):
        for line in part.read_text().splitlines():
            message = json.loads(line)
            rows.append(
                tuple(
                    message[name]
                    for name in ("commitLogOffset", "msgId", "topic", "queueId", "queueOffset")
                )
            )
    shutil.rmtree(destination)
    return rows


def commitlog_damage(store: Path, rng: random.Random) -> str:
    return damage_segment(store, "commitlog", rng)


@pytest.mark.campaign
def test_the_commitlog_source_reads_what_the_local_export_writes(stores, tmp_path: Path):
    for store, done in mutants(stores, tmp_path, "source-commitlog", commitlog_damage):
        exported = outcome(lambda: exported_rows(store, tmp_path / "export"))  # noqa: B023
        for split in ("0", "4096"):
            read = outcome(lambda: commitlog_rows(store, splitSize=split))  # noqa: B023
            assert read == exported, f"{done}, splitSize={split}"


@pytest.mark.campaign
def test_the_source_options_read_what_a_full_read_holds(stores, tmp_path: Path) -> None:
    rng = campaign_random("source-filters-pick")
    for store, done in mutants(stores, tmp_path, "source-filters", commitlog_damage):
        every = outcome(lambda: commitlog_rows(store))  # noqa: B023
        if not isinstance(every, list) or not every:
            continue
        topics = rng.sample(sorted({row[2] for row in every}), 1)
        queue = rng.choice(sorted({row[3] for row in every}))
        low, high = sorted(rng.choice(every)[0] for _ in range(2))
        cases = [
            ({"queueIds": str(queue)}, lambda row: row[3] == queue),  # noqa: B023
            (
                {"startingOffset": str(low), "endingOffset": str(high)},
                lambda row: low <= row[0] < high,  # noqa: B023
            ),
        ]
        if is_path_safe(topics[0]):
            cases.append(({"topics": topics[0]}, lambda row: row[2] in topics))  # noqa: B023
        else:  # a damaged record's topic with a control character: no name a user can give
            read = outcome(lambda: commitlog_rows(store, topics=topics[0]))  # noqa: B023
            assert read[0] == "refused", f"{done}, topics={topics[0]!r}"
        for options, kept in cases:
            read = outcome(lambda: commitlog_rows(store, splitSize="4096", **options))  # noqa: B023
            assert read == [row for row in every if kept(row)], f"{done}, {options}"


def queue_damage(store: Path, rng: random.Random) -> str:
    if rng.random() < 0.5:
        mutate_units(store, rng, 1)
        return "a unit rewritten (mutate_units)"
    return damage_segment(store, "consumequeue", rng)


def source_units(store: Path) -> list[tuple]:
    from rmqstore.spark.sources import ConsumeQueueReader

    reader = ConsumeQueueReader({"path": str(store)})
    rows = []
    for partition in reader.partitions():
        for batch in reader.read(partition):
            columns = batch.to_pydict()
            names = ("topic", "queueId", "queueOffset", "commitLogOffset", "storeSize", "tagsCode")
            rows.extend(zip(*(columns[name] for name in names), strict=True))
    return rows


def engine_units(store: Path) -> list[tuple]:
    with Store.open_read(store) as opened:
        minimum = opened.commitlog.min_offset
        return [
            (topic, queue_id, unit.queue_offset, unit.physical_offset, unit.size, unit.tags_code)
            for topic, queue_id in list_queues(opened.consumequeue_dir)
            for unit in opened.consume_queue(topic, queue_id).units()
            if unit.physical_offset >= minimum and unit.size > 0 and not unit.is_pre_blank
        ]


@pytest.mark.campaign
def test_the_consume_queue_source_reads_what_the_engine_reads(stores, tmp_path: Path) -> None:
    for store, done in mutants(stores, tmp_path, "source-queues", queue_damage):
        expected = outcome(lambda: engine_units(store))  # noqa: B023
        assert outcome(lambda: source_units(store)) == expected, done  # noqa: B023


@pytest.mark.campaign
def test_the_streaming_source_reads_the_batch_read_up_to_where_it_ends(
    stores, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rmqstore.spark import sources

    monkeypatch.setattr(sources, "WRITE_SETTLE", 0)  # no writer: no record is being written
    rng = campaign_random("source-stream-options")
    for store, done in mutants(stores, tmp_path, "source-stream", commitlog_damage):
        batch = outcome(lambda: [row[0] for row in commitlog_rows(store)])  # noqa: B023
        options = rng.choice([{}, {"splitSize": "4096"}, {"maxBytesPerTrigger": "3000"}])
        try:
            offsets, end = streamed_offsets(store, **options)
        except RmqStoreError as exc:
            assert batch == ("refused", str(exc).split(" is ")[0]), done
            continue
        assert offsets == [offset for offset in batch if offset < end], f"{done}, {options}"
