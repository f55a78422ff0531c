"""``rmqstore offsets``: consumer groups' and the delay scheduler's offsets against their
queues (mqadmin consumerProgress, offline)."""

from __future__ import annotations

from pathlib import Path

import click

from rmqstore.commands.options import (
    json_option,
    refuse_empty_text,
    store_argument,
    store_config_options,
    topics_option,
)
from rmqstore.commands.output import (
    DelimitedWriter,
    Grid,
    console,
    counted,
    delimited_options,
    emit_json,
    format_millis,
    warn,
)
from rmqstore.config import StoreConfig
from rmqstore.consumerprogress import PAST_END, OffsetsReport, offsets_report
from rmqstore.delay import DelayLevels
from rmqstore.store import Store
from rmqstore.topics import SCHEDULE_TOPIC
from rmqstore.wording import quoted

_ROW_FIELDS = [
    "group", "topic", "queueId", "consumerOffset", "minOffset", "maxOffset", "lag",
    "lastConsumed", "state",
]  # fmt: skip


@click.command("offsets")
@store_argument
@click.option(
    "--group",
    "groups",
    multiple=True,
    metavar="G",
    callback=refuse_empty_text("a consumer group"),
    help="Only this consumer group (repeatable); the delay scheduler is then left out.",
)
@topics_option(
    "Only the offsets in these topics' queues (repeatable); the delay scheduler is shown "
    f"only when {SCHEDULE_TOPIC} is one of them."
)
@store_config_options
@json_option
@delimited_options(_ROW_FIELDS, _ROW_FIELDS, jsonl="per group, topic and queue per line")
def command(
    store: Path,
    groups: tuple[str, ...],
    topics: tuple[str, ...],
    config: StoreConfig,
    as_json: bool,
    delimited: tuple[str, list[str]] | None,
) -> int:
    """Where each consumer group and the delay scheduler stand in their queues.

    Reads config/consumerOffset.json (each group's next offset in each queue it consumes)
    and config/delayOffset.json (the scheduler's next offset in each SCHEDULE_TOPIC_XXXX
    queue, one per delay level) as a broker loads them (fastjson's bare number keys; the
    .bak when a file is missing, empty or does not parse), and sets each offset against its
    consume queue's min and max offsets: the lag (messages still to consume), the store time
    of the last message consumed, and the state: ok; past-end (the offset is beyond the
    queue's end: what a recovery that cut the queue leaves; a broker answers the group as
    out of range, and messages stored again below the offset may never reach it: reset the
    group's offset, mqadmin resetOffsetByTime, before producers write; a delay level's
    offset a 4.9.8 or 5.x broker sets back to the end as it loads delayOffset.json, where
    4.9.0 and older deliver nothing delayed there again below it); before-start (the
    queue's first messages were removed, expired, before the group consumed them); no-queue
    (the store has no consume queue for it); unreadable (its consume queue does not load, a
    file of the wrong size: a warning says why). Reads only; the commit log is read only for
    the store time of each group's last consumed message. Exit 0, with a warning when an
    offset is past its queue's end (rmqstore verify fails on it).

    JSON fields: consumerOffsets{file (the file read, null when there is none), groups[{group,
    lag, queues[{topic, queueId, consumerOffset, minOffset, maxOffset, lag, lastConsumed,
    state}]}]}, delayOffsets{file, levels[{level, delayMillis, offset, recorded (false: no
    offset is recorded, the scheduler starts at 0), minOffset, maxOffset, pending, nextDue
    (the deliver time of the next message, its unit's tagsCode), state}]} (null with --group,
    or --topic without SCHEDULE_TOPIC_XXXX). --csv, --tsv and --jsonl print a row per
    group, topic and queue.
    """
    if as_json and delimited:
        raise click.UsageError("--json and --csv/--tsv/--jsonl exclude each other")
    with Store.open_read(store, config) as opened:
        for message in opened.notes:
            warn(message)
        report = offsets_report(
            opened, groups, topics, DelayLevels(opened.config.message_delay_level)
        )
    for message in report.notes:
        warn(message)
    _warn_unmatched(report, groups, topics)
    scheduler = not groups and (not topics or SCHEDULE_TOPIC in topics)
    _warn_past_end(report, scheduler)
    if delimited:
        table = DelimitedWriter(*delimited)
        table.rows(
            {"group": group["group"], **row}
            for group in report.consumers["groups"]
            for row in group["queues"]
        )
    elif as_json:
        document = report.to_dict()
        if not scheduler:
            document["delayOffsets"] = None
        emit_json(document)
    else:
        _render_consumers(report)
        if scheduler:
            _render_scheduler(report)
    return 0


def _warn_past_end(report: OffsetsReport, scheduler: bool) -> None:
    consumers = sum(
        row["state"] == PAST_END for group in report.consumers["groups"] for row in group["queues"]
    )
    if consumers:
        warn(
            f"{counted(consumers, 'consumer offset')} past the end of "
            f"{'its' if consumers == 1 else 'their'} queue (state past-end): messages stored "
            "there again below the offset may never reach the group"
        )
    levels = sum(row["state"] == PAST_END for row in report.scheduler["levels"])
    if scheduler and levels:
        warn(
            f"the delay scheduler's offset of {counted(levels, 'level')} is past the end of "
            f"{'its' if levels == 1 else 'their'} {SCHEDULE_TOPIC} queue (state past-end): "
            "a 4.9.8 or 5.x broker sets it back to the end as it loads the file; an older one "
            "delivers nothing delayed there again below the offset"
        )


def _warn_unmatched(
    report: OffsetsReport, groups: tuple[str, ...], topics: tuple[str, ...]
) -> None:
    if report.consumers["file"] is None:
        return
    found = report.consumers["groups"]
    names = {group["group"] for group in found}
    for group in groups:
        if group not in names:
            warn(f"no offsets of group {quoted(group)} in {report.consumers['file']}")
    seen = {row["topic"] for group in found for row in group["queues"]}
    for topic in topics:
        if topic not in seen and topic != SCHEDULE_TOPIC:
            warn(f"no offsets in topic {quoted(topic)} in {report.consumers['file']}")


def _render_consumers(report: OffsetsReport) -> None:
    consumers = report.consumers
    if consumers["file"] is None:
        console.print(
            "consumer offsets: none (config/consumerOffset.json does not load)"
            if report.consumers_loaded.failures
            else "consumer offsets: none (no config/consumerOffset.json: a broker writes it as "
            "groups consume)"
        )
        return
    console.print(f"consumer offsets ({consumers['file']})")
    if not consumers["groups"]:
        return
    table = Grid()
    for name, justify in (
        ("group", "left"),
        ("topic", "left"),
        ("queue", "right"),
        ("offset", "right"),
        ("min", "right"),
        ("max", "right"),
        ("lag", "right"),
        ("last consumed", "left"),
        ("state", "left"),
    ):
        table.add_column(name, justify=justify, wrap=name in ("group", "topic"))
    for group in consumers["groups"]:
        for row in group["queues"]:
            table.add_row(
                group["group"],
                row["topic"],
                str(row["queueId"]),
                str(row["consumerOffset"]),
                _number(row["minOffset"]),
                _number(row["maxOffset"]),
                str(row["lag"]),
                format_millis(row["lastConsumed"]),
                row["state"],
            )
    console.print(table)
    for group in consumers["groups"]:
        out = sum(row["state"] == PAST_END for row in group["queues"])
        console.print(
            f"{group['group']}: lag {group['lag']:,} over "
            f"{counted(len(group['queues']), 'queue')}" + (f", {out} past the end" if out else "")
        )


def _render_scheduler(report: OffsetsReport) -> None:
    scheduler = report.scheduler
    if scheduler["file"] is None and not scheduler["levels"]:
        return  # no delayed messages, and nothing recorded
    console.print(f"delay scheduler ({scheduler['file'] or 'no offsets recorded'})")
    table = Grid()
    for name, justify in (
        ("level", "right"),
        ("delay", "right"),
        ("offset", "right"),
        ("min", "right"),
        ("max", "right"),
        ("pending", "right"),
        ("next due", "left"),
        ("state", "left"),
    ):
        table.add_column(name, justify=justify)
    for row in scheduler["levels"]:
        table.add_row(
            str(row["level"]),
            _delay(row["delayMillis"]),
            str(row["offset"]) + ("" if row["recorded"] else " (none recorded)"),
            _number(row["minOffset"]),
            _number(row["maxOffset"]),
            str(row["pending"]),
            format_millis(row["nextDue"]),
            row["state"],
        )
    console.print(table)


def _number(value: int | None) -> str:
    return "-" if value is None else str(value)


def _delay(millis: int | None) -> str:
    """A delay as messageDelayLevel writes it (``10s``, ``2m``, ``1h``)."""
    if millis is None:
        return "-"
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if millis % size == 0:
            return f"{millis // size}{unit}"
    return f"{millis}ms"
