"""Topic names (spec §2.9): RocketMQ's own rules for new messages, and the path-safety rule for
any topic read from a file before it becomes a consume-queue directory name."""

from __future__ import annotations

import re

from rmqstore.errors import TopicError
from rmqstore.wording import quoted

MAX_TOPIC_LENGTH = 127  # chars (4.x store check); 5.x: UTF-8 bytes
MAX_RETRY_TOPIC_BYTES = 255  # 5.x: %RETRY% topics up to 255 bytes, stored as V2 records
RETRY_PREFIX = "%RETRY%"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
SYSTEM_TOPIC_PREFIX = "rmq_sys_"  # TopicValidator.SYSTEM_TOPIC_PREFIX (rmq_sys_wheel_timer, ...)
HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
_VALID_TOPIC = re.compile(r"[%|a-zA-Z0-9_-]+")
_UNSAFE_CHARS = re.compile(r"[/\\\x00-\x1f\x7f]")


def check_topic(topic: str, *, allow_v2: bool = True) -> None:
    """Refuse a topic that RocketMQ's clients and brokers refuse (``TopicValidator``).

    Letters, digits, ``%``, ``|``, ``-`` and ``_``; at most 127 characters, except ``%RETRY%``
    topics, which 5.x stores as V2 records up to 255 bytes (``allow_v2``).
    """
    if not topic:
        raise TopicError("topic is empty")
    if not _VALID_TOPIC.fullmatch(topic):
        bad = sorted({ch for ch in topic if not _VALID_TOPIC.fullmatch(ch)})
        raise TopicError(
            f"topic {quoted(topic)} has characters RocketMQ does not allow "
            f"({quoted(''.join(bad))}); allowed are letters, digits, '%', '|', '-' and '_'"
        )
    limit = MAX_TOPIC_LENGTH
    if allow_v2 and topic.startswith(RETRY_PREFIX):
        limit = MAX_RETRY_TOPIC_BYTES
    if len(topic) > limit:
        raise TopicError(f"topic is {len(topic)} characters long; the limit is {limit}")


def check_topic_path_safe(topic: str) -> None:
    """Refuse a topic (usually read from a record) that is not a safe single path component."""
    if not topic or topic in (".", ".."):
        raise TopicError(f"topic {quoted(topic)} cannot name a consume-queue directory")
    if _UNSAFE_CHARS.search(topic):
        raise TopicError(f"topic {quoted(topic)} contains a path separator or control character")
    if len(topic.encode("utf-8", "surrogatepass")) > MAX_RETRY_TOPIC_BYTES:
        raise TopicError("topic is longer than 255 bytes, the limit of a directory name")


def is_path_safe(topic: str) -> bool:
    try:
        check_topic_path_safe(topic)
    except TopicError:
        return False
    return True
