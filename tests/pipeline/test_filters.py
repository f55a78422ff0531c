"""Row filters (rmqstore.pipeline.filters) applied by the commit-log rows keep exactly the rows
the same condition picks out of the unfiltered rows, with SQL's null rule, on every fixture
scenario and real-broker commit-log file; a column subset is those columns of the full rows."""

from __future__ import annotations

import random
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from pipeline.test_columns import one_file_store, rows_by_columns

from rmqstore.pipeline.filters import RowFilter, holds_for, offset_window
from rmqstore.pipeline.rows import MessageRowOptions

from support import compiled_pass_only

pytest.importorskip("pyarrow")

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _micros(value: datetime) -> int:
    delta = value - EPOCH
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


def satisfied(row_filter: RowFilter, row: dict[str, Any]) -> bool:
    """The condition evaluated on one full row, by SQL's rules (a null satisfies nothing but
    IS NULL)."""
    value = row[row_filter.column]
    if isinstance(value, datetime):
        value = _micros(value)
    if row_filter.operator in ("is_null", "is_not_null"):
        return ((value is None) == (row_filter.operator == "is_null")) != row_filter.negated
    if value is None:
        return False
    return holds_for(row_filter, value)


def conditions(rows: list[dict[str, Any]], rng: random.Random) -> list[tuple[RowFilter, ...]]:
    """Filters of every operator on every kind of column, with values taken from the rows."""
    some = rng.choice(rows)
    topics = sorted({row["topic"] for row in rows})
    offsets = sorted(row["commitLogOffset"] for row in rows)
    middle = offsets[len(offsets) // 2]
    tags = [row["tags"] for row in rows if row["tags"] is not None]
    keys = [row["keys"] for row in rows if row["keys"]]
    stored = _micros(some["storeTime"]) if some["storeTime"] else 0
    found: list[tuple[RowFilter, ...]] = [
        (RowFilter("topic", "eq", some["topic"]),),
        (RowFilter("topic", "eq", some["topic"], negated=True),),
        (RowFilter("topic", "in", tuple(topics[::2])),),
        (RowFilter("topic", "in", tuple(topics[:1]), negated=True),),
        (RowFilter("topic", "starts_with", some["topic"][:3]),),
        (RowFilter("topic", "is_not_null"),),
        (RowFilter("queueId", "in", (some["queueId"], 10**12)),),
        (RowFilter("queueId", "eq", some["queueId"]), RowFilter("queueOffset", "ge", 1)),
        (RowFilter("commitLogOffset", "ge", middle),),
        (RowFilter("commitLogOffset", "lt", middle), RowFilter("storeSize", "gt", 100)),
        (RowFilter("commitLogOffset", "le", offsets[0]),),
        (RowFilter("storeTimestamp", "gt", some["storeTimestamp"]),),
        (RowFilter("storeTime", "le", stored),),
        (RowFilter("bornTime", "lt", stored, negated=True),),
        (RowFilter("tags", "is_null"),),
        (RowFilter("tags", "is_null", negated=True),),
        (RowFilter("sysFlag", "eq", 0, negated=True),),
        (RowFilter("topic", "eq", "no such topic"),),
        (RowFilter("bornHost", "eq", some["bornHost"]),),  # columns built as dictionaries
        (RowFilter("storeHost", "in", (some["storeHost"], "1.2.3.4:5")),),
        (RowFilter("version", "eq", "V2"), RowFilter("queueOffset", "ge", 1)),
        (RowFilter("file", "starts_with", "commitlog/"),),
    ]
    if tags:
        tag = rng.choice(tags)
        found += [
            (RowFilter("tags", "eq", tag),),
            (RowFilter("tags", "in", (tag,), negated=True),),
            (RowFilter("tags", "ends_with", tag[-2:]),),
        ]
    if keys:
        found.append((RowFilter("keys", "contains", rng.choice(keys)[1:3]),))
    return found


@compiled_pass_only  # the kernel_corpus seeds; filters are evaluated on the columns in Python
def test_filtered_rows_are_the_rows_the_condition_picks(seeds, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(16)
    checked = 0
    kinds_offered, kinds_checked = set(), set()
    for number, (name, data, base) in enumerate(seeds):
        location, part = one_file_store(tmp_path / str(number), data, base)
        rows = rows_by_columns(location, part, MessageRowOptions())
        if not rows:
            continue
        offered = conditions(rows, rng)
        kinds_offered.update(map(_kind, offered))
        # three conditions a seed, in turn: every kind on many seeds
        for filters in (offered[(3 * number + step) % len(offered)] for step in range(3)):
            kinds_checked.add(_kind(filters))
            got = rows_by_columns(location, part, MessageRowOptions(filters=filters))
            expected = [row for row in rows if all(satisfied(f, row) for f in filters)]
            assert got == expected, f"{name}: {filters}"
            coded = rows_by_columns(location, part, MessageRowOptions(filters=filters), coded=True)
            assert coded == expected, f"{name}: {filters} (coded)"
            checked += 1
        subset = ("msgId", "topic", "storeTime", "body")
        got = rows_by_columns(location, part, MessageRowOptions(columns=subset))
        assert got == [{column: row[column] for column in subset} for row in rows], name
    assert checked > 50
    assert kinds_checked == kinds_offered


def _kind(filters: tuple[RowFilter, ...]) -> tuple[tuple[str, str, bool], ...]:
    return tuple((f.column, f.operator, f.negated) for f in filters)


def test_topics_option_is_a_topic_filter(seeds, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    for number, (_, data, base) in enumerate(seeds):
        location, part = one_file_store(tmp_path / str(number), data, base)
        rows = rows_by_columns(location, part, MessageRowOptions())
        if len({row["topic"] for row in rows}) > 2:
            break
    topic, queue_id = rows[-1]["topic"], rows[-1]["queueId"]
    both = MessageRowOptions(
        topics=frozenset([topic]), filters=(RowFilter("queueId", "eq", queue_id),)
    )
    expected = [row for row in rows if row["topic"] == topic and row["queueId"] == queue_id]
    assert 0 < len(expected) < len(rows)
    assert rows_by_columns(location, part, both) == expected


def test_offset_window() -> None:
    assert offset_window((), "commitLogOffset") == (-(2**63), 2**63)
    window = offset_window(
        (
            RowFilter("commitLogOffset", "ge", 100),
            RowFilter("commitLogOffset", "lt", 500),
            RowFilter("commitLogOffset", "gt", 50),
            RowFilter("queueId", "eq", 3),
            RowFilter("commitLogOffset", "eq", 7, negated=True),
        ),
        "commitLogOffset",
    )
    assert window == (100, 500)
    assert offset_window((RowFilter("commitLogOffset", "in", (9, 4)),), "commitLogOffset") == (
        4,
        10,
    )
    assert offset_window((RowFilter("commitLogOffset", "le", 9),), "commitLogOffset") == (
        -(2**63),
        10,
    )
    assert offset_window((RowFilter("commitLogOffset", "in", ()),), "commitLogOffset") == (0, 0)
