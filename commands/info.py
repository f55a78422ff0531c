"""``rmqstore info``: a one-screen summary of a store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from rmqstore.checkpoint import CHECKPOINT_FILE_SIZE
from rmqstore.commands.options import (
    json_option,
    progress_option,
    store_argument,
    store_config_options,
    topics_option,
)
from rmqstore.commands.output import (
    DelimitedWriter,
    Grid,
    Styled,
    console,
    counted,
    delimited_options,
    emit_json,
    fields_grid,
    format_millis,
    progress_bar,
    warn,
)
from rmqstore.config import StoreConfig
from rmqstore.store import Store
from rmqstore.summary import summarize, topic_status


@click.command("info")
@store_argument
@topics_option(
    "Only the status of these topics' queues (like mqadmin topicStatus): min and max "
    "offsets and the store time of each queue's last message, without reading the log."
)
@click.option(
    "--deep",
    is_flag=True,
    help="Count every record of the commit log (messages, and each queue's records that no "
    "consume queue holds: PREPARED and ROLLBACK); without it only the log's tail is read.",
)
@store_config_options
@json_option
@progress_option
@delimited_options(
    ["topic", "queueId", "messages", "minOffset", "maxOffset", "notQueued"],
    ["topic", "queueId", "messages", "minOffset", "maxOffset", "notQueued", "lastUpdated"],
    jsonl="per topic and queue per line",
)
def command(
    store: Path,
    topics: tuple[str, ...],
    deep: bool,
    config: StoreConfig,
    as_json: bool,
    no_progress: bool,
    delimited: tuple[str, list[str]] | None,
) -> int:
    """Summarise a store on one screen, reading only the end of its commit log.

    Commit-log files and offset range, topics and queues with their offsets, consume queues
    with the broker's min/max offsets, index, dispatch lag (records in the commit log not
    yet in consume queues, from the first one a queue takes after where they end: PREPARED
    and ROLLBACK records alone are no lag; without 'abort' it adds that a 5.x broker's
    start may leave them out: 5.3.0 and 5.3.1 all, 5.3.2 and later those up to the
    furthest queue's end),
    checkpoint values, abort and lock state. Reads only; works on a store a broker holds
    (with a warning). Without --deep the log is read from where the consume queues end (and
    its last files, for the valid end as a broker's recovery finds it), so a store of any
    size answers at once; a queue's messages are then its consume queue's units plus the
    records after them. --deep reads every record: the log's message count and each queue's
    records no consume queue holds (notQueued), null without it. A 5.x store whose consume
    queues are a RocksDB database (storeType=defaultRocksDB) is read from its commit log
    alone, every record (its queues are not read: no dispatch lag); so is one with BatchCQ
    topics (their queues in batchconsumequeue/ are not read).

    JSON fields: store, kernel (native or python: which record kernel ran), deep, locked (a
    boolean), lockHolder (null, "another process" or "this process"), abort,
    checkpoint{physicMsgTimestamp, logicsMsgTimestamp, indexMsgTimestamp, masterFlushedOffset,
    confirmPhyOffset, minTimestamp, minTimestampIndex} (as a broker reads it), checkpointBytes
    (the file's size: 4096, fewer when a crash cut it short, null when absent), geometry{...},
    commitLog{files, firstFile, lastFile, minOffset, maxOffset, messages, firstStoreTimestamp,
    lastStoreTimestamp, end, endError, filesWithDataAfterEnd, missingFiles[{from, to, files}]
    (runs of files missing between two that are there)}, topics[{topic, queues[{queueId,
    messages, minOffset, maxOffset, notQueued}]}] (from the commit log; an LMQ queue's from its
    consume queue), consumeQueues[{topic,
    queueId, minOffset, maxOffset, maxPhysicalOffset}] (from consume-queue files),
    consumeQueueStore ("files", or "rocksdb": not read), batchQueueTopics (topics whose
    queues are in batchconsumequeue/, not read), linkedQueueFolders[{folder, target}]
    (consumequeue/ folders that are symbolic links, not read), index{files,
    entries, endOffset, endTimestamp}, consumerOffsets{file, groups, lag, pastEnd} (from
    config/consumerOffset.json, as rmqstore offsets reads it; null without one),
    dispatch{cursor, behindBytes, behindRecords} (null for "rocksdb"). With
    --topic: topics[{topic, queues[{queueId, minOffset, maxOffset, lastUpdated}]}]
    (lastUpdated: the store time of the queue's last message; 0 when the queue is empty, or,
    with a warning, when its last unit points at no whole record).
    --csv, --tsv and --jsonl print a row per topic and queue (messages and notQueued from the
    commit log; with --topic, lastUpdated instead, without reading the log).
    """
    if as_json and delimited:
        raise click.UsageError("--json and --csv/--tsv/--jsonl exclude each other")
    if topics and deep:
        raise click.UsageError(
            "--deep counts the records of the whole log; --topic reads only the consume queues"
        )
    with Store.open_read(store, config) as opened:
        for message in opened.notes:
            warn(message)
        if topics:
            status = [topic_status(opened, topic) for topic in topics]
            for topic in status:
                for queue in topic["queues"]:
                    if queue["maxOffset"] > queue["minOffset"] and not queue["lastUpdated"]:
                        warn(
                            f"the last unit of {topic['topic']}:{queue['queueId']} (queue "
                            f"offset {queue['maxOffset'] - 1}) points at no whole record (a "
                            "crash's torn tail, or a removed file); run rmqstore verify"
                        )
            if delimited:
                _queue_rows(status, delimited)
            elif as_json:
                emit_json({"topics": status})
            else:
                _topic_status_table(status)
            return 0
        total = opened.commitlog.data_extent() - opened.commitlog.min_offset
        with progress_bar("scanning commit log", total, not no_progress) as update:
            summary = summarize(opened, update, deep=deep)
    consumers = summary["consumerOffsets"]
    if consumers is not None and consumers["pastEnd"]:
        warn(
            f"{counted(consumers['pastEnd'], 'consumer offset')} in {consumers['file']} "
            f"{'is' if consumers['pastEnd'] == 1 else 'are'} past the end of "
            f"{'its' if consumers['pastEnd'] == 1 else 'their'} queue; rmqstore offsets "
            "names them"
        )
    if delimited:
        _queue_rows(summary["topics"], delimited)
    elif as_json:
        emit_json(summary)
    else:
        _render(summary)
    return 0


def _queue_rows(topics: list[dict[str, Any]], delimited: tuple[str, list[str]]) -> None:
    """A row per topic and queue of the JSON's topics[].queues[]."""
    table = DelimitedWriter(*delimited)
    for topic in topics:
        for queue in topic["queues"]:
            table.row({"topic": topic["topic"], **queue})


def _render(summary: dict[str, Any]) -> None:
    log = summary["commitLog"]
    overview = fields_grid()
    overview.add_row("store", summary["store"])
    overview.add_row("record kernel", summary["kernel"])
    overview.add_row("lock", f"held by {summary['lockHolder']}" if summary["locked"] else "free")
    overview.add_row(
        "abort",
        "present (not closed cleanly, or consume queues behind)" if summary["abort"] else "absent",
    )
    geometry = summary["geometry"]
    overview.add_row(
        "file sizes",
        f"commit log {geometry['commitLogFileSize']:,}, consume "
        f"queue {geometry['consumeQueueFileSize']:,}",
    )
    overview.add_row(
        "commit log",
        f"{counted(log['files'], 'file')} {log['firstFile'] or ''}"
        f"{' .. ' + log['lastFile'] if log['files'] > 1 else ''}",
    )
    overview.add_row("offsets", f"{log['minOffset']:,} .. {log['maxOffset']:,}")
    overview.add_row(
        "messages",
        f"{log['messages']:,}" if log["messages"] is not None else "(counted with --deep)",
    )
    overview.add_row(
        "store times",
        f"{format_millis(log['firstStoreTimestamp'])} .. "
        f"{format_millis(log['lastStoreTimestamp'])}",
    )
    end = (
        "clean"
        if log["end"] == "clean"
        else Styled(("invalid bytes", "red"), f": {log['endError']}")
    )
    overview.add_row("log end", end)
    if log["filesWithDataAfterEnd"]:
        overview.add_row(
            Styled(("warning", "red")),
            "files after the end hold data: "
            + ", ".join(log["filesWithDataAfterEnd"])
            + " (run rmqstore verify)",
        )
    for gap in log["missingFiles"]:
        overview.add_row(
            Styled(("warning", "red")),
            f"commit-log files missing: {gap['from']}"
            + (f" .. {gap['to']}" if gap["to"] != gap["from"] else "")
            + f" ({counted(gap['files'], 'file')}; the messages there are lost; run rmqstore "
            "verify)",
        )
    checkpoint = summary["checkpoint"]
    if checkpoint is None:
        overview.add_row("checkpoint", "absent (a broker reads it as zeros)")
    else:
        if summary["checkpointBytes"] < CHECKPOINT_FILE_SIZE:
            overview.add_row(
                "checkpoint",
                f"{summary['checkpointBytes']} bytes, cut short: a broker reads the rest as "
                "zeros (rmqstore flush writes it whole)",
            )
        for key in ("physicMsgTimestamp", "logicsMsgTimestamp", "indexMsgTimestamp"):
            overview.add_row(key, f"{checkpoint[key]} ({format_millis(checkpoint[key])})")
        if checkpoint["confirmPhyOffset"] or checkpoint["masterFlushedOffset"]:
            overview.add_row("confirmPhyOffset", str(checkpoint["confirmPhyOffset"]))
            overview.add_row("masterFlushedOffset", str(checkpoint["masterFlushedOffset"]))
    dispatch = summary["dispatch"]
    if summary["consumeQueueStore"] == "rocksdb":
        overview.add_row(
            "consume queues",
            "a RocksDB database (storeType=defaultRocksDB), not read: no dispatch lag known",
        )
    else:
        overview.add_row(
            "dispatch lag",
            f"{dispatch['behindRecords']:,} records, "
            f"{dispatch['behindBytes']:,} bytes behind the commit log"
            + (
                " (BatchCQ topics' records among them)"
                if summary["batchQueueTopics"] and dispatch["behindRecords"]
                else ""
            )
            + (
                "; no 'abort', so a 5.x broker's start may leave them out (5.3.0 and 5.3.1 "
                "all, 5.3.2 and later those up to the furthest queue's end): rmqstore dispatch "
                "adds them"
                if dispatch["behindRecords"] and not summary["abort"]
                else ""
            ),
        )
    if batch_topics := summary["batchQueueTopics"]:
        named = ", ".join(batch_topics[:10])
        more = f" and {len(batch_topics) - 10} more" if len(batch_topics) > 10 else ""
        overview.add_row(
            "batch queues",
            f"{named}{more}: queue.type BatchCQ, queues in batchconsumequeue/, not read",
        )
    if linked := summary["linkedQueueFolders"]:
        overview.add_row(
            "linked queues",
            ", ".join(f"{link['folder']} -> {link['target']}" for link in linked)
            + ": symbolic links, not read (a broker reads and writes through them, "
            "rmqstore does not; dispatch --rebuild --yes moves them to quarantine)",
        )
    index = summary["index"]
    overview.add_row(
        "index",
        f"{counted(index['files'], 'file')}, {counted(index['entries'], 'entry', 'entries')}",
    )
    consumers = summary["consumerOffsets"]
    if consumers is not None:
        overview.add_row(
            "consumer groups",
            f"{consumers['groups']:,}, lag {consumers['lag']:,}"
            + (f"; {consumers['pastEnd']:,} past a queue's end" if consumers["pastEnd"] else "")
            + " (rmqstore offsets)",
        )
    console.print(overview)
    if summary["consumeQueues"]:
        _consume_queue_table(summary["consumeQueues"])
    source = (
        "every record of the commit log"
        if summary["deep"]
        else "consume queues and the records after them; --deep reads every record"
    )
    queues = Grid(title=f"topics and queues ({source})", title_justify="left")
    for name, justify in (
        ("topic", "left"),
        ("queue", "right"),
        ("messages", "right"),
        ("min offset", "right"),
        ("max offset", "right"),
    ):
        queues.add_column(name, justify=justify, wrap=name == "topic")  # type: ignore[arg-type]
    for topic in summary["topics"]:
        for queue in topic["queues"]:
            queues.add_row(
                topic["topic"],
                str(queue["queueId"]),
                f"{queue['messages']:,}",
                str(queue["minOffset"]),
                str(queue["maxOffset"]),
            )
    console.print(queues)


def _consume_queue_table(rows: list[dict[str, Any]]) -> None:
    table = Grid(title="consume queues (the broker's view)", title_justify="left")
    for name, justify in (
        ("topic", "left"),
        ("queue", "right"),
        ("min offset", "right"),
        ("max offset", "right"),
        ("max physical offset", "right"),
    ):
        table.add_column(name, justify=justify, wrap=name == "topic")  # type: ignore[arg-type]
    for row in rows:
        table.add_row(
            row["topic"],
            str(row["queueId"]),
            str(row["minOffset"]),
            str(row["maxOffset"]),
            str(row["maxPhysicalOffset"]),
        )
    console.print(table)


def _topic_status_table(status: list[dict[str, Any]]) -> None:
    table = Grid()
    for name, justify in (
        ("topic", "left"),
        ("queue", "right"),
        ("min offset", "right"),
        ("max offset", "right"),
        ("last updated", "left"),
    ):
        table.add_column(name, justify=justify, wrap=name == "topic")
    for topic in status:
        for queue in topic["queues"]:
            table.add_row(
                topic["topic"],
                str(queue["queueId"]),
                str(queue["minOffset"]),
                str(queue["maxOffset"]),
                format_millis(queue["lastUpdated"]),
            )
    console.print(table)
