"""flush: files forced to disk, then a checkpoint that says what is on disk."""

from __future__ import annotations

import itertools
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from rmqstore.checkpoint import Checkpoint, read_checkpoint, write_checkpoint
from rmqstore.config import StoreConfig
from rmqstore.dispatch import Dispatcher
from rmqstore.flush import flush_store
from rmqstore.indexfile import read_index_headers
from rmqstore.msgid import UniqKeyGenerator
from rmqstore.record import Message
from rmqstore.segments import can_sync_file_system
from rmqstore.store import Store

from support import crashed_with_a_queue_behind, recorded_calls, run_cli, sync_calls

CONFIG = StoreConfig(commitlog_file_size=4096, index_slots=4, index_entries=10)


def append(root: Path, count: int, clock, *, dispatch: bool) -> list[int]:
    with Store.open_write(root, CONFIG, create=True) as store:
        appender = store.appender(clock=clock, uniq_keys=UniqKeyGenerator())
        results = appender.append_many(
            [Message(topic="T", body=b"x" * 300, queue_id=n % 2) for n in range(count)]
        )
        if dispatch:
            dispatcher = Dispatcher(store)
            dispatcher.run()
            dispatcher.close()
    return [result.store_timestamp for result in results]


def flushed(root: Path):
    with Store.open_write(root, CONFIG) as store:
        return flush_store(store)


def test_the_checkpoint_says_what_the_files_hold(tmp_path: Path) -> None:
    root = tmp_path / "s"
    clock = itertools.count(1_700_000_000_000, 1000).__next__
    dispatched = append(root, 25, clock, dispatch=True)  # rolls commit-log files
    write_checkpoint(root / "checkpoint", Checkpoint(confirm_phy_offset=5))
    full = [h for _, h in read_index_headers(root / "index") if h.index_count >= 10]

    result = flushed(root)

    # all but lock, checkpoint and config/rmqstore-geometry.json
    assert result.files == len([p for p in root.rglob("*") if p.is_file()]) - 3
    assert result.checkpoint_after == read_checkpoint(root / "checkpoint")
    assert result.checkpoint_after.physic_msg_timestamp == dispatched[-1]
    assert result.checkpoint_after.logics_msg_timestamp == dispatched[-1]
    assert result.checkpoint_after.index_msg_timestamp == full[-1].end_timestamp > 0
    assert result.checkpoint_after.confirm_phy_offset == 5  # 5.x fields are kept
    assert result.checkpoint_before == Checkpoint(confirm_phy_offset=5)

    undispatched = append(root, 3, clock, dispatch=False)
    again = flushed(root).checkpoint_after
    assert again.physic_msg_timestamp == undispatched[-1]
    assert again.logics_msg_timestamp == dispatched[-1]


def test_an_empty_store_gets_a_zero_checkpoint(tmp_path: Path) -> None:
    root = tmp_path / "s"
    Store.open_write(root, CONFIG, create=True).close()
    result = flushed(root)
    assert result.checkpoint_after == Checkpoint()
    assert (root / "checkpoint").stat().st_size == 4096


def test_last_record_timestamp_is_the_store_time_before_the_end(tmp_path: Path) -> None:
    from rmqstore.flush import last_record_timestamp

    root = tmp_path / "store"
    stamps = append(root, 40, itertools.count(1_700_000_000_000, 7).__next__, dispatch=False)
    with Store.open_read(root) as store:
        records = [(offset, header) for offset, header, *_ in store.commitlog.scan()]
        assert len(records) == len(stamps) == 40
        assert last_record_timestamp(store, records[0][0]) == 0
        for (offset, header), stamp in zip(records, stamps, strict=True):
            end = offset + header[0]
            assert last_record_timestamp(store, end) == stamp
            assert last_record_timestamp(store, offset + 1) == stamp


def test_a_flush_after_a_crash_keeps_the_times_its_recovery_replays_from(tmp_path: Path) -> None:
    """A power loss took T:1's last units: the checkpoint's times pick the file a broker's
    crash recovery replays from, which gives them back. flush keeps them where they were
    (it used to move them up to the newest record T:0 holds, so the recovery started at
    the last file and left T:1's units out for good); recover then gives every unit back."""
    root = tmp_path / "s"
    crashed = crashed_with_a_queue_behind(root, index=False)
    options = (*crashed.options, "--broker-config", _no_index(tmp_path))
    before = read_checkpoint(root / "checkpoint")
    result = run_cli("flush", root, "--json", *options)
    assert result.exit_code == 0, result.stderr
    assert "the checkpoint's times were kept" in result.stderr
    after = read_checkpoint(root / "checkpoint")
    assert after == before
    with Store.open_read(root) as store:  # the geometry it remembers
        assert store.commitlog.recovery_start(after, True).start <= crashed.first_lost
    recovered = run_cli("recover", root, "--yes", *options)
    assert recovered.exit_code == 0, recovered.stderr
    checked = run_cli("verify", root, "--json", *options)
    document = json.loads(checked.stdout)
    assert document["ok"], document["findings"]
    assert document["checked"]["units"] == crashed.messages
    # once recovered (no 'abort'), a flush moves the times up to what the files hold
    again = run_cli("flush", root, *options)
    assert again.exit_code == 0 and not again.stderr, again.stderr
    assert read_checkpoint(root / "checkpoint").logics_msg_timestamp > before.logics_msg_timestamp


def _no_index(directory: Path) -> Path:
    """A broker.conf without the index (messageIndexEnable=false): a recovery rebuilding
    index files would replay from where they end, earlier than the checkpoint says."""
    conf = directory / "broker.conf"
    conf.write_text("messageIndexEnable=false\n")
    return conf


def test_each_folders_files_are_synced_in_name_order(tmp_path: Path, monkeypatch) -> None:
    """Name order is offset order (time order for index files): a power cut part way through
    a flush leaves a log's or a queue's earlier files on the disk before its later ones,
    whatever order a folder lists them in (the file system's own: here the reverse)."""
    import os

    import rmqstore.flush as flush_module

    real_walk = os.walk

    def walk_listing_in_reverse(top: Path):
        for directory, subdirectories, names in real_walk(top):
            yield directory, subdirectories, sorted(names, reverse=True)

    monkeypatch.setattr(flush_module.os, "walk", walk_listing_in_reverse)

    root = tmp_path / "s"
    config = replace(CONFIG, consumequeue_file_size=200)  # 10 units a file
    clock = itertools.count(1_700_000_000_000, 1000).__next__
    with Store.open_write(root, config, create=True) as store:  # several files of each kind
        appender = store.appender(clock=clock, uniq_keys=UniqKeyGenerator())
        appender.append_many(
            [Message(topic="T", body=b"x" * 300, queue_id=n % 2) for n in range(60)]
        )
        dispatcher = Dispatcher(store)
        dispatcher.run()
        dispatcher.close()
    synced: list[Path] = []
    real = flush_module._fsync

    def fsync(path: Path) -> int:
        synced.append(path)
        return real(path)

    monkeypatch.setattr(flush_module, "_fsync", fsync)
    with Store.open_write(root, config) as store:
        flush_store(store)
    by_folder: dict[Path, list[str]] = {}
    for path in synced:
        by_folder.setdefault(path.parent, []).append(path.name)
    several = {folder: names for folder, names in by_folder.items() if len(names) > 2}
    assert {folder.name for folder in several} >= {"commitlog", "0", "1", "index"}
    assert all(names == sorted(names) for names in several.values()), several


SHORT_QUEUES = replace(CONFIG, consumequeue_file_size=40)  # two units a file


def _many_short_queues(root: Path, queues: int) -> None:
    """A store of ``queues`` queues of one message each (a queue a device, as LMQ stores
    are), but for T0's three, in two files; dispatched."""
    clock = itertools.count(1_700_000_000_000, 1000).__next__
    messages = [Message(topic=f"T{n}", body=b"x") for n in range(queues)]
    with Store.open_write(root, SHORT_QUEUES, create=True) as store:
        appender = store.appender(clock=clock, uniq_keys=UniqKeyGenerator())
        appender.append_many([*messages, Message(topic="T0", body=b"y"), messages[0]])
        dispatcher = Dispatcher(store)
        dispatcher.run()
        dispatcher.close()


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_a_flush_of_many_one_file_queues_syncs_their_file_system_once(tmp_path: Path) -> None:
    """flush (and recover, which ends with one) fsynced every file and folder of the store:
    three a queue, each flushing the disk's write cache, even with nothing to write (a
    store of 20,000 LMQ queues: 60,000 fsyncs, up to 6.5 s of flush here). The queues of
    one file and the queues' folders are now made durable together by one syncfs; the
    commit log and the index files, and a queue of several files, still go file by file,
    in order."""
    if not can_sync_file_system(tmp_path):
        pytest.skip("syncfs is used on Linux 5.8 and later, on local file systems")
    root = tmp_path / "s"
    _many_short_queues(root, 300)
    assert len(list((root / "consumequeue" / "T0" / "0").iterdir())) == 2
    geometry = ["--commitlog-file-size", "4096", "--consumequeue-file-size", "40",
                "--index-slots", "4", "--index-entries", "10"]  # fmt: skip
    counts = sync_calls(["flush", str(root), *geometry], tmp_path)
    logs = len(list((root / "commitlog").iterdir())) + len(list((root / "index").iterdir()))
    assert counts["syncfs"] == 1
    # the log's and the index's files and folders, the two files of T0's queue, the root,
    # the checkpoint and the root again as it is replaced: not 900 more for the queues
    assert counts["fsync"] <= logs + 2 + 2 + 1 + 2, counts
    assert run_cli("verify", root, *geometry).exit_code == 0


def test_where_syncfs_cannot_be_trusted_every_file_and_folder_is_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before Linux 5.8 syncfs did not report write-back errors: there (and off Linux) the
    flush syncs each queue file and folder on its own."""
    import rmqstore.flush as flush_module

    root = tmp_path / "s"
    _many_short_queues(root, 20)
    monkeypatch.setattr(flush_module, "can_sync_file_system", lambda _folder: False)
    files = recorded_calls(monkeypatch, flush_module, "_fsync")
    folders = recorded_calls(monkeypatch, flush_module, "sync_directory")
    with Store.open_write(root, SHORT_QUEUES) as store:
        flush_store(store)
    queues = root / "consumequeue"
    assert sum(path.is_relative_to(queues) for path in files) == 20 + 1  # T0's two files
    assert sum(path.is_relative_to(queues) for path in folders) == 1 + 20 + 20
