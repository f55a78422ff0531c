"""The store's ``lock`` file (spec §8.3), locked the way a running broker locks it.

The broker calls ``FileChannel.tryLock(0, 1, false)``: an exclusive POSIX record lock on byte 0,
then writes the four bytes ``lock``. On Linux rmqstore takes an *open file description* lock on
the same byte. It conflicts with the JVM's lock exactly like a classic record lock, but it
belongs to our open file rather than to the whole process, so two writers inside one process
also exclude each other and a read-only probe that opens and closes the file cannot drop it
(closing any descriptor drops all of a process's classic record locks). Elsewhere we fall back
to ``fcntl.lockf``. ``flock`` must never be used: it does not see the JVM's lock.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import struct
from enum import Enum
from pathlib import Path
from typing import ClassVar

from rmqstore.errors import StoreBusyError, StoreFormatError, StoreIOError
from rmqstore.segments import pwrite_fully

LOCK_FILE_CONTENT = b"lock"
_OFD_SETLK = getattr(fcntl, "F_OFD_SETLK", None)
_OFD_GETLK = getattr(fcntl, "F_OFD_GETLK", None)
# struct flock on Linux: short l_type, short l_whence, off_t l_start, off_t l_len, pid_t l_pid
_FLOCK = struct.Struct("@hhqqi4x")
_BUSY_ERRNOS = (errno.EACCES, errno.EAGAIN)


class LockState(Enum):
    FREE = "free"
    HELD = "held by another process"
    HELD_HERE = "held by this rmqstore"


def _flock_bytes(lock_type: int) -> bytes:
    return _FLOCK.pack(lock_type, os.SEEK_SET, 0, 1, 0)


def _registry_key(path: Path) -> str:
    """One name per lock file however it is spelled (``./s/../s/lock`` is ``s/lock``)."""
    return os.path.realpath(path)


def _open_regular(path: Path, flags: int) -> int:
    """Open a lock file without waiting on a FIFO, and check that it is a regular file."""
    fd = os.open(path, flags | os.O_NONBLOCK, 0o644)
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise StoreFormatError(f"{path} is not a regular file; a store's lock file is")
    return fd


class StoreLock:
    """An exclusive lock on byte 0 of ``<store>/lock``; released by :meth:`release`."""

    _held_paths: ClassVar[set[str]] = set()

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._key = _registry_key(path)

    def acquire(self) -> None:
        try:
            fd = _open_regular(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise StoreFormatError(
                    f"{self.path} is a symbolic link; writers do not follow links out of the store"
                ) from None
            if exc.errno == errno.EISDIR:
                raise StoreFormatError(
                    f"{self.path} is not a regular file; a store's lock file is"
                ) from None
            raise StoreIOError(f"cannot open {self.path}: {exc.strerror}") from None
        try:
            if _OFD_SETLK is not None:
                fcntl.fcntl(fd, _OFD_SETLK, _flock_bytes(fcntl.F_WRLCK))
            else:
                if self._key in StoreLock._held_paths:
                    raise OSError(errno.EAGAIN, "held by this process")
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
        except OSError as exc:
            os.close(fd)
            if exc.errno in _BUSY_ERRNOS:
                raise StoreBusyError(
                    f"store is busy: {self.path} is locked by another process "
                    "(a running broker or another rmqstore); stop it first"
                ) from None
            raise StoreIOError(f"cannot lock {self.path}: {exc.strerror}") from None
        try:
            if os.pread(fd, 4, 0) != LOCK_FILE_CONTENT:
                pwrite_fully(fd, LOCK_FILE_CONTENT, 0)
        except OSError as exc:
            os.close(fd)
            raise StoreIOError(f"cannot write {self.path}: {exc.strerror}") from None
        self._fd = fd
        StoreLock._held_paths.add(self._key)

    def release(self) -> None:
        if self._fd is None:
            return
        StoreLock._held_paths.discard(self._key)
        os.close(self._fd)  # closing the descriptor releases the lock
        self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None


def probe_lock(path: Path) -> LockState:
    """Whether someone holds the store lock, without taking it and without disturbing a lock
    this process holds. A lock that cannot be checked is an error, never "free"."""
    if _registry_key(path) in StoreLock._held_paths:
        return LockState.HELD_HERE
    try:
        fd = _open_regular(path, os.O_RDONLY)
    except FileNotFoundError:
        return LockState.FREE  # no lock file: nobody ever locked this store
    except OSError as exc:
        raise StoreIOError(f"cannot check the lock {path}: {exc.strerror}") from None
    try:
        if _OFD_GETLK is not None:
            answer = fcntl.fcntl(fd, _OFD_GETLK, _flock_bytes(fcntl.F_WRLCK))
            lock_type = _FLOCK.unpack(answer)[0]
            return LockState.FREE if lock_type == fcntl.F_UNLCK else LockState.HELD
        try:
            fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, 0)
        except OSError as exc:
            if exc.errno in _BUSY_ERRNOS:
                return LockState.HELD
            raise
        return LockState.FREE
    except OSError as exc:
        raise StoreIOError(f"cannot check the lock {path}: {exc.strerror}") from None
    finally:
        os.close(fd)
