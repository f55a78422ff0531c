"""JSON text that comes from a store's files or a user's options, parsed with what a
hostile document can make Python do bounded: a document nested thousands of levels deep
(Python's parser gives up with a RecursionError, which no caller expects) and a number of
thousands of digits (Python refuses to convert it, with advice about its own limits).
Both are a ValueError naming what is wrong, as any other text that is not JSON is."""

from __future__ import annotations

import json
from typing import Any

# no number in a broker's files comes near this (a Java long has 19 digits); Python refuses
# to convert a longer one than 4300 digits anyway
MAX_NUMBER_DIGITS = 1000


def parse_json(text: str | bytes) -> Any:
    """``text`` parsed as JSON. Raises ValueError (json.JSONDecodeError when the text is
    not JSON) for any document that does not parse, one nested too deeply among them."""
    try:
        return json.loads(text, parse_int=_integer)
    except RecursionError:
        raise ValueError("nested too deeply to read") from None


def _integer(digits: str) -> int:
    length = len(digits.lstrip("-"))
    if length > MAX_NUMBER_DIGITS:
        raise ValueError(f"a number of {length} digits")
    return int(digits)
