"""``rmqstore append``: single messages, JSON lines, sync group commit, and bad input that must
leave the store exactly as it was."""

from __future__ import annotations

import base64
import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rmqstore.lockfile import StoreLock

from campaigns import sigint_delivered
from support import ORACLE_OPTIONS, run_cli, stopped_while_the_reader_lags, tree_digest


def new_store(tmp_path: Path) -> Path:
    store = tmp_path / "store"
    result = run_cli(
        "append",
        store,
        "--create",
        "--commitlog-file-size",
        "65536",
        "--topic",
        "TopicTest",
        "--body",
        "first",
        "--tags",
        "TagA",
        "--keys",
        "k1 k2",
    )
    assert result.exit_code == 0, result.stderr
    return store


def read_all(store: Path) -> list[dict]:
    result = run_cli("read", store, "--from-offset", "0", "--jsonl", "--body", "base64")
    assert result.exit_code == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_single_message_and_its_output(tmp_path: Path) -> None:
    store = tmp_path / "store"
    result = run_cli(
        "append",
        store,
        "--create",
        "--commitlog-file-size",
        "65536",
        "--topic",
        "TopicTest",
        "--queue",
        "2",
        "--body",
        "hello",
        "--tags",
        "TagA",
        "--keys",
        "k1 k2",
        "--property",
        "color=red",
        "--flag",
        "7",
        "--json",
    )
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["appended"] == 1
    (appended,) = document["messages"]
    assert appended["commitLogOffset"] == 0 and appended["queueOffset"] == 0
    (stored,) = read_all(store)
    assert stored["msgId"] == appended["msgId"]
    assert stored["storeSize"] == appended["storeSize"]
    assert (stored["topic"], stored["queueId"], stored["flag"]) == ("TopicTest", 2, 7)
    assert base64.b64decode(stored["body"]) == b"hello"
    assert stored["tags"] == "TagA" and stored["keys"] == "k1 k2"
    assert stored["properties"]["color"] == "red"
    assert stored["properties"]["CLUSTER"] == "DefaultCluster"
    assert len(stored["uniqKey"]) == 32


def test_body_file(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    payload = bytes(range(256)) * 3
    (tmp_path / "body.bin").write_bytes(payload)
    result = run_cli("append", store, "--topic", "Bin", "--body-file", tmp_path / "body.bin")
    assert result.exit_code == 0, result.stderr
    assert base64.b64decode(read_all(store)[-1]["body"]) == payload


def test_json_lines_input_with_every_field(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    lines = [
        {
            "topic": "Orders",
            "queueId": 1,
            "tags": "paid",
            "keys": "o-1",
            "properties": {"region": "eu"},
            "body": "one",
            "flag": 3,
            "bornTimestamp": 1700000000000,
            "bornHost": "[2001:db8::5]:4000",
            "reconsumeTimes": 2,
        },
        {"topic": "Orders", "queueId": 1, "bodyBase64": base64.b64encode(b"\x00\xff").decode()},
        {"topic": "Orders", "queueId": 1, "transaction": "prepared"},
        {
            "topic": "Orders",
            "queueId": 1,
            "transaction": "commit",
            "preparedTransactionOffset": 123,
        },
    ]
    (tmp_path / "in.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    result = run_cli("append", store, "--input", tmp_path / "in.jsonl", "--jsonl")
    assert result.exit_code == 0, result.stderr
    printed = [json.loads(line) for line in result.stdout.splitlines()]
    assert [p["queueOffset"] for p in printed] == [0, 1, 0, 2]
    stored = read_all(store)[1:]
    assert stored[0]["bornHost"] == "[2001:db8::5]:4000" and stored[0]["sysFlag"] == 0x10
    assert stored[0]["bornTimestamp"] == 1700000000000
    assert stored[0]["properties"]["region"] == "eu" and stored[0]["reconsumeTimes"] == 2
    assert base64.b64decode(stored[1]["body"]) == b"\x00\xff"
    assert stored[2]["sysFlag"] & 0xC == 0x4 and stored[2]["queueOffset"] == 0
    assert stored[3]["preparedTransactionOffset"] == 123


def test_stdin_input(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    text = "".join(json.dumps({"topic": "S", "body": f"m{i}"}) + "\n" for i in range(50))
    result = run_cli("append", store, "--input", "-", "--flush", "sync", input=text)
    assert result.exit_code == 0, result.stderr
    assert len(read_all(store)) == 51


def buffered_env() -> dict[str, str]:
    """The environment without PYTHONUNBUFFERED: stdout on a pipe is block-buffered, as for a
    user's shell (an unbuffered test environment would hide acknowledgements left in it)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}


def test_sync_flush_acknowledges_each_line_before_the_next_arrives(tmp_path: Path) -> None:
    """A producer that waits for each acknowledgement: group commit must not wait for more,
    and the acknowledgements must not wait in stdout's buffer."""
    store = new_store(tmp_path)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rmqstore",
            "append",
            str(store),
            "--input",
            "-",
            "--flush",
            "sync",
            "--jsonl",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=buffered_env(),
    )
    assert process.stdin is not None and process.stdout is not None
    try:
        for index in range(3):
            process.stdin.write(json.dumps({"topic": "Ack", "body": str(index)}) + "\n")
            process.stdin.flush()
            ready, _, _ = select.select([process.stdout], [], [], 30)
            assert ready, f"no acknowledgement of message {index} within 30 s"
            acknowledged = json.loads(process.stdout.readline())
            assert acknowledged["queueOffset"] == index
        process.stdin.close()
        assert process.wait(timeout=60) == 0
    finally:
        process.kill()
        process.wait()


def bad_case(tmp_path: Path, store: Path, name: str) -> list[str]:
    if name == "traversal topic":
        return ["--topic", "../x", "--body", "b"]
    if name == "long topic":
        return ["--topic", "T" * 128, "--body", "b"]
    if name == "bad characters":
        return ["--topic", "a b", "--body", "b"]
    if name == "body over the limit":
        (tmp_path / "broker.conf").write_text("maxMessageSize=16\n")
        return ["--topic", "T", "--body", "x" * 17, "--broker-config", tmp_path / "broker.conf"]
    if name == "traversal lmq queue":
        lines = [
            '{"topic": "T", "properties": {"INNER_MULTI_DISPATCH": "%LMQ%a"}}',
            '{"topic": "T", "properties": {"INNER_MULTI_DISPATCH": "%LMQ%a,../x"}}',
        ]
        (tmp_path / "in.jsonl").write_text("\n".join(lines * 3) + "\n")
        return ["--multi-dispatch", "--input", tmp_path / "in.jsonl"]
    lines = {
        "malformed json": ['{"topic": "T", "body": "a"}', "{not json"],
        "unknown field": ['{"topic": "T", "body": "a"}', '{"topic": "T", "bodi": "b"}'],
        "wrong type": ['{"topic": "T", "queueId": "1"}'],
        "bad base64": ['{"topic": "T", "bodyBase64": "@@@"}'],
        "missing topic": ['{"body": "a"}'],
    }[name]
    (tmp_path / "in.jsonl").write_text("\n".join(lines * 3) + "\n")
    return ["--input", tmp_path / "in.jsonl"]


@pytest.mark.parametrize("flush", ["async", "sync"])
@pytest.mark.parametrize(
    "name",
    [
        "traversal topic",
        "long topic",
        "bad characters",
        "body over the limit",
        "malformed json",
        "unknown field",
        "wrong type",
        "bad base64",
        "missing topic",
        "traversal lmq queue",
    ],
)
def test_bad_input_is_one_line_and_leaves_the_store_as_it_was(
    tmp_path: Path, name: str, flush: str
) -> None:
    store = new_store(tmp_path)
    before = tree_digest(store)
    result = run_cli("append", store, *bad_case(tmp_path, store, name), "--flush", flush)
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith("rmqstore: error: ")
    assert len(result.stderr.strip().splitlines()) == 1
    assert tree_digest(store) == before


def test_a_held_lock_is_exit_3_and_changes_nothing(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    before = tree_digest(store)
    lock = StoreLock(store / "lock")
    lock.acquire()
    try:
        result = run_cli("append", store, "--topic", "T", "--body", "x")
    finally:
        lock.release()
    assert result.exit_code == 3
    assert "locked" in result.stderr
    assert tree_digest(store) == before


def test_stdin_failure_rolls_back_everything_in_async_mode(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    before = tree_digest(store)
    good = json.dumps({"topic": "T", "body": "ok"}) + "\n"
    # no interval flush while the input is read (on a loaded machine reading 9,000 lines took
    # longer than the default 500 ms, and the messages a flush covered were reported)
    result = run_cli(
        "append",
        store,
        "--input",
        "-",
        "--jsonl",
        "--flush",
        "async",
        "--flush-interval",
        "600000",
        "--flush-thorough-interval",
        "600000",
        input=good * 9000 + "garbage\n",
    )
    assert result.exit_code == 2
    assert result.stdout == ""  # nothing is reported before the whole input is stored
    assert "unreported messages appended before it were rolled back" in result.stderr
    assert "the store is unchanged" in result.stderr
    assert tree_digest(store) == before


def test_missing_store_and_non_store(tmp_path: Path) -> None:
    result = run_cli("append", tmp_path / "nope", "--topic", "T", "--body", "x")
    assert result.exit_code == 2 and "--create" in result.stderr
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "file").write_text("x")
    result = run_cli("append", tmp_path / "dir", "--create", "--topic", "T", "--body", "x")
    assert result.exit_code == 2 and "not empty" in result.stderr


def test_a_broker_ip_that_is_a_name_is_refused_unless_a_store_host_is_given(
    tmp_path: Path,
) -> None:
    """A broker looks brokerIP1 up when it starts; rmqstore does not guess what it found."""
    store = new_store(tmp_path)
    before = tree_digest(store)
    (tmp_path / "broker.conf").write_text("brokerIP1=broker-a.example\nlistenPort=10921\n")
    config = ["--broker-config", tmp_path / "broker.conf"]
    refused = run_cli("append", store, *config, "--topic", "T", "--body", "x")
    assert refused.exit_code == 2 and "give --store-host ADDRESS:PORT" in refused.stderr
    assert "'broker-a.example:10921' is not an IP address" in refused.stderr
    assert tree_digest(store) == before
    given = run_cli("append", store, *config, "--topic", "T", "--body", "x",
                    "--store-host", "10.0.0.7:10921", "--jsonl")  # fmt: skip
    assert given.exit_code == 0, given.stderr
    assert run_cli("read", store, "--from-offset", "0", "--jsonl").stdout.count("10.0.0.7") == 1


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"properties": {"INNER_NUM": "x", "INNER_BASE": "7"}}, "INNER_NUM='x' with INNER_BASE"),
        ({"properties": {"INNER_NUM": "40000", "INNER_BASE": "7"}}, "a Java short and long"),
        (
            {
                "topic": "SCHEDULE_TOPIC_XXXX",
                "properties": {"DELAY": "x"},
                "transaction": "prepared",
            },
            "DELAY='x' in a message to SCHEDULE_TOPIC_XXXX is not a number",
        ),
    ],
)
def test_records_a_broker_would_find_invalid_are_refused(
    tmp_path: Path, given: dict, said: str
) -> None:
    """A 5.x broker parses INNER_NUM and INNER_BASE of every record holding both, and every
    broker the DELAY of a SCHEDULE_TOPIC_XXXX record: one that does not parse is an invalid
    record to it, which its recovery cuts with all after it (these were written)."""
    store = new_store(tmp_path)
    before = tree_digest(store)
    line = json.dumps({"topic": "T", "body": "b", **given})
    for run in (["--input", "-"], ["--input", "-", "--jsonl"]):
        refused = run_cli("append", store, *run, input=line + "\n")
        assert refused.exit_code == 2 and said in refused.stderr, refused.stderr
    assert tree_digest(store) == before
    fine = {"INNER_NUM": "3", "INNER_BASE": "-9223372036854775808"}
    line = json.dumps({"topic": "T", "body": "b", "properties": fine})
    assert run_cli("append", store, "--input", "-", input=line + "\n").exit_code == 0


def test_a_store_whose_broker_requires_dup_info_is_left_to_the_broker(tmp_path: Path) -> None:
    """5.x duplicationEnable=true: the broker's recovery takes a record without DUP_INFO for
    an invalid one. rmqstore neither writes DUP_INFO nor ends the log by that rule, so its
    writers refuse the store (append wrote records such a broker cut), and verify says so."""
    store = new_store(tmp_path)
    (tmp_path / "broker.conf").write_text("duplicationEnable=true\n")
    config = ["--broker-config", tmp_path / "broker.conf"]
    (store / "abort").write_bytes(b"")  # a crash: recover would have work
    before = tree_digest(store)
    for command in (["append", "--topic", "T", "--body", "x"], ["recover", "--yes"],
                    ["dispatch"], ["dispatch", "--rebuild", "--yes"], ["flush"]):  # fmt: skip
        refused = run_cli(command[0], store, *config, *command[1:])
        assert refused.exit_code == 2 and "duplicationEnable=true" in refused.stderr, command
    assert tree_digest(store) == before
    verified = run_cli("verify", store, *config)
    assert "store-dup-info" in verified.stdout
    assert "start its broker" in verified.stdout and "requires DUP_INFO" in verified.stdout


def test_record_version_v1_refuses_long_retry_topics(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    topic = "%RETRY%" + "g" * 140
    assert (
        run_cli(
            "append", store, "--topic", topic, "--body", "x", "--record-version", "v1"
        ).exit_code
        == 2
    )
    assert run_cli("append", store, "--topic", topic, "--body", "x").exit_code == 0
    assert read_all(store)[-1]["version"] == "V2"


def test_usage_errors(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    assert run_cli("append", store, "--topic", "T").exit_code == 2
    assert run_cli("append", store, "--topic", "T", "--body", "a", "--input", "-").exit_code == 2
    assert (
        run_cli("append", store, "--topic", "T", "--body", "a", "--property", "novalue").exit_code
        == 2
    )


@pytest.mark.parametrize("store_host", ["10.0.0.1:10911", "[2001:db8::7]:10911"])
def test_report_lines_read_back_are_what_each_result_says(tmp_path: Path, store_host: str) -> None:
    """The lines append prints (read back from the records, compiled kernel or reference)
    equal the JSON document of each AppendResult and its UNIQ_KEY, and the plain line, for
    keys the compiled kernel writes itself and keys it leaves to the reference (quotes,
    backslashes, control characters, non-ASCII), generated keys and none."""
    from rmqstore.commands.append import result_document
    from rmqstore.commands.output import json_text
    from rmqstore.config import StoreConfig
    from rmqstore.hosts import parse_host
    from rmqstore.kernel.layout import LINES_JSONL, LINES_PLAIN
    from rmqstore.msgid import UniqKeyGenerator
    from rmqstore.record import Message
    from rmqstore.store import Store

    keys = [None, "plain-KEY_1", 'q"uote', "back\\slash", "tab\there", "\x7f", "été", "标签"]
    with Store.open_write(
        tmp_path / "s", StoreConfig(commitlog_file_size=4096), create=True
    ) as store:
        appender = store.appender(uniq_keys=UniqKeyGenerator(), store_host=parse_host(store_host))
        start = appender.end_offset
        messages = []
        for number in range(60):  # rolls over several 4 KiB files (BLANKs in the range)
            key = keys[number % len(keys)]
            properties = {} if key is None else {"UNIQ_KEY": key}
            topic = ("%RETRY%" + "g" * 130) if number % 7 == 0 else f"T{number % 3}"
            messages.append(
                Message(topic=topic, body=b"x" * 90, queue_id=number % 2, properties=properties)
            )
        results = appender.append_many(messages)
        appender.flush()
        end = appender.end_offset
        stored = store.commitlog.uniq_keys(start, end)
        blocks = {
            style: b"".join(block for block, _ in store.commitlog.result_lines(start, end, style))
            for style in (LINES_JSONL, LINES_PLAIN)
        }
    jsonl = [
        json_text(result_document(result, stored[result.physical_offset])) for result in results
    ]
    assert blocks[LINES_JSONL].decode().splitlines() == jsonl
    plain = [
        f"{r.msg_id}  offset={r.physical_offset}  queue={r.topic}:{r.queue_id}  "
        f"queueOffset={r.queue_offset}  size={r.store_size}"
        + ("" if stored[r.physical_offset] is None else f"  uniqKey={stored[r.physical_offset]}")
        for r in results
    ]
    assert blocks[LINES_PLAIN].decode().split("\n")[:-1] == plain
    assert len({stored[r.physical_offset] for r in results}) > 8  # generated keys too


def clean_store(tmp_path: Path) -> Path:
    """A store closed cleanly: its messages dispatched, no ``abort``."""
    store = new_store(tmp_path)
    assert run_cli("dispatch", store).exit_code == 0
    assert not (store / "abort").exists()
    return store


@pytest.mark.parametrize("flush", ["async", "sync"])
def test_a_closed_stdout_keeps_what_was_reported_and_is_not_success(
    tmp_path: Path, flush: str
) -> None:
    """``append --input f --jsonl | head -1``: the message head printed is in the store, and
    the writer that could not report the rest does not exit 0."""
    store = clean_store(tmp_path)
    lines = tmp_path / "in.jsonl"
    lines.write_text(
        "".join(json.dumps({"topic": "P", "body": f"m{n}"}) + "\n" for n in range(3000))
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "rmqstore", "append", str(store), "--input", str(lines), "--jsonl",
         "--flush", flush],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=buffered_env(),
    )  # fmt: skip
    assert process.stdout is not None and process.stderr is not None
    first = json.loads(process.stdout.readline())
    process.stdout.close()  # what head does after its line
    error = process.stderr.read().decode()
    code = process.wait(timeout=120)
    assert code == 4, error
    assert "standard output was closed" in error and "Traceback" not in error
    stored = read_all(store)
    assert first["commitLogOffset"] in {m["commitLogOffset"] for m in stored}
    assert next(m["body"] for m in stored if m["topic"] == "P") == base64.b64encode(b"m0").decode()
    # what was stored stays, and the store is sound for the next writer
    assert run_cli("append", store, "--topic", "P", "--body", "next").exit_code == 0


def test_a_failed_append_leaves_a_clean_store_exactly_as_it_was(tmp_path: Path) -> None:
    store = clean_store(tmp_path)
    before = tree_digest(store)
    lines = tmp_path / "in.jsonl"
    good = json.dumps({"topic": "T", "body": "ok"}) + "\n"
    lines.write_text(good * 300 + json.dumps({"topic": "bad.topic", "body": "x"}) + "\n")
    result = run_cli("append", store, "--input", lines, "--jsonl")
    assert result.exit_code == 2
    assert "the store is unchanged" in result.stderr
    assert result.stdout == ""
    assert not (store / "abort").exists()
    assert tree_digest(store) == before
    assert run_cli("verify", store).exit_code == 0


def test_a_failed_create_leaves_nothing_behind(tmp_path: Path) -> None:
    missing = tmp_path / "new"
    result = run_cli("append", missing, "--create", "--topic", "bad.topic", "--body", "x")
    assert result.exit_code == 2, result.stderr
    assert not missing.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run_cli("append", empty, "--create", "--topic", "bad.topic", "--body", "x")
    assert result.exit_code == 2, result.stderr
    assert list(empty.iterdir()) == []


def test_queue_offsets_come_from_the_consume_queues_not_a_scan_that_stops(
    tmp_path: Path,
) -> None:
    """One corrupt record in the first file: the next message still gets the queue offset
    after the 200 already queued (the broker's recoverTopicQueueTable), not 2. (Without
    --dispatch the append is refused: the 'abort' it left would make a broker's crash
    recovery walk the first file and cut the log at the corrupt record.)"""
    store = tmp_path / "store"
    lines = tmp_path / "in.jsonl"
    lines.write_text((json.dumps({"topic": "Q", "body": "x" * 100}) + "\n") * 200)
    created = run_cli(
        "append", store, "--create", "--commitlog-file-size", "8192", "--input", lines,
        "--dispatch", "--jsonl",
    )  # fmt: skip
    assert created.exit_code == 0, created.stderr
    assert len(list((store / "commitlog").iterdir())) >= 3
    third = json.loads(created.stdout.splitlines()[2])
    segment = store / "commitlog" / "00000000000000000000"
    with open(segment, "r+b") as handle:  # break the magic code of the third record
        handle.seek(third["commitLogOffset"] + 4)
        handle.write(b"\x00\x00\x00\x01")
    refused = run_cli("append", store, "--topic", "Q", "--body", "next", "--jsonl")
    assert refused.exit_code == 2 and "at offset 514 (MAGICCODE" in refused.stderr
    result = run_cli("append", store, "--topic", "Q", "--body", "next", "--jsonl", "--dispatch")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["queueOffset"] == 200


def refused_until_rebuilt(
    store: Path, topic: str, said: list[str], then_offset: int, queues: tuple[str, ...]
) -> None:
    """Appending to each of ``queues`` of ``topic`` (the first the damaged one, with
    --dispatch; the others without) is refused saying each of ``said``, the store unchanged;
    after dispatch --rebuild a message to the first takes queue offset ``then_offset`` and
    verify finds the store sound."""
    before = tree_digest(store)
    for queue in queues:
        dispatch = ["--dispatch"] if queue == queues[0] else []
        refused = run_cli("append", store, "--topic", topic, "--queue", queue, "--body", "x",
                          *dispatch)  # fmt: skip
        assert refused.exit_code == 2, refused.stderr
        told = " ".join(refused.stderr.split())
        assert all(phrase in told for phrase in said), refused.stderr
    assert tree_digest(store) == before
    rebuilt = run_cli("dispatch", store, "--rebuild", "--yes")
    assert rebuilt.exit_code == 0, rebuilt.stderr
    result = run_cli("append", store, "--topic", topic, "--queue", queues[0], "--body", "x",
                     "--dispatch", "--jsonl")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["queueOffset"] == then_offset
    assert json.loads(run_cli("verify", store, "--json").stdout)["ok"]


def test_a_store_with_a_dispatch_hole_is_refused_until_rebuilt(tmp_path: Path) -> None:
    """A consume queue that lost its last units while another queue reaches past them: the
    queue's next record to dispatch carries queue offset 12 while the queue ends at 10. The
    message appended to it took queue offset 11, which a stored message already has (and a
    rebuild then drops the appended one as a repeat). Refused, the store unchanged, until
    dispatch --rebuild; then the message takes 13."""
    from rmqstore.fixtures import generate

    store = tmp_path / "store"
    generate("cq-truncated", store)
    said = [
        "records of Orders-EU_west:2 are missing from its consume queue: the next one to "
        "dispatch has queue offset 12, but the queue ends at 10"
    ]
    refused_until_rebuilt(store, "Orders-EU_west", said, 13, queues=("2", "0"))


@pytest.mark.parametrize("loss", ["deleted", "emptied"])
def test_a_queue_whose_files_were_lost_is_refused_until_rebuilt(tmp_path: Path, loss: str) -> None:
    """A queue's only consume-queue file deleted, or emptied (a 5.x broker deletes an empty
    last file as it loads), while the commit log holds the queue's 44 records, all before
    where the other queues end: the queue looked new, and the message appended to it took
    queue offset 0, which a stored message has, so verify then found nothing a command could
    mend (before, dispatch --rebuild mended it). Refused, the store unchanged, whichever
    queue is appended to; after dispatch --rebuild the message takes 44."""
    from rmqstore.fixtures import generate

    store = tmp_path / "store"
    generate("multi", store)
    only_file = store / "consumequeue" / "TopicTest" / "1" / f"{0:020d}"
    if loss == "deleted":
        only_file.unlink()
    else:
        only_file.write_bytes(b"")
    said = [
        "the consume queue of TopicTest:1 holds no unit, but the commit log holds its "
        "records (one at offset 7047, queue offset 0)"
    ]
    refused_until_rebuilt(store, "TopicTest", said, 44, queues=("1", "2"))


@pytest.mark.parametrize("then", ["its own units", "junk, then its own units"])
def test_a_queue_with_a_unit_overwritten_in_its_middle_is_refused_until_rebuilt(
    tmp_path: Path, then: str
) -> None:
    """A unit in the middle of TopicTest:1 (20 of its 44) with its size overwritten by 0: a
    broker's walk, and rmqstore's, ends the queue there, so the message appended took queue
    offset 20, which a stored message has, and verify then found damage no command mends
    (found by the append fuzzer on a 4.9.8 store, seed 33). The units after it point at the
    queue's own records (after one of junk, pointing at another queue's record, in the
    second case): refused, the store unchanged, whichever queue is appended to; after
    dispatch --rebuild the message takes 44."""
    from rmqstore.fixtures import generate

    store = tmp_path / "store"
    generate("multi", store)
    queue_file = store / "consumequeue" / "TopicTest" / "1" / f"{0:020d}"
    with open(queue_file, "r+b") as units:
        units.seek(20 * 20 + 8)
        units.write(bytes(4))
        if then != "its own units":
            units.seek(21 * 20)
            units.write((0).to_bytes(8, "big") + (223).to_bytes(4, "big") + bytes(8))
    own = 21 if then == "its own units" else 22
    said = [
        "the consume queue of TopicTest:1 ends at queue offset 20",
        f"unit {own} points at the record at offset",
        "run rmqstore dispatch --rebuild --yes first",
    ]
    refused_until_rebuilt(store, "TopicTest", said, 44, queues=("1", "2"))


@pytest.mark.parametrize("points_at", ["past the log", "another queue's record"])
def test_stale_units_after_a_queues_end_do_not_stop_an_append(
    tmp_path: Path, points_at: str
) -> None:
    """A broker's recovery leaves units after a queue's new end (pointing at where the log
    then ended, or past it; records written since may lie there): they are not the queue's
    own records, so appending goes on and the message takes the queue's next offset."""
    store = new_store(tmp_path)
    for topic in ("A", "B"):
        made = run_cli("append", store, "--topic", topic, "--body", "b", "--dispatch")
        assert made.exit_code == 0, made.stderr
    other = json.loads(run_cli("read", store, "--topic", "B", "--json").stdout)[0]
    offset, size = (
        (1 << 30, 200)
        if points_at == "past the log"
        else (other["commitLogOffset"], other["storeSize"])
    )
    (queue_file,) = (store / "consumequeue" / "A" / "0").iterdir()
    with open(queue_file, "r+b") as units:
        units.seek(2 * 20)  # one zero unit after the end, then the stale one
        units.write(offset.to_bytes(8, "big") + size.to_bytes(4, "big") + bytes(8))
    result = run_cli("append", store, "--topic", "A", "--body", "next", "--dispatch", "--jsonl")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["queueOffset"] == 1


def test_a_queue_a_recovery_emptied_takes_messages_from_queue_offset_0(tmp_path: Path) -> None:
    """A recovery deletes the consume-queue files whose units all point past the log's valid
    end, as a broker's does: a new queue whose only record was the torn one is left a folder
    without files, and the log holds none of its records. Appending to it is no loss of
    files: the message takes queue offset 0, and the store is sound."""
    store = new_store(tmp_path)
    torn = run_cli("append", store, "--topic", "New", "--body", "b" * 64, "--dispatch", "--jsonl")
    assert torn.exit_code == 0, torn.stderr
    record = json.loads(torn.stdout)
    with open(store / "commitlog" / f"{0:020d}", "r+b") as log:  # its body and after: zeros
        log.seek(record["commitLogOffset"] + 20)
        log.write(bytes(record["storeSize"] - 20))
    (store / "abort").touch()
    recovered = run_cli("recover", store, "--yes")
    assert recovered.exit_code == 0, recovered.stderr
    assert list((store / "consumequeue" / "New" / "0").iterdir()) == []
    result = run_cli("append", store, "--topic", "New", "--body", "again", "--dispatch", "--jsonl")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["queueOffset"] == 0
    assert json.loads(run_cli("verify", store, "--json").stdout)["ok"]


def test_a_log_that_cannot_be_read_to_its_end_is_refused(tmp_path: Path) -> None:
    """Without consume queues the offsets come from the whole log; a corrupt record before
    the valid end makes them unknowable, and the append is refused with nothing changed."""
    store = tmp_path / "store"
    lines = tmp_path / "in.jsonl"
    lines.write_text((json.dumps({"topic": "Q", "body": "x" * 100}) + "\n") * 200)
    created = run_cli(
        "append", store, "--create", "--commitlog-file-size", "8192", "--input", lines, "--jsonl"
    )
    assert created.exit_code == 0, created.stderr
    (store / "abort").unlink()
    third = json.loads(created.stdout.splitlines()[2])
    with open(store / "commitlog" / "00000000000000000000", "r+b") as handle:
        handle.seek(third["commitLogOffset"] + 4)
        handle.write(b"\x00\x00\x00\x01")
    before = tree_digest(store)
    result = run_cli("append", store, "--topic", "Q", "--body", "next")
    assert result.exit_code == 2
    assert "cannot be read" in result.stderr and "next queue offsets are unknown" in result.stderr
    assert tree_digest(store) == before


@pytest.mark.parametrize(
    "line",
    [
        '{"topic": "T", "body": "\\ud800"}',
        '{"topic": "T", "tags": "\\udfff", "body": "x"}',
        '{"topic": "T", "properties": {"k": "\\ud834"}, "body": "x"}',
    ],
)
def test_text_that_is_not_unicode_is_an_input_error(tmp_path: Path, line: str) -> None:
    store = clean_store(tmp_path)
    before = tree_digest(store)
    lines = tmp_path / "in.jsonl"
    lines.write_text('{"topic": "T", "body": "fine"}\n' + line + "\n")
    result = run_cli("append", store, "--input", lines)
    assert result.exit_code == 2, result.stderr
    # refused by the text check, or already by orjson's parser (a lone surrogate)
    assert "is not valid text" in result.stderr or "surrogate" in result.stderr
    assert result.stderr.count("\n") == 1
    assert tree_digest(store) == before


def test_bytes_from_the_shell_that_are_not_utf8(tmp_path: Path) -> None:
    """A body keeps the bytes it was given; tags, keys and properties must be text."""
    store = clean_store(tmp_path)
    base = [sys.executable.encode(), b"-m", b"rmqstore", b"append", bytes(store)]
    body = subprocess.run(
        [*base, b"--topic", b"T", b"--body", b"caf\xe9", b"--json"], capture_output=True
    )
    assert body.returncode == 0, body.stderr
    offset = json.loads(body.stdout)["messages"][0]["commitLogOffset"]
    read = run_cli("read", store, "--offset", str(offset), "--json", "--body", "hex")
    assert json.loads(read.stdout)["body"] == "636166E9"
    for option in (b"--tags", b"--keys", b"--property"):
        value = b"k=\xff" if option == b"--property" else b"\xff"
        bad = subprocess.run(
            [*base, b"--topic", b"T", b"--body", b"x", option, value], capture_output=True
        )
        assert bad.returncode == 2, bad.stderr
        assert b"not valid text" in bad.stderr and b"Traceback" not in bad.stderr


def test_bodies_over_a_size_are_compressed_as_a_producer_does(tmp_path: Path) -> None:
    import zlib

    store = tmp_path / "store"
    lines = tmp_path / "in.jsonl"
    big, small = "b" * 5000, "s" * 10
    lines.write_text(
        json.dumps({"topic": "T", "body": big})
        + "\n"
        + json.dumps({"topic": "T", "body": small})
        + "\n"
    )
    result = run_cli(
        "append", store, "--create", "--input", lines, "--compress-over", "4096", "--json",
        "--dispatch",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    first, second = (m["commitLogOffset"] for m in json.loads(result.stdout)["messages"])
    stored = json.loads(
        run_cli("read", store, "--offset", str(first), "--json", "--body", "base64").stdout
    )
    assert stored["sysFlag"] & 0x1 and stored["sysFlag"] & 0x700 == 0x300
    assert zlib.decompress(base64.b64decode(stored["body"])) == big.encode()
    restored = json.loads(
        run_cli("read", store, "--offset", str(first), "--decompress", "--json").stdout
    )
    assert restored["body"] == big
    plain = json.loads(run_cli("read", store, "--offset", str(second), "--json").stdout)
    assert plain["sysFlag"] & 0x1 == 0 and plain["body"] == small
    assert run_cli("verify", store).exit_code == 0


def test_each_reported_message_carries_the_uniq_key_it_was_stored_with(tmp_path: Path) -> None:
    store = tmp_path / "store"
    lines = "".join(
        json.dumps({"topic": "T", "body": f"m{n}", **({"keys": "k"} if n % 3 else {})}) + "\n"
        for n in range(5000)
    )
    given = json.dumps({"topic": "T", "body": "own", "properties": {"UNIQ_KEY": "OWN-KEY"}})
    result = run_cli(
        "append", store, "--create", "--input", "-", "--jsonl", "--commitlog-file-size", "65536",
        input=lines + given + "\n",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    reported = [json.loads(line) for line in result.stdout.splitlines()]
    read = run_cli("read", store, "--from-offset", "0", "--jsonl", "--body", "none")
    stored = [json.loads(line) for line in read.stdout.splitlines()]
    assert len(reported) == len(stored) == 5001
    assert [r["uniqKey"] for r in reported] == [s["uniqKey"] for s in stored]
    assert reported[-1]["uniqKey"] == "OWN-KEY"
    assert len({r["uniqKey"] for r in reported}) == 5001


def test_append_lists_new_topics_and_queues_in_topics_json(tmp_path: Path) -> None:
    """A broker serves a topic's queues only when config/topics.json lists it, and balances
    consumers over readQueueNums queues: append left a new topic (or a queue past the count)
    out, so a broker started on the store refused to serve it. Now the topic is added with
    default options, or its queue counts raised; every other field stays as it was, the old
    content goes to topics.json.bak, and a file that does not parse is left alone."""
    from rmqstore.fixtures import generate

    store = tmp_path / "store"
    generate("basic", store)
    topics = store / "config" / "topics.json"
    original = json.loads(topics.read_text())
    original["topicConfigTable"]["BasicTopic"]["attributes"] = {"+message.type": "NORMAL"}
    topics.write_text(json.dumps(original))  # a 5.x field rmqstore does not write
    before = topics.read_bytes()

    result = run_cli("append", store, "--topic", "BasicTopic", "--body", "known")
    assert result.exit_code == 0, result.stderr
    assert topics.read_bytes() == before and not (store / "config" / "topics.json.bak").exists()

    result = run_cli("append", store, "--topic", "NewTopic", "--queue", "3", "--body", "x")
    assert result.exit_code == 0, result.stderr
    assert "added topic NewTopic (4 queues) to" in result.stderr
    after = json.loads(topics.read_text())
    assert (store / "config" / "topics.json.bak").read_bytes() == before
    assert after["topicConfigTable"]["BasicTopic"] == original["topicConfigTable"]["BasicTopic"]
    assert after["topicConfigTable"]["NewTopic"] == {
        "order": False, "perm": 6, "readQueueNums": 4, "topicFilterType": "SINGLE_TAG",
        "topicName": "NewTopic", "topicSysFlag": 0, "writeQueueNums": 4,
    }  # fmt: skip
    assert after["dataVersion"]["counter"] == original["dataVersion"]["counter"] + 1

    result = run_cli("append", store, "--topic", "BasicTopic", "--queue", "1", "--body", "y")
    assert result.exit_code == 0, result.stderr
    widened = json.loads(topics.read_text())["topicConfigTable"]["BasicTopic"]
    assert (widened["readQueueNums"], widened["writeQueueNums"]) == (2, 2)
    assert widened["attributes"] == {"+message.type": "NORMAL"}

    # a DELAY message goes to SCHEDULE_TOPIC_XXXX, which a broker makes itself with a queue
    # per level: an entry for the one level used would shrink it when the broker loads it
    # (the topic it is delivered to later, REAL_TOPIC, is listed)
    listed = topics.read_bytes()
    result = run_cli(
        "append", store, "--topic", "BasicTopic", "--property", "DELAY=3", "--body", "later"
    )
    assert result.exit_code == 0, result.stderr
    assert topics.read_bytes() == listed
    result = run_cli(
        "append", store, "--topic", "Later", "--queue", "1", "--property", "DELAY=3",
        "--body", "later",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    table = json.loads(topics.read_text())["topicConfigTable"]
    assert "SCHEDULE_TOPIC_XXXX" not in table and table["Later"]["readQueueNums"] == 2

    # links: a topics.json.bak one is replaced, never written through; a topics.json one
    # (its target may be shared, or outside the store) is left alone
    outside = tmp_path / "outside"
    outside.write_text("kept")
    backup = store / "config" / "topics.json.bak"
    backup.unlink()
    backup.symlink_to(outside)
    result = run_cli("append", store, "--topic", "Fourth", "--body", "z")
    assert result.exit_code == 0, result.stderr
    assert outside.read_text() == "kept" and not backup.is_symlink()
    assert "Fourth" in json.loads(topics.read_text())["topicConfigTable"]
    kept = topics.read_text()
    topics.unlink()
    topics.symlink_to(outside)
    result = run_cli("append", store, "--topic", "Fifth", "--body", "z")
    assert result.exit_code == 0, result.stderr
    assert "topics.json is a symbolic link, which rmqstore does not write through" in (
        result.stderr
    )
    assert outside.read_text() == "kept" and topics.is_symlink()
    topics.unlink()
    topics.write_text(kept)

    # thousands of new topics: the first ten named, the rest counted, in a line of its size
    lines = "".join(
        json.dumps({"topic": f"Many{number:04d}", "queueId": number % 3, "body": "m"}) + "\n"
        for number in range(1200)
    )
    result = run_cli("append", store, "--input", "-", input=lines)
    assert result.exit_code == 0, result.stderr
    (added,) = [line for line in result.stderr.splitlines() if "added topics" in line]
    assert "Many0000 (1 queue), Many0001 (2 queues), Many0002 (3 queues)," in added
    assert "Many0009 (1 queue) and 1,190 more topics to" in added and len(added) < 400
    table = json.loads(topics.read_text())["topicConfigTable"]
    assert all(f"Many{number:04d}" in table for number in range(1200))

    topics.write_text("{not json")
    result = run_cli("append", store, "--topic", "Third", "--body", "z")
    assert result.exit_code == 0, result.stderr
    assert "topics.json was left as it is (it is not a JSON topic table)" in result.stderr
    assert topics.read_text() == "{not json"
    topics.write_text("[1, 2]")  # JSON, but not a table
    result = run_cli("append", store, "--topic", "Third", "--body", "z")
    assert result.exit_code == 0 and "it is not a JSON topic table" in result.stderr
    topics.write_text(kept)
    backup.unlink()
    backup.mkdir()  # the .bak cannot be written: the messages are stored all the same
    result = run_cli("append", store, "--topic", "Sixth", "--body", "z")
    assert result.exit_code == 0, result.stderr
    assert "cannot write" in result.stderr and "appended 1 message" in result.stderr
    assert topics.read_text() == kept
    backup.rmdir()

    created = tmp_path / "created"
    result = run_cli("append", created, "--create", "--topic", "T", "--queue", "2", "--body", "w")
    assert result.exit_code == 0, result.stderr
    table = json.loads((created / "config" / "topics.json").read_text())["topicConfigTable"]
    assert table["T"]["readQueueNums"] == 3
    bare = tmp_path / "bare"  # a store without the file (store code only, as the oracle's)
    generate("basic", bare)
    (bare / "config" / "topics.json").unlink()
    assert run_cli("append", bare, "--topic", "U", "--body", "v").exit_code == 0
    assert not (bare / "config" / "topics.json").exists()


def test_multi_dispatch_gives_lmq_offsets_to_every_message_of_an_input(tmp_path: Path) -> None:
    """As a broker with enableMultiDispatch (from --multi-dispatch or the broker config):
    every message naming LMQ queues gets their next offsets, also in inputs the record kernel
    packs in batches; the queues are not listed in topics.json (no broker lists them);
    --no-multi-dispatch, or no setting, stores the property as given."""
    store = new_store(tmp_path)
    rooms = ["%LMQ%room-a", "%LMQ%room-b"]
    lines = [
        {"topic": "Chat", "queueId": number % 2, "body": f"m{number}",
         "properties": {"INNER_MULTI_DISPATCH": ",".join(rooms[: 1 + number % 2])}}
        for number in range(300)
    ]  # fmt: skip
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (tmp_path / "broker.conf").write_text("enableMultiDispatch=true\n")
    given = {
        "option": ["--multi-dispatch"],
        "config": ["--broker-config", tmp_path / "broker.conf"],
        "off": ["--broker-config", tmp_path / "broker.conf", "--no-multi-dispatch"],
        "default": [],
    }
    for name, options in given.items():
        result = run_cli("append", store, "--input", tmp_path / "in.jsonl", "--dispatch", *options)
        assert result.exit_code == 0, (name, result.stderr)
    stored = [m for m in read_all(store) if m["topic"] == "Chat"]
    assert len(stored) == 4 * 300
    expected = {room: 0 for room in rooms}
    for number, message in enumerate(stored):
        offsets = message["properties"].get("INNER_MULTI_QUEUE_OFFSET")
        if number >= 2 * 300:  # --no-multi-dispatch, then no setting
            assert offsets is None
            continue
        named = message["properties"]["INNER_MULTI_DISPATCH"].split(",")
        assert offsets == ",".join(str(expected[room]) for room in named), number
        for room in named:
            expected[room] += 1
    for room in rooms:
        result = run_cli("read", store, "--topic", room, "--queue", "0", "--jsonl")
        assert result.exit_code == 0 and result.stderr == "", result.stderr
        assert len(result.stdout.splitlines()) == expected[room]
    table = json.loads((store / "config" / "topics.json").read_text())["topicConfigTable"]
    assert "Chat" in table and not any(name.startswith("%LMQ%") for name in table)
    assert run_cli("verify", store).exit_code == 0


def test_an_append_left_undispatched_is_refused_where_a_crash_recovery_would_cut_the_log(
    oracle, tmp_path: Path
) -> None:
    """A real broker's store, closed cleanly, with a record damaged in an early commit-log
    file: a broker's normal recovery walks the last three files and keeps every record. An
    append without --dispatch leaves 'abort', and the crash recovery a broker then runs
    walks from the file the checkpoint picks (the first: its records were stored within
    seconds), ends the log at the damage and deletes the 2.5 MB after it, the appended
    message with them (recover put them in quarantine; found by a fuzzer that appends to
    mutated real stores). Now that append is refused, changing nothing; with --dispatch the
    store is left without 'abort' and nothing is cut."""
    store = oracle("s1_multi").copy_to(tmp_path)
    damaged = 851968
    with open(store / "commitlog" / f"{damaged:020d}", "r+b") as log_file:
        log_file.write((1 << 30).to_bytes(4, "big"))  # TOTALSIZE out of bounds
    before = tree_digest(store)
    append = ["append", store, "--topic", "TopicTest", "--body", "after", *ORACLE_OPTIONS]
    refused = run_cli(*append)
    assert refused.exit_code == 2
    assert (
        f"a broker's crash recovery would then end the log at offset {damaged:,} "
        "(TOTALSIZE 1073741824 is out of bounds)"
    ) in refused.stderr
    assert "append with --dispatch (the store is unchanged)" in refused.stderr
    assert tree_digest(store) == before
    appended = run_cli(*append, "--dispatch", "--json")
    assert appended.exit_code == 0, appended.stderr
    assert not (store / "abort").exists()
    plan = json.loads(run_cli("recover", store, "--dry-run", "--json", *ORACLE_OPTIONS).stdout)
    assert plan["plan"]["mode"] == "normal" and not plan["plan"]["cuts"]
    (message,) = json.loads(appended.stdout)["messages"]
    assert plan["plan"]["logEnd"] == message["commitLogOffset"] + message["storeSize"]


def test_a_queue_missing_a_file_among_its_last_three_is_refused_until_rebuilt(
    oracle, tmp_path: Path
) -> None:
    """A 5.3.3 broker's store whose TopicTest:0 queue lost its middle file (units 100-199):
    a broker's load walks on past the gap, so its next queue offset for TopicTest:0 is 251,
    after the last file's units. The queue read here ends at the gap: an appended message
    took queue offset 100, which a stored message has, and its unit went into a new file in
    the gap, where a broker's next load then ended the queue and deleted the file after it.
    Every writer now refuses such a store before it changes anything, dry runs too, and
    names the rebuild; after it, an append takes queue offset 251 and verify finds the store
    sound."""
    store = oracle("v533_s1_multi").copy_to(tmp_path)
    (store / "consumequeue" / "TopicTest" / "0" / f"{2000:020d}").unlink()
    before = tree_digest(store)
    for command in (
        ["append", "--topic", "TopicTest", "--queue", "0", "--body", "x", "--dispatch"],
        ["append", "--topic", "TopicTest", "--queue", "1", "--body", "x"],
        ["dispatch"],
        ["dispatch", "--dry-run"],
        ["recover"],
        ["recover", "--dry-run"],
    ):
        refused = run_cli(command[0], store, *command[1:], *ORACLE_OPTIONS)
        assert refused.exit_code == 2, (command, refused.stderr)
        assert "TopicTest:0 is missing its file 00000000000000002000" in refused.stderr
        assert "run rmqstore dispatch --rebuild --yes first" in refused.stderr
        assert tree_digest(store) == before, command
    assert run_cli("dispatch", store, "--rebuild", "--yes", *ORACLE_OPTIONS).exit_code == 0
    done = run_cli(
        "append", store, "--topic", "TopicTest", "--queue", "0", "--body", "x", "--dispatch",
        "--json", *ORACLE_OPTIONS,
    )  # fmt: skip
    assert done.exit_code == 0, done.stderr
    assert json.loads(done.stdout)["messages"][0]["queueOffset"] == 251
    checked = json.loads(run_cli("verify", store, "--json", *ORACLE_OPTIONS).stdout)
    assert checked["ok"], checked["findings"]


# an append stopped by FIRST once its first messages are in the log, and by SECOND again as
# their rollback begins (Ctrl-C pressed twice, a hangup after a kill)
STOPPED_TWICE_APPEND = """
import os, signal, sys
from rmqstore.batch import AppendJob
from rmqstore.commitlog import CommitLogAppender
from rmqstore.commands.main import main
append, rollback = AppendJob._append, CommitLogAppender.rollback
def append_then_stop(self, *args):
    appended = append(self, *args)
    os.kill(os.getpid(), signal.FIRST)
    return appended
def rollback_stopped_again(self, savepoint):
    os.kill(os.getpid(), signal.SECOND)
    return rollback(self, savepoint)
AppendJob._append, CommitLogAppender.rollback = append_then_stop, rollback_stopped_again
sys.argv = ["rmqstore", "append", *sys.argv[1:]]
main()
"""


@pytest.mark.parametrize(
    ("first", "second", "code", "said"),
    [
        ("SIGINT", "SIGINT", 130, "interrupted"),
        ("SIGTERM", "SIGINT", 143, "terminated (SIGTERM)"),
        ("SIGHUP", "SIGTERM", 129, "hung up (SIGHUP)"),
    ],
)
def test_a_second_signal_does_not_break_into_the_rollback_of_the_first(
    tmp_path: Path, first: str, second: str, code: int, said: str
) -> None:
    """A second Ctrl-C (or any stop signal after the first) raised again inside the
    rollback the first had begun: the unreported messages stayed in the log behind
    'abort', the exit code was 1 with click's 'Aborted!' when it came before the error line,
    and a traceback from the interpreter joining its threads when it came after. Only the
    first now stops the command; the rollback ends, and so does the command, as on one."""
    store = new_store(tmp_path)
    before = tree_digest(store)
    messages = tmp_path / "messages.jsonl"
    messages.write_text(
        "".join(json.dumps({"topic": "T", "body": f"m{n}"}) + "\n" for n in range(300))
    )
    script = STOPPED_TWICE_APPEND.replace("FIRST", first).replace("SECOND", second)
    done = subprocess.run(
        [sys.executable, "-c", script, str(store), "--input", str(messages), "--dispatch",
         "--flush", "async", "--flush-interval", "600000", "--flush-thorough-interval", "600000"],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=sigint_delivered,
    )  # fmt: skip
    assert done.returncode == code, done.stderr
    assert done.stderr.strip() == f"rmqstore: error: {said}"
    assert done.stdout == ""  # nothing was flushed, so nothing reported
    assert tree_digest(store) == before


def test_a_signal_while_the_reader_lags_leaves_whole_report_lines(tmp_path: Path) -> None:
    """Ctrl-C while the report of a large group waits for a reader that lags (the pipe full):
    the report written through stdout's buffer was cut part way through a write, and its
    last line was half a message; the stop now waits until the line in flight is out, and
    each line the report holds names a message the store holds."""
    store = new_store(tmp_path)
    messages = tmp_path / "messages.jsonl"
    messages.write_text(
        "".join(json.dumps({"topic": "T", "body": f"m{n}"}) + "\n" for n in range(3000))
    )
    appending = subprocess.Popen(
        [sys.executable, "-m", "rmqstore", "append", str(store), "--input", str(messages),
         "--jsonl", "--flush", "async", "--flush-interval", "600000",
         "--flush-thorough-interval", "600000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=sigint_delivered,
    )  # fmt: skip

    out, err = stopped_while_the_reader_lags(appending, signal.SIGINT)  # its report: 500 KB
    assert appending.returncode == 130, err
    assert err.decode().strip() == "rmqstore: error: interrupted"
    assert out.endswith(b"\n")
    reported = [json.loads(line)["msgId"] for line in out.splitlines()]
    assert 0 < len(reported) < 3000
    read = run_cli("read", store, "--from-offset", "0", "--jsonl", "--body", "none")
    held = {json.loads(line)["msgId"] for line in read.stdout.splitlines()}
    assert set(reported) <= held


# an append --dispatch whose consume queue, rolling to its next file, is interrupted (Ctrl-C)
# just as it has closed its map of the last one
INTERRUPTED_AS_A_QUEUE_ROLLS = """
import mmap, signal, sys
import rmqstore.consumequeue as consumequeue
from rmqstore.commands.entry import main
class InterruptedOnClose(mmap.mmap):
    def close(self):
        super().close()
        raise KeyboardInterrupt
def map_writable(path):
    with open(path, "r+b") as handle:
        return InterruptedOnClose(handle.fileno(), 0, access=mmap.ACCESS_WRITE)
consumequeue.map_writable = map_writable
sys.argv = ["rmqstore", "append", *sys.argv[1:]]
main()
"""


def test_ctrl_c_as_a_queue_lets_its_map_go_is_one_line_and_rolls_back(tmp_path: Path) -> None:
    """A Ctrl-C right as a consume queue has closed the map of its last file (rolling to its
    next) ends the command in one line, and leaves a store recover mends. The signals
    campaign (seed 3) found a Ctrl-C there leaving the closed map in use, a unit written
    through it later, and an internal error (exit 70, TypeError from pack_into): the map is
    now let go of, and the write path through it shut, before it is closed. This path does
    not write through the map again, and passed on the code before too; the campaign's
    path was not made to happen on demand."""
    store = new_store(tmp_path)
    messages = tmp_path / "messages.jsonl"
    messages.write_text(
        "".join(json.dumps({"topic": "T", "body": f"m{n}"}) + "\n" for n in range(1000))
    )
    done = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_AS_A_QUEUE_ROLLS, str(store), "--input",
         str(messages), "--dispatch", "--consumequeue-file-size", "2000", "--flush", "async",
         "--flush-interval", "600000", "--flush-thorough-interval", "600000"],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip() == "rmqstore: error: interrupted"
    # the messages were durable, not yet reported, as the dispatch after the last flush
    # stopped: the store is left for a broker's start (or recover) to finish dispatching
    assert run_cli("recover", store, "--yes").exit_code == 0
    assert run_cli("verify", store).exit_code == 0


# an append whose third new commit-log file is made, then Ctrl-C before it is listed as made
INTERRUPTED_AS_A_FILE_IS_MADE = """
import sys
from rmqstore.segments import SegmentQueue
from rmqstore.commands.entry import main
create, made = SegmentQueue.create, []
def create_then_interrupted(self, *args, **kwargs):
    segment = create(self, *args, **kwargs)
    made.append(segment)
    if len(made) == WHICH and segment.path.parent.name == "commitlog":
        raise KeyboardInterrupt
    return segment
SegmentQueue.create = create_then_interrupted
sys.argv = ["rmqstore", "append", *sys.argv[1:]]
main()
"""


@pytest.mark.parametrize("which", [1, 3])
def test_ctrl_c_as_a_commit_log_file_is_made_leaves_no_file_behind(
    tmp_path: Path, which: int
) -> None:
    """A Ctrl-C between a new commit-log file's making and its listing as made: the
    rollback zeroed that file instead of removing it, after removing the files made before
    it, and the log had a gap (verify: `file-gap`, the next file expected earlier; found by
    a hunt of stopped appends); and the BLANK the roll had written at the end of the file
    it rolled from stayed (the rollback took that file's mark from the position the roll
    had not left yet). Every file the session made is now removed, and the BLANK zeroed:
    the store is as it was."""
    store = new_store(tmp_path)
    before = tree_digest(store)
    messages = tmp_path / "messages.jsonl"
    body = "x" * 2000
    messages.write_text(
        "".join(json.dumps({"topic": "T", "body": body}) + "\n" for _ in range(150))
    )  # about 4.7 files of 64 KiB
    done = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_AS_A_FILE_IS_MADE.replace("WHICH", str(which)),
         str(store), "--input", str(messages), "--flush", "async", "--flush-interval",
         "600000", "--flush-thorough-interval", "600000"],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip() == "rmqstore: error: interrupted"
    assert tree_digest(store) == before  # byte for byte: no file left, no BLANK
