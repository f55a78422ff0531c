"""Property strings in both trailing-separator styles (spec §3.1-3.4)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rmqstore.errors import InputError
from rmqstore.properties import decode_properties, encode_properties, split_keys

from support import vectors

EXPECTED = {
    "TAGS": "TagA",
    "KEYS": "order-1 order-2",
    "UNIQ_KEY": "C0A8000A0FA0759A6E0E1B2E00000001",
}


def test_both_styles_decode_to_the_same_properties() -> None:
    encoding = vectors()["propertiesEncoding"]
    five = bytes.fromhex(encoding["properties_5x_style_hex"])
    four_nine = bytes.fromhex(encoding["properties_4_9_style_hex"])
    assert five.endswith(b"\x02") and not four_nine.endswith(b"\x02")
    assert decode_properties(five) == EXPECTED
    assert decode_properties(four_nine) == EXPECTED


def test_encoding_matches_both_styles_byte_for_byte() -> None:
    encoding = vectors()["propertiesEncoding"]
    assert encode_properties(EXPECTED) == bytes.fromhex(encoding["properties_5x_style_hex"])
    assert encode_properties(EXPECTED, trailing_separator=False) == bytes.fromhex(
        encoding["properties_4_9_style_hex"]
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("C\x01z\x01w\x02", {"C": "z\x01w"}),  # the value may hold 0x01 (4.9+ parser)
        ("\x01y\x02", {}),  # empty name dropped
        ("a\x01\x02b\x01c", {"b": "c"}),  # empty value dropped
        ("a\x011\x02a\x012", {"a": "2"}),  # later duplicates win
        ("", {}),
        ("noseparator", {}),
    ],
)
def test_parser_edge_cases_follow_4_9_rules(text: str, expected: dict) -> None:
    assert decode_properties(text) == expected


@pytest.mark.parametrize("bad", [{"": "v"}, {"k": ""}, {"k\x01": "v"}, {"k": "v\x02"}])
def test_encoder_refuses_what_a_broker_would_misparse(bad: dict) -> None:
    with pytest.raises(InputError):
        encode_properties(bad)


def test_encoder_refuses_more_than_32767_bytes() -> None:
    with pytest.raises(InputError, match="32767"):
        encode_properties({"big": "x" * 40000})


def test_keys_split_like_java_with_empty_pieces_skipped() -> None:
    assert split_keys("k1  k2 ") == ["k1", "k2"]
    assert split_keys(None) == []
    assert split_keys("one") == ["one"]


names = st.text(
    alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)),
    min_size=1,
    max_size=20,
)


@given(st.dictionaries(names, names, max_size=8), st.booleans())
def test_round_trip(properties: dict, trailing: bool) -> None:
    encoded = encode_properties(properties, trailing_separator=trailing)
    assert decode_properties(encoded) == properties
