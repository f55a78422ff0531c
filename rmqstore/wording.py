"""How the engine words counts in its notes and findings (the CLI uses the same helper)."""

from __future__ import annotations


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """``count`` and the noun, singular for one: ``1 file``, ``2 files``, ``1,024 entries``."""
    return f"{count:,} {noun if count == 1 else (plural or noun + 's')}"
