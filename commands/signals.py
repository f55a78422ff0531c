"""SIGINT and SIGTERM: as a request to stop at the next safe point (``--follow`` loops), and
SIGTERM as an interruption like Ctrl-C everywhere else."""

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


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill PID``, a service manager or container stopping the command, a
    ``timeout``): raised where the command is, as SIGINT raises KeyboardInterrupt, so that
    the command stops the way Ctrl-C stops it (an export's unfinished folder removed, a
    writer's unflushed group rolled back) instead of vanishing mid-way."""


def _terminate(_number: int, _frame: Any) -> None:
    raise Terminated


def interrupt_on_sigterm() -> None:
    """Make SIGTERM raise :class:`Terminated` in this process, unless its handler is not
    the default one (the process was started with it ignored, or something set its own).
    Only for the console script's own process (not a program calling rmqstore)."""
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminate)
