"""How the engine words counts in its notes and findings (the CLI uses the same helper)."""

from __future__ import annotations


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """``count`` and the noun, singular for one: ``1 file``, ``2 files``, ``1,024 entries``."""
    return f"{count:,} {noun if count == 1 else (plural or noun + 's')}"


def missing_files(start: int, end: int, file_size: int) -> str:
    """The commit-log files missing from offset ``start`` to ``end``, in words."""
    return (
        f"commit-log files are missing from offset {start} to {end} "
        f"({counted((end - start) // file_size, 'file')})"
    )


SHOWN_TEXT_LIMIT = 64  # characters of a user's or a file's value an error repeats


def clipped(text: str, limit: int = SHOWN_TEXT_LIMIT) -> str:
    """``text`` as it is, or its first ``limit`` characters and its length when longer."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text):,} characters)"


def quoted(value: object, limit: int = SHOWN_TEXT_LIMIT) -> str:
    """``repr(value)``, cut to its first ``limit`` characters when longer, with its length.

    Errors repeat what they were given so that the reader sees which value was wrong; a value
    of ten thousand characters (an option, a property from a damaged record) must still leave
    a one-line error.
    """
    if not isinstance(value, str):
        shown = repr(value)
        return shown if len(shown) <= limit else f"{shown[:limit]}… ({len(shown):,} characters)"
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}… ({len(value):,} characters)"
