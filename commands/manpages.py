"""Generate man pages from the click command tree: ``python -m rmqstore.commands.manpages DIR``.

``rmqstore(1)`` lists the commands and the exit codes; each command (and each subcommand of a
command group) gets ``rmqstore-NAME(1)``. The pages are deterministic (no dates), so a test can
regenerate them and fail when the checked-in copies are stale.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from rmqstore import __version__
from rmqstore.commands.main import all_commands, cli
from rmqstore.errors import ExitCode

EXIT_CODES = [
    (ExitCode.OK, "Success."),
    (
        ExitCode.FINDINGS,
        "Completed and found problems: verify findings, a dry run that has work to do.",
    ),
    (
        ExitCode.USAGE,
        "Usage or input error: a bad option, not a store, unreadable, corrupt or "
        "truncated input, an invalid topic, a malformed JSON line, a declined "
        "confirmation. Nothing was changed.",
    ),
    (
        ExitCode.BUSY,
        "The store is busy: its lock file is held by another process (a running "
        "broker or another rmqstore writer).",
    ),
    (
        ExitCode.IO,
        "I/O failure: disk full, permission denied, a failed fsync; output that could not "
        "be written whole (stdout redirected to a file on a full disk); an HA peer that broke "
        "the protocol, stalled or went away.",
    ),
    (
        ExitCode.INTERNAL,
        "Internal error (a bug in rmqstore). Set RMQSTORE_DEBUG=1 for a traceback and report it.",
    ),
]


# (command line, what it does) for each page's EXAMPLES section
EXAMPLES: dict[str, list[tuple[str, str]]] = {
    "rmqstore": [
        ("rmqstore info /data/rocketmq/store", "What a store holds, on one screen."),
        ("rmqstore verify /data/rocketmq/store", "Check it; exit 1 names each problem's fix."),
        (
            "rmqstore --utc --no-progress read store --from-offset 0 --count 10",
            "Global options go before the command.",
        ),
    ],
    "rmqstore-info": [
        ("rmqstore info store", "Files, offsets, topics and queues, checkpoint, abort, lock."),
        ("rmqstore info store --topic Orders", "Each queue's min/max offset (topicStatus)."),
        ("rmqstore info store --json | jq .commitLog.maxOffset", "For scripts."),
    ],
    "rmqstore-append": [
        (
            "rmqstore append store --create --topic Orders --tags TagA --keys order-1 --body hi",
            "One message into a new store.",
        ),
        (
            "rmqstore append store --input messages.jsonl --flush sync --jsonl",
            "JSON lines, each reported once it is on disk.",
        ),
        (
            "producer | rmqstore append store --input - --flush sync --dispatch",
            "From a pipe, consume queues and index kept up to date.",
        ),
        (
            "rmqstore append store --input big.jsonl --compress-over 4096",
            "Compress bodies over 4 KiB with zlib, as a producer does.",
        ),
    ],
    "rmqstore-read": [
        ("rmqstore read store --offset 0", "The message at a physical offset."),
        (
            "rmqstore read store --msg-id AC110001473C1B6D1C0F07D9E0C10000",
            "By a producer's message id (UNIQ_KEY) or an offset message id.",
        ),
        ("rmqstore read store --from-offset 0 --count 100 --jsonl", "Sequentially."),
        (
            "rmqstore read store --topic Orders --tags 'TagA||TagB' --begin 2024-03-01T00:00:00Z",
            "A topic's queues, filtered by tags and store time.",
        ),
        ("rmqstore read store --key order-1", "Through the index, in every topic."),
        (
            "rmqstore read store --topic Orders --csv --fields msgId,queueId,queueOffset",
            "CSV for a spreadsheet.",
        ),
    ],
    "rmqstore-verify": [
        ("rmqstore verify store", "Everything; the report ends with the next step."),
        ("rmqstore verify store --only commitlog --no-crc", "The commit log's structure only."),
        (
            "rmqstore verify store --json | jq '.findings[] | {kind, commitLogOffset, fix}'",
            "Each finding's position and fix.",
        ),
        ("rmqstore verify store --jobs 2", "In two worker processes."),
    ],
    "rmqstore-dump": [
        (
            "rmqstore dump store/commitlog/00000000000000000000 --count 20",
            "The first 20 records of a commit-log file.",
        ),
        (
            "rmqstore dump store/consumequeue/Orders/1/00000000000000000000",
            "A consume-queue file, each unit's record looked up.",
        ),
        (
            "rmqstore dump store/index/20240301120000000 --slots --jsonl",
            "An index file's header, slots and entries.",
        ),
        ("rmqstore dump /tmp/copied-file --kind commitlog", "A file outside its store."),
    ],
    "rmqstore-dispatch": [
        ("rmqstore dispatch store", "Bring consume queues and index up to the commit log."),
        ("rmqstore dispatch store --rebuild --dry-run", "Show what a rebuild would do."),
        (
            "rmqstore dispatch store --rebuild --yes --jobs 2",
            "Rebuild from scratch (old files to quarantine).",
        ),
    ],
    "rmqstore-recover": [
        ("rmqstore recover store --dry-run", "The plan: what would be cut, exit 1 if any."),
        ("rmqstore recover store --yes", "Recover after a crash; cut bytes go to quarantine."),
    ],
    "rmqstore-flush": [
        ("rmqstore flush store", "fsync everything, then write a checkpoint that says so."),
    ],
    "rmqstore-replicate": [
        (
            "rmqstore replicate /data/rocketmq/store /backup/store",
            "A byte-identical copy; run again, it copies only what is new.",
        ),
        (
            "rmqstore replicate /data/rocketmq/store /backup/store --follow --interval 500",
            "Keep the copy current while a broker writes; stop with Ctrl-C or SIGTERM.",
        ),
        ("rmqstore replicate store copy --until 1048576", "Only the records before 1 MiB."),
        (
            "rmqstore replicate ha://master-host:10912 /data/rocketmq/slave-store --follow",
            "Be a slave of a running broker: catch up over the HA protocol and keep up.",
        ),
    ],
    "rmqstore-serve-ha": [
        (
            "rmqstore serve-ha /backup/store --listen 0.0.0.0:10912",
            "Let a RocketMQ slave broker (haMasterAddress=this-host:10912) catch up from a copy.",
        ),
        (
            "rmqstore serve-ha store --listen 127.0.0.1:0 --follow",
            "Any free port (said on stderr); serve what a writer adds until Ctrl-C.",
        ),
    ],
    "rmqstore-export": [
        (
            "rmqstore export store --to /tmp/orders --topic Orders",
            "A topic to Parquet (local engine on small stores).",
        ),
        ("rmqstore export store --to s3://bucket/orders --engine spark", "A large store on Spark."),
        ("rmqstore export store --to /tmp/all --format jsonl --no-body", "JSON lines, no bodies."),
    ],
    "rmqstore-stats": [
        ("rmqstore stats store", "Messages, bytes, offsets, times and tags per queue."),
        ("rmqstore stats store --tsv --fields topic,queueId,messages", "Tab-separated, for awk."),
    ],
    "rmqstore-offsets": [
        ("rmqstore offsets store", "Each group's offset, lag and last consumed time per queue."),
        ("rmqstore offsets store --group orders-app", "One group (consumerProgress, offline)."),
        (
            "rmqstore offsets store --csv --fields group,topic,queueId,state | grep past-end",
            "The offsets a recovery left past their queue's end.",
        ),
    ],
    "rmqstore-fixtures": [
        ("rmqstore fixtures list", "The scenarios."),
        ("rmqstore fixtures generate torn-tail /tmp/torn --seed 7", "A damaged store."),
    ],
    "rmqstore-fixtures-list": [("rmqstore fixtures list --json", "For scripts.")],
    "rmqstore-fixtures-generate": [
        ("rmqstore fixtures generate multi /tmp/multi", "A clean store of several topics."),
        (
            "rmqstore fixtures generate large /tmp/large --messages 1000000 --jobs 2",
            "A million messages, for benchmarks.",
        ),
    ],
    "rmqstore-fixtures-describe": [
        (
            "rmqstore fixtures describe torn-tail /tmp/torn",
            "Its damage and what verify and recover must report.",
        ),
    ],
    "rmqstore-quarantine": [
        ("rmqstore quarantine list store", "What recover and rebuilds cut, with sizes."),
    ],
    "rmqstore-quarantine-list": [("rmqstore quarantine list store --json", "For scripts.")],
    "rmqstore-quarantine-restore": [
        (
            "rmqstore quarantine restore store 20240301-120000-recover",
            "Put the bytes one run cut back where they were.",
        ),
    ],
    "rmqstore-quarantine-purge": [
        ("rmqstore quarantine purge store --all --dry-run", "What would be deleted."),
        ("rmqstore quarantine purge store --all --yes", "Delete every quarantine folder."),
    ],
}


def _examples(name: str) -> str:
    items = "\n".join(f".TP\n.B {roff(line)}\n{roff(text)}" for line, text in EXAMPLES[name])
    return f".SH EXAMPLES\n{items}\n"


def _findings() -> str:
    """rmqstore-verify(1): every finding kind, what it means and what mends it."""
    from rmqstore.verify.findings import FIXES, KINDS

    items = "\n".join(
        f".TP\n.B {roff(kind)}\n{roff(meaning[0].upper() + meaning[1:])}. Fix: "
        f"{roff(FIXES[kind].format(store='STORE'))}."
        for kind, meaning in KINDS.items()
    )
    return f".SH FINDINGS\n{items}\n"


def roff(text: str) -> str:
    """Escape text for roff: backslashes, hyphens, and lines starting with . or '."""
    escaped = text.replace("\\", "\\e").replace("-", "\\-")
    lines = []
    for line in escaped.splitlines():
        lines.append("\\&" + line if line.startswith((".", "'")) else line)
    return "\n".join(lines)


def paragraphs(help_text: str) -> str:
    """click help text (paragraphs separated by blank lines) as roff paragraphs."""
    blocks = [" ".join(block.split()) for block in help_text.strip().split("\n\n")]
    return "\n.PP\n".join(roff(block) for block in blocks if block)


def _options(command: click.Command, context: click.Context) -> str:
    parts = []
    for param in command.get_params(context):
        if not isinstance(param, click.Option):
            continue
        record = param.get_help_record(context)
        if record is None:
            continue
        names, help_text = record
        parts.append(f".TP\n.B {roff(names)}\n{roff(' '.join(help_text.split()))}")
    return "\n".join(parts)


def _arguments(command: click.Command) -> list[str]:
    return [
        param.human_readable_name for param in command.params if isinstance(param, click.Argument)
    ]


def _header(name: str, section: int, summary: str) -> str:
    return (
        f'.TH "{name.upper()}" "{section}" "" "rmqstore {__version__}" "rmqstore manual"\n'
        f".SH NAME\n{roff(name)} \\- {roff(summary)}\n"
    )


def _exit_status() -> str:
    items = "\n".join(f".TP\n.B {int(code)}\n{roff(text)}" for code, text in EXIT_CODES)
    return f".SH EXIT STATUS\n{items}\n"


def _root_context() -> click.Context:
    return click.Context(cli, info_name="rmqstore", **cli.context_settings)


def command_page(path: list[str], command: click.Command, parent: click.Context) -> str:
    context = click.Context(command, info_name=path[-1], parent=parent)
    name = "-".join(path)
    summary = command.get_short_help_str(limit=200).rstrip(".")
    usage = " ".join(command.collect_usage_pieces(context))
    page = [
        _header(name, 1, summary),
        f".SH SYNOPSIS\n.B {roff(' '.join(path))}\n{roff(usage)}\n",
        f".SH DESCRIPTION\n{paragraphs(command.help or '')}\n",
    ]
    if isinstance(command, click.Group):
        items = "\n".join(
            f".TP\n.B {roff(sub)}\n{roff(command.commands[sub].get_short_help_str(200))}"
            for sub in sorted(command.commands)
        )
        page.append(f".SH COMMANDS\n{items}\n")
    options = _options(command, context)
    if options:
        page.append(f".SH OPTIONS\n{options}\n")
    if name == "rmqstore-verify":
        page.append(_findings())
    page.append(_examples(name))
    page.append(_exit_status())
    page.append(".SH SEE ALSO\n.BR rmqstore (1),\n.BR rmqstore\\-store (5)\n")
    return "".join(page)


SPARK_SOURCES = (
    "From a PySpark program: from rmqstore.spark import register; register(spark); then "
    'spark.read.format("rocketmq-commitlog").load(STORE) (a row per message, the columns '
    "export writes) or rocketmq-consumequeue (a row per consume-queue unit); "
    'spark.readStream.format("rocketmq-commitlog") tails a live store, its offsets commit-log '
    "physical offsets.\n\n"
    'A schema given to the read (.schema("topic STRING, commitLogOffset BIGINT")) builds only '
    "those columns. Columns every message has a value in are NOT NULL in the sources' schema "
    "(all but crcOk unless verifyCrc, body with includeBody=false, tags, tagsCode, keys, "
    "uniqKey, bornTime and storeTime); NOT NULL in a schema given to the read on a column "
    "that can be null is an error. register(spark, pushdown=True) turns on "
    "spark.sql.python.filterPushdown.enabled and the sources take pushed-down conditions "
    "(=, <>, <, >, IN, LIKE prefix/suffix/infix, IS NULL on topic, queueId, offsets, sizes, "
    "flags, timestamps, tags, keys and the like), applied to each batch of records before "
    "its other columns are built; a commitLogOffset window leaves out the ranges outside it "
    "(as the options startingOffset and endingOffset do without pushdown; queueIds and topics "
    "select queues and topics). "
    "With pushdown on, load() a DataFrame per query: Spark 4.1-4.3 reuses a DataFrame's last "
    "pushed read for a later query on it that has no condition to push. The README's Spark "
    "section has the options."
)


def main_page() -> str:
    context = _root_context()
    subcommands = all_commands()
    commands = "\n".join(
        f".TP\n.B {roff(name)}\n{roff(subcommands[name].get_short_help_str(200))} "
        f"See \\fBrmqstore\\-{roff(name)}\\fR(1)."
        for name in sorted(subcommands)
    )
    return "".join(
        [
            _header("rmqstore", 1, "offline toolkit for Apache RocketMQ message stores"),
            ".SH SYNOPSIS\n.B rmqstore\nCOMMAND STORE [OPTIONS]\n",
            f".SH DESCRIPTION\n{paragraphs(cli.help or '')}\n",
            f".SH COMMANDS\n{commands}\n",
            f".SH OPTIONS\n{_options(cli, context)}\n",
            f".SH SPARK DATA SOURCES\n{paragraphs(SPARK_SOURCES)}\n",
            _examples("rmqstore"),
            _exit_status(),
            ".SH ENVIRONMENT\n.TP\n.B RMQSTORE_DEBUG\nPrint a traceback after an internal "
            "error.\n.TP\n.B JAVA_HOME\nThe Java 17+ used by the Spark pipeline.\n"
            ".TP\n.B RMQSTORE_KERNEL\nWhich record kernel runs: auto (the compiled one when "
            "it was built, else the pure-Python reference), native (the compiled one, or exit 2) "
            "or python (the reference).\n"
            ".TP\n.B PYSPARK_PYTHON\nThe Python of Spark's workers, in your own PySpark job: one "
            "with rmqstore installed. rmqstore's own local sessions set it, when it is not set, "
            "to their interpreter through a launcher that leaves a pip-installed PySpark's "
            "pyspark.zip off PYTHONPATH (each Python process Spark starts would otherwise "
            "compile PySpark anew from it): rmqstore.spark.worker_python().\n"
            ".TP\n.B RMQSTORE_SPARK_CLASS_ARCHIVE\nA file for the class archive of the JVM "
            "of rmqstore's Spark sessions (Java class data sharing): read when it exists, "
            "written as the process ends when it does not (about 170 MB, once). Later "
            "sessions start about 2.5 s sooner. Delete it after upgrading Java or PySpark.\n"
            ".TP\n.B OPENBLAS_NUM_THREADS\nrmqstore sets it to 1 unless it is set: numpy "
            "(stats imports it, and pyarrow does wherever numpy can be imported: Spark's "
            "workers, a program calling rmqstore) would otherwise start OpenBLAS threads that "
            "spin for a while (rmqstore does no linear algebra). Worker processes and Spark's "
            "Python workers inherit it. The export command's own process imports pyarrow "
            "without numpy: an export converts nothing to numpy arrays.\n",
            ".SH SEE ALSO\n"
            + ",\n".join(f".BR rmqstore\\-{roff(name)} (1)" for name in sorted(subcommands))
            + ",\n.BR rmqstore\\-store (5)\n",
        ]
    )


def generated_pages() -> dict[str, str]:
    """File name -> page text for every generated page."""
    pages = {"rmqstore.1": main_page()}

    def walk(path: list[str], command: click.Command, parent: click.Context) -> None:
        pages[f"{'-'.join(path)}.1"] = command_page(path, command, parent)
        if isinstance(command, click.Group):
            context = click.Context(command, info_name=path[-1], parent=parent)
            for name, sub in sorted(command.commands.items()):
                walk([*path, name], sub, context)

    root = _root_context()
    for name, command in sorted(all_commands().items()):
        walk(["rmqstore", name], command, root)
    return pages


def write_pages(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in generated_pages().items():
        path = directory / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "man")
    for page in write_pages(target):
        print(page)
