"""Worker processes for the local engine: the same picklable jobs the Spark engine sends to its
executors (ranges of the commit log), run in N processes of this machine instead.

Workers are started with ``spawn``: they share nothing with the caller (no inherited maps,
locks or threads) and read the store themselves, as executors do.
"""

from __future__ import annotations

import multiprocessing
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from rmqstore.errors import StoreIOError

Runner = Callable[[Callable[[Any], Any], list], list]


def run_here(function: Callable[[Any], Any], jobs: list) -> list:
    """One job after the other in this process."""
    return [function(job) for job in jobs]


def process_map(workers: int, function: Callable[[Any], Any], jobs: list) -> Iterator[Any]:
    """``function`` over ``jobs`` in ``workers`` processes, yielding results in job order as
    they can be consumed; 1 worker (or a single job) runs here. At most two jobs per worker
    are handed out ahead of the caller, so results a slow caller has not taken yet do not pile
    up: memory stays flat however many jobs there are."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, not {workers}")
    if workers == 1 or len(jobs) <= 1:
        yield from map(function, jobs)
        return
    context = multiprocessing.get_context("spawn")
    processes = min(workers, len(jobs))
    waiting = deque(jobs)
    pending: deque[Future] = deque()
    try:
        with ProcessPoolExecutor(processes, mp_context=context) as pool:
            try:
                while waiting and len(pending) < 2 * processes:
                    pending.append(pool.submit(function, waiting.popleft()))
                while pending:
                    result = pending.popleft().result()
                    if waiting:
                        pending.append(pool.submit(function, waiting.popleft()))
                    yield result
            finally:
                for future in pending:  # the caller stopped early: drop what has not started
                    future.cancel()
    except BrokenProcessPool:
        raise StoreIOError(
            "a worker process ended abruptly (out of memory, or killed); "
            "run again with fewer --jobs"
        ) from None


def process_runner(workers: int) -> Runner:
    """A runner: :func:`process_map` collected into a list."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, not {workers}")
    return lambda function, jobs: list(process_map(workers, function, jobs))
