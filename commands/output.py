"""Rendering shared by the commands: JSON, rich tables, bodies, timestamps, progress, notes."""

from __future__ import annotations

import functools
import json
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import click

from rmqstore.documents import (  # noqa: F401  (encode_body and message_document for the commands)
    delimited_row,
    document_cells,
    encode_body,
    message_document,
)
from rmqstore.times import format_store_time
from rmqstore.wording import counted  # noqa: F401  (the commands take it from here)

BODY_MODES = ("auto", "text", "hex", "base64", "none", "raw")


class Styled(tuple):
    """A line or cell in parts, some of them styled: a ``(text, style)`` pair is ``text`` in
    a rich style on a terminal (plain anywhere else), any other part is text. Every part is
    shown as it is: rmqstore parses no rich markup, so message data, file and topic names
    in its output are never taken for it (a body's ``[debug]`` or ``:smile:`` became a style
    or an emoji, and a bare ``[/]`` failed the command with exit 70)."""

    def __new__(cls, *parts: str | tuple[str, str]) -> Styled:
        return super().__new__(cls, parts)

    @property
    def plain(self) -> str:
        return "".join(shown(part if isinstance(part, str) else part[0]) for part in self)


# characters a terminal acts on instead of showing them: C0 controls (a line feed included,
# so that a value stays on its row, and ESC, which starts the sequences that recolour, move
# the cursor, retitle the window or hide what follows), DEL, C1 controls (0x9b is a CSI to
# some terminals), the Unicode line and paragraph separators, and the bidirectional
# overrides and isolates, which reorder what is shown
_UNSHOWN = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_SHOWN_AS = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def shown(text: str) -> str:
    """``text`` for human output (tables, plain lines, stderr): each character a terminal
    would act on written as an escape (``\\x1b``, ``\\n``, ``\\u202e``), so data read from a
    store (a body, a key, a file name) neither drives the operator's terminal nor breaks a
    line. JSON, CSV and TSV are data and keep their characters (JSON escapes its own)."""
    if not _UNSHOWN.search(text):
        return text
    return _UNSHOWN.sub(_escaped, text)


def _escaped(found: re.Match[str]) -> str:
    character = found.group()
    code = ord(character)
    return _SHOWN_AS.get(character) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


class Grid:
    """A table of human output, built with the calls of a rich ``Table`` (``add_column``,
    ``add_row``, the same options). On a terminal rich draws it (and is imported only then);
    anywhere else it is plain aligned columns. A column is never wrapped or cut (identifiers:
    file names, msgIds, offsets stay whole) unless it is added with ``wrap=True`` (prose,
    topics), which folds it within its own column on a narrow terminal."""

    def __init__(self, title: str | None = None, **options: Any) -> None:
        self.title = title
        self.options = options
        self.show_header = options.get("show_header", True)
        self.columns: list[tuple[str, dict[str, Any]]] = []
        self.rows: list[tuple[Any, ...]] = []

    def add_column(self, header: str = "", *, wrap: bool = False, **options: Any) -> None:
        self.columns.append((header, {**options, _WRAP: wrap}))

    def add_row(self, *cells: Any) -> None:
        self.rows.append(cells)

    def to_rich(self, room: int) -> tuple[Any, int]:
        """The rich Table for a terminal ``room`` columns wide, and the width it takes: every
        unwrapped column as wide as its longest cell; the folding columns share what is left
        (each at least as wide as its longest word, up to 64, so identifiers stay whole)."""
        from rich.table import Table

        columns = []
        fixed = 1  # the left border
        for number, (header, options) in enumerate(self.columns):
            options = dict(options)
            wrap = options.pop(_WRAP)
            texts = [_plain_text(row[number]) for row in self.rows]
            longest = max([len(_plain_text(header)) if self.show_header else 0, 1]
                          + [len(text) for text in texts])  # fmt: skip
            if wrap:
                words = [len(w) for text in texts for w in text.split() if len(w) <= _LONGEST]
                least = max([options.get("min_width") or 0, len(_plain_text(header)), *words])
                columns.append((header, options, least, longest))
            else:
                options["no_wrap"] = True
                options["width"] = max(options.pop("min_width", 0) or 0, longest)
                columns.append((header, options, None, longest))
            fixed += 3  # padding and a border
        folding = [c for c in columns if c[2] is not None]
        fixed += sum(c[1]["width"] for c in columns if c[2] is None)
        share = max(room - fixed, 0) // max(len(folding), 1)
        table = Table(title=self.title, **self.options)
        taken = fixed
        for header, options, least, longest in columns:
            if least is not None:
                width = max(least, min(longest, share))
                options.update(overflow="fold", width=width)
                taken += width
            table.add_column(header, **options)
        for row in self.rows:
            table.add_row(*(_rich_text(cell) for cell in row))
        return table, taken


_WRAP = "_wrap"  # the column option (ours, not rich's) that lets a column fold
_LONGEST = 64  # longer words (a body, a base64 blob) may be split in a folding column


def fields_grid(*, wrap_values: bool = False) -> Grid:
    """A summary of name/value rows: names in bold, no header, no borders."""
    grid = Grid(show_header=False, box=None, pad_edge=False)
    grid.add_column(style="bold")
    grid.add_column(wrap=wrap_values)
    return grid


class HumanOutput:
    """Human output on stdout. On a terminal: rich text and tables. Anywhere else (a pipe, a
    file): plain lines that are never wrapped or cut and end without spaces, and tables as
    aligned columns without box drawing, so identifiers (msgIds, file names, offsets) survive
    ``| cat``, ``| grep`` and ``> file`` whole. rich is imported only for a terminal (and for
    text holding markup)."""

    def __init__(self) -> None:
        self._terminal: Any = None

    def print(self, renderable: Any = "") -> None:
        if sys.stdout.isatty():
            if self._terminal is None:
                from rich.console import Console

                self._terminal = Console(highlight=False, soft_wrap=False, emoji=False)
            if isinstance(renderable, Grid):
                # wider than the terminal when its identifiers need it: the terminal then
                # wraps the line, but no identifier is cut or split by the table
                room = self._terminal.width
                table, needed = renderable.to_rich(room)
                if needed <= room:
                    self._terminal.print(table)
                else:  # a console as wide as the table needs (rich caps print's width)
                    from rich.console import Console

                    wide = Console(highlight=False, soft_wrap=False, width=needed, emoji=False)
                    wide.print(table, crop=False)
            elif isinstance(renderable, str | Styled):
                self._terminal.print(_rich_text(renderable, lines=True))
            else:
                self._terminal.print(renderable)
            return
        for line in plain_lines(renderable):
            click.echo(line)


def plain_lines(renderable: Any) -> list[str]:
    """``renderable`` (markup text, a :class:`Grid` or a rich Table) as plain lines with no
    trailing spaces."""
    if isinstance(renderable, Grid):
        return _grid_lines(renderable)
    table = sys.modules.get("rich.table")
    if table is not None and isinstance(renderable, table.Table):
        return _table_lines(renderable)
    if isinstance(renderable, str):
        return [shown(line).rstrip() for line in renderable.split("\n")]
    return [line.rstrip() for line in _plain_text(renderable).split("\n")]


def _grid_lines(grid: Grid) -> list[str]:
    cells = [tuple(_plain_text(cell) for cell in row) for row in grid.rows]
    if grid.show_header:
        cells.insert(0, tuple(_plain_text(header) for header, _ in grid.columns))
    justify = [options.get("justify") for _, options in grid.columns]
    least = [options.get("min_width") or 0 for _, options in grid.columns]
    return _aligned([_plain_text(grid.title)] if grid.title else [], cells, justify, least)


def _table_lines(table: Any) -> list[str]:
    rows = [[_plain_text(cell) for cell in column.cells] for column in table.columns]
    cells = list(zip(*rows, strict=True)) if rows else []
    if table.show_header:
        cells.insert(0, tuple(_plain_text(column.header) for column in table.columns))
    justify = [column.justify for column in table.columns]
    return _aligned([_plain_text(table.title)] if table.title else [], cells, justify)


def _aligned(
    lines: list[str],
    cells: list[tuple[str, ...]],
    justify: list[Any],
    least: list[int] | None = None,
) -> list[str]:
    """``cells`` as lines of columns two spaces apart, each as wide as its widest cell (and
    at least ``least``)."""
    widths = [max((len(row[i]) for row in cells), default=0) for i in range(len(justify))]
    if least is not None:
        widths = [max(width, floor) for width, floor in zip(widths, least, strict=True)]
    for row in cells:
        parts = []
        for index, (value, width) in enumerate(zip(row, widths, strict=True)):
            parts.append(value.rjust(width) if justify[index] == "right" else value.ljust(width))
        lines.append("  ".join(parts).rstrip())
    return lines


def _plain_text(cell: Any) -> str:
    """A cell or line as the text shown, without its styles, control characters shown."""
    if cell is None:
        return ""
    if isinstance(cell, str):
        return shown(cell)
    if isinstance(cell, Styled):
        return cell.plain
    text = sys.modules.get("rich.text")
    if text is not None and isinstance(cell, text.Text):
        return shown(cell.plain)
    return shown(str(cell))


def _rich_text(cell: Any, *, lines: bool = False) -> Any:
    """A cell (or, with ``lines``, text of several lines) for rich: shown as it is (never
    parsed as markup), control characters shown, :class:`Styled` parts in their styles."""
    from rich.text import Text

    if isinstance(cell, Styled):
        return Text.assemble(
            *(
                Text(shown(part)) if isinstance(part, str) else Text(shown(part[0]), part[1])
                for part in cell
            )
        )
    if isinstance(cell, Text):
        return cell if not _UNSHOWN.search(cell.plain) else Text(shown(cell.plain), cell.style)
    if cell is None:
        return Text("")
    if lines:
        return Text("\n".join(shown(line) for line in str(cell).split("\n")))
    return Text(shown(str(cell)))


console = HumanOutput()


def write_data(text: str, *, flush: bool = False) -> None:
    """Data for programs (JSON, JSON lines, CSV, TSV) on stdout, in UTF-8 whatever the
    locale's encoding, as JSON must be and as the rows written as bytes (the kernel's, a
    stream's) are. In a locale that is not UTF-8 (``LANG=de_DE.ISO-8859-1``,
    ``PYTHONIOENCODING=latin-1``) stdout's text layer wrote ``é`` as one Latin-1 byte
    beside rows of UTF-8, and ended in an internal error (exit 70) at a character the
    encoding lacks. Human output keeps the locale's encoding (see
    :func:`rmqstore.commands.main.main`)."""
    stdout = sys.stdout
    if _writes_utf8(stdout) or not hasattr(stdout, "buffer"):
        stdout.write(text)
        if flush:
            stdout.flush()
        return
    stdout.flush()  # what was written as text before it
    stdout.buffer.write(text.encode("utf-8", "surrogateescape"))
    if flush:
        stdout.buffer.flush()


def _writes_utf8(stream: Any) -> bool:
    import codecs

    encoding = getattr(stream, "encoding", None) or "utf-8"
    try:
        return codecs.lookup(encoding).name == "utf-8"
    except LookupError:
        return False


def emit_json(document: Any) -> None:
    write_data(json.dumps(document, ensure_ascii=False, indent=2) + "\n", flush=True)


def emit_json_line(document: Any) -> None:
    """A document (not only of text and integers, see :func:`document_json`) as one line of
    compact JSON, flushed: a line a program follows as it comes."""
    write_data(json_text(document) + "\n", flush=True)


def emit_jsonl(document: Any) -> None:
    """A message document as one line of JSON (see :func:`document_json`)."""
    write_data(document_json(document) + "\n")


def json_text(document: Any) -> str:
    """Compact JSON (one line), UTF-8 characters kept as they are."""
    return json.dumps(document, ensure_ascii=False, separators=(",", ":"))


def document_json(document: Any) -> str:
    """A document of text, integers, null, booleans, and lists and objects of them, no
    floats (a message document, :func:`message_document`; a ``dump`` item) as
    :func:`json_text` writes it, by orjson, several times as fast (a test holds the two to
    the same text). orjson writes floats otherwise, so other documents go through
    :func:`json_text`."""
    dumps = _fast_dumps()
    if dumps is not None:
        try:
            return dumps(document).decode("utf-8")
        except TypeError:  # orjson's refusal: keys that are not text, text that is not
            pass  # Unicode; the standard library's way then
    return json_text(document)


@functools.cache
def _fast_dumps() -> Callable[[Any], bytes] | None:
    """orjson's dumps, imported when JSON is first written (start-up stays light)."""
    try:
        from orjson import dumps
    except ImportError:  # pragma: no cover - a dependency, but the standard library does it too
        return None
    return dumps


def write_whole_lines(
    block: bytes | bytearray,
    *,
    atomic: bool = False,
    quoted_rows: bool = False,
    array: ArrayStream | None = None,
) -> None:
    """Write ``block`` (whole lines) to stdout so that a signal stopping the command leaves
    the other end whole lines only: the stop waits (see
    :func:`~rmqstore.commands.signals.held_stops`) until the line being written is out.
    Through stdout's buffer, a Ctrl-C met while a pipe's reader lagged cut a large write
    part way, and the output ended in half a line (``read --jsonl``: every time; the last
    message ``append`` reported). A reader that takes nothing more for a second gets the
    stop all the same, and can then be left half a line, unless ``atomic``: into a pipe,
    the lines then go in writes of whole lines of at most PIPE_BUF bytes, each of which a
    pipe takes whole or not at all (for what a producer acts on, ``append``'s report; the
    reads' output is not written so, as that made ``read --jsonl`` 25-45% slower). With
    ``quoted_rows`` (CSV/TSV rows, whose quoted fields may hold line feeds), the stop waits
    for the row in flight, not the line; with ``array`` (the elements of a JSON array, see
    :class:`JsonArrayOutput`), for the element in flight, and ``array`` notes how the
    stream ends."""
    import os

    from rmqstore.commands.signals import act_on_held, held_stops

    sys.stdout.flush()  # what was written as text before it
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (a test's captured output)
        sys.stdout.buffer.write(block)
        return
    view = memoryview(block)
    start, size = 0, len(view)
    most = _PIPE_ATOMIC if atomic and _stdout_is_pipe(fd) else size
    with held_stops() as stop_held:
        while start < size:
            if stop_held() and size == len(view):  # out with the line in flight, then stop
                if not start:
                    size = 0
                elif array is not None:
                    size = _element_end(block, start)
                else:
                    size = _line_end(block, start, quoted_rows)
                if start >= size:
                    if array is not None:
                        array.whole = True
                    act_on_held()
                continue
            end = size
            if size - start > most:  # whole lines, as many as fit (a longer one alone)
                cut = block.rfind(b"\n", start, start + most)
                if cut < start:
                    cut = block.find(b"\n", start + most)
                end = cut + 1 if cut >= 0 else size
            if array is not None:
                array.whole = False  # until the write is out, or stops where it may end
            written = os.write(fd, view[start:end])
            if array is not None and written:
                array.opened = True
            start += written
        if array is not None:  # out to the end, or to where a held stop cut it
            array.whole = True
            array.closed = size == len(view) and block.endswith(b"]\n")


def _line_end(block: bytes | bytearray, start: int, quoted_rows: bool) -> int:
    """Where the line (or, ``quoted_rows``, the CSV/TSV row: a line feed outside quotes)
    that ``block[start - 1]`` is part of ends: past its line feed (the block's end when
    none follows). ``block`` begins with a line (or row)."""
    end = block.find(b"\n", start - 1)
    while quoted_rows and end >= 0 and block.count(b'"', 0, end) % 2:
        end = block.find(b"\n", end + 1)  # inside a quoted field: the row goes on
    return len(block) if end < 0 else end + 1


def _element_end(block: bytes | bytearray, start: int) -> int:
    """Where the JSON array element ``block[start - 1]`` is part of ends (before the comma
    that follows it, or the array's closing), or past the ``[`` that opens the array; the
    block's end when neither follows. ``block`` begins with ``[`` or a separator."""
    if start == 1 and block[:1] == b"[":
        return 1
    ends = [end for end in (block.find(b",\n", start), block.find(b"\n]\n", start)) if end >= 0]
    return min(ends, default=len(block))


# a pipe takes a write of at most this many bytes whole or not at all (POSIX's PIPE_BUF)
_PIPE_ATOMIC = 4096


@functools.cache
def _stdout_is_pipe(fd: int) -> bool:
    import os
    import stat

    try:
        return stat.S_ISFIFO(os.fstat(fd).st_mode)
    except OSError:
        return False


class LineOutput:
    """Whole lines for stdout, gathered into writes of at least :data:`GATHERED` bytes
    (a line at a time, a write each was a system call a message) and written by
    :func:`write_whole_lines`."""

    GATHERED = 1 << 16

    def __init__(self) -> None:
        self._pending = bytearray()

    def write(self, lines: bytes) -> None:
        if not self._pending and len(lines) >= self.GATHERED:
            self._write_out(lines)
            return
        self._pending += lines
        if len(self._pending) >= self.GATHERED:
            self.flush()

    def flush(self) -> None:
        if self._pending:
            pending, self._pending = self._pending, bytearray()
            self._write_out(pending)

    def _write_out(self, block: bytes | bytearray) -> None:
        write_whole_lines(block)


@dataclass
class ArrayStream:
    """How the JSON array :class:`JsonArrayOutput` writes to stdout ends, as
    :func:`write_whole_lines` leaves it."""

    opened: bool = False  # some of it is out (its "[" at least)
    whole: bool = True  # it ends where a "]" may follow (after the "[" or an element)
    closed: bool = False  # its "]" is out


class JsonArrayOutput(LineOutput):
    """The elements of one JSON array for stdout, as ``read --json`` writes them: ``[`` and
    a line feed, the elements (one line each) separated by a comma and a line feed, a line
    feed and ``]``. A stop signal waits for the element in flight (not the line, which
    would leave a comma with nothing after it), and :meth:`close_stopped` then closes the
    array: a script given the output of a stopped read parses the messages written so far
    (the exit code says it was stopped), as it does those of a read an error ended."""

    def __init__(self) -> None:
        super().__init__()
        self.stream = ArrayStream()

    def _write_out(self, block: bytes | bytearray) -> None:
        write_whole_lines(block, array=self.stream)

    def close_stopped(self) -> None:
        """Close the array a stop signal cut short, if what is out ends where a ``]`` may
        follow (not when a reader that took nothing for a second left an element half
        out)."""
        stream = self.stream
        if stream.opened and stream.whole and not stream.closed:
            import os

            with suppress(OSError, ValueError):
                os.write(sys.stdout.fileno(), b"\n]\n")
            stream.closed = True


class DelimitedWriter:
    """CSV or TSV on stdout: a header row of ``fields``, then one row per document (a missing
    or null value empty, an object or list as compact JSON, booleans as true/false; quoted
    as :func:`rmqstore.documents.delimited_row` says); or, for ``jsonl``, one JSON object of
    ``fields`` per document and line."""

    def __init__(self, kind: str, fields: list[str]) -> None:
        self.fields = fields
        self.jsonl = kind == "jsonl"
        self._delimiter = "\t" if kind == "tsv" else ","
        if not self.jsonl:
            write_data(delimited_row(list(fields), self._delimiter))

    def row(self, document: dict[str, Any]) -> None:
        write_data(self._text(document))

    def write_rows(self, text: bytes) -> None:
        """Rows already written as this table writes them (UTF-8), as they are (whole
        rows: :func:`write_whole_lines`)."""
        write_whole_lines(text, quoted_rows=not self.jsonl)

    def rows(self, documents: Iterable[dict[str, Any]]) -> None:
        """The rows of many documents, written to stdout at once (one write, not one per
        row: stdout may be unbuffered, PYTHONUNBUFFERED)."""
        write_data("".join(map(self._text, documents)))

    def _text(self, document: dict[str, Any]) -> str:
        if self.jsonl:  # the row's fields as one JSON object, values as --json has them
            return json_text({name: document.get(name) for name in self.fields}) + "\n"
        return delimited_row(document_cells(document, self.fields), self._delimiter)


def delimited_options(
    default_fields: list[str], known: list[str], *, jsonl: str | None = None
) -> Callable[[Any], Any]:
    """``--csv``, ``--tsv`` and ``--fields`` (and ``--jsonl`` when ``jsonl`` says what a line
    is: the same rows as JSON objects, every known field unless --fields picks); passes
    ``delimited``: a (kind, fields) pair or None."""

    def decorate(func: Any) -> Any:
        @functools.wraps(func)
        def wrapper(**kwargs: Any) -> Any:
            kind = kwargs.pop("delimited_kind")
            fields_text = kwargs.pop("fields")
            if fields_text is not None and kind is None:
                raise click.UsageError(
                    "--fields goes with --csv or --tsv" + (" or --jsonl" if jsonl else "")
                )
            fields = known if kind == "jsonl" else default_fields
            if fields_text is not None:
                fields = [name.strip() for name in fields_text.split(",") if name.strip()]
                unknown = [name for name in fields if name not in known]
                if unknown or not fields:
                    raise click.UsageError(
                        f"unknown field(s) {', '.join(unknown) or '(none given)'}; known: "
                        f"{', '.join(known)}"
                    )
            kwargs["delimited"] = None if kind is None else (kind, fields)
            return func(**kwargs)

        options = [
            click.option(
                "--csv",
                "delimited_kind",
                flag_value="csv",
                help="CSV with a header row (RFC 4180: a cell holding a comma, a quote or a "
                "line break in quotes, its quotes doubled).",
            ),
            click.option(
                "--tsv",
                "delimited_kind",
                flag_value="tsv",
                help="Tab-separated, with a header row (quoted as --csv is, for a tab).",
            ),
            click.option(
                "--fields",
                metavar="A,B,...",
                help="With --csv/--tsv"
                + ("/--jsonl" if jsonl else "")
                + ": these fields in this order (default: "
                + ",".join(default_fields)
                + "). Any field of --json.",
            ),
        ]
        if jsonl is not None:
            options.insert(
                0,
                click.option(
                    "--jsonl",
                    "delimited_kind",
                    flag_value="jsonl",
                    help=f"One JSON object {jsonl}.",
                ),
            )
        for option in reversed(options):
            wrapper = option(wrapper)
        return wrapper

    return decorate


def warn(message: str) -> None:
    click.echo(f"rmqstore: warning: {shown(message)}", err=True)


def note(message: str) -> None:
    click.echo(f"rmqstore: {shown(message)}", err=True)


SHOW_UTC = False  # set by the global --utc option
SHOW_PROGRESS = True  # cleared by the global --no-progress option


def format_millis(millis: int) -> str:
    """An epoch-millisecond value as local time (UTC with ``--utc``) with milliseconds and
    the zone (``-`` for 0)."""
    return format_store_time(millis, utc=SHOW_UTC)


@contextmanager
def progress_bar(description: str, total: int, enabled: bool) -> Iterator[Callable[[int], None]]:
    """Yields ``update(completed)``; draws a bar on stderr only when it is a terminal (and
    neither the global ``--no-progress`` nor the command's turned it off)."""
    if not (enabled and SHOW_PROGRESS) or not sys.stderr.isatty() or total <= 0:
        yield lambda completed: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeRemainingColumn(),
    )
    # stdout is left alone: what a command prints while the bar runs (read --jsonl) goes
    # where it was sent, never into the bar's stream
    with Progress(
        *columns,
        console=Console(stderr=True, highlight=False, emoji=False),
        transient=True,
        redirect_stdout=False,
        redirect_stderr=False,
    ) as progress:
        task = progress.add_task(description, total=total)
        yield lambda completed: progress.update(task, completed=min(completed, total))


def confirm_or_refuse(what: str, summary: str) -> None:
    """Before destructive work: ask on a terminal; elsewhere refuse (a usage error) unless
    the command was given --yes. ``what`` names the work ("recover"), ``summary`` says it."""
    summary = shown(summary)  # it may name the store's paths
    if not sys.stdin.isatty():
        raise click.UsageError(
            f"{what} would {summary}; add --yes to confirm, or --dry-run to see the plan"
        )
    if not click.confirm(f"{summary[0].upper()}{summary[1:]}?", default=False, err=True):
        raise click.Abort()
