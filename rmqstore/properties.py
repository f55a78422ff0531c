"""The PROPERTIES field of a record (spec §3): ``name 0x01 value 0x02`` pairs in UTF-8.

4.3.1 and 5.x end every pair with 0x02; 4.9.x drops the final one. Both parse the same.
"""

from __future__ import annotations

import codecs
from collections.abc import Mapping

from rmqstore.errors import InputError
from rmqstore.javavalues import JAVA_LONG_RANGE, JAVA_SHORT_RANGE, parse_java_integer
from rmqstore.wording import quoted

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
MAX_PROPERTIES_BYTES = 32767  # PROPERTIESLENGTH is a signed short

TAGS = "TAGS"
KEYS = "KEYS"
UNIQ_KEY = "UNIQ_KEY"
DELAY = "DELAY"
REAL_TOPIC = "REAL_TOPIC"
REAL_QID = "REAL_QID"
CLUSTER = "CLUSTER"
WAIT = "WAIT"
KEY_SEPARATOR = " "
INNER_NUM = "INNER_NUM"
INNER_BASE = "INNER_BASE"


def _java_replacement(error: UnicodeError) -> tuple[str, int]:
    """A replacement character for the malformed bytes a decode met, over the bytes Java's
    UTF-8 decoder takes for one: as Python's decoder, but for a lead byte 0xED followed by
    0xA0..0xBF (half of a surrogate pair, as CESU-8 writes characters beyond the BMP),
    which Java takes with the continuation byte after it, if there is one, as one malformed
    sequence where Python replaces each byte (spec §3.5: the text a hash is taken of)."""
    if not isinstance(error, UnicodeDecodeError):
        raise error
    data, start = error.object, error.start
    if data[start] == 0xED and start + 1 < len(data) and 0xA0 <= data[start + 1] <= 0xBF:
        follows = start + 2 < len(data) and 0x80 <= data[start + 2] <= 0xBF
        return "\ufffd", start + (3 if follows else 2)
    return "\ufffd", error.end


JAVA_REPLACE = "rmqstore-java-replace"
codecs.register_error(JAVA_REPLACE, _java_replacement)


def java_text(data: bytes | bytearray | memoryview) -> str:
    """``data`` as Java's ``new String(bytes, UTF_8)`` makes it, the way a broker decodes a
    record's properties before it hashes TAGS into the tagsCode and KEYS and UNIQ_KEY into
    the index: valid UTF-8 as it is, malformed bytes as U+FFFD, as many as Java writes
    (Python's ``errors="replace"`` wrote three for the 0xED 0xA0 0x80 Java writes one for,
    and the hashes then differed from the broker's)."""
    return bytes(data).decode("utf-8", JAVA_REPLACE)


def decode_properties(data: bytes | bytearray | memoryview | str) -> dict[str, str]:
    """Parse a property string the way 4.9+/5.x ``string2messageProperties`` does.

    A pair is accepted only when its name and value are both non-empty; the value runs to the
    next 0x02 and may itself contain 0x01; later duplicates overwrite earlier ones. Invalid
    UTF-8 decodes with U+FFFD replacement characters, as Java's decoder does
    (:func:`java_text`).
    """
    if isinstance(data, bytes):
        text = data.decode("utf-8", JAVA_REPLACE)
    else:
        text = data if isinstance(data, str) else java_text(data)
    properties: dict[str, str] = {}
    for segment in text.split(PROPERTY_SEPARATOR):
        name, _, value = segment.partition(NAME_VALUE_SEPARATOR)
        if name and value:
            properties[name] = value
    return properties


def check_property(name: str, value: str) -> None:
    """Refuse names/values a broker would mis-parse: empty, or containing a separator."""
    if not name:
        raise InputError("property name is empty")
    if not value:
        raise InputError(f"property {quoted(name)} has an empty value (brokers drop such pairs)")
    for part, what in ((name, "name"), (value, "value")):
        if NAME_VALUE_SEPARATOR in part or PROPERTY_SEPARATOR in part:
            raise InputError(f"property {what} {quoted(part)} contains a 0x01/0x02 separator byte")


def encode_properties(
    properties: Mapping[str, str], *, trailing_separator: bool = True, check: bool = True
) -> bytes:
    """Serialise properties in insertion order. ``trailing_separator=False`` is 4.9.x style."""
    if not properties:
        return b""
    text = "".join(
        [
            f"{name}{NAME_VALUE_SEPARATOR}{value}{PROPERTY_SEPARATOR}"
            for name, value in properties.items()
        ]
    )
    if check:
        if INNER_NUM in properties and INNER_BASE in properties:
            check_inner_batch(properties[INNER_NUM], properties[INNER_BASE])
        pairs = len(properties)
        # one separator of each kind per pair, and no empty name or value: else find which
        if (
            text.count(NAME_VALUE_SEPARATOR) != pairs
            or text.count(PROPERTY_SEPARATOR) != pairs
            or not all(properties)
            or not all(properties.values())
        ):
            for name, value in properties.items():
                check_property(name, value)
    if not trailing_separator:
        text = text[:-1]
    encoded = text.encode("utf-8")
    if len(encoded) > MAX_PROPERTIES_BYTES:
        raise InputError(
            f"properties are {len(encoded)} bytes; a record allows at most {MAX_PROPERTIES_BYTES}"
        )
    return encoded


def check_inner_batch(count: str, base: str) -> None:
    """InputError unless a 5.x broker can read INNER_NUM ``count`` and INNER_BASE ``base``
    (``Short.parseShort``, ``Long.parseLong``): it reads them from every record holding both,
    and one it cannot read is an invalid record to it, which its recovery cuts with every
    record after it (spec §2.7)."""
    try:
        parse_java_integer(count, JAVA_SHORT_RANGE)
        parse_java_integer(base, JAVA_LONG_RANGE)
    except ValueError:
        raise InputError(
            f"INNER_NUM={quoted(count)} with INNER_BASE={quoted(base)}: a 5.x broker parses "
            "them as a Java short and long (an inner batch's count and base offset) and takes "
            "a record where they do not parse for an invalid one, which its recovery cuts"
        ) from None


def split_keys(keys: str | None) -> list[str]:
    """KEYS pieces as the index sees them: Java ``split(" ")`` without empty pieces."""
    if not keys:
        return []
    return [piece for piece in keys.split(KEY_SEPARATOR) if piece]
