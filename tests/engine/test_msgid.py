"""Offset message ids and UNIQ_KEYs (spec §4)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rmqstore.errors import InputError
from rmqstore.hosts import HostAddress, parse_host
from rmqstore.msgid import (
    UniqKeyGenerator,
    decode_offset_msg_id,
    decode_uniq_key,
    offset_msg_id,
)

from support import vectors


@pytest.mark.parametrize("vector", vectors()["offsetMsgIds"], ids=lambda v: v["offsetMsgId"])
def test_offset_msg_id_vectors(vector: dict) -> None:
    host = vector["storeHost"]
    text = f"[{host}]:{vector['port']}" if ":" in host else f"{host}:{vector['port']}"
    store_host = parse_host(text)
    assert offset_msg_id(store_host, vector["commitLogOffset"]) == vector["offsetMsgId"]
    assert decode_offset_msg_id(vector["offsetMsgId"]) == (store_host, vector["commitLogOffset"])


@given(
    st.one_of(st.binary(min_size=4, max_size=4), st.binary(min_size=16, max_size=16)),
    st.integers(0, 65535),
    st.integers(0, (1 << 63) - 1),
)
def test_offset_msg_id_round_trip(address: bytes, port: int, offset: int) -> None:
    host = HostAddress(address, port)
    assert decode_offset_msg_id(offset_msg_id(host, offset)) == (host, offset)


# spaces inside an id of the right length: bytes.fromhex passed over them, and the id named
# another record (15 bytes: a 7-byte host)
SPACED = "7F000001  02A9F0000000000000009E"


@pytest.mark.parametrize("bad", ["", "XYZ", "00" * 17, "G" * 32, SPACED, "7F\t" + "0" * 29])
def test_bad_msg_ids_are_input_errors(bad: str) -> None:
    with pytest.raises(InputError):
        decode_offset_msg_id(bad)
    with pytest.raises(InputError):
        decode_uniq_key(bad)


def test_uniq_key_example_decodes() -> None:
    example = vectors()["uniqKeyExample"]
    info = decode_uniq_key(example["uniqKey"])
    assert info.ip == example["ip"]
    assert info.pid == example["pid"]
    assert info.class_loader_hash == example["classLoaderHash"]
    assert info.millis_since_month_start == example["millisSinceStartOfMonth"]
    assert info.counter == example["counter"]


def test_ipv6_uniq_key_from_a_real_broker_store_decodes() -> None:
    info = decode_uniq_key("FD00000000000000000000000000000235795FFD2B276F07903A0000")
    assert info.ip == "fd00::2"
    assert info.counter == 0


def test_generator_is_deterministic_and_counts() -> None:
    clock = iter(range(1_700_000_000_000, 1_700_000_000_010)).__next__
    keys = UniqKeyGenerator(
        ip=bytes([192, 168, 0, 10]), pid=4000, class_loader_hash=0x759A6E0E, clock=clock
    )
    first, second = keys.next_key(), keys.next_key()
    assert first.startswith("C0A8000A0FA0759A6E0E") and len(first) == 32
    assert decode_uniq_key(first).counter == 0 and decode_uniq_key(second).counter == 1
    assert (
        decode_uniq_key(second).millis_since_month_start
        == decode_uniq_key(first).millis_since_month_start + 1
    )


def test_a_month_ends_where_the_next_one_starts_december_too() -> None:
    """The window UNIQ_KEY counts milliseconds in: the local month, its end the next month's
    start (January of the next year after December, the 29th of February in a leap year)."""
    import calendar
    import time

    from rmqstore.msgid import _start_of_month_millis

    for year in (2023, 2024):
        for month in range(1, 13):
            middle = time.mktime((year, month, 15, 12, 0, 0, 0, 0, -1))
            start, following = _start_of_month_millis(int(middle * 1000))
            days = calendar.monthrange(year, month)[1]
            assert start == int(time.mktime((year, month, 1, 0, 0, 0, 0, 0, -1)) * 1000)
            assert abs(following - start - days * 86_400_000) <= 3_600_000  # an hour of DST
            assert time.localtime(following / 1000)[:3] == (
                (year + 1, 1, 1) if month == 12 else (year, month + 1, 1)
            )
