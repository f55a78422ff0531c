"""Stretches of work a stop signal (Ctrl-C, SIGTERM, SIGHUP) is not to cut in two: a
dispatch's batch, whose units go into their queues one queue after the other. The engine
marks them with :func:`whole`; what a stop does meanwhile is the command line's to decide
(:func:`rmqstore.commands.signals.held_stops` holds it until the stretch is done, for at most
a second). For a program calling the engine, a stretch is code like any other."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

_holding: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext


def whole() -> contextlib.AbstractContextManager[Any]:
    """A stretch of work a stop signal waits for (see the module docstring)."""
    return _holding()


def hold_stops_with(holding: Callable[[], contextlib.AbstractContextManager[Any]]) -> None:
    """What :func:`whole` enters from now on (the command line's :func:`held_stops`)."""
    global _holding
    _holding = holding
