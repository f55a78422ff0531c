"""Arrow compute functions called by name, without importing ``pyarrow.compute``: that module
makes a Python wrapper for each of Arrow's several hundred functions when it is imported
(about 20 ms, a twentieth of an export of 1M messages). The column builders call the few they
use through ``call_function`` of pyarrow's compiled compute module, the one
``pyarrow.compute`` itself calls (the public module is the fallback where that is not there).
pyarrow's array methods that compute (``cast``, ``take``, ``filter``, ``dictionary_encode``,
...) import ``pyarrow.compute``: the builders call these instead.
"""

from __future__ import annotations

from typing import Any

try:
    from pyarrow._compute import CastOptions
    from pyarrow._compute import call_function as _call_function
except ImportError:  # pragma: no cover - a pyarrow whose layout differs
    from pyarrow.compute import CastOptions
    from pyarrow.compute import call_function as _call_function


def call(name: str, *args: Any, options: Any = None) -> Any:
    """Arrow's compute function ``name`` on ``args`` (arrays and scalars)."""
    return _call_function(name, list(args), options)


def cast(values: Any, kind: Any) -> Any:
    """``values`` as Arrow type ``kind``, an error where a value does not fit."""
    return _call_function("cast", [values], CastOptions.safe(kind))


def total(values: Any) -> int:
    """The sum of an integer array (0 when it has no values)."""
    return _call_function("sum", [values]).as_py() or 0


def dictionary_encode(values: Any) -> Any:
    """``values`` as an Arrow dictionary array (nulls stay null)."""
    return _call_function("dictionary_encode", [values])


def dictionary_decode(values: Any) -> Any:
    """A dictionary array's values, one per row."""
    return _call_function("take", [values.dictionary, values.indices])


def take(values: Any, indices: Any) -> Any:
    return _call_function("take", [values, indices])


def keep(values: Any, mask: Any) -> Any:
    """The values where the boolean ``mask`` is true (``filter``)."""
    return _call_function("filter", [values, mask])
