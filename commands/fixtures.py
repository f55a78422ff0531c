"""``rmqstore fixtures``: deterministic clean and damaged stores for tests and CI."""

from __future__ import annotations

import functools
from pathlib import Path

import click

from rmqstore.commands.options import GivenPath, Number, jobs_option, json_option, progress_option
from rmqstore.commands.output import (
    Grid,
    Styled,
    console,
    counted,
    emit_json,
    note,
    progress_bar,
)
from rmqstore.config import (
    JAVA_INT_MAX,
    LARGEST_CONSUMEQUEUE_FILE_SIZE,
    SMALLEST_COMMITLOG_FILE_SIZE,
    SMALLEST_INDEX_ENTRIES,
    SMALLEST_INDEX_SLOTS,
)
from rmqstore.fixtures import SCENARIOS, FixtureOptions, describe, generate
from rmqstore.fixtures.plans import MAX_SEED
from rmqstore.verify.findings import where_text


@click.group("fixtures")
def command() -> None:
    """Generate deterministic RocketMQ stores, clean or damaged, for tests and CI.

    The same scenario, seed and options always give the same bytes and file names
    (timestamps, hosts, UNIQ_KEYs and index file names come from the seed). Each store gets a
    fixture.json manifest: the messages with their offsets, and for damaged scenarios where
    the damage is, what 'rmqstore verify' must report (kinds and offsets) and what a
    broker-compatible recovery must reach (valid end, records kept, queue offsets).
    """


@command.command("list")
@json_option
def list_command(as_json: bool) -> int:
    """List the scenarios with a one-line description and how many messages each stores.

    JSON: [{scenario, damaged, messages (stored at the default size), messagesRequested (the
    default --messages; some scenarios add file-end fills or transaction ops), description}].
    """
    rows = [
        {
            "scenario": s.name,
            "damaged": s.damage is not None,
            "messages": s.stored,
            "messagesRequested": s.messages,
            "description": s.description,
        }
        for s in SCENARIOS.values()
    ]
    if as_json:
        emit_json(rows)
        return 0
    table = Grid()
    for name in ("scenario", "kind", "messages", "description"):
        table.add_column(name, wrap=name == "description")
    for row in rows:
        table.add_row(
            row["scenario"],
            "damaged" if row["damaged"] else "clean",
            f"{row['messages']:,}",
            row["description"],
        )
    console.print(table)
    return 0


@command.command("generate")
@click.argument("scenario", type=click.Choice(list(SCENARIOS)), metavar="SCENARIO")
@click.argument("out", type=GivenPath(path_type=Path), metavar="OUT")
@click.option(
    "--seed",
    type=Number(min=0, max=MAX_SEED),
    default=1,
    show_default=True,
    help="Seed for everything random: bodies, keys, hosts, times (a day later per seed), damage.",
)
@click.option(
    "--messages",
    type=Number(min=1),
    metavar="N",
    help="How many messages (default: the scenario's own count); refused when their records "
    "alone would not fit in OUT's free space, and above 100,000 for a damaged scenario. A "
    "generation stopped part-way (a full disk, Ctrl-C) removes what it made.",
)
@click.option(
    "--broker-version",
    type=click.Choice(["4.9", "5"]),
    default="4.9",
    show_default=True,
    help="4.9: properties without the trailing separator, as 4.9.x writes them; 5: "
    "with it (v2 is always 5: 4.9 with it is refused).",
)
@click.option(
    "--commitlog-file-size",
    type=Number(min=SMALLEST_COMMITLOG_FILE_SIZE, max=JAVA_INT_MAX),
    metavar="BYTES",
    help="Commit-log file size (default: the scenario's).",
)
@click.option(
    "--consumequeue-file-size",
    type=Number(min=20, max=LARGEST_CONSUMEQUEUE_FILE_SIZE),
    metavar="BYTES",
    help="Consume-queue file size (default: the scenario's).",
)
@click.option(
    "--index-slots",
    type=Number(min=SMALLEST_INDEX_SLOTS, max=JAVA_INT_MAX),
    metavar="N",
    help="Index hash slots per file (default: the scenario's).",
)
@click.option(
    "--index-entries",
    type=Number(min=SMALLEST_INDEX_ENTRIES, max=JAVA_INT_MAX),
    metavar="N",
    help="Index entries per file (default: the scenario's).",
)
@click.option(
    "--force",
    is_flag=True,
    help="Replace OUT when it holds an earlier store or fixture (moved to a quarantine "
    "folder, whose restore gives it back).",
)
@jobs_option(
    "Build the consume queues and index with the commit log read in N worker "
    "processes (the same bytes; worth it for large stores)."
)
@json_option
@progress_option
def generate_command(
    scenario: str,
    out: Path,
    seed: int,
    messages: int | None,
    broker_version: str,
    commitlog_file_size: int | None,
    consumequeue_file_size: int | None,
    index_slots: int | None,
    index_entries: int | None,
    force: bool,
    jobs: int,
    as_json: bool,
    no_progress: bool,
) -> int:
    """Write scenario SCENARIO as a complete store in OUT.

    Commit log, consume queues, index, checkpoint and config/topics.json, plus
    OUT/fixture.json. OUT must be missing or empty (or --force), and not inside another
    store. The geometry used is in the manifest; pass the same --index-slots/--index-entries
    to other commands.
    """
    forced = SCENARIOS[scenario].broker_version
    given = click.get_current_context().get_parameter_source("broker_version")
    if forced and broker_version != forced and given is not click.core.ParameterSource.DEFAULT:
        raise click.UsageError(
            f"scenario {scenario} is a {forced}.x store; --broker-version {broker_version} "
            "does not go with it"
        )
    options = FixtureOptions(
        seed=seed,
        messages=messages,
        broker_version=broker_version,
        commitlog_file_size=commitlog_file_size,
        consumequeue_file_size=consumequeue_file_size,
        index_slots=index_slots,
        index_entries=index_entries,
    )
    watch = functools.partial(progress_bar, enabled=not no_progress)
    manifest = generate(scenario, out, options, force=force, workers=jobs, progress=watch)
    summary = {
        key: manifest[key]
        for key in (
            "scenario",
            "seed",
            "brokerVersion",
            "messageCount",
            "geometry",
            "commitLog",
            "damage",
        )
    }
    summary["store"] = str(out)
    summary["expect"] = manifest["expect"]
    if as_json:
        emit_json(summary)
    else:
        geometry = manifest["geometry"]
        note(
            f"wrote scenario {scenario} (seed {seed}, "
            f"{counted(manifest['messageCount'], 'message')}) "
            f"to {out}; geometry: --commitlog-file-size {geometry['commitLogFileSize']} "
            f"--consumequeue-file-size {geometry['consumeQueueFileSize']} --index-slots "
            f"{geometry['indexHashSlots']} --index-entries {geometry['indexEntries']}"
        )
        if manifest["damage"]:
            note(f"damage: {manifest['damage']['description']}")
    return 0


@command.command("describe")
@click.argument("scenario", type=click.Choice(list(SCENARIOS)), metavar="SCENARIO")
@click.argument("out", type=GivenPath(path_type=Path), metavar="OUT")
@json_option
def describe_command(scenario: str, out: Path, as_json: bool) -> int:
    """Print the manifest of scenario SCENARIO generated in OUT.

    JSON fields: scenario, description, seed, brokerVersion, messagesRequested, messageCount,
    geometry, commitLog{minOffset, maxOffset}, queueMaxOffsets, messages[{msgId, topic,
    queueId, queueOffset, commitLogOffset, storeSize, storeTimestamp, transaction, tags, keys,
    uniqKey, bodyLength}] (null above 100,000 messages), damage{file, filePosition,
    commitLogOffset, topic, queueId, queueOffset (those that apply), description},
    expect{verify[{kind, and the position fields verify must report}], recovery{validEnd,
    recordsKept, queueMaxOffsets, note}}.
    """
    manifest = describe(scenario, out)
    if as_json:
        emit_json(manifest)
        return 0
    console.print(Styled((manifest["scenario"], "bold"), f": {manifest['description']}"))
    console.print(
        f"seed {manifest['seed']}, {counted(manifest['messageCount'], 'message')}, log "
        f"{manifest['commitLog']['minOffset']:,} .. "
        f"{manifest['commitLog']['maxOffset']:,}"
    )
    if manifest["damage"]:
        damage = manifest["damage"]
        console.print(f"damage: {damage['description']} ({where_text(damage)})")
        for finding in manifest["expect"]["verify"]:
            where = where_text(finding)
            console.print(f"  verify reports {finding['kind']}" + (f" at {where}" if where else ""))
    recovery = manifest["expect"]["recovery"]
    console.print(
        f"recovery reaches {recovery['validEnd']:,} keeping "
        f"{recovery['recordsKept']:,} records: {recovery['note']}"
    )
    return 0
