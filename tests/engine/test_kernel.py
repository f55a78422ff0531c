"""The compiled record kernel against its pure-Python reference: the same rows, stop, position
and CRC verdicts on every real-broker store, every fixture scenario and mutations of them, read
whole and window by window; and the rules that make a record invalid, one by one."""

from __future__ import annotations

import itertools
import os
import random
import struct
import zlib
from array import array
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmqstore import kernel
from rmqstore.hashing import index_key_hash, tags_code
from rmqstore.hosts import parse_host
from rmqstore.kernel import layout, reference
from rmqstore.multidispatch import INNER_MULTI_DISPATCH
from rmqstore.properties import KEYS, TAGS, UNIQ_KEY, decode_properties, split_keys
from rmqstore.record import Message, RegionScan, ScanStop, encode_blank, encode_record
from rmqstore.windows import FileWindows

from kernel_corpus import (
    differences,
    mutate,
    pack_rows,
    run_scan,
)
from support import compiled_pass_only


def load_native() -> ModuleType:
    if os.environ.get("RMQSTORE_KERNEL") == "native":
        from rmqstore.kernel import _native  # make test: the compiled kernel must be there

        return _native
    return pytest.importorskip("rmqstore.kernel._native", reason="compiled kernel not built")


native = load_native()
# a test that runs both kernels itself is the same test in make test's reference pass
both_ways = compiled_pass_only


def test_make_test_runs_the_kernel_it_asks_for() -> None:
    wanted = os.environ.get("RMQSTORE_KERNEL", "auto")
    expected = {"native": "native", "python": "python"}.get(wanted, kernel.NAME)
    assert expected == kernel.NAME
    assert kernel.description().startswith(expected)


@given(st.binary(max_size=300), st.integers(0, 2**32 - 1))
def test_crc32_is_zlibs(data: bytes, start: int) -> None:
    assert native.crc32(data) == zlib.crc32(data)
    assert native.crc32(data, start) == zlib.crc32(data, start)
    assert reference.crc32(data) == zlib.crc32(data)


@both_ways
def test_every_seed_scans_the_same_both_ways(seeds: list[tuple[str, bytes, int]]) -> None:
    assert len(seeds) > 20
    rng = random.Random(1)
    for name, data, base in seeds:
        problems = list(differences(native, data, base, rng))
        assert not problems, f"{name}: {problems}"


@both_ways
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_seeds_scan_the_same_both_ways(seeds, data) -> None:  # type: ignore[no-untyped-def]
    name, content, base = data.draw(st.sampled_from(seeds))
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1)))
    mutated = mutate(content, base, rng)
    problems = list(differences(native, mutated, base, rng))
    assert not problems, f"{name} mutated: {problems}"


def _record(position: int = 0, **changes: object) -> bytes:
    fields = {"topic": "T", "body": b"hello", "physical_offset": position, **changes}
    return encode_record(Message(**fields))  # type: ignore[arg-type]


def _scan_both(data: bytes, options: int = 0, base: int = 0) -> tuple[int, ...]:
    results = [run_scan(impl, data, 0, base, options, 16) for impl in (native, reference)]
    assert results[0] == results[1]
    return results[0][1]


def _set_int(data: bytes, at: int, value: int, fmt: str = ">i") -> bytes:
    changed = bytearray(data)
    struct.pack_into(fmt, changed, at, value)
    return bytes(changed)


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda r: _set_int(r, 4, 0x12345678), layout.Problem.MAGIC),
        (lambda r: _set_int(r, 0, 90), layout.Problem.TOTAL_SIZE_BOUNDS),
        (lambda r: _set_int(r, 0, 2**31 - 1), layout.Problem.TOTAL_SIZE_BOUNDS),
        (lambda r: _set_int(r, 84, -1), layout.Problem.BODY_LENGTH),
        (lambda r: _set_int(r, 84, 2**31 - 1), layout.Problem.BODY_LENGTH),
        (lambda r: r[:93] + b"\xff" + r[94:], layout.Problem.TOPIC_NEGATIVE),
        (lambda r: r[:93] + b"\x7f" + r[94:], layout.Problem.TOPIC_PAST_RECORD),
        (lambda r: _set_int(r, 95, 5, ">h"), layout.Problem.FIELDS_MISMATCH),
        (lambda r: _set_int(r, 28, 4096, ">q"), layout.Problem.PHYSICAL_OFFSET),
        (lambda r: r[:94] + b"\xff" + r[95:], layout.Problem.TOPIC_UTF8),
    ],
)
def test_each_rule_makes_a_record_invalid(damage, problem: layout.Problem) -> None:  # type: ignore[no-untyped-def]
    record = _record()
    assert record[93] == 1  # V1 topic length of "T" after the 88-byte header and 5-byte body
    stop, position, _value, _failures, found = _scan_both(damage(record) + bytes(64))
    assert (stop, position, found) == (layout.Stop.INVALID, 0, problem)


def test_surrogates_and_overlong_utf8_are_invalid_topics_as_python_decodes_them() -> None:
    for topic in (b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80", b"\xe2\x82", b"ok\xc3\xa9"):
        body = _record(topic="X" * len(topic))
        at = body.index(b"X" * len(topic))
        data = body[:at] + topic + body[at + len(topic) :]
        stop, *_rest, found = _scan_both(data)
        valid = True
        try:
            topic.decode("utf-8")
        except UnicodeDecodeError:
            valid = False
        assert (stop == layout.Stop.END) is valid, topic
        assert found == (layout.Problem.NONE if valid else layout.Problem.TOPIC_UTF8)


def test_crc_rules() -> None:
    good = _record()
    bad = _set_int(good, 8, 1)
    assert _scan_both(bad, layout.CHECK_CRC)[3] == 1  # counted, not a stop
    stop, position, _value, failures, problem = _scan_both(
        bad, layout.CHECK_CRC | layout.STOP_ON_CRC_ERROR
    )
    assert (stop, position, failures, problem) == (
        layout.Stop.INVALID,
        0,
        1,
        layout.Problem.BODY_CRC,
    )
    empty = _set_int(_record(body=b""), 8, 12345)  # the broker checks no CRC for an empty body
    assert _scan_both(empty, layout.CHECK_CRC | layout.STOP_ON_CRC_ERROR)[0] == layout.Stop.END
    with_property = encode_record(Message(topic="T", body=b"x"), append_crc_property=True)
    options = layout.CHECK_CRC | layout.STOP_ON_CRC_ERROR | layout.PROPERTY_CRC
    assert _scan_both(with_property, options)[0] == layout.Stop.END
    assert _scan_both(good, options)[4] == layout.Problem.PROPERTY_CRC  # no property at all
    wrong_digit = bytearray(with_property)
    wrong_digit[-2] = ord("9") if wrong_digit[-2] != ord("9") else ord("8")
    assert _scan_both(bytes(wrong_digit), options)[4] == layout.Problem.PROPERTY_CRC


def test_ipv6_v2_and_blank() -> None:
    v6 = parse_host("[2001:db8::1]:10911")
    first = encode_record(Message(topic="%RETRY%" + "g" * 130, version=2, born_host=v6))
    second = encode_record(Message(topic="T", body=b"b", store_host=v6, physical_offset=len(first)))
    data = first + second + encode_blank(40) + bytes(32)
    rows, final = run_scan(native, data, 0, 0, layout.CHECK_CRC, 4)
    assert [row[layout.VERSION] for row in rows] == [2, 1]
    assert [row[layout.HEADER_SIZE] for row in rows] == [100, 100]
    assert final[:3] == (layout.Stop.BLANK, len(first) + len(second), 40)
    assert (rows, final) == run_scan(reference, data, 0, 0, layout.CHECK_CRC, 4)


def test_bounds_and_capacity() -> None:
    rows = layout.new_rows(1)
    for impl in (native, reference):
        with pytest.raises(ValueError):
            impl.scan(b"abc", 0, 4, 0, 0, 0, rows)
        with pytest.raises(ValueError):
            impl.scan(b"abc", 2, 1, 0, 0, 0, rows)
        assert impl.scan(b"", 0, 0, 0, 0, 0, rows)[:2] == (0, layout.Stop.END)
        assert impl.scan(_record(), 0, 10, 0, 0, 0, layout.new_rows(0))[1] == layout.Stop.ROWS_FULL


def test_a_file_that_shrinks_while_it_is_read_names_the_file(tmp_path: Path) -> None:
    records = b"".join(_record(position=i * len(_record())) for i in range(200))
    path = tmp_path / "00000000000000000000"
    path.write_bytes(records + bytes(4096))
    with FileWindows(path, 1 << 20, window_bytes=1024) as windows:
        scan = RegionScan(None, 0, windows.limit, 0, windows=windows)
        items = iter(scan)
        next(items)
        os.truncate(path, 2048)  # another process cuts the file
        with pytest.raises(Exception) as caught:
            list(items)
    assert caught.type.__name__ == "StoreIOError"
    assert str(path) in str(caught.value) and "truncated" in str(caught.value)


def test_windowed_region_scan_equals_whole(tmp_path: Path) -> None:
    data = bytearray()
    for i in range(300):
        body = b"b" * (i * 37 % 900)
        data += encode_record(Message(topic=f"T{i % 3}", body=body, physical_offset=len(data)))
    data += encode_blank(100) + bytes(92)
    path = tmp_path / "00000000000000000000"
    path.write_bytes(data)
    whole = RegionScan(bytes(data), 0, len(data), 0, check_crc=True)
    expected = list(whole)
    with FileWindows(path, len(data), window_bytes=512) as windows:
        windowed = RegionScan(None, 0, windows.limit, 0, check_crc=True, windows=windows)
        assert list(windowed) == expected
    assert (windowed.stop, windowed.end_position, windowed.blank_length) == (
        ScanStop.BLANK,
        whole.end_position,
        100,
    )


def test_topic_names_of_runs_and_of_topics_that_differ_in_one_byte() -> None:
    """TopicNames compares a row's topic with the last one in place: runs of one topic,
    topics of one length that differ in a byte, a topic that begins another, and non-ASCII
    topics each come back as the record holds them, from bytes and from a bytearray."""
    names = ["TopicA", "TopicA", "TopicB", "Topic", "TopicAB", "TopicA", "Tópico", "Tópicó"]
    topics = [name for name in names for _ in range(2)]
    data = b""
    for topic in topics:
        data += encode_record(Message(topic=topic, body=b"x", physical_offset=len(data)))
    for window in (bytes(data), bytearray(data)):
        names_of, found = layout.TopicNames(), []
        for buf, _, rows, count in RegionScan(window, 0, len(window), 0).batches():
            found += [names_of.of(buf, rows, row) for row in range(count)]
        assert found == topics


@both_ways
def test_dispatch_preparation_agrees_with_the_reference_rules(
    seeds: list[tuple[str, bytes, int]],
) -> None:
    """Rows the kernel prepares get the tagsCode and index key hashes the reference functions
    (decode_properties, tags_code, index_key_hash) give; the others are flagged."""
    checked = flagged = lmq = 0
    for name, data, base in seeds:
        rows, _final = run_scan(native, data, 0, base, 0, 4096)
        packed = pack_rows(rows)
        out = layout.new_dispatch_out(max(len(rows), 1))
        keys = bytearray(layout.HASHED_KEY_SIZE * 65536)
        done, entries = native.prepare_dispatch(
            data, packed, 0, len(rows), layout.INDEX_KEYS, out, keys
        )
        assert done == len(rows)
        hashed = list(struct.iter_unpack(layout.HASHED_KEY_FORMAT, keys[: entries * 21]))
        for number, row in enumerate(rows):
            at = number * layout.DISPATCH_WIDTH
            topic = data[row[layout.TOPIC_AT] : row[layout.TOPIC_AT] + row[layout.TOPIC_LENGTH]]
            props = data[
                row[layout.PROPERTIES_AT] : row[layout.PROPERTIES_AT]
                + row[layout.PROPERTIES_LENGTH]
            ]
            if INNER_MULTI_DISPATCH in decode_properties(props):  # the caller puts LMQ units
                assert out[at + layout.DISPATCH_FLAGS] & layout.HAS_COPIES, name
                lmq += 1
            else:
                assert not out[at + layout.DISPATCH_FLAGS] & layout.HAS_COPIES, name
            if out[at + layout.DISPATCH_FLAGS] & layout.NEEDS_REFERENCE:
                flagged += 1
                continue
            checked += 1
            properties = decode_properties(props)
            assert out[at + layout.TAGS_CODE] == tags_code(properties.get(TAGS)), name
            expected_keys = []
            if row[layout.SYS_FLAG] & 0xC != 0xC:
                if UNIQ_KEY in properties:
                    expected_keys.append(properties[UNIQ_KEY])
                expected_keys += split_keys(properties.get(KEYS))
            first = out[at + layout.KEYS_FROM]
            got = hashed[first : first + out[at + layout.KEYS_COUNT]]
            topic_text = topic.decode()
            assert [entry[2] for entry in got] == [
                index_key_hash(f"{topic_text}#{key}") for key in expected_keys
            ], name
            assert [entry[3] for entry in got] == [1] + [0] * (len(got) - 1) if got else True
            assert {(entry[0], entry[1]) for entry in got} <= {
                (row[layout.PHYSICAL_OFFSET], row[layout.STORE_TIMESTAMP])
            }
    assert checked > 1000 and flagged > 10 and lmq > 10


def _index_buffer(slots: int, entries: int) -> bytearray:
    return bytearray(40 + 4 * slots + 20 * entries)


@both_ways
@given(st.data())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_index_application_writes_the_same_bytes_both_ways(seeds, data) -> None:  # type: ignore[no-untyped-def]
    """Keys of a seed applied to an index file by both kernels, with files small enough to
    fill and reservations small enough to run out: the same file bytes, state and stops."""
    name, content, base = data.draw(st.sampled_from(seeds))
    rows, _final = run_scan(reference, content, 0, base, 0, 4096)
    packed = pack_rows(rows)
    out = layout.new_dispatch_out(max(len(rows), 1))
    keys = bytearray(layout.HASHED_KEY_SIZE * 65536)
    _done, entries = reference.prepare_dispatch(
        content, packed, 0, len(rows), layout.INDEX_KEYS, out, keys
    )
    slots = data.draw(st.sampled_from((1, 7, 64)))
    limit = data.draw(st.sampled_from((2, 50, 4000)))
    step = data.draw(st.sampled_from((1, 16, 100000)))
    begin_offset = data.draw(st.sampled_from((0, base, base + 5000)))
    results = []
    for implementation in (reference, native):
        files = []
        buf = _index_buffer(slots, limit)
        state = array("q", [1, 0, 0, 0, begin_offset, 0, 0, 0, 0])
        reserved = step
        number = 0
        stops = []
        while True:
            number, reason = implementation.apply_index(
                buf, slots, 40 + 4 * slots, limit, reserved, state, keys, number, entries
            )
            stops.append((number, reason))
            if reason == layout.APPLIED_ALL:
                break
            if reason == layout.NEEDS_RESERVE:
                reserved += step
            else:  # full: a new file carries the end offset on, as IndexFile.create does
                files.append(bytes(buf))
                buf = _index_buffer(slots, limit)
                end = state[layout.STATE_END_OFFSET]
                state[0:7] = array("q", [1, 0, 0, 0, end, state[5], 0])
                reserved = step
        files.append(bytes(buf))
        results.append((files, list(state), stops))
    assert results[0] == results[1], name


_UNIT_VALUES = st.tuples(
    st.sampled_from((0, 1, 500, 2**40, -1, -(2**63), 2**63 - 1)) | st.integers(-10, 10**6),
    st.sampled_from((0, 1, 100, -1, 2**31 - 1, -(2**31))),
    st.integers(-(2**63), 2**63 - 1),
)


@both_ways
@given(st.lists(_UNIT_VALUES, max_size=40), st.integers(-5, 10**6), st.integers(0, 19))
def test_queue_file_scans_agree(units, physical_offset: int, torn: int) -> None:  # type: ignore[no-untyped-def]
    """Units a queue-file scan counts as valid, and where truncation would cut, both ways
    (with a torn unit at the end now and then)."""
    data = b"".join(struct.pack(">qiq", *unit) for unit in units) + bytes(torn)
    assert native.valid_units(data) == reference.valid_units(data)
    assert native.cut_index(data, physical_offset) == reference.cut_index(data, physical_offset)


_ENTRY_VALUES = st.tuples(
    st.sampled_from((0, 1, 7, 2**31 - 1, -1, -(2**31))) | st.integers(0, 1000),
    st.integers(-5, 10**6),
    st.sampled_from((0, 1, -1, 2**31 - 1)),
    st.integers(-2, 12),
)


@both_ways
@given(st.lists(_ENTRY_VALUES, max_size=60), st.integers(1, 9), st.integers(0, 60))
def test_index_chain_walks_agree(entries, slots: int, split: int) -> None:  # type: ignore[no-untyped-def]
    """The chain walk of a verify, both ways, over entries cut into two calls anywhere."""
    data = b"".join(struct.pack(">iqii", *entry) for entry in entries)
    results = []
    for implementation in (reference, native):
        newest = array("i", bytes(4 * slots))
        chain = array("q", [-1, 0, -1, 0, 0])
        bad = array("q", bytes(8 * layout.BAD_WIDTH * 3))
        cut = min(split, len(entries)) * 20
        found = [
            implementation.index_chain(data[:cut], 1, slots, newest, chain, bad, 3),
        ]
        first_bad = list(bad[: found[0] * layout.BAD_WIDTH])
        found.append(
            implementation.index_chain(data[cut:], 1 + cut // 20, slots, newest, chain, bad, 2)
        )
        results.append((found, first_bad, list(bad[: found[1] * layout.BAD_WIDTH]), newest, chain))
    assert results[0] == results[1]


@both_ways
@given(
    st.lists(st.tuples(st.integers(0, 2**31 - 1), st.integers(-1, 10**9)), max_size=30), st.data()
)
def test_key_matching_agrees(pairs, data) -> None:  # type: ignore[no-untyped-def]
    keys = b"".join(
        struct.pack(layout.HASHED_KEY_FORMAT, offset, 5, key_hash, 1) for key_hash, offset in pairs
    )
    stored = list(pairs)
    if stored and data.draw(st.booleans()):
        at = data.draw(st.integers(0, len(stored) - 1))
        stored[at] = (stored[at][0] ^ data.draw(st.sampled_from((0, 1))), stored[at][1])
    entries = b"".join(struct.pack(">iqii", key_hash, offset, 0, 0) for key_hash, offset in stored)
    first = data.draw(st.integers(0, len(pairs)))
    count = data.draw(st.integers(0, len(pairs) - first))
    expected = reference.match_keys(keys, first, count, entries)
    assert native.match_keys(keys, first, count, entries) == expected


def test_row_columns_are_copied_out_as_arrow_integers() -> None:
    width = layout.ROW_WIDTH
    rows = array("q", range(3 * width))
    rows[width + layout.QUEUE_ID] = -(1 << 31)
    rows[2 * width + layout.QUEUE_ID] = (1 << 31) - 1
    rows[2 * width + layout.PHYSICAL_OFFSET] = 1 << 40
    rows[width + layout.FLAG] = 1 << 33
    for impl in (native, reference):
        out = bytearray(12)
        impl.row_columns(rows, 0, 3, array("q", [layout.QUEUE_ID, 4, 0]), out)
        assert list(array("i", bytes(out))) == [layout.QUEUE_ID, -(1 << 31), (1 << 31) - 1]
        # two columns in one pass, each at its own offset
        out = bytearray(40)
        both = array("q", [layout.PHYSICAL_OFFSET, 8, 0, layout.QUEUE_ID, 4, 24])
        impl.row_columns(rows, 1, 3, both, out)
        assert list(array("q", bytes(out[:16]))) == [width + layout.PHYSICAL_OFFSET, 1 << 40]
        assert list(array("i", bytes(out[24:32]))) == [-(1 << 31), (1 << 31) - 1]
        with pytest.raises(ValueError, match="row 2: 1099511627776 does not fit in 32 bits"):
            impl.row_columns(rows, 0, 3, array("q", [layout.PHYSICAL_OFFSET, 4, 0]), bytearray(12))
        # the first refusal row by row: row 1's FLAG before row 2's PHYSICAL_OFFSET
        narrow = array("q", [layout.PHYSICAL_OFFSET, 4, 0, layout.FLAG, 4, 12])
        with pytest.raises(ValueError, match="row 1: 8589934592 does not fit in 32 bits"):
            impl.row_columns(rows, 0, 3, narrow, bytearray(24))
        for call in (
            (rows, 0, 3, array("q", [layout.QUEUE_ID, 4, 0]), bytearray(11)),  # too small
            (rows, 0, 3, array("q", [layout.QUEUE_ID, 4, 4]), bytearray(12)),  # past the end
            (rows, 0, 1, array("q", [layout.QUEUE_ID, 4, 2]), bytearray(8)),  # misaligned
            (rows, 0, 1, array("q", [layout.QUEUE_ID, 4, -4]), bytearray(8)),
            (rows, 0, 4, array("q", [layout.QUEUE_ID, 4, 0]), bytearray(16)),  # no such rows
            (rows, 2, 1, array("q", [layout.QUEUE_ID, 4, 0]), bytearray(16)),
            (rows, 0, 1, array("q", [width, 8, 0]), bytearray(8)),  # no such column
            (rows, 0, 1, array("q", [-1, 8, 0]), bytearray(8)),
            (rows, 0, 1, array("q", [0, 2, 0]), bytearray(8)),  # no such width
            (rows, 0, 1, array("q", [0, 8]), bytearray(8)),  # not triples
        ):
            with pytest.raises(ValueError):
                impl.row_columns(*call)


def test_text_rows_join_literals_and_columns_and_refuse_what_lies_outside() -> None:
    data = b"abcdef\x00\xff"
    narrow, wide = array("i", [0, 2, 2, 8]), array("q", [1, 3, 6, 8])
    numbers = array("q", [0, -1, 2**63 - 1, -(2**63)])
    parts = [b"<", (layout.TEXT_AS_IS, 4, narrow, data, 0), b"|",
             (layout.TEXT_BASE64, 8, wide, data, 0), b"|",
             (layout.TEXT_DECIMAL, 8, numbers, b"", 1), b">\n"]  # fmt: skip
    expected = (
        b"<ab|YmM=|-1>\n<|ZGVm|9223372036854775807>\n<cdef\x00\xff|AP8=|-9223372036854775808>\n"
    )
    for impl in (native, reference):
        out = bytearray(b"kept:")
        assert impl.text_rows(parts, 3, out) == len(expected)
        assert out == b"kept:" + expected
        for bad in (
            [(layout.TEXT_AS_IS, 4, narrow, data, 1)],  # offsets fewer than the rows
            [(layout.TEXT_AS_IS, 4, array("i", [0, 9, 9, 9]), data, 0)],  # past the data
            [(layout.TEXT_AS_IS, 4, array("i", [2, 1, 3, 4]), data, 0)],  # decreasing
            [(layout.TEXT_AS_IS, 4, array("i", [-1, 1, 3, 4]), data, 0)],
            [(layout.TEXT_DECIMAL, 8, numbers, b"", 2)],  # values fewer than the rows
            [(3, 4, narrow, data, 0)],  # no such encoding
            [(layout.TEXT_AS_IS, 2, narrow, data, 0)],  # no such width
            [(layout.TEXT_AS_IS, 4, narrow, data, -1)],
            [(layout.TEXT_AS_IS, 4, narrow, data)],  # not a part
            [bytearray(b"x")],
        ):
            out = bytearray(b"kept")
            with pytest.raises(ValueError):
                impl.text_rows([b"x", *bad], 3, out)
            assert out == b"kept"  # nothing written before the error
        for count in (-1, (1 << 60) + 1, 1 << 63):
            with pytest.raises((ValueError, OverflowError)):
                impl.text_rows([b"x"], count, bytearray())


@pytest.mark.parametrize("where", [0, 7, 8, 15, 16, 20])
def test_ascii_only_finds_a_high_byte_anywhere(where: int) -> None:
    for impl in (native, reference):
        data = bytearray(b"a" * 21)
        assert impl.ascii_only(data, 21)
        data[where] = 0xC3
        assert not impl.ascii_only(data, 21)
        assert impl.ascii_only(data, where)  # the bytes before it
        assert impl.ascii_only(memoryview(array("b", data)), where)  # any item format
        with pytest.raises(ValueError):
            impl.ascii_only(data, 22)
        with pytest.raises(ValueError):
            impl.ascii_only(data, -1)


def test_host_keys_read_ipv4_fields_and_stop_at_ipv6() -> None:
    v4 = parse_host("10.0.0.7:10911")
    v6 = parse_host("[2001:db8::1]:10911")
    data = b""
    for born in (v4, v4, v6):
        data += encode_record(
            Message(topic="T", body=b"x", born_host=born, physical_offset=len(data))
        )
    rows = layout.new_rows(8)
    count = native.scan(data, 0, len(data), 0, 0, 0, rows)[0]
    assert count == 3
    for impl in (native, reference):
        keys = array("q", bytes(8 * 3))
        assert impl.host_keys(data, rows, 0, count, layout.FIELD_BORN_HOST, keys) == 2
        assert keys[0] == keys[1] == int.from_bytes(v4.to_field(), "big", signed=True)
        assert impl.host_keys(data, rows, 0, count, layout.FIELD_STORE_HOST, keys) == 3
        with pytest.raises(ValueError):
            impl.host_keys(data, rows, 0, count, layout.FIELD_TOPIC, keys)
        with pytest.raises(ValueError):
            impl.host_keys(data, rows, 0, count, layout.FIELD_BORN_HOST, array("q", [0]))
        with pytest.raises(ValueError):  # a row that points past the buffer
            impl.host_keys(data[:100], rows, 0, count, layout.FIELD_STORE_HOST, keys)


@pytest.mark.parametrize("implementation", [reference, native], ids=["reference", "native"])
def test_records_at_stops_at_the_first_span_that_is_not_a_record_of_the_queue(
    implementation: ModuleType,
) -> None:
    """``records_at`` decodes records where consume-queue units say they are, each exactly
    one whole record of the unit's size, of the queue and topic asked for: the first span
    that is not (another size or queue or topic, inside a record, past the buffer, a size of
    0 or less) ends it, and it returns how many came before."""
    records = [
        encode_record(
            Message(topic="T", queue_id=queue, body=b"x" * 10, physical_offset=100 + 200 * n)
        )
        for n, queue in enumerate((1, 1, 2, 1))
    ]
    assert all(len(record) < 200 for record in records)
    data = b"".join(record + bytes(200 - len(record)) for record in records)
    sizes = [len(record) for record in records]

    def decoded(pairs: list[tuple[int, int]], queue_id: int = 1, topic: bytes = b"T") -> int:
        spans = array("q", [value for pair in pairs for value in pair])
        rows = layout.new_rows(max(len(pairs), 1))
        return implementation.records_at(data, spans, len(pairs), 100, queue_id, topic, rows)

    assert decoded([(0, sizes[0]), (200, sizes[1]), (600, sizes[3])]) == 3
    assert decoded([(0, sizes[0]), (400, sizes[2])]) == 1  # queue 2's record
    assert decoded([(400, sizes[2])], queue_id=2) == 1
    assert decoded([(0, sizes[0])], topic=b"U") == 0
    assert decoded([(0, sizes[0])], topic=b"") == 0
    assert decoded([(0, sizes[0] + 1)]) == 0  # a size off by one
    assert decoded([(0, sizes[0] - 1)]) == 0
    assert decoded([(4, sizes[0])]) == 0  # inside the record
    assert decoded([(0, sizes[0]), (len(data) - 10, 20)]) == 1  # past the buffer
    assert decoded([(-(1 << 62), sizes[0])]) == 0
    assert decoded([(0, 0)]) == 0 and decoded([(0, -(1 << 31))]) == 0
    assert decoded([]) == 0
    with pytest.raises(ValueError):
        implementation.records_at(data, array("q", [0, sizes[0]] * 2), 2, 100, 1, b"T",
                                  layout.new_rows(1))  # fmt: skip


def _queue_rows(queue_offsets: list[int]) -> array:
    """Rows of records of queue 0 of topic ``T`` (the first byte of a one-byte buffer)
    with these queue offsets, 100 bytes each from offset 0."""
    rows = []
    for number, queue_offset in enumerate(queue_offsets):
        row = [0] * layout.ROW_WIDTH
        row[layout.TOPIC_AT], row[layout.TOPIC_LENGTH] = 0, 1
        row[layout.QUEUE_OFFSET] = queue_offset
        row[layout.PHYSICAL_OFFSET], row[layout.TOTAL_SIZE] = 100 * number, 100
        rows.extend(row)
    return array("q", rows)


@pytest.mark.parametrize(
    ("queue_offsets", "runs"),
    [
        ([2**63 - 2, 2**63 - 1], 1),
        ([2**63 - 1, -(2**63)], 2),  # first + units would overflow a long: no run goes on
        ([-(2**63), -(2**63) + 1, 0], 2),
        ([5, 7, 8], 2),
    ],
)
def test_queue_and_copy_runs_at_the_ends_of_a_long(queue_offsets: list[int], runs: int) -> None:
    """A run goes on only with the next queue offset, in both kernels, even where ``first +
    units`` is past a long (the compiled kernel added them as signed integers: undefined in
    C, found by the fuzz campaign's UBSan)."""
    rows = _queue_rows(queue_offsets)
    count = len(queue_offsets)
    for impl in (native, reference):
        found = impl.queue_runs(
            b"T", rows, 0, count, layout.new_dispatch_out(count), bytearray(20 * count),
            array("q", bytes(8 * layout.RUN_WIDTH * 8)), array("q", bytes(8 * count)),
        )  # fmt: skip
        assert found == (count, runs), impl
    # the same offsets as INNER_MULTI_QUEUE_OFFSET pieces of an LMQ queue (non-negative ones)
    kept = [offset for offset in queue_offsets if offset >= 0]
    buf = bytearray(b"T")
    copy_rows = []
    for number, offset in enumerate(kept):
        piece = b"INNER_MULTI_DISPATCH\x01%%LMQ%%q\x02INNER_MULTI_QUEUE_OFFSET\x01%d\x02" % offset
        row = [0] * layout.ROW_WIDTH
        row[layout.TOPIC_LENGTH] = 1
        row[layout.PROPERTIES_AT], row[layout.PROPERTIES_LENGTH] = len(buf), len(piece)
        row[layout.PHYSICAL_OFFSET], row[layout.TOTAL_SIZE] = 100 * number, 100
        copy_rows.extend(row)
        buf += piece
    tables = len(kept)
    results = [
        impl.copy_runs(
            bytes(buf),
            array("q", copy_rows),
            array("q", range(tables)),
            layout.new_dispatch_out(tables),
            bytearray(20 * tables),
            array("q", bytes(8 * layout.COPY_RUN_WIDTH * 8)),
            array("q", bytes(16 * tables)),
        )
        for impl in (native, reference)
    ]
    breaks = sum(1 for a, b in itertools.pairwise(kept) if b != a + 1)
    assert results[0] == results[1] == (tables, (breaks + 1) if kept else 0, tables)
