"""The export rows built as columns from kernel batches (rmqstore.pipeline.columns) hold what a
per-record decode gives, on every fixture scenario and real-broker commit-log file, mutated
copies of them, and records made to hit the rare paths (text that is not UTF-8, duplicate and
very many properties, IPv6 hosts, SCHEDULE_TOPIC_XXXX with a bad DELAY)."""

from __future__ import annotations

import random
from contextlib import suppress
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmqstore.delay import SCHEDULE_TOPIC, DelayLevels, unit_tags_code
from rmqstore.errors import InputError, RecordError
from rmqstore.fixtures import generate
from rmqstore.fixtures.plans import FixtureOptions
from rmqstore.hashing import tags_code
from rmqstore.hosts import HostAddress, parse_host
from rmqstore.kernel import layout
from rmqstore.pipeline.columns import TIMESTAMP_MS_RANGE
from rmqstore.pipeline.filters import RowFilter
from rmqstore.pipeline.location import StoreLocation
from rmqstore.pipeline.ranges import FileRange, RangeScan, plan_ranges
from rmqstore.pipeline.rows import (
    COMMITLOG_COLUMNS,
    EXPORT_BATCH_ROWS,
    GATHER_BYTES,
    BatchGatherer,
    MessageBatcher,
    MessageRowOptions,
    message_batches,
)
from rmqstore.properties import KEYS, TAGS, UNIQ_KEY, decode_properties
from rmqstore.record import (
    H_BODY_CRC,
    H_BODY_LENGTH,
    H_BORN_HOST,
    H_BORN_TIMESTAMP,
    H_FLAG,
    H_MAGIC,
    H_PREPARED_OFFSET,
    H_QUEUE_ID,
    H_QUEUE_OFFSET,
    H_RECONSUME_TIMES,
    H_STORE_HOST,
    H_STORE_TIMESTAMP,
    H_SYS_FLAG,
    H_TOTAL_SIZE,
    MAGIC_V2,
    Message,
    encode_record,
    header_struct,
    inflate_body,
)

from kernel_corpus import mutate
from support import compiled_pass_only

pytest.importorskip("pyarrow")

NAMES = [name for name, _, _ in COMMITLOG_COLUMNS]


def rows_by_record(location: StoreLocation, part: FileRange, options: MessageRowOptions) -> list:
    """The export rows decoded one record at a time from the per-record scan."""
    levels = DelayLevels(options.delay_levels) if options.delay_levels else DelayLevels()
    found = []
    scan = RangeScan(location, part, options.check_crc, resync_last=options.resync_last)
    for buf, at, offset, header, topic, props, crc_ok in scan:
        if options.topics is not None and topic not in options.topics:
            continue
        properties = decode_properties(props)
        tags = properties.get(TAGS)
        if topic == SCHEDULE_TOPIC:
            try:
                code = unit_tags_code(topic, properties, header[H_STORE_TIMESTAMP], levels)
            except RecordError:
                code = None
        else:
            code = tags_code(tags)
        body = None
        if options.include_body:
            body_at = offset - part.file_start - at + header_struct(header[H_SYS_FLAG]).size
            body = bytes(buf[body_at : body_at + header[H_BODY_LENGTH]])
            if options.decompress and body:
                with suppress(InputError):
                    body = inflate_body(body, header[H_SYS_FLAG], offset)
        values = (
            topic,
            header[H_QUEUE_ID],
            header[H_QUEUE_OFFSET],
            body,
            list(properties.items()),
            header[H_BORN_TIMESTAMP],
            header[H_STORE_TIMESTAMP],
            header[H_FLAG],
            offset,
            header[H_TOTAL_SIZE],
            header[H_TOTAL_SIZE],
            header[H_BODY_LENGTH],
            header[H_BODY_CRC],
            crc_ok,
            header[H_SYS_FLAG],
            str(HostAddress.from_field(header[H_BORN_HOST])),
            str(HostAddress.from_field(header[H_STORE_HOST])),
            header[H_RECONSUME_TIMES],
            header[H_PREPARED_OFFSET],
            tags,
            code,
            properties.get(KEYS),
            properties.get(UNIQ_KEY),
            (header[H_STORE_HOST] + offset.to_bytes(8, "big")).hex().upper(),
            "V2" if header[H_MAGIC] == MAGIC_V2 else "V1",
            f"commitlog/{part.name}",
            _time(header[H_BORN_TIMESTAMP]),
            _time(header[H_STORE_TIMESTAMP]),
        )
        found.append(dict(zip(NAMES, values, strict=True)))
    return found


def _time(millis: int) -> datetime | None:
    low, high = TIMESTAMP_MS_RANGE
    if not low <= millis <= high:
        return None
    return datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(milliseconds=millis)


def rows_by_columns(
    location: StoreLocation, part: FileRange, options: MessageRowOptions, *, coded: bool = False
) -> list:
    return [
        row
        for batch in message_batches(location, [part], options, coded=coded)
        for row in batch.to_pylist()
    ]


# columns without the property map: its picks are parsed on their own
PICKS_AND_TEXT = ("tags", "keys", "uniqKey", "bornHost", "storeHost", "topic", "file", "version")


def one_file_store(root: Path, data: bytes, base: int) -> tuple[StoreLocation, FileRange]:
    (root / "commitlog").mkdir(parents=True, exist_ok=True)
    name = f"{base:020d}"
    (root / "commitlog" / name).write_bytes(data)
    return StoreLocation(str(root)), FileRange(name, base, 0, len(data), len(data), True)


OPTION_SETS = [
    MessageRowOptions(),
    MessageRowOptions(include_body=False, check_crc=True, resync_last=True),
    MessageRowOptions(check_crc=True, delay_levels="1s 5s 10s"),
    MessageRowOptions(decompress=True),
]


def assert_same_rows(location: StoreLocation, part: FileRange, label: str) -> int:
    """The rows of every option set the same both ways; how many rows the defaults give."""
    plain = rows_by_record(location, part, MessageRowOptions())
    for options in OPTION_SETS:
        expected = (
            plain if options == MessageRowOptions() else rows_by_record(location, part, options)
        )
        got = rows_by_columns(location, part, options)
        assert got == expected, f"{label}: {options}"
    topics = {row["topic"] for row in expected[::2]}
    options = MessageRowOptions(topics=frozenset(topics))
    assert rows_by_columns(location, part, options) == rows_by_record(location, part, options)
    # as the Parquet export gets them (text of few values as dictionaries): the same rows
    assert rows_by_columns(location, part, MessageRowOptions(), coded=True) == plain, label
    subset = MessageRowOptions(columns=PICKS_AND_TEXT)
    assert rows_by_columns(location, part, subset) == [
        {name: row[name] for name in PICKS_AND_TEXT} for row in plain
    ], label
    return len(plain)


@compiled_pass_only
def test_every_seed_exports_as_decoded_record_by_record(seeds, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    exported = 0
    for number, (name, data, base) in enumerate(seeds):
        location, part = one_file_store(tmp_path / str(number), data, base)
        exported += assert_same_rows(location, part, name)
    assert exported > 5000


@compiled_pass_only
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])  # fmt: skip
@given(st.data())
def test_mutated_seeds_export_as_decoded_record_by_record(seeds, tmp_path: Path, data) -> None:  # type: ignore[no-untyped-def]
    name, content, base = seeds[data.draw(st.integers(0, len(seeds) - 1), label="seed")]
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1)))
    root = tmp_path / f"m{rng.randrange(10**9)}"
    location, part = one_file_store(root, mutate(content, base, rng), base)
    assert_same_rows(location, part, f"{name} mutated")


def pairs(count: int) -> bytes:
    """``count`` properties with distinct two-letter names (five bytes each)."""
    letters = [bytes([c]) for c in range(0x21, 0x7F)]
    names = [a + b for a in letters for b in letters][:count]
    return b"".join(name + b"\x01v\x02" for name in names)


def records(messages: list[Message]) -> bytes:
    data = bytearray()
    for message in messages:
        message.physical_offset = len(data)
        data += encode_record(message)
    return bytes(data)


def test_rare_text_and_properties(tmp_path: Path) -> None:
    ipv6 = parse_host("[2001:db8::7]:10911")
    many = pairs(5000)
    messages = [
        Message("T", b"x", properties_bytes=b"TAGS\x01\xff\xfe\x02KEYS\x01a  b\x02"),
        Message("T", b"", properties_bytes=b"A\x011\x02B\x012\x02A\x013\x02\x01x\x02y\x01\x02"),
        Message("T", b"y", properties_bytes=b"\xc3\x28\x01v\x02TAGS\x01t\x02", born_host=ipv6),
        Message("T", b"z", properties_bytes=many, store_host=ipv6),
        Message("T", b"w", properties_bytes=many + b"TAGS\x01last\x02"),
        Message(SCHEDULE_TOPIC, b"d", properties_bytes=b"DELAY\x01x\x02TAGS\x01a\x02"),
        Message(SCHEDULE_TOPIC, b"d", properties_bytes=b"DELAY\x012\x02", store_timestamp=9),
        Message("Tö", b"u", properties_bytes="TAGS\x01ö\x02UNIQ_KEY\x01u\x02".encode()),
        # 😀 as CESU-8 writes it: Java decodes one U+FFFD per surrogate half, not three
        Message("T", b"c", properties_bytes=b"TAGS\x01\xed\xa0\xbd\xed\xb8\x80\x02"),
    ]
    location, part = one_file_store(tmp_path, records(messages), 0)
    rows = rows_by_columns(location, part, MessageRowOptions(delay_levels="1s 5s"))
    assert len(rows) == len(messages)
    assert rows[0]["tags"] == "\ufffd\ufffd"
    assert rows[1]["properties"] == [("A", "3"), ("B", "2")]
    assert rows[2]["bornHost"] == "[2001:db8::7]:10911"
    assert len(rows[3]["properties"]) == 5000
    assert rows[5]["tagsCode"] is None
    assert rows[8]["tags"] == "\ufffd\ufffd"
    assert rows[8]["tagsCode"] == tags_code("\ufffd\ufffd")
    assert_same_rows(location, part, "rare")


def test_rows_the_kernel_did_not_make_are_refused(tmp_path: Path) -> None:
    from array import array

    from rmqstore import kernel
    from rmqstore.kernel import layout

    _, part = one_file_store(tmp_path, records([Message("T", b"x")]), 0)
    data = (tmp_path / "commitlog" / part.name).read_bytes()
    rows = layout.new_rows(1)
    kernel.scan(data, 0, len(data), 0, 0, 0, rows)
    rows[layout.TOPIC_AT] = len(data) - 1
    rows[layout.TOPIC_LENGTH] = 5
    spans = array("q", bytes(16))
    with pytest.raises(ValueError, match="outside"):
        kernel.field_spans(data, rows, 0, 1, layout.FIELD_TOPIC, spans)
    spans[0], spans[1] = len(data) - 2, 10
    with pytest.raises(ValueError, match="outside"):
        kernel.gather(data, spans, 1, bytearray(100), array("i", bytes(8)))
    spans[0], spans[1] = 0, 10
    with pytest.raises(ValueError, match="fit"):
        kernel.gather(data, spans, 1, bytearray(5), array("i", bytes(8)))
    rows[layout.POSITION] = len(data) - 3
    with pytest.raises(ValueError, match="outside"):
        kernel.message_ids(data, rows, 0, 1, bytearray(100), array("i", bytes(8)))


def test_many_records_with_many_pairs_take_the_record_path(tmp_path: Path) -> None:
    many = pairs(6000)
    messages = [Message("T", b"x", properties_bytes=many) for _ in range(3)]
    location, part = one_file_store(tmp_path, records(messages), 0)
    rows: list[dict[str, Any]] = rows_by_columns(location, part, MessageRowOptions())
    assert [len(row["properties"]) for row in rows] == [6000] * 3
    assert_same_rows(location, part, "many pairs")


def test_tags_codes_of_many_distinct_tags_and_none(tmp_path: Path) -> None:
    """A batch hashes each distinct TAGS once; one with very many distinct tags (here every
    message its own, non-ASCII ones among them) is hashed row by row: the same codes, and 0
    where a message has no TAGS."""
    messages = [
        Message("T", b"x", properties_bytes=f"TAGS\x01tag-{n}{'é' * (n % 3)}\x02".encode())
        if n % 5
        else Message("T", b"x")
        for n in range(3000)
    ]
    location, part = one_file_store(tmp_path, records(messages), 0)
    rows = rows_by_columns(location, part, MessageRowOptions())
    assert [row["tagsCode"] for row in rows] == [tags_code(row["tags"]) for row in rows]
    assert rows[0]["tagsCode"] == 0 and rows[0]["tags"] is None
    assert_same_rows(location, part, "distinct tags")


def gathered_store(tmp_path: Path, oracle, source: str) -> StoreLocation:  # type: ignore[no-untyped-def]
    if source == "multi":
        root = tmp_path / "multi"
        generate("multi", root, FixtureOptions(commitlog_file_size=4096))
        return StoreLocation(str(root))
    root = oracle(source).copy_to(tmp_path / source)
    return StoreLocation(str(root))


@compiled_pass_only
@pytest.mark.parametrize("source", ["multi", "s1_multi", "v533_s1_multi"])
def test_small_files_gathered_hold_the_rows_file_by_file(tmp_path: Path, oracle, source) -> None:  # type: ignore[no-untyped-def]
    """The kernel batches of many small files, gathered into a few Arrow batches, give the
    rows a per-record decode gives file by file, each row naming its own file, and count
    each file's rows that pass the filters."""
    location = gathered_store(tmp_path, oracle, source)
    parts = plan_ranges(location, 0, split_last=False)
    assert len(parts) > 5
    plain = [rows_by_record(location, part, MessageRowOptions()) for part in parts]
    topics = frozenset(row["topic"] for rows in plain for row in rows[::3])
    odd_queues = MessageRowOptions(filters=(RowFilter("queueId", "in", (1, 3)),))
    for options in [*OPTION_SETS, MessageRowOptions(topics=topics), odd_queues]:
        expected = [rows_by_record(location, part, options) for part in parts]
        if options is odd_queues:  # the filter left to the batches, not the scan
            expected = [[row for row in rows if row["queueId"] in (1, 3)] for rows in plain]
        built: list[Any] = []
        gatherer = BatchGatherer(MessageBatcher(options), built.append)
        for number, part in enumerate(parts):
            scan = RangeScan(location, part, options.check_crc, resync_last=options.resync_last)
            for buf, _, rows, count in scan.batches():
                gatherer.add(buf, rows, count, f"commitlog/{part.name}", number)
        gatherer.flush()
        assert [row for batch in built for row in batch.to_pylist()] == [
            row for rows in expected for row in rows
        ], f"{source}: {options}"
        assert len(built) < len(parts) / 5
        assert [gatherer.kept.get(number, 0) for number in range(len(parts))] == [
            len(rows) for rows in expected
        ]
    # through message_batches, coded as the Parquet export builds them
    everything = [row for rows in plain for row in rows]
    coded = message_batches(location, parts, MessageRowOptions(), coded=True)
    assert [row for batch in coded for row in batch.to_pylist()] == everything


def scanned(root: Path, messages: list[Message]) -> tuple[Any, Any, int, int]:
    """A one-file store of ``messages``: the scan's one kernel batch, and the file's size."""
    data = records(messages)
    location, part = one_file_store(root, data, 0)
    scan = RangeScan(location, part, False, resync_last=False, batch_rows=EXPORT_BATCH_ROWS)
    ((buf, _, rows, count),) = list(scan.batches())
    return buf, rows, count, len(data)


@compiled_pass_only
def test_gathering_stops_at_its_row_and_byte_bounds(tmp_path: Path) -> None:
    """Gathered rows are built once they would pass EXPORT_BATCH_ROWS rows or GATHER_BYTES
    of records, and a kernel batch of many rows is built on its own, after those gathered."""
    sizes: list[int] = []
    gatherer = BatchGatherer(
        MessageBatcher(MessageRowOptions()), lambda b: sizes.append(b.num_rows)
    )
    width = layout.ROW_WIDTH
    # 1 KiB bodies, 100 rows (110 KB) a batch, 90 batches: past the byte bound once
    body = bytes(range(256)) * 4
    big = [Message(topic="T", queue_id=0, queue_offset=n, body=body) for n in range(300)]
    buf, rows, count, size = scanned(tmp_path / "big", big)
    for start in [0, 100, 200] * 30:
        gatherer.add(buf, rows[start * width : (start + 100) * width], 100, "commitlog/x")
    gatherer.flush()
    assert sum(sizes) == 9000 and len(sizes) == 2
    assert sizes[0] * size // count <= GATHER_BYTES < (sizes[0] + 100) * size // count
    # empty bodies, 1,000 rows a batch, 20 batches: past the row bound once
    sizes.clear()
    tiny = [Message(topic="T", queue_id=0, queue_offset=n, body=b"") for n in range(5000)]
    buf, rows, count, _ = scanned(tmp_path / "tiny", tiny)
    for _ in range(20):
        gatherer.add(buf, rows[: 1000 * width], 1000, "commitlog/y")
    gatherer.flush()
    assert sizes == [EXPORT_BATCH_ROWS // 1000 * 1000, 20000 - EXPORT_BATCH_ROWS // 1000 * 1000]
    # a kernel batch of many rows: built as it is, after the rows gathered before it
    sizes.clear()
    gatherer.add(buf, rows, 10, "commitlog/y")
    gatherer.add(buf, rows, count, "commitlog/y")
    assert sizes == [10, 5000]
