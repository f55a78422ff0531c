"""``dump`` of a consume-queue file: the units found in place by the record kernel (a span of
the log read at once) get the verdicts the units looked up one by one get, on every
real-broker store and on copies whose units point anywhere."""

from __future__ import annotations

import random
import shutil
import struct
from pathlib import Path

import pytest

from rmqstore import filedump
from rmqstore.config import StoreConfig
from rmqstore.fixtures import generate

from support import ORACLE_CONFIG, ORACLE_STORES, mutate_units


def _queue_files(store: Path) -> list[Path]:
    return sorted(
        path
        for path in (store / "consumequeue").rglob("*")
        if path.is_file() and len(path.name) == 20
    )


def _both_ways(path: Path, config: StoreConfig, monkeypatch: pytest.MonkeyPatch) -> list:
    """The items of ``path`` with units found in place, after checking they are the items of
    every unit looked up one by one; returns them."""
    target = filedump.identify(path)
    fast = list(filedump.consumequeue_items(target, config))
    with monkeypatch.context() as patched:
        patched.setattr(filedump, "_units_in_place", lambda *args: [])
        slow = list(filedump.consumequeue_items(target, config))
    assert fast == slow, path
    return fast


@pytest.mark.parametrize("name", sorted(ORACLE_STORES))
def test_every_real_broker_queue_file(oracle, name: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    config = StoreConfig(**ORACLE_CONFIG)
    verdicts = set()
    for path in _queue_files(oracle(name).store):
        items = _both_ways(path, config, monkeypatch)
        verdicts |= {item.get("record") for item in items if item["type"] == "unit"}
    assert "ok" in verdicts


@pytest.mark.parametrize("seed", range(8))
def test_units_pointing_anywhere(tmp_path: Path, seed: int, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    store = tmp_path / "store"
    generate("multi" if seed % 2 else "torn-tail", store)
    rng = random.Random(seed)
    mutate_units(store, rng, rng.randrange(4, 20))
    verdicts = set()
    for path in _queue_files(store):
        items = _both_ways(path, StoreConfig(), monkeypatch)
        verdicts |= {item.get("record") for item in items if item["type"] == "unit"}
    assert "ok" in verdicts
    shutil.rmtree(store)


def test_a_unit_pointing_at_an_earlier_record_of_its_queue(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Unit 5 holding unit 0's bytes points at a whole record of its queue and size, but of
    queue offset 0: it differs, found in place or looked up."""
    store = tmp_path / "store"
    generate("multi", store)
    path = _queue_files(store)[0]
    data = bytearray(path.read_bytes())
    data[100:120] = data[0:20]
    path.write_bytes(data)
    items = [
        item for item in _both_ways(path, StoreConfig(), monkeypatch) if item["type"] == "unit"
    ]
    assert items[5]["record"] == "differs" and "queue offset 0" in items[5]["recordNote"]
    assert {item["record"] for item in items[:5] + items[6:]} == {"ok"}


def test_units_pointing_at_the_wrong_size_and_into_a_record(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A unit one byte too long points at its own record, which differs by its size; a unit
    pointing four bytes into a record finds none there: the same found in place or looked up
    (through a window of the log, as each unit not plainly in place is)."""
    store = tmp_path / "store"
    generate("multi", store)
    path = _queue_files(store)[0]
    data = bytearray(path.read_bytes())
    offset, record_size, code = struct.unpack_from(">qiq", data, 2 * 20)
    struct.pack_into(">qiq", data, 2 * 20, offset, record_size + 1, code)
    offset, size, code = struct.unpack_from(">qiq", data, 3 * 20)
    struct.pack_into(">qiq", data, 3 * 20, offset + 4, size, code)
    path.write_bytes(data)
    items = [
        item for item in _both_ways(path, StoreConfig(), monkeypatch) if item["type"] == "unit"
    ]
    assert items[2]["record"] == "differs" and f"is {record_size} bytes" in items[2]["recordNote"]
    assert items[3]["record"] == "missing" and "MAGICCODE" in items[3]["recordNote"]
    assert {item["record"] for item in items[:2] + items[4:]} == {"ok"}
