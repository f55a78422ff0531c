"""The ``rmqstore`` entry point: the command group and the one place where errors become exit
codes. Every command is also callable in-process with :func:`run`."""

from __future__ import annotations

import codecs
import contextlib
import errno
import importlib
import io
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import click

from rmqstore import __version__, kernel
from rmqstore.commands.signals import (
    begin_command,
    defer_stops,
    interrupt_on_sigterm,
    stop_listening,
    stopped_by,
)
from rmqstore.errors import ExitCode, OutputClosedError, RmqStoreError, context_of

# the click context's ``obj`` when rmqstore's console script started the process (main()):
# nothing but the command lives in it then, and a command may set the process up for its own
# work (not when the command line runs from Python: ``run()``, a test's CliRunner)
OWN_PROCESS = "rmqstore-process"


def process_is_own() -> bool:
    """Whether rmqstore's console script started this process (see :data:`OWN_PROCESS`)."""
    context = click.get_current_context(silent=True)
    return context is not None and context.find_root().obj == OWN_PROCESS


def _error(message: str) -> None:
    """One line on stderr: a path or name in ``message`` holding a line feed or an escape
    sequence is shown escaped (:func:`rmqstore.commands.output.shown`)."""
    from rmqstore.commands.output import shown

    with contextlib.suppress(OSError):  # stderr gone with its terminal: the exit code says it
        click.echo(f"rmqstore: error: {shown(message)}", err=True)


class RmqStoreGroup(click.Group):
    """Runs a subcommand and maps what it raises to the documented exit codes. A command's
    module is imported only when that command runs (or help lists it), so start-up pays only
    for what runs."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(_COMMAND_MODULES)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in _COMMAND_MODULES:
            return None
        module = importlib.import_module(f"rmqstore.commands.{cmd_name.replace('-', '_')}")
        command: click.Command = module.command
        return command

    def invoke(self, ctx: click.Context) -> Any:
        try:
            try:
                begin_command()  # a stop signal that came as the command line was set up
                result = super().invoke(ctx)
            except click.exceptions.Exit:
                raise
            except KeyboardInterrupt:  # SIGINT, SIGTERM, SIGHUP: none later breaks into the exit
                stop_listening()
                _keep_spark_log()
                return self._failed(ctx)
            except BaseException:
                _keep_spark_log()
                return self._failed(ctx)
            if isinstance(result, int) and result:
                ctx.exit(result)
            return result
        finally:
            # the command is done, and its exit code known: a stop signal from now on is
            # ignored (met in click's code on the way out, it printed "Aborted!", exit 1;
            # met as the interpreter ended, it killed the process)
            stop_listening()

    def _failed(self, ctx: click.Context) -> Any:
        """Map the exception being handled to its exit code (one line on stderr)."""
        try:
            raise
        except click.ClickException:
            raise
        except click.Abort:
            _error("aborted")
            ctx.exit(ExitCode.USAGE)
        except RmqStoreError as exc:
            if isinstance(exc, OutputClosedError):
                _silence_stdout()
            _error(str(exc) + context_of(exc))
            ctx.exit(exc.exit_code)
        except BrokenPipeError:
            _silence_stdout()
            ctx.exit(ExitCode.OK)
        except ImportError as exc:
            module = (exc.name or "").partition(".")[0]
            if module not in _OPTIONAL_MODULES:
                _internal_error(ctx, exc)
            _error(
                f"this needs the optional module {module}, which is not installed "
                "(pip install 'rmqstore[spark]')"
            )
            ctx.exit(ExitCode.USAGE)
        except KeyboardInterrupt as exc:  # SIGINT; SIGTERM (Terminated), SIGHUP (HungUp)
            _stopped(ctx, exc)
        except RuntimeError as exc:
            # Python 3.11 wraps what a class's __set_name__ raises: a stop signal met as a
            # module the command imports defines a class ("internal error: RuntimeError:
            # Error calling __set_name__ on 'Field' instance 'sources' in 'StoreConfig'",
            # exit 70: the signals campaign, seed 20, an append sent SIGTERM)
            if not isinstance(exc.__cause__, KeyboardInterrupt):
                _internal_error(ctx, exc)
            _stopped(ctx, exc.__cause__)
        except OSError as exc:
            detail = exc.strerror or str(exc)
            where = f" ({exc.filename})" if exc.filename else ""
            if exc.errno in _PATH_ERRORS:  # the path given does not lead to a file
                _error(f"{detail}{where}{context_of(exc)}")
                ctx.exit(ExitCode.USAGE)
            _error(f"I/O failure: {detail}{where}{context_of(exc)}")
            ctx.exit(ExitCode.IO)
        except Exception as exc:
            _internal_error(ctx, exc)


def _stopped(ctx: click.Context, stop: KeyboardInterrupt) -> NoReturn:
    """A stop signal's line and exit code."""
    said, code = stopped_by(stop)
    _error(said + context_of(stop))
    ctx.exit(code)


def _keep_spark_log() -> None:
    """A command failed: if it ran Spark, keep that run's JVM log (errors name it)."""
    spark = sys.modules.get("rmqstore.spark")
    if spark is not None:
        spark.keep_log()


# a path that leads nowhere (missing, through a file, too long, a loop of links): the input
# given is wrong, not the machine failing
_PATH_ERRORS = frozenset({errno.ENOENT, errno.ENOTDIR, errno.ENAMETOOLONG, errno.ELOOP})

_OPTIONAL_MODULES = frozenset({"pyarrow", "pyspark", "pandas", "numpy"})


def _internal_error(ctx: click.Context, exc: BaseException) -> NoReturn:
    _error(
        f"internal error: {type(exc).__name__}: {exc} (this is a bug in rmqstore; "
        "set RMQSTORE_DEBUG=1 for a traceback)"
    )
    if os.environ.get("RMQSTORE_DEBUG"):
        import traceback  # only here: every command's start-up would pay for it

        traceback.print_exception(exc)
    ctx.exit(ExitCode.INTERNAL)


def _silence_stdout() -> None:
    """After EPIPE (``rmqstore read ... | head``) stop Python from complaining at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


@click.group(
    cls=RmqStoreGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(
    __version__,
    prog_name="rmqstore",
    message=f"%(prog)s %(version)s\nrecord kernel: {kernel.description()}",
)
@click.option("--utc", is_flag=True, help="Show times in UTC (default: local time, with its zone).")
@click.option(
    "--progress/--no-progress",
    default=True,
    help="Progress bars on stderr for long work, drawn only when stderr is a terminal "
    "(default: on).",
)
def cli(utc: bool, progress: bool) -> None:
    """Inspect, verify and write Apache RocketMQ message store directories offline.

    STORE is the store root directory (the broker's storePathRootDir), holding commitlog/,
    consumequeue/, index/, checkpoint, abort and lock. Files are read and written
    byte-compatible with RocketMQ 4.x and 5.x brokers; no broker needs to run. A store whose
    commit log or queues rmqstore does not keep (no commitlog/ folder: give --broker-config
    when storePathCommitLog is elsewhere; a DLedger log; 5.x consume queues in a RocksDB
    database; BatchCQ topics' batchconsumequeue/) is read but not written: the writers refuse
    it (exit 2), but for append without --dispatch to the other topics of a BatchCQ store.
    So is a store file a writer would change in place that has other hard links (a copy
    made with cp -al shares its bytes with the store it was made from): refused, exit 2.
    A command raises its soft open-file limit (ulimit -n) to the hard one, and keeps within
    it: past half of it, consume-queue files are mapped again as they are written, and past
    an eighth of it (64 at most) index files are opened again as they are read. Options
    take numbers and times as rmqstore shows them too (1,073,741,824; 2024-03-01
    12:00:00.123 +0800), so they can be copied from its output. JSON, CSV and TSV are
    written in UTF-8 whatever the locale; human output in the locale's encoding, a
    character it lacks written as an escape (\\u6807).

    Exit codes: 0 ok; 1 completed and found problems; 2 usage or input error (bad option,
    not a store, corrupt or unreadable input, aborted at a prompt, --engine spark without
    Java 17+ and pyspark, or a missing optional module); 3 store busy (its lock is held, e.g.
    by a running broker); 4 I/O failure (disk full, permission, output that could not be
    written whole, a writer's stdout closed while it reported what it stored, or an HA peer
    that broke the protocol or went away);
    70 internal error; 130 interrupted by SIGINT (Ctrl-C), 143 by SIGTERM, 129 by SIGHUP
    (its terminal or ssh session gone; not under nohup): stopped where it was, as on an
    error; another of these signals while it stops, or one once it is done, is ignored
    (Ctrl-\\ or kill -9 end it at once). Lines on stdout (CSV/TSV rows) stay whole: a stop
    that comes while one is being written waits until it is out (at most a second, for a
    reader that takes nothing more); a JSON array (read --json) is closed.
    """
    from rmqstore.commands import output

    output.SHOW_UTC = utc
    output.SHOW_PROGRESS = progress


_COMMAND_MODULES = (
    "info",
    "append",
    "read",
    "verify",
    "dump",
    "dispatch",
    "recover",
    "flush",
    "replicate",
    "serve-ha",
    "export",
    "stats",
    "offsets",
    "fixtures",
    "quarantine",
)


def all_commands() -> dict[str, click.Command]:
    """Every subcommand by name (imports every command module)."""
    context = click.Context(cli)
    found = {name: cli.get_command(context, name) for name in cli.list_commands(context)}
    return {name: command for name, command in found.items() if command is not None}


def run(argv: Sequence[str] | None = None) -> int:
    """Run a command line in-process and return its exit code (for scripts and tests)."""
    try:
        result = cli.main(
            args=list(argv) if argv is not None else None,
            prog_name="rmqstore",
            standalone_mode=False,
        )
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return ExitCode.USAGE
    except click.Abort:
        _error("aborted")
        return ExitCode.USAGE
    return result if isinstance(result, int) else ExitCode.OK


def main() -> None:
    """Console-script entry point."""
    # numpy (which stats imports, and pyarrow wherever numpy is importable: Spark's workers,
    # an export from Python) starts OpenBLAS threads, one per core, that busy-wait for work
    # for a while; rmqstore does no linear algebra, and on a small machine those threads
    # take CPU from the work (5% of an export's wall time on 2 cores, when it imported
    # numpy). A caller's own setting wins; worker processes and Spark's Python workers
    # inherit it.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    _raise_open_file_limit()
    interrupt_on_sigterm()
    defer_stops()
    _closed_stdio_to_devnull()
    _whole_writes_to_stdout()
    _unencodable_escaped()
    try:
        cli.main(prog_name="rmqstore", obj=OWN_PROCESS)
    except SystemExit as exit:
        code = _output_written(exit.code)
        if code != exit.code:
            raise SystemExit(code) from None
        raise


def _closed_stdio_to_devnull() -> None:
    """A command started with stdout or stderr closed (``>&-``) writes that output to
    /dev/null, as a program whose caller discards it, and one started with stdin closed
    (``<&-``) reads nothing from it. Python leaves ``sys.stdout`` (``sys.stdin``) None then
    (``info`` and ``read`` ended in an internal error, exit 70, ``--version`` in a
    traceback, ``append --input -`` in an internal error), and the descriptor free: the
    next file the command opened, a store's file among them, would have taken the number
    output is written to (or input read from)."""
    for number, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        if getattr(sys, name) is not None:
            continue
        try:
            opened = os.open(os.devnull, os.O_RDONLY if mode == "r" else os.O_WRONLY)
            if opened != number:
                os.dup2(opened, number)
                os.close(opened)
            setattr(sys, name, open(number, mode, encoding="utf-8", closefd=False))  # noqa: SIM115
        except OSError:
            pass  # no /dev/null: left as it is


# the unbuffered stdout this process began with: kept, so that it is not closed under the
# buffered one put in its place (see _whole_writes_to_stdout)
_UNBUFFERED_STDOUT: list[Any] = []


def _whole_writes_to_stdout() -> None:
    """Under PYTHONUNBUFFERED (``python -u``; many container images set it) stdout's text
    layer writes straight to the file descriptor, and drops what a short write leaves: on a
    full disk ``info --json`` and ``stats --json`` wrote the first 4 KiB of their document
    and exited 0. A buffer under it writes the rest or raises; it is flushed at each line
    feed, so lines still come out as they are written."""
    stdout = sys.stdout
    if not isinstance(getattr(stdout, "buffer", None), io.RawIOBase):
        return  # buffered already, or not a file (a caller's own stream)
    _UNBUFFERED_STDOUT.append(stdout)
    sys.stdout = io.TextIOWrapper(
        io.BufferedWriter(stdout.buffer),
        encoding=stdout.encoding,
        errors=stdout.errors,
        line_buffering=True,
    )


def _unencodable_escaped() -> None:
    """In a locale whose encoding is not UTF-8 (``LANG=de_DE.ISO-8859-1``,
    ``PYTHONIOENCODING=latin-1``) human output writes a character the encoding lacks as an
    escape (``\\u6807``), as stderr does: ``read``'s table of a message tagged 标签 ended
    in an internal error (exit 70). Data (JSON, CSV, TSV) is UTF-8 whatever the locale
    (:func:`rmqstore.commands.output.write_data`)."""
    stdout = sys.stdout
    if isinstance(stdout, io.TextIOWrapper) and stdout.errors == "strict":
        with contextlib.suppress(LookupError, ValueError):
            if codecs.lookup(stdout.encoding).name != "utf-8":
                stdout.reconfigure(errors="backslashreplace")


def _output_written(code: Any) -> Any:
    """The exit code once the output still in stdout's buffer is written: an output the
    disk had no room for (or another failed write) is exit 4 in one line, where the command
    had succeeded (or found problems: 1); a command that failed keeps its code and its
    line. A failed flush drops what is left in the buffer, so the interpreter's own flush
    at exit does not fail again (Python then printed "Exception ignored in:
    <_io.TextIOWrapper name='<stdout>'...>" and exited 120). A reader that closed the pipe
    (``| head``) is not a failure."""
    if sys.stdout is None:
        return code
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _silence_stdout()
    except OSError as exc:
        _silence_stdout()
        if code in (None, 0, ExitCode.FINDINGS):
            _error(f"I/O failure: cannot write the output: {exc.strerror or exc}")
            return ExitCode.IO
    except ValueError:  # stdout closed by the caller: nothing left to write
        pass
    return code


def _raise_open_file_limit() -> None:
    """Take the open-file limit up to its hard limit, as a broker's start-up asks for its
    own (RocketMQ's scripts want 655,350): a shell's soft limit is often 1,024, while a store
    has thousands of queues and index files. Above the soft limit the engine keeps fewer
    files open and maps them again as it goes, which is slower; the hard limit is never
    passed. Only the command's own process (and its workers, which inherit it)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = hard if hard != resource.RLIM_INFINITY else 1 << 20
        wanted = min(wanted, 1 << 20)
        if soft != resource.RLIM_INFINITY and soft < wanted:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ImportError, OSError, ValueError):
        pass  # kept as it is: the engine keeps within it
