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
    (ExitCode.IO, "I/O failure: disk full, permission denied, a failed fsync."),
    (
        ExitCode.INTERNAL,
        "Internal error (a bug in rmqstore). Set RMQSTORE_DEBUG=1 for a traceback and report it.",
    ),
]


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
    page.append(_exit_status())
    page.append(".SH SEE ALSO\n.BR rmqstore (1),\n.BR rmqstore\\-store (5)\n")
    return "".join(page)


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
            _exit_status(),
            ".SH ENVIRONMENT\n.TP\n.B RMQSTORE_DEBUG\nPrint a traceback after an internal "
            "error.\n.TP\n.B JAVA_HOME\nThe Java 17+ used by the Spark pipeline.\n"
            ".TP\n.B RMQSTORE_KERNEL\nWhich record kernel runs: auto (the compiled one when "
            "it was built, else the pure-Python reference), native (the compiled one, or exit 2) "
            "or python (the reference).\n",
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
