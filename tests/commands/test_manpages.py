"""Man pages are generated from the click tree: every command and option documented, no page
stale."""

from __future__ import annotations

import click
import pytest

from rmqstore.commands.main import cli
from rmqstore.commands.manpages import generated_pages

from support import REPO

pytestmark = pytest.mark.plumbing


def walk(command: click.Command, path: str):
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from walk(sub, f"{path} {name}")


def test_every_command_and_option_has_help() -> None:
    for path, command in walk(cli, "rmqstore"):
        assert command.help and command.help.strip(), f"{path} has no help text"
        for param in command.params:
            if isinstance(param, click.Option):
                assert param.help, f"{path} {param.opts} has no help text"


def test_checked_in_pages_are_current() -> None:
    for name, text in generated_pages().items():
        page = REPO / "man" / name
        assert page.exists(), f"man/{name} is missing: run 'make man'"
        assert page.read_text(encoding="utf-8") == text, f"man/{name} is stale: run 'make man'"
    assert (REPO / "man" / "rmqstore-store.5").exists()


def test_main_page_documents_the_exit_codes() -> None:
    page = generated_pages()["rmqstore.1"]
    assert ".SH EXIT STATUS" in page
    for code in (0, 1, 2, 3, 4):
        assert f".B {code}\n" in page
