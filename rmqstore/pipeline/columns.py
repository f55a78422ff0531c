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

import threading
from array import array
from collections.abc import Iterable, Sequence
from typing import Any

from rmqstore import kernel
from rmqstore.hosts import HostAddress
from rmqstore.kernel import layout
from rmqstore.pipeline import arrowcalls
from rmqstore.properties import JAVA_REPLACE, decode_properties

_WIDTH = layout.ROW_WIDTH
_MOST_PAIRS_IN_A_RECORD = 8192  # 32767 bytes of properties, at least 4 bytes a pair

_scratch = threading.local()  # per thread: the kernel's working arrays, reused batch to batch


def scratch(name: str, items: int, typecode: str = "q") -> array:
    """A working array of at least ``items`` items that the kernel fills before it is read
    (spans, pairs): kept per thread and name, so a batch does not allocate and zero it."""
    found = getattr(_scratch, name, None)
    if found is None or len(found) < items:
        found = array(typecode, bytes(array(typecode).itemsize * items))
        setattr(_scratch, name, found)
    return found


def fresh(pa: Any, size: int, typecode: str = "B") -> tuple[Any, memoryview]:
    """A new Arrow buffer of ``size`` bytes for the kernel to fill (uninitialised: the
    kernel writes every byte a column reads), and a view of it as ``typecode`` items. It
    comes from Arrow's memory pool, which reuses freed memory: no zeroed pages per batch."""
    buffer = pa.allocate_buffer(max(size, 8))  # (none empty: Arrow wants a buffer)
    view = memoryview(buffer).cast(typecode)
    return buffer, view[: size // view.itemsize]


def integers(pa: Any, rows: Any, column: int, count: int, kind: Any = None) -> Any:
    """Row column ``column`` of the first ``count`` rows as an Arrow int64 array, or int32
    when ``kind`` is (the kernel copies the column out of the rows; a value outside 32 bits
    is a ValueError), or cast to another ``kind``."""
    copied = RowIntegers(pa, rows, count, [(column, _width_of(pa, kind))])
    return copied.integers(column, kind)


def _width_of(pa: Any, kind: Any) -> int:
    """The bytes a row column is copied out as for an Arrow column of ``kind``: 4 for
    int32, else 8 (int64, cast to ``kind`` after when it is another type)."""
    return 4 if kind is not None and kind == pa.int32() else 8


class RowIntegers:
    """Integer row columns of the first ``count`` rows, copied out by one kernel pass over
    the rows into one Arrow buffer: ``wanted`` lists ``(row column, width)`` pairs (width 4:
    int32, a value outside 32 bits is a ValueError; 8: int64). Each column starts on a
    64-byte boundary of the buffer, as Arrow allocates them."""

    def __init__(self, pa: Any, rows: Any, count: int, wanted: Iterable[tuple[int, int]]) -> None:
        self.pa, self.count = pa, count
        self.placed: dict[tuple[int, int], int] = {}
        spec = array("q")
        at = 0
        for column, width in dict.fromkeys(wanted):
            spec.extend((column, width, at))
            self.placed[(column, width)] = at
            at += -(-width * count // 64) * 64
        self.buffer, view = fresh(pa, at)
        kernel.row_columns(rows, 0, count, spec, view)

    def array(self, column: int, width: int) -> Any | None:
        """Row column ``column`` as Arrow int32 (width 4) or int64; None when not copied."""
        at = self.placed.get((column, width))
        if at is None:
            return None
        kind = self.pa.int32() if width == 4 else self.pa.int64()
        values = self.buffer.slice(at, width * self.count)
        return self.pa.Array.from_buffers(kind, self.count, [None, values])

    def integers(self, column: int, kind: Any = None) -> Any | None:
        """Row column ``column`` as Arrow int64, or as ``kind`` (int32 as copied, another
        type cast from int64); None when it was not copied at that width."""
        width = _width_of(self.pa, kind)
        found = self.array(column, width)
        if found is None or kind is None or width == 4:
            return found
        return arrowcalls.cast(found, kind)


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


def timestamps(pa: Any, millis: Any) -> Any:
    """Epoch milliseconds (an Arrow int64 array) as Arrow timestamps in microseconds, UTC
    (Spark's TimestampType); null outside :data:`TIMESTAMP_MS_RANGE`."""
    call = arrowcalls.call
    count = len(millis)
    low, high = TIMESTAMP_MS_RANGE
    kind = pa.timestamp("us", tz="UTC")
    extremes = call("min_max", millis)
    if not count or (low <= extremes["min"].as_py() and extremes["max"].as_py() <= high):
        return call("multiply", millis, constant(pa, 1000)).view(kind)  # the usual batch
    shown = call(
        "and",
        call("greater_equal", millis, constant(pa, low)),
        call("less_equal", millis, constant(pa, high)),
    )
    kept = arrowcalls.total(arrowcalls.cast(shown, pa.int64()))
    micros = call("multiply", call("if_else", shown, millis, constant(pa, 0)), constant(pa, 1000))
    return pa.Array.from_buffers(
        kind,
        count,
        [None if kept == count else shown.buffers()[1], micros.buffers()[1]],
        null_count=count - kept,
    )


def _int64(pa: Any, values: array, count: int) -> Any:
    return pa.Array.from_buffers(pa.int64(), count, [None, pa.py_buffer(values)])


def _binary_from_spans(pa: Any, buf: Any, spans: array, count: int, total: int, absent: int) -> Any:
    data, data_view = fresh(pa, total)
    offsets, offset_view = fresh(pa, 4 * (count + 1), "i")
    written = kernel.gather(buf, spans, count, data_view, offset_view)
    data = data.slice(0, written)  # ``total`` may be room to spare: no stray bytes go on
    validity = None
    if absent:
        lengths = _int64(pa, spans[1 : 2 * count : 2], count)
        validity = arrowcalls.call(
            "not_equal", lengths, constant(pa, layout.SPAN_ABSENT)
        ).buffers()[1]
    return pa.Array.from_buffers(pa.binary(), count, [validity, offsets, data], null_count=absent)


def binary(pa: Any, buf: Any, rows: Any, count: int, field: int) -> Any:
    """A record field (``layout.FIELD_*``) of the first ``count`` rows as Arrow binary, null
    where the record has no such field."""
    spans = scratch("spans", 2 * count)
    total, absent = kernel.field_spans(buf, rows, 0, count, field, spans)
    return _binary_from_spans(pa, buf, spans, count, total, absent)


def _valid_utf8(pa: Any, strings: Any) -> bool:
    """Whether the bytes of an Arrow string array are UTF-8 (the kernel's check for plain
    ASCII first: the usual case, and cheaper than Arrow's full validation)."""
    data = strings.buffers()[2]
    if data is None or kernel.ascii_only(data, data.size):
        return True
    try:
        strings.validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def text(pa: Any, values: Any) -> Any:
    """Arrow binary as Arrow strings: as they are when valid UTF-8, else decoded with
    replacement characters."""
    strings = values.view(pa.string())
    if not _valid_utf8(pa, strings):
        return pa.array(
            [
                None if value is None else value.decode("utf-8", JAVA_REPLACE)
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


_zero_indices: dict[int, Any] = {}  # count -> that many int32 zeros (a batch's usual count)


def repeated(pa: Any, value: str, count: int) -> Any:
    """``value`` ``count`` times, as an Arrow dictionary array (int32 indices) of that one
    value: ``dictionary_decode()`` gives the strings."""
    zeros = _zero_indices.get(count)
    if zeros is None:
        zeros = pa.Array.from_buffers(pa.int32(), count, [None, pa.py_buffer(bytes(4 * count))])
        if len(_zero_indices) >= 4:
            _zero_indices.clear()
        _zero_indices[count] = zeros
    return pa.DictionaryArray.from_arrays(zeros, strings(pa, [value]))


def labels(pa: Any, runs: Sequence[tuple[str, int]]) -> Any:
    """Each run's label (text, rows) its rows times, in order, as an Arrow dictionary array
    (int32 indices) of the distinct labels."""
    if len(runs) == 1:
        return repeated(pa, runs[0][0], runs[0][1])
    distinct = list(dict.fromkeys(label for label, _ in runs))
    number = {label: index for index, label in enumerate(distinct)}
    indices = array("i")
    for label, rows in runs:
        indices += array("i", [number[label]]) * rows
    values = pa.Array.from_buffers(pa.int32(), len(indices), [None, pa.py_buffer(indices)])
    return pa.DictionaryArray.from_arrays(values, strings(pa, distinct))


def chosen(pa: Any, condition: Any, if_true: str, if_false: str) -> Any:
    """``if_true`` where the boolean array ``condition`` holds, else ``if_false``, as an
    Arrow dictionary array (int32 indices) of those two values, in that order."""
    indices = arrowcalls.cast(condition, pa.int32())
    return pa.DictionaryArray.from_arrays(indices, strings(pa, [if_false, if_true]))


def crc_verdicts(pa: Any, rows: Any, count: int) -> Any:
    """The CRC verdict of each row: true, false, or null where it was not checked."""
    status = integers(pa, rows, layout.CRC_STATUS, count)
    good = arrowcalls.call("equal", status, constant(pa, layout.CRC_GOOD))
    checked = arrowcalls.call("not_equal", status, constant(pa, layout.CRC_UNCHECKED))
    unchecked = count - arrowcalls.total(arrowcalls.cast(checked, pa.int64()))
    return pa.Array.from_buffers(
        pa.bool_(), count, [checked.buffers()[1], good.buffers()[1]], null_count=unchecked
    )


def hosts(pa: Any, buf: Any, rows: Any, count: int, field: int) -> Any:
    """Born or store host fields as ``address:port`` text, each distinct field decoded once:
    an Arrow dictionary array (int32 indices) of those texts. IPv4 fields are told apart as
    the 64-bit integers the kernel reads them as; a batch with an IPv6 host, by their bytes."""
    keys, key_view = fresh(pa, 8 * count, "q")
    if count and kernel.host_keys(buf, rows, 0, count, field, key_view) == count:
        integers = pa.Array.from_buffers(pa.int64(), count, [None, keys])
        extremes = arrowcalls.call("min_max", integers)
        if extremes["min"] == extremes["max"]:  # one host (a store host, usually)
            field_bytes = (extremes["min"].as_py() & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "big")
            return repeated(pa, str(HostAddress.from_field(field_bytes)), count)
        encoded = arrowcalls.dictionary_encode(integers)
        fields = [
            (key & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "big") for key in encoded.dictionary.to_pylist()
        ]
    else:
        encoded = arrowcalls.dictionary_encode(binary(pa, buf, rows, count, field))
        fields = encoded.dictionary.to_pylist()
    names = [str(HostAddress.from_field(value)) for value in fields]
    return pa.DictionaryArray.from_arrays(encoded.indices, strings(pa, names))


def message_ids(pa: Any, buf: Any, rows: Any, count: int) -> Any:
    """The msgId of each row (store host and physical offset in upper-case hex)."""
    data, data_view = fresh(pa, layout.MESSAGE_ID_MAX * count)
    offsets, offset_view = fresh(pa, 4 * (count + 1), "i")
    written = kernel.message_ids(buf, rows, 0, count, data_view, offset_view)
    return pa.Array.from_buffers(pa.string(), count, [None, offsets, data.slice(0, written)])


class PropertyPairs:
    """The property pairs of a batch's rows, parsed once by the kernel: the map column (its
    names and values copied into Arrow buffers in the same pass, ``with_map``) and the TAGS,
    KEYS and UNIQ_KEY columns are built from them. The picks live in this thread's working
    arrays: use it before the thread parses the next batch."""

    def __init__(
        self, pa: Any, buf: Any, rows: Any, count: int, *, with_map: bool, lengths: Any = None
    ) -> None:
        """``lengths``: the rows' PROPERTIES_LENGTH column as Arrow int64, when at hand."""
        self.pa, self.buf, self.rows, self.count = pa, buf, rows, count
        self.with_map = with_map
        if lengths is None:
            lengths = integers(pa, rows, layout.PROPERTIES_LENGTH, count)
        # the names and the values of a record lie in its properties: their bytes fit here
        self.room = arrowcalls.total(lengths)
        # a pair takes at least 4 bytes (3 for the last of a record): at most this many pairs
        capacity = (self.room + count) // 4 + 1 if with_map else -1
        map_room = self.room if with_map else 0
        self.keys, key_view = fresh(pa, map_room)
        self.key_offsets, key_offset_view = fresh(pa, 4 * (capacity + 1), "i")
        self.items, item_view = fresh(pa, map_room)
        self.item_offsets, item_offset_view = fresh(pa, 4 * (capacity + 1), "i")
        self.picked = memoryview(scratch("picked", layout.PICKED_WIDTH * count))
        self.pair_offsets, offset_view = fresh(pa, 4 * (count + 1), "i")
        following, self.pairs, self.key_bytes, self.item_bytes = kernel.property_pairs(
            buf,
            rows,
            0,
            count,
            scratch("pair_spans", 4 * _MOST_PAIRS_IN_A_RECORD),
            key_view,
            key_offset_view[: capacity + 1],
            item_view,
            item_offset_view[: capacity + 1],
            offset_view,
            self.picked,
        )
        # short of the count: a record with more pairs than a record can hold (then the
        # columns are made one record at a time)
        self.complete = following == count

    def map(self, kind: Any) -> Any:
        """The properties of each row as an Arrow map (``kind``), pairs in the order
        :func:`decode_properties` keeps them."""
        pa = self.pa
        if not (self.complete and self.with_map):  # (a batch asks for the map up front)
            return _properties_by_record(pa, self.buf, self.rows, self.count, kind)
        keys = _strings(pa, self.pairs, self.key_offsets, self.keys.slice(0, self.key_bytes))
        items = _strings(pa, self.pairs, self.item_offsets, self.items.slice(0, self.item_bytes))
        if keys is None or items is None:
            return _properties_by_record(pa, self.buf, self.rows, self.count, kind)
        offsets = pa.Array.from_buffers(pa.int32(), self.count + 1, [None, self.pair_offsets])
        return pa.MapArray.from_arrays(offsets, keys, items, type=kind)

    def text(self, field: int) -> Any:
        """The value of TAGS, KEYS or UNIQ_KEY (``layout.FIELD_*``) of each row as Arrow
        text (see :func:`text`), null where the record has none."""
        pa, count = self.pa, self.count
        if not self.complete:
            return text(pa, binary(pa, self.buf, self.rows, count, field))
        which = (layout.FIELD_TAGS, layout.FIELD_KEYS, layout.FIELD_UNIQ_KEY).index(field)
        spans = self.picked[2 * count * which : 2 * count * (which + 1)]
        values = _binary_from_spans(pa, self.buf, spans, count, self.room, 0)
        # an absent value gathers as empty, and a present one never is (a pair needs one)
        call = arrowcalls.call
        present = call("greater", call("binary_length", values), constant32(pa, 0))
        absent = count - present.true_count
        if absent:
            values = pa.Array.from_buffers(
                pa.binary(), count, [present.buffers()[1], *values.buffers()[1:]], absent
            )
        return text(pa, values)


def _strings(pa: Any, count: int, offsets: Any, data: Any) -> Any:
    """An Arrow string array of ``count`` values from its buffers; None when one is not
    valid UTF-8."""
    strings = pa.Array.from_buffers(pa.string(), count, [None, offsets, data])
    return strings if _valid_utf8(pa, strings) else None


def _properties_by_record(pa: Any, buf: Any, rows: Any, count: int, kind: Any) -> Any:
    found = []
    for row in range(count):
        at = row * _WIDTH
        start = rows[at + layout.PROPERTIES_AT]
        raw = bytes(buf[start : start + rows[at + layout.PROPERTIES_LENGTH]])
        found.append(list(decode_properties(raw).items()))
    return pa.array(found, type=kind)
