"""``rmqstore append``: append messages to a store's commit log, as a broker would."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import click

from rmqstore.batch import (
    TRANSACTION_TYPES,
    AppendJob,
    FlushPolicy,
    MessageDefaults,
    build_message,
    compressed_bodies,
    longest_line,
    messages_from_lines,
    read_line_blocks,
    read_lines,
)
from rmqstore.commands.options import (
    Number,
    json_option,
    jsonl_option,
    refuse_empty,
    refuse_empty_text,
    store_argument,
    store_config_options,
)
from rmqstore.commands.output import console, emit_json, note, warn, write_whole_lines
from rmqstore.commitlog import AppendResult
from rmqstore.config import StoreConfig
from rmqstore.dispatch import Dispatcher
from rmqstore.errors import InputError, MessageTooLargeError, OutputClosedError
from rmqstore.hosts import parse_host
from rmqstore.kernel.layout import LINES_JSONL, LINES_PLAIN
from rmqstore.msgid import UniqKeyGenerator
from rmqstore.record import Message
from rmqstore.segments import read_given_file
from rmqstore.store import Store
from rmqstore.wording import quoted


def _parse_property(
    _ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]
) -> dict[str, str]:
    properties: dict[str, str] = {}
    for item in values:
        name, separator, value = item.partition("=")
        if not separator or not name:
            raise click.BadParameter(f"{quoted(item)} is not NAME=VALUE")
        properties[name] = value
    return properties


@click.command("append")
@store_argument
@click.option(
    "--topic",
    callback=refuse_empty_text("a topic name"),
    help="Topic (RocketMQ rules: letters, digits, %, |, -, _).",
)
@click.option(
    "--queue",
    "queue_id",
    type=Number(0, (1 << 31) - 1),
    default=0,
    show_default=True,
    help="Queue id.",
)
@click.option("--tags", help="TAGS property (its Java hash is the consume-queue tagsCode).")
@click.option("--keys", help="KEYS property: space-separated keys, each indexed.")
@click.option(
    "--property",
    "properties",
    multiple=True,
    callback=_parse_property,
    metavar="NAME=VALUE",
    help="A user property; repeat for more.",
)
@click.option(
    "--flag",
    type=Number(-(1 << 31), (1 << 31) - 1),
    default=0,
    help="The producer's flag int.",
)
@click.option("--body", help="Message body as text (UTF-8).")
@click.option(
    "--body-file",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="Message body: the bytes of this file (read no further than maxMessageSize: a "
    "longer one is refused).",
)
@click.option(
    "--input",
    "input_path",
    metavar="FILE|-",
    callback=refuse_empty,
    help="Append one message per JSON line of FILE (- for stdin). Fields: topic, "
    "queueId, tags, keys, properties, body or bodyBase64, flag, bornTimestamp, "
    "bornHost, reconsumeTimes, transaction, preparedTransactionOffset; the "
    "options above are defaults for missing fields. A line longer than any message of at "
    "most maxMessageSize takes as JSON (6 x maxMessageSize + 1 MiB) is refused once that "
    "much of it is read.",
)
@click.option(
    "--born-host",
    default="127.0.0.1:0",
    show_default=True,
    help="Producer address HOST:PORT ([v6]:PORT for IPv6).",
)
@click.option(
    "--transaction",
    type=click.Choice(list(TRANSACTION_TYPES)),
    default="none",
    help="Transaction type bits: prepared and rollback records get queue offset 0 "
    "and no consume-queue unit.",
)
@click.option(
    "--prepared-offset",
    type=Number(0, (1 << 63) - 1),
    default=0,
    help="preparedTransactionOffset (commit/rollback of a half message).",
)
@click.option(
    "--flush",
    type=click.Choice(["async", "sync"]),
    help="sync (flushDiskType=SYNC_FLUSH): report a message only after an fsync covering it "
    "(group commit); async (ASYNC_FLUSH, the default unless the broker config says "
    "SYNC_FLUSH): flush every --flush-interval when --flush-least-pages are dirty, everything "
    "every --flush-thorough-interval, and at the end; each message is reported after the "
    "flush that covers it.",
)
@click.option(
    "--flush-interval",
    type=Number(min=1),
    metavar="MS",
    help="ASYNC_FLUSH: how often to flush (flushIntervalCommitLog, default 500).",
)
@click.option(
    "--flush-least-pages",
    type=Number(min=0),
    metavar="N",
    help="ASYNC_FLUSH: flush only when N 4 KiB pages are dirty (flushCommitLogLeastPages, "
    "default 4).",
)
@click.option(
    "--flush-thorough-interval",
    type=Number(min=1),
    metavar="MS",
    help="ASYNC_FLUSH: flush whatever is dirty this often (flushCommitLogThoroughInterval, "
    "default 10000).",
)
@click.option(
    "--transient-store-pool",
    is_flag=True,
    default=None,
    help="Stage records in memory and write them to the file every --commit-interval "
    "(transientStorePoolEnable; ASYNC_FLUSH only): what is staged and not yet written is "
    "lost in a crash, as with a broker.",
)
@click.option(
    "--commit-interval",
    type=Number(min=1),
    metavar="MS",
    help="Transient store pool: how often staged records are written (commitIntervalCommitLog, "
    "default 200).",
)
@click.option(
    "--commit-least-pages",
    type=Number(min=0),
    metavar="N",
    help="Transient store pool: write only when N pages are staged (commitCommitLogLeastPages, "
    "default 4; all of them every commitCommitLogThoroughInterval, default 200 ms).",
)
@click.option(
    "--preallocate",
    is_flag=True,
    default=None,
    help="Allocate every block of a new commit-log file when it is created "
    "(warmMapedFileEnable); by default files are sparse and blocks are reserved as written.",
)
@click.option(
    "--dispatch",
    "dispatch_after",
    is_flag=True,
    help="Also put the appended messages into consume queues and the index, as a broker's "
    "dispatcher would (then 'abort' is removed at the end).",
)
@click.option(
    "--create",
    is_flag=True,
    help="Create a new store if STORE is missing or an empty directory (not inside another store).",
)
@click.option(
    "--store-host",
    help="Broker address HOST:PORT written as STOREHOST; default: "
    "brokerIP1:listenPort, else the last record's, else "
    "127.0.0.1:10911.",
)
@click.option(
    "--record-version",
    type=click.Choice(["auto", "v1"]),
    default="auto",
    show_default=True,
    help="auto: V1 records, V2 only where 5.x writes them (%RETRY% topics over 127 "
    "characters); v1: refuse such topics (for 4.x brokers).",
)
@click.option(
    "--no-uniq-key", is_flag=True, help="Do not generate a UNIQ_KEY for messages that lack one."
)
@click.option(
    "--compress-over",
    type=Number(min=1),
    metavar="BYTES",
    help="Compress each body of at least BYTES with zlib and set the COMPRESSED flag, as a "
    "producer does over compressMsgBodyOverHowmuch (4.x default 4096); read --decompress "
    "restores the body.",
)
@click.option(
    "--multi-dispatch/--no-multi-dispatch",
    default=None,
    help="As a broker with enableMultiDispatch (the default when the broker config says so): "
    "a message whose INNER_MULTI_DISPATCH property names further queues (comma separated, "
    "commas at the end naming none, as the broker splits it; %LMQ% names are LMQ queues, "
    "queue 0) gets the next offset of each in "
    "INNER_MULTI_QUEUE_OFFSET, and a dispatch puts its unit in each of them. Not for %RETRY% "
    "and rmq_sys_ topics, DELAY messages (their delivery is the broker's) or prepared and "
    "rollback records, as a 5.x broker, whose records append writes (no dispatch copies a "
    "5.x record of those topics either; a 4.9 broker's, whose properties end without 0x02, it "
    "does).",
)
@store_config_options
@json_option
@jsonl_option
def command(
    store: Path,
    topic: str | None,
    queue_id: int,
    tags: str | None,
    keys: str | None,
    properties: dict[str, str],
    flag: int,
    body: str | None,
    body_file: Path | None,
    input_path: str | None,
    born_host: str,
    transaction: str,
    prepared_offset: int,
    flush: str | None,
    flush_interval: int | None,
    flush_least_pages: int | None,
    flush_thorough_interval: int | None,
    transient_store_pool: bool | None,
    commit_interval: int | None,
    commit_least_pages: int | None,
    preallocate: bool | None,
    create: bool,
    store_host: str | None,
    record_version: str,
    no_uniq_key: bool,
    compress_over: int | None,
    dispatch_after: bool,
    multi_dispatch: bool | None,
    config: StoreConfig,
    as_json: bool,
    as_jsonl: bool,
) -> int:
    """Append messages to the commit log, as a broker would.

    The broker's rules apply: the roll rule with BLANK records, dense queue offsets continuing
    the store's, non-decreasing store times, a generated UNIQ_KEY and the CLUSTER property,
    DELAY messages moved to SCHEDULE_TOPIC_XXXX. With --dispatch the messages also go into
    consume queues and the index, and each flush moves the checkpoint's times to what it made
    durable (what the dispatch meets is told as rmqstore dispatch tells it, in warnings);
    without it 'abort' is left so a broker re-dispatches them at start. A topic
    appended to that config/topics.json does not list (or a queue id past its
    readQueueNums/writeQueueNums) is added to it, with default options, as mqadmin updateTopic
    would, since a broker serves only the topics listed there (a DELAY message's own topic,
    where it is delivered later, not SCHEDULE_TOPIC_XXXX, which a broker makes itself with a
    queue per delay level); the old file is kept as topics.json.bak, a file that is not a
    JSON topic table (or a link) is left alone with a warning, and a store without the file
    gets one only when --create makes it. With --multi-dispatch, messages naming further (LMQ)
    queues in INNER_MULTI_DISPATCH get their offsets in INNER_MULTI_QUEUE_OFFSET, as a broker
    with enableMultiDispatch gives them.

    Prints per message: msgId, commitLogOffset, queueOffset, storeSize, uniqKey (also topic,
    queueId, storeTimestamp in JSON; uniqKey is read back from the stored record), only once
    it is durable. --flush sync (SYNC_FLUSH) prints each group as soon as it is fsynced.
    --flush async (ASYNC_FLUSH) prints the messages each interval flush covers (a pipe that
    stays open is flushed every --flush-interval when --flush-least-pages are dirty, and
    everything every --flush-thorough-interval, so a crash loses at most about one interval),
    and the rest after the final flush. stdout is flushed after each group. An error keeps
    what was flushed and printed and rolls back the rest (an input that fails before the first
    flush leaves the store unchanged; a failed --create leaves no store). A failed flush (a
    disk going bad) is not tried again, since a second fsync succeeds over pages the first
    lost: 'abort' stays and the checkpoint is not moved, so a broker's start checks the log's
    tail. With
    --transient-store-pool records are staged in memory and written to the file every
    --commit-interval; a flush writes what is staged first. Settings come from the options,
    else the broker config (flushDiskType, flushIntervalCommitLog, flushCommitLogLeastPages,
    flushCommitLogThoroughInterval, transientStorePoolEnable, commitIntervalCommitLog,
    commitCommitLogLeastPages, commitCommitLogThoroughInterval, warmMapedFileEnable). A closed
    stdout ends the command with exit 4, keeping what is stored. Queue offsets continue the
    consume queues' (and the undispatched records after them); a topic's or queue's
    consume-queue folder that is a symbolic link is refused, since its offsets cannot be
    learnt without following it (dispatch --rebuild --yes moves it to quarantine), and so is a
    store whose next record to dispatch carries a later queue offset than its queue's next one
    (records missing from the queue: the next message would take a stored one's queue
    offset; dispatch --rebuild --yes mends it), and so is a store with a consume queue
    missing a file among its last three (a broker's load walks on past the gap: its next
    queue offset is not where the queue ends here), and so is a store with a queue folder
    that holds no unit while the commit log holds that queue's records before where the
    queues end (its files were lost: the next message would take queue offset 0, which a
    stored one has; dispatch --rebuild --yes mends it; only then is the log read up to
    there), and so is a store with a queue that ends at a unit overwritten in its middle
    while the units after it point at its own records (its walk ends there, as a broker's
    does: the next message would take a stored one's queue offset; dispatch --rebuild
    --yes mends it). Without --dispatch, a store without 'abort'
    is refused, unchanged, when the crash recovery the 'abort' left makes a broker run would
    end its log early: it walks from the file the checkpoint picks, which may be earlier than
    the last three a normal recovery walks, and damage there would cut the log (append with
    --dispatch). Takes the store's lock; refuses a store a broker holds.
    """
    sources = [
        name
        for name, value in (("--body", body), ("--body-file", body_file), ("--input", input_path))
        if value is not None
    ]
    if len(sources) != 1:
        raise click.UsageError("give exactly one of --body, --body-file or --input")
    if as_json and as_jsonl:
        raise click.UsageError("--json and --jsonl exclude each other")
    defaults = MessageDefaults(
        topic=topic,
        queue_id=queue_id,
        tags=tags,
        keys=keys,
        properties={"CLUSTER": config.cluster_name, **properties},
        flag=flag,
        born_host=parse_host(born_host),
        transaction=transaction,
        prepared_transaction_offset=prepared_offset,
    )
    config, policy = _flush_policy(
        config,
        flush,
        flush_interval=flush_interval,
        flush_commitlog_least_pages=flush_least_pages,
        flush_commitlog_thorough_interval=flush_thorough_interval,
        transient_store_pool_enable=transient_store_pool,
        commit_interval_commitlog=commit_interval,
        commit_commitlog_least_pages=commit_least_pages,
        warm_mapped_file_enable=preallocate,
    )
    results: list[dict] = []
    lines_style = _lines_style(as_json, as_jsonl)
    report = (
        {"on_result": _guard_output(_emitter(as_json, results))}
        if lines_style is None
        else {"on_lines": _guard_output(_write_lines), "lines_style": lines_style}
    )
    with Store.open_write(store, config, create=create, appends_only=not dispatch_after) as opened:
        appender = opened.appender(
            uniq_keys=None if no_uniq_key else UniqKeyGenerator(),
            allow_v2=record_version == "auto",
            store_host=parse_host(store_host) if store_host else None,
            list_topics=True,
            undispatched=not dispatch_after,
            multi_dispatch=config.enable_multi_dispatch
            if multi_dispatch is None
            else multi_dispatch,
        )
        dispatcher = Dispatcher(opened) if dispatch_after else None
        dispatch_problems: list[str] = []

        def dispatch_appended() -> None:
            assert dispatcher is not None
            done = dispatcher.run(
                until=appender.end_offset, flushed_time=appender.last_store_timestamp
            )
            dispatch_problems.extend(done.problems)

        try:
            job = AppendJob(
                appender,
                policy=policy,
                **report,  # type: ignore[arg-type]
                on_commit=dispatch_appended if dispatcher else None,
                on_reported=_guard_output(_flush_stdout),
                uniq_keys=True,
            )
            if compress_over is not None:
                job.transform = lambda messages: compressed_bodies(
                    messages, compress_over, type_bits=appender.trailing_separator
                )
            _run_job(
                job,
                input_path,
                body,
                body_file,
                defaults,
                appender.prepare,
                opened.config.max_message_size,
            )
            appended = job.committed
        finally:
            if dispatcher is not None:
                dispatcher.close()
    for text in opened.notes:
        note(text)
    for problem in dispatch_problems:  # what the dispatch of the messages met (as dispatch's)
        warn(problem)
    if as_json:
        emit_json({"appended": appended, "messages": results})
    elif not as_jsonl:
        note(f"appended {appended} message{'s' if appended != 1 else ''}")
    return 0


def _flush_policy(
    config: StoreConfig, flush: str | None, *, flush_interval: int | None, **given: object
) -> tuple[StoreConfig, FlushPolicy]:
    """The store config with the options applied, and the flush policy it makes: --flush or
    the broker config's flushDiskType, and the intervals and pages of either."""
    if flush is not None:
        given["flush_disk_type"] = "SYNC_FLUSH" if flush == "sync" else "ASYNC_FLUSH"
    config = config.with_overrides(flush_interval_commitlog=flush_interval, **given)
    sync = config.flush_disk_type == "SYNC_FLUSH"
    if sync and config.transient_store_pool_enable:
        if given.get("transient_store_pool_enable"):
            raise click.UsageError(
                "--transient-store-pool goes with ASYNC_FLUSH (a broker ignores the pool with "
                "SYNC_FLUSH)"
            )
        note("the broker config enables the transient store pool, which SYNC_FLUSH ignores")
    if sync:
        _refuse_given(
            {
                "--flush-interval": flush_interval,
                "--flush-least-pages": given.get("flush_commitlog_least_pages"),
                "--flush-thorough-interval": given.get("flush_commitlog_thorough_interval"),
            },
            "ASYNC_FLUSH; with SYNC_FLUSH each message is flushed before it is reported",
        )
    if not (config.transient_store_pool_enable and not sync):
        _refuse_given(
            {
                "--commit-interval": given.get("commit_interval_commitlog"),
                "--commit-least-pages": given.get("commit_commitlog_least_pages"),
            },
            "--transient-store-pool",
        )
    policy = FlushPolicy(
        sync=sync,
        interval_ms=config.flush_interval_commitlog,
        least_pages=config.flush_commitlog_least_pages,
        thorough_ms=config.flush_commitlog_thorough_interval,
        transient=config.transient_store_pool_enable and not sync,
        commit_interval_ms=config.commit_interval_commitlog,
        commit_least_pages=config.commit_commitlog_least_pages,
        commit_thorough_ms=config.commit_commitlog_thorough_interval,
    )
    return config, policy


def _refuse_given(options: dict[str, object], goes_with: str) -> None:
    """A usage error naming the options given (not None) that only go with ``goes_with``."""
    given = [name for name, value in options.items() if value is not None]
    if given:
        verb = "goes" if len(given) == 1 else "go"
        raise click.UsageError(f"{'/'.join(given)} {verb} with {goes_with}")


def _run_job(
    job: AppendJob,
    input_path: str | None,
    body: str | None,
    body_file: Path | None,
    defaults: MessageDefaults,
    prepare: Callable[[Message], object],
    max_message_size: int,
) -> None:
    if input_path is None:
        payload = _body_bytes(body) if body is not None else _read_body(body_file, max_message_size)
        message = build_message({}, defaults, "options")
        message.body = payload
        job.run([message])
        return
    longest = longest_line(max_message_size)
    if input_path == "-":
        stream = sys.stdin.buffer
        blocks = read_line_blocks(
            stream, job.commit, job.policy.tick_seconds, longest=longest, source="stdin"
        )
        job.run_line_blocks(blocks, defaults, "stdin")
    else:
        path = Path(input_path)
        if job.sync:
            _prevalidate(path, defaults, prepare, longest)
        with _open_input(path) as stream:
            blocks = read_line_blocks(
                stream, job.commit, job.policy.tick_seconds, longest=longest, source=str(path)
            )
            job.run_line_blocks(blocks, defaults, str(path))


def _body_bytes(body: str) -> bytes:
    """``--body`` as bytes: bytes the shell passed that are not UTF-8 are kept as given."""
    try:
        return body.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise InputError("options: body is not valid text (a lone surrogate)") from None


def _flush_stdout() -> None:
    """After each group of acknowledgements: a producer on the other end of a pipe waits for
    them, so they must not sit in the buffer."""
    sys.stdout.flush()


def _guard_output(write: Callable[..., None]) -> Callable[..., None]:
    """A closed stdout while reporting ends the command (nothing reported is undone) with an
    I/O error, never as success."""

    def guarded(*args: object) -> None:
        try:
            write(*args)
        except BrokenPipeError:
            raise OutputClosedError(
                "standard output was closed while reporting appended messages; the rest of "
                "the input was not appended"
            ) from None

    return guarded


def _lines_style(as_json: bool, as_jsonl: bool) -> int | None:
    """How the report is written when it is text read back from the log (JSON lines, or the
    plain lines a pipe or file gets), None when each message is reported on its own (a JSON
    document, or lines rendered for a terminal)."""
    if as_jsonl:
        return LINES_JSONL
    if not as_json and not sys.stdout.isatty():
        return LINES_PLAIN
    return None


def _write_lines(block: bytes) -> None:
    write_whole_lines(block, atomic=True)  # what the producer acts on: never half a line


def _emitter(as_json: bool, results: list[dict]) -> Callable[[AppendResult, str | None], None]:
    """How each durable message is reported when it is not as lines: ``emit(result,
    uniq_key)``, collected for the JSON document or shown on the terminal."""
    if as_json:
        return lambda result, uniq_key: results.append(result_document(result, uniq_key))

    def show(result: AppendResult, uniq_key: str | None) -> None:
        console.print(  # topics hold no markup: letters, digits, %|-_
            f"{result.msg_id}  offset={result.physical_offset}  "
            f"queue={result.topic}:{result.queue_id}  "
            f"queueOffset={result.queue_offset}  size={result.store_size}"
            + (f"  uniqKey={uniq_key}" if uniq_key is not None else "")
        )

    return show


def result_document(result: AppendResult, uniq_key: str | None) -> dict[str, object]:
    """What append reports of a message: the store's result and the message's UNIQ_KEY."""
    return {**result.to_dict(), "uniqKey": uniq_key}


def _read_body(path: Path | None, max_message_size: int) -> bytes:
    """``--body-file``: read no further than one byte past the longest body the store takes
    (``/dev/zero`` is refused, not read for ever)."""
    assert path is not None
    try:
        body = read_given_file(path, max_message_size)
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from None
    if body is None:
        raise MessageTooLargeError(
            f"{path}: message body is more than {max_message_size} bytes; maxMessageSize is "
            f"{max_message_size}"
        )
    return body


def _open_input(path: Path):
    try:
        return open(path, "rb")
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from None


def _prevalidate(
    path: Path, defaults: MessageDefaults, prepare: Callable[[Message], object], longest: int
) -> None:
    """Check every line of a file before appending any, so a bad line appends nothing even
    when earlier groups would already be durable."""
    with _open_input(path) as stream:
        lines = read_lines(stream, longest=longest, source=str(path))
        messages: Iterator[Message] = messages_from_lines(lines, defaults, str(path))
        for message in messages:
            prepare(message)
