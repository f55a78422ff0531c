"""``MessageReader.queue_lines``/``topic_lines`` (``read --topic T [--queue Q] --jsonl`` or
``--csv``/``--tsv``: the units of a block read together, the records decoded by the record
kernel and written as JSON lines or CSV/TSV rows by it) against :meth:`by_queue`/:meth:`by_topic`
read one message at a time: the same text, notes and errors on every fixture, every
real-broker store, and copies whose consume queues point anywhere."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from rmqstore.commands.output import document_json
from rmqstore.config import StoreConfig
from rmqstore.consumequeue import list_queues
from rmqstore.documents import DelimitedLayout, delimited_row, document_cells, message_document
from rmqstore.errors import RmqStoreError
from rmqstore.fixtures import SCENARIOS, generate
from rmqstore.kernel.layout import BODY_MODE_NAMES, MESSAGE_COLUMNS
from rmqstore.reader import MessageReader, MessageSelection, TextBlock, selected
from rmqstore.record import BodyMode, Message
from rmqstore.store import Store

from support import ORACLE_CONFIG, ORACLE_STORES, compiled_pass_only, mutate_units, run_cli

SMALL_SCENARIOS = sorted(name for name in SCENARIOS if name != "large")


def _render(items, body_mode: str, table: DelimitedLayout | None = None) -> str:
    """The text of the items: a block's as it is; a message's JSON line, or its row of
    ``table`` as ``read --csv``/``--tsv`` writes it."""
    parts = []
    for item in items:
        if isinstance(item, TextBlock):
            parts.append(item.text.decode("utf-8"))
            continue
        assert isinstance(item, Message)
        document = message_document(item, body_mode, item.body)
        if table is None:
            parts.append(document_json(document) + "\n")
        else:
            parts.append(delimited_row(document_cells(document, table.fields), table.delimiter))
    return "".join(parts)


def _outcome(store_dir: Path, config: StoreConfig, read) -> tuple[str, list[str], str | None]:
    """(the lines, the notes, the error) of ``read(reader)``, with a reader of its own."""
    with Store.open_read(store_dir, config) as store:
        reader = MessageReader(store)
        parts: list = []
        error = None
        try:
            for item in read(reader):
                parts.append(item)
        except RmqStoreError as exc:
            error = f"{type(exc).__name__}: {exc}"
        return _render(parts, read.body_mode, read.table), reader.notes, error


class _Read:
    """One read, one at a time (``slow``) or by blocks of lines (the reader's lines), of the
    messages ``selection`` keeps (all without one)."""

    def __init__(
        self,
        kind: str,
        topic: str,
        queue_id: int,
        start,
        count,
        body_mode: str,
        table: DelimitedLayout | None = None,
        selection: MessageSelection | None = None,
    ):
        self.kind, self.topic, self.queue_id = kind, topic, queue_id
        self.start, self.count, self.body_mode, self.table = start, count, body_mode, table
        self.selection = selection

    def slow(self):
        body = BodyMode.SKIP if self.body_mode == "none" else BodyMode.READ
        walk_count = self.count if self.selection is None else None

        def read(reader: MessageReader):
            if self.kind == "queue":
                messages = reader.by_queue(
                    self.topic, self.queue_id, self.start, walk_count, body=body
                )
            else:
                messages = reader.by_topic(self.topic, walk_count, body=body)
            if self.selection is None:
                return messages
            chosen = self.selection
            return selected(
                messages, tags=chosen.tags, begin=chosen.begin, end=chosen.end, count=self.count
            )

        read.body_mode = self.body_mode  # type: ignore[attr-defined]
        read.table = self.table  # type: ignore[attr-defined]
        return read

    def fast(self):
        shape = {"body_mode": self.body_mode, "layout": self.table, "selection": self.selection}

        def read(reader: MessageReader):
            if self.kind == "queue":
                return reader.queue_lines(
                    self.topic, self.queue_id, self.start, self.count, **shape
                )
            return reader.topic_lines(self.topic, self.count, **shape)

        read.body_mode = self.body_mode  # type: ignore[attr-defined]
        read.table = self.table  # type: ignore[attr-defined]
        return read

    def picked(self):
        """With a selection: the messages the reader picks from the kernel's rows
        (``queue_messages``/``topic_messages``, as ``read`` shows a filtered table)."""
        body = BodyMode.SKIP if self.body_mode == "none" else BodyMode.READ
        chosen = self.selection

        def read(reader: MessageReader):
            if self.kind == "queue":
                return reader.queue_messages(
                    self.topic, self.queue_id, self.start, self.count, selection=chosen, body=body
                )
            return reader.topic_messages(self.topic, self.count, selection=chosen, body=body)

        read.body_mode = self.body_mode  # type: ignore[attr-defined]
        read.table = self.table  # type: ignore[attr-defined]
        return read


def _table(rng: random.Random) -> DelimitedLayout | None:
    """JSON lines half the time, else a CSV or TSV table of every column or some."""
    if rng.random() < 0.5:
        return None
    fields = MESSAGE_COLUMNS if rng.random() < 0.5 else rng.sample(MESSAGE_COLUMNS, 4)
    return DelimitedLayout(tuple(fields), rng.choice((",", "\t")))


def _selection(rng: random.Random, stored: list[tuple[int, str | None]]) -> MessageSelection | None:
    """None half the time, else a window between two of the ``stored`` (store time, TAGS)
    pairs, some of their tags (with one no message has), or both."""
    if rng.random() < 0.5 or not stored:
        return None
    stamps = sorted(stamp for stamp, _ in stored)
    begin, end = sorted((rng.choice(stamps), rng.choice(stamps)))
    known = sorted({tags for _, tags in stored if tags is not None})
    tags = frozenset([*rng.sample(known, min(len(known), rng.randint(1, 3))), "no-such-tag"])
    kind = rng.randrange(3)
    if kind == 0:
        return MessageSelection(begin, end)
    if kind == 1:
        return MessageSelection(tags=tags)
    return MessageSelection(begin, end, tags)


def _reads(store_dir: Path, rng: random.Random, config: StoreConfig) -> list[_Read]:
    queues = list_queues(store_dir / "consumequeue")
    with Store.open_read(store_dir, config) as store:
        try:
            stored = [
                (message.store_timestamp, message.tags)
                for message in MessageReader(store).sequential(0, body=BodyMode.SKIP)
            ]
        except RmqStoreError:
            stored = []
    reads = []
    for topic, queue_id in queues:
        mode, table = rng.choice(BODY_MODE_NAMES), _table(rng)
        chosen = _selection(rng, stored)
        reads.append(_Read("queue", topic, queue_id, None, None, mode, table, chosen))
        start, count = rng.randrange(-2, 30), rng.randrange(1, 40)
        reads.append(_Read("queue", topic, queue_id, start, count, mode, table, chosen))
    for topic in sorted({topic for topic, _ in queues}):
        mode, table = rng.choice(BODY_MODE_NAMES), _table(rng)
        chosen = _selection(rng, stored)
        reads.append(_Read("topic", topic, 0, None, None, mode, table, chosen))
        reads.append(_Read("topic", topic, 0, None, rng.randrange(1, 60), mode, table, chosen))
    return reads


def _check_store(store_dir: Path, config: StoreConfig, seed: int) -> int:
    """Every read of ``_reads`` gives the same either way; returns how many lines they gave."""
    lines = 0
    for read in _reads(store_dir, random.Random(seed), config):
        slow = _outcome(store_dir, config, read.slow())
        fast = _outcome(store_dir, config, read.fast())
        assert fast == slow, (store_dir, read.__dict__)
        if read.selection is not None:
            assert _outcome(store_dir, config, read.picked()) == slow, (store_dir, read.__dict__)
        lines += slow[0].count("\n")
    return lines


def _check_sequential(store_dir: Path, config: StoreConfig, seed: int) -> None:
    """A sequential read picking by store time and TAGS from the scan's rows gives the
    messages a read of every message filtered one by one gives (with a body CRC check too,
    and a count), the same notes and error."""
    rng = random.Random(seed)
    with Store.open_read(store_dir, config) as store:
        stored = [
            (message.store_timestamp, message.tags)
            for message in MessageReader(store).sequential(0, body=BodyMode.SKIP)
        ]
    for _ in range(6):
        chosen = _selection(rng, stored) or MessageSelection(tags=frozenset({"TagA"}))
        count = rng.choice((None, 1, 7))
        body = rng.choice((BodyMode.READ, BodyMode.SKIP, BodyMode.VERIFY))

        def everything(reader: MessageReader, chosen=chosen, count=count, body=body):
            return selected(
                reader.sequential(0, body=body),
                tags=chosen.tags,
                begin=chosen.begin,
                end=chosen.end,
                count=count,
            )

        def picked(reader: MessageReader, chosen=chosen, count=count, body=body):
            return reader.sequential(0, count, body=body, selection=chosen)

        for read in (everything, picked):
            read.body_mode = "auto"  # type: ignore[attr-defined]
            read.table = None  # type: ignore[attr-defined]
        slow = _outcome(store_dir, config, everything)
        assert _outcome(store_dir, config, picked) == slow, (store_dir, chosen, count, body)


@compiled_pass_only  # every scenario's files are kernel_corpus seeds
@pytest.mark.parametrize("scenario", SMALL_SCENARIOS)
def test_lines_of_every_fixture_are_the_messages_read_one_by_one(
    tmp_path: Path, scenario: str
) -> None:
    generate(scenario, tmp_path / "store")
    assert _check_store(tmp_path / "store", StoreConfig(), 1) > 0
    _check_sequential(tmp_path / "store", StoreConfig(), 1)


@compiled_pass_only  # every real-broker commit-log file is a kernel_corpus seed
@pytest.mark.parametrize("name", sorted(ORACLE_STORES))
def test_lines_of_every_real_broker_store_are_the_messages_read_one_by_one(
    oracle, name: str
) -> None:
    found = oracle(name)
    stores = [found.store]
    if name == "s2_crash":
        stores += [found.root / "store_torn_half_record", found.root / "store_torn_random_garbage"]
    for store_dir in stores:
        assert _check_store(store_dir, StoreConfig(**ORACLE_CONFIG), 2) > 0
        _check_sequential(store_dir, StoreConfig(**ORACLE_CONFIG), 2)


@pytest.mark.parametrize("seed", range(12))
def test_lines_of_mutated_queues_are_the_messages_read_one_by_one(
    tmp_path: Path, seed: int
) -> None:
    base = tmp_path / "base"
    generate("multi" if seed % 2 else "torn-tail", base)
    store_dir = tmp_path / "store"
    shutil.copytree(base, store_dir)
    rng = random.Random(seed)
    mutate_units(store_dir, rng, rng.randrange(1, 12))
    _check_store(store_dir, StoreConfig(), seed)


def test_a_unit_pointing_at_a_record_of_another_queue_of_the_same_size(tmp_path: Path) -> None:
    """Records of the same size in other queues and topics: only the queue id or the topic
    tells them apart, and a unit pointing at one gets the same note both ways."""
    lines = tmp_path / "in.jsonl"
    lines.write_text(
        "".join(
            f'{{"topic": "{topic}", "queueId": {queue}, "body": "same"}}\n'
            for topic, queue in (("TA", 0), ("TA", 1), ("TB", 0), ("TA", 0), ("TA", 1))
        )
    )
    store_dir = tmp_path / "store"
    result = run_cli("append", store_dir, "--create", "--input", lines, "--dispatch", "--jsonl")
    assert result.exit_code == 0, result.stderr
    puts = [json.loads(line) for line in result.stdout.splitlines()]
    assert len({put["storeSize"] for put in puts}) == 1

    def point(topic: str, queue: int, unit: int, offset: int) -> None:
        (path,) = (store_dir / "consumequeue" / topic / str(queue)).iterdir()
        data = bytearray(path.read_bytes())
        data[unit * 20 : unit * 20 + 8] = offset.to_bytes(8, "big")
        path.write_bytes(data)

    point("TA", 1, 0, puts[0]["commitLogOffset"])  # TA:0's record: another queue
    point("TA", 0, 1, puts[2]["commitLogOffset"])  # TB:0's record: another topic
    for read in (
        _Read("queue", "TA", 0, None, None, "auto"),
        _Read("queue", "TA", 1, None, None, "base64"),
        _Read("topic", "TA", 0, None, None, "none"),
    ):
        slow = _outcome(store_dir, StoreConfig(), read.slow())
        assert any("not a" in note for note in slow[1])
        assert _outcome(store_dir, StoreConfig(), read.fast()) == slow


def test_one_odd_unit_is_read_alone_and_the_kernel_goes_on_after_it(tmp_path: Path) -> None:
    """A unit pointing inside a record is read message by message (its note, its error), and
    only it: the units before and after it in the same run still come as the kernel's
    lines."""
    store_dir = tmp_path / "store"
    generate("multi", store_dir)
    (path,) = sorted((store_dir / "consumequeue" / "TopicTest" / "0").iterdir())[:1]
    data = bytearray(path.read_bytes())
    data[100:108] = data[0:8]  # unit 5 points at unit 0's record
    path.write_bytes(data)
    with Store.open_read(store_dir) as store:
        reader = MessageReader(store)
        items = list(reader.queue_lines("TopicTest", 0, body_mode="none"))
    kinds = [type(item).__name__ for item in items]
    assert kinds.count("Message") == 1, kinds
    odd = kinds.index("Message")
    assert kinds[odd - 1] == kinds[odd + 1] == "TextBlock"
    assert sum(item.messages for item in items[:odd]) == 5
    assert sum(item.text.count(b"\n") for item in items[:odd]) == 5
    assert any("unit 5 of TopicTest:0 points at offset" in note for note in reader.notes)
