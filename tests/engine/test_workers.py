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


def test_workers_die_with_a_killed_caller(tmp_path: Path) -> None:
    """SIGKILL the process running a pool: its workers do not live on (holding the
    caller's stdout open for minutes)."""
    import signal
    import subprocess
    import sys
    import time

    code = (
        "import sys; sys.path.insert(0, sys.argv[2]); from support import record_pid_and_sleep; "
        "from rmqstore.workers import process_map; "
        "list(process_map(2, record_pid_and_sleep, [(sys.argv[1], n) for n in range(2)]))"
    )
    caller = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path), str(Path(__file__).parent.parent)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("worker-*.pid"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    pids = [int(path.read_text()) for path in tmp_path.glob("worker-*.pid")]
    assert len(pids) == 2
    caller.send_signal(signal.SIGKILL)
    caller.wait()
    deadline = time.monotonic() + 10
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [pid for pid in pids if Path(f"/proc/{pid}").exists() and not _zombie(pid)]
        time.sleep(0.1)
    assert alive == []


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return False
