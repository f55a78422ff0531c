"""``rmqstore read`` on real-broker stores and on bad input."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rmqstore.fixtures import generate

from campaigns import sigint_delivered
from support import (
    ORACLE_OPTIONS,
    assert_read_matches_scan_record,
    compiled_pass_only,
    java_host,
    lock_held_elsewhere,
    manifest_dump,
    run_cli,
    stopped_while_the_reader_lags,
    store_being_written,
    wait_to_write,
)

DUMPED = [
    "s1_multi",
    "s3_txn_delay",
    "s4_recovered_from_torn_half_record",
    "v533_s1_multi",
    "v533_s3_txn",
]


@pytest.mark.parametrize("name", DUMPED)
def test_sequential_read_of_every_message_matches_the_broker(oracle, name: str) -> None:
    store = oracle(name)
    records = [
        r
        for r in manifest_dump(store.manifest)["commitLogScan"]["records"]
        if r["type"] == "MESSAGE"
    ]
    result = run_cli("read", store.store, "--from-offset", "0", "--jsonl", "--body", "base64")
    assert result.exit_code == 0, result.stderr
    documents = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(documents) == len(records)
    for document, record in zip(documents, records, strict=True):
        assert_read_matches_scan_record(document, record)


@pytest.mark.parametrize("name", ["s1_multi", "s3_txn_delay", "v533_s1_multi"])
def test_read_by_offset_and_msg_id_match_look_message_by_offset(oracle, name: str) -> None:
    store = oracle(name)
    for offset, expected in manifest_dump(store.manifest)["lookMessageByOffset"].items():
        for args in (["--offset", offset], ["--msg-id", expected["msgId"]]):
            result = run_cli("read", store.store, *args, "--json", "--body", "base64")
            assert result.exit_code == 0, result.stderr
            document = json.loads(result.stdout)
            for key in (
                "msgId",
                "topic",
                "queueId",
                "queueOffset",
                "commitLogOffset",
                "storeSize",
                "sysFlag",
                "flag",
                "bodyCRC",
                "bornTimestamp",
                "storeTimestamp",
                "reconsumeTimes",
                "preparedTransactionOffset",
                "tags",
                "keys",
                "uniqKey",
                "bodyLength",
                "properties",
            ):
                assert document[key] == expected[key], (offset, key)
            assert document["bornHost"] == java_host(expected["bornHost"])
            assert document["storeHost"] == java_host(expected["storeHost"])
            body = base64.b64decode(document.get("body") or "")
            assert hashlib.sha256(body).hexdigest() == expected["bodySha256"]


def test_crashed_store_reads_every_put(oracle) -> None:
    crash = oracle("s2_crash")
    puts = crash.manifest["puts"]
    result = run_cli("read", crash.store, "--from-offset", "0", "--jsonl", "--body", "none")
    assert result.exit_code == 0, result.stderr
    documents = [json.loads(line) for line in result.stdout.splitlines()]
    assert [d["commitLogOffset"] for d in documents] == [p["physicalOffset"] for p in puts]
    assert [d["msgId"] for d in documents] == [p["msgId"] for p in puts]
    assert documents[-1]["storeHost"] == java_host(puts[-1]["storeHost"])


def test_decompress_restores_the_producer_body(oracle) -> None:
    store = oracle("s1_multi")
    put = next(p for p in store.manifest["puts"] if p["sysFlag"] & 1)
    result = run_cli("read", store.store, "--offset", put["physicalOffset"], "--body", "raw")
    assert hashlib.sha256(result.stdout_bytes).hexdigest() == put["storedBodySha256"]
    result = run_cli(
        "read", store.store, "--offset", put["physicalOffset"], "--body", "raw", "--decompress"
    )
    assert hashlib.sha256(result.stdout_bytes).hexdigest() == put["originalBodySha256"]


def test_body_encodings(oracle) -> None:
    store = oracle("s1_multi")
    put = next(p for p in store.manifest["puts"] if p["storedBodyLength"] > 10)
    raw = run_cli(
        "read", store.store, "--offset", put["physicalOffset"], "--body", "raw"
    ).stdout_bytes
    for mode, decode in (("hex", bytes.fromhex), ("base64", base64.b64decode)):
        result = run_cli(
            "read", store.store, "--offset", put["physicalOffset"], "--body", mode, "--json"
        )
        document = json.loads(result.stdout)
        assert document["bodyEncoding"] == mode
        assert decode(document["body"]) == raw
    result = run_cli(
        "read", store.store, "--offset", put["physicalOffset"], "--body", "none", "--json"
    )
    assert "body" not in json.loads(result.stdout)


def test_raw_body_does_not_go_with_a_structured_output(oracle) -> None:
    """``--body raw --json`` wrote the raw bytes and no JSON, and ``--body raw --csv`` a CSV
    row without the body: one option was dropped without a word. Both are usage errors."""
    store = oracle("s1_multi")
    put = next(p for p in store.manifest["puts"] if p["storedBodyLength"] > 10)
    for output in ("--json", "--jsonl", "--csv", "--tsv"):
        result = run_cli(
            "read", store.store, "--offset", put["physicalOffset"], "--body", "raw", output
        )
        assert result.exit_code == 2 and result.stdout == "", output
        assert "--body raw writes the body's bytes alone" in result.stderr


def test_topic_and_queue_jsonl_lines_are_the_json_documents(tmp_path: Path) -> None:
    """``--topic T [--queue Q] --jsonl`` writes the record kernel's lines a block at a time,
    and a block with an odd unit message by message: in order, one line per document of the
    same read with --json (which reads message by message)."""
    store = tmp_path / "store"
    generate("multi", store)
    (path,) = sorted((store / "consumequeue" / "TopicTest" / "0").iterdir())[:1]
    data = bytearray(path.read_bytes())
    data[20 * 5 : 20 * 5 + 8] = data[0:8]  # unit 5 points at unit 0's record: a note
    path.write_bytes(data)
    for selection in (["--queue", "0"], ["--queue", "0", "--from", "3", "--count", "9"], []):
        command = ["read", store, "--topic", "TopicTest", *selection, "--body", "base64"]
        lines = run_cli(*command, "--jsonl")
        array = run_cli(*command, "--json")
        assert lines.exit_code == array.exit_code == 0, lines.stderr
        documents = [json.loads(line) for line in lines.stdout.splitlines()]
        assert documents == json.loads(array.stdout) and documents
        assert lines.stderr == array.stderr and "points at offset" in lines.stderr


@compiled_pass_only  # these scenarios' files are kernel_corpus seeds
@pytest.mark.parametrize("scenario", ["multi", "torn-tail", "missing-file", "cq-truncated"])
def test_json_jsonl_and_csv_from_kernel_lines_are_what_message_by_message_gives(
    tmp_path: Path, scenario: str
) -> None:
    """``--json``, ``--jsonl``, ``--csv`` and ``--tsv`` reads of the log, a topic or a queue
    are written from the record kernel's lines, filtered by store time and TAGS on its rows
    (so is the table's choice of messages); ``--verify-crc`` (every CRC is good) makes the
    same read go message by message. Output, notes, errors (an array closed before one) and
    exit codes are the same."""
    store = tmp_path / "store"
    generate(scenario, store)
    selections = [
        ["--from-offset", "0"],
        ["--from-offset", "0", "--count", "3"],
        ["--topic", "TopicTest"],
        ["--topic", "TopicTest", "--count", "7"],
        ["--topic", "TopicTest", "--queue", "1", "--from", "4", "--count", "20"],
        ["--topic", "TopicTest", "--queue", "3", "--from", "9999"],
        ["--from-offset", "0", "--tags", "TagA||tag-été||标签"],
        [
            "--from-offset",
            "0",
            "--begin",
            "1700086400100",
            "--end",
            "1700086400300",
            "--count",
            "20",
        ],
        ["--from-offset", "0", "--begin", "1", "--end", "2"],  # nothing kept
        ["--topic", "TopicTest", "--tags", "TagB||emoji-😀", "--count", "9"],
        ["--topic", "TopicTest", "--queue", "1", "--begin", "1700086400200", "--tags", "TagB"],
    ]
    outputs = [
        ["--json"],
        ["--jsonl"],
        ["--csv"],
        ["--tsv", "--fields", "msgId,properties,body,bodyEncoding,queueOffset,storeHost"],
        [],  # the table: a filter picks its messages from the kernel's rows too
    ]
    for selection in selections:
        for output in outputs:
            for body in ("auto", "none", "hex"):
                command = ["read", store, *selection, *output, "--body", body]
                fast, slow = run_cli(*command), run_cli(*command, "--verify-crc")
                assert (fast.exit_code, fast.stdout, fast.stderr) == (
                    slow.exit_code,
                    slow.stdout,
                    slow.stderr,
                ), command


def test_a_read_going_on_past_missing_files_says_so(tmp_path: Path) -> None:
    """A sequential read went on from a file's BLANK to the next file there is, over a
    deleted one, and said nothing: 183 of the 202 messages, exit 0, no word of the 19 others.
    It now warns, naming the offsets (once it has gone past them, with a --count too)."""
    store = tmp_path / "store"
    generate("missing-file", store)
    warning = (
        "warning: commit-log files are missing from offset 81920 to 98304 (1 file): the read "
        "went on past them, and their messages are not in it"
    )
    for extra in ([], ["--begin", "1"], ["--count", "150"]):
        for output in ("--jsonl", "--json"):
            result = run_cli("read", store, "--from-offset", "0", output, *extra)
            assert result.exit_code == 0 and warning in result.stderr, (extra, output)
    before = run_cli("read", store, "--from-offset", "0", "--count", "3", "--jsonl")
    assert before.exit_code == 0 and "missing" not in before.stderr


def test_a_queue_read_leaves_out_units_pointing_into_missing_files(tmp_path: Path) -> None:
    """A consume queue's units pointing into a deleted commit-log file made a topic or queue
    read fail (exit 2) at the first of them, hiding every later message. A broker's consumer
    skips such units; the read now leaves them out with a warning per run, and goes on."""
    store = tmp_path / "store"
    generate("missing-file", store)
    everything = run_cli("read", store, "--from-offset", "0", "--jsonl").stdout
    stored = {json.loads(line)["msgId"] for line in everything.splitlines()}
    for output in ("--jsonl", "--json"):
        result = run_cli("read", store, "--topic", "TopicTest", output, "--body", "none")
        assert result.exit_code == 0, result.stderr
        assert (
            "warning: 2 units of TopicTest:0 (queue offset 9 to 10) point into commit-log "
            "files that are missing: left out" in result.stderr
        )
        if output == "--jsonl":
            read = [json.loads(line) for line in result.stdout.splitlines()]
        else:
            read = json.loads(result.stdout)
        assert {message["msgId"] for message in read} <= stored
        assert [m["queueOffset"] for m in read if m["queueId"] == 0][8:10] == [8, 11]


def test_a_filtered_read_stops_at_its_count_before_reading_on(tmp_path: Path) -> None:
    """``--count 5 --begin T`` read a sixth message before stopping, so a read whose sixth
    unit points where no record starts failed (exit 2) after printing the five it asked for."""
    store = tmp_path / "store"
    generate("multi", store)
    (path,) = sorted((store / "consumequeue" / "TopicTest" / "0").iterdir())[:1]
    data = bytearray(path.read_bytes())
    offset = int.from_bytes(data[100:108], "big") + 1  # unit 5: inside its record
    data[100:108] = offset.to_bytes(8, "big")
    path.write_bytes(data)
    command = ["read", store, "--topic", "TopicTest", "--queue", "0", "--from", "0"]
    assert run_cli(*command, "--count", "6", "--jsonl").exit_code == 2  # the sixth fails
    for selection in (["--begin", "1"], ["--end", "9999999999999"]):
        result = run_cli(*command, "--count", "5", "--jsonl", *selection)
        assert result.exit_code == 0, result.stderr
        assert len(result.stdout.splitlines()) == 5


def test_human_output_shows_fields(oracle) -> None:
    result = run_cli("read", oracle("s1_multi").store, "--offset", "316690")
    assert result.exit_code == 0
    assert "7F00000100002A9F000000000004D512" in result.stdout
    assert "tag-été" in result.stdout


def test_count_limits_a_sequential_read(oracle) -> None:
    result = run_cli(
        "read",
        oracle("s1_multi").store,
        "--from-offset",
        "0",
        "--count",
        "5",
        "--json",
        "--body",
        "none",
    )
    documents = json.loads(result.stdout)
    assert [d["commitLogOffset"] for d in documents][:2] == [0, 266]
    assert len(documents) == 5


def store_with_garbage(tmp_path: Path) -> Path:
    store = tmp_path / "garbage"
    (store / "commitlog").mkdir(parents=True)
    (store / "commitlog" / "00000000000000000000").write_bytes(os.urandom(65536))
    return store


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--offset", "5"], "no message starts at offset 5"),
        (["--offset", "99999999"], "beyond the commit-log files"),
        (["--offset", "3346149"], "at or after the end of the log"),
        (["--msg-id", "ZZ"], "bad message id"),
        (["--from-offset", "7"], "no message starts at offset 7"),
    ],
)
def test_bad_lookups_are_one_line_errors(oracle, args: list[str], needle: str) -> None:
    result = run_cli("read", oracle("s1_multi").store, *args)
    assert result.exit_code == 2
    assert needle in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "args", [[], ["--offset", "1", "--msg-id", "00"], ["--count", "3", "--offset", "0"]]
)
def test_option_misuse_is_a_usage_error(oracle, args: list[str]) -> None:
    result = run_cli("read", oracle("s1_multi").store, *args)
    assert result.exit_code == 2


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--topic", "TopicTest", "--queue", "0", "--offset", "0"], "--topic does not go with"),
        (["--topic", "TopicTest", "--msg-id", "0" * 32], "--topic does not go with"),
        (["--from-offset", "0", "--queue", "1"], "--queue goes with --topic"),
        (["--key", "k", "--topic", "TopicTest", "--queue", "1"], "--queue goes with --topic"),
        (["--offset", "0", "--tags", "TagA"], "--tags filters a read of many messages"),
        (["--msg-id", "0" * 32, "--begin", "1", "--end", "2"], "--begin/--end filter a read"),
        (["--topic", "TopicTest", "--queue", "0", "--time", "0", "--end", "5"], "--end filters"),
        (["--from-offset", "0", "--max", "3"], "--max goes with --key or --uniq-key"),
        (["--topic", "TopicTest", "--queue", "0", "--time-rule", "4.x"], "--time-rule goes with"),
    ],
)
def test_an_option_the_lookup_would_ignore_is_refused(oracle, args: list[str], needle: str) -> None:
    """``--topic T --queue 0 --offset 5`` once read the commit-log record at offset 5, of any
    topic, as if the queue offset had been meant; every option a mode leaves unused is refused."""
    result = run_cli("read", oracle("s1_multi").store, *args)
    assert result.exit_code == 2, result.stdout
    assert needle in result.stderr and result.stdout == ""


def test_a_long_value_is_repeated_cut_in_its_error(oracle) -> None:
    store = oracle("s1_multi").store
    long_id = "A" * 10_000
    by_id = run_cli("read", store, *ORACLE_OPTIONS, "--msg-id", long_id)
    by_time = run_cli("read", store, "--topic", "TopicTest", "--queue", "0", "--time", long_id)
    for result in (by_id, by_time):
        assert result.exit_code == 2
        assert "(10,000 characters)" in result.stderr and len(result.stderr) < 1_000
    assert "has 10,000 hex digits, not the 32 or 56 of an offset message id" in by_id.stderr


def test_not_a_store(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    (tmp_path / "empty").mkdir()
    for target, needle in (
        (tmp_path / "missing", "no such directory"),
        (tmp_path / "file", "is a file"),
        (tmp_path / "empty", "not a RocketMQ store"),
    ):
        result = run_cli("read", target, "--offset", "0")
        assert result.exit_code == 2, target
        assert needle in result.stderr


def test_garbage_commit_log(tmp_path: Path) -> None:
    result = run_cli("read", store_with_garbage(tmp_path), "--from-offset", "0")
    assert result.exit_code == 2
    assert "no message starts at offset 0" in result.stderr


def test_truncated_commit_log_file(oracle, tmp_path: Path) -> None:
    store = oracle("s1_multi").copy_to(tmp_path)
    first = store / "commitlog" / "00000000000000000000"
    with open(first, "r+b") as handle:
        handle.truncate(1000)
    result = run_cli("read", store, "--offset", "0", "--commitlog-file-size", "65536")
    assert result.exit_code == 2
    assert "is 1000 bytes; the configured size is 65536" in result.stderr


def test_sequential_read_with_verify_crc_stops_at_the_bad_body(tmp_path: Path) -> None:
    from rmqstore.fixtures import generate

    store_dir = tmp_path / "store"
    generate("crc-flip", store_dir)
    args = ("read", store_dir, "--from-offset", "0", "--count", "100000", "--jsonl")
    plain = run_cli(*args)
    checked = run_cli(*args, "--verify-crc")
    assert plain.exit_code == 0
    assert checked.exit_code == 2 and "BODYCRC does not match the body" in checked.stderr
    read = [json.loads(line) for line in checked.stdout.splitlines()]
    everything = [json.loads(line) for line in plain.stdout.splitlines()]
    assert 0 < len(read) < len(everything)
    assert read == everything[: len(read)]
    assert f"offset {everything[len(read)]['commitLogOffset']}" in checked.stderr


def test_client_ids_keys_and_no_hits_like_mqadmin(oracle) -> None:
    store = oracle("s1_multi").store
    first = run_cli("read", store, "--from-offset", "0", "--count", "40", "--jsonl")
    documents = [json.loads(line) for line in first.stdout.splitlines()]
    wanted = next(d for d in documents if d.get("uniqKey") and d.get("keys"))
    uniq, key = wanted["uniqKey"], wanted["keys"].split()[0]
    # a producer's msgId (the UNIQ_KEY) is found through the index, across topics
    by_client_id = run_cli("read", store, *ORACLE_OPTIONS, "--msg-id", uniq, "--json")
    assert by_client_id.exit_code == 0, by_client_id.stderr
    assert json.loads(by_client_id.stdout)["commitLogOffset"] == wanted["commitLogOffset"]
    assert "client id (UNIQ_KEY)" in by_client_id.stderr
    # a client id pasted in lower case: --msg-id finds it, --uniq-key (exact, as the broker
    # compares) finds nothing but says which case producers write
    lower = run_cli("read", store, *ORACLE_OPTIONS, "--msg-id", uniq.lower(), "--json")
    assert lower.exit_code == 0, lower.stderr
    assert json.loads(lower.stdout)["commitLogOffset"] == wanted["commitLogOffset"]
    exact = run_cli("read", store, *ORACLE_OPTIONS, "--uniq-key", uniq.lower(), "--jsonl")
    assert exact.exit_code == 1 and exact.stdout == ""
    assert f"try --uniq-key {uniq}" in exact.stderr
    # --uniq-key and --key without --topic search every topic
    by_uniq = run_cli("read", store, *ORACLE_OPTIONS, "--uniq-key", uniq, "--jsonl")
    assert [json.loads(line)["commitLogOffset"] for line in by_uniq.stdout.splitlines()] == [
        wanted["commitLogOffset"]
    ]
    by_key = run_cli("read", store, *ORACLE_OPTIONS, "--key", key, "--jsonl")
    assert by_key.exit_code == 0
    assert wanted["commitLogOffset"] in [
        json.loads(line)["commitLogOffset"] for line in by_key.stdout.splitlines()
    ]
    # a UNIQ_KEY asked for as a key: no false "same hash" note, but what it is
    as_key = run_cli(
        "read", store, *ORACLE_OPTIONS, "--topic", wanted["topic"], "--key", uniq, "--jsonl"
    )
    assert as_key.exit_code == 1 and as_key.stdout == ""
    assert (
        "1 message carries" in as_key.stderr
        and "as its UNIQ_KEY" in as_key.stderr
        and "same hash" not in as_key.stderr
    )
    # no hit: a note and exit 1, as grep does
    missing = run_cli("read", store, *ORACLE_OPTIONS, "--key", "no-such-key-anywhere")
    assert missing.exit_code == 1
    assert "no message of any topic has key no-such-key-anywhere" in missing.stderr
    assert "each piece of KEYS" not in missing.stderr
    # the whole KEYS of a message asked for (its pieces are what the index holds): a hint
    whole = run_cli("read", store, *ORACLE_OPTIONS, "--key", f"{key} other")
    assert whole.exit_code == 1 and f"look one up, --key {key}" in whole.stderr
    unknown = run_cli("read", store, *ORACLE_OPTIONS, "--msg-id", "0" * 31 + "1")
    assert unknown.exit_code == 2 and "as a client id (UNIQ_KEY)" in unknown.stderr


def test_times_in_any_form_and_shown_with_their_zone(oracle) -> None:
    store = oracle("s1_multi").store
    first = json.loads(
        run_cli("read", store, "--from-offset", "0", "--count", "1", "--jsonl").stdout
    )
    millis = first["storeTimestamp"]
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(millis // 1000))
    iso += f".{millis % 1000:03d}Z"
    by_ms = run_cli("read", store, "--topic", first["topic"], "--queue",
                    str(first["queueId"]), "--time", str(millis), "--json")  # fmt: skip
    by_iso = run_cli("read", store, "--topic", first["topic"], "--queue",
                     str(first["queueId"]), "--time", iso, "--json")  # fmt: skip
    assert by_ms.exit_code == by_iso.exit_code == 0, by_iso.stderr
    assert json.loads(by_ms.stdout) == json.loads(by_iso.stdout)
    bad = run_cli("read", store, "--topic", "T", "--queue", "0", "--time", "noon")
    assert bad.exit_code == 2 and "is not a time" in bad.stderr
    past_long = run_cli("read", store, "--topic", "T", "--queue", "0", "--time", str(2**63))
    assert past_long.exit_code == 2 and "beyond the epoch milliseconds" in past_long.stderr
    last_long = run_cli("read", store, "--topic", first["topic"], "--queue",
                        str(first["queueId"]), "--time", str(2**63 - 1), "--json")  # fmt: skip
    assert last_long.exit_code == 0, last_long.stderr
    shown = run_cli("--utc", "read", store, "--offset", str(first["commitLogOffset"]))
    assert " UTC" in shown.stdout
    # a time as a read shows it, copied into --time as it is
    (copied,) = re.findall(r"storeTimestamp +\d+ \((.+ UTC)\)", shown.stdout)
    by_copy = run_cli("read", store, "--topic", first["topic"], "--queue",
                      str(first["queueId"]), "--time", copied, "--json")  # fmt: skip
    assert by_copy.exit_code == 0, by_copy.stderr
    assert json.loads(by_copy.stdout) == json.loads(by_ms.stdout)


def test_tags_are_a_subscription_expression_as_a_consumer_gives_one(oracle) -> None:
    """``TagA || TagB`` (the form RocketMQ's examples subscribe with) picks what
    ``TagA||TagB`` picks: each tag is trimmed, as the broker's FilterAPI trims it (it picked
    nothing); ``*`` is every message (it picked only a tag named ``*``); an expression naming
    no tag, or an empty one, is refused (both picked nothing, exit 0)."""
    store = oracle("s1_multi").store
    topic = ["read", store, "--topic", "TopicTest", "--jsonl"]
    spaced = run_cli(*topic, "--tags", " TagA ||  TagB ")
    assert spaced.exit_code == 0 and spaced.stdout
    assert spaced.stdout == run_cli(*topic, "--tags", "TagA||TagB").stdout
    assert run_cli(*topic, "--tags", "*").stdout == run_cli(*topic).stdout
    for lookup in (["--topic", "TopicTest"], ["--from-offset", "0"], ["--key", "k"]):
        for expression, said in [("||", "name no tag"), (" || ", "name no tag"), ("", "empty")]:
            refused = run_cli("read", store, *lookup, "--tags", expression)
            assert refused.exit_code == 2 and said in refused.stderr, (lookup, expression)


def test_a_whole_topic_filtered_by_tags_and_time(oracle) -> None:
    store = oracle("s1_multi").store
    per_queue = []
    for queue in range(4):
        result = run_cli("read", store, "--topic", "TopicTest", "--queue", str(queue), "--jsonl")
        per_queue += [json.loads(line) for line in result.stdout.splitlines()]
    whole = run_cli("read", store, "--topic", "TopicTest", "--jsonl")
    assert [json.loads(line) for line in whole.stdout.splitlines()] == per_queue
    times = sorted(d["storeTimestamp"] for d in per_queue)
    begin, end = times[len(times) // 4], times[len(times) // 2]
    expected = [
        d
        for d in per_queue
        if d.get("tags") in ("TagA", "TagB") and begin <= d["storeTimestamp"] <= end
    ]
    filtered = run_cli("read", store, "--topic", "TopicTest", "--tags", "TagA||TagB",
                       "--begin", str(begin), "--end", str(end), "--jsonl")  # fmt: skip
    assert [json.loads(line) for line in filtered.stdout.splitlines()] == expected
    assert expected
    counted = run_cli("read", store, "--topic", "TopicTest", "--tags", "TagA||TagB",
                      "--count", "2", "--jsonl")  # fmt: skip
    assert len(counted.stdout.splitlines()) == 2
    nothing = run_cli("read", store, "--topic", "NoSuchTopic")
    assert nothing.exit_code == 2 and "has no consume queues" in nothing.stderr
    assert begin < end
    for lookup in (["--topic", "TopicTest"], ["--from-offset", "0"], ["--key", "k"]):
        swapped = run_cli("read", store, *lookup, "--begin", str(end), "--end", str(begin))
        assert swapped.exit_code == 2 and "--begin is after --end" in swapped.stderr


def test_csv_and_tsv_with_chosen_fields(oracle) -> None:
    import csv
    import io

    store = oracle("s1_multi").store
    jsonl = run_cli(
        "read", store, "--topic", "TopicTest", "--queue", "1", "--count", "5", "--jsonl"
    )
    documents = [json.loads(line) for line in jsonl.stdout.splitlines()]
    table = run_cli("read", store, "--topic", "TopicTest", "--queue", "1", "--count", "5", "--csv")
    rows = list(csv.DictReader(io.StringIO(table.stdout)))
    assert [row["msgId"] for row in rows] == [d["msgId"] for d in documents]
    assert [row["tags"] for row in rows] == [d.get("tags") or "" for d in documents]
    chosen = run_cli("read", store, "--offset", str(documents[0]["commitLogOffset"]), "--tsv",
                     "--fields", "queueOffset,properties,uniqKey")  # fmt: skip
    header, line = chosen.stdout.splitlines()
    assert header.split("\t") == ["queueOffset", "properties", "uniqKey"]
    values = next(csv.reader([line], delimiter="\t"))
    assert int(values[0]) == documents[0]["queueOffset"]
    assert json.loads(values[1]) == documents[0]["properties"]
    bad = run_cli("read", store, "--offset", "0", "--csv", "--fields", "nope")
    assert bad.exit_code == 2 and "unknown field" in bad.stderr
    both = run_cli("read", store, "--offset", "0", "--csv", "--json")
    assert both.exit_code == 2


def test_seek_starts_at_the_next_record(oracle) -> None:
    store = oracle("s1_multi").store
    first, second = (
        json.loads(line)
        for line in run_cli(
            "read", store, "--from-offset", "0", "--count", "2", "--jsonl"
        ).stdout.splitlines()
    )
    inside = first["commitLogOffset"] + 7  # inside the first record
    refused = run_cli("read", store, "--from-offset", inside, "--count", "1", "--jsonl")
    assert refused.exit_code != 0 and "no message starts at offset" in refused.stderr
    sought = run_cli("read", store, "--from-offset", inside, "--seek", "--count", "1", "--jsonl")
    assert sought.exit_code == 0, sought.stderr
    assert json.loads(sought.stdout)["commitLogOffset"] == second["commitLogOffset"]
    assert f"reading from the next one, at {second['commitLogOffset']}" in sought.stderr
    exact = run_cli("read", store, "--from-offset", 0, "--seek", "--count", "1", "--jsonl")
    assert json.loads(exact.stdout)["commitLogOffset"] == 0 and exact.stderr == ""
    misuse = run_cli("read", store, "--offset", 0, "--seek")
    assert misuse.exit_code == 2 and "--seek goes with --from-offset" in misuse.stderr


def test_a_read_from_the_end_is_empty_and_from_inside_a_record_an_error(
    oracle, tmp_path: Path
) -> None:
    """A script reading on from where its last read stopped gets nothing new, exit 0: at the
    log's end, past it in the last file, with or without --seek (also when a broker has
    pre-allocated the next file), and at 0 of a store with no commit-log file yet. An offset
    inside a record is an error even where the record holds zeros (the high bytes of its
    queue offset), which read as the end of the data, and the error comes before anything is
    printed: no JSON array or CSV header left open."""
    store = oracle("s1_multi").copy_to(tmp_path)
    first = json.loads(run_cli("read", store, "--from-offset", "0", "--count", "1",
                               "--jsonl").stdout)  # fmt: skip
    end = json.loads(run_cli("info", store, "--json").stdout)["commitLog"]["maxOffset"]
    last = sorted((store / "commitlog").iterdir())[-1]
    for preallocated in (False, True):
        if preallocated:  # the next file, all zeros, as a broker's allocation service makes it
            size = last.stat().st_size
            (last.parent / f"{int(last.name) + size:020d}").write_bytes(bytes(size))
        for start in (end, end + 1):
            for flags in ([], ["--seek"]):
                for shape, empty in (("--json", "[\n]\n"), ("--jsonl", ""), ("--csv", "msgId,")):
                    result = run_cli("read", store, "--from-offset", start, *flags, shape)
                    assert result.exit_code == 0, (start, flags, shape, result.stderr)
                    assert result.stdout.startswith(empty), (start, flags, shape)
                    assert len(result.stdout.splitlines()) <= 2 and result.stderr == ""
    zeros = first["commitLogOffset"] + 20  # the queue offset's high bytes: zero
    for shape in ("--json", "--jsonl", "--csv", "--tsv"):
        inside = run_cli("read", store, "--from-offset", zeros, shape)
        assert inside.exit_code == 2, (shape, inside.stderr)
        assert f"no message starts at offset {zeros}: the log goes on" in inside.stderr
        assert inside.stdout == ""
    missing = run_cli("read", store, "--offset", zeros, "--csv")
    assert missing.exit_code == 2 and missing.stdout == ""
    empty = tmp_path / "empty"
    (empty / "commitlog").mkdir(parents=True)
    for flags in ([], ["--seek"]):
        nothing = run_cli("read", empty, "--from-offset", "0", *flags, "--json")
        assert nothing.exit_code == 0 and json.loads(nothing.stdout) == [], nothing.stderr
    beyond = run_cli("read", empty, "--from-offset", "1")
    assert beyond.exit_code == 2 and "outside the commit-log files" in beyond.stderr


def test_a_queue_read_stops_at_units_past_the_logs_valid_end(tmp_path: Path) -> None:
    """A crashed store's queue whose last units point at its torn tail: the read gives the
    messages before it and a warning, exit 0 (it failed part way, exit 2, leaving a JSON
    array open). A unit pointing at a damaged record before the log's valid end is still an
    error, exit 2, after an array that is closed."""
    from rmqstore.fixtures import generate

    store = tmp_path / "torn"
    generate("torn-tail", store)
    lines = run_cli("read", store, "--from-offset", "0", "--jsonl", "--body", "none").stdout
    whole = [json.loads(line) for line in lines.splitlines()]
    end = whole[-1]["commitLogOffset"] + whole[-1]["storeSize"]
    queue = run_cli("read", store, "--topic", "Orders-EU_west", "--queue", "2", "--json",
                    "--body", "none")  # fmt: skip
    assert queue.exit_code == 0, queue.stderr
    read = json.loads(queue.stdout)
    expected = [d for d in whole if (d["topic"], d["queueId"]) == ("Orders-EU_west", 2)]
    assert read == expected and read
    cut = read[-1]["queueOffset"] + 1
    assert (f"units of Orders-EU_west:2 from queue offset {cut} point at or past the commit "
            f"log's valid end ({end})") in queue.stderr  # fmt: skip
    topic = run_cli("read", store, "--topic", "Orders-EU_west", "--jsonl", "--body", "none")
    assert topic.exit_code == 0 and len(topic.stdout.splitlines()) == len(
        [d for d in whole if d["topic"] == "Orders-EU_west"]
    )
    clean = tmp_path / "clean"  # no abort: a broker's recovery walks its last three files
    generate("multi", clean)
    lines = run_cli("read", clean, "--topic", "TopicTest", "--queue", "0", "--jsonl",
                    "--body", "none").stdout  # fmt: skip
    expected = [json.loads(line) for line in lines.splitlines()]
    damaged = expected[3]["commitLogOffset"]  # in the first file
    path = clean / "commitlog" / f"{damaged - damaged % 65536:020d}"
    with path.open("r+b") as handle:
        handle.seek(damaged % 65536 + 4)
        handle.write(b"\xde\xad\xbe\xef")  # its magic code
    broken = run_cli("read", clean, "--topic", "TopicTest", "--queue", "0", "--json",
                     "--body", "none")  # fmt: skip
    assert broken.exit_code == 2 and f"record at offset {damaged}" in broken.stderr
    assert json.loads(broken.stdout) == expected[:3]


def test_index_hits_on_records_that_cannot_be_read_are_left_out_with_a_note(
    tmp_path: Path,
) -> None:
    """A key lookup whose index hit is the torn tail of a crashed store, or a damaged record:
    the hit is left out with a warning, and the lookup answers as for no hit (exit 1; the
    lookup failed, exit 2, on the record it could not read)."""
    from rmqstore.fixtures import generate

    store = tmp_path / "torn"
    generate("torn-tail", store)
    torn = json.loads((store / "fixture.json").read_text())["messages"][-1]
    end = torn["commitLogOffset"]
    lookup = run_cli("read", store, "--uniq-key", torn["uniqKey"], "--json")
    assert lookup.exit_code == 1 and json.loads(lookup.stdout) == [], lookup.stderr
    assert f"an index hit at offset {end} is past the commit log's valid end ({end})" in (
        lookup.stderr
    )
    by_id = run_cli("read", store, "--msg-id", torn["uniqKey"])
    assert by_id.exit_code == 2 and "the index has no message with it (an index hit" in (
        by_id.stderr
    )
    clean = tmp_path / "clean"
    generate("multi", clean)
    first = json.loads(run_cli("read", clean, "--from-offset", "0", "--count", "1",
                               "--jsonl").stdout)  # fmt: skip
    path = clean / "commitlog" / f"{0:020d}"
    with path.open("r+b") as handle:
        handle.seek(first["commitLogOffset"] + 4)
        handle.write(b"\xde\xad\xbe\xef")  # its magic code
    damaged = run_cli("read", clean, "--uniq-key", first["uniqKey"], "--json")
    assert damaged.exit_code == 1 and json.loads(damaged.stdout) == []
    assert f"an index hit at offset {first['commitLogOffset']} is not a readable record" in (
        damaged.stderr
    )


@pytest.mark.parametrize("name, generation", [("s1_multi", "4.x"), ("v533_s1_multi", "5.x")])
def test_time_reads_follow_the_rule_of_the_broker_that_wrote_the_store(
    oracle, name: str, generation: str
) -> None:
    """No --time-rule: the rule is told from the records, and every probe the broker answered
    gets the broker's queue offset."""
    store = oracle(name)
    probes = [
        p
        for p in manifest_dump(store.manifest)["offsetInQueueByTime"]
        if "timestamp" in p and p["offsetInQueueByTime"]
    ]
    assert probes
    for probe in probes:
        result = run_cli(
            "read", store.store, "--topic", probe["topic"], "--queue", probe["queueId"],
            "--time", probe["timestamp"], "--json", "--body", "none", *ORACLE_OPTIONS,
        )  # fmt: skip
        document = json.loads(result.stdout)
        assert document["rule"] == generation
        assert document["queueOffset"] == probe["offsetInQueueByTime"], probe


@compiled_pass_only  # every real-broker commit-log file is a kernel_corpus seed
@pytest.mark.parametrize("name", ["s1_multi", "s2_crash", "v533_s1_multi", "s3_txn_delay"])
def test_jsonl_written_by_the_kernel_is_the_documents_text(oracle, name: str) -> None:
    """``read --from-offset N --jsonl`` is written by the record kernel; a time bound (which
    filters nothing here) sends the same read through the message documents: the same text,
    notes and exit in every body mode, with --count and --seek."""
    store = oracle(name).store
    for body in ("auto", "text", "hex", "base64", "none"):
        for extra in ([], ["--count", "7"], ["--seek"]):
            start = "1" if "--seek" in extra else "0"
            args = ["read", store, "--from-offset", start, "--jsonl", "--body", body, *extra]
            fast = run_cli(*args)
            slow = run_cli(*args, "--begin", "1")
            assert (fast.exit_code, fast.stdout, fast.stderr) == (
                slow.exit_code,
                slow.stdout,
                slow.stderr,
            )
            assert fast.exit_code == 0 and fast.stdout


def test_csv_and_tsv_cells_holding_delimiters_quotes_and_line_breaks(tmp_path: Path) -> None:
    """Bodies, tags, keys and properties holding commas, tabs, quotes, line feeds, carriage
    returns and zero bytes: the rows the record kernel writes for --csv and --tsv are the ones
    written message by message (--begin 1), and read back by a CSV reader they give the
    values --jsonl gives."""
    import csv
    import io

    store = tmp_path / "store"
    texts = ["a,b", 'say "hi"', "two\nlines", "cr\rhere", "tab\there", "nul\x00byte", "é😀", '"']
    lines = [
        {"topic": "Cells", "body": text, "tags": text, "keys": text, "properties": {"note": text}}
        for text in texts
    ] + [{"topic": "Cells", "body": ""}, {"topic": "Cells", "body": "plain"}]
    text = "".join(json.dumps(line) + "\n" for line in lines)
    appended = run_cli("append", store, "--input", "-", "--create", "--dispatch", input=text)
    assert appended.exit_code == 0, appended.stderr
    printed = run_cli("read", store, "--from-offset", "0", "--jsonl").stdout
    documents = [json.loads(line) for line in printed.splitlines()]
    assert len(documents) == len(lines)
    fields = ["msgId", "tags", "keys", "properties", "body", "bodyEncoding", "tags"]
    for selection in (["--from-offset", "0"], ["--topic", "Cells", "--count", "7"]):
        for output, delimiter in (("--csv", ","), ("--tsv", "\t")):
            for chosen in (["--fields", ",".join(fields)], ["--fields", "body"], []):
                command = ["read", store, *selection, output, *chosen]
                fast, slow = run_cli(*command), run_cli(*command, "--begin", "1")
                assert (fast.exit_code, fast.stdout) == (0, slow.stdout), command
            command = ["read", store, *selection, output, "--fields", ",".join(fields)]
            table = io.StringIO(run_cli(*command).stdout, newline="")
            rows = list(csv.reader(table, delimiter=delimiter))
            assert rows[0] == fields
            by_id = {document["msgId"]: document for document in documents}
            for row in rows[1:]:
                document = by_id[row[0]]
                assert row[1] == row[6] == (document["tags"] or "")
                assert row[2] == (document["keys"] or "")
                assert json.loads(row[3]) == document["properties"]
                assert row[4] == document["body"] and row[5] == document["bodyEncoding"]


def test_more_fields_than_the_kernel_takes_are_written_message_by_message(tmp_path: Path) -> None:
    """A --fields list longer than the record kernel's rows take (MOST_COLUMNS) still gives
    every column, as message by message (--begin 1) gives it."""
    from rmqstore.kernel.layout import MOST_COLUMNS

    store = tmp_path / "store"
    generate("multi", store)
    fields = ",".join(["msgId", "tags"] * (MOST_COLUMNS // 2 + 1))
    for selection in (["--from-offset", "0"], ["--topic", "TopicTest"]):
        command = ["read", store, *selection, "--count", "5", "--csv", "--fields", fields]
        fast, slow = run_cli(*command), run_cli(*command, "--begin", "1")
        assert fast.exit_code == 0 and fast.stdout == slow.stdout
        assert [len(line.split(",")) for line in fast.stdout.splitlines()] == [MOST_COLUMNS + 2] * 6


@pytest.mark.parametrize("output", ["--jsonl", "--json"])
def test_a_sequential_read_of_a_store_being_written_reads_each_record_whole(
    tmp_path: Path, monkeypatch, output: str
) -> None:
    """The lock held by a writer that is copying in the last record but one: a read to the
    end of the log reads what was there when it began, 50 ms later (that record whole), and
    stops before the record written after (JSON lines come from the record kernel's lines,
    JSON from messages: two readers)."""
    import rmqstore.segments as segments

    store, being_written, finishing = store_being_written(tmp_path)
    finishing.patch_into(monkeypatch, segments)
    with lock_held_elsewhere(store / "lock"):
        result = run_cli("read", store, "--from-offset", "0", output)
    assert result.exit_code == 0, result.stderr
    assert finishing.waited == [0.05]
    read = (
        [json.loads(line) for line in result.stdout.splitlines()]
        if output == "--jsonl"
        else json.loads(result.stdout)
    )
    assert [row["keys"] for row in read] == [f"key-{n}" for n in range(11)]
    assert read[-1]["properties"] == being_written["properties"]
    assert read[-1]["uniqKey"] == being_written["uniqKey"]


def test_a_key_look_up_without_index_files_says_what_to_do(tmp_path: Path) -> None:
    """No index files: ``rmqstore dispatch`` makes them; but while another process holds
    the lock (a rebuild has moved them to quarantine and not yet made the new ones, a
    broker starting), dispatch would be refused: run the look-up again once it is done."""
    store = tmp_path / "store"
    generate("basic", store)
    for index_file in (store / "index").iterdir():
        index_file.unlink()
    result = run_cli("read", store, "--key", "k1")
    assert result.exit_code == 2  # NotFoundError: an input error
    assert result.stderr.strip().endswith("the store has no index files; run rmqstore dispatch")
    with lock_held_elsewhere(store / "lock"):
        held = run_cli("read", store, "--key", "k1")
    assert held.exit_code == 2
    assert "the store has no index files (another process holds its lock" in held.stderr
    assert "run rmqstore dispatch" not in held.stderr


def test_numbers_copied_from_info_go_back_into_options(tmp_path: Path) -> None:
    """info shows offsets and sizes in groups of three digits (``16,384``); an option given
    one takes it as the number, not as 'not a valid integer'."""
    store = tmp_path / "store"
    generate("basic", store)
    shown = run_cli("info", store).stdout
    (size,) = re.findall(r"commit log (\d{1,3}(?:,\d{3})+)", shown)
    (end,) = re.findall(r"offsets +0 \.\. (\d{1,3}(?:,\d{3})+)", shown)
    assert run_cli("verify", store, "--commitlog-file-size", size).exit_code == 0
    at_end = run_cli("read", store, "--from-offset", end, "--jsonl")
    assert at_end.exit_code == 0 and at_end.stdout == ""
    last = json.loads(
        run_cli("read", store, "--from-offset", "0", "--jsonl").stdout.splitlines()[-1]
    )
    assert last["commitLogOffset"] >= 1000
    grouped = f"{last['commitLogOffset']:,}"
    by_grouped = run_cli("read", store, "--offset", grouped, "--json")
    assert by_grouped.exit_code == 0 and json.loads(by_grouped.stdout) == last
    for wrong in ("1,0", "10,00", "1,000,", ",100"):  # not groups of three: refused as before
        refused = run_cli("read", store, "--offset", wrong)
        assert refused.exit_code == 2 and "is not a valid integer" in refused.stderr, wrong


def _read_into_a_pipe(store: Path, *output: str) -> subprocess.Popen:
    """``rmqstore read STORE --from-offset 0 --jsonl`` (or ``output``: a megabyte of lines)
    into a pipe."""
    read = ["read", str(store), "--from-offset", "0", *(output or ["--jsonl"])]
    return subprocess.Popen(
        [sys.executable, "-m", "rmqstore", *read],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=sigint_delivered,
    )


def _lines_store(tmp_path: Path, body: str = "m{n:05d}" * 40) -> Path:
    store = tmp_path / "store"
    messages = tmp_path / "messages.jsonl"
    messages.write_text(
        "".join(json.dumps({"topic": "T", "body": body.format(n=n)}) + "\n" for n in range(3000))
    )
    created = run_cli("append", store, "--create", "--input", messages)
    assert created.exit_code == 0, created.stderr
    return store


@pytest.mark.parametrize(
    ("number", "code", "said"),
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated (SIGTERM)")],
)
def test_a_signal_while_the_reader_lags_leaves_whole_lines(
    tmp_path: Path, number: int, code: int, said: str
) -> None:
    """A stop signal while ``read --jsonl`` waits for a reader that lags (the pipe full):
    the output ended in half a line every time (a large write through stdout's buffer cut
    part way); the stop now waits until the line in flight is out, so a script reading the
    lines parses every one."""
    reading = _read_into_a_pipe(_lines_store(tmp_path))
    out, err = stopped_while_the_reader_lags(reading, number)
    assert reading.returncode == code, err
    assert err.decode().strip() == f"rmqstore: error: {said}"
    assert out.endswith(b"\n")
    bodies = [json.loads(line)["body"] for line in out.splitlines()]
    assert 0 < len(bodies) < 3000
    assert bodies == [f"m{n:05d}" * 40 for n in range(len(bodies))]


def test_a_signal_while_the_reader_lags_leaves_whole_csv_rows(tmp_path: Path) -> None:
    """``read --csv`` of bodies holding line feeds (quoted fields of several lines), stopped
    while its reader lags: the stop waited for the line in flight, which ended inside a
    quoted body, and the last row was cut there (a CSV reader took half a body, or failed
    on the open quote); it now waits for the row."""
    import csv
    import io

    body = "m{n:05d} first line\n" + "a line of the body\n" * 30 + "m{n:05d} last line"
    reading = _read_into_a_pipe(
        _lines_store(tmp_path, body), "--csv", "--fields", "queueOffset,body"
    )
    out, err = stopped_while_the_reader_lags(reading, signal.SIGTERM)
    assert reading.returncode == 143, err
    rows = list(csv.DictReader(io.StringIO(out.decode(), newline=""), strict=True))
    assert 0 < len(rows) < 3000
    assert [row["body"] for row in rows] == [body.format(n=n) for n in range(len(rows))]
    assert out.endswith(b"\n") and not out.endswith(b"line\n")


@pytest.mark.parametrize("crc", [[], ["--verify-crc"]])  # the kernel's blocks; one by one
def test_a_signal_while_the_reader_lags_leaves_a_whole_json_array(
    tmp_path: Path, crc: list[str]
) -> None:
    """``read --json`` (one array) stopped while its reader lags: the output ended inside an
    element, or after a comma, and a script could not parse any of it (4 of 4 runs); the
    stop now waits for the element in flight and the array is closed, as when an error ends
    the read, so the script gets the messages written (the exit code says the read was
    stopped)."""
    reading = _read_into_a_pipe(_lines_store(tmp_path), "--json", *crc)
    out, err = stopped_while_the_reader_lags(reading, signal.SIGTERM)
    assert reading.returncode == 143, err
    bodies = [document["body"] for document in json.loads(out)]
    assert 0 < len(bodies) < 3000
    assert bodies == [f"m{n:05d}" * 40 for n in range(len(bodies))]
    assert out.endswith(b"\n]\n")


def test_a_stop_waits_no_longer_than_a_second_for_a_reader_that_takes_nothing(
    tmp_path: Path,
) -> None:
    """The stop waits for the line in flight only as long as the reader takes some of it:
    a reader that takes nothing more (the pipe full, never read again) does not keep the
    command from stopping."""
    reading = _read_into_a_pipe(_lines_store(tmp_path))
    try:
        wait_to_write(reading)
        reading.send_signal(signal.SIGTERM)
        reading.wait(timeout=30)  # the pipe is not read: it ends all the same
    finally:
        if reading.poll() is None:
            reading.kill()
    assert reading.returncode == 143
    assert reading.stderr is not None
    assert reading.stderr.read().decode().strip() == "rmqstore: error: terminated (SIGTERM)"
