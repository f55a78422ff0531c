"""Java hashing semantics the store depends on (spec §3.5, §7.3).

``String.hashCode`` is ``h = 31*h + c`` over UTF-16 code units with 32-bit wrap-around. The
tagsCode of a message is that value sign-extended to 64 bits; the index key hash is its
``Math.abs`` with ``abs(Integer.MIN_VALUE)`` (still negative in Java) mapped to 0.
"""

from __future__ import annotations

import sys
from functools import lru_cache
from operator import mul

_MASK32 = 0xFFFFFFFF
_INT_MIN = -(1 << 31)
_UTF16_NATIVE = "utf-16-le" if sys.byteorder == "little" else "utf-16-be"

# powers of 31 modulo 2**32 for each string length, most significant first
_powers_by_length: dict[int, tuple[int, ...]] = {}

# The fast path for ASCII: a code unit c below 128 is (c // 31) * 31 + c % 31 with both parts
# below 31, so sum(c_i * 31**(n-1-i)) is 31 * H + L, where H and L are the strings of those
# parts read as base-31 numerals, which int() parses in C. Tables for bytes.translate:
_BASE31_DIGITS = b"0123456789abcdefghijklmnopqrstu"
_HIGH_DIGITS = bytes(_BASE31_DIGITS[c // 31] for c in range(128)) + bytes(128)
_LOW_DIGITS = bytes(_BASE31_DIGITS[c % 31] for c in range(128)) + bytes(128)


def _powers(length: int) -> tuple[int, ...]:
    powers = _powers_by_length.get(length)
    if powers is None:
        powers = tuple(pow(31, length - 1 - i, 1 << 32) for i in range(length))
        if length <= 4096:
            _powers_by_length[length] = powers
    return powers


@lru_cache(maxsize=4096)
def _power31(length: int) -> int:
    """31**length modulo 2**32 (remembered: lengths repeat)."""
    return pow(31, length, 1 << 32)


def _code_units(text: str) -> bytes | memoryview:
    """The UTF-16 code units of ``text`` as an iterable of ints."""
    if text.isascii():
        return text.encode("ascii")
    return memoryview(text.encode(_UTF16_NATIVE, "surrogatepass")).cast("H")


def _unsigned_hash(text: str) -> int:
    """``String.hashCode`` of ``text`` as an unsigned 32-bit int."""
    if text.isascii():
        data = text.encode("ascii")
        try:
            high = int(data.translate(_HIGH_DIGITS), 31)
            return (high * 31 + int(data.translate(_LOW_DIGITS), 31)) & _MASK32
        except ValueError:  # empty, or more digits than int() parses
            if not data:
                return 0
    units = _code_units(text)
    return sum(map(mul, units, _powers(len(units)))) & _MASK32


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode()`` as a signed 32-bit int."""
    unsigned = _unsigned_hash(text)
    return unsigned - (1 << 32) if unsigned & 0x80000000 else unsigned


@lru_cache(maxsize=8192)
def tags_code(tags: str | None) -> int:
    """The consume-queue tagsCode of a TAGS value: its Java hash sign-extended; 0 when absent."""
    if not tags:
        return 0
    return java_string_hash(tags)


def index_key_hash(key: str) -> int:
    """The index keyHash of ``topic#key``: ``Math.abs(hashCode)``, MIN_VALUE mapped to 0."""
    code = java_string_hash(key)
    if code == _INT_MIN:
        return 0
    return -code if code < 0 else code


def index_key_hash_with_prefix(prefix_hash: int, suffix: str) -> int:
    """:func:`index_key_hash` of ``prefix + suffix`` given ``java_string_hash(prefix)``: the
    hash of a concatenation is ``h(prefix) * 31**len(suffix) + h(suffix)`` (mod 2**32), so an
    index saves hashing ``topic#`` for every key."""
    units = len(suffix) if suffix.isascii() else len(_code_units(suffix))
    unsigned = (prefix_hash * _power31(units) + _unsigned_hash(suffix)) & _MASK32
    if unsigned == 0x80000000:
        return 0  # Math.abs(Integer.MIN_VALUE)
    return (1 << 32) - unsigned if unsigned & 0x80000000 else unsigned
