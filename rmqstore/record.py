"""Commit-log record codec (spec §2.2-2.8): V1 and V2 records, IPv4/IPv6 host fields, BLANK
records, body CRC and the 5.x ``__CRC32#`` property. Pure functions over bytes-like objects.

This module encodes records and decodes one record into a :class:`Message`; walking many
records (the acceptance rules of spec §2.7, at speed) is the record kernel's
(:mod:`rmqstore.kernel`), and :class:`RegionScan` is its per-record face.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NamedTuple

from rmqstore import kernel
from rmqstore.checksum import (
    CRC32_PROPERTY_NAME,
    CRC32_RESERVED_LEN,
    body_crc,
    crc_property_bytes,
    decode_crc_digits,
    record_crc,
)
from rmqstore.delay import bad_delay_error
from rmqstore.errors import InputError, RecordError
from rmqstore.hosts import DEFAULT_BORN_HOST, DEFAULT_STORE_HOST, HostAddress
from rmqstore.javavalues import parse_java_int
from rmqstore.kernel import layout as kernel_layout
from rmqstore.msgid import offset_msg_id
from rmqstore.properties import DELAY, KEYS, TAGS, UNIQ_KEY, decode_properties
from rmqstore.windows import BufferWindows, FileWindows

MAGIC_V1 = -626843481  # 0xDAA320A7 read as a Java int
MAGIC_V2 = -626843477  # 0xDAA320AB
MAGIC_BLANK = -875286124  # 0xCBD43194
BLANK_MIN_LENGTH = 8  # END_FILE_MIN_BLANK_LENGTH: a message needs size + 8 <= space left

# SYSFLAG bits (spec §2.4)
COMPRESSED_FLAG = 0x1
MULTI_TAGS_FLAG = 0x2
TRANSACTION_MASK = 0xC
TRANSACTION_NOT_TYPE = 0x0
TRANSACTION_PREPARED = 0x4
TRANSACTION_COMMIT = 0x8
TRANSACTION_ROLLBACK = 0xC
# the transaction types a broker puts into consume queues (the others wait for a decision)
QUEUED_TRANSACTIONS = (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT)
BORNHOST_V6_FLAG = 0x10
STOREHOST_V6_FLAG = 0x20
COMPRESSION_TYPE_MASK = 0x700
TRANSACTION_NAMES = {0x0: "NOT_TYPE", 0x4: "PREPARED", 0x8: "COMMIT", 0xC: "ROLLBACK"}

# Fixed header: TOTALSIZE .. BODYLENGTH. Variants by (bornV6, storeV6) = (sysFlag >> 4) & 3.
_HEADER_FORMATS = {
    0: ">iiiiiqqiq8sq8siqi",
    1: ">iiiiiqqiq20sq8siqi",
    2: ">iiiiiqqiq8sq20siqi",
    3: ">iiiiiqqiq20sq20siqi",
}
_HEADERS = {key: struct.Struct(fmt) for key, fmt in _HEADER_FORMATS.items()}
HEADER_IPV4 = _HEADERS[0]
_SIZE_AND_MAGIC = struct.Struct(">ii")
_SHORT = struct.Struct(">h")

# positions in the header tuple
H_TOTAL_SIZE = 0
H_MAGIC = 1
H_BODY_CRC = 2
H_QUEUE_ID = 3
H_FLAG = 4
H_QUEUE_OFFSET = 5
H_PHYSICAL_OFFSET = 6
H_SYS_FLAG = 7
H_BORN_TIMESTAMP = 8
H_BORN_HOST = 9
H_STORE_TIMESTAMP = 10
H_STORE_HOST = 11
H_RECONSUME_TIMES = 12
H_PREPARED_OFFSET = 13
H_BODY_LENGTH = 14


class RecordHeader(NamedTuple):
    """The fixed header of a message record (TOTALSIZE .. BODYLENGTH), by name (the ``H_*``
    positions index it too). Hosts are the raw 8- or 20-byte fields."""

    total_size: int
    magic: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    physical_offset: int
    sys_flag: int
    born_timestamp: int
    born_host: bytes
    store_timestamp: int
    store_host: bytes
    reconsume_times: int
    prepared_offset: int
    body_length: int


_HOST_FLAGS = BORNHOST_V6_FLAG | STOREHOST_V6_FLAG
_MIN_RECORD_LENGTH = HEADER_IPV4.size + 1 + 2  # empty body, topic and properties


def header_struct(sys_flag: int) -> struct.Struct:
    return _HEADERS[(sys_flag >> 4) & 3]


def record_length(
    sys_flag: int, body_length: int, topic_length: int, props_length: int, version: int = 1
) -> int:
    """TOTALSIZE implied by the fields (spec §2.2 formula)."""
    topic_length_size = 2 if version == 2 else 1
    return (
        header_struct(sys_flag).size
        + max(body_length, 0)
        + topic_length_size
        + topic_length
        + 2
        + max(props_length, 0)
    )


class BodyMode(Enum):
    """What decoding does with the body: one parser, three costs."""

    SKIP = "skip"  # do not copy the body (Message.body is None)
    READ = "read"  # copy the body
    VERIFY = "verify"  # copy it and check BODYCRC (RecordError on mismatch)


@dataclass(slots=True)
class Message:
    """One commit-log message record, with RocketMQ's field meanings."""

    topic: str
    body: bytes | None = b""
    queue_id: int = 0
    flag: int = 0
    properties: dict[str, str] = field(default_factory=dict)
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: HostAddress = DEFAULT_BORN_HOST
    store_timestamp: int = 0
    store_host: HostAddress = DEFAULT_STORE_HOST
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    queue_offset: int = 0
    physical_offset: int = 0
    body_crc: int = 0
    store_size: int = 0
    body_length: int = 0
    version: int = 1
    properties_bytes: bytes = b""

    @property
    def tags(self) -> str | None:
        return self.properties.get(TAGS)

    @property
    def keys(self) -> str | None:
        return self.properties.get(KEYS)

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(UNIQ_KEY)

    @property
    def transaction_type(self) -> int:
        return self.sys_flag & TRANSACTION_MASK

    @property
    def msg_id(self) -> str:
        return offset_msg_id(self.store_host, self.physical_offset)

    def fields(self) -> dict[str, Any]:
        """The message's fields under RocketMQ's names, body excluded (used by every output)."""
        return {
            "msgId": self.msg_id,
            "topic": self.topic,
            "queueId": self.queue_id,
            "queueOffset": self.queue_offset,
            "commitLogOffset": self.physical_offset,
            "storeSize": self.store_size,
            "bodyCRC": self.body_crc,
            "flag": self.flag,
            "sysFlag": self.sys_flag,
            "bornTimestamp": self.born_timestamp,
            "bornHost": str(self.born_host),
            "storeTimestamp": self.store_timestamp,
            "storeHost": str(self.store_host),
            "reconsumeTimes": self.reconsume_times,
            "preparedTransactionOffset": self.prepared_transaction_offset,
            "properties": dict(self.properties),
            "tags": self.tags,
            "keys": self.keys,
            "uniqKey": self.uniq_key,
            "bodyLength": self.body_length,
            "version": f"V{self.version}",
        }


def host_flags(born_host: HostAddress, store_host: HostAddress) -> int:
    """The V6 sysFlag bits a broker sets from the socket address types."""
    return (BORNHOST_V6_FLAG if born_host.is_ipv6 else 0) | (
        STOREHOST_V6_FLAG if store_host.is_ipv6 else 0
    )


def encode_record(message: Message, *, append_crc_property: bool = False) -> bytes:
    """Encode ``message`` exactly as a broker writes it.

    ``properties_bytes`` is used as given (so a decoded record re-encodes byte-identically);
    when empty, ``properties`` is not serialised here (callers encode properties first). The
    V6 sysFlag bits are derived from the host addresses and BODYCRC is recomputed, as the
    broker does. ``append_crc_property`` adds the 5.x ``__CRC32#`` property (spec §2.6).
    """
    body = message.body or b""
    topic = message.topic.encode("utf-8")
    props = message.properties_bytes
    sys_flag = (message.sys_flag & ~_HOST_FLAGS) | host_flags(message.born_host, message.store_host)
    if append_crc_property:
        if props and not props.endswith(b"\x02"):
            props += b"\x02"
        props += bytes(CRC32_RESERVED_LEN)
    if message.version == 2:
        if len(topic) > 32767:
            raise InputError("topic is too long for a V2 record")
        topic_field = len(topic).to_bytes(2, "big") + topic
    else:
        if len(topic) > 127:
            raise InputError(f"topic is {len(topic)} bytes; a V1 record allows at most 127")
        topic_field = bytes([len(topic)]) + topic
    if len(props) > 32767:
        raise InputError(f"properties are {len(props)} bytes; a record allows at most 32767")
    header = header_struct(sys_flag)
    total = header.size + len(body) + len(topic_field) + 2 + len(props)
    record = bytearray(total)
    header.pack_into(
        record,
        0,
        total,
        MAGIC_V2 if message.version == 2 else MAGIC_V1,
        body_crc(body),
        message.queue_id,
        message.flag,
        message.queue_offset,
        message.physical_offset,
        sys_flag,
        message.born_timestamp,
        message.born_host.to_field(),
        message.store_timestamp,
        message.store_host.to_field(),
        message.reconsume_times,
        message.prepared_transaction_offset,
        len(body),
    )
    position = header.size
    record[position : position + len(body)] = body
    position += len(body)
    record[position : position + len(topic_field)] = topic_field
    position += len(topic_field)
    _SHORT.pack_into(record, position, len(props))
    record[position + 2 :] = props
    if append_crc_property:
        crc = record_crc(memoryview(record)[: total - CRC32_RESERVED_LEN])
        record[total - CRC32_RESERVED_LEN :] = crc_property_bytes(crc)
    return bytes(record)


def encode_blank(length: int) -> bytes:
    """The 8 header bytes of a BLANK record that declares ``length`` bytes."""
    return _SIZE_AND_MAGIC.pack(length, MAGIC_BLANK)


def _fail(field_name: str, offset: int, reason: str) -> RecordError:
    return RecordError(field_name, offset, reason)


def decode_message(
    buf: Any,
    position: int = 0,
    *,
    physical_offset: int | None = None,
    body: BodyMode = BodyMode.READ,
    verify_property_crc: bool = False,
) -> Message:
    """Decode the message record at ``position`` of ``buf``: the record kernel scans it as one
    row (the acceptance rules of spec §2.7 in their one place), and the row is built into a
    :class:`Message`.

    ``physical_offset`` is where the record lives in the commit log; when given, the stored
    PHYSICALOFFSET must equal it. ``BodyMode.VERIFY`` checks BODYCRC as recovery does (not for
    an empty body). Every failure is a :class:`RecordError` naming the field.
    """
    where = position if physical_offset is None else physical_offset
    end = len(buf)
    if end - position < 8:
        raise _fail("TOTALSIZE", where, f"is missing: only {max(end - position, 0)} bytes remain")
    total, magic = _SIZE_AND_MAGIC.unpack_from(buf, position)
    if magic == MAGIC_BLANK:
        raise _fail("MAGICCODE", where, "is BLANK: end-of-file filler, not a message")
    if magic not in (MAGIC_V1, MAGIC_V2):
        raise _fail("MAGICCODE", where, f"0x{magic & 0xFFFFFFFF:08X} is not a message magic code")
    if total > end - position:
        raise _fail(
            "TOTALSIZE",
            where,
            f"{total} runs past the end of the data ({end - position} bytes remain)",
        )
    if physical_offset is None:  # the record is taken to be where it says it is
        stored_at = position + _PHYSICAL_OFFSET_AT
        physical_offset = (
            int.from_bytes(buf[stored_at : stored_at + 8], "big", signed=True)
            if stored_at + 8 <= position + total
            else position
        )
    options = (
        kernel_layout.CHECK_CRC | kernel_layout.STOP_ON_CRC_ERROR if body is BodyMode.VERIFY else 0
    )
    rows = kernel_layout.new_rows(1)
    count, _stop, _end, value, _failed, problem = kernel.scan(
        buf, position, end, physical_offset - position, 0, options, rows
    )
    if count != 1:
        field_name, reason = kernel_layout.describe(problem, value)
        raise _fail(field_name, where, reason)
    if verify_property_crc:
        check_property_crc(buf, position, total, where)
    return message_from_row(buf, rows, 0, body=body is not BodyMode.SKIP)


def message_from_row(buf: Any, rows: Any, row: int, *, body: bool = True) -> Message:
    """The :class:`Message` of row ``row`` of a kernel scan of ``buf`` (``body=False``: the
    body left out)."""
    at = row * _ROW_WIDTH
    start = rows[at]
    sys_flag = rows[at + _SYS_FLAG]
    fields = header_struct(sys_flag).unpack_from(buf, start)
    body_at = start + rows[at + _HEADER_SIZE]
    body_length = rows[at + _BODY_LENGTH]
    topic_at = rows[at + _TOPIC_AT]
    properties_at = rows[at + _PROPERTIES_AT]
    props_bytes = bytes(buf[properties_at : properties_at + rows[at + _PROPERTIES_LENGTH]])
    return Message(
        topic=bytes(buf[topic_at : topic_at + rows[at + _TOPIC_LENGTH]]).decode("utf-8"),
        body=bytes(buf[body_at : body_at + body_length]) if body else None,
        queue_id=fields[H_QUEUE_ID],
        flag=fields[H_FLAG],
        properties=decode_properties(props_bytes),
        sys_flag=sys_flag,
        born_timestamp=fields[H_BORN_TIMESTAMP],
        born_host=HostAddress.from_field(fields[H_BORN_HOST]),
        store_timestamp=fields[H_STORE_TIMESTAMP],
        store_host=HostAddress.from_field(fields[H_STORE_HOST]),
        reconsume_times=fields[H_RECONSUME_TIMES],
        prepared_transaction_offset=fields[H_PREPARED_OFFSET],
        queue_offset=fields[H_QUEUE_OFFSET],
        physical_offset=fields[H_PHYSICAL_OFFSET],
        body_crc=fields[H_BODY_CRC],
        store_size=fields[H_TOTAL_SIZE],
        body_length=body_length,
        version=rows[at + _VERSION],
        properties_bytes=props_bytes,
    )


def property_crc_status(buf: Any, position: int, total: int) -> bool | None:
    """True/False when the record ends with a ``__CRC32#`` property that does/does not match;
    None when it has none."""
    tail = bytes(buf[position + total - CRC32_RESERVED_LEN : position + total])
    prefix = CRC32_PROPERTY_NAME.encode("ascii") + b"\x01"
    if not (tail.startswith(prefix) and tail.endswith(b"\x02")):
        return None
    try:
        stored = decode_crc_digits(tail[len(prefix) : -1])
    except ValueError:
        return False
    return stored == record_crc(memoryview(buf)[position : position + total - CRC32_RESERVED_LEN])


def check_property_crc(buf: Any, position: int, total: int, where: int) -> None:
    status = property_crc_status(buf, position, total)
    if status is None:
        raise _fail("PROPERTIES", where, f"has no {CRC32_PROPERTY_NAME} property")
    if not status:
        raise _fail("PROPERTIES", where, f"{CRC32_PROPERTY_NAME} does not match the record")


def decompress_body(message: Message) -> bytes:
    """The producer's original body: zlib-inflated when COMPRESSED_FLAG says ZLIB (type 0 or 3).

    The store never compresses; LZ4 and ZSTD bodies (types 1 and 2) are not supported here.
    """
    return inflate_body(message.body or b"", message.sys_flag, message.physical_offset)


def inflate_body(body: bytes, sys_flag: int, physical_offset: int) -> bytes:
    """``body`` as the producer sent it, given its record's sysFlag (see
    :func:`decompress_body`); an InputError names the record when it cannot be."""
    if not sys_flag & COMPRESSED_FLAG:
        return body
    compression = (sys_flag & COMPRESSION_TYPE_MASK) >> 8
    if compression not in (0, 3):
        name = {1: "LZ4", 2: "ZSTD"}.get(compression, f"type {compression}")
        raise InputError(
            f"message at {physical_offset} is {name}-compressed; "
            "only ZLIB bodies can be decompressed"
        )
    try:
        return zlib.decompress(body)
    except zlib.error as exc:
        raise InputError(f"message at {physical_offset}: body does not inflate: {exc}") from None


class ScanStop(Enum):
    """Why a scan of one file region stopped."""

    BLANK = "blank"  # a BLANK record: the file is complete
    INVALID = "invalid"  # non-zero bytes that are not a valid record (torn or corrupt)
    END = "end"  # zeros or the end of the data: nothing more was written


class RegionScan:
    """Walks the records of one commit-log file region, the per-record face of the record
    kernel (:mod:`rmqstore.kernel`): ``buf`` is the region in memory (bytes or a map) or, given
    ``windows``, a :class:`rmqstore.windows.FileWindows` reading the file piece by piece.

    Iterating yields ``(physical_offset, header, topic, properties_bytes, crc_ok)`` for each
    valid message, where ``header`` is the unpacked fixed-header tuple (index it with the
    ``H_*`` constants) and ``crc_ok`` is None unless ``check_crc``. A record with a bad body CRC
    is yielded with ``crc_ok=False`` and counted, or ends the scan as invalid when
    ``stop_on_crc_error`` (recovery's rule). After iteration
    ``stop``, ``end_position`` (file position where valid records end), ``blank_length`` and
    ``error`` say how it ended. :meth:`batches` gives the kernel's row batches instead.
    While a record is yielded, ``window`` holds it, from file position ``window_start``.
    """

    __slots__ = (
        "_topics",
        "base_offset",
        "batch_rows",
        "blank_length",
        "check_delay",
        "crc_failures",
        "end_position",
        "error",
        "options",
        "start",
        "stop",
        "window",
        "window_start",
        "windows",
    )

    def __init__(
        self,
        buf: Any,
        start: int,
        limit: int,
        base_offset: int,
        check_crc: bool = False,
        *,
        stop_on_crc_error: bool = False,
        property_crc: bool = False,
        check_delay: bool = False,
        windows: Any = None,
        batch_rows: int = 0,
    ) -> None:
        """``batch_rows``: rows per batch (0: the default, 4096). ``check_delay``: a
        SCHEDULE_TOPIC_XXXX record whose DELAY a broker cannot parse ends the scan as
        invalid (:func:`first_unparsed_delay`), as it ends a broker's recovery walk."""
        self.windows = windows if windows is not None else BufferWindows(buf, limit)
        self.batch_rows = batch_rows or _BATCH_ROWS
        self.start = start
        self.base_offset = base_offset
        self.options = (
            (kernel_layout.CHECK_CRC if check_crc else 0)
            | (kernel_layout.STOP_ON_CRC_ERROR if stop_on_crc_error else 0)
            | (kernel_layout.PROPERTY_CRC if property_crc else 0)
        )
        self.check_delay = check_delay
        self.end_position = start
        self.stop: ScanStop | None = None
        self.blank_length = 0
        self.crc_failures = 0
        self.error: RecordError | None = None
        self.window: Any = None  # the bytes of the batch being yielded (see batches)
        self._topics = kernel_layout.TopicNames()
        self.window_start = 0  # the file position of window[0]

    def batches(self) -> Iterator[tuple[Any, int, Any, int]]:
        """``(window, window_start, rows, count)`` per kernel call: ``rows`` holds ``count``
        rows (:mod:`rmqstore.kernel.layout`) whose positions index ``window``, which starts at
        file position ``window_start``. The rows and the window are reused by the next batch.
        Every record the kernel checked counts into ``crc_failures``."""
        return self._batches(count_failures=True)

    def _batches(self, *, count_failures: bool) -> Iterator[tuple[Any, int, Any, int]]:
        rows = kernel_layout.new_rows(self.batch_rows)
        scan = kernel.scan
        windows = self.windows
        base = self.base_offset
        position = self.start
        need = 0
        self.end_position = position
        if position > windows.limit:  # past the region's bytes (a file cut short): no record
            self.stop = ScanStop.END
            return
        while True:
            window, window_start, available, room = windows.window(position, need)
            count, stop, end, value, failures, problem = scan(
                window,
                position - window_start,
                available,
                base + window_start,
                room,
                self.options,
                rows,
            )
            refused = first_unparsed_delay(window, rows, count) if self.check_delay else None
            if refused is not None:  # the batch ends before it, and so does the scan
                row = refused[0]
                if count_failures:
                    after = rows[row * _ROW_WIDTH + _CRC_STATUS : count * _ROW_WIDTH : _ROW_WIDTH]
                    failures -= after.count(_CRC_BAD)
                count = row
                end = rows[row * _ROW_WIDTH + _PHYSICAL_OFFSET] - base - window_start
            if count_failures:
                self.crc_failures += failures
            if count:
                self.window, self.window_start = window, window_start
                yield window, window_start, rows, count
            position = window_start + end
            if refused is not None:
                self.end_position = position
                self.stop, self.error = ScanStop.INVALID, refused[1]
                return
            self.end_position = position
            if stop == _ROWS_FULL:
                need = 0
                continue
            if stop == _MORE_DATA:
                need = value
                continue
            self.stop = _STOPS[stop]
            if stop == _BLANK:
                self.blank_length = value
            elif stop == _INVALID:
                field_name, reason = kernel_layout.describe(problem, value)
                self.error = RecordError(field_name, base + position, reason)
                if not count_failures and problem in (_BODY_CRC_PROBLEM, _PROPERTY_CRC_PROBLEM):
                    self.crc_failures += 1  # the record that stopped the scan
            return

    def __iter__(self) -> Iterator[tuple[int, RecordHeader, str, bytes, bool | None]]:
        # the Python API's per-record iterator: the kernel makes a batch's items at once
        # (record_items); a stop part-way leaves end_position at the start of the batch it
        # stopped in (where reading again finds every record not yet yielded)
        names = self._topics.names
        base = self.base_offset
        crc_at, width = _CRC_STATUS, _ROW_WIDTH
        position = self.start
        try:
            # failures are counted as records are yielded: a caller may stop part-way
            for window, window_start, rows, count in self._batches(count_failures=False):
                position = rows[_PHYSICAL_OFFSET] - base
                if _CRC_BAD in rows[crc_at : count * width : width]:
                    for item in self.items(window, window_start, rows, count):
                        position = item[0] - base
                        yield item
                    continue
                items: list[tuple[int, RecordHeader, str, bytes, bool | None]] = []
                kernel.record_items(window, rows, 0, count, RecordHeader, names, items)
                yield from items
            position = self.end_position
        finally:
            self.end_position = position

    def items(
        self, window: Any, window_start: int, rows: Any, count: int
    ) -> Iterator[tuple[int, RecordHeader, str, bytes, bool | None]]:
        """The per-record items (see the class) of one batch of :meth:`batches`, each
        failed CRC check counted as it is yielded."""
        items: list[tuple[int, RecordHeader, str, bytes, bool | None]] = []
        kernel.record_items(window, rows, 0, count, RecordHeader, self._topics.names, items)
        for item in items:
            if item[4] is False:
                self.crc_failures += 1
            yield item


def first_unparsed_delay(buf: Any, rows: Any, count: int) -> tuple[int, RecordError] | None:
    """The first of ``count`` kernel rows of ``buf`` a broker's ``checkMessageAndReturnSize``
    finds invalid beyond what the kernel checks (spec §2.7 step 7: its recovery stops there,
    as at a torn record, and its dispatch stops there), with the error: a
    SCHEDULE_TOPIC_XXXX record whose DELAY is not a Java int (a broker refuses to store such
    a message, so only damage or a hand-made record holds one). None when there is none."""
    if not count:
        return None
    found = kernel_layout.zeroed(count)
    scheduled = kernel.attention_rows(buf, rows, 0, count, -1, kernel_layout.SCHEDULED_ONLY, found)
    for row in found[:scheduled]:
        at = row * _ROW_WIDTH
        properties_at = rows[at + _PROPERTIES_AT]
        properties = bytes(buf[properties_at : properties_at + rows[at + _PROPERTIES_LENGTH]])
        if b"DELAY" not in properties:
            continue
        level = decode_properties(properties).get(DELAY)
        if level is None:
            continue
        try:
            parse_java_int(level)
        except ValueError:
            return row, bad_delay_error(rows[at + _PHYSICAL_OFFSET], level)
    return None


def record_item(
    buf: Any, rows: Any, row: int, topics: kernel_layout.TopicNames
) -> tuple[int, RecordHeader, str, bytes, bool | None]:
    """Row ``row`` of a kernel scan of ``buf`` as ``(physical_offset, header, topic,
    properties_bytes, crc_ok)``: ``header`` is the record's :class:`RecordHeader`, ``crc_ok``
    None when the CRC was not checked."""
    at = row * _ROW_WIDTH
    start = rows[at]
    sys_flag = rows[at + _SYS_FLAG]
    header = _new_header(
        RecordHeader,
        header_struct(sys_flag).unpack_from(buf, start)
        if sys_flag & _HOST_FLAGS
        else _UNPACK_IPV4(buf, start),
    )
    properties_at = rows[at + _PROPERTIES_AT]
    properties = bytes(buf[properties_at : properties_at + rows[at + _PROPERTIES_LENGTH]])
    status = rows[at + _CRC_STATUS]
    crc_ok = None if status == _CRC_UNCHECKED else status == _CRC_GOOD
    return rows[at + _PHYSICAL_OFFSET], header, topics.of(buf, rows, row), properties, crc_ok


_BATCH_ROWS = 4096
_ROWS_FULL = kernel_layout.Stop.ROWS_FULL
_MORE_DATA = kernel_layout.Stop.MORE_DATA
_BLANK = kernel_layout.Stop.BLANK
_INVALID = kernel_layout.Stop.INVALID
_BODY_CRC_PROBLEM = kernel_layout.Problem.BODY_CRC
_PROPERTY_CRC_PROBLEM = kernel_layout.Problem.PROPERTY_CRC
_STOPS = {
    kernel_layout.Stop.END: ScanStop.END,
    kernel_layout.Stop.BLANK: ScanStop.BLANK,
    kernel_layout.Stop.INVALID: ScanStop.INVALID,
}
_SYS_FLAG = kernel_layout.SYS_FLAG
_PROPERTIES_AT = kernel_layout.PROPERTIES_AT
_PROPERTIES_LENGTH = kernel_layout.PROPERTIES_LENGTH
_CRC_STATUS = kernel_layout.CRC_STATUS
_CRC_UNCHECKED = kernel_layout.CRC_UNCHECKED
_CRC_GOOD = kernel_layout.CRC_GOOD
_CRC_BAD = kernel_layout.CRC_BAD
_PHYSICAL_OFFSET = kernel_layout.PHYSICAL_OFFSET
_UNPACK_IPV4 = HEADER_IPV4.unpack_from
# a RecordHeader straight from a header struct's values (each struct unpacks exactly its
# fields: tests/engine/test_record.py checks): RecordHeader._make checks the count again and
# costs 10% of a per-record scan
_new_header = tuple.__new__
_ROW_WIDTH = kernel_layout.ROW_WIDTH
_HEADER_SIZE = kernel_layout.HEADER_SIZE
_BODY_LENGTH = kernel_layout.BODY_LENGTH
_TOPIC_AT = kernel_layout.TOPIC_AT
_TOPIC_LENGTH = kernel_layout.TOPIC_LENGTH
_VERSION = kernel_layout.VERSION
_PHYSICAL_OFFSET_AT = 28  # TOTALSIZE .. QUEUEOFFSET
_TOTAL_SIZE = kernel_layout.TOTAL_SIZE


_MESSAGE_MAGICS = (struct.pack(">i", MAGIC_V1), struct.pack(">i", MAGIC_V2))
_SEARCH_WINDOW = 64 * 1024


def find_next_record(
    buf: Any, start: int, limit: int, base_offset: int, search_end: int | None = None
) -> int | None:
    """The first position at or after ``start`` (below ``search_end``, default ``limit``)
    where a valid message record begins: a message magic code, the stored PHYSICALOFFSET
    equal to the position, and a record that decodes within ``limit``. Used to resynchronise
    after corrupt bytes and to find the first record of a range."""
    search = start + 4
    magic_end = limit if search_end is None else min(limit, search_end + 8)
    window = _SEARCH_WINDOW
    while search < magic_end:
        # both magic codes, in growing windows: the cost follows the distance to a hit
        window_end = min(magic_end, search + window)
        hits = [
            hit
            for hit in (buf.find(magic, search, window_end) for magic in _MESSAGE_MAGICS)
            if hit >= 0
        ]
        if not hits:
            search = max(search, window_end - 3)  # a code may straddle the window's end
            if window_end >= magic_end:
                return None
            window *= 2
            continue
        position = min(hits) - 4
        if (
            position + 36 <= limit
            and int.from_bytes(buf[position + 28 : position + 36], "big", signed=True)
            == base_offset + position
        ):
            try:  # the record must lie below limit (a reused window holds older bytes after)
                decode_message(
                    memoryview(buf)[:limit],
                    position,
                    physical_offset=base_offset + position,
                    body=BodyMode.SKIP,
                )
                return position
            except RecordError:
                pass
        search = position + 5
    return None


_RESYNC_CHUNK = 8 * 1024 * 1024
_RESYNC_SPAN = 8 * 1024 * 1024 + 65536  # the longest record a resynchronisation can accept


# more than a record's header and its topic's length take: a body (at most maxMessageSize
# bytes) is followed by the topic's length, which is not zero
_HEADER_REACH = 256
_ZEROS_PIECE = 1024 * 1024


def data_ends_at(
    read: Callable[[int, int], bytes], position: int, file_size: int, max_message_size: int
) -> bool:
    """Whether a file's data ends at ``position``, where its bytes are zeros: only zeros
    follow as far as a record holding that position could reach. A zero there is otherwise
    inside a record (the high bytes of its queue offset, an empty or zero-filled body), and
    a scan from it reads as the end of the data. ``read(position, length)`` gives the file's
    bytes (fewer at its end)."""
    stop = min(file_size, position + max_message_size + _HEADER_REACH)
    while position < stop:
        piece = read(position, min(_ZEROS_PIECE, stop - position))
        if not piece:
            break
        if piece.count(0) != len(piece):
            return False
        position += len(piece)
    return True


def find_next_record_in_file(
    windows: Any, start: int, base_offset: int, search_end: int | None = None
) -> int | None:
    """:func:`find_next_record` over a file read through ``windows``
    (:class:`rmqstore.windows.FileWindows`), chunk by chunk, never mapped: the first valid
    record at or after ``start`` and before ``search_end`` (default: the end of the file), or
    None. A record longer than 8 MiB is not recognised as a place to resume."""
    limit = windows.limit
    end = limit if search_end is None else min(limit, search_end)
    chunk_start = start
    while chunk_start < end:
        chunk_end = min(end, chunk_start + _RESYNC_CHUNK)
        need = min(limit - chunk_start, chunk_end - chunk_start + _RESYNC_SPAN)
        window, window_start, available, _room = windows.window(chunk_start, need)
        found = find_next_record(
            window,
            chunk_start - window_start,
            available,
            base_offset + window_start,
            search_end=chunk_end - window_start,
        )
        if found is not None:
            found += window_start
            return found if found < end else None
        chunk_start = chunk_end
    return None


def next_record_in_segment(path: Any, size: int, start: int, position: int) -> int | None:
    """The file position of the first valid record at or after ``position`` of the
    commit-log file at ``path`` (``size`` bytes, its first byte at physical offset
    ``start``), read through windows; None when none follows in the file."""
    with FileWindows(path, size) as windows:
        return find_next_record_in_file(windows, position, start)
