"""``rmqstore append``: single messages, JSON lines, sync group commit, and bad input that must
leave the store exactly as it was."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rmqstore.lockfile import StoreLock

from support import run_cli, tree_digest


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


def test_sync_flush_acknowledges_each_line_before_the_next_arrives(tmp_path: Path) -> None:
    """A producer that waits for each acknowledgement: group commit must not wait for more."""
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
    )
    assert process.stdin is not None and process.stdout is not None
    for index in range(3):
        process.stdin.write(json.dumps({"topic": "Ack", "body": str(index)}) + "\n")
        process.stdin.flush()
        acknowledged = json.loads(process.stdout.readline())  # would hang without the commit
        assert acknowledged["queueOffset"] == index
    process.stdin.close()
    assert process.wait(timeout=60) == 0


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
    result = run_cli("append", store, "--input", "-", "--jsonl", input=good * 600 + "garbage\n")
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


def test_fast_jsonl_writer_equals_the_json_encoder(capsys: pytest.CaptureFixture) -> None:
    from rmqstore.commands.append import _jsonl_writer
    from rmqstore.commands.output import json_text
    from rmqstore.commitlog import AppendResult

    results = [
        AppendResult(
            12345, 7, 300, 1700000000123, 'Top"ic\\é', 3, bytes([10, 0, 0, 1, 0, 0, 0x2A, 0x9F])
        ),
        AppendResult(2**40, 0, 91, 1, "%RETRY%x", 0, bytes(16) + bytes(4)),
    ]
    emit = _jsonl_writer()
    for result in results:
        emit(result)
    lines = capsys.readouterr().out.splitlines()
    assert lines == [json_text(result.to_dict()) for result in results]
