"""Index files against golden bytes and a broker-written file (spec §7)."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from rmqstore.hashing import index_key_hash
from rmqstore.indexfile import (
    IndexFile,
    IndexHeader,
    IndexService,
    index_file_name,
    index_file_size,
    infer_geometry,
    read_index_headers,
)

from support import files_held, vectors


@pytest.mark.parametrize("name", ["miniIndexFile", "miniIndexFileSecond"])
def test_puts_produce_the_golden_file(tmp_path: Path, name: str) -> None:
    vector = vectors()[name]
    previous = IndexHeader(
        end_phy_offset=vector["prevEndPhyOffset"], end_timestamp=vector["prevEndTimestamp"]
    )
    index = IndexFile.create(
        tmp_path / "f",
        vector["hashSlotNum"],
        vector["indexNum"],
        previous if vector["prevEndTimestamp"] else None,
    )
    for put in vector["puts"]:
        assert index_key_hash(put["key"]) == put["keyHash"]
        assert put["keyHash"] % vector["hashSlotNum"] == put["slot"]
        assert index.put_key(put["keyHash"], put["phyOffset"], put["storeTimestamp"])
    index.close()
    assert (tmp_path / "f").read_bytes().hex().upper() == vector["fileHex"]


def test_the_follow_on_file_measures_its_first_entry_from_the_previous_end(tmp_path: Path) -> None:
    vector = vectors()["miniIndexFileSecond"]
    path = tmp_path / "f"
    path.write_bytes(bytes.fromhex(vector["fileHex"]))
    index = IndexFile.open(path, vector["hashSlotNum"], vector["indexNum"])
    first = vector["puts"][0]
    assert index.entry(1)[2] == (first["storeTimestamp"] - vector["prevEndTimestamp"]) // 1000
    assert index.header.begin_timestamp == first["storeTimestamp"]
    index.close()


def test_the_broker_written_file(tmp_path: Path) -> None:
    generated = vectors()["brokerGenerated_4_9_8"]
    config = generated["config"]
    vector = generated["indexFile"]
    (tmp_path / "index").mkdir()
    path = tmp_path / "index" / vector["name"]
    path.write_bytes(bytes.fromhex(vector["fileHex"]))
    index = IndexFile.open(path, config["maxHashSlotNum"], config["maxIndexNum"])
    header = vector["header"]
    assert (index.header.begin_timestamp, index.header.end_timestamp) == (
        header["beginTimestamp"],
        header["endTimestamp"],
    )
    assert (index.header.hash_slot_count, index.header.index_count) == (
        header["hashSlotCount"],
        header["indexCount"],
    )
    assert index.is_full
    assert not index.put_key(1, 2, 3)
    index.close()
    service = IndexService(tmp_path / "index", config["maxHashSlotNum"], config["maxIndexNum"])
    record = generated["commitlogRecords"][0]
    uniq = record["properties"]["UNIQ_KEY"]
    assert record["physicalOffset"] in service.query(record["topic"], uniq)
    for key in record["properties"]["KEYS"].split():
        assert record["physicalOffset"] in service.query(record["topic"], key)
    service.close()
    ((_, read),) = read_index_headers(tmp_path / "index")
    assert read.index_count == header["indexCount"]


def test_file_names_and_sizes() -> None:
    names = vectors()["indexFileNames"]
    import os
    import time

    previous = os.environ.get("TZ")
    try:
        for zone in ("UTC", "Asia/Shanghai", "America/New_York"):
            os.environ["TZ"] = zone
            time.tzset()
            assert index_file_name(names["epochMillis"]) == names[zone]
    finally:
        if previous is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = previous
        time.tzset()
    defaults = vectors()["indexFileDefaults"]
    assert index_file_size(defaults["hashSlotNum"], defaults["indexNum"]) == defaults["fileSize"]
    assert infer_geometry(defaults["fileSize"]) == (5_000_000, 20_000_000)
    assert infer_geometry(44040) is None  # 1000 slots, 2000 entries: needs the config


def _build_many_files(directory: Path, records: range, clock: Iterator[int]) -> tuple[int, int]:
    """A writable service putting one-key ``records``, 3 to a file, the files named by
    ``clock``; returns the most descriptors and maps it held on the way and the files there
    are."""
    service = IndexService(directory, 2, 4, writable=True, clock=lambda: next(clock))
    most = files_held(directory)
    for number in records:
        offset, stored = 1000 + number * 100, 1_700_000_000_000 + number
        assert service.build(offset, stored, "T", None, [f"k{number}"])
        most = max(most, files_held(directory))
    made = len(service.files)
    service.close()
    return most, made


def test_a_service_over_many_files_keeps_few_open_and_writes_the_same_bytes(
    tmp_path: Path,
) -> None:
    """A store of small index files has thousands: each held open ran dispatch and recover
    out of descriptors (EMFILE under a ulimit of 1024). Only OPEN_FILES_KEPT are held; the
    others are opened again when read. Written in one go or resumed halfway (the files
    made before opened again, as a dispatch resuming does), the bytes are the same."""
    from rmqstore.indexfile import OPEN_FILES_KEPT

    whole, resumed = tmp_path / "whole" / "index", tmp_path / "resumed" / "index"
    most, made = _build_many_files(whole, range(300), itertools.count(1_700_000_000_000, 1000))
    assert made == 100 > OPEN_FILES_KEPT
    assert most <= 2  # the file written and the one it follows
    clock = itertools.count(1_700_000_000_000, 1000)
    _build_many_files(resumed, range(150), clock)
    most, _ = _build_many_files(resumed, range(150, 300), clock)
    assert most <= OPEN_FILES_KEPT
    names = sorted(path.name for path in whole.iterdir())
    assert names == sorted(path.name for path in resumed.iterdir())
    for name in names:
        assert (whole / name).read_bytes() == (resumed / name).read_bytes()

    for writable in (False, True):  # read again, and opened to write on
        service = IndexService(whole, 2, 4, writable=writable)
        assert files_held(whole) <= OPEN_FILES_KEPT
        for number in (0, 1, 150, 298, 299, 0):  # the oldest file again after the newest
            assert service.query("T", f"k{number}") == [1000 + number * 100]
            assert files_held(whole) <= OPEN_FILES_KEPT
        assert sum(1 for _ in service.all_entries()) == 300
        assert files_held(whole) <= OPEN_FILES_KEPT
        service.close()
        assert files_held(whole) == 0


def test_an_index_file_deleted_while_let_go_is_named_when_read_again(tmp_path: Path) -> None:
    """Past OPEN_FILES_KEPT a file is opened again when read: one a broker deleted meanwhile
    (its retention deletes index files with the commit-log files they index) is an error
    naming it and saying to run again, not a bare "No such file"."""
    from rmqstore.errors import StoreIOError
    from rmqstore.indexfile import OPEN_FILES_KEPT

    directory = tmp_path / "index"
    _build_many_files(
        directory, range(3 * (OPEN_FILES_KEPT + 5)), itertools.count(1_700_000_000_000, 1000)
    )
    service = IndexService(directory, 2, 4)
    oldest = service.files[0]
    assert oldest.released  # let go as the newer ones were opened
    oldest.path.unlink()
    with pytest.raises(
        StoreIOError, match=r"was deleted while it was read .* run the command again"
    ):
        service.query("T", "k0")
    service.close()


@pytest.mark.parametrize("stopped_in", ["create", "listing"])
def test_a_stop_as_an_index_file_is_made_leaves_nothing_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stopped_in: str
) -> None:
    """A signal while an index file is made (renamed into place, its header not yet written)
    or just after, before the service lists it: the file made goes, with its temporary
    (one was left under its unique name, and no later dispatch took it away: verify kept
    calling it an unknown file), when the files made are taken away."""
    import rmqstore.indexfile as indexfile

    directory = tmp_path / "index"
    service = IndexService(directory, 2, 4, writable=True, clock=lambda: 1_700_000_000_000)
    real = indexfile.fsync_directory if stopped_in == "create" else service._held
    calls: list[object] = []

    def stopped(*args: object) -> object:
        calls.append(args)
        if len(calls) == 1 and stopped_in == "listing":  # made, not yet listed
            raise KeyboardInterrupt
        result = real(*args)
        if len(calls) == 1:  # renamed into place, the folder synced
            raise KeyboardInterrupt
        return result

    monkeypatch.setattr(
        *((indexfile, "fsync_directory") if stopped_in == "create" else (service, "_held")),
        stopped,
    )
    with pytest.raises(KeyboardInterrupt):
        service.writable_file()
    assert service.files == []
    assert os.listdir(directory) == ([] if stopped_in == "create" else ["20231114221320000"])
    assert service.remove_files_after(0)
    assert os.listdir(directory) == [] and service.files == []
