"""Human output that is not on a terminal: plain lines, never wrapped or cut, no trailing
spaces, no box drawing, so identifiers survive pipes and files whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rmqstore.fixtures import FixtureOptions, generate

from support import run_cli

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
        "offset", "topic", "queue", "q.offset", "size", "stored", "tags", "keys", "body",
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
