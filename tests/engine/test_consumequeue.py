"""rmqstore.consumequeue: a queue file's valid end found by reading its units, not the file."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from rmqstore import consumequeue, kernel
from rmqstore.consumequeue import (
    _FIRST_CHUNK,
    _LARGEST_CHUNK,
    CQ_UNIT_SIZE,
    PRE_BLANK_UNIT,
    ConsumeQueue,
    PutOutcome,
)

FILE_SIZE = 300_000 * CQ_UNIT_SIZE  # a broker's default consume-queue file (6,000,000 bytes)
UNIT = struct.Struct(">qiq")


def _units(count: int, first_offset: int = 0) -> bytes:
    return b"".join(UNIT.pack(first_offset + 100 * i, 100, i) for i in range(count))


def _queue_file(root: Path, body: bytes, *, size: int = FILE_SIZE, start: int = 0) -> Path:
    """A queue file of ``size`` bytes (sparse, as a broker's) starting with ``body``."""
    directory = root / "T" / "0"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{start:020d}"
    with path.open("wb") as file:
        file.write(body)
        file.truncate(max(size, len(body)))
    return path


def _whole_file_count(path: Path, limit: int) -> int:
    """The reference: every byte of the file read, then its leading valid units counted."""
    return kernel.valid_units(path.read_bytes()[:limit]) * CQ_UNIT_SIZE


# unit counts around the chunk boundaries (the chunks grow 4x from the first)
_BOUNDARIES = [
    _FIRST_CHUNK // CQ_UNIT_SIZE,
    (_FIRST_CHUNK + 4 * _FIRST_CHUNK) // CQ_UNIT_SIZE,
    (_FIRST_CHUNK * (1 + 4 + 16)) // CQ_UNIT_SIZE,
]
SHAPES = sorted(
    {0, 1, 7, *_BOUNDARIES, *(n - 1 for n in _BOUNDARIES), *(n + 1 for n in _BOUNDARIES)}
)


@pytest.mark.parametrize("units", SHAPES)
def test_the_valid_end_is_the_whole_file_walk(tmp_path: Path, units: int) -> None:
    path = _queue_file(tmp_path, _units(units))
    valid, kept, head = consumequeue._valid_prefix(path, FILE_SIZE, keep=True)
    assert valid == _whole_file_count(path, FILE_SIZE) == units * CQ_UNIT_SIZE
    # what is kept: the valid units and the first invalid one (a zero unit here)
    assert kept == path.read_bytes()[: valid + CQ_UNIT_SIZE]
    assert consumequeue._valid_prefix(path, FILE_SIZE)[1] == b""  # nothing kept unasked
    # and the first chunk as read, which the chunks of a later walk start from
    assert head == path.read_bytes()[:_FIRST_CHUNK]
    for limit in (0, CQ_UNIT_SIZE, _FIRST_CHUNK - 1, FILE_SIZE):
        assert list(consumequeue._file_chunks(path, limit, head)) == list(
            consumequeue._file_chunks(path, limit)
        )


def test_a_full_file_is_valid_to_its_end(tmp_path: Path) -> None:
    size = (_FIRST_CHUNK + _LARGEST_CHUNK) // CQ_UNIT_SIZE * CQ_UNIT_SIZE + 3 * CQ_UNIT_SIZE
    path = _queue_file(tmp_path, _units(size // CQ_UNIT_SIZE), size=size)
    valid, kept, _ = consumequeue._valid_prefix(path, size, keep=True)
    assert valid == size and kept == path.read_bytes()


@pytest.mark.parametrize(
    "tail",
    [
        UNIT.pack(-1, 100, 0),  # offset < 0
        UNIT.pack(500, 0, 0),  # size 0
        UNIT.pack(500, -5, 0),  # size < 0
        b"\x00\x00\x00",  # a partial unit at the file's end
    ],
)
def test_the_walk_stops_where_the_broker_stops(tmp_path: Path, tail: bytes) -> None:
    count = _FIRST_CHUNK // CQ_UNIT_SIZE + 5  # the stop lies in the second chunk
    if len(tail) < CQ_UNIT_SIZE:  # the file ends there
        path = _queue_file(tmp_path, _units(count) + tail, size=0)
    else:  # valid-looking units follow the stop: they are not the queue's
        path = _queue_file(tmp_path, _units(count) + tail + _units(10, 10_000))
    valid = consumequeue._valid_prefix(path, FILE_SIZE)[0]
    assert valid == _whole_file_count(path, FILE_SIZE) == count * CQ_UNIT_SIZE


def test_a_file_longer_than_the_configured_size_is_read_no_further(tmp_path: Path) -> None:
    path = _queue_file(tmp_path, _units(1000), size=1000 * CQ_UNIT_SIZE)
    assert consumequeue._valid_prefix(path, 400 * CQ_UNIT_SIZE)[0] == 400 * CQ_UNIT_SIZE


def _counted_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The byte counts of the queue module's file reads from now on (the real reads)."""
    read: list[int] = []
    real_read_range = consumequeue.read_range

    def counting(path: Path, start: int, length: int) -> bytes:
        data = real_read_range(path, start, length)
        read.append(len(data))
        return data

    monkeypatch.setattr(consumequeue, "read_range", counting)
    return read


def test_loading_a_queue_reads_its_units_and_a_chunk_not_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker with thousands of queues has thousands of mostly unwritten 6 MB files:
    finding each one's end must not read (and copy) all of it."""
    _queue_file(tmp_path, _units(5))
    read = _counted_reads(monkeypatch)
    queue = ConsumeQueue(tmp_path, "T", 0, FILE_SIZE, commitlog_min_offset=150)
    assert queue.max_offset == 5 and queue.max_physical_offset == 4 * 100 + 100
    # one read: the last unit and the min offset's are taken from the chunk the walk read
    assert len(read) == 1 and read[0] <= _FIRST_CHUNK, read
    assert queue.min_offset == 2 and queue.loaded_last_unit == queue.read_unit(4)
    read.clear()
    read.clear()
    truncation = queue.truncation_at(200)  # keep the units of the records below 200
    assert truncation is not None and truncation.units_removed == 3
    assert sum(read) <= _FIRST_CHUNK, read


def test_a_flush_syncs_only_what_was_written_since_the_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dispatcher flushes its queues before writing the checkpoint and again as it closes
    them: the second flush of a queue with nothing new written does not sync it again."""
    import os

    synced: list[int] = []
    real = os.fdatasync

    def fdatasync(fd: int) -> None:  # counts, and syncs for real
        synced.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    queue = ConsumeQueue(tmp_path, "T", 0, 400)
    queue.put(0, 0, 100, 7)
    queue.flush()
    assert len(synced) == 1
    queue.flush()
    queue.close()
    assert len(synced) == 1
    queue = ConsumeQueue(tmp_path, "T", 0, 400)
    assert queue.max_offset == 1
    queue.flush()  # loaded, nothing written
    assert len(synced) == 1
    queue.put(1, 100, 100, 7)  # the common case of put() marks no file dirty
    queue.close()
    assert len(synced) == 2
    assert ConsumeQueue(tmp_path, "T", 0, 400).max_offset == 2


def test_a_queue_file_takes_disk_blocks_as_its_units_grow(tmp_path: Path) -> None:
    """A broker's queue files are sparse, so a store of many short queues (a queue per
    device, LMQ) takes a page a queue on its disk. rmqstore reserves blocks ahead of the
    units it writes through the map (a full disk is then an error, not a SIGBUS): a page at
    first, then as much again as the file holds, at most 256 KiB ahead. A fixed 256 KiB
    made a rebuild of 100,000 one-message queues need 25 GB."""
    queue = ConsumeQueue(tmp_path, "T", 0, FILE_SIZE)
    path = tmp_path / "T" / "0" / f"{0:020d}"

    def allocated() -> int:
        return path.stat().st_blocks * 512

    queue.put(0, 0, 100, 7)
    queue.flush()
    assert CQ_UNIT_SIZE <= allocated() <= 16 * 1024
    written = 20_000
    for offset in range(1, written):
        queue.put(offset, 100 * offset, 100, 7)
        if offset in (200, 2_000):  # the reservation grows with the file
            assert offset * CQ_UNIT_SIZE <= allocated() <= 2 * offset * CQ_UNIT_SIZE + 16 * 1024
    queue.close()
    assert written * CQ_UNIT_SIZE <= allocated() <= written * CQ_UNIT_SIZE + 256 * 1024 + 16 * 1024
    assert ConsumeQueue(tmp_path, "T", 0, FILE_SIZE).max_offset == written


def test_a_rocksdb_database_is_told_from_queue_folders(tmp_path: Path) -> None:
    """consumequeue/ of a 5.x broker with storeType=defaultRocksDB (spec §6.9): told by the
    names and kinds of its entries, never by opening them."""
    import os

    root = tmp_path / "consumequeue"
    (root / "TopicA" / "0").mkdir(parents=True)
    assert not consumequeue.holds_rocksdb(root)
    assert not consumequeue.holds_rocksdb(tmp_path / "missing")
    (root / "CURRENT").mkdir()  # a topic named CURRENT is a folder
    (root / "MANIFEST-000005").write_bytes(b"")
    assert not consumequeue.holds_rocksdb(root)
    (root / "CURRENT").rmdir()
    os.mkfifo(root / "CURRENT")  # not a regular file: not a database's, and never opened
    assert not consumequeue.holds_rocksdb(root)
    (root / "CURRENT").unlink()
    (root / "CURRENT").write_text("MANIFEST-000005\n")
    assert consumequeue.holds_rocksdb(root)
    (root / "MANIFEST-000005").rename(root / "MANIFEST-x")
    assert not consumequeue.holds_rocksdb(root)
    (root / "MANIFEST-x").rename(root / "MANIFEST-000012")
    assert consumequeue.holds_rocksdb(root)


@pytest.mark.parametrize(
    ("name", "queue_id"),
    [
        ("0", 0),
        ("15", 15),
        ("-1", -1),
        ("2147483647", 2**31 - 1),
        ("+2", None),  # Java parses it as 2, then opens folder "2": this one is no queue
        ("007", None),
        ("-0", None),
        ("1_0", None),  # Python's int() takes these; Java's parseInt does not
        (" 1", None),
        ("1\n", None),
        ("\u0663", None),  # an Arabic-Indic 3
        ("2147483648", None),  # past a Java int: skipped at load
        ("", None),
        ("x", None),
    ],
)
def test_a_queue_folder_is_named_by_its_number_as_java_writes_it(
    tmp_path: Path, name: str, queue_id: int | None
) -> None:
    assert consumequeue.queue_id_of(name) == queue_id
    if name and "\n" not in name:
        (tmp_path / "T" / "0").mkdir(parents=True, exist_ok=True)
        (tmp_path / "T" / name).mkdir(exist_ok=True)
        expected = sorted({("T", 0), *([] if queue_id is None else [("T", queue_id)])})
        assert sorted(consumequeue.list_queues(tmp_path)) == expected
        (tmp_path / "U" / "3").mkdir(parents=True, exist_ok=True)
        assert consumequeue.list_queues(tmp_path, topic="T") == expected
        assert consumequeue.list_queues(tmp_path, topic="U") == [("U", 3)]
        assert consumequeue.list_queues(tmp_path, topic="V") == []


def test_a_topic_folder_moved_after_the_listing_is_not_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rebuild beside a reader moves the consume-queue folders to quarantine between the
    reader's listing of the topics and of one topic's queues: that topic has no queues (it
    ended the reader with a bare "No such file or directory (PATH)", exit 2)."""
    import os
    import shutil

    for topic in ("T", "U"):
        (tmp_path / topic / "0").mkdir(parents=True)
    listed = os.scandir

    def topics_then_a_move(folder):
        entries = list(listed(folder))
        if Path(folder) == tmp_path:
            shutil.move(tmp_path / "T", tmp_path.parent / "moved-T")
        return entries

    monkeypatch.setattr(consumequeue.os, "scandir", topics_then_a_move)
    assert consumequeue.list_queues(tmp_path) == [("U", 0)]


@pytest.mark.parametrize("units", [1, *_BOUNDARIES, *(n + 1 for n in _BOUNDARIES)])
def test_the_min_offset_is_the_first_unit_still_in_the_log(
    tmp_path: Path, units: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """correctMinOffset: the first unit of the first file pointing at or past the commit
    log's min offset, however far into the file (past the chunk boundaries); none found: the
    queue's start stays. The common case (nothing expired) reads one chunk."""
    count = _BOUNDARIES[-1] + 10
    _queue_file(tmp_path, _units(count))
    read = _counted_reads(monkeypatch)
    for expired, expected in ((0, 0), (units - 1, units - 1), (count + 5, 0)):
        queue = ConsumeQueue(tmp_path, "T", 0, FILE_SIZE)
        read.clear()
        commitlog_min_offset = 100 * expired - 50 if expired else 0  # inside unit expired-1
        queue.correct_min_offset(commitlog_min_offset)
        assert queue.min_offset == expected
        if not expired:
            assert sum(read) <= _FIRST_CHUNK
        # corrected by the load, from the chunks it read: the same min offset
        read.clear()
        loaded = ConsumeQueue(tmp_path, "T", 0, FILE_SIZE)
        load_reads = len(read)
        read.clear()
        corrected = ConsumeQueue(
            tmp_path, "T", 0, FILE_SIZE, commitlog_min_offset=commitlog_min_offset
        )
        if not expired:  # nothing read past what the load reads
            assert len(read) == load_reads
        assert corrected.min_offset == expected and corrected.bounds[0] == loaded.bounds[0]
        assert loaded.loaded_last_unit == corrected.loaded_last_unit == loaded.read_unit(count - 1)


def test_units_of_a_queue_with_a_file_cut_short_in_the_middle(tmp_path: Path) -> None:
    """A queue file before the last one cut to 189 bytes (not a whole number of units), the
    queue's end still told by its last file: reading its units gives the whole ones of the
    cut file and stops there (it raised struct.error, and verify's second look at the queue
    ended in an internal error)."""
    import os

    from rmqstore.fixtures import FixtureOptions, generate
    from rmqstore.store import Store
    from rmqstore.verify import verify_store

    store = tmp_path / "store"
    generate("lmq", store, FixtureOptions(messages=4000, commitlog_file_size=256 * 1024))
    folder = store / "consumequeue" / "%LMQ%room-1" / "0"
    files = sorted(folder.iterdir())
    cut = files[len(files) // 2]
    os.truncate(cut, 189)
    queue = ConsumeQueue(store / "consumequeue", "%LMQ%room-1", 0, 400, strict=False)
    assert queue.max_offset > int(cut.name) // 20 + 9  # past the cut
    values = list(queue.unit_values())
    assert [value[0] for value in values] == list(range(int(cut.name) // 20 + 9))
    with Store.open_read(store) as opened:
        report = verify_store(opened)
    assert report.counts["cq-unit"] > 0 and not report.ok


def _syncing_spy(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files ``sync_file_data`` makes durable (for real), in order, by name."""
    synced: list[str] = []
    real = consumequeue.sync_file_data

    def sync_file_data(path: Path) -> None:
        synced.append(path.name)
        real(path)

    monkeypatch.setattr(consumequeue, "sync_file_data", sync_file_data)
    return synced


def test_a_flush_syncs_a_file_the_queue_moved_on_from_or_let_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Units written through a file's map after the last flush are durable only once that
    file is synced: a queue that rolled to its next file, or let its map go (past
    WRITE_MAPS.limit, another queue mapped meanwhile), still syncs it at its next flush. It
    synced only the file mapped at the flush, so the units the previous file took since the
    last flush were not made durable by it."""
    synced = _syncing_spy(monkeypatch)
    queue = ConsumeQueue(tmp_path, "T", 0, 4 * CQ_UNIT_SIZE)  # 4 units a file
    queue.put(0, 0, 100, 7)
    queue.flush()
    assert synced == [f"{0:020d}"]
    synced.clear()
    for number in range(1, 4):  # 3 more in the first file
        queue.put(number, number * 100, 100, 7)
    assert synced == []
    for number in range(4, 6):  # 2 in the second: the first is synced before its first unit
        queue.put(number, number * 100, 100, 7)
        assert synced == [f"{0:020d}"]
    queue.flush()
    assert synced == [f"{0:020d}", f"{4 * CQ_UNIT_SIZE:020d}"]
    queue.close()

    monkeypatch.setattr(consumequeue.WRITE_MAPS, "limit", 1)
    first, second = (ConsumeQueue(tmp_path, topic, 0, 400) for topic in ("A", "B"))
    first.put(0, 0, 100, 7)
    first.flush()
    first.put(1, 100, 100, 7)  # through the map, marking nothing
    second.put(0, 200, 100, 7)  # maps its own file: the first lets its map go
    synced.clear()
    first.flush()
    assert synced == [f"{0:020d}"]
    second.close()
    first.close()
    assert ConsumeQueue(tmp_path, "A", 0, 400).max_offset == 2


def test_a_queue_starting_past_its_files_start_appears_with_its_fill_and_first_unit_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queue's first file, made for a unit at queue offset 7 (an HA replica's queues, a
    queue whose old files expired): the pre-blank units and the unit are synced before the
    file appears under its name. A power cut used to be able to leave it all zero (the next
    put then appends at offset 0, at the wrong queue offset) or holding only the fill (a
    broker's load takes a pre-blank unit for a record ending at 2 GiB). A queue starting at
    its file's start is made sparse, with no sync (an all-zero file ends it where its unit
    goes again)."""
    import os

    happened: list[tuple[str, bytes]] = []
    real_rename, real_fdatasync = os.rename, os.fdatasync

    def rename(source: str | Path, target: str | Path) -> None:
        happened.append(("rename", Path(source).read_bytes()[: 9 * CQ_UNIT_SIZE]))
        real_rename(source, target)

    def fdatasync(fd: int) -> None:
        happened.append(("fdatasync", b""))
        real_fdatasync(fd)

    monkeypatch.setattr(os, "rename", rename)
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    queue = ConsumeQueue(tmp_path / "late", "T", 0, 20 * CQ_UNIT_SIZE)
    assert queue.put(7, 1000, 100, 5) is PutOutcome.WRITTEN
    head = PRE_BLANK_UNIT * 7 + UNIT.pack(1000, 100, 5) + bytes(CQ_UNIT_SIZE)
    assert happened == [("fdatasync", b""), ("rename", head)]
    assert (queue.min_offset, queue.max_offset, queue.max_physical_offset) == (7, 8, 1100)
    queue.close()

    happened.clear()
    queue = ConsumeQueue(tmp_path / "early", "T", 0, 20 * CQ_UNIT_SIZE)
    assert queue.put(20, 1000, 100, 5) is PutOutcome.WRITTEN  # the start of its second file
    assert happened == [("rename", bytes(9 * CQ_UNIT_SIZE))]
    queue.close()


def test_a_queue_made_with_its_names_deferred_syncs_them_before_a_second_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dispatcher whose file system gets one syncfs at the end makes a queue's first file,
    and the folders for it, without an fsync of each folder (``defer_names``). The queue
    that rolls to a second file makes those names durable before the second file appears
    (and the first file's units before the second takes any), so a power cut never leaves
    the later file on the disk without the earlier one; a flush makes them durable too."""
    import os

    happened: list[str] = []
    real_rename, real_fsync_directory = os.rename, consumequeue.fsync_directory

    def rename(source: str | Path, target: str | Path) -> None:
        happened.append(f"rename {Path(target).name}")
        real_rename(source, target)

    def fsync_directory(folder: Path) -> None:
        happened.append(f"fsync {folder.relative_to(tmp_path)}")
        real_fsync_directory(folder)

    monkeypatch.setattr(os, "rename", rename)
    monkeypatch.setattr(consumequeue, "fsync_directory", fsync_directory)
    monkeypatch.setattr("rmqstore.segments.fsync_directory", fsync_directory)
    synced = _syncing_spy(monkeypatch)
    root = tmp_path / "consumequeue"
    queue = ConsumeQueue(root, "T", 0, 4 * CQ_UNIT_SIZE)
    queue.defer_names = True
    for number in range(4):
        queue.put(number, number * 100, 100, 7)
    assert happened == [f"rename {0:020d}"] and synced == []
    assert queue.sync_deferred()  # one file to sync: it can wait for the syncfs
    queue.put(4, 400, 100, 7)
    assert happened == [
        f"rename {0:020d}",
        # the first file's names, outermost first, then the second file, made durably
        "fsync .",
        "fsync consumequeue",
        "fsync consumequeue/T",
        "fsync consumequeue/T/0",
        f"rename {4 * CQ_UNIT_SIZE:020d}",
        "fsync consumequeue/T/0",
    ]
    assert synced == [f"{0:020d}"]
    queue.close()

    happened.clear()
    other = ConsumeQueue(root, "U", 3, 4 * CQ_UNIT_SIZE)
    other.defer_names = True
    other.put(0, 900, 100, 7)
    other.flush()  # a flush makes the deferred names durable first
    names = ["consumequeue", "consumequeue/U", "consumequeue/U/3"]
    assert happened == [f"rename {0:020d}"] + [f"fsync {name}" for name in names]
    assert not other.sync_deferred()  # nothing left to sync
    other.close()
