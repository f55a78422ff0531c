"""``verify``'s checks of the broker's config files against the consume queues (spec §8.4):
``topics.json`` (a broker serves a topic's queues only when the file lists the topic, and its
consumers balance over its readQueueNums queues only), and the offsets in
``consumerOffset.json`` and ``delayOffset.json`` (an offset past its queue's end, what a
recovery that cut the queue leaves, makes the broker skip messages stored there again)."""

from __future__ import annotations

from rmqstore.consumequeue import list_queues
from rmqstore.consumerprogress import past_end
from rmqstore.geometry import CONFIG_DIR
from rmqstore.multidispatch import LMQ_PREFIX
from rmqstore.offsetsconfig import load_config, read_consumer_offsets, read_delay_offsets
from rmqstore.store import CONSUMEQUEUE_DIR, Store
from rmqstore.topics import SCHEDULE_TOPIC
from rmqstore.topicsconfig import (
    BATCH_CONSUMEQUEUE_DIR,
    TOPICS_FILE,
    batch_queue_topics,
    listed_queue_counts,
)
from rmqstore.verify.findings import NOTE, WARNING, VerifyReport
from rmqstore.verify.queues import QueueChecks
from rmqstore.wording import counted


def check_config_files(store: Store, report: VerifyReport, queues: QueueChecks | None) -> None:
    """The config files against the consume queues (the topic table and the queue folders
    always; the rest not when the queues were not checked)."""
    check_queue_types(store, report)
    check_topics_config(store, report, queues)
    check_offsets(store, report, queues)


def check_queue_types(store: Store, report: VerifyReport) -> None:
    """An error for each topic whose queue folders are not where its queue type keeps them:
    a 5.x broker loads ``consumequeue/`` expecting ordinary topics and ``batchconsumequeue/``
    expecting BatchCQ ones (``queue.type`` in ``config/topics.json``; a topic it does not
    list is ordinary), and refuses to start on a queue folder of the other type."""
    found = store.topic_table
    batch = batch_queue_topics(found)
    config = found[1].relative_to(store.root).as_posix() if found else "config/topics.json"
    if batch and not store.queues_in_rocksdb:  # (a store of many queues is listed only then)
        for topic in sorted({topic for topic, _ in list_queues(store.consumequeue_dir)} & batch):
            report.add(
                "queue-type",
                f"{CONSUMEQUEUE_DIR}/{topic}/ holds queues of {topic}, which {config} makes a "
                f"BatchCQ topic (queue.type): a 5.x broker does not start (the queue type of "
                f"topic {topic} should be BatchCQ); move the folder aside",
                file=f"{CONSUMEQUEUE_DIR}/{topic}",
                topic=topic,
            )
    for topic in sorted({topic for topic, _ in list_queues(store.root / BATCH_CONSUMEQUEUE_DIR)}):
        if topic not in batch:
            report.add(
                "queue-type",
                f"{BATCH_CONSUMEQUEUE_DIR}/{topic}/ holds batch queues of {topic}, which "
                f"{config} does not make a BatchCQ topic: a 5.x broker does not start (the "
                f"queue type of topic {topic} should be SimpleCQ); list it with queue.type "
                "BatchCQ, or move the folder aside",
                file=f"{BATCH_CONSUMEQUEUE_DIR}/{topic}",
                topic=topic,
            )


def check_offsets(store: Store, report: VerifyReport, queues: QueueChecks | None) -> None:
    """A warning for each consumer group's offset and each delay level's scheduler offset
    past the end of its queue (of the queues checked), and for an offsets file that does
    not load."""
    if queues is None:
        return
    config_dir = store.root / CONFIG_DIR
    consumers = read_consumer_offsets(config_dir)
    scheduler = None
    if not queues.topics or SCHEDULE_TOPIC in queues.topics:
        scheduler = read_delay_offsets(config_dir)
    for loaded in [consumers.loaded] + ([scheduler.loaded] if scheduler is not None else []):
        text = loaded.failure_text(store.root)
        if loaded.unreadable and text:
            name = loaded.path.relative_to(store.root).as_posix()
            report.add("config-unreadable", text, WARNING, file=name)
    states = queues.states

    def end_of(topic: str, queue_id: int) -> int | None:
        state = states.get((topic, queue_id))
        return None if state is None else state.max_offset

    for offset in past_end(consumers, scheduler, end_of):
        source = consumers if offset.group is not None else scheduler
        assert source is not None
        report.add(
            "offset-past-end",
            offset.describe(),
            WARNING,
            file=source.loaded.source_name(store.root),
            topic=offset.topic,
            queue_id=offset.queue_id,
            queue_offset=offset.offset,
        )


def check_topics_config(store: Store, report: VerifyReport, queues: QueueChecks | None) -> None:
    """A note for each topic with units in its consume queues that ``topics.json`` does not
    list, and for each queue of a listed topic at or past its readQueueNums. Nothing when the
    store has no such file, or when the queues were not checked."""
    if queues is None:
        return
    if store.topic_table is None:  # no file, or none that loads: which, and why
        loaded = load_config(store.root / CONFIG_DIR, TOPICS_FILE)
        if loaded.unreadable:
            name = loaded.path.relative_to(store.root).as_posix()
            report.add(
                "config-unreadable",
                f"{name} does not load ({'; '.join(loaded.failures)}): a broker loads no "
                "topic table from it (its topics' queue counts, permissions and 5.x queue "
                "types)",
                WARNING,
                file=name,
            )
    found = listed_queue_counts(store.topic_table)
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
