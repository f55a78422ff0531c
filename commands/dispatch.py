"""``rmqstore dispatch``: build or resume consume queues and the index from the commit log."""

from __future__ import annotations

import contextlib
from pathlib import Path

import click

from rmqstore.commands.options import (
    EngineChoice,
    Number,
    engine_options,
    jobs_option,
    json_option,
    progress_option,
    store_argument,
    store_config_options,
    topics_option,
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
from rmqstore.consumerprogress import offsets_past_end
from rmqstore.dispatch import (
    Dispatcher,
    DispatchResult,
    RebuildPlan,
    linked_queue_problem,
    plan_dispatch,
    plan_rebuild,
    rebuilding,
)
from rmqstore.errors import ExitCode
from rmqstore.geometry import INDEX_GEOMETRY, QUEUE_GEOMETRY
from rmqstore.store import Store


@click.command("dispatch")
@store_argument
@click.option(
    "--rebuild",
    is_flag=True,
    help="Rebuild from scratch: move the existing consume queues (and index) to a new "
    "quarantine/ folder (with a copy of the checkpoint: quarantine restore undoes the "
    "rebuild), then replay the whole commit log. Asks on a terminal.",
)
@topics_option(
    "Only these topics' consume queues (repeatable). The index, shared by all "
    "topics, is then left alone, and 'abort' kept when the queues built reach past records "
    "left out (a broker would not dispatch them)."
)
@click.option(
    "--from-offset",
    type=Number(min=0),
    metavar="N",
    help="Replay from this record offset instead of where the queues and index end "
    "(what is already there is skipped, as a broker does; exit 2 when no record starts at N "
    "before the log's end).",
)
@click.option(
    "--no-index",
    is_flag=True,
    help="Build consume queues only ('abort' kept when they reach past records not indexed).",
)
@click.option(
    "--max-records",
    type=Number(min=1),
    metavar="N",
    help="Stop after N records (resume later by running dispatch again); after a crash, "
    "the records it puts again before where the queues end do not count.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Only show what would be done; exit 1 when there is work to do. Opens the store "
    "read-only: no lock taken, nothing written.",
)
@click.option(
    "--up-to-damage",
    is_flag=True,
    help="With --rebuild: rebuild even when the commit log is damaged before its valid end "
    "(in a file a broker's recovery does not walk), the queues and index then ending at the "
    "damage; without it such a rebuild is refused, exit 2, nothing changed.",
)
@click.option("--yes", is_flag=True, help="Do not ask before --rebuild (for scripts).")
@engine_options(default="local")
@jobs_option()
@store_config_options
@json_option
@progress_option
def command(
    store: Path,
    rebuild: bool,
    topics: tuple[str, ...],
    from_offset: int | None,
    no_index: bool,
    max_records: int | None,
    dry_run: bool,
    up_to_damage: bool,
    yes: bool,
    engine: EngineChoice,
    jobs: int,
    config: StoreConfig,
    as_json: bool,
    no_progress: bool,
) -> int:
    """Build consume queues and index from the commit log.

    An idempotent replay, like a broker's dispatcher: it resumes where the consume queues and
    the index end (past records that give them nothing: without UNIQ_KEY or KEYS, PREPARED,
    ROLLBACK; with --topic, other topics' records), puts NOT_TYPE/COMMIT records into
    consume queues (SCHEDULE_TOPIC_XXXX units carry the deliver time; a record naming LMQ
    queues in INNER_MULTI_DISPATCH, with the offsets its broker gave it in
    INNER_MULTI_QUEUE_OFFSET, gets a unit in each of them too, as the broker that wrote it:
    a 5.x broker leaves out %RETRY% and rmq_sys_ topics and SCHEDULE_TOPIC_XXXX, a 4.9 one,
    whose properties end without 0x02, no topic; up to an offset the broker's
    Long.parseLong refuses, where its dispatch stops for ever: a warning names such a
    record, and so does verify, dispatch-stop), indexes UNIQ_KEY and each
    KEYS piece of all but ROLLBACK records, and updates the checkpoint. Running it twice
    changes nothing; an invalid record (a torn tail) ends it. One in a file a broker's
    recovery does not walk, before the log's valid end, ends it too (a broker's dispatcher
    on a slave stops there; a master's skips the rest of the file): damage{offset, reason,
    logEnd} names it, with a warning and exit 1.
    A topic's or queue's folder in consumequeue/ that is a symbolic link is not written
    through (a warning names it at each run and dry run; --rebuild moves it to quarantine).
    Bytes after a queue's valid end (junk, a torn unit) go to quarantine/<time>-dispatch
    before units are written over them. Takes the store's lock. On a store with 'abort' (a
    crash) it starts where a broker's crash recovery does, at the file the checkpoint picks,
    so units a queue lost while others kept theirs come back before 'abort' goes; damage in
    a file that recovery does not walk, met while catching up before that file, is passed as
    the broker's crash recovery passes it: the dispatch goes on from that file, and
    damageSkipped{offset, reason, logEnd, resumedAt} names it, with a warning and exit 1
    (the records in between that the queues and index did not hold stay out); 'abort' stays
    where a broker started without it would cut the log at such damage (see rmqstore
    recover). On a store without 'abort', --topic, --no-index and --from-offset past where
    the queues end are refused, nothing changed (exit 2), when there is something to
    dispatch and the 'abort' they keep would make a broker's crash recovery (from the file
    the checkpoint picks) cut the log at damage in a file before the last three; so are
    --rebuild --topic and --rebuild --no-index (dry run too, every engine) when the queues
    end before the log does (the rebuild resets the checkpoint's consume-queue time). A
    whole dispatch leaves no 'abort'. A consume queue missing a file among its last three,
    with files after it, is refused (dry run too, exit 2, nothing changed): a broker's load
    walks on past the gap and puts units after the last file's; --rebuild mends it. An
    error that stops it once it put a unit or an index entry
    (a full disk: exit 4) leaves 'abort' in place, as a crash would (some queues may reach
    further than others or the index): the one-line error says so; run it again once the
    cause is mended. Stopped before that, it says it "stopped before it changed the store"
    and takes away the empty queue and index files and the folders it made. The units, files
    and folders it wrote are on the disk before the checkpoint moves: on Linux 5.8 and
    later, on ext4, XFS, Btrfs, F2FS or tmpfs, the queues written in one file, and the new
    queues' folders, by one syncfs of their file system when there are 64 such queues or
    more (see rmqstore flush); a queue that rolls to its next file syncs the one before
    first.

    With --rebuild --jobs N the commit log is read in ranges (--split-size) by N worker
    processes and applied here in log order: the same files and result as one pass. After a
    rebuild, a consumer group's offset (config/consumerOffset.json) past the end of a
    rebuilt queue is named in a warning (read with the lock still held, so no other writer
    comes between). A commit log damaged before its valid end (in a file a broker's
    recovery does not walk, and a broker serves the records after it) would end the replay
    at the damage, the rebuilt queues and index leaving out the records after it: such a
    rebuild is refused (exit 2, nothing changed) unless --up-to-damage;
    the dry run's plan shows the damage. A rebuild an error stops once the old files began
    to move (a full disk: exit 4) leaves 'abort' in place, as a crash would, so a broker
    starting on the store runs its crash recovery; the one-line error says so and names the
    quarantine folder: run it again once the cause is mended.

    JSON: fromOffset, toOffset, logEnd, records, unitsWritten, unitsSkipped,
    indexedRecords, indexEntries, queuesTouched, stoppedBy, problems, damage, damageSkipped
    (and plan, quarantine with --rebuild). With --dry-run: fromOffset, logEnd, behindBytes,
    maxRecords (or plan and maxRecords with --rebuild; plan.damage{offset, reason, logEnd},
    null for a sound log).
    """
    build_index = not no_index and not topics
    if engine.spark and not rebuild:
        raise click.UsageError("--engine spark works with --rebuild (a parallel rebuild)")
    if engine.spark and max_records is not None:
        raise click.UsageError("--max-records does not apply to --engine spark")
    if rebuild and from_offset is not None:
        raise click.UsageError(
            "--rebuild replays the whole commit log; --from-offset N replays from N into the "
            "consume queues and index as they are (without --rebuild)"
        )
    engine.check_jobs(jobs)
    if jobs > 1 and (not rebuild or max_records is not None):
        raise click.UsageError("--jobs works with --rebuild (and without --max-records)")
    if up_to_damage and not rebuild:
        raise click.UsageError("--up-to-damage works with --rebuild")
    if topics and not no_index:
        note("--topic: only those consume queues are built; the index is left alone")
    if dry_run:
        return _dry_run(
            store, config, rebuild, topics, build_index, from_offset, max_records, as_json
        )
    replacing = frozenset()
    if rebuild:  # the rebuilt files may take sizes other than the ones they replace
        replacing = (INDEX_GEOMETRY if build_index else frozenset()) | (
            frozenset() if topics else QUEUE_GEOMETRY
        )
    with contextlib.ExitStack() as held:  # a rebuild's lock, kept until its queues are read
        with Store.open_write(store, config, replacing=replacing) as opened:
            document: dict = {}
            if rebuild:
                plan = plan_rebuild(
                    opened,
                    topics=topics or None,
                    rebuild_index=build_index,
                    up_to_damage=up_to_damage,
                )
                document["plan"] = plan.to_dict()
                if not yes:
                    moves = ", ".join(str(path) for path in plan.moves) or "nothing"
                    upto = "" if plan.damage is None else f" up to offset {plan.damage.offset:,}"
                    confirm_or_refuse(
                        "--rebuild",
                        f"move {counted(plan.files, 'file')} ({moves}) to quarantine and "
                        f"rebuild{upto}",
                    )
                held.callback(opened.keep_lock().release)
                session = engine.session() if engine.spark else None  # before anything moves
                with rebuilding(opened, plan) as quarantine:
                    document["quarantine"] = str(quarantine)
                    if session is not None:
                        result = _rebuild_on_spark(
                            session, opened, engine, topics, build_index, plan
                        )
                    elif jobs > 1:
                        result = _rebuild_in_workers(
                            opened, engine, jobs, topics, build_index, plan, not no_progress
                        )
                    else:
                        result = _dispatch_here(
                            opened, topics, build_index, plan.from_offset, max_records, no_progress
                        )
            else:
                result = _dispatch_here(
                    opened, topics, build_index, from_offset, max_records, no_progress, check=True
                )
        if rebuild:  # rebuilt queues may end before where consumers stood (the lock held)
            with Store.open_read(store, config) as rebuilt:
                for offset in offsets_past_end(rebuilt):
                    warn(offset.describe())
    return _report(opened, result, document, as_json)


def _dry_run(
    store: Path,
    config: StoreConfig,
    rebuild: bool,
    topics: tuple[str, ...],
    build_index: bool,
    from_offset: int | None,
    max_records: int | None,
    as_json: bool,
) -> int:
    """The plan, from a read-only open: a dry run takes no lock and writes nothing."""
    with Store.open_read(store, config) as opened:
        opened.refuse_if_locked()
        opened.refuse_foreign_parts()
        if rebuild:
            plan = plan_rebuild(
                opened, topics=topics or None, rebuild_index=build_index, up_to_damage=True
            )
            return _show_plan({"plan": plan.to_dict(), "maxRecords": max_records}, as_json)
        linked: list[Path] = []
        start, end = plan_dispatch(
            opened,
            topics=topics or None,
            build_index=build_index,
            from_offset=from_offset,
            linked=linked,
        )
        for link in linked:  # as the dispatch names them
            warn(linked_queue_problem(link))
        document = {
            "fromOffset": start,
            "logEnd": end,
            "behindBytes": max(0, end - start),
            "maxRecords": max_records,
        }
        return _show_plan(document, as_json, work=end > start)


def _dispatch_here(
    store: Store,
    topics: tuple[str, ...],
    build_index: bool,
    from_offset: int | None,
    max_records: int | None,
    no_progress: bool,
    check: bool = False,
) -> DispatchResult:
    """Dispatch in this process (``check``: a --from-offset must be a record's start)."""
    dispatcher = Dispatcher(store, topics=topics or None, build_index=build_index)
    try:
        base = dispatcher.start_offset(from_offset)
        # the bar's length: where the data ends roughly (the walk finds the valid end itself)
        total = max(1, store.commitlog.data_extent() - base)
        with progress_bar("dispatching", total, not no_progress) as update:
            return dispatcher.run(
                from_offset,
                check_start=check and from_offset is not None,
                max_records=max_records,
                progress=lambda offset: update(offset - base),
            )
    finally:
        dispatcher.close()


def _rebuild_on_spark(
    session: object,
    store: Store,
    engine: EngineChoice,
    topics: tuple[str, ...],
    build_index: bool,
    plan: RebuildPlan,
) -> DispatchResult:
    from rmqstore.pipeline.local import PipelineOptions
    from rmqstore.spark.jobs import SparkPipeline

    pipeline = SparkPipeline(
        session, str(store.root), PipelineOptions.for_config(store.config, engine.split)
    )
    return pipeline.rebuild(
        store,
        from_offset=plan.from_offset,
        topics=frozenset(topics) or None,
        build_index=build_index,
    )


def _rebuild_in_workers(
    store: Store,
    engine: EngineChoice,
    jobs: int,
    topics: tuple[str, ...],
    build_index: bool,
    plan: RebuildPlan,
    show_progress: bool,
) -> DispatchResult:
    from rmqstore.pipeline.rebuild import rebuild_in_workers  # worker processes: only here

    base = plan.from_offset
    total = max(1, store.commitlog.data_extent() - base)  # the workers find the valid end
    with progress_bar("dispatching", total, show_progress) as update:
        return rebuild_in_workers(
            store,
            from_offset=base,
            topics=frozenset(topics) or None,
            build_index=build_index,
            workers=jobs,
            split=engine.split,
            progress=lambda offset: update(min(offset, base + total) - base),
        )


def _report(store: Store, result: DispatchResult, document: dict, as_json: bool) -> int:
    for text in store.notes:
        note(text)
    for problem in result.problems:
        warn(problem)
    document.update(result.to_dict())
    if as_json:
        emit_json(document)
    else:
        _render(result, document.get("quarantine"))
    damaged = result.damage is not None or result.damage_skipped is not None
    return ExitCode.FINDINGS if damaged else ExitCode.OK


def _show_plan(document: dict, as_json: bool, work: bool = True) -> int:
    if as_json:
        emit_json(document)
    else:
        plan = document.get("plan")
        most = document.get("maxRecords")
        limit = "" if most is None else f", stopping after {counted(most, 'record')}"
        if plan:
            console.print(Styled(("dispatch --rebuild plan", "bold")))
            for path in plan["quarantine"]:
                console.print(f"  move to quarantine: {path}")
            console.print(
                f"  files: {plan['files']}; reset checkpoint: {', '.join(plan['resetCheckpoint'])}"
            )
            console.print(f"  then dispatch from offset {plan['dispatchFrom']}{limit}")
            damage = plan["damage"]
            if damage is not None:
                warning = (
                    f"the commit log is damaged at offset {damage['offset']:,} "
                    f"({damage['reason']}), before its valid end at {damage['logEnd']:,}: "
                    "the replay would stop there; refused unless --up-to-damage"
                )
                console.print(Styled("  ", (warning, "yellow")))
        else:
            console.print(
                f"would dispatch {document['behindBytes']:,} bytes of the commit log "
                f"(offsets {document['fromOffset']:,} .. {document['logEnd']:,}){limit}"
            )
    return ExitCode.FINDINGS if work else ExitCode.OK


def _render(result: DispatchResult, quarantine: str | None) -> None:

    table = fields_grid()
    table.add_row(
        "records",
        f"{result.records:,} (offsets {result.from_offset:,} .. "
        f"{result.to_offset:,}; log ends at {result.log_end:,})",
    )
    table.add_row(
        "consume queue units",
        f"{result.units_written:,} written, "
        f"{result.units_skipped:,} already there, {result.queues_touched} queues",
    )
    table.add_row(
        "index",
        f"{counted(result.index_entries, 'entry', 'entries')} for "
        f"{counted(result.index_records, 'record')}",
    )
    if quarantine:
        table.add_row("old files", f"moved to {quarantine}")
    if result.stopped_by:
        table.add_row("log ends with", result.stopped_by)
    console.print(table)
