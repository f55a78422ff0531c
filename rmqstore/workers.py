"""Worker processes for the local engine: the same picklable jobs the Spark engine sends to its
executors (ranges of the commit log), run in N processes of this machine instead.

Workers are started with ``spawn``: they share nothing with the caller (no inherited maps,
locks or threads) and read the store themselves, as executors do. A worker dies with the
process that started it (a killed ``dispatch --rebuild --jobs 2`` leaves no worker behind
holding the caller's stdout open).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from rmqstore.errors import StoreIOError

if TYPE_CHECKING:
    from concurrent.futures import Future

Runner = Callable[[Callable[[Any], Any], list], list]


# ``progress(description, total)`` -> a context yielding ``update(done)``: how a caller
# watches long work advance (the CLI draws a bar with it; the engine never draws)
Progress = Callable[[str, int], AbstractContextManager[Callable[[int], None]]]


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity where the system tells it, as in a
    container given fewer CPUs than the machine has)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def run_here(function: Callable[[Any], Any], jobs: list) -> list:
    """One job after the other in this process."""
    return [function(job) for job in jobs]


_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """In a worker: be killed when ``parent`` exits, however it exits (SIGKILL included).
    Linux delivers SIGKILL on the parent's death (``PR_SET_PDEATHSIG``); elsewhere, and as a
    second guard, a thread checks the parent every half second."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before the guard was set
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="rmqstore-parent-watch", daemon=True).start()


def process_map(
    workers: int,
    function: Callable[[Any], Any],
    jobs: list,
    *,
    prepare: Callable[[], object] | None = None,
) -> Iterator[Any]:
    """``function`` over ``jobs`` in ``workers`` processes, yielding results in job order as
    they can be consumed; 1 worker (or a single job) runs here. At most two jobs per worker
    are handed out ahead of the caller, so results a slow caller has not taken yet do not pile
    up: memory stays flat however many jobs there are. ``prepare`` (a module-level function)
    runs first in each worker process, never here."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, not {workers}")
    if workers == 1 or len(jobs) <= 1:
        yield from map(function, jobs)
        return
    # imported here: a command that runs in one process does not pay for them at start-up
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    context = multiprocessing.get_context("spawn")
    _tracker_deaf_to_hangups()
    processes = min(workers, len(jobs))
    waiting = deque(jobs)
    pending: deque[Future] = deque()
    try:
        pool = ProcessPoolExecutor(
            processes, mp_context=context, initializer=_start, initargs=(os.getpid(), prepare)
        )
        try:
            while waiting and len(pending) < 2 * processes:
                pending.append(_submit(pool, function, waiting.popleft()))
            while pending:
                result = pending.popleft().result()
                if waiting:
                    pending.append(_submit(pool, function, waiting.popleft()))
                yield result
        finally:
            for future in pending:  # the caller stopped early: drop what has not started
                future.cancel()
            _shut_down(pool)
    except BrokenProcessPool:
        raise StoreIOError(
            "a worker process ended abruptly (out of memory, or killed); "
            "run again with fewer --jobs"
        ) from None


def _shut_down(pool: Any) -> None:
    """``pool.shutdown(wait=True)``, finished even when a stop signal cuts into it (the stop
    then goes on): a pool left running had its thread close its wakeup pipe as the process
    ended, racing Python 3.11's exit hook, which wrote to it ("Exception ignored in: <module
    'threading'> ... Bad file descriptor", a traceback after the command's one line). A
    second signal is ignored while the command stops, so the second call runs to its end."""
    try:
        pool.shutdown(wait=True)
    except BaseException:
        pool.shutdown(wait=True)
        raise


# the signals that stop a command: a worker leaves them to the process that started it
_STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})


def _submit(pool: Any, function: Callable[[Any], Any], job: Any) -> Future:
    """``pool.submit``, which starts a worker process when it needs one more: with the stop
    signals blocked, so that the worker starts with them blocked (as multiprocessing starts
    its resource tracker) until :func:`_start` has them ignored. A Ctrl-C reaching a worker
    still importing its modules, or waiting for its next job, printed its traceback (a
    dozen lines from each worker) beside the command's one line."""
    if not hasattr(signal, "pthread_sigmask"):
        return pool.submit(function, job)
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        return pool.submit(function, job)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _start(parent: int, prepare: Callable[[], object] | None) -> None:
    """A worker process's start: :func:`die_with_parent`; SIGINT, SIGTERM and SIGHUP ignored
    (a Ctrl-C, a hangup or a stop of the whole process group is the parent's to act on: it
    stops the command, lets the jobs running end and ends its workers; one that arrived
    while the worker started is dropped), then ``prepare``."""
    die_with_parent(parent)
    for number in _STOP_SIGNALS:
        signal.signal(number, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    if prepare is not None:
        prepare()


def _tracker_deaf_to_hangups() -> None:
    """Start multiprocessing's resource tracker (a helper process a pool of workers needs,
    started once) with SIGHUP blocked, as it blocks SIGINT and SIGTERM itself: a hangup of
    the terminal's process group killed it, and the pool started another, with a warning
    and tracebacks on stderr, while the command itself stopped on the hangup."""
    from multiprocessing import resource_tracker

    if not hasattr(signal, "pthread_sigmask"):
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
    try:
        resource_tracker.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def process_runner(workers: int) -> Runner:
    """A runner: :func:`process_map` collected into a list."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, not {workers}")
    return lambda function, jobs: list(process_map(workers, function, jobs))
