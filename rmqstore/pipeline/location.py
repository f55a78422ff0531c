"""Reading store files where they are: a local path (read with pread) or a ``pyarrow.fs`` URI
(``s3://``, ``hdfs://``, ``gs://``, ``file://``), read in ranges. Executors open files by
themselves from the location and names a partition carries."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rmqstore.consumequeue import holds_rocksdb, rocksdb_names
from rmqstore.errors import InputError, NotAStoreError, StoreFormatError, StoreIOError
from rmqstore.geometry import stated_file_size
from rmqstore.lockfile import LockState, probe_lock
from rmqstore.segments import (
    data_end_estimate,
    is_segment_name,
    settled_data_end,
    usual_size,
)
from rmqstore.topicsconfig import BATCH_CONSUMEQUEUE_DIR, batch_queue_topics, read_topic_table
from rmqstore.windows import FileWindows, ReadWindows, read_range


@dataclass(frozen=True)
class StoreLocation:
    """Where a store root is: ``uri`` as the user gave it."""

    uri: str

    @property
    def remote(self) -> bool:
        return "://" in self.uri

    def _filesystem(self) -> tuple[Any, str]:
        try:
            from pyarrow import fs
        except ImportError as exc:  # pragma: no cover - pyarrow comes with the spark extra
            raise InputError(
                "reading a store by URI needs pyarrow: pip install 'rmqstore[spark]'"
            ) from exc
        try:
            return fs.FileSystem.from_uri(self.uri)
        except Exception as exc:  # pyarrow raises ArrowInvalid and friends
            raise InputError(f"cannot open {self.uri}: {exc}") from None

    def segments(self, relative: str) -> list[tuple[str, int]]:
        """(name, size) of the 20-digit segment files in ``relative``, by name."""
        if not self.remote:
            directory = Path(self.uri) / relative
            if not directory.is_dir():
                return []
            return sorted(
                (entry.name, entry.stat().st_size)
                for entry in os.scandir(directory)
                if is_segment_name(entry.name) and entry.is_file()
            )
        from pyarrow import fs

        filesystem, root = self._filesystem()
        infos = filesystem.get_file_info(
            fs.FileSelector(f"{root.rstrip('/')}/{relative}", allow_not_found=True)
        )
        return sorted(
            (info.base_name, info.size)
            for info in infos
            if info.type == fs.FileType.File and is_segment_name(info.base_name)
        )

    def commitlog_segments(
        self, listed: list[tuple[str, int]] | None = None
    ) -> list[tuple[str, int]]:
        """(name, size) of the commit-log files, by name, as a broker loads them (see
        :meth:`checked_segments`): of the size the store states it has (a local store's
        remembered geometry or ``config/broker.properties``), else all of one size.
        ``listed``: the folder's :meth:`segments`, when the caller has listed it."""
        stated = None if self.remote else stated_file_size(Path(self.uri), "commitlog_file_size")
        return self.checked_segments("commitlog", "commit-log", "the commit log", stated, listed)

    def checked_segments(
        self,
        relative: str,
        kind: str,
        whole: str,
        size: int | None = None,
        listed: list[tuple[str, int]] | None = None,
    ) -> list[tuple[str, int]]:
        """(name, size) of the segment files of ``relative`` (``kind`` files, together
        ``whole``), by name, as a broker loads them: a zero-length last file (a 5.x broker
        deletes it at start-up; a running one has just made it) left out, and a file of
        another ``size`` (by default, than the others) refused: a broker does not load the
        store, rmqstore's commands refuse it, and verify reports it. ``listed``: the folder's
        :meth:`segments`, when the caller has listed it."""
        segments = list(self.segments(relative) if listed is None else listed)
        if segments and segments[-1][1] == 0:
            segments.pop()
        sizes = Counter(found for _, found in segments)
        if size is None and len(sizes) > 1:
            usual = usual_size(sizes)
            said = f"the other files of {whole} are {usual}"
        elif size is not None and set(sizes) - {size}:
            usual, said = size, f"the configured size is {size}"
        else:
            return segments
        name, found = next((name, found) for name, found in segments if found != usual)
        raise StoreFormatError(
            f"{kind} file {self.uri.rstrip('/')}/{relative}/{name} is {found} bytes; {said}: "
            "a broker does not load the store (rmqstore verify reports what else it finds)"
        )

    def directories(self, relative: str) -> list[str]:
        """Names of the sub-directories of ``relative`` (empty when it does not exist)."""
        if not self.remote:
            directory = Path(self.uri) / relative
            if not directory.is_dir():
                return []
            return sorted(
                entry.name for entry in os.scandir(directory) if entry.is_dir(follow_symlinks=False)
            )
        from pyarrow import fs

        filesystem, root = self._filesystem()
        infos = filesystem.get_file_info(
            fs.FileSelector(f"{root.rstrip('/')}/{relative}", allow_not_found=True)
        )
        return sorted(info.base_name for info in infos if info.type == fs.FileType.Directory)

    def queues_in_rocksdb(self) -> bool:
        """Whether ``consumequeue/`` holds a RocksDB database, not queue folders
        (:func:`rmqstore.consumequeue.holds_rocksdb`)."""
        if not self.remote:
            return holds_rocksdb(Path(self.uri) / "consumequeue")
        from pyarrow import fs

        filesystem, root = self._filesystem()
        infos = filesystem.get_file_info(
            fs.FileSelector(f"{root.rstrip('/')}/consumequeue", allow_not_found=True)
        )
        return rocksdb_names({info.base_name for info in infos if info.type == fs.FileType.File})

    def batch_queue_topics(self) -> frozenset[str]:
        """The topics whose queues are in ``batchconsumequeue/`` (5.x BatchCQ topics): those
        with a folder there, and, for a store on this machine, those ``config/topics.json``
        makes BatchCQ (:attr:`rmqstore.store.Store.batch_queue_topics`)."""
        folders = frozenset(self.directories(BATCH_CONSUMEQUEUE_DIR))
        if self.remote:
            return folders
        return folders | batch_queue_topics(read_topic_table(Path(self.uri) / "config"))

    def check_store(self) -> None:
        """Refuse what is not a store with one clear sentence."""
        if not self.uri:
            raise NotAStoreError("no store given: a directory or URI (with Spark: load(STORE))")
        if not self.remote:
            root = Path(self.uri)
            if root.exists() and not root.is_dir():
                raise NotAStoreError(f"{root} is a file, not a store directory")
            if not root.is_dir():
                raise NotAStoreError(f"{root}: no such directory")
            if not (root / "commitlog").is_dir():
                raise NotAStoreError(f"{root} is not a RocketMQ store (no commitlog/ directory)")
            return
        if not self.segments("commitlog"):
            raise NotAStoreError(f"{self.uri} holds no commit-log files")

    def data_end(self, name: str, size: int) -> int:
        """Roughly where the data of commit-log file ``name`` ends (for planning ranges)."""

        def read(position: int, length: int) -> bytes:
            with self.open_range(f"commitlog/{name}", position, length) as (buf, at):
                return bytes(buf[position - at : position - at + length])

        return data_end_estimate(read, size)

    def live_end(self, name: str, size: int) -> int | None:
        """Of a local store whose lock another process holds (a broker writing it): where
        the data of its last commit-log file ``name`` ends now (a file position), returned
        :data:`WRITE_SETTLE` later, when a record being written then is whole; the records
        starting before it are the store as it stood. None for a store nobody else holds
        (or one by URI: its lock cannot be asked)."""
        if self.remote:
            return None
        root = Path(self.uri)
        try:
            if probe_lock(root / "lock") is not LockState.HELD:
                return None
        except (StoreIOError, StoreFormatError):
            return None  # a lock that cannot be asked (or no file): read the store as it is
        return settled_data_end(root / "commitlog" / name, size)

    @contextmanager
    def windows(self, relative: str, limit: int, *, read_ahead: int | None = None) -> Iterator[Any]:
        """The file's bytes ``[0, limit)`` (fewer at its end) for a scan that reads them in
        windows (:class:`rmqstore.windows.FileWindows`): memory stays flat whatever the size
        of the region; windows stop at ``read_ahead`` unless a record needs more."""
        if not self.remote:
            with FileWindows(Path(self.uri) / relative, limit, read_ahead=read_ahead) as windows:
                yield windows
            return
        filesystem, root = self._filesystem()
        path = f"{root.rstrip('/')}/{relative}"
        with filesystem.open_input_file(path) as handle:
            size = handle.size()
            yield ReadWindows(
                lambda position, length: handle.read_at(length, position),
                min(limit, size),
                f"{self.uri.rstrip('/')}/{relative}",
                read_ahead=read_ahead,
            )

    @contextmanager
    def open_range(self, relative: str, start: int, length: int) -> Iterator[tuple[Any, int]]:
        """``(buffer, buffer_start)``: the bytes ``[start, start + length)`` of the file (fewer
        at its end), read into memory (never mapped: a file truncated underneath gives an
        error naming it, not a SIGBUS)."""
        if not self.remote:
            yield read_range(Path(self.uri) / relative, start, length), start
            return
        filesystem, root = self._filesystem()
        with filesystem.open_input_file(f"{root.rstrip('/')}/{relative}") as handle:
            handle.seek(start)
            yield handle.read(length), start
