"""``dispatch --rebuild`` with the log read in worker processes writes the same bytes and
reports the same result as one walk in this process: generated scenarios (clean and
damaged), the real-broker crash copies, odd queue offsets, a DELAY that is not a number,
unsafe topics and index files that fill up."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import pytest

from rmqstore.config import StoreConfig
from rmqstore.delay import SCHEDULE_TOPIC
from rmqstore.dispatch import Dispatcher, apply_rebuild, plan_rebuild
from rmqstore.fixtures import generate
from rmqstore.geometry import INDEX_GEOMETRY, QUEUE_GEOMETRY
from rmqstore.pipeline.rebuild import rebuild_in_workers
from rmqstore.properties import encode_properties
from rmqstore.record import Message, encode_blank, encode_record
from rmqstore.store import Store

from support import ORACLE_CONFIG, tree_digest


def clock():
    counter = itertools.count(1_700_000_000_000, 13)
    return lambda: next(counter)


def rebuild(
    store_dir: Path,
    config: StoreConfig | None = None,
    *,
    workers: int | None = None,
    split: int = 0,
    topics: frozenset[str] | None = None,
    progress: list[int] | None = None,
) -> dict:
    """Rebuild in one walk here (``workers`` None) or with the ranges read by workers."""
    replacing = INDEX_GEOMETRY | QUEUE_GEOMETRY if topics is None else frozenset()
    with Store.open_write(store_dir, config, replacing=replacing) as store:
        plan = plan_rebuild(store, topics=topics, rebuild_index=topics is None)
        apply_rebuild(store, plan)
        if workers is None:
            dispatcher = Dispatcher(store, topics=topics, build_index=topics is None, clock=clock())
            try:
                result = dispatcher.run(plan.from_offset)
            finally:
                dispatcher.close()
        else:
            result = rebuild_in_workers(
                store,
                from_offset=plan.from_offset,
                topics=topics,
                build_index=topics is None,
                workers=workers,
                split=split,
                clock=clock(),
                progress=progress.append if progress is not None else None,
            )
        notes = list(store.notes)
    shutil.rmtree(store_dir / "quarantine", ignore_errors=True)
    return {**result.to_dict(), "notes": notes}


def same_as_one_walk(
    source: Path, tmp_path: Path, config: StoreConfig | None = None, **options
) -> dict:
    one, many = tmp_path / "one", tmp_path / "many"
    shutil.copytree(source, one)
    shutil.copytree(source, many)
    expected = rebuild(one, config, topics=options.get("topics"))
    got = rebuild(many, config, **options)
    assert got == expected
    assert tree_digest(many) == tree_digest(one)
    shutil.rmtree(one)
    shutil.rmtree(many)
    return got


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("generated")
    for name in ("multi", "txn", "delay", "v2", "torn-tail", "garbage-after-end", "crc-flip",
                 "missing-file", "abort-left", "stale-checkpoint", "short-checkpoint"):  # fmt: skip
        generate(name, root / name)
    return root


SCENARIOS = ["multi", "txn", "delay", "v2", "torn-tail", "garbage-after-end", "crc-flip",
             "missing-file", "abort-left", "stale-checkpoint", "short-checkpoint"]  # fmt: skip


@pytest.mark.parametrize("name", SCENARIOS)
@pytest.mark.parametrize("split", [4096, 50_000])
def test_ranges_applied_here_give_one_walks_bytes(
    stores: Path, tmp_path: Path, name: str, split: int
) -> None:
    same_as_one_walk(stores / name, tmp_path, workers=1, split=split)


@pytest.mark.parametrize("name", ["multi", "torn-tail", "crc-flip"])
def test_ranges_read_in_worker_processes(stores: Path, tmp_path: Path, name: str) -> None:
    progress: list[int] = []
    result = same_as_one_walk(stores / name, tmp_path, workers=2, split=8192, progress=progress)
    assert result["unitsWritten"] > 0
    assert progress == sorted(progress) and len(progress) > 2


@pytest.mark.parametrize("copy", ["store", "store_torn_half_record", "store_torn_random_garbage"])
def test_real_broker_crash_copies(oracle, tmp_path: Path, copy: str) -> None:
    config = StoreConfig(**ORACLE_CONFIG)
    source = oracle("s2_crash").root / copy
    for split in (5000, 40_000):
        same_as_one_walk(source, tmp_path, config, workers=1, split=split)
    same_as_one_walk(source, tmp_path, config, workers=2, split=20_000)


def test_one_topic_and_full_index_files(stores: Path, tmp_path: Path) -> None:
    result = same_as_one_walk(
        stores / "multi", tmp_path, workers=1, split=4096, topics=frozenset({"TopicTest"})
    )
    assert result["indexEntries"] == 0 and result["unitsWritten"] > 0
    tiny_index = StoreConfig(index_slots=7, index_entries=16)  # a new file every few records
    result = same_as_one_walk(stores / "multi", tmp_path, tiny_index, workers=1, split=4096)
    assert result["indexEntries"] > 100


def _crafted_store(store_dir: Path, queue_offsets: list[int], bad_delay_at: int | None) -> None:
    """Records written by something other than a broker: queue offsets with duplicates and
    gaps, an unsafe topic, schedule-topic records (one with a DELAY that is not a number)."""
    config = StoreConfig(commitlog_file_size=4096)
    with Store.open_write(store_dir, config, create=True):
        pass
    data = bytearray()
    file_start = 0
    for number, queue_offset in enumerate(queue_offsets):
        topic = "../evil" if number == 3 else "T"
        properties = {"UNIQ_KEY": f"U{number:04d}", "KEYS": f"k{number} shared"}
        if number % 5 == 4:
            topic = SCHEDULE_TOPIC
            delay = "x" if number == bad_delay_at else "3"
            properties = {"DELAY": delay, "TAGS": "t", "REAL_TOPIC": "T", "REAL_QID": "0"}
        message = Message(
            topic=topic,
            body=b"b" * 90,
            properties_bytes=encode_properties(properties),
            queue_offset=queue_offset,
            store_timestamp=1_700_000_000_000 + 1500 * number,
            born_timestamp=1_700_000_000_000,
        )
        size = len(encode_record(message))
        if len(data) + size + 8 > 4096:  # the roll rule: a BLANK record fills the file
            data += encode_blank(4096 - len(data))
            (store_dir / "commitlog" / f"{file_start:020d}").write_bytes(data.ljust(4096, b"\0"))
            file_start += 4096
            data = bytearray()
        message.physical_offset = file_start + len(data)
        data += encode_record(message)
    (store_dir / "commitlog" / f"{file_start:020d}").write_bytes(data.ljust(4096, b"\0"))


@pytest.mark.parametrize("bad_delay_at", [None, 29])
def test_odd_queue_offsets_unsafe_topics_and_a_bad_delay(
    tmp_path: Path, bad_delay_at: int | None
) -> None:
    offsets = [0, 1, 2, 2, 5, 6, 3, 7, 8, 9, *range(10, 40), 12, 41, 42]
    _crafted_store(tmp_path / "crafted", offsets, bad_delay_at)
    tiny_index = StoreConfig(index_slots=5, index_entries=7)  # a record's keys span files
    for split, config in ((700, None), (4096, None), (700, tiny_index)):
        result = same_as_one_walk(tmp_path / "crafted", tmp_path, config, workers=1, split=split)
        assert result["unitsSkipped"] > 0
        assert any("gap" in problem for problem in result["problems"])
        assert any("../evil" in problem for problem in result["problems"])
        assert (result["stoppedBy"] is not None) == (bad_delay_at is not None)
    same_as_one_walk(tmp_path / "crafted", tmp_path, workers=2, split=700)


def test_records_longer_than_max_message_size_are_all_queued(tmp_path: Path) -> None:
    """A broker that allows longer records than the reader's maxMessageSize: the ranges
    queue every record, as one walk does (they used to queue none of these six)."""
    from rmqstore.record import Message
    from rmqstore.store import Store

    source = tmp_path / "source"
    written = StoreConfig(commitlog_file_size=4 * 1024 * 1024)  # the broker's: 4 MiB bodies
    config = StoreConfig(commitlog_file_size=4 * 1024 * 1024, max_message_size=1000)
    with Store.open_write(source, written, create=True) as store:
        store.appender().append_many(
            Message(topic="Big", queue_id=n % 2, body=bytes([n]) * 300_000) for n in range(6)
        )
    for workers in (1, 2):
        result = same_as_one_walk(source, tmp_path, config, workers=workers, split=100_000)
        assert result["unitsWritten"] == 6
