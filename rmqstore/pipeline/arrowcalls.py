"""Arrow compute functions called by name, without importing ``pyarrow.compute``: that module
makes a Python wrapper for each of Arrow's several hundred functions when it is imported
(about 20 ms, a twentieth of an export of 1M messages). The column builders call the few they
use through ``call_function`` of pyarrow's compiled compute module, the one
``pyarrow.compute`` itself calls (the public module is the fallback where that is not there).
pyarrow's array methods that compute (``cast``, ``take``, ``filter``, ``dictionary_encode``,
...) import ``pyarrow.compute``: the builders call these instead.
"""

from __future__ import annotations

import sys
from functools import cache
from typing import Any

# what an export imports of pyarrow: its core, the compiled compute module and the Parquet
# writer (each of the first two imports numpy when it can)
_EXPORT_MODULES = ("pyarrow", "pyarrow._compute", "pyarrow.parquet")


def import_pyarrow_without_numpy() -> bool:
    """Import pyarrow's modules an export uses as pyarrow runs where numpy is not installed,
    when neither is imported yet; True when it did. pyarrow imports numpy only to convert to
    and from numpy arrays, which rmqstore never asks of it, and importing numpy takes 30-35
    ms, more than half of pyarrow's import (and a fifteenth of an export of 1M messages).

    For a process rmqstore's command line owns (the export command calls it; the engine
    does not, since a program embedding it may want pyarrow's numpy conversions): in it,
    pyarrow converts nothing to numpy from then on, but numpy itself stays importable
    (``stats`` reads Arrow buffers with ``numpy.frombuffer``, which needs nothing of
    pyarrow)."""
    if "numpy" in sys.modules or "pyarrow" in sys.modules:
        return False
    sys.modules["numpy"] = None  # type: ignore[assignment]  # `import numpy` raises ImportError
    try:
        for name in _EXPORT_MODULES:
            __import__(name)
    except ImportError:
        return False  # no pyarrow: the export says so where it first needs it
    finally:
        if sys.modules.get("numpy", 0) is None:
            del sys.modules["numpy"]
    return True


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
