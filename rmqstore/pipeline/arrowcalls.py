"""Arrow compute functions called by name, without importing ``pyarrow.compute``: that module
makes a Python wrapper for each of Arrow's several hundred functions when it is imported
(about 20 ms, a twentieth of an export of 1M messages). The column builders call the few they
use through ``call_function`` of pyarrow's compiled compute module, the one
``pyarrow.compute`` itself calls (the public module is the fallback where that is not there).
pyarrow's array methods that compute (``cast``, ``take``, ``filter``, ``dictionary_encode``,
...) import ``pyarrow.compute``: the builders call these instead.
"""

from __future__ import annotations

from functools import cache
from typing import Any


@cache
def _compute() -> tuple[Any, Any]:
    """pyarrow's ``call_function`` and ``CastOptions``, imported when first called (importing
    this module does not import pyarrow)."""
    try:
        from pyarrow._compute import CastOptions, call_function
    except ImportError:  # pragma: no cover - a pyarrow whose layout differs
        from pyarrow.compute import CastOptions, call_function
    return call_function, CastOptions


def call(name: str, *args: Any, options: Any = None) -> Any:
    """Arrow's compute function ``name`` on ``args`` (arrays and scalars)."""
    return _compute()[0](name, list(args), options)


def cast(values: Any, kind: Any) -> Any:
    """``values`` as Arrow type ``kind``, an error where a value does not fit."""
    call_function, cast_options = _compute()
    return call_function("cast", [values], cast_options.safe(kind))


def total(values: Any) -> int:
    """The sum of an integer array (0 when it has no values)."""
    return call("sum", values).as_py() or 0


def dictionary_encode(values: Any) -> Any:
    """``values`` as an Arrow dictionary array (nulls stay null)."""
    return call("dictionary_encode", values)


def dictionary_decode(values: Any) -> Any:
    """A dictionary array's values, one per row."""
    return call("take", values.dictionary, values.indices)


def take(values: Any, indices: Any) -> Any:
    return call("take", values, indices)


def keep(values: Any, mask: Any) -> Any:
    """The values where the boolean ``mask`` is true (``filter``)."""
    return call("filter", values, mask)
