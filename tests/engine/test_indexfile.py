"""Index files against golden bytes and a broker-written file (spec §7)."""

from __future__ import annotations

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

from support import vectors


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
