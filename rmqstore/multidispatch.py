"""Multi-dispatch and LMQ queues (spec §6.8): a broker with ``enableMultiDispatch`` (and
``enableLmq``) writes a unit for a record into further queues besides its own. The producer
names them in the record's ``INNER_MULTI_DISPATCH`` property (comma separated); at append the
broker wrote the queue offset it chose in each of them into ``INNER_MULTI_QUEUE_OFFSET`` (in
the same order). LMQ queues are named ``%LMQ%...`` and are always queue 0; another name takes
the record's own queue id. Each copy is the record's unit (offset, size, tagsCode) at that
queue offset.

The broker adds ``INNER_MULTI_QUEUE_OFFSET`` only when it dispatches the copies, so a record
carrying both properties, with as many offsets as queues, is one whose copies a broker wrote:
rmqstore writes and checks them from the record alone, whatever the broker's settings."""

from __future__ import annotations

from typing import NamedTuple

from rmqstore.topics import RETRY_PREFIX, is_path_safe

INNER_MULTI_DISPATCH = "INNER_MULTI_DISPATCH"
INNER_MULTI_QUEUE_OFFSET = "INNER_MULTI_QUEUE_OFFSET"
LMQ_PREFIX = "%LMQ%"
_SPLITTER = ","
_JAVA_LONG_MAX = 2**63 - 1


class QueueCopy(NamedTuple):
    """One further queue a record's unit goes into, at ``queue_offset``."""

    topic: str
    queue_id: int
    queue_offset: int


def queue_copies(topic: str, queue_id: int, properties: dict[str, str]) -> list[QueueCopy]:
    """The further queues a record of ``topic``/``queue_id`` with ``properties`` has a unit
    in (none for a ``%RETRY%`` topic, as the broker skips them, or when the two properties do
    not pair up: the broker logs an error and writes no copy). A queue whose name is not a
    safe folder name (``..``, a slash) is left out: it names no queue rmqstore can open."""
    queues = properties.get(INNER_MULTI_DISPATCH)
    offsets = properties.get(INNER_MULTI_QUEUE_OFFSET)
    if not queues or not offsets or topic.startswith(RETRY_PREFIX):
        return []
    names = queues.split(_SPLITTER)
    numbers = offsets.split(_SPLITTER)
    if len(names) != len(numbers):
        return []
    copies = []
    for name, number in zip(names, numbers, strict=True):
        if not number.isascii() or not number.isdigit() or len(number) > 19:
            return []  # Long.parseLong fails: the broker writes none of them
        queue_offset = int(number)
        if queue_offset > _JAVA_LONG_MAX or not is_path_safe(name):
            continue
        copies.append(QueueCopy(name, 0 if name.startswith(LMQ_PREFIX) else queue_id, queue_offset))
    return copies


def record_units(
    topic: str, queue_id: int, queue_offset: int, properties: dict[str, str]
) -> list[QueueCopy]:
    """Every unit a queued record has: in its own queue, then in the further queues it
    names (:func:`queue_copies`)."""
    return [QueueCopy(topic, queue_id, queue_offset), *queue_copies(topic, queue_id, properties)]
