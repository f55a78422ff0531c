"""Scans that read ahead in a thread (LogScan.batches(ahead=True)) give the batches and the
outcome of a scan that does not, hand errors to the caller, and close their files when the
caller stops early."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rmqstore.errors import StoreIOError
from rmqstore.fixtures import FixtureOptions, generate
from rmqstore.kernel.layout import ROW_WIDTH
from rmqstore.store import Store
from rmqstore.windows import read_ahead


def batches_of(store: Store, *, ahead: bool, check_crc: bool) -> tuple[list, tuple]:
    scan = store.commitlog.scan(check_crc=check_crc)
    found = [
        (list(rows[: count * ROW_WIDTH]), count)
        for _window, _window_start, rows, count in scan.batches(ahead=ahead)
    ]
    return found, (scan.end_offset, scan.stop, str(scan.error), scan.crc_failures)


@pytest.mark.parametrize("scenario", ["multi", "crc-flip", "garbage-after-end", "torn-tail"])
def test_reading_ahead_gives_the_same_batches_and_outcome(tmp_path: Path, scenario: str) -> None:
    generate(scenario, tmp_path / "store", FixtureOptions(commitlog_file_size=64 * 1024))
    with Store.open_read(tmp_path / "store") as store:
        for check_crc in (False, True):
            behind = batches_of(store, ahead=False, check_crc=check_crc)
            ahead = batches_of(store, ahead=True, check_crc=check_crc)
            assert behind[1] == ahead[1]
            assert behind[0] == ahead[0]
            assert len(ahead[0]) > 1


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_stopping_early_stops_the_reader_and_closes_its_files(tmp_path: Path) -> None:
    generate("multi", tmp_path / "store", FixtureOptions(commitlog_file_size=64 * 1024))
    with Store.open_read(tmp_path / "store") as store:
        before = open_descriptors()
        batches = store.commitlog.scan().batches(ahead=True)
        next(batches)
        batches.close()  # type: ignore[attr-defined]
        assert open_descriptors() == before


def test_an_error_in_the_reader_is_raised_to_the_caller() -> None:
    def failing():  # type: ignore[no-untyped-def]
        yield 1
        yield 2
        raise StoreIOError("commitlog/00000000000000000000 ended while it was read")

    got = []
    with pytest.raises(StoreIOError, match="ended while it was read"):
        for item in read_ahead(failing()):
            got.append(item)
    assert got == [1, 2]


def _stop_in(seconds: float) -> None:
    """A stop signal (as KeyboardInterrupt) in this thread ``seconds`` from now."""

    def stop(_number: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)


def test_a_stop_while_the_reader_thread_ends_waits_for_it(tmp_path: Path) -> None:
    """A stop signal that breaks into the wait for the reading thread to end is raised once
    it has ended: a thread left running as the interpreter ended met Arrow's memory pool
    torn down (an abort, exit -6, after the command's one line; the signals campaign)."""
    ended: list[str] = []

    def slow() -> Iterator[int]:
        try:
            yield 1
            time.sleep(0.4)  # producing the next batch as the consumer stops
            yield 2
        finally:
            ended.append("producer")

    previous = signal.getsignal(signal.SIGALRM)
    try:
        with pytest.raises(KeyboardInterrupt):
            items = read_ahead(slow())
            assert next(items) == 1
            _stop_in(0.1)
            items.close()  # the consumer leaves: the wait for the thread is broken into
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert ended == ["producer"]  # (Thread.is_alive says False after a broken join)
