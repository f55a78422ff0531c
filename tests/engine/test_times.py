"""Store times as operators write them (epoch ms, ISO-8601, mqadmin's format) and as rmqstore
shows them (local or UTC, with the zone)."""

from __future__ import annotations

import os
import time

import pytest

from rmqstore.errors import InputError
from rmqstore.times import format_store_time, parse_store_time

MOMENT = 1_709_294_400_123  # 2024-03-01T12:00:00.123Z


@pytest.fixture
def shanghai():  # type: ignore[no-untyped-def]
    saved = os.environ.get("TZ")
    os.environ["TZ"] = "Asia/Shanghai"
    time.tzset()
    yield
    if saved is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = saved
    time.tzset()


def test_every_form_names_the_same_moment(shanghai) -> None:  # type: ignore[no-untyped-def]
    for text in (
        str(MOMENT),
        "2024-03-01T12:00:00.123Z",
        "2024-03-01T12:00:00.123+00:00",
        "2024-03-01T20:00:00.123+08:00",
        "2024-03-01T20:00:00.123",  # local time
        "2024-03-01 20:00:00.123",
        "2024-03-01#20:00:00:123",  # mqadmin, local time
    ):
        assert parse_store_time(text) == MOMENT, text


def test_shown_with_the_zone(shanghai) -> None:  # type: ignore[no-untyped-def]
    assert format_store_time(MOMENT) == "2024-03-01 20:00:00.123 +0800"
    assert format_store_time(MOMENT, utc=True) == "2024-03-01 12:00:00.123 UTC"
    assert format_store_time(0) == "-"


def test_times_in_a_row_and_at_the_ends(shanghai) -> None:  # type: ignore[no-untyped-def]
    """Records in a row share their second (its text is made once): each still gets its
    own milliseconds, second, form and zone."""
    assert format_store_time(1_700_086_400_999) == "2023-11-16 06:13:20.999 +0800"
    assert format_store_time(1_700_086_401_000) == "2023-11-16 06:13:21.000 +0800"
    assert format_store_time(1_700_086_401_000, utc=True) == "2023-11-15 22:13:21.000 UTC"
    assert format_store_time(1_700_086_401_001) == "2023-11-16 06:13:21.001 +0800"
    os.environ["TZ"] = "UTC"
    time.tzset()
    assert format_store_time(1_700_086_401_002) == "2023-11-15 22:13:21.002 +0000"
    # Long.MAX as Java's Date shows it (dividing it as a float put it a second later)
    assert format_store_time(2**63 - 1, utc=True) == "292278994-08-17 07:12:55.807 UTC"


@pytest.mark.parametrize("text", ["yesterday", "2024-13-01T00:00:00", "2024-03-01T25:00:00", ""])
def test_not_a_time(text: str) -> None:
    with pytest.raises(InputError, match="is not a time"):
        parse_store_time(text)
