"""Index files (spec §7): ``index/<yyyyMMddHHmmssSSS>``, a 40-byte header, hash slots and
20-byte entries chained per slot. This module owns their layout: put a key, walk a chain,
roll to a new file when one is full, and answer ``queryOffset`` across files."""

from __future__ import annotations

import functools
import mmap
import os
import re
import struct
import sys
import time
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rmqstore import kernel
from rmqstore.errors import RebuildFirstError, StoreFormatError, StoreIOError, read_failure
from rmqstore.hashing import index_key_hash, index_key_hash_with_prefix, java_string_hash
from rmqstore.kernel import layout as kernel_layout
from rmqstore.segments import (
    creating_name,
    discard_made,
    fsync_directory,
    link_target,
    make_directories,
    map_writable,
    open_file_limit,
    reserve_blocks,
)

HEADER_SIZE = 40
SLOT_SIZE = 4
ENTRY_SIZE = 20
MAX_QUERY_RESULTS = 64  # maxMsgsNumBatch
LONG_MAX = (1 << 63) - 1
_HEADER = struct.Struct(">qqqqii")
_ENTRY = struct.Struct(">iqii")
_OFFSET_AT = 4  # where an entry's physical offset is in it
_LITTLE_ENDIAN = sys.byteorder == "little"
_INT = struct.Struct(">i")
_NAME = re.compile(r"[0-9]{17}")
_RESERVE_ENTRIES = 65536  # entries whose blocks are allocated at a time (1.25 MiB)
_ENTRY_CHUNK = 65536  # entries read at a time (1.25 MiB)
# index files an IndexService keeps open (descriptors, or the map of the one written): the
# others are opened again when read. A store of small index files has thousands, and each
# held open ran a dispatch or recovery out of descriptors (EMFILE) under a ulimit of 1024
OPEN_FILES_KEPT = 64  # at most; fewer under a low open-file limit (open_files_kept)


@functools.cache
def open_files_kept() -> int:
    """How many index files an IndexService holds open: :data:`OPEN_FILES_KEPT`, or an
    eighth of the open-file limit when that is less (at least 4): under a limit of 64 the
    64 held ran a verify or key look-up out of descriptors, with the consume queues' maps
    and the commit log's files beside them."""
    limit = open_file_limit()
    return OPEN_FILES_KEPT if limit is None else max(4, min(OPEN_FILES_KEPT, limit // 8))


# a key hashed by a worker: physical offset, store time, key hash, 1 for a record's first key
HASHED_KEY = struct.Struct(kernel_layout.HASHED_KEY_FORMAT)


def is_index_name(name: str) -> bool:
    """Whether ``name`` is an index file's: 17 digits, its creation time (yyyyMMddHHmmssSSS)."""
    return _NAME.fullmatch(name) is not None


def index_file_size(slots: int, entries: int) -> int:
    return HEADER_SIZE + slots * SLOT_SIZE + entries * ENTRY_SIZE


def index_file_name(millis: int, *, utc: bool = False) -> str:
    """``UtilAll.timeMillisToHumanString``: yyyyMMddHHmmssSSS in the local time zone, as the
    broker's JVM names files (or in UTC, for names that do not depend on the machine)."""
    moment = time.gmtime(millis / 1000) if utc else time.localtime(millis / 1000)
    return time.strftime("%Y%m%d%H%M%S", moment) + f"{millis % 1000:03d}"


@dataclass
class IndexHeader:
    begin_timestamp: int = 0
    end_timestamp: int = 0
    begin_phy_offset: int = 0
    end_phy_offset: int = 0
    hash_slot_count: int = 0
    index_count: int = 1  # entry 0 is never used

    @property
    def never_written(self) -> bool:
        """All zero (``index_count`` read as 1): a file made, then a crash before its first
        header write reached the disk."""
        return self == IndexHeader()

    def carry_end_of(self, previous: IndexHeader) -> None:
        """Begin and end where ``previous`` ends, as a file made after it starts."""
        if previous.end_phy_offset > 0:
            self.begin_phy_offset = self.end_phy_offset = previous.end_phy_offset
        if previous.end_timestamp > 0:
            self.begin_timestamp = self.end_timestamp = previous.end_timestamp


def read_index_headers(directory: Path) -> list[tuple[Path, IndexHeader]]:
    """The header of every index file, in name order. Headers do not depend on the slot and
    entry counts, so this works without knowing the broker's configuration."""
    headers = []
    if not directory.is_dir():
        return headers
    for path in sorted(directory.iterdir()):
        if is_index_name(path.name) and path.is_file():
            try:
                with open(path, "rb") as handle:
                    data = handle.read(HEADER_SIZE)
            except OSError as exc:
                raise read_failure(path, exc) from None
            header = IndexHeader(*_HEADER.unpack(data.ljust(HEADER_SIZE, b"\0")))
            header.index_count = max(header.index_count, 1)
            headers.append((path, header))
    return headers


def infer_geometry(file_size: int) -> tuple[int, int] | None:
    """(slots, entries) for a file of ``file_size`` bytes when it has RocketMQ's default
    ratio of four entries per slot; None otherwise (the broker's configuration is needed)."""
    slots, remainder = divmod(file_size - HEADER_SIZE, SLOT_SIZE + 4 * ENTRY_SIZE)
    return (slots, 4 * slots) if slots > 0 and remainder == 0 else None


class IndexFile:
    """One index file, mapped. The header is kept in memory and written to the map after
    every record's keys (:meth:`sync_header`), so the file is consistent between records."""

    def __init__(
        self,
        path: Path,
        slots: int,
        entries: int,
        buf: mmap.mmap | None,
        header: IndexHeader,
        writable: bool,
        fd: int = -1,
    ) -> None:
        self.path = path
        self.slots = slots
        self.entries = entries
        self.buf = buf  # the writable map; None when read-only
        self.fd = fd  # the descriptor reads use when read-only (never mapped: no SIGBUS)
        self.header = header
        self.writable = writable
        self._entries_at = HEADER_SIZE + slots * SLOT_SIZE
        self.reserved_entries = 0  # entries below this number have their disk blocks
        # released (:meth:`release`): the file is opened again, read-only, when next read;
        # ``on_reopen`` is told (the service keeping few open)
        self.released = False
        self.on_reopen: Callable[[IndexFile], None] | None = None

    @classmethod
    def open(cls, path: Path, slots: int, entries: int, *, writable: bool = False) -> IndexFile:
        expected = index_file_size(slots, entries)
        try:
            size = path.stat().st_size
        except OSError as exc:
            raise read_failure(path, exc) from None
        if size != expected:
            raise StoreFormatError(
                f"index file {path} is {size} bytes, but {slots} hash slots and {entries} "
                f"entries make {expected}; pass the broker's maxHashSlotNum/maxIndexNum "
                "(--broker-config or --index-slots/--index-entries), or, where the file is "
                "damaged, rmqstore dispatch --rebuild --yes builds the index again"
            )
        if writable:
            index = cls(path, slots, entries, map_writable(path), IndexHeader(), True)
        else:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as exc:
                raise read_failure(path, exc) from None
            index = cls(path, slots, entries, None, IndexHeader(), False, fd)
        header = index.header = IndexHeader(*_HEADER.unpack(index.read(0, HEADER_SIZE)))
        if header.index_count <= 0:
            header.index_count = 1  # a file never written has an all-zero header
        if header.index_count > entries or not 0 <= header.hash_slot_count <= slots:
            index.close(flush=False)
            raise StoreFormatError(
                f"index file {path} has a corrupt header: indexCount {header.index_count}, "
                f"hashSlotCount {header.hash_slot_count} (at most {entries} and {slots})"
            )
        if writable:
            try:
                index.reserve_entries(header.index_count)
            except BaseException:
                index.close(flush=False)
                raise
            index.drop_unfinished_entries()
        return index

    def reserve_entries(self, upto: int) -> None:
        """Allocate disk blocks for the header, the slots and the entries below ``upto``
        (rounded up to a step of entries) before any is written through the map: a write
        into a hole of this sparse file on a full disk would be a SIGBUS, not an error. The
        entries not used yet stay holes, as in a broker's file."""
        if upto < self.reserved_entries:
            return
        target = min(self.entries, max(upto + 1, self.reserved_entries) + _RESERVE_ENTRIES)
        reserve_blocks(self.path, self._entries_at + target * ENTRY_SIZE)
        self.reserved_entries = target

    def drop_unfinished_entries(self) -> int:
        """After a kill: entries written past the header's indexCount (the header follows
        each record's entries and slots) belong to a record whose indexing did not finish.
        They are zeroed, and each slot pointing at one is set back along its chain to the
        newest entry below the count, so the next put cannot chain an entry to itself and
        older entries of the slot stay reachable. Returns how many were dropped."""
        count = self.header.index_count
        number = count
        while number < self.entries:
            key_hash, physical_offset, time_diff, previous = self.entry(number)
            if not (key_hash or physical_offset or time_diff or previous):
                break  # never written
            slot_at = HEADER_SIZE + (key_hash % self.slots) * SLOT_SIZE
            head = _INT.unpack_from(self.buf, slot_at)[0]
            if head >= count:
                while count <= head < self.entries:
                    following = self.entry(head)[3]
                    head = following if following < head else 0  # a loop ends the chain
                _INT.pack_into(self.buf, slot_at, head if 0 < head < count else 0)
            _ENTRY.pack_into(self.buf, self._entries_at + number * ENTRY_SIZE, 0, 0, 0, 0)
            number += 1
        return number - count

    @classmethod
    def create(
        cls, path: Path, slots: int, entries: int, previous: IndexHeader | None
    ) -> IndexFile:
        """A new file; a follow-on file starts its header at the previous file's end."""
        size = index_file_size(slots, entries)
        temporary = path.with_name(creating_name(path.name))
        if os.path.lexists(path):
            raise StoreFormatError(f"{path} already exists")
        index = None
        try:
            fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
            try:
                os.ftruncate(fd, size)  # sparse, as the broker's; blocks reserved as used
            finally:
                os.close(fd)
            os.rename(temporary, path)  # in place only at full size
            fsync_directory(path.parent)
            header = IndexHeader()
            if previous is not None:
                header.carry_end_of(previous)
            index = cls(path, slots, entries, map_writable(path), header, True)
            index.reserve_entries(1)  # no room even for its slots: no file left behind
            index.sync_header()
        except BaseException as exc:  # an error or a signal: nothing of the file stays
            if index is not None:
                index.close(flush=False)
            discard_made(temporary, path)
            if isinstance(exc, OSError):
                raise StoreIOError(f"cannot create {path}: {exc.strerror}") from None
            raise
        return index

    @property
    def is_full(self) -> bool:
        return self.header.index_count >= self.entries

    def put_key(self, key_hash: int, physical_offset: int, store_timestamp: int) -> bool:
        """``IndexFile.putKey``; False when the file is full."""
        header = self.header
        count = header.index_count
        if count >= self.entries:
            return False
        if count >= self.reserved_entries:
            self.reserve_entries(count)
        buf = self.buf
        slot_at = HEADER_SIZE + (key_hash % self.slots) * SLOT_SIZE
        previous = _INT.unpack_from(buf, slot_at)[0]
        if previous <= 0 or previous > count:
            previous = 0
        begin = header.begin_timestamp
        if begin <= 0 or store_timestamp <= begin:
            time_diff = 0  # Java: max(diff / 1000, 0), the division truncating toward zero
        else:
            time_diff = min((store_timestamp - begin) // 1000, 0x7FFFFFFF)
        _ENTRY.pack_into(
            buf,
            self._entries_at + count * ENTRY_SIZE,
            key_hash,
            physical_offset,
            time_diff,
            previous,
        )
        _INT.pack_into(buf, slot_at, count)
        if count <= 1:
            header.begin_phy_offset = physical_offset
            header.begin_timestamp = store_timestamp
        if previous == 0:
            header.hash_slot_count += 1
        header.index_count = count + 1
        header.end_phy_offset = physical_offset
        header.end_timestamp = store_timestamp
        return True

    def sync_header(self) -> None:
        header = self.header
        _HEADER.pack_into(
            self.buf,
            0,
            header.begin_timestamp,
            header.end_timestamp,
            header.begin_phy_offset,
            header.end_phy_offset,
            header.hash_slot_count,
            header.index_count,
        )

    def time_matched(self, begin: int, end: int) -> bool:
        """``isTimeMatched``: the file's time range overlaps ``[begin, end]``."""
        first, last = self.header.begin_timestamp, self.header.end_timestamp
        return (begin < first and end > last) or first <= begin <= last or first <= end <= last

    def select(self, key: str, results: list[int], max_results: int, begin: int, end: int) -> None:
        """``selectPhyOffset``: walk the key's chain newest first, collecting the physical
        offsets of entries with the same 32-bit hash stored within ``[begin, end]``."""
        key_hash = index_key_hash(key)
        count = self.header.index_count
        current = self.slot(key_hash % self.slots)
        if current <= 0 or current > count or count <= 1:
            return
        while len(results) < max_results:
            entry_hash, physical_offset, time_diff, previous = self.entry(current)
            if time_diff < 0:
                break
            stamp = self.header.begin_timestamp + time_diff * 1000
            if entry_hash == key_hash and begin <= stamp <= end:
                results.append(physical_offset)
            if previous <= 0 or previous > count or previous == current or stamp < begin:
                break
            current = previous

    def entry(self, number: int) -> tuple[int, int, int, int]:
        """Entry ``number``: (keyHash, physical offset, timeDiff seconds, previous entry)."""
        if self.buf is not None:
            return _ENTRY.unpack_from(self.buf, self._entries_at + number * ENTRY_SIZE)
        return _ENTRY.unpack(self.read(self._entries_at + number * ENTRY_SIZE, ENTRY_SIZE))

    def slot(self, slot: int) -> int:
        if self.buf is not None:
            return _INT.unpack_from(self.buf, HEADER_SIZE + slot * SLOT_SIZE)[0]
        return _INT.unpack(self.read(HEADER_SIZE + slot * SLOT_SIZE, SLOT_SIZE))[0]

    def read(self, position: int, length: int) -> bytes:
        """``length`` bytes of the file from ``position`` (which the file must hold)."""
        if self.buf is not None:
            return bytes(self.buf[position : position + length])
        if self.released:
            self._reopen()
        try:
            data = os.pread(self.fd, length, position)
        except OSError as exc:
            raise StoreIOError(f"cannot read {self.path}: {exc.strerror}") from None
        if len(data) < length:
            raise StoreIOError(
                f"{self.path} ended at byte {position + len(data)} while it was read (an index "
                f"file is {index_file_size(self.slots, self.entries)} bytes): another process "
                "truncated it"
            )
        return data

    def slot_table(self) -> bytes:
        """The hash slots, as stored (big-endian ints)."""
        return self.read(HEADER_SIZE, self.slots * SLOT_SIZE)

    def entry_chunks(self, first: int = 1) -> Iterator[tuple[int, bytes]]:
        """``(number of the first, packed entries)`` from entry ``first`` to the last written,
        in chunks of 1.25 MiB."""
        count = self.header.index_count
        number = max(first, 1)
        while number < count:
            upto = min(count, number + _ENTRY_CHUNK)
            yield (
                number,
                self.read(self._entries_at + number * ENTRY_SIZE, (upto - number) * ENTRY_SIZE),
            )
            number = upto

    def iter_entries(self, first: int = 1) -> Iterator[tuple[int, tuple[int, int, int, int]]]:
        """``(number, entry)`` from entry ``first`` to the last written, read in chunks
        (memory stays one chunk whatever the file holds)."""
        for number, chunk in self.entry_chunks(first):
            for step, entry in enumerate(_ENTRY.iter_unpack(chunk)):
                yield number + step, entry

    def offset_chunks(self, first: int = 1) -> Iterator[tuple[int, array]]:
        """``(number of the first, the physical offset of each entry)`` from entry ``first``
        to the last written, a chunk at a time (each offset's bytes gathered by strided
        copies: no Python object per entry)."""
        for number, chunk in self.entry_chunks(first):
            count = len(chunk) // ENTRY_SIZE
            gathered = bytearray(8 * count)
            for byte in range(8):
                gathered[byte::8] = chunk[_OFFSET_AT + byte : count * ENTRY_SIZE : ENTRY_SIZE]
            offsets = array("q", gathered)
            if _LITTLE_ENDIAN:
                offsets.byteswap()
            yield number, offsets

    def flush(self) -> None:
        if self.writable and isinstance(self.buf, mmap.mmap):
            self.sync_header()
            try:
                self.buf.flush()
            except OSError as exc:
                raise StoreIOError(f"cannot flush {self.path}: {exc.strerror}") from None

    def release(self) -> None:
        """Flush a writable file and let its map or descriptor go, keeping the header: the
        file is opened again, read-only, when next read (a full file is never written
        again)."""
        if self.released or (self.buf is None and self.fd < 0):
            return  # released, or closed
        self.close()
        self.writable = False
        self.released = True

    def _reopen(self) -> None:
        try:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise StoreIOError(
                f"{self.path} was deleted while it was read (a broker deletes index files as "
                "the commit-log files they index expire): run the command again"
            ) from None
        except OSError as exc:
            raise StoreIOError(f"cannot read {self.path}: {exc.strerror}") from None
        self.released = False
        if self.on_reopen is not None:
            self.on_reopen(self)

    def close(self, *, flush: bool = True) -> None:
        """Flush (a writable file, unless ``flush`` is False: a failed open or creation) and
        release the map or descriptor."""
        self.released = False
        if self.buf is not None:
            if flush:
                self.flush()
            buf, self.buf = self.buf, None  # let go of before it is closed (a signal between)
            buf.close()
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)


class IndexService:
    """The ``index/`` directory: files in name (= creation time) order."""

    def __init__(
        self,
        directory: Path,
        slots: int,
        entries: int,
        *,
        writable: bool = False,
        clock: Callable[[], int] | None = None,
        utc_names: bool = False,
    ) -> None:
        self.directory = directory
        self.utc_names = utc_names
        self.slots = slots
        self.entries = entries
        self.writable = writable
        self.clock = clock or (lambda: time.time_ns() // 1_000_000)
        self.unexpected: list[Path] = []
        self.links: list[Path] = []  # index files that are symbolic links (read through)
        self.files: list[IndexFile] = []
        # told each new file's path before the file is made (a quarantine lists it as made)
        self.on_create: Callable[[Path], None] | None = None
        # the file writable_file is making, until it is listed in files
        self.making: Path | None = None
        self._topic_prefixes: dict[str, int] = {}  # Java hash of "topic#"
        self._open: dict[IndexFile, None] = {}  # the files held open, oldest first
        if directory.is_dir():
            try:
                for path in sorted(directory.iterdir()):
                    if is_index_name(path.name) and path.is_file():
                        if path.is_symlink():
                            self.links.append(path)
                            if writable:
                                self.refuse_links()
                        if writable and self.files:
                            self.files[-1].release()  # never written again: not the last
                        self._held(IndexFile.open(path, slots, entries, writable=writable))
                    else:
                        self.unexpected.append(path)
            except BaseException:
                self.close()  # the maps of the files opened before the one that failed
                raise
        if writable and len(self.files) > 1 and self.files[-1].header.never_written:
            # a power cut after the file was made, before its header reached the disk: it
            # starts where the one before ends, as made (with an end offset of 0 every
            # record would be indexed again, and its first entry timed from 0); written
            # with its first entry, so a file nothing is added to stays as it was found
            self.files[-1].header.carry_end_of(self.files[-2].header)

    def refuse_links(self, then: str = "") -> None:
        """RebuildFirstError when an index file is a symbolic link: rmqstore's writers write
        no file through one, so a writer that may write the index (or move its files) is
        refused before it changes anything; ``then``: what to run after the rebuild."""
        for path in self.links[:1]:
            raise RebuildFirstError(
                f"{path} is a symbolic link (to {link_target(path)}), which rmqstore's writers "
                f"do not write through; run rmqstore dispatch --rebuild --yes first{then} (it "
                "moves the index files, the link among them, to quarantine and builds the "
                "index in the store; rmqstore verify shows it: file-link)"
            )

    def _held(self, index: IndexFile) -> IndexFile:
        """Add a file just opened (the last of :attr:`files`)."""
        self.files.append(index)
        index.on_reopen = self._reopened
        self._reopened(index)
        return index

    def _reopened(self, index: IndexFile) -> None:
        """Count ``index`` as held open, and release the ones held longest beyond
        :func:`open_files_kept` (never the one written, nor ``index``)."""
        held = self._open
        held.pop(index, None)
        held[index] = None
        kept = open_files_kept()
        if len(held) <= kept:
            return
        for oldest in list(held):
            if len(held) <= kept:
                break
            if oldest is index or oldest.writable:
                continue
            del held[oldest]
            oldest.release()  # a no-op for one released or closed since

    @property
    def last(self) -> IndexFile | None:
        return self.files[-1] if self.files else None

    @property
    def last_written(self) -> IndexFile | None:
        """The last file a header was written to (a writer carries the end of the one
        before into a never-written last file: see ``__init__``)."""
        for index in reversed(self.files):
            if not index.header.never_written:
                return index
        return None

    def writable_file(self) -> IndexFile:
        """The last file, or a new one when there is none or it is full (``retryGetAndCreate``)."""
        last = self.last
        if last is not None and not last.is_full:
            return last
        try:
            make_directories(self.directory)
        except OSError as exc:
            raise StoreIOError(f"cannot create {self.directory}: {exc.strerror}") from None
        millis = self.clock()
        while (self.directory / index_file_name(millis, utc=self.utc_names)).exists():
            millis += 1  # two files in one millisecond: keep names unique and ordered
        if last is not None:
            last.flush()
        path = self.directory / index_file_name(millis, utc=self.utc_names)
        if self.on_create is not None:
            self.on_create(path)
        self.making = path  # until it is listed (see remove_files_after)
        created = self._held(
            IndexFile.create(path, self.slots, self.entries, last.header if last else None)
        )
        self.making = None
        if last is not None:
            last.release()  # full: never written again
        return created

    def build(
        self,
        physical_offset: int,
        store_timestamp: int,
        topic: str,
        uniq_key: str | None,
        keys: list[str],
    ) -> bool:
        """``buildIndex`` for one record: ``topic#UNIQ_KEY`` first, then ``topic#key`` for each
        KEYS piece. Skipped (False) when the record lies before the last file's end, the
        broker's protection against indexing a record twice."""
        files = self.files
        index = files[-1] if files else None
        if index is None or index.header.index_count >= index.entries:
            index = self.writable_file()
        end = index.header.end_phy_offset
        if physical_offset < end:
            return False  # already indexed
        record_keys = [uniq_key, *keys] if uniq_key is not None else keys
        if physical_offset == end:
            # the record the index ends with: resuming after a kill, only the keys its
            # indexing did not reach yet (none when it finished, as after a clean stop)
            present = self.entries_of(physical_offset)
            if present and present >= len(record_keys):
                return False
            record_keys = record_keys[present:]
        prefix = self._topic_prefixes.get(topic)
        if prefix is None:
            prefix = self._topic_prefixes[topic] = java_string_hash(f"{topic}#")
        for key in record_keys:
            key_hash = index_key_hash_with_prefix(prefix, key)
            while not index.put_key(key_hash, physical_offset, store_timestamp):
                index.sync_header()
                index = self.writable_file()
        index.sync_header()
        return True

    def entries_of(self, physical_offset: int) -> int:
        """How many entries at the very end of the index (across files) are for the record
        at ``physical_offset``: the keys of it already indexed, in order."""
        present = 0
        for index in reversed(self.files):
            number = index.header.index_count - 1
            while number >= 1 and index.entry(number)[1] == physical_offset:
                present += 1
                number -= 1
            if number >= 1:
                break
        return present

    def build_hashed(self, entries: Any) -> tuple[int, int]:
        """:meth:`build` for keys hashed elsewhere (by the record kernel's dispatch
        preparation, here or in worker processes): ``entries`` packed with
        :data:`HASHED_KEY` in log order, a record's keys one after the other, the first
        flagged. The record kernel writes them into the files. Returns (records indexed,
        entries written)."""
        total = len(entries) // HASHED_KEY.size
        state = kernel_layout.zeroed(kernel_layout.STATE_WIDTH)
        index: IndexFile | None = None
        number = 0
        while number < total:
            if index is None:
                files = self.files
                index = files[-1] if files and not files[-1].is_full else self.writable_file()
                header = index.header
                state[kernel_layout.STATE_COUNT] = header.index_count
                state[kernel_layout.STATE_SLOT_COUNT] = header.hash_slot_count
                state[kernel_layout.STATE_BEGIN_TIMESTAMP] = header.begin_timestamp
                state[kernel_layout.STATE_BEGIN_OFFSET] = header.begin_phy_offset
                state[kernel_layout.STATE_END_OFFSET] = header.end_phy_offset
                state[kernel_layout.STATE_END_TIMESTAMP] = header.end_timestamp
            number, reason = kernel.apply_index(
                index.buf,
                index.slots,
                index._entries_at,
                index.entries,
                index.reserved_entries,
                state,
                entries,
                number,
                total,
            )
            self._settle_header(index, state)
            if reason == kernel_layout.NEEDS_RESERVE:
                index.reserve_entries(state[kernel_layout.STATE_COUNT])
            elif reason == kernel_layout.INDEX_FULL:
                index = None  # the next file: a record's keys may continue there
        return state[kernel_layout.STATE_INDEXED], state[kernel_layout.STATE_WRITTEN]

    @staticmethod
    def _settle_header(index: IndexFile, state: array) -> None:
        header = index.header
        header.index_count = state[kernel_layout.STATE_COUNT]
        header.hash_slot_count = state[kernel_layout.STATE_SLOT_COUNT]
        header.begin_timestamp = state[kernel_layout.STATE_BEGIN_TIMESTAMP]
        header.begin_phy_offset = state[kernel_layout.STATE_BEGIN_OFFSET]
        header.end_phy_offset = state[kernel_layout.STATE_END_OFFSET]
        header.end_timestamp = state[kernel_layout.STATE_END_TIMESTAMP]
        index.sync_header()

    def query(
        self,
        topic: str,
        key: str,
        max_results: int = MAX_QUERY_RESULTS,
        begin: int = 0,
        end: int = LONG_MAX,
    ) -> list[int]:
        """``IndexService.queryOffset``: physical offsets of entries whose hash matches
        ``topic#key``, newest file first, at most ``min(max_results, 64)``. Hash matches only:
        callers must check the records themselves."""
        limit = min(max_results, MAX_QUERY_RESULTS)
        results: list[int] = []
        indexed_key = f"{topic}#{key}"
        for index in reversed(self.files):
            if index.time_matched(begin, end):
                index.select(indexed_key, results, limit, begin, end)
            if index.header.begin_timestamp < begin or len(results) >= limit:
                break
        return results

    def all_entries(self) -> Iterator[tuple[IndexFile, int, tuple[int, int, int, int]]]:
        for index in self.files:
            for number, entry in index.iter_entries():
                yield index, number, entry

    def flush(self) -> None:
        for index in self.files:
            if index.writable:
                index.flush()

    def close(self) -> None:
        for index in self.files:
            index.close()
        self.files = []
        self._open.clear()

    def remove_files_after(self, count: int) -> bool:
        """Remove the files after the first ``count`` (made by a dispatch that stopped
        before it put an entry there); False, and nothing removed, when one holds an entry."""
        made = self.files[count:]
        if self.making is not None and all(index.path != self.making for index in self.files):
            # a file made, then stopped before it was listed: it holds no entry
            discard_made(self.making.with_name(creating_name(self.making.name)), self.making)
            self.making = None
        if not made:
            return True
        if any(index.header.index_count > 1 for index in made):
            return False
        for index in made:
            index.close(flush=False)
            self._open.pop(index, None)
            index.path.unlink(missing_ok=True)
        del self.files[count:]
        fsync_directory(self.directory)
        return True
