"""``verify``'s checks of the broker's config files against the consume queues (spec §8.4):
``topics.json`` (a broker serves a topic's queues only when the file lists the topic, and its
consumers balance over its readQueueNums queues only), and the offsets in
``consumerOffset.json`` and ``delayOffset.json`` (an offset past its queue's end, what a
recovery that cut the queue leaves, makes the broker skip messages stored there again)."""

from __future__ import annotations

from rmqstore.consumerprogress import PAST_END, offsets_report
from rmqstore.geometry import CONFIG_DIR
from rmqstore.multidispatch import LMQ_PREFIX
from rmqstore.store import Store
from rmqstore.topics import SCHEDULE_TOPIC
from rmqstore.topicsconfig import listed_queue_counts
from rmqstore.verify.findings import NOTE, WARNING, VerifyReport
from rmqstore.verify.queues import QueueChecks
from rmqstore.wording import counted


def check_config_files(store: Store, report: VerifyReport, queues: QueueChecks | None) -> None:
    """The config files against the consume queues; nothing when the queues were not
    checked."""
    check_topics_config(store, report, queues)
    check_offsets(store, report, queues)


def check_offsets(store: Store, report: VerifyReport, queues: QueueChecks | None) -> None:
    """A warning for each consumer group's offset and each delay level's scheduler offset
    past the end of its queue, and for an offsets file that does not load."""
    if queues is None:
        return
    topics = queues.topics or ()
    found = offsets_report(store, topics=topics, delay_levels=queues.delay_levels)
    scheduler_checked = not topics or SCHEDULE_TOPIC in topics
    loaded_files = [found.consumers_loaded] + (
        [found.scheduler_loaded] if scheduler_checked else []
    )
    for loaded in loaded_files:
        if loaded.unreadable:
            name = loaded.path.relative_to(store.root).as_posix()
            report.add(
                "config-unreadable",
                f"{name} does not load ({'; '.join(loaded.failures)}): a broker finds no "
                "offsets in it",
                WARNING,
                file=name,
            )
    consumers = found.consumers
    for group in consumers["groups"]:
        for row in group["queues"]:
            if row["state"] != PAST_END:
                continue
            report.add(
                "offset-past-end",
                f"group {group['group']}'s offset {row['consumerOffset']} in "
                f"{row['topic']}:{row['queueId']} is past the queue's end "
                f"{row['maxOffset']}: messages stored there again below it may never reach "
                "the group (reset its offset, mqadmin resetOffsetByTime, before producers "
                "write)",
                WARNING,
                file=consumers["file"],
                topic=row["topic"],
                queue_id=row["queueId"],
                queue_offset=row["consumerOffset"],
            )
    if not scheduler_checked:
        return
    scheduler = found.scheduler
    for row in scheduler["levels"]:
        if row["state"] == PAST_END:
            report.add(
                "offset-past-end",
                f"the delay scheduler's offset {row['offset']} for level {row['level']} is "
                f"past the end {row['maxOffset']} of its {SCHEDULE_TOPIC} queue: messages "
                "delayed there again below it may never be delivered",
                WARNING,
                file=scheduler["file"],
                topic=SCHEDULE_TOPIC,
                queue_id=row["level"] - 1,
                queue_offset=row["offset"],
            )


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
        if (
            topic == SCHEDULE_TOPIC
            or topic.startswith(LMQ_PREFIX)
            or state.max_offset <= state.min_offset
        ):
            # a broker makes SCHEDULE_TOPIC_XXXX itself and serves LMQ queues without a topic
            # of their own; an empty queue loses nothing
            continue
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
