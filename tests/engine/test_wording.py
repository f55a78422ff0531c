"""How the engine words counts and the values it repeats in errors."""

from __future__ import annotations

import pytest

from rmqstore.errors import InputError, TopicError
from rmqstore.hosts import parse_host
from rmqstore.msgid import decode_offset_msg_id
from rmqstore.times import parse_store_time
from rmqstore.topics import check_topic
from rmqstore.wording import clipped, counted, quoted


def test_counted_uses_the_singular_for_one() -> None:
    assert counted(1, "file") == "1 file"
    assert counted(1_024, "entry", "entries") == "1,024 entries"


def test_short_values_are_shown_whole() -> None:
    assert quoted("abc") == "'abc'"
    assert quoted(12) == "12"
    assert clipped("abc") == "abc"


def test_long_values_are_cut_with_their_length() -> None:
    assert quoted("x" * 65) == repr("x" * 64) + "… (65 characters)"
    assert clipped("y" * 10_000) == "y" * 64 + "… (10,000 characters)"
    assert quoted(list(range(1_000))).endswith(" characters)")
    assert len(quoted(list(range(1_000)))) < 100


@pytest.mark.parametrize(
    ("parse", "error"),
    [
        (decode_offset_msg_id, InputError),
        (parse_store_time, InputError),
        (parse_host, InputError),
        (check_topic, TopicError),
    ],
)
def test_errors_repeat_a_long_input_cut(parse, error) -> None:
    with pytest.raises(error) as raised:
        parse("Z/" * 50_000)
    assert len(str(raised.value)) < 400
    assert "(100,000 characters)" in str(raised.value)
