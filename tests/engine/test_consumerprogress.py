"""Consumer groups' and the delay scheduler's offsets against the consume queues."""

from __future__ import annotations

import shutil
from pathlib import Path

from rmqstore.config import StoreConfig
from rmqstore.consumerprogress import (
    BEFORE_START,
    IN_RANGE,
    NO_QUEUE,
    PAST_END,
    offsets_past_end,
    offsets_report,
)
from rmqstore.fixtures import FixtureOptions, generate
from rmqstore.store import Store

from support import ORACLE_CONFIG


def test_the_real_schedulers_offsets_against_its_queues(oracle) -> None:
    """s3_txn_delay: a 4.9.8 broker shut down after delivering levels 1-3; level 18 (2 h)
    was still waiting. The scheduler's offsets are the queues' ends for the delivered levels
    and level 18 has none recorded (its queue starts at 0)."""
    store = oracle("s3_txn_delay")
    manifest = store.manifest
    with Store.open_read(store.store, StoreConfig(**ORACLE_CONFIG)) as opened:
        report = offsets_report(opened)
    assert report.consumers == {"file": None, "groups": []}
    assert report.scheduler["file"] == "config/delayOffset.json"
    levels = {row["level"]: row for row in report.scheduler["levels"]}
    max_offsets = {int(k): v for k, v in manifest["scheduleTopicMaxOffsets"].items() if v}
    assert set(levels) == set(max_offsets)
    for level in (1, 2, 3):
        assert levels[level]["offset"] == levels[level]["maxOffset"] == max_offsets[level]
        assert levels[level]["pending"] == 0 and levels[level]["state"] == IN_RANGE
        assert levels[level]["recorded"]
    waiting = levels[18]
    assert not waiting["recorded"] and waiting["offset"] == 0
    assert waiting["pending"] == max_offsets[18] == 3
    first = min(
        (p for p in manifest["puts"] if p["topic"] == "SCHEDULE_TOPIC_XXXX" and p["queueId"] == 17),
        key=lambda put: put["queueOffset"],
    )
    assert waiting["nextDue"] == first["storeTimestamp"] + 2 * 3600 * 1000
    assert waiting["delayMillis"] == 7_200_000
    assert report.notes == []


def test_the_bak_of_the_real_scheduler_file_is_read_when_the_file_is_damaged(
    oracle, tmp_path: Path
) -> None:
    store = oracle("s3_txn_delay").copy_to(tmp_path)  # the session's copy stays as it is
    (store / "config" / "delayOffset.json").write_text('{\n\t"offsetTable":{')
    with Store.open_read(store, StoreConfig(**ORACLE_CONFIG)) as opened:
        report = offsets_report(opened)
    assert report.scheduler["file"] == "config/delayOffset.json.bak"
    levels = {row["level"]: row for row in report.scheduler["levels"]}
    # the .bak is the broker's copy from before its last persist: level 3 not yet there
    assert (levels[1]["offset"], levels[2]["offset"]) == (3, 2)
    assert not levels[3]["recorded"] and levels[3]["pending"] == levels[3]["maxOffset"]
    assert any("does not load" in note and ".bak" in note for note in report.notes)


def test_each_state_and_lag(tmp_path: Path) -> None:
    store = tmp_path / "store"
    generate("basic", store, FixtureOptions())  # BasicTopic queue 0: 20 messages
    (store / "config" / "consumerOffset.json").write_text(
        '{"offsetTable":{"BasicTopic@a":{0:5},"BasicTopic@b":{0:20},"BasicTopic@c":{0:23},'
        '"BasicTopic@d":{0:0,3:4},"Gone@a":{1:7}}}'
    )
    with Store.open_read(store) as opened:
        queue = opened.consume_queue("BasicTopic", 0)
        fifth = queue.read_unit(4)
        fifth_time = opened.commitlog.read(fifth.physical_offset).store_timestamp
        report = offsets_report(opened)
        past = offsets_past_end(opened)
        cut = offsets_past_end(opened, {("BasicTopic", 0): 10})
    rows = {
        (group["group"], row["topic"], row["queueId"]): row
        for group in report.consumers["groups"]
        for row in group["queues"]
    }
    assert rows[("a", "BasicTopic", 0)] | {} == {
        "topic": "BasicTopic",
        "queueId": 0,
        "consumerOffset": 5,
        "minOffset": 0,
        "maxOffset": 20,
        "lag": 15,
        "lastConsumed": fifth_time,
        "state": IN_RANGE,
    }
    assert rows[("b", "BasicTopic", 0)]["lag"] == 0
    assert rows[("c", "BasicTopic", 0)]["state"] == PAST_END
    assert rows[("c", "BasicTopic", 0)]["lastConsumed"] == 0
    assert rows[("d", "BasicTopic", 0)]["lastConsumed"] == 0  # nothing consumed yet
    assert rows[("d", "BasicTopic", 3)]["state"] == NO_QUEUE
    assert rows[("a", "Gone", 1)]["state"] == NO_QUEUE
    group_lag = {group["group"]: group["lag"] for group in report.consumers["groups"]}
    assert group_lag == {"a": 15, "b": 0, "c": 0, "d": 20}
    assert [(p.group, p.offset, p.queue_end) for p in past] == [("c", 23, 20)]
    # queues cut to 10 units: every group past 10 is named, with the queue's new end
    assert [(p.group, p.offset, p.queue_end) for p in cut] == [("b", 20, 10), ("c", 23, 10)]


def test_an_offset_before_a_queues_start(tmp_path: Path) -> None:
    """The queue's first file removed (expired): its min offset moves on, and a group that
    had not got there lost those messages."""
    store = tmp_path / "store"
    generate("basic", store, FixtureOptions(messages=60, consumequeue_file_size=400))
    queue_dir = store / "consumequeue" / "BasicTopic" / "0"
    first = sorted(queue_dir.iterdir())[0]
    shutil.move(first, tmp_path / first.name)
    (store / "config" / "consumerOffset.json").write_text('{"offsetTable":{"BasicTopic@a":{0:3}}}')
    with Store.open_read(store) as opened:
        row = offsets_report(opened).consumers["groups"][0]["queues"][0]
    assert row["minOffset"] == 20 and row["state"] == BEFORE_START
    assert row["lag"] == row["maxOffset"] - 20
