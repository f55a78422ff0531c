"""Commit-log record codec: golden vectors, broker-written bytes, errors, round trips."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmqstore.errors import RecordError
from rmqstore.hosts import HostAddress, parse_host
from rmqstore.properties import encode_properties
from rmqstore.record import (
    MAGIC_BLANK,
    BodyMode,
    Message,
    RegionScan,
    ScanStop,
    decode_message,
    encode_blank,
    encode_record,
    property_crc_status,
)

from support import vectors

RECORDS = vectors()["messageRecords"]


def message_from_vector(vector: dict) -> Message:
    return Message(
        topic=vector["topic"],
        body=bytes.fromhex(vector["bodyHex"]),
        queue_id=vector["queueId"],
        flag=vector["flag"],
        sys_flag=vector["sysFlag"],
        born_timestamp=vector["bornTimestamp"],
        born_host=parse_host(vector["bornHost"]),
        store_timestamp=vector["storeTimestamp"],
        store_host=parse_host(vector["storeHost"]),
        reconsume_times=vector["reconsumeTimes"],
        prepared_transaction_offset=vector["preparedTransactionOffset"],
        queue_offset=vector["queueOffset"],
        physical_offset=vector["physicalOffset"],
        version=2 if vector["format"] == "V2" else 1,
        properties_bytes=bytes.fromhex(vector["propertiesHex"]),
    )


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_encode_matches_golden_bytes(name: str) -> None:
    vector = RECORDS[name]
    encoded = encode_record(
        message_from_vector(vector), append_crc_property=vector["crc32PropertyAppended"]
    )
    assert encoded.hex().upper() == vector["recordHex"]
    assert len(encoded) == vector["totalSize"]


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_decode_matches_golden_fields(name: str) -> None:
    vector = RECORDS[name]
    record = bytes.fromhex(vector["recordHex"])
    message = decode_message(record, physical_offset=vector["physicalOffset"], body=BodyMode.VERIFY)
    assert message.topic == vector["topic"]
    assert message.queue_id == vector["queueId"]
    assert message.queue_offset == vector["queueOffset"]
    assert message.physical_offset == vector["physicalOffset"]
    assert message.sys_flag == vector["sysFlag"]
    assert message.born_timestamp == vector["bornTimestamp"]
    assert message.store_timestamp == vector["storeTimestamp"]
    assert message.born_host == parse_host(vector["bornHost"])
    assert message.store_host == parse_host(vector["storeHost"])
    assert message.reconsume_times == vector["reconsumeTimes"]
    assert message.body == bytes.fromhex(vector["bodyHex"])
    assert message.body_crc == vector["bodyCRC"]
    assert message.store_size == vector["totalSize"]
    assert message.version == (2 if vector["format"] == "V2" else 1)
    if vector["crc32PropertyAppended"]:
        assert message.properties["__CRC32#"] == vector["crc32PropertyDigits"]
        assert property_crc_status(record, 0, len(record)) is True
    else:
        assert property_crc_status(record, 0, len(record)) is None
        assert message.properties_bytes == bytes.fromhex(vector["propertiesHex"])


def test_crc_property_mismatch_is_detected() -> None:
    record = bytearray(bytes.fromhex(RECORDS["v1_ipv4_with_crc32_property"]["recordHex"]))
    record[100] ^= 0xFF  # a body byte: the whole-record CRC no longer matches
    assert property_crc_status(record, 0, len(record)) is False
    with pytest.raises(RecordError, match="__CRC32#"):
        decode_message(record, verify_property_crc=True)


def test_blank_record_vector() -> None:
    blank = vectors()["blankRecord"]
    assert encode_blank(blank["maxBlank"]).hex().upper() == blank["first8Hex"]
    assert blank["nextMessageLength"] + 8 > blank["maxBlank"]


def test_broker_written_records_decode_and_re_encode_byte_identically() -> None:
    for vector in vectors()["brokerGenerated_4_9_8"]["commitlogRecords"]:
        record = bytes.fromhex(vector["recordHex"])
        message = decode_message(
            record, physical_offset=vector["physicalOffset"], body=BodyMode.VERIFY
        )
        assert message.topic == vector["topic"]
        assert message.queue_id == vector["queueId"]
        assert message.queue_offset == vector["queueOffset"]
        assert message.sys_flag == vector["sysFlag"]
        assert message.store_size == vector["totalSize"]
        assert message.store_timestamp == vector["storeTimestamp"]
        assert message.born_host == parse_host(vector["bornHost"])
        assert message.properties == vector["properties"]
        assert not message.properties_bytes.endswith(b"\x02")  # 4.9.x style
        assert encode_record(message) == record


def test_region_scan_walks_broker_records_to_the_blank() -> None:
    generated = vectors()["brokerGenerated_4_9_8"]
    data = b"".join(bytes.fromhex(v["recordHex"]) for v in generated["commitlogRecords"])
    tail = generated["blankRecordTail"]
    scan = RegionScan(
        data + bytes.fromhex(tail["hex"]), 0, len(data) + len(tail["hex"]) // 2, 0, check_crc=True
    )
    items = list(scan)
    assert [item[0] for item in items] == [
        v["physicalOffset"] for v in generated["commitlogRecords"]
    ]
    assert all(item[4] for item in items)
    assert scan.stop is ScanStop.BLANK and scan.end_position == len(data)
    assert struct.unpack(">ii", bytes.fromhex(tail["hex"])[:8])[1] == MAGIC_BLANK


V1 = bytes.fromhex(RECORDS["v1_ipv4"]["recordHex"])


@pytest.mark.parametrize(
    ("position", "value", "field"),
    [
        (4, b"\0\0\0\0", "MAGICCODE"),
        (0, b"\0\0\x10\0", "TOTALSIZE"),
        (0, b"\0\0\0\x20", "TOTALSIZE"),
        (84, b"\x7f\0\0\0", "BODYLENGTH"),
        (102, b"\xf0", "TOPICLENGTH"),
        (112, b"\x80\x00", "PROPERTIESLENGTH"),
        (112, b"\x00\x40", "TOTALSIZE"),
        (28, b"\0\0\0\0\0\0\0\x01", "PHYSICALOFFSET"),
    ],
)
def test_decode_errors_name_the_field(position: int, value: bytes, field: str) -> None:
    damaged = bytearray(V1)
    damaged[position : position + len(value)] = value
    with pytest.raises(RecordError) as caught:
        decode_message(bytes(damaged), physical_offset=1073742080)
    assert caught.value.field == field
    assert caught.value.physical_offset == 1073742080


def test_body_modes() -> None:
    damaged = bytearray(V1)
    damaged[90] ^= 1
    assert decode_message(V1, body=BodyMode.SKIP).body is None
    assert decode_message(bytes(damaged), body=BodyMode.READ).body != b"Hello RocketMQ"
    with pytest.raises(RecordError) as caught:
        decode_message(bytes(damaged), body=BodyMode.VERIFY)
    assert caught.value.field == "BODYCRC"


def test_truncated_record_is_an_error_not_a_crash() -> None:
    for cut in (0, 3, 8, 50, 100, len(V1) - 1):
        with pytest.raises(RecordError):
            decode_message(V1[:cut])


def test_blank_is_not_a_message() -> None:
    with pytest.raises(RecordError, match="BLANK"):
        decode_message(encode_blank(64) + bytes(56))


hosts = st.one_of(
    st.builds(HostAddress, st.binary(min_size=4, max_size=4), st.integers(0, 65535)),
    st.builds(HostAddress, st.binary(min_size=16, max_size=16), st.integers(0, 65535)),
)
property_text = st.text(
    alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)),
    min_size=1,
    max_size=12,
)
ints32 = st.integers(-(1 << 31), (1 << 31) - 1)
ints64 = st.integers(-(1 << 63), (1 << 63) - 1)


@settings(max_examples=300)
@given(
    topic=st.text(min_size=1, max_size=60).filter(lambda t: len(t.encode()) <= 127),
    long_topic=st.booleans(),
    body=st.binary(max_size=600),
    properties=st.dictionaries(property_text, property_text, max_size=6),
    born=hosts,
    store=hosts,
    flag=ints32,
    queue_id=st.integers(0, (1 << 31) - 1),
    sys_flag=st.integers(0, 0x7FF),
    queue_offset=ints64,
    physical_offset=ints64,
    born_ts=ints64,
    store_ts=ints64,
    reconsume=ints32,
    prepared=ints64,
    trailing=st.booleans(),
    crc_property=st.booleans(),
)
def test_round_trip_any_message(
    topic,
    long_topic,
    body,
    properties,
    born,
    store,
    flag,
    queue_id,
    sys_flag,
    queue_offset,
    physical_offset,
    born_ts,
    store_ts,
    reconsume,
    prepared,
    trailing,
    crc_property,
) -> None:
    version = 2 if long_topic else 1
    if long_topic:
        topic = "%RETRY%" + "x" * 140 + topic
    message = Message(
        topic=topic,
        body=body,
        queue_id=queue_id,
        flag=flag,
        sys_flag=sys_flag,
        born_timestamp=born_ts,
        born_host=born,
        store_timestamp=store_ts,
        store_host=store,
        reconsume_times=reconsume,
        prepared_transaction_offset=prepared,
        queue_offset=queue_offset,
        physical_offset=physical_offset,
        version=version,
        properties_bytes=encode_properties(properties, trailing_separator=trailing),
    )
    record = encode_record(message, append_crc_property=crc_property)
    decoded = decode_message(record, physical_offset=physical_offset, body=BodyMode.VERIFY)
    assert decoded.topic == topic
    assert decoded.body == body
    assert decoded.born_host == born and decoded.store_host == store
    expected_flags = (
        (sys_flag & ~0x30) | (0x10 if born.is_ipv6 else 0) | (0x20 if store.is_ipv6 else 0)
    )
    assert decoded.sys_flag == expected_flags
    assert (decoded.flag, decoded.queue_id, decoded.queue_offset) == (flag, queue_id, queue_offset)
    assert (decoded.born_timestamp, decoded.store_timestamp) == (born_ts, store_ts)
    assert (decoded.reconsume_times, decoded.prepared_transaction_offset) == (reconsume, prepared)
    assert decoded.version == version and decoded.store_size == len(record)
    expected_properties = dict(properties)
    if crc_property:
        expected_properties.pop("__CRC32#", None)
        assert property_crc_status(record, 0, len(record)) is True
        del decoded.properties["__CRC32#"]
    assert decoded.properties == expected_properties
    assert encode_record(decoded) == record
    scan = RegionScan(record + bytes(8), 0, len(record) + 8, physical_offset, check_crc=True)
    (item,) = list(scan)
    assert item[0] == physical_offset and item[2] == topic and item[4] is True


def test_an_empty_body_has_no_crc_to_check() -> None:
    """The broker checks BODYCRC only when the body is not empty: a record with an empty
    body and any stored BODYCRC is valid, for decode_message as for the scan."""
    message = Message(topic="T", body=b"", properties_bytes=b"A\x01b\x02")
    record = bytearray(encode_record(message))
    record[8:12] = (12345).to_bytes(4, "big")  # BODYCRC of nothing is 0; the broker ignores it
    decoded = decode_message(bytes(record), physical_offset=0, body=BodyMode.VERIFY)
    assert decoded.body == b"" and decoded.body_crc == 12345
    scan = RegionScan(bytes(record) + bytes(8), 0, len(record) + 8, 0, True)
    assert [crc_ok for *_, crc_ok in scan] == [True]


def test_each_header_struct_unpacks_exactly_the_header_fields() -> None:
    """record_item builds a RecordHeader from a struct's values without _make's count check:
    every host-flag combination's struct must give one value per field."""
    from rmqstore.record import _HEADERS, RecordHeader

    for key, layout in _HEADERS.items():
        values = layout.unpack(bytes(layout.size))
        assert len(values) == len(RecordHeader._fields), key
