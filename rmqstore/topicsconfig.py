"""``config/topics.json`` (spec §8.4): the topics a broker lets clients use. Written in
fastjson's pretty style (tab indentation, sorted fields). A broker serves a topic's consume
queues only to a topic it lists (a pull of another is refused, "topic not exist"), and a
consumer balances over its readQueueNums queues only."""

from __future__ import annotations

import json
from collections.abc import Collection
from itertools import islice
from pathlib import Path
from typing import Any

from rmqstore.errors import StoreFormatError, StoreIOError
from rmqstore.jsontext import parse_json
from rmqstore.segments import fsync_directory, read_small_file, write_whole_file
from rmqstore.topics import SCHEDULE_TOPIC

DEFAULT_PERM = 6  # READ | WRITE


TOPICS_FILE = "topics.json"
QUEUE_TYPE_ATTRIBUTE = "queue.type"  # a 5.x topic attribute (spec §8.4)
BATCH_QUEUE_TYPE = "BatchCQ"
BATCH_CONSUMEQUEUE_DIR = "batchconsumequeue"  # 5.x BatchCQ topics' queues (spec §6.7)
MAX_TOPICS_BYTES = 256 << 20  # a broker of many thousands of topics writes a few MB


def topic_config(topic: str, queue_count: int) -> dict[str, Any]:
    """A topic's entry as ``mqadmin updateTopic`` makes it with default options."""
    return {
        "order": False,
        "perm": DEFAULT_PERM,
        "readQueueNums": queue_count,
        "topicFilterType": "SINGLE_TAG",
        "topicName": topic,
        "topicSysFlag": 0,
        "writeQueueNums": queue_count,
    }


def topics_document(queues: dict[str, int], timestamp: int) -> dict:
    """``queues``: topic -> number of queues (highest queue id + 1)."""
    table = {topic: topic_config(topic, count) for topic, count in sorted(queues.items())}
    return {
        "dataVersion": {"counter": len(table), "timestamp": timestamp},
        "topicConfigTable": table,
    }


def _text(document: dict) -> str:
    return json.dumps(
        document, indent="\t", separators=(",", ":"), sort_keys=True, ensure_ascii=False
    )


def write_topics_json(config_dir: Path, queues: dict[str, int], timestamp: int) -> Path:
    path = config_dir / TOPICS_FILE
    try:
        made = not config_dir.is_dir()
        config_dir.mkdir(parents=True, exist_ok=True)
        write_whole_file(path, _text(topics_document(queues, timestamp)).encode())
        if made:  # the folder's own entry, as the file's is
            fsync_directory(config_dir.parent)
    except OSError as exc:
        raise StoreIOError(f"cannot write {path}: {exc.strerror}") from None
    return path


def add_topics(
    config_dir: Path, queues: dict[str, int], timestamp: int, *, create: bool
) -> list[str]:
    """Make ``topics.json`` list every topic of ``queues`` with at least that many read and
    write queues, keeping every other field as it is; ``dataVersion`` counts the change.
    A missing file is written only with ``create``. The old content goes to
    ``topics.json.bak`` first, where a broker looks when ``topics.json`` does not load.
    Returns what the user should hear: the topics added or widened, or why none were."""
    # the broker makes SCHEDULE_TOPIC_XXXX itself, with a queue per delay level: an entry
    # for the few levels appended to would replace that one when the broker loads the file
    queues = {topic: count for topic, count in queues.items() if topic != SCHEDULE_TOPIC}
    path = config_dir / TOPICS_FILE
    if path.is_symlink() and queues:  # its target may be outside the store, or shared
        return [
            f"{path} is a symbolic link, which rmqstore does not write through, so it was "
            f"left as it is; a broker serves {_names(queues)} only once it lists them "
            "(mqadmin updateTopic)"
        ]
    if not path.exists():
        if not create or not queues:
            return []
        try:
            write_topics_json(config_dir, queues, timestamp)
        except StoreIOError as exc:  # the messages are stored: a note, not a failure
            return [f"{exc}; a broker serves {_names(queues)} only once it lists them"]
        return [f"wrote {path} listing {_names(queues)}"]
    try:
        old = read_small_file(path, MAX_TOPICS_BYTES)  # a FIFO is not waited on
        document = parse_json(old) if old.strip() else {"topicConfigTable": {}}
        if not isinstance(document, dict):
            raise ValueError("not a JSON object")
        table = document.setdefault("topicConfigTable", {})
        if not isinstance(table, dict):
            raise ValueError("topicConfigTable is not an object")
    except (OSError, ValueError, StoreFormatError) as exc:  # JSONDecodeError included
        reason = (
            exc.strerror
            if isinstance(exc, OSError)
            else "it is not a regular file of JSON"
            if isinstance(exc, StoreFormatError)
            else "it is not a JSON topic table"
        )
        return [
            f"{path} was left as it is ({reason}); a broker serves {_names(queues)} only once "
            "it lists them (mqadmin updateTopic)"
        ]
    changed: dict[str, int] = {}
    for topic, count in sorted(queues.items()):
        entry = table.get(topic)
        if not isinstance(entry, dict):
            table[topic] = topic_config(topic, count)
            changed[topic] = count
            continue
        for field in ("readQueueNums", "writeQueueNums"):
            current = entry.get(field)
            if not isinstance(current, int) or current < count:
                entry[field] = count
                changed[topic] = count
    if not changed:
        return []
    version = document.get("dataVersion")
    if not isinstance(version, dict):
        version = document["dataVersion"] = {"counter": 0}
    counter = version.get("counter")
    version["counter"] = (counter if isinstance(counter, int) else 0) + 1
    version["timestamp"] = timestamp
    try:
        _replace(path, old, _text(document).encode("utf-8"))
    except StoreIOError as exc:  # the messages are stored: a note, not a failure
        return [f"{exc}; a broker serves {_names(changed)} only once it lists them"]
    return [f"added {_names(changed)} to {path}, where a broker looks up the topics it serves"]


def listed_queue_counts(
    found: tuple[dict[str, Any], Path] | None,
) -> tuple[dict[str, int], Path] | None:
    """The readQueueNums of each topic of a topic table (:func:`read_topic_table`), and the
    file it came from; None when there is no table (a store written by the store code alone
    has neither file)."""
    if found is None:
        return None
    table, source = found
    counts = {}
    for topic, entry in table.items():
        count = entry.get("readQueueNums") if isinstance(entry, dict) else None
        counts[topic] = count if isinstance(count, int) and not isinstance(count, bool) else 0
    return counts, source


def batch_queue_topics(found: tuple[dict[str, Any], Path] | None) -> frozenset[str]:
    """The topics a topic table (:func:`read_topic_table`) gives the 5.x attribute
    ``queue.type`` = ``BatchCQ``: a broker keeps their queues in ``batchconsumequeue/``
    (spec §6.7), not in ``consumequeue/``."""
    if found is None:
        return frozenset()
    return frozenset(
        topic
        for topic, entry in found[0].items()
        if isinstance(entry, dict)
        and isinstance(entry.get("attributes"), dict)
        and entry["attributes"].get(QUEUE_TYPE_ATTRIBUTE) == BATCH_QUEUE_TYPE
    )


def batch_queues_note(topics: Collection[str]) -> str:
    """What a store's BatchCQ ``topics`` are, in a few words (the first ten named)."""
    named = sorted(topics)
    listed = ", ".join(named[:10]) + (f" and {len(named) - 10} more" if len(named) > 10 else "")
    return (
        f"topic{'s' if len(named) != 1 else ''} {listed} keep{'s' if len(named) == 1 else ''} "
        f"{'its' if len(named) == 1 else 'their'} queues in {BATCH_CONSUMEQUEUE_DIR}/ "
        "(queue.type BatchCQ, a RocketMQ 5 broker's batch consume queues)"
    )


def read_topic_table(config_dir: Path) -> tuple[dict[str, Any], Path] | None:
    """``topicConfigTable`` of ``topics.json``, or of its ``.bak`` when the file is missing,
    empty or does not parse (as a broker loads it), and the file it came from."""
    path = config_dir / TOPICS_FILE
    for candidate in (path, path.with_name(path.name + ".bak")):
        try:
            data = read_small_file(candidate, MAX_TOPICS_BYTES, follow_links=True)
            table = parse_json(data)["topicConfigTable"]
        except (OSError, ValueError, TypeError, KeyError, StoreFormatError):
            continue
        if isinstance(table, dict):
            return table, candidate
    return None


def _replace(path: Path, old: bytes, new: bytes) -> None:
    """The broker's persist: the old content to ``.bak``, then the new content in place,
    each written whole (a crash leaves the old file or the new one; a link there is
    replaced, never written through)."""
    try:
        write_whole_file(path.with_name(path.name + ".bak"), old)
        write_whole_file(path, new)
    except OSError as exc:
        raise StoreIOError(f"cannot write {path}: {exc.strerror}") from None


_NAMES_SHOWN = 10  # topics a message names; an append of thousands says how many more


def _names(queues: dict[str, int]) -> str:
    listed = ", ".join(
        f"{topic} ({count} queue{'s' if count != 1 else ''})"
        for topic, count in islice(queues.items(), _NAMES_SHOWN)
    )
    more = len(queues) - _NAMES_SHOWN
    if more > 0:
        listed += f" and {more:,} more topic{'s' if more != 1 else ''}"
    return f"topic{'s' if len(queues) != 1 else ''} {listed}"
