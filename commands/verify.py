"""``rmqstore verify``: is the store sound, and exactly where is it not?"""

from __future__ import annotations

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
    DelimitedWriter,
    Grid,
    Styled,
    console,
    counted,
    delimited_options,
    emit_json,
    fields_grid,
    progress_bar,
    warn,
)
from rmqstore.config import StoreConfig
from rmqstore.errors import ExitCode
from rmqstore.store import Store
from rmqstore.verify import CROSS_CHECKS, KINDS, VerifyOptions, VerifyReport, verify_store
from rmqstore.verify.ranges import RangedVerify
from rmqstore.wording import quoted
from rmqstore.workers import process_runner

_STYLE = {"error": "red", "warning": "yellow", "note": "dim"}
# the columns of --csv/--tsv: every field of a finding's JSON, in its order
_FINDING_FIELDS = [
    "severity",
    "kind",
    "file",
    "filePosition",
    "commitLogOffset",
    "topic",
    "queueId",
    "queueOffset",
    "message",
    "fix",
]

_HELP = (
    """Check a store's records and cross-file consistency; exit 1 on findings.

    Records: magic, length formula, body CRC, the 5.x __CRC32# property, stored physical
    offset, properties, BLANK records, queue-offset density, bytes after the end (a finding
    when 'abort' is present, a note when not). Files: names, sizes, gaps. Consume queues: each
    unit against its record (offset, size, tagsCode), orphan units, units past the log,
    pre-blank placement, dispatch lag. Index: header, slots and chains, each entry against its
    record's keys, index lag. Checkpoint times against the data; 'abort'. Reads only.

    A store whose lock another process holds (a running broker writing it) is checked as it
    stood when verify began, with a warning: the checkpoint and 'abort' are read first, then
    the consume queues and index, then where the log's data ends (its last non-zero byte,
    the bytes before it read 50 ms later, when a record being written is whole); records
    written after are not checked. What a running broker has by design is a note, not a
    problem: 'abort', records not in their queues or index yet (one note for all queues),
    index slots and header counts its newest entries changed; a note store-live says where
    the check ended. Damage before that end is reported as ever (a record that is not whole
    there is damage, not a record being written), and the next step says to stop the
    process holding the lock first. A commit-log file the broker deletes while verify reads
    it ends the run (exit 4) with a line saying so.

    With --engine spark the commit log is
    checked in ranges on Spark executors, with the same findings (the store must be at the
    same path on every executor); with --jobs N, in N processes of this machine. A damaged
    or lagging store is checked about as fast as a sound one (the records a batch at a time,
    their units and index entries run by run); findings past --max-findings are counted,
    not listed.

    Finding kinds: """
    + ", ".join(KINDS)
    + """. Each finding names its fix (the command that mends it, or "none: report only": so
    is damage in a commit-log file before those a broker's recovery walks, which no recovery
    cuts, with what points at it and the lags after it no dispatch reaches, and a queue's
    consume-queue findings after a gap in its records' queue offsets), and the report
    ends with the next step to take. Positions mean one thing each: file (the
    store-relative file or directory) and filePosition (a byte in that file), commitLogOffset
    (a commit-log physical offset), topic/queueId/queueOffset (a consume-queue unit or
    queue); a field that does not apply is null. A finding only a rebuild mends is report
    only too when the rebuild refuses the log (a replay of it stops at damage before its
    valid end: rebuildRefusedAt is that damage's offset, else null). A consume-queue or
    index file of the wrong size puts the rebuild first (recover refuses the store until it
    is replaced), unless every consume queue has one or the index files are all one wrong
    size: then the sizes given are more likely not the broker's, and those findings are
    report only. Recover is not named when its plan refuses the store (recoverRefused says
    why): the rebuild it asks for first is, or no command. JSON: {ok, nextStep,
    rebuildRefusedAt, recoverRefused, findings[{kind, severity, file, filePosition,
    commitLogOffset, topic, queueId, queueOffset, message, fix}], findingsByKind, truncated,
    checked}. Exit 0 when
    sound (notes allowed), 1 when there are errors or warnings.
    """
)


@click.command("verify", help=_HELP)
@store_argument
@click.option("--no-crc", is_flag=True, help="Skip body CRC checks (faster).")
@click.option(
    "--commitlog-only",
    is_flag=True,
    help="Check the commit log only, not consume queues, index or checkpoint (= --only commitlog).",
)
@click.option(
    "--only",
    "only",
    multiple=True,
    type=click.Choice(["commitlog", "queues", "index"]),
    help="Check only these (repeatable): the commit log alone, or the consume queues and/or "
    "the index against it (the commit log's records are always checked).",
)
@topics_option(
    "Check consume queues (and index entries) of these topics only "
    "(repeatable); the commit log is always checked. The checkpoint's consume-queue time "
    "vouches for every queue, so it is checked only without --topic."
)
@click.option(
    "--from-offset",
    type=Number(min=0),
    metavar="N",
    help="Start the record checks at the record at physical offset N (exit 2 when none "
    "starts there; from the log's end, nothing is left to check).",
)
@click.option(
    "--max-findings",
    type=Number(min=1),
    default=1000,
    show_default=True,
    metavar="N",
    help="List at most N findings (all are counted).",
)
@engine_options(default="local")
@jobs_option()
@store_config_options
@json_option
@delimited_options(_FINDING_FIELDS, _FINDING_FIELDS, jsonl="per finding per line")
@progress_option
def command(
    store: Path,
    no_crc: bool,
    commitlog_only: bool,
    only: tuple[str, ...],
    topics: tuple[str, ...],
    from_offset: int | None,
    max_findings: int,
    engine: EngineChoice,
    jobs: int,
    config: StoreConfig,
    as_json: bool,
    delimited: tuple[str, list[str]] | None,
    no_progress: bool,
) -> int:
    """The verify command (its help text is _HELP, which lists the finding kinds)."""
    chosen = set(only)
    if "commitlog" in chosen and chosen - {"commitlog"}:
        raise click.UsageError("--only commitlog checks the commit log alone: give it alone")
    if commitlog_only and chosen - {"commitlog"}:
        raise click.UsageError(
            "--commitlog-only checks the commit log alone; it does not go with --only "
            + "/".join(sorted(chosen - {"commitlog"}))
        )
    if topics and (commitlog_only or chosen == {"commitlog"}):
        raise click.UsageError(
            "--topic picks the consume queues and index entries to check; the commit log "
            "alone (--commitlog-only) is checked whole"
        )
    options = VerifyOptions(
        check_crc=not no_crc,
        commitlog_only=commitlog_only or chosen == {"commitlog"},
        checks=frozenset(chosen) if chosen else CROSS_CHECKS,
        topics=frozenset(topics) if topics else None,
        from_offset=from_offset,
        max_findings=max_findings,
    )
    engine.check_jobs(jobs)
    # the topics whose queues were looked for (a mistyped one is said to have none)
    topics = topics if "queues" in options.cross_checks else ()
    with Store.open_read(store, config, strict_file_sizes=False) as opened:
        for text in opened.notes:
            if text != opened.foreign_log:  # a finding of the report says it
                warn(text)
        if engine.spark:
            from rmqstore.pipeline.local import PipelineOptions
            from rmqstore.spark.jobs import SparkPipeline

            pipeline = SparkPipeline(
                engine.session(),
                str(store),
                PipelineOptions.for_config(opened.config, engine.split),
            )
            report = pipeline.verify(opened, options)
            return _finish(report, as_json, store, delimited, topics)
        if jobs > 1:
            ranged = RangedVerify.for_options(opened, options, engine.split)
            report = ranged.run(process_runner(jobs))
            return _finish(report, as_json, store, delimited, topics)
        segments = opened.commitlog.segments
        base = segments[0].start if segments else 0
        total = opened.commitlog.data_extent() - base  # the data, not pre-allocated zeros
        with progress_bar("verifying", total, not no_progress) as update:
            report = verify_store(opened, options, lambda offset: update(offset - base))
    return _finish(report, as_json, store, delimited, topics)


def _finish(
    report: VerifyReport,
    as_json: bool,
    store: Path,
    delimited: tuple[str, list[str]] | None = None,
    topics: tuple[str, ...] = (),
) -> int:
    if as_json and delimited:
        raise click.UsageError("--json and --csv/--tsv exclude each other")
    if delimited:
        table = DelimitedWriter(*delimited)  # a row per finding
        for finding in report.to_dict(str(store))["findings"]:
            table.row(finding)
    elif as_json:
        emit_json(report.to_dict(str(store)))
    else:
        _render(report, topics)
        if not report.ok:
            console.print(f"next step: {_next_step(report, str(store))}")
    return ExitCode.OK if report.ok else ExitCode.FINDINGS


def _next_step(report: VerifyReport, store: str) -> str:
    """What to do about what was found, in words."""
    if report.unsettled:
        return "verify again once no other process writes the store (it changed while read)"
    step = report.next_step(store)
    if step and report.counts["store-live"]:  # the writers refuse a store whose lock is held
        return f"stop the process that holds the store's lock, then {step} (and verify again)"
    if step:
        return f"{step} (then verify again)"
    if report.by_hand is not None:
        return f"{report.by_hand} (rmqstore's writers refuse the store until then); verify again"
    if report.writers_refused and not report.counts["queue-type"]:  # the broker would start
        why = (
            "a store whose broker requires DUP_INFO"
            if report.counts["store-dup-info"]
            else "a store with queues it does not keep"
        )
        return (
            "start its broker, which recovers and dispatches the store (rmqstore's writers "
            f"refuse {why})"
        )
    return f"{report.no_step_reason()}; see the messages"


def _render(report: VerifyReport, topics: tuple[str, ...] = ()) -> None:
    checked = report.checked
    summary = fields_grid()
    summary.add_row(
        "records",
        f"{checked['records']:,} ({checked['recordBytes']:,} bytes) in "
        f"{counted(checked['commitLogFiles'], 'commit-log file')}",
    )
    if checked["consumeQueues"]:
        summary.add_row(
            "consume queues",
            f"{counted(checked['consumeQueues'], 'queue')}, "
            f"{counted(checked['units'], 'unit')} matched against records",
        )
    elif topics:  # a mistyped --topic: say that nothing of it was checked
        summary.add_row(
            "consume queues",
            f"none of {'topic' if len(topics) == 1 else 'topics'} "
            f"{', '.join(quoted(topic) for topic in sorted(set(topics)))}",
        )
    if checked["indexFiles"]:
        summary.add_row(
            "index",
            f"{counted(checked['indexFiles'], 'file')}, "
            f"{counted(checked['indexEntries'], 'entry', 'entries')}",
        )
    verdict = ("sound", "green") if report.ok else ("problems found", "red")
    counts = ", ".join(f"{k}: {v}" for k, v in sorted(report.counts.items()))
    summary.add_row("result", Styled(verdict, f" ({counts})" if counts else ""))
    console.print(summary)
    if not report.findings:
        return
    table = Grid()
    for name in ("severity", "kind", "where", "message"):
        table.add_column(name, wrap=name == "message")
    for finding in report.findings:
        style = _STYLE[finding.severity]
        table.add_row(
            Styled((finding.severity, style)),
            finding.kind,
            finding.where(),
            finding.message,
        )
    console.print(table)
    if report.truncated:
        console.print(
            f"(first {len(report.findings)} findings shown; {sum(report.counts.values())} in all)"
        )
