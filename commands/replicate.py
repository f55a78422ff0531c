"""``rmqstore replicate SOURCE DEST``: an incremental, byte-identical copy of a store."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import click

from rmqstore.commands.options import json_option, store_config_options
from rmqstore.commands.output import Grid, console, counted, emit_json, json_text, note
from rmqstore.config import StoreConfig
from rmqstore.replication import ReplicationRound, follow, replicate_round, source_geometry
from rmqstore.store import Store


@click.command("replicate")
@click.argument("source", type=click.Path(path_type=Path), metavar="SOURCE")
@click.argument("dest", type=click.Path(path_type=Path), metavar="DEST")
@click.option(
    "--follow",
    "keep_following",
    is_flag=True,
    help="Keep copying as SOURCE grows (polling every --interval) until SIGINT or SIGTERM, "
    "which stop after the round in progress, DEST sound.",
)
@click.option(
    "--interval",
    type=click.IntRange(min=10),
    default=1000,
    show_default=True,
    metavar="MS",
    help="With --follow: how often SOURCE is looked at.",
)
@click.option(
    "--until",
    type=click.IntRange(min=0),
    metavar="OFFSET",
    help="Copy only the records that end by this commit-log offset.",
)
@store_config_options
@json_option
def command(
    source: Path,
    dest: Path,
    keep_following: bool,
    interval: int,
    until: int | None,
    config: StoreConfig,
    as_json: bool,
) -> int:
    """Copy SOURCE's commit log into DEST, byte for byte, and dispatch DEST's consume queues
    and index from it, as a slave broker does.

    SOURCE is a store directory, read only, even while a broker writes it: only whole,
    CRC-valid records up to its valid end are copied. DEST is created when missing or empty;
    its commit-log files get SOURCE's names, sizes and bytes (records, BLANKs), and after every
    round its consume queues and index cover what was copied and its checkpoint says so, so
    verify finds it sound. A second run copies only what is new, from DEST's end. DEST must
    be a prefix of SOURCE (its last 64 MiB and any bytes after its end equal to SOURCE's),
    else nothing changes and the command exits 2. The writer's lock of DEST is taken (exit 3
    when held). Consumer offsets and other config/*.json files are not part of the commit log
    and are not copied.

    JSON: {source, dest, fromOffset, toOffset, sourceEnd, bytesCopied, filesCreated,
    recordsDispatched}; with --follow one such object per round and line.
    """
    config = source_geometry(source, config)
    with Store.open_write(dest, config, create=True) as opened:
        for text in opened.notes:
            note(text)
        if not keep_following:
            outcome = replicate_round(source, opened, config, until=until)
            _report(source, dest, outcome, as_json, single=True)
            return 0
        stop = _StopSignal()
        with stop:
            end = follow(
                source,
                opened,
                config,
                interval=interval / 1000,
                should_stop=stop.requested,
                on_round=lambda outcome: _report(source, dest, outcome, as_json, single=False),
                until=until,
            )
        if stop.signal is not None:
            note(f"stopped by {stop.signal}; DEST ends at {end} and is sound")
    return 0


class _StopSignal:
    """SIGINT and SIGTERM ask --follow to stop after its current round."""

    def __init__(self) -> None:
        self.signal: str | None = None
        self._previous: dict[int, Any] = {}

    def requested(self) -> bool:
        return self.signal is not None

    def _handle(self, number: int, _frame: Any) -> None:
        self.signal = signal.Signals(number).name

    def __enter__(self) -> _StopSignal:
        for number in (signal.SIGINT, signal.SIGTERM):
            self._previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)


def _report(
    source: Path, dest: Path, outcome: ReplicationRound, as_json: bool, *, single: bool
) -> None:
    document = {"source": str(source), "dest": str(dest), **outcome.to_dict()}
    if as_json:
        if single:
            emit_json(document)
        else:
            click.echo(json_text(document))
        return
    if not single and not outcome.bytes_copied:
        return  # a quiet round of --follow says nothing
    table = Grid(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row(
        "copied",
        f"{counted(outcome.bytes_copied, 'byte')} ({outcome.from_offset}..{outcome.to_offset})",
    )
    if outcome.files_created:
        table.add_row("new files", ", ".join(outcome.files_created))
    table.add_row("dispatched", counted(outcome.records_dispatched, "record"))
    table.add_row("DEST ends at", str(outcome.to_offset))
    console.print(table)
