"""The local engine's worker processes (real ones, started with spawn)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from rmqstore.errors import StoreIOError
from rmqstore.workers import process_map, process_runner

from support import die_in_worker, mark_started, square_and_pid


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


def test_jobs_are_handed_out_only_a_little_ahead_of_the_caller(tmp_path: Path) -> None:
    results = process_map(2, mark_started, [(str(tmp_path), n) for n in range(40)])
    assert next(results) == 0
    time.sleep(1.0)  # time enough for the workers to start anything they were given
    started = len(list(tmp_path.glob("started-*")))
    assert started <= 5  # two per worker ahead, and the one that replaced the first
    assert list(results) == list(range(1, 40))
    assert len(list(tmp_path.glob("started-*"))) == 40
