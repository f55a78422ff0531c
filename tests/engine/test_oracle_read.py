"""Every message of the real-broker stores reads back as the broker reported it."""

from __future__ import annotations

import hashlib
import os

import pytest

from rmqstore.commitlog import CommitLog
from rmqstore.config import StoreConfig
from rmqstore.properties import decode_properties
from rmqstore.reader import MessageReader
from rmqstore.record import BodyMode, ScanStop
from rmqstore.store import Store
from rmqstore.verify import verify_store

from support import ORACLE_CONFIG, ORACLE_STORES, manifest_dump

WITH_PUTS = sorted(name for name in ORACLE_STORES if not name.startswith("s4_"))


@pytest.mark.parametrize("name", WITH_PUTS)
def test_every_put_reads_back_exactly(oracle, name: str) -> None:
    store_dir = oracle(name).store
    manifest = oracle(name).manifest
    with Store.open_read(store_dir) as store:
        reader = MessageReader(store)
        for put in manifest["puts"]:
            message = reader.by_offset(put["physicalOffset"], body=BodyMode.VERIFY)
            where = f"put {put['seq']} at {put['physicalOffset']}"
            assert message.topic == put["topic"], where
            assert message.queue_id == put["queueId"], where
            assert message.queue_offset == put["queueOffset"], where
            assert message.store_size == put["size"], where
            assert message.msg_id == put["msgId"], where
            assert message.store_timestamp == put["storeTimestamp"], where
            # the manifest's uniqKey is the producer's; op messages never stored theirs
            stored = decode_properties(put["propertiesString"])
            assert message.uniq_key == stored.get("UNIQ_KEY"), where
            assert message.tags == put["tags"] and message.keys == put["keys"], where
            assert message.sys_flag == put["sysFlag"] and message.flag == put["flag"], where
            assert message.body_crc == put["bodyCRC"], where
            assert message.born_timestamp == put["bornTimestamp"], where
            assert message.reconsume_times == put["reconsumeTimes"], where
            assert message.prepared_transaction_offset == put["preparedTransactionOffset"], where
            assert message.properties_bytes.decode("utf-8") == put["propertiesString"], where
            assert message.properties == decode_properties(put["propertiesString"]), where
            assert len(message.body) == put["storedBodyLength"], where
            assert hashlib.sha256(message.body).hexdigest() == put["storedBodySha256"], where


@pytest.mark.parametrize("name", sorted(ORACLE_STORES))
def test_scan_finds_the_records_and_blanks_the_broker_found(oracle, name: str) -> None:
    manifest = oracle(name).manifest
    dump = manifest_dump(manifest)
    log = CommitLog(oracle(name).store / "commitlog", 65536)
    scan = log.scan(check_crc=True)
    offsets = []
    for offset, _header, _topic, _props, crc_ok in scan:
        assert crc_ok
        offsets.append(offset)
    if dump is not None:
        records = dump["commitLogScan"]["records"]
        assert offsets == [r["offset"] for r in records if r["type"] == "MESSAGE"]
        assert scan.end_offset == dump["commitLogScan"]["maxOffset"]
        assert dump["storeState"]["maxPhyOffset"] == scan.end_offset
    else:
        assert scan.end_offset == manifest["lastValidEnd"]
    # S4 was recovered by a real broker, which leaves the torn bytes after the valid end
    expected_stop = ScanStop.INVALID if name.startswith("s4_") else ScanStop.END
    assert scan.stop is expected_stop
    log.close()


def test_v2_records_of_the_5_3_3_store_are_read(oracle) -> None:
    manifest = oracle("v533_s1_multi").manifest
    long_topics = {put["topic"] for put in manifest["puts"] if len(put["topic"]) > 127}
    assert long_topics and all(t.startswith("%RETRY%") for t in long_topics)
    with Store.open_read(oracle("v533_s1_multi").store) as store:
        versions = {
            store.commitlog.read(p["physicalOffset"]).version
            for p in manifest["puts"]
            if p["topic"] in long_topics
        }
    assert versions == {2}


@pytest.mark.parametrize("copy", ["store_torn_half_record", "store_torn_random_garbage"])
def test_torn_copies_end_at_the_last_valid_record(oracle, copy: str) -> None:
    crash = oracle("s2_crash")
    log = CommitLog(crash.root / copy / "commitlog", 65536)
    scan = log.scan()
    count = sum(1 for _ in scan)
    assert count == len(crash.manifest["puts"])
    assert scan.end_offset == crash.manifest["lastValidEnd"]
    assert scan.stop is ScanStop.INVALID  # non-zero bytes follow: a torn write
    log.close()


def test_valid_end_uses_recovery_rules_on_the_crashed_store(oracle) -> None:
    crash = oracle("s2_crash")
    with Store.open_read(crash.root / "store_torn_half_record", StoreConfig()) as store:
        assert store.abort_path.exists()
        end = store.log_end()
    assert end.offset == crash.manifest["lastValidEnd"]
    assert end.error is not None


def test_no_file_is_left_open_after_reads_and_a_verify(oracle) -> None:
    """Reads go through a few cached descriptors (never maps); closing the store closes them,
    and a verify closes what it opened."""
    before = set(os.listdir("/proc/self/fd"))
    with Store.open_read(oracle("s1_multi").store, StoreConfig(**ORACLE_CONFIG)) as store:
        reader = MessageReader(store)
        for offset, *_ in store.commitlog.scan():
            reader.by_offset(offset)
        verify_store(store)
    assert set(os.listdir("/proc/self/fd")) <= before
