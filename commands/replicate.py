"""``rmqstore replicate SOURCE DEST``: an incremental, byte-identical copy of a store."""

from __future__ import annotations

from pathlib import Path

import click

from rmqstore.commands.options import (
    GivenPath,
    Number,
    json_option,
    refuse_empty,
    store_config_options,
)
from rmqstore.commands.output import (
    console,
    counted,
    emit_json,
    emit_json_line,
    fields_grid,
    note,
)
from rmqstore.commands.signals import StopSignal
from rmqstore.config import StoreConfig
from rmqstore.replication import ReplicationRound, follow, replicate_round, source_geometry
from rmqstore.store import Store, refuse_output_inside

HA_SCHEME = "ha://"


@click.command("replicate")
@click.argument("source", metavar="SOURCE", callback=refuse_empty)
@click.argument("dest", type=GivenPath(path_type=Path), metavar="DEST")
@click.option(
    "--follow",
    "keep_following",
    is_flag=True,
    help="Keep copying as SOURCE grows (polling every --interval) until SIGINT, SIGTERM or "
    "SIGHUP (not under nohup), which stop after the round in progress, DEST sound.",
)
@click.option(
    "--interval",
    type=Number(min=10),
    default=1000,
    show_default=True,
    metavar="MS",
    help="With --follow: how often SOURCE is looked at.",
)
@click.option(
    "--until",
    type=Number(min=0),
    metavar="OFFSET",
    help="Copy only the records that end by this commit-log offset (with --follow: stop "
    "once DEST holds them all).",
)
@store_config_options
@json_option
def command(
    source: str,
    dest: Path,
    keep_following: bool,
    interval: int,
    until: int | None,
    config: StoreConfig,
    as_json: bool,
) -> int:
    """Copy SOURCE's commit log into DEST, byte for byte, and dispatch DEST's consume queues
    and index from it, as a slave broker does.

    SOURCE is a store directory, or ha://HOST:PORT, a master broker's HA port (or rmqstore
    serve-ha), spoken to as a RocketMQ slave: DEST reports its max offset (0 when empty: a
    master then sends its last file on), each frame's offset is checked against DEST's end and
    its bytes written there, and the records that are whole are dispatched (a record cut by a
    frame waits for its rest); without --follow it ends once DEST has all the master has.
    With --follow DEST is made and its lock taken first, then a connection that cannot be
    made (no master there yet, a wrong address: one line on stderr each time) or that fails
    (the master restarts, falls silent for 20 s) is made again every 5 s, as a slave broker
    does from its start; without --follow a connection that cannot be made ends the command
    (exit 4) before DEST is made. A master that breaks the protocol ends it (exit 4), DEST
    left at its last whole record; so does a master whose commit-log files are of another
    size than DEST's (the HA protocol does not say it: give DEST the master's
    mappedFileSizeCommitLog), found where it shows: an empty DEST's first frame not at a
    file's start, a frame crossing DEST's file end, or a BLANK closing a master's file
    somewhere other than DEST's file end (a slave broker so configured takes the master's
    next file into the same file, and its walk stops at that BLANK).

    A directory SOURCE is read only, even while a broker writes it: only whole, CRC-valid
    records up to its valid end are copied. DEST is created when missing or empty (a DEST
    inside SOURCE or another store is refused, exit 2); its commit-log files get SOURCE's
    names, sizes and bytes (records, BLANKs), and after every round its consume queues and
    index cover what was copied and its checkpoint says so, so verify finds it sound. A
    second run copies only what is new, from DEST's end. DEST must be a prefix of SOURCE
    (its last 64 MiB and any bytes after its end equal to SOURCE's), else nothing changes
    and the command exits 2.
    The writer's lock of DEST is taken (exit 3 when held), and 'abort' is written before a
    byte is copied, as a slave broker has it; a run stopped (killed, or a full disk: exit 4)
    before what it copied is dispatched keeps it, so a broker starting on DEST dispatches
    those records in its crash recovery: run replicate again. Consumer offsets and other
    config/*.json files are not part of the commit log and are not copied. A directory SOURCE
    whose broker keeps its consume queues in a RocksDB database or in batchconsumequeue/
    (BatchCQ topics), or with no commit-log folder, is refused (exit 2) before DEST is made:
    a replica's consume queues would not be what its broker reads.

    JSON: {source, dest, fromOffset, toOffset, sourceEnd, bytesCopied, filesCreated,
    recordsDispatched}; with --follow one such object per round and line. From ha://:
    {source, dest, fromOffset, toOffset, bytesReceived, frames, recordsDispatched}.
    """
    if source.startswith(HA_SCHEME):
        if until is not None:
            raise click.UsageError("--until is for a directory SOURCE")
        return _from_master(source, dest, keep_following, config, as_json)
    config = source_geometry(Path(source), config)
    source_dir = Path(source)
    refuse_output_inside(source_dir, dest, "DEST")
    with Store.open_write(dest, config, create=True) as opened:
        for text in opened.notes:
            note(text)
        if not keep_following:
            outcome = replicate_round(source_dir, opened, config, until=until)
            _report(source, dest, outcome, as_json, single=True)
            return 0
        stop = StopSignal()
        with stop:
            end = follow(
                source_dir,
                opened,
                config,
                interval=interval / 1000,
                should_stop=stop.requested,
                on_round=lambda outcome: _report(source, dest, outcome, as_json, single=False),
                until=until,
            )
        if stop.signal is not None:
            note(f"stopped by {stop.signal}; DEST ends at {end} and is sound")
        else:
            note(f"DEST holds every record that ends by --until {until}; it ends at {end}")
    return 0


def _from_master(
    source: str, dest: Path, keep_following: bool, config: StoreConfig, as_json: bool
) -> int:
    """DEST caught up from a master's HA port (and kept up with --follow)."""
    from rmqstore.ha import SlaveProgress, connect, follow_master, replicate_from_master
    from rmqstore.hosts import split_host_port

    address = split_host_port(source[len(HA_SCHEME) :])

    def said(progress: SlaveProgress) -> None:  # a dispatch while following
        if as_json:
            emit_json_line({"source": source, "dest": str(dest), **progress.to_dict()})
        else:
            console.print(
                f"DEST ends at {progress.whole_end}: "
                f"{counted(progress.records_dispatched, 'record')} dispatched, "
                f"{counted(progress.bytes_received, 'byte')} received"
            )

    stop = StopSignal()
    if keep_following:  # DEST is taken first and the master awaited, as a slave broker does
        with Store.open_write(dest, config, create=True) as opened, stop:
            progress = follow_master(
                address, opened, should_stop=stop.requested, on_progress=said, on_event=note
            )
    else:
        connection = connect(address)  # a master that is not there: nothing is made
        try:
            with Store.open_write(dest, config, create=True) as opened, stop:
                progress = replicate_from_master(
                    connection, opened, follow=False, should_stop=stop.requested
                )
        finally:
            connection.close()
    document = {"source": source, "dest": str(dest), **progress.to_dict()}
    if as_json and not keep_following:
        emit_json(document)
    elif not as_json:
        table = fields_grid()
        table.add_row(
            "received",
            f"{counted(progress.bytes_received, 'byte')} in {counted(progress.frames, 'frame')}",
        )
        table.add_row("dispatched", counted(progress.records_dispatched, "record"))
        table.add_row("DEST ends at", str(document["toOffset"]))
        console.print(table)
    if stop.signal is not None:
        note(f"stopped by {stop.signal}; DEST ends at {document['toOffset']} and is sound")
    return 0


def _report(
    source: str, dest: Path, outcome: ReplicationRound, as_json: bool, *, single: bool
) -> None:
    document = {"source": str(source), "dest": str(dest), **outcome.to_dict()}
    if as_json:
        if single:
            emit_json(document)
        else:
            emit_json_line(document)
        return
    if not single and not outcome.bytes_copied:
        return  # a quiet round of --follow says nothing
    table = fields_grid()
    table.add_row(
        "copied",
        f"{counted(outcome.bytes_copied, 'byte')} ({outcome.from_offset}..{outcome.to_offset})",
    )
    if outcome.files_created:
        table.add_row("new files", ", ".join(outcome.files_created))
    table.add_row("dispatched", counted(outcome.records_dispatched, "record"))
    table.add_row("DEST ends at", str(outcome.to_offset))
    console.print(table)
