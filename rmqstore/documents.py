"""What ``read`` prints of a message, as a JSON-ready document: the fields under RocketMQ's
names (:meth:`rmqstore.record.Message.fields`) and the body in one of the body modes. The
CLI renders these; the record kernel's ``message_lines`` writes the same documents as JSON
lines straight from scanned records."""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from typing import Any

from rmqstore.record import Message


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


def document_cells(document: dict[str, Any], fields: list[str] | tuple[str, ...]) -> list[str]:
    """The CSV/TSV cells of ``document`` for ``fields``: text as it is, integers in decimal, a
    missing or null value empty, booleans as true/false, an object or list as compact JSON
    (UTF-8 characters kept)."""
    return [value if type(value) is str else _cell(value) for value in map(document.get, fields)]


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return str(value)


_NEEDS_QUOTES = {",": re.compile('[,"\n\r]'), "\t": re.compile('[\t"\n\r]')}


def delimited_row(cells: list[str], delimiter: str) -> str:
    """One CSV (``delimiter`` a comma) or TSV (a tab) row and its newline, quoted as RFC 4180
    says: a cell holding the delimiter, a quote, a line feed or a carriage return in quotes,
    its quotes doubled; a row of one empty cell as ``""`` (not an empty line). Python's csv
    module leaves a carriage return unquoted before 3.11.9 and 3.12.3, so a CSV reader split
    such a row in two; this writes the same text on every Python."""
    needs_quotes = _NEEDS_QUOTES[delimiter].search
    if len(cells) == 1 and not cells[0]:
        return '""\n'
    return (
        delimiter.join(
            '"' + cell.replace('"', '""') + '"' if needs_quotes(cell) else cell for cell in cells
        )
        + "\n"
    )


@dataclass(frozen=True)
class DelimitedLayout:
    """Messages as ``read --csv``/``--tsv`` prints them: a row of :func:`document_cells` of
    ``fields`` (names of :data:`rmqstore.kernel.layout.MESSAGE_COLUMNS`) per message, cells
    split by ``delimiter`` (``,`` or a tab)."""

    fields: tuple[str, ...]
    delimiter: str = ","
