"""The record kernel in pure Python: the reference the compiled kernel is tested against, and
the path that runs where no compiled kernel was built. Same interface and results as
``rmqstore.kernel._native`` (see :mod:`rmqstore.kernel.layout`)."""

from __future__ import annotations

import struct
import zlib
from typing import Any

from rmqstore.kernel.layout import (
    CHECK_CRC,
    CRC_BAD,
    CRC_GOOD,
    CRC_UNCHECKED,
    PROPERTY_CRC,
    ROW_WIDTH,
    STOP_ON_CRC_ERROR,
    Problem,
    Stop,
)

MAGIC_V1 = -626843481
MAGIC_V2 = -626843477
MAGIC_BLANK = -875286124
IPV4_HEADER = 88  # the fixed header with two IPv4 hosts
MIN_RECORD_LENGTH = IPV4_HEADER + 3  # empty body, topic and properties
CRC_PROPERTY_LENGTH = 20  # "__CRC32#" 0x01, ten digits, 0x02
_CRC_PROPERTY_PREFIX = b"__CRC32#\x01"

_SIZE_AND_MAGIC = struct.Struct(">ii")
# BODYCRC QUEUEID FLAG QUEUEOFFSET PHYSICALOFFSET SYSFLAG BORNTIMESTAMP, from byte 8
_FRONT = struct.Struct(">iiiqqiq")
_INT = struct.Struct(">i")
_LONG = struct.Struct(">q")
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
    unpack_front = _FRONT.unpack_from
    unpack_int = _INT.unpack_from
    unpack_long = _LONG.unpack_from
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
            body_crc, queue_id, flag, queue_offset, physical, sys_flag, born = unpack_front(
                buf, position + 8
            )
            born_length = 20 if sys_flag & 0x10 else 8
            store_length = 20 if sys_flag & 0x20 else 8
            header_size = 72 + born_length + store_length
            if header_size + 3 > total:
                return done(Stop.INVALID, total, Problem.HEADER_TOO_SMALL)
            stored_at = position + 48 + born_length
            store_timestamp = unpack_long(buf, stored_at)[0]
            reconsume_times = unpack_int(buf, stored_at + 8 + store_length)[0]
            prepared = unpack_long(buf, stored_at + 12 + store_length)[0]
            body_length = unpack_int(buf, position + header_size - 4)[0]
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
