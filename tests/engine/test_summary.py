"""``info``'s summary: the quick one (the log's tail only) says what the deep one (every
record) says, but for the counts only a full read can give."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from rmqstore.config import StoreConfig
from rmqstore.fixtures import SCENARIOS, FixtureOptions, generate
from rmqstore.store import Store
from rmqstore.summary import summarize

from support import ORACLE_CONFIG

CLEAN = sorted(n for n in SCENARIOS if n != "large" and SCENARIOS[n].damage is None)
DAMAGED = sorted(n for n in SCENARIOS if SCENARIOS[n].damage is not None)


def _without_full_counts(summary: dict) -> dict:
    """The summary less what only --deep counts."""
    document = copy.deepcopy(summary)
    del document["deep"]
    del document["commitLog"]["messages"]
    for topic in document["topics"]:
        for queue in topic["queues"]:
            del queue["notQueued"]
    return document


def _compare(store_dir: Path, config=None) -> None:  # type: ignore[no-untyped-def]
    with Store.open_read(store_dir, config) as store:
        quick = summarize(store)
        deep = summarize(store, deep=True)
    assert quick["deep"] is False and deep["deep"] is True
    assert quick["commitLog"]["messages"] is None
    assert deep["commitLog"]["messages"] >= 0
    # a queue of only PREPARED/ROLLBACK records has no consume queue: only --deep sees it
    for topic in deep["topics"]:
        topic["queues"] = [q for q in topic["queues"] if q["messages"] != q["notQueued"]]
    deep["topics"] = [topic for topic in deep["topics"] if topic["queues"]]
    assert _queued_counts(quick) == _queued_counts(deep)
    for document in (quick, deep):
        for topic in document["topics"]:
            for queue in topic["queues"]:
                queue["messages"] = None
    assert _without_full_counts(quick) == _without_full_counts(deep)


def _queued_counts(summary: dict) -> dict:
    """Each queue's message count less the records no consume queue holds (deep knows
    those; the quick count is of consume-queue units and the tail)."""
    counts = {}
    for topic in summary["topics"]:
        for queue in topic["queues"]:
            not_queued = queue["notQueued"] or 0
            counts[(topic["topic"], queue["queueId"])] = queue["messages"] - not_queued
    return counts


@pytest.mark.parametrize("name", CLEAN)
def test_the_quick_summary_agrees_with_the_deep_one(tmp_path: Path, name: str) -> None:
    out = tmp_path / name
    generate(name, out, FixtureOptions())
    _compare(out)


@pytest.mark.parametrize(
    "name", ["s1_multi", "s3_txn_delay", "s4_recovered_from_torn_half_record", "v533_s1_multi"]
)
def test_the_quick_summary_agrees_on_broker_stores(oracle, name: str) -> None:
    _compare(oracle(name).store, StoreConfig(**ORACLE_CONFIG))


@pytest.mark.parametrize("name", [n for n in DAMAGED if n != "cq-wrong-size"])
def test_on_damaged_stores_the_ends_and_the_lag_agree(tmp_path: Path, name: str) -> None:
    out = tmp_path / name
    generate(name, out, FixtureOptions())
    with Store.open_read(out) as store:
        quick, deep = summarize(store), summarize(store, deep=True)
    for document in (quick, deep):
        del document["commitLog"]["messages"]
    assert quick["commitLog"] == deep["commitLog"]
    assert quick["dispatch"] == deep["dispatch"]
    assert quick["consumeQueues"] == deep["consumeQueues"]


@pytest.mark.parametrize("name", ["multi", "cq-truncated", "torn-tail"])
def test_each_consume_queue_is_loaded_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """A broker may have thousands of queues: the summary reads each one once (its offsets,
    its tip and its last unit together), not once per question asked of them (a queue
    ending before the log does sends the summary to the log's tail)."""
    store_dir = tmp_path / "store"
    generate(name, store_dir)
    loads: list[tuple[str, int]] = []
    real = Store.listed_queue

    def counting(self: Store, topic: str, queue_id: int):  # type: ignore[no-untyped-def]
        loads.append((topic, queue_id))
        return real(self, topic, queue_id)

    monkeypatch.setattr(Store, "listed_queue", counting)
    with Store.open_read(store_dir) as store:
        summary = summarize(store)
    assert loads and len(loads) == len(set(loads)) == len(summary["consumeQueues"])


def test_records_no_queue_takes_are_not_a_dispatch_lag(tmp_path: Path) -> None:
    """PREPARED and ROLLBACK records after the furthest queue's last record, or a last
    commit-log file holding no record after a BLANK, are no lag: a dispatch adds nothing
    for them (info called them records and bytes behind, whatever dispatch did). A record
    a queue takes after them is behind, and so is what follows it."""
    from rmqstore.dispatch import Dispatcher
    from rmqstore.record import TRANSACTION_PREPARED, TRANSACTION_ROLLBACK, Message

    config = StoreConfig(commitlog_file_size=4096, consumequeue_file_size=200)
    store_dir = tmp_path / "s"
    with Store.open_write(store_dir, config, create=True) as store:
        store.appender().append_many([Message(topic="T", body=b"x" * 700) for _ in range(5)])
        dispatcher = Dispatcher(store)
        dispatcher.run()
        dispatcher.close()
        queued_end = store.log_end().offset
        appender = store.appender()
        for sys_flag in (TRANSACTION_PREPARED, TRANSACTION_ROLLBACK):
            appender.append(Message(topic="T", body=b"y", sys_flag=sys_flag))
    for deep in (False, True):
        with Store.open_read(store_dir, config) as store:
            lag = summarize(store, deep=deep)["dispatch"]
            end = store.log_end().offset
        assert end > queued_end and lag == {"cursor": end, "behindBytes": 0, "behindRecords": 0}

    with Store.open_write(store_dir, config) as store:
        appended = store.appender().append(Message(topic="T", body=b"z"))
        store.appender().append(Message(topic="T", body=b"y", sys_flag=TRANSACTION_ROLLBACK))
        end = store.log_end().offset
    with Store.open_read(store_dir, config) as store:
        lag = summarize(store)["dispatch"]
    assert lag == {
        "cursor": appended.physical_offset,
        "behindBytes": end - appended.physical_offset,
        "behindRecords": 2,
    }

    blank_dir = tmp_path / "blank"
    with Store.open_write(blank_dir, config, create=True) as store:
        store.appender().append_many([Message(topic="T", body=b"x" * 700) for _ in range(7)])
    (blank_dir / "commitlog" / "00000000000000004096").write_bytes(bytes(4096))
    with Store.open_write(blank_dir, config) as store:
        dispatcher = Dispatcher(store)
        dispatcher.run()
        dispatcher.close()
    with Store.open_read(blank_dir, config) as store:
        lag = summarize(store)["dispatch"]
    assert lag == {"cursor": 4096, "behindBytes": 0, "behindRecords": 0}
