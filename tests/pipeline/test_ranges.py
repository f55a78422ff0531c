"""Ranges of the pipeline, in-process: whatever the split, the records read through the
ranges are those one walk of the log sees, and the end where dispatch stops is the local
dispatcher's."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from rmqstore.config import StoreConfig
from rmqstore.delay import DelayLevels
from rmqstore.dispatch import Dispatcher
from rmqstore.errors import StoreFormatError, UncleanStoreError
from rmqstore.fixtures import generate
from rmqstore.geometry import geometry_path
from rmqstore.pipeline.location import StoreLocation
from rmqstore.pipeline.ranges import (
    FileRange,
    RangeScan,
    dispatch_end,
    file_bounds,
    part_groups,
    plan_ranges,
    plan_spans,
    record_margin,
    summarize_range,
    walk_summaries,
)
from rmqstore.record import Message
from rmqstore.store import Store

from support import ORACLE_CONFIG

SPLITS = [97, 1500, 0]


def ranged_records(store_dir: Path, split: int, margin: int = record_margin()) -> list[int]:
    location = StoreLocation(str(store_dir))
    summaries = [
        summarize_range(location, part, check_crc=False, delay_levels=DelayLevels())
        for part in plan_ranges(location, split, split_last=True, margin=margin)
    ]
    bounds = file_bounds(walk_summaries(summaries))
    offsets = []
    for part in plan_ranges(location, split, split_last=True, bounds=bounds, margin=margin):
        offsets.extend(item[2] for item in RangeScan(location, part, False, resync_last=True))
    return offsets


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("stores")
    for name in ("multi", "torn-tail", "garbage-after-end", "crc-flip", "missing-file"):
        generate(name, root / name)
    return root


@pytest.mark.parametrize("name", ["multi", "torn-tail", "garbage-after-end", "crc-flip"])
@pytest.mark.parametrize("split", SPLITS)
def test_ranges_read_what_a_walk_reads(stores: Path, name: str, split: int) -> None:
    with Store.open_read(stores / name) as store:
        expected = [offset for offset, *_ in store.commitlog.scan()]
    assert ranged_records(stores / name, split) == expected


def test_a_record_longer_than_the_margin_is_still_read_whole(tmp_path: Path) -> None:
    # a broker configured with a larger maxMessageSize than the reader's: records that run
    # past a range's end by more than the margin the reader reads ahead
    store_dir = tmp_path / "store"
    config = StoreConfig(commitlog_file_size=1024 * 1024)
    bodies = [bytes([n]) * (200_000 + n) for n in range(4)] + [b"small"]
    with Store.open_write(store_dir, config, create=True) as store:
        store.appender().append_many(Message(topic="Big", body=body) for body in bodies)
    with Store.open_read(store_dir) as store:
        expected = [offset for offset, *_ in store.commitlog.scan()]
    assert len(expected) == len(bodies)
    for split in (30_000, 150_000, 0):
        assert ranged_records(store_dir, split, margin=record_margin(1)) == expected
    # the bytes a range reads past its end stay near the margin
    location = StoreLocation(str(store_dir))
    first = plan_ranges(location, 150_000, split_last=True, margin=record_margin(1))[0]
    with location.windows("commitlog/" + first.name, first.file_size, read_ahead=1000) as w:
        _, start, filled, room = w.window(0, 0)
        assert (start, filled, room) == (0, 1000, first.file_size - 1000)
        _, start, filled, _ = w.window(500, 200_100)  # a record needs more: read whole
        assert (start, filled) == (500, 200_100)


def test_a_long_damaged_region_of_long_records_is_skipped(tmp_path: Path) -> None:
    # damage longer than a range reads ahead, in a completed file: each range past it finds
    # its own first record, and the ranges together read what a walk of the log reads
    store_dir = tmp_path / "store"
    config = StoreConfig(commitlog_file_size=1024 * 1024)
    with Store.open_write(store_dir, config, create=True) as store:
        store.appender().append_many(
            Message(topic="Big", body=bytes([n]) * 150_000) for n in range(10)
        )
    with Store.open_read(store_dir) as store:
        offsets = [offset for offset, *_ in store.commitlog.scan()]
    fd = os.open(store_dir / "commitlog" / f"{0:020d}", os.O_RDWR)
    os.pwrite(fd, b"\xab" * (offsets[5] - offsets[1] - 8), offsets[1] + 8)  # records 1-4 garbled
    os.close(fd)
    for split in (30_000, 150_000, 0):
        assert ranged_records(store_dir, split, margin=record_margin(1)) == [
            offsets[0],
            *offsets[5:],
        ]


def test_damage_in_a_completed_file_is_skipped(stores: Path, tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    generate("multi", store_dir)
    with Store.open_read(store_dir) as store:
        offsets = [offset for offset, *_ in store.commitlog.scan()]
    damaged = offsets[10]
    fd = os.open(store_dir / "commitlog" / f"{0:020d}", os.O_RDWR)
    os.pwrite(fd, b"\x00\x00\x00\x01", damaged + 4)  # not a magic code
    os.close(fd)
    for split in SPLITS:
        assert ranged_records(store_dir, split) == [o for o in offsets if o != damaged]


def test_zeros_over_records_in_a_completed_file_are_skipped(tmp_path: Path) -> None:
    """A run of zeros written over records in a file the log has gone on from: damage, the
    records after it read on whatever the split, as other damage is. They ended the file (as
    zeros do in the last file), so a read in whole files left out the records after them and
    a read in smaller ranges did not; dispatch still stops there, as the dispatcher does, and
    names the damage."""
    store_dir = tmp_path / "store"
    generate("multi", store_dir)
    with Store.open_read(store_dir) as store:
        offsets = [offset for offset, *_ in store.commitlog.scan()]
    first, second = offsets[10], offsets[11]
    fd = os.open(store_dir / "commitlog" / f"{0:020d}", os.O_RDWR)
    os.pwrite(fd, bytes(second - first), first)
    os.close(fd)
    for split in SPLITS:
        assert ranged_records(store_dir, split) == [o for o in offsets if o != first], split
    location = StoreLocation(str(store_dir))
    summaries = [
        summarize_range(location, part, check_crc=False, delay_levels=DelayLevels())
        for part in plan_ranges(location, 0, split_last=True)
    ]
    end = dispatch_end(walk_summaries(summaries), next_file_start=None, crc_from=None)
    os.rename(store_dir / "consumequeue", tmp_path / "queues")  # dispatched again below
    with Store.open_write(store_dir) as store:
        # the queues only: the 'abort' kept would make a broker's crash recovery (from the
        # first file) cut the log at the zeros, so it is refused before it begins
        queues_only = Dispatcher(store, build_index=False)
        with pytest.raises(UncleanStoreError, match=f"end the log at offset {first:,} "):
            queues_only.run(store.commitlog.min_offset)
        queues_only.close()
        dispatcher = Dispatcher(store)
        result = dispatcher.run(store.commitlog.min_offset)
        dispatcher.close()
    assert end.cut == result.to_offset == first and end.reason is None
    # the log goes on past the zeros: the dispatch names them, the log's end the valid one
    assert result.damage is not None and result.damage.offset == first
    assert result.log_end == result.damage.log_end > first
    assert result.stopped_by == f"damage at offset {first}: {result.damage.reason}"


def test_a_file_cut_short_is_refused_and_an_empty_last_one_left_out(
    stores: Path, tmp_path: Path
) -> None:
    """The ranges are planned over the files as a broker loads them: an empty file after the
    last (a running broker has just made it; a 5.x one deletes it at start-up) is left out,
    and a file of another size than the others (a copy cut short) is refused: the ranges
    would read it as a file that ends early and go on past what it lost."""
    store_dir = tmp_path / "store"
    shutil.copytree(stores / "multi", store_dir)
    files = sorted((store_dir / "commitlog").iterdir())
    size = files[0].stat().st_size
    with Store.open_read(store_dir) as store:
        offsets = [offset for offset, *_ in store.commitlog.scan()]
    (store_dir / "commitlog" / f"{int(files[-1].name) + size:020d}").touch()
    location = StoreLocation(str(store_dir))
    assert location.commitlog_segments() == [(path.name, size) for path in files]
    assert ranged_records(store_dir, 1500) == offsets
    os.truncate(files[2], 1000)
    cut = f"commit-log file {store_dir}/commitlog/{files[2].name} is 1000 bytes; "
    for split in SPLITS:  # the size the store's remembered geometry says
        with pytest.raises(
            StoreFormatError, match=re.escape(f"{cut}the configured size is {size}")
        ):
            plan_ranges(location, split, split_last=True)
    geometry_path(store_dir).unlink()  # a broker's store: the others' size
    with pytest.raises(
        StoreFormatError, match=re.escape(f"{cut}the other files of the commit log")
    ):
        plan_ranges(location, 0, split_last=True)


def test_a_torn_real_broker_store_ends_at_the_last_valid_end(oracle) -> None:
    crash = oracle("s2_crash")
    for copy in ("store_torn_half_record", "store_torn_random_garbage"):
        store_dir = crash.root / copy
        for split in (3000, 0):
            offsets = ranged_records(store_dir, split)
            with Store.open_read(store_dir, StoreConfig(**ORACLE_CONFIG)) as store:
                last = store.commitlog.read(offsets[-1])
            assert offsets[-1] + last.store_size == crash.manifest["lastValidEnd"]


@pytest.mark.parametrize("name", ["multi", "torn-tail", "garbage-after-end", "crc-flip"])
def test_dispatch_end_is_where_the_dispatcher_stops(stores: Path, tmp_path: Path, name: str):
    store_dir = tmp_path / name
    generate(name, store_dir)
    with Store.open_write(store_dir) as store:
        recovery = store.commitlog.recovery_start(store.checkpoint(), store.abort_path.exists())
        crc_from = recovery.start if store.config.check_crc_on_recover else None
        location = StoreLocation(str(store_dir))
        for split in SPLITS:
            summaries = [
                summarize_range(
                    location,
                    part,
                    check_crc=crc_from is not None and part.file_start >= crc_from,
                    delay_levels=DelayLevels(),
                )
                for part in plan_ranges(location, split, split_last=True)
            ]
            end = dispatch_end(walk_summaries(summaries), next_file_start=None, crc_from=crc_from)
            for queue_dir in (store_dir / "consumequeue").glob("*"):
                os.rename(queue_dir, tmp_path / f"moved-{name}-{split}-{queue_dir.name}")
            dispatcher = Dispatcher(store, build_index=False)
            result = dispatcher.run(store.commitlog.min_offset)
            dispatcher.close()
            assert end.cut == result.log_end
            assert end.reason == result.stopped_by


def test_one_planner_for_every_caller() -> None:
    """plan_spans: ranges of ``split`` bytes from a position of the first file, each file's
    last range running to its end (or where its records end), a pre-allocated last file
    planned only up to where its data seems to end."""
    files = [(0, 1000), (1000, 1000), (2000, 1000)]
    data_end = lambda start, size: 500  # noqa: E731
    assert plan_spans(files, 400, begin=100, data_end=data_end) == [
        (0, 1000, 100, 500, False),
        (0, 1000, 500, 900, False),
        (0, 1000, 900, 1000, False),
        (1000, 1000, 0, 400, False),
        (1000, 1000, 400, 800, False),
        (1000, 1000, 800, 1000, False),
        (2000, 1000, 0, 400, True),
        (2000, 1000, 400, 1000, True),
    ]
    assert plan_spans(files, 400, ends={0: 1000, 1000: 600}) == [
        (0, 1000, 0, 400, False),
        (0, 1000, 400, 800, False),
        (0, 1000, 800, 1000, False),
        (1000, 1000, 0, 400, False),
        (1000, 1000, 400, 600, False),
    ]  # the last file is not in ``ends``: left out
    assert plan_spans(files, 0, begin=100, data_end=data_end) == [
        (0, 1000, 100, 1000, False),
        (1000, 1000, 0, 1000, False),
        (2000, 1000, 0, 1000, True),
    ]
    assert plan_spans(files, 400, split_last=False, data_end=data_end)[-1:] == [
        (2000, 1000, 0, 1000, True)
    ]
    # a last range of at most a tenth of a split joins the one before (SPLIT_SLOP)
    assert plan_spans([(0, 1000)], 450, data_end=lambda start, size: 495) == [
        (0, 1000, 0, 1000, True)
    ]  # 45 bytes of data after 450: not a range of their own
    assert plan_spans([(0, 1000)], 450, data_end=lambda start, size: 496) == [
        (0, 1000, 0, 450, True),
        (0, 1000, 450, 1000, True),
    ]
    assert plan_spans([(0, 1000)], 450, ends={0: 945}) == [
        (0, 1000, 0, 450, True),
        (0, 1000, 450, 945, True),
    ]
    assert plan_spans([(0, 1000)], 450, ends={0: 946}) == [
        (0, 1000, 0, 450, True),
        (0, 1000, 450, 900, True),
        (0, 1000, 900, 946, True),
    ]


def test_part_groups_join_whole_small_files_only() -> None:
    """Consecutive files planned as one range each share a part up to ``split`` bytes; the
    ranges of a file planned in several stay alone (a walk may not visit the later ones)."""

    def whole(name: str, size: int) -> FileRange:
        return FileRange(name, int(name), 0, size, size, False)

    small = [whole("0000", 300), whole("1000", 300), whole("2000", 300)]
    cut = [FileRange("3000", 3000, start, start + 500, 1000, False) for start in (0, 500)]
    late = [whole("4000", 400), whole("5000", 500)]
    ranges = small + cut + late
    assert part_groups(ranges, 700) == [small[:2], small[2:], cut[:1], cut[1:], late[:1], late[1:]]
    assert part_groups(ranges, 1000) == [small, cut[:1], cut[1:], late]
    assert part_groups(ranges, 0) == [[part] for part in ranges]
    assert part_groups([], 1000) == []


@pytest.mark.parametrize(
    ("split", "limit"), [(0, 1 << 30), (1500, 1500), (1500, 40000), (40000, 40000)]
)
@pytest.mark.parametrize("name", ["multi", "torn-tail", "garbage-after-end", "crc-flip"])
def test_a_walk_visits_every_range_of_a_part_group_or_none(
    stores: Path, name: str, split: int, limit: int
) -> None:
    """What a one-pass export or ``stats`` reads of a group is kept whole: whatever ends a
    file's records, one walk of the log visits all of a group's ranges or none of them (also
    with groups of more bytes than a range, where a file's ranges would otherwise join)."""
    location = StoreLocation(str(stores / name))
    planned = plan_ranges(location, split, split_last=True)
    summaries = [
        summarize_range(location, part, check_crc=True, delay_levels=DelayLevels())
        for part in planned
    ]
    walked = walk_summaries(summaries)
    visited = {(each.file, each.start) for each in walked}
    groups = part_groups(planned, limit)
    if len({part.name for part in planned}) == len(planned):  # whole files, all visited
        assert len(walked) == len(planned)
        if all(2 * part.file_size <= limit for part in planned):  # two fit in a part
            assert len(groups) < len(planned)
    elif name != "multi":
        assert len(walked) < len(planned)  # a file's records end before its last range
    for group in groups:
        seen = {(part.name, part.start) in visited for part in group}
        assert len(seen) == 1, group


@pytest.mark.parametrize("split", [0, 4096])
def test_the_summaries_count_the_records_with_lmq_units(tmp_path: Path, split: int) -> None:
    """A walk's summaries say where records with units in further (LMQ) queues lie, so a
    rebuild on Spark reads only those files a second time for them, and none without."""
    from rmqstore.multidispatch import queue_copies

    generate("lmq", tmp_path / "lmq")
    generate("basic", tmp_path / "basic")
    for name in ("lmq", "basic"):
        location = StoreLocation(str(tmp_path / name))
        summaries = [
            summarize_range(
                location, part, check_crc=False, delay_levels=DelayLevels(), count_copies=True
            )
            for part in plan_ranges(location, split, split_last=True)
        ]
        with Store.open_read(tmp_path / name) as store:
            copies = sum(
                bool(queue_copies(m.topic, m.queue_id, m.properties, m.properties_bytes))
                for m in (store.commitlog.read(offset) for offset, *_ in store.commitlog.scan())
            )
        assert sum(summary.queue_copies for summary in summaries) == copies
        assert copies == (45 if name == "lmq" else 0)
