"""The record kernel: batch scans of commit-log regions into packed rows, dispatch preparation
(tagsCodes and index key hashes of those rows) and the application of index keys to an index
file (see :mod:`rmqstore.kernel.layout`). Two implementations with one interface: the compiled
``_native`` module, built by ``pip install`` where a C compiler exists, and the pure-Python
``reference``. ``RMQSTORE_KERNEL=python`` forces the reference; ``RMQSTORE_KERNEL=native``
makes a missing compiled kernel an error instead of a quiet fallback (``make test`` sets it).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from typing import Any, NoReturn

from rmqstore.errors import InputError

_CHOICE = os.environ.get("RMQSTORE_KERNEL", "auto").strip().lower() or "auto"
_implementation: Any = None
_why_not_native: str | None = None  # None: the compiled kernel runs
_refusal: str | None = None  # set when the environment asks for what cannot run

if _CHOICE == "python":
    _why_not_native = "RMQSTORE_KERNEL=python"
elif _CHOICE in ("auto", "native"):
    try:
        from rmqstore.kernel import _native as _implementation
    except ImportError as exc:
        missing = importlib.util.find_spec("rmqstore.kernel._native") is None
        _why_not_native = "not built (no C compiler at install?)" if missing else str(exc)
        if _CHOICE == "native":
            _refusal = (
                "RMQSTORE_KERNEL=native but the compiled kernel is not built; reinstall "
                "with a C compiler present (pip install .)"
            )
else:
    _why_not_native = f"RMQSTORE_KERNEL={_CHOICE!r}"
    _refusal = f"RMQSTORE_KERNEL={_CHOICE!r} is not one of auto, native, python"

if _implementation is None:  # the reference, imported only when it runs
    from rmqstore.kernel import reference as _implementation

NAME = "native" if _why_not_native is None else "python"


def _refuse(*_args: Any, **_kwargs: Any) -> NoReturn:
    raise InputError(str(_refusal))


scan: Callable[[Any, int, int, int, int, int, Any], tuple[int, int, int, int, int, int]] = (
    _refuse if _refusal else _implementation.scan
)
crc32: Callable[..., int] = _refuse if _refusal else _implementation.crc32
prepare_dispatch: Callable[..., tuple[int, int]] = (
    _refuse if _refusal else _implementation.prepare_dispatch
)
apply_index: Callable[..., tuple[int, int]] = _refuse if _refusal else _implementation.apply_index
queue_runs: Callable[..., tuple[int, int]] = _refuse if _refusal else _implementation.queue_runs
records_at: Callable[..., int] = _refuse if _refusal else _implementation.records_at
valid_units: Callable[[Any], int] = _refuse if _refusal else _implementation.valid_units
cut_index: Callable[[Any, int], int] = _refuse if _refusal else _implementation.cut_index
attention_rows: Callable[..., int] = _refuse if _refusal else _implementation.attention_rows
index_chain: Callable[..., int] = _refuse if _refusal else _implementation.index_chain
match_keys: Callable[..., int] = _refuse if _refusal else _implementation.match_keys
field_spans: Callable[..., tuple[int, int]] = _refuse if _refusal else _implementation.field_spans
gather: Callable[..., int] = _refuse if _refusal else _implementation.gather
property_pairs: Callable[..., tuple[int, int, int, int]] = (
    _refuse if _refusal else _implementation.property_pairs
)
message_ids: Callable[..., int] = _refuse if _refusal else _implementation.message_ids
row_columns: Callable[..., None] = _refuse if _refusal else _implementation.row_columns
host_keys: Callable[..., int] = _refuse if _refusal else _implementation.host_keys
ascii_only: Callable[[Any, int], bool] = _refuse if _refusal else _implementation.ascii_only
pack_records: Callable[..., tuple[int, int, int, int]] = (
    _refuse if _refusal else _implementation.pack_records
)
document_rows: Callable[..., tuple[int, int, Any]] = (
    _refuse if _refusal else _implementation.document_rows
)
result_lines: Callable[..., int] = _refuse if _refusal else _implementation.result_lines
text_rows: Callable[..., int] = _refuse if _refusal else _implementation.text_rows
message_lines: Callable[..., int] = _refuse if _refusal else _implementation.message_lines
message_rows: Callable[..., int] = _refuse if _refusal else _implementation.message_rows
record_items: Callable[..., int] = _refuse if _refusal else _implementation.record_items
row_copies: Callable[..., int] = _refuse if _refusal else _implementation.row_copies
copy_runs: Callable[..., tuple[int, int, int]] = _refuse if _refusal else _implementation.copy_runs
copy_stops: Callable[..., int] = _refuse if _refusal else _implementation.copy_stops


def write_lines(kind: str, buf: Any, rows: Any, count: int, out: bytearray, *modes: Any) -> None:
    """The text lines of rows ``[0, count)`` of a scan of ``buf`` appended to ``out``:
    ``kind`` is ``result_lines`` (``modes``: a LINES_* style), ``message_lines`` (a BODY_*
    mode) or ``message_rows`` (a BODY_* mode, the columns and the delimiter). The kernel that
    runs writes them; a row the compiled kernel leaves is written by the reference, so the
    text is the same either way."""
    write = {
        "result_lines": result_lines,
        "message_lines": message_lines,
        "message_rows": message_rows,
    }[kind]
    row = 0
    while row < count:
        row = write(buf, rows, row, count, *modes, out)
        if row < count:  # text the compiled kernel leaves to the reference
            from rmqstore.kernel import reference

            row = getattr(reference, kind)(buf, rows, row, row + 1, *modes, out)


def description() -> str:
    """One line for ``--version`` and ``info``: which kernel runs and why."""
    if _refusal:
        return f"none ({_refusal})"
    if _why_not_native is None:
        return "native (compiled)"
    return f"python (pure-Python reference; compiled kernel: {_why_not_native})"
