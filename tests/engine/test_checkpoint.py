"""Checkpoint layouts (spec §8.1) against the golden images and a real broker's file."""

from __future__ import annotations

from pathlib import Path

import pytest

from rmqstore.checkpoint import (
    Checkpoint,
    read_checkpoint,
    read_checkpoint_file,
    write_checkpoint,
)
from rmqstore.errors import StoreFormatError

from support import vectors

VECTOR = vectors()["checkpoint"]
FIELDS = dict(
    physic_msg_timestamp=1700000000123,
    logics_msg_timestamp=1700000000100,
    index_msg_timestamp=1699999990000,
)


def test_4x_and_5x_images() -> None:
    four = Checkpoint(**FIELDS)
    five = Checkpoint(**FIELDS, confirm_phy_offset=1073742267)
    assert four.encode()[:24].hex().upper() == VECTOR["v4_first24Hex"]
    assert five.encode()[:40].hex().upper() == VECTOR["v5_first40Hex"]
    assert len(four.encode()) == VECTOR["fileSize"]
    assert four.encode()[24:] == bytes(4096 - 24)
    assert five.layout == "5.x" and four.layout == "4.x"


def test_derived_minimums() -> None:
    checkpoint = Checkpoint(**FIELDS)
    assert checkpoint.min_timestamp == VECTOR["minTimestamp"]
    assert checkpoint.min_timestamp_index == VECTOR["minTimestampIndex"]
    assert Checkpoint().min_timestamp == 0


def test_real_broker_checkpoint(oracle) -> None:
    store = oracle("s1_multi")
    checkpoint = read_checkpoint(store.store / "checkpoint")
    expected = store.manifest["checkpointFileOnDisk"]
    assert checkpoint is not None
    assert checkpoint.physic_msg_timestamp == expected["physicMsgTimestamp"]
    assert checkpoint.logics_msg_timestamp == expected["logicsMsgTimestamp"]
    assert checkpoint.index_msg_timestamp == expected["indexMsgTimestamp"]
    generated = vectors()["brokerGenerated_4_9_8"]["checkpoint"]
    decoded = Checkpoint.decode(bytes.fromhex(generated["first24Hex"]))
    assert decoded.physic_msg_timestamp == generated["physicMsgTimestamp"]
    assert decoded.index_msg_timestamp == generated["indexMsgTimestamp"]


def test_write_preserves_the_5x_fields_and_creates_4096_bytes(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint"
    assert read_checkpoint(path) is None
    write_checkpoint(path, Checkpoint(**FIELDS, master_flushed_offset=5, confirm_phy_offset=9))
    assert path.stat().st_size == 4096
    assert read_checkpoint(path) == Checkpoint(
        **FIELDS, master_flushed_offset=5, confirm_phy_offset=9
    )


def test_a_longer_file_or_a_folder_is_a_format_error(tmp_path: Path) -> None:
    (tmp_path / "checkpoint").write_bytes(b"\0" * 4097)
    with pytest.raises(StoreFormatError, match="4097 bytes"):
        read_checkpoint(tmp_path / "checkpoint")
    (tmp_path / "other").mkdir()
    with pytest.raises(StoreFormatError, match="not a regular file"):
        read_checkpoint(tmp_path / "other")


@pytest.mark.parametrize("size", [0, 1, 7, 8, 12, 23, 24, 39, 40, 4095])
def test_a_short_file_reads_as_a_broker_maps_it(tmp_path: Path, size: int) -> None:
    """The bytes it holds, then zeros; every time no later than the one written, so a
    recovery from it starts no later."""
    whole = Checkpoint(**FIELDS, master_flushed_offset=5, confirm_phy_offset=9)
    path = tmp_path / "checkpoint"
    path.write_bytes(whole.encode()[:size])
    found = read_checkpoint_file(path)
    assert found is not None and found.size == size and found.short
    assert found.checkpoint == Checkpoint.decode(whole.encode()[:size] + bytes(4096 - size))
    assert found.checkpoint.physic_msg_timestamp <= whole.physic_msg_timestamp
    assert found.checkpoint.logics_msg_timestamp <= whole.logics_msg_timestamp
    assert found.checkpoint.index_msg_timestamp <= whole.index_msg_timestamp
    assert found.checkpoint.min_timestamp <= whole.min_timestamp
    # written again, the file is whole
    write_checkpoint(path, found.checkpoint)
    assert path.stat().st_size == 4096
    assert read_checkpoint(path) == found.checkpoint
