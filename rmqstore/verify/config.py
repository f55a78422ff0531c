"""``verify``'s check of ``config/topics.json`` against the consume queues (spec §8.4): a
broker serves a topic's queues only when the file lists the topic, and its consumers balance
over its readQueueNums queues only."""

from __future__ import annotations

from rmqstore.geometry import CONFIG_DIR
from rmqstore.store import Store
from rmqstore.topics import SCHEDULE_TOPIC
from rmqstore.topicsconfig import listed_queue_counts
from rmqstore.verify.findings import NOTE, VerifyReport
from rmqstore.verify.queues import QueueChecks
from rmqstore.wording import counted


def check_topics_config(store: Store, report: VerifyReport, queues: QueueChecks | None) -> None:
    """A note for each topic with units in its consume queues that ``topics.json`` does not
    list, and for each queue of a listed topic at or past its readQueueNums. Nothing when the
    store has no such file, or when the queues were not checked."""
    if queues is None:
        return
    found = listed_queue_counts(store.root / CONFIG_DIR)
    if found is None:
        return
    counts, source = found
    name = source.relative_to(store.root).as_posix()
    unlisted: dict[str, list[int]] = {}
    for (topic, queue_id), state in sorted(queues.states.items()):
        if topic == SCHEDULE_TOPIC or state.max_offset <= state.min_offset:
            continue  # a broker makes SCHEDULE_TOPIC_XXXX itself; an empty queue loses nothing
        listed = counts.get(topic)
        if listed is None:
            unlisted.setdefault(topic, []).append(queue_id)
        elif queue_id >= listed:
            report.add(
                "topic-unlisted",
                f"{topic}:{queue_id} holds {counted(state.max_offset - state.min_offset, 'unit')}"
                f", but {name} gives {topic} {counted(listed, 'read queue')}: consumers do not "
                "balance over this one (mqadmin updateTopic -r raises the count)",
                NOTE,
                file=name,
                topic=topic,
                queue_id=queue_id,
            )
    for topic, queue_ids in unlisted.items():
        report.add(
            "topic-unlisted",
            f"{topic} has units in {counted(len(queue_ids), 'queue')}, but {name} does not "
            "list it: a broker does not serve it until it is created (mqadmin updateTopic)",
            NOTE,
            file=name,
            topic=topic,
        )
