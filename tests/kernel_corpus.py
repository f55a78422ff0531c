"""The record kernel's test corpus and its differential check, shared by the differential tests
(tests/engine/test_kernel.py) and the sanitizer fuzz run (tests/kernel_fuzz.py, ``make
fuzz-native``): the commit-log files of every real-broker store and every fixture scenario,
mutated the ways damaged disks and hostile writers mutate them, each scanned by both kernels
whole and window by window."""

from __future__ import annotations

import random
import struct
import tarfile
import tempfile
from array import array
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from types import ModuleType

from rmqstore.fixtures import SCENARIOS, FixtureOptions, generate
from rmqstore.kernel import reference
from rmqstore.kernel.layout import (
    CHECK_CRC,
    FIELD_BORN_HOST,
    FIELD_KEYS,
    FIELD_STORE_HOST,
    FIELD_TAGS,
    FIELD_TOPIC,
    FIELD_UNIQ_KEY,
    FORCE_PROPERTY_CRC,
    HASHED_KEY_SIZE,
    MESSAGE_ID_MAX,
    PHYSICAL_OFFSET,
    PICKED_WIDTH,
    POSITION,
    PROPERTIES_AT,
    PROPERTIES_LENGTH,
    PROPERTY_CRC,
    QUEUE_ID,
    ROW_WIDTH,
    RUN_WIDTH,
    SCHEDULED_ONLY,
    STOP_ON_CRC_ERROR,
    SYS_FLAG,
    TEXT_AS_IS,
    TEXT_BASE64,
    TEXT_DECIMAL,
    TOPIC_AT,
    TOPIC_LENGTH,
    TOTAL_SIZE,
    UNIT_SIZE,
    Stop,
    new_dispatch_out,
    new_rows,
    rows_bytes,
)

from support import ORACLE_ARCHIVES

OPTION_SETS = (
    0,
    CHECK_CRC,
    CHECK_CRC | STOP_ON_CRC_ERROR,
    CHECK_CRC | PROPERTY_CRC,
    CHECK_CRC | STOP_ON_CRC_ERROR | PROPERTY_CRC,
)
EXTREME_INTS = (0, -1, 1, 2**31 - 1, -(2**31), 91, 7)
EXTREME_SHORTS = (0, -1, 32767, -32768, 255, 127, 128)


class Seeds(list):
    """The seed files, with a short repr (hypothesis prints the arguments of a failure)."""

    def __repr__(self) -> str:
        return f"<{len(self)} commit-log files>"


def seed_files(workdir: Path) -> list[tuple[str, bytes, int]]:
    """``(name, file bytes, physical offset of its first byte)`` for every commit-log file of
    the oracle stores and the fixture scenarios (generated into ``workdir``)."""
    seeds: list[tuple[str, bytes, int]] = []
    for archive in sorted(ORACLE_ARCHIVES.glob("*.tar.gz")):
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                parts = Path(member.name).parts
                if member.isfile() and len(parts) >= 2 and parts[-2] == "commitlog":
                    data = tar.extractfile(member).read()  # type: ignore[union-attr]
                    seeds.append((f"{archive.name}:{member.name}", data, int(parts[-1])))
    seeds.append(("crafted text cells", crafted_text_records(), 0))
    for name in SCENARIOS:
        out = workdir / name
        small = name == "large"  # the benchmark shape, kept small: 1 GiB files are no seed
        options = FixtureOptions(messages=300, commitlog_file_size=65536) if small else None
        generate(name, out, options or FixtureOptions())
        for path in sorted((out / "commitlog").iterdir()):
            seeds.append((f"scenario {name}:{path.name}", path.read_bytes(), int(path.name)))
    return Seeds(seeds)


_AWKWARD_TEXTS = ("a,b", 'say "hi"', "two\nlines", "cr\rhere", "tab\there", "nul\x00", "é😀", '"')


def crafted_text_records() -> bytes:
    """Records whose bodies, tags, keys and properties hold what text output must escape or
    quote (delimiters, quotes, line breaks, zero bytes, characters beyond ASCII)."""
    from rmqstore.properties import encode_properties
    from rmqstore.record import Message, encode_record

    data = bytearray()
    for number, text in enumerate(_AWKWARD_TEXTS * 2):
        properties = {"TAGS": text, "KEYS": text, text: text} if number % 2 else {"n": text}
        body = text.encode("utf-8") if number < len(_AWKWARD_TEXTS) else b"\r\xff" + bytes([number])
        message = Message(
            topic="Cells",
            body=body,
            properties=properties,
            properties_bytes=encode_properties(properties),
            physical_offset=len(data),
            queue_offset=number,
        )
        data += encode_record(message)
    return bytes(data)


def scenario_workdir() -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix="rmqstore-kernel-corpus-")


def record_positions(data: bytes, base: int) -> list[tuple[int, int, int]]:
    """``(record start, topic length at, properties length at)`` of the valid records."""
    rows = new_rows(1024)
    found = []
    position = 0
    while True:
        count, stop, position, *_ = reference.scan(data, position, len(data), base, 0, 0, rows)
        for index in range(count):
            row = rows[index * ROW_WIDTH : (index + 1) * ROW_WIDTH]
            version = row[2]
            found.append((row[0], row[TOPIC_AT] - version, row[PROPERTIES_AT] - 2))
        if stop != Stop.ROWS_FULL:
            return found


def mutate(data: bytes, base: int, rng: random.Random) -> bytes:
    """One to three damages of the kinds a reader meets: bit flips, a truncated tail, zeroed
    ranges, and length fields (TOTALSIZE, BODYLENGTH, topic and properties lengths) set to
    extremes."""
    mutated = bytearray(data)
    records = record_positions(data, base) if data else []
    for _ in range(rng.randint(1, 3)):
        kind = rng.randrange(6) if records else rng.randrange(3)
        if not mutated:
            break
        if kind == 0:  # bit flips
            for _ in range(rng.randint(1, 8)):
                at = rng.randrange(len(mutated))
                mutated[at] ^= 1 << rng.randrange(8)
        elif kind == 1:  # truncation
            del mutated[rng.randrange(len(mutated)) :]
        elif kind == 2:  # a zeroed range
            at = rng.randrange(len(mutated))
            mutated[at : at + rng.randint(1, 512)] = bytes(min(512, len(mutated) - at))
            del mutated[len(data) :]
        else:
            start, topic_length_at, properties_length_at = rng.choice(records)
            if kind == 3:  # TOTALSIZE or BODYLENGTH
                field_at = rng.choice((start, start + 84))
                if field_at + 4 <= len(mutated):
                    struct.pack_into(">i", mutated, field_at, rng.choice(EXTREME_INTS))
            elif kind == 4:  # topic length (1 byte in V1, the first of 2 in V2)
                if topic_length_at < len(mutated):
                    mutated[topic_length_at] = rng.choice((0, 127, 128, 255, 1))
            elif properties_length_at + 2 <= len(mutated):  # properties length
                struct.pack_into(">h", mutated, properties_length_at, rng.choice(EXTREME_SHORTS))
    return bytes(mutated)


def run_scan(
    kernel: ModuleType,
    data: bytes,
    start: int,
    base: int,
    options: int,
    capacity: int,
    window: int | None = None,
) -> tuple[list[tuple[int, ...]], tuple[int, ...]]:
    """Scan ``data`` from ``start`` to a stop other than ``ROWS_FULL``/``MORE_DATA``, reading
    it whole or, with ``window``, in windows as rmqstore.windows.FileWindows does. Returns the
    rows (positions made absolute) and the final ``(stop, position, value, crc failures,
    problem)`` (position absolute, failures summed)."""
    rows = new_rows(capacity)
    found: list[tuple[int, ...]] = []
    failures = 0
    position = start
    need = 0
    while True:
        if window is None:
            window_start, window_end = 0, len(data)
        else:
            window_start = position
            window_end = min(len(data), position + max(window, need))
        buf = data[window_start:window_end]
        count, stop, end, value, failed, problem = kernel.scan(
            buf,
            position - window_start,
            len(buf),
            base + window_start,
            len(data) - window_end,
            options,
            rows,
        )
        failures += failed
        # one call's rows lie back to back (what layout.rows_bytes counts on)
        sizes = sum(rows[TOTAL_SIZE : count * ROW_WIDTH : ROW_WIDTH])
        assert rows_bytes(rows, count) == sizes, "a scan's rows are not back to back"
        for index in range(count):
            row = list(rows[index * ROW_WIDTH : (index + 1) * ROW_WIDTH])
            for column in (0, TOPIC_AT, PROPERTIES_AT):
                row[column] += window_start
            found.append(tuple(row))
        position = window_start + end
        if stop == Stop.ROWS_FULL:
            need = 0
            continue
        if stop == Stop.MORE_DATA:
            assert window is not None, "MORE_DATA from a whole-buffer scan"
            assert value > len(buf) - (position - window_start), "MORE_DATA for bytes it had"
            need = value
            continue
        return found, (stop, position, value, failures, problem)


def differences(native: ModuleType, data: bytes, base: int, rng: random.Random) -> Iterator[str]:
    """Every way the two kernels (and whole against windowed reading) disagree on ``data``."""
    start = 0
    if data and rng.random() < 0.25:
        start = rng.randrange(len(data))
    for options in OPTION_SETS:
        capacity = rng.choice((1, 3, 64))
        expected = run_scan(reference, data, start, base, options, capacity)
        got = run_scan(native, data, start, base, options, capacity)
        if got != expected:
            yield f"native differs from reference (options {options}, start {start})"
        window = rng.choice((8, 100, 200, 4096))
        windowed = run_scan(native, data, start, base, options, capacity, window)
        if windowed != expected:
            yield f"windowed ({window}) differs from whole (options {options}, start {start})"
    yield from dispatch_both(native, data, base, rng.choice((0, 1)), rng.choice((1, 3, 4096)))
    yield from columns_both(native, data, base, rng.choice((1, 4, 4096)))
    yield from pack_both(native, rng)
    yield from lines_both(native, data, base)
    yield from message_lines_both(native, data, base, rng.randrange(5))
    yield from message_rows_both(native, data, base, rng)
    yield from documents_both(native, rng)
    yield from records_at_both(native, data, base, rng)
    yield from record_items_both(native, data, base, rng)
    yield from row_copies_both(native, data, base, rng)
    yield from copy_runs_both(native, data, base, rng)
    yield from copy_stops_both(native, data, base, rng)
    yield from text_rows_both(native, data, rng)


def records_at_both(
    native: ModuleType, data: bytes, base: int, rng: random.Random
) -> Iterator[str]:
    """How ``records_at`` differs between the kernels on spans of ``data`` as consume-queue
    units give them: the records' own (start and size), of one queue and topic or not, and
    spans moved, resized, out of the buffer, empty or negative."""
    rows = new_rows(4096)
    records = []
    position = 0
    while True:  # (start, size, queue id, topic) of each record a scan accepts
        count, stop, position, *_ = reference.scan(data, position, len(data), base, 0, 0, rows)
        for index in range(count):
            row = rows[index * ROW_WIDTH : (index + 1) * ROW_WIDTH]
            topic = data[row[TOPIC_AT] : row[TOPIC_AT] + row[TOPIC_LENGTH]]
            records.append((row[0], row[1], row[4], topic))
        if stop != Stop.ROWS_FULL:
            break
    if records:
        _start, _size, queue_id, topic = rng.choice(records)
    else:
        queue_id, topic = rng.randrange(-1, 4), rng.choice((b"", b"TopicTest"))
    spans = array("q")
    for start, size, record_queue, record_topic in records:
        if rng.random() < 0.5 and (record_queue, record_topic) != (queue_id, topic):
            continue  # mostly the one queue's records, as a queue's units point at them
        kind = rng.randrange(12)
        if kind == 0:
            start += rng.choice((-1, 1, -8, 8))
        elif kind == 1:
            size += rng.choice((-1, 1, -size, 1 << 20))
        elif kind == 2:
            start = rng.choice((-1, len(data), len(data) - 1, -(1 << 62)))
        elif kind == 3:
            size = rng.choice((0, -1, -(1 << 31)))
        spans.extend((start, size))
    count = len(spans) // 2
    outcomes = []
    for kernel in (reference, native):
        got = new_rows(max(count, 1))
        decoded = kernel.records_at(data, spans, count, base, queue_id, topic, got)
        outcomes.append((decoded, list(got[: decoded * ROW_WIDTH])))
    if outcomes[0] != outcomes[1]:
        yield "records_at differs"
    for kernel in (reference, native):  # more spans than rows: refused, nothing read
        try:
            kernel.records_at(data, spans, count + 1, base, queue_id, topic, new_rows(count))
        except ValueError:
            continue
        yield "records_at took more spans than its rows hold"


def pack_rows(rows: list[tuple[int, ...]]) -> array:
    """Rows as :func:`run_scan` returns them, packed back into a rows buffer."""
    packed = new_rows(max(len(rows), 1))
    for number, row in enumerate(rows):
        packed[number * ROW_WIDTH : (number + 1) * ROW_WIDTH] = array("q", row)
    return packed


def dispatch_both(
    native: ModuleType, data: bytes, base: int, options: int, key_capacity: int
) -> Iterator[str]:
    """Every way the kernels disagree preparing dispatch for the rows of ``data``: the
    per-row integers, the packed keys, and where each call stopped for want of room."""
    rows, _final = run_scan(reference, data, 0, base, 0, 4096)
    if not rows:
        return
    packed = pack_rows(rows)
    previous_time = rows[len(rows) // 2][10] if options else -1
    for looking in (0, FORCE_PROPERTY_CRC, SCHEDULED_ONLY):
        attention = []
        for kernel in (reference, native):
            found = array("q", bytes(8 * len(rows)))
            number = kernel.attention_rows(
                data, packed, 0, len(rows), previous_time, looking, found
            )
            attention.append(list(found[:number]))
        if attention[0] != attention[1]:
            yield f"attention_rows differs (options {looking})"
    results = []
    for kernel in (reference, native):
        out = new_dispatch_out(len(rows))
        keys = bytearray(HASHED_KEY_SIZE * key_capacity)
        calls = []
        first = 0
        while first < len(rows):
            first_next, entries = kernel.prepare_dispatch(
                data, packed, first, len(rows), options, out, keys
            )
            calls.append((first_next, entries, bytes(keys[: entries * HASHED_KEY_SIZE])))
            if first_next == first:
                break  # a row with more keys than the buffer holds
            first = first_next
        results.append((list(out), calls))
    if results[0] != results[1]:
        yield f"prepare_dispatch differs (options {options}, key capacity {key_capacity})"
        return
    out = array("q", results[0][0])
    grouped = []
    for kernel in (reference, native):
        runs = array("q", bytes(8 * RUN_WIDTH * key_capacity))  # few runs: the table fills
        units = bytearray(UNIT_SIZE * len(rows))
        row_runs = array("q", bytes(8 * len(rows)))
        calls = []
        first = 0
        while first < len(rows):
            first_next, found = kernel.queue_runs(
                data, packed, first, len(rows), out, units, runs, row_runs
            )
            used = sum(runs[n * RUN_WIDTH + 3] for n in range(found))
            calls.append((first_next, list(runs[: found * RUN_WIDTH]), bytes(units[: used * 20])))
            if first_next == first:
                break
            first = first_next
        grouped.append(calls)
    if grouped[0] != grouped[1]:
        yield f"queue_runs differs (run capacity {key_capacity})"
    yield from index_both(native, data, results[0][1][0][2] if results[0][1] else b"")


def index_both(native: ModuleType, data: bytes, keys: bytes) -> Iterator[str]:
    """The consume-queue and index functions of both kernels on the same bytes: ``data``
    read as queue units and as index entries, ``keys`` (prepared HASHED_KEY entries) matched
    against those entries and written into a small index file."""
    results = []
    for kernel in (reference, native):
        outcome: list[object] = [kernel.valid_units(data), kernel.cut_index(data, len(data) // 2)]
        newest = array("i", bytes(4 * 7))
        chain = array("q", [-1, 0, -1, 0, 0])
        bad = array("q", bytes(8 * 6 * 4))
        found = kernel.index_chain(data, 1, 7, newest, chain, bad, 4)
        outcome += [found, list(bad[: found * 6]), list(newest), list(chain)]
        count = len(keys) // HASHED_KEY_SIZE
        outcome.append(kernel.match_keys(keys, 0, count, data))
        index = bytearray(40 + 4 * 5 + 20 * 64)
        state = array("q", [1, 0, 0, 0, 0, 0, 0, 0, 0])
        number, stops = 0, []
        while True:
            number, reason = kernel.apply_index(index, 5, 60, 64, 64, state, keys, number, count)
            stops.append((number, reason))
            if reason != 1:  # a full file: start again in an empty one
                break
            index[:] = bytes(len(index))
            state[0] = 1
        outcome += [bytes(index), list(state), stops]
        results.append(outcome)
    if results[0] != results[1]:
        yield "queue-file or index functions differ"


def _decoded_pairs(data: bytes, row: list[int]) -> list[tuple[bytes, bytes]]:
    """The pairs ``decode_properties`` keeps from a row's properties, as bytes."""
    start = row[PROPERTIES_AT]
    props = data[start : start + row[PROPERTIES_LENGTH]]
    kept: dict[bytes, bytes] = {}
    for pair in props.split(b"\x02"):
        name, separator, value = pair.partition(b"\x01")
        if separator and name and value:
            kept[name] = value
    return list(kept.items())


def columns_both(native: ModuleType, data: bytes, base: int, pair_capacity: int) -> Iterator[str]:
    """Every way the kernels disagree on the export columns of the rows of ``data``: each
    field's spans and gathered bytes, the property map and picks (stopping before a record
    with more than ``pair_capacity`` pairs), integer columns, host keys, the ASCII check and
    the message ids."""
    rows, _final = run_scan(reference, data, 0, base, 0, 4096)
    if not rows:
        return
    packed = pack_rows(rows)
    count = len(rows)
    first = count // 3 if count > 2 else 0
    found_spans = {}  # field to the reference's spans
    for field in range(FIELD_TOPIC, FIELD_UNIQ_KEY + 1):
        got = []
        for kernel in (reference, native):
            spans = array("q", bytes(16 * (count - first)))
            total, absent = kernel.field_spans(data, packed, first, count, field, spans)
            gathered = bytearray(total)
            offsets = array("i", bytes(4 * (count - first + 1)))
            written = kernel.gather(data, spans, count - first, gathered, offsets)
            got.append((total, absent, list(spans), written, bytes(gathered), list(offsets)))
        if got[0] != got[1]:
            yield f"field_spans/gather differ (field {field})"
        found_spans[field] = got[0][2]
    calls = []
    room = sum(row[PROPERTIES_LENGTH] for row in rows)
    for kernel in (reference, native):
        spans = array("q", bytes(32 * max(pair_capacity, 1)))  # one record's pairs
        pair_offsets = array("i", bytes(4 * (count + 1)))
        row, made = first, []
        while row < count:
            keys, items = bytearray(room), bytearray(room)
            key_offsets = array("i", bytes(4 * (room + 1)))
            item_offsets = array("i", bytes(4 * (room + 1)))
            picked = array("q", bytes(8 * PICKED_WIDTH * (count - row)))
            following, pairs, key_bytes, item_bytes = kernel.property_pairs(
                data, packed, row, count, spans, keys, key_offsets, items, item_offsets,
                pair_offsets, picked,
            )  # fmt: skip
            done = following - row
            made.append(
                (
                    following,
                    pairs,
                    bytes(keys[:key_bytes]),
                    list(key_offsets[: pairs + 1]),
                    bytes(items[:item_bytes]),
                    list(item_offsets[: pairs + 1]),
                    list(pair_offsets[: done + 1]),
                    [  # the picks of the rows done, field by field
                        list(picked[2 * (count - row) * n : 2 * (count - row) * n + 2 * done])
                        for n in range(3)
                    ],
                )
            )
            if following == row:
                break  # one record has more pairs than the working room holds
            row = following
        calls.append(made)
    if calls[0] != calls[1]:
        yield f"property_pairs differ (record capacity {pair_capacity})"
    elif len(calls[0]) == 1 and calls[0][0][0] == count:  # every row in one call
        for n, field in enumerate((FIELD_TAGS, FIELD_KEYS, FIELD_UNIQ_KEY)):
            if calls[0][0][7][n] != found_spans[field]:
                yield f"property_pairs picks field {field} unlike field_spans"
        _, _, keys, key_offsets, items, item_offsets, pair_offsets, _ = calls[0][0]
        names = []  # the map, record by record
        for pair_first, pair_end in pairwise(pair_offsets):
            names.append(
                [
                    (
                        keys[key_offsets[pair] : key_offsets[pair + 1]],
                        items[item_offsets[pair] : item_offsets[pair + 1]],
                    )
                    for pair in range(pair_first, pair_end)
                ]
            )
        if names != [_decoded_pairs(data, row) for row in rows[first:]]:
            yield "property_pairs' map unlike decode_properties"
    for kernel in (reference, native):  # without the map: the same picks and pair offsets
        spans = array("q", bytes(32 * max(pair_capacity, 1)))
        pair_offsets = array("i", bytes(4 * (count + 1)))
        picked = array("q", bytes(8 * PICKED_WIDTH * (count - first)))
        unmapped = kernel.property_pairs(
            data, packed, first, count, spans, bytearray(), array("i"), bytearray(), array("i"),
            pair_offsets, picked,
        )  # fmt: skip
        done = unmapped[0] - first
        if unmapped[0] == calls[0][0][0] and (
            unmapped[1] != calls[0][0][1]
            or list(pair_offsets[: done + 1]) != calls[0][0][6]
            or [
                list(picked[2 * (count - first) * n : 2 * (count - first) * n + 2 * done])
                for n in range(3)
            ]
            != calls[0][0][7]
        ):
            yield "property_pairs without the map differ"
    ids = []
    for kernel in (reference, native):
        text = bytearray(MESSAGE_ID_MAX * count)
        offsets = array("i", bytes(4 * (count + 1)))
        written = kernel.message_ids(data, packed, 0, count, text, offsets)
        ids.append((written, bytes(text[:written]), list(offsets)))
    if ids[0] != ids[1]:
        yield "message_ids differ"
    integer_columns = []
    done = count - first
    for kernel in (reference, native):
        found = []
        for width in (4, 8):  # every column one at a time, then all of them in one pass
            for column in range(ROW_WIDTH):
                out = bytearray(width * done + 3)
                try:
                    kernel.row_columns(packed, first, count, array("q", [column, width, 0]), out)
                    found.append(bytes(out))
                except ValueError as exc:  # a value outside 32 bits: the same refusal
                    found.append(str(exc))
            every = array("q")
            for column in range(ROW_WIDTH):
                every.extend((column, width, width * done * column))
            out = bytearray(width * done * ROW_WIDTH)
            try:
                kernel.row_columns(packed, first, count, every, out)
                found.append(bytes(out))
            except ValueError as exc:
                found.append(str(exc))
        integer_columns.append(found)
    if integer_columns[0] != integer_columns[1]:
        yield "row_columns differs"
    for number, width in enumerate((4, 8)):  # one pass gives what the columns one by one give
        singles = integer_columns[0][number * (ROW_WIDTH + 1) : (number + 1) * (ROW_WIDTH + 1)]
        *each, every = singles
        if all(isinstance(value, bytes) for value in each):
            if every != b"".join(value[: width * done] for value in each):
                yield f"row_columns in one pass unlike column by column (width {width})"
        elif not isinstance(every, str):
            yield f"row_columns in one pass took a value it refuses alone (width {width})"
    for field in (FIELD_BORN_HOST, FIELD_STORE_HOST):
        found_keys = []
        for kernel in (reference, native):
            keys = array("q", bytes(8 * (count - first)))
            done = kernel.host_keys(data, packed, first, count, field, keys)
            found_keys.append((done, list(keys[: done - first])))
        if found_keys[0] != found_keys[1]:
            yield f"host_keys differ (field {field})"
        done, keys_found = found_keys[0]
        spans = found_spans[field]
        hosts = [data[at : at + length] for at, length in zip(spans[::2], spans[1::2], strict=True)]
        if [key.to_bytes(8, "big", signed=True) for key in keys_found] != hosts[: done - first]:
            yield f"host_keys unlike the fields (field {field})"
    cut = len(data) // 2
    if {kernel.ascii_only(data, cut) for kernel in (reference, native)} != {data[:cut].isascii()}:
        yield "ascii_only differs"


def pack_both(native: ModuleType, rng: random.Random) -> Iterator[str]:
    """Every way the kernels disagree packing a random batch of records (sometimes with a
    damaged row or span): the bytes written, the results, the state carried, where each call
    stopped, or whether it was refused."""
    from rmqstore.hosts import HostAddress
    from rmqstore.kernel import layout
    from rmqstore.messagebatch import MessageBatch
    from rmqstore.record import Message

    count = rng.randint(1, 12)
    messages = [
        Message(
            topic=rng.choice(["T", "Orders", "x" * 140]),
            body=bytes(rng.getrandbits(8) for _ in range(rng.choice([0, 3, 200]))),
            queue_id=rng.randrange(3),
            flag=rng.randrange(-3, 3),
            sys_flag=rng.choice([0, 4, 8, 12, 1]),
            properties={"TAGS": "t"} if rng.random() < 0.5 else {},
            born_host=HostAddress(bytes(rng.choice([4, 16])), rng.randrange(65536)),
            born_timestamp=rng.randrange(1 << 40),
        )
        for _ in range(count)
    ]
    trailing = rng.random() < 0.5
    batch = MessageBatch.from_messages(messages, trailing_separator=trailing)
    rows = array("q", batch.rows)
    for row in range(count):
        rows[row * layout.PACK_WIDTH + layout.PACK_NOW] = 1000 + row * rng.randrange(3)
    body_spans, prop_spans = array("q", batch.body_spans), array("q", batch.prop_spans)
    if rng.random() < 0.3:  # damage one field of one message
        target = rng.choice([rows, body_spans, prop_spans])
        target[rng.randrange(len(target))] = rng.choice((*EXTREME_INTS, -1, 1 << 40))
    topics, topic_rows = bytearray(), array("q")
    for topic in batch.topics:
        field = len(topic).to_bytes(2, "big") if len(topic) > 127 else bytes([len(topic)])
        topic_rows.extend((len(topics), len(field) + len(topic), -626843481))
        topics += field + topic.encode()
    hosts, host_rows = bytearray(), array("q")
    for host in batch.hosts:
        host_rows.extend((len(hosts), len(host.to_field())))
        hosts += host.to_field()
    size = rng.choice([512, 4096, 65536])
    reserved = size - rng.randrange(2) * 100
    store_host = bytes(rng.choice([8, 20]))
    start = rng.randrange(64)
    outcomes: list[object] = []
    for kernel in (reference, native):
        buf = bytearray(size)
        state = array("q", bytes(8 * layout.KEY_STATE_WIDTH))
        state[layout.KEY_MONTH_START], state[layout.KEY_NEXT_MONTH] = 1000, 1010
        state[layout.KEY_TRAILING_SEPARATOR] = 1 if trailing else 0
        state[layout.KEY_QUEUE_SPAN] = batch.queue_span
        slots = array("q", bytes(8 * batch.queue_span * len(batch.topics)))
        out = array("q", bytes(8 * layout.RESULT_WIDTH * count))
        calls = []
        first, position = 0, start
        try:
            while first < count and len(calls) < 20:
                first, position, stop, value = kernel.pack_records(
                    buf, position, size, reserved, 1 << 30, array("q", rows), first, count,
                    batch.bodies, body_spans, batch.props, prop_spans, topics, topic_rows, hosts,
                    host_rows, store_host, slots, b"AB" * 10, state, out,
                )  # fmt: skip
                calls.append((first, position, stop, value))
                if stop != layout.PACKED_ALL:
                    break
            outcomes.append((calls, bytes(buf), list(out), list(state), list(slots)))
        except ValueError:
            outcomes.append("refused")
    if outcomes[0] != outcomes[1]:
        yield "pack_records differs"


def lines_both(native: ModuleType, data: bytes, base: int) -> Iterator[str]:
    """Every way the report lines of the rows of ``data`` differ between the compiled kernel
    (the reference writing the rows it leaves, as ``CommitLog.result_lines`` does) and the
    reference alone, in both styles."""
    from rmqstore.kernel.layout import LINES_JSONL, LINES_PLAIN

    for style in (LINES_JSONL, LINES_PLAIN):
        yield from _text_both(native, "result_lines", data, base, style)


_DOCUMENT_VALUES = (
    None, True, 0, -1, 3, 2**31 - 1, 2**31, 2**63 - 1, 1.5, "", "T", "caf\u00e9", "\U0001f600",
    "a\x00b", "\ud800", "x" * 300, [], {}, ["T"],
)  # fmt: skip
_DOCUMENT_NAMES = ("topic", "body", "tags", "keys", "queueId", "flag", "properties")


def documents_both(native: ModuleType, rng: random.Random) -> Iterator[str]:
    """Every way the kernels disagree turning random JSON-line documents (most of the
    common shape, some of another shape or with values of the wrong type or range) into
    batch columns: the columns, the topics and the sequence of stops."""
    from rmqstore.kernel.layout import DOC_NEEDS_PROPERTIES, DOC_OTHER

    documents: list[object] = []
    for _ in range(rng.randint(0, 30)):
        if rng.random() < 0.05:
            documents.append(rng.choice((["T"], "text", 3, None)))
            continue
        document = {
            "topic": rng.choice(("T", "U", "Orders")),
            "body": rng.choice(("", "b", "é" * 9)),
        }
        for name in rng.sample(_DOCUMENT_NAMES, rng.randint(0, 3)):
            if name in ("tags", "keys") and rng.random() < 0.7:
                document[name] = rng.choice(("A", "B", "k1 k2", None))
            elif name == "queueId" and rng.random() < 0.7:
                document[name] = rng.randrange(8)
            else:
                document[name] = rng.choice(_DOCUMENT_VALUES)
        if rng.random() < 0.1:
            del document["topic"]
        documents.append(document)
    defaults = (rng.choice(("D", None, "")), rng.choice((0, 2)), rng.choice((None, "DT", "")),
                rng.choice((None, "dk")), 7, 0, 123, 0, 1, 2)  # fmt: skip
    outcomes = []
    for kernel in (reference, native):
        topics: dict[str, int] = {}
        cache: dict[object, tuple[bytes, bool]] = {}
        columns = (array("q"), array("q"), bytearray(), array("q"), bytearray())
        state = array("q", (0, 0, 1))
        stops, first = [], 0
        while first < len(documents):
            first, stop, key = kernel.document_rows(
                documents, first, len(documents), defaults, topics, cache, *columns, state
            )
            stops.append((first, stop, key))
            if stop == DOC_OTHER:
                first += 1
            elif stop == DOC_NEEDS_PROPERTIES:
                cache[key] = (repr(key).encode(), len(cache) % 2 == 0)
        outcomes.append((stops, topics, [bytes(c) for c in columns], list(state)))
    if outcomes[0] != outcomes[1]:
        yield "document_rows differs"


def message_lines_both(native: ModuleType, data: bytes, base: int, body_mode: int) -> Iterator[str]:
    """Every way the JSON lines ``read --jsonl`` prints of the rows of ``data`` differ between
    the compiled kernel (the reference writing the rows it leaves, as
    ``MessageReader.sequential_lines`` does) and the reference alone, in one body mode."""
    yield from _text_both(native, "message_lines", data, base, body_mode)


def message_rows_both(
    native: ModuleType, data: bytes, base: int, rng: random.Random
) -> Iterator[str]:
    """Every way the CSV/TSV rows ``read --csv``/``--tsv`` prints of the rows of ``data``
    differ between the kernels, for a random body mode, delimiter and list of columns (one
    column, every column, or some, a column maybe twice)."""
    from rmqstore.kernel.layout import MESSAGE_COLUMNS

    numbers = range(len(MESSAGE_COLUMNS))
    shape = rng.randrange(3)
    if shape == 0:
        columns = bytes((rng.choice(numbers),))
    elif shape == 1:
        columns = bytes(numbers)
    else:
        columns = bytes(rng.choice(numbers) for _ in range(rng.randint(2, 30)))
    modes = (rng.randrange(5), columns, rng.choice((9, 44)))
    yield from _text_both(native, "message_rows", data, base, *modes)


def _text_both(
    native: ModuleType, kind: str, data: bytes, base: int, *modes: object
) -> Iterator[str]:
    """How ``kind`` (``result_lines``, ``message_lines`` or ``message_rows``) differs
    between the kernels on the rows of ``data``, driven as ``rmqstore.kernel.write_lines``
    drives it."""
    rows, _final = run_scan(reference, data, 0, base, 0, 4096)
    if not rows:
        return
    packed = pack_rows(rows)
    count = len(rows)
    expected = bytearray()
    getattr(reference, kind)(data, packed, 0, count, *modes, expected)
    got = bytearray()
    row = 0
    while row < count:
        row = getattr(native, kind)(data, packed, row, count, *modes, got)
        if row < count:
            row = getattr(reference, kind)(data, packed, row, row + 1, *modes, got)
    if got != expected:
        yield f"{kind} differ (modes {modes})"


def record_items_both(
    native: ModuleType, data: bytes, base: int, rng: random.Random
) -> Iterator[str]:
    """How ``record_items`` (the Python API's per-record items) differs between the kernels
    on the rows of ``data`` as a scan with CRC checks gives them, and on those rows with a
    position, topic or properties span moved (inside the buffer, past it, negative), a host
    flag flipped (the other header size) or a row taken from the middle: the items, the
    header type, and the error (its type and message) where one is raised."""
    from rmqstore.record import RecordHeader

    rows, _final = run_scan(reference, data, 0, base, CHECK_CRC, 4096)
    if rows and rng.random() < 0.5:
        rows = [list(row) for row in rows]
        for row in rng.sample(rows, min(len(rows), rng.randint(1, 3))):
            column = rng.choice((POSITION, TOPIC_AT, TOPIC_LENGTH, PROPERTIES_AT,
                                 PROPERTIES_LENGTH, SYS_FLAG))  # fmt: skip
            if column == SYS_FLAG:
                row[column] ^= rng.choice((0x10, 0x20, 0x30))
            else:
                row[column] = rng.choice(
                    (row[column] + rng.choice((-1, 1, 7)), -1, len(data), len(data) - 3,
                     1 << 40, -(1 << 62), 0)
                )  # fmt: skip
        rows = [tuple(row) for row in rows]
    packed = pack_rows(rows)
    first = rng.randrange(len(rows) + 1) if rows and rng.random() < 0.3 else 0
    outcomes = []
    for kernel in (reference, native):
        items: list = []
        try:
            returned: object = kernel.record_items(
                data, packed, first, len(rows), RecordHeader, {}, items
            )
        except (ValueError, UnicodeDecodeError) as exc:
            returned = f"{type(exc).__name__}: {exc}"
        types = {type(item[1]) for item in items}
        outcomes.append((returned, items, types))
    if outcomes[0] != outcomes[1]:
        yield "record_items differs"
    elif outcomes[0][2] - {RecordHeader}:
        yield "record_items made headers of another type"
    for kernel in (reference, native):  # more rows than the buffer holds: refused
        try:
            kernel.record_items(data, packed, 0, len(packed) // ROW_WIDTH + 1, RecordHeader,
                                {}, [])  # fmt: skip
        except ValueError:
            continue
        yield "record_items took more rows than its buffer holds"


_COPY_PIECES = (
    b"INNER_MULTI_DISPATCH\x01", b"INNER_MULTI_QUEUE_OFFSET\x01", b"\x02INNER_MULTI_DISPATCH\x01",
    b"\x02INNER_MULTI_QUEUE_OFFSET\x01", b"\x01", b"\x02", b"%LMQ%r", b"%LMQ%", b"Q", b",", b"7",
    b"12", b"0", b"9223372036854775807", b"9223372036854775808", b"99999999999999999999",
    b"1234567890123456789", b"\xc3\xb6", b"\xff", b"\xe2", b"TAGS\x01x\x02", b"-1", b" ", b"+3",
)  # fmt: skip
_COPY_TOPICS = (b"T", b"%RETRY%group", b"%LMQ%own", b"\xff\xfe", b"", b"%RETRY")
# topics a 5.x broker gives no copies (multidispatch.gets_no_copies), and names close to them
_COPY_TOPICS += (b"SCHEDULE_TOPIC_XXXX", b"SCHEDULE_TOPIC_XXX", b"SCHEDULE_TOPIC_XXXXX")
_COPY_TOPICS += (b"rmq_sys_wheel_timer", b"rmq_sys_", b"rmq_sys", b"RMQ_SYS_TRANS_HALF_TOPIC")
_COPY_NAMES = (
    b"%LMQ%room-1",
    b"%LMQ%r\xc3\xb6",
    b"Plain",
    b"",
    b"%LMQ%",
    b"%LMQ",
    b"a\xffb",
    b"..",
)
_COPY_OFFSETS = (
    b"0", b"7", b"123", b"9223372036854775807", b"9223372036854775808", b"9999999999999999999",
    b"12345678901234567890", b"", b"-1", b"1 ", b"\xd9\xa3",
    # what Long.parseLong takes (a sign, leading zeros, the extremes) and StringUtils.isBlank
    b"+5", b"-0", b"-9223372036854775808", b"-9223372036854775809", b"+", b"-",
    b"000000000000000000000042", b" ", b"\t", b"\xe3\x80\x80", b"\xc2\xa0", b"\xe2\x80",
)  # fmt: skip


def _copy_properties(rng: random.Random) -> bytes:
    """Random property bytes: pieces at random, or (mostly) the two pairs a broker writes,
    with as many or other numbers of names and offsets of every kind, commas at their ends,
    pieces between them, a pair repeated, its name inside another pair's value."""
    if rng.random() < 0.3:
        return b"".join(rng.choices(_COPY_PIECES, k=rng.randrange(0, 14)))
    count = rng.randint(1, 4)
    names = rng.choices(_COPY_NAMES, k=count)
    offsets = [rng.choice(_COPY_OFFSETS) if rng.random() < 0.2 else b"%d" % rng.randrange(10**6)
               for _ in range(count + (rng.random() < 0.1) - (rng.random() < 0.1))]  # fmt: skip
    # commas at the end (which Java's String.split drops) after the names or the offsets
    ends = [b"," * rng.choice((0, 0, 0, 1, 2)) for _ in range(2)]
    pairs = [
        b"INNER_MULTI_DISPATCH\x01" + b",".join(names) + ends[0],
        b"INNER_MULTI_QUEUE_OFFSET\x01" + b",".join(offsets) + ends[1],
        b"TAGS\x01t",
        b"KEYS\x01k",
    ]
    rng.shuffle(pairs)
    if rng.random() < 0.2:
        pairs.insert(rng.randrange(len(pairs) + 1), rng.choice(_COPY_PIECES))
    if rng.random() < 0.1:
        pairs.append(rng.choice(pairs))
    return b"\x02".join(pairs) + rng.choice((b"\x02", b""))


def _rows_with_copies(
    data: bytes, base: int, rng: random.Random
) -> tuple[bytearray, list[tuple[int, ...]]]:
    """The rows a scan of ``data`` gives, and rows made to point at random property bytes
    appended to it (see :func:`row_copies_both`), each with a physical offset and size."""
    rows, _final = run_scan(reference, data, 0, base, 0, 4096)
    buf = bytearray(data)
    made = []
    for _ in range(rng.randint(1, 12)):
        topic = rng.choice(_COPY_TOPICS)
        props = _copy_properties(rng)
        row = [0] * ROW_WIDTH
        row[TOPIC_AT], row[TOPIC_LENGTH] = len(buf), len(topic)
        buf += topic
        row[PROPERTIES_AT], row[PROPERTIES_LENGTH] = len(buf), len(props)
        buf += props
        row[SYS_FLAG] = rng.choice((0, 0x4, 0x8, 0xC, 0x10, 0x38))
        row[QUEUE_ID] = rng.choice((0, 3, -1, 2**31 - 1))
        row[PHYSICAL_OFFSET] = rng.choice((0, 4096, 2**40, 2**63 - 1))
        row[TOTAL_SIZE] = rng.choice((0, 300, 2**31 - 1))
        made.append(tuple(row))
    return buf, [*rows, *made]


def copy_runs_both(native: ModuleType, data: bytes, base: int, rng: random.Random) -> Iterator[str]:
    """How ``copy_runs`` (the units in further queues of rows, gathered into runs) differs
    between the kernels, and from the units ``row_copies`` gives for the same rows, on the
    rows :func:`row_copies_both` makes, in log order, with run and unit tables of every size
    (full ones stop before a row); and the error of a row outside the rows, the buffer or
    the dispatch output."""
    from rmqstore.kernel.layout import (
        COPY_RUN_FIRST_QUEUE_OFFSET,
        COPY_RUN_NAME_AT,
        COPY_RUN_NAME_LENGTH,
        COPY_RUN_QUEUE_ID,
        COPY_RUN_UNITS,
        COPY_RUN_UNITS_FROM,
        COPY_RUN_WIDTH,
        DISPATCH_WIDTH,
    )
    from rmqstore.multidispatch import QueueCopy

    buf, rows = _rows_with_copies(data, base, rng)
    packed = pack_rows(rows)
    numbers = array("q", sorted(rng.sample(range(len(rows)), rng.randint(0, len(rows)))))
    dispatch_out = array("q", [rng.choice((0, -1, 2**63 - 1, -(2**31))) for _ in rows] * 4)
    run_room, unit_room = rng.choice(((1, 1), (3, 5), (64, 64), (4096, 4096)))
    outcomes = []
    for kernel in (reference, native):
        units = bytearray(unit_room * UNIT_SIZE)
        runs = array("q", bytes(8 * COPY_RUN_WIDTH * run_room))
        scratch = array("q", bytes(8 * 2 * unit_room))
        done, found, placed = kernel.copy_runs(
            bytes(buf), packed, numbers, dispatch_out, units, runs, scratch
        )
        outcomes.append(
            (done, found, placed, bytes(units[: placed * UNIT_SIZE]),
             list(runs[: found * COPY_RUN_WIDTH]), list(scratch[: 2 * placed]))
        )  # fmt: skip
    if outcomes[0] != outcomes[1]:
        yield "copy_runs differs"
        return
    done, found, placed, units, runs, _ = outcomes[0]
    got = []
    for number in range(found):
        run = runs[number * COPY_RUN_WIDTH : (number + 1) * COPY_RUN_WIDTH]
        name_at = run[COPY_RUN_NAME_AT]
        name = bytes(buf[name_at : name_at + run[COPY_RUN_NAME_LENGTH]]).decode("utf-8", "replace")
        for index in range(run[COPY_RUN_UNITS]):
            unit = struct.unpack_from(">qiq", units, (run[COPY_RUN_UNITS_FROM] + index) * UNIT_SIZE)
            got.append(
                (name, run[COPY_RUN_QUEUE_ID], run[COPY_RUN_FIRST_QUEUE_OFFSET] + index, *unit)
            )
    copies: list = []
    reference.row_copies(bytes(buf), packed, numbers[:done], QueueCopy, {}, copies)
    expected = [
        (*unit, rows[number][PHYSICAL_OFFSET], rows[number][TOTAL_SIZE],
         dispatch_out[number * DISPATCH_WIDTH])
        for number, units_of_row in zip(numbers[:done], copies, strict=True)
        for unit in units_of_row
    ]  # fmt: skip
    if sorted(got) != sorted(expected) or placed != len(expected):
        yield "copy_runs gives other units than row_copies"
    # a span moved outside the buffer, a row outside the rows or the dispatch output
    victim, broken_rows = _broken_row(buf, rows, rng)
    for number_list, packed_rows, out in (
        ([victim], broken_rows, dispatch_out),
        ([0, rng.choice((len(rows), -1, 1 << 40))], packed, dispatch_out),
        ([len(rows) - 1], packed, dispatch_out[: (len(rows) - 1) * DISPATCH_WIDTH]),
    ):
        errors = []
        for kernel in (reference, native):
            try:
                kernel.copy_runs(
                    bytes(buf), packed_rows, array("q", number_list), out,
                    bytearray(UNIT_SIZE * 64), array("q", bytes(8 * COPY_RUN_WIDTH * 64)),
                    array("q", bytes(8 * 128)),
                )  # fmt: skip
                errors.append(None)
            except ValueError as exc:
                errors.append(str(exc))
        if errors[0] != errors[1]:
            yield f"copy_runs fails otherwise on a bad row ({errors})"


def _broken_row(
    buf: bytearray, rows: list[tuple[int, ...]], rng: random.Random
) -> tuple[int, array]:
    """A row picked at random (its number), and the rows packed with its topic or properties
    span moved outside ``buf``."""
    broken = [list(row) for row in rows]
    victim = rng.randrange(len(broken))
    column = rng.choice((TOPIC_AT, TOPIC_LENGTH, PROPERTIES_AT, PROPERTIES_LENGTH))
    broken[victim][column] = rng.choice((-1, len(buf), len(buf) + 1, 1 << 40, -(1 << 62)))
    return victim, pack_rows([tuple(row) for row in broken])


def _made_row(buf: bytearray, row: tuple[int, ...]) -> tuple[str, bytes, bool]:
    """A row's topic (decoded with replacement characters), stored properties, and whether a
    queue takes its record (not PREPARED nor ROLLBACK)."""
    topic_at, props_at = row[TOPIC_AT], row[PROPERTIES_AT]
    topic = bytes(buf[topic_at : topic_at + row[TOPIC_LENGTH]]).decode("utf-8", "replace")
    props = bytes(buf[props_at : props_at + row[PROPERTIES_LENGTH]])
    return topic, props, row[SYS_FLAG] & 0xC in (0, 0x8)


def copy_stops_both(
    native: ModuleType, data: bytes, base: int, rng: random.Random
) -> Iterator[str]:
    """How ``copy_stops`` (the rows a broker's dispatch throws at) differs between the
    kernels, and from ``dispatch_stop`` of the properties decoded, on the rows
    :func:`row_copies_both` makes, in any order; and the error of a row outside the rows or
    the buffer, or of an output shorter than the rows."""
    from rmqstore.multidispatch import dispatch_stop
    from rmqstore.properties import decode_properties

    buf, rows = _rows_with_copies(data, base, rng)
    packed = pack_rows(rows)
    numbers = array("q", rng.sample(range(len(rows)), rng.randint(0, len(rows))))
    expected = []
    for number in numbers:
        topic, props, queued = _made_row(buf, rows[number])
        properties = decode_properties(props)
        if queued and dispatch_stop(topic, rows[number][QUEUE_ID], properties, props):
            expected.append(number)
    outcomes = []
    for kernel in (reference, native):
        out = array("q", [-7] * (len(numbers) + 1))
        found = kernel.copy_stops(bytes(buf), packed, numbers, out)
        outcomes.append((found, list(out)))
    if outcomes[0] != outcomes[1]:
        yield "copy_stops differs"
    elif outcomes[0][1][: outcomes[0][0]] != expected:
        yield "copy_stops differs from dispatch_stop of the decoded properties"
    victim, broken_rows = _broken_row(buf, rows, rng)
    for number_list, packed_rows, room in (
        ([victim], broken_rows, 1),
        ([0, rng.choice((len(rows), -1, 1 << 40))], packed, 2),
        ([0, 0], packed, 1),
    ):
        errors = []
        for kernel in (reference, native):
            try:
                kernel.copy_stops(
                    bytes(buf), packed_rows, array("q", number_list), array("q", [0] * room)
                )
                errors.append(None)
            except ValueError as exc:
                errors.append(str(exc))
        if errors[0] != errors[1]:
            yield f"copy_stops fails otherwise on a bad row ({errors})"


def row_copies_both(
    native: ModuleType, data: bytes, base: int, rng: random.Random
) -> Iterator[str]:
    """How ``row_copies`` (a record's units in further queues) differs between the kernels,
    and from ``queue_copies`` of the properties decoded (rmqstore.multidispatch, what the
    reference way of dispatch and verify reads), on the rows a scan of ``data`` gives and on
    rows made to point at random property bytes (the two names where a pair starts and
    inside values, separators, offsets of every length and above a long, LMQ and other
    names, text that is not UTF-8), with every transaction type and the topics a 5.x broker
    gives no copies (and names close to them); and the error (type and message) of a row
    number outside the rows or a span outside the buffer."""
    from rmqstore.multidispatch import QueueCopy, queue_copies
    from rmqstore.properties import decode_properties

    buf, rows = _rows_with_copies(data, base, rng)
    packed = pack_rows(rows)
    numbers = array("q", rng.sample(range(len(rows)), len(rows)))  # any order
    expected = []
    for number in numbers:
        topic, props, queued = _made_row(buf, rows[number])
        expected.append(
            queue_copies(topic, rows[number][QUEUE_ID], decode_properties(props), props)
            if queued
            else []
        )
    outcomes = []
    for kernel in (reference, native):
        out: list = []
        returned = kernel.row_copies(bytes(buf), packed, numbers, QueueCopy, {}, out)
        outcomes.append((returned, out, {type(unit) for units in out for unit in units}))
    if outcomes[0] != outcomes[1]:
        yield "row_copies differs"
    elif outcomes[0][1] != expected:
        yield "row_copies differs from queue_copies of the decoded properties"
    elif outcomes[0][2] - {QueueCopy}:
        yield "row_copies made copies of another type"
    # a span moved outside the buffer, a row number outside the rows: the same error
    victim, broken_rows = _broken_row(buf, rows, rng)
    wrong = rng.choice((len(rows), -1, 1 << 40))
    for number_list, packed_rows in (
        ([victim], broken_rows),
        ([0, wrong], packed),
    ):
        errors = []
        for kernel in (reference, native):
            try:
                kernel.row_copies(
                    bytes(buf), packed_rows, array("q", number_list), QueueCopy, {}, []
                )
                errors.append(None)
            except ValueError as exc:
                errors.append(str(exc))
        if errors[0] != errors[1]:
            yield f"row_copies fails otherwise on a bad row ({errors})"
        elif number_list == [0, wrong] and errors[0] is None:
            yield "row_copies took a row number outside the rows"


def text_rows_both(native: ModuleType, data: bytes, rng: random.Random) -> Iterator[str]:
    """How ``text_rows`` differs: rows joined from literals and columns cut from ``data`` (its
    values), their offsets mostly valid, sometimes decreasing, past the data, too few, of a
    width or encoding there is not, or a part of another shape."""
    count = rng.choice((0, 1, 2, 7, 40))
    parts: list[object] = []
    for _ in range(rng.randrange(6)):
        if rng.random() < 0.3:
            at = rng.randrange(len(data) + 1)
            parts.append(bytes(data[at : at + rng.randrange(12)]))
            continue
        encoding = rng.choice((TEXT_AS_IS, TEXT_BASE64, TEXT_DECIMAL))
        width = rng.choice((4, 8))
        first = rng.choice((0, 0, 1, 3))
        numbers = first + count + (0 if encoding == TEXT_DECIMAL else 1)
        if encoding == TEXT_DECIMAL:
            raw = bytes(rng.getrandbits(8) for _ in range(numbers * width))
            if rng.random() < 0.5:  # the input's bytes as numbers
                raw = (data + bytes(numbers * width))[: numbers * width]
            offsets = array("i" if width == 4 else "q", raw)
        else:
            cuts = sorted(rng.randrange(len(data) + 1) for _ in range(numbers))
            offsets = array("i" if width == 4 else "q", cuts)
            if offsets and rng.random() < 0.1:  # hostile: past the data, or decreasing
                offsets[rng.randrange(len(offsets))] = rng.choice((-1, len(data) + 1, 0))
        if rng.random() < 0.05:
            offsets = offsets[: max(0, len(offsets) - 1)]  # one too few
        if rng.random() < 0.03:
            encoding = rng.choice((3, -1))
        if rng.random() < 0.03:
            width = rng.choice((2, 16))
        part: object = (encoding, width, offsets, data, first)
        if rng.random() < 0.02:
            part = rng.choice(((encoding, width, offsets, data), bytearray(b"x"), None))
        parts.append(part)
    outcomes = []
    for kernel in (reference, native):
        out = bytearray(b"kept")
        try:
            written = kernel.text_rows(parts, count, out)
        except ValueError:
            outcomes.append(("ValueError", bytes(out)))
        else:
            outcomes.append((written, bytes(out)))
    if outcomes[0] != outcomes[1]:
        yield f"text_rows differs ({count} rows, {len(parts)} parts)"
