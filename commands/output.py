"""Rendering shared by the commands: JSON, rich tables, bodies, timestamps, progress, notes."""

from __future__ import annotations

import base64
import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from rmqstore.record import Message

BODY_MODES = ("auto", "text", "hex", "base64", "none", "raw")


class HumanOutput:
    """Human output on stdout. On a terminal: rich text and tables. Anywhere else (a pipe, a
    file): plain lines that are never wrapped or cut and end without spaces, and tables as
    aligned columns without box drawing, so identifiers (msgIds, file names, offsets) survive
    ``| cat``, ``| grep`` and ``> file`` whole."""

    def __init__(self) -> None:
        self._terminal = Console(highlight=False, soft_wrap=False)

    def print(self, renderable: Any = "") -> None:
        if sys.stdout.isatty():
            self._terminal.print(renderable)
            return
        for line in plain_lines(renderable):
            click.echo(line)


def plain_lines(renderable: Any) -> list[str]:
    """``renderable`` (markup text or a rich Table) as plain lines with no trailing spaces."""
    if isinstance(renderable, Table):
        return _table_lines(renderable)
    text = renderable if isinstance(renderable, Text) else Text.from_markup(str(renderable))
    return [line.rstrip() for line in text.plain.split("\n")]


def _table_lines(table: Table) -> list[str]:
    rows = [[_cell_text(cell) for cell in column.cells] for column in table.columns]
    cells = list(zip(*rows, strict=True)) if rows else []
    if table.show_header:
        cells.insert(0, tuple(_cell_text(column.header) for column in table.columns))
    widths = [max((len(row[i]) for row in cells), default=0) for i in range(len(table.columns))]
    lines = [_cell_text(table.title)] if table.title else []
    for row in cells:
        parts = []
        for index, (value, width) in enumerate(zip(row, widths, strict=True)):
            right = table.columns[index].justify == "right"
            parts.append(value.rjust(width) if right else value.ljust(width))
        lines.append("  ".join(parts).rstrip())
    return lines


def _cell_text(cell: Any) -> str:
    if isinstance(cell, Text):
        return cell.plain
    return Text.from_markup(str(cell)).plain if cell is not None else ""


console = HumanOutput()
error_console = Console(stderr=True, highlight=False)


def emit_json(document: Any) -> None:
    click.echo(json.dumps(document, ensure_ascii=False, indent=2))


def emit_jsonl(document: Any) -> None:
    sys.stdout.write(json_text(document) + "\n")


def json_text(document: Any) -> str:
    """Compact JSON (one line), UTF-8 characters kept as they are."""
    return json.dumps(document, ensure_ascii=False, separators=(",", ":"))


def warn(message: str) -> None:
    click.echo(f"rmqstore: warning: {message}", err=True)


def note(message: str) -> None:
    click.echo(f"rmqstore: {message}", err=True)


def format_millis(millis: int) -> str:
    """An epoch-millisecond value as local time with milliseconds (``-`` for 0)."""
    if millis <= 0:
        return "-"
    try:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(millis / 1000))
    except (OverflowError, OSError, ValueError):
        return str(millis)
    return f"{stamp}.{millis % 1000:03d}"


def encode_body(body: bytes | None, mode: str) -> tuple[str | None, str | None]:
    """The body as (value, encoding) for JSON and tables; ``auto`` is text when the bytes are
    valid UTF-8, else base64."""
    if body is None or mode == "none":
        return None, None
    if mode in ("auto", "text"):
        try:
            return body.decode("utf-8"), "text"
        except UnicodeDecodeError:
            if mode == "text":
                return body.decode("utf-8", "replace"), "text-lossy"
    if mode == "hex":
        return body.hex().upper(), "hex"
    return base64.b64encode(body).decode("ascii"), "base64"


def message_document(message: Message, body_mode: str, body: bytes | None = None) -> dict:
    """A message under RocketMQ's field names plus ``body``/``bodyEncoding``."""
    document = message.fields()
    value, encoding = encode_body(message.body if body is None else body, body_mode)
    if encoding is not None:
        document["body"] = value
        document["bodyEncoding"] = encoding
    return document


@contextmanager
def progress_bar(description: str, total: int, enabled: bool) -> Iterator[Callable[[int], None]]:
    """Yields ``update(completed)``; draws a bar on stderr only when it is a terminal."""
    if not enabled or not sys.stderr.isatty() or total <= 0:
        yield lambda completed: None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=error_console, transient=True) as progress:
        task = progress.add_task(description, total=total)
        yield lambda completed: progress.update(task, completed=completed)


def confirm_or_refuse(what: str, summary: str) -> None:
    """Before destructive work: ask on a terminal; elsewhere refuse (a usage error) unless
    the command was given --yes. ``what`` names the work ("recover"), ``summary`` says it."""
    if not sys.stdin.isatty():
        raise click.UsageError(
            f"{what} would {summary}; add --yes to confirm, or --dry-run to see the plan"
        )
    if not click.confirm(f"{summary[0].upper()}{summary[1:]}?", default=False, err=True):
        raise click.Abort()
