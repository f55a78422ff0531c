"""The store facade: open a store root read-only, or locked for writing as a broker does.

Read-only opens never create or change a file. A writable open takes the ``lock`` (refusing a
store a broker holds), finds the valid end of the commit log the way recovery would, and creates
``abort`` while writing; a clean close flushes, writes the checkpoint and removes ``abort``
when the consume queues have caught up (as a broker's shutdown does).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from enum import Enum
from functools import cached_property
from pathlib import Path
from typing import Any

from rmqstore.checkpoint import Checkpoint, read_checkpoint, write_checkpoint
from rmqstore.commitlog import CommitLog, CommitLogAppender, LogEnd
from rmqstore.config import (
    StoreConfig,
    check_index_reservation,
)
from rmqstore.consumequeue import (
    ROCKSDB_QUEUES_NOTE,
    ConsumeQueue,
    QueueTip,
    Unit,
    holds_rocksdb,
    list_queues,
)
from rmqstore.delay import DelayLevels
from rmqstore.errors import (
    InputError,
    NotAStoreError,
    NotFoundError,
    RebuildFirstError,
    RmqStoreError,
    StoreBusyError,
    StoreFormatError,
    StoreIOError,
    UncleanStoreError,
    add_context,
    failure_text,
    on_failure,
)
from rmqstore.geometry import (
    CONFIG_DIR,
    geometry_path,
    remember_geometry,
    resolve_geometry,
)
from rmqstore.hosts import DEFAULT_STORE_HOST, HostAddress, parse_host
from rmqstore.indexfile import IndexService, is_index_name
from rmqstore.kernel.layout import (
    PHYSICAL_OFFSET,
    PROPERTIES_AT,
    PROPERTIES_LENGTH,
    QUEUE_ID,
    QUEUE_OFFSET,
    ROW_WIDTH,
    SYS_FLAG,
    TOTAL_SIZE,
    TopicNames,
)
from rmqstore.lockfile import LOCK_FILE_CONTENT, LockState, StoreLock, probe_lock
from rmqstore.msgid import UniqKeyGenerator
from rmqstore.multidispatch import copies_marked, stored_copies
from rmqstore.quarantine import QUARANTINE_DIR, Quarantine
from rmqstore.record import (
    TRANSACTION_MASK,
    TRANSACTION_PREPARED,
    TRANSACTION_ROLLBACK,
    BodyMode,
    record_item,
)
from rmqstore.segments import (
    fsync_directory,
    hard_links,
    make_directories,
    nonzero_extent,
    open_for_writing,
    remove_empty_directory,
    shared_file_error,
    sync_directory,
)
from rmqstore.topics import check_topic_path_safe
from rmqstore.topicsconfig import (
    BATCH_CONSUMEQUEUE_DIR,
    add_topics,
    batch_queue_topics,
    batch_queues_note,
    read_topic_table,
)
from rmqstore.wording import quoted

COMMITLOG_DIR = "commitlog"
CONSUMEQUEUE_DIR = "consumequeue"
DLEDGER_PREFIX = "dledger-"  # dledger-<selfId>/: a DLedger-mode broker's commit log
INDEX_DIR = "index"
CHECKPOINT_FILE = "checkpoint"
ABORT_FILE = "abort"
LOCK_FILE = "lock"
_UNQUEUED = (TRANSACTION_PREPARED, TRANSACTION_ROLLBACK)  # no consume-queue unit
_STORE_MARKERS = (COMMITLOG_DIR, CONSUMEQUEUE_DIR, INDEX_DIR, CHECKPOINT_FILE)


@dataclass
class LogState:
    """What appending needs to know about the records already in the log."""

    queue_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    last_store_timestamp: int = 0
    last_store_host: HostAddress | None = None
    records: int = 0


@dataclass(frozen=True)
class EndRules:
    """What a recovery walk finds the log's end by: a crash's rules (``abort`` there) or a
    normal shutdown's, and the checkpoint (it picks where a crash's walk starts)."""

    abnormal: bool
    checkpoint: Checkpoint | None


@dataclass
class Residue:
    """Non-zero bytes after the valid end of the commit log."""

    pieces: list[tuple[Path, int, int]] = field(default_factory=list)  # (file, start, stop)
    in_later_files: bool = False

    @property
    def total(self) -> int:
        return sum(stop - start for _, start, stop in self.pieces)


def _entries(folder: Path) -> list[os.DirEntry[str]]:
    """The entries of ``folder`` (none when it cannot be listed)."""
    try:
        return list(os.scandir(folder))
    except OSError:
        return []


class Store:
    """An opened store root. Use :meth:`open_read` or :meth:`open_write`; close when done."""

    def __init__(self, root: Path, config: StoreConfig, *, writable: bool) -> None:
        self.root = root
        self.config = config
        self.writable = writable
        self.commitlog_dir = config.commitlog_dir or root / COMMITLOG_DIR
        self.notes: list[str] = []  # things the user should hear about (stderr warnings)
        self._lock: StoreLock | None = None
        self._commitlog: CommitLog | None = None
        # a commit-log file of another size than the configured one is an error (a broker
        # does not load the store); verify opens with it False, to report it and go on
        self.strict_file_sizes = True
        # open_read found the lock held by another process (a broker writing the store)
        self.held_elsewhere = False
        # set by a reader of a store held elsewhere (verify): where the log's data ended when
        # the reader began; what starts past it was written since and is not looked at
        self.live_end: int | None = None
        self._appender: CommitLogAppender | None = None
        self.abort_existed = self.aborted
        # where a broker's recovery walks the log from, for the store as opened (see
        # recovery_start_offset): -1 none, None not asked yet
        self._recovery_from: int | None = None
        self.dispatched_through: int | None = None  # set by dispatch: consume queues' end
        # set by a dispatch that left records out (some topics' queues, no index, a start
        # past where queues end): where the queues reached before it changed anything
        # (rmqstore.dispatch.queue_reach), and whether they now reach further (None: no such
        # dispatch ran); the close then keeps 'abort' (see _settle_abort)
        self.queue_reach_before: int | None = None
        self.partial_dispatch_reaches_further: bool | None = None
        self.tail_verified = False  # nothing but zeros follows the valid end of the log
        # set by work that leaves the store inconsistent until it is done (recover, dispatch
        # --rebuild, a replicate round): stopped by an error, it keeps 'abort', as a broker's
        # crash does, so a broker starting on the store runs its crash recovery (see close)
        self.abort_until_done = False
        # a dispatch of this open has replayed what a crash's recovery replays (dispatch.py)
        self.crash_replayed = False
        self._writing = False
        self._log_end: LogEnd | None = None
        self._creation: _Creation | None = None  # set when this open made the store
        self._list_topics = False  # closing adds the topics appended to config/topics.json
        self._lock_existed = True  # whether the lock file was there before this open
        self._given_config = StoreConfig()  # what the caller said (open_write sets it)

    # -- paths ---------------------------------------------------------------------------------

    @property
    def abort_path(self) -> Path:
        return self.root / ABORT_FILE

    @property
    def aborted(self) -> bool:
        """Whether ``abort`` is there (a link named abort counts, even a dangling one)."""
        return os.path.lexists(self.abort_path)

    @property
    def written_elsewhere(self) -> bool:
        """Whether another process (a broker) holds the store's lock and may be writing it,
        as found when it was opened, or as a reader of it was told (``live_end``)."""
        return self.held_elsewhere or self.live_end is not None

    @property
    def lock_path(self) -> Path:
        return self.root / LOCK_FILE

    @property
    def checkpoint_path(self) -> Path:
        return self.root / CHECKPOINT_FILE

    @property
    def consumequeue_dir(self) -> Path:
        return self.root / CONSUMEQUEUE_DIR

    @property
    def index_dir(self) -> Path:
        return self.root / INDEX_DIR

    # -- opening -------------------------------------------------------------------------------

    @classmethod
    def open_read(
        cls, root: Path | str, config: StoreConfig | None = None, *, strict_file_sizes: bool = True
    ) -> Store:
        """Open an existing store without changing anything. A lock held by a broker is noted.
        Without ``strict_file_sizes`` a commit-log file of another size than the configured
        one is read as it is and recorded in the log's ``queue.problems`` (for verify)."""
        path = Path(root)
        _check_store_root(path, create=False, config=config)
        store = cls(path, resolve_geometry(path, config or StoreConfig()), writable=False)
        store.strict_file_sizes = strict_file_sizes
        state = probe_lock(store.lock_path)
        if state is LockState.HELD:
            store.held_elsewhere = True
            store.notes.append(
                "the store is locked by a running process (a broker?); what is "
                "read may change underneath"
            )
        if store.foreign_log is not None:
            store.notes.append(store.foreign_log)
        return store

    @classmethod
    def open_write(
        cls,
        root: Path | str,
        config: StoreConfig | None = None,
        *,
        create: bool = False,
        replacing: frozenset[str] = frozenset(),
        only_quarantine: bool = False,
        appends_only: bool = False,
    ) -> Store:
        """Open a store for writing with its lock held; ``create`` makes a new, empty store in
        a missing or empty directory. Everything the store says about itself (``abort``, file
        sizes, the valid end) is read only once the lock is held, so a writer that crashed
        just before cannot make a crashed store look clean. ``replacing``: the geometry
        fields (StoreConfig names) whose files the caller replaces whole (a rebuild), so a
        size given for them may differ from the remembered one. A store whose commit log or
        queues rmqstore does not keep (no commit-log folder, a DLedger log, a RocksDB
        database, BatchCQ topics) is refused (:meth:`refuse_foreign_parts`) unless the caller
        ``only_quarantine`` moves pieces to and from quarantine (restore, purge); a caller
        that ``appends_only`` (no dispatch) may open one with BatchCQ topics, whose messages
        its appender refuses."""
        path = Path(root)
        creation = _check_store_root(path, create=create, config=config, writing=True)
        lock_existed = os.path.lexists(path / LOCK_FILE)
        lock = StoreLock(path / LOCK_FILE)
        try:
            lock.acquire()
        except BaseException as exc:
            if creation is not None and not lock_existed and not isinstance(exc, StoreBusyError):
                # the lock file this open made (a full disk refused its bytes): gone again,
                # so a failed creation leaves the directory as it was
                with contextlib.suppress(OSError):
                    if (path / LOCK_FILE).stat().st_size <= len(LOCK_FILE_CONTENT):
                        (path / LOCK_FILE).unlink()
            if creation is _Creation.MADE_ROOT:
                remove_empty_directory(path)
            raise
        store: Store | None = None
        try:
            given = config or StoreConfig()
            store = cls(path, resolve_geometry(path, given, replacing), writable=True)
            store._lock = lock
            store._creation = creation
            store._lock_existed = lock_existed
            store._given_config = given
            if not only_quarantine and store.config.duplication_enable:
                raise InputError(
                    "the broker config says duplicationEnable=true: a 5.x broker's recovery "
                    "then takes a record without a DUP_INFO property (two parts, x_y) for an "
                    "invalid one and cuts the log there; rmqstore's writers neither write it "
                    "nor end the log by that rule, so they leave such a store to the broker "
                    "(the store is unchanged)"
                )
            if not only_quarantine:
                check_index_reservation(store.config.index_slots, store.config.index_entries)
            store.refuse_links_out()
            if not only_quarantine and creation is None:
                store.refuse_foreign_parts(batch_topics=not appends_only)
            if creation is not None:
                make_directories(store.commitlog_dir)
            store.commitlog  # noqa: B018 - load and check the commit log files now
            if not only_quarantine:
                store.refuse_shared_files()
        except BaseException:
            if store is not None:
                store.close(failed=True)
            else:
                lock.release()
                if creation is _Creation.MADE_ROOT:
                    remove_empty_directory(path)
            raise
        return store

    @property
    def commitlog(self) -> CommitLog:
        if self._commitlog is None:
            self._commitlog = CommitLog(
                self.commitlog_dir, self.commitlog_file_size, strict=self.strict_file_sizes
            )
        return self._commitlog

    @property
    def commitlog_file_size(self) -> int:
        assert self.config.commitlog_file_size is not None
        return self.config.commitlog_file_size

    @property
    def consumequeue_file_size(self) -> int:
        assert self.config.consumequeue_file_size is not None
        return self.config.consumequeue_file_size

    def inside(self, path: Path) -> bool:
        """Whether ``path`` resolves (symlinks followed) to a place inside the store root:
        writers never follow a link out of the store."""
        if self._plainly_below_root(path):
            return True
        try:
            return path.resolve().is_relative_to(self._resolved_root)
        except OSError:
            return False

    def _plainly_below_root(self, path: Path) -> bool:
        """Whether ``path`` is the root joined with names (no ``..``) none of which is a
        symbolic link: then it resolves inside the root, told by a look at each entry below
        the root (a store of thousands of queues asks for each one, and resolving walks every
        part of the path from ``/``). An entry that cannot be looked at (not there yet, as a
        queue folder a dispatch is about to make) ends the look: resolving takes it and the
        names after it as they are."""
        root, text = str(self.root), str(path)
        if not text.startswith(root) or text[len(root) : len(root) + 1] != os.sep:
            return False
        names = text[len(root) + 1 :].split(os.sep)
        if ".." in names or "" in names:
            return False
        below = root
        for name in names:
            below = os.path.join(below, name)
            try:
                if stat.S_ISLNK(os.lstat(below).st_mode):
                    return False
            except OSError:
                return True
        return True

    @cached_property
    def _resolved_root(self) -> Path:
        """Where the store root resolves to (once: a store of thousands of queues asks for
        each of them)."""
        return self.root.resolve()

    def refuse_links_out(self) -> None:
        """Writers never follow a link out of the store: a store path a writer may write
        through (its folders, checkpoint, abort, commit-log files) that is a symbolic link
        leading outside the store is refused before anything is written."""
        for path in self.links_out()[:1]:
            raise StoreFormatError(
                f"{path} is a symbolic link leading out of the store; writers never "
                "follow one (put the real file or folder there instead)"
            )

    def refuse_shared_files(self) -> None:
        """Writers change no byte another path holds: a store whose commit-log files, index
        files or checkpoint have other hard links (a copy made with ``cp -al``) is refused
        before anything is written. Consume-queue files are not looked at here (a store may
        hold thousands): one with other hard links is refused where a writer is about to
        write it (:func:`rmqstore.segments.open_for_writing`), and by recover's plan."""
        for path, links in self.shared_files()[:1]:
            raise shared_file_error(path, links)

    def shared_files(self) -> list[tuple[Path, int]]:
        """The store's files a writer writes in place that have other hard links, with how
        many links each has: commit-log files, index files and the checkpoint (a consume
        queue's files are told by its load: ``SegmentQueue.shared``)."""
        found = list(self.commitlog.queue.shared)
        for entry in sorted(_entries(self.index_dir), key=lambda entry: entry.name):
            if entry.is_file(follow_symlinks=False):
                links = entry.stat(follow_symlinks=False).st_nlink
                if links > 1:
                    found.append((Path(entry.path), links))
        with contextlib.suppress(OSError):
            if (links := hard_links(self.checkpoint_path)) > 1:
                found.append((self.checkpoint_path, links))
        return found

    def write_marks(self) -> tuple[Any, ...]:
        """What any writer of the store changes as it goes, to compare over a read that
        takes a while (verify): whether the lock is held, and the identity, size and times
        of the store's folders (a file made, moved or deleted in them), its checkpoint and
        abort, and the last commit-log and index files. A writer that ran between two marks
        changed one of them at least (a broker, append, dispatch and recover write the log,
        the index or the checkpoint, and a writer still running holds the lock); a writer
        that wrote nothing leaves them as they were."""
        paths = [  # not the root itself: a report saved there (verify | tee STORE/x) is no write
            self.commitlog_dir,
            self.consumequeue_dir,
            self.index_dir,
            self.root / CONFIG_DIR,
            self.checkpoint_path,
            self.abort_path,
        ]
        segments = self.commitlog.segments
        if segments:
            paths.append(segments[-1].path)
        index_files = [
            entry.name for entry in _entries(self.index_dir) if is_index_name(entry.name)
        ]
        if index_files:
            paths.append(self.index_dir / max(index_files))
        marks: list[Any] = []
        try:
            marks.append(probe_lock(self.lock_path))
        except StoreIOError:
            marks.append(None)  # a lock that cannot be checked: told apart by the files
        for path in paths:
            try:
                found = os.lstat(path)
            except OSError:
                marks.append(None)
                continue
            marks.append(
                (found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns, found.st_nlink)
            )
        return tuple(marks)

    def links_out(self) -> list[Path]:
        """The store paths a writer may write through (its folders, checkpoint, abort,
        commit-log files) that are symbolic links leading outside the store."""
        paths = [
            self.consumequeue_dir,
            self.index_dir,
            self.root / QUARANTINE_DIR,
            self.root / CONFIG_DIR,
            self.checkpoint_path,
            self.abort_path,
        ]
        if self.config.commitlog_dir is None:  # a configured commit-log folder may be elsewhere
            paths.append(self.commitlog_dir)
        if self.commitlog_dir.is_dir():
            paths.extend(Path(entry.path) for entry in os.scandir(self.commitlog_dir))
        return [path for path in paths if path.is_symlink() and not self.inside(path)]

    @cached_property
    def queues_in_rocksdb(self) -> bool:
        """Whether ``consumequeue/`` holds a RocksDB database (a 5.x broker's
        storeType=defaultRocksDB) instead of consume-queue files."""
        return holds_rocksdb(self.consumequeue_dir)

    @cached_property
    def batch_queue_topics(self) -> frozenset[str]:
        """The topics whose queues a 5.x broker keeps in ``batchconsumequeue/`` (spec §6.7),
        which rmqstore neither reads nor writes: those ``config/topics.json`` gives the
        attribute queue.type=BatchCQ, and those with a folder there."""
        folders = {
            entry.name
            for entry in _entries(self.root / BATCH_CONSUMEQUEUE_DIR)
            if entry.is_dir(follow_symlinks=False)
        }
        return batch_queue_topics(self.topic_table) | folders

    @cached_property
    def topic_table(self) -> tuple[dict[str, Any], Path] | None:
        """``config/topics.json``'s topic table as a broker loads it (its ``.bak`` when the
        file does not load), and the file it came from; read once."""
        return read_topic_table(self.root / CONFIG_DIR)

    @cached_property
    def foreign_log(self) -> str | None:
        """Why this store's commit log is not where rmqstore reads it, or not one it reads
        (None when it is): its folder does not exist (a broker's storePathCommitLog points
        elsewhere, or the log is a DLedger one), or a ``dledger-*`` folder holds a DLedger
        commit log (enableDLegerCommitLog, another record framing)."""
        dledger = sorted(
            entry.name
            for entry in _entries(self.root)
            if entry.name.startswith(DLEDGER_PREFIX) and entry.is_dir(follow_symlinks=False)
        )
        if dledger:
            return (
                f"{self.root / dledger[0]} holds a DLedger commit log (enableDLegerCommitLog), "
                "which rmqstore does not read"
            )
        if not os.path.lexists(self.commitlog_dir):
            return (
                f"{self.commitlog_dir} does not exist: the commit log is elsewhere (give "
                "--broker-config with the broker's storePathCommitLog), or the store has none "
                "(an empty folder there has the log taken as empty, as a broker takes it, "
                "dropping every queue)"
            )
        return None

    def refuse_foreign_parts(self, *, batch_topics: bool = True) -> None:
        """Writers refuse a store whose commit log or queues rmqstore does not keep: no
        commit-log folder or a DLedger log (:attr:`foreign_log`: recovery would cut every
        queue for a log it cannot see), consume queues in a RocksDB database, or
        (``batch_topics``) BatchCQ topics' queues. Appending needs each queue's next offset,
        which only those hold, and dispatch, recovery and flush would write (or cut, or vouch
        for) queue files its broker does not read, or leave those queues pointing past what
        they cut."""
        if self.foreign_log is not None:
            raise StoreFormatError(f"{self.foreign_log}; rmqstore writes nothing in this store")
        what = self.foreign_queues(batch_topics=batch_topics)
        if what is not None:
            raise StoreFormatError(
                f"{what}; rmqstore writes nothing in such a store (its broker recovers and "
                "dispatches it at start-up); read, verify, stats and export read its commit log"
            )

    def foreign_queues(self, *, batch_topics: bool = True) -> str | None:
        """What of the store's queues rmqstore does not keep, said in a phrase: consume
        queues in a RocksDB database, or (``batch_topics``) BatchCQ topics' queues; None when
        it keeps them all."""
        if self.queues_in_rocksdb:
            return f"{self.consumequeue_dir} {ROCKSDB_QUEUES_NOTE}"
        if batch_topics and self.batch_queue_topics:
            return (
                f"{batch_queues_note(self.batch_queue_topics)}, which rmqstore neither reads "
                "nor writes"
            )
        return None

    def queues_unread(self, topic: str) -> str | None:
        """Why ``topic``'s queues are not read: they are in a RocksDB database, or in
        ``batchconsumequeue/`` (a BatchCQ topic); None when they are consume-queue files."""
        if self.queues_in_rocksdb:
            where = f"{self.consumequeue_dir} {ROCKSDB_QUEUES_NOTE}"
        elif topic in self.batch_queue_topics:
            where = batch_queues_note([topic])
        else:
            return None
        return (
            f"{where}, which rmqstore does not read (find messages by --offset, --from-offset, "
            "--msg-id or --key instead)"
        )

    def consume_queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        """An existing consume queue, read-only, with its min offset corrected as at load."""
        check_topic_path_safe(topic)
        directory = self.consumequeue_dir / topic / str(queue_id)
        unread = self.queues_unread(topic)
        if unread is not None:
            raise NotFoundError(
                f"no consume queue for topic {quoted(topic)} queue {queue_id}: {unread}"
            )
        if not directory.is_dir() or not self.inside(directory):
            known = self.topics_with_queues()
            hint = (
                f" (topics with queues: {', '.join(known[:10])})"
                if known
                else (" (the store has no consume queues; run rmqstore dispatch)")
            )
            raise NotFoundError(
                f"no consume queue for topic {quoted(topic)} queue {queue_id}{hint}"
            )
        return self.listed_queue(topic, queue_id)

    def listed_queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        """A consume queue :func:`list_queues` found (a folder below ``consumequeue/``, no
        link on the way), read-only, as :meth:`consume_queue` opens it, without looking at
        its folder again (``info`` of a store of 100,000 LMQ queues spent 3 s so)."""
        return ConsumeQueue(
            self.consumequeue_dir,
            topic,
            queue_id,
            self.consumequeue_file_size,
            commitlog_min_offset=self.commitlog.min_offset,
        )

    def topics_with_queues(self) -> list[str]:
        """The topics that have a consume-queue folder, sorted (for hints at a mistyped topic)."""
        return sorted({topic for topic, _ in list_queues(self.consumequeue_dir)})

    def index_service(self) -> IndexService:
        """The index files, read-only (their geometry comes from the configuration)."""
        return IndexService(self.index_dir, self.config.index_slots, self.config.index_entries)

    def checkpoint(self) -> Checkpoint | None:
        return read_checkpoint(self.checkpoint_path)

    def lock_state(self) -> LockState:
        return probe_lock(self.lock_path)

    def refuse_if_locked(self) -> None:
        """For a dry run: what a writer would do is planned only where a writer could run."""
        if self.lock_state() is LockState.HELD:
            raise StoreBusyError(
                f"store is busy: {self.lock_path} is locked by another process (a running "
                "broker or another rmqstore); stop it first"
            )

    def end_rules(self) -> EndRules:
        """What :meth:`log_end` would find the end by if asked now: whether ``abort`` is
        there (the rules of a crash) and the checkpoint."""
        return EndRules(self.aborted, self.checkpoint())

    def log_end(
        self, progress: Callable[[int], None] | None = None, *, rules: EndRules | None = None
    ) -> LogEnd:
        """The valid end of the commit log as the broker's recovery would find it (computed
        once; not cached while appending, which moves it). ``rules``: those of an earlier
        :meth:`end_rules`, for the end as it would have been found then (the log unchanged
        since), when it is asked only later."""
        if self._log_end is not None and self._appender is None:
            return self._log_end
        if rules is None:
            rules = self.end_rules()
        self._log_end = self.commitlog.valid_end(
            check_crc=self.config.check_crc_on_recover,
            abnormal=rules.abnormal,
            checkpoint=rules.checkpoint,
            progress=progress,
            property_crc=self.config.force_verify_prop_crc,
        )
        return self._log_end

    def recovery_start_offset(self) -> int | None:
        """Where a broker's recovery walks the commit log from (the start of a file; None
        without files), for the store as it was opened: its ``abort`` and checkpoint then.
        A writer makes ``abort`` as it begins, and a rebuild then resets the checkpoint's
        times, either of which would move it; so it is taken when writing begins, if not
        asked before. Where a replay of the log checks CRCs from, and where damage stops
        being what no recovery cuts."""
        if self._recovery_from is None:
            start = self.commitlog.recovery_start(self.checkpoint(), self.abort_existed)
            self._recovery_from = -1 if start is None else start.start
        return None if self._recovery_from < 0 else self._recovery_from

    def valid_end_as_opened(self) -> int:
        """The valid end a broker's recovery finds for the store as it was opened (see
        :meth:`recovery_start_offset`; :meth:`log_end` computed once writing began takes
        the rules of a crash). Computed each time: only a replay stopped early asks."""
        start = self.recovery_start_offset()
        return self.commitlog.valid_end(
            check_crc=self.config.check_crc_on_recover,
            abnormal=self.abort_existed,
            checkpoint=self.checkpoint(),
            property_crc=self.config.force_verify_prop_crc,
            start=None if start is None else self.commitlog.queue.find(start),
        ).offset

    def reload_files(self) -> None:
        """Forget the loaded commit-log files and valid end (after recovery cut or moved
        files); the next use loads them again."""
        if self._commitlog is not None:
            self._commitlog.close()
            self._commitlog = None
        self._log_end = None

    def remember_log_end(self, end: LogEnd) -> None:
        """Record an end found by a scan that walked the log the way recovery does."""
        if self._appender is None:
            self._log_end = end

    # -- writing -------------------------------------------------------------------------------

    def appender(
        self,
        *,
        clock: Callable[[], int] | None = None,
        uniq_keys: UniqKeyGenerator | None = None,
        allow_v2: bool = True,
        store_host: HostAddress | None = None,
        trailing_separator: bool = True,
        list_topics: bool = False,
        multi_dispatch: bool = False,
        undispatched: bool = False,
    ) -> CommitLogAppender:
        """Prepare to append: find the valid end, deal with bytes after it, learn the queue
        offsets, then create ``abort``. Refuses a crashed store whose tail is not clean, and
        one with a consume-queue folder that is a link (its queues' offsets are unknown).
        ``undispatched``: the messages are left for a broker's start to dispatch, so the
        'abort' made stays; a store opened without one is refused when a broker's crash
        recovery would then end its log early (:meth:`crash_recovery_cut`).
        With ``list_topics``, closing the store adds the topics and queues appended to that
        ``config/topics.json`` lacks (written anew for a store this open created).
        ``multi_dispatch``: messages naming further queues get offsets in them, as with the
        broker's enableMultiDispatch (:class:`CommitLogAppender`)."""
        if self._appender is not None:
            return self._appender
        self._list_topics = list_topics
        self._require_writable()
        linked: list[Path] = []
        queues = list_queues(self.consumequeue_dir, linked)
        for link in linked[:1]:  # before anything moves
            raise StoreFormatError(
                f"{link} is a symbolic link, which rmqstore does not follow, so the next "
                "queue offsets of its queues are unknown; rmqstore dispatch --rebuild --yes "
                "moves it to quarantine and rebuilds its queues in the store"
            )
        end = self.log_end()
        state = self.log_state(end, queues)  # (refuses a dispatch hole before anything moves)
        if undispatched and not self.aborted:
            cut = self.crash_recovery_cut()
            if cut is not None:
                offset, reason = cut
                raise UncleanStoreError(
                    "appended messages left undispatched leave 'abort', and a broker's crash "
                    f"recovery would then end the log at offset {offset:,} ({reason}), in a "
                    "file its normal recovery does not walk, and delete the records after "
                    "it: append with --dispatch (the store is unchanged)"
                )
        self._clear_residue(end)
        host = (
            store_host or _config_host(self.config) or state.last_store_host or DEFAULT_STORE_HOST
        )
        self._appender = CommitLogAppender(
            self.commitlog,
            end.offset,
            state.queue_offsets,
            store_host=host,
            max_message_size=self.config.max_message_size,
            delay_levels=DelayLevels(self.config.message_delay_level),
            append_crc_property=self.config.append_prop_crc,
            allow_v2=allow_v2,
            clock=clock,
            uniq_keys=uniq_keys,
            last_store_timestamp=state.last_store_timestamp,
            trailing_separator=trailing_separator,
            # the broker uses the pool only with ASYNC_FLUSH (isTransientStorePoolEnable)
            refused_topics={
                topic: f"{batch_queues_note([topic])}, whose next queue offsets rmqstore cannot "
                "learn: its messages are not appended"
                for topic in self.batch_queue_topics
            },
            transient=self.config.transient_store_pool_enable
            and self.config.flush_disk_type == "ASYNC_FLUSH",
            preallocate=self.config.warm_mapped_file_enable,
            multi_dispatch=multi_dispatch,
        )
        self.begin_write()
        return self._appender

    def _require_writable(self) -> None:
        if not self.writable:
            raise RuntimeError("store was opened read-only")

    def begin_write(self) -> None:
        """Mark the store as being written: create ``abort``, as a broker does at start."""
        self._require_writable()
        if self._writing:
            return
        with contextlib.suppress(RmqStoreError, OSError):  # a log that does not load: later
            self.recovery_start_offset()  # before 'abort' and a rebuild's checkpoint move it
        if not self.aborted:
            os.close(open_for_writing(self.abort_path, os.O_CREAT | os.O_EXCL))
            self._writing = True  # 'abort' is there: the close settles it, even if this fails
            sync_directory(self.root)
        self._writing = True

    @property
    def writing(self) -> bool:
        """Whether :meth:`begin_write` has marked the store as being written."""
        return self._writing

    @contextlib.contextmanager
    def until_done(
        self,
        operation: str,
        kept: Callable[[], str] = lambda: "",
        changed: Callable[[], bool] = lambda: True,
        tidy: Callable[[], None] = lambda: None,
    ) -> Iterator[None]:
        """The block's work leaves the store inconsistent until it is done (``recover``,
        ``dispatch``, a ``replicate`` round): stopped by an error once ``changed()`` (it
        changed the store: by default as soon as it began), it keeps 'abort'
        (:attr:`abort_until_done`), and what it raises says how far it got (:meth:`how_far`,
        ``kept()`` saying where what it moved is kept). Stopped before it changed the store,
        ``tidy()`` takes away what the work made that holds nothing yet (the empty files and
        folders a dispatch makes), so the store is left as it was found. Inside another
        operation's block (the dispatch a ``recover`` replays) it adds nothing: the outer one
        says how far."""
        if self.abort_until_done:
            yield
            return
        self.abort_until_done = True
        written_before = self._writing  # by this open, before the block (append --dispatch)
        try:
            with on_failure(lambda: self.how_far(operation, kept(), changed(), written_before)):
                yield
        except BaseException:
            if not changed():  # the close settles 'abort' as if the work had not begun
                self.abort_until_done = False
                tidy()
            raise
        self.abort_until_done = False  # done: the close settles 'abort' as usual

    def how_far(
        self, operation: str, kept: str, changed: bool = True, written_before: bool = False
    ) -> str:
        """What the error that stopped ``operation`` (work run :meth:`until_done`) adds
        about the store: unchanged, or changed and left under 'abort' for the operation to be
        run again; ``kept`` says where what it cut or moved is kept ("" when nowhere, or not
        known yet). ``written_before``: this open wrote the store before the operation began
        (the records of an ``append --dispatch``), so an operation that changed nothing did
        not leave the store as it found it at the open."""
        if written_before and not changed:
            return f"{operation} stopped before it changed anything more"
        if not self._writing or not changed:
            return f"{operation} stopped before it changed the store"
        return (
            f"{operation} stopped part way and left 'abort' in place (a broker starting on the "
            f"store runs its crash recovery); run rmqstore {operation} again once the cause is "
            f"mended{kept}"
        )

    def begin_write_keeping_state(self, quarantine: Quarantine) -> None:
        """:meth:`keep_state` in ``quarantine`` (a folder just made), then
        :meth:`begin_write`. Stopped before 'abort' is made (a full disk while copying the
        checkpoint), the store is unchanged and the folder, holding copies only, is removed:
        no empty folder is left for ``quarantine list`` to show and a restore to undo."""
        try:
            self.keep_state(quarantine)
            self.begin_write()
        except BaseException:
            if not self._writing:
                quarantine.discard()
            raise

    def keep_state(self, quarantine: Quarantine) -> None:
        """Keep the checkpoint and ``abort`` as they were when this store was opened in
        ``quarantine``, so that its restore gives them back along with its pieces (a
        restored torn tail under ``abort`` is recovered again at a broker's start)."""
        quarantine.keep_copy(self.checkpoint_path, True, "the checkpoint")
        quarantine.keep_copy(self.abort_path, self.abort_existed, "abort")

    def normal_recovery_cut(self) -> tuple[int, str] | None:
        """Where a broker's normal recovery (no 'abort': it walks the last three files)
        would end the log before the file its crash recovery starts at, as the checkpoint
        now picks it, and why (damage in a file only the normal recovery walks): started
        without 'abort', a broker cuts the log there and deletes the files after it, records
        its crash recovery keeps. None when it would not."""
        normal, crash = self._recovery_starts()
        if normal is None or crash is None or normal >= crash:
            return None
        opened_from = self.recovery_start_offset() if self.abort_existed else None
        if opened_from is not None and opened_from <= normal:
            # the crash recovery of the store as opened walked those files by the same rules:
            # damage there ends (or ended) its log too, so a normal recovery cuts nothing more
            return None
        return self._walk_cut(normal, crash)

    def crash_recovery_cut(self, checkpoint: Checkpoint | None = None) -> tuple[int, str] | None:
        """Where a broker's crash recovery (with 'abort': it walks from the file the
        checkpoint picks, CRCs checked when checkCRCOnRecover) would end the log before the
        third-last file, where its normal recovery starts, and why (damage in a file only
        the crash recovery walks): a store left with an 'abort' it did not have loses the
        records after it at a broker's next start. None when it would not. ``checkpoint``:
        the one the work about to be done leaves (a rebuild resets its times), else the
        store's as it is now."""
        normal, crash = self._recovery_starts(checkpoint)
        if normal is None or crash is None or crash >= normal:
            return None
        return self._walk_cut(crash, normal)

    def _recovery_starts(
        self, checkpoint: Checkpoint | None = None
    ) -> tuple[int | None, int | None]:
        """Where a broker's normal and crash recoveries would start walking the log as its
        files are now, with ``checkpoint`` (else the store's as it is now; None: no files)."""
        if checkpoint is None:
            checkpoint = self.checkpoint()
        starts = (self.commitlog.recovery_start(checkpoint, abnormal) for abnormal in (False, True))
        normal, crash = (None if start is None else start.start for start in starts)
        return normal, crash

    def _walk_cut(self, start: int, boundary: int) -> tuple[int, str] | None:
        """Where a recovery's walk from ``start`` ends the log before the file starting at
        ``boundary``, and why; None when it reaches that file."""
        scan = self.commitlog.scan_short_of(
            start,
            boundary,
            check_crc=self.config.check_crc_on_recover,
            property_crc=self.config.force_verify_prop_crc,
        )
        if scan is None or scan.end_offset >= boundary:
            return None
        if scan.error is None:
            return scan.end_offset, ZEROS_WHERE_RECORDS_GO_ON
        return scan.end_offset, str(scan.error).removeprefix(
            f"record at offset {scan.end_offset}: "
        )

    def residue_after(self, end: LogEnd) -> Residue:
        """Non-zero bytes after the valid end of the log: in its last file, and in later files
        (which a broker's recovery deletes)."""
        log = self.commitlog
        residue = Residue()
        for segment in log.segments:
            if end.segment is None or segment.start < end.segment.start:
                continue
            start = end.offset - segment.start if segment is end.segment else 0
            extent = nonzero_extent(segment.path, start, log.file_size)
            if extent is not None:
                residue.pieces.append((segment.path, start, extent[1]))
                if segment is not end.segment:
                    residue.in_later_files = True
        return residue

    def check_tail(self, end: LogEnd) -> bool:
        """Whether nothing but zeros follows the valid end; remembered for :meth:`close`."""
        self.tail_verified = not self.residue_after(end).pieces
        return self.tail_verified

    def _clear_residue(self, end: LogEnd) -> None:
        """Bytes after the valid end: a broker overwrites stale bytes left by its own recovery,
        but after a crash (``abort`` present) they are an unrecovered torn tail. Stale bytes
        are quarantined and zeroed before appending; a torn tail is refused."""
        residue = self.residue_after(end)
        if not residue.pieces:
            self.tail_verified = True
            return
        where = f"{residue.total} non-zero bytes after the last valid record (offset {end.offset})"
        reason = f" ({end.error})" if end.error else ""
        if self.abort_existed or residue.in_later_files:
            raise UncleanStoreError(
                f"the store was not closed cleanly: {where}{reason}; a broker's recovery "
                "must truncate it first (start the broker once, or run rmqstore recover)"
            )
        quarantine = Quarantine.create(self.root, "append")
        for path, start, stop in residue.pieces:
            quarantine.cut_region(
                path,
                start,
                stop,
                "stale bytes after the valid end of the commit log, overwritten by append",
            )
        self.tail_verified = True
        self.notes.append(f"moved {where} to {quarantine.directory} before appending")
        self.commitlog.forget_maps()

    def _refuse_lost_queue_files(self, unitless: set[tuple[str, int]], cursor: int) -> None:
        """StoreFormatError when the commit log holds, before ``cursor`` (where the consume
        queues end), a record of one of the ``unitless`` queues: folders that hold no unit. A
        broker makes a queue's folder with its first unit's file, and its recovery deletes
        the files whose units all point past the log's valid end, so a queue without units
        whose records the log holds lost its files: appending would give the next message a
        queue offset a stored one has. Read only in that case, the log up to ``cursor``
        (the records after it are counted as appending learns the offsets)."""
        log = self.commitlog
        queue_ids = {queue_id for _, queue_id in unitless}
        topics = TopicNames()
        for window, _window_start, rows, count in log.scan(log.min_offset).batches():
            for row in range(count):
                at = row * ROW_WIDTH
                offset = rows[at + PHYSICAL_OFFSET]
                if offset >= cursor:
                    return
                if rows[at + QUEUE_ID] not in queue_ids:
                    continue
                if rows[at + SYS_FLAG] & TRANSACTION_MASK in _UNQUEUED:
                    continue
                key = (topics.of(window, rows, row), rows[at + QUEUE_ID])
                if key in unitless:
                    raise RebuildFirstError(
                        _lost_files_refusal(key, offset, rows[at + QUEUE_OFFSET])
                    )

    def _refuse_lost_units(
        self, key: tuple[str, int], unit: Unit, ends_at: int, cursor: int
    ) -> None:
        """StoreFormatError when ``unit``, found after the valid end of queue ``key`` (at
        queue offset ``ends_at``), is the queue's own: it points, before ``cursor`` (where
        the consume queues end, where a dispatch resumes), at a record of that queue with
        the unit's queue offset. The queue lost the units from its end up to it (a unit in
        the middle overwritten: a broker's walk ends the queue there too), and their records,
        behind where a dispatch resumes, come back only by a rebuild (or the crash recovery
        an ``abort`` asks for): appending would give the next message a queue offset a stored
        one has. A stale unit a broker's recovery left after the end points at the log's end
        or past it, or at another record."""
        if not 0 <= unit.physical_offset < cursor:
            return
        try:
            held = self.commitlog.read(unit.physical_offset, body=BodyMode.SKIP)
        except (RmqStoreError, OSError):
            return  # not a record there: no evidence
        topic, queue_id = key
        if (held.topic, held.queue_id, held.queue_offset) != (topic, queue_id, unit.queue_offset):
            return
        raise RebuildFirstError(
            f"the consume queue of {topic}:{queue_id} ends at queue offset {ends_at} (the unit "
            f"there is not valid), but holds units past it: unit {unit.queue_offset} points at "
            f"the record at offset {unit.physical_offset}, which has that queue offset: the "
            "queue lost the units between, and an appended message would take a queue offset "
            "a stored message has; run rmqstore dispatch --rebuild --yes first (rmqstore "
            "verify shows the damage)"
        )

    def log_state(self, end: LogEnd, queues: list[tuple[str, int]]) -> LogState:
        """What appending continues from, learnt as a broker's start-up learns it
        (``recoverTopicQueueTable`` once the dispatcher has caught up): each queue's next
        offset is its consume queue's max offset, moved on by the records after the point
        where the consume queues end, put by the consume queues' own rules. The walk starts at
        the last queued record (whose store time and host the next record follows), so a
        dispatched store reads only its tail. A log that cannot be read from there to its
        valid end is refused rather than guessed at."""
        log = self.commitlog
        tips: dict[tuple[str, int], QueueTip | None] = {}
        cursor = -1  # where the consume queues end
        last_queued = -1  # start of the newest record a consume queue points to
        past_ends: dict[tuple[str, int], list[Unit]] = {}  # units found after a queue's end
        for topic, queue_id in queues:
            queue = ConsumeQueue(
                self.consumequeue_dir, topic, queue_id, self.consumequeue_file_size
            )
            queue.refuse_until_rebuilt(  # (the appender reads its queues: a link is read)
                "an appended message could take a queue offset a stored one has", writes=False
            )
            tip = QueueTip.of(queue)
            tips[(topic, queue_id)] = tip
            past_end = queue.units_after_end()
            if past_end:
                past_ends[(topic, queue_id)] = past_end
            # a queue with a unit past its first file's start: the load read its last unit
            if tip is not None and queue.loaded_last_unit is not None:
                cursor = max(cursor, tip.max_physical_offset)
                last_queued = max(last_queued, queue.loaded_last_unit.physical_offset)
        if cursor > end.offset:
            raise UncleanStoreError(
                f"the consume queues point past the valid end of the commit log ({cursor} > "
                f"{end.offset}): run rmqstore recover first"
            )
        start = last_queued if 0 <= last_queued < end.offset else log.min_offset
        cursor = max(cursor, log.min_offset)
        unitless = {key for key, tip in tips.items() if tip is None or tip.max_offset == 0}
        if unitless:
            self._refuse_lost_queue_files(unitless, min(cursor, end.offset))
        for key, units in past_ends.items():
            tip = tips[key]
            ends_at = tip.max_offset if tip is not None else 0
            for unit in units:  # (junk first, then the queue's own, after a unit overwritten)
                self._refuse_lost_units(key, unit, ends_at, min(cursor, end.offset))
        state = LogState()
        last = None
        scan = log.scan(start)
        reached_end = False
        topics = TopicNames()
        for window, _window_start, rows, count in scan.batches():
            offsets = rows[PHYSICAL_OFFSET : count * ROW_WIDTH : ROW_WIDTH]
            kept = bisect_left(offsets, end.offset)
            if kept:
                state.records += kept
                last = record_item(window, rows, kept - 1, topics)[1]
            first = bisect_left(offsets, cursor, 0, kept)
            marked = copies_marked(window, rows, kept, first)  # units in further queues
            for row in range(first, kept):
                at = row * ROW_WIDTH
                if rows[at + SYS_FLAG] & TRANSACTION_MASK in _UNQUEUED:
                    continue
                key = (topics.of(window, rows, row), rows[at + QUEUE_ID])
                tip = tips.get(key)
                if (
                    tip is not None
                    and rows[at + QUEUE_OFFSET] > tip.max_offset
                    and offsets[row] + rows[at + TOTAL_SIZE] > tip.max_physical_offset
                ):
                    replay = self.recovery_start_offset() if self.abort_existed else None
                    raise RebuildFirstError(
                        _hole_refusal(
                            key,
                            rows[at + QUEUE_OFFSET],
                            tip,
                            replay is not None and replay <= tip.max_physical_offset,
                        )
                    )
                tips[key] = QueueTip.after_put(
                    tip, rows[at + QUEUE_OFFSET], offsets[row], rows[at + TOTAL_SIZE]
                )
                if marked and copies_marked(window, rows, row + 1, row):
                    _put_copies(tips, window, rows, row, key)
            if kept < count:
                reached_end = True
                break
        if not reached_end and scan.end_offset < end.offset:
            reason = f" ({scan.error})" if scan.error else ""
            raise StoreFormatError(
                f"the commit log cannot be read from {start} to its valid end {end.offset}: it "
                f"stops at {scan.end_offset}{reason}, so the next queue offsets are unknown; "
                "rmqstore verify shows the damage"
            )
        state.queue_offsets = {key: tip.max_offset for key, tip in tips.items() if tip}
        if last is not None:
            state.last_store_timestamp = last.store_timestamp
            state.last_store_host = HostAddress.from_field(last.store_host)
        return state

    def keep_lock(self) -> StoreLock:
        """Take over the store's lock (opened for writing): closing then leaves it held, for
        the caller to release, so that what the work left can be read (recover's check)
        before another writer may come between."""
        if self._lock is None:
            raise RuntimeError("keep_lock of a store not opened for writing")
        lock, self._lock = self._lock, None
        return lock

    def close(self, *, failed: bool = False) -> None:
        """Flush and release the lock (unless the caller took it over: :meth:`keep_lock`).
        ``abort`` goes as at a broker's shutdown: when what was written is in the consume
        queues. A pre-existing ``abort`` goes only when dispatch reached the end of the log
        and nothing follows it (the store is consistent again). ``failed``: the work ended
        with an error; a store this open created is then removed again unless it holds a
        message, and ``abort`` stays if the work was marked :attr:`abort_until_done`."""
        try:
            appended, end_offset, flush_failed = 0, None, False
            if self._appender is not None:
                appender = self._appender
                self._appender = None
                appender.close()
                appended, end_offset = appender.appended, appender.end_offset
                flush_failed = appender.flush_failure is not None
                if appended and not flush_failed:
                    previous = self.checkpoint() or Checkpoint()
                    write_checkpoint(
                        self.checkpoint_path,
                        replace(previous, physic_msg_timestamp=appender.last_store_timestamp),
                    )
                    if self._list_topics:
                        self.notes.extend(
                            add_topics(
                                self.root / CONFIG_DIR,
                                appender.queues_appended(),
                                appender.last_store_timestamp,
                                create=self._creation is not None,
                            )
                        )
            # after a failed flush neither the checkpoint nor a removed 'abort' may say the
            # log is whole: a broker's start then checks its tail (crash recovery)
            if self._writing and not (failed and self.abort_until_done) and not flush_failed:
                self._settle_abort(appended, end_offset)
            if not failed and (self._writing or self._creation is not None):
                remember_geometry(
                    self.root, self._given_config, self.config, created=self._creation is not None
                )
        finally:
            if self._commitlog is not None:
                self._commitlog.close()
            if self._lock is not None:
                if failed and self._creation is not None and not self._holds_messages():
                    self._undo_creation()
                self._lock.release()
                self._lock = None

    def _holds_messages(self) -> bool:
        """Whether any commit-log file holds a non-zero byte (read straight from the
        directory: this runs while closing, whatever state the files are in)."""
        if not self.commitlog_dir.is_dir():
            return False
        for entry in os.scandir(self.commitlog_dir):
            if entry.is_file(follow_symlinks=False):
                size = entry.stat(follow_symlinks=False).st_size
                if nonzero_extent(Path(entry.path), 0, size) is not None:
                    return True
        return False

    def _undo_creation(self) -> None:
        """Remove what creating the store made (all of it empty: zero-filled commit-log files,
        ``abort``, the remembered geometry, ``lock`` unless it was there before) so a failed
        ``--create`` leaves the directory as it was. Only empty directories are removed."""
        self.reload_files()
        if self.commitlog_dir.is_dir():
            for entry in os.scandir(self.commitlog_dir):
                if entry.is_file(follow_symlinks=False):
                    os.unlink(entry.path)
        made = [self.abort_path, geometry_path(self.root)]
        for path in made if self._lock_existed else [*made, self.lock_path]:
            path.unlink(missing_ok=True)
        for directory in (
            self.commitlog_dir,
            geometry_path(self.root).parent,
            self.consumequeue_dir,
            self.index_dir,
        ):
            remove_empty_directory(directory)
        fsync_directory(self.root)
        if self._creation is _Creation.MADE_ROOT:
            remove_empty_directory(self.root)

    def _settle_abort(self, appended: int, end_offset: int | None) -> None:
        # records a dispatch left out, before where the queues now reach, a broker starting
        # without 'abort' would never dispatch
        if self.partial_dispatch_reaches_further is not None:
            left_out = (
                "this dispatch left records out (other topics' queues with --topic, the "
                "index with --no-index, those before --from-offset)"
            )
            if self.partial_dispatch_reaches_further:
                self.notes.append(
                    f"{left_out} and the queues now reach past them, so 'abort' is kept: a "
                    "broker's crash recovery dispatches them (or run rmqstore dispatch)"
                )
            elif self.abort_existed:
                self.notes.append(f"{left_out}, so 'abort' stays")
            else:
                self._remove_abort()  # the queues reach no further than before
            return
        caught_up = self.dispatched_through is not None and (
            end_offset is None or self.dispatched_through >= end_offset
        )
        if not self.abort_existed and (appended == 0 or caught_up):
            self._remove_abort()
        elif self.abort_existed and caught_up and self.tail_verified:
            cut = self.normal_recovery_cut()
            if cut is not None:
                self.notes.append(
                    f"'abort' is kept: {normal_recovery_cut_text(*cut)}; with 'abort' a "
                    "broker's crash recovery starts after the damage and keeps them"
                )
                return
            self._remove_abort()
            self.notes.append(
                "the consume queues and index now cover the whole commit log and nothing "
                "follows its end, so 'abort' was removed (no crash recovery is needed)"
            )
        elif appended:
            self.notes.append(
                "the consume queues do not include the appended messages, so 'abort' is left "
                "in place: a broker re-dispatches them when it starts"
                + ("" if self.batch_queue_topics else " (or run rmqstore dispatch)")
            )

    def _remove_abort(self) -> None:
        try:
            self.abort_path.unlink(missing_ok=True)
            fsync_directory(self.root)
        except OSError as exc:
            raise StoreIOError(f"cannot remove {self.abort_path}: {exc.strerror}") from None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, *_: object) -> None:
        if exc is None:
            self.close()
            return
        try:
            self.close(failed=True)
        except (RmqStoreError, OSError) as closing:  # (the lock is released all the same)
            # the error that stopped the work is the one to report, not one it led to (a
            # disk gone read-only after a failed write-back refuses the checkpoint too)
            add_context(exc, f"closing the store failed too: {failure_text(closing)}")


# why a replay or a recovery stops at zeros before records that go on in later files
ZEROS_WHERE_RECORDS_GO_ON = "zeros where records go on: the file has no BLANK at its end"


def normal_recovery_cut_text(offset: int, reason: str) -> str:
    """What a broker started without 'abort' does to a log :meth:`Store.normal_recovery_cut`
    found cut at ``offset``."""
    return (
        "without it a broker's next start runs its normal recovery, which walks the last "
        f"three commit-log files, ends the log at offset {offset:,} ({reason}) and deletes "
        "the records after it"
    )


def _put_copies(
    tips: dict[tuple[str, int], QueueTip | None],
    window: Any,
    rows: Any,
    row: int,
    key: tuple[str, int],
) -> None:
    """Move the queues on that a dispatch of the record of kernel ``row`` (in ``key``'s
    queue) puts units in besides its own (multi-dispatch copies, spec §6.8), by the consume
    queues' rules."""
    at = row * ROW_WIDTH
    properties_at = rows[at + PROPERTIES_AT]
    stored = bytes(window[properties_at : properties_at + rows[at + PROPERTIES_LENGTH]])
    physical_offset, size = rows[at + PHYSICAL_OFFSET], rows[at + TOTAL_SIZE]
    for topic, queue_id, queue_offset in stored_copies(key[0], key[1], stored):
        copy_key = (topic, queue_id)
        tips[copy_key] = QueueTip.after_put(tips.get(copy_key), queue_offset, physical_offset, size)


def _config_host(config: StoreConfig) -> HostAddress | None:
    """The broker config's brokerIP1:listenPort. A host name there is refused: a broker
    looks it up when it starts, on its own machine, and rmqstore does not guess what it
    found."""
    if not config.store_host:
        return None
    try:
        return parse_host(config.store_host)
    except InputError:
        raise InputError(
            f"the broker config's brokerIP1:listenPort {quoted(config.store_host)} is not an "
            "IP address and port (a broker looks a name up when it starts; rmqstore does "
            "not): give --store-host ADDRESS:PORT"
        ) from None


class _Creation(Enum):
    MADE_ROOT = "made the store directory"
    IN_EMPTY_ROOT = "used an empty directory"


# the folders a writer may write into, and what to tell of a file in the place of each
_STORE_FOLDERS = (
    (CONSUMEQUEUE_DIR, "rmqstore dispatch rebuilds the consume queues from the commit log"),
    (INDEX_DIR, "rmqstore dispatch rebuilds the index from the commit log"),
    (CONFIG_DIR, "a broker keeps its topic and offset files there"),
)


def refuse_output_inside(store_root: Path, output: Path, what: str) -> None:
    """InputError when ``output`` (links followed) is the store's directory or inside it: a
    command's output goes elsewhere. A 4.x broker refuses to start with a folder in its
    commit-log directory or a queue's, and every folder under ``consumequeue/`` is a topic."""
    try:
        root, target = store_root.resolve(), output.resolve()
    except (OSError, RuntimeError):  # a link loop: opening it fails later with its own error
        return
    if target == root:
        raise InputError(f"{what} {output} is the store {store_root} itself")
    if target.is_relative_to(root):
        raise InputError(
            f"{what} {output} is inside the store {store_root}; choose a place outside it (a "
            "broker lists the store's folders, and a 4.x broker refuses to start with a "
            "folder in its commit-log directory)"
        )


def _lost_files_refusal(key: tuple[str, int], offset: int, queue_offset: int) -> str:
    """Why appending is refused when a queue's folder holds no unit but the commit log, before
    where the consume queues end, holds records of that queue: its files were lost."""
    topic, queue_id = key
    return (
        f"the consume queue of {topic}:{queue_id} holds no unit, but the commit log holds its "
        f"records (one at offset {offset}, queue offset {queue_offset}): its files were lost, "
        "so an appended message would take a queue offset a stored message already has (as a "
        "broker would give it 0); run rmqstore dispatch --rebuild --yes first (rmqstore "
        "verify shows the records missing from the queue)"
    )


def _hole_refusal(
    key: tuple[str, int], queue_offset: int, tip: QueueTip, replayed: bool = False
) -> str:
    """Why appending is refused when a record after where the consume queues end carries a
    later queue offset than its queue's next one: the records between are missing from the
    queue (a dispatch hole), and the queue offset appending would give the next message of
    that queue is one a record already has (a rebuild then drops the message as a repeat).
    ``replayed``: the store has 'abort' and a crash's replay starts before the records
    missing, so a plain dispatch puts them back (a dispatch killed part way left the queues
    it had written ahead of the others); it used to ask for a rebuild of every queue."""
    topic, queue_id = key
    said = (
        f"records of {topic}:{queue_id} are missing from its consume queue: the next one to "
        f"dispatch has queue offset {queue_offset}, but the queue ends at {tip.max_offset}, so "
        "an appended message would take a queue offset a stored message already has; "
    )
    if replayed:
        return said + (
            "run rmqstore dispatch first ('abort' is there: a dispatch or rebuild stopped part "
            "way, and the next dispatch puts records again from where a broker's crash "
            "recovery would, putting the missing units back)"
        )
    return said + "run rmqstore dispatch --rebuild --yes first (rmqstore verify shows the hole)"


def enclosing_store(path: Path) -> Path | None:
    """The store directory ``path`` (links followed) lies inside, if any: the nearest folder
    above it holding a ``commitlog/`` folder and a checkpoint or ``consumequeue/``."""
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError):  # a link loop: creating it fails later with its own error
        return None
    for folder in resolved.parents:
        try:
            if (folder / COMMITLOG_DIR).is_dir() and (
                (folder / CHECKPOINT_FILE).is_file() or (folder / CONSUMEQUEUE_DIR).is_dir()
            ):
                return folder
        except OSError:
            return None
    return None


def _refuse_store_inside_another(root: Path) -> None:
    """A new store is not made inside another: a broker lists that store's folders (a 4.x
    broker refuses to start with a folder in its commit-log directory; a topic's folder under
    ``consumequeue/`` holds its queues)."""
    outer = enclosing_store(root)
    if outer is not None:
        raise NotAStoreError(
            f"{root} is inside the store {outer}; make the new store outside it (a broker "
            "lists the store's folders, and a 4.x broker refuses to start with a folder in its "
            "commit-log directory)"
        )


def misplaced_files(root: Path) -> list[tuple[str, str]]:
    """(store-relative name, message) of each file where a store folder should be, and of an
    ``abort`` that is not a file: a writer refuses them before it changes anything (it would
    fail part way through, or could not remove ``abort``), and verify reports them."""
    found = []
    for name, why in _STORE_FOLDERS:
        path = root / name
        if path.exists() and not path.is_dir():
            found.append((name, f"{path} is not a directory; move it aside ({why})"))
    abort = root / ABORT_FILE
    if abort.exists() and not abort.is_file():
        found.append(
            (
                ABORT_FILE,
                f"{abort} is not a regular file; a store's abort file is (an empty one: move "
                "this aside and put an empty file there to keep the crash marker)",
            )
        )
    return found


def _refuse_misplaced_files(root: Path) -> None:
    found = misplaced_files(root)
    if found:
        raise NotAStoreError(found[0][1])


def missing_folders(path: Path) -> list[Path]:
    """``path`` and the folders above it that are not there, innermost first (``path`` is
    taken as missing)."""
    missing = [path]
    while not missing[-1].parent.exists() and missing[-1].parent != missing[-1]:
        missing.append(missing[-1].parent)
    return missing


def _make_new_root(root: Path) -> None:
    """Make the missing folder ``root`` and the missing folders above it; when that fails, the
    folders made on the way are removed again, so a refused path leaves nothing behind."""
    if ".." in root.parts:
        # "new/.." names the folder above "new", which the OS finds only once "new" exists
        raise NotAStoreError(
            f"{root}: no such directory, and a new store's path cannot pass through '..'; "
            "name the folder to create without '..'"
        )
    missing = missing_folders(root)
    made: list[Path] = []
    folder = root
    try:
        for folder in reversed(missing):
            folder.mkdir()
            made.append(folder)
            fsync_directory(folder.parent)
    except OSError as exc:
        for made_folder in reversed(made):
            with contextlib.suppress(OSError):
                made_folder.rmdir()
        if exc.errno == errno.EEXIST:  # not there to exists(), yet there: a link to nowhere
            raise NotAStoreError(
                f"cannot create {root}: {folder} is in the way (a link that leads nowhere?)"
            ) from None
        if exc.errno in (errno.ENOTDIR, errno.ENAMETOOLONG, errno.ELOOP):
            raise NotAStoreError(f"cannot create {root}: {exc.strerror}") from None
        raise StoreIOError(f"cannot create {root}: {exc.strerror}") from None


def _check_store_root(
    root: Path, *, create: bool, config: StoreConfig | None, writing: bool = False
) -> _Creation | None:
    """Refuse what is not a store; says how a new store is being created (None: it exists)."""
    if not root.exists():
        if create:
            _refuse_store_inside_another(root)
            _make_new_root(root)
            return _Creation.MADE_ROOT
        hint = "; use --create to make a new store" if writing else ""
        raise NotAStoreError(f"{root}: no such directory{hint}")
    if not root.is_dir():
        raise NotAStoreError(f"{root} is a file, not a store directory")
    commitlog_dir = (config.commitlog_dir if config else None) or root / COMMITLOG_DIR
    if commitlog_dir.exists() and not commitlog_dir.is_dir():
        raise NotAStoreError(f"{commitlog_dir} is not a directory")
    if writing:
        _refuse_misplaced_files(root)
    if commitlog_dir.is_dir() or any((root / marker).exists() for marker in _STORE_MARKERS):
        return None
    if create and all(entry.name in (QUARANTINE_DIR, LOCK_FILE) for entry in root.iterdir()):
        _refuse_store_inside_another(root)
        return _Creation.IN_EMPTY_ROOT  # empty, or emptied into its quarantine (lock aside)
    if create:
        raise NotAStoreError(
            f"{root} is not empty and is not a RocketMQ store; refusing to create a store in it"
        )
    hint = "; use --create to make a new store" if writing else ""
    raise NotAStoreError(f"{root} is not a RocketMQ store (no commitlog/ directory){hint}")
