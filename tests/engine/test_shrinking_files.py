"""A store file that another process truncates while rmqstore reads it: every read path gives
a StoreIOError naming the file (exit 4 at the command line), never a SIGBUS. Files are read
with pread into memory, not through maps, so the truncation happens between two reads here,
exactly where it would bite a mapped reader."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from rmqstore.config import StoreConfig
from rmqstore.errors import ExitCode, StoreIOError
from rmqstore.fixtures import FixtureOptions, generate
from rmqstore.indexfile import IndexFile
from rmqstore.store import Store
from rmqstore.verify.findings import VerifyReport
from rmqstore.verify.records import RecordPass

FILE_SIZE = 32 * 1024 * 1024
CONFIG = StoreConfig(index_slots=1000, index_entries=20_000)  # index files of 404 KB


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The benchmark shape, small: 50,000 messages (14 MB of records, more than the 8 MiB
    read window) in a 32 MiB commit-log file (made once: each test cuts a copy)."""
    out = tmp_path_factory.mktemp("shrinking") / "store"
    generate(
        "large",
        out,
        FixtureOptions(
            messages=50_000,
            commitlog_file_size=FILE_SIZE,
            index_slots=CONFIG.index_slots,
            index_entries=CONFIG.index_entries,
        ),
    )
    assert _first_log_file(out).stat().st_size == FILE_SIZE
    return out


@pytest.fixture
def store_path(generated: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(generated, tmp_path / "store"))


def _first_log_file(root: Path) -> Path:
    return sorted((root / "commitlog").iterdir())[0]


def test_a_scan_names_the_file_cut_under_it(store_path: Path) -> None:
    with Store.open_read(store_path, CONFIG) as store:
        scan = iter(store.commitlog.scan())
        next(scan)
        path = _first_log_file(store_path)
        os.truncate(path, 4096)
        with pytest.raises(StoreIOError) as caught:
            for _ in scan:
                pass
    assert str(path) in str(caught.value)
    assert caught.value.exit_code == ExitCode.IO


def test_a_read_by_offset_names_the_file_cut_under_it(store_path: Path) -> None:
    with Store.open_read(store_path, CONFIG) as store:
        last = None
        for offset, *_ in store.commitlog.scan():
            last = offset
        assert last is not None and last > 8192
        store.commitlog.read(0)  # the file is open now
        os.truncate(_first_log_file(store_path), 8192)
        with pytest.raises(StoreIOError, match="truncated"):
            store.commitlog.read(last)


class _Truncator:
    """A verify listener that cuts the commit-log file at the first record it is shown."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.done = False

    def on_record(
        self, offset: int, header: tuple, topic: str, properties: object, stored: bytes
    ) -> None:
        if not self.done:
            os.truncate(self.path, 4096)
            self.done = True

    def finish(self, log_end: int) -> None:
        pass


def test_verify_names_the_file_cut_under_it(store_path: Path) -> None:
    path = _first_log_file(store_path)
    with Store.open_read(store_path, CONFIG) as store:
        records = RecordPass(store, VerifyReport(), check_crc=True, listeners=[_Truncator(path)])
        with pytest.raises(StoreIOError) as caught:
            records.run()
    assert str(path) in str(caught.value)


def test_an_index_file_cut_under_a_query(store_path: Path) -> None:
    index_path = sorted((store_path / "index").iterdir())[0]
    index = IndexFile.open(index_path, CONFIG.index_slots, CONFIG.index_entries)
    try:
        os.truncate(index_path, 4096)
        with pytest.raises(StoreIOError) as caught:
            index.select("BenchmarkTopic#nothing", [], 64, 0, 2**62)
            for _ in index.iter_entries():
                pass
    finally:
        index.close()
    assert str(index_path) in str(caught.value)
