"""``rmqstore export``: every message of a store to Parquet or JSON lines."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import click

from rmqstore.commands.main import process_is_own
from rmqstore.commands.options import (
    EngineChoice,
    engine_options,
    jobs_option,
    json_option,
    progress_option,
    refuse_empty,
    store_config_options,
    store_location_argument,
    topics_option,
)
from rmqstore.commands.output import (
    console,
    counted,
    emit_json,
    fields_grid,
    progress_bar,
    warn,
)
from rmqstore.config import StoreConfig
from rmqstore.pipeline.arrowcalls import import_pyarrow_without_numpy
from rmqstore.pipeline.local import EXPORT_FORMATS, ExportResult, PipelineOptions
from rmqstore.store import Store
from rmqstore.wording import missing_files, quoted


def _destination(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """``--to``: not empty, and not ``-``, which a script means as stdout (it made a folder
    named ``-``)."""
    value = refuse_empty(ctx, param, value)
    if value == "-":
        raise click.BadParameter(
            "- is not stdout here: export writes part files into a directory; for JSON lines "
            "on stdout run rmqstore read STORE --from-offset 0 --jsonl (./- names a folder "
            "called -)",
            ctx,
            param,
        )
    return value


@click.command("export")
@store_location_argument
@click.option(
    "--to",
    "destination",
    required=True,
    callback=_destination,
    metavar="DIR",
    help="A new (or empty) directory for the part files, or a pyarrow URI (s3://, hdfs://, "
    "gs://). Not - (stdout): read --from-offset 0 --jsonl writes JSON lines there.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(EXPORT_FORMATS),
    default="parquet",
    show_default=True,
    help="Parquet files, or JSON lines (one object per message, body in base64).",
)
@topics_option("Only these topics.")
@click.option("--no-body", is_flag=True, help="Leave the message bodies out.")
@click.option(
    "--decompress/--no-decompress",
    default=True,
    show_default=True,
    help="Inflate ZLIB bodies of COMPRESSED records as a consumer receives them (others, and "
    "bodies that do not inflate, stay as stored; sysFlag says which were compressed).",
)
@engine_options(default="auto")
@jobs_option()
@store_config_options
@json_option
@progress_option
def command(
    store: str,
    destination: str,
    fmt: str,
    topics: tuple[str, ...],
    no_body: bool,
    decompress: bool,
    engine: EngineChoice,
    jobs: int,
    config: StoreConfig,
    as_json: bool,
    no_progress: bool,
) -> int:
    """Export every message of the commit log, one row per message.

    Columns (the rocketmq-commitlog data source): topic, queueId, queueOffset, body,
    properties, bornTimestamp, storeTimestamp, flag, commitLogOffset, storeSize (also as
    msgSize), bodyLength, bodyCRC, crcOk, sysFlag, bornHost, storeHost, reconsumeTimes,
    preparedTransactionOffset, tags, tagsCode, keys, uniqKey, msgId, version, file, bornTime,
    storeTime (timestamps, UTC; ISO-8601 in JSON lines).

    Records are read up to where each file's records end, as one walk of the log sees it:
    damaged regions of completed files are skipped, and the log ends at the first invalid
    record of its last file. One part file per range of the commit log (--split-size;
    consecutive files smaller than that share one up to it), part-NNNNN.parquet or .jsonl;
    both engines write the same files. STORE and DIR may be local
    paths or pyarrow URIs (s3://, hdfs://, gs://). A local DIR is written under a temporary
    name (.DIR.rmqstore-PID), synced to disk and renamed at the end, so a failed export
    leaves nothing behind and one that said it was done outlives a crash just after; such a
    folder a killed export (or a power cut) left is removed by the next export to DIR. A DIR
    inside the store is refused (exit 2: a broker lists the store's folders). Reads only; a
    local store whose lock a broker holds is exported as it stood when the export began: up
    to where its last file's data ended then, read 50 ms later, when a record being written
    is whole.

    A --topic that matches no message gets a warning on stderr naming the topics that have
    consume queues (a typo, most often); the exit code stays 0.

    Parquet parts hold row groups of about 65,536 messages, snappy-compressed: topic, tags,
    hosts, version, file and the small integer columns dictionary-encoded; offsets and times
    as deltas (DELTA_BINARY_PACKED, which Spark 3.3+, Arrow, DuckDB and Trino read); min/max
    statistics for the columns one selects by (not bodies, properties, keys, ids, CRCs, hosts
    or versions). Columns every message has a value in are REQUIRED (not null); body, crcOk,
    tags, keys, uniqKey, tagsCode, bornTime and storeTime may be null.

    JSON: destination, format, messages, files, commitLogFiles, liveEnd (of a store whose
    lock another process held, the commit-log offset it was exported up to, with a warning on
    stderr; else null).
    """
    engine.resolve(store, jobs)
    options = PipelineOptions.for_config(store_settings(store, config), engine.split, jobs)
    selected = frozenset(topics) or None
    if engine.spark:
        from rmqstore.spark.jobs import SparkPipeline

        pipeline = SparkPipeline(engine.session(), store, options)
    else:
        from rmqstore.pipeline.local import LocalPipeline

        if process_is_own():
            import_pyarrow_without_numpy()  # an export converts nothing to numpy
        watch = functools.partial(progress_bar, enabled=not no_progress)
        pipeline = LocalPipeline(store, options, watch)
    result = pipeline.export(
        destination, fmt, topics=selected, include_body=not no_body, decompress=decompress
    )
    warn_missing_files(store, config, "export")
    warn_live_end(result.live_end, "export")
    if selected and not result.messages:
        warn_topics_without_messages(store, config, sorted(selected))
    if as_json:
        emit_json(result.to_dict())
    else:
        _render(result)
    return 0


def store_settings(store: str, config: StoreConfig) -> StoreConfig:
    """The store's settings when it is a local directory (a URI keeps the given ones)."""
    if "://" in store:
        return config
    return Store.open_read(Path(store), config).config


def warn_topics_without_messages(store: str, config: StoreConfig, missing: list[str]) -> None:
    """A --topic that matched no message is most often a typo: say so on stderr, with the
    topics that have consume queues (of a local store) to compare with."""
    if not missing:
        return
    hint = ""
    if "://" not in store:
        with Store.open_read(Path(store), config) as opened:
            known = opened.topics_with_queues()
        if known:
            more = ", ..." if len(known) > 10 else ""
            hint = f" (topics with consume queues: {', '.join(known[:10])}{more})"
    names = ", ".join(quoted(topic) for topic in missing)
    warn(f"no message of topic {names} in the commit log{hint}")


def warn_missing_files(store: str, config: StoreConfig, what: str) -> None:
    """Commit-log files missing between others (a local store's): the ranges of the files
    that are there were read, and ``what`` does not hold the missing files' messages."""
    if "://" in store:
        return
    with Store.open_read(Path(store), config) as opened:
        log = opened.commitlog
        for previous, following in log.queue.gaps():
            start = previous.start + log.file_size
            warn(
                f"{missing_files(start, following.start, log.file_size)}: their messages are "
                f"not in the {what} (run rmqstore verify)"
            )


def warn_live_end(live_end: int | None, what: str) -> None:
    """Of a store whose lock another process held: where its log was read up to, and that
    ``what`` does not hold the messages written after."""
    if live_end is not None:
        warn(
            "the store's lock is held by a running process (a broker?): it was read as it "
            f"stood when the command began, up to commit-log offset {live_end:,}; the "
            f"messages written after are not in the {what}"
        )


def _render(result: ExportResult) -> None:
    table = fields_grid()
    table.add_row("exported", f"{counted(result.messages, 'message')} as {result.format}")
    table.add_row("to", result.destination)
    if result.files:
        more = ", ..." if len(result.files) > 1 else ""
        table.add_row(
            "files", f"{counted(len(result.files), 'part file')} ({result.files[0]}{more})"
        )
    damaged = [f for f in result.commitlog_files if f.invalid_regions]
    if damaged:
        table.add_row(
            "skipped",
            "damaged regions in " + ", ".join(f.file for f in damaged) + " (run rmqstore verify)",
        )
    console.print(table)
