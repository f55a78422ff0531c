"""An export's JSON lines, a column at a time: each Arrow batch becomes the text of its rows
(one JSON object per message, every column in order, a null written as null, the body in
base64, properties as an object, ``bornTime``/``storeTime`` as ISO-8601 UTC with
milliseconds), the bytes ``json.dumps(row, ensure_ascii=False, separators=(",", ":"))`` gives
for each row. Each column's values are made JSON text by Arrow's compute functions and the
rows joined element-wise, so no Python object is made per value but for the bodies' base64
and the few strings that need escaping: a row at a time cost 25-40 microseconds per message,
30 to 40 times a Parquet export. With the compiled kernel the rows are joined, the body
written in base64 and the 32- and 64-bit integers in decimal by ``kernel.text_rows``
(Arrow's join of some fifty parts a row, a base64 made per body in Python and Arrow's casts of
the integers took half the export); the pure-Python kernel leaves them to Arrow and
``base64``, which give the same bytes.
"""

from __future__ import annotations

import json
from base64 import b64encode
from datetime import datetime
from functools import cache
from typing import Any

from rmqstore import kernel
from rmqstore.kernel.layout import TEXT_AS_IS, TEXT_BASE64, TEXT_DECIMAL
from rmqstore.pipeline import arrowcalls

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
# the bytes of UTF-8 text json.dumps writes as they are with ensure_ascii=False: all but the
# quote, the backslash and the controls below 0x20 (not even U+2028 is escaped)
_WRITTEN_AS_IS = bytes(byte for byte in range(256) if byte >= 0x20 and byte not in b'"\\')
# times Arrow writes for years 1000-9999 (four digits, as datetime.isoformat writes them)
_FOUR_DIGIT_YEARS_MS = (-30_610_224_000_000, 253_402_300_799_999)


@cache
def _between_date_and_time() -> Any:
    """Options of ``replace_substring``: the first space a T."""
    try:
        from pyarrow._compute import ReplaceSubstringOptions
    except ImportError:  # pragma: no cover - a pyarrow whose layout differs
        from pyarrow.compute import ReplaceSubstringOptions
    return ReplaceSubstringOptions(" ", "T", max_replacements=1)


def jsonl_text(pa: Any, batch: Any) -> Any:
    """The JSON lines of ``batch``'s rows (each ending in a newline), as an Arrow buffer or a
    bytearray."""
    if not batch.num_rows:
        return b""
    joined_here = kernel.NAME == "native"
    parts: list[Any] = []  # texts (the same in every row) and columns of JSON text
    literal = ""  # between two columns' values: the key, and the quotes of either
    for number, (field, column) in enumerate(zip(batch.schema, batch.columns, strict=True)):
        literal += ("{" if number == 0 else ",") + json.dumps(field.name) + ":"
        if joined_here and not column.null_count and _kernel_writes(pa, field.type):
            quote = '"' if _is_binary(pa, field.type) else ""  # the body, in base64
            parts += [literal + quote, _kernel_column(pa, column)]
            literal = quote
            continue
        values, before, after = _values(pa, field.type, column)
        if values.null_count:  # each value wrapped here, and a null written as null
            if before or after:
                values = _joined(pa, before, values, after)
            values = arrowcalls.call("coalesce", values, _text(pa, "null"))
            before = after = ""
        parts += [literal + before, values]
        literal = after
    parts.append(literal + "}\n")
    if joined_here:
        out = bytearray()
        kernel.text_rows([_kernel_part(pa, part) for part in parts], batch.num_rows, out)
        return out
    texts = [_text(pa, part) if isinstance(part, str) else part for part in parts]
    rows = arrowcalls.call("binary_join_element_wise", *texts, _text(pa, ""))
    offsets = memoryview(rows.buffers()[1]).cast("q")
    return rows.buffers()[2][offsets[rows.offset] : offsets[rows.offset + len(rows)]]


def _is_binary(pa: Any, kind: Any) -> bool:
    return bool(pa.types.is_binary(kind) or pa.types.is_large_binary(kind))


def _kernel_writes(pa: Any, kind: Any) -> bool:
    """Whether ``kernel.text_rows`` writes a column of ``kind`` (with no null) itself: a
    binary one in base64, a 32- or 64-bit integer in decimal."""
    return _is_binary(pa, kind) or pa.types.is_int32(kind) or pa.types.is_int64(kind)


def _kernel_column(pa: Any, column: Any) -> tuple[int, int, Any, Any, int]:
    """A column :func:`_kernel_writes` as ``kernel.text_rows`` takes it."""
    if _is_binary(pa, column.type):
        return _offsets_and_data(pa, TEXT_BASE64, column)
    width = 4 if pa.types.is_int32(column.type) else 8
    return (TEXT_DECIMAL, width, column.buffers()[1], b"", column.offset)


def _offsets_and_data(pa: Any, encoding: int, column: Any) -> tuple[int, int, Any, Any, int]:
    """A string or binary column as a ``kernel.text_rows`` column part."""
    _, offsets, data = column.buffers()
    wide = pa.types.is_large_string(column.type) or pa.types.is_large_binary(column.type)
    return (encoding, 8 if wide else 4, offsets, b"" if data is None else data, column.offset)


def _kernel_part(pa: Any, part: Any) -> Any:
    """A part of :func:`jsonl_text`'s rows as ``kernel.text_rows`` takes it: a text as its
    UTF-8 bytes, a column of JSON text as it is."""
    if isinstance(part, str):
        return part.encode()
    if isinstance(part, tuple):
        return part
    return _offsets_and_data(pa, TEXT_AS_IS, part)


def _text(pa: Any, value: str) -> Any:
    return pa.scalar(value, pa.large_string())


def _joined(pa: Any, before: str, values: Any, after: str) -> Any:
    return arrowcalls.call(
        "binary_join_element_wise", _text(pa, before), values, _text(pa, after), _text(pa, "")
    )


def _values(pa: Any, kind: Any, column: Any) -> tuple[Any, str, str]:
    """``column``'s values as JSON text (large strings; null where null) once each is put
    between the two texts returned (a string's quotes)."""
    types = pa.types
    if types.is_string(kind) or types.is_large_string(kind):
        return _strings(pa, column)
    if _is_binary(pa, kind):  # the body, in base64
        encoded = pa.array(
            [None if value is None else b64encode(value) for value in column.to_pylist()],
            pa.large_binary(),
        )
        return arrowcalls.cast(encoded, pa.large_string()), '"', '"'
    if types.is_map(kind):
        return _objects(pa, column), "", ""
    if types.is_timestamp(kind):
        return _times(pa, column)
    if types.is_integer(kind) or types.is_boolean(kind):  # 12, true
        return arrowcalls.cast(column, pa.large_string()), "", ""
    written = [json.dumps(value, ensure_ascii=False) for value in column.to_pylist()]
    return pa.array(written, pa.large_string()), "", ""  # a type the export does not make


def _strings(pa: Any, column: Any) -> tuple[Any, str, str]:
    """JSON strings, escaped the way json.dumps escapes them (see :func:`_values`)."""
    column = arrowcalls.cast(column, pa.large_string())
    offsets = memoryview(column.buffers()[1]).cast("q")
    data = column.buffers()[2]
    first, last = offsets[column.offset], offsets[column.offset + len(column)]
    # the column's bytes at once (no byte of a multi-byte UTF-8 character is ASCII); a
    # regular expression's search took four times as long
    if data is None or not bytes(memoryview(data)[first:last]).translate(None, _WRITTEN_AS_IS):
        return column, '"', '"'
    encode = json.encoder.encode_basestring  # type: ignore[attr-defined]
    written = [None if value is None else encode(value) for value in column.to_pylist()]
    return pa.array(written, pa.large_string()), "", ""


def _objects(pa: Any, column: Any) -> Any:
    """A map column as JSON objects, a key given twice in a row once (where first given,
    with the last value given, as ``dict`` of the pairs keeps it)."""
    first, last = column.offsets[0].as_py(), column.offsets[-1].as_py()
    # a batch sliced from a larger one: its maps' offsets point into the larger one's pairs
    keys = column.keys.slice(first, last - first)
    items = column.items.slice(first, last - first)
    offsets = arrowcalls.call("subtract", column.offsets, pa.scalar(first, pa.int32()))
    if _keys_repeat(pa, offsets, keys):
        return pa.array(
            [None if pairs is None else _dumps(dict(pairs)) for pairs in column.to_pylist()],
            pa.large_string(),
        )
    pairs = arrowcalls.call(
        "binary_join_element_wise",
        _json_strings(pa, keys),
        _json_strings(pa, items),
        _text(pa, ":"),
    )
    joined = arrowcalls.call(
        "binary_join", pa.ListArray.from_arrays(offsets, pairs), _text(pa, ",")
    )
    brace, closing = _text(pa, "{"), _text(pa, "}")
    objects = arrowcalls.call("binary_join_element_wise", brace, joined, closing, _text(pa, ""))
    if not column.null_count:
        return objects
    return arrowcalls.call(
        "if_else", arrowcalls.call("is_valid", column), objects, pa.scalar(None, pa.large_string())
    )


def _json_strings(pa: Any, column: Any) -> Any:
    """Each string as JSON, a null as null."""
    values, before, after = _strings(pa, column)
    if before:
        values = _joined(pa, before, values, after)
    return arrowcalls.call("coalesce", values, _text(pa, "null"))


def _keys_repeat(pa: Any, offsets: Any, keys: Any) -> bool:
    """Whether a key comes twice in one map (``offsets`` into ``keys``, from 0): each pair
    numbered by its map and its key's number among the distinct keys, in integers (hashing
    the key texts joined to their map's number took twice as long)."""
    if len(keys) < 2:
        return False
    rows = pa.ListArray.from_arrays(offsets, keys)
    encoded = arrowcalls.dictionary_encode(keys)  # a map's keys are never null
    maps = arrowcalls.cast(arrowcalls.call("list_parent_indices", rows), pa.int64())
    numbered = arrowcalls.call(
        "add",
        arrowcalls.call("multiply", maps, pa.scalar(len(encoded.dictionary), pa.int64())),
        arrowcalls.cast(encoded.indices, pa.int64()),
    )  # below 2**62: fewer than 2**31 maps and keys
    return arrowcalls.call("count_distinct", numbered).as_py() != len(keys)


def _times(pa: Any, column: Any) -> tuple[Any, str, str]:
    """Timestamps as ``2023-11-15T22:13:20.000Z`` (``datetime.isoformat`` to milliseconds,
    UTC). Arrow writes a timestamp without a zone 30 times as fast as one in UTC (which it
    converts through the zone database): the UTC values are written as such."""
    millis = arrowcalls.cast(column.view(pa.timestamp(column.type.unit)), pa.timestamp("ms"))
    extremes = arrowcalls.call("min_max", millis.view(pa.int64()))
    low, high = extremes["min"].as_py(), extremes["max"].as_py()
    if low is None or (_FOUR_DIGIT_YEARS_MS[0] <= low and high <= _FOUR_DIGIT_YEARS_MS[1]):
        written = arrowcalls.call(  # 2023-11-15 22:13:20.000
            "replace_substring",
            arrowcalls.cast(millis, pa.large_string()),
            options=_between_date_and_time(),
        )
        return written, '"', 'Z"'
    written = [None if value is None else _iso(value) for value in column.to_pylist()]
    return pa.array(written, pa.large_string()), "", ""  # a year of other than four digits


def _iso(value: datetime) -> str:
    return '"' + value.isoformat(timespec="milliseconds").replace("+00:00", "Z") + '"'
