"""``rmqstore quarantine``: list and purge the folders of cut bytes under STORE/quarantine."""

from __future__ import annotations

from pathlib import Path

import click

from rmqstore.commands.options import json_option, store_argument
from rmqstore.commands.output import Grid, confirm_or_refuse, console, counted, emit_json, note
from rmqstore.errors import ExitCode
from rmqstore.quarantine import QuarantineFolder, list_quarantine, purge_quarantine
from rmqstore.store import Store


@click.group("quarantine")
def command() -> None:
    """The bytes rmqstore cut out of a store (recover, dispatch --rebuild, append over stale
    bytes), kept in STORE/quarantine/<time>-<operation>/ with a manifest.json naming where each
    piece came from."""


@command.command("list")
@store_argument
@json_option
def list_command(store: Path, as_json: bool) -> int:
    """List the quarantine folders, oldest first, with what made them and their sizes.

    JSON: folders[{name, operation, created, pieces, bytes, manifestOk}], bytes.
    """
    with Store.open_read(store):  # refuses what is not a store
        folders = list_quarantine(store)
    if as_json:
        emit_json(
            {
                "folders": [folder.to_dict() for folder in folders],
                "bytes": sum(f.bytes for f in folders),
            }
        )
        return ExitCode.OK
    _render(folders)
    return ExitCode.OK


@command.command("purge")
@store_argument
@click.argument("names", nargs=-1, metavar="[NAME]...")
@click.option("--all", "everything", is_flag=True, help="Every quarantine folder.")
@click.option("--dry-run", is_flag=True, help="Only say what would be deleted (exit 1 if any).")
@click.option("--yes", is_flag=True, help="Do not ask before deleting (for scripts).")
@json_option
def purge_command(
    store: Path, names: tuple[str, ...], everything: bool, dry_run: bool, yes: bool, as_json: bool
) -> int:
    """Delete quarantine folders NAME... (or --all) for good: the only rmqstore command that
    deletes bytes. Takes the store's lock (refuses a store a broker holds).

    JSON: purged[names], bytes.
    """
    if bool(names) == everything:
        raise click.UsageError("give the folder NAMEs to purge, or --all")
    with Store.open_read(store):  # refuses what is not a store
        folders = list_quarantine(store)
    chosen = [f.name for f in folders] if everything else list(names)
    size = sum(f.bytes for f in folders if f.name in chosen)
    if dry_run:
        if as_json:
            emit_json({"purged": [], "wouldPurge": chosen, "bytes": size})
        else:
            note(f"would delete {counted(len(chosen), 'folder')} ({counted(size, 'byte')})")
        return ExitCode.FINDINGS if chosen else ExitCode.OK
    if chosen and not yes:
        confirm_or_refuse(
            "quarantine purge",
            f"delete {counted(len(chosen), 'quarantine folder')} "
            f"({counted(size, 'byte')}) for good",
        )
    with Store.open_write(store):  # the store's lock, as a writer takes it
        freed = purge_quarantine(store, chosen) if chosen else 0
    if as_json:
        emit_json({"purged": chosen, "bytes": freed})
    else:
        note(f"deleted {counted(len(chosen), 'folder')} ({counted(freed, 'byte')})")
    return ExitCode.OK


def _render(folders: list[QuarantineFolder]) -> None:
    if not folders:
        note("no quarantine folders")
        return
    table = Grid()
    for name, justify in (
        ("name", "left"),
        ("operation", "left"),
        ("created (UTC)", "left"),
        ("pieces", "right"),
        ("bytes", "right"),
    ):
        table.add_column(name, justify=justify)
    for folder in folders:
        table.add_row(
            folder.name,
            folder.operation,
            folder.created,
            str(folder.pieces) if folder.manifest_ok else "? (no manifest)",
            f"{folder.bytes:,}",
        )
    console.print(table)
