"""Row filters of the commit-log and consume-queue sources: conditions on one column that a
read applies to a batch of kernel rows before it builds the batch's other columns, and that
prune the planned ranges (``commitLogOffset``) or queues (``topic``, ``queueId``) before
anything is read. The Spark sources translate pushed-down filters into these
(:mod:`rmqstore.spark.sources`); the engine never imports pyspark.

Each filter holds exactly as the SQL comparison does on the column's value: a null value
(a record without TAGS, a timestamp outside years 1-9999) satisfies no comparison, negated or
not, and only ``is_null`` picks it.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Any

from rmqstore.pipeline import columns

COMPARISONS = ("eq", "gt", "ge", "lt", "le")
OPERATORS = (
    *COMPARISONS,
    "in",
    "starts_with",
    "ends_with",
    "contains",
    "is_null",
    "is_not_null",
)
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)


@dataclass(frozen=True)
class RowFilter:
    """``column operator value`` (``value`` a tuple for ``in``; integers for integer columns,
    strings for text, epoch microseconds for timestamps), negated when ``negated``."""

    column: str
    operator: str
    value: Any = None
    negated: bool = False


def keep_mask(pa: Any, filters: tuple[RowFilter, ...], column: Any) -> Any:
    """The rows that satisfy every filter, as an Arrow boolean array without nulls;
    ``column(name)`` gives a column of the batch."""
    import pyarrow.compute as pc

    keep = None
    for row_filter in filters:
        held = _holds(pa, row_filter, column(row_filter.column))
        keep = held if keep is None else pc.and_(keep, held)
    return pc.fill_null(keep, False)


def _holds(pa: Any, row_filter: RowFilter, values: Any) -> Any:
    import pyarrow.compute as pc

    if pa.types.is_timestamp(values.type):
        values = values.view(pa.int64())  # epoch microseconds; nulls stay null
    operator, value = row_filter.operator, row_filter.value
    if operator == "is_null":
        held = pc.is_null(values)
    elif operator == "is_not_null":
        held = pc.is_valid(values)
    elif operator == "in":
        held = pc.is_in(values, value_set=_value_set(pa, values.type, value))
    elif operator == "starts_with":
        held = pc.starts_with(values, pattern=value)
    elif operator == "ends_with":
        held = pc.ends_with(values, pattern=value)
    elif operator == "contains":
        held = pc.match_substring(values, pattern=value)
    else:
        compare = {
            "eq": pc.equal,
            "gt": pc.greater,
            "ge": pc.greater_equal,
            "lt": pc.less,
            "le": pc.less_equal,
        }[operator]
        held = compare(values, _scalar(pa, values.type, value))
    if operator in ("is_null", "is_not_null"):
        return pc.invert(held) if row_filter.negated else held
    if row_filter.negated:
        held = pc.invert(held)
    return pc.and_(held, pc.is_valid(values))  # a null value satisfies no comparison


def _scalar(pa: Any, kind: Any, value: Any) -> Any:
    if isinstance(value, str):
        return columns.strings(pa, [value])[0]
    return columns.constant(pa, value)


def _value_set(pa: Any, kind: Any, values: tuple) -> Any:
    if pa.types.is_string(kind):
        return columns.strings(pa, [value for value in values if isinstance(value, str)])
    low, high = _INT32 if pa.types.is_int32(kind) else _INT64
    kept = [value for value in values if isinstance(value, int) and low <= value <= high]
    items = array("i" if pa.types.is_int32(kind) else "q", kept)
    return pa.Array.from_buffers(kind, len(kept), [None, pa.py_buffer(items)])


def holds_for(row_filter: RowFilter, value: Any) -> bool:
    """Whether ``value`` (not null: a partition's topic or queue id) satisfies the filter."""
    operator, wanted = row_filter.operator, row_filter.value
    if operator in ("is_null", "is_not_null"):
        held = operator == "is_not_null"
    elif operator == "in":
        held = value in wanted
    elif operator == "starts_with":
        held = value.startswith(wanted)
    elif operator == "ends_with":
        held = value.endswith(wanted)
    elif operator == "contains":
        held = wanted in value
    else:
        held = {
            "eq": value == wanted,
            "gt": value > wanted,
            "ge": value >= wanted,
            "lt": value < wanted,
            "le": value <= wanted,
        }[operator]
    return held != row_filter.negated


def offset_window(filters: tuple[RowFilter, ...], column: str) -> tuple[int, int]:
    """The ``[low, high)`` window of an integer column the filters leave (every value when
    they say nothing about it)."""
    low, high = _INT64[0], _INT64[1] + 1
    for row_filter in filters:
        if row_filter.column != column or row_filter.negated:
            continue
        operator, value = row_filter.operator, row_filter.value
        if operator == "in":
            values = [item for item in value if isinstance(item, int)]
            if not values:
                return 0, 0
            low, high = max(low, min(values)), min(high, max(values) + 1)
        elif operator == "eq":
            low, high = max(low, value), min(high, value + 1)
        elif operator == "gt":
            low = max(low, value + 1)
        elif operator == "ge":
            low = max(low, value)
        elif operator == "lt":
            high = min(high, value)
        elif operator == "le":
            high = min(high, value + 1)
    return low, high
