"""``rmqstore dump FILE``: one commit-log, consume-queue, index or checkpoint file on its
own."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from rmqstore.commands.options import GivenPath, Number, store_config_options
from rmqstore.commands.output import document_json, format_millis, json_text, shown, write_data
from rmqstore.config import StoreConfig
from rmqstore.errors import ExitCode
from rmqstore.filedump import (
    FileKind,
    checkpoint_items,
    commitlog_items,
    consumequeue_items,
    identify,
    index_items,
)

_A_FILE_OF = {
    FileKind.COMMITLOG: "a commit-log file",
    FileKind.CONSUMEQUEUE: "a consume-queue file",
    FileKind.INDEX: "an index file",
    FileKind.CHECKPOINT: "a checkpoint",
}


@click.command("dump")
@click.argument("file", type=GivenPath(path_type=Path), metavar="FILE")
@click.option(
    "--kind",
    type=click.Choice([kind.value for kind in FileKind]),
    help="What FILE is, when where it sits does not say (a file copied out of its store).",
)
@click.option("--no-crc", is_flag=True, help="Commit-log file: do not check body CRCs.")
@click.option(
    "--no-check",
    is_flag=True,
    help="Consume-queue file: do not look up each unit's record in the store's commit log.",
)
@click.option("--slots", "with_slots", is_flag=True, help="Index file: list the non-empty slots.")
@click.option(
    "--count",
    type=Number(min=1),
    metavar="K",
    help="Stop after K items (records, units or entries).",
)
@click.option("--jsonl", "as_jsonl", is_flag=True, help="One JSON object per item and line.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON document {file, kind, items[...], problems} (written as it goes).",
)
@store_config_options
def command(
    file: Path,
    kind: str | None,
    no_crc: bool,
    no_check: bool,
    with_slots: bool,
    count: int | None,
    as_jsonl: bool,
    as_json: bool,
    config: StoreConfig,
) -> int:
    """Print one store file on its own, item by item, like Kafka's DumpLogSegments --files.

    A commit-log file (commitlog/NAME): each record (commit-log offset, position in the file,
    size, format V1/V2, queue offset, store time, body CRC, topic:queueId), a BLANK that
    closes the file, bytes that are not a record (with where records resume), and where the
    data ends with the count of non-zero bytes after it. A consume-queue file
    (consumequeue/TOPIC/QUEUE/NAME): each unit (queue offset, commit-log offset, size,
    tagsCode), with its record looked up in the store's commit log: ok (in an LMQ queue, a
    record naming the queue in INNER_MULTI_DISPATCH, noted as a copy), missing or differs
    (--no-check skips that). An index file (index/NAME): the header, the non-empty hash
    slots with --slots, and each entry (key hash, its slot, commit-log offset, timeDiff, the
    entry it links to). The index geometry comes from --index-slots/--index-entries (or
    --broker-config) or, without them, RocketMQ's default ratio of four entries per slot.
    The checkpoint (STORE/checkpoint): physicMsgTimestamp, logicsMsgTimestamp,
    indexMsgTimestamp, the 5.x masterFlushedOffset and confirmPhyOffset, and the times a
    crash's recovery picks its first file by (minTimestamp, minTimestampIndex); a file
    shorter than 4096 bytes is read as a broker maps it, zero-filled, and is not sound.

    The kind is taken from where FILE sits in a store; --kind names it for a file elsewhere.
    JSON items have a type (record, blank, invalid, end, unit, header, slot, entry,
    checkpoint, note) and camelCase fields. Reads only. Exit 0 when every item is sound, 1
    when one is not (an invalid record, a bad CRC, non-zero bytes after the end, a unit
    whose record is missing or differs, a checkpoint cut short).
    """
    if as_json and as_jsonl:
        raise click.UsageError("--json and --jsonl exclude each other")
    target = identify(file, FileKind(kind) if kind else None)
    for flag, given, wanted in (
        ("--no-crc", no_crc, FileKind.COMMITLOG),
        ("--no-check", no_check, FileKind.CONSUMEQUEUE),
        ("--slots", with_slots, FileKind.INDEX),
    ):
        if given and target.kind is not wanted:
            raise click.UsageError(
                f"{flag} goes with {_A_FILE_OF[wanted]}; {file} is {_A_FILE_OF[target.kind]}"
            )
    if target.kind is FileKind.COMMITLOG:
        items = commitlog_items(target.path, check_crc=not no_crc)
    elif target.kind is FileKind.CHECKPOINT:
        items = checkpoint_items(target.path)
    elif target.kind is FileKind.CONSUMEQUEUE:
        items = consumequeue_items(target, config, check=not no_check)
    else:
        known = {config.sources.get(name, "default") for name in ("index_slots", "index_entries")}
        geometry = (
            (config.index_slots, config.index_entries) if known != {"default"} else (None, None)
        )
        items = index_items(target.path, *geometry, with_slots=with_slots)
    items = _limited(items, count)
    problems = 0
    if as_json:
        write_data(f'{{"file":{json_text(str(file))},"kind":"{target.kind.value}","items":[')
        for number, item in enumerate(items):
            problems += _is_problem(item)
            write_data(("," if number else "") + "\n" + document_json(item))
        write_data(f'\n],"problems":{problems}}}\n')
    elif as_jsonl:
        for item in items:
            problems += _is_problem(item)
            write_data(document_json(item) + "\n")
    else:
        # shown: a file's name, a record's topic, come from the store
        print(shown(f"{file}: {target.kind.value} file, {file.stat().st_size:,} bytes"))
        render = _RENDER[target.kind]
        for item in items:
            problems += _is_problem(item)
            print(shown(render(item)))
        if problems:
            print(f"{problems} item(s) not sound")
    return ExitCode.FINDINGS if problems else ExitCode.OK


_COUNTED = frozenset({"record", "unit", "entry"})


def _limited(items: Iterator[dict[str, Any]], count: int | None) -> Iterator[dict[str, Any]]:
    """The items up to the ``count``-th record, unit or entry (all with None)."""
    seen = 0
    for item in items:
        if count is not None and item["type"] in _COUNTED:
            if seen == count:
                return
            seen += 1
        yield item


def _is_problem(item: dict[str, Any]) -> bool:
    kind = item["type"]
    return (
        kind == "invalid"
        or (kind == "record" and item["bodyCrcOk"] is False)
        or (kind == "blank" and not item["fillsFile"])
        or (kind == "end" and item["nonZeroBytesAfter"] > 0)
        or (kind == "unit" and item["record"] in ("missing", "differs"))
        or (kind == "checkpoint" and item["shortBy"] > 0)
    )


def _commitlog_line(item: dict[str, Any]) -> str:
    kind, offset, position = item["type"], item.get("commitLogOffset"), item.get("filePosition")
    if kind == "record":
        crc = {True: "ok", False: "BAD", None: "-"}[item["bodyCrcOk"]]
        return (
            f"offset {offset} pos {position} size {item['storeSize']} V{item['version']} "
            f"{item['topic']}:{item['queueId']}#{item['queueOffset']} "
            f"sysFlag {item['sysFlag']} stored {format_millis(item['storeTimestamp'])} "
            f"body {item['bodyLength']} crc {crc}"
        )
    if kind == "blank":
        fills = "" if item["fillsFile"] else " (does NOT reach the end of the file)"
        return f"offset {offset} pos {position} BLANK of {item['storeSize']} bytes{fills}"
    if kind == "invalid":
        resumes = item["resumesAt"]
        return f"offset {offset} pos {position} INVALID: {item['reason']}; " + (
            "no record follows" if resumes is None else f"records resume at {resumes}"
        )
    if kind == "end":
        return _end_line(f"offset {offset} pos {position}", item)
    return f"note: {item['message']}"


def _end_line(where: str, item: dict[str, Any]) -> str:
    after = item["nonZeroBytesAfter"]
    return f"{where} END of data" + (f"; {after} non-zero bytes follow" if after else "")


def _unit_line(item: dict[str, Any]) -> str:
    if item["type"] == "unit":
        text = f"queueOffset {item['queueOffset']} pos {item['filePosition']} " + (
            "pre-blank"
            if item["preBlank"]
            else f"offset {item['commitLogOffset']} size {item['size']} "
            f"tagsCode {item['tagsCode']} record {item['record']}"
        )
        return text + (f" ({item['recordNote']})" if item.get("recordNote") else "")
    if item["type"] == "end":
        return _end_line(f"queueOffset {item['queueOffset']} pos {item['filePosition']}", item)
    return f"note: {item['message']}"


def _index_line(item: dict[str, Any]) -> str:
    kind = item["type"]
    if kind == "header":
        return (
            f"header: begin {format_millis(item['beginTimestamp'])} end "
            f"{format_millis(item['endTimestamp'])} offsets {item['beginPhyOffset']}.."
            f"{item['endPhyOffset']} hashSlotCount {item['hashSlotCount']} indexCount "
            f"{item['indexCount']} (geometry {item['slots']} slots, {item['entries']} entries)"
        )
    if kind == "slot":
        return f"slot {item['slot']} pos {item['filePosition']} -> entry {item['entry']}"
    if kind == "entry":
        return (
            f"entry {item['entry']} pos {item['filePosition']} hash {item['keyHash']} slot "
            f"{item['slot']} offset {item['commitLogOffset']} timeDiff {item['timeDiff']} "
            f"-> entry {item['previous']}"
        )
    return f"note: {item['message']}"


def _checkpoint_line(item: dict[str, Any]) -> str:
    if item["type"] != "checkpoint":
        return f"note: {item['message']}"
    lines = [
        f"{name:<20}{item[name]:>14}  {format_millis(item[name])}"
        for name in ("physicMsgTimestamp", "logicsMsgTimestamp", "indexMsgTimestamp")
    ]
    lines += [f"{name:<20}{item[name]:>14}" for name in ("masterFlushedOffset", "confirmPhyOffset")]
    where = (
        "  (a crash's recovery starts at the last commit-log file stored no later)",
        "  (the same, with messageIndexSafe)",
    )
    lines += [
        f"{name:<20}{item[name]:>14}  {format_millis(item[name])}{said}"
        for name, said in zip(("minTimestamp", "minTimestampIndex"), where, strict=True)
    ]
    return "\n".join(lines)


_RENDER: dict[FileKind, Callable[[dict[str, Any]], str]] = {
    FileKind.COMMITLOG: _commitlog_line,
    FileKind.CONSUMEQUEUE: _unit_line,
    FileKind.INDEX: _index_line,
    FileKind.CHECKPOINT: _checkpoint_line,
}
