"""config/consumerOffset.json and config/delayOffset.json read as a broker loads them."""

from __future__ import annotations

from pathlib import Path

import pytest

from rmqstore.offsetsconfig import (
    MAX_CONFIG_BYTES,
    load_config,
    loads_fastjson,
    read_consumer_offsets,
    read_delay_offsets,
)

# what a 4.9 broker's fastjson writes: integer map keys bare, the map's closing brace on a
# line of its own
BROKER_WRITTEN = """{
\t"offsetTable":{
\t\t"TopicTest@please_rename_unique_group_name_4":{0:250,1:249,2:250,3:251
\t\t},
\t\t"%RETRY%please_rename_unique_group_name_4@please_rename_unique_group_name_4":{0:0
\t\t}
\t}
}"""


def test_bare_integer_keys_parse_and_strings_that_look_like_them_are_left_alone() -> None:
    assert loads_fastjson('{1:2,"a":{ -3 :4}}') == {"1": 2, "a": {"-3": 4}}
    # inside a string a "{0:" is text, not a key; escaped quotes do not end the string
    assert loads_fastjson('{"k":"{0:1,2:3} \\"{4:5}\\""}') == {"k": '{0:1,2:3} "{4:5}"'}
    with pytest.raises(ValueError):
        loads_fastjson("{0:1")
    with pytest.raises(ValueError):
        loads_fastjson('{"unterminated: {0:1}')


def test_consumer_offsets_as_a_broker_writes_them(tmp_path: Path) -> None:
    (tmp_path / "consumerOffset.json").write_text(BROKER_WRITTEN)
    offsets = read_consumer_offsets(tmp_path)
    group = "please_rename_unique_group_name_4"
    assert offsets.table == {
        ("TopicTest", group): {0: 250, 1: 249, 2: 250, 3: 251},
        (f"%RETRY%{group}", group): {0: 0},
    }
    assert offsets.left_out == [] and offsets.loaded.failures == ()
    assert offsets.loaded.source == tmp_path / "consumerOffset.json"


@pytest.mark.parametrize("main", [None, b"", b"  \n", b"{not json", b"[1,2]", b"\xff\xfe"])
def test_the_bak_is_read_when_the_file_is_missing_empty_or_does_not_parse(
    tmp_path: Path, main: bytes | None
) -> None:
    if main is not None:
        (tmp_path / "delayOffset.json").write_bytes(main)
    (tmp_path / "delayOffset.json.bak").write_text('{"offsetTable":{1:3,"2":2}}')
    offsets = read_delay_offsets(tmp_path)
    assert offsets.table == {1: 3, 2: 2}
    assert offsets.loaded.source == tmp_path / "delayOffset.json.bak"
    # a file that is there but does not load is said, an empty or missing one is not
    assert bool(offsets.loaded.failures) == bool(main and main.strip())
    assert not offsets.loaded.unreadable


def test_neither_file_loading_is_unreadable_and_neither_there_is_not(tmp_path: Path) -> None:
    assert load_config(tmp_path, "consumerOffset.json").document is None
    assert not load_config(tmp_path, "consumerOffset.json").unreadable
    (tmp_path / "consumerOffset.json").write_text("{")
    (tmp_path / "consumerOffset.json.bak").write_text("garbage")
    loaded = load_config(tmp_path, "consumerOffset.json")
    assert loaded.unreadable and len(loaded.failures) == 2
    assert read_consumer_offsets(tmp_path).table == {}


def test_a_file_past_the_bound_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "consumerOffset.json"
    with path.open("wb") as handle:  # sparse: no disk used
        handle.truncate(MAX_CONFIG_BYTES + 1)
    loaded = load_config(tmp_path, "consumerOffset.json")
    assert loaded.unreadable and "at most 256 MiB" in loaded.failures[0]


def test_entries_that_are_not_offsets_are_left_out_and_said(tmp_path: Path) -> None:
    (tmp_path / "consumerOffset.json").write_text(
        '{"offsetTable":{"T@g":{0:1,1:-1,2:"x",3:true,-1:5,"a":1,2147483648:1,4:1.5,'
        '5:9223372036854775808},"nogroup":{0:1},"../../etc@g":{0:1},"T2@g":[1],'
        '"T3@g":{0:9223372036854775807}}}'
    )
    offsets = read_consumer_offsets(tmp_path)
    assert offsets.table == {("T", "g"): {0: 1}, ("T3", "g"): {0: 2**63 - 1}}
    assert len(offsets.left_out) == 11
    assert any("../../etc" in text for text in offsets.left_out)
    (tmp_path / "delayOffset.json").write_text('{"offsetTable":{0:1,1:2,"x":3,2:-1}}')
    delay = read_delay_offsets(tmp_path)
    assert delay.table == {1: 2} and len(delay.left_out) == 3
