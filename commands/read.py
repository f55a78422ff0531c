"""``rmqstore read``: messages by physical offset, offset message id, or sequentially."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import click

from rmqstore.commands.options import (
    STORE_TIME,
    Number,
    json_option,
    jsonl_option,
    progress_option,
    refuse_empty_text,
    store_argument,
    store_config_options,
)
from rmqstore.commands.output import (
    BODY_MODES,
    DelimitedWriter,
    Grid,
    JsonArrayOutput,
    LineOutput,
    Styled,
    console,
    delimited_options,
    document_json,
    emit_json,
    emit_jsonl,
    encode_body,
    fields_grid,
    format_millis,
    message_document,
    note,
    progress_bar,
    warn,
    write_data,
)
from rmqstore.config import StoreConfig
from rmqstore.documents import DelimitedLayout
from rmqstore.errors import RmqStoreError
from rmqstore.indexfile import LONG_MAX, MAX_QUERY_RESULTS
from rmqstore.kernel.layout import MOST_COLUMNS
from rmqstore.msgid import HEX_DIGITS
from rmqstore.properties import split_keys
from rmqstore.reader import (
    MessageReader,
    MessageSelection,
    TextBlock,
    selected,
    subscription_tags,
)
from rmqstore.record import BodyMode, Message, decompress_body
from rmqstore.store import Store
from rmqstore.wording import clipped

_TABLE_CHUNK = 100


@click.command("read")
@store_argument
@click.option(
    "--offset",
    type=Number(min=0),
    metavar="N",
    help="The message starting at commit-log (physical) offset N.",
)
@click.option(
    "--msg-id",
    metavar="ID",
    callback=refuse_empty_text("a message id"),
    help="The message an id names: an offset message id (32 or 56 hex digits), or else a "
    "producer's client id (UNIQ_KEY) through the index; either case.",
)
@click.option(
    "--from-offset",
    type=Number(min=0),
    metavar="N",
    help="Read sequentially from the record starting at physical offset N.",
)
@click.option(
    "--seek",
    is_flag=True,
    help="With --from-offset: when no record starts at N, start at the next one that does.",
)
@click.option(
    "--topic",
    metavar="T",
    callback=refuse_empty_text("a topic name"),
    help="With --queue: read through the consume queue; with --key/--uniq-key: the "
    "topic to search.",
)
@click.option(
    "--queue", "queue_id", type=Number(min=0), metavar="Q", help="Queue id (with --topic)."
)
@click.option(
    "--from",
    "queue_from",
    type=Number(min=0),
    metavar="N",
    help="With --topic/--queue: start at queue offset N (default: the min offset).",
)
@click.option(
    "--count",
    type=Number(min=1),
    metavar="K",
    help="With --from-offset or --topic/--queue: at most K messages.",
)
@click.option(
    "--key",
    metavar="K",
    callback=refuse_empty_text("a key"),
    help="Messages with this key in KEYS (of --topic, or of every topic), through the index.",
)
@click.option(
    "--uniq-key",
    metavar="ID",
    callback=refuse_empty_text("a unique key"),
    help="Messages with this UNIQ_KEY (client message id; of --topic, or of every topic), "
    "through the index; compared case by case, as the broker does.",
)
@click.option(
    "--begin",
    type=STORE_TIME,
    default=0,
    metavar="TIME",
    help="Only messages stored at or after TIME (epoch ms, ISO-8601, "
    "yyyy-MM-dd#HH:mm:ss:SSS or as rmqstore shows times; local time without a zone, refused "
    "when the clocks went back or forward over it; with --key/--uniq-key the index compares "
    "whole seconds).",
)
@click.option(
    "--end",
    type=STORE_TIME,
    default=LONG_MAX,
    metavar="TIME",
    help="Only messages stored at or before TIME (not before --begin).",
)
@click.option(
    "--tags",
    metavar="A||B",
    callback=refuse_empty_text("a tag, or * for every message"),
    help="Only messages with one of these TAGS: a subscription expression, as a consumer "
    "subscribes (TagA || TagB, each tag trimmed; * is every message).",
)
@click.option(
    "--max",
    "max_results",
    type=Number(min=1),
    default=MAX_QUERY_RESULTS,
    show_default=True,
    help="With --key/--uniq-key: at most N index hits (the broker caps it at 64).",
)
@click.option(
    "--time",
    "timestamp",
    type=STORE_TIME,
    metavar="TIME",
    help="With --topic/--queue: the queue offset for this store time (as --begin takes it), "
    "and its message.",
)
@click.option(
    "--time-rule",
    type=click.Choice(["auto", "5.x", "4.x"]),
    default="auto",
    show_default=True,
    help="--time: 5.x gives the first message stored at or after MS; 4.x the 4.9 "
    "broker's nearest match within a file chosen by its time; auto the rule of the broker "
    "that wrote the store (told from its records' properties; 5.x when they do not say).",
)
@click.option(
    "--body",
    "body_mode",
    type=click.Choice(BODY_MODES),
    default="auto",
    show_default=True,
    help="How to show bodies: auto (UTF-8 text, else base64), text, hex, base64, "
    "none, or raw (the bytes alone on stdout; one message only, not with --json, --jsonl, "
    "--csv or --tsv).",
)
@click.option(
    "--decompress",
    is_flag=True,
    help="Inflate ZLIB-compressed bodies (sysFlag bit 0) before showing them.",
)
@click.option("--verify-crc", is_flag=True, help="Fail when a body does not match its BODYCRC.")
@store_config_options
@json_option
@jsonl_option
@progress_option
@delimited_options(
    ["msgId", "topic", "queueId", "queueOffset", "commitLogOffset", "storeSize",
     "storeTimestamp", "tags", "keys", "uniqKey"],
    [*Message(topic="T").fields(), "body", "bodyEncoding"],
)  # fmt: skip
def command(
    store: Path,
    offset: int | None,
    msg_id: str | None,
    from_offset: int | None,
    seek: bool,
    topic: str | None,
    queue_id: int | None,
    queue_from: int | None,
    count: int | None,
    key: str | None,
    uniq_key: str | None,
    begin: int,
    end: int,
    tags: str | None,
    max_results: int,
    timestamp: int | None,
    time_rule: str,
    body_mode: str,
    decompress: bool,
    verify_crc: bool,
    config: StoreConfig,
    as_json: bool,
    as_jsonl: bool,
    delimited: tuple[str, list[str]] | None,
    no_progress: bool,
) -> int:
    """Read messages: by offset, message id, sequentially, by queue, key, unique key or time.

    Give exactly one of: --offset N; --msg-id ID (an offset message id, or a client id: the
    UNIQ_KEY a producer logs, found through the index like mqadmin queryMsgById); --from-offset
    N [--count K] [--seek]; --topic T --queue Q [--from N] [--count K] (through the consume queue);
    --topic T [--count K] (every queue of T, one after the other, like mqadmin printMsg);
    [--topic T] --key K [--begin MS] [--end MS] [--max N] or [--topic T] --uniq-key ID
    (through the index, each hit checked against its record, like mqadmin
    queryMsgByKey/queryMsgByUniqueKey; without --topic every topic with consume queues is
    searched; no hit is a note and exit 1, as with grep); --topic T --queue Q --time MS (the
    queue offset for a store time). --tags A||B and --begin/--end keep only the messages with
    those tags, stored in that time (--count then counts the messages kept). --seek starts a
    sequential read at the next record when none starts at N; without it an N inside a record is
    an error (exit 2, before anything is printed). A read from the log's end (or past it in the
    last file) is empty, exit 0, so a script can read on from where it stopped; a queue read
    stops, with a warning, at units pointing past the log's valid end (a torn tail). An option
    the lookup would not use is an error, not ignored (--offset is a commit-log offset; a
    queue offset is --from). A long --jsonl or --csv read shows progress on a terminal. Reads
    only; a sequential read of a store whose lock a broker holds stops where the log's data
    ended when it began, its records read 50 ms later, when one being written is whole.

    Fields use RocketMQ's names: msgId, topic, queueId, queueOffset, commitLogOffset,
    storeSize, bodyCRC, flag, sysFlag, bornTimestamp, bornHost, storeTimestamp, storeHost,
    reconsumeTimes, preparedTransactionOffset, properties, tags, keys, uniqKey, bodyLength,
    version, body, bodyEncoding (text, text-lossy, hex or base64). --json has one shape per
    mode: --offset and --msg-id print one message object; --from-offset, --topic [--queue],
    --key and --uniq-key print an array of message objects (empty when nothing matched);
    --time prints {topic, queueId, timestamp, rule, queueOffset, message} (message null when
    the queue has none there). --jsonl prints one message object per line in every mode.
    """
    mode = _mode(
        offset, msg_id, from_offset, topic, queue_id, queue_from, count, key, uniq_key, timestamp
    )
    _refuse_unused(mode, tags)
    wanted_tags = subscription_tags(tags) if tags is not None else None
    if begin > end:
        raise click.UsageError(
            f"--begin is after --end ({begin} > {end}, epoch ms): no message is stored in "
            "that window"
        )
    if sum((as_json, as_jsonl, delimited is not None)) > 1:
        raise click.UsageError("--json, --jsonl and --csv/--tsv exclude each other")
    if seek and mode != "sequential":
        raise click.UsageError("--seek goes with --from-offset")
    if body_mode == "raw" and mode not in ("offset", "msg-id"):
        raise click.UsageError("--body raw shows one message; use --offset or --msg-id")
    if body_mode == "raw" and (as_json or as_jsonl or delimited is not None):
        # the body's bytes alone: one of these would be ignored, or would leave it out
        raise click.UsageError(
            "--body raw writes the body's bytes alone; it does not go with --json, --jsonl, "
            "--csv or --tsv (use --body base64 in those)"
        )
    body = (
        BodyMode.SKIP if body_mode == "none" else (BodyMode.VERIFY if verify_crc else BodyMode.READ)
    )
    with Store.open_read(store, config) as opened:
        for text in opened.notes:
            warn(text)
        reader = MessageReader(opened)
        if mode in ("offset", "msg-id"):
            message = (
                reader.by_offset(offset, body=body)
                if mode == "offset"  # type: ignore[arg-type]
                else reader.by_msg_id(msg_id, body=body)
            )  # type: ignore[arg-type]
            _warn_all(reader.notes)
            if delimited:
                document = message_document(message, body_mode, _body_of(message, decompress))
                DelimitedWriter(*delimited).row(document)
                return 0
            _show_one(message, body_mode, decompress, as_json, as_jsonl)
            return 0
        if mode == "time":
            assert topic is not None and queue_id is not None and timestamp is not None
            if time_rule == "auto":
                time_rule = reader.broker_generation() or "5.x"
            queue_offset = reader.offset_by_time(topic, queue_id, timestamp, rule=time_rule)
            found = (
                next(iter(reader.by_queue(topic, queue_id, queue_offset, 1, body=body)), None)
                if queue_offset >= 0
                else None
            )
            _show_time(
                topic,
                queue_id,
                timestamp,
                time_rule,
                queue_offset,
                found,
                body_mode,
                decompress,
                as_json or as_jsonl,
            )
            return 0
        filtered = wanted_tags is not None or begin > 0 or end < LONG_MAX
        walk_count = None if filtered else count  # a filter counts what it lets through
        selection = (  # the kernel's rows filtered by their store time, then TAGS
            MessageSelection(begin, end, wanted_tags) if filtered else None
        )
        kernel_lines = (as_jsonl or as_json or delimited is not None) and not (
            decompress or verify_crc
        )
        layout = (  # the rows the record kernel writes (more --fields: message by message)
            DelimitedLayout(tuple(delimited[1]), "\t" if delimited[0] == "tsv" else ",")
            if delimited is not None and len(delimited[1]) <= MOST_COLUMNS
            else None
        )
        kernel_lines = kernel_lines and (delimited is None or layout is not None)
        if mode == "sequential" and kernel_lines:
            _stream_lines(
                opened,
                reader,
                from_offset,  # type: ignore[arg-type]
                count,
                body_mode,
                layout,
                selection,
                seek,
                no_progress,
                lambda items: _write_items(items, body_mode, as_json, delimited),
            )
            _warn_all(reader.notes)
            return 0
        if mode in ("queue", "topic") and kernel_lines:
            shape = {"body_mode": body_mode, "layout": layout, "selection": selection}
            items = (
                reader.queue_lines(topic, queue_id, queue_from, count, **shape)  # type: ignore[arg-type]
                if mode == "queue"
                else reader.topic_lines(topic, count, **shape)  # type: ignore[arg-type]
            )
            _write_items(items, body_mode, as_json, delimited)
            _warn_all(reader.notes)
            return 0
        # a filter the reader applies to the scan's rows (a body CRC check of a queue's
        # records reads them one by one, and a filter then picks among the messages)
        picked = selection is not None and (mode == "sequential" or body is not BodyMode.VERIFY)
        if mode == "sequential":
            messages: Iterable[Message] = reader.sequential(
                from_offset,  # type: ignore[arg-type]
                count,
                body=body,
                seek=seek,
                selection=selection,
            )
        elif mode == "queue" and picked:
            messages = reader.queue_messages(
                topic,  # type: ignore[arg-type]
                queue_id,  # type: ignore[arg-type]
                queue_from,
                count,
                selection=selection,  # type: ignore[arg-type]
                body=body,
            )
        elif mode == "queue":
            messages = reader.by_queue(topic, queue_id, queue_from, walk_count, body=body)  # type: ignore[arg-type]
        elif mode == "topic" and picked:
            messages = reader.topic_messages(topic, count, selection=selection, body=body)  # type: ignore[arg-type]
        elif mode == "topic":
            messages = reader.by_topic(topic, walk_count, body=body)  # type: ignore[arg-type]
        else:
            messages = reader.by_key(
                topic,
                key or uniq_key,
                begin=begin,
                end=end,  # type: ignore[arg-type]
                max_results=max_results,
                uniq=mode == "uniq-key",
                body=body,
            )
        messages = _first_fetched(messages)
        table = DelimitedWriter(*delimited) if delimited else None
        if mode in ("queue", "topic") and filtered and not picked:
            messages = selected(messages, tags=wanted_tags, begin=begin, end=end, count=count)
        elif mode in ("key", "uniq-key") and wanted_tags is not None:
            messages = selected(messages, tags=wanted_tags)
        streamed = table is not None or as_jsonl
        total = opened.commitlog.data_extent() - from_offset if from_offset is not None else 0
        with progress_bar("reading", total, streamed and not no_progress) as update:
            if mode == "sequential":
                messages = _watched(messages, update, from_offset)  # type: ignore[arg-type]
            if table is not None:
                shown = 0
                for shown, message in enumerate(messages, 1):  # noqa: B007 - the count is used
                    table.row(message_document(message, body_mode, _body_of(message, decompress)))
            else:
                shown = _show_many(messages, body_mode, decompress, as_json, as_jsonl)
        _warn_all(reader.notes)
        if not shown and mode in ("key", "uniq-key"):
            where = f"topic {topic}" if topic is not None else "any topic"
            kind = "UNIQ_KEY" if mode == "uniq-key" else "key"
            note(f"no message of {where} has {kind} {clipped(key or uniq_key or '')}")
            if uniq_key is not None and _hex_in_lower_case(uniq_key):
                note(
                    "unique keys compare case by case, and producers write them in upper-case "
                    f"hex: try --uniq-key {clipped(uniq_key.upper())} (--msg-id tries both)"
                )
            if key is not None and (pieces := split_keys(key)) and pieces != [key]:
                note(
                    "a broker indexes each piece of KEYS between spaces on its own: look one "
                    f"up, --key {clipped(pieces[0])}"
                )
            return 1
    return 0


def _hex_in_lower_case(text: str) -> bool:
    """Whether ``text`` is hex digits with some in lower case (a client id pasted in lower case)."""
    return text != text.upper() and all(c in HEX_DIGITS for c in text)


def _stream_lines(
    store: Store,
    reader: MessageReader,
    from_offset: int,
    count: int | None,
    body_mode: str,
    layout: DelimitedLayout | None,
    selection: MessageSelection | None,
    seek: bool,
    no_progress: bool,
    write: Callable[[Iterable[TextBlock]], None],
) -> None:
    """``read --from-offset N`` with --jsonl, --json, --csv or --tsv: the lines (or the rows
    of ``layout``) of the messages ``selection`` keeps (all without one), written by the
    record kernel a block at a time (the same text :func:`document_json` gives of each
    message document), handed to ``write`` with the progress told as they go."""
    total = store.commitlog.data_extent() - from_offset
    with progress_bar("reading", total, not no_progress) as update:

        def blocks() -> Iterator[TextBlock]:
            for text, messages, end in reader.sequential_lines(
                from_offset,
                count,
                body_mode=body_mode,
                layout=layout,
                selection=selection,
                seek=seek,
            ):
                yield TextBlock(text, messages)
                update(end - from_offset)

        write(blocks())


def _write_items(
    items: Iterable[TextBlock | Message],
    body_mode: str,
    as_array: bool,
    delimited: tuple[str, list[str]] | None,
) -> None:
    """Blocks of text the record kernel wrote, and messages (of blocks read one by one) as
    their text: a JSON line each (``--jsonl``), or the elements of one JSON array
    (``--json``), written as they come and closed when a read part way fails or is stopped
    (an error before the first comes before the ``[``, as elsewhere); or, ``delimited``, a
    CSV/TSV row per message (the header once the first block is in)."""
    if delimited is not None:
        _write_rows(items, body_mode, delimited)
        return
    # whole lines (elements): a stop signal waits for the line (element) in flight
    output = JsonArrayOutput() if as_array else LineOutput()
    write = output.write
    opened = False
    try:
        for item in items:
            if isinstance(item, TextBlock):
                if not item.messages:
                    continue  # a block a filter kept nothing of (it told the progress)
                block = item.text
            else:
                document = message_document(item, body_mode, _body_of(item, False))
                block = (document_json(document) + "\n").encode("utf-8")
            if as_array:  # no JSON text holds a raw newline: each one ends an element
                block = (b"[\n" if not opened else b",\n") + block[:-1].replace(b"\n", b",\n")
            opened = True
            write(block)
    except RmqStoreError:
        if as_array and opened:
            write(b"\n]\n")
        output.flush()
        raise
    except KeyboardInterrupt:  # a stop signal (SIGINT, SIGTERM, SIGHUP)
        if isinstance(output, JsonArrayOutput):
            output.close_stopped()
        raise
    if as_array:
        write(b"\n]\n" if opened else b"[\n]\n")
    output.flush()


def _write_rows(
    items: Iterable[TextBlock | Message], body_mode: str, delimited: tuple[str, list[str]]
) -> None:
    """CSV/TSV rows: the record kernel's blocks of rows as they are, and the rows of
    messages (the header once the first block is in)."""
    table: DelimitedWriter | None = None
    for item in items:
        if table is None:
            table = DelimitedWriter(*delimited)
        if isinstance(item, TextBlock):
            table.write_rows(item.text)
        else:
            table.row(message_document(item, body_mode, _body_of(item, False)))
    if table is None:
        DelimitedWriter(*delimited)  # the header of no rows


def _first_fetched(messages: Iterable[Message]) -> Iterator[Message]:
    """``messages`` with the first one read already, so that an error where they start (no
    record at the offset, a queue offset past the end) comes before anything is printed: no
    JSON array or CSV header left open on stdout."""
    iterator = iter(messages)
    for first in iterator:
        return itertools.chain((first,), iterator)
    return iter(())


def _watched(
    messages: Iterable[Message], update: Callable[[int], None], base: int
) -> Iterator[Message]:
    """``messages``, telling ``update`` how far into the log they have come."""
    for number, message in enumerate(messages):
        if not number & 0xFFF:
            update(message.physical_offset - base)
        yield message


def _mode(
    offset: int | None,
    msg_id: str | None,
    from_offset: int | None,
    topic: str | None,
    queue_id: int | None,
    queue_from: int | None,
    count: int | None,
    key: str | None,
    uniq_key: str | None,
    timestamp: int | None,
) -> str:
    """Which lookup the options ask for; a usage error unless exactly one."""
    chosen = [
        name
        for name, value in (
            ("offset", offset),
            ("msg-id", msg_id),
            ("sequential", from_offset),
            ("key", key),
            ("uniq-key", uniq_key),
            ("time", timestamp),
        )
        if value is not None
    ]
    if not chosen and topic is not None:
        chosen = ["queue" if queue_id is not None else "topic"]
    if len(chosen) != 1:
        raise click.UsageError(
            "give exactly one of --offset, --msg-id, --from-offset, "
            "--topic/--queue, --key, --uniq-key or "
            "--topic/--queue/--time"
        )
    mode = chosen[0]
    if mode in ("time", "queue") and topic is None:
        raise click.UsageError(f"--{mode} needs --topic")
    if mode in ("time", "queue") and queue_id is None:
        raise click.UsageError(f"--{mode} needs --queue")
    if count is not None and mode not in ("sequential", "queue", "topic"):
        raise click.UsageError("--count goes with --from-offset, --topic or --topic/--queue")
    if queue_from is not None and mode != "queue":
        raise click.UsageError("--from goes with --topic/--queue")
    if topic is not None and mode in ("offset", "msg-id", "sequential"):
        raise click.UsageError(
            "--topic does not go with --offset, --msg-id or --from-offset, which name a "
            "commit-log position (a queue's messages from queue offset N: --topic T --queue Q "
            "--from N)"
        )
    if queue_id is not None and mode in ("offset", "msg-id", "sequential", "key", "uniq-key"):
        raise click.UsageError("--queue goes with --topic (a consume-queue read) or --topic/--time")
    return mode


def _refuse_unused(mode: str, tags: str | None) -> None:
    """Refuse a filter or setting the mode would silently leave unused."""
    given = _given_options()
    if mode in ("offset", "msg-id", "time"):
        unused = ["--tags"] if tags is not None else []
        unused += [name for name in ("--begin", "--end") if name in given]
        if unused:
            verb = "filters" if len(unused) == 1 else "filter"
            raise click.UsageError(
                f"{'/'.join(unused)} {verb} a read of many messages: --from-offset, "
                "--topic [--queue], --key or --uniq-key"
            )
    if "--max" in given and mode not in ("key", "uniq-key"):
        raise click.UsageError("--max goes with --key or --uniq-key (--count limits other reads)")
    if "--time-rule" in given and mode != "time":
        raise click.UsageError("--time-rule goes with --time")


def _given_options() -> set[str]:
    """The options of this command line the user gave, among those with a default."""
    context = click.get_current_context()
    names = {"begin": "--begin", "end": "--end", "max_results": "--max", "time_rule": "--time-rule"}
    return {
        option
        for name, option in names.items()
        if context.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT
    }


def _warn_all(notes: list[str]) -> None:
    for text in notes:
        warn(text)


def _show_time(
    topic: str,
    queue_id: int,
    timestamp: int,
    rule: str,
    queue_offset: int,
    message: Message | None,
    body_mode: str,
    decompress: bool,
    as_json: bool,
) -> None:
    document = {
        "topic": topic,
        "queueId": queue_id,
        "timestamp": timestamp,
        "rule": rule,
        "queueOffset": queue_offset,
        "message": message_document(message, body_mode, _body_of(message, decompress))
        if message
        else None,
    }
    if as_json:
        emit_json(document)
        return
    console.print(
        Styled(
            ("queue offset", "bold"),
            f" {queue_offset} for {topic}:{queue_id} at {timestamp} "
            f"({format_millis(timestamp)}), rule {rule}",
        )
    )
    if message is not None:
        _detail_table(document["message"])


def _body_of(message: Message, decompress: bool) -> bytes | None:
    if message.body is None:
        return None
    return decompress_body(message) if decompress else message.body


def _show_one(
    message: Message, body_mode: str, decompress: bool, as_json: bool, as_jsonl: bool
) -> None:
    body = _body_of(message, decompress)
    if body_mode == "raw":
        sys.stdout.buffer.write(body or b"")
        sys.stdout.flush()
        return
    document = message_document(message, body_mode, body)
    if as_json:
        emit_json(document)
    elif as_jsonl:
        emit_jsonl(document)
    else:
        _detail_table(document)


def _show_many(
    messages: Iterable[Message], body_mode: str, decompress: bool, as_json: bool, as_jsonl: bool
) -> int:
    """Print the messages as they stream; returns how many were shown."""
    shown = 0
    if as_json:
        # one JSON array, written as it streams so memory stays flat, and closed when a
        # record part way fails or a stop signal comes (the error and exit 2, or the exit
        # code of the stop, say the array is not all there); each element in one write,
        # so that what stdout holds ends where the "]" may follow
        write_data("[")
        try:
            for message in messages:
                document = message_document(message, body_mode, _body_of(message, decompress))
                write_data(("," if shown else "") + "\n" + document_json(document))
                shown += 1
        except (RmqStoreError, KeyboardInterrupt):
            write_data("\n]\n")
            raise
        write_data("\n]\n")
        return shown
    if as_jsonl:
        for message in messages:
            emit_jsonl(message_document(message, body_mode, _body_of(message, decompress)))
            shown += 1
        return shown
    table = _DelimitedLayout(body_mode, decompress)
    chunk: list[Message] = []
    for message in messages:
        chunk.append(message)
        shown += 1
        if len(chunk) == _TABLE_CHUNK:
            table.print(chunk)
            chunk = []
    if chunk:
        table.print(chunk)
    return shown


def _detail_table(document: dict) -> None:
    table = fields_grid(wrap_values=True)
    for key, value in document.items():
        if key == "properties":
            value = "\n".join(f"{name}={text}" for name, text in value.items()) or "-"
        elif key in ("bornTimestamp", "storeTimestamp"):
            value = f"{value} ({format_millis(value)})"
        elif value is None:
            value = "-"
        table.add_row(key, str(value))
    console.print(table)


class _DelimitedLayout:
    """Messages as a table printed chunk by chunk as they stream: the header once, and the
    columns kept at least as wide as earlier chunks had them, so the lines stay aligned."""

    _COLUMNS = (
        ("offset", "right"),
        ("msgId", "left"),
        ("topic", "left"),
        ("queue", "right"),
        ("q.offset", "right"),
        ("size", "right"),
        ("stored", "left"),
        ("tags", "left"),
        ("keys", "left"),
        ("body", "left"),
    )

    def __init__(self, body_mode: str, decompress: bool) -> None:
        self.body_mode = body_mode
        self.decompress = decompress
        self.widths = [len(name) for name, _ in self._COLUMNS]
        self.printed = False

    def print(self, messages: list[Message]) -> None:
        rows = []
        for message in messages:
            value, _ = encode_body(_body_of(message, self.decompress), self.body_mode)
            rows.append(
                (
                    str(message.physical_offset),
                    message.msg_id,
                    message.topic,
                    str(message.queue_id),
                    str(message.queue_offset),
                    str(message.store_size),
                    format_millis(message.store_timestamp),
                    message.tags or "",
                    message.keys or "",
                    (value or "")[:40],
                )
            )
        table = Grid(show_header=not self.printed)
        for (name, justify), width in zip(self._COLUMNS, self.widths, strict=True):
            table.add_column(name, justify=justify, min_width=width, no_wrap=True)
        for row in rows:
            table.add_row(*row)
            self.widths = [max(w, len(cell)) for w, cell in zip(self.widths, row, strict=True)]
        console.print(table)
        self.printed = True
