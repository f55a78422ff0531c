"""``rmqstore stats``: messages, bytes, times and tags per topic and queue; per file counts."""

from __future__ import annotations

import functools

import click

from rmqstore.commands.export import (
    store_settings,
    warn_live_end,
    warn_missing_files,
    warn_topics_without_messages,
)
from rmqstore.commands.options import (
    EngineChoice,
    engine_options,
    jobs_option,
    json_option,
    progress_option,
    store_config_options,
    store_location_argument,
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
    progress_bar,
)
from rmqstore.config import StoreConfig
from rmqstore.pipeline.local import PipelineOptions, StoreStats


@click.command("stats")
@store_location_argument
@topics_option("Only these topics.")
@engine_options(default="auto")
@jobs_option()
@store_config_options
@json_option
@progress_option
@delimited_options(
    ["topic", "queueId", "messages", "bytes", "minOffset", "maxOffset",
     "firstStoreTimestamp", "lastStoreTimestamp", "distinctTags"],
    ["topic", "queueId", "messages", "bytes", "minOffset", "maxOffset",
     "firstStoreTimestamp", "lastStoreTimestamp", "distinctTags", "topTags"],
    jsonl="per topic and queue per line",
)  # fmt: skip
def command(
    store: str,
    topics: tuple[str, ...],
    engine: EngineChoice,
    jobs: int,
    config: StoreConfig,
    as_json: bool,
    no_progress: bool,
    delimited: tuple[str, list[str]] | None,
) -> int:
    """Count the records of a store per topic and queue, and per commit-log file.

    Per topic and queue: messages (records of any transaction type), bytes (storeSize),
    min/max queue offset, first/last store time, distinct tags and the most common ones. Per
    commit-log file: records, bytes, BLANK bytes, CRC failures (body CRCs are checked),
    damaged regions skipped, and where and why its records end (a file after the last one
    holding data, such as a broker's pre-allocated next file, ends at 0; of a store a broker
    is writing, the files after where it was counted up to are not listed). STORE may be a
    local path or a pyarrow URI (s3://, hdfs://, gs://). Reads only; a local store whose
    lock a broker holds is counted as it stood when the command began (up to where its last
    file's data ended then, read 50 ms later, when a record being written is whole).

    A --topic that matches no message gets a warning on stderr naming the topics that have
    consume queues (a typo, most often); the exit code stays 0.

    JSON: messages, bytes, queues[{topic, queueId, messages, bytes, minOffset, maxOffset
    (RocketMQ's meaning, as in info: the first queue offset and the one after the last),
    firstStoreTimestamp, lastStoreTimestamp, distinctTags, topTags[{tag,
    messages}]}], files[{file, records, bytes, blankBytes, crcFailures, invalidRegions, end,
    endedBy}], liveEnd (of a store whose lock another process held, the commit-log offset it
    was counted up to, with a warning on stderr; else null).
    """
    engine.resolve(store, jobs)
    options = PipelineOptions.for_config(store_settings(store, config), engine.split, jobs)
    selected = frozenset(topics) or None
    if engine.spark:
        from rmqstore.spark.jobs import SparkPipeline

        stats = SparkPipeline(engine.session(), store, options).stats(topics=selected)
    else:
        from rmqstore.pipeline.local import LocalPipeline

        watch = functools.partial(progress_bar, enabled=not no_progress)
        stats = LocalPipeline(store, options, watch).stats(topics=selected)
    if as_json and delimited:
        raise click.UsageError("--json and --csv/--tsv exclude each other")
    warn_missing_files(store, config, "counts")
    warn_live_end(stats.live_end, "counts")
    if selected:
        found = {queue["topic"] for queue in stats.to_dict()["queues"]}
        warn_topics_without_messages(store, config, sorted(selected - found))
    if delimited:
        table = DelimitedWriter(*delimited)  # a row per topic and queue
        for queue in stats.to_dict()["queues"]:
            table.row(queue)
    elif as_json:
        emit_json(stats.to_dict())
    else:
        _render(stats)
    return 0


def _render(stats: StoreStats) -> None:
    document = stats.to_dict()
    queues = Grid(
        title=f"{counted(document['messages'], 'message')}, {counted(document['bytes'], 'byte')}"
    )
    queues.add_column("topic", wrap=True)
    queues.add_column("queue", justify="right")
    queues.add_column("messages", justify="right")
    queues.add_column("bytes", justify="right")
    queues.add_column("queue offsets")
    queues.add_column("last stored")
    queues.add_column("tags", justify="right")
    for queue in document["queues"]:
        queues.add_row(
            queue["topic"],
            str(queue["queueId"]),
            f"{queue['messages']:,}",
            f"{queue['bytes']:,}",
            f"{queue['minOffset']}..{queue['maxOffset'] - 1}",
            format_millis(queue["lastStoreTimestamp"] or 0),
            str(queue["distinctTags"]),
        )
    console.print(queues)
    files = Grid(title="commit-log files")
    files.add_column("file")
    for name in ("records", "bytes", "blank bytes", "CRC failures", "damaged"):
        files.add_column(name, justify="right")
    files.add_column("ends")
    for entry in document["files"]:
        ends = f"{entry['endedBy']} at {entry['end']:,}" if entry["endedBy"] else "-"
        files.add_row(
            entry["file"].rsplit("/", 1)[-1],
            f"{entry['records']:,}",
            f"{entry['bytes']:,}",
            f"{entry['blankBytes']:,}",
            str(entry["crcFailures"]),
            str(entry["invalidRegions"]),
            ends,
        )
    console.print(files)
