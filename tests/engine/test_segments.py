"""Segment-file naming, lookup, sizes and sparse residue detection."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from rmqstore.errors import StoreFormatError
from rmqstore.segments import (
    SegmentQueue,
    all_zeros,
    data_end_estimate,
    last_nonzero_end,
    nonzero_extent,
    pwrite_fully,
    segment_name,
    write_whole_file,
)

from support import small_filesystem, vectors


@pytest.mark.parametrize(("offset", "name"), sorted(vectors()["mappedFileNames"].items()))
def test_names(offset: str, name: str) -> None:
    assert segment_name(int(offset)) == name


def make_queue(tmp_path: Path, starts: list[int], size: int = 100) -> SegmentQueue:
    for start in starts:
        (tmp_path / segment_name(start)).write_bytes(bytes(size))
    return SegmentQueue.load(tmp_path, size)


def test_find_follows_the_broker_rule(tmp_path: Path) -> None:
    queue = make_queue(tmp_path, [200, 300, 500])
    assert queue.find(250).start == 200
    assert queue.find(399).start == 300
    assert queue.find(550).start == 500  # after a gap: found by scanning
    assert queue.find(450) is None and queue.find(199) is None and queue.find(600) is None


def test_sizes_are_checked_and_unexpected_entries_listed(tmp_path: Path) -> None:
    make_queue(tmp_path, [0, 100])
    (tmp_path / segment_name(200)).write_bytes(bytes(50))
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "subdir").mkdir()
    with pytest.raises(StoreFormatError, match="is 50 bytes"):
        SegmentQueue.load(tmp_path, 100)
    lenient = SegmentQueue.load(tmp_path, 100, strict=False)
    # a folder too: a broker lists it with the files
    assert lenient.problems and [p.name for p in lenient.unexpected] == ["notes.txt", "subdir"]


def test_a_file_deleted_between_the_listing_and_its_look_is_not_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker's retention deletes its oldest file right after a reader listed the folder:
    the listing leaves it out (its size could not be looked at). It used to end the command
    with a bare "No such file or directory" (exit 2, as if a path given were wrong)."""
    import rmqstore.segments as segments

    make_queue(tmp_path, [0, 100, 200])
    listed = list(os.scandir(tmp_path))

    def listing_then_deletion(folder: Path) -> list[os.DirEntry[str]]:
        (tmp_path / segment_name(0)).unlink()  # after the listing, before the look
        return listed

    monkeypatch.setattr(segments.os, "scandir", listing_then_deletion)
    queue = SegmentQueue.load(tmp_path, 100)
    assert [s.start for s in queue.segments] == [100, 200]


def test_a_store_file_gone_since_it_was_listed_is_said_so(tmp_path: Path) -> None:
    """A file a listing found, deleted or moved before a reader opens it (a broker's
    retention, a rebuild beside the reader): one line saying so, exit 4 (it said "cannot
    read PATH: No such file or directory")."""
    from rmqstore.errors import StoreIOError
    from rmqstore.indexfile import IndexFile
    from rmqstore.segments import file_reader
    from rmqstore.windows import FileWindows, read_range

    gone = tmp_path / segment_name(0)
    for read in (
        lambda: read_range(gone, 0, 20),
        lambda: FileWindows(gone, 100),
        lambda: nonzero_extent(gone, 0, 20),  # (these said "cannot read PATH: No such file")
        lambda: last_nonzero_end(gone, 20),
        lambda: file_reader(gone)(0, 20),
        lambda: IndexFile.open(tmp_path / "20240101000000000", 2, 4),
    ):
        with pytest.raises(StoreIOError, match=r"is gone since the store was listed .* again"):
            read()


def test_an_empty_last_file_is_ignored_like_5x(tmp_path: Path) -> None:
    make_queue(tmp_path, [0])
    (tmp_path / segment_name(100)).write_bytes(b"")
    queue = SegmentQueue.load(tmp_path, 100)
    assert [s.start for s in queue.segments] == [0] and queue.problems


def test_created_segments_are_full_size_and_sparse(tmp_path: Path) -> None:
    queue = SegmentQueue.load(tmp_path, 1 << 20)
    segment = queue.create(1 << 20)
    assert segment.path.name == "00000000000001048576"
    assert segment.path.stat().st_size == 1 << 20
    assert segment.path.stat().st_blocks * 512 < 1 << 20
    with pytest.raises(StoreFormatError):
        queue.create(12345)


def _stop_once(monkeypatch: pytest.MonkeyPatch, where: object, name: str, after: bool) -> None:
    """``where.name`` raises KeyboardInterrupt (a Ctrl-C there) at its first call: before
    doing its work, or ``after`` it."""
    real = getattr(where, name)
    calls: list[object] = []

    def stopped(*args: object, **kwargs: object) -> object:
        calls.append(args)
        if len(calls) > 1:
            return real(*args, **kwargs)
        if after:
            real(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(where, name, stopped)


@pytest.mark.parametrize(
    ("name", "after"), [("rename", False), ("fsync_directory", False), ("fsync_directory", True)]
)
def test_a_stop_as_a_segment_is_made_leaves_nothing_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, after: bool
) -> None:
    """A signal while a file is made (its temporary written, or renamed into place but not
    yet listed): nothing of it stays, neither the temporary (which a dispatch's tidying did
    not find) nor a file no list holds (left after a stopped dispatch that said the store
    was unchanged). The next make of it succeeds."""
    import rmqstore.segments as segments

    queue = SegmentQueue.load(tmp_path, 1 << 20)
    _stop_once(monkeypatch, os if name == "rename" else segments, name, after)
    with pytest.raises(KeyboardInterrupt):
        queue.create(0, head=b"\x01" * 20)
    assert os.listdir(tmp_path) == [] and queue.segments == []
    assert queue.create(0).path.name == segment_name(0)


def test_an_empty_file_left_at_the_name_stays_when_a_stop_comes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An empty file an older writer's kill left at the name was there before: a stop before
    the rename leaves it as it was (the temporary goes)."""
    (tmp_path / segment_name(0)).write_bytes(b"")
    queue = SegmentQueue.load(tmp_path, 1 << 20)
    _stop_once(monkeypatch, os, "rename", False)
    with pytest.raises(KeyboardInterrupt):
        queue.create(0)
    assert os.listdir(tmp_path) == [segment_name(0)]
    assert (tmp_path / segment_name(0)).stat().st_size == 0


def test_a_stop_as_a_whole_file_is_written_keeps_the_old_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signal before the new version is renamed into place: the old one stays, and no
    temporary is left for verify to call an unknown file."""
    path = tmp_path / "checkpoint"
    path.write_bytes(b"old")
    _stop_once(monkeypatch, os, "replace", False)
    with pytest.raises(KeyboardInterrupt):
        write_whole_file(path, b"new")
    assert os.listdir(tmp_path) == ["checkpoint"] and path.read_bytes() == b"old"


def test_nonzero_extent(tmp_path: Path) -> None:
    path = tmp_path / "f"
    with open(path, "wb") as handle:
        handle.truncate(10 << 20)
    assert nonzero_extent(path, 0, 10 << 20) is None
    fd = os.open(path, os.O_RDWR)
    os.pwrite(fd, b"\x01\x00\x02", (5 << 20) + 7)
    os.close(fd)
    assert nonzero_extent(path, 0, 10 << 20) == ((5 << 20) + 7, (5 << 20) + 10)
    assert nonzero_extent(path, (5 << 20) + 9, 10 << 20) == ((5 << 20) + 9, (5 << 20) + 10)
    assert nonzero_extent(path, (5 << 20) + 10, 10 << 20) is None


def test_last_nonzero_end(tmp_path: Path) -> None:
    """Found from the end backwards, across holes and chunk edges, within the size given."""
    path = tmp_path / "f"
    with open(path, "wb") as handle:
        handle.truncate(10 << 20)
    assert last_nonzero_end(path, 10 << 20) == 0
    fd = os.open(path, os.O_RDWR)
    os.pwrite(fd, b"\x01\x00\x02", (5 << 20) + 7)  # a hole after it, and zeros before
    assert last_nonzero_end(path, 10 << 20) == (5 << 20) + 10
    assert last_nonzero_end(path, (5 << 20) + 9) == (5 << 20) + 8  # only what lies before
    os.pwrite(fd, b"\x03", (1 << 20) - 1)  # the last byte of a chunk
    assert last_nonzero_end(path, 5 << 20) == 1 << 20
    os.pwrite(fd, b"\x04", (10 << 20) - 1)  # the very end
    os.close(fd)
    assert last_nonzero_end(path, 10 << 20) == 10 << 20
    dense = tmp_path / "dense"  # no holes: the zero tail is read
    dense.write_bytes(b"\x05" * 100 + bytes(3 << 20))
    assert last_nonzero_end(dense, dense.stat().st_size) == 100


def test_a_write_the_disk_cuts_short_is_continued_until_it_fails(tmp_path: Path) -> None:
    """A disk filling up writes what fits and reports it as a short count, not an error:
    pwrite_fully asks for the rest and so raises the full disk instead of stopping short."""
    with small_filesystem(tmp_path, "1m") as disk:
        fd = os.open(disk / "f", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            written = os.pwrite(fd, bytes(2 << 20), 0)
            assert 0 < written < 2 << 20  # what a single write does here
            with pytest.raises(OSError) as raised:
                pwrite_fully(fd, b"x" * (2 << 20), 0)
            assert raised.value.errno == errno.ENOSPC
            pwrite_fully(fd, b"y" * 4096, 0)  # what fits is written whole
        finally:
            os.close(fd)
        assert (disk / "f").read_bytes()[:4097] == b"y" * 4096 + b"x"


@pytest.mark.parametrize("data_end", [0, 1, 4095, 4096, 4097, 40_000, 65_536])
def test_the_data_end_estimate_finds_the_block_after_the_data(data_end: int) -> None:
    """A file whose data fills it from its start to ``data_end``: the estimate is the end of
    the 4 KiB block the data ends in (the first block is taken to hold data)."""
    size = 65_536
    content = bytes(range(1, 256)) * (size // 255 + 1)
    content = content[:data_end] + bytes(size - data_end)

    def read(position: int, length: int) -> bytes:
        return content[position : position + length]

    blocks = max(1, -(-data_end // 4096))  # the blocks holding data, rounded up
    assert data_end_estimate(read, size, block=4096) == blocks * 4096
    assert all_zeros(bytes(10)) and all_zeros(b"") and not all_zeros(bytes(9) + b"\x01")
