"""``config/topics.json`` (spec §8.4): the topics a broker lets clients use. Written in
fastjson's pretty style (tab indentation, sorted fields)."""

from __future__ import annotations

import json
from pathlib import Path

from rmqstore.errors import StoreIOError

DEFAULT_PERM = 6  # READ | WRITE


def topics_document(queues: dict[str, int], timestamp: int) -> dict:
    """``queues``: topic -> number of queues (highest queue id + 1)."""
    table = {
        topic: {
            "order": False,
            "perm": DEFAULT_PERM,
            "readQueueNums": count,
            "topicFilterType": "SINGLE_TAG",
            "topicName": topic,
            "topicSysFlag": 0,
            "writeQueueNums": count,
        }
        for topic, count in sorted(queues.items())
    }
    return {
        "dataVersion": {"counter": len(table), "timestamp": timestamp},
        "topicConfigTable": table,
    }


def write_topics_json(config_dir: Path, queues: dict[str, int], timestamp: int) -> Path:
    path = config_dir / "topics.json"
    text = json.dumps(
        topics_document(queues, timestamp),
        indent="\t",
        separators=(",", ":"),
        sort_keys=True,
        ensure_ascii=False,
    )
    try:
        config_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise StoreIOError(f"cannot write {path}: {exc.strerror}") from None
    return path
