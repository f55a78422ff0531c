"""The record kernel in pure Python: the reference the compiled kernel is tested against, and
the path that runs where no compiled kernel was built. Same interface and results as
``rmqstore.kernel._native`` (see :mod:`rmqstore.kernel.layout`)."""

from __future__ import annotations

import json
import struct
import zlib
from array import array
from base64 import b64encode
from itertools import pairwise
from typing import Any

from rmqstore.javavalues import java_ascii_long, java_blank, java_split
from rmqstore.kernel.layout import (
    APPLIED_ALL,
    BAD_WIDTH,
    BODY_LENGTH,
    CHAIN_ENTRIES,
    CHAIN_FIRST_OFFSET,
    CHAIN_HEADS,
    CHAIN_LAST_OFFSET,
    CHAIN_PREVIOUS_OFFSET,
    CHECK_CRC,
    COPY_RUN_FIRST_QUEUE_OFFSET,
    COPY_RUN_LAST_ROW,
    COPY_RUN_UNITS,
    COPY_RUN_UNITS_FROM,
    COPY_RUN_WIDTH,
    CRC_BAD,
    CRC_GOOD,
    CRC_STATUS,
    CRC_UNCHECKED,
    DISPATCH_FLAGS,
    DISPATCH_WIDTH,
    DOC_BORN_TIMESTAMP,
    DOC_DEFAULT_KEYS,
    DOC_DEFAULT_QUEUE_ID,
    DOC_DEFAULT_TAGS,
    DOC_DEFAULT_TOPIC,
    DOC_DEFAULTS_WIDTH,
    DOC_DONE,
    DOC_FLAG,
    DOC_HOST,
    DOC_NEEDS_PROPERTIES,
    DOC_OTHER,
    DOC_PREPARED_OFFSET,
    DOC_RECONSUME_TIMES,
    DOC_STATE_LONGEST_BODY,
    DOC_STATE_LONGEST_PROPS,
    DOC_STATE_QUEUE_SPAN,
    DOC_STATE_WIDTH,
    DOC_SYS_FLAG,
    FIELD_BODY,
    FIELD_BORN_HOST,
    FIELD_KEYS,
    FIELD_PROPERTIES,
    FIELD_STORE_HOST,
    FIELD_TAGS,
    FIELD_TOPIC,
    FIELD_UNIQ_KEY,
    FORCE_PROPERTY_CRC,
    HAS_COPIES,
    HASHED_KEY_FORMAT,
    HASHED_KEY_SIZE,
    HEADER_SIZE,
    HOST_ROW_AT,
    HOST_ROW_LENGTH,
    HOST_ROW_WIDTH,
    INDEX_FULL,
    INDEX_KEYS,
    KEY_COUNTER,
    KEY_LAST_STAMP,
    KEY_MONTH_START,
    KEY_NEXT_MONTH,
    KEY_QUEUE_SPAN,
    KEY_STATE_WIDTH,
    KEY_TRAILING_SEPARATOR,
    KEYS_COUNT,
    KEYS_FROM,
    LINES_JSONL,
    LINES_PLAIN,
    NEEDS_REFERENCE,
    NEEDS_RESERVE,
    NEEDS_ROLL,
    NEW_MONTH,
    PACK_BORN_TIMESTAMP,
    PACK_FLAG,
    PACK_HOST,
    PACK_NOW,
    PACK_PREPARED_OFFSET,
    PACK_QUEUE_ID,
    PACK_RECONSUME_TIMES,
    PACK_SYS_FLAG,
    PACK_TOPIC,
    PACK_UNIQ_KEY,
    PACK_WIDTH,
    PACKED_ALL,
    PHYSICAL_OFFSET,
    PICKED_NAMES,
    PICKED_WIDTH,
    POSITION,
    PROPERTIES_AT,
    PROPERTIES_LENGTH,
    PROPERTY_CRC,
    QUEUE_ID,
    QUEUE_OFFSET,
    RESULT_PHYSICAL_OFFSET,
    RESULT_QUEUE_OFFSET,
    RESULT_SIZE,
    RESULT_STORE_TIMESTAMP,
    RESULT_WIDTH,
    ROW_WIDTH,
    RUN_FIRST_QUEUE_OFFSET,
    RUN_LAST_ROW,
    RUN_UNITS,
    RUN_UNITS_FROM,
    RUN_WIDTH,
    SCHEDULED_ONLY,
    SPAN_ABSENT,
    STATE_BEGIN_OFFSET,
    STATE_BEGIN_TIMESTAMP,
    STATE_COUNT,
    STATE_END_OFFSET,
    STATE_END_TIMESTAMP,
    STATE_INDEXED,
    STATE_SKIPPING,
    STATE_SLOT_COUNT,
    STATE_WRITTEN,
    STOP_ON_CRC_ERROR,
    STORE_TIMESTAMP,
    SYS_FLAG,
    TAGS_CODE,
    TEXT_AS_IS,
    TEXT_BASE64,
    TEXT_DECIMAL,
    TOPIC_AT,
    TOPIC_LENGTH,
    TOPIC_ROW_AT,
    TOPIC_ROW_LENGTH,
    TOPIC_ROW_MAGIC,
    TOPIC_ROW_WIDTH,
    TOTAL_SIZE,
    UNIT_SIZE,
    Problem,
    Stop,
)
from rmqstore.properties import JAVA_REPLACE  # the error handler, registered as it loads

MAGIC_V1 = -626843481
MAGIC_V2 = -626843477
MAGIC_BLANK = -875286124
IPV4_HEADER = 88  # the fixed header with two IPv4 hosts
MIN_RECORD_LENGTH = IPV4_HEADER + 3  # empty body, topic and properties
CRC_PROPERTY_LENGTH = 20  # "__CRC32#" 0x01, ten digits, 0x02
_CRC_PROPERTY_PREFIX = b"__CRC32#\x01"

_SIZE_AND_MAGIC = struct.Struct(">ii")
# the fixed header by (born host, store host) sizes, hosts skipped: TOTALSIZE MAGICCODE
# BODYCRC QUEUEID FLAG QUEUEOFFSET PHYSICALOFFSET SYSFLAG BORNTIMESTAMP (BORNHOST)
# STORETIMESTAMP (STOREHOST) RECONSUMETIMES PREPAREDTRANSACTIONOFFSET BODYLENGTH
_HEADERS = {
    0: struct.Struct(">iiiiiqqiq8xq8xiqi"),
    1: struct.Struct(">iiiiiqqiq20xq8xiqi"),
    2: struct.Struct(">iiiiiqqiq8xq20xiqi"),
    3: struct.Struct(">iiiiiqqiq20xq20xiqi"),
}
_SHORT = struct.Struct(">h")
_ROW = struct.Struct(f"={ROW_WIDTH}q")


def crc32(data: Any) -> int:
    """Plain CRC-32 (IEEE), as zlib computes it."""
    return zlib.crc32(data)


def property_crc_matches(buf: Any, position: int, total: int) -> bool:
    """True when the record's last 20 bytes are a ``__CRC32#`` property holding the CRC of
    the bytes before them (spec §2.6)."""
    tail = bytes(buf[position + total - CRC_PROPERTY_LENGTH : position + total])
    if not tail.startswith(_CRC_PROPERTY_PREFIX) or tail[-1] != 2:
        return False
    digits = tail[len(_CRC_PROPERTY_PREFIX) : -1]
    if any(not 0x30 <= digit <= 0x39 for digit in digits):
        return False
    stored = int(digits[::-1].decode("ascii"))
    record = memoryview(buf)[position : position + total - CRC_PROPERTY_LENGTH]
    try:
        return stored == zlib.crc32(record) & 0x7FFFFFFF
    finally:
        record.release()


def scan(
    buf: Any, start: int, limit: int, base_offset: int, room: int, options: int, rows: Any
) -> tuple[int, int, int, int, int, int]:
    """See :mod:`rmqstore.kernel.layout`."""
    capacity = len(rows) // ROW_WIDTH
    if not 0 <= start <= limit <= len(buf) or room < 0:
        raise ValueError("scan bounds are outside the buffer")
    check_crc = bool(options & CHECK_CRC)
    stop_on_crc_error = bool(options & STOP_ON_CRC_ERROR)
    property_crc = bool(options & PROPERTY_CRC)
    unpack_ipv4 = _HEADERS[0].unpack_from
    unpack_short = _SHORT.unpack_from
    pack_row = _ROW.pack_into
    view = memoryview(buf)
    checked_topics: set[bytes] = set()
    count = 0
    failures = 0
    position = start

    def done(stop: Stop, value: int = 0, problem: Problem = Problem.NONE) -> tuple:
        return count, int(stop), position, value, failures, int(problem)

    try:
        while True:
            if count == capacity:
                return done(Stop.ROWS_FULL)
            remaining = limit - position
            if remaining < 8:
                return done(Stop.MORE_DATA, 8) if room else done(Stop.END)
            total, magic = _SIZE_AND_MAGIC.unpack_from(buf, position)
            if magic != MAGIC_V1:
                if magic == 0 and total == 0:
                    return done(Stop.END)
                if magic == MAGIC_BLANK:
                    return done(Stop.BLANK, total)
                if magic != MAGIC_V2:
                    return done(Stop.INVALID, magic, Problem.MAGIC)
            if not MIN_RECORD_LENGTH <= total <= remaining + room:
                return done(Stop.INVALID, total, Problem.TOTAL_SIZE_BOUNDS)
            if total > remaining:
                return done(Stop.MORE_DATA, total)
            # the whole fixed header in one unpack (two IPv4 hosts, the common case)
            header = unpack_ipv4(buf, position)
            sys_flag = header[7]
            if sys_flag & 0x30:
                header_size = 72 + (20 if sys_flag & 0x10 else 8) + (20 if sys_flag & 0x20 else 8)
                if header_size + 3 > total:
                    return done(Stop.INVALID, total, Problem.HEADER_TOO_SMALL)
                header = _HEADERS[(sys_flag >> 4) & 3].unpack_from(buf, position)
            else:
                header_size = 88
            (
                _total,
                _magic,
                body_crc,
                queue_id,
                flag,
                queue_offset,
                physical,
                _sys_flag,
                born,
                store_timestamp,
                reconsume_times,
                prepared,
                body_length,
            ) = header
            topic_at = position + header_size + body_length
            record_end = position + total
            if body_length < 0 or topic_at + 3 > record_end:
                return done(Stop.INVALID, body_length, Problem.BODY_LENGTH)
            if magic == MAGIC_V1:
                version = 1
                topic_length = buf[topic_at]
                if topic_length > 127:
                    return done(Stop.INVALID, topic_length - 256, Problem.TOPIC_NEGATIVE)
                topic_at += 1
            else:
                version = 2
                topic_length = unpack_short(buf, topic_at)[0]
                if topic_length < 0:
                    return done(Stop.INVALID, topic_length, Problem.TOPIC_NEGATIVE)
                topic_at += 2
            properties_at = topic_at + topic_length
            if properties_at + 2 > record_end:
                return done(Stop.INVALID, topic_length, Problem.TOPIC_PAST_RECORD)
            properties_length = unpack_short(buf, properties_at)[0]
            if properties_length < 0:
                return done(Stop.INVALID, properties_length, Problem.PROPERTIES_NEGATIVE)
            if properties_at + 2 + properties_length != record_end:
                return done(Stop.INVALID, total, Problem.FIELDS_MISMATCH)
            if physical != base_offset + position:
                return done(Stop.INVALID, physical, Problem.PHYSICAL_OFFSET)
            topic = bytes(view[topic_at:properties_at])
            if topic not in checked_topics:
                try:
                    topic.decode("utf-8")
                except UnicodeDecodeError:
                    return done(Stop.INVALID, 0, Problem.TOPIC_UTF8)
                checked_topics.add(topic)
            crc_status = CRC_UNCHECKED
            if check_crc:
                if property_crc:
                    good = property_crc_matches(buf, position, total)
                    failed = Problem.PROPERTY_CRC
                else:
                    body_at = position + header_size
                    good = (
                        not body_length
                        or zlib.crc32(view[body_at : body_at + body_length]) & 0x7FFFFFFF
                        == body_crc
                    )
                    failed = Problem.BODY_CRC
                crc_status = CRC_GOOD if good else CRC_BAD
                if not good:
                    failures += 1
                    if stop_on_crc_error:
                        return done(Stop.INVALID, body_crc, failed)
            pack_row(
                rows,
                8 * ROW_WIDTH * count,
                position,
                total,
                version,
                body_crc,
                queue_id,
                flag,
                queue_offset,
                physical,
                sys_flag,
                born,
                store_timestamp,
                reconsume_times,
                prepared,
                header_size,
                body_length,
                topic_at,
                topic_length,
                properties_at + 2,
                properties_length,
                crc_status,
            )
            count += 1
            position = record_end
    finally:
        view.release()


SCHEDULE_TOPIC = b"SCHEDULE_TOPIC_XXXX"
_HASHED_KEY = struct.Struct(HASHED_KEY_FORMAT)
_ENTRY = struct.Struct(">iqii")
_SLOT = struct.Struct(">i")
_INDEX_HEADER = 40
_ENTRY_SIZE = 20


def java_hash(data: bytes, start: int = 0) -> int:
    """``String.hashCode`` of ASCII text, continuing from ``start``, as an unsigned 32-bit."""
    value = start
    for code in data:
        value = (31 * value + code) & 0xFFFFFFFF
    return value


def _signed(value: int) -> int:
    return value - (1 << 32) if value & 0x80000000 else value


def _index_hash(value: int) -> int:
    """``Math.abs`` of the hash, ``Integer.MIN_VALUE`` mapped to 0 (spec §7.3)."""
    signed = _signed(value)
    return 0 if signed == -(1 << 31) else abs(signed)


def dispatch_properties(
    props: bytes,
) -> tuple[bytes | None, bytes | None, bytes | None, bool]:
    """TAGS, KEYS and UNIQ_KEY values as ``string2messageProperties`` finds them, and whether
    an INNER_MULTI_DISPATCH property is there."""
    tags = keys = uniq = None
    multi_dispatch = False
    for pair in props.split(b"\x02"):
        name, _, value = pair.partition(b"\x01")
        if not name or not value:
            continue
        if name == b"TAGS":
            tags = value
        elif name == b"KEYS":
            keys = value
        elif name == b"UNIQ_KEY":
            uniq = value
        elif name == b"INNER_MULTI_DISPATCH":
            multi_dispatch = True
    return tags, keys, uniq, multi_dispatch


def prepare_dispatch(
    buf: Any, rows: Any, first: int, count: int, options: int, out: Any, keys: Any
) -> tuple[int, int]:
    """See :mod:`rmqstore.kernel.layout`."""
    capacity = len(keys) // HASHED_KEY_SIZE
    if not 0 <= first <= count <= len(rows) // ROW_WIDTH or len(out) < count * DISPATCH_WIDTH:
        raise ValueError("dispatch rows are outside their buffers")
    view = memoryview(buf)
    entries = 0
    row = first
    try:
        while row < count:
            at = row * ROW_WIDTH
            topic_at = rows[at + TOPIC_AT]
            topic = bytes(view[topic_at : topic_at + rows[at + TOPIC_LENGTH]])
            properties_at = rows[at + PROPERTIES_AT]
            props = bytes(view[properties_at : properties_at + rows[at + PROPERTIES_LENGTH]])
            tags, keys_value, uniq, multi_dispatch = dispatch_properties(props)
            reference = topic == SCHEDULE_TOPIC or not all(
                value is None or value.isascii() for value in (topic, tags, keys_value, uniq)
            )
            pieces: list[bytes] = []
            if (
                not reference
                and options & INDEX_KEYS
                and rows[at + SYS_FLAG] & 0xC != 0xC  # ROLLBACK records are not indexed
            ):
                if uniq is not None:
                    pieces.append(uniq)
                if keys_value:
                    pieces.extend(piece for piece in keys_value.split(b" ") if piece)
            if entries + len(pieces) > capacity:
                break
            out_at = row * DISPATCH_WIDTH
            out[out_at + TAGS_CODE] = (
                _signed(java_hash(tags)) if tags is not None and not reference else 0
            )
            out[out_at + DISPATCH_FLAGS] = (NEEDS_REFERENCE if reference else 0) | (
                HAS_COPIES if multi_dispatch else 0
            )
            out[out_at + KEYS_FROM] = entries
            out[out_at + KEYS_COUNT] = len(pieces)
            if pieces:
                prefix = java_hash(b"#", java_hash(topic))
                offset, stamp = rows[at + PHYSICAL_OFFSET], rows[at + STORE_TIMESTAMP]
                for number, piece in enumerate(pieces):
                    _HASHED_KEY.pack_into(
                        keys,
                        (entries + number) * HASHED_KEY_SIZE,
                        offset,
                        stamp,
                        _index_hash(java_hash(piece, prefix)),
                        1 if number == 0 else 0,
                    )
                entries += len(pieces)
            row += 1
    finally:
        view.release()
    return row, entries


def apply_index(
    buf: Any,
    slots: int,
    entries_at: int,
    limit: int,
    reserved: int,
    state: Any,
    keys: Any,
    start: int,
    stop: int,
) -> tuple[int, int]:
    """See :mod:`rmqstore.kernel.layout`."""
    if slots <= 0 or len(buf) < entries_at + limit * _ENTRY_SIZE or not 0 <= start <= stop:
        raise ValueError("index geometry is outside the buffer")
    if stop * HASHED_KEY_SIZE > len(keys) or len(state) < 9 or state[STATE_COUNT] < 1:
        raise ValueError("keys or state are outside their buffers")
    count = state[STATE_COUNT]
    slot_count = state[STATE_SLOT_COUNT]
    begin = state[STATE_BEGIN_TIMESTAMP]
    end_offset = state[STATE_END_OFFSET]
    end_timestamp = state[STATE_END_TIMESTAMP]
    skipping = state[STATE_SKIPPING]
    indexed = state[STATE_INDEXED]
    written = state[STATE_WRITTEN]
    number = start
    reason = APPLIED_ALL
    while number < stop:
        if count >= limit:  # the caller rolls to a new file and goes on from this entry
            reason = INDEX_FULL
            break
        offset, stamp, key_hash, first = _HASHED_KEY.unpack_from(keys, number * HASHED_KEY_SIZE)
        if first:
            # a record the index already holds, as IndexService.build decides
            skipping = int(offset < end_offset or (offset == end_offset and count > 1))
        if skipping:
            number += 1
            continue
        if count >= reserved:  # the caller reserves blocks and goes on from this entry
            reason = NEEDS_RESERVE
            break
        if key_hash < 0:  # never from prepare_dispatch: Math.abs, MIN_VALUE made 0
            raise ValueError(f"key hash {key_hash} of entry {number} is negative")
        if first:
            indexed += 1
        slot_at = _INDEX_HEADER + (key_hash % slots) * 4
        previous = _SLOT.unpack_from(buf, slot_at)[0]
        if previous <= 0 or previous > count:
            previous = 0
            slot_count += 1
        # Java: max(diff / 1000, 0), the division truncating toward zero
        late = begin > 0 and stamp > begin
        time_diff = min((stamp - begin) // 1000, 0x7FFFFFFF) if late else 0
        _ENTRY.pack_into(
            buf, entries_at + count * _ENTRY_SIZE, key_hash, offset, time_diff, previous
        )
        _SLOT.pack_into(buf, slot_at, count)
        if count <= 1:
            state[STATE_BEGIN_OFFSET] = offset
            begin = stamp
        count += 1
        end_offset, end_timestamp = offset, stamp
        written += 1
        number += 1
    state[STATE_COUNT] = count
    state[STATE_SLOT_COUNT] = slot_count
    state[STATE_BEGIN_TIMESTAMP] = begin
    state[STATE_END_OFFSET] = end_offset
    state[STATE_END_TIMESTAMP] = end_timestamp
    state[STATE_SKIPPING] = skipping
    state[STATE_INDEXED] = indexed
    state[STATE_WRITTEN] = written
    return number, reason


_UNIT = struct.Struct(">qiq")


def queue_runs(
    buf: Any,
    rows: Any,
    first: int,
    count: int,
    dispatch_out: Any,
    units: Any,
    runs: Any,
    row_runs: Any,
) -> tuple[int, int]:
    """See :mod:`rmqstore.kernel.layout`."""
    capacity = len(runs) // RUN_WIDTH
    if (
        not 0 <= first <= count <= len(rows) // ROW_WIDTH
        or len(dispatch_out) < count * DISPATCH_WIDTH
        or len(units) < (count - first) * UNIT_SIZE
        or len(row_runs) < count
    ):
        raise ValueError("queue runs are outside their buffers")
    view = memoryview(buf)
    try:
        found: list[list[int]] = []  # per run: its RUN_WIDTH integers
        latest: dict[tuple[bytes, int], int] = {}  # (topic bytes, queue id) -> its latest run
        row = first
        while row < count:
            row_runs[row] = -1
            at = row * ROW_WIDTH
            if dispatch_out[row * DISPATCH_WIDTH + DISPATCH_FLAGS] & NEEDS_REFERENCE or (
                rows[at + SYS_FLAG] & 0xC not in (0x0, 0x8)
            ):
                row += 1
                continue
            topic_at = rows[at + TOPIC_AT]
            key = (bytes(view[topic_at : topic_at + rows[at + TOPIC_LENGTH]]), rows[at + QUEUE_ID])
            queue_offset = rows[at + QUEUE_OFFSET]
            # only the queue's latest run may go on, so each queue's runs follow log order
            number = latest.get(key, -1)
            if number >= 0 and (
                found[number][RUN_FIRST_QUEUE_OFFSET] + found[number][RUN_UNITS] != queue_offset
            ):
                number = -1
            if number < 0:
                if len(found) == capacity:
                    break
                number = latest[key] = len(found)
                first_end = rows[at + PHYSICAL_OFFSET] + rows[at + TOTAL_SIZE]
                found.append([row, key[1], queue_offset, 0, 0, row, first_end])
            found[number][RUN_UNITS] += 1
            found[number][RUN_LAST_ROW] = row
            row_runs[row] = number
            row += 1
        unit_at = 0
        for run in found:
            run[RUN_UNITS_FROM] = unit_at
            unit_at += run[RUN_UNITS]
        written = [0] * len(found)
        for index in range(first, row):
            number = row_runs[index]
            if number < 0:
                continue
            at = index * ROW_WIDTH
            _UNIT.pack_into(
                units,
                (found[number][RUN_UNITS_FROM] + written[number]) * UNIT_SIZE,
                rows[at + PHYSICAL_OFFSET],
                rows[at + TOTAL_SIZE],
                dispatch_out[index * DISPATCH_WIDTH + TAGS_CODE],
            )
            written[number] += 1
        for number, run in enumerate(found):
            runs[number * RUN_WIDTH : (number + 1) * RUN_WIDTH] = type(runs)("q", run)
        return row, len(found)
    finally:
        view.release()


def records_at(
    buf: Any,
    spans: Any,
    count: int,
    base_offset: int,
    queue_id: int,
    topic: bytes,
    rows: Any,
) -> int:
    """See :mod:`rmqstore.kernel.layout`."""
    if count < 0 or count > len(rows) // ROW_WIDTH or 2 * count > len(spans):
        raise ValueError("records_at: more spans than rows or span pairs")
    view = memoryview(rows)
    for number in range(count):
        position, size = spans[2 * number], spans[2 * number + 1]
        if size <= 0 or position < 0 or position > len(buf) - size:
            return number
        at = number * ROW_WIDTH
        row = view[at : at + ROW_WIDTH]
        if scan(buf, position, position + size, base_offset, 0, 0, row)[0] != 1:
            return number
        topic_at, topic_length = rows[at + TOPIC_AT], rows[at + TOPIC_LENGTH]
        if (
            rows[at + TOTAL_SIZE] != size
            or rows[at + QUEUE_ID] != queue_id
            or bytes(buf[topic_at : topic_at + topic_length]) != topic
        ):
            return number
    return count


def valid_units(data: Any) -> int:
    """See :mod:`rmqstore.kernel.layout`."""
    count = 0
    for offset, size, _code in _UNIT.iter_unpack(
        memoryview(data)[: len(data) // UNIT_SIZE * UNIT_SIZE]
    ):
        if offset < 0 or size <= 0:
            break
        count += 1
    return count


def cut_index(data: Any, physical_offset: int) -> int:
    """See :mod:`rmqstore.kernel.layout`."""
    units = memoryview(data)[: len(data) // UNIT_SIZE * UNIT_SIZE]
    for index, (offset, size, _code) in enumerate(_UNIT.iter_unpack(units)):
        valid = offset >= 0 and size > 0
        if offset >= physical_offset and (valid or index == 0):
            return index
        if not valid:
            return -1
    return -1


def attention_rows(
    buf: Any, rows: Any, first: int, count: int, previous_time: int, options: int, found: Any
) -> int:
    """See :mod:`rmqstore.kernel.layout`."""
    if not 0 <= first <= count <= len(rows) // ROW_WIDTH or len(found) < count - first:
        raise ValueError("rows are outside their buffers")
    view = memoryview(buf)
    force = bool(options & FORCE_PROPERTY_CRC)
    schedule_only = bool(options & SCHEDULED_ONLY)
    number = 0
    try:
        for row in range(first, count):
            at = row * ROW_WIDTH
            stamp = rows[at + STORE_TIMESTAMP]
            topic_at = rows[at + TOPIC_AT]
            properties_at = rows[at + PROPERTIES_AT]
            props = bytes(view[properties_at : properties_at + rows[at + PROPERTIES_LENGTH]])
            topic = bytes(view[topic_at : topic_at + rows[at + TOPIC_LENGTH]])
            look = (
                topic == SCHEDULE_TOPIC
                if schedule_only
                else (
                    rows[at + CRC_STATUS] == CRC_BAD
                    or not props.isascii()
                    or force
                    or (props[-20:-12] == b"__CRC32#" and props[-1:] == b"\x02")
                    or topic == SCHEDULE_TOPIC
                    or stamp < previous_time
                )
            )
            previous_time = stamp
            if look:
                found[number] = row
                number += 1
    finally:
        view.release()
    return number


def index_chain(
    data: Any,
    first_number: int,
    slots: int,
    newest: Any,
    chain: Any,
    bad: Any,
    bad_capacity: int,
) -> int:
    """See :mod:`rmqstore.kernel.layout`."""
    if slots <= 0 or len(newest) < slots or len(bad) < bad_capacity * BAD_WIDTH:
        raise ValueError("index chain buffers are too small")
    previous_offset = chain[CHAIN_PREVIOUS_OFFSET]
    heads = chain[CHAIN_HEADS]
    first = chain[CHAIN_FIRST_OFFSET]
    last = chain[CHAIN_LAST_OFFSET]
    walked = chain[CHAIN_ENTRIES]
    found = 0
    units = memoryview(data)[: len(data) // _ENTRY_SIZE * _ENTRY_SIZE]
    for step, (key_hash, offset, time_diff, previous) in enumerate(_ENTRY.iter_unpack(units)):
        number = first_number + step
        slot = key_hash % slots
        if (
            key_hash < 0 or previous != newest[slot] or time_diff < 0 or offset < previous_offset
        ) and found < bad_capacity:
            bad[found * BAD_WIDTH : (found + 1) * BAD_WIDTH] = type(bad)(
                "q", (number, key_hash, offset, time_diff, previous, newest[slot])
            )
            found += 1
        newest[slot] = number
        heads += previous == 0
        previous_offset = offset
        if not walked:
            first = offset
        walked += 1
        last = offset
    chain[CHAIN_ENTRIES] = walked
    chain[CHAIN_PREVIOUS_OFFSET] = previous_offset
    chain[CHAIN_HEADS] = heads
    chain[CHAIN_FIRST_OFFSET] = first
    chain[CHAIN_LAST_OFFSET] = last
    return found


def match_keys(keys: Any, first: int, count: int, entries: Any) -> int:
    """See :mod:`rmqstore.kernel.layout`."""
    if first < 0 or count < 0 or (first + count) * HASHED_KEY_SIZE > len(keys):
        raise ValueError("keys are outside their buffer")
    available = min(count, len(entries) // _ENTRY_SIZE)
    for number in range(available):
        offset, _stamp, key_hash, _first = _HASHED_KEY.unpack_from(
            keys, (first + number) * HASHED_KEY_SIZE
        )
        entry_hash, entry_offset, _diff, _previous = _ENTRY.unpack_from(
            entries, number * _ENTRY_SIZE
        )
        if entry_hash != key_hash or entry_offset != offset:
            return number
    return available


_BORN_HOST_AT = 48  # TOTALSIZE .. BORNTIMESTAMP
_PROPERTY_NAMES = {FIELD_TAGS: b"TAGS", FIELD_KEYS: b"KEYS", FIELD_UNIQ_KEY: b"UNIQ_KEY"}


def _host_fields(rows: Any, at: int) -> tuple[int, int, int, int]:
    """Where the born host and store host fields of a row's record lie, and their lengths."""
    position = rows[at + POSITION]
    sys_flag = rows[at + SYS_FLAG]
    born_length = 20 if sys_flag & 0x10 else 8
    store_at = position + _BORN_HOST_AT + born_length + 8
    return position + _BORN_HOST_AT, born_length, store_at, 20 if sys_flag & 0x20 else 8


def _property_value(props: bytes, name: bytes) -> tuple[int, int]:
    """Where (in ``props``) the value of the last valid pair called ``name`` lies."""
    found = (0, SPAN_ABSENT)
    position = 0
    for pair in props.split(b"\x02"):
        pair_name, separator, value = pair.partition(b"\x01")
        if separator and pair_name == name and value:
            found = (position + len(pair_name) + 1, len(value))
        position += len(pair) + 1
    return found


def _row_fits(rows: Any, at: int, length: int) -> None:
    start = rows[at + POSITION]
    if not (start >= 0 and start + rows[at + TOTAL_SIZE] <= length):
        raise ValueError(f"row {at // ROW_WIDTH} points outside the buffer")


def field_spans(
    buf: Any, rows: Any, first: int, count: int, field: int, spans: Any
) -> tuple[int, int]:
    """See :mod:`rmqstore.kernel.layout`."""
    if not 0 <= first <= count <= len(rows) // ROW_WIDTH or len(spans) < 2 * (count - first):
        raise ValueError("rows are outside their buffers")
    if not FIELD_TOPIC <= field <= FIELD_UNIQ_KEY:
        raise ValueError(f"no field {field}")
    length = len(buf)
    total = absent = 0
    for row in range(first, count):
        at = row * ROW_WIDTH
        _row_fits(rows, at, length)
        if field == FIELD_TOPIC:
            span = (rows[at + TOPIC_AT], rows[at + TOPIC_LENGTH])
        elif field == FIELD_BODY:
            span = (rows[at + POSITION] + rows[at + HEADER_SIZE], rows[at + BODY_LENGTH])
        elif field == FIELD_PROPERTIES:
            span = (rows[at + PROPERTIES_AT], rows[at + PROPERTIES_LENGTH])
        elif field in (FIELD_BORN_HOST, FIELD_STORE_HOST):
            born_at, born_length, store_at, store_length = _host_fields(rows, at)
            span = (born_at, born_length) if field == FIELD_BORN_HOST else (store_at, store_length)
        else:
            props_at = rows[at + PROPERTIES_AT]
            props = bytes(buf[props_at : props_at + rows[at + PROPERTIES_LENGTH]])
            value_at, value_length = _property_value(props, _PROPERTY_NAMES[field])
            span = (props_at + value_at, value_length) if value_length >= 0 else (0, SPAN_ABSENT)
        if span[1] >= 0 and not (span[0] >= 0 and span[0] + span[1] <= length):
            raise ValueError(f"row {row} points outside the buffer")
        out = 2 * (row - first)
        spans[out], spans[out + 1] = span
        if span[1] == SPAN_ABSENT:
            absent += 1
        else:
            total += span[1]
    return total, absent


def gather(buf: Any, spans: Any, count: int, data: Any, offsets: Any) -> int:
    """See :mod:`rmqstore.kernel.layout`."""
    if not 0 <= count <= len(spans) // 2 or len(offsets) < count + 1:
        raise ValueError("spans are outside their buffers")
    view = memoryview(buf)
    written = 0
    try:
        offsets[0] = 0
        for number in range(count):
            at, size = spans[2 * number], spans[2 * number + 1]
            if size != SPAN_ABSENT:
                if not (at >= 0 and size >= 0 and at + size <= len(view)):
                    raise ValueError(f"span {number} is outside the buffer")
                if written + size > len(data) or written + size > 0x7FFFFFFF:
                    raise ValueError("the gathered bytes do not fit")
                data[written : written + size] = view[at : at + size]
                written += size
            offsets[number + 1] = written
    finally:
        view.release()
    return written


def property_pairs(
    buf: Any,
    rows: Any,
    first: int,
    count: int,
    spans: Any,
    keys: Any,
    key_offsets: Any,
    items: Any,
    item_offsets: Any,
    pair_offsets: Any,
    picked: Any,
) -> tuple[int, int, int, int]:
    """See :mod:`rmqstore.kernel.layout`."""
    picking = len(picked) > 0
    mapping = len(key_offsets) > 0 or len(item_offsets) > 0
    capacity = min(len(key_offsets), len(item_offsets)) - 1
    if (
        not 0 <= first <= count <= len(rows) // ROW_WIDTH
        or len(pair_offsets) < count - first + 1
        or (mapping and capacity < 0)
        or (picking and len(picked) < PICKED_WIDTH * (count - first))
    ):
        raise ValueError("rows are outside their buffers")
    record_capacity = len(spans) // 4  # the compiled kernel's working room for one record
    length = len(buf)
    pairs = key_bytes = item_bytes = 0
    pair_offsets[0] = 0
    if mapping:
        key_offsets[0] = item_offsets[0] = 0
    row = first
    while row < count:
        at = row * ROW_WIDTH
        props_at = rows[at + PROPERTIES_AT]
        props_length = rows[at + PROPERTIES_LENGTH]
        if not (props_at >= 0 and props_length >= 0 and props_at + props_length <= length):
            raise ValueError(f"row {row} points outside the buffer")
        props = bytes(buf[props_at : props_at + props_length])
        # name to (value at, value length); a later duplicate keeps the first one's place
        kept: dict[bytes, tuple[int, int]] = {}
        position = props_at
        for pair in props.split(b"\x02"):
            name, separator, value = pair.partition(b"\x01")
            if separator and name and value:
                kept[name] = (position + len(name) + 1, len(value))
            position += len(pair) + 1
        row_keys = sum(len(name) for name in kept)
        row_items = sum(value_length for _, value_length in kept.values())
        if len(kept) > record_capacity or (
            mapping
            and (
                pairs + len(kept) > capacity
                or key_bytes + row_keys > min(len(keys), 0x7FFFFFFF)
                or item_bytes + row_items > min(len(items), 0x7FFFFFFF)
            )
        ):
            break
        for name, (value_at, value_length) in kept.items():
            if mapping:
                keys[key_bytes : key_bytes + len(name)] = name
                key_bytes += len(name)
                items[item_bytes : item_bytes + value_length] = buf[
                    value_at : value_at + value_length
                ]
                item_bytes += value_length
                key_offsets[pairs + 1], item_offsets[pairs + 1] = key_bytes, item_bytes
            pairs += 1
        if picking:
            for which, name in enumerate(PICKED_NAMES):
                value_at, value_length = kept.get(name, (0, SPAN_ABSENT))
                at = 2 * (count - first) * which + 2 * (row - first)
                picked[at], picked[at + 1] = value_at, value_length
        row += 1
        pair_offsets[row - first] = pairs
    return row, pairs, key_bytes, item_bytes


def message_ids(buf: Any, rows: Any, first: int, count: int, data: Any, offsets: Any) -> int:
    """See :mod:`rmqstore.kernel.layout`."""
    if not 0 <= first <= count <= len(rows) // ROW_WIDTH or len(offsets) < count - first + 1:
        raise ValueError("rows are outside their buffers")
    length = len(buf)
    written = 0
    offsets[0] = 0
    for row in range(first, count):
        at = row * ROW_WIDTH
        _row_fits(rows, at, length)
        _, _, store_at, store_length = _host_fields(rows, at)
        if store_at + store_length > length:
            raise ValueError(f"row {row} points outside the buffer")
        text = (
            (
                bytes(buf[store_at : store_at + store_length])
                + (rows[at + PHYSICAL_OFFSET] & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "big")
            )
            .hex()
            .upper()
            .encode("ascii")
        )
        if written + len(text) > len(data):
            raise ValueError("the message ids do not fit")
        data[written : written + len(text)] = text
        written += len(text)
        offsets[row - first + 1] = written
    return written


def row_columns(rows: Any, first: int, count: int, columns: Any, out: Any) -> None:
    """See :mod:`rmqstore.kernel.layout`."""
    if len(columns) % 3 or not 0 <= first <= count <= len(rows) // ROW_WIDTH:
        raise ValueError("rows are outside their buffers")
    target = memoryview(out).cast("B")
    specs = [tuple(columns[k : k + 3]) for k in range(0, len(columns), 3)]
    done = count - first
    for column, width, at in specs:
        if width not in (4, 8):
            raise ValueError(f"width {width} is not 4 or 8")
        if not 0 <= column < ROW_WIDTH or at < 0 or at % width or width * done > len(target) - at:
            raise ValueError("rows are outside their buffers")
    found = []
    for column, width, at in specs:
        values = rows[first * ROW_WIDTH + column : count * ROW_WIDTH : ROW_WIDTH]
        found.append((width, at, values))
    # the native kernel goes row by row, every column of a row in turn: the value it refuses
    # is the first outside 32 bits in that order
    refused = [
        (row, number, value)
        for number, (width, _, values) in enumerate(found)
        if width == 4
        for row, value in enumerate(values)
        if not -(1 << 31) <= value < 1 << 31
    ]
    if refused:
        row, _, value = min(refused)
        raise ValueError(f"row {first + row}: {value} does not fit in 32 bits")
    for width, at, values in found:
        packed = array("i" if width == 4 else "q", values)
        target[at : at + width * done] = memoryview(packed).cast("B")


def host_keys(buf: Any, rows: Any, first: int, count: int, field: int, keys: Any) -> int:
    """See :mod:`rmqstore.kernel.layout`."""
    if field not in (FIELD_BORN_HOST, FIELD_STORE_HOST):
        raise ValueError(f"field {field} is not a host field")
    if not 0 <= first <= count <= len(rows) // ROW_WIDTH or len(keys) < count - first:
        raise ValueError("rows are outside their buffers")
    length = len(buf)
    for row in range(first, count):
        at = row * ROW_WIDTH
        born_at, born_length, store_at, store_length = _host_fields(rows, at)
        host_at, host_length = (
            (born_at, born_length) if field == FIELD_BORN_HOST else (store_at, store_length)
        )
        if host_length != 8:
            return row  # an IPv6 host
        _row_fits(rows, at, length)
        if host_at + 8 > length:
            raise ValueError(f"row {row} points outside the buffer")
        keys[row - first] = int.from_bytes(buf[host_at : host_at + 8], "big", signed=True)
    return count


_ITEM_HEADERS = {  # the fixed header with its hosts, by (sysFlag >> 4) & 3
    0: struct.Struct(">iiiiiqqiq8sq8siqi"),
    1: struct.Struct(">iiiiiqqiq20sq8siqi"),
    2: struct.Struct(">iiiiiqqiq8sq20siqi"),
    3: struct.Struct(">iiiiiqqiq20sq20siqi"),
}


def record_items(
    buf: Any, rows: Any, first: int, count: int, header_type: Any, names: Any, items: Any
) -> int:
    """See :mod:`rmqstore.kernel.layout`."""
    if not 0 <= first <= count <= len(rows) // ROW_WIDTH:
        raise ValueError("rows are outside their buffers")
    length = len(buf)
    new_header = tuple.__new__
    raw, topic = None, ""
    for row in range(first, count):
        at = row * ROW_WIDTH
        start = rows[at + POSITION]
        header = _ITEM_HEADERS[(rows[at + SYS_FLAG] >> 4) & 3]
        topic_at, topic_length = rows[at + TOPIC_AT], rows[at + TOPIC_LENGTH]
        props_at, props_length = rows[at + PROPERTIES_AT], rows[at + PROPERTIES_LENGTH]
        if not (
            0 <= start <= length - header.size
            and topic_at >= 0
            and 0 <= topic_length <= length - topic_at
            and props_at >= 0
            and 0 <= props_length <= length - props_at
        ):
            raise ValueError(f"row {row} points outside the buffer")
        if raw is None or buf[topic_at : topic_at + topic_length] != raw:
            raw = bytes(buf[topic_at : topic_at + topic_length])
            topic = names.get(raw)
            if topic is None:
                topic = names[raw] = raw.decode("utf-8")
        status = rows[at + CRC_STATUS]
        items.append(
            (
                rows[at + PHYSICAL_OFFSET],
                new_header(header_type, header.unpack_from(buf, start)),
                topic,
                bytes(buf[props_at : props_at + props_length]),
                None if status == CRC_UNCHECKED else status == CRC_GOOD,
            )
        )
    return count - first


def ascii_only(data: Any, length: int) -> bool:
    """See :mod:`rmqstore.kernel.layout`."""
    view = memoryview(data).cast("B")
    if not 0 <= length <= len(view):
        raise ValueError("length is outside the buffer")
    return view[:length].tobytes().isascii()


_PACK_HEADER = {  # the fixed header by (born host length, store host length)
    (8, 8): struct.Struct(">iiiiiqqiq8sq8siqi"),
    (20, 8): struct.Struct(">iiiiiqqiq20sq8siqi"),
    (8, 20): struct.Struct(">iiiiiqqiq8sq20siqi"),
    (20, 20): struct.Struct(">iiiiiqqiq20sq20siqi"),
}
_UNIQ_NAME = b"UNIQ_KEY\x01"


def pack_records(
    buf: Any,
    position: int,
    file_size: int,
    reserved: int,
    base_offset: int,
    messages: Any,
    first: int,
    count: int,
    bodies: Any,
    body_spans: Any,
    props: Any,
    prop_spans: Any,
    topics: Any,
    topic_table: Any,
    hosts: Any,
    host_table: Any,
    store_host: Any,
    slots: Any,
    key_prefix: Any,
    key_state: Any,
    out: Any,
) -> tuple[int, int, int, int]:
    """See :mod:`rmqstore.kernel.layout`."""
    if not (
        0 <= first <= count <= len(messages) // PACK_WIDTH
        and len(out) >= count * RESULT_WIDTH
        and len(body_spans) >= 2 * count
        and len(prop_spans) >= 2 * count
        and len(key_state) >= KEY_STATE_WIDTH
        and 0 <= position <= file_size <= len(buf)
        and len(store_host) in (8, 20)
    ):
        raise ValueError("records to pack are outside their buffers")
    store_field = bytes(store_host)
    prefix = bytes(key_prefix)
    trailing = key_state[KEY_TRAILING_SEPARATOR] == 1
    message = first
    while message < count:
        at = message * PACK_WIDTH
        topic_row = messages[at + PACK_TOPIC] * TOPIC_ROW_WIDTH
        host_row = messages[at + PACK_HOST] * HOST_ROW_WIDTH
        if not (0 <= topic_row <= len(topic_table) - TOPIC_ROW_WIDTH) or not (
            0 <= host_row <= len(host_table) - HOST_ROW_WIDTH
        ):
            raise ValueError(f"message {message} names no topic or host")
        topic = _span(
            topics, topic_table[topic_row + TOPIC_ROW_AT], topic_table[topic_row + TOPIC_ROW_LENGTH]
        )
        born = _span(
            hosts, host_table[host_row + HOST_ROW_AT], host_table[host_row + HOST_ROW_LENGTH]
        )
        body = _span(bodies, body_spans[2 * message], body_spans[2 * message + 1])
        properties = _span(props, prop_spans[2 * message], prop_spans[2 * message + 1])
        now = messages[at + PACK_NOW]
        if messages[at + PACK_UNIQ_KEY]:
            if not key_state[KEY_MONTH_START] <= now < key_state[KEY_NEXT_MONTH]:
                return message, position, NEW_MONTH, now
            counter = key_state[KEY_COUNTER]
            key = prefix + b"%08X%04X" % ((now - key_state[KEY_MONTH_START]) & 0xFFFFFFFF, counter)
            if trailing:
                properties = properties + _UNIQ_NAME + key + b"\x02"
            else:
                properties = properties + (b"\x02" + _UNIQ_NAME if properties else _UNIQ_NAME) + key
        else:
            counter = -1
        if len(born) not in (8, 20) or len(properties) > 32767:
            raise ValueError(f"message {message} has a bad host field or properties")
        header = _PACK_HEADER[(len(born), len(store_field))]
        total = header.size + len(body) + len(topic) + 2 + len(properties)
        if position + total + 8 > file_size:
            return message, position, NEEDS_ROLL, total
        if position + total > reserved:
            return message, position, NEEDS_RESERVE, position + total
        queue_id = messages[at + PACK_QUEUE_ID]
        sys_flag = (messages[at + PACK_SYS_FLAG] & ~0x30) | (0x10 if len(born) == 20 else 0)
        sys_flag |= 0x20 if len(store_field) == 20 else 0
        int32_fields = (
            queue_id,
            messages[at + PACK_FLAG],
            sys_flag,
            messages[at + PACK_RECONSUME_TIMES],
            topic_table[topic_row + TOPIC_ROW_MAGIC],
        )
        if not all(-(1 << 31) <= value < 1 << 31 for value in int32_fields):
            raise ValueError(f"message {message} has a 32-bit field out of range")
        if sys_flag & 0xC in (0x4, 0xC):  # PREPARED, ROLLBACK: no consume-queue unit
            queue_offset = 0
        else:
            span = key_state[KEY_QUEUE_SPAN]
            slot = messages[at + PACK_TOPIC] * span + queue_id
            if not (0 <= queue_id < span and 0 <= slot < len(slots)):
                raise ValueError(f"message {message} names a queue outside the slots")
            queue_offset = slots[slot]
            slots[slot] = queue_offset + 1
        if now > key_state[KEY_LAST_STAMP]:
            key_state[KEY_LAST_STAMP] = now
        stamp = key_state[KEY_LAST_STAMP]
        physical = base_offset + position
        header.pack_into(
            buf, position, total, topic_table[topic_row + TOPIC_ROW_MAGIC],
            zlib.crc32(body) & 0x7FFFFFFF, queue_id,
            messages[at + PACK_FLAG], queue_offset, physical, sys_flag,
            messages[at + PACK_BORN_TIMESTAMP], born, stamp, store_field,
            messages[at + PACK_RECONSUME_TIMES], messages[at + PACK_PREPARED_OFFSET], len(body),
        )  # fmt: skip
        cursor = position + header.size
        buf[cursor : cursor + len(body)] = body
        cursor += len(body)
        buf[cursor : cursor + len(topic)] = topic
        cursor += len(topic)
        buf[cursor : cursor + 2] = len(properties).to_bytes(2, "big")
        buf[cursor + 2 : cursor + 2 + len(properties)] = properties
        if counter >= 0:
            key_state[KEY_COUNTER] = (counter + 1) & 0xFFFF
        result = message * RESULT_WIDTH
        out[result + RESULT_PHYSICAL_OFFSET] = physical
        out[result + RESULT_QUEUE_OFFSET] = queue_offset
        out[result + RESULT_SIZE] = total
        out[result + RESULT_STORE_TIMESTAMP] = stamp
        position += total
        message += 1
    return message, position, PACKED_ALL, 0


def _span(data: Any, at: int, length: int) -> bytes:
    if not (at >= 0 and length >= 0 and at + length <= len(data)):
        raise ValueError("a span is outside its buffer")
    return bytes(data[at : at + length])


_DOCUMENT_FIELDS = frozenset(("topic", "body", "tags", "keys", "queueId"))
_INT32_MAX = (1 << 31) - 1


def document_rows(
    documents: list[Any],
    first: int,
    count: int,
    defaults: tuple[Any, ...],
    topics: dict[str, int],
    properties: dict[tuple[str | None, str | None], tuple[bytes, bool]],
    rows: Any,
    body_spans: Any,
    bodies: bytearray,
    prop_spans: Any,
    props: bytearray,
    state: Any,
) -> tuple[int, int, tuple[str | None, str | None] | None]:
    """See :mod:`rmqstore.kernel.layout`."""
    if not 0 <= first <= count <= len(documents):
        raise ValueError("documents are outside their list")
    if len(defaults) != DOC_DEFAULTS_WIDTH or len(state) < DOC_STATE_WIDTH:
        raise ValueError("defaults or state of the wrong width")
    default_topic = defaults[DOC_DEFAULT_TOPIC]
    default_queue_id = defaults[DOC_DEFAULT_QUEUE_ID]
    row_tail = (
        defaults[DOC_FLAG],
        defaults[DOC_SYS_FLAG],
        defaults[DOC_BORN_TIMESTAMP],
        defaults[DOC_HOST],
        defaults[DOC_RECONSUME_TIMES],
        defaults[DOC_PREPARED_OFFSET],
        0,  # PACK_NOW: the appender's
    )
    last_encoded: bytes | None = None
    props_at = 0
    for index in range(first, count):
        document = documents[index]
        if type(document) is not dict or not _DOCUMENT_FIELDS.issuperset(document):
            return index, DOC_OTHER, None
        topic = document.get("topic", default_topic)
        body = document.get("body", "")
        tags = document.get("tags")
        keys = document.get("keys")
        queue_id = document.get("queueId", default_queue_id)
        if (
            type(topic) is not str
            or not topic
            or type(body) is not str
            or (tags is not None and type(tags) is not str)
            or (keys is not None and type(keys) is not str)
            or type(queue_id) is not int
            or not 0 <= queue_id <= _INT32_MAX
        ):
            return index, DOC_OTHER, None
        key = (defaults[DOC_DEFAULT_TAGS] if tags is None else tags,
               defaults[DOC_DEFAULT_KEYS] if keys is None else keys)  # fmt: skip
        encoded = properties.get(key)
        if encoded is None:
            return index, DOC_NEEDS_PROPERTIES, key
        try:
            body_bytes = body.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: the general way names it
            return index, DOC_OTHER, None
        topic_row = topics.get(topic)
        if topic_row is None:
            topic_row = topics[topic] = len(topics)
        encoded_props, needs_key = encoded
        body_spans.extend((len(bodies), len(body_bytes)))
        bodies += body_bytes
        if encoded_props is not last_encoded:
            props_at = len(props)
            props += encoded_props
            last_encoded = encoded_props
        prop_spans.extend((props_at, len(encoded_props)))
        state[DOC_STATE_LONGEST_BODY] = max(state[DOC_STATE_LONGEST_BODY], len(body_bytes))
        state[DOC_STATE_LONGEST_PROPS] = max(state[DOC_STATE_LONGEST_PROPS], len(encoded_props))
        state[DOC_STATE_QUEUE_SPAN] = max(state[DOC_STATE_QUEUE_SPAN], queue_id + 1)
        rows.extend((topic_row, queue_id, *row_tail, 1 if needs_key else 0))
    return count, DOC_DONE, None


def result_lines(buf: Any, rows: Any, first: int, count: int, style: int, out: bytearray) -> int:
    """See :mod:`rmqstore.kernel.layout`."""
    if not 0 <= first <= count <= len(rows) // ROW_WIDTH:
        raise ValueError("rows are outside their buffers")
    if style not in (LINES_JSONL, LINES_PLAIN):
        raise ValueError(f"no line style {style}")
    length = len(buf)
    for row in range(first, count):
        at = row * ROW_WIDTH
        _row_fits(rows, at, length)
        _, _, store_at, store_length = _host_fields(rows, at)
        physical = rows[at + PHYSICAL_OFFSET]
        msg_id = (
            (
                _span(buf, store_at, store_length)
                + (physical & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "big")
            )
            .hex()
            .upper()
        )
        topic = _span(buf, rows[at + TOPIC_AT], rows[at + TOPIC_LENGTH]).decode(
            "utf-8", JAVA_REPLACE
        )
        props_at = rows[at + PROPERTIES_AT]
        props = _span(buf, props_at, rows[at + PROPERTIES_LENGTH])
        key_at, key_length = _property_value(props, b"UNIQ_KEY")
        key = (
            None
            if key_length == SPAN_ABSENT
            else props[key_at : key_at + key_length].decode("utf-8", JAVA_REPLACE)
        )
        queue_id, queue_offset = rows[at + QUEUE_ID], rows[at + QUEUE_OFFSET]
        size, stamp = rows[at + TOTAL_SIZE], rows[at + STORE_TIMESTAMP]
        if style == LINES_JSONL:
            text = (
                f'{{"msgId":"{msg_id}","topic":{json.dumps(topic, ensure_ascii=False)},'
                f'"queueId":{queue_id},"commitLogOffset":{physical},"queueOffset":{queue_offset},'
                f'"storeSize":{size},"storeTimestamp":{stamp},"uniqKey":'
                f"{'null' if key is None else json.dumps(key, ensure_ascii=False)}}}\n"
            )
        else:
            text = (
                f"{msg_id}  offset={physical}  queue={topic}:{queue_id}  "
                f"queueOffset={queue_offset}  size={size}"
                + (f"  uniqKey={key}" if key is not None else "")
                + "\n"
            )
        out += text.encode("utf-8")
    return count


def message_lines(
    buf: Any, rows: Any, first: int, count: int, body_mode: int, out: bytearray
) -> int:
    """See :mod:`rmqstore.kernel.layout`."""
    from rmqstore.documents import message_document  # the record layer imports the kernel
    from rmqstore.kernel.layout import BODY_MODE_NAMES, BODY_NONE
    from rmqstore.record import message_from_row

    if not 0 <= first <= count <= len(rows) // ROW_WIDTH:
        raise ValueError("rows are outside their buffers")
    if not 0 <= body_mode < len(BODY_MODE_NAMES):
        raise ValueError(f"no body mode {body_mode}")
    length = len(buf)
    mode = BODY_MODE_NAMES[body_mode]
    for row in range(first, count):
        _row_fits(rows, row * ROW_WIDTH, length)
        message = message_from_row(buf, rows, row, body=body_mode != BODY_NONE)
        document = message_document(message, mode)
        out += json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        out += b"\n"
    return count


def message_rows(
    buf: Any,
    rows: Any,
    first: int,
    count: int,
    body_mode: int,
    columns: bytes,
    delimiter: int,
    out: bytearray,
) -> int:
    """See :mod:`rmqstore.kernel.layout`."""
    from rmqstore.documents import delimited_row, document_cells, message_document
    from rmqstore.kernel.layout import BODY_MODE_NAMES, BODY_NONE, MESSAGE_COLUMNS, MOST_COLUMNS
    from rmqstore.record import message_from_row

    if not 0 <= first <= count <= len(rows) // ROW_WIDTH:
        raise ValueError("rows are outside their buffers")
    if not 0 <= body_mode < len(BODY_MODE_NAMES):
        raise ValueError(f"no body mode {body_mode}")
    if not 0 < len(columns) <= MOST_COLUMNS or max(columns) >= len(MESSAGE_COLUMNS):
        raise ValueError("no such columns")
    if delimiter not in (9, 44):
        raise ValueError(f"no delimiter {delimiter}")
    fields = [MESSAGE_COLUMNS[number] for number in columns]
    length = len(buf)
    mode = BODY_MODE_NAMES[body_mode]
    for row in range(first, count):
        _row_fits(rows, row * ROW_WIDTH, length)
        message = message_from_row(buf, rows, row, body=body_mode != BODY_NONE)
        cells = document_cells(message_document(message, mode), fields)
        out += delimited_row(cells, chr(delimiter)).encode("utf-8")
    return count


def _copy_pieces(buf: Any, rows: Any, row: int) -> tuple[int, list[tuple[int, int, int, int]], int]:
    """How many of the further queues row ``row`` names a broker's dispatch reaches (up to
    an offset ``Long.parseLong`` refuses), and its units in them as ``row_copies`` reads them
    (a negative offset writes none), each as ``(name_at, name_length, queue_id,
    queue_offset)`` (the name a span of ``buf``); and how many pieces the two properties name
    when they pair up (more than the first where the broker's dispatch throws), else 0."""
    length = len(buf)
    if not 0 <= row < len(rows) // ROW_WIDTH:
        raise ValueError(f"row {row} is outside the rows")
    at = row * ROW_WIDTH
    topic_at, topic_length = rows[at + TOPIC_AT], rows[at + TOPIC_LENGTH]
    props_at, props_length = rows[at + PROPERTIES_AT], rows[at + PROPERTIES_LENGTH]
    if not (
        topic_at >= 0
        and 0 <= topic_length <= length - topic_at
        and props_at >= 0
        and 0 <= props_length <= length - props_at
    ):
        raise ValueError(f"row {row} points outside the buffer")
    if rows[at + SYS_FLAG] & 0xC in (0x4, 0xC):
        return 0, [], 0  # PREPARED, ROLLBACK: in no queue
    topic = bytes(buf[topic_at : topic_at + topic_length])
    props = bytes(buf[props_at : props_at + props_length])
    if (topic.startswith((b"%RETRY%", b"rmq_sys_")) or topic == b"SCHEDULE_TOPIC_XXXX") and (
        not props or props[-1] == 0x02
    ):
        return 0, [], 0  # topics a 5.x broker gives no copies (a 4.9 one's records end otherwise)
    names_at, names_length = _property_value(props, b"INNER_MULTI_DISPATCH")
    offsets_at, offsets_length = _property_value(props, b"INNER_MULTI_QUEUE_OFFSET")
    if names_length == SPAN_ABSENT or offsets_length == SPAN_ABSENT:
        return 0, [], 0
    names_value = props[names_at : names_at + names_length]
    offsets_value = props[offsets_at : offsets_at + offsets_length]
    if _blank(names_value) or _blank(offsets_value):
        return 0, [], 0  # StringUtils.isBlank
    queue_names = java_split(names_value, b",")
    offsets = java_split(offsets_value, b",")
    if len(queue_names) != len(offsets):
        return 0, [], 0
    pieces = []
    name_at = props_at + names_at
    named = 0
    for raw, number in zip(queue_names, offsets, strict=True):
        value = java_ascii_long(number)
        if value is None:
            break  # Long.parseLong throws: the broker writes no later unit
        named += 1
        if value >= 0:  # a negative one writes none (its queue's end is past it)
            queue_id = 0 if raw.startswith(b"%LMQ%") else rows[at + QUEUE_ID]
            pieces.append((name_at, len(raw), queue_id, value))
        name_at += len(raw) + 1
    return named, pieces, len(offsets)


def _blank(value: bytes) -> bool:
    """Whether a property value is blank to ``StringUtils.isBlank`` once decoded."""
    return java_blank(value.decode("utf-8", JAVA_REPLACE))


def row_copies(buf: Any, rows: Any, numbers: Any, copy_type: Any, names: Any, out: Any) -> int:
    """See :mod:`rmqstore.kernel.layout`."""
    new_copy = tuple.__new__
    for row in numbers:
        _named, pieces, _paired = _copy_pieces(buf, rows, row)
        copies: list = []
        out.append(copies)
        for name_at, name_length, queue_id, value in pieces:
            raw = bytes(buf[name_at : name_at + name_length])
            name = names.get(raw)
            if name is None:
                name = names[raw] = raw.decode("utf-8", JAVA_REPLACE)
            copies.append(new_copy(copy_type, (name, queue_id, value)))
    return len(numbers)


def copy_stops(buf: Any, rows: Any, numbers: Any, out: Any) -> int:
    """See :mod:`rmqstore.kernel.layout`."""
    if len(out) < len(numbers):
        raise ValueError("out holds fewer integers than numbers")
    found = 0
    for row in numbers:
        named, _pieces, paired = _copy_pieces(buf, rows, row)
        if named < paired:
            out[found] = row
            found += 1
    return found


def copy_runs(
    buf: Any, rows: Any, numbers: Any, dispatch_out: Any, units: Any, runs: Any, scratch: Any
) -> tuple[int, int, int]:
    """See :mod:`rmqstore.kernel.layout`."""
    run_capacity = len(runs) // COPY_RUN_WIDTH
    unit_capacity = min(len(units) // UNIT_SIZE, len(scratch) // 2)
    found: list[list[int]] = []  # per run: its COPY_RUN_WIDTH integers
    latest: dict[tuple[bytes, int], int] = {}  # (name bytes, queue id) -> its latest run
    placed: list[tuple[int, int]] = []  # per unit: (run, row)
    done = 0
    for row in numbers:
        named, pieces, _paired = _copy_pieces(buf, rows, row)
        if not 0 <= row * DISPATCH_WIDTH <= len(dispatch_out) - DISPATCH_WIDTH:
            raise ValueError(f"row {row} is outside the dispatch output")
        if len(found) + named > run_capacity or len(placed) + named > unit_capacity:
            break
        for name_at, name_length, queue_id, value in pieces:
            key = (bytes(buf[name_at : name_at + name_length]), queue_id)
            number = latest.get(key, -1)
            if number >= 0 and (
                found[number][COPY_RUN_FIRST_QUEUE_OFFSET] + found[number][COPY_RUN_UNITS] != value
            ):
                number = -1
            if number < 0:
                number = latest[key] = len(found)
                found.append([name_at, name_length, queue_id, value, 0, 0, row])
            found[number][COPY_RUN_UNITS] += 1
            found[number][COPY_RUN_LAST_ROW] = row
            placed.append((number, row))
        done += 1
    filled = [0] * len(found)
    unit_at = 0
    for run in found:
        run[COPY_RUN_UNITS_FROM] = unit_at
        unit_at += run[COPY_RUN_UNITS]
    for number, row in placed:
        run = found[number]
        _UNIT.pack_into(
            units,
            (run[COPY_RUN_UNITS_FROM] + filled[number]) * UNIT_SIZE,
            rows[row * ROW_WIDTH + PHYSICAL_OFFSET],
            rows[row * ROW_WIDTH + TOTAL_SIZE],
            dispatch_out[row * DISPATCH_WIDTH + TAGS_CODE],
        )
        filled[number] += 1
    for number, run in enumerate(found):
        runs[number * COPY_RUN_WIDTH : (number + 1) * COPY_RUN_WIDTH] = type(runs)("q", run)
    for index, (number, row) in enumerate(placed):
        scratch[2 * index], scratch[2 * index + 1] = number, row
    return done, len(found), len(placed)


def text_rows(parts: list[Any], count: int, out: bytearray) -> int:
    """See :mod:`rmqstore.kernel.layout`."""
    if not 0 <= count <= 1 << 60:
        raise ValueError("a row count below 0 or past what one call may write")
    prepared: list[Any] = []
    for part in parts:
        if type(part) is bytes:
            prepared.append(part)
            continue
        if type(part) is not tuple or len(part) != 5:
            raise ValueError("a part is bytes or (encoding, width, offsets, data, first)")
        encoding, width, offsets, data, first = part
        if type(encoding) is not int or type(width) is not int or type(first) is not int:
            raise ValueError("a column's encoding, offset width and first row are ints")
        if encoding not in (TEXT_AS_IS, TEXT_BASE64, TEXT_DECIMAL) or width not in (4, 8):
            raise ValueError("a column's encoding or offset width is not one there is")
        offset_bytes = memoryview(offsets).cast("B")
        values = memoryview(data).cast("B")
        numbers = count if encoding == TEXT_DECIMAL else count + 1
        if first < 0 or (first + numbers) * width > len(offset_bytes):
            raise ValueError("a column's offsets are fewer than its rows")
        window = offset_bytes[first * width : (first + numbers) * width]
        bounds = window.cast("i" if width == 4 else "q").tolist()
        if encoding == TEXT_DECIMAL:
            prepared.append([str(number).encode() for number in bounds])
            continue
        for start, end in pairwise(bounds):
            if not 0 <= start <= end <= len(values):
                raise ValueError("a column's offset is outside its data or decreasing")
        prepared.append((encoding == TEXT_BASE64, bounds, values))
    pieces: list[bytes] = []
    for row in range(count):
        for part in prepared:
            if type(part) is bytes:
                pieces.append(part)
            elif type(part) is list:
                pieces.append(part[row])
            else:
                encoded, bounds, values = part
                value = bytes(values[bounds[row] : bounds[row + 1]])
                pieces.append(b64encode(value) if encoded else value)
    text = b"".join(pieces)
    out += text
    return len(text)
