"""Java hashing semantics: String.hashCode over UTF-16, tagsCode, index keyHash (§3.5, §7.3)."""

from __future__ import annotations

import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rmqstore.hashing import (
    index_key_hash,
    index_key_hash_with_prefix,
    java_string_hash,
    tags_code,
)

from support import vectors


def reference_hash(text: str) -> int:
    """A direct transcription of Java's loop, as the independent reference."""
    value = 0
    units = text.encode("utf-16-be", "surrogatepass")
    for index in range(0, len(units), 2):
        value = (31 * value + int.from_bytes(units[index : index + 2], "big")) & 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


@pytest.mark.parametrize("vector", vectors()["tagHashCodes"], ids=lambda v: repr(v["tags"]))
def test_tag_hash_codes_match_java(vector: dict) -> None:
    assert bytes.fromhex(vector["utf8Hex"]).decode("utf-8") == vector["tags"]
    assert java_string_hash(vector["tags"]) == vector["javaStringHashCode"]
    assert tags_code(vector["tags"]) == vector["tagsCode"]
    assert (tags_code(vector["tags"]) & 0xFFFFFFFFFFFFFFFF) == int(vector["tagsCodeHex64"], 16)


@pytest.mark.parametrize("vector", vectors()["indexKeyHashes"], ids=lambda v: v["indexKey"])
def test_index_key_hashes_match_java(vector: dict) -> None:
    assert vector["indexKey"] == f"{vector['topic']}#{vector['key']}"
    assert java_string_hash(vector["indexKey"]) == vector["javaStringHashCode"]
    assert index_key_hash(vector["indexKey"]) == vector["keyHash"]
    assert vector["keyHash"] % 5_000_000 == vector["slotPos_5000000"]
    assert vector["keyHash"] % 16 == vector["slotPos_16"]


def test_absent_tags_hash_to_zero() -> None:
    assert tags_code(None) == 0
    assert tags_code("") == 0


def test_min_value_hash_maps_to_key_hash_zero() -> None:
    edge = vectors()["javaEdgeCases"]
    assert java_string_hash("polygenelubricants") == edge['"polygenelubricants".hashCode()']
    assert index_key_hash("TopicTest#key-FaCkcvF") == 0


@given(st.text())
def test_hash_equals_reference_for_any_text(text: str) -> None:
    assert java_string_hash(text) == reference_hash(text)


@given(st.text(max_size=40), st.text(max_size=80))
def test_prefix_composition_equals_hashing_the_whole_key(prefix: str, suffix: str) -> None:
    assert index_key_hash_with_prefix(java_string_hash(prefix), suffix) == index_key_hash(
        prefix + suffix
    )


def test_prefix_composition_keeps_the_min_value_rule() -> None:
    assert index_key_hash_with_prefix(java_string_hash("TopicTest#"), "key-FaCkcvF") == 0


@given(st.text(alphabet=st.characters(max_codepoint=127)))
def test_ascii_fast_path_equals_reference(text: str) -> None:
    assert java_string_hash(text) == reference_hash(text)


@pytest.mark.parametrize("length", [0, 1, 4299, 4300, 4301, 5000, 20000])
def test_long_ascii_keys_hash_like_java(length: int) -> None:
    # past int()'s digit limit the fast path falls back to the general one
    text = "".join(chr(33 + (i * 7) % 94) for i in range(length))
    assert java_string_hash(text) == reference_hash(text)
    assert index_key_hash_with_prefix(java_string_hash("T#"), text) == index_key_hash("T#" + text)


def test_hashes_with_a_lowered_int_digit_limit() -> None:
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(640)
    try:
        text = "k" * 1000
        assert java_string_hash(text) == reference_hash(text)
    finally:
        sys.set_int_max_str_digits(limit)
