"""CRC-32 as the store uses it: the masked body CRC (spec §2.5) and the 5.x ``__CRC32#``
whole-record property with its reversed decimal digits (spec §2.6).

``zlib.crc32`` is the hot-path implementation (several GB/s); the tests cross-check it against
crcmod, an independent implementation of the same IEEE polynomial.
"""

from __future__ import annotations

import zlib

from rmqstore.wording import quoted

CRC32_PROPERTY_NAME = "__CRC32#"
CRC32_DIGITS = 10
# "__CRC32#" + 0x01 + 10 digits + 0x02, reserved at the very end of the properties field
CRC32_RESERVED_LEN = len(CRC32_PROPERTY_NAME) + 1 + CRC32_DIGITS + 1
_MASK31 = 0x7FFFFFFF


def body_crc(body: bytes | bytearray | memoryview) -> int:
    """BODYCRC: CRC-32 of the stored body with the top bit cleared; 0 for an empty body."""
    return zlib.crc32(body) & _MASK31 if body else 0


def record_crc(record_without_crc_property: bytes | bytearray | memoryview) -> int:
    """The ``__CRC32#`` value: masked CRC-32 of the record except its last 20 bytes."""
    return zlib.crc32(record_without_crc_property) & _MASK31


def encode_crc_digits(crc: int) -> bytes:
    """Ten ASCII digits, least significant first, padded on the right with '0'."""
    return str(crc)[::-1].ljust(CRC32_DIGITS, "0").encode("ascii")


def decode_crc_digits(digits: bytes | str) -> int:
    """Inverse of :func:`encode_crc_digits` (reads the characters from last to first)."""
    text = digits.decode("ascii") if isinstance(digits, (bytes, bytearray)) else digits
    if len(text) != CRC32_DIGITS or not text.isdigit():
        raise ValueError(f"not {CRC32_DIGITS} decimal digits: {quoted(text)}")
    return int(text[::-1])


def crc_property_bytes(crc: int) -> bytes:
    """The 20 reserved bytes: ``__CRC32#`` 0x01 digits 0x02."""
    return CRC32_PROPERTY_NAME.encode("ascii") + b"\x01" + encode_crc_digits(crc) + b"\x02"
