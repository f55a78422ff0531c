"""verify in ranges (what the Spark engine runs on executors) gives the findings and counts of
the single pass, whatever the range size: on generated and real-broker stores, clean and
damaged, with damage placed on range boundaries, and with every option."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rmqstore.config import StoreConfig
from rmqstore.errors import InputError
from rmqstore.fixtures import SCENARIOS, generate
from rmqstore.record import BORNHOST_V6_FLAG, H_STORE_TIMESTAMP, H_SYS_FLAG, H_TOTAL_SIZE
from rmqstore.store import Store
from rmqstore.verify import VerifyOptions, verify_store
from rmqstore.verify.ranges import RangedVerify
from rmqstore.workers import process_runner

from support import ORACLE_CONFIG, compiled_pass_only

RANGE_SIZES = [97, 1500, 1 << 30]
SMALL_SCENARIOS = sorted(name for name in SCENARIOS if name != "large")


def both(store_dir: Path, range_size: int, config: StoreConfig | None = None, **options):
    """(single pass, ranges) reports for the same store and options."""
    settings = dict(check_crc=True, commitlog_only=False, topics=None, from_offset=None)
    settings.update(max_findings=None)
    settings.update(options)
    with Store.open_read(store_dir, config) as store:
        single = verify_store(store, VerifyOptions(**settings))
    with Store.open_read(store_dir, config) as store:
        ranged = RangedVerify(store, range_size=range_size, **settings).run()
    return single, ranged


def assert_same(single, ranged) -> None:
    assert sorted(map(repr, ranged.findings)) == sorted(map(repr, single.findings))
    assert ranged.counts == single.counts
    assert ranged.checked == single.checked
    assert ranged.ok == single.ok


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("scenarios")
    for name in SMALL_SCENARIOS:
        generate(name, root / name)
    return root


@compiled_pass_only  # every scenario's files are kernel_corpus seeds
@pytest.mark.parametrize("name", SMALL_SCENARIOS)
@pytest.mark.parametrize("range_size", RANGE_SIZES)
def test_generated_scenarios(scenarios: Path, name: str, range_size: int) -> None:
    assert_same(*both(scenarios / name, range_size))


@pytest.mark.parametrize(
    "name",
    [
        "s1_multi",
        "s3_txn_delay",
        "v533_s1_multi",
        "v533_s3_txn",
        "s4_recovered_from_torn_half_record",
    ],
)
def test_real_broker_stores(oracle, name: str) -> None:
    for range_size in (3000, 65536):
        assert_same(*both(oracle(name).store, range_size, StoreConfig(**ORACLE_CONFIG)))


@pytest.mark.parametrize("copy", ["store_torn_half_record", "store_torn_random_garbage"])
def test_torn_real_broker_stores(oracle, copy: str) -> None:
    single, ranged = both(oracle("s2_crash").root / copy, 3000, StoreConfig(**ORACLE_CONFIG))
    assert_same(single, ranged)
    torn = [f.commit_log_offset for f in ranged.findings if f.kind == "torn-tail"]
    assert torn == [oracle("s2_crash").manifest["lastValidEnd"]]


def _records(store_dir: Path) -> list[tuple[int, tuple]]:
    with Store.open_read(store_dir) as store:
        return [(offset, header) for offset, header, *_ in store.commitlog.scan()]


def _patch(store_dir: Path, offset: int, data: bytes, file_size: int) -> None:
    path = store_dir / "commitlog" / f"{offset - offset % file_size:020d}"
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, data, offset % file_size)
    finally:
        os.close(fd)


@pytest.fixture
def damaged(tmp_path: Path) -> Path:
    """``multi`` with a bad magic code in the first file (skipped, then resumed), a store
    time that goes back and a queue offset that jumps."""
    store_dir = tmp_path / "store"
    generate("multi", store_dir)
    records = _records(store_dir)
    size = 65536
    _patch(store_dir, records[10][0] + 4, b"\x00\x00\x00\x01", size)
    offset, header = records[30]
    # STORETIMESTAMP follows BORNTIMESTAMP (at 40) and BORNHOST (8 bytes, 20 for IPv6)
    born_host = 20 if header[H_SYS_FLAG] & BORNHOST_V6_FLAG else 8
    _patch(
        store_dir,
        offset + 48 + born_host,
        (header[H_STORE_TIMESTAMP] - 100_000).to_bytes(8, "big"),
        size,
    )
    _patch(store_dir, records[50][0] + 20, (999).to_bytes(8, "big"), size)
    return store_dir


@pytest.mark.parametrize("range_size", [97, 300, 1 << 30])
def test_damage_across_range_boundaries(damaged: Path, range_size: int) -> None:
    single, ranged = both(damaged, range_size)
    assert {"record-invalid", "store-time-order", "queue-offset-gap"} <= set(single.counts)
    assert_same(single, ranged)


@pytest.mark.slow
def test_options(damaged: Path, scenarios: Path) -> None:
    offsets = [offset for offset, _ in _records(scenarios / "multi")]
    for options in (
        {"from_offset": offsets[100]},
        {"from_offset": 65536},
        {"topics": frozenset({"TopicTest"})},
        {"commitlog_only": True},
        {"check_crc": False},
    ):
        for range_size in (400, 1 << 30):
            assert_same(*both(damaged, range_size, **options))


@pytest.mark.parametrize(
    "record, into, refusal",
    [
        (100, 1, "no record starts at offset"),
        # the queue offset of a queue's first record is 8 zero bytes, which a scan reads as
        # the end of the data: from there the walk found a file ending without a BLANK
        # record ("file-incomplete", next step recover) in a sound store
        (0, 20, "holds zeros, and the file's data goes on"),
    ],
)
def test_a_from_offset_that_is_not_a_record_is_refused(
    scenarios: Path, record: int, into: int, refusal: str
) -> None:
    start = _records(scenarios / "multi")[record][0] + into
    with Store.open_read(scenarios / "multi") as store, pytest.raises(InputError, match=refusal):
        verify_store(store, VerifyOptions(from_offset=start))
    for range_size in (400, 1 << 30):
        with Store.open_read(scenarios / "multi") as store:
            ranged = RangedVerify(
                store,
                check_crc=True,
                commitlog_only=False,
                topics=None,
                from_offset=start,
                max_findings=None,
                range_size=range_size,
            )
            with pytest.raises(InputError, match=refusal):
                ranged.run()


@pytest.mark.parametrize("past", [0, 1, 4000])
def test_a_from_offset_at_or_past_the_end_finds_a_sound_store_sound(
    scenarios: Path, past: int
) -> None:
    """A walk from the log's end sees no record: the index entries before it are older than
    the walk (they were all said to point past the end), and there is no newest record to
    hold the checkpoint's times against (both were said to be ahead). A store whose
    checkpoint is ahead is still told so from its last record."""
    last, header = _records(scenarios / "multi")[-1]
    end = last + header[H_TOTAL_SIZE]
    for range_size in (400, 1 << 30):
        single, ranged = both(scenarios / "multi", range_size, from_offset=end + past)
        assert single.ok and not single.findings, single.findings
        assert single.checked["records"] == 0
        assert_same(single, ranged)
    stale = [offset for offset, _ in _records(scenarios / "stale-checkpoint")]
    single, ranged = both(scenarios / "stale-checkpoint", 1 << 30, from_offset=stale[-1])
    assert set(single.counts) == {"checkpoint-future"} and single.checked["records"] == 1
    assert_same(single, ranged)


def test_max_findings_keeps_the_count(damaged: Path) -> None:
    single, ranged = both(damaged, 400, max_findings=2)
    assert len(ranged.findings) == 2 and ranged.truncated
    assert ranged.counts == single.counts and ranged.problems == single.problems


@pytest.mark.parametrize("name", ["torn-tail", "index-broken-chain", "cq-wrong-size"])
def test_ranges_in_worker_processes(scenarios: Path, name: str) -> None:
    settings = dict(check_crc=True, commitlog_only=False, topics=None, from_offset=None)
    settings.update(max_findings=None)
    with Store.open_read(scenarios / name) as store:
        single = verify_store(store, VerifyOptions(**settings))
    with Store.open_read(scenarios / name) as store:
        ranged = RangedVerify(store, range_size=1500, **settings).run(process_runner(2))
    assert_same(single, ranged)


def test_each_range_closes_the_store_it_opened(
    scenarios: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whether a range's check ends normally or with an engine error, its store is closed."""
    from rmqstore.verify import ranges as ranges_module

    opened: list[Store] = []
    closed: list[Store] = []
    real_open, real_close = Store.open_read, Store.close

    def recording_open(*args, **kwargs) -> Store:
        store = real_open(*args, **kwargs)
        opened.append(store)
        return store

    def recording_close(self: Store, **kwargs) -> None:
        closed.append(self)
        real_close(self, **kwargs)

    monkeypatch.setattr(Store, "open_read", recording_open)
    monkeypatch.setattr(Store, "close", recording_close)
    with Store.open_read(scenarios / "multi") as store:
        verify = RangedVerify(
            store, check_crc=True, commitlog_only=False, topics=None, from_offset=None,
            max_findings=None, range_size=1500,
        )  # fmt: skip
        jobs = verify.jobs(verify.plan())
    monkeypatch.setattr(ranges_module, "QueueChecks", _failing_queue_checks)
    for job in jobs:
        outcome = ranges_module.check_range(job)
        assert outcome.error is not None  # the engine error came back in the outcome
    ranged = [store for store in opened if store not in closed]
    assert ranged == []


def _failing_queue_checks(*_args: object, **_kwargs: object) -> None:
    from rmqstore.errors import StoreFormatError

    raise StoreFormatError("a queue file of the wrong size")


def _positions_one_by_one(checks, offsets: list[int]) -> list:
    """Where each range takes up the index's entries, entry by entry (what positions_of
    must give, however it reads them)."""
    positions: list = []
    wanted = 0
    for ordinal, index in enumerate(checks.service.files):
        for number, (_, offset, _, _) in index.iter_entries():
            while wanted < len(offsets) and offset >= offsets[wanted]:
                positions.append((ordinal, number))
                wanted += 1
    return positions + [checks.stream_end()] * (len(offsets) - wanted)


@pytest.mark.parametrize("chunk", [1, 7, 65536])
def test_where_ranges_take_up_the_index_in_order_and_out_of_order(
    scenarios: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """positions_of searches chunks of ascending entries by bisection and passes over
    chunks pointing before what it looks for: the same positions as a walk of every entry,
    across index files, and also where entries are out of order (offsets swapped)."""
    import random
    import shutil

    from rmqstore import indexfile
    from rmqstore.verify.findings import VerifyReport
    from rmqstore.verify.index import IndexChecks

    monkeypatch.setattr(indexfile, "_ENTRY_CHUNK", chunk)  # chunks of 1, 7 and all entries
    store_dir = tmp_path / "store"
    shutil.copytree(scenarios / "abort-left", store_dir)
    chooser = random.Random(5)
    for damaged in (False, True):
        with Store.open_read(store_dir) as store:
            checks = IndexChecks(store, VerifyReport(), None)
            files = checks.service.files if checks.service is not None else []
            assert len(files) == 2
            places = [
                (Path(index.path), index._entries_at, index.header.index_count) for index in files
            ]
            pointed = sorted(
                offset for index in files for _, (_, offset, _, _) in index.iter_entries()
            )
            for _ in range(40):
                wanted = chooser.sample(range(pointed[-1] + 50), chooser.randint(1, 6))
                wanted += chooser.sample(pointed, 2)
                wanted = sorted(set(wanted))
                assert checks.positions_of(wanted) == _positions_one_by_one(checks, wanted)
        if not damaged:  # swap the offsets of a few entries in each file, then again
            for path, entries_at, count in places:
                data = bytearray(path.read_bytes())
                for _ in range(5):
                    one, other = (
                        entries_at + 20 * n + 4 for n in chooser.sample(range(1, count), 2)
                    )
                    data[one : one + 8], data[other : other + 8] = (
                        data[other : other + 8],
                        data[one : one + 8],
                    )
                path.write_bytes(data)
