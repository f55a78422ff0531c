"""``rmqstore flush``: force a store's files to disk and write its checkpoint."""

from __future__ import annotations

from pathlib import Path

import click

from rmqstore.commands.options import json_option, store_argument, store_config_options
from rmqstore.commands.output import (
    console,
    counted,
    emit_json,
    fields_grid,
    format_millis,
    note,
)
from rmqstore.config import StoreConfig
from rmqstore.flush import FlushResult, flush_store
from rmqstore.store import Store


@click.command("flush")
@store_argument
@store_config_options
@json_option
def command(store: Path, config: StoreConfig, as_json: bool) -> int:
    """Force commit log, consume queues and index to disk, then write the checkpoint.

    Every file under commitlog/, consumequeue/ and index/ is fsynced (on Linux 5.8 and
    later, on ext4, XFS, Btrfs, F2FS or tmpfs, the consume queues of one file and the
    queues' folders by one syncfs of their file system instead of an fsync each), then the
    checkpoint gets what is on disk:
    physicMsgTimestamp = store time of the last valid record, logicsMsgTimestamp = store
    time of the newest record in the consume queues, indexMsgTimestamp = end time of the
    last full index file. A checkpoint a crash cut short
    is read as a broker reads it (the bytes it holds, then zeros) and written whole; one
    longer than 4096 bytes is refused (exit 2). 'abort' is left as it is (run rmqstore
    recover for a crashed store), and while it is there the three times do not move forward
    (they are lowered only where the files hold less): a broker's crash recovery replays the
    commit log from the file they pick, giving back consume-queue units and index entries
    the crash lost, and times moved up to what the queues hold would skip that. Takes the
    store's lock.

    JSON: files, bytes, logEnd, checkpointBefore, checkpoint, abortPresent.
    """
    with Store.open_write(store, config) as opened:
        result = flush_store(opened)
    if result.abort_present:
        note(
            "'abort' is present: the store was not closed cleanly, so the checkpoint's times "
            "were kept where its crash recovery replays from; run rmqstore recover"
        )
    if as_json:
        emit_json(result.to_dict())
    else:
        _render(result)
    return 0


def _render(result: FlushResult) -> None:
    table = fields_grid()
    table.add_row("flushed", f"{counted(result.files, 'file')}, {counted(result.bytes, 'byte')}")
    table.add_row("commit log ends at", f"{result.log_end:,}")
    checkpoint = result.checkpoint_after
    for name, value in (
        ("physicMsgTimestamp", checkpoint.physic_msg_timestamp),
        ("logicsMsgTimestamp", checkpoint.logics_msg_timestamp),
        ("indexMsgTimestamp", checkpoint.index_msg_timestamp),
    ):
        table.add_row(name, format_millis(value))
    console.print(table)
