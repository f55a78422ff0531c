"""Body CRC and the 5.x __CRC32# property digits, cross-checked against crcmod."""

from __future__ import annotations

import crcmod.predefined
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rmqstore.checksum import body_crc, decode_crc_digits, encode_crc_digits, record_crc

from support import vectors

crcmod_crc32 = crcmod.predefined.mkCrcFun("crc-32")


@pytest.mark.parametrize("vector", vectors()["bodyCrc"], ids=lambda v: v["bodyHex"][:16])
def test_body_crc_vectors(vector: dict) -> None:
    body = bytes.fromhex(vector["bodyHex"])
    assert crcmod_crc32(body) == vector["crc32Unsigned"]
    assert body_crc(body) == vector["bodyCRC"]


@given(st.binary(max_size=4096))
def test_body_crc_agrees_with_crcmod(body: bytes) -> None:
    expected = crcmod_crc32(body) & 0x7FFFFFFF if body else 0
    assert body_crc(body) == expected
    assert record_crc(body) == crcmod_crc32(body) & 0x7FFFFFFF


@pytest.mark.parametrize(
    ("crc", "digits"),
    [
        (1383656313, "3136563831"),
        (123, "3210000000"),
        (0, "0000000000"),
        (2147483647, "7463847412"),
    ],
)
def test_crc_digits_are_reversed_and_right_padded(crc: int, digits: str) -> None:
    assert encode_crc_digits(crc) == digits.encode("ascii")
    assert decode_crc_digits(digits) == crc


@given(st.integers(min_value=0, max_value=0x7FFFFFFF))
def test_crc_digits_round_trip(crc: int) -> None:
    assert decode_crc_digits(encode_crc_digits(crc)) == crc


def test_crc_digits_reject_non_digits() -> None:
    with pytest.raises(ValueError):
        decode_crc_digits("12345abcde")
    with pytest.raises(ValueError):
        decode_crc_digits("123")
