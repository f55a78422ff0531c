"""Where a scan's bytes come from: a buffer already in memory, or a file read window by window
with ``preadv`` into one reused buffer. Scans read files this way rather than through a map,
so a file truncated underneath a reader gives an error naming the file instead of a SIGBUS,
and resident memory stays one window whatever the store's size."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from queue import Full, Queue
from typing import Any, NamedTuple, TypeVar

from rmqstore.errors import StoreIOError, read_failure
from rmqstore.stops import through_stops

WINDOW_BYTES = 8 * 1024 * 1024
T = TypeVar("T")


class BufferWindows:
    """A region wholly in memory: every window is the whole buffer up to ``limit``."""

    def __init__(self, buf: Any, limit: int) -> None:
        self.buf = buf
        self.limit = limit

    def window(self, position: int, need: int) -> tuple[Any, int, int, int]:
        """``(buffer, file position of buffer[0], bytes available, bytes of the region after
        them)`` for a scan at ``position`` that needs ``need`` bytes there."""
        return self.buf, 0, self.limit, 0

    def close(self) -> None:
        pass


def _read_length(position: int, need: int, limit: int, read_ahead: int, window_bytes: int) -> int:
    """How many bytes a window read at ``position`` takes: ``window_bytes``, or what a record
    there needs, but not past ``read_ahead`` unless the record needs it, nor past ``limit``."""
    wanted = min(max(need, 8), limit - position)
    bound = max(min(read_ahead, limit), position + wanted)
    return min(max(window_bytes, need), bound - position)


class FileWindows:
    """A file region ``[0, limit)`` read in windows of at least ``window_bytes`` (larger when a
    record needs more). ``limit`` is taken from the file's size when opened; a file that turns
    out shorter while it is read raises :class:`StoreIOError`. ``read_ahead``: windows do not
    run past this position unless a record needs the bytes beyond it (a scan of a range of
    the file reads little of what follows; a record longer than expected is still read
    whole, up to ``limit``)."""

    def __init__(
        self,
        path: Path,
        limit: int,
        window_bytes: int = WINDOW_BYTES,
        *,
        fresh: bool = False,
        read_ahead: int | None = None,
    ) -> None:
        """``fresh``: every read goes into a new buffer, so earlier windows stay as they were
        for as long as someone holds them (a reader working ahead of its consumer)."""
        self.path = path
        self.fresh = fresh
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise read_failure(path, exc) from None
        try:
            size = os.fstat(self.fd).st_size
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        except OSError as exc:
            os.close(self.fd)
            raise StoreIOError(f"cannot read {path}: {exc.strerror}") from None
        self.limit = min(limit, size)
        self.read_ahead = self.limit if read_ahead is None else read_ahead
        self.window_bytes = window_bytes
        self.buffer = bytearray()
        self.start = 0  # file position of buffer[0]
        self.filled = 0  # valid bytes in buffer

    def window(self, position: int, need: int) -> tuple[Any, int, int, int]:
        """As :meth:`BufferWindows.window`; reads only when the current window does not hold
        ``need`` bytes (or the rest of the region) at ``position``."""
        wanted = min(max(need, 8), self.limit - position)
        end = self.start + self.filled
        if not (self.start <= position and position + wanted <= end):
            self._read(
                position,
                _read_length(position, need, self.limit, self.read_ahead, self.window_bytes),
            )
            end = self.start + self.filled
        return self.buffer, self.start, self.filled, self.limit - end

    def read(self, position: int, length: int) -> bytes:
        """``length`` bytes from ``position`` (fewer at the region's end), apart from the
        windows."""
        length = max(0, min(length, self.limit - position))
        try:
            return os.pread(self.fd, length, position)
        except OSError as exc:
            raise StoreIOError(f"cannot read {self.path}: {exc.strerror}") from None

    def _read(self, position: int, length: int) -> None:
        if self.fresh or len(self.buffer) < length:
            self.buffer = bytearray(length)
        view = memoryview(self.buffer)
        done = 0
        try:
            while done < length:
                try:
                    got = os.preadv(self.fd, [view[done:length]], position + done)
                except OSError as exc:
                    raise StoreIOError(f"cannot read {self.path}: {exc.strerror}") from None
                if got == 0:
                    raise StoreIOError(
                        f"{self.path} ended at byte {position + done} while it was read "
                        f"(it was {self.limit} bytes when the scan began): another process "
                        "truncated it"
                    )
                done += got
        finally:
            view.release()
        self.start = position
        self.filled = length

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> FileWindows:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class ReadWindows:
    """A region ``[0, limit)`` of a file read through ``read(position, length)`` (a remote
    file), in windows as :class:`FileWindows` reads a local one (``read_ahead`` too); ``name``
    names the file in errors."""

    def __init__(
        self,
        read: Any,
        limit: int,
        name: str,
        window_bytes: int = WINDOW_BYTES,
        *,
        read_ahead: int | None = None,
    ) -> None:
        self.read = read
        self.limit = limit
        self.read_ahead = limit if read_ahead is None else read_ahead
        self.name = name
        self.window_bytes = window_bytes
        self.buffer: Any = b""
        self.start = 0
        self.filled = 0

    def window(self, position: int, need: int) -> tuple[Any, int, int, int]:
        """As :meth:`FileWindows.window`."""
        wanted = min(max(need, 8), self.limit - position)
        end = self.start + self.filled
        if not (self.start <= position and position + wanted <= end):
            length = _read_length(position, need, self.limit, self.read_ahead, self.window_bytes)
            data = self.read(position, length)
            if len(data) < length:
                raise StoreIOError(
                    f"{self.name} ended at byte {position + len(data)} while it was read "
                    f"(it was {self.limit} bytes when the scan began)"
                )
            self.buffer, self.start, self.filled = data, position, length
            end = position + length
        return self.buffer, self.start, self.filled, self.limit - end

    def close(self) -> None:
        self.buffer = b""


def read_range(path: Path, start: int, length: int) -> bytes:
    """Bytes ``[start, start + length)`` of a local file, clipped to its size when opened; a
    file that turns out shorter while it is read is an error naming it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise read_failure(path, exc) from None
    try:
        expected = max(0, min(length, os.fstat(fd).st_size - start))
        chunks = []
        done = 0
        while done < expected:
            chunk = os.pread(fd, expected - done, start + done)
            if not chunk:
                raise StoreIOError(
                    f"{path} ended at byte {start + done} while it was read: another process "
                    "truncated it"
                )
            chunks.append(chunk)
            done += len(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise StoreIOError(f"cannot read {path}: {exc.strerror}") from None
    finally:
        os.close(fd)


class _Failed(NamedTuple):
    error: BaseException


_DONE = object()


def read_ahead(batches: Iterator[T], depth: int = 2) -> Iterator[T]:
    """The items of ``batches`` produced by a worker thread up to ``depth`` items ahead of the
    consumer: the reading and scanning (which release the GIL) overlap the consumer's work.
    The items must not share buffers the producer reuses (see ``FileWindows(fresh=True)``).
    An error in the producer is raised here; when the consumer stops early, the producer is
    stopped and ``batches`` closed (its files with it) before this generator finishes."""
    handoff: Queue[Any] = Queue(maxsize=depth)
    stopping = threading.Event()
    ended = threading.Event()  # the producer's code is done

    def offer(item: Any) -> bool:
        while not stopping.is_set():
            try:
                handoff.put(item, timeout=0.05)
                return True
            except Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in batches:
                if not offer(item):
                    return
            offer(_DONE)
        except BaseException as exc:  # handed to the consumer, raised there
            offer(_Failed(exc))
        finally:
            try:
                batches.close()  # type: ignore[attr-defined]
            finally:
                ended.set()

    worker = threading.Thread(target=produce, name="rmqstore-read-ahead", daemon=True)
    worker.start()
    try:
        while True:
            item = handoff.get()
            if item is _DONE:
                return
            if isinstance(item, _Failed):
                raise item.error
            yield item
    finally:
        stopping.set()
        through_stops(ended.wait)  # the producer ends before the interpreter does
        worker.join()
