"""What a writer learns about a store, and when: state read only once the lock is held, the
geometry remembered with the store, locks probed honestly, directories and files made durable
in the right order."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import rmqstore.lockfile as lockfile_module
import rmqstore.segments as segments_module
from rmqstore.config import StoreConfig
from rmqstore.errors import InputError, StoreFormatError, StoreIOError, context_of
from rmqstore.geometry import geometry_path, read_geometry
from rmqstore.indexfile import IndexFile, IndexService, index_file_size
from rmqstore.lockfile import LockState, StoreLock, probe_lock
from rmqstore.msgid import UniqKeyGenerator
from rmqstore.record import Message
from rmqstore.store import Store

from support import run_cli

CONFIG = StoreConfig(commitlog_file_size=4096, index_slots=4, index_entries=16)


def new_store(root: Path, count: int = 3) -> None:
    with Store.open_write(root, CONFIG, create=True) as store:
        store.appender(uniq_keys=UniqKeyGenerator()).append_many(
            [Message(topic="T", body=b"x") for _ in range(count)]
        )


def test_abort_is_read_after_the_lock_is_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer that crashes between our look at the store and our lock leaves ``abort``:
    the store must then be treated as crashed, not clean."""
    root = tmp_path / "s"
    new_store(root)
    (root / "abort").unlink()
    real_acquire = StoreLock.acquire

    def crash_just_before(self: StoreLock) -> None:
        (root / "abort").touch()  # the other writer's crash, before we hold the lock
        real_acquire(self)

    monkeypatch.setattr(StoreLock, "acquire", crash_just_before)
    with Store.open_write(root, CONFIG) as store:
        assert store.abort_existed


def test_geometry_given_once_is_remembered_and_contradictions_refused(tmp_path: Path) -> None:
    store = tmp_path / "s"
    made = run_cli(
        "append", store, "--create", "--consumequeue-file-size", "2000", "--topic", "T",
        "--body", "x",
    )  # fmt: skip
    assert made.exit_code == 0, made.stderr
    assert read_geometry(store)["consumequeue_file_size"] == 2000
    assert geometry_path(store).parent.name == "config"
    dispatched = run_cli("dispatch", store)  # told nothing: uses what the store remembers
    assert dispatched.exit_code == 0, dispatched.stderr
    (queue_file,) = (store / "consumequeue" / "T" / "0").iterdir()
    assert queue_file.stat().st_size == 2000
    refused = run_cli("dispatch", store, "--consumequeue-file-size", "6000000")
    assert refused.exit_code == 2
    assert "mappedFileSizeConsumeQueue" in refused.stderr and "2000" in refused.stderr
    info = run_cli("info", store, "--json")
    assert '"consumeQueueFileSize": 2000' in info.stdout


def test_an_option_given_to_an_existing_store_is_remembered(tmp_path: Path) -> None:
    root = tmp_path / "s"
    new_store(root)
    geometry_path(root).unlink()
    config = StoreConfig(commitlog_file_size=4096, consumequeue_file_size=400)
    with Store.open_write(root, config) as store:
        store.begin_write()
    assert read_geometry(root)["consumequeue_file_size"] == 400
    with pytest.raises(InputError, match="made with 400"):
        Store.open_read(root, StoreConfig(consumequeue_file_size=600))


def test_a_lock_that_cannot_be_checked_is_an_error_not_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = tmp_path / "lock"
    lock.write_bytes(b"lock")

    def failing_fcntl(*_args: object) -> bytes:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(lockfile_module.fcntl, "fcntl", failing_fcntl)
    monkeypatch.setattr(lockfile_module.fcntl, "lockf", failing_fcntl)
    with pytest.raises(StoreIOError, match="cannot check the lock"):
        probe_lock(lock)


def test_a_fifo_lock_does_not_hang_and_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "s"
    new_store(root)
    (root / "lock").unlink()
    os.mkfifo(root / "lock")
    with pytest.raises(StoreFormatError, match="not a regular file"):
        probe_lock(root / "lock")
    with pytest.raises(StoreFormatError, match="not a regular file"):
        Store.open_write(root, CONFIG)


def test_one_lock_file_however_it_is_spelled(tmp_path: Path) -> None:
    root = tmp_path / "s"
    new_store(root)
    with Store.open_write(root, CONFIG):
        other_spelling = tmp_path / "s" / ".." / "s" / "lock"
        assert probe_lock(other_spelling) is LockState.HELD_HERE


def test_index_files_opened_before_a_bad_one_are_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "index"
    directory.mkdir()
    (directory / "20240101000000000").write_bytes(bytes(index_file_size(4, 16)))
    (directory / "20240101000000001").write_bytes(bytes(10))  # the wrong size
    closed: list[Path] = []
    real_close = IndexFile.close

    def recording_close(self: IndexFile) -> None:
        closed.append(self.path)
        real_close(self)

    monkeypatch.setattr(IndexFile, "close", recording_close)
    with pytest.raises(StoreFormatError):
        IndexService(directory, 4, 16)
    assert closed == [directory / "20240101000000000"]


def test_new_queue_and_index_directories_are_durable_in_their_parents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "s"
    new_store(root)
    synced: list[str] = []
    real = segments_module.fsync_directory

    def recording(directory: Path) -> None:
        synced.append(str(Path(directory).relative_to(tmp_path)))
        real(directory)

    monkeypatch.setattr(segments_module, "fsync_directory", recording)
    monkeypatch.setattr("rmqstore.indexfile.fsync_directory", recording)
    # (a dispatch makes a new queue's folders durable as it flushes the queue)
    monkeypatch.setattr("rmqstore.consumequeue.fsync_directory", recording)
    assert run_cli("dispatch", root).exit_code == 0
    for made in ("s/consumequeue", "s/consumequeue/T", "s/consumequeue/T/0", "s/index"):
        parent = str(Path(made).parent)
        assert parent in synced, f"{made} was created but {parent} was never synced"


def test_append_dispatch_makes_the_log_durable_before_what_points_into_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``append --dispatch`` (async): commit log first, then consume queues and index, then
    the checkpoint."""
    root = tmp_path / "s"
    new_store(root)
    order: list[str] = []
    for name in ("fsync", "fdatasync"):
        real = getattr(os, name)

        def recording(fd: int, real=real) -> None:
            order.append(os.readlink(f"/proc/self/fd/{fd}"))
            real(fd)

        monkeypatch.setattr(os, name, recording)
    real_msync = segments_module.mmap.mmap.flush

    result = run_cli("append", root, "--topic", "T", "--body", "y", "--dispatch")
    assert result.exit_code == 0, result.stderr
    del real_msync

    def first(part: str) -> int:
        return next(i for i, path in enumerate(order) if part in path)

    # the commit log's current file is written back with msync; its directory and any
    # rolled file with fsync. What must come after it: queue files, then the checkpoint.
    assert first("/consumequeue/") < first("/checkpoint")
    log_synced = [i for i, path in enumerate(order) if "/commitlog/" in path]
    assert not log_synced or log_synced[0] < first("/consumequeue/")


def test_a_new_checkpoint_is_durable_in_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "s"
    new_store(root)
    (root / "checkpoint").unlink()
    synced: list[Path] = []
    real = segments_module.fsync_directory
    monkeypatch.setattr(
        segments_module, "fsync_directory", lambda d: (synced.append(Path(d)), real(d))
    )
    from rmqstore.checkpoint import Checkpoint, read_checkpoint, write_checkpoint

    write_checkpoint(root / "checkpoint", Checkpoint(physic_msg_timestamp=7))
    assert synced == [root]
    assert read_checkpoint(root / "checkpoint") == Checkpoint(physic_msg_timestamp=7)
    assert not list(root.glob(".checkpoint*"))


def test_a_killed_create_leaves_no_short_segment(tmp_path: Path) -> None:
    """Segments appear at their full size or not at all; an empty one left by an older
    writer is replaced instead of refusing the store."""
    root = tmp_path / "s"
    new_store(root)
    (root / "commitlog" / "00000000000000004096").touch()  # killed between create and size
    with Store.open_write(root, CONFIG) as store:
        appender = store.appender()
        appender.append_many([Message(topic="T", body=b"z" * 1500) for _ in range(3)])
    assert (root / "commitlog" / "00000000000000004096").stat().st_size == 4096
    assert not list((root / "commitlog").glob(".*"))


def test_a_rollback_that_removes_files_makes_their_removal_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "s"
    new_store(root)
    (root / "abort").unlink()  # as if its messages were dispatched
    synced: list[Path] = []
    real = segments_module.fsync_directory
    monkeypatch.setattr(
        segments_module, "fsync_directory", lambda d: (synced.append(Path(d)), real(d))
    )
    with Store.open_write(root, CONFIG) as store:
        appender = store.appender()
        savepoint = appender.savepoint()
        appender.append_many([Message(topic="T", body=b"z" * 1500) for _ in range(6)])
        assert len(list((root / "commitlog").iterdir())) > 1  # rolled into new files
        appender.rollback(savepoint)
        assert appender.appended == 0
    assert [p.name for p in (root / "commitlog").iterdir()] == ["00000000000000000000"]
    assert root / "commitlog" in synced
    assert not (root / "abort").exists()  # nothing appended: abort goes as it came


def test_work_inside_other_work_leaves_saying_how_far_to_the_outer_one(tmp_path: Path) -> None:
    """The dispatch a recover replays runs inside the recover's until_done: done, it does
    not end the recover's (a later error still keeps 'abort'); stopped, the error says how
    far the recover got, once."""
    root = tmp_path / "s"
    new_store(root)
    (root / "abort").unlink()
    with (
        pytest.raises(StoreIOError) as raised,
        Store.open_write(root, CONFIG) as store,
        store.until_done("recover"),
    ):
        store.begin_write()
        with store.until_done("dispatch"):
            pass
        assert store.abort_until_done
        with store.until_done("dispatch"):
            raise StoreIOError("cannot write: No space left on device")
    assert context_of(raised.value) == (
        "; recover stopped part way and left 'abort' in place (a broker starting on the store "
        "runs its crash recovery); run rmqstore recover again once the cause is mended"
    )
    assert (root / "abort").exists()
