"""The store facade on real files: creating, the broker's lock (against a real JVM), abort,
stale bytes after the end, refusing a torn store, read-only opens changing nothing."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from rmqstore.checkpoint import read_checkpoint
from rmqstore.config import StoreConfig
from rmqstore.errors import NotAStoreError, StoreBusyError, UncleanStoreError
from rmqstore.lockfile import LockState, probe_lock
from rmqstore.reader import MessageReader
from rmqstore.record import Message
from rmqstore.store import Store
from rmqstore.summary import summarize

from support import ORACLE_CONFIG, lock_held_elsewhere, tree_digest

LOCK_HOLDER_JAVA = """
import java.io.RandomAccessFile;
import java.nio.channels.FileLock;
public class LockHolder {
    public static void main(String[] args) throws Exception {
        FileLock lock = new RandomAccessFile(args[0], "rw").getChannel().tryLock(0, 1, false);
        System.out.println(lock == null ? "BUSY" : "LOCKED");
        System.out.flush();
        if (lock != null) { System.in.read(); }
    }
}
"""


def java_lock_holder(tmp_path: Path, lock_file: Path) -> subprocess.Popen:
    """A JVM taking the store lock exactly as a broker does (FileChannel.tryLock(0, 1))."""
    java = shutil.which("java")
    if java is None:
        pytest.skip("no java on PATH")
    source = tmp_path / "LockHolder.java"
    source.write_text(LOCK_HOLDER_JAVA)
    process = subprocess.Popen(
        [java, str(source), str(lock_file)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() in ("LOCKED", "BUSY")
    return process


def test_create_rules(tmp_path: Path) -> None:
    with pytest.raises(NotAStoreError, match="no such directory"):
        Store.open_write(tmp_path / "missing")
    Store.open_write(tmp_path / "new", create=True).close()
    assert (tmp_path / "new" / "commitlog").is_dir()
    (tmp_path / "empty").mkdir()
    Store.open_write(tmp_path / "empty", create=True).close()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(NotAStoreError, match="not empty"):
        Store.open_write(tmp_path / "other", create=True)
    assert sorted(p.name for p in (tmp_path / "other").iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("through_link", [False, True])
def test_inside_is_where_a_path_resolves(tmp_path: Path, through_link: bool) -> None:
    """Store.inside answers what resolving the path answers, whether it is told by a look
    at each entry below the root (plain folders) or by resolving (links, ``..``, missing
    parts), for a store opened by its path or through a link to it."""
    real = tmp_path / "store"
    Store.open_write(real, create=True).close()
    queues = real / "consumequeue"
    (queues / "T" / "0").mkdir(parents=True)
    (queues / "T" / "0" / "file").write_bytes(b"")
    (queues / "T" / "linked-in").symlink_to(queues / "T" / "0")
    (tmp_path / "outside" / "0").mkdir(parents=True)
    (queues / "out").symlink_to(tmp_path / "outside")
    (queues / "T" / "linked-out").symlink_to(tmp_path / "outside" / "0")
    (queues / "up").symlink_to("..")  # the store root itself
    root = real
    if through_link:
        root = tmp_path / "link-to-store"
        root.symlink_to(real)
    store = Store.open_read(root)
    resolved_root = root.resolve()
    cases = {
        "consumequeue/T/0": True,  # told without resolving
        "consumequeue/T": True,
        "consumequeue/T/missing": True,  # not made yet: taken as it is
        "consumequeue/missing/0": True,
        "consumequeue/T/0/file/under-a-file": True,
        "consumequeue/T/linked-in": None,
        "consumequeue/T/linked-out": None,
        "consumequeue/out/0": None,
        "consumequeue/out/missing": None,
        "consumequeue/up/consumequeue": None,
        "consumequeue/up/../..": None,
        "consumequeue/../../outside": None,
        "": None,
    }
    for relative, plain in cases.items():
        path = root / relative if relative else root
        expected = path.resolve().is_relative_to(resolved_root)
        assert store.inside(path) == expected, relative
        assert store._plainly_below_root(path) == bool(plain), relative
    assert not store.inside(tmp_path / "outside" / "0")
    assert store.inside(queues / "T" / "linked-in") and not store.inside(queues / "out" / "0")


def test_a_running_broker_jvm_keeps_rmqstore_out(tmp_path: Path) -> None:
    Store.open_write(tmp_path / "s", create=True).close()
    lock_file = tmp_path / "s" / "lock"
    before = tree_digest(tmp_path / "s")
    holder = java_lock_holder(tmp_path, lock_file)
    try:
        assert probe_lock(lock_file) is LockState.HELD
        with pytest.raises(StoreBusyError, match="locked by another process"):
            Store.open_write(tmp_path / "s")
        with Store.open_read(tmp_path / "s") as store:  # reading is allowed, with a note
            assert any("locked" in note for note in store.notes)
    finally:
        holder.communicate("\n", timeout=30)
    assert tree_digest(tmp_path / "s") == before
    assert probe_lock(lock_file) is LockState.FREE


def test_rmqstore_keeps_a_broker_jvm_out(tmp_path: Path) -> None:
    with Store.open_write(tmp_path / "s", create=True):
        holder = java_lock_holder(tmp_path, tmp_path / "s" / "lock")
        holder.communicate("\n", timeout=30)
        # the JVM printed BUSY: it could not take the lock we hold
        assert holder.returncode == 0
        again = subprocess.run(
            [
                shutil.which("java") or "java",
                str(tmp_path / "LockHolder.java"),
                str(tmp_path / "s" / "lock"),
            ],
            input="\n",
            text=True,
            capture_output=True,
            timeout=60,
        )
        assert again.stdout.strip() == "BUSY"


def test_two_writers_in_one_process_exclude_each_other(tmp_path: Path) -> None:
    with Store.open_write(tmp_path / "s", create=True):
        with pytest.raises(StoreBusyError):
            Store.open_write(tmp_path / "s")
        with Store.open_read(tmp_path / "s") as reader:
            assert reader.lock_state() is LockState.HELD_HERE
    Store.open_write(tmp_path / "s").close()


def test_a_python_process_holding_a_posix_lock_is_seen(tmp_path: Path) -> None:
    Store.open_write(tmp_path / "s", create=True).close()
    with lock_held_elsewhere(tmp_path / "s" / "lock"), pytest.raises(StoreBusyError):
        Store.open_write(tmp_path / "s")


def test_abort_is_kept_until_consume_queues_catch_up(tmp_path: Path) -> None:
    store = Store.open_write(tmp_path / "s", create=True)
    store.appender().append(Message(topic="T", body=b"x"))
    assert store.abort_path.exists()
    store.close()
    assert store.abort_path.exists()  # the appended message is not in any consume queue
    assert any("abort" in note for note in store.notes)
    checkpoint = read_checkpoint(tmp_path / "s" / "checkpoint")
    assert checkpoint is not None and checkpoint.physic_msg_timestamp > 0
    (tmp_path / "s" / "abort").unlink()
    store = Store.open_write(tmp_path / "s")
    store.appender()
    assert store.abort_path.exists()
    store.close()
    assert not store.abort_path.exists()  # nothing appended: a clean close


def test_appending_after_a_crash_with_a_clean_tail_is_allowed(tmp_path: Path) -> None:
    with Store.open_write(tmp_path / "s", create=True) as store:
        store.appender().append(Message(topic="T", body=b"x"))
    assert (tmp_path / "s" / "abort").exists()
    with Store.open_write(tmp_path / "s") as store:
        assert store.appender().append(Message(topic="T", body=b"y")).queue_offset == 1


@pytest.mark.parametrize("copy", ["store_torn_half_record", "store_torn_random_garbage"])
def test_a_torn_crashed_store_is_refused_unchanged(oracle, tmp_path: Path, copy: str) -> None:
    crash = oracle("s2_crash")
    store_dir = crash.copy_to(tmp_path, copy)
    before = tree_digest(store_dir)
    store = Store.open_write(store_dir, StoreConfig(**ORACLE_CONFIG))
    with pytest.raises(UncleanStoreError, match=f"offset {crash.manifest['lastValidEnd']}"):
        store.appender()
    store.close()
    assert tree_digest(store_dir) == before


def test_stale_bytes_after_a_recovered_end_are_quarantined(oracle, tmp_path: Path) -> None:
    recovered = oracle("s4_recovered_from_torn_half_record")
    end = recovered.manifest["dumpAfterRecovery"]["storeState"]["maxPhyOffset"]
    store_dir = recovered.copy_to(tmp_path)
    last = sorted((store_dir / "commitlog").iterdir())[-1]
    position = end - int(last.name)
    stale = last.read_bytes()[position:].rstrip(b"\0")
    assert stale  # a broker's recovery left the torn bytes behind
    with Store.open_write(store_dir, StoreConfig(**ORACLE_CONFIG)) as store:
        result = store.appender().append(Message(topic="TopicTest", body=b"after"))
    assert result.physical_offset == end
    (quarantine,) = (store_dir / "quarantine").iterdir()
    saved = list(quarantine.rglob("*.bin"))
    assert len(saved) == 1 and saved[0].read_bytes() == stale
    assert "manifest.json" in {p.name for p in quarantine.iterdir()}
    with Store.open_read(store_dir) as store:
        assert MessageReader(store).by_offset(end).body == b"after"


@pytest.mark.parametrize("name", ["s2_crash", "s1_multi"])
def test_reading_changes_nothing(oracle, tmp_path: Path, name: str) -> None:
    store_dir = oracle(name).copy_to(tmp_path)
    before = tree_digest(store_dir)
    stamps = {p: p.stat().st_mtime_ns for p in store_dir.rglob("*")}
    time.sleep(0.01)
    with Store.open_read(store_dir) as store:
        summarize(store)
        reader = MessageReader(store)
        list(reader.sequential(0))
    assert tree_digest(store_dir) == before
    assert {p: p.stat().st_mtime_ns for p in store_dir.rglob("*")} == stamps
