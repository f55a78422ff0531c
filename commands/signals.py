"""SIGINT, SIGTERM and SIGHUP: as a request to stop at the next safe point (``--follow``
loops), and SIGTERM and SIGHUP as an interruption like Ctrl-C everywhere else."""

from __future__ import annotations

import signal
from typing import Any


class StopSignal:
    """While entered, SIGINT, SIGTERM and SIGHUP set :attr:`signal` instead of interrupting; the
    loop that asked checks :meth:`requested` where stopping leaves everything sound."""

    def __init__(self) -> None:
        self.signal: str | None = None
        self._previous: dict[int, Any] = {}

    def requested(self) -> bool:
        return self.signal is not None

    def _handle(self, number: int, _frame: Any) -> None:
        self.signal = signal.Signals(number).name

    def __enter__(self) -> StopSignal:
        for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            if number == signal.SIGHUP and signal.getsignal(number) is signal.SIG_IGN:
                continue  # run under nohup: a hangup is not a request to stop
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


class HungUp(Terminated):
    """SIGHUP (the terminal or ssh session the command ran in went away): it stops the
    command as SIGTERM does, instead of ending the process on the spot."""


def _terminate(_number: int, _frame: Any) -> None:
    raise Terminated


def _hang_up(_number: int, _frame: Any) -> None:
    raise HungUp


def interrupt_on_sigterm() -> None:
    """Make SIGTERM raise :class:`Terminated`, and SIGHUP :class:`HungUp`, in this process,
    each unless its handler is not the default one (the process was started with it
    ignored, as nohup does SIGHUP, or something set its own). Only for the console
    script's own process (not a program calling rmqstore)."""
    for number, handler in ((signal.SIGTERM, _terminate), (signal.SIGHUP, _hang_up)):
        if signal.getsignal(number) is signal.SIG_DFL:
            signal.signal(number, handler)
