"""JSON from files and options: a hostile document is a ValueError naming the problem."""

from __future__ import annotations

import json

import pytest

from rmqstore.jsontext import MAX_NUMBER_DIGITS, parse_json


def test_documents_parse_as_json_does() -> None:
    text = '{"a": [1, -2, 3.5, "x", null, true], "b": {"c": 9223372036854775807}}'
    assert parse_json(text) == json.loads(text)
    assert parse_json(text.encode()) == json.loads(text)
    assert parse_json("-" + "9" * MAX_NUMBER_DIGITS) == -int("9" * MAX_NUMBER_DIGITS)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"a":' * 100_000 + "1" + "}" * 100_000, "nested too deeply"),
        ('{"a": ' + "7" * 100_000 + "}", "a number of 100000 digits"),
        ("-" + "1" * (MAX_NUMBER_DIGITS + 1), f"a number of {MAX_NUMBER_DIGITS + 1} digits"),
        ("{not json", "Expecting property name"),
    ],
)
def test_what_python_cannot_parse_is_a_value_error_saying_why(text: str, said: str) -> None:
    with pytest.raises(ValueError, match=said) as raised:
        parse_json(text)
    assert "sys.set_int_max_str_digits" not in str(raised.value)
