"""Arrow columns straight from the record kernel's row batches: integers sliced out of the
rows, and fields, property maps and message ids gathered by the kernel into Arrow's own buffer
layout, so that no Python code runs per record. Used by the ``export`` rows and ``stats``;
pyarrow is imported by the caller and passed in.

Nothing here converts Python objects with ``pa.array`` or ``pa.scalar``: pyarrow imports pandas
for that (a third of a second), so small arrays of text are built from buffers too.

Text that is not valid UTF-8 (a TAGS value, a property) is decoded the way
:func:`rmqstore.properties.decode_properties` decodes it, with replacement characters, in the
rare batch that has some.
"""

from __future__ import annotations

from array import array
from typing import Any

from rmqstore import kernel
from rmqstore.hosts import HostAddress
from rmqstore.kernel import layout
from rmqstore.properties import decode_properties

_WIDTH = layout.ROW_WIDTH
_MOST_PAIRS_IN_A_RECORD = 8192  # 32767 bytes of properties, at least 4 bytes a pair


def integers(pa: Any, rows: Any, column: int, count: int, kind: Any = None) -> Any:
    """Row column ``column`` of the first ``count`` rows as an Arrow int64 array (cast to
    ``kind`` when given)."""
    values = rows[column : count * _WIDTH : _WIDTH]
    result = pa.Array.from_buffers(pa.int64(), count, [None, pa.py_buffer(values)])
    return result if kind is None else result.cast(kind)


def constant(pa: Any, value: int) -> Any:
    """An Arrow int64 scalar, made from a buffer (a plain int in a compute call would go
    through ``pa.scalar``, which imports pandas)."""
    return pa.Array.from_buffers(pa.int64(), 1, [None, pa.py_buffer(array("q", [value]))])[0]


def constant32(pa: Any, value: int) -> Any:
    """An Arrow int32 scalar, made from a buffer (see :func:`constant`)."""
    return pa.Array.from_buffers(pa.int32(), 1, [None, pa.py_buffer(array("i", [value]))])[0]


# epoch milliseconds a timestamp can show: years 1 to 9999 (others, from a damaged or hostile
# record, are null; the ms columns keep them)
TIMESTAMP_MS_RANGE = (-62_135_596_800_000, 253_402_300_799_999)


def timestamps(pa: Any, rows: Any, column: int, count: int) -> Any:
    """Row column ``column`` (epoch milliseconds) as Arrow timestamps in microseconds, UTC
    (Spark's TimestampType); null outside :data:`TIMESTAMP_MS_RANGE`."""
    import pyarrow.compute as pc

    millis = integers(pa, rows, column, count)
    low, high = TIMESTAMP_MS_RANGE
    kind = pa.timestamp("us", tz="UTC")
    extremes = pc.min_max(millis)
    if not count or (low <= extremes["min"].as_py() and extremes["max"].as_py() <= high):
        return pc.multiply(millis, constant(pa, 1000)).view(kind)  # the usual batch
    shown = pc.and_(
        pc.greater_equal(millis, constant(pa, low)), pc.less_equal(millis, constant(pa, high))
    )
    kept = pc.sum(pc.cast(shown, pa.int64())).as_py() or 0
    micros = pc.multiply(pc.if_else(shown, millis, constant(pa, 0)), constant(pa, 1000))
    return pa.Array.from_buffers(
        kind,
        count,
        [None if kept == count else shown.buffers()[1], micros.buffers()[1]],
        null_count=count - kept,
    )


def _int64(pa: Any, values: array, count: int) -> Any:
    return pa.Array.from_buffers(pa.int64(), count, [None, pa.py_buffer(values)])


def _binary_from_spans(pa: Any, buf: Any, spans: array, count: int, total: int, absent: int) -> Any:
    import pyarrow.compute as pc

    data = bytearray(total)
    offsets = array("i", bytes(4 * (count + 1)))
    kernel.gather(buf, spans, count, data, offsets)
    validity = None
    if absent:
        lengths = _int64(pa, spans[1 : 2 * count : 2], count)
        validity = pc.not_equal(lengths, constant(pa, layout.SPAN_ABSENT)).buffers()[1]
    return pa.Array.from_buffers(
        pa.binary(),
        count,
        [validity, pa.py_buffer(offsets), pa.py_buffer(data)],
        null_count=absent,
    )


def binary(pa: Any, buf: Any, rows: Any, count: int, field: int) -> Any:
    """A record field (``layout.FIELD_*``) of the first ``count`` rows as Arrow binary, null
    where the record has no such field."""
    spans = array("q", bytes(16 * count))
    total, absent = kernel.field_spans(buf, rows, 0, count, field, spans)
    return _binary_from_spans(pa, buf, spans, count, total, absent)


def text(pa: Any, values: Any) -> Any:
    """Arrow binary as Arrow strings: as they are when valid UTF-8, else decoded with
    replacement characters."""
    strings = values.view(pa.string())
    try:
        strings.validate(full=True)
    except pa.ArrowInvalid:
        return pa.array(
            [
                None if value is None else value.decode("utf-8", "replace")
                for value in values.to_pylist()
            ],
            type=pa.string(),
        )
    return strings


def topics(pa: Any, buf: Any, rows: Any, count: int) -> Any:
    """The topics of the rows (the scan checked they are UTF-8)."""
    return binary(pa, buf, rows, count, layout.FIELD_TOPIC).view(pa.string())


def strings(pa: Any, values: list[str]) -> Any:
    """A few Python strings as an Arrow string array (no nulls)."""
    data = bytearray()
    offsets = array("i", [0])
    for value in values:
        data += value.encode("utf-8")
        offsets.append(len(data))
    return pa.Array.from_buffers(
        pa.string(), len(values), [None, pa.py_buffer(offsets), pa.py_buffer(bytes(data))]
    )


def repeated(pa: Any, value: str, count: int) -> Any:
    """``value`` ``count`` times."""
    zeros = pa.Array.from_buffers(pa.int32(), count, [None, pa.py_buffer(bytes(4 * count))])
    return pa.DictionaryArray.from_arrays(zeros, strings(pa, [value])).dictionary_decode()


def chosen(pa: Any, condition: Any, if_true: str, if_false: str) -> Any:
    """``if_true`` where the boolean array ``condition`` holds, else ``if_false``."""
    import pyarrow.compute as pc

    indices = pc.cast(condition, pa.int8())
    return pa.DictionaryArray.from_arrays(
        indices, strings(pa, [if_false, if_true])
    ).dictionary_decode()


def crc_verdicts(pa: Any, rows: Any, count: int) -> Any:
    """The CRC verdict of each row: true, false, or null where it was not checked."""
    import pyarrow.compute as pc

    status = integers(pa, rows, layout.CRC_STATUS, count)
    good = pc.equal(status, constant(pa, layout.CRC_GOOD))
    checked = pc.not_equal(status, constant(pa, layout.CRC_UNCHECKED))
    unchecked = count - pc.sum(pc.cast(checked, pa.int64())).as_py()
    return pa.Array.from_buffers(
        pa.bool_(), count, [checked.buffers()[1], good.buffers()[1]], null_count=unchecked
    )


def hosts(pa: Any, buf: Any, rows: Any, count: int, field: int) -> Any:
    """Born or store host fields as ``address:port`` text, each distinct field decoded once."""
    encoded = binary(pa, buf, rows, count, field).dictionary_encode()
    names = [str(HostAddress.from_field(value)) for value in encoded.dictionary.to_pylist()]
    return pa.DictionaryArray.from_arrays(encoded.indices, strings(pa, names)).dictionary_decode()


def message_ids(pa: Any, buf: Any, rows: Any, count: int) -> Any:
    """The msgId of each row (store host and physical offset in upper-case hex)."""
    data = bytearray(layout.MESSAGE_ID_MAX * count)
    offsets = array("i", bytes(4 * (count + 1)))
    written = kernel.message_ids(buf, rows, 0, count, data, offsets)
    return pa.Array.from_buffers(
        pa.string(), count, [None, pa.py_buffer(offsets), pa.py_buffer(data[:written])]
    )


def properties(pa: Any, buf: Any, rows: Any, count: int, kind: Any) -> Any:
    """The properties of each row as an Arrow map (``kind``), pairs in the order
    :func:`decode_properties` keeps them."""
    capacity = max(4 * count, _MOST_PAIRS_IN_A_RECORD)
    names = array("q", bytes(16 * capacity))
    values = array("q", bytes(16 * capacity))
    pair_offsets = array("i", bytes(4 * (count + 1)))
    following, pairs = kernel.property_pairs(buf, rows, 0, count, names, values, pair_offsets)
    if following < count:  # records with very many pairs: one record at a time from here
        return _properties_by_record(pa, buf, rows, count, kind)
    keys = _strings_from_spans(pa, buf, names, pairs)
    items = _strings_from_spans(pa, buf, values, pairs)
    if keys is None or items is None:
        return _properties_by_record(pa, buf, rows, count, kind)
    offsets = pa.Array.from_buffers(pa.int32(), count + 1, [None, pa.py_buffer(pair_offsets)])
    return pa.MapArray.from_arrays(offsets, keys, items, type=kind)


def _strings_from_spans(pa: Any, buf: Any, spans: array, count: int) -> Any:
    """Arrow strings of ``count`` spans; None when one is not valid UTF-8."""
    total = sum(spans[1 : 2 * count : 2])
    strings = _binary_from_spans(pa, buf, spans, count, total, 0).view(pa.string())
    try:
        strings.validate(full=True)
    except pa.ArrowInvalid:
        return None
    return strings


def _properties_by_record(pa: Any, buf: Any, rows: Any, count: int, kind: Any) -> Any:
    found = []
    for row in range(count):
        at = row * _WIDTH
        start = rows[at + layout.PROPERTIES_AT]
        raw = bytes(buf[start : start + rows[at + layout.PROPERTIES_LENGTH]])
        found.append(list(decode_properties(raw).items()))
    return pa.array(found, type=kind)
