"""The PROPERTIES field of a record (spec §3): ``name 0x01 value 0x02`` pairs in UTF-8.

4.3.1 and 5.x end every pair with 0x02; 4.9.x drops the final one. Both parse the same.
"""

from __future__ import annotations

from collections.abc import Mapping

from rmqstore.errors import InputError
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


def decode_properties(data: bytes | bytearray | memoryview | str) -> dict[str, str]:
    """Parse a property string the way 4.9+/5.x ``string2messageProperties`` does.

    A pair is accepted only when its name and value are both non-empty; the value runs to the
    next 0x02 and may itself contain 0x01; later duplicates overwrite earlier ones. Invalid
    UTF-8 decodes with U+FFFD replacement characters, as Java's decoder does.
    """
    if isinstance(data, bytes):
        text = data.decode("utf-8", "replace")
    else:
        text = data if isinstance(data, str) else bytes(data).decode("utf-8", "replace")
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


def split_keys(keys: str | None) -> list[str]:
    """KEYS pieces as the index sees them: Java ``split(" ")`` without empty pieces."""
    if not keys:
        return []
    return [piece for piece in keys.split(KEY_SEPARATOR) if piece]
