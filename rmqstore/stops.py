"""Stretches of work a stop signal (Ctrl-C, SIGTERM, SIGHUP) is not to cut in two: a
dispatch's batch, whose units go into their queues one queue after the other. The engine
marks them with :func:`whole`; what a stop does meanwhile is the command line's to decide
(:func:`rmqstore.commands.signals.held_stops` holds it until the stretch is done, for at most
a second). For a program calling the engine, a stretch is code like any other.

And the point from which the work is done and a stop is not to fail it (:func:`past_undoing`:
an export's folder about to be renamed into place, every byte of it on the disk): the
command line ignores stop signals from there on, as once its exit code is known."""

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


def _nothing() -> None:
    """What :func:`past_undoing` does for a program calling the engine."""


_at_done: Callable[[], None] = _nothing


def past_undoing() -> None:
    """The work is done from here (see the module docstring): a stop signal that comes
    later is not to end the command as stopped, its work there (an export's folder in place
    and the command's exit code 143 did not agree). For a program calling the engine,
    nothing happens."""
    _at_done()


def at_done_call(done: Callable[[], None]) -> None:
    """What :func:`past_undoing` calls from now on (the command line's
    :func:`~rmqstore.commands.signals.stop_listening`)."""
    global _at_done
    _at_done = done


def through_stops(action: Callable[[], object], on_stop: Callable[[], None] | None = None) -> None:
    """Run ``action`` (a wait: for a worker thread's end, for room to tell it to end) to its
    end, also when a stop signal breaks into it (raised as KeyboardInterrupt): ``on_stop``
    is called and ``action`` run again, and the first stop is raised once it is done. A
    worker thread left running as the interpreter ended met Arrow's memory pool torn down,
    and the process died of an abort after the command's one line (exit -6: an export given
    SIGHUP, the signals campaign, seed 20261215). Not for ``Thread.join``: Python 3.11 takes
    a join a signal broke into for the thread's end (``is_alive()`` false, the next join
    returns at once) while the thread still runs; wait for an event it sets instead."""
    stop: KeyboardInterrupt | None = None
    while True:
        try:
            action()
            break
        except KeyboardInterrupt as exc:
            stop = stop or exc
            if on_stop is not None:
                on_stop()
    if stop is not None:
        raise stop
