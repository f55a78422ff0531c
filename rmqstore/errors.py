"""Typed engine errors. Each carries a one-line human message and the CLI exit code for it.

The CLI maps these to exit codes in exactly one place (``rmqstore.commands.main``); the engine
never prints and never exits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import IntEnum


class ExitCode(IntEnum):
    """Exit codes shared by every command (documented in rmqstore(1))."""

    OK = 0
    FINDINGS = 1  # completed and found problems (verify findings, a dry run with work to do)
    USAGE = 2  # usage or input error: bad option, not a store, unreadable or corrupt input
    BUSY = 3  # the store's lock is held by another process (a running broker)
    IO = 4  # I/O failure: disk full, permission denied, fsync failed
    INTERNAL = 70  # a bug in rmqstore (sysexits EX_SOFTWARE); please report it


class RmqStoreError(Exception):
    """Base class of every error the engine raises on purpose."""

    exit_code: ExitCode = ExitCode.USAGE

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class InputError(RmqStoreError):
    """The user's input is wrong: an option value, a JSON line, a topic name, a missing file."""


class NotAStoreError(InputError):
    """The path given as STORE is missing, not a directory, or not a RocketMQ store."""


class StoreFormatError(InputError):
    """A store file is malformed: wrong size, bad name, a record that does not decode."""


class RebuildFirstError(StoreFormatError):
    """A writer refuses the store until ``dispatch --rebuild`` writes its consume queues or
    index anew (a damaged or linked queue or index file, a gap in a queue): the message says
    what and why, and what to run after the rebuild."""


class RecordError(StoreFormatError):
    """A commit-log record failed to decode; names the failing field and the record offset."""

    def __init__(self, field: str, physical_offset: int, reason: str) -> None:
        super().__init__(f"record at offset {physical_offset}: {field} {reason}")
        self.field = field
        self.physical_offset = physical_offset
        self.reason = reason


class TopicError(InputError):
    """A topic name breaks RocketMQ's rules or would not be a safe path component."""


class MessageTooLargeError(InputError):
    """A message body or record exceeds the store's limits."""


class NotFoundError(InputError):
    """A lookup that names exactly one thing (an offset, a message id) found nothing."""


class UncleanStoreError(InputError):
    """The store was not closed cleanly (``abort`` present) and must be recovered first."""


class StoreBusyError(RmqStoreError):
    """The store's ``lock`` is held by another process (a broker or another rmqstore)."""

    exit_code = ExitCode.BUSY


class StoreIOError(RmqStoreError):
    """The operating system refused an operation: disk full, permission denied, fsync failure."""

    exit_code = ExitCode.IO


def read_failure(path: object, exc: OSError) -> StoreIOError:
    """The error for a store file that could not be opened or read. One that is not there
    any more was listed a moment before (readers open the files a listing found): another
    process deleted or moved it since, as a broker deletes its oldest files as they expire
    and a rebuild or recover beside the reader moves files to quarantine."""
    if isinstance(exc, FileNotFoundError):
        return StoreIOError(
            f"{path} is gone since the store was listed (another process deleted or moved it: "
            "a broker deletes its oldest files as they expire, a rebuild or recover moves "
            "files to quarantine): run the command again"
        )
    return StoreIOError(f"cannot read {path}: {exc.strerror}")


class OutputClosedError(StoreIOError):
    """Standard output was closed while a writer was reporting what it stored (its reader,
    such as ``head``, exited): the writer stops, keeping everything durable."""


def add_context(exc: BaseException, text: str) -> None:
    """Add ``text`` to what the CLI says of ``exc`` after its own message: where the work
    stopped and how to go on. Kept in the exception's notes (PEP 678's ``__notes__``, what
    ``add_note`` of Python 3.11 appends to), so a traceback shows it too."""
    exc.__notes__ = [*getattr(exc, "__notes__", ()), text]  # type: ignore[attr-defined]


def failure_text(exc: BaseException) -> str:
    """What went wrong in ``exc``, for a message that reports another error first: an
    OSError as its description and file (``Read-only file system (/store/checkpoint)``)."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror + (f" ({exc.filename})" if exc.filename else "")
    return str(exc)


def context_of(exc: BaseException) -> str:
    """The texts :func:`add_context` added to ``exc``, each after "; " ("" when none)."""
    notes = getattr(exc, "__notes__", None)
    return "".join(f"; {note}" for note in notes) if isinstance(notes, list) else ""


@contextmanager
def on_failure(context: Callable[[], str]) -> Iterator[None]:
    """Whatever the block raises carries ``context()`` (:func:`add_context`), asked for
    when it fails, so it can say how far the work got."""
    try:
        yield
    except BaseException as exc:
        add_context(exc, context())
        raise
