"""``rmqstore quarantine``: list and purge the folders of cut bytes under STORE/quarantine."""

from __future__ import annotations

from pathlib import Path

import click

from rmqstore.commands.options import json_option, store_argument
from rmqstore.commands.output import Grid, confirm_or_refuse, console, counted, emit_json, note
from rmqstore.errors import ExitCode
from rmqstore.quarantine import (
    QuarantineFolder,
    RestoreStep,
    list_quarantine,
    plan_purge,
    plan_restore,
    purge_quarantine,
    restore_quarantine,
)
from rmqstore.store import Store


@click.group("quarantine")
def command() -> None:
    """The bytes rmqstore cut out of a store (recover, dispatch --rebuild, a dispatch or append
    writing over stale bytes, fixtures generate --force over an old store, a restore setting aside
    what it replaces), kept in STORE/quarantine/<time>-<operation>/ with a manifest.json naming
    where each piece came from: list them, restore one, purge them."""


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
    deletes bytes. Takes the store's lock (refuses a store a broker holds). Each folder is
    renamed out of the list before its files are deleted: a purge killed part way leaves
    no folder that looks restorable with pieces missing (the next operation that makes,
    restores or purges a folder removes what it left).

    JSON: purged[names], bytes.
    """
    if bool(names) == everything:
        raise click.UsageError("give the folder NAMEs to purge, or --all")
    with Store.open_read(store):  # refuses what is not a store
        chosen, size = plan_purge(store, None if everything else list(names))
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
    with Store.open_write(store, only_quarantine=True):  # the lock, as a writer takes it
        freed = purge_quarantine(store, chosen) if chosen else 0
    if as_json:
        emit_json({"purged": chosen, "bytes": freed})
    else:
        note(f"deleted {counted(len(chosen), 'folder')} ({counted(freed, 'byte')})")
    return ExitCode.OK


@command.command("restore")
@store_argument
@click.argument("name", metavar="NAME")
@click.option("--dry-run", is_flag=True, help="Only show what would go back (exit 1 if any).")
@click.option("--yes", is_flag=True, help="Do not ask before restoring (for scripts).")
@json_option
def restore_command(store: Path, name: str, dry_run: bool, yes: bool, as_json: bool) -> int:
    """Put quarantine folder NAME back where its pieces came from: moved files and folders
    are moved back, cut byte ranges written back, then the emptied folder is removed.
    Refuses, before changing anything, a piece whose place is taken by what the operation
    did not make (a path that exists again, a range written since it was cut) and a piece
    missing from the folder or shorter or longer than its range. A restore that stopped
    part-way (a full disk, a kill) is finished by running it again: pieces already back are
    left out. A file in the folder that the manifest does not list (a kill between moving it
    there and listing it) goes back by its path too. What the operation made in the pieces'
    places or beside them (the queues and index a dispatch --rebuild rebuilt, the index files
    recover rebuilt, the checkpoint both wrote, an abort one left) is first moved into a new
    quarantine folder, <time>-restore, whose own restore undoes this one. The commit log,
    consume queues, index, checkpoint and abort are then as they were before the operation
    (recover and dispatch --rebuild keep copies of the checkpoint and abort), but for the
    units it dispatched after where queues ended (they index records the log holds): a torn
    tail put back is under abort again, for a broker's start or rmqstore recover. Takes the
    store's lock.

    JSON: restored[{kind (set aside, move back, write back), target, start, end}]
    (wouldRestore with --dry-run), setAsideIn (the new folder, or null).
    """
    if dry_run:
        with Store.open_read(store):
            steps = plan_restore(store, name)
        if as_json:
            emit_json({"restored": [], "wouldRestore": [s.to_dict() for s in steps]})
        else:
            for step in steps:
                note(f"would {step.kind} {step.target}")
        return ExitCode.FINDINGS if steps else ExitCode.OK
    with Store.open_write(store, only_quarantine=True):  # the lock, as a writer takes it
        steps = plan_restore(store, name)
        if steps and not yes:
            confirm_or_refuse("quarantine restore", _what_restore_does(steps))
        outcome = restore_quarantine(store, name)
    if as_json:
        emit_json(
            {
                "restored": [s.to_dict() for s in outcome.steps],
                "setAsideIn": str(outcome.set_aside_in) if outcome.set_aside_in else None,
            }
        )
    else:
        if outcome.set_aside_in is not None:
            note(f"what {name} replaced is now in {outcome.set_aside_in}")
        note(f"{_what_restore_does(outcome.steps)}; run rmqstore verify {store}")
    return ExitCode.OK


def _what_restore_does(steps: list[RestoreStep]) -> str:
    aside = sum(step.kind == "set aside" for step in steps)
    back = f"put {counted(len(steps) - aside, 'piece')} back"
    if not aside:
        return back
    return f"set aside {counted(aside, 'path')} the operation made, then {back}"


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
