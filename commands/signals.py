"""SIGINT, SIGTERM and SIGHUP: as a request to stop at the next safe point (``--follow``
loops), and SIGTERM and SIGHUP as an interruption like Ctrl-C everywhere else; only the
first of them: those after it are ignored while the command stops."""

from __future__ import annotations

# atexit here, not where a stop registers its handler: that runs inside a signal handler, and
# an import there, met while the interrupted code was importing a module of its own, broke
# Python 3.11's import locks ("internal error: KeyError: 139896121883520", the thread's id,
# from importlib's table of the imports each thread waits on; the signals campaign, seed 9).
# Nothing a signal handler here runs imports anything.
import atexit
import contextlib
import signal
import sys
from collections.abc import Callable, Iterator
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
        if self.signal is None:
            self.signal = signal.Signals(number).name
        # the first stop: those after it are ignored, until the process ends, so a second
        # Ctrl-C cannot break into the closing the loop's end sets going (a replica's flush)
        stop_listening()

    def __enter__(self) -> StopSignal:
        for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            if number == signal.SIGHUP and signal.getsignal(number) is signal.SIG_IGN:
                continue  # run under nohup: a hangup is not a request to stop
            self._previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        if _stopping:
            return  # stopping: the handlers that ignore stay
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


_STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# whether a stop signal has been raised in this process: the command is on its way out
_stopping = False
_installed = False  # interrupt_on_sigterm ran: this is the console script's process
_deferring = False  # the command line is being set up: a stop waits for the command to begin


def _first_only(stop: Callable[[int, Any], Any]) -> Callable[[int, Any], Any]:
    """``stop`` for the first SIGINT, SIGTERM or SIGHUP; any after it is ignored, so that a
    second Ctrl-C (or a hangup after a SIGTERM) cannot break into what the first set going:
    an export's folder being removed, a writer's group being rolled back, the interpreter
    joining its threads. Ctrl-\\ (SIGQUIT) or kill -9 still end the process at once."""

    def handler(number: int, frame: Any) -> Any:
        global _held
        if _stopping:
            return None
        stop_listening()
        if _deferring:  # the command has not begun: it is raised where it begins
            _held = (stop, number)
            return None
        if _holding:  # lines are being written: the stop waits for the line in flight
            _held = (stop, number)
            _release_held_after(HELD_AT_MOST)
            return None
        return _raise_stop(stop, number, frame)

    handler.first_only = True  # type: ignore[attr-defined]
    return handler


# the stop raised (for its delivery again, see _unraisable), and how often it was delivered again
_raised: tuple[Callable[[int, Any], Any], int] | None = None
_delivered_again = 0
_DELIVERED_AGAIN_AT_MOST = 10


def _raise_stop(stop: Callable[[int, Any], Any], number: int, frame: Any) -> Any:
    global _raised
    _raised = (stop, number)
    return stop(number, frame)


def _unraisable(unraisable: Any) -> None:
    """``sys.unraisablehook``: a stop raised where Python drops exceptions (a weakref
    callback, ``__del__``: importlib's cleanup of a module's lock as the command imports
    a module) is raised again a moment later, where the command is; it was lost (printed as
    "Exception ignored in: <function _get_module_lock.<locals>.cb>" with a traceback, and
    the command went on as if no signal had come). Anything else as Python reports it."""
    global _delivered_again
    exc = unraisable.exc_value
    if (
        _raised is not None
        and isinstance(exc, KeyboardInterrupt)
        and _delivered_again < _DELIVERED_AGAIN_AT_MOST
    ):
        _delivered_again += 1
        stop, number = _raised
        signal.signal(signal.SIGALRM, lambda _number, _frame: stop(number, None))
        signal.setitimer(signal.ITIMER_REAL, 0.001)
        return
    sys.__unraisablehook__(unraisable)


# while stdout takes whole lines (held_stops): a stop signal waits until the line in flight
# is out, for at most this many seconds (a reader that takes nothing more)
HELD_AT_MOST = 1.0
_holding = False
_held: tuple[Callable[[int, Any], Any], int] | None = None  # the stop waiting, and its signal


@contextlib.contextmanager
def held_stops() -> Iterator[Callable[[], bool]]:
    """While entered, the first stop signal does not interrupt: it is held, and the function
    yielded says whether one is; the block acts on it with :func:`act_on_held` where its
    output ends in a whole line (a stop signal arriving mid-write cut a line in half at the
    reader's end), and the block's end acts on one still held. A held stop acts on its own
    after :data:`HELD_AT_MOST` seconds, wherever the block is (its write blocked by a reader
    that takes nothing). Outside the console script's process, a block like any other."""
    global _holding
    if not _installed or _holding:
        yield lambda: False
        return
    _holding = True
    try:
        yield lambda: _held is not None
    except BaseException:
        _forget_held()  # stopped otherwise (the held stop's own time ran out, a broken pipe)
        raise
    finally:
        _holding = False
    act_on_held()


def act_on_held() -> None:
    """Raise the stop :func:`held_stops` held, if one is."""
    global _held
    if _held is None:
        return
    stop, number = _held
    _forget_held()
    _raise_stop(stop, number, None)


def _forget_held() -> None:
    global _held
    _held = None
    signal.setitimer(signal.ITIMER_REAL, 0)


def _release_held_after(seconds: float) -> None:
    signal.signal(signal.SIGALRM, lambda _number, _frame: act_on_held())
    signal.setitimer(signal.ITIMER_REAL, seconds)


def interrupt_on_sigterm() -> None:
    """Make SIGTERM raise :class:`Terminated`, and SIGHUP :class:`HungUp`, in this process,
    each unless its handler is not the default one (the process was started with it
    ignored, as nohup does SIGHUP, or something set its own); SIGINT raises
    KeyboardInterrupt as before (unless ignored, as in a job a script started with ``&``).
    Only the first of them does: see :func:`_first_only`. Only for the console script's own
    process (not a program calling rmqstore)."""
    global _installed
    for number, handler in (
        (signal.SIGINT, signal.default_int_handler),
        (signal.SIGTERM, _terminate),
        (signal.SIGHUP, _hang_up),
    ):
        current = signal.getsignal(number)
        if current is signal.SIG_DFL or (
            number == signal.SIGINT and current is signal.default_int_handler
        ):
            signal.signal(number, _first_only(handler))
    _installed = True
    sys.unraisablehook = _unraisable
    from rmqstore import stops

    stops.hold_stops_with(held_stops)  # the engine's stretches a stop is not to cut in two
    stops.at_done_call(stop_listening)  # the engine's work is done: no stop fails it now


def defer_stops() -> None:
    """Until :func:`begin_command`, a stop signal waits: the console script sets itself up
    (its modules load, click parses the command line) and the stop is raised where the
    command begins, which maps it to its line and exit code. One met in click's own code
    around the command was click's: it printed an empty line and "Aborted!", exit 1 (the
    signals campaign, seed 15: a SIGTERM as an append began or ended); one met in an import
    broke into it."""
    global _deferring
    if _installed:
        _deferring = True


def begin_command() -> None:
    """The command begins: a stop signal that came while it was being set up is raised."""
    global _deferring
    if _deferring:
        _deferring = False
        act_on_held()


def stop_listening() -> None:
    """The command is stopping on a signal: SIGINT, SIGTERM and SIGHUP are ignored from now
    on (and by the kernel once the Python code is done, :func:`_deaf`), in the console
    script's process only. Also where the first one came through a handler not rmqstore's
    (PySpark's, as a session starts)."""
    global _stopping
    if not _installed:
        return
    if not _stopping:
        atexit.register(_deaf)
    _stopping = True
    # a handler that does nothing, not SIG_IGN: one of them that arrived just before, still
    # pending, then found no handler, and Python wrote "Signal 15 ignored due to race
    # condition" with a traceback on stderr
    for number in _STOPS:
        signal.signal(number, _ignore)


def _ignore(_number: int, _frame: Any) -> None:
    """A stop signal after the first: nothing to do."""


def _deaf() -> None:
    """At exit, once the Python code is done: the stop signals ignored by the kernel, since
    the interpreter, as it ends, puts the default action back for the signals it handles
    (one arriving then ended the process, killed by it); and no alarm left to come (a held
    stop's, or a dropped stop's delivery again: SIGALRM's default action killed the
    process, exit -14)."""
    signal.setitimer(signal.ITIMER_REAL, 0)
    for number in _STOPS:
        signal.signal(number, signal.SIG_IGN)


def stopped_by(exc: KeyboardInterrupt) -> tuple[str, int]:
    """What a command stopped by a signal says, and its exit code."""
    if isinstance(exc, HungUp):
        return "hung up (SIGHUP)", 129
    if isinstance(exc, Terminated):
        return "terminated (SIGTERM)", 143
    return "interrupted", 130


def keep_first_stop_only() -> None:
    """Once a library has set a SIGINT handler of its own (PySpark's cancels the running
    jobs, then raises KeyboardInterrupt), keep it for the first stop signal only, as
    :func:`interrupt_on_sigterm` set rmqstore's; in the console script's process only."""
    current = signal.getsignal(signal.SIGINT)
    if _installed and callable(current) and not getattr(current, "first_only", False):
        signal.signal(signal.SIGINT, _first_only(current))
