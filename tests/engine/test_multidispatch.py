"""Multi-dispatch and LMQ queues (spec 6.8): the units a record has in further queues are
written by every dispatch, checked by verify, and read back without a warning."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from array import array
from pathlib import Path

import pytest

from rmqstore.config import StoreConfig
from rmqstore.consumequeue import UNIT
from rmqstore.dispatch import Dispatcher
from rmqstore.errors import InputError
from rmqstore.fixtures import FixtureOptions, generate
from rmqstore.javavalues import java_split
from rmqstore.multidispatch import (
    INNER_MULTI_DISPATCH,
    INNER_MULTI_QUEUE_OFFSET,
    DispatchStop,
    QueueCopy,
    copy_queues,
    dispatch_stop,
    gets_no_copies,
    named_copies,
    queue_copies,
    rows_copies,
    split_queues,
    written_by_49,
)
from rmqstore.properties import decode_properties
from rmqstore.record import Message
from rmqstore.store import Store
from rmqstore.verify import verify_store

from support import file_digest, run_cli, tree_digest

LMQ = ["%LMQ%room-1", "%LMQ%room-2", "%LMQ%device_7"]  # the lmq scenario's queues


def _copies(dispatch: str, offsets: str, topic: str = "T", queue_id: int = 3) -> list:
    properties = {"INNER_MULTI_DISPATCH": dispatch, "INNER_MULTI_QUEUE_OFFSET": offsets}
    return queue_copies(topic, queue_id, properties)


def test_the_queues_a_record_names_and_the_offsets_the_broker_gave_them() -> None:
    assert _copies("%LMQ%a,%LMQ%b", "4,0") == [
        QueueCopy("%LMQ%a", 0, 4),
        QueueCopy("%LMQ%b", 0, 0),
    ]
    assert _copies("Plain", "9") == [QueueCopy("Plain", 3, 9)]  # the record's own queue id
    assert _copies("%LMQ%a", "1", topic="%RETRY%g") == []  # the broker skips retry topics
    # so does a 5.x broker SCHEDULE_TOPIC_XXXX and system topics (the timer's): such a
    # record carries the properties of the message it was made from
    for topic in ("SCHEDULE_TOPIC_XXXX", "rmq_sys_wheel_timer", "rmq_sys_"):
        assert gets_no_copies(topic) and _copies("%LMQ%a", "1", topic=topic) == []
    for topic in ("SCHEDULE_TOPIC_XXXX_", "SCHEDULE", "RMQ_SYS_TRANS_HALF_TOPIC", "rmq_sys", "T"):
        assert _copies("%LMQ%a", "1", topic=topic) == [QueueCopy("%LMQ%a", 0, 1)], topic
    # a 4.9 broker gives every topic copies: its records' properties end without 0x02
    named = {"INNER_MULTI_DISPATCH": "%LMQ%a,Q", "INNER_MULTI_QUEUE_OFFSET": "1,2"}
    copies = [QueueCopy("%LMQ%a", 0, 1), QueueCopy("Q", 3, 2)]
    for topic in ("SCHEDULE_TOPIC_XXXX", "%RETRY%g", "rmq_sys_wheel_timer", "T"):
        assert queue_copies(topic, 3, named, b"...TAGS\x01x") == copies
        assert named_copies(topic, 3, named) == copies
        assert queue_copies(topic, 3, named, b"...TAGS\x01x\x02") == (
            [] if topic != "T" else copies
        )
    assert written_by_49(b"A\x01b") and written_by_49(memoryview(b"\x00"))
    assert not written_by_49(b"") and not written_by_49(b"A\x01b\x02")
    assert _copies("%LMQ%a,%LMQ%b", "1") == []  # unpaired: the broker writes none
    # Long.parseLong throws at "x": the broker wrote the unit before it
    assert _copies("%LMQ%a,%LMQ%b", "1,x") == [QueueCopy("%LMQ%a", 0, 1)]
    assert _copies("%LMQ%a", " 1") == [] and _copies("%LMQ%a", "-1") == []
    # no folder can hold it: kept, so that dispatch and verify name it
    assert _copies("../../x,%LMQ%b", "1,2") == [
        QueueCopy("../../x", 3, 1),
        QueueCopy("%LMQ%b", 0, 2),
    ]
    assert queue_copies("T", 0, {"INNER_MULTI_DISPATCH": "%LMQ%a"}) == []  # no broker offsets


def test_a_broker_dispatch_stops_at_an_offset_long_parselong_refuses() -> None:
    """A broker's multiDispatchLmqQueue parses each offset with Long.parseLong as it writes
    the units in turn: it wrote those before a piece it refuses, then threw, and its
    dispatcher tried the record again for ever. rmqstore wrote none of the record's units
    and named nothing; a 5.x broker gives a name that is not an LMQ queue an empty piece."""

    def stop(dispatch: str, offsets: str, topic: str = "T") -> DispatchStop | None:
        properties = {"INNER_MULTI_DISPATCH": dispatch, "INNER_MULTI_QUEUE_OFFSET": offsets}
        return dispatch_stop(topic, 3, properties)

    assert stop("Plain,%LMQ%a", ",7") == DispatchStop(0, "", "Plain")
    assert _copies("Plain,%LMQ%a", ",7") == []
    assert stop("%LMQ%a,Plain,%LMQ%b", "4,,9") == DispatchStop(1, "", "Plain")
    assert _copies("%LMQ%a,Plain,%LMQ%b", "4,,9") == [QueueCopy("%LMQ%a", 0, 4)]
    assert stop("%LMQ%a,Plain", "7,") is None  # unpaired once split: no dispatch at all
    for refused in (" 1", "1 ", "x", "+", "-", "1e3", "0x10", "9223372036854775808", "\u0663"):
        assert stop("%LMQ%a", refused) == DispatchStop(0, refused, "%LMQ%a"), refused
    # what Long.parseLong reads: a sign, leading zeros, the extremes of a long
    assert _copies("%LMQ%a", "+5") == _copies("%LMQ%a", "0000000000000000000005")
    assert _copies("%LMQ%a", "9223372036854775807") == [QueueCopy("%LMQ%a", 0, 2**63 - 1)]
    for below in ("-1", "-9223372036854775808"):  # no unit: the queue's end is past it
        assert _copies("%LMQ%a,%LMQ%b", f"{below},2") == [QueueCopy("%LMQ%b", 0, 2)]
        assert stop("%LMQ%a", below) is None
    assert _copies("%LMQ%a", "-0") == [QueueCopy("%LMQ%a", 0, 0)]
    # a blank value (StringUtils.isBlank: Java's whitespace, not a no-break space)
    for blank in (" ", "\t\r\n", "\u3000", "\u2028 \x1f"):
        assert stop("%LMQ%a", blank) is None and _copies(blank, "1") == [], blank
    assert stop("%LMQ%a", "\u00a0") == DispatchStop(0, "\u00a0", "%LMQ%a")
    # topics a 5.x broker gives no copies are not dispatched, so do not stop it
    assert stop("%LMQ%a", "", "%RETRY%g") is None and stop("%LMQ%a", ",1", "%RETRY%g") is None


_BROKER_LOOP_IN_JAVA = """
import java.nio.file.*;
import java.util.*;
public class Loop {
    static boolean blank(String text) {  // StringUtils.isBlank
        for (int i = 0; i < text.length(); i++) {
            if (!Character.isWhitespace(text.charAt(i))) return false;
        }
        return true;
    }
    public static void main(String[] args) throws Exception {
        for (String line : Files.readAllLines(Path.of(args[0]))) {
            int bar = line.indexOf('|');
            String[] pair = {line.substring(0, bar), line.substring(bar + 1)};
            List<String> out = new ArrayList<>();
            if (!blank(pair[0]) && !blank(pair[1])) {
                String[] queues = pair[0].split(",");
                String[] offsets = pair[1].split(",");
                if (queues.length == offsets.length) {
                    for (int i = 0; i < queues.length; i++) {
                        long offset;
                        try {
                            offset = Long.parseLong(offsets[i]);
                        } catch (NumberFormatException e) {
                            out.add("stop " + i);
                            break;
                        }
                        if (offset >= 0) {
                            out.add(queues[i] + "@" + offset);
                        }
                    }
                }
            }
            System.out.println(String.join(";", out));
        }
    }
}
"""


def test_the_offsets_are_read_as_a_brokers_long_parselong_reads_them(tmp_path: Path) -> None:
    """named_copies and dispatch_stop against a JVM running the broker's loop (isBlank,
    String.split, Long.parseLong, a negative offset writing no unit) on 4,000 random pairs of
    values, of ASCII text and Java's whitespace (digits of other scripts, which Java reads
    and rmqstore does not, left out)."""
    javac = shutil.which("javac")
    if javac is None:
        pytest.skip("no javac (a JDK) on PATH")
    chooser = random.Random(20261203)
    names = ["%LMQ%a", "%LMQ%b", "Q", ",", " ", "\u3000"]
    numbers = ["0", "7", "-", "+", ",", " ", "x", "9223372036854775807", "9", "-1", "\u00a0"]
    pairs = [
        (
            "".join(chooser.choices(names, k=chooser.randrange(0, 5))),
            "".join(chooser.choices(numbers, k=chooser.randrange(0, 6))),
        )
        for _ in range(4000)
    ]
    (tmp_path / "pairs").write_text("".join(f"{a}|{b}\n" for a, b in pairs), encoding="utf-8")
    (tmp_path / "Loop.java").write_text(_BROKER_LOOP_IN_JAVA)
    subprocess.run([javac, "-d", str(tmp_path), str(tmp_path / "Loop.java")], check=True)
    done = subprocess.run(
        ["java", "-Dfile.encoding=UTF-8", "-Dstdout.encoding=UTF-8", "-cp", str(tmp_path),
         "Loop", str(tmp_path / "pairs")],
        capture_output=True, text=True, encoding="utf-8", check=True, timeout=120,
    )  # fmt: skip
    ours = []
    for queues, offsets in pairs:
        properties = {INNER_MULTI_DISPATCH: queues, INNER_MULTI_QUEUE_OFFSET: offsets}
        words = [f"{c.topic}@{c.queue_offset}" for c in named_copies("T", 0, properties)]
        stop = dispatch_stop("T", 0, properties)
        ours.append(";".join([*words, *([] if stop is None else [f"stop {stop.number}"])]))
    assert done.stdout.splitlines() == ours


def test_the_pieces_are_split_as_a_broker_splits_them() -> None:
    """Java's String.split drops empty pieces at the end: a producer's ``%LMQ%a,%LMQ%b,``
    named two queues, the broker gave them two offsets and wrote both units, where rmqstore
    saw three names against two offsets and wrote none (a rebuild dropped the broker's units,
    verify called them orphans)."""
    both = [QueueCopy("%LMQ%a", 0, 4), QueueCopy("%LMQ%b", 0, 0)]
    assert _copies("%LMQ%a,%LMQ%b,", "4,0") == both
    assert _copies("%LMQ%a,%LMQ%b,,,", "4,0,") == both
    assert _copies(",%LMQ%a", "1,2") == [QueueCopy("", 3, 1), QueueCopy("%LMQ%a", 0, 2)]
    assert _copies(",", ",") == [] and _copies("%LMQ%a,,", ",") == []
    # a 5.x broker leaves a name that is not an LMQ queue no offset: "7," is one piece
    assert _copies("%LMQ%a,Plain", "7,") == []
    assert split_queues("a,b,,") == ["a", "b"] and split_queues(",a,,b") == ["", "a", "", "b"]
    assert split_queues(",,") == [] and split_queues("") == [""] and split_queues("a") == ["a"]
    assert java_split(b"%LMQ%a,,", b",") == [b"%LMQ%a"]  # the reference kernel's, on bytes


_SPLIT_IN_JAVA = """
import java.nio.file.*;
public class Split {
    public static void main(String[] args) throws Exception {
        for (String line : Files.readAllLines(Path.of(args[0]))) {
            String[] pieces = line.split(",");
            System.out.println(pieces.length + ":" + String.join("|", pieces));
        }
    }
}
"""


def test_the_split_is_javas_string_split(tmp_path: Path) -> None:
    """java_split against the JVM's own String.split(",") on 3,000 random texts of commas
    and letters (it fails on Python's str.split at the first text ending in a comma)."""
    javac = shutil.which("javac")
    if javac is None:
        pytest.skip("no javac (a JDK) on PATH")
    chooser = random.Random(20261202)
    texts = ["", ",", ",,", "a"]
    texts += ["".join(chooser.choices("ab,", k=chooser.randrange(1, 9))) for _ in range(3000)]
    (tmp_path / "texts").write_text("".join(text + "\n" for text in texts))
    (tmp_path / "Split.java").write_text(_SPLIT_IN_JAVA)
    subprocess.run([javac, "-d", str(tmp_path), str(tmp_path / "Split.java")], check=True)
    done = subprocess.run(
        ["java", "-cp", str(tmp_path), "Split", str(tmp_path / "texts")],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    ours = [f"{len(pieces)}:{'|'.join(pieces)}" for pieces in map(split_queues, texts)]
    assert done.stdout.splitlines() == ours


_D, _O = b"INNER_MULTI_DISPATCH\x01", b"INNER_MULTI_QUEUE_OFFSET\x01"


@pytest.mark.parametrize(
    "data",
    [
        _D + b"%LMQ%a,%LMQ%b\x02" + _O + b"4,0\x02",
        b"TAGS\x01t\x02" + _D + b"%LMQ%a\x02KEYS\x01k\x02" + _O + b"7",  # no last 0x02
        _D + b"%LMQ%a\x02" + _O + b"1\x02" + _D + b"%LMQ%b\x02",  # later duplicate wins
        b"X\x01" + _D + b"%LMQ%a\x02" + _O + b"1\x02",  # a name inside a value: not a pair
        b"X\x01y\x01" + _D[:-1] + b"\x02" + _D + b"%LMQ%z\x02" + _O + b"2\x02",
        _D + b"\x02" + _O + b"1\x02",  # an empty value: no such property
        _D + "%LMQ%sal\u00f6n".encode() + b"\x02" + _O + b"3\x02",  # not ASCII
        _D + b"%LMQ%\xff\xfe\x02" + _O + b"3\x02",  # not UTF-8
        _D + b"%LMQ%a\x01b\x02" + _O + b"3\x01\x02",  # a value holding 0x01
        _O + b"5\x02",
        b"",
        _D + b"%LMQ%a",
        _D + b"%LMQ%a,%LMQ%b,\x02" + _O + b"4,0\x02",  # a comma at the end names no queue
        _D + b"%LMQ%a,,\x02" + _O + b"4,,,\x02",
        _D + b",\x02" + _O + b",,\x02",  # commas only: no piece at all
        _D + b",%LMQ%a\x02" + _O + b"3,4\x02",  # an empty name first is a piece
        _D + b"%LMQ%a,Q\x02" + _O + b"7,\x02",  # a 5.x broker's offsets for an LMQ and a Q
    ],
)
def test_the_stored_properties_give_the_copies_a_full_decode_gives(data: bytes) -> None:
    for topic in _TOPICS:
        expected = queue_copies(topic, 3, decode_properties(data), data)
        assert _stored_copies(topic, 3, data) == expected


# topics the kernels compare: those a 5.x broker gives no copies, and names close to them
_TOPICS = ["T", "%RETRY%g", "%RETRY%", "%RETRY", "SCHEDULE_TOPIC_XXXX", "SCHEDULE_TOPIC_XXX"]
_TOPICS += ["SCHEDULE_TOPIC_XXXXY", "rmq_sys_wheel_timer", "rmq_sys_", "rmq_sys", "RMQ_SYS_x"]


def _stored_copies(topic: str, queue_id: int, data: bytes) -> list:
    """rows_copies of one kernel row whose topic and properties are ``topic`` and ``data``."""
    from rmqstore.kernel import layout

    row = layout.new_rows(1)
    buf = topic.encode() + data
    row[layout.TOPIC_AT], row[layout.TOPIC_LENGTH] = 0, len(topic.encode())
    row[layout.PROPERTIES_AT], row[layout.PROPERTIES_LENGTH] = len(topic.encode()), len(data)
    row[layout.QUEUE_ID] = queue_id
    (copies,) = rows_copies(buf, row, [0], {})
    return copies


def test_random_stored_properties_give_the_copies_a_full_decode_gives() -> None:
    pieces = [_D, _O, _D[:-1], b"\x01", b"\x02", b"%LMQ%a", b"Q", b",", b"7", b"12", b"\xc3\xb6"]
    pieces += [b"\xff", b"TAGS\x01x\x02", b"-1", b"\x02" + _D + b"%LMQ%b,Q", b"\x02" + _O + b"3,4"]
    # what Long.parseLong and StringUtils.isBlank take, and what they do not
    pieces += [b"+", b"-", b" ", b"\t", b"\xe3\x80\x80", b"\xc2\xa0", b"\xe2\x80\x87", b"0000"]
    pieces += [b"9223372036854775807", b"9223372036854775808", b"-9223372036854775808"]
    chooser = random.Random(20261127)
    for _ in range(20000):
        data = b"".join(chooser.choices(pieces, k=chooser.randrange(0, 12)))
        topic = chooser.choice(_TOPICS)
        expected = queue_copies(topic, 1, decode_properties(data), data)
        assert _stored_copies(topic, 1, data) == expected, (topic, data)


@pytest.fixture
def lmq_store(tmp_path: Path) -> Path:
    store = tmp_path / "lmq"
    generate("lmq", store, FixtureOptions())
    return store


def _lmq_files(store: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(store)): path.read_bytes()
        for name in LMQ
        for path in sorted((store / "consumequeue" / name / "0").iterdir())
    }


def test_every_dispatch_writes_the_lmq_units_the_broker_would(lmq_store: Path, tmp_path) -> None:
    """The units of each LMQ queue are the records naming it, at the offsets they carry, each
    with its record's offset, size and tagsCode; a rebuild in one process and one in worker
    processes write the same bytes."""
    with Store.open_read(lmq_store) as store:
        records = [store.commitlog.read(offset) for offset, *_ in store.commitlog.scan()]
        expected: dict[str, list[tuple[int, int, int]]] = {name: [] for name in LMQ}
        for message in records:
            stored = message.properties_bytes
            for copy in queue_copies(message.topic, message.queue_id, message.properties, stored):
                assert copy.queue_id == 0 and copy.queue_offset == len(expected[copy.topic])
                expected[copy.topic].append((message.physical_offset, message.store_size))
        for name in LMQ:
            units = [(u.physical_offset, u.size) for u in store.consume_queue(name, 0).units()]
            assert units == expected[name] and units
    before = _lmq_files(lmq_store)
    digest = tree_digest(lmq_store / "consumequeue")
    for copy in _rebuilt_copies(lmq_store, tmp_path):
        assert _lmq_files(copy) == before, copy
        assert tree_digest(copy / "consumequeue") == digest, copy


def _rebuilt_copies(store_dir: Path, tmp_path: Path) -> list[Path]:
    """Copies of ``store_dir`` rebuilt by ``dispatch --rebuild`` in one process and in two
    worker processes."""
    copies = []
    for jobs in ("1", "2"):
        copy = tmp_path / f"jobs{jobs}"
        shutil.copytree(store_dir, copy)
        result = run_cli(
            "dispatch", copy, "--rebuild", "--yes", "--jobs", jobs, "--split-size", "4096"
        )
        assert result.exit_code == 0, result.stderr
        copies.append(copy)
    return copies


def test_verify_checks_lmq_units_and_a_dispatch_from_an_offset_restores_one(
    lmq_store: Path,
) -> None:
    """verify called every LMQ unit an orphan (its record belongs to another queue), with
    dispatch --rebuild as the next step, which dropped the LMQ queues."""
    with Store.open_read(lmq_store) as store:
        report = verify_store(store)
    assert report.ok, report.counts
    assert report.counts["topic-unlisted"] == 0  # a broker serves LMQ queues without a topic
    queue_file = sorted((lmq_store / "consumequeue" / LMQ[0] / "0").iterdir())[-1]
    units = bytearray(queue_file.read_bytes())
    last = len(units.rstrip(b"\0")) + 19
    last -= last % 20 + 20  # the queue's last unit
    removed = bytes(units[last : last + 20])
    units[last : last + 20] = bytes(20)
    queue_file.write_bytes(units)
    result = run_cli("verify", lmq_store, "--json")
    assert result.exit_code == 1
    findings = json.loads(result.stdout)["findings"]
    assert [(f["kind"], f["topic"]) for f in findings] == [("dispatch-hole", LMQ[0])]
    offset = findings[0]["commitLogOffset"]
    assert run_cli("dispatch", lmq_store, "--from-offset", str(offset)).exit_code == 0
    assert queue_file.read_bytes()[last : last + 20] == removed
    # a unit pointing at another record of the topic is named as not its record's
    units = bytearray(queue_file.read_bytes())
    units[0:8] = units[20:28]
    queue_file.write_bytes(units)
    with Store.open_read(lmq_store) as store:
        report = verify_store(store)
    assert report.counts["cq-unit"] == 1 and report.counts["cq-unit-orphan"] == 1


def test_an_lmq_queue_reads_without_warnings(lmq_store: Path) -> None:
    result = run_cli("read", lmq_store, "--topic", LMQ[1], "--queue", "0", "--jsonl")
    assert result.exit_code == 0 and result.stderr == ""
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert lines and {line["topic"] for line in lines} == {"MqttTopic"}
    for number, line in enumerate(lines):
        names = line["properties"]["INNER_MULTI_DISPATCH"].split(",")
        offsets = line["properties"]["INNER_MULTI_QUEUE_OFFSET"].split(",")
        assert offsets[names.index(LMQ[1])] == str(number)


def test_a_dispatcher_walking_the_log_writes_what_a_rebuild_does(lmq_store: Path) -> None:
    """Recovery's dispatch after a cut: the LMQ units for the records after the cut come
    back as the dispatcher walks the log."""
    before = _lmq_files(lmq_store)
    for name in LMQ:
        shutil.rmtree(lmq_store / "consumequeue" / name)
    with Store.open_write(lmq_store) as store:
        dispatcher = Dispatcher(store)
        try:
            result = dispatcher.run(0)
        finally:
            dispatcher.close()
    assert _lmq_files(lmq_store) == before
    lmq_units = 155 - 60  # the lmq scenario's units in all queues, less one per record
    assert (result.units_written, result.units_skipped) == (lmq_units, 60)


# -- append gives the offsets (a broker with enableMultiDispatch) ------------------------------


def test_the_queues_a_broker_gives_offsets_in() -> None:
    assert copy_queues("T", 3, "%LMQ%a,Plain,%LMQ%a") == [
        ("%LMQ%a", 0),
        ("Plain", 3),
        ("%LMQ%a", 0),
    ]
    # a comma at the end names no queue, as the broker's String.split reads it
    assert copy_queues("T", 3, "%LMQ%a,Plain,,") == [("%LMQ%a", 0), ("Plain", 3)]
    for bad in ("", ",", ",,", ",%LMQ%a", "%LMQ%a,,Plain", "../x", "%LMQ%a/b", "x" * 128):
        with pytest.raises(InputError, match="INNER_MULTI_DISPATCH names no queue"):
            copy_queues("T", 0, bad)


def _lmq_message(body: str, queues: str | None, **fields: object) -> Message:
    properties = {} if queues is None else {INNER_MULTI_DISPATCH: queues}
    return Message(
        topic=str(fields.pop("topic", "MqttTopic")), body=body.encode(), properties=properties,
        **fields,  # type: ignore[arg-type]
    )  # fmt: skip


def _next_offsets(store_dir: Path) -> dict[str, int]:
    with Store.open_read(store_dir) as store:
        return {name: store.consume_queue(name, 0).max_offset for name in LMQ}


def test_append_gives_each_further_queue_its_next_offset_as_the_broker_does(
    lmq_store: Path,
) -> None:
    """Offsets continue the LMQ queues, in the property's order; a given
    INNER_MULTI_QUEUE_OFFSET is replaced; a second append before any dispatch continues
    after the copies of the records the first one left undispatched; a dispatch then puts
    every copy at its offset and verify finds the store sound."""
    start = _next_offsets(lmq_store)
    stale = _lmq_message("stale", LMQ[1])
    stale.properties[INNER_MULTI_QUEUE_OFFSET] = "0"  # what a producer cannot know
    for _session in range(2):
        with Store.open_write(lmq_store) as store:
            appender = store.appender(multi_dispatch=True)
            appender.append_many(
                [
                    _lmq_message("both", f"{LMQ[0]},{LMQ[2]}"),
                    _lmq_message("one", LMQ[0]),
                    stale,
                    _lmq_message("none", None),
                ]
            )
    with Store.open_read(lmq_store) as store:
        appended = [store.commitlog.read(offset) for offset, *_ in store.commitlog.scan()][-8:]
    offsets = [m.properties.get(INNER_MULTI_QUEUE_OFFSET) for m in appended]
    first, second = (start[LMQ[0]], start[LMQ[2]]), (start[LMQ[0]] + 2, start[LMQ[2]] + 1)
    assert offsets == [
        f"{first[0]},{first[1]}", str(first[0] + 1), str(start[LMQ[1]]), None,
        f"{second[0]},{second[1]}", str(second[0] + 1), str(start[LMQ[1]] + 1), None,
    ]  # fmt: skip
    assert run_cli("dispatch", lmq_store).exit_code == 0
    assert _next_offsets(lmq_store) == {
        LMQ[0]: start[LMQ[0]] + 4,
        LMQ[1]: start[LMQ[1]] + 2,
        LMQ[2]: start[LMQ[2]] + 2,
    }
    with Store.open_read(lmq_store) as store:
        report = verify_store(store)
    assert report.ok, report.counts


@pytest.mark.parametrize(
    "fields",
    [
        {"topic": "%RETRY%group"},  # the broker skips retry topics
        {"properties_extra": {"DELAY": "3"}},  # copies belong to the delivery
        {"topic": "rmq_sys_wheel_timer"},  # a 5.x timer message waiting: so do they
        {"sys_flag": 0x4},  # a prepared half message is in no queue
    ],
    ids=["retry", "delay", "timer", "prepared"],
)
def test_messages_a_broker_gives_no_copies(lmq_store: Path, fields: dict) -> None:
    start = _next_offsets(lmq_store)
    extra = fields.pop("properties_extra", {})
    message = _lmq_message("x", LMQ[0], **fields)
    message.properties.update(extra)
    with Store.open_write(lmq_store) as store:
        (result,) = store.appender(multi_dispatch=True).append_many([message])
    with Store.open_read(lmq_store) as store:
        stored = store.commitlog.read(result.physical_offset)
    assert INNER_MULTI_QUEUE_OFFSET not in stored.properties
    assert stored.properties[INNER_MULTI_DISPATCH] == LMQ[0]
    assert run_cli("dispatch", lmq_store).exit_code == 0
    assert _next_offsets(lmq_store) == start


def _last_lmq_record(store_dir: Path) -> Message:
    with Store.open_read(store_dir) as store:
        records = [store.commitlog.read(offset) for offset, *_ in store.commitlog.scan()]
    return [m for m in records if INNER_MULTI_QUEUE_OFFSET in m.properties][-1]


@pytest.mark.parametrize(
    ("topic", "delay", "stored_topic"),
    [
        ("%RETRY%group", "3", "SCHEDULE_TOPIC_XXXX"),  # a retry waits for its delay level
        ("%RETRY%group", None, "%RETRY%group"),  # then is delivered
        ("rmq_sys_wheel_timer", None, "rmq_sys_wheel_timer"),  # a timer message waiting
    ],
    ids=["retry-waiting", "retry", "timer"],
)
def test_a_resent_lmq_message_keeps_the_originals_offsets_and_gets_no_copies(
    lmq_store: Path, tmp_path: Path, topic: str, delay: str | None, stored_topic: str
) -> None:
    """A 5.x broker resends a message that failed, or waits with it, under another topic with
    the original's properties: INNER_MULTI_QUEUE_OFFSET names the units the original already
    has, and the broker writes no copy of the new record. rmqstore dispatched copies of the
    SCHEDULE_TOPIC_XXXX one: verify called the original's units wrong (cq-unit, exit 1) and
    named dispatch --rebuild, which kept them and left verify saying the same."""
    original = _last_lmq_record(lmq_store)
    properties = {
        name: original.properties[name] for name in (INNER_MULTI_DISPATCH, INNER_MULTI_QUEUE_OFFSET)
    }
    if delay is not None:
        properties["DELAY"] = delay
    message = Message(
        topic=topic, body=original.body, properties=properties | {"RETRY_TOPIC": "MqttTopic"}
    )
    with Store.open_write(lmq_store) as store:
        (result,) = store.appender(multi_dispatch=True).append_many([message])
    stored = _last_lmq_record(lmq_store)
    assert (stored.topic, stored.physical_offset) == (stored_topic, result.physical_offset)
    assert stored.properties[INNER_MULTI_QUEUE_OFFSET] == properties[INNER_MULTI_QUEUE_OFFSET]
    before = _lmq_files(lmq_store)
    assert run_cli("dispatch", lmq_store).exit_code == 0
    assert _lmq_files(lmq_store) == before
    result = run_cli("verify", lmq_store)
    assert result.exit_code == 0, result.stdout
    for copy in _rebuilt_copies(lmq_store, tmp_path):
        assert _lmq_files(copy) == before, copy
    for name in LMQ:
        read = run_cli("read", lmq_store, "--topic", name, "--queue", "0", "--jsonl")
        assert read.exit_code == 0 and read.stderr == "", name


def test_a_49_broker_gives_retried_and_delayed_messages_copies(
    lmq_store: Path, tmp_path: Path
) -> None:
    """A 4.9 broker leaves out no topic: a DELAY message waiting in SCHEDULE_TOPIC_XXXX and a
    message resent to a %RETRY% topic get the next offsets of their LMQ queues (replacing
    those a resent message carries) and their units there, and its records' properties end
    without 0x02 (the lmq scenario is such a store). rmqstore, leaving those topics out for
    every record, wrote the next LMQ message's unit a place too early after a crash: verify
    then found an orphan and a hole."""
    start = _next_offsets(lmq_store)
    original = _last_lmq_record(lmq_store)
    queues = f"{LMQ[0]},{LMQ[2]}"
    retried = {INNER_MULTI_DISPATCH: queues, INNER_MULTI_QUEUE_OFFSET: "0,0", "RETRY_TOPIC": "T"}
    messages = [
        Message(
            topic="MqttTopic",
            body=b"later",
            properties={INNER_MULTI_DISPATCH: queues, "DELAY": "2"},
        ),
        Message(topic="%RETRY%group", body=original.body, properties=retried),
        _lmq_message("next", queues),
    ]
    with Store.open_write(lmq_store) as store:
        appender = store.appender(multi_dispatch=True, trailing_separator=False)
        results = appender.append_many(messages)
    with Store.open_read(lmq_store) as store:
        stored = [store.commitlog.read(result.physical_offset) for result in results]
    assert [m.topic for m in stored] == ["SCHEDULE_TOPIC_XXXX", "%RETRY%group", "MqttTopic"]
    assert [m.properties[INNER_MULTI_QUEUE_OFFSET] for m in stored] == [
        f"{start[LMQ[0]] + number},{start[LMQ[2]] + number}" for number in range(3)
    ]
    assert all(not m.properties_bytes.endswith(b"\x02") for m in stored)
    assert run_cli("dispatch", lmq_store).exit_code == 0
    assert _next_offsets(lmq_store) == start | {
        LMQ[0]: start[LMQ[0]] + 3,
        LMQ[2]: start[LMQ[2]] + 3,
    }
    result = run_cli("verify", lmq_store)
    assert result.exit_code == 0, result.stdout
    before = _lmq_files(lmq_store)
    for copy in _rebuilt_copies(lmq_store, tmp_path):
        assert _lmq_files(copy) == before, copy
    read = run_cli(
        "read",
        lmq_store,
        "--topic",
        LMQ[2],
        "--queue",
        "0",
        "--from",
        str(start[LMQ[2]]),
        "--jsonl",
    )
    assert read.exit_code == 0 and read.stderr == ""
    assert [json.loads(line)["topic"] for line in read.stdout.splitlines()] == [
        m.topic for m in stored
    ]


def test_a_rolled_back_append_gives_its_offsets_again(lmq_store: Path) -> None:
    start = _next_offsets(lmq_store)
    with Store.open_write(lmq_store) as store:
        appender = store.appender(multi_dispatch=True)
        savepoint = appender.savepoint()
        appender.append_many([_lmq_message("undone", LMQ[0])])
        appender.rollback(savepoint)
        (result,) = appender.append_many([_lmq_message("kept", LMQ[0])])
    with Store.open_read(lmq_store) as store:
        stored = store.commitlog.read(result.physical_offset)
    assert stored.properties[INNER_MULTI_QUEUE_OFFSET] == str(start[LMQ[0]])


def test_queue_names_no_folder_can_hold_are_named_by_dispatch_and_verify(tmp_path: Path) -> None:
    """A record naming a further queue such as ``../../evil`` (a broker would write outside
    consumequeue/), or with such a topic of its own: dispatch writes no unit for it and says
    so, and verify reports it (it called the store sound), on one process and on two."""
    from rmqstore.record import encode_record

    store_dir = tmp_path / "s"
    lines = [
        {"topic": "Chat", "body": "a", "properties": {
            INNER_MULTI_DISPATCH: "%LMQ%ok,../../evil", INNER_MULTI_QUEUE_OFFSET: "0,0"}},
        {"topic": "Chat", "body": "b", "properties": {
            INNER_MULTI_DISPATCH: "../../evil", INNER_MULTI_QUEUE_OFFSET: "1"}},
    ]  # fmt: skip
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = run_cli("append", store_dir, "--create", "--input", tmp_path / "in.jsonl")
    assert result.exit_code == 0, result.stderr
    log = sorted((store_dir / "commitlog").iterdir())[0]
    with open(log, "rb") as handle:
        end = len(handle.read(1 << 16).rstrip(b"\0"))  # the records: a few hundred bytes
    with open(log, "r+b") as handle:  # a record with an unsafe topic of its own
        handle.seek(end)
        handle.write(
            encode_record(
                Message(topic="a/b", body=b"x", physical_offset=end, store_timestamp=2**50)
            )
        )
    result = run_cli("dispatch", store_dir, "--json")
    assert result.exit_code == 0, result.stderr
    problems = json.loads(result.stdout)["problems"]
    assert len(problems) == 2 and "'../../evil'" in problems[0] and "'a/b'" in problems[1]
    assert not (tmp_path / "evil").exists() and not (store_dir / "evil").exists()
    assert sorted(p.name for p in (store_dir / "consumequeue").iterdir()) == ["%LMQ%ok", "Chat"]
    for jobs in ("1", "2"):  # a rebuild in one process and in workers says the same
        result = run_cli("dispatch", store_dir, "--rebuild", "--yes", "--jobs", jobs, "--json")
        assert result.exit_code == 0, result.stderr
        problems = json.loads(result.stdout)["problems"]
        assert len(problems) == 2 and "'../../evil'" in problems[0] and "'a/b'" in problems[1]
        queues = sorted(p.name for p in (store_dir / "consumequeue").iterdir())
        assert queues == ["%LMQ%ok", "Chat"] and not (tmp_path / "evil").exists()
    for jobs in ("1", "2"):
        result = run_cli("verify", store_dir, "--json", "--jobs", jobs, "--split-size", "4096")
        assert result.exit_code == 1, result.stderr
        findings = json.loads(result.stdout)["findings"]
        named = [(f["kind"], f["topic"], f["commitLogOffset"]) for f in findings]
        assert named == [("queue-name-unsafe", "../../evil", 0), ("queue-name-unsafe", "a/b", end)]
        assert findings[0]["message"].startswith("2 records of topic '../../evil'")


def test_the_walk_puts_copies_of_kernel_prepared_rows_as_the_reference_way_does(
    tmp_path: Path,
) -> None:
    """The dispatcher's walk puts the LMQ units of rows the kernel prepared after their own
    units, row by row; rows it leaves to the reference way (a DELAY, text that is not ASCII,
    rows before where the index ends) and batches where a copy could share a queue with an own
    unit (a non-LMQ queue named, an LMQ topic's own record) go the reference way. Every
    consume-queue file and the index are the same bytes as a rebuild in worker processes
    (which puts every copy the reference way), over file rolls, and a resumed dispatch adds
    what a removed LMQ queue lacks."""
    import random

    rng = random.Random(11)
    rooms = [f"%LMQ%room-{n}" for n in range(7)]
    lines = []
    for number in range(3000):
        document: dict = {"topic": "Chat", "queueId": number % 3, "body": f"m{number}"}
        named = rng.sample(rooms, rng.randint(1, 3))
        shape = rng.randrange(40)
        if shape == 0:
            document["properties"] = {"DELAY": "2"}
        elif shape == 1:
            document["tags"] = "café"  # not ASCII: the reference way
        elif shape == 2 and number > 2000:
            named.append("PlainCopy")  # a non-LMQ queue: the batch goes the reference way
        elif shape == 3 and number > 2500:
            document["topic"] = rooms[0]  # an LMQ topic's own record
        if shape != 4:
            document.setdefault("properties", {})[INNER_MULTI_DISPATCH] = ",".join(named)
        lines.append(json.dumps(document))
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    store = tmp_path / "walk"
    result = run_cli("append", store, "--create", "--multi-dispatch", "--input",
                     tmp_path / "in.jsonl", "--commitlog-file-size", "65536")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    rebuilt = tmp_path / "rebuilt"
    shutil.copytree(store, rebuilt)
    assert run_cli("dispatch", store).exit_code == 0  # the walk
    result = run_cli("dispatch", rebuilt, "--rebuild", "--yes", "--jobs", "2",
                     "--split-size", "65536")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert tree_digest(store / "consumequeue") == tree_digest(rebuilt / "consumequeue")
    assert len(list((store / "consumequeue").iterdir())) == 10  # Chat, 7 rooms, PlainCopy, SCHEDULE

    def index_digests(root: Path) -> list[str]:  # (files are named by their creation time)
        return [file_digest(path, ignored=8) for path in sorted((root / "index").iterdir())]

    assert index_digests(store) == index_digests(rebuilt)
    room = store / "consumequeue" / rooms[3]
    before = tree_digest(room)
    shutil.rmtree(room)
    result = run_cli("dispatch", store, "--from-offset", "0")
    assert result.exit_code == 0, result.stderr
    assert tree_digest(room) == before
    with Store.open_read(store) as opened:
        report = verify_store(opened)
    # only the LMQ topic's own records, whose offsets the copies into it interleave (no broker
    # writes such records), are not dense
    assert {(f.kind, f.topic) for f in report.findings} == {("queue-offset-gap", rooms[0])}


def test_verify_compares_each_lmq_unit_of_clean_batches(tmp_path: Path) -> None:
    """Records whose only reason for a look is their LMQ units are taken in batches: each
    of their LMQ units is still compared with its record (a unit whose size was changed, or
    that points at the next record, is named, in one process and in ranges)."""
    rooms = [f"%LMQ%r{n}" for n in range(4)]
    lines = [
        json.dumps(
            {
                "topic": "Chat",
                "queueId": number % 2,
                "body": f"message {number}",
                "keys": f"k{number}",
                "properties": {INNER_MULTI_DISPATCH: ",".join(rooms[: 1 + number % 3])},
            }
        )
        for number in range(12000)
    ]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    store = tmp_path / "store"
    result = run_cli("append", store, "--create", "--multi-dispatch", "--dispatch", "--input",
                     tmp_path / "in.jsonl")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    for jobs in ("1", "2"):
        result = run_cli("verify", store, "--json", "--jobs", jobs)
        assert result.exit_code == 0, result.stdout
        assert json.loads(result.stdout)["checked"]["units"] == 12000 + 12000 + 8000 + 4000
    queue_file = store / "consumequeue" / rooms[1] / "0" / "00000000000000000000"
    units = bytearray(queue_file.read_bytes())
    units[5000 * 20 + 8 : 5000 * 20 + 12] = (123).to_bytes(4, "big")  # unit 5000's size
    units[7000 * 20 : 7000 * 20 + 8] = units[7001 * 20 : 7001 * 20 + 8]  # unit 7000's offset
    queue_file.write_bytes(units)
    for jobs in ("1", "2"):
        result = run_cli("verify", store, "--json", "--jobs", jobs)
        assert result.exit_code == 1
        findings = json.loads(result.stdout)["findings"]
        named = sorted((f["kind"], f.get("queueOffset")) for f in findings)
        assert named == [("cq-unit", 5000), ("cq-unit", 7000), ("cq-unit-orphan", 7000)], findings


def test_queue_names_not_utf8_that_decode_alike_go_in_in_log_order(tmp_path: Path) -> None:
    """Two further-queue names that are not UTF-8 but decode to the same text name one queue
    (as rmqstore names it): the kernel gathers their units into runs apart, so the walk puts
    such rows the reference way, unit after unit in log order, as a rebuild in worker
    processes does (the runs put one after the other gave a queue offset the later record);
    the records are long enough for the rebuild's 4 KiB ranges to go to the workers."""
    store = tmp_path / "walk"
    named = (("A", 0), ("B", 1), ("A", 1), ("B", 2), ("A", 2))
    messages = [
        Message(topic="Chat", body=b"x" * 1500, properties={INNER_MULTI_DISPATCH: f"%LMQ%{name}"})
        for name, _ in named
    ]
    for message, (_, offset) in zip(messages, named, strict=True):
        message.properties[INNER_MULTI_QUEUE_OFFSET] = str(offset)
    small = StoreConfig(commitlog_file_size=1 << 20)  # (a 1 GiB file is copied whole)
    with Store.open_write(store, small, create=True) as opened:
        opened.appender().append_many(messages)
    log = store / "commitlog" / "00000000000000000000"
    with log.open("rb") as file:
        data = bytearray(file.read(16384))  # the names' bytes made not UTF-8, same lengths
    data = data.replace(b"%LMQ%A", b"%LMQ%\xff").replace(b"%LMQ%B", b"%LMQ%\xfe")
    with log.open("r+b") as file:
        file.write(data)
    rebuilt = tmp_path / "rebuilt"
    shutil.copytree(store, rebuilt)
    assert run_cli("dispatch", store).exit_code == 0  # the walk
    result = run_cli(
        "dispatch", rebuilt, "--rebuild", "--yes", "--jobs", "2", "--split-size", "4096"
    )
    assert result.exit_code == 0, result.stderr
    queue = store / "consumequeue" / "%LMQ%\ufffd" / "0" / "00000000000000000000"
    units = [UNIT.unpack_from(queue.read_bytes(), n * 20) for n in range(3)]
    record_size = units[1][0]
    # the first record at 0, the second (the \xfe name's offset 1) at 1, the fourth at 2
    assert [unit[0] for unit in units] == [0, record_size, 3 * record_size]
    assert tree_digest(store / "consumequeue") == tree_digest(rebuilt / "consumequeue")


def test_a_comma_at_the_end_of_the_queues_gives_the_units_a_broker_writes(
    lmq_store: Path, tmp_path: Path
) -> None:
    """A producer's ``INNER_MULTI_DISPATCH`` ending in a comma: append gives the two queues
    their offsets (it refused the message), and the walk, a rebuild in worker processes and
    verify all take the units a broker writes for it."""
    start = _next_offsets(lmq_store)
    with Store.open_write(lmq_store) as store:
        (result,) = store.appender(multi_dispatch=True).append_many(
            [_lmq_message("trailing", f"{LMQ[0]},{LMQ[2]},")]
        )
    with Store.open_read(lmq_store) as store:
        stored = store.commitlog.read(result.physical_offset)
    assert stored.properties[INNER_MULTI_QUEUE_OFFSET] == f"{start[LMQ[0]]},{start[LMQ[2]]}"
    rebuilt = tmp_path / "rebuilt"
    shutil.copytree(lmq_store, rebuilt)
    assert run_cli("dispatch", lmq_store).exit_code == 0
    expected = {**start, LMQ[0]: start[LMQ[0]] + 1, LMQ[2]: start[LMQ[2]] + 1}
    assert _next_offsets(lmq_store) == expected
    result = run_cli(
        "dispatch", rebuilt, "--rebuild", "--yes", "--jobs", "2", "--split-size", "4096"
    )
    assert result.exit_code == 0, result.stderr
    assert tree_digest(rebuilt / "consumequeue") == tree_digest(lmq_store / "consumequeue")
    with Store.open_read(lmq_store) as store:
        report = verify_store(store)
    assert report.ok, report.counts


def test_verify_names_a_record_a_brokers_dispatch_stops_at(tmp_path: Path) -> None:
    """A producer's INNER_MULTI_DISPATCH naming a queue that is not an LMQ queue before an
    LMQ one: a 5.x broker gave the first an empty offset, threw at it as it dispatched, and
    retried the record for ever (no later message reached a queue; a crash recovery through
    it failed the broker's start). verify said nothing of it and advised dispatch, which a
    broker's own start was said to do; now it names the record (dispatch-stop, report only),
    with one or two jobs, and dispatch writes the unit before the piece, as the broker did.
    600 messages: the record's file is a batch verify takes as a whole, which the kernel's
    copy_stops sends record by record."""
    lmq_store = tmp_path / "lmq"
    generate("lmq", lmq_store, FixtureOptions(messages=600))
    names = f"{LMQ[0]},Plain,{LMQ[1]}"
    with Store.open_read(lmq_store) as store:
        room = [store.consume_queue(name, 0).max_offset for name in LMQ[:2]]
    stuck = run_cli(
        "append", lmq_store, "--topic", "MqttTopic", "--queue", "0", "--body", "stuck",
        "--property", f"{INNER_MULTI_DISPATCH}={names}",
        "--property", f"{INNER_MULTI_QUEUE_OFFSET}={room[0]},,{room[1]}", "--json",
    )  # fmt: skip
    assert stuck.exit_code == 0, stuck.stderr
    offset = json.loads(stuck.stdout)["messages"][0]["commitLogOffset"]
    assert run_cli("append", lmq_store, "--topic", "MqttTopic", "--body", "after").exit_code == 0
    for jobs in ("1", "2"):
        result = run_cli("verify", lmq_store, "--json", "--jobs", jobs, "--split-size", "4096")
        report = json.loads(result.stdout)
        stops = [f for f in report["findings"] if f["kind"] == "dispatch-stop"]
        assert result.exit_code == 1 and len(stops) == 1, report["findingsByKind"]
        assert stops[0]["commitLogOffset"] == offset and "'Plain'" in stops[0]["message"]
        lags = [f["message"] for f in report["findings"] if f["kind"] == "dispatch-lag"]
        assert lags and all(f"stops at the record at {offset:,}" in lag for lag in lags)
    only_log = json.loads(run_cli("verify", lmq_store, "--json", "--commitlog-only").stdout)
    assert "dispatch-stop" not in only_log["findingsByKind"]  # a check of what dispatch does
    dispatched = run_cli("dispatch", lmq_store, "--json")
    assert dispatched.exit_code == 0  # a warning: the dispatch went on
    said = f"record at {offset}: a broker's dispatch stops here for ever (piece 2"
    assert [said in text for text in json.loads(dispatched.stdout)["problems"]] == [True]
    assert said in dispatched.stderr
    with Store.open_read(lmq_store) as store:
        assert [u.physical_offset for u in store.consume_queue(LMQ[0], 0).units()][-1] == offset
        assert store.consume_queue(LMQ[1], 0).max_offset == room[1]  # after the stop: none
        report = verify_store(store)
    assert report.counts == {"dispatch-stop": 1}, report.counts
    digest = tree_digest(lmq_store / "consumequeue")
    for jobs in ("1", "2"):  # the walk, and worker processes
        rebuilt = run_cli(
            "dispatch", lmq_store, "--rebuild", "--yes", "--jobs", jobs, "--split-size", "4096",
            "--json",
        )  # fmt: skip
        assert rebuilt.exit_code == 0, rebuilt.stderr
        problems = json.loads(rebuilt.stdout)["problems"]
        assert [said in text for text in problems] == [True], problems
        assert tree_digest(lmq_store / "consumequeue") == digest
    again = run_cli(
        "append", lmq_store, "--dispatch", "--topic", "MqttTopic", "--body", "again",
        "--property", f"{INNER_MULTI_DISPATCH}=Plain,{LMQ[2]}",
        "--property", f"{INNER_MULTI_QUEUE_OFFSET}=,0",
    )  # fmt: skip
    assert again.exit_code == 0  # its dispatch's warnings are told, as dispatch tells them
    assert "a broker's dispatch stops here for ever (piece 1 of" in again.stderr


def test_the_kernel_finds_the_rows_a_brokers_dispatch_stops_at() -> None:
    """The kernel's copy_stops (which sends a clean verify batch record by record, to name
    such a record) gives the rows dispatch_stop names, on random properties: blank values,
    signs, longs and beyond, 5.x and 4.9 endings, topics a 5.x broker gives no copies."""
    from rmqstore import kernel
    from rmqstore.kernel import layout

    values = [b"1", b"12", b",", b" ", b"x", b"-1", b"+", b"9223372036854775808", b"\xe3\x80\x80"]
    values += [b"\xc2\xa0", b"\t", b"0"]
    chooser = random.Random(20261204)
    for _ in range(2000):
        count = chooser.randrange(1, 6)
        rows = layout.new_rows(count)
        buf = bytearray()
        expected = []
        for row in range(count):
            topic = chooser.choice(_TOPICS).encode()
            names = b",".join(
                chooser.choices([b"%LMQ%a", b"Q", b"", b" "], k=chooser.randrange(1, 4))
            )
            offsets = b"".join(chooser.choices(values, k=chooser.randrange(1, 5)))
            data = _D + names + b"\x02" + _O + offsets
            if chooser.random() < 0.7:
                data += b"\x02"  # a 5.x record; a 4.9 one ends its last pair without it
            at = row * layout.ROW_WIDTH
            rows[at + layout.TOPIC_AT], rows[at + layout.TOPIC_LENGTH] = len(buf), len(topic)
            buf += topic
            rows[at + layout.PROPERTIES_AT] = len(buf)
            rows[at + layout.PROPERTIES_LENGTH] = len(data)
            buf += data
            if dispatch_stop(topic.decode(), 0, decode_properties(data), data) is not None:
                expected.append(row)
        out = layout.zeroed(count)
        found = kernel.copy_stops(bytes(buf), rows, array("q", range(count)), out)
        assert list(out[:found]) == expected, (buf, rows)
