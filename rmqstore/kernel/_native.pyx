# cython: language_level=3, boundscheck=True, wraparound=False, initializedcheck=True
"""The record kernel, compiled: the same interface and results as ``reference.py`` (see
``layout.py``), at native speed.

Safety: the buffer's length is checked against ``limit`` on entry, and every read of the
buffer and every write of a row goes through a helper that checks its range against the real
length of the buffer before it touches memory. A failed check marks the call as breached and
the call raises ``KernelBoundsError`` instead of reading: a logic slip can give an error, never
a wild read or write. The record rules themselves check every length against ``limit`` first,
so the helpers' checks never fire on any input (the fuzz target holds the kernel to that under
AddressSanitizer). The scan runs without the GIL.
"""

from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memchr, memcmp, memcpy

from rmqstore.kernel.layout import (
    CHECK_CRC as _CHECK_CRC,
    PROPERTY_CRC as _PROPERTY_CRC,
    ROW_WIDTH as _ROW_WIDTH,
    STOP_ON_CRC_ERROR as _STOP_ON_CRC_ERROR,
)


class KernelBoundsError(RuntimeError):
    """The kernel caught itself about to read or write outside a buffer (a bug)."""


DEF WIDTH = 20
DEF ROW_WIDTH_NATIVE = 20
assert WIDTH == _ROW_WIDTH
from rmqstore.kernel import layout as _layout
from rmqstore.properties import JAVA_REPLACE  # the error handler, registered as it loads

# the columns named here are the interface's (layout.py): a mismatch is a bug, found at import
def _check_columns(pairs):
    for name, value in pairs:
        if getattr(_layout, name) != value:
            raise ImportError(f"the compiled kernel's {name} is not layout.py's")


_check_columns((
    ("POSITION", C_POSITION), ("TOTAL_SIZE", C_TOTAL_SIZE), ("VERSION", C_VERSION),
    ("BODY_CRC", C_BODY_CRC), ("QUEUE_ID", C_QUEUE_ID), ("FLAG", C_FLAG), ("QUEUE_OFFSET",
    C_QUEUE_OFFSET), ("PHYSICAL_OFFSET", C_PHYSICAL_OFFSET), ("SYS_FLAG", C_SYS_FLAG),
    ("BORN_TIMESTAMP", C_BORN_TIMESTAMP), ("STORE_TIMESTAMP", C_STORE_TIMESTAMP),
    ("RECONSUME_TIMES", C_RECONSUME_TIMES), ("PREPARED_OFFSET", C_PREPARED_OFFSET),
    ("HEADER_SIZE", C_HEADER_SIZE), ("BODY_LENGTH", C_BODY_LENGTH), ("TOPIC_AT",
    C_TOPIC_AT), ("TOPIC_LENGTH", C_TOPIC_LENGTH), ("PROPERTIES_AT", C_PROPERTIES_AT),
    ("PROPERTIES_LENGTH", C_PROPERTIES_LENGTH), ("CRC_STATUS", C_CRC_STATUS),
))
_check_columns((
    ("TAGS_CODE", TAGS_CODE), ("DISPATCH_FLAGS", DISPATCH_FLAGS), ("KEYS_FROM", KEYS_FROM),
    ("KEYS_COUNT", KEYS_COUNT),
))
_check_columns((
    ("RUN_TOPIC_ROW", RUN_TOPIC_ROW), ("RUN_QUEUE_ID", RUN_QUEUE_ID),
    ("RUN_FIRST_QUEUE_OFFSET", RUN_FIRST_QUEUE_OFFSET), ("RUN_UNITS", RUN_UNITS),
    ("RUN_UNITS_FROM", RUN_UNITS_FROM), ("RUN_LAST_ROW", RUN_LAST_ROW), ("RUN_FIRST_END",
    RUN_FIRST_END),
))
_check_columns((
    ("STATE_COUNT", STATE_COUNT), ("STATE_SLOT_COUNT", STATE_SLOT_COUNT),
    ("STATE_BEGIN_TIMESTAMP", STATE_BEGIN_TIMESTAMP), ("STATE_BEGIN_OFFSET",
    STATE_BEGIN_OFFSET), ("STATE_END_OFFSET", STATE_END_OFFSET), ("STATE_END_TIMESTAMP",
    STATE_END_TIMESTAMP), ("STATE_SKIPPING", STATE_SKIPPING), ("STATE_INDEXED",
    STATE_INDEXED), ("STATE_WRITTEN", STATE_WRITTEN),
))

cdef enum:
    C_POSITION = 0
    C_TOTAL_SIZE = 1
    C_VERSION = 2
    C_BODY_CRC = 3
    C_QUEUE_ID = 4
    C_FLAG = 5
    C_QUEUE_OFFSET = 6
    C_PHYSICAL_OFFSET = 7
    C_SYS_FLAG = 8
    C_BORN_TIMESTAMP = 9
    C_STORE_TIMESTAMP = 10
    C_RECONSUME_TIMES = 11
    C_PREPARED_OFFSET = 12
    C_HEADER_SIZE = 13
    C_BODY_LENGTH = 14
    C_TOPIC_AT = 15
    C_TOPIC_LENGTH = 16
    C_PROPERTIES_AT = 17
    C_PROPERTIES_LENGTH = 18
    C_CRC_STATUS = 19

cdef enum:  # dispatch columns
    TAGS_CODE = 0
    DISPATCH_FLAGS = 1
    KEYS_FROM = 2
    KEYS_COUNT = 3

cdef enum:  # run columns
    RUN_TOPIC_ROW = 0
    RUN_QUEUE_ID = 1
    RUN_FIRST_QUEUE_OFFSET = 2
    RUN_UNITS = 3
    RUN_UNITS_FROM = 4
    RUN_LAST_ROW = 5
    RUN_FIRST_END = 6

cdef enum:  # index state
    STATE_COUNT = 0
    STATE_SLOT_COUNT = 1
    STATE_BEGIN_TIMESTAMP = 2
    STATE_BEGIN_OFFSET = 3
    STATE_END_OFFSET = 4
    STATE_END_TIMESTAMP = 5
    STATE_SKIPPING = 6
    STATE_INDEXED = 7
    STATE_WRITTEN = 8
    STATE_WIDTH = 9

cdef enum:
    STOP_ROWS_FULL = 0
    STOP_END = 1
    STOP_BLANK = 2
    STOP_INVALID = 3
    STOP_MORE_DATA = 4

cdef enum:
    P_NONE = 0
    P_MAGIC = 1
    P_TOTAL_SIZE_BOUNDS = 2
    P_HEADER_TOO_SMALL = 3
    P_BODY_LENGTH = 4
    P_TOPIC_NEGATIVE = 5
    P_TOPIC_PAST_RECORD = 6
    P_FIELDS_MISMATCH = 7
    P_PHYSICAL_OFFSET = 8
    P_TOPIC_UTF8 = 9
    P_BODY_CRC = 10
    P_PROPERTY_CRC = 11
    P_PROPERTIES_NEGATIVE = 12

cdef int32_t MAGIC_V1 = -626843481
cdef int32_t MAGIC_V2 = -626843477
cdef int32_t MAGIC_BLANK = -875286124
cdef int64_t MIN_RECORD_LENGTH = 91
cdef int64_t CRC_PROPERTY_LENGTH = 20

cdef uint32_t CRC_TABLE[8][256]


cdef void _fill_crc_table() noexcept:
    cdef uint32_t value
    cdef int n, k
    for n in range(256):
        value = n
        for k in range(8):
            value = (value >> 1) ^ 0xEDB88320 if value & 1 else value >> 1
        CRC_TABLE[0][n] = value
    for n in range(256):
        value = CRC_TABLE[0][n]
        for k in range(1, 8):
            value = CRC_TABLE[0][value & 0xFF] ^ (value >> 8)
            CRC_TABLE[k][n] = value


_fill_crc_table()


cdef uint32_t _crc32(uint32_t crc, const uint8_t* data, Py_ssize_t length) noexcept nogil:
    """CRC-32 (IEEE), eight bytes per step (slicing-by-8); the caller checked the range."""
    cdef uint32_t one, two
    crc = ~crc
    while length >= 8:
        one = crc ^ (<uint32_t>data[0] | (<uint32_t>data[1] << 8)
                     | (<uint32_t>data[2] << 16) | (<uint32_t>data[3] << 24))
        two = (<uint32_t>data[4] | (<uint32_t>data[5] << 8)
               | (<uint32_t>data[6] << 16) | (<uint32_t>data[7] << 24))
        crc = (CRC_TABLE[7][one & 0xFF] ^ CRC_TABLE[6][(one >> 8) & 0xFF]
               ^ CRC_TABLE[5][(one >> 16) & 0xFF] ^ CRC_TABLE[4][one >> 24]
               ^ CRC_TABLE[3][two & 0xFF] ^ CRC_TABLE[2][(two >> 8) & 0xFF]
               ^ CRC_TABLE[1][(two >> 16) & 0xFF] ^ CRC_TABLE[0][two >> 24])
        data += 8
        length -= 8
    while length > 0:
        crc = CRC_TABLE[0][(crc ^ data[0]) & 0xFF] ^ (crc >> 8)
        data += 1
        length -= 1
    return ~crc


def crc32(data, uint32_t start=0):
    """CRC-32 (IEEE) of a bytes-like object, as ``zlib.crc32``."""
    cdef const uint8_t[::1] view = data
    if view.shape[0] == 0:
        return start
    return _crc32(start, &view[0], view.shape[0])


cdef struct Reader:
    const uint8_t* data
    Py_ssize_t length
    int breached


cdef inline bint _fits(int64_t at, int64_t size, int64_t length) noexcept nogil:
    """``[at, at + size)`` lies inside a buffer of ``length`` bytes."""
    return at >= 0 and size >= 0 and at <= length - size


cdef inline bint _within(Reader* reader, int64_t at, int64_t size) noexcept nogil:
    if not _fits(at, size, reader.length):
        reader.breached = 1
        return False
    return True


cdef inline uint32_t _u32(Reader* reader, int64_t at) noexcept nogil:
    if not _within(reader, at, 4):
        return 0
    cdef const uint8_t* p = reader.data + at
    return ((<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16)
            | (<uint32_t>p[2] << 8) | <uint32_t>p[3])


cdef inline int32_t _i32(Reader* reader, int64_t at) noexcept nogil:
    return <int32_t>_u32(reader, at)


cdef inline int64_t _i64(Reader* reader, int64_t at) noexcept nogil:
    return <int64_t>((<uint64_t>_u32(reader, at) << 32) | <uint64_t>_u32(reader, at + 4))


cdef inline int16_t _i16(Reader* reader, int64_t at) noexcept nogil:
    if not _within(reader, at, 2):
        return 0
    return <int16_t>((<uint32_t>reader.data[at] << 8) | <uint32_t>reader.data[at + 1])


cdef inline uint8_t _u8(Reader* reader, int64_t at) noexcept nogil:
    if not _within(reader, at, 1):
        return 0
    return reader.data[at]


cdef bint _utf8_valid(const uint8_t* s, int64_t n) noexcept nogil:
    """Well-formed UTF-8 (Unicode table 3-7), as Python's strict decoder accepts it."""
    cdef int64_t i = 0
    cdef uint8_t c, low, high
    cdef int follow, k
    while i < n:
        c = s[i]
        if c < 0x80:
            i += 1
            continue
        low = 0x80
        high = 0xBF
        if 0xC2 <= c <= 0xDF:
            follow = 1
        elif 0xE0 <= c <= 0xEF:
            follow = 2
            if c == 0xE0:
                low = 0xA0
            elif c == 0xED:
                high = 0x9F
        elif 0xF0 <= c <= 0xF4:
            follow = 3
            if c == 0xF0:
                low = 0x90
            elif c == 0xF4:
                high = 0x8F
        else:
            return False
        if i + follow >= n:
            return False
        if not low <= s[i + 1] <= high:
            return False
        for k in range(2, follow + 1):
            if not 0x80 <= s[i + k] <= 0xBF:
                return False
        i += follow + 1
    return True


cdef bint _property_crc_matches(Reader* reader, int64_t position, int64_t total) noexcept nogil:
    cdef int64_t tail = position + total - CRC_PROPERTY_LENGTH
    cdef const uint8_t* p
    cdef uint64_t stored = 0
    cdef int k
    if not _within(reader, position, total) or tail < position:
        return False
    p = reader.data + tail
    if memcmp(p, b"__CRC32#\x01", 9) != 0 or p[19] != 2:
        return False
    for k in range(18, 8, -1):
        if not 0x30 <= p[k] <= 0x39:
            return False
        stored = stored * 10 + (p[k] - 0x30)
    return stored == (_crc32(0, reader.data + position, total - CRC_PROPERTY_LENGTH) & 0x7FFFFFFF)


cdef struct Outcome:
    int64_t count
    int64_t stop
    int64_t position
    int64_t value
    int64_t failures
    int64_t problem


cdef void _scan(Reader* reader, int64_t start, int64_t limit, int64_t base, int64_t room,
                bint check_crc, bint stop_on_crc_error, bint property_crc,
                int64_t* rows, int64_t capacity, Outcome* out) noexcept nogil:
    cdef int64_t position = start, remaining, total, record_end, header_size
    cdef int64_t topic_at, topic_length, properties_at, properties_length, body_length
    cdef int64_t born_length, store_length, stored_at, physical, crc_status
    cdef int64_t checked_topic_at = -1, checked_topic_length = -1
    cdef int32_t magic, body_crc, sys_flag
    cdef int64_t version
    cdef int64_t* row
    cdef bint good
    out.count = 0
    out.stop = STOP_END
    out.failures = 0
    out.value = 0
    out.problem = P_NONE
    while True:
        if out.count == capacity:
            out.stop = STOP_ROWS_FULL
            break
        remaining = limit - position
        if remaining < 8:
            if room > 0:
                out.stop = STOP_MORE_DATA
                out.value = 8
            else:
                out.stop = STOP_END
            break
        total = _i32(reader, position)
        magic = _i32(reader, position + 4)
        if magic != MAGIC_V1:
            if magic == 0 and total == 0:
                out.stop = STOP_END
                break
            if magic == MAGIC_BLANK:
                out.stop = STOP_BLANK
                out.value = total
                break
            if magic != MAGIC_V2:
                out.stop, out.value, out.problem = STOP_INVALID, magic, P_MAGIC
                break
        if not (MIN_RECORD_LENGTH <= total <= remaining + room):
            out.stop, out.value, out.problem = STOP_INVALID, total, P_TOTAL_SIZE_BOUNDS
            break
        if total > remaining:
            out.stop, out.value = STOP_MORE_DATA, total
            break
        sys_flag = _i32(reader, position + 36)
        born_length = 20 if sys_flag & 0x10 else 8
        store_length = 20 if sys_flag & 0x20 else 8
        header_size = 72 + born_length + store_length
        if header_size + 3 > total:
            out.stop, out.value, out.problem = STOP_INVALID, total, P_HEADER_TOO_SMALL
            break
        body_length = _i32(reader, position + header_size - 4)
        topic_at = position + header_size + body_length
        record_end = position + total
        if body_length < 0 or topic_at + 3 > record_end:
            out.stop, out.value, out.problem = STOP_INVALID, body_length, P_BODY_LENGTH
            break
        if magic == MAGIC_V1:
            version = 1
            topic_length = _u8(reader, topic_at)
            if topic_length > 127:
                out.stop, out.value, out.problem = STOP_INVALID, topic_length - 256, P_TOPIC_NEGATIVE
                break
            topic_at += 1
        else:
            version = 2
            topic_length = _i16(reader, topic_at)
            if topic_length < 0:
                out.stop, out.value, out.problem = STOP_INVALID, topic_length, P_TOPIC_NEGATIVE
                break
            topic_at += 2
        properties_at = topic_at + topic_length
        if properties_at + 2 > record_end:
            out.stop, out.value, out.problem = STOP_INVALID, topic_length, P_TOPIC_PAST_RECORD
            break
        properties_length = _i16(reader, properties_at)
        if properties_length < 0:
            out.stop, out.value, out.problem = STOP_INVALID, properties_length, P_PROPERTIES_NEGATIVE
            break
        if properties_at + 2 + properties_length != record_end:
            out.stop, out.value, out.problem = STOP_INVALID, total, P_FIELDS_MISMATCH
            break
        physical = _i64(reader, position + 28)
        if physical != base + position:
            out.stop, out.value, out.problem = STOP_INVALID, physical, P_PHYSICAL_OFFSET
            break
        if not _within(reader, topic_at, topic_length):
            break
        if not (topic_length == checked_topic_length and (
                topic_length == 0 or memcmp(reader.data + topic_at,
                                            reader.data + checked_topic_at, topic_length) == 0)):
            if not _utf8_valid(reader.data + topic_at, topic_length):
                out.stop, out.problem = STOP_INVALID, P_TOPIC_UTF8
                break
            checked_topic_at, checked_topic_length = topic_at, topic_length
        body_crc = _i32(reader, position + 8)
        crc_status = -1
        if check_crc:
            if property_crc:
                good = _property_crc_matches(reader, position, total)
            elif body_length == 0:
                good = True
            elif _within(reader, position + header_size, body_length):
                good = (_crc32(0, reader.data + position + header_size, body_length)
                        & 0x7FFFFFFF) == <uint32_t>body_crc
            else:
                break
            crc_status = 1 if good else 0
            if not good:
                out.failures += 1
                if stop_on_crc_error:
                    out.stop, out.value = STOP_INVALID, body_crc
                    out.problem = P_PROPERTY_CRC if property_crc else P_BODY_CRC
                    break
        stored_at = position + 48 + born_length
        row = rows + out.count * WIDTH
        row[C_POSITION] = position
        row[C_TOTAL_SIZE] = total
        row[C_VERSION] = version
        row[C_BODY_CRC] = body_crc
        row[C_QUEUE_ID] = _i32(reader, position + 12)
        row[C_FLAG] = _i32(reader, position + 16)
        row[C_QUEUE_OFFSET] = _i64(reader, position + 20)
        row[C_PHYSICAL_OFFSET] = physical
        row[C_SYS_FLAG] = sys_flag
        row[C_BORN_TIMESTAMP] = _i64(reader, position + 40)
        row[C_STORE_TIMESTAMP] = _i64(reader, stored_at)
        row[C_RECONSUME_TIMES] = _i32(reader, stored_at + 8 + store_length)
        row[C_PREPARED_OFFSET] = _i64(reader, stored_at + 12 + store_length)
        row[C_HEADER_SIZE] = header_size
        row[C_BODY_LENGTH] = body_length
        row[C_TOPIC_AT] = topic_at
        row[C_TOPIC_LENGTH] = topic_length
        row[C_PROPERTIES_AT] = properties_at + 2
        row[C_PROPERTIES_LENGTH] = properties_length
        row[C_CRC_STATUS] = crc_status
        out.count += 1
        position = record_end
        if reader.breached:
            break
    out.position = position


def scan(buf, int64_t start, int64_t limit, int64_t base_offset, int64_t room, int options,
         rows):
    """See ``rmqstore/kernel/layout.py``."""
    cdef const uint8_t[::1] view = buf
    cdef int64_t[::1] row_view = rows
    cdef Reader reader
    cdef Outcome out
    cdef int64_t capacity = row_view.shape[0] // WIDTH
    cdef int64_t* row_data = NULL
    if not (0 <= start <= limit <= view.shape[0]) or room < 0:
        raise ValueError("scan bounds are outside the buffer")
    reader.data = &view[0] if view.shape[0] else NULL
    reader.length = view.shape[0]
    reader.breached = 0
    cdef bint check_crc = options & _CHECK_CRC
    cdef bint stop_on_crc_error = options & _STOP_ON_CRC_ERROR
    cdef bint property_crc = options & _PROPERTY_CRC
    if capacity:
        row_data = &row_view[0]
    with nogil:
        _scan(&reader, start, limit, base_offset, room, check_crc, stop_on_crc_error,
              property_crc, row_data, capacity, &out)
    if reader.breached:
        raise KernelBoundsError(
            f"record kernel stopped a read outside its buffer near position {out.position}")
    return out.count, out.stop, out.position, out.value, out.failures, out.problem


def records_at(buf, spans, int64_t count, int64_t base_offset, int64_t queue_id, topic,
               rows):
    """See ``rmqstore/kernel/layout.py``."""
    cdef const uint8_t[::1] view = buf
    cdef const int64_t[::1] span_view = spans
    cdef const uint8_t[::1] name = topic
    cdef int64_t[::1] row_view = rows
    cdef Reader reader
    cdef Outcome out
    cdef int64_t i, position, size, name_length = name.shape[0]
    cdef int64_t* row
    if count < 0 or count > row_view.shape[0] // WIDTH or 2 * count > span_view.shape[0]:
        raise ValueError("records_at: more spans than rows or span pairs")
    reader.data = &view[0] if view.shape[0] else NULL
    reader.length = view.shape[0]
    reader.breached = 0
    i = 0
    with nogil:
        while i < count:
            position = span_view[2 * i]
            size = span_view[2 * i + 1]
            if size <= 0 or not _fits(position, size, reader.length):
                break
            row = &row_view[i * WIDTH]
            _scan(&reader, position, position + size, base_offset, 0, 0, 0, 0, row, 1, &out)
            if reader.breached or out.count != 1:
                break
            if row[C_TOTAL_SIZE] != size or row[C_QUEUE_ID] != queue_id:
                break
            if row[C_TOPIC_LENGTH] != name_length or not _fits(
                    row[C_TOPIC_AT], name_length, reader.length):
                break
            if name_length and memcmp(reader.data + row[C_TOPIC_AT], &name[0],
                                      <size_t>name_length) != 0:
                break
            i += 1
    if reader.breached:
        raise KernelBoundsError("record kernel stopped a read outside its buffer (records_at)")
    return i


# -- dispatch preparation (see layout.py) -----------------------------------------------------

DEF DISPATCH_WIDTH = 4
DEF KEY_SIZE = 21

cdef const uint8_t* SCHEDULE_TOPIC = b"SCHEDULE_TOPIC_XXXX"


cdef inline uint32_t _java_hash(const uint8_t* data, int64_t length, uint32_t value) noexcept nogil:
    cdef int64_t i
    for i in range(length):
        value = 31 * value + data[i]
    return value


cdef inline int32_t _index_hash(uint32_t value) noexcept nogil:
    cdef int32_t signed = <int32_t>value
    if value == 0x80000000U:
        return 0
    return -signed if signed < 0 else signed


cdef inline bint _is_ascii(const uint8_t* data, int64_t length) noexcept nogil:
    # eight bytes at a time (a record's properties are some 100 bytes), then the rest
    cdef int64_t i = 0
    cdef uint64_t word, seen = 0
    cdef uint8_t tail = 0
    while i + 8 <= length:
        memcpy(&word, data + i, 8)
        seen |= word
        i += 8
    while i < length:
        tail |= data[i]
        i += 1
    return (seen & 0x8080808080808080ULL) == 0 and tail < 0x80


cdef inline void _put_le(uint8_t* at, uint64_t value, int size) noexcept nogil:
    cdef int i
    for i in range(size):
        at[i] = (value >> (8 * i)) & 0xFF


cdef inline int64_t _pair_end(const uint8_t* data, int64_t position, int64_t end,
                              int64_t* separator) noexcept nogil:
    """Where the property pair starting at ``position`` ends (its 0x02, or ``end``); its
    0x01 goes into ``separator`` (the pair's end when it has none). The caller checked that
    ``[position, end)`` lies in the buffer (so both searches stay inside it)."""
    cdef const uint8_t* found
    cdef int64_t pair_end = end
    if position >= end:
        separator[0] = position
        return position
    found = <const uint8_t*>memchr(data + position, 2, <size_t>(end - position))
    if found != NULL:
        pair_end = found - data
    found = <const uint8_t*>memchr(data + position, 1, <size_t>(pair_end - position))
    separator[0] = pair_end if found == NULL else found - data
    return pair_end


cdef struct TextSpans:
    int64_t topic_at
    int64_t topic_length
    int64_t props_at
    int64_t props_length


cdef inline bint _text_spans(const int64_t[::1] row_view, int64_t at, int64_t length,
                             TextSpans* spans) noexcept nogil:
    """Where the topic and properties of the row at ``at`` lie; False when either is outside
    a buffer of ``length`` bytes (a row the scan did not make)."""
    spans.topic_at = row_view[at + C_TOPIC_AT]
    spans.topic_length = row_view[at + C_TOPIC_LENGTH]
    spans.props_at = row_view[at + C_PROPERTIES_AT]
    spans.props_length = row_view[at + C_PROPERTIES_LENGTH]
    return (_fits(spans.topic_at, spans.topic_length, length)
            and _fits(spans.props_at, spans.props_length, length))


def prepare_dispatch(buf, rows, int64_t first, int64_t count, int options, out, keys):
    """See ``rmqstore/kernel/layout.py``."""
    cdef const uint8_t[::1] view = buf
    cdef const int64_t[::1] row_view = rows
    cdef int64_t[::1] out_view = out
    cdef uint8_t[::1] key_view = keys
    cdef int64_t capacity = key_view.shape[0] // KEY_SIZE
    cdef int64_t length = view.shape[0]
    cdef int64_t row, at, topic_at, topic_length, entries = 0
    cdef TextSpans text
    cdef int64_t position, end, separator, pair_end, name_length, value_at, value_length
    cdef int64_t tags_at = -1, tags_length = 0, keys_at = -1, keys_length = 0
    cdef int64_t uniq_at = -1, uniq_length = 0, pieces, piece_start, k, out_at, number
    cdef const uint8_t* data
    cdef uint8_t* key_data = &key_view[0] if key_view.shape[0] else NULL
    cdef uint32_t prefix
    cdef bint reference, multi_dispatch, bad = False
    if not (0 <= first <= count <= row_view.shape[0] // ROW_WIDTH_NATIVE) \
            or out_view.shape[0] < count * DISPATCH_WIDTH:
        raise ValueError("dispatch rows are outside their buffers")
    data = &view[0] if length else NULL
    row = first
    with nogil:
        while row < count:
            at = row * ROW_WIDTH_NATIVE
            if not _text_spans(row_view, at, length, &text):
                bad = True
                break
            topic_at, topic_length = text.topic_at, text.topic_length
            tags_at = keys_at = uniq_at = -1
            tags_length = keys_length = uniq_length = 0
            multi_dispatch = False
            position = text.props_at
            end = text.props_at + text.props_length
            while position <= end:
                pair_end = _pair_end(data, position, end, &separator)
                name_length = separator - position
                value_at = separator + 1
                value_length = pair_end - value_at
                if separator < pair_end and name_length > 0 and value_length > 0:
                    if name_length == 4 and memcmp(data + position, b"TAGS", 4) == 0:
                        tags_at, tags_length = value_at, value_length
                    elif name_length == 4 and memcmp(data + position, b"KEYS", 4) == 0:
                        keys_at, keys_length = value_at, value_length
                    elif name_length == 8 and memcmp(data + position, b"UNIQ_KEY", 8) == 0:
                        uniq_at, uniq_length = value_at, value_length
                    elif name_length == 20 and memcmp(data + position,
                                                      b"INNER_MULTI_DISPATCH", 20) == 0:
                        multi_dispatch = True  # its units go to further queues too
                position = pair_end + 1
            reference = (
                (topic_length == 19 and memcmp(data + topic_at, SCHEDULE_TOPIC, 19) == 0)
                or not _is_ascii(data + topic_at, topic_length)
                or (tags_at >= 0 and not _is_ascii(data + tags_at, tags_length))
                or (keys_at >= 0 and not _is_ascii(data + keys_at, keys_length))
                or (uniq_at >= 0 and not _is_ascii(data + uniq_at, uniq_length))
            )
            pieces = 0
            if not reference and options & 1 and (row_view[at + C_SYS_FLAG] & 0xC) != 0xC:
                if uniq_at >= 0:
                    pieces += 1
                k = keys_at
                while keys_at >= 0 and k < keys_at + keys_length:
                    while k < keys_at + keys_length and data[k] == 0x20:
                        k += 1
                    if k < keys_at + keys_length:
                        pieces += 1
                    while k < keys_at + keys_length and data[k] != 0x20:
                        k += 1
            if entries + pieces > capacity:
                break
            out_at = row * DISPATCH_WIDTH
            out_view[out_at + TAGS_CODE] = 0
            if tags_at >= 0 and not reference:
                out_view[out_at + TAGS_CODE] = <int32_t>_java_hash(data + tags_at, tags_length, 0)
            out_view[out_at + DISPATCH_FLAGS] = (1 if reference else 0) | (2 if multi_dispatch else 0)
            out_view[out_at + KEYS_FROM] = entries
            out_view[out_at + KEYS_COUNT] = pieces
            if pieces:
                prefix = _java_hash(data + topic_at, topic_length, 0) * 31 + 0x23  # '#'
                number = 0
                if uniq_at >= 0:
                    _write_key(key_data + (entries + number) * KEY_SIZE, row_view[at + C_PHYSICAL_OFFSET],
                               row_view[at + C_STORE_TIMESTAMP],
                               _index_hash(_java_hash(data + uniq_at, uniq_length, prefix)), 1)
                    number += 1
                k = keys_at
                while keys_at >= 0 and k < keys_at + keys_length:
                    while k < keys_at + keys_length and data[k] == 0x20:
                        k += 1
                    piece_start = k
                    while k < keys_at + keys_length and data[k] != 0x20:
                        k += 1
                    if k > piece_start:
                        _write_key(key_data + (entries + number) * KEY_SIZE, row_view[at + C_PHYSICAL_OFFSET],
                                   row_view[at + C_STORE_TIMESTAMP],
                                   _index_hash(_java_hash(data + piece_start, k - piece_start,
                                                          prefix)),
                                   1 if number == 0 else 0)
                        number += 1
                entries += pieces
            row += 1
    if bad:
        raise ValueError(f"row {row} points outside the buffer")
    return row, entries


cdef inline void _write_key(uint8_t* at, int64_t offset, int64_t stamp, int32_t key_hash,
                            int first) noexcept nogil:
    _put_le(at, <uint64_t>offset, 8)
    _put_le(at + 8, <uint64_t>stamp, 8)
    _put_le(at + 16, <uint32_t>key_hash, 4)
    at[20] = first


# -- index application (see layout.py) ---------------------------------------------------------

cdef inline int64_t _get_le(const uint8_t* at, int size) noexcept nogil:
    cdef uint64_t value = 0
    cdef int i
    for i in range(size - 1, -1, -1):
        value = (value << 8) | at[i]
    return <int64_t>value


cdef inline void _put_be32(uint8_t* at, uint32_t value) noexcept nogil:
    at[0] = value >> 24
    at[1] = (value >> 16) & 0xFF
    at[2] = (value >> 8) & 0xFF
    at[3] = value & 0xFF


cdef inline int32_t _get_be32(const uint8_t* at) noexcept nogil:
    return <int32_t>((<uint32_t>at[0] << 24) | (<uint32_t>at[1] << 16)
                     | (<uint32_t>at[2] << 8) | <uint32_t>at[3])


def apply_index(buf, int64_t slots, int64_t entries_at, int64_t limit, int64_t reserved, state,
                keys, int64_t start, int64_t stop):
    """See ``rmqstore/kernel/layout.py``."""
    cdef uint8_t[::1] index_view = buf
    cdef int64_t[::1] state_view = state
    cdef const uint8_t[::1] key_view = keys
    cdef uint8_t* index_data
    cdef const uint8_t* key_data
    cdef const uint8_t* key
    cdef int64_t count, slot_count, begin, end_offset, end_timestamp, skipping, indexed, written
    cdef int64_t number = start, offset, stamp, slot_at, previous, time_diff, entry_at
    cdef int32_t key_hash
    cdef int first, reason = 0
    if slots <= 0 or limit < 0 or entries_at < 40 + 4 * slots \
            or index_view.shape[0] < entries_at + limit * 20 or not 0 <= start <= stop:
        raise ValueError("index geometry is outside the buffer")
    if stop * KEY_SIZE > key_view.shape[0] or state_view.shape[0] < STATE_WIDTH or state_view[STATE_COUNT] < 1:
        raise ValueError("keys or state are outside their buffers")
    index_data = &index_view[0]
    key_data = &key_view[0] if key_view.shape[0] else NULL
    count, slot_count = state_view[STATE_COUNT], state_view[STATE_SLOT_COUNT]
    begin, end_offset, end_timestamp = state_view[STATE_BEGIN_TIMESTAMP], state_view[STATE_END_OFFSET], state_view[STATE_END_TIMESTAMP]
    skipping, indexed, written = state_view[STATE_SKIPPING], state_view[STATE_INDEXED], state_view[STATE_WRITTEN]
    with nogil:
        while number < stop:
            if count >= limit:
                reason = 1
                break
            key = key_data + number * KEY_SIZE
            offset = _get_le(key, 8)
            stamp = _get_le(key + 8, 8)
            key_hash = <int32_t>_get_le(key + 16, 4)
            first = key[20]
            if first:
                skipping = 1 if (offset < end_offset or (offset == end_offset and count > 1)) else 0
            if skipping:
                number += 1
                continue
            if count >= reserved:
                reason = 2
                break
            if first:
                indexed += 1
            if key_hash < 0:  # never from prepare_dispatch: Math.abs, MIN_VALUE made 0
                reason = 3
                break
            slot_at = 40 + (key_hash % slots) * 4
            previous = _get_be32(index_data + slot_at)
            if previous <= 0 or previous > count:
                previous = 0
                slot_count += 1
            if begin <= 0 or stamp <= begin:
                time_diff = 0
            else:
                time_diff = (stamp - begin) // 1000
                if time_diff > 0x7FFFFFFF:
                    time_diff = 0x7FFFFFFF
            entry_at = entries_at + count * 20
            _put_be32(index_data + entry_at, <uint32_t>key_hash)
            _put_be32(index_data + entry_at + 4, <uint32_t>(<uint64_t>offset >> 32))
            _put_be32(index_data + entry_at + 8, <uint32_t>(<uint64_t>offset & 0xFFFFFFFFU))
            _put_be32(index_data + entry_at + 12, <uint32_t>time_diff)
            _put_be32(index_data + entry_at + 16, <uint32_t>previous)
            _put_be32(index_data + slot_at, <uint32_t>count)
            if count <= 1:
                state_view[STATE_BEGIN_OFFSET] = offset
                begin = stamp
            count += 1
            end_offset, end_timestamp = offset, stamp
            written += 1
            number += 1
    if reason == 3:
        raise ValueError(f"key hash {key_hash} of entry {number} is negative")
    state_view[STATE_COUNT], state_view[STATE_SLOT_COUNT], state_view[STATE_BEGIN_TIMESTAMP] = count, slot_count, begin
    state_view[STATE_END_OFFSET], state_view[STATE_END_TIMESTAMP] = end_offset, end_timestamp
    state_view[STATE_SKIPPING], state_view[STATE_INDEXED], state_view[STATE_WRITTEN] = skipping, indexed, written
    return number, reason


# -- consume-queue runs (see layout.py) --------------------------------------------------------

DEF RUN_WIDTH = 7


cdef inline void _put_unit(uint8_t* unit, int64_t physical_offset, int64_t size,
                           int64_t tags_code) noexcept nogil:
    """A consume-queue unit (20 bytes, big-endian: offset, size, tagsCode) at ``unit``."""
    _put_be32(unit, <uint32_t>(<uint64_t>physical_offset >> 32))
    _put_be32(unit + 4, <uint32_t>(<uint64_t>physical_offset & 0xFFFFFFFFU))
    _put_be32(unit + 8, <uint32_t>size)
    _put_be32(unit + 12, <uint32_t>(<uint64_t>tags_code >> 32))
    _put_be32(unit + 16, <uint32_t>(<uint64_t>tags_code & 0xFFFFFFFFU))


cdef inline bint _continues(int64_t first, int64_t units, int64_t queue_offset) noexcept nogil:
    """Whether ``queue_offset`` is the next of a run of ``units`` from ``first``, without the
    signed overflow of ``first + units`` (a run may start at queue offset 2^63 - 1)."""
    return queue_offset > first and <uint64_t>queue_offset - <uint64_t>first == <uint64_t>units


def queue_runs(buf, rows, int64_t first, int64_t count, dispatch_out, units, runs, row_runs):
    """See ``rmqstore/kernel/layout.py``."""
    cdef const uint8_t[::1] view = buf
    cdef int64_t[::1] row_view = rows
    cdef int64_t[::1] out_view = dispatch_out
    cdef uint8_t[::1] unit_view = units
    cdef int64_t[::1] run_view = runs
    cdef int64_t[::1] row_run_view = row_runs
    cdef int64_t capacity = run_view.shape[0] // RUN_WIDTH
    cdef int64_t length = view.shape[0]
    cdef int64_t row, at, n, number, found = 0, topic_at, topic_length, queue_id, queue_offset
    cdef int64_t other_at, run_at, unit_at, sys_type
    cdef const uint8_t* data
    cdef uint8_t* unit
    cdef bint bad = False
    if (not (0 <= first <= count <= row_view.shape[0] // ROW_WIDTH_NATIVE)
            or out_view.shape[0] < count * DISPATCH_WIDTH
            or unit_view.shape[0] < (count - first) * 20 or row_run_view.shape[0] < count):
        raise ValueError("queue runs are outside their buffers")
    data = &view[0] if length else NULL
    row = first
    with nogil:
        while row < count:
            row_run_view[row] = -1
            at = row * ROW_WIDTH_NATIVE
            sys_type = row_view[at + C_SYS_FLAG] & 0xC
            if out_view[row * DISPATCH_WIDTH + DISPATCH_FLAGS] & 1 or (sys_type != 0 and sys_type != 8):
                row += 1
                continue
            topic_at = row_view[at + C_TOPIC_AT]
            topic_length = row_view[at + C_TOPIC_LENGTH]
            if not _fits(topic_at, topic_length, length):
                bad = True
                break
            queue_id = row_view[at + C_QUEUE_ID]
            queue_offset = row_view[at + C_QUEUE_OFFSET]
            number = -1
            n = found - 1
            while n >= 0:  # the queue's latest run
                run_at = n * RUN_WIDTH
                if run_view[run_at + RUN_QUEUE_ID] == queue_id:
                    other_at = row_view[run_view[run_at + RUN_TOPIC_ROW] * ROW_WIDTH_NATIVE + C_TOPIC_AT]
                    if (row_view[run_view[run_at + RUN_TOPIC_ROW] * ROW_WIDTH_NATIVE + C_TOPIC_LENGTH] == topic_length
                            and (topic_length == 0 or memcmp(data + other_at, data + topic_at,
                                                             topic_length) == 0)):
                        number = n
                        break
                n -= 1
            if number >= 0 and not _continues(run_view[number * RUN_WIDTH + RUN_FIRST_QUEUE_OFFSET],
                                              run_view[number * RUN_WIDTH + RUN_UNITS], queue_offset):
                number = -1
            if number < 0:
                if found == capacity:
                    break
                number = found
                found += 1
                run_at = number * RUN_WIDTH
                run_view[run_at + RUN_TOPIC_ROW] = row
                run_view[run_at + RUN_QUEUE_ID] = queue_id
                run_view[run_at + RUN_FIRST_QUEUE_OFFSET] = queue_offset
                run_view[run_at + RUN_UNITS] = 0
                run_view[run_at + RUN_UNITS_FROM] = 0
                run_view[run_at + RUN_FIRST_END] = row_view[at + C_PHYSICAL_OFFSET] + row_view[at + C_TOTAL_SIZE]
            run_view[number * RUN_WIDTH + RUN_UNITS] += 1
            run_view[number * RUN_WIDTH + RUN_LAST_ROW] = row
            row_run_view[row] = number
            row += 1
        if not bad:
            unit_at = 0
            for n in range(found):
                run_view[n * RUN_WIDTH + RUN_UNITS_FROM] = unit_at
                unit_at += run_view[n * RUN_WIDTH + RUN_UNITS]
                run_view[n * RUN_WIDTH + RUN_UNITS] = 0  # counted again as the units are written
            for n in range(first, row):
                number = row_run_view[n]
                if number < 0:
                    continue
                run_at = number * RUN_WIDTH
                unit = &unit_view[(run_view[run_at + RUN_UNITS_FROM] + run_view[run_at + RUN_UNITS]) * 20]
                at = n * ROW_WIDTH_NATIVE
                _put_unit(unit, row_view[at + C_PHYSICAL_OFFSET], row_view[at + C_TOTAL_SIZE],
                          out_view[n * DISPATCH_WIDTH + TAGS_CODE])
                run_view[run_at + RUN_UNITS] += 1
    if bad:
        raise ValueError(f"row {row} points outside the buffer")
    return row, found


# -- consume-queue files (see layout.py) -------------------------------------------------------

cdef inline int64_t _get_be64(const uint8_t* at) noexcept nogil:
    return <int64_t>((<uint64_t><uint32_t>_get_be32(at) << 32) | <uint32_t>_get_be32(at + 4))


def valid_units(data):
    """See ``rmqstore/kernel/layout.py``."""
    cdef const uint8_t[::1] view = data
    cdef int64_t units = view.shape[0] // 20, index = 0
    cdef const uint8_t* at
    if units == 0:
        return 0
    at = &view[0]
    with nogil:
        while index < units:
            if _get_be64(at) < 0 or _get_be32(at + 8) <= 0:
                break
            index += 1
            at += 20
    return index


def cut_index(data, int64_t physical_offset):
    """See ``rmqstore/kernel/layout.py``."""
    cdef const uint8_t[::1] view = data
    cdef int64_t units = view.shape[0] // 20, index = 0, offset, result = -1
    cdef const uint8_t* at
    cdef bint valid
    if units == 0:
        return -1
    at = &view[0]
    with nogil:
        while index < units:
            offset = _get_be64(at)
            valid = offset >= 0 and _get_be32(at + 8) > 0
            if offset >= physical_offset and (valid or index == 0):
                result = index
                break
            if not valid:
                break
            index += 1
            at += 20
    return result


# -- record checks (see layout.py) -------------------------------------------------------------

_check_columns((("FORCE_PROPERTY_CRC", 1), ("SCHEDULED_ONLY", 2)))  # attention_rows options


def attention_rows(buf, rows, int64_t first, int64_t count, int64_t previous_time, int options,
                   found):
    """See ``rmqstore/kernel/layout.py``."""
    cdef const uint8_t[::1] view = buf
    cdef const int64_t[::1] row_view = rows
    cdef int64_t[::1] found_view = found
    cdef int64_t length = view.shape[0], number = 0, row, at, stamp, topic_at, topic_length
    cdef int64_t props_at, props_length
    cdef TextSpans text
    cdef const uint8_t* data
    cdef bint look, force = options & 1, schedule_only = options & 2, bad = False
    if not (0 <= first <= count <= row_view.shape[0] // ROW_WIDTH_NATIVE) \
            or found_view.shape[0] < count - first:
        raise ValueError("rows are outside their buffers")
    data = &view[0] if length else NULL
    row = first
    with nogil:
        while row < count:
            at = row * ROW_WIDTH_NATIVE
            stamp = row_view[at + C_STORE_TIMESTAMP]
            if not _text_spans(row_view, at, length, &text):
                bad = True
                break
            topic_at, topic_length = text.topic_at, text.topic_length
            props_at, props_length = text.props_at, text.props_length
            look = (topic_length == 19 and memcmp(data + topic_at, SCHEDULE_TOPIC, 19) == 0) \
                if schedule_only else (
                row_view[at + C_CRC_STATUS] == 0
                or force
                or not _is_ascii(data + props_at, props_length)
                or (props_length >= 20 and memcmp(data + props_at + props_length - 20,
                                                  b"__CRC32#", 8) == 0
                    and data[props_at + props_length - 1] == 2)
                or (topic_length == 19 and memcmp(data + topic_at, SCHEDULE_TOPIC, 19) == 0)
                or stamp < previous_time
            )
            previous_time = stamp
            if look:
                found_view[number] = row
                number += 1
            row += 1
    if bad:
        raise ValueError(f"row {row} points outside the buffer")
    return number


# -- index files, verify (see layout.py) -------------------------------------------------------

def index_chain(data, int64_t first_number, int64_t slots, newest, chain, bad,
                int64_t bad_capacity):
    """See ``rmqstore/kernel/layout.py``."""
    cdef const uint8_t[::1] view = data
    cdef int32_t[::1] newest_view = newest
    cdef int64_t[::1] chain_view = chain
    cdef int64_t[::1] bad_view = bad
    cdef int64_t units = view.shape[0] // 20, step, number, slot, found = 0
    cdef int64_t previous_offset, heads, first, last, offset, walked
    cdef int32_t key_hash, time_diff, previous
    cdef const uint8_t* at
    if slots <= 0 or newest_view.shape[0] < slots or bad_view.shape[0] < bad_capacity * 6 \
            or chain_view.shape[0] < 5:
        raise ValueError("index chain buffers are too small")
    previous_offset, heads = chain_view[0], chain_view[1]
    first, last, walked = chain_view[2], chain_view[3], chain_view[4]
    if units:
        at = &view[0]
        with nogil:
            for step in range(units):
                number = first_number + step
                key_hash = _get_be32(at)
                offset = _get_be64(at + 4)
                time_diff = _get_be32(at + 12)
                previous = _get_be32(at + 16)
                slot = key_hash % slots
                if slot < 0:
                    slot += slots  # Python's %: never negative
                if (key_hash < 0 or previous != newest_view[slot] or time_diff < 0
                        or offset < previous_offset) and found < bad_capacity:
                    bad_view[found * 6] = number
                    bad_view[found * 6 + 1] = key_hash
                    bad_view[found * 6 + 2] = offset
                    bad_view[found * 6 + 3] = time_diff
                    bad_view[found * 6 + 4] = previous
                    bad_view[found * 6 + 5] = newest_view[slot]
                    found += 1
                newest_view[slot] = <int32_t>number
                if previous == 0:
                    heads += 1
                previous_offset = offset
                if walked == 0:
                    first = offset
                walked += 1
                last = offset
                at += 20
    chain_view[0], chain_view[1], chain_view[2], chain_view[3] = previous_offset, heads, first, last
    chain_view[4] = walked
    return found


def match_keys(keys, int64_t first, int64_t count, entries):
    """See ``rmqstore/kernel/layout.py``."""
    cdef const uint8_t[::1] key_view = keys
    cdef const uint8_t[::1] entry_view = entries
    cdef int64_t available, number = 0
    cdef const uint8_t* key
    cdef const uint8_t* entry
    if first < 0 or count < 0 or (first + count) * KEY_SIZE > key_view.shape[0]:
        raise ValueError("keys are outside their buffer")
    available = min(count, entry_view.shape[0] // 20)
    if available == 0:
        return 0
    key = &key_view[first * KEY_SIZE]
    entry = &entry_view[0]
    with nogil:
        while number < available:
            if (<int32_t>_get_le(key + 16, 4) != _get_be32(entry)
                    or _get_le(key, 8) != _get_be64(entry + 4)):
                break
            number += 1
            key += KEY_SIZE
            entry += 20
    return number


# -- columns for export and stats (see layout.py) ----------------------------------------------

cdef enum:
    FIELD_TOPIC = 0
    FIELD_BODY = 1
    FIELD_PROPERTIES = 2
    FIELD_BORN_HOST = 3
    FIELD_STORE_HOST = 4
    FIELD_TAGS = 5
    FIELD_KEYS = 6
    FIELD_UNIQ_KEY = 7

DEF SPAN_ABSENT = -1
DEF BORN_HOST_AT = 48
DEF PICKED_WIDTH_NATIVE = 6

_check_columns((
    ("FIELD_TOPIC", FIELD_TOPIC), ("FIELD_BODY", FIELD_BODY), ("FIELD_PROPERTIES",
    FIELD_PROPERTIES), ("FIELD_BORN_HOST", FIELD_BORN_HOST), ("FIELD_STORE_HOST",
    FIELD_STORE_HOST), ("FIELD_TAGS", FIELD_TAGS), ("FIELD_KEYS", FIELD_KEYS),
    ("FIELD_UNIQ_KEY", FIELD_UNIQ_KEY), ("SPAN_ABSENT", SPAN_ABSENT),
    ("PICKED_WIDTH", PICKED_WIDTH_NATIVE),
))


cdef inline int64_t _host_field(int64_t start, int64_t sys_flag, int field,
                                int64_t* host_length) noexcept nogil:
    """Where the born host (``field`` FIELD_BORN_HOST) or the store host field of the record
    at ``start`` lies, and its length: 8 bytes, or 20 for IPv6 (the sysFlag bits 0x10 and
    0x20 say which). The caller checks that it lies in the buffer."""
    cdef int64_t born_length = 20 if sys_flag & 0x10 else 8
    if field == FIELD_BORN_HOST:
        host_length[0] = born_length
        return start + BORN_HOST_AT
    host_length[0] = 20 if sys_flag & 0x20 else 8
    return start + BORN_HOST_AT + born_length + 8


cdef inline void _find_value(const uint8_t* data, int64_t props_at, int64_t props_length,
                             const uint8_t* name, int64_t name_length, int64_t* found_at,
                             int64_t* found_length) noexcept nogil:
    """The last valid pair called ``name`` in properties the caller checked lie in data."""
    cdef int64_t position = props_at, end = props_at + props_length, pair_end, separator
    found_at[0] = 0
    found_length[0] = SPAN_ABSENT
    while position <= end:
        pair_end = _pair_end(data, position, end, &separator)
        if (separator < pair_end and separator - position == name_length and name_length > 0
                and pair_end - separator - 1 > 0
                and memcmp(data + position, name, name_length) == 0):
            found_at[0] = separator + 1
            found_length[0] = pair_end - separator - 1
        position = pair_end + 1


def field_spans(buf, rows, int64_t first, int64_t count, int field, spans):
    """See ``rmqstore/kernel/layout.py``."""
    cdef const uint8_t[::1] view = buf
    cdef int64_t[::1] row_view = rows
    cdef int64_t[::1] span_view = spans
    cdef int64_t length = view.shape[0], row, at, start, sys_flag, span_at = 0, span_length = 0
    cdef int64_t total = 0, absent = 0, out
    cdef const uint8_t* data
    cdef bint bad = False
    if not (0 <= first <= count <= row_view.shape[0] // ROW_WIDTH_NATIVE) \
            or span_view.shape[0] < 2 * (count - first):
        raise ValueError("rows are outside their buffers")
    if not FIELD_TOPIC <= field <= FIELD_UNIQ_KEY:
        raise ValueError(f"no field {field}")
    data = &view[0] if length else NULL
    row = first
    with nogil:
        while row < count:
            at = row * ROW_WIDTH_NATIVE
            start = row_view[at + C_POSITION]
            if not _fits(start, row_view[at + C_TOTAL_SIZE], length):
                bad = True
                break
            sys_flag = row_view[at + C_SYS_FLAG]
            if field == FIELD_TOPIC:
                span_at, span_length = row_view[at + C_TOPIC_AT], row_view[at + C_TOPIC_LENGTH]
            elif field == FIELD_BODY:
                span_at = start + row_view[at + C_HEADER_SIZE]
                span_length = row_view[at + C_BODY_LENGTH]
            elif field == FIELD_PROPERTIES:
                span_at = row_view[at + C_PROPERTIES_AT]
                span_length = row_view[at + C_PROPERTIES_LENGTH]
            elif field == FIELD_BORN_HOST or field == FIELD_STORE_HOST:
                span_at = _host_field(start, sys_flag, field, &span_length)
            else:
                span_at = row_view[at + C_PROPERTIES_AT]
                span_length = row_view[at + C_PROPERTIES_LENGTH]
                if not _fits(span_at, span_length, length):
                    bad = True
                    break
                if field == FIELD_TAGS:
                    _find_value(data, span_at, span_length, b"TAGS", 4, &span_at, &span_length)
                elif field == FIELD_KEYS:
                    _find_value(data, span_at, span_length, b"KEYS", 4, &span_at, &span_length)
                else:
                    _find_value(data, span_at, span_length, b"UNIQ_KEY", 8, &span_at,
                                &span_length)
            if span_length != SPAN_ABSENT and not _fits(span_at, span_length, length):
                bad = True
                break
            out = 2 * (row - first)
            span_view[out] = span_at
            span_view[out + 1] = span_length
            if span_length == SPAN_ABSENT:
                absent += 1
            else:
                total += span_length
            row += 1
    if bad:
        raise ValueError(f"row {row} points outside the buffer")
    return total, absent


def gather(buf, spans, int64_t count, data, offsets):
    """See ``rmqstore/kernel/layout.py``."""
    cdef const uint8_t[::1] view = buf
    cdef const int64_t[::1] span_view = spans
    cdef uint8_t[::1] data_view = data
    cdef int32_t[::1] offset_view = offsets
    cdef int64_t length = view.shape[0], capacity = data_view.shape[0], written = 0
    cdef int64_t number, at, size
    cdef int failure = 0
    if not (0 <= count <= span_view.shape[0] // 2) or offset_view.shape[0] < count + 1:
        raise ValueError("spans are outside their buffers")
    offset_view[0] = 0
    number = 0
    with nogil:
        while number < count:
            at = span_view[2 * number]
            size = span_view[2 * number + 1]
            if size != SPAN_ABSENT:
                if not _fits(at, size, length):
                    failure = 1
                    break
                if size > capacity - written or written + size > 0x7FFFFFFF:
                    failure = 2
                    break
                if size:
                    memcpy(&data_view[written], &view[at], size)
                written += size
            offset_view[number + 1] = <int32_t>written
            number += 1
    if failure == 1:
        raise ValueError(f"span {number} is outside the buffer")
    if failure == 2:
        raise ValueError("the gathered bytes do not fit")
    return written


def property_pairs(buf, rows, int64_t first, int64_t count, spans, keys, key_offsets, items,
                   item_offsets, pair_offsets, picked):
    """See ``rmqstore/kernel/layout.py``."""
    cdef const uint8_t[::1] view = buf
    cdef int64_t[::1] row_view = rows
    cdef int64_t[::1] span_view = spans
    cdef uint8_t[::1] key_view = keys
    cdef int32_t[::1] key_offset_view = key_offsets
    cdef uint8_t[::1] item_view = items
    cdef int32_t[::1] item_offset_view = item_offsets
    cdef int32_t[::1] offset_view = pair_offsets
    cdef int64_t[::1] pick_view = picked
    cdef int64_t length = view.shape[0], row, at, props_at, props_length, position, end
    cdef int64_t pair_end, separator, name_length, value_length, pairs = 0, row_pairs, k
    cdef int64_t record_capacity = span_view.shape[0] // 4, pick_at, which
    cdef int64_t capacity = min(key_offset_view.shape[0], item_offset_view.shape[0]) - 1
    cdef int64_t key_room = key_view.shape[0], item_room = item_view.shape[0]
    cdef int64_t key_bytes = 0, item_bytes = 0, row_key_bytes, row_item_bytes, stride
    cdef const uint8_t* data
    # raw views of the working arrays: every index below is checked against these sizes
    # before it is used (a record's pairs against record_capacity, the names and values
    # against the rooms and capacity, the rows against the shapes checked here)
    cdef const int64_t* row_at
    cdef int64_t* span = NULL
    cdef uint8_t* key_out = NULL
    cdef uint8_t* item_out = NULL
    cdef int32_t* key_offset_out = NULL
    cdef int32_t* item_offset_out = NULL
    cdef int32_t* offset_out
    cdef int64_t* pick_out = NULL
    cdef bint bad = False, full = False, duplicate
    cdef bint picking = pick_view.shape[0] > 0
    cdef bint mapping = key_offset_view.shape[0] > 0 or item_offset_view.shape[0] > 0
    if not (0 <= first <= count <= row_view.shape[0] // ROW_WIDTH_NATIVE) \
            or offset_view.shape[0] < count - first + 1 or (mapping and capacity < 0) \
            or (picking and pick_view.shape[0] < PICKED_WIDTH_NATIVE * (count - first)):
        raise ValueError("rows are outside their buffers")
    data = &view[0] if length else NULL
    offset_out = &offset_view[0]
    offset_out[0] = 0
    if record_capacity:
        span = &span_view[0]
    if mapping:
        key_offset_out = &key_offset_view[0]
        item_offset_out = &item_offset_view[0]
        key_offset_out[0] = 0
        item_offset_out[0] = 0
        if key_room:
            key_out = &key_view[0]
        if item_room:
            item_out = &item_view[0]
    if picking:
        pick_out = &pick_view[0]
    stride = 2 * (count - first)  # between the TAGS, KEYS and UNIQ_KEY picks of a row
    row = first
    with nogil:
        while row < count:
            row_at = &row_view[0] + row * ROW_WIDTH_NATIVE
            props_at = row_at[C_PROPERTIES_AT]
            props_length = row_at[C_PROPERTIES_LENGTH]
            if not _fits(props_at, props_length, length):
                bad = True
                break
            # the record's pairs, as spans (name at, name length, value at, value length)
            row_pairs = 0
            position = props_at
            end = props_at + props_length
            while position <= end:
                pair_end = _pair_end(data, position, end, &separator)
                name_length = separator - position
                value_length = pair_end - separator - 1
                if separator < pair_end and name_length > 0 and value_length > 0:
                    duplicate = False
                    k = 0
                    while k < row_pairs:
                        if (span[4 * k + 1] == name_length
                                and memcmp(data + span[4 * k], data + position,
                                           name_length) == 0):
                            span[4 * k + 2] = separator + 1
                            span[4 * k + 3] = value_length
                            duplicate = True
                            break
                        k += 1
                    if not duplicate:
                        if row_pairs == record_capacity:
                            full = True
                            break
                        span[4 * row_pairs] = position
                        span[4 * row_pairs + 1] = name_length
                        span[4 * row_pairs + 2] = separator + 1
                        span[4 * row_pairs + 3] = value_length
                        row_pairs += 1
                position = pair_end + 1
            if full:
                break
            row_key_bytes = 0
            row_item_bytes = 0
            k = 0
            while k < row_pairs:
                row_key_bytes += span[4 * k + 1]
                row_item_bytes += span[4 * k + 3]
                k += 1
            if mapping and (row_pairs > capacity - pairs or row_key_bytes > key_room - key_bytes
                            or row_item_bytes > item_room - item_bytes
                            or key_bytes + row_key_bytes > 0x7FFFFFFF
                            or item_bytes + row_item_bytes > 0x7FFFFFFF):
                break  # the next call goes on from this row
            k = 0
            while mapping and k < row_pairs:  # the names and values, back to back
                # a kept pair's name and value are never empty
                memcpy(key_out + key_bytes, data + span[4 * k], span[4 * k + 1])
                key_bytes += span[4 * k + 1]
                memcpy(item_out + item_bytes, data + span[4 * k + 2], span[4 * k + 3])
                item_bytes += span[4 * k + 3]
                key_offset_out[pairs + k + 1] = <int32_t>key_bytes
                item_offset_out[pairs + k + 1] = <int32_t>item_bytes
                k += 1
            if picking:  # the values of TAGS, KEYS and UNIQ_KEY among the pairs kept
                pick_at = 2 * (row - first)
                for which in range(3):
                    pick_out[pick_at + stride * which] = 0
                    pick_out[pick_at + stride * which + 1] = SPAN_ABSENT
                k = 0
                while k < row_pairs:
                    name_length = span[4 * k + 1]
                    which = -1
                    if name_length == 4 and memcmp(data + span[4 * k], b"TAGS", 4) == 0:
                        which = 0
                    elif name_length == 4 and memcmp(data + span[4 * k], b"KEYS", 4) == 0:
                        which = 1
                    elif name_length == 8 and memcmp(data + span[4 * k], b"UNIQ_KEY", 8) == 0:
                        which = 2
                    if which >= 0:
                        pick_out[pick_at + stride * which] = span[4 * k + 2]
                        pick_out[pick_at + stride * which + 1] = span[4 * k + 3]
                    k += 1
            pairs += row_pairs
            row += 1
            offset_out[row - first] = <int32_t>pairs
    if bad:
        raise ValueError(f"row {row} points outside the buffer")
    return row, pairs, key_bytes, item_bytes


cdef const char* HEX_DIGITS = b"0123456789ABCDEF"
# the two upper-case hex digits of each byte value, back to back (byte b at 2 * b)
cdef const char* HEX_PAIRS = (
    b"000102030405060708090A0B0C0D0E0F101112131415161718191A1B1C1D1E1F"
    b"202122232425262728292A2B2C2D2E2F303132333435363738393A3B3C3D3E3F"
    b"404142434445464748494A4B4C4D4E4F505152535455565758595A5B5C5D5E5F"
    b"606162636465666768696A6B6C6D6E6F707172737475767778797A7B7C7D7E7F"
    b"808182838485868788898A8B8C8D8E8F909192939495969798999A9B9C9D9E9F"
    b"A0A1A2A3A4A5A6A7A8A9AAABACADAEAFB0B1B2B3B4B5B6B7B8B9BABBBCBDBEBF"
    b"C0C1C2C3C4C5C6C7C8C9CACBCCCDCECFD0D1D2D3D4D5D6D7D8D9DADBDCDDDEDF"
    b"E0E1E2E3E4E5E6E7E8E9EAEBECEDEEEFF0F1F2F3F4F5F6F7F8F9FAFBFCFDFEFF"
)


def message_ids(buf, rows, int64_t first, int64_t count, data, offsets):
    """See ``rmqstore/kernel/layout.py``."""
    cdef const uint8_t[::1] view = buf
    cdef int64_t[::1] row_view = rows
    cdef uint8_t[::1] data_view = data
    cdef int32_t[::1] offset_view = offsets
    cdef int64_t length = view.shape[0], capacity = data_view.shape[0], written = 0
    cdef int64_t row, at, start, host_at, host_length, k
    cdef uint64_t offset
    cdef const uint8_t* source
    cdef uint8_t* out
    cdef int failure = 0
    if not (0 <= first <= count <= row_view.shape[0] // ROW_WIDTH_NATIVE) \
            or offset_view.shape[0] < count - first + 1:
        raise ValueError("rows are outside their buffers")
    source = &view[0] if length else NULL
    offset_view[0] = 0
    row = first
    with nogil:
        while row < count:
            at = row * ROW_WIDTH_NATIVE
            start = row_view[at + C_POSITION]
            host_at = _host_field(start, row_view[at + C_SYS_FLAG], FIELD_STORE_HOST,
                                  &host_length)
            if not (_fits(start, row_view[at + C_TOTAL_SIZE], length)
                    and _fits(host_at, host_length, length)):
                failure = 1
                break
            if 2 * (host_length + 8) > capacity - written:
                failure = 2
                break
            # both checked above: the host lies in the buffer, and the id fits in the room
            # left at ``written``; each byte becomes its two digits from the pair table
            out = &data_view[written]
            for k in range(host_length):
                memcpy(out + 2 * k, HEX_PAIRS + 2 * source[host_at + k], 2)
            out += 2 * host_length
            offset = <uint64_t>row_view[at + C_PHYSICAL_OFFSET]
            for k in range(8):
                memcpy(out + 2 * k, HEX_PAIRS + 2 * ((offset >> (56 - 8 * k)) & 0xFF), 2)
            written += 2 * (host_length + 8)
            row += 1
            offset_view[row - first] = <int32_t>written
    if failure == 1:
        raise ValueError(f"row {row} points outside the buffer")
    if failure == 2:
        raise ValueError("the message ids do not fit")
    return written


def row_columns(rows, int64_t first, int64_t count, columns, out):
    """See ``rmqstore/kernel/layout.py``."""
    cdef const int64_t[::1] row_view = rows
    cdef const int64_t[::1] spec_view = columns
    cdef uint8_t[::1] out_view = out
    cdef int64_t wanted = spec_view.shape[0] // 3, size = out_view.shape[0], done = count - first
    cdef int64_t k, row = 0, value = 0, column, width, at
    cdef int32_t narrow
    cdef const int64_t* source
    cdef const int64_t* spec
    cdef uint8_t* target
    cdef bint failed = False
    if spec_view.shape[0] % 3 or not (0 <= first <= count
                                      and count <= row_view.shape[0] // ROW_WIDTH_NATIVE):
        raise ValueError("rows are outside their buffers")
    for k in range(wanted):
        column, width, at = spec_view[3 * k], spec_view[3 * k + 1], spec_view[3 * k + 2]
        if width != 4 and width != 8:
            raise ValueError(f"width {width} is not 4 or 8")
        if not 0 <= column < ROW_WIDTH_NATIVE or at < 0 or at % width or width * done > size - at:
            raise ValueError("rows are outside their buffers")
    if done == 0 or wanted == 0:
        return
    # all checked above: the rows hold rows [first, count), and each column's values fit in
    # ``out`` from its offset (so ``out`` is not empty)
    source = &row_view[first * ROW_WIDTH_NATIVE]
    spec = &spec_view[0]
    target = &out_view[0]
    with nogil:
        while row < done and not failed:  # row by row: each row read once for every column
            for k in range(wanted):
                value = source[row * ROW_WIDTH_NATIVE + spec[3 * k]]
                if spec[3 * k + 1] == 8:
                    memcpy(target + spec[3 * k + 2] + 8 * row, &value, 8)
                else:
                    narrow = <int32_t>value
                    if narrow != value:
                        failed = True
                        break
                    memcpy(target + spec[3 * k + 2] + 4 * row, &narrow, 4)
            if not failed:
                row += 1
    if failed:
        raise ValueError(f"row {first + row}: {value} does not fit in 32 bits")


def host_keys(buf, rows, int64_t first, int64_t count, int field, keys):
    """See ``rmqstore/kernel/layout.py``."""
    cdef const uint8_t[::1] view = buf
    cdef const int64_t[::1] row_view = rows
    cdef int64_t[::1] key_view = keys
    cdef int64_t length = view.shape[0], row, at, start, host_at, host_length
    cdef uint64_t key
    cdef int k
    cdef bint bad = False
    cdef const uint8_t* data
    if field != FIELD_BORN_HOST and field != FIELD_STORE_HOST:
        raise ValueError(f"field {field} is not a host field")
    if not (0 <= first <= count <= row_view.shape[0] // ROW_WIDTH_NATIVE) \
            or key_view.shape[0] < count - first:
        raise ValueError("rows are outside their buffers")
    data = &view[0] if length else NULL
    row = first
    with nogil:
        while row < count:
            at = row * ROW_WIDTH_NATIVE
            start = row_view[at + C_POSITION]
            host_at = _host_field(start, row_view[at + C_SYS_FLAG], field, &host_length)
            if host_length != 8:
                break  # an IPv6 host
            if not (_fits(start, row_view[at + C_TOTAL_SIZE], length) and _fits(host_at, 8, length)):
                bad = True
                break
            key = 0
            for k in range(8):  # checked above: the field lies in the buffer
                key = (key << 8) | data[host_at + k]
            key_view[row - first] = <int64_t>key
            row += 1
    if bad:
        raise ValueError(f"row {row} points outside the buffer")
    return row


def ascii_only(data, int64_t length):
    """See ``rmqstore/kernel/layout.py``."""
    cdef const uint8_t[::1] view = memoryview(data).cast("B")  # bytes of any item format
    cdef bint plain
    if not 0 <= length <= view.shape[0]:
        raise ValueError("length is outside the buffer")
    if length == 0:
        return True
    with nogil:
        plain = _is_ascii(&view[0], length)  # checked above: the bytes lie in the buffer
    return plain


# -- packing records for append (see layout.py) ------------------------------------------------

cdef enum:
    PACK_TOPIC = 0
    PACK_QUEUE_ID = 1
    PACK_FLAG = 2
    PACK_SYS_FLAG = 3
    PACK_BORN_TIMESTAMP = 4
    PACK_HOST = 5
    PACK_RECONSUME_TIMES = 6
    PACK_PREPARED_OFFSET = 7
    PACK_NOW = 8
    PACK_UNIQ_KEY = 9
    PACK_WIDTH = 10
    KEY_COUNTER = 0
    KEY_MONTH_START = 1
    KEY_NEXT_MONTH = 2
    KEY_LAST_STAMP = 3
    KEY_TRAILING_SEPARATOR = 4
    KEY_QUEUE_SPAN = 5
    KEY_STATE_WIDTH = 6
    RESULT_WIDTH = 4
    PACKED_ALL = 0
    NEEDS_ROLL = 1
    NEEDS_RESERVE = 2
    NEW_MONTH = 3

_check_columns((
    ("PACK_TOPIC", PACK_TOPIC), ("KEY_QUEUE_SPAN", KEY_QUEUE_SPAN), ("PACK_QUEUE_ID",
    PACK_QUEUE_ID), ("PACK_FLAG", PACK_FLAG), ("PACK_SYS_FLAG", PACK_SYS_FLAG),
    ("PACK_BORN_TIMESTAMP", PACK_BORN_TIMESTAMP), ("PACK_HOST", PACK_HOST),
    ("PACK_RECONSUME_TIMES", PACK_RECONSUME_TIMES), ("PACK_PREPARED_OFFSET",
    PACK_PREPARED_OFFSET), ("PACK_NOW", PACK_NOW), ("PACK_UNIQ_KEY", PACK_UNIQ_KEY),
    ("PACK_WIDTH", PACK_WIDTH), ("KEY_COUNTER", KEY_COUNTER), ("KEY_MONTH_START",
    KEY_MONTH_START), ("KEY_NEXT_MONTH", KEY_NEXT_MONTH), ("KEY_LAST_STAMP", KEY_LAST_STAMP),
    ("KEY_TRAILING_SEPARATOR", KEY_TRAILING_SEPARATOR), ("KEY_STATE_WIDTH", KEY_STATE_WIDTH),
    ("RESULT_WIDTH", RESULT_WIDTH), ("PACKED_ALL", PACKED_ALL), ("NEEDS_ROLL", NEEDS_ROLL),
    ("NEEDS_RESERVE", NEEDS_RESERVE), ("NEW_MONTH", NEW_MONTH), ("TOPIC_ROW_AT", 0),
    ("TOPIC_ROW_LENGTH", 1), ("TOPIC_ROW_MAGIC", 2), ("TOPIC_ROW_WIDTH", 3), ("HOST_ROW_AT", 0),
    ("HOST_ROW_LENGTH", 1), ("HOST_ROW_WIDTH", 2), ("RESULT_PHYSICAL_OFFSET", 0),
    ("RESULT_QUEUE_OFFSET", 1), ("RESULT_SIZE", 2), ("RESULT_STORE_TIMESTAMP", 3),
))


cdef uint64_t MASK32 = 0xFFFFFFFFU


cdef inline void _put_be(uint8_t* at, uint64_t value, int size) noexcept nogil:
    cdef int i
    for i in range(size):
        at[size - 1 - i] = (value >> (8 * i)) & 0xFF


cdef inline bint _is_int32(int64_t value) noexcept nogil:
    return -2147483648 <= value <= 2147483647


cdef inline void _put_hex(uint8_t* at, uint64_t value, int digits) noexcept nogil:
    cdef int i
    for i in range(digits):
        at[digits - 1 - i] = HEX_DIGITS[(value >> (4 * i)) & 0xF]


def pack_records(buf, int64_t position, int64_t file_size, int64_t reserved, int64_t base_offset,
                 messages, int64_t first, int64_t count, bodies, body_spans, props, prop_spans,
                 topics, topic_table, hosts, host_table, store_host, slots, key_prefix,
                 key_state, out):
    """See ``rmqstore/kernel/layout.py``."""
    cdef uint8_t[::1] view = buf
    cdef const int64_t[::1] msg = messages
    cdef const uint8_t[::1] body_data = bodies
    cdef const int64_t[::1] body_span = body_spans
    cdef const uint8_t[::1] prop_data = props
    cdef const int64_t[::1] prop_span = prop_spans
    cdef const uint8_t[::1] topic_data = topics
    cdef const int64_t[::1] topic_rows = topic_table
    cdef const uint8_t[::1] host_data = hosts
    cdef const int64_t[::1] host_rows = host_table
    cdef const uint8_t[::1] store_field = store_host
    cdef int64_t[::1] slot_view = slots
    cdef const uint8_t[::1] prefix = key_prefix
    cdef int64_t[::1] state = key_state
    cdef int64_t[::1] result = out
    cdef int64_t length = view.shape[0], message, at, topic_row, host_row, topic_at, topic_length
    cdef int64_t host_at, host_length, body_at, body_length, props_at, props_length, now, slot
    cdef int64_t prefix_length = prefix.shape[0], extra, total, header_size, queue_offset, stamp
    cdef int64_t store_length = store_field.shape[0], cursor, counter, stop = PACKED_ALL, value = 0
    cdef int64_t final_props, queue_id, sys_flag
    cdef uint32_t crc
    cdef bint uniq, trailing
    cdef uint8_t* data
    cdef int failure = 0
    if not (0 <= first <= count <= msg.shape[0] // PACK_WIDTH
            and result.shape[0] >= count * RESULT_WIDTH
            and body_span.shape[0] >= 2 * count and prop_span.shape[0] >= 2 * count
            and state.shape[0] >= KEY_STATE_WIDTH
            and 0 <= position <= file_size <= length and length > 0
            and (store_length == 8 or store_length == 20)):
        raise ValueError("records to pack are outside their buffers")
    data = &view[0]
    trailing = state[KEY_TRAILING_SEPARATOR] == 1
    message = first
    with nogil:
        while message < count:
            at = message * PACK_WIDTH
            topic_row = msg[at + PACK_TOPIC] * 3
            host_row = msg[at + PACK_HOST] * 2
            if not (_fits(topic_row, 3, topic_rows.shape[0])
                    and _fits(host_row, 2, host_rows.shape[0])):
                failure = 1
                break
            topic_at = topic_rows[topic_row]
            topic_length = topic_rows[topic_row + 1]
            host_at = host_rows[host_row]
            host_length = host_rows[host_row + 1]
            body_at = body_span[2 * message]
            body_length = body_span[2 * message + 1]
            props_at = prop_span[2 * message]
            props_length = prop_span[2 * message + 1]
            if not (_fits(topic_at, topic_length, topic_data.shape[0])
                    and _fits(host_at, host_length, host_data.shape[0])
                    and (host_length == 8 or host_length == 20)
                    and _fits(body_at, body_length, body_data.shape[0])
                    and _fits(props_at, props_length, prop_data.shape[0])):
                failure = 2
                break
            now = msg[at + PACK_NOW]
            uniq = msg[at + PACK_UNIQ_KEY] != 0
            extra = 0
            if uniq:
                if not (state[KEY_MONTH_START] <= now < state[KEY_NEXT_MONTH]):
                    stop, value = NEW_MONTH, now
                    break
                # UNIQ_KEY 0x01 key, and a separator before (4.9.x) or after (5.x) it
                extra = 9 + prefix_length + 12 + (1 if trailing or props_length else 0)
            final_props = props_length + extra
            if final_props > 32767:
                failure = 3
                break
            header_size = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + host_length + 8 + store_length + 4 + 8 + 4
            total = header_size + body_length + topic_length + 2 + final_props
            if position + total + 8 > file_size:
                stop, value = NEEDS_ROLL, total
                break
            if position + total > reserved:
                stop, value = NEEDS_RESERVE, position + total
                break
            if not _fits(position, total, length):
                failure = 4
                break
            queue_id = msg[at + PACK_QUEUE_ID]
            sys_flag = (msg[at + PACK_SYS_FLAG] & ~0x30) | (0x10 if host_length == 20 else 0)
            sys_flag |= 0x20 if store_length == 20 else 0
            if not (_is_int32(queue_id) and _is_int32(msg[at + PACK_FLAG]) and _is_int32(sys_flag)
                    and _is_int32(msg[at + PACK_RECONSUME_TIMES])
                    and _is_int32(topic_rows[topic_row + 2])):
                failure = 7
                break
            if (sys_flag & 0xC) == 0x4 or (sys_flag & 0xC) == 0xC:
                queue_offset = 0  # PREPARED, ROLLBACK: no consume-queue unit
            else:
                slot = msg[at + PACK_TOPIC] * state[KEY_QUEUE_SPAN] + queue_id
                if not (0 <= queue_id < state[KEY_QUEUE_SPAN]
                        and 0 <= slot < slot_view.shape[0]):
                    failure = 5
                    break
                queue_offset = slot_view[slot]
                slot_view[slot] = queue_offset + 1
            if now > state[KEY_LAST_STAMP]:
                state[KEY_LAST_STAMP] = now
            stamp = state[KEY_LAST_STAMP]
            cursor = position
            _put_be(data + cursor, <uint64_t>total, 4)
            _put_be(data + cursor + 4, <uint64_t><uint32_t><int32_t>topic_rows[topic_row + 2], 4)
            crc = _crc32(0, &body_data[body_at], body_length) if body_length else 0
            _put_be(data + cursor + 8, <uint64_t>(crc & 0x7FFFFFFF), 4)
            _put_be(data + cursor + 12, <uint64_t><uint32_t><int32_t>queue_id, 4)
            _put_be(data + cursor + 16, <uint64_t><uint32_t><int32_t>msg[at + PACK_FLAG], 4)
            _put_be(data + cursor + 20, <uint64_t>queue_offset, 8)
            _put_be(data + cursor + 28, <uint64_t>(base_offset + position), 8)
            _put_be(data + cursor + 36, <uint64_t><uint32_t><int32_t>sys_flag, 4)
            _put_be(data + cursor + 40, <uint64_t>msg[at + PACK_BORN_TIMESTAMP], 8)
            cursor += 48
            memcpy(data + cursor, &host_data[host_at], host_length)
            cursor += host_length
            _put_be(data + cursor, <uint64_t>stamp, 8)
            cursor += 8
            memcpy(data + cursor, &store_field[0], store_length)
            cursor += store_length
            _put_be(data + cursor, <uint64_t><uint32_t><int32_t>msg[at + PACK_RECONSUME_TIMES], 4)
            _put_be(data + cursor + 4, <uint64_t>msg[at + PACK_PREPARED_OFFSET], 8)
            _put_be(data + cursor + 12, <uint64_t><uint32_t>body_length, 4)
            cursor += 16
            if body_length:
                memcpy(data + cursor, &body_data[body_at], body_length)
            cursor += body_length
            memcpy(data + cursor, &topic_data[topic_at], topic_length)
            cursor += topic_length
            _put_be(data + cursor, <uint64_t>final_props, 2)
            cursor += 2
            if props_length:
                memcpy(data + cursor, &prop_data[props_at], props_length)
            cursor += props_length
            if uniq:
                if not trailing and props_length:
                    data[cursor] = 2
                    cursor += 1
                memcpy(data + cursor, b"UNIQ_KEY\x01", 9)
                cursor += 9
                if prefix_length:
                    memcpy(data + cursor, &prefix[0], prefix_length)
                cursor += prefix_length
                counter = state[KEY_COUNTER]
                _put_hex(data + cursor, (<uint64_t>(now - state[KEY_MONTH_START])) & MASK32, 8)
                _put_hex(data + cursor + 8, <uint64_t>counter, 4)
                cursor += 12
                if trailing:
                    data[cursor] = 2
                    cursor += 1
                state[KEY_COUNTER] = (counter + 1) & 0xFFFF
            if cursor != position + total:
                failure = 6
                break
            result[message * RESULT_WIDTH] = base_offset + position
            result[message * RESULT_WIDTH + 1] = queue_offset
            result[message * RESULT_WIDTH + 2] = total
            result[message * RESULT_WIDTH + 3] = stamp
            position += total
            message += 1
    if failure:
        raise ValueError(f"message {message} cannot be packed (check {failure})")
    return message, position, stop, value


# -- JSON-line documents into batch columns (see layout.py) ---------------------------------

from cpython.array cimport array as carray, extend_buffer
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_GetItem
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.object cimport PyObject
from cpython.unicode cimport PyUnicode_AsUTF8AndSize

cdef enum:
    DOC_DONE_C = 0
    DOC_OTHER_C = 1
    DOC_NEEDS_PROPERTIES_C = 2
    DOC_DEFAULTS_WIDTH_C = 10
    DOC_STATE_WIDTH_C = 3
    PACK_WIDTH_C = 10
    LINES_JSONL_C = 0
    LINES_PLAIN_C = 1

_check_columns((
    ("DOC_DONE", DOC_DONE_C), ("DOC_OTHER", DOC_OTHER_C), ("DOC_NEEDS_PROPERTIES",
    DOC_NEEDS_PROPERTIES_C), ("DOC_DEFAULTS_WIDTH", DOC_DEFAULTS_WIDTH_C), ("DOC_STATE_WIDTH",
    DOC_STATE_WIDTH_C), ("PACK_WIDTH", PACK_WIDTH_C), ("DOC_DEFAULT_TOPIC", 0),
    ("DOC_DEFAULT_QUEUE_ID", 1), ("DOC_DEFAULT_TAGS", 2), ("DOC_DEFAULT_KEYS", 3),
    ("DOC_FLAG", 4), ("DOC_SYS_FLAG", 5), ("DOC_BORN_TIMESTAMP", 6), ("DOC_HOST", 7),
    ("DOC_RECONSUME_TIMES", 8), ("DOC_PREPARED_OFFSET", 9), ("DOC_STATE_LONGEST_BODY", 0),
    ("DOC_STATE_LONGEST_PROPS", 1), ("DOC_STATE_QUEUE_SPAN", 2), ("PACK_TOPIC", 0),
    ("PACK_QUEUE_ID", 1), ("PACK_FLAG", 2), ("PACK_SYS_FLAG", 3), ("PACK_BORN_TIMESTAMP", 4),
    ("PACK_HOST", 5), ("PACK_RECONSUME_TIMES", 6), ("PACK_PREPARED_OFFSET", 7),
    ("PACK_NOW", 8), ("PACK_UNIQ_KEY", 9), ("LINES_JSONL", LINES_JSONL_C),
    ("LINES_PLAIN", LINES_PLAIN_C),
))

cdef str _TOPIC = "topic"
cdef str _BODY = "body"
cdef str _TAGS = "tags"
cdef str _KEYS = "keys"
cdef str _QUEUE_ID = "queueId"
cdef int64_t INT32_MAX_C = 2147483647


cdef inline object _field(dict document, str name, object missing, int* present):
    """``document[name]``, or ``missing``; counts the fields found."""
    cdef PyObject* value = PyDict_GetItem(document, name)
    if value == NULL:
        return missing
    present[0] += 1
    return <object>value


cdef int _append_bytes(bytearray target, const char* data, Py_ssize_t length) except -1:
    """``target += data[:length]``: the bytearray grows first, then exactly that many bytes
    are copied into the new room."""
    cdef Py_ssize_t old = PyByteArray_GET_SIZE(target)
    if length < 0:
        raise KernelBoundsError("a negative length to append")
    PyByteArray_Resize(target, old + length)
    if PyByteArray_GET_SIZE(target) != old + length:
        raise KernelBoundsError("a bytearray did not grow as asked")
    if length:
        memcpy(PyByteArray_AS_STRING(target) + old, data, length)
    return 0


def document_rows(list documents, Py_ssize_t first, Py_ssize_t count, tuple defaults,
                  dict topics, dict properties, carray rows, carray body_spans,
                  bytearray bodies, carray prop_spans, bytearray props, state):
    """See ``rmqstore/kernel/layout.py``."""
    cdef int64_t[::1] state_view = state
    cdef int64_t row[PACK_WIDTH_C]
    cdef int64_t spans[2]
    cdef int present, overflow
    cdef long long queue_id
    cdef Py_ssize_t index, body_length, props_at = 0, props_length
    cdef const char* body_data
    cdef object document, topic, body, tags, keys, queue_value, key, encoded, topic_row
    cdef object encoded_props, last_encoded = None
    if not (0 <= first <= count <= len(documents)):
        raise ValueError("documents are outside their list")
    if len(defaults) != DOC_DEFAULTS_WIDTH_C or state_view.shape[0] < DOC_STATE_WIDTH_C:
        raise ValueError("defaults or state of the wrong width")
    if rows.typecode != "q" or body_spans.typecode != "q" or prop_spans.typecode != "q":
        raise ValueError("rows and spans are arrays of 64-bit integers ('q')")
    default_topic, default_queue_id, default_tags, default_keys = defaults[:4]
    row[2] = defaults[4]
    row[3] = defaults[5]
    row[4] = defaults[6]
    row[5] = defaults[7]
    row[6] = defaults[8]
    row[7] = defaults[9]
    row[8] = 0  # PACK_NOW: the appender's
    for index in range(first, count):
        document = documents[index]
        if type(document) is not dict:
            return index, DOC_OTHER_C, None
        present = 0
        topic = _field(<dict>document, _TOPIC, default_topic, &present)
        body = _field(<dict>document, _BODY, "", &present)
        tags = _field(<dict>document, _TAGS, None, &present)
        keys = _field(<dict>document, _KEYS, None, &present)
        queue_value = _field(<dict>document, _QUEUE_ID, default_queue_id, &present)
        if present != len(<dict>document):  # a field of another shape
            return index, DOC_OTHER_C, None
        if (type(topic) is not str or len(<str>topic) == 0 or type(body) is not str
                or (tags is not None and type(tags) is not str)
                or (keys is not None and type(keys) is not str)
                or type(queue_value) is not int):
            return index, DOC_OTHER_C, None
        overflow = 0
        queue_id = PyLong_AsLongLongAndOverflow(queue_value, &overflow)
        if overflow or queue_id < 0 or queue_id > INT32_MAX_C:
            return index, DOC_OTHER_C, None
        key = (default_tags if tags is None else tags, default_keys if keys is None else keys)
        encoded = properties.get(key)
        if encoded is None:
            return index, DOC_NEEDS_PROPERTIES_C, key
        try:
            body_data = PyUnicode_AsUTF8AndSize(body, &body_length)
        except UnicodeEncodeError:  # a lone surrogate: the general way names it
            return index, DOC_OTHER_C, None
        topic_row = topics.get(topic)
        if topic_row is None:
            topic_row = len(topics)
            topics[topic] = topic_row
        encoded_props, needs_key = encoded
        if type(encoded_props) is not bytes:
            raise TypeError("an encoded property string is bytes")
        spans[0] = PyByteArray_GET_SIZE(bodies)
        spans[1] = body_length
        extend_buffer(body_spans, <char*>spans, 2)
        _append_bytes(bodies, body_data, body_length)
        props_length = PyBytes_GET_SIZE(encoded_props)
        if encoded_props is not last_encoded:
            props_at = PyByteArray_GET_SIZE(props)
            _append_bytes(props, PyBytes_AS_STRING(encoded_props), props_length)
            last_encoded = encoded_props
        spans[0] = props_at
        spans[1] = props_length
        extend_buffer(prop_spans, <char*>spans, 2)
        if body_length > state_view[0]:
            state_view[0] = body_length
        if props_length > state_view[1]:
            state_view[1] = props_length
        if queue_id + 1 > state_view[2]:
            state_view[2] = queue_id + 1
        row[0] = topic_row
        row[1] = queue_id
        row[9] = 1 if needs_key else 0
        extend_buffer(rows, <char*>row, PACK_WIDTH_C)
    return count, DOC_DONE_C, None


# -- what append reports, as text lines (see layout.py) -------------------------------------

cdef struct Writer:
    uint8_t* data
    int64_t capacity
    int64_t cursor
    bint breached


cdef inline void _put_bytes(Writer* writer, const uint8_t* data, int64_t length) noexcept nogil:
    if length < 0 or writer.cursor + length > writer.capacity:
        writer.breached = True
        return
    if length:
        memcpy(writer.data + writer.cursor, data, length)
    writer.cursor += length


cdef inline void _put_text(Writer* writer, const char* text) noexcept nogil:
    cdef int64_t length = 0
    while text[length] != 0:
        length += 1
    _put_bytes(writer, <const uint8_t*>text, length)


cdef inline void _put_decimal(Writer* writer, int64_t value) noexcept nogil:
    cdef uint8_t digits[24]
    cdef int64_t at = 24
    cdef uint64_t magnitude = (<uint64_t>0 - <uint64_t>value) if value < 0 else <uint64_t>value
    while True:
        at -= 1
        digits[at] = <uint8_t>(48 + magnitude % 10)
        magnitude //= 10
        if magnitude == 0:
            break
    if value < 0:
        at -= 1
        digits[at] = 45  # '-'
    _put_bytes(writer, &digits[at], 24 - at)


cdef inline void _put_hex_bytes(Writer* writer, const uint8_t* data, int64_t length) noexcept nogil:
    cdef int64_t k
    if length < 0 or writer.cursor + 2 * length > writer.capacity:
        writer.breached = True
        return
    for k in range(length):
        writer.data[writer.cursor] = HEX_DIGITS[data[k] >> 4]
        writer.data[writer.cursor + 1] = HEX_DIGITS[data[k] & 0xF]
        writer.cursor += 2


cdef inline bint _printable(const uint8_t* data, int64_t length, bint json) noexcept nogil:
    """Bytes a line may carry as they are: printable ASCII (for JSON, no quote or backslash)."""
    cdef int64_t k
    for k in range(length):
        if data[k] < 0x20 or data[k] > 0x7E or (json and (data[k] == 34 or data[k] == 92)):
            return False
    return True


cdef struct RecordSpans:
    int64_t start
    int64_t sys_flag
    int64_t born_at
    int64_t store_at
    int64_t store_length
    TextSpans text


cdef inline bint _record_spans(const int64_t[::1] row_view, int64_t at, int64_t length,
                               RecordSpans* spans) noexcept nogil:
    """Where the record of the row at ``at`` and its store host, topic and properties lie;
    False when one of them is outside the buffer (a row the scan did not make)."""
    spans.start = row_view[at + C_POSITION]
    spans.sys_flag = row_view[at + C_SYS_FLAG]
    spans.born_at = spans.start + BORN_HOST_AT
    spans.store_at = _host_field(spans.start, spans.sys_flag, FIELD_STORE_HOST,
                                 &spans.store_length)
    return (_text_spans(row_view, at, length, &spans.text)
            and _fits(spans.start, row_view[at + C_TOTAL_SIZE], length)
            and _fits(spans.store_at, spans.store_length, length))


cdef int _start_line(bytearray out, Writer* writer, int64_t need) except -1:
    """Makes room for a line of at most ``need`` bytes at the end of ``out``."""
    writer.cursor = PyByteArray_GET_SIZE(out)
    PyByteArray_Resize(out, writer.cursor + need)
    writer.data = <uint8_t*>PyByteArray_AS_STRING(out)
    writer.capacity = PyByteArray_GET_SIZE(out)
    writer.breached = False
    return 0


cdef int _end_line(bytearray out, Writer* writer, int64_t old_size) except -1:
    """Gives back the room the line did not use; a line that outgrew it (a bug) takes every
    line of the call back out of ``out`` and raises."""
    PyByteArray_Resize(out, writer.cursor)
    if writer.breached:
        PyByteArray_Resize(out, old_size)
        raise KernelBoundsError("a line outgrew the room made for it")
    return 0


cdef void _put_msg_id(Writer* writer, const uint8_t* store_host, int64_t host_length,
                      int64_t physical_offset) noexcept nogil:
    """The offset message id: the store host field and the physical offset, in upper hex."""
    cdef uint8_t offset_bytes[8]
    cdef int k
    for k in range(8):
        offset_bytes[k] = (<uint64_t>physical_offset >> (8 * (7 - k))) & 0xFF
    _put_hex_bytes(writer, store_host, host_length)
    _put_hex_bytes(writer, offset_bytes, 8)


def result_lines(buf, rows, int64_t first, int64_t count, int style, bytearray out not None):
    """See ``rmqstore/kernel/layout.py``."""
    cdef const uint8_t[::1] view = buf
    cdef const int64_t[::1] row_view = rows
    cdef int64_t length = view.shape[0], row, at, store_at, store_length
    cdef int64_t topic_at, topic_length, key_at, key_length, need, old_size
    cdef const uint8_t* data
    cdef bint json = style == LINES_JSONL_C, bad = False
    cdef Writer writer
    cdef RecordSpans spans
    if not (0 <= first <= count <= row_view.shape[0] // ROW_WIDTH_NATIVE):
        raise ValueError("rows are outside their buffers")
    if style != LINES_JSONL_C and style != LINES_PLAIN_C:
        raise ValueError(f"no line style {style}")
    data = &view[0] if length else NULL
    old_size = PyByteArray_GET_SIZE(out)
    row = first
    while row < count:
        at = row * ROW_WIDTH_NATIVE
        if not _record_spans(row_view, at, length, &spans):
            bad = True
            break
        store_at, store_length = spans.store_at, spans.store_length
        topic_at, topic_length = spans.text.topic_at, spans.text.topic_length
        _find_value(data, spans.text.props_at, spans.text.props_length, b"UNIQ_KEY", 8, &key_at,
                    &key_length)
        if not _printable(data + topic_at, topic_length, json) or (
                key_length != SPAN_ABSENT and not _printable(data + key_at, key_length, json)):
            break  # the reference writes this line
        need = 2 * (store_length + 8) + topic_length + (key_length if key_length > 0 else 0)
        need += 6 * 21 + 160  # six numbers and the line's own text
        _start_line(out, &writer, need)
        if json:
            _put_text(&writer, b'{"msgId":"')
            _put_msg_id(&writer, data + store_at, store_length, row_view[at + C_PHYSICAL_OFFSET])
            _put_text(&writer, b'","topic":"')
            _put_bytes(&writer, data + topic_at, topic_length)
            _put_text(&writer, b'","queueId":')
            _put_decimal(&writer, row_view[at + C_QUEUE_ID])
            _put_text(&writer, b',"commitLogOffset":')
            _put_decimal(&writer, row_view[at + C_PHYSICAL_OFFSET])
            _put_text(&writer, b',"queueOffset":')
            _put_decimal(&writer, row_view[at + C_QUEUE_OFFSET])
            _put_text(&writer, b',"storeSize":')
            _put_decimal(&writer, row_view[at + C_TOTAL_SIZE])
            _put_text(&writer, b',"storeTimestamp":')
            _put_decimal(&writer, row_view[at + C_STORE_TIMESTAMP])
            if key_length == SPAN_ABSENT:
                _put_text(&writer, b',"uniqKey":null}\n')
            else:
                _put_text(&writer, b',"uniqKey":"')
                _put_bytes(&writer, data + key_at, key_length)
                _put_text(&writer, b'"}\n')
        else:
            _put_msg_id(&writer, data + store_at, store_length, row_view[at + C_PHYSICAL_OFFSET])
            _put_text(&writer, b"  offset=")
            _put_decimal(&writer, row_view[at + C_PHYSICAL_OFFSET])
            _put_text(&writer, b"  queue=")
            _put_bytes(&writer, data + topic_at, topic_length)
            _put_text(&writer, b":")
            _put_decimal(&writer, row_view[at + C_QUEUE_ID])
            _put_text(&writer, b"  queueOffset=")
            _put_decimal(&writer, row_view[at + C_QUEUE_OFFSET])
            _put_text(&writer, b"  size=")
            _put_decimal(&writer, row_view[at + C_TOTAL_SIZE])
            if key_length != SPAN_ABSENT:
                _put_text(&writer, b"  uniqKey=")
                _put_bytes(&writer, data + key_at, key_length)
            _put_text(&writer, b"\n")
        _end_line(out, &writer, old_size)
        row += 1
    if bad:
        raise ValueError(f"row {row} points outside the buffer")
    return row


# -- what read prints of a message, as JSON lines (see layout.py) ---------------------------

cdef enum:
    BODY_NONE_C = 0
    BODY_AUTO_C = 1
    BODY_TEXT_C = 2
    BODY_HEX_C = 3
    BODY_BASE64_C = 4
    MOST_PAIRS = 256  # properties with more pairs are left to the reference

_check_columns((
    ("BODY_NONE", BODY_NONE_C), ("BODY_AUTO", BODY_AUTO_C), ("BODY_TEXT", BODY_TEXT_C),
    ("BODY_HEX", BODY_HEX_C), ("BODY_BASE64", BODY_BASE64_C),
))

cdef const char* BASE64_DIGITS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
cdef const char* LOWER_HEX = b"0123456789abcdef"


cdef inline void _put_byte(Writer* writer, uint8_t byte) noexcept nogil:
    if writer.cursor + 1 > writer.capacity:
        writer.breached = True
        return
    writer.data[writer.cursor] = byte
    writer.cursor += 1


cdef void _put_json_text(Writer* writer, const uint8_t* data, int64_t length,
                         bint doubled) noexcept nogil:
    """Valid UTF-8 as the inside of a JSON string, as json.dumps(ensure_ascii=False) writes
    it: quote and backslash escaped, control characters as \\n \\r \\t \\b \\f or \\u00XX;
    ``doubled``: each quote twice (the JSON text inside a quoted CSV cell)."""
    cdef int64_t k
    cdef uint8_t byte
    for k in range(length):
        byte = data[k]
        if byte == 34 or byte == 92:
            _put_byte(writer, 92)
            _put_byte(writer, byte)
            if doubled and byte == 34:
                _put_byte(writer, 34)
        elif byte >= 0x20:
            _put_byte(writer, byte)
        elif byte == 10:
            _put_text(writer, b"\\n")
        elif byte == 13:
            _put_text(writer, b"\\r")
        elif byte == 9:
            _put_text(writer, b"\\t")
        elif byte == 8:
            _put_text(writer, b"\\b")
        elif byte == 12:
            _put_text(writer, b"\\f")
        else:
            _put_text(writer, b"\\u00")
            _put_byte(writer, LOWER_HEX[byte >> 4])
            _put_byte(writer, LOWER_HEX[byte & 0xF])


cdef void _put_base64(Writer* writer, const uint8_t* data, int64_t length) noexcept nogil:
    """``data`` in standard base64 with padding: its room checked once, then written four
    characters at a time (a check per character took most of an export's join)."""
    cdef int64_t need, k = 0
    cdef uint8_t* at
    cdef uint32_t triple
    if length < 0 or length > writer.capacity - writer.cursor:  # never less than it needs
        writer.breached = True
        return
    need = (length + 2) // 3 * 4
    if need > writer.capacity - writer.cursor:
        writer.breached = True
        return
    at = writer.data + writer.cursor
    while k + 3 <= length:
        triple = (<uint32_t>data[k] << 16) | (<uint32_t>data[k + 1] << 8) | data[k + 2]
        at[0] = BASE64_DIGITS[(triple >> 18) & 63]
        at[1] = BASE64_DIGITS[(triple >> 12) & 63]
        at[2] = BASE64_DIGITS[(triple >> 6) & 63]
        at[3] = BASE64_DIGITS[triple & 63]
        at += 4
        k += 3
    if length - k == 1:
        triple = <uint32_t>data[k] << 16
        at[0] = BASE64_DIGITS[(triple >> 18) & 63]
        at[1] = BASE64_DIGITS[(triple >> 12) & 63]
        at[2] = 61
        at[3] = 61
    elif length - k == 2:
        triple = (<uint32_t>data[k] << 16) | (<uint32_t>data[k + 1] << 8)
        at[0] = BASE64_DIGITS[(triple >> 18) & 63]
        at[1] = BASE64_DIGITS[(triple >> 12) & 63]
        at[2] = BASE64_DIGITS[(triple >> 6) & 63]
        at[3] = 61
    writer.cursor += need


cdef void _put_ipv4_host(Writer* writer, const uint8_t* field) noexcept nogil:
    """An 8-byte host field (IPv4 address, big-endian signed port) as ``a.b.c.d:port``."""
    cdef int k
    for k in range(4):
        if k:
            _put_byte(writer, 46)
        _put_decimal(writer, field[k])
    _put_byte(writer, 58)
    _put_decimal(writer, <int32_t>((<uint32_t>field[4] << 24) | (<uint32_t>field[5] << 16)
                                   | (<uint32_t>field[6] << 8) | field[7]))


cdef inline void _put_field_name(Writer* writer, const char* name) noexcept nogil:
    """``,"name":`` (the first field has no comma: the caller writes ``{``)."""
    _put_text(writer, name)


cdef void _put_json_value(Writer* writer, const uint8_t* data, int64_t at,
                          int64_t length, bint doubled) noexcept nogil:
    """A JSON string of data[at:at+length], or null for SPAN_ABSENT (``doubled``: see
    _put_json_text)."""
    if length == SPAN_ABSENT:
        _put_text(writer, b"null")
        return
    _put_byte(writer, 34)
    if doubled:
        _put_byte(writer, 34)
    _put_json_text(writer, data + at, length, doubled)
    _put_byte(writer, 34)
    if doubled:
        _put_byte(writer, 34)


def message_lines(buf, rows, int64_t first, int64_t count, int body_mode,
                  bytearray out not None):
    """See ``rmqstore/kernel/layout.py``."""
    cdef const uint8_t[::1] view = buf
    cdef const int64_t[::1] row_view = rows
    cdef int64_t length = view.shape[0], row, at, sys_flag, born_at, store_at
    cdef int64_t topic_at, topic_length, props_at, props_length, body_at, body_length
    cdef RecordSpans spans
    cdef int64_t position, end, pair_end, separator, pairs, j, need, old_size
    cdef int64_t tags_at, tags_length, keys_at, keys_length, uniq_at, uniq_length
    cdef int64_t name_at[MOST_PAIRS]
    cdef int64_t name_length[MOST_PAIRS]
    cdef int64_t value_at[MOST_PAIRS]
    cdef int64_t value_length[MOST_PAIRS]
    cdef const uint8_t* data
    cdef bint bad = False, body_text, fallback
    cdef Writer writer
    if not (0 <= first <= count <= row_view.shape[0] // ROW_WIDTH_NATIVE):
        raise ValueError("rows are outside their buffers")
    if not BODY_NONE_C <= body_mode <= BODY_BASE64_C:
        raise ValueError(f"no body mode {body_mode}")
    data = &view[0] if length else NULL
    old_size = PyByteArray_GET_SIZE(out)
    row = first
    while row < count:
        at = row * ROW_WIDTH_NATIVE
        body_at = row_view[at + C_POSITION] + row_view[at + C_HEADER_SIZE]
        body_length = row_view[at + C_BODY_LENGTH]
        if not (_record_spans(row_view, at, length, &spans)
                and _fits(body_at, body_length, length)):
            bad = True
            break
        sys_flag, born_at, store_at = spans.sys_flag, spans.born_at, spans.store_at
        topic_at, topic_length = spans.text.topic_at, spans.text.topic_length
        props_at, props_length = spans.text.props_at, spans.text.props_length
        if sys_flag & 0x30:  # an IPv6 host: the reference writes its text
            break
        if not _utf8_valid(data + props_at, props_length):
            break
        # the pairs as decode_properties keeps them: a name and a value, both non-empty
        pairs = 0
        fallback = False
        position, end = props_at, props_at + props_length
        while position <= end:
            pair_end = _pair_end(data, position, end, &separator)
            if separator < pair_end and separator > position and pair_end - separator - 1 > 0:
                for j in range(pairs):
                    if (name_length[j] == separator - position
                            and memcmp(data + name_at[j], data + position,
                                       name_length[j]) == 0):
                        fallback = True  # a name twice: the later value in the first place
                if pairs >= MOST_PAIRS:
                    fallback = True
                if fallback:
                    break
                name_at[pairs], name_length[pairs] = position, separator - position
                value_at[pairs] = separator + 1
                value_length[pairs] = pair_end - separator - 1
                pairs += 1
            position = pair_end + 1
        if fallback:
            break
        body_text = False
        if body_mode == BODY_AUTO_C or body_mode == BODY_TEXT_C:
            body_text = _utf8_valid(data + body_at, body_length)
            if not body_text and body_mode == BODY_TEXT_C:
                break  # text-lossy: the reference writes it
        tags_at, tags_length = 0, SPAN_ABSENT
        keys_at, keys_length = 0, SPAN_ABSENT
        uniq_at, uniq_length = 0, SPAN_ABSENT
        for j in range(pairs):
            if name_length[j] == 4 and memcmp(data + name_at[j], b"TAGS", 4) == 0:
                tags_at, tags_length = value_at[j], value_length[j]
            elif name_length[j] == 4 and memcmp(data + name_at[j], b"KEYS", 4) == 0:
                keys_at, keys_length = value_at[j], value_length[j]
            elif name_length[j] == 8 and memcmp(data + name_at[j], b"UNIQ_KEY", 8) == 0:
                uniq_at, uniq_length = value_at[j], value_length[j]
        need = 800 + 6 * topic_length + 12 * props_length + 6 * body_length
        _start_line(out, &writer, need)
        _put_text(&writer, b'{"msgId":"')
        _put_msg_id(&writer, data + store_at, 8, row_view[at + C_PHYSICAL_OFFSET])
        _put_text(&writer, b'","topic":')
        _put_json_value(&writer, data, topic_at, topic_length, False)
        _put_text(&writer, b',"queueId":')
        _put_decimal(&writer, row_view[at + C_QUEUE_ID])
        _put_text(&writer, b',"queueOffset":')
        _put_decimal(&writer, row_view[at + C_QUEUE_OFFSET])
        _put_text(&writer, b',"commitLogOffset":')
        _put_decimal(&writer, row_view[at + C_PHYSICAL_OFFSET])
        _put_text(&writer, b',"storeSize":')
        _put_decimal(&writer, row_view[at + C_TOTAL_SIZE])
        _put_text(&writer, b',"bodyCRC":')
        _put_decimal(&writer, row_view[at + C_BODY_CRC])
        _put_text(&writer, b',"flag":')
        _put_decimal(&writer, row_view[at + C_FLAG])
        _put_text(&writer, b',"sysFlag":')
        _put_decimal(&writer, sys_flag)
        _put_text(&writer, b',"bornTimestamp":')
        _put_decimal(&writer, row_view[at + C_BORN_TIMESTAMP])
        _put_text(&writer, b',"bornHost":"')
        _put_ipv4_host(&writer, data + born_at)
        _put_text(&writer, b'","storeTimestamp":')
        _put_decimal(&writer, row_view[at + C_STORE_TIMESTAMP])
        _put_text(&writer, b',"storeHost":"')
        _put_ipv4_host(&writer, data + store_at)
        _put_text(&writer, b'","reconsumeTimes":')
        _put_decimal(&writer, row_view[at + C_RECONSUME_TIMES])
        _put_text(&writer, b',"preparedTransactionOffset":')
        _put_decimal(&writer, row_view[at + C_PREPARED_OFFSET])
        _put_text(&writer, b',"properties":{')
        for j in range(pairs):
            if j:
                _put_byte(&writer, 44)
            _put_json_value(&writer, data, name_at[j], name_length[j], False)
            _put_byte(&writer, 58)
            _put_json_value(&writer, data, value_at[j], value_length[j], False)
        _put_text(&writer, b'},"tags":')
        _put_json_value(&writer, data, tags_at, tags_length, False)
        _put_text(&writer, b',"keys":')
        _put_json_value(&writer, data, keys_at, keys_length, False)
        _put_text(&writer, b',"uniqKey":')
        _put_json_value(&writer, data, uniq_at, uniq_length, False)
        _put_text(&writer, b',"bodyLength":')
        _put_decimal(&writer, body_length)
        _put_text(&writer, b',"version":"V2"' if row_view[at + C_VERSION] == 2
                  else b',"version":"V1"')
        if body_mode != BODY_NONE_C:
            _put_text(&writer, b',"body":"')
            if body_text:
                _put_json_text(&writer, data + body_at, body_length, False)
                _put_text(&writer, b'","bodyEncoding":"text"')
            elif body_mode == BODY_HEX_C:
                _put_hex_bytes(&writer, data + body_at, body_length)
                _put_text(&writer, b'","bodyEncoding":"hex"')
            else:
                _put_base64(&writer, data + body_at, body_length)
                _put_text(&writer, b'","bodyEncoding":"base64"')
        _put_text(&writer, b"}\n")
        _end_line(out, &writer, old_size)
        row += 1
    if bad:
        raise ValueError(f"row {row} points outside the buffer")
    return row


# -- what read prints of a message, as CSV or TSV rows (see layout.py) --------------------------

cdef struct MessageParts:
    # what message_rows writes of a record, found once. message_lines finds the same in its
    # own loop, by the same rules: through this struct it ran 15% slower (the compiler keeps
    # its locals in registers, the struct's fields it reloads after every byte written)
    RecordSpans spans
    int64_t body_at
    int64_t body_length
    bint body_text  # the body is written as text (valid UTF-8, body mode auto or text)
    int64_t pairs
    int64_t name_at[MOST_PAIRS]
    int64_t name_length[MOST_PAIRS]
    int64_t value_at[MOST_PAIRS]
    int64_t value_length[MOST_PAIRS]
    int64_t tags_at
    int64_t tags_length
    int64_t keys_at
    int64_t keys_length
    int64_t uniq_at
    int64_t uniq_length


cdef enum:
    PARTS_OUTSIDE = -1  # the row points outside the buffer
    PARTS_REFERENCE = 0  # the reference writes this row
    PARTS_FOUND = 1


cdef inline int _message_parts(const int64_t[::1] row_view, int64_t at, const uint8_t* data,
                               int64_t length, int body_mode, MessageParts* parts) noexcept nogil:
    """The spans of the row at ``at`` that a message document is made of: its record's
    fields, its property pairs as decode_properties keeps them (a name and a value, both
    non-empty), TAGS, KEYS and UNIQ_KEY among them, and whether the body is text."""
    cdef int64_t position, end, pair_end, separator, j, pairs = 0
    parts.body_at = row_view[at + C_POSITION] + row_view[at + C_HEADER_SIZE]
    parts.body_length = row_view[at + C_BODY_LENGTH]
    if not (_record_spans(row_view, at, length, &parts.spans)
            and _fits(parts.body_at, parts.body_length, length)):
        return PARTS_OUTSIDE
    if parts.spans.sys_flag & 0x30:  # an IPv6 host: the reference writes its text
        return PARTS_REFERENCE
    if not _utf8_valid(data + parts.spans.text.props_at, parts.spans.text.props_length):
        return PARTS_REFERENCE
    position = parts.spans.text.props_at
    end = position + parts.spans.text.props_length
    while position <= end:
        pair_end = _pair_end(data, position, end, &separator)
        if separator < pair_end and separator > position and pair_end - separator - 1 > 0:
            for j in range(pairs):
                if (parts.name_length[j] == separator - position
                        and memcmp(data + parts.name_at[j], data + position,
                                   parts.name_length[j]) == 0):
                    return PARTS_REFERENCE  # a name twice: the later value in the first place
            if pairs >= MOST_PAIRS:
                return PARTS_REFERENCE
            parts.name_at[pairs], parts.name_length[pairs] = position, separator - position
            parts.value_at[pairs] = separator + 1
            parts.value_length[pairs] = pair_end - separator - 1
            pairs += 1
        position = pair_end + 1
    parts.pairs = pairs
    parts.body_text = False
    if body_mode == BODY_AUTO_C or body_mode == BODY_TEXT_C:
        parts.body_text = _utf8_valid(data + parts.body_at, parts.body_length)
        if not parts.body_text and body_mode == BODY_TEXT_C:
            return PARTS_REFERENCE  # text-lossy: the reference writes it
    parts.tags_at, parts.tags_length = 0, SPAN_ABSENT
    parts.keys_at, parts.keys_length = 0, SPAN_ABSENT
    parts.uniq_at, parts.uniq_length = 0, SPAN_ABSENT
    for j in range(pairs):
        if parts.name_length[j] == 4 and memcmp(data + parts.name_at[j], b"TAGS", 4) == 0:
            parts.tags_at, parts.tags_length = parts.value_at[j], parts.value_length[j]
        elif parts.name_length[j] == 4 and memcmp(data + parts.name_at[j], b"KEYS", 4) == 0:
            parts.keys_at, parts.keys_length = parts.value_at[j], parts.value_length[j]
        elif parts.name_length[j] == 8 and memcmp(data + parts.name_at[j], b"UNIQ_KEY", 8) == 0:
            parts.uniq_at, parts.uniq_length = parts.value_at[j], parts.value_length[j]
    return PARTS_FOUND


cdef void _put_properties_json(Writer* writer, const uint8_t* data, MessageParts* parts,
                               bint doubled) noexcept nogil:
    """The properties as a JSON object, in the order the record has them (``doubled``: see
    _put_json_text)."""
    cdef int64_t j
    _put_byte(writer, 123)
    for j in range(parts.pairs):
        if j:
            _put_byte(writer, 44)
        _put_json_value(writer, data, parts.name_at[j], parts.name_length[j], doubled)
        _put_byte(writer, 58)
        _put_json_value(writer, data, parts.value_at[j], parts.value_length[j], doubled)
    _put_byte(writer, 125)


cdef enum:  # MESSAGE_COLUMNS, by number
    COL_MSG_ID = 0
    COL_TOPIC = 1
    COL_QUEUE_ID = 2
    COL_QUEUE_OFFSET = 3
    COL_COMMIT_LOG_OFFSET = 4
    COL_STORE_SIZE = 5
    COL_BODY_CRC = 6
    COL_FLAG = 7
    COL_SYS_FLAG = 8
    COL_BORN_TIMESTAMP = 9
    COL_BORN_HOST = 10
    COL_STORE_TIMESTAMP = 11
    COL_STORE_HOST = 12
    COL_RECONSUME_TIMES = 13
    COL_PREPARED_OFFSET = 14
    COL_PROPERTIES = 15
    COL_TAGS = 16
    COL_KEYS = 17
    COL_UNIQ_KEY = 18
    COL_BODY_LENGTH = 19
    COL_VERSION = 20
    COL_BODY = 21
    COL_BODY_ENCODING = 22
    COLUMN_COUNT = 23
    MOST_COLUMNS_C = 64

_COLUMNS_BY_NUMBER = (  # the COL_* numbers above, in order
    "msgId", "topic", "queueId", "queueOffset", "commitLogOffset", "storeSize", "bodyCRC",
    "flag", "sysFlag", "bornTimestamp", "bornHost", "storeTimestamp", "storeHost",
    "reconsumeTimes", "preparedTransactionOffset", "properties", "tags", "keys", "uniqKey",
    "bodyLength", "version", "body", "bodyEncoding",
)
if (_layout.MESSAGE_COLUMNS != _COLUMNS_BY_NUMBER or len(_COLUMNS_BY_NUMBER) != COLUMN_COUNT
        or _layout.MOST_COLUMNS != MOST_COLUMNS_C):
    raise ImportError("the compiled kernel's message columns are not layout.py's")

cdef int64_t ROW_COLUMN_OF[COLUMN_COUNT]  # the row column holding each message column, or -1
for _number in range(COLUMN_COUNT):
    ROW_COLUMN_OF[_number] = -1
for _number, _column in (
    (COL_QUEUE_ID, C_QUEUE_ID), (COL_QUEUE_OFFSET, C_QUEUE_OFFSET),
    (COL_COMMIT_LOG_OFFSET, C_PHYSICAL_OFFSET), (COL_STORE_SIZE, C_TOTAL_SIZE),
    (COL_BODY_CRC, C_BODY_CRC), (COL_FLAG, C_FLAG), (COL_SYS_FLAG, C_SYS_FLAG),
    (COL_BORN_TIMESTAMP, C_BORN_TIMESTAMP), (COL_STORE_TIMESTAMP, C_STORE_TIMESTAMP),
    (COL_RECONSUME_TIMES, C_RECONSUME_TIMES), (COL_PREPARED_OFFSET, C_PREPARED_OFFSET),
    (COL_BODY_LENGTH, C_BODY_LENGTH),
):
    ROW_COLUMN_OF[_number] = _column


cdef bint _text_cell_quoted(const uint8_t* data, int64_t length, uint8_t delimiter) noexcept nogil:
    """Whether a text cell goes in quotes: it holds the delimiter, a quote, a line feed or a
    carriage return."""
    cdef int64_t k
    cdef uint8_t byte
    for k in range(length):
        byte = data[k]
        if byte == delimiter or byte == 34 or byte == 10 or byte == 13:
            return True
    return False


cdef void _put_text_cell(Writer* writer, const uint8_t* data, int64_t length,
                         bint quoted) noexcept nogil:
    cdef int64_t k
    if not quoted:
        _put_bytes(writer, data, length)
        return
    _put_byte(writer, 34)
    for k in range(length):
        _put_byte(writer, data[k])
        if data[k] == 34:
            _put_byte(writer, 34)
    _put_byte(writer, 34)


def message_rows(buf, rows, int64_t first, int64_t count, int body_mode,
                 bytes columns not None, int delimiter, bytearray out not None):
    """See ``rmqstore/kernel/layout.py``."""
    cdef const uint8_t[::1] view = buf
    cdef const int64_t[::1] row_view = rows
    cdef int64_t length = view.shape[0], row, at, need, old_size, state, line_start, k
    cdef int64_t column_count = PyBytes_GET_SIZE(columns), cell_at, cell_length
    cdef const uint8_t* codes = <const uint8_t*>PyBytes_AS_STRING(columns)
    cdef uint8_t code, separator = <uint8_t>delimiter
    cdef MessageParts parts
    cdef const uint8_t* data
    cdef bint bad = False
    cdef Writer writer
    if not (0 <= first <= count <= row_view.shape[0] // ROW_WIDTH_NATIVE):
        raise ValueError("rows are outside their buffers")
    if not BODY_NONE_C <= body_mode <= BODY_BASE64_C:
        raise ValueError(f"no body mode {body_mode}")
    if not 0 < column_count <= MOST_COLUMNS_C:
        raise ValueError("no such columns")
    for k in range(column_count):
        if codes[k] >= COLUMN_COUNT:
            raise ValueError("no such columns")
    if delimiter != 9 and delimiter != 44:
        raise ValueError(f"no delimiter {delimiter}")
    data = &view[0] if length else NULL
    old_size = PyByteArray_GET_SIZE(out)
    row = first
    while row < count:
        at = row * ROW_WIDTH_NATIVE
        state = _message_parts(row_view, at, data, length, body_mode, &parts)
        if state == PARTS_OUTSIDE:
            bad = True
            break
        if state == PARTS_REFERENCE:
            break
        need = 3  # a row of one empty cell, and its newline
        for k in range(column_count):
            code = codes[k]
            if code == COL_TOPIC:
                need += 2 * parts.spans.text.topic_length + 3
            elif code == COL_PROPERTIES:
                need += 12 * parts.spans.text.props_length + 8
            elif code == COL_TAGS or code == COL_KEYS or code == COL_UNIQ_KEY:
                need += 2 * parts.spans.text.props_length + 3
            elif code == COL_BODY:
                need += 2 * parts.body_length + 8
            else:
                need += 48
        _start_line(out, &writer, need)
        line_start = writer.cursor
        for k in range(column_count):
            if k:
                _put_byte(&writer, separator)
            code = codes[k]
            if ROW_COLUMN_OF[code] >= 0:  # a number the scan put in the row
                _put_decimal(&writer, row_view[at + ROW_COLUMN_OF[code]])
            elif code == COL_MSG_ID:
                _put_msg_id(&writer, data + parts.spans.store_at, 8,
                            row_view[at + C_PHYSICAL_OFFSET])
            elif code == COL_BORN_HOST:
                _put_ipv4_host(&writer, data + parts.spans.born_at)
            elif code == COL_STORE_HOST:
                _put_ipv4_host(&writer, data + parts.spans.store_at)
            elif code == COL_PROPERTIES:
                # JSON text holds no raw control character; it holds quotes once not empty
                if parts.pairs:
                    _put_byte(&writer, 34)
                _put_properties_json(&writer, data, &parts, parts.pairs > 0)
                if parts.pairs:
                    _put_byte(&writer, 34)
            elif code == COL_VERSION:
                _put_text(&writer, b"V2" if row_view[at + C_VERSION] == 2 else b"V1")
            elif code == COL_BODY_ENCODING:
                if body_mode != BODY_NONE_C:
                    _put_text(&writer, b"text" if parts.body_text
                              else b"hex" if body_mode == BODY_HEX_C else b"base64")
            elif code == COL_BODY and body_mode != BODY_NONE_C and not parts.body_text:
                if body_mode == BODY_HEX_C:
                    _put_hex_bytes(&writer, data + parts.body_at, parts.body_length)
                else:
                    _put_base64(&writer, data + parts.body_at, parts.body_length)
            else:  # a text cell, or nothing (a body not shown, a property the record lacks)
                cell_at, cell_length = 0, 0
                if code == COL_TOPIC:
                    cell_at, cell_length = parts.spans.text.topic_at, parts.spans.text.topic_length
                elif code == COL_TAGS and parts.tags_length != SPAN_ABSENT:
                    cell_at, cell_length = parts.tags_at, parts.tags_length
                elif code == COL_KEYS and parts.keys_length != SPAN_ABSENT:
                    cell_at, cell_length = parts.keys_at, parts.keys_length
                elif code == COL_UNIQ_KEY and parts.uniq_length != SPAN_ABSENT:
                    cell_at, cell_length = parts.uniq_at, parts.uniq_length
                elif code == COL_BODY and body_mode != BODY_NONE_C:
                    cell_at, cell_length = parts.body_at, parts.body_length
                _put_text_cell(&writer, data + cell_at, cell_length,
                               _text_cell_quoted(data + cell_at, cell_length, separator))
        if column_count == 1 and writer.cursor == line_start:
            _put_text(&writer, b'""')  # as csv writes a row of one empty cell
        _put_byte(&writer, 10)
        _end_line(out, &writer, old_size)
        row += 1
    if bad:
        raise ValueError(f"row {row} points outside the buffer")
    return row


# -- the Python API's per-record items (see layout.py) -----------------------------------------

from cpython.bytes cimport PyBytes_FromStringAndSize

assert (_layout.CRC_UNCHECKED, _layout.CRC_BAD, _layout.CRC_GOOD) == (-1, 0, 1)  # as _scan writes


def record_items(buf, rows, int64_t first, int64_t count, header_type, dict names, list items):
    """See ``rmqstore/kernel/layout.py``."""
    cdef const uint8_t[::1] view = buf
    cdef const int64_t[::1] row_view = rows
    cdef int64_t length = view.shape[0], row, at, start, sys_flag, born, store
    cdef int64_t topic_at, topic_length, props_at, props_length, status
    cdef int64_t last_at = -1, last_length = -1
    cdef TextSpans text
    cdef const uint8_t* data
    cdef const uint8_t* p
    cdef object topic = None, raw, header, crc_ok
    if not (0 <= first <= count <= row_view.shape[0] // ROW_WIDTH_NATIVE):
        raise ValueError("rows are outside their buffers")
    data = &view[0] if length else NULL
    new_header = tuple.__new__
    for row in range(first, count):
        at = row * ROW_WIDTH_NATIVE
        start = row_view[at + C_POSITION]
        sys_flag = row_view[at + C_SYS_FLAG]
        born = 20 if sys_flag & 0x10 else 8
        store = 20 if sys_flag & 0x20 else 8
        if not (_fits(start, 72 + born + store, length)
                and _text_spans(row_view, at, length, &text)):
            raise ValueError(f"row {row} points outside the buffer")
        topic_at, topic_length = text.topic_at, text.topic_length
        props_at, props_length = text.props_at, text.props_length
        # (checked above: every read below lies inside the buffer)
        if topic_length != last_length or (
                topic_length and memcmp(data + topic_at, data + last_at, <size_t>topic_length)):
            raw = PyBytes_FromStringAndSize(<const char*>(data + topic_at), topic_length) \
                if topic_length else b""
            topic = names.get(raw)
            if topic is None:
                topic = raw.decode("utf-8")
                names[raw] = topic
            last_at, last_length = topic_at, topic_length
        p = data + start
        header = new_header(header_type, (
            _get_be32(p), _get_be32(p + 4), _get_be32(p + 8), _get_be32(p + 12),
            _get_be32(p + 16), _get_be64(p + 20), _get_be64(p + 28), _get_be32(p + 36),
            _get_be64(p + 40), PyBytes_FromStringAndSize(<const char*>(p + 48), born),
            _get_be64(p + 48 + born),
            PyBytes_FromStringAndSize(<const char*>(p + 56 + born), store),
            _get_be32(p + 56 + born + store), _get_be64(p + 60 + born + store),
            _get_be32(p + 68 + born + store)))
        status = row_view[at + C_CRC_STATUS]
        crc_ok = None if status == -1 else status == 1  # CRC_UNCHECKED, CRC_GOOD
        items.append((
            row_view[at + C_PHYSICAL_OFFSET], header, topic,
            PyBytes_FromStringAndSize(<const char*>(data + props_at), props_length)
            if props_length else b"",
            crc_ok))
    return count - first


cdef inline int64_t _piece_end(const uint8_t* data, int64_t position, int64_t end) noexcept nogil:
    """Where the comma-separated piece starting at ``position`` ends (its comma, or ``end``);
    the caller checked that ``[position, end)`` lies in the buffer."""
    cdef const uint8_t* found
    if position >= end:
        return end
    found = <const uint8_t*>memchr(data + position, 44, <size_t>(end - position))
    return end if found == NULL else found - data


cdef int64_t _copy_spans(const uint8_t* data, const int64_t* row, int64_t* names_at,
                         int64_t* names_end, int64_t* offsets_at,
                         int64_t* offsets_end, int64_t* paired) noexcept nogil:
    """How many of the further queues ``row`` (its ROW_WIDTH columns) names a broker's
    dispatch reaches (up to an offset Long.parseLong refuses), its INNER_MULTI_DISPATCH and
    INNER_MULTI_QUEUE_OFFSET spans set, before negative offsets are left out: 0 when it has
    none (see row_copies in layout.py). The caller checked that the row's topic and
    properties lie in the buffer. ``paired``: how many pieces the two name when they pair
    up (more than the result where the broker's dispatch throws), else 0."""
    cdef int64_t topic_at = row[C_TOPIC_AT], topic_length = row[C_TOPIC_LENGTH]
    cdef int64_t props_at = row[C_PROPERTIES_AT], props_length = row[C_PROPERTIES_LENGTH]
    cdef int64_t sys_type = row[C_SYS_FLAG] & 0xC
    cdef int64_t names_length, offsets_length, pieces, other_pieces, position, piece_end
    cdef int64_t valid
    names_at[0] = names_end[0] = offsets_at[0] = offsets_end[0] = paired[0] = 0
    if sys_type == 0x4 or sys_type == 0xC:
        return 0  # PREPARED, ROLLBACK: in no queue
    # topics a 5.x broker gives no copies (rmqstore.multidispatch.gets_no_copies), of a
    # record whose properties end as a 5.x broker writes them (a 4.9 broker's do not end
    # with 0x02, and it gives every topic copies: multidispatch.written_by_49)
    if props_length == 0 or data[props_at + props_length - 1] == 2:
        if topic_length >= 7 and memcmp(data + topic_at, b"%RETRY%", 7) == 0:
            return 0
        if topic_length >= 8 and memcmp(data + topic_at, b"rmq_sys_", 8) == 0:
            return 0
        if topic_length == 19 and memcmp(data + topic_at, b"SCHEDULE_TOPIC_XXXX", 19) == 0:
            return 0
    _find_value(data, props_at, props_length, b"INNER_MULTI_DISPATCH", 20, names_at,
                &names_length)
    _find_value(data, props_at, props_length, b"INNER_MULTI_QUEUE_OFFSET", 24, offsets_at,
                &offsets_length)
    if names_length == SPAN_ABSENT or offsets_length == SPAN_ABSENT:
        return 0
    names_end[0] = names_at[0] + names_length
    offsets_end[0] = offsets_at[0] + offsets_length
    if (_java_blank(data, names_at[0], names_end[0])
            or _java_blank(data, offsets_at[0], offsets_end[0])):
        return 0  # StringUtils.isBlank: the broker dispatches no copy
    # split as Java's String.split(","): empty pieces at the end dropped (a value of commas
    # has none, so no copy)
    while names_end[0] > names_at[0] and data[names_end[0] - 1] == 44:
        names_end[0] -= 1
    while offsets_end[0] > offsets_at[0] and data[offsets_end[0] - 1] == 44:
        offsets_end[0] -= 1
    if names_end[0] == names_at[0] or offsets_end[0] == offsets_at[0]:
        return 0
    # as many names as offsets: else no copy at all
    pieces = 1
    position = names_at[0]
    while True:
        position = _piece_end(data, position, names_end[0])
        if position == names_end[0]:
            break
        pieces += 1
        position += 1
    other_pieces = 1
    for position in range(offsets_at[0], offsets_end[0]):
        if data[position] == 44:
            other_pieces += 1
    if pieces != other_pieces:
        return 0
    paired[0] = pieces
    # the pieces up to the first offset Long.parseLong refuses (where the broker throws)
    valid = 0
    position = offsets_at[0]
    while valid < pieces:
        piece_end = _piece_end(data, position, offsets_end[0])
        if not _java_long(data, position, piece_end):
            break
        valid += 1
        position = piece_end + 1
    return valid


cdef bint _java_long(const uint8_t* data, int64_t at, int64_t end) noexcept nogil:
    """Whether ``Long.parseLong`` reads the bytes ``[at, end)`` (in the buffer): an optional
    sign, then ASCII digits (leading zeros any number), within a signed 64-bit integer."""
    cdef uint64_t limit = <uint64_t>0x7FFFFFFFFFFFFFFF, magnitude = 0, digit
    if at < end and (data[at] == 43 or data[at] == 45):  # + or -
        if data[at] == 45:
            limit += 1
        at += 1
    if at >= end:
        return False
    while at < end:
        if not 48 <= data[at] <= 57:
            return False
        digit = data[at] - 48
        if magnitude > (limit - digit) // 10:
            return False
        magnitude = magnitude * 10 + digit
        at += 1
    return True


cdef bint _java_blank(const uint8_t* data, int64_t at, int64_t end) noexcept nogil:
    """Whether the UTF-8 bytes ``[at, end)`` (in the buffer) are blank to
    ``StringUtils.isBlank``: only characters ``Character.isWhitespace`` takes (tab to CR,
    U+001C to U+001F, space, U+1680, U+2000 to U+2006, U+2008 to U+200A, U+2028, U+2029,
    U+205F, U+3000)."""
    cdef uint8_t second, third
    while at < end:
        if 9 <= data[at] <= 13 or 28 <= data[at] <= 32:
            at += 1
            continue
        if end - at < 3:
            return False
        second, third = data[at + 1], data[at + 2]
        if not (
            (data[at] == 0xE1 and second == 0x9A and third == 0x80)
            or (data[at] == 0xE2 and second == 0x80
                and (0x80 <= third <= 0x86 or 0x88 <= third <= 0x8A
                     or third == 0xA8 or third == 0xA9))
            or (data[at] == 0xE2 and second == 0x81 and third == 0x9F)
            or (data[at] == 0xE3 and second == 0x80 and third == 0x80)):
            return False
        at += 3
    return True


cdef inline int64_t _next_copy(const uint8_t* data, int64_t* position, int64_t names_end,
                               int64_t* number_end, int64_t offsets_end,
                               uint64_t* value) noexcept nogil:
    """The end of the next name of a row's further queues, from ``position`` (moved past
    it), and its offset in ``value`` (``number_end`` moved to the offset's comma), one
    ``_copy_spans`` found Long.parseLong reads: a negative one (no unit) as 2^64 - 1."""
    cdef int64_t name_end = _piece_end(data, position[0], names_end)
    cdef bint negative = False
    value[0] = 0
    number_end[0] += 1
    if number_end[0] < offsets_end and (data[number_end[0]] == 43 or data[number_end[0]] == 45):
        negative = data[number_end[0]] == 45
        number_end[0] += 1
    while number_end[0] < offsets_end and data[number_end[0]] != 44:
        value[0] = value[0] * 10 + (data[number_end[0]] - 48)  # checked: within 2^63
        number_end[0] += 1
    if negative and value[0] != 0:
        value[0] = <uint64_t>0xFFFFFFFFFFFFFFFF
    return name_end


cdef inline int64_t _checked_row(const int64_t[::1] row_view, int64_t row, int64_t row_count,
                                 int64_t length) except -1:
    """The first column of row ``row``, once its topic and properties are known to lie in a
    buffer of ``length`` bytes (a ValueError otherwise, as the reference raises it)."""
    cdef int64_t at
    if not 0 <= row < row_count:
        raise ValueError(f"row {row} is outside the rows")
    cdef TextSpans text
    at = row * ROW_WIDTH_NATIVE
    if not _text_spans(row_view, at, length, &text):
        raise ValueError(f"row {row} points outside the buffer")
    return at


def row_copies(buf, rows, numbers, copy_type, dict names, list out):
    """See ``rmqstore/kernel/layout.py``."""
    cdef const uint8_t[::1] view = buf
    cdef const int64_t[::1] row_view = rows
    cdef const int64_t[::1] number_view = numbers
    cdef int64_t length = view.shape[0], row_count = row_view.shape[0] // ROW_WIDTH_NATIVE
    cdef int64_t n, at, names_at, names_end, offsets_at, offsets_end, pieces, piece
    cdef int64_t position, name_end, number_end, queue_id, paired
    cdef uint64_t value
    cdef const uint8_t* data = &view[0] if length else NULL
    cdef object raw, name, copies
    new_copy = tuple.__new__
    for n in range(number_view.shape[0]):
        at = _checked_row(row_view, number_view[n], row_count, length)
        # (checked: every read below lies inside the buffer)
        copies = []
        out.append(copies)
        pieces = _copy_spans(data, &row_view[at], &names_at, &names_end, &offsets_at,
                             &offsets_end, &paired)
        position = names_at
        number_end = offsets_at - 1
        for piece in range(pieces):
            name_end = _next_copy(data, &position, names_end, &number_end, offsets_end, &value)
            if value <= <uint64_t>0x7FFFFFFFFFFFFFFF:
                raw = PyBytes_FromStringAndSize(<const char*>(data + position),
                                                name_end - position) \
                    if name_end > position else b""
                name = names.get(raw)
                if name is None:
                    name = raw.decode("utf-8", JAVA_REPLACE)
                    names[raw] = name
                queue_id = 0 if (name_end - position >= 5
                                 and memcmp(data + position, b"%LMQ%", 5) == 0) \
                    else row_view[at + C_QUEUE_ID]
                copies.append(new_copy(copy_type, (name, queue_id, <int64_t>value)))
            position = name_end + 1
    return number_view.shape[0]


def copy_stops(buf, rows, numbers, out):
    """See ``rmqstore/kernel/layout.py``."""
    cdef const uint8_t[::1] view = buf
    cdef const int64_t[::1] row_view = rows
    cdef const int64_t[::1] number_view = numbers
    cdef int64_t[::1] out_view = out
    cdef int64_t length = view.shape[0], row_count = row_view.shape[0] // ROW_WIDTH_NATIVE
    cdef int64_t n, at, names_at, names_end, offsets_at, offsets_end, pieces, paired
    cdef int64_t found = 0
    cdef const uint8_t* data = &view[0] if length else NULL
    if out_view.shape[0] < number_view.shape[0]:
        raise ValueError("out holds fewer integers than numbers")
    for n in range(number_view.shape[0]):
        at = _checked_row(row_view, number_view[n], row_count, length)
        pieces = _copy_spans(data, &row_view[at], &names_at, &names_end, &offsets_at,
                             &offsets_end, &paired)
        if pieces < paired:
            out_view[found] = number_view[n]
            found += 1
    return found


DEF COPY_RUN_WIDTH = 7

cdef enum:  # copy-run columns
    COPY_RUN_NAME_AT = 0
    COPY_RUN_NAME_LENGTH = 1
    COPY_RUN_QUEUE_ID = 2
    COPY_RUN_FIRST_QUEUE_OFFSET = 3
    COPY_RUN_UNITS = 4
    COPY_RUN_UNITS_FROM = 5
    COPY_RUN_LAST_ROW = 6


def copy_runs(buf, rows, numbers, dispatch_out, units, runs, scratch):
    """See ``rmqstore/kernel/layout.py``."""
    cdef const uint8_t[::1] view = buf
    cdef const int64_t[::1] row_view = rows
    cdef const int64_t[::1] number_view = numbers
    cdef const int64_t[::1] out_view = dispatch_out
    cdef uint8_t[::1] unit_view = units
    cdef int64_t[::1] run_view = runs
    cdef int64_t[::1] scratch_view = scratch
    cdef int64_t length = view.shape[0], row_count = row_view.shape[0] // ROW_WIDTH_NATIVE
    cdef int64_t run_capacity = run_view.shape[0] // COPY_RUN_WIDTH
    cdef int64_t unit_capacity = min(unit_view.shape[0] // 20, scratch_view.shape[0] // 2)
    cdef int64_t n, row, at, names_at, names_end, offsets_at, offsets_end, pieces, piece
    cdef int64_t position, name_end, number_end, queue_id, name_length, number, m, run_at
    cdef int64_t paired
    cdef int64_t found = 0, placed = 0, done = 0, unit_at
    cdef uint64_t value
    cdef const uint8_t* data = &view[0] if length else NULL
    cdef uint8_t* unit
    for n in range(number_view.shape[0]):
        row = number_view[n]
        at = _checked_row(row_view, row, row_count, length)
        if not 0 <= row * DISPATCH_WIDTH <= out_view.shape[0] - DISPATCH_WIDTH:
            raise ValueError(f"row {row} is outside the dispatch output")
        pieces = _copy_spans(data, &row_view[at], &names_at, &names_end, &offsets_at,
                             &offsets_end, &paired)
        if found + pieces > run_capacity or placed + pieces > unit_capacity:
            break
        position = names_at
        number_end = offsets_at - 1
        for piece in range(pieces):
            name_end = _next_copy(data, &position, names_end, &number_end, offsets_end, &value)
            if value <= <uint64_t>0x7FFFFFFFFFFFFFFF:
                name_length = name_end - position
                queue_id = 0 if (name_length >= 5 and memcmp(data + position, b"%LMQ%", 5) == 0) \
                    else row_view[at + C_QUEUE_ID]
                number = -1
                m = found - 1
                while m >= 0:  # the queue's latest run
                    run_at = m * COPY_RUN_WIDTH
                    if (run_view[run_at + COPY_RUN_QUEUE_ID] == queue_id
                            and run_view[run_at + COPY_RUN_NAME_LENGTH] == name_length
                            and (name_length == 0
                                 or memcmp(data + run_view[run_at + COPY_RUN_NAME_AT],
                                           data + position, name_length) == 0)):
                        number = m
                        break
                    m -= 1
                if number >= 0 and not _continues(
                        run_view[number * COPY_RUN_WIDTH + COPY_RUN_FIRST_QUEUE_OFFSET],
                        run_view[number * COPY_RUN_WIDTH + COPY_RUN_UNITS], <int64_t>value):
                    number = -1
                if number < 0:
                    number = found
                    found += 1
                    run_at = number * COPY_RUN_WIDTH
                    run_view[run_at + COPY_RUN_NAME_AT] = position
                    run_view[run_at + COPY_RUN_NAME_LENGTH] = name_length
                    run_view[run_at + COPY_RUN_QUEUE_ID] = queue_id
                    run_view[run_at + COPY_RUN_FIRST_QUEUE_OFFSET] = <int64_t>value
                    run_view[run_at + COPY_RUN_UNITS] = 0
                    run_view[run_at + COPY_RUN_UNITS_FROM] = 0
                run_view[number * COPY_RUN_WIDTH + COPY_RUN_UNITS] += 1
                run_view[number * COPY_RUN_WIDTH + COPY_RUN_LAST_ROW] = row
                scratch_view[2 * placed] = number
                scratch_view[2 * placed + 1] = row
                placed += 1
            position = name_end + 1
        done += 1
    unit_at = 0
    for m in range(found):
        run_view[m * COPY_RUN_WIDTH + COPY_RUN_UNITS_FROM] = unit_at
        unit_at += run_view[m * COPY_RUN_WIDTH + COPY_RUN_UNITS]
        run_view[m * COPY_RUN_WIDTH + COPY_RUN_UNITS] = 0  # counted again as units are written
    for m in range(placed):
        number = scratch_view[2 * m]
        row = scratch_view[2 * m + 1]
        run_at = number * COPY_RUN_WIDTH
        unit = &unit_view[(run_view[run_at + COPY_RUN_UNITS_FROM] + run_view[run_at + COPY_RUN_UNITS]) * 20]
        at = row * ROW_WIDTH_NATIVE
        _put_unit(unit, row_view[at + C_PHYSICAL_OFFSET], row_view[at + C_TOTAL_SIZE],
                  out_view[row * DISPATCH_WIDTH + TAGS_CODE])
        run_view[run_at + COPY_RUN_UNITS] += 1
    return done, found, placed


# -- rows of text joined from columns (see layout.py) -------------------------------------------

from cpython.mem cimport PyMem_Free, PyMem_Malloc

cdef enum:
    TEXT_AS_IS_C = 0
    TEXT_BASE64_C = 1
    TEXT_DECIMAL_C = 2

cdef int64_t MOST_TEXT_BYTES = <int64_t>1 << 60  # what one call may append: past any real batch

_check_columns((
    ("TEXT_AS_IS", TEXT_AS_IS_C), ("TEXT_BASE64", TEXT_BASE64_C),
    ("TEXT_DECIMAL", TEXT_DECIMAL_C),
))


cdef struct TextPart:
    bint literal  # bytes the same in every row: ``data``
    const uint8_t* data  # a literal's bytes, or a column's values
    int64_t data_length
    const uint8_t* offsets
    int64_t first
    int width
    int encoding


cdef inline int64_t _text_offset(const TextPart* part, int64_t index) noexcept nogil:
    """Offset ``index`` of a column (checked by the caller to lie in its offsets)."""
    cdef int32_t narrow
    cdef int64_t wide
    if part.width == 4:
        memcpy(&narrow, part.offsets + 4 * index, 4)
        return narrow
    memcpy(&wide, part.offsets + 8 * index, 8)
    return wide


cdef inline int64_t _decimal_length(int64_t value) noexcept nogil:
    """How many characters ``_put_decimal`` writes for ``value``."""
    cdef uint64_t magnitude = (<uint64_t>0 - <uint64_t>value) if value < 0 else <uint64_t>value
    cdef int64_t length = 2 if value < 0 else 1
    while magnitude >= 10:
        magnitude //= 10
        length += 1
    return length


cdef const uint8_t* _bytes_of(object buffer, list held, int64_t* length) except? NULL:
    """The bytes of ``buffer`` (any contiguous buffer), kept acquired by ``held``."""
    cdef const uint8_t[::1] view = memoryview(buffer).cast("B")
    held.append(view)
    length[0] = view.shape[0]
    return &view[0] if view.shape[0] else NULL


def text_rows(list parts not None, int64_t count, bytearray out not None):
    """See ``rmqstore/kernel/layout.py``."""
    cdef Py_ssize_t part_count = len(parts), k
    cdef list held = list(parts)  # the literals and buffers stay alive while the GIL is free
    cdef TextPart* table
    cdef TextPart* part
    cdef int64_t offsets_length, numbers, row, start, end, size, total = 0, old_size
    cdef int failure = 0
    cdef Writer writer
    if not 0 <= count <= MOST_TEXT_BYTES:
        raise ValueError("a row count below 0 or past what one call may write")
    table = <TextPart*>PyMem_Malloc((part_count if part_count else 1) * sizeof(TextPart))
    if table == NULL:
        raise MemoryError()
    try:
        for k in range(part_count):
            item = parts[k]
            part = &table[k]
            if type(item) is bytes:
                part.literal = True
                part.offsets = NULL
                part.data_length = PyBytes_GET_SIZE(item)
                part.data = <const uint8_t*>PyBytes_AS_STRING(item)
                continue
            if type(item) is not tuple or len(item) != 5:
                raise ValueError("a part is bytes or (encoding, width, offsets, data, first)")
            encoding, width, offsets, data, first = item
            if type(encoding) is not int or type(width) is not int or type(first) is not int:
                raise ValueError("a column's encoding, offset width and first row are ints")
            if encoding not in (TEXT_AS_IS_C, TEXT_BASE64_C, TEXT_DECIMAL_C) or width not in (4, 8):
                raise ValueError("a column's encoding or offset width is not one there is")
            part.literal = False
            part.encoding, part.width = encoding, width
            part.offsets = _bytes_of(offsets, held, &offsets_length)
            part.data = _bytes_of(data, held, &part.data_length)
            numbers = count if encoding == TEXT_DECIMAL_C else count + 1
            if not (0 <= first <= offsets_length // width - numbers):
                raise ValueError("a column's offsets are fewer than its rows")
            part.first = first
        with nogil:  # every offset checked, and the room counted, before anything is written
            for k in range(part_count):
                part = &table[k]
                if part.literal:
                    if count and part.data_length > MOST_TEXT_BYTES // count:
                        failure = 2
                    else:
                        total += part.data_length * count
                elif part.encoding == TEXT_DECIMAL_C:
                    for row in range(count):
                        total += _decimal_length(_text_offset(part, part.first + row))
                else:
                    for row in range(count):
                        start = _text_offset(part, part.first + row)
                        end = _text_offset(part, part.first + row + 1)
                        if not (0 <= start <= end <= part.data_length):
                            failure = 1
                            break
                        size = end - start
                        total += (size + 2) // 3 * 4 if part.encoding == TEXT_BASE64_C else size
                        if total > MOST_TEXT_BYTES:
                            break
                if failure == 0 and total > MOST_TEXT_BYTES:
                    failure = 2
                if failure:
                    break
        if failure == 1:
            raise ValueError("a column's offset is outside its data or decreasing")
        if failure == 2:
            raise ValueError("the rows are longer than one call may write")
        old_size = PyByteArray_GET_SIZE(out)
        _start_line(out, &writer, total)
        # ``out`` exported while the GIL is free: no other thread can resize it meanwhile
        pinned = memoryview(out)
        try:
            with nogil:
                for row in range(count):
                    for k in range(part_count):
                        part = &table[k]
                        if part.literal:
                            _put_bytes(&writer, part.data, part.data_length)
                            continue
                        if part.encoding == TEXT_DECIMAL_C:
                            _put_decimal(&writer, _text_offset(part, part.first + row))
                            continue
                        start = _text_offset(part, part.first + row)
                        end = _text_offset(part, part.first + row + 1)
                        if part.encoding == TEXT_BASE64_C:
                            _put_base64(&writer, part.data + start, end - start)
                        else:
                            _put_bytes(&writer, part.data + start, end - start)
        finally:
            pinned.release()
        if writer.cursor != old_size + total:
            writer.breached = True
        _end_line(out, &writer, old_size)
        return total
    finally:
        PyMem_Free(table)
