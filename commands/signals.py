"""SIGINT and SIGTERM as a request to stop at the next safe point (``--follow`` loops)."""

from __future__ import annotations

import signal
from typing import Any


class StopSignal:
    """While entered, SIGINT and SIGTERM set :attr:`signal` instead of interrupting; the
    loop that asked checks :meth:`requested` where stopping leaves everything sound."""

    def __init__(self) -> None:
        self.signal: str | None = None
        self._previous: dict[int, Any] = {}

    def requested(self) -> bool:
        return self.signal is not None

    def _handle(self, number: int, _frame: Any) -> None:
        self.signal = signal.Signals(number).name

    def __enter__(self) -> StopSignal:
        for number in (signal.SIGINT, signal.SIGTERM):
            self._previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
