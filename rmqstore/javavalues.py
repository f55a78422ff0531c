"""Text read the way Java's library reads it where a broker does: ``Integer.parseInt`` and
``Long.parseLong`` (a DELAY level, a broker.conf number, a delay table's entries),
``Boolean.parseBoolean`` and ``String.trim`` (broker.conf values), ``String.split`` (the
further queues of a record and their offsets).

Python's own readers take more than Java's (``int(" 3")``, ``int("1_0")``, ``str.strip()``
of a no-break space), so text a broker refuses or reads otherwise would mean something else
here.
"""

from __future__ import annotations

import re
from typing import TypeVar

from rmqstore.wording import quoted

_Text = TypeVar("_Text", str, bytes)

# a sign, then decimal digits of any script: Java's Character.digit takes them (U+0663 is
# 3), but one UTF-16 unit at a time, so a digit beyond the BMP is not one to Java
_JAVA_INTEGER = re.compile(r"[+-]?\d+")
_FIRST_BEYOND_BMP = "\U00010000"
JAVA_SHORT_RANGE = range(-(2**15), 2**15)
JAVA_INT_RANGE = range(-(2**31), 2**31)
JAVA_LONG_RANGE = range(-(2**63), 2**63)
# Character.isWhitespace, which StringUtils.isBlank tests each character with (not the
# no-break spaces U+00A0, U+2007, U+202F)
_JAVA_WHITESPACE = frozenset(
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
    "\u2008\u2009\u200a\u2028\u2029\u205f\u3000"
)
_ASCII_INTEGER = re.compile(r"[+-]?[0-9]+")
_ASCII_INTEGER_BYTES = re.compile(rb"[+-]?[0-9]+")
# String.trim takes off every character up to U+0020 at either end, and nothing else (not a
# no-break space, not U+0085)
_TRIMMED = "".join(map(chr, range(0x21)))


def parse_java_integer(text: str, values: range = JAVA_INT_RANGE) -> int:
    """``Integer.parseInt`` (``Long.parseLong`` with ``values=JAVA_LONG_RANGE``): an
    optional sign and digits only, nothing around them, within the type's range; else
    ValueError."""
    if not _JAVA_INTEGER.fullmatch(text) or not all(c < _FIRST_BEYOND_BMP for c in text):
        raise ValueError(f"not an integer: {quoted(text)}")
    value = int(text)
    if value not in values:
        raise ValueError(f"out of range: {quoted(text)}")
    return value


def parse_java_int(text: str) -> int:
    """``Integer.parseInt``."""
    return parse_java_integer(text, JAVA_INT_RANGE)


def java_long(value: int) -> int:
    """``value`` as a Java long holds it: wrapped into 64 bits, two's complement."""
    return (value + 2**63) % 2**64 - 2**63


def java_ascii_long(text: str | bytes) -> int | None:
    """``Long.parseLong`` of ``text`` (or of its ASCII bytes), None where it throws: empty, a
    sign alone, any other character, beyond a long; ASCII digits only (Java also takes the
    digits of other scripts: callers that read bytes in C cannot)."""
    pattern = _ASCII_INTEGER_BYTES if isinstance(text, bytes) else _ASCII_INTEGER
    if not pattern.fullmatch(text):  # type: ignore[arg-type]
        return None
    value = int(text)
    return value if value in JAVA_LONG_RANGE else None


def java_blank(text: str) -> bool:
    """``StringUtils.isBlank``: empty, or only characters ``Character.isWhitespace`` takes."""
    return all(character in _JAVA_WHITESPACE for character in text)


def java_trim(text: str) -> str:
    """``String.trim``."""
    return text.strip(_TRIMMED)


def java_boolean_word(text: str) -> bool | None:
    """True or False for ``true`` or ``false`` in any case (what ``Boolean.parseBoolean``
    reads as they look), None for any other text, which Java reads as false."""
    if text.isascii():
        lowered = text.lower()
        if lowered in ("true", "false"):
            return lowered == "true"
    return None


def java_split(text: _Text, separator: _Text) -> list[_Text]:
    """``text.split(separator)`` as Java's ``String.split`` gives it for a one-character
    ``separator`` that is no regex metacharacter: empty pieces at the end are dropped
    (``"a,b,"`` is two pieces, ``","`` none), other empty pieces kept; text without the
    separator is one piece, even when empty. For text and for its bytes."""
    pieces = text.split(separator)
    if len(pieces) > 1:
        while pieces and not pieces[-1]:
            pieces.pop()
    return pieces
