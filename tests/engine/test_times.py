"""Store times as operators write them (epoch ms, ISO-8601, mqadmin's format) and as rmqstore
shows them (local or UTC, with the zone)."""

from __future__ import annotations

import os
import time

import pytest

from rmqstore.errors import InputError
from rmqstore.times import format_store_time, parse_store_time

MOMENT = 1_709_294_400_123  # 2024-03-01T12:00:00.123Z


def in_zone(zone: str):  # type: ignore[no-untyped-def]
    saved = os.environ.get("TZ")
    os.environ["TZ"] = zone
    time.tzset()
    yield
    if saved is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = saved
    time.tzset()


@pytest.fixture
def shanghai():  # type: ignore[no-untyped-def]
    yield from in_zone("Asia/Shanghai")


@pytest.fixture
def berlin():  # type: ignore[no-untyped-def]
    yield from in_zone("Europe/Berlin")


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


@pytest.mark.parametrize("form", ["2026-10-25T02:30", "2026-10-25#02:30:00:000"])
def test_a_local_time_the_clock_showed_twice_is_refused(berlin, form: str) -> None:  # type: ignore[no-untyped-def]
    """Berlin's clocks went back from 03:00 to 02:00 on 2026-10-25: 02:30 was shown at
    00:30Z and again at 01:30Z. Taking either silently would let a range ending there
    leave out an hour of messages; the error names both, with their offsets, which parse."""
    with pytest.raises(InputError, match="happened twice in local time") as refused:
        parse_store_time(form)
    assert "2026-10-25T02:30:00+02:00 or 2026-10-25T02:30:00+01:00" in str(refused.value)
    assert parse_store_time("2026-10-25T02:30:00+02:00") == 1_792_888_200_000
    assert parse_store_time("2026-10-25T02:30:00+01:00") == 1_792_891_800_000
    assert parse_store_time("2026-10-25T03:30") == 1_792_895_400_000  # once: +01:00


def test_a_local_time_the_clock_never_showed_is_refused(berlin) -> None:  # type: ignore[no-untyped-def]
    """On 2026-03-29 Berlin's clocks went forward from 02:00 to 03:00."""
    with pytest.raises(InputError, match="never happened in local time"):
        parse_store_time("2026-03-29T02:30:00.250")
    assert parse_store_time("2026-03-29T01:59:59.999") + 1 == parse_store_time("2026-03-29T03:00")


@pytest.mark.parametrize("utc", [False, True])
def test_a_time_as_shown_is_taken_back(shanghai, utc: bool) -> None:  # type: ignore[no-untyped-def]
    """What read, info and stats show can be copied into --begin/--end as it is."""
    for millis in (MOMENT, 1_700_086_401_000):
        shown = format_store_time(millis, utc=utc)
        assert shown.endswith(" UTC" if utc else " +0800")
        assert parse_store_time(shown) == millis, shown
    assert parse_store_time("2024-03-01 12:00:00 -0130") == MOMENT - 123 + 5_400_000
    for almost in ("2024-03-01 12:00:00.123 CET", "2024-03-01 12:00:00.123  +0800"):
        with pytest.raises(InputError, match="is not a time"):
            parse_store_time(almost)


def test_a_local_zone_a_day_from_utc_is_refused_for_input_and_shown_as_utc() -> None:
    """TZ=UTC+24 is a zone the C library takes and Python's datetime cannot hold: a local
    time given was an internal error (exit 70), and a time shown was a bare number."""
    zone = in_zone("UTC+24")
    next(zone)
    try:
        assert time.localtime(MOMENT // 1000).tm_gmtoff == -86_400
        with pytest.raises(InputError, match="cannot be placed in the local time zone"):
            parse_store_time("2024-03-01T12:00:00")
        assert parse_store_time("2024-03-01T12:00:00.123Z") == MOMENT
        assert format_store_time(MOMENT) == "2024-03-01 12:00:00.123 UTC"
    finally:
        next(zone, None)
