"""Batches packed by the record kernel (``append_batch``) write the bytes and return the
results of the per-message path (``append_many``): every kind of message, file rolls, both
broker versions' property endings, a UNIQ_KEY month boundary, queue offsets continued."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

from rmqstore.config import StoreConfig
from rmqstore.errors import MessageTooLargeError
from rmqstore.hosts import HostAddress, parse_host
from rmqstore.messagebatch import BatchUnsupported, MessageBatch, uniform_batch
from rmqstore.msgid import UniqKeyGenerator
from rmqstore.record import (
    TRANSACTION_COMMIT,
    TRANSACTION_PREPARED,
    TRANSACTION_ROLLBACK,
    Message,
)
from rmqstore.store import Store

from support import tree_digest

CONFIG = StoreConfig(commitlog_file_size=8192)
V6 = parse_host("[2001:db8::9]:10911")
V4 = parse_host("10.0.0.9:4321")
MONTH_END = 1_711_929_599_000  # 2024-03-31T23:59:59Z


def varied(count: int, seed: int) -> list[Message]:
    rng = random.Random(seed)
    messages = []
    for n in range(count):
        properties = {"seq": str(n)}
        if n % 3:
            properties["TAGS"] = rng.choice(["TagA", "标签", "A||B"])
        if n % 5 == 0:
            properties["KEYS"] = f"order-{n} user-{n % 7}"
        if n % 11 == 0:
            properties["UNIQ_KEY"] = f"{n:032X}"
        body = bytes(rng.getrandbits(8) for _ in range(rng.choice([0, 1, 50, 900])))
        messages.append(
            Message(
                topic=rng.choice(["TopicTest", "Orders", "%RETRY%" + "g" * 140]),
                body=body,
                queue_id=rng.randrange(5),
                flag=rng.choice([0, 7, -1]),
                properties=properties,
                sys_flag=rng.choice(
                    [0, 0, 0, TRANSACTION_PREPARED, TRANSACTION_COMMIT, TRANSACTION_ROLLBACK, 1]
                ),
                born_timestamp=1_700_000_000_000 + n,
                born_host=V6 if n % 4 == 0 else V4,
                reconsume_times=n % 3,
                prepared_transaction_offset=n * 10,
            )
        )
    return messages


def write(root: Path, messages: list[Message], *, batched: bool, version5: bool, start: int):
    ticks = itertools.count(start, 7)
    with Store.open_write(root, CONFIG, create=True) as store:
        appender = store.appender(
            clock=lambda: next(ticks),
            store_host=V6 if version5 else V4,
            trailing_separator=version5,
            uniq_keys=UniqKeyGenerator(pid=42, class_loader_hash=7, first_counter=65530),
        )
        results = []
        for chunk in (messages[:7], messages[7:150], messages[150:]):
            if batched:
                batch = MessageBatch.from_messages(chunk, trailing_separator=version5)
                results += appender.append_batch(batch).results()
            else:
                results += appender.append_many(chunk)
        offsets = dict(appender.queue_offsets)
    return results, offsets


@pytest.mark.parametrize("version5", [False, True])
@pytest.mark.parametrize("start", [1_700_000_000_000, MONTH_END - 500])
def test_batches_write_what_one_message_at_a_time_writes(
    tmp_path: Path, version5: bool, start: int
) -> None:
    messages = varied(400, seed=start % 97)
    one = write(tmp_path / "one", messages, batched=False, version5=version5, start=start)
    many = write(tmp_path / "batch", messages, batched=True, version5=version5, start=start)
    assert one == many
    assert tree_digest(tmp_path / "one") == tree_digest(tmp_path / "batch")
    assert len({result.physical_offset // 8192 for result in one[0]}) > 5  # rolls happened


def test_a_uniform_batch_and_unsupported_messages(tmp_path: Path) -> None:
    born = HostAddress(bytes([10, 0, 0, 1]), 5000)
    batch = uniform_batch(
        topic="Bench",
        body=b"x" * 100,
        properties={"TAGS": "TagA"},
        queue_ids=(n & 3 for n in range(500)),
        born_host=born,
        born_timestamp=5,
        trailing_separator=True,
    )
    messages = [
        Message(topic="Bench", body=b"x" * 100, queue_id=n & 3, properties={"TAGS": "TagA"},
                born_host=born, born_timestamp=5)
        for n in range(500)
    ]  # fmt: skip
    for name, batched in (("a", True), ("b", False)):
        ticks = itertools.count(1_700_000_000_000)
        with Store.open_write(tmp_path / name, CONFIG, create=True) as store:
            appender = store.appender(
                clock=ticks.__next__, trailing_separator=True,
                uniq_keys=UniqKeyGenerator(pid=1, class_loader_hash=2),
            )  # fmt: skip
            if batched:
                appender.append_batch(batch)
            else:
                appender.append_many(messages)
    assert tree_digest(tmp_path / "a") == tree_digest(tmp_path / "b")
    with pytest.raises(BatchUnsupported):
        MessageBatch.from_messages(
            [Message(topic="T", properties={"DELAY": "3"})], trailing_separator=True
        )
    with Store.open_write(tmp_path / "c", CONFIG, create=True) as store:
        appender = store.appender(trailing_separator=True)
        too_big = MessageBatch.from_messages(
            [Message(topic="T", body=b"y" * 9000)], trailing_separator=True
        )
        with pytest.raises(MessageTooLargeError):
            appender.append_batch(too_big)
        assert appender.appended == 0


@pytest.mark.parametrize("damage", ["topic", "host", "body", "props", "queue", "store_host"])
def test_rows_the_builder_did_not_make_are_refused_both_ways(damage: str) -> None:
    from array import array

    from rmqstore.kernel import _native, layout, reference

    batch = MessageBatch.from_messages(
        [Message(topic="T", body=b"abc", properties={"TAGS": "x"}) for _ in range(3)],
        trailing_separator=True,
    )
    rows = array("q", batch.rows)
    body_spans, prop_spans = array("q", batch.body_spans), array("q", batch.prop_spans)
    store_host = bytes(8)
    if damage == "topic":
        rows[layout.PACK_TOPIC] = 5
    elif damage == "host":
        rows[layout.PACK_WIDTH + layout.PACK_HOST] = -1
    elif damage == "body":
        body_spans[2] = 10**9
    elif damage == "props":
        prop_spans[3] = 1 << 40
    elif damage == "queue":
        rows[2 * layout.PACK_WIDTH + layout.PACK_QUEUE_ID] = 7
    else:
        store_host = bytes(9)
    for kernel in (_native, reference):
        state = array("q", bytes(8 * layout.KEY_STATE_WIDTH))
        state[layout.KEY_QUEUE_SPAN] = 1
        state[layout.KEY_NEXT_MONTH] = 1 << 62
        with pytest.raises(ValueError):
            kernel.pack_records(
                bytearray(4096), 0, 4096, 4096, 0, array("q", rows), 0, 3, batch.bodies,
                body_spans, batch.props, prop_spans, b"\x01T", array("q", [0, 2, -626843481]),
                bytes(8), array("q", [0, 8]), store_host, array("q", [0]), b"", state,
                array("q", bytes(8 * layout.RESULT_WIDTH * 3)),
            )  # fmt: skip


def _scenario_log(
    root: Path, name: str, messages: list[Message] | None, *, batched: bool = False
) -> list[Message]:
    """The commit log of fixture scenario ``name`` (before any damage) under ``root``: its
    plan run as ``fixtures generate`` runs it, or, given the messages that run appended, those
    messages again, one at a time or (``batched``) in batches through the record kernel's
    packer (a chunk the packer does not take one at a time, as ``append`` does). Returns the
    messages."""
    from dataclasses import replace

    from rmqstore.fixtures import FixtureOptions, _config, scenario, scenario_builder

    chosen = scenario(name)
    options = FixtureOptions(broker_version=chosen.broker_version or "4.9")
    with Store.open_write(root, _config(chosen, options), create=True) as store:
        builder = scenario_builder(store, chosen, options)
        if messages is None:
            chosen.plan(builder, chosen.messages)
            return [replace(message) for message, _ in builder.appended]
        chunks = random.Random(len(messages))
        at = 0
        while at < len(messages):
            chunk = messages[at : at + chunks.choice((1, 7, 64, 500))]
            at += len(chunk)
            if not batched:
                builder.appender.append_many(chunk)
                continue
            try:
                builder.appender.append_batch(
                    MessageBatch.from_messages(
                        chunk, trailing_separator=builder.appender.trailing_separator
                    )
                )
            except BatchUnsupported:  # a DELAY, or the __CRC32# property: one at a time
                builder.appender.append_many(chunk)
    return messages


@pytest.mark.parametrize("name", ["basic", "multi", "txn", "delay", "v2"])
def test_fixture_scenarios_written_in_batches_are_the_same_log(tmp_path: Path, name: str) -> None:
    """Every scenario's messages (the damaged ones are ``multi``'s before their damage;
    ``large`` is written in batches already) give the same files either way."""
    messages = _scenario_log(tmp_path / "plan", name, None)
    _scenario_log(tmp_path / "one", name, messages)
    _scenario_log(tmp_path / "batch", name, messages, batched=True)
    one = sorted((tmp_path / "one" / "commitlog").iterdir())
    batch = sorted((tmp_path / "batch" / "commitlog").iterdir())
    assert [p.name for p in one] == [p.name for p in batch]
    assert [p.read_bytes() for p in one] == [p.read_bytes() for p in batch]
