"""Appending with the broker's rules, on real files: roll rule, BLANKs, queue offsets, times,
limits, V2, DELAY rewrite, the CRC property, rollback."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from rmqstore.config import StoreConfig
from rmqstore.errors import InputError, MessageTooLargeError, TopicError
from rmqstore.fixtures import SCENARIOS, FixtureOptions, generate
from rmqstore.hosts import HostAddress, parse_host
from rmqstore.msgid import UniqKeyGenerator
from rmqstore.record import (
    MAGIC_BLANK,
    TRANSACTION_COMMIT,
    TRANSACTION_PREPARED,
    TRANSACTION_ROLLBACK,
    BodyMode,
    Message,
    ScanStop,
    property_crc_status,
)
from rmqstore.store import Store

from support import ORACLE_CONFIG, tree_digest

FILE_SIZE = 4096


def new_store(path: Path, **config: object) -> Store:
    settings = {"commitlog_file_size": FILE_SIZE, **config}
    return Store.open_write(path, StoreConfig(**settings), create=True)


def counting_clock(start: int = 1_700_000_000_000):
    counter = itertools.count(start)
    return lambda: next(counter)


def message(topic: str = "TopicTest", body: bytes = b"hello", **fields: object) -> Message:
    return Message(topic=topic, body=body, properties={"TAGS": "TagA"}, **fields)


def record_size(appender, body_length: int) -> int:
    """Size of a V1/IPv4 record of TopicTest with TAGS=TagA and no generated key."""
    return 88 + body_length + 1 + len("TopicTest") + 2 + len(b"TAGS\x01TagA\x02")


def test_roll_rule_writes_a_blank_and_continues_in_the_next_file(tmp_path: Path) -> None:
    with new_store(tmp_path / "s") as store:
        appender = store.appender(clock=counting_clock())
        results = appender.append_many([message(body=b"x" * 900) for _ in range(5)])
        size = results[0].store_size
        assert [r.physical_offset for r in results[:4]] == [0, size, 2 * size, 3 * size]
        # the fifth does not fit (4*size + size + 8 > 4096): BLANK, then the next file
        assert 4 * size + size + 8 > FILE_SIZE
        assert results[4].physical_offset == FILE_SIZE
        log = store.commitlog
        blank = log.pread(log.segments[0], 4 * size, 8)
        assert int.from_bytes(blank[:4], "big") == FILE_SIZE - 4 * size
        assert int.from_bytes(blank[4:], "big", signed=True) == MAGIC_BLANK
        assert [s.name for s in log.segments] == ["00000000000000000000", "00000000000000004096"]
        assert all(s.path.stat().st_size == FILE_SIZE for s in log.segments)


@pytest.mark.parametrize(("slack", "rolls"), [(8, False), (7, True)])
def test_exact_fit_needs_eight_bytes_left(tmp_path: Path, slack: int, rolls: bool) -> None:
    with new_store(tmp_path / "s") as store:
        appender = store.appender(clock=counting_clock())
        first = appender.append(message())
        body_length = FILE_SIZE - slack - first.store_size - record_size(appender, 0)
        second = appender.append(message(body=b"y" * body_length))
        assert first.store_size + second.store_size == FILE_SIZE - slack
        third = appender.append(message())
        if rolls:  # size + 8 > remaining: the message itself moved to the next file
            assert second.physical_offset == FILE_SIZE
        else:  # exactly 8 bytes left: it stays, and an 8-byte BLANK ends the file
            assert second.physical_offset == first.store_size
            assert third.physical_offset == FILE_SIZE
            blank = store.commitlog.pread(store.commitlog.segments[0], FILE_SIZE - 8, 8)
            assert int.from_bytes(blank[:4], "big") == 8


def test_queue_offsets_are_dense_and_skip_prepared_and_rollback(tmp_path: Path) -> None:
    with new_store(tmp_path / "s") as store:
        appender = store.appender(clock=counting_clock())
        results = appender.append_many(
            [
                message(queue_id=1),
                message(queue_id=1, sys_flag=TRANSACTION_PREPARED),
                message(queue_id=1, sys_flag=TRANSACTION_COMMIT),
                message(queue_id=1, sys_flag=TRANSACTION_ROLLBACK),
                message(queue_id=2),
                message(queue_id=1),
            ]
        )
        assert [r.queue_offset for r in results] == [0, 0, 1, 0, 0, 2]


def test_queue_offsets_continue_from_a_real_broker_store(oracle, tmp_path: Path) -> None:
    store_dir = oracle("s1_multi").copy_to(tmp_path)
    table = oracle("s1_multi").manifest["dump"]["storeState"]["commitLogTopicQueueTable"]
    with Store.open_write(store_dir, StoreConfig(**ORACLE_CONFIG)) as store:
        appender = store.appender()
        results = appender.append_many(
            [message(queue_id=0), message(queue_id=3), message(topic="NewTopic")]
        )
        assert results[0].queue_offset == table["TopicTest-0"]
        assert results[1].queue_offset == table["TopicTest-3"]
        assert results[2].queue_offset == 0
        assert results[0].physical_offset == 3346149  # the broker's maxPhyOffset
        assert store.appender() is appender


def test_store_timestamps_never_decrease(tmp_path: Path) -> None:
    times = iter([1000, 900, 1200, 1100])
    with new_store(tmp_path / "s") as store:
        appender = store.appender(clock=lambda: next(times))
        results = appender.append_many([message() for _ in range(4)])
    assert [r.store_timestamp for r in results] == [1000, 1000, 1200, 1200]


def test_limits(tmp_path: Path) -> None:
    with new_store(tmp_path / "s", max_message_size=100) as store:
        appender = store.appender()
        with pytest.raises(MessageTooLargeError, match="maxMessageSize"):
            appender.append(message(body=b"z" * 101))
    with new_store(tmp_path / "t") as store:
        appender = store.appender()
        with pytest.raises(MessageTooLargeError, match="cannot fit"):
            appender.append(message(body=b"z" * 4000))
        with pytest.raises(TopicError):
            appender.append(message(topic="../x"))
        assert appender.appended == 0


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"queue_id": 1 << 31}, "queueId 2147483648 does not fit a 32-bit field"),
        ({"flag": -(1 << 31) - 1}, "flag -2147483649 does not fit a 32-bit field"),
        ({"reconsume_times": 1 << 40}, "reconsumeTimes 1099511627776 does not fit"),
        ({"prepared_transaction_offset": 1 << 63}, "preparedTransactionOffset 92233720368547"),
        ({"born_timestamp": "now"}, "bornTimestamp must be an integer, not 'now'"),
    ],
)
def test_a_field_outside_its_java_type_leaves_the_log_as_it_was(
    tmp_path: Path, fields: dict, said: str
) -> None:
    """The record's fields are packed one after the other: one that does not fit used to
    leave the fields before it in the file (12 bytes after the log's end, a store every
    later writer refused as not closed cleanly) and its queue offset taken."""
    root = tmp_path / "s"
    with new_store(root) as store:
        appender = store.appender(clock=counting_clock())
        appender.append(message(queue_id=1))
        end = appender.savepoint().offset
        with pytest.raises(InputError, match=re.escape(said)):
            appender.append_many([message(queue_id=1, body=b"second"), message(**fields)])
        assert appender.savepoint().offset > end  # the message before it stays appended
        after = appender.append(message(queue_id=1, body=b"third"))
        assert after.queue_offset == 2
    with Store.open_read(root) as store:
        assert [item[0] for item in store.commitlog.scan()] == [0, end, after.physical_offset]


def test_long_retry_topics_are_v2_only_when_allowed(tmp_path: Path) -> None:
    topic = "%RETRY%" + "g" * 140
    with new_store(tmp_path / "s", commitlog_file_size=65536) as store:
        appender = store.appender()
        result = appender.append(message(topic=topic))
        assert store.commitlog.read(result.physical_offset).version == 2
        assert store.commitlog.read(appender.append(message()).physical_offset).version == 1
    with new_store(tmp_path / "t") as store, pytest.raises(TopicError):
        store.appender(allow_v2=False).append(message(topic=topic))


def test_delay_messages_move_to_the_schedule_topic(tmp_path: Path) -> None:
    with new_store(tmp_path / "s") as store:
        appender = store.appender(clock=counting_clock())
        delayed = message(queue_id=3)
        delayed.properties["DELAY"] = "25"  # clamped to the highest level, 18
        prepared = message(sys_flag=TRANSACTION_PREPARED)
        prepared.properties["DELAY"] = "2"
        results = appender.append_many([delayed, prepared])
        stored = store.commitlog.read(results[0].physical_offset)
        assert (stored.topic, stored.queue_id) == ("SCHEDULE_TOPIC_XXXX", 17)
        assert stored.properties["DELAY"] == "18"
        assert stored.properties["REAL_TOPIC"] == "TopicTest"
        assert stored.properties["REAL_QID"] == "3"
        assert store.commitlog.read(results[1].physical_offset).topic == "TopicTest"


def test_a_delay_level_is_read_as_javas_integer_parse_int_reads_it(tmp_path: Path) -> None:
    with new_store(tmp_path / "s") as store:
        appender = store.appender(clock=counting_clock())
        arabic = message()
        arabic.properties["DELAY"] = "\u0663"  # ARABIC-INDIC DIGIT THREE: Java's parseInt is 3
        stored = store.commitlog.read(appender.append(arabic).physical_offset)
        assert (stored.topic, stored.queue_id) == ("SCHEDULE_TOPIC_XXXX", 2)
        for refused in ("\U0001d7d1", "1_0", " 3", "+", "2147483648"):  # 𝟑 is two UTF-16 units
            odd = message()
            odd.properties["DELAY"] = refused
            with pytest.raises(InputError, match="is not a delay level"):
                appender.append(odd)


def test_crc_property_when_enabled(tmp_path: Path) -> None:
    with new_store(tmp_path / "s", append_prop_crc=True) as store:
        appender = store.appender()
        sent = message()
        sent.properties["__CRC32#"] = "9999999999"  # a client's value is dropped
        result = appender.append(sent)
        buf = store.commitlog.pread(store.commitlog.segments[0], 0, result.store_size)
        assert property_crc_status(buf, 0, result.store_size) is True
        stored = store.commitlog.read(0, verify_property_crc=True)
        assert stored.properties["__CRC32#"] != "9999999999"


def test_appended_records_decode_to_what_was_given(tmp_path: Path) -> None:
    born = parse_host("[2001:db8::7]:4242")
    keys = UniqKeyGenerator(pid=7, class_loader_hash=9, clock=counting_clock())
    sent = [
        Message(
            topic=f"T{i % 3}",
            body=bytes([i % 256]) * i,  # more shapes than the appender keeps layouts for
            queue_id=i % 2,
            flag=i,
            properties={"KEYS": f"k{i} k{i + 1}", "seq": str(i)},
            born_host=born,
            born_timestamp=1_600_000_000_000 + i,
            reconsume_times=i % 4,
        )
        for i in range(300)
    ]
    with new_store(tmp_path / "s") as store:
        results = store.appender(
            uniq_keys=keys,
            clock=counting_clock(),
            store_host=HostAddress(bytes([10, 0, 0, 9]), 10911),
        ).append_many(sent)
    with Store.open_read(tmp_path / "s") as store:
        for given, result in zip(sent, results, strict=True):
            got = store.commitlog.read(result.physical_offset, body=BodyMode.VERIFY)
            assert got.msg_id == result.msg_id
            assert (got.topic, got.body, got.queue_id, got.flag) == (
                given.topic,
                given.body,
                given.queue_id,
                given.flag,
            )
            assert got.born_host == born and str(got.store_host) == "10.0.0.9:10911"
            assert got.sys_flag == 0x10  # IPv6 born host
            assert got.born_timestamp == given.born_timestamp
            assert got.reconsume_times == given.reconsume_times
            assert got.properties["KEYS"] == given.properties["KEYS"]
            assert got.uniq_key and got.uniq_key.startswith(keys._prefix)
            assert got.queue_offset == result.queue_offset
        scan = store.commitlog.scan(check_crc=True)
        assert [item[0] for item in scan] == [r.physical_offset for r in results]
        assert scan.stop is ScanStop.END


def test_rollback_restores_the_exact_bytes(tmp_path: Path) -> None:
    with new_store(tmp_path / "s") as store:
        appender = store.appender(clock=counting_clock())
        appender.append_many([message(body=b"a" * 700) for _ in range(3)])
        appender.flush()
        before = tree_digest(tmp_path / "s" / "commitlog")
        offsets = dict(appender.queue_offsets)
        savepoint = appender.savepoint()
        appender.append_many([message(body=b"b" * 700) for _ in range(12)])  # rolls twice
        assert len(store.commitlog.segments) == 3
        appender.rollback(savepoint)
        appender.flush()
        assert tree_digest(tmp_path / "s" / "commitlog") == before
        assert appender.queue_offsets == offsets
        again = appender.append(message())
        assert again.queue_offset == 3


def test_data_extent_leaves_out_pre_allocated_zeros(tmp_path: Path) -> None:
    from rmqstore.fixtures import FixtureOptions, generate

    generate("large", tmp_path / "store", FixtureOptions(messages=300))
    with Store.open_read(tmp_path / "store") as store:
        end = store.log_end().offset
        extent = store.commitlog.data_extent()
        assert end <= extent <= end + 65536 < store.commitlog.file_size


def _read_answer(read, offset: int) -> tuple:
    """What one lookup gives: the holder's fields, or the error's type and text."""
    from rmqstore.errors import RmqStoreError

    try:
        found = read(offset)
    except RmqStoreError as exc:
        return (type(exc).__name__, str(exc))
    return (
        found.topic,
        found.queue_id,
        found.queue_offset,
        found.properties_bytes,
        found.store_size,
    )


@pytest.mark.parametrize(
    ("name", "copy"),
    [
        ("s1_multi", "store"),
        ("v533_s1_multi", "store"),
        ("s2_crash", "store_torn_random_garbage"),
        ("s2_crash", "store_torn_half_record"),
    ],
)
@pytest.mark.parametrize("window", [120, 4096, None])
def test_record_lookup_answers_as_a_single_read(
    oracle,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    copy: str,
    window: int | None,
) -> None:
    """RecordLookup (verify's second look at a queue's unmatched units) reads the log a
    window at a time: at every record, inside records, at file ends, past the log, in a
    window too small for a record and in a copy with bytes flipped, it answers what
    CommitLog.read answers, or raises the same error."""
    import random

    from rmqstore.commitlog import RecordLookup

    found = oracle(name)
    store_dir = found.copy_to(tmp_path, copy)
    puts = [put["physicalOffset"] for put in found.manifest["puts"]]
    rng = random.Random(7)
    with Store.open_read(store_dir, StoreConfig(**ORACLE_CONFIG)) as store:
        log = store.commitlog
        read = log.read
        ends = [segment.start + segment.size for segment in log.segments]
        extent = ends[-1]
        offsets = sorted(
            {*puts, *(p + rng.randrange(1, 100) for p in puts[::7]), *ends, *(e - 8 for e in ends)}
            | {rng.randrange(0, extent + 1000) for _ in range(300)}
            | {extent + 5, -3}
        )
        for mutated in (False, True):
            if mutated:  # a copy with bytes flipped at random (headers, lengths, topics)
                for _ in range(60):
                    at = rng.choice(puts) + rng.randrange(0, 120)
                    segment = log.queue.find(at)
                    if segment is not None:
                        with open(segment.path, "r+b") as handle:
                            handle.seek(at - segment.start)
                            handle.write(bytes([rng.randrange(256)]))
            lookup = RecordLookup(log) if window is None else RecordLookup(log, window)
            expected = [
                _read_answer(lambda at: log.read(at, body=BodyMode.SKIP), at) for at in offsets
            ]
            single_reads: list[int] = []

            def counted_read(at: int, reads: list[int] = single_reads, **kw: object) -> object:
                reads.append(at)
                return read(at, **kw)

            monkeypatch.setattr(log, "read", counted_read)
            assert [_read_answer(lookup.holder, at) for at in offsets] == expected
            monkeypatch.undo()
            if window is None:  # every whole record is taken from a window, only the rest read
                assert len(single_reads) == sum(len(answer) == 2 for answer in expected)
            backwards = RecordLookup(log) if window is None else RecordLookup(log, window)
            assert [_read_answer(backwards.holder, at) for at in reversed(offsets)] == expected[
                ::-1
            ]
            assert sum(answer[0] == "RecordError" for answer in expected) > 0
            assert sum(len(answer) == 5 for answer in expected) >= len(puts) // 2


def test_a_scan_from_past_the_bytes_of_a_file_cut_short_finds_no_record(
    oracle, tmp_path: Path
) -> None:
    """A scan that starts past the bytes a commit-log file cut short holds (where the
    consume queues still end) finds no record and ends where it started; it stopped with a
    ValueError from the record kernel (found by the mutant campaign)."""
    import os

    from rmqstore.commitlog import CommitLog
    from rmqstore.record import ScanStop

    store = oracle("s1_multi").copy_to(tmp_path)
    os.truncate(store / "commitlog" / f"{65536:020d}", 1000)
    log = CommitLog(store / "commitlog", 65536, strict=False)
    try:
        for start in (65536 + 1001, 65536 + 30000):
            scan = log.scan(start, check_crc=True)
            assert list(scan) == [] and list(log.scan(start).batches()) == []
            assert (scan.end_offset, scan.stop) == (start, ScanStop.END)
    finally:
        log.close()


def _ends_after_agrees(store_dir: Path, config: StoreConfig, rng) -> int:
    """For offsets at and inside every record (after the end too), at file ends and at
    random, under a normal's and a crash's rules: ``ends_after`` is never True where the
    valid end is not after the offset. Returns how many times it was True."""
    settled = 0
    with Store.open_read(store_dir, config) as store:
        log = store.commitlog
        if not log.segments:
            return 0
        starts = [item[0] for item in log.scan(check_crc=False)]
        ends = [segment.start + segment.size for segment in log.segments]
        tail = [s for s in starts if s >= log.segments[max(0, len(log.segments) - 3)].start]
        firsts = [s for s in starts if any(s < end <= s + 4096 for end in ends)]
        offsets = sorted(
            {*rng.sample(tail, min(len(tail), 25)), *starts[-3:], *ends[-3:], ends[-1] - 1}
            | {*rng.sample(starts, min(len(starts), 25)), *rng.sample(firsts, min(len(firsts), 10))}
            | {s + rng.randrange(1, 60) for s in rng.sample(starts, min(len(starts), 10))}
            | {rng.randrange(0, ends[-1] + 100) for _ in range(10)}
        )
        checkpoint = store.checkpoint()
        for abnormal in (False, True):
            for check_crc in (True, False):
                end = log.valid_end(check_crc=check_crc, abnormal=abnormal, checkpoint=checkpoint)
                for offset in offsets:
                    if log.ends_after(
                        offset, check_crc=check_crc, abnormal=abnormal, checkpoint=checkpoint
                    ):
                        assert end.offset > offset, (store_dir.name, abnormal, offset, end)
                        settled += 1
    return settled


@pytest.mark.parametrize("scenario", sorted(name for name in SCENARIOS if name != "large"))
def test_ends_after_never_says_more_than_the_valid_end(tmp_path: Path, scenario: str) -> None:
    """``read --offset`` walks the log only up to the offset when that settles whether the
    offset is before the valid end (see CommitLog.ends_after): on every fixture scenario,
    clean and damaged, and on copies with bytes flipped, it never lets through an offset
    the valid end leaves out, and it settles offsets in the last file."""
    import random

    rng = random.Random(scenario)
    store_dir = tmp_path / "store"
    generate(scenario, store_dir, FixtureOptions(seed=5))
    config = StoreConfig()  # the geometry the fixture remembers
    assert _ends_after_agrees(store_dir, config, rng) > 0
    segments = sorted((store_dir / "commitlog").iterdir())
    for _ in range(40):  # flipped bytes, zeros, mostly in the last files
        path = rng.choice(segments[-3:] if rng.random() < 0.6 else segments)
        length = rng.choice([1, 1, 8, 200])
        with open(path, "r+b") as handle:
            handle.seek(rng.randrange(0, path.stat().st_size - length))
            handle.write(bytes([rng.randrange(256)]) * length)
    _ends_after_agrees(store_dir, config, rng)


def test_ends_after_settles_offsets_before_a_pre_made_empty_file(tmp_path: Path) -> None:
    """A broker makes the next commit-log file before it is needed, so a store copied from a
    running broker (or after a clean shutdown) ends in an empty file. An offset in the files
    before it is settled by a walk up to it too (it used to take a walk to the log's end),
    and never let through where the valid end leaves it out, bytes flipped in any file."""
    import random

    rng = random.Random(7)
    store_dir = tmp_path / "store"
    generate("multi", store_dir, FixtureOptions(seed=3))
    segments = sorted((store_dir / "commitlog").iterdir())
    size = segments[-1].stat().st_size
    pre_made = store_dir / "commitlog" / f"{int(segments[-1].name) + size:020d}"
    pre_made.write_bytes(bytes(size))
    config = StoreConfig()
    with Store.open_read(store_dir, config) as store:
        log = store.commitlog
        last_data = log.segments[-2]
        starts = [item[0] for item in log.scan(check_crc=False) if item[0] >= last_data.start]
        assert starts and all(
            log.ends_after(offset) for offset in starts[:: max(1, len(starts) // 20)]
        )
        assert not log.ends_after(log.valid_end().offset)
    assert _ends_after_agrees(store_dir, config, rng) > 0
    for _ in range(60):
        path = rng.choice(segments)
        with open(path, "r+b") as handle:
            handle.seek(rng.randrange(0, size - 8))
            handle.write(bytes([rng.randrange(256)]) * rng.choice([1, 8]))
        if rng.random() < 0.2:
            _ends_after_agrees(store_dir, config, rng)
    _ends_after_agrees(store_dir, config, rng)


@pytest.mark.parametrize("copy", ["store", "store_torn_random_garbage", "store_torn_half_record"])
def test_ends_after_on_real_broker_stores(oracle, tmp_path: Path, copy: str) -> None:
    import random

    store_dir = oracle("s2_crash").copy_to(tmp_path, copy)
    assert _ends_after_agrees(store_dir, StoreConfig(**ORACLE_CONFIG), random.Random(copy)) > 0


def test_a_commit_log_file_gone_since_it_was_listed_is_said_so(tmp_path: Path) -> None:
    """A commit-log file a broker deleted (its retention) after the reader listed the log:
    the read says so, and to run again (it said "cannot read PATH: No such file")."""
    from rmqstore.errors import StoreIOError

    store = tmp_path / "store"
    generate("multi", store, FixtureOptions())
    with Store.open_read(store) as opened:
        segment = opened.commitlog.segments[0]
        segment.path.unlink()
        with pytest.raises(StoreIOError, match=r"is gone since the store was listed .* again"):
            opened.commitlog.pread(segment, 0, 100)
