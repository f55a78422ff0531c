"""``rmqstore recover``: a broker's crash recovery, offline, with a plan first."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import click

from rmqstore.commands.options import (
    json_option,
    progress_option,
    store_argument,
    store_config_options,
)
from rmqstore.commands.output import (
    Styled,
    confirm_or_refuse,
    console,
    counted,
    emit_json,
    fields_grid,
    note,
    progress_bar,
    warn,
)
from rmqstore.config import StoreConfig
from rmqstore.errors import ExitCode
from rmqstore.recovery import RecoveryPlan, RecoveryResult, apply_recovery, plan_recovery
from rmqstore.store import Store
from rmqstore.verify import VerifyOptions, verify_store


@click.command("recover")
@store_argument
@click.option(
    "--dry-run",
    is_flag=True,
    help="Only show the plan; exit 1 when there is work to do (a crash to recover from, "
    "bytes or files to cut). Opens the store read-only: no lock taken, nothing written.",
)
@click.option("--yes", is_flag=True, help="Do not ask before cutting (for scripts).")
@click.option(
    "--no-check",
    is_flag=True,
    help="Do not verify the store afterwards (a broker's start-up does not); exit 0 then "
    "says only that recovery ran.",
)
@store_config_options
@json_option
@progress_option
def command(
    store: Path,
    dry_run: bool,
    yes: bool,
    no_check: bool,
    config: StoreConfig,
    as_json: bool,
    no_progress: bool,
) -> int:
    """Recover a store after a crash, as a broker's start-up would.

    Finds the valid end of the commit log with the broker's rules (abnormal recovery when
    'abort' is present: from the file the checkpoint names, CRCs checked when
    checkCRCOnRecover; without 'abort' from the third-last file, and where the broker's next
    start would end it: once the files after the end go, that start walks the last three
    files left, earlier ones, and ends the log at damage there). Then it cuts what the
    broker cuts: the bytes after the last valid record (a torn write), commit-log files that
    start after it, each consume queue's units for records at or after it, and, as a
    broker's load of a queue does, the queue's files after an invalid unit that ends it in
    an earlier file. Index files newer than the checkpoint's indexMsgTimestamp after a
    crash, or holding entries for cut records, are rebuilt. Every cut byte is copied to
    quarantine/ first and every file is moved there, never deleted. Then it dispatches the
    log into the consume queues and index from where they end (after a crash from the file
    the recovery started from, as a broker does, skipping what they hold: a queue that lost
    its last units while others kept theirs gets them back; damage in a file that recovery
    does not walk, met while catching the index up before that file, is passed as a broker's
    crash recovery passes it, with a warning: see rmqstore dispatch), flushes, writes the
    checkpoint and removes 'abort' (it keeps 'abort', and says why, where a broker started
    without it would run its normal recovery over the last three files and cut the log at
    damage its crash recovery does not walk, deleting the records after it). A consume queue
    missing a file among its last three, with files after it, is refused (dry run too, exit
    2, nothing changed): a broker's load walks on past the gap, so its replay puts units
    elsewhere; run rmqstore dispatch --rebuild --yes first. Takes the store's lock; asks on a
    terminal before cutting.

    An error that stops it (a full disk: exit 4) is one line that says how far it got:
    "stopped before it changed the store", or "stopped part way", in which case 'abort' stays
    (a broker starting on the store runs its crash recovery, as after a crash) and the line
    names the quarantine folder; run recover again once the cause is mended.

    Afterwards the store is verified (unless --no-check), its lock still held, so no other
    writer comes between (one starting then is refused, exit 3): exit 0 when verify calls it
    sound; 1 when damage remains that recovery does not mend (it is named, with the next
    step, such as a consume queue or index corrupted before the recovery point, a bad body
    CRC in a file recovery does not walk, a missing commit-log file), when a dispatch
    problem was met, or, with --dry-run, when there is work. A consumer group's offset
    (config/consumerOffset.json) or the delay scheduler's (config/delayOffset.json) that the
    cuts leave past its queue's end is named in the plan and after the run (verify fails on
    it): messages stored there again below it may never be consumed; reset it (mqadmin
    resetOffsetByTime) before producers write. rmqstore does not write those files.

    JSON: plan{mode, logEnd, stoppedBy, cuts[{file, start, end, why}], moves[{file, why}],
    bytesCut, unitsRemoved, queuesTruncated, indexFilesRebuilt, skipped, warnings,
    offsetsPastEnd[{group (null: the delay scheduler), topic, queueId, offset, queueEnd}]}, and
    after a run: quarantine, dispatch{...as rmqstore dispatch}, checkpoint{...},
    abortRemoved, remaining{ok, findingsByKind, nextStep} (null with --no-check).
    """
    # the lock, kept from the recovery through its check: no other writer comes between
    with contextlib.ExitStack() as held:
        # a dry run opens the store read-only: it takes no lock and writes nothing
        with (Store.open_read if dry_run else Store.open_write)(store, config) as opened:
            if dry_run:
                opened.refuse_if_locked()
                opened.refuse_foreign_parts()
            with progress_bar(
                "finding the valid end", _log_size(opened), not no_progress
            ) as update:
                plan = plan_recovery(opened, progress=_relative(opened, update))
            if dry_run:
                return _show_plan(plan, as_json)
            if (plan.cuts or plan.moves) and not yes:
                confirm_or_refuse(
                    "recover",
                    f"cut {counted(plan.bytes_cut, 'byte')} and move "
                    f"{counted(len(plan.moves), 'file')} to quarantine "
                    f"(the log ends at {plan.log_end:,})",
                )
            if not no_check:
                held.callback(opened.keep_lock().release)
            total = max(1, plan.log_end - opened.commitlog.min_offset)
            with progress_bar("dispatching", total, not no_progress) as update:
                result = apply_recovery(opened, plan, progress=_relative(opened, update))
        abort_removed = not opened.aborted
        for text in opened.notes:
            note(text)
        for problem in [*plan.warnings, *result.dispatch.problems]:
            warn(problem)
        for offset in plan.offsets_past_end:
            warn(offset.describe())
        remaining = None
        if not no_check:
            with Store.open_read(store, config) as checked:
                remaining = verify_store(checked, VerifyOptions(max_findings=100))
            if not remaining.ok:
                kinds = ", ".join(f"{k}: {v}" for k, v in sorted(remaining.counts.items()))
                step = remaining.next_step(str(store))
                warn(
                    f"after recovery, verify still finds {kinds}; next step: "
                    + (step or f"{remaining.no_step_reason()} (rmqstore verify says more)")
                )
    if as_json:
        after = None
        if remaining is not None:
            report = remaining.to_dict(str(store))
            after = {key: report[key] for key in ("ok", "findingsByKind", "nextStep")}
        emit_json({**result.to_dict(), "abortRemoved": abort_removed, "remaining": after})
    else:
        _render(result, abort_removed)
    mended = abort_removed and not plan.warnings and not result.dispatch.problems
    if remaining is not None and not remaining.ok:
        mended = False
    return ExitCode.OK if mended else ExitCode.FINDINGS


def _log_size(store: Store) -> int:
    log = store.commitlog
    return log.data_extent() - log.min_offset


def _relative(store: Store, update: Callable[[int], None]) -> Callable[[int], None]:
    """A progress callback taking log offsets, for a bar counting from the first one."""
    base = store.commitlog.min_offset
    return lambda offset: update(offset - base)


def _show_plan(plan: RecoveryPlan, as_json: bool) -> int:
    if as_json:
        emit_json({"plan": plan.to_dict()})
    else:
        mode = "abnormal: abort present" if plan.abnormal else "normal"
        console.print(Styled(("recover plan", "bold"), f" ({mode})"))
        console.print(f"  valid end of the commit log: {plan.log_end:,}")
        if plan.stopped_by:
            console.print(f"  it ends at: {plan.stopped_by}")
        for cut in plan.cuts:
            console.print(
                f"  cut bytes {cut.start:,}..{cut.end:,} of {cut.path} to quarantine: {cut.reason}"
            )
        for move in plan.moves:
            console.print(f"  move to quarantine: {move.path} ({move.reason})")
        for skipped in plan.skipped:
            console.print(f"  left alone: {skipped}")
        for warning in plan.warnings:
            console.print(Styled("  ", ("cannot mend:", "yellow"), f" {warning}"))
        for offset in plan.offsets_past_end:
            left = offset.describe(" once recovered")
            console.print(Styled("  ", ("left for you:", "yellow"), f" {left}"))
        if plan.queues_truncated:
            console.print(
                f"  consume queues truncated: {plan.queues_truncated} "
                f"({counted(plan.units_removed, 'unit')})"
            )
        if plan.index_files_rebuilt:
            console.print(f"  index files rebuilt: {plan.index_files_rebuilt}")
        console.print("  then dispatch to the valid end, flush, write the checkpoint")
        if not plan.has_work:
            console.print("nothing to recover: the store was closed cleanly")
    return ExitCode.FINDINGS if plan.has_work else ExitCode.OK


def _render(result: RecoveryResult, abort_removed: bool) -> None:
    plan = result.plan
    table = fields_grid()
    table.add_row("mode", "abnormal (abort was present)" if plan.abnormal else "normal")
    table.add_row("commit log", f"ends at {plan.log_end:,}" + (
        f" ({plan.stopped_by})" if plan.stopped_by else ""))  # fmt: skip
    table.add_row(
        "cut",
        f"{counted(plan.bytes_cut, 'byte')} in {counted(len(plan.cuts), 'place')}, "
        f"{counted(len(plan.moves), 'file')}",
    )
    table.add_row(
        "consume queues",
        f"{plan.queues_truncated} truncated ({counted(plan.units_removed, 'unit')}); "
        f"{result.dispatch.units_written:,} units dispatched",
    )
    table.add_row("index", f"{counted(result.dispatch.index_entries, 'entry', 'entries')} added")
    if result.quarantine:
        table.add_row("quarantine", str(result.quarantine))
    if plan.skipped:
        table.add_row("left alone", "; ".join(plan.skipped))
    table.add_row(
        "abort",
        (
            "removed: the store is consistent"
            + (", but for what was left alone" if plan.skipped else "")
        )
        if abort_removed
        else "left in place: dispatch did not reach the valid end",
    )
    console.print(table)
