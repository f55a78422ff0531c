"""The local engine's worker processes (real ones, started with spawn)."""

from __future__ import annotations

import os

import pytest

from rmqstore.errors import StoreIOError
from rmqstore.workers import process_runner

from support import die_in_worker, square_and_pid


def test_results_come_back_in_job_order_from_other_processes() -> None:
    results = process_runner(2)(square_and_pid, list(range(12)))
    assert [square for square, _ in results] == [n * n for n in range(12)]
    assert os.getpid() not in {pid for _, pid in results}


def test_one_worker_or_one_job_runs_here() -> None:
    assert process_runner(1)(square_and_pid, [3]) == [(9, os.getpid())]
    assert process_runner(4)(square_and_pid, [5]) == [(25, os.getpid())]


def test_a_worker_that_dies_is_a_one_line_error() -> None:
    with pytest.raises(StoreIOError, match="worker process ended abruptly"):
        process_runner(2)(die_in_worker, [1, 2, 3])


def test_at_least_one_worker() -> None:
    with pytest.raises(ValueError):
        process_runner(0)
