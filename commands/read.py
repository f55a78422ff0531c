"""``rmqstore read``: messages by physical offset, offset message id, or sequentially."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

import click
from rich.table import Table

from rmqstore.commands.options import (
    json_option,
    jsonl_option,
    store_argument,
    store_config_options,
)
from rmqstore.commands.output import (
    BODY_MODES,
    console,
    emit_json,
    emit_jsonl,
    encode_body,
    format_millis,
    json_text,
    message_document,
    warn,
)
from rmqstore.config import StoreConfig
from rmqstore.reader import MessageReader
from rmqstore.record import BodyMode, Message, decompress_body
from rmqstore.store import Store

_TABLE_CHUNK = 100


@click.command("read")
@store_argument
@click.option(
    "--offset",
    type=click.IntRange(min=0),
    metavar="N",
    help="The message starting at commit-log (physical) offset N.",
)
@click.option(
    "--msg-id",
    metavar="ID",
    help="The message named by an offset message id (32 or 56 hex digits).",
)
@click.option(
    "--from-offset",
    type=click.IntRange(min=0),
    metavar="N",
    help="Read sequentially from the record starting at physical offset N.",
)
@click.option(
    "--count",
    type=click.IntRange(min=1),
    metavar="K",
    help="With --from-offset: at most K messages (default: to the end of the log).",
)
@click.option(
    "--body",
    "body_mode",
    type=click.Choice(BODY_MODES),
    default="auto",
    show_default=True,
    help="How to show bodies: auto (UTF-8 text, else base64), text, hex, base64, "
    "none, or raw (the bytes alone on stdout; one message only).",
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
def command(
    store: Path,
    offset: int | None,
    msg_id: str | None,
    from_offset: int | None,
    count: int | None,
    body_mode: str,
    decompress: bool,
    verify_crc: bool,
    config: StoreConfig,
    as_json: bool,
    as_jsonl: bool,
) -> int:
    """Read messages from the commit log.

    Exactly one of --offset, --msg-id or --from-offset. Reads only; a message is found only
    below the valid end of the log, as with the broker's lookMessageByOffset.

    Fields use RocketMQ's names: msgId, topic, queueId, queueOffset, commitLogOffset,
    storeSize, bodyCRC, flag, sysFlag, bornTimestamp, bornHost, storeTimestamp, storeHost,
    reconsumeTimes, preparedTransactionOffset, properties, tags, keys, uniqKey, bodyLength,
    version, body,
    bodyEncoding (text, text-lossy, hex or base64).
    """
    modes = [
        name
        for name, value in (
            ("--offset", offset),
            ("--msg-id", msg_id),
            ("--from-offset", from_offset),
        )
        if value is not None
    ]
    if len(modes) != 1:
        raise click.UsageError("give exactly one of --offset, --msg-id or --from-offset")
    if count is not None and from_offset is None:
        raise click.UsageError("--count goes with --from-offset")
    if as_json and as_jsonl:
        raise click.UsageError("--json and --jsonl exclude each other")
    body = (
        BodyMode.SKIP if body_mode == "none" else (BodyMode.VERIFY if verify_crc else BodyMode.READ)
    )
    with Store.open_read(store, config) as opened:
        for message in opened.notes:
            warn(message)
        reader = MessageReader(opened)
        if from_offset is not None:
            if body_mode == "raw":
                raise click.UsageError("--body raw shows one message; use --offset or --msg-id")
            messages = reader.sequential(from_offset, count, body=body)
            _show_many(messages, body_mode, decompress, as_json, as_jsonl)
            for message in reader.notes:
                warn(message)
            return 0
        if msg_id is not None:
            message = reader.by_msg_id(msg_id, body=body)
        else:
            assert offset is not None
            message = reader.by_offset(offset, body=body)
        for text in reader.notes:
            warn(text)
        _show_one(message, body_mode, decompress, as_json, as_jsonl)
    return 0


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
) -> None:
    if as_json:
        # one JSON array, written as it streams so memory stays flat
        sys.stdout.write("[")
        for index, message in enumerate(messages):
            document = message_document(message, body_mode, _body_of(message, decompress))
            sys.stdout.write(("," if index else "") + "\n")
            sys.stdout.write(json_text(document))
        sys.stdout.write("\n]\n")
        return
    if as_jsonl:
        for message in messages:
            emit_jsonl(message_document(message, body_mode, _body_of(message, decompress)))
        return
    chunk: list[Message] = []
    for message in messages:
        chunk.append(message)
        if len(chunk) == _TABLE_CHUNK:
            _summary_table(chunk, body_mode, decompress)
            chunk = []
    if chunk:
        _summary_table(chunk, body_mode, decompress)


def _detail_table(document: dict) -> None:
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for key, value in document.items():
        if key == "properties":
            value = "\n".join(f"{name}={text}" for name, text in value.items()) or "-"
        elif key in ("bornTimestamp", "storeTimestamp"):
            value = f"{value} ({format_millis(value)})"
        elif value is None:
            value = "-"
        table.add_row(key, str(value))
    console.print(table)


def _summary_table(messages: list[Message], body_mode: str, decompress: bool) -> None:
    table = Table()
    for name, justify in (
        ("offset", "right"),
        ("topic", "left"),
        ("queue", "right"),
        ("q.offset", "right"),
        ("size", "right"),
        ("stored", "left"),
        ("tags", "left"),
        ("keys", "left"),
        ("body", "left"),
    ):
        table.add_column(
            name,
            justify=justify,
            overflow="ellipsis",  # type: ignore[arg-type]
            max_width=40 if name == "body" else None,
        )
    for message in messages:
        value, _ = encode_body(_body_of(message, decompress), body_mode)
        table.add_row(
            str(message.physical_offset),
            message.topic,
            str(message.queue_id),
            str(message.queue_offset),
            str(message.store_size),
            format_millis(message.store_timestamp),
            message.tags or "",
            message.keys or "",
            (value or "")[:80],
        )
    console.print(table)
