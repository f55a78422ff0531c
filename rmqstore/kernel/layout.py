"""The record kernel's interface, shared by its two implementations (``_native``, compiled,
and ``reference``, pure Python): the row columns, why a scan stopped, what made a record
invalid, and the option bits. Nothing here depends on which implementation runs.

``scan(buf, start, limit, base_offset, room, options, rows)`` walks the records of
``buf[start:limit]`` (a commit-log file region whose first byte is at physical offset
``base_offset``; ``room`` bytes of the region follow ``limit`` but are not in ``buf``) and
writes one row of :data:`ROW_WIDTH` signed 64-bit integers into ``rows`` (an ``array('q')``)
per valid message, until a stop. It returns the tuple
``(count, stop, position, value, crc_failures, problem)``. ``position`` is where the scan
stopped (the end of the last row's record, or the record that stopped it); ``value`` is the
BLANK's declared length, the bytes a record needs (``MORE_DATA``) or the offending field value
(``INVALID``).

The acceptance rules are those of the spec §2.7 as rmqstore applies them (a record must also
carry its own physical offset and a UTF-8 topic); both implementations follow them exactly and
the differential tests hold them to it.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from enum import IntEnum
from typing import Any

# Row columns: one signed 64-bit integer each. Positions are indexes into the scanned buffer.
POSITION = 0  # where the record starts in the buffer
TOTAL_SIZE = 1
VERSION = 2  # 1 or 2 (the magic code)
BODY_CRC = 3  # the stored BODYCRC
QUEUE_ID = 4
FLAG = 5
QUEUE_OFFSET = 6
PHYSICAL_OFFSET = 7
SYS_FLAG = 8
BORN_TIMESTAMP = 9
STORE_TIMESTAMP = 10
RECONSUME_TIMES = 11
PREPARED_OFFSET = 12
HEADER_SIZE = 13  # 88, 100 or 112: the body starts at POSITION + HEADER_SIZE
BODY_LENGTH = 14
TOPIC_AT = 15
TOPIC_LENGTH = 16
PROPERTIES_AT = 17
PROPERTIES_LENGTH = 18
CRC_STATUS = 19  # CRC_UNCHECKED, CRC_BAD or CRC_GOOD
ROW_WIDTH = 20

COLUMN_NAMES = (
    "position",
    "totalSize",
    "version",
    "bodyCRC",
    "queueId",
    "flag",
    "queueOffset",
    "physicalOffset",
    "sysFlag",
    "bornTimestamp",
    "storeTimestamp",
    "reconsumeTimes",
    "preparedTransactionOffset",
    "headerSize",
    "bodyLength",
    "topicAt",
    "topicLength",
    "propertiesAt",
    "propertiesLength",
    "crcStatus",
)
assert len(COLUMN_NAMES) == ROW_WIDTH

CRC_UNCHECKED = -1
CRC_BAD = 0
CRC_GOOD = 1

# option bits
CHECK_CRC = 1  # check BODYCRC (or, with PROPERTY_CRC, the __CRC32# property) of every row
STOP_ON_CRC_ERROR = 2  # a failed check makes the record invalid (recovery's rule)
PROPERTY_CRC = 4  # forceVerifyPropCRC: the __CRC32# property replaces the body check


class Stop(IntEnum):
    """Why a scan call returned."""

    ROWS_FULL = 0  # the rows buffer is full; call again from ``position``
    END = 1  # zeros or the end of the region: nothing more was written
    BLANK = 2  # a BLANK record (``value`` = its declared length): the file is complete
    INVALID = 3  # bytes that are not a valid record (``problem`` says which rule failed)
    MORE_DATA = 4  # the record at ``position`` runs past ``limit`` into ``room``: read more


class Problem(IntEnum):
    """The rule an invalid record broke (``Stop.INVALID``)."""

    NONE = 0
    MAGIC = 1  # value: the magic code
    TOTAL_SIZE_BOUNDS = 2  # value: TOTALSIZE
    HEADER_TOO_SMALL = 3  # value: TOTALSIZE
    BODY_LENGTH = 4  # value: BODYLENGTH
    TOPIC_NEGATIVE = 5  # value: the topic length
    TOPIC_PAST_RECORD = 6  # value: the topic length
    FIELDS_MISMATCH = 7  # value: TOTALSIZE
    PHYSICAL_OFFSET = 8  # value: the stored PHYSICALOFFSET
    TOPIC_UTF8 = 9
    BODY_CRC = 10  # value: the stored BODYCRC
    PROPERTY_CRC = 11
    PROPERTIES_NEGATIVE = 12  # value: PROPERTIESLENGTH


def describe(problem: int, value: int) -> tuple[str, str]:
    """The field an invalid record's problem concerns and the reason, in words."""
    kind = Problem(problem)
    if kind is Problem.MAGIC:
        return "MAGICCODE", f"0x{value & 0xFFFFFFFF:08X} is not a message magic code"
    if kind is Problem.TOTAL_SIZE_BOUNDS:
        return "TOTALSIZE", f"{value} is out of bounds"
    if kind is Problem.HEADER_TOO_SMALL:
        return "TOTALSIZE", f"{value} is too small"
    if kind is Problem.BODY_LENGTH:
        return "BODYLENGTH", f"{value} does not fit"
    if kind is Problem.TOPIC_NEGATIVE:
        return "TOPICLENGTH", "is negative"
    if kind is Problem.TOPIC_PAST_RECORD:
        return "TOPICLENGTH", "runs past the record"
    if kind is Problem.FIELDS_MISMATCH:
        return "TOTALSIZE", f"{value} does not match its fields"
    if kind is Problem.PHYSICAL_OFFSET:
        return "PHYSICALOFFSET", f"{value} differs from the position"
    if kind is Problem.TOPIC_UTF8:
        return "TOPIC", "is not valid UTF-8"
    if kind is Problem.BODY_CRC:
        return "BODYCRC", "does not match the body"
    if kind is Problem.PROPERTIES_NEGATIVE:
        return "PROPERTIESLENGTH", f"{value} is negative"
    if kind is Problem.PROPERTY_CRC:
        return "PROPERTIES", "__CRC32# is missing or does not match the record"
    raise ValueError(f"no problem to describe ({problem})")


def new_rows(capacity: int) -> array:
    """A rows buffer for ``capacity`` records."""
    return zeroed(ROW_WIDTH * capacity)


def zeroed(count: int) -> array:
    """``count`` 64-bit integers, all 0, for a kernel call to write into. Made by repetition:
    made from ``bytes``, an array of 4,096 rows took 25 times as long (0.5 ms, which a read
    of one message waited through)."""
    return array("q", _ZERO) * count


_ZERO = (0,)


def rows_bytes(rows: array, count: int) -> int:
    """The bytes the first ``count`` rows of one ``scan`` call take in the log: a scan steps
    from each record to the byte after it, so its rows lie back to back and their sizes sum
    to where the last ends less where the first begins (no pass over the rows)."""
    if count <= 0:
        return 0
    last = (count - 1) * ROW_WIDTH
    return rows[last + POSITION] + rows[last + TOTAL_SIZE] - rows[POSITION]


# -- dispatch preparation --------------------------------------------------------------------
#
# ``prepare_dispatch(buf, rows, first, count, options, out, keys)`` reads the properties of
# rows ``[first, count)`` of a scan of ``buf`` and writes, per row, DISPATCH_WIDTH integers
# into ``out`` (at the row's own index) and the row's index keys into ``keys`` (packed with
# HASHED_KEY, entry 0 first). It returns ``(next_row, entries)``: it stops before a row whose
# keys would not fit. A row flagged NEEDS_REFERENCE (a SCHEDULE_TOPIC_XXXX record, or a topic,
# TAGS, KEYS or UNIQ_KEY that is not ASCII) gets no tagsCode and no keys: the caller prepares it
# the reference way (rmqstore.dispatch). A row with an INNER_MULTI_DISPATCH property is flagged
# HAS_COPIES as well (its units go to further queues too, which the caller puts: the kernel
# reads no queue names); it gets its tagsCode and keys unless also NEEDS_REFERENCE. Properties
# are parsed as ``string2messageProperties`` does (a pair needs a non-empty name and value; a
# later duplicate wins).
TAGS_CODE = 0  # the Java hash of TAGS, sign-extended; 0 without TAGS
DISPATCH_FLAGS = 1
KEYS_FROM = 2  # the row's first entry in ``keys``
KEYS_COUNT = 3  # UNIQ_KEY first, then each KEYS piece (none for ROLLBACK or without INDEX_KEYS)
DISPATCH_WIDTH = 4

NEEDS_REFERENCE = 1  # flag: prepare this row the reference way
HAS_COPIES = 2  # flag: the row has units in further queues (INNER_MULTI_DISPATCH) too
INDEX_KEYS = 1  # option: compute index keys (ROLLBACK records get none)

# a key to index: physical offset, store time, key hash, 1 for a record's first key
HASHED_KEY_FORMAT = "<qqiB"
HASHED_KEY_SIZE = 21
# the keys a key buffer holds (prepare_dispatch stops at a record whose keys do not fit; a
# record has at most 16,384), and that buffer's size
KEY_CAPACITY = 65536
KEY_BUFFER_SIZE = HASHED_KEY_SIZE * KEY_CAPACITY


def rows_before(rows: Any, count: int, physical_offset: int) -> int:
    """How many of the first ``count`` rows (in log order) start before ``physical_offset``."""
    if not count or rows[(count - 1) * ROW_WIDTH + PHYSICAL_OFFSET] < physical_offset:
        return count
    return bisect_left(rows[PHYSICAL_OFFSET : count * ROW_WIDTH : ROW_WIDTH], physical_offset)


def new_dispatch_out(capacity: int) -> array:
    return zeroed(DISPATCH_WIDTH * capacity)


# -- index application -----------------------------------------------------------------------
#
# ``apply_index(buf, slots, entries_at, limit, reserved, state, keys, start, stop)`` writes the
# HASHED_KEY entries ``keys[start:stop]`` into an index file mapped writable as ``buf``
# (``slots`` hash slots, entries from byte ``entries_at``, ``limit`` entries at most, disk blocks
# reserved below entry ``reserved``), the way IndexFile.putKey does, skipping records already
# indexed. ``state`` (an ``array('q')``) carries the file's header between calls. It returns
# ``(next, reason)``: APPLIED_ALL, or the entry it stopped before because the file is FULL or
# needs more blocks RESERVED.
STATE_COUNT = 0  # indexCount
STATE_SLOT_COUNT = 1  # hashSlotCount
STATE_BEGIN_TIMESTAMP = 2
STATE_BEGIN_OFFSET = 3
STATE_END_OFFSET = 4
STATE_END_TIMESTAMP = 5
STATE_SKIPPING = 6  # 1 while the keys of a record indexed before are passed over
STATE_INDEXED = 7  # records indexed (counted up)
STATE_WRITTEN = 8  # entries written (counted up)
STATE_WIDTH = 9

APPLIED_ALL = 0
INDEX_FULL = 1
NEEDS_RESERVE = 2


# -- consume-queue runs ----------------------------------------------------------------------
#
# ``queue_runs(buf, rows, first, count, dispatch_out, units, runs, row_runs)`` gathers the
# consume-queue units of rows ``[first, count)`` (those prepare_dispatch did not flag, whose
# transaction type a broker queues: NOT_TYPE and COMMIT) into runs: units of one queue (topic
# bytes and queue id) with consecutive queue offsets, in log order. Each run's units are packed
# back to back into ``units`` (20 bytes each, as in a consume-queue file) and described by one
# row of RUN_WIDTH integers in ``runs``; ``row_runs`` is scratch space (one integer per row).
# It returns ``(next_row, run_count)``, stopping before a row that needs a run when ``runs``
# is full.
RUN_TOPIC_ROW = 0  # a row holding the run's topic
RUN_QUEUE_ID = 1
RUN_FIRST_QUEUE_OFFSET = 2
RUN_UNITS = 3  # how many units
RUN_UNITS_FROM = 4  # the first unit's index in ``units``
RUN_LAST_ROW = 5  # the row of the last unit (its store time is the newest queued)
RUN_FIRST_END = 6  # where the first unit's record ends in the commit log
RUN_WIDTH = 7
UNIT_SIZE = 20


# -- consume-queue files ---------------------------------------------------------------------
#
# ``valid_units(data)``: how many 20-byte units at the start of ``data`` are valid (offset >= 0
# and size > 0), as a broker's queue recovery counts them. ``cut_index(data, physical_offset)``:
# where truncateDirtyLogicFiles cuts a file: the first unit whose offset is at or past
# ``physical_offset`` (valid, or the very first unit), -1 when an invalid unit comes first or
# none is.


# -- records where consume-queue units point (read --topic) ---------------------------------
#
# ``records_at(buf, spans, count, base_offset, queue_id, topic, rows)``: ``spans`` holds
# ``count`` (position, size) pairs of ``buf`` (whose first byte is at physical offset
# ``base_offset``); the record at each is scanned into row ``i`` of ``rows``, in order, while
# it is exactly one whole record of that size there (its own physical offset, as ``scan``
# requires) of queue ``queue_id`` of ``topic`` (bytes). Returns how many in a row were; a span
# outside ``buf``, or with a size of 0 or less, stops it too. More spans than ``rows`` or
# ``spans`` hold is a ValueError.


# -- record checks (verify) ------------------------------------------------------------------
#
# ``attention_rows(buf, rows, first, count, previous_time, options, found)`` writes into
# ``found`` the indexes of the rows of ``[first, count)`` that a verify must look at one by one,
# and returns how many: a failed CRC check, properties that are not ASCII, properties ending with
# a ``__CRC32#`` property (every row with FORCE_PROPERTY_CRC), a SCHEDULE_TOPIC_XXXX record,
# or a store time earlier than the row before (``previous_time`` for the first; -1: none).
# With SCHEDULED_ONLY, only the SCHEDULE_TOPIC_XXXX records (a range's summary looks at
# their DELAY, nothing else).
FORCE_PROPERTY_CRC = 1
SCHEDULED_ONLY = 2


class TopicNames:
    """The topics of rows as text, each distinct topic decoded once (the scan checked that
    every row's topic is UTF-8)."""

    __slots__ = ("last_name", "last_raw", "names")

    def __init__(self) -> None:
        self.names: dict[bytes, str] = {}
        self.last_raw = b""  # the topic of the row asked for last: rows in a row mostly share it
        self.last_name = ""

    def of(self, window: bytes | bytearray, rows: Any, row: int) -> str:
        """The topic of row ``row`` of ``rows`` (a scan of ``window``, the bytes or bytearray
        a scan window is)."""
        at = row * ROW_WIDTH
        topic_at = rows[at + TOPIC_AT]
        length = rows[at + TOPIC_LENGTH]
        last = self.last_raw
        if len(last) == length and window.startswith(last, topic_at):
            return self.last_name  # compared in place: no copy of the topic's bytes
        raw = bytes(window[topic_at : topic_at + length])
        name = self.names.get(raw)
        if name is None:
            name = self.names[raw] = raw.decode("utf-8")
        self.last_raw, self.last_name = raw, name
        return name


# -- index files (verify) --------------------------------------------------------------------
#
# ``index_chain(data, first_number, slots, newest, chain, bad, bad_capacity)`` walks the 20-byte
# entries in ``data`` (entry numbers from ``first_number``) as a verify does: ``newest`` (an
# ``array('i')`` of one int per slot) is the slot table the entries imply so far; ``chain`` (an
# ``array('q')``) carries CHAIN_WIDTH integers between calls. An entry is bad when its hash is
# negative, it does not link to the newest earlier entry of its slot, its timeDiff is negative
# or its offset goes back; the first ``bad_capacity`` bad ones are written into ``bad``
# (BAD_WIDTH integers each). Returns how many were written.
CHAIN_PREVIOUS_OFFSET = 0  # the offset of the entry before (-1 before the first)
CHAIN_HEADS = 1  # entries that start a chain (previous 0)
CHAIN_FIRST_OFFSET = 2  # the offset of the first entry walked
CHAIN_LAST_OFFSET = 3
CHAIN_ENTRIES = 4  # entries walked
CHAIN_WIDTH = 5
BAD_NUMBER = 0
BAD_HASH = 1
BAD_OFFSET = 2
BAD_TIME_DIFF = 3
BAD_PREVIOUS = 4
BAD_NEWEST = 5  # the newest earlier entry of the slot, when the entry was met
BAD_WIDTH = 6
#
# ``match_keys(keys, first, count, entries)`` compares HASHED_KEY entries ``keys[first:first +
# count]`` with the 20-byte index entries in ``entries`` (hash and offset of each) and returns
# how many match from the start.


# -- columns for export and stats ------------------------------------------------------------
#
# ``field_spans(buf, rows, first, count, field, spans)`` writes, for rows ``[first, count)``
# of a scan of ``buf``, where one field of each record lies: two integers per row into
# ``spans`` (from index 0), the field's position in ``buf`` and its length (SPAN_ABSENT when
# the record has no such field). It returns ``(total, absent)``: the bytes of the present
# fields and how many rows have none. Property values are found as ``string2messageProperties``
# finds them (the last pair of that name with a non-empty name and value).
FIELD_TOPIC = 0
FIELD_BODY = 1
FIELD_PROPERTIES = 2
FIELD_BORN_HOST = 3  # the 8- or 20-byte host field (address and port)
FIELD_STORE_HOST = 4
FIELD_TAGS = 5
FIELD_KEYS = 6
FIELD_UNIQ_KEY = 7
SPAN_ABSENT = -1
#
# ``gather(buf, spans, count, data, offsets)`` copies the ``count`` spans (pairs of position
# and length, as field_spans writes them) of ``buf`` back to back into ``data`` and writes
# ``count + 1`` 32-bit offsets into ``offsets`` (an absent span is empty), as an Arrow binary
# column holds them. It returns the bytes written.
#
# ``property_pairs(buf, rows, first, count, spans, keys, key_offsets, items, item_offsets,
# pair_offsets, picked)`` parses the properties of rows ``[first, count)`` as
# ``decode_properties`` does (a pair needs a non-empty name and value; a later duplicate
# replaces the value and keeps the first one's place) and copies each kept pair's name into
# ``keys`` and its value into ``items``, back to back, with 32-bit offsets in ``key_offsets``
# and ``item_offsets`` (one per pair after a leading 0, as an Arrow string column holds them),
# and 32-bit offsets of each row's first pair into ``pair_offsets`` (index ``row - first``; the
# one after the last row closes it): the Arrow map of the rows' properties. With
# ``key_offsets`` and ``item_offsets`` both empty, nothing is copied (the picks and the pair
# offsets only). ``spans`` is working room for one record's pairs (4 integers a pair): a
# record with more pairs than it holds is not parsed. Unless ``picked`` is empty (else it
# holds PICKED_WIDTH integers per row), it also writes there the value spans of the TAGS,
# KEYS and UNIQ_KEY pairs kept (position 0 and SPAN_ABSENT where there is none; the spans
# field_spans finds): all rows' TAGS spans first, as field_spans writes them, then the KEYS
# and the UNIQ_KEY spans, each from index ``2 * (count - first) * n``. It returns
# ``(next_row, pairs, key_bytes, item_bytes)``, stopping before a row whose pairs or bytes
# would not fit.
PICKED_WIDTH = 6
PICKED_NAMES = (b"TAGS", b"KEYS", b"UNIQ_KEY")
#
# ``message_ids(buf, rows, first, count, data, offsets)`` writes the msgId of each row (store
# host field and physical offset, in upper-case hex) back to back into ``data``, with 32-bit
# offsets as ``gather``; it returns the bytes written.
MESSAGE_ID_MAX = 2 * (20 + 8)
#
# ``row_columns(rows, first, count, columns, out)`` copies row columns of rows ``[first,
# count)`` into ``out`` (a writable buffer) in one pass over the rows. ``columns`` holds a
# triple per column: the row column, a width of 4 or 8 bytes, and the byte offset in ``out``
# (a multiple of the width) where its values go, as ``width``-byte signed integers in the
# machine's byte order, back to back, as an Arrow int32 (width 4) or int64 (width 8) column
# holds them. A value outside 32 bits for width 4 is a ValueError naming the first such one,
# row by row and column by column in ``columns``' order (``out`` is then partly written).
#
# ``host_keys(buf, rows, first, count, field, keys)`` writes the born or store host field
# (``field``: FIELD_BORN_HOST or FIELD_STORE_HOST) of each row of ``[first, count)`` whose
# host is IPv4 into ``keys`` (one signed 64-bit integer a row, index ``row - first``): the
# field's 8 bytes (address, then port) read as a big-endian integer. It returns the first row
# whose host is IPv6 (``count`` when none is).
#
# ``ascii_only(data, length)`` is whether the first ``length`` bytes of ``data`` are all below
# 0x80 (plain ASCII: valid UTF-8 without a further check).
#
# ``record_items(buf, rows, first, count, header_type, names, items)`` appends to the list
# ``items`` the per-record item of each row of ``[first, count)``, as the Python API's record
# iterator yields it: ``(physical_offset, header, topic, properties, crc_ok)``. ``header`` is
# a ``header_type`` (a tuple subclass: rmqstore.record.RecordHeader) made of the fixed header
# read from the row's POSITION by the row's SYS_FLAG's host sizes (TOTALSIZE .. BODYLENGTH,
# big-endian signed integers, the hosts as 8- or 20-byte bytes); ``topic`` the row's topic
# bytes decoded as UTF-8 (strictly: a UnicodeDecodeError otherwise), through ``names`` (a dict
# of topic bytes to text, filled as topics are first met); ``properties`` the row's property
# bytes; ``crc_ok`` None for CRC_UNCHECKED, else whether CRC_STATUS is CRC_GOOD;
# ``physical_offset`` the row's PHYSICAL_OFFSET. A row whose header, topic or properties lie
# outside ``buf`` is a ValueError (rows before it are appended). It returns ``count - first``.
#
# ``row_copies(buf, rows, numbers, copy_type, names, out)`` appends to the list ``out``, for
# each row number in ``numbers`` (an ``array('q')``), the list of the row's units in further
# queues (spec 6.8) as rmqstore.multidispatch.queue_copies gives them from the row's properties
# decoded: none for a record no queue takes (SYS_FLAG's transaction type PREPARED or ROLLBACK),
# for a topic starting with ``%RETRY%`` or ``rmq_sys_``, or SCHEDULE_TOPIC_XXXX (topics a 5.x
# broker gives no copies: rmqstore.multidispatch.gets_no_copies) when the row's properties are
# empty or end with 0x02 (not a 4.9 broker's: multidispatch.written_by_49), without
# INNER_MULTI_DISPATCH or INNER_MULTI_QUEUE_OFFSET (the last pair of each with a non-empty
# name and value, as ``string2messageProperties`` keeps them), when either value is blank
# (``StringUtils.isBlank``: only characters Java's ``Character.isWhitespace`` takes, once
# decoded as UTF-8 with replacement characters) or the two do not hold as many
# comma-separated pieces (split as Java's ``String.split(",")`` splits: empty pieces at the end
# dropped); else a ``copy_type`` (a tuple subclass: rmqstore.multidispatch.QueueCopy) per
# piece, in order, up to the first offset piece that ``Long.parseLong`` refuses (anything but
# an optional + or - and ASCII digits, or a value beyond a signed 64-bit integer; leading
# zeros are fine): (the name decoded as UTF-8 with replacement characters, through ``names``,
# a dict of name bytes to text filled as names are first met; 0 for a name starting with
# ``%LMQ%``, else the row's QUEUE_ID; the offset), leaving out a negative offset (-0 is 0).
# A row number outside ``rows``, or a row whose topic or properties lie outside ``buf``, is a
# ValueError (rows before it are appended). It returns ``len(numbers)``.

#
# ``copy_runs(buf, rows, numbers, dispatch_out, units, runs, scratch)`` gathers the units in
# further queues of the rows ``numbers`` (an ``array('q')`` of row numbers in log order), the
# units ``row_copies`` gives for them, into runs as ``queue_runs`` gathers a row's own unit: units
# of one queue (the name's bytes and the queue id) with consecutive queue offsets, in log order,
# a queue's next unit going on only its latest run. Each run's units are packed back to back into
# ``units`` (20 bytes each, as in a consume-queue file: the row's PHYSICAL_OFFSET, TOTAL_SIZE
# and the TAGS_CODE of ``dispatch_out``, DISPATCH_WIDTH integers per row of ``rows``) and
# described by COPY_RUN_WIDTH integers in ``runs``; ``scratch`` is scratch space (two integers per
# unit). It returns ``(rows_done, run_count, unit_count)``: the rows of ``numbers`` taken, in
# order, stopping before a row whose pieces (INNER_MULTI_DISPATCH's up to the offset
# ``row_copies`` stops at, each a unit at most) might not fit in the runs, units or scratch
# left. A row number outside ``rows`` or ``dispatch_out``, or a row whose topic or properties
# lie outside ``buf``, is a ValueError.
#
# ``copy_stops(buf, rows, numbers, out)`` writes into ``out`` (an ``array('q')`` holding at
# least ``len(numbers)`` integers), in order, the row numbers of ``numbers`` whose further
# queues a broker's dispatch throws at: rows that ``row_copies`` stops for at an offset piece
# ``Long.parseLong`` refuses, before the last of the pieces the two properties name (they
# pair up, as ``row_copies`` takes them); it returns how many it wrote
# (rmqstore.multidispatch.dispatch_stop names the piece). A row number outside ``rows``, or a
# row whose topic or properties lie outside ``buf``, is a ValueError; so is an ``out``
# shorter than ``numbers``.
COPY_RUN_NAME_AT = 0  # the queue's name: a span of ``buf``
COPY_RUN_NAME_LENGTH = 1
COPY_RUN_QUEUE_ID = 2  # 0 for a name starting with %LMQ%, else the rows' QUEUE_ID
COPY_RUN_FIRST_QUEUE_OFFSET = 3
COPY_RUN_UNITS = 4
COPY_RUN_UNITS_FROM = 5  # the first unit's index in ``units``
COPY_RUN_LAST_ROW = 6  # the row of the last unit
COPY_RUN_WIDTH = 7

# -- packing records for append ------------------------------------------------------------
#
# ``pack_records(buf, position, file_size, reserved, base_offset, messages, first, count,
# bodies, body_spans, props, prop_spans, topics, topic_table, hosts, host_table, store_host,
# slots, key_prefix, key_state, out)`` writes the records of messages ``[first, count)`` into
# ``buf`` (a commit-log file mapped writable, whose first byte is at physical offset
# ``base_offset``) from file position ``position``, as ``CommitLog.putMessage`` lays them out:
# BODYCRC computed, the V6 sysFlag bits set from the host fields, the queue offset taken from
# (and advanced in) ``slots`` (none, and 0, for PREPARED and ROLLBACK records), the store time
# never going back, a generated UNIQ_KEY appended to the properties where asked. Each message
# is a row of PACK_WIDTH integers in ``messages``; bodies and properties are spans (position,
# length: two integers a message) of ``bodies`` and ``props``; topic fields (the TOPICLENGTH
# byte or short and the topic) and born-host fields are rows of ``topic_table`` (TOPIC_ROW_*) and
# ``host_table`` (HOST_ROW_*) over ``topics`` and ``hosts``. Per message it writes RESULT_WIDTH
# integers into ``out`` (at the message's own index). It returns ``(next, position, stop,
# value)``: PACKED_ALL, or the message it stopped before: NEEDS_ROLL (the record and an 8-byte
# BLANK do not fit in the file: ``value`` is the record's size), NEEDS_RESERVE (disk blocks
# are reserved only up to ``reserved``: ``value`` is the position the record ends at) or
# NEW_MONTH (the message's clock is outside the UNIQ_KEY's month: ``value`` is its clock).
PACK_TOPIC = 0  # row of topic_table
PACK_QUEUE_ID = 1  # with PACK_TOPIC, names the queue: slot topic * KEY_QUEUE_SPAN + queue id
PACK_FLAG = 2
PACK_SYS_FLAG = 3  # the message's own; the V6 host bits are set from the host fields
PACK_BORN_TIMESTAMP = 4
PACK_HOST = 5  # row of host_table
PACK_RECONSUME_TIMES = 6
PACK_PREPARED_OFFSET = 7
PACK_NOW = 8  # the clock when the message is put (epoch ms)
PACK_UNIQ_KEY = 9  # 1: append a generated UNIQ_KEY to the properties
PACK_WIDTH = 10

TOPIC_ROW_AT = 0
TOPIC_ROW_LENGTH = 1  # the length byte (V1) or short (V2) and the topic
TOPIC_ROW_MAGIC = 2
TOPIC_ROW_WIDTH = 3

HOST_ROW_AT = 0
HOST_ROW_LENGTH = 1  # 8 or 20
HOST_ROW_WIDTH = 2

# key_state: the UNIQ_KEY generator's and the appender's running values, read and written back
KEY_COUNTER = 0  # the next key's counter (16 bits)
KEY_MONTH_START = 1  # epoch ms of the start of the month the keys count from
KEY_NEXT_MONTH = 2  # epoch ms of the next month's start
KEY_LAST_STAMP = 3  # the last store time given (store times never go back)
KEY_TRAILING_SEPARATOR = 4  # 1: 5.x properties end with 0x02; 0: 4.9.x drops the last one
KEY_QUEUE_SPAN = 5  # queue ids per topic in ``slots`` (queue ids are below it)
KEY_STATE_WIDTH = 6

RESULT_PHYSICAL_OFFSET = 0
RESULT_QUEUE_OFFSET = 1
RESULT_SIZE = 2
RESULT_STORE_TIMESTAMP = 3
RESULT_WIDTH = 4

PACKED_ALL = 0
NEEDS_ROLL = 1
NEEDS_RESERVE = 2
NEW_MONTH = 3


# -- JSON-line documents into batch columns (append --input) --------------------------------
#
# ``document_rows(documents, first, count, defaults, topics, properties, rows, body_spans,
# bodies, prop_spans, props, state)`` adds the parsed JSON lines ``documents[first:count]`` of
# the common shape to a batch's columns (see :mod:`rmqstore.messagebatch`): a dict whose only
# fields are ``topic`` (a non-empty string; DOC_DEFAULT_TOPIC when missing), ``body`` (a
# string, stored as UTF-8; empty when missing), ``tags`` and ``keys`` (strings or null: null or
# missing take DOC_DEFAULT_TAGS / DOC_DEFAULT_KEYS) and ``queueId`` (an int of 0 to 2^31 - 1;
# DOC_DEFAULT_QUEUE_ID when missing). Each such document appends a PACK_WIDTH row to ``rows``,
# its body to ``bodies`` and (when it is not the same object as the previous document's) its
# encoded property string to ``props``, with their spans; ``topics`` maps a topic to its row
# (a new topic takes the next row). ``properties`` maps ``(tags, keys)`` to ``(encoded
# property string, needs a generated UNIQ_KEY)``; the other row fields come from ``defaults``
# (DOC_* indexes). ``state`` (an ``array('q')`` of DOC_STATE_WIDTH) carries the longest body,
# the longest property string and the queue span, read and written back. It returns ``(next,
# stop, key)``: DOC_DONE with ``next == count``; DOC_OTHER for a document of another shape or
# with a value of the wrong type or range (the caller builds its message the general way,
# which names what is wrong); DOC_NEEDS_PROPERTIES when ``key``, the document's ``(tags,
# keys)``, is not in ``properties`` (the caller encodes it, adds it and calls again from there).
DOC_DEFAULT_TOPIC = 0
DOC_DEFAULT_QUEUE_ID = 1
DOC_DEFAULT_TAGS = 2
DOC_DEFAULT_KEYS = 3
DOC_FLAG = 4
DOC_SYS_FLAG = 5
DOC_BORN_TIMESTAMP = 6
DOC_HOST = 7  # row of the batch's hosts
DOC_RECONSUME_TIMES = 8
DOC_PREPARED_OFFSET = 9
DOC_DEFAULTS_WIDTH = 10

DOC_STATE_LONGEST_BODY = 0
DOC_STATE_LONGEST_PROPS = 1
DOC_STATE_QUEUE_SPAN = 2
DOC_STATE_WIDTH = 3

DOC_DONE = 0
DOC_OTHER = 1
DOC_NEEDS_PROPERTIES = 2


# -- what append reports, as text lines --------------------------------------------------------
#
# ``result_lines(buf, rows, first, count, style, out)`` appends to the bytearray ``out`` the
# line ``append`` prints for each row ``[first, count)`` of a scan of ``buf``: LINES_JSONL, the
# JSON object ``{"msgId", "topic", "queueId", "commitLogOffset", "queueOffset", "storeSize",
# "storeTimestamp", "uniqKey"}`` (no spaces; text as ``json.dumps(ensure_ascii=False)`` writes
# it, a missing UNIQ_KEY null), or LINES_PLAIN, ``MSGID  offset=N  queue=TOPIC:Q
# queueOffset=N  size=N`` and ``  uniqKey=K`` when the record has one; each line ends with a
# newline. Text is decoded as UTF-8 with replacement. It returns the row it stopped before:
# ``count``, or (the compiled kernel only) a row whose topic or UNIQ_KEY holds a byte outside
# printable ASCII (or, for LINES_JSONL, a quote or backslash), whose line the caller then has
# the reference write.
LINES_JSONL = 0
LINES_PLAIN = 1


# -- what read prints of a message, as JSON lines -----------------------------------------------
#
# ``message_lines(buf, rows, first, count, body_mode, out)`` appends to the bytearray ``out``
# the JSON line ``read --jsonl`` prints for each row ``[first, count)`` of a scan of ``buf``:
# :func:`rmqstore.documents.message_document` of the row's message (the fields of
# ``Message.fields()`` in their order; with a body mode other than BODY_NONE the body and its
# encoding as ``encode_body`` gives them) as ``json.dumps(ensure_ascii=False,
# separators=(",", ":"))`` writes it, and a newline. It returns the row it stopped before:
# ``count``, or (the compiled kernel only) a row whose line the caller then has the reference
# write: one with an IPv6 host, properties that are not valid UTF-8 or that name a property
# twice, or (BODY_TEXT) a body that is not valid UTF-8.
BODY_NONE = 0
BODY_AUTO = 1
BODY_TEXT = 2
BODY_HEX = 3
BODY_BASE64 = 4
BODY_MODE_NAMES = ("none", "auto", "text", "hex", "base64")  # by BODY_* number


# -- what read prints of a message, as CSV or TSV rows -------------------------------------------
#
# ``message_rows(buf, rows, first, count, body_mode, columns, delimiter, out)`` appends to the
# bytearray ``out`` the row ``read --csv``/``--tsv`` prints for each row ``[first, count)`` of a
# scan of ``buf``: :func:`rmqstore.documents.delimited_row` (UTF-8) of the
# :func:`rmqstore.documents.document_cells` of the document ``message_lines`` writes (in
# ``body_mode``) for the fields numbered by ``columns`` (bytes, each an index into
# MESSAGE_COLUMNS; a field may come more than once), ``delimiter`` 44 (a comma) or 9 (a tab):
# a cell holding the delimiter, a quote, a line feed or a carriage return in quotes, its
# quotes doubled; a row of one empty cell as ``""``. It returns the row it stopped before:
# ``count``, or (the compiled kernel only) a row ``message_lines`` also leaves, whose row the
# caller then has the reference write.
MESSAGE_COLUMNS = (
    "msgId", "topic", "queueId", "queueOffset", "commitLogOffset", "storeSize", "bodyCRC",
    "flag", "sysFlag", "bornTimestamp", "bornHost", "storeTimestamp", "storeHost",
    "reconsumeTimes", "preparedTransactionOffset", "properties", "tags", "keys", "uniqKey",
    "bodyLength", "version", "body", "bodyEncoding",
)  # fmt: skip
MOST_COLUMNS = 64  # columns longer than this are refused (ValueError)


# -- rows of text joined from columns (an export's JSON lines) ----------------------------------
#
# ``text_rows(parts, count, out)`` appends to the bytearray ``out`` ``count`` rows, each the
# concatenation of ``parts`` in order, and returns how many bytes it appended. A part is
# ``bytes`` (the same text in every row) or a column ``(encoding, width, offsets, data, first)``:
# Arrow's layout of a string or binary array, ``offsets`` holding ``width`` (4 or 8) byte
# native-endian offsets into ``data``, row ``i``'s value at offsets ``first + i`` and
# ``first + i + 1``; TEXT_AS_IS writes the value's bytes, TEXT_BASE64 their standard base64
# (with padding). TEXT_DECIMAL takes an integer column instead: ``offsets`` holds its values
# (``width``-byte native-endian signed integers, row ``i``'s at index ``first + i``; ``data``
# is not read), each written in decimal as ``str`` writes it. A part of another shape, an
# offset outside ``data`` or decreasing, or offsets (values) fewer than ``first + count + 1``
# (``first + count``), or a ``count`` below 0 or above 2**60, is a ValueError, raised before
# ``out`` changes.
TEXT_AS_IS = 0
TEXT_BASE64 = 1
TEXT_DECIMAL = 2
