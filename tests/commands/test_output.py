"""Human output that is not on a terminal: plain lines, never wrapped or cut, no trailing
spaces, no box drawing, so identifiers survive pipes and files whole."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rmqstore.fixtures import FixtureOptions, generate

from support import run_cli

pytestmark = pytest.mark.plumbing

BOX_DRAWING = set("│┃─━┏┓┗┛┡┩╇┼╋└┘┌┐")


@pytest.fixture(scope="module")
def torn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("output") / "torn-with-a-long-folder-name-to-make-paths-long"
    generate("torn-tail", out, FixtureOptions())
    return out


def plain(*args: str | Path) -> str:
    result = run_cli(*args, env={"COLUMNS": "60"})
    assert result.exit_code in (0, 1), result.stderr
    for line in result.stdout.splitlines():
        assert line == line.rstrip(), f"trailing spaces: {line!r}"
        assert not BOX_DRAWING & set(line), f"box drawing: {line!r}"
    return result.stdout


def test_identifiers_are_never_split_at_60_columns(torn: Path) -> None:
    first = json.loads(run_cli("read", torn, "--offset", "0", "--json").stdout)
    assert first["msgId"] in plain("read", torn, "--offset", "0")
    table = plain("read", torn, "--from-offset", "0", "--count", "3")
    assert table.splitlines()[0].split() == [
        "offset", "msgId", "topic", "queue", "q.offset", "size", "stored", "tags", "keys",
        "body",
    ]  # fmt: skip
    info = json.loads(run_cli("info", torn, "--json").stdout)
    text = plain("info", torn)
    assert info["commitLog"]["lastFile"] in text and str(torn) in text
    plan = json.loads(run_cli("recover", torn, "--dry-run", "--json").stdout)["plan"]
    shown = plain("recover", torn, "--dry-run")
    for cut in plan["cuts"]:
        assert cut["file"] in shown
    for name in ("verify", "stats"):
        extra = ["--engine", "local"] if name == "stats" else []
        plain(name, torn, *extra)
    plain("fixtures", "list")


def test_only_writers_suggest_create(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a store")
    for command in (["info"], ["verify"], ["read", "--offset", "0"]):
        result = run_cli(command[0], tmp_path, *command[1:])
        assert result.exit_code == 2 and "not a RocketMQ store" in result.stderr
        assert "--create" not in result.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "--create" in run_cli("append", empty, "--topic", "T", "--body", "x").stderr


def test_identifiers_stay_whole_in_every_command(torn: Path, tmp_path: Path) -> None:
    """At 60 columns into a pipe, every file name, offset and topic a command's JSON holds
    appears whole in its human output."""
    stats = json.loads(run_cli("stats", torn, "--engine", "local", "--json").stdout)
    text = plain("stats", torn, "--engine", "local")
    for entry in stats["files"]:
        assert Path(entry["file"]).name in text
    for queue in stats["queues"]:
        assert queue["topic"] in text
    report = json.loads(run_cli("verify", torn, "--json").stdout)
    text = plain("verify", torn)
    for finding in report["findings"]:
        assert finding["file"] in text and str(finding["commitLogOffset"] or "") in text
    topic = stats["queues"][0]["topic"]
    status = json.loads(run_cli("info", torn, "--topic", topic, "--json").stdout)
    assert topic in plain("info", torn, "--topic", topic) and status
    first = sorted((torn / "commitlog").iterdir())[0]
    dumped = plain("dump", first, "--count", "5")
    for line in run_cli("dump", first, "--count", "5", "--jsonl").stdout.splitlines():
        item = json.loads(line)
        assert f"offset {item['commitLogOffset']} " in dumped
    manifest = json.loads(run_cli("fixtures", "describe", "torn-tail", torn, "--json").stdout)
    assert manifest["damage"]["file"] in plain("fixtures", "describe", "torn-tail", torn)
    copy = tmp_path / "copy"
    generate("torn-tail", copy, FixtureOptions())
    assert run_cli("recover", copy, "--yes").exit_code in (0, 1)
    listed = json.loads(run_cli("quarantine", "list", copy, "--json").stdout)
    text = plain("quarantine", "list", copy)
    assert listed["folders"]
    for entry in listed["folders"]:
        assert entry["name"] in text


def _with_terminal_stderr(*args: str | Path) -> tuple[int, bytes, bytes]:
    """Run ``rmqstore ARGS`` in a new process whose stderr is a terminal (a pty)."""
    master, slave = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "rmqstore", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=slave,
        env={**os.environ, "COLUMNS": "80"},
    )
    os.close(slave)
    seen = bytearray()

    def pump() -> None:
        with contextlib.suppress(OSError):  # EIO once the process has closed the terminal
            while chunk := os.read(master, 65536):
                seen.extend(chunk)

    reader = threading.Thread(target=pump)
    reader.start()
    assert process.stdout is not None
    out = process.stdout.read()
    code = process.wait()
    reader.join()
    os.close(master)
    return code, out, bytes(seen)


def test_progress_draws_on_a_terminal_and_leaves_stdout_alone(tmp_path: Path) -> None:
    store = tmp_path / "store"
    generate("large", store, FixtureOptions(messages=20000))
    code, out, terminal = _with_terminal_stderr("read", store, "--from-offset", "0", "--jsonl")
    assert code == 0
    assert out.count(b"\n") == 20000  # every message on stdout, none in the bar's stream
    assert b"reading" in terminal and b"BenchmarkTopic" not in terminal
    code, out, terminal = _with_terminal_stderr("--no-progress", "verify", store)
    assert code == 0 and b"sound" in out and terminal == b""
    code, _, terminal = _with_terminal_stderr("verify", store)
    assert code == 0 and b"verifying" in terminal


def _keys(document: object) -> set[str]:
    """Every key of every object in a JSON document (map values of properties aside: those
    are the message's own property names)."""
    if isinstance(document, list):
        return set().union(*map(_keys, document)) if document else set()
    if not isinstance(document, dict):
        return set()
    keys = set(document)
    for name, value in document.items():
        if name not in ("properties", "findingsByKind", "sources", "queueMaxOffsets"):
            keys |= _keys(value)
    return keys


def test_every_json_key_is_camel_case(torn: Path, tmp_path: Path) -> None:
    copy, recovered = tmp_path / "copy", tmp_path / "recovered"
    generate("basic", copy, FixtureOptions())
    generate("torn-tail", recovered, FixtureOptions())
    assert run_cli("recover", recovered, "--yes").exit_code in (0, 1)
    first = sorted((torn / "commitlog").iterdir())[0]
    commands = [
        ["info", torn, "--json"],
        ["info", torn, "--topic", "TopicTest", "--json"],
        ["read", torn, "--offset", "0", "--json"],
        ["read", torn, "--from-offset", "0", "--count", "5", "--json"],
        ["verify", torn, "--json"],
        ["stats", torn, "--engine", "local", "--json"],
        ["recover", torn, "--dry-run", "--json"],
        ["dispatch", torn, "--rebuild", "--dry-run", "--json"],
        ["fixtures", "describe", "torn-tail", torn, "--json"],
        ["fixtures", "list", "--json"],
        ["dump", first, "--count", "3", "--json"],
        ["append", copy, "--topic", "T", "--body", "x", "--json"],
        ["flush", copy, "--json"],
        ["quarantine", "list", recovered, "--json"],
        ["export", torn, "--to", tmp_path / "out", "--engine", "local", "--json"],
    ]
    for command in commands:
        result = run_cli(*command)
        assert result.exit_code in (0, 1), (command, result.stderr)
        keys = _keys(json.loads(result.stdout))
        assert keys, command
        bad = {key for key in keys if "_" in key or key[:1].isupper() or "-" in key}
        assert not bad, (command, bad)


def test_read_json_has_one_shape_per_mode(torn: Path) -> None:
    one = json.loads(run_cli("read", torn, "--offset", "0", "--json").stdout)
    assert isinstance(one, dict) and {"msgId", "uniqKey", "commitLogOffset"} <= set(one)
    assert json.loads(run_cli("read", torn, "--msg-id", one["msgId"], "--json").stdout) == one
    by_client_id = json.loads(run_cli("read", torn, "--msg-id", one["uniqKey"], "--json").stdout)
    assert by_client_id == one
    for mode in (
        ["--from-offset", "0", "--count", "2"],
        ["--topic", one["topic"], "--count", "2"],
        ["--topic", one["topic"], "--queue", str(one["queueId"]), "--count", "2"],
        ["--uniq-key", one["uniqKey"]],
    ):
        many = json.loads(run_cli("read", torn, *mode, "--json").stdout)
        assert isinstance(many, list) and many and all(isinstance(m, dict) for m in many), mode
        assert set(many[0]) == set(one), mode
    none = run_cli("read", torn, "--key", "no-such-key", "--json")
    assert none.exit_code == 1 and json.loads(none.stdout) == []
    timed = json.loads(
        run_cli(
            "read", torn, "--topic", one["topic"], "--queue", str(one["queueId"]),
            "--time", str(one["storeTimestamp"]), "--json",
        ).stdout
    )  # fmt: skip
    assert set(timed) == {"topic", "queueId", "timestamp", "rule", "queueOffset", "message"}
    assert timed["message"]["msgId"] == one["msgId"]


def test_a_long_read_table_streams_with_one_header_and_every_msg_id(torn: Path) -> None:
    documents = [
        json.loads(line)
        for line in run_cli("read", torn, "--from-offset", "0", "--jsonl").stdout.splitlines()
    ]
    assert len(documents) > 150  # more than one chunk of the streamed table
    lines = plain("read", torn, "--from-offset", "0").splitlines()
    assert lines[0].split()[:2] == ["offset", "msgId"]
    assert len(lines) == len(documents) + 1  # one header
    for line, document in zip(lines[1:], documents, strict=True):
        assert line.split()[:2] == [str(document["commitLogOffset"]), document["msgId"]]
    starts = {line.index(line.split()[1]) for line in lines[1:]}
    assert len(starts) == 1  # the msgId column stays where it is across chunks


def test_info_stats_and_verify_print_rows_as_csv_and_jsonl(torn: Path) -> None:
    info = json.loads(run_cli("info", torn, "--json").stdout)
    queues = [(t["topic"], q["queueId"]) for t in info["topics"] for q in t["queues"]]
    rows = run_cli("info", torn, "--csv").stdout.splitlines()
    assert rows[0] == "topic,queueId,messages,minOffset,maxOffset,notQueued"
    assert len(rows) == len(queues) + 1
    lines = [json.loads(line) for line in run_cli("info", torn, "--jsonl").stdout.splitlines()]
    assert [(line["topic"], line["queueId"]) for line in lines] == queues
    stats = run_cli("stats", torn, "--engine", "local", "--jsonl", "--fields", "topic,maxOffset")
    assert all(
        set(json.loads(line)) == {"topic", "maxOffset"} for line in stats.stdout.splitlines()
    )
    report = json.loads(run_cli("verify", torn, "--json").stdout)
    found = [json.loads(line) for line in run_cli("verify", torn, "--jsonl").stdout.splitlines()]
    assert [f["kind"] for f in found] == [f["kind"] for f in report["findings"]]
    assert all("fix" in f and "commitLogOffset" in f for f in found)
    both = run_cli("verify", torn, "--json", "--jsonl")
    assert both.exit_code == 2


def _terminal_bytes(*args: str | Path, columns: int = 400) -> str:
    """``rmqstore ARGS`` with stdout on a terminal (a pty) ``columns`` wide, every byte as
    written."""
    master, slave = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "rmqstore", *map(str, args)],
        stdout=slave,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "COLUMNS": str(columns)},
    )
    os.close(slave)
    seen = bytearray()
    with contextlib.suppress(OSError):
        while chunk := os.read(master, 65536):
            seen.extend(chunk)
    process.wait()
    os.close(master)
    return seen.decode("utf-8", "replace")


def _on_terminal(*args: str | Path, columns: int = 60) -> str:
    """``rmqstore ARGS`` with stdout on a terminal (a pty) ``columns`` wide, escapes removed."""
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", _terminal_bytes(*args, columns=columns))


def test_identifiers_stay_whole_on_a_narrow_terminal(torn: Path) -> None:
    stats = json.loads(run_cli("stats", torn, "--engine", "local", "--json").stdout)
    text = _on_terminal("stats", torn, "--engine", "local")
    for entry in stats["files"]:
        assert Path(entry["file"]).name in text
    for queue in stats["queues"]:
        assert f"{queue['bytes']:,}" in text
    report = json.loads(run_cli("verify", torn, "--json").stdout)
    text = _on_terminal("verify", torn)
    for finding in report["findings"]:
        assert finding["file"] in text
    first = json.loads(run_cli("read", torn, "--offset", "0", "--json").stdout)
    assert first["msgId"] in _on_terminal("read", torn, "--offset", "0")
    assert first["msgId"] in _on_terminal("read", torn, "--from-offset", "0", "--count", "3")


@pytest.mark.parametrize("name", ["s1_multi", "v533_s1_multi", "s3_txn_delay"])
def test_document_json_is_what_the_standard_encoder_writes(oracle, name: str) -> None:
    """``document_json`` (orjson where it takes the document) writes what ``json_text``
    (``json.dumps(..., ensure_ascii=False, separators=(",", ":"))``) writes: for every message
    of the broker stores with every body encoding, and for text and keys orjson escapes or
    refuses."""
    from rmqstore.commands.output import document_json, json_text, message_document
    from rmqstore.reader import MessageReader
    from rmqstore.store import Store

    def standard(document: object) -> str:
        return json.dumps(document, ensure_ascii=False, separators=(",", ":"))

    documents: list[object] = [
        {"text": '\x00\x01\x1f\x7f\n\r\t\b\f"\\/ é 中 😀 \u2028\u2029'},
        {1: "an int key", "nested": {"list": [1, None, True, 2**63 - 1, -(2**63)]}},
        {"lone": "\ud800"},
    ]
    with Store.open_read(oracle(name).store) as store:
        messages = MessageReader(store).sequential(store.commitlog.min_offset)
        for number, message in enumerate(messages):
            mode = ("auto", "text", "hex", "base64", "none")[number % 5]
            documents.append(message_document(message, mode))
    assert len(documents) > 100
    for document in documents:
        assert document_json(document) == json_text(document) == standard(document)


def test_message_data_is_shown_as_it_is_never_as_markup_or_terminal_codes(
    tmp_path: Path,
) -> None:
    """A body, keys or tags holding rich markup (``[/]``, ``[debug]``, ``[link=...]``), an
    ``:emoji:`` code or control characters (an escape sequence, one retitling the window, a
    line feed). ``read`` failed with exit 70 on ``[/]`` (rich's MarkupError), dropped
    ``[debug]``, made ``:smile:`` an emoji, and wrote the escape sequences to the terminal
    as they were; a store file's name did the same in ``verify``, and an error naming a path
    with a line feed took two lines. Now human output shows the text as it is, each control
    character escaped, on a terminal and in plain lines; JSON keeps the bytes."""
    store = tmp_path / "store"
    generate("basic", store, FixtureOptions())
    body = "\x1b]0;pwned\x07[/] [debug] a\nb :smile: [link=http://x]y[/link] \u202e."
    appended = run_cli(
        "append", store, "--topic", "BasicTopic", "--body", body, "--keys", "k[/]",
        "--tags", "t\x1b[1m", "--dispatch", "--jsonl",
    )  # fmt: skip
    assert appended.exit_code == 0, appended.stderr
    offset = str(json.loads(appended.stdout)["commitLogOffset"])
    # (a table shows a body's first 40 characters; the one message's fields all of it)
    as_shown = "\\x1b]0;pwned\\x07[/] [debug] a\\nb :smile:"
    whole = as_shown + " [link=http://x]y[/link] \\u202e."
    reads = (
        ["read", store, "--offset", offset],
        ["read", store, "--from-offset", offset],
        ["read", store, "--topic", "BasicTopic", "--queue", "0", "--begin", "1"],
    )
    for args in reads:
        result = run_cli(*args)
        assert result.exit_code == 0, (args, result.stderr)
        assert as_shown in result.stdout and "k[/]" in result.stdout
        assert whole in result.stdout or "--offset" not in args
        assert "t\\x1b[1m" in result.stdout and "\x1b" not in result.stdout
        raw = _terminal_bytes(*args)
        assert "\x1b]" not in raw and "\x07" not in raw and "\u202e" not in raw, args
        styles_removed = re.sub(r"\x1b\[[0-9;]*m", "", raw)
        assert as_shown in styles_removed and "t\\x1b[1m" in styles_removed, args
    document = json.loads(run_cli("read", store, "--offset", offset, "--json").stdout)
    assert document["body"] == body and document["keys"] == "k[/]"
    (store / "commitlog" / "evil\x1b]0;title\x07[red]x").touch()
    report = run_cli("verify", store)
    assert "commitlog/evil\\x1b]0;title\\x07[red]x" in report.stdout
    assert "\x1b" not in report.stdout and "\x1b]" not in _terminal_bytes("verify", store)
    dumped = run_cli("dump", store / "commitlog" / "evil\x1b]0;title\x07[red]x")
    assert "evil\\x1b]0;title\\x07[red]x" in dumped.stdout and "\x1b" not in dumped.stdout
    odd = tmp_path / "line\nfeed"
    odd.mkdir()
    refused = run_cli("verify", odd)
    assert refused.exit_code == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "line\\nfeed" in refused.stderr


def test_text_in_rmqstores_own_styled_lines_stays_literal() -> None:
    """rmqstore's styled lines (a recover plan's warnings, a dispatch plan's damage, verify's
    verdict) hold engine text that may name the store's paths: it is shown as it is, a
    backslash before a ``[`` and a trailing one included, and the styles still apply."""
    from rmqstore.commands.output import Styled, _plain_text, _rich_text

    for data in ["x\\[red]y[/red]", "[/]", "a\\", "[bold]b :smile:", "c\x1bd\ne"]:
        line = Styled("  ", ("cannot mend:", "yellow"), f" {data}")
        literal = data.replace("\x1b", "\\x1b").replace("\n", "\\n")
        assert _plain_text(line) == f"  cannot mend: {literal}"
        rendered = _rich_text(line)
        assert rendered.plain == f"  cannot mend: {literal}" and rendered.spans


@pytest.mark.parametrize("kernel", ["auto", "python"])
def test_a_locale_that_is_not_utf8_escapes_human_output_and_keeps_data_utf8(
    tmp_path: Path, kernel: str
) -> None:
    """Under a Latin-1 locale the table writes é as Latin-1 and 标签 as an escape (it ended
    in an internal error, exit 70); JSON, JSON lines, CSV and TSV are the UTF-8 bytes a
    UTF-8 locale gets, whichever kernel writes the rows."""
    store = tmp_path / "magasin-été"
    generate("multi", store)
    first = store / "commitlog" / "00000000000000000000"

    def run(encoding: str, *args: str | Path) -> bytes:
        env = {**os.environ, "PYTHONIOENCODING": encoding, "RMQSTORE_KERNEL": kernel}
        done = subprocess.run(
            [sys.executable, "-m", "rmqstore", *map(str, args)], capture_output=True, env=env
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    table = run("latin-1", "read", store, "--from-offset", "0", "--count", "600")
    assert b"\\u6807\\u7b7e" in table  # 标签
    assert "kéy-1".encode("latin-1") in table
    assert "kéy-1".encode() not in table
    for args in (
        ("read", store, "--from-offset", "0", "--count", "600", "--json"),
        ("read", store, "--from-offset", "0", "--count", "600", "--jsonl"),
        ("read", store, "--from-offset", "0", "--count", "600", "--csv"),
        ("read", store, "--key", "kéy-1", "--tsv"),
        ("dump", first, "--json"),  # the file's name
        ("fixtures", "describe", "multi", store, "--json"),
    ):
        data = run("latin-1", *args)
        assert any(text.encode() in data for text in ("标签", "kéy-1", "été")), args
        assert data == run("utf-8", *args), args
