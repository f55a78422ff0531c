"""Worker processes for the local engine: the same picklable jobs the Spark engine sends to its
executors (ranges of the commit log), run in N processes of this machine instead.

Workers are started with ``spawn``: they share nothing with the caller (no inherited maps,
locks or threads) and read the store themselves, as executors do.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from rmqstore.errors import StoreIOError

Runner = Callable[[Callable[[Any], Any], list], list]


def run_here(function: Callable[[Any], Any], jobs: list) -> list:
    """One job after the other in this process."""
    return [function(job) for job in jobs]


def process_map(workers: int, function: Callable[[Any], Any], jobs: list) -> Iterator[Any]:
    """``function`` over ``jobs`` in ``workers`` processes, yielding results in job order as
    they can be consumed (so a caller folding them keeps little in memory); 1 worker (or a
    single job) runs here."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, not {workers}")
    if workers == 1 or len(jobs) <= 1:
        yield from map(function, jobs)
        return
    context = multiprocessing.get_context("spawn")
    try:
        with ProcessPoolExecutor(min(workers, len(jobs)), mp_context=context) as pool:
            yield from pool.map(function, jobs)
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
