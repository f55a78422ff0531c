"""One store file on its own, item by item, as ``rmqstore dump`` prints it (the counterpart of
Kafka's ``DumpLogSegments --files``).

- A commit-log file: each record (offset, position, size, format, queue, times, body CRC), a
  BLANK that closes the file, bytes that are not a record (and where records resume), and
  where the data ends with how many non-zero bytes follow.
- A consume-queue file: each unit (queue offset, commit-log offset, size, tagsCode); inside a
  store, each unit's record is looked up and said to match, to be missing or to differ.
- An index file: the header, the non-empty hash slots (optional), and each entry with the
  entry it links to (the slot's chain).
- The checkpoint: its fields (the 5.x ones too) and the times a crash's recovery derives
  from them, read as a broker maps the file (a short one zero-filled, and said to be short).

Every item is a dict with a ``type`` and camelCase fields (the JSON of ``dump --jsonl``).
Reads only, with ``pread`` (a file shrinking meanwhile is an error, never a crash); memory
stays one read window whatever the file's size.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rmqstore.checkpoint import CHECKPOINT_FILE_SIZE, read_checkpoint_file
from rmqstore.config import StoreConfig
from rmqstore.errors import InputError, NotFoundError, RecordError, StoreFormatError, StoreIOError
from rmqstore.indexfile import ENTRY_SIZE, HEADER_SIZE, SLOT_SIZE, IndexFile, infer_geometry
from rmqstore.record import (
    H_BODY_LENGTH,
    H_BORN_TIMESTAMP,
    H_MAGIC,
    H_QUEUE_ID,
    H_QUEUE_OFFSET,
    H_STORE_TIMESTAMP,
    H_SYS_FLAG,
    H_TOTAL_SIZE,
    MAGIC_V2,
    RegionScan,
    ScanStop,
    find_next_record_in_file,
)
from rmqstore.segments import is_segment_name, nonzero_extent
from rmqstore.topics import is_path_safe
from rmqstore.windows import FileWindows

if TYPE_CHECKING:
    from rmqstore.commitlog import RecordLookup
    from rmqstore.reader import MessageReader

_INDEX_NAME = re.compile(r"[0-9]{17}")
_UNIT = struct.Struct(">qiq")
_UNITS_PER_READ = 4096  # 80 KiB of units at a time


class FileKind(str, Enum):
    COMMITLOG = "commitlog"
    CONSUMEQUEUE = "consumequeue"
    INDEX = "index"
    CHECKPOINT = "checkpoint"


@dataclass(frozen=True)
class DumpTarget:
    """The file to dump, what kind it is, and the store it sits in (None: on its own)."""

    path: Path
    kind: FileKind
    store_root: Path | None


def identify(path: Path, kind: FileKind | None = None) -> DumpTarget:
    """Where ``path`` sits says what it is: ``commitlog/NAME``,
    ``consumequeue/TOPIC/QUEUE/NAME`` or ``index/NAME`` of a store (``kind`` overrides, for a
    file copied out of its store)."""
    if path.is_symlink() or not path.exists():
        raise InputError(f"{path} does not exist" if not path.exists() else f"{path} is a symlink")
    if not path.is_file():
        raise InputError(
            f"{path} is not a file: dump takes one commit-log, consume-queue, index or "
            "checkpoint file"
        )
    parents = path.resolve().parents
    found: FileKind | None = None
    root: Path | None = None
    if parents[0].name == "commitlog":
        found, root = FileKind.COMMITLOG, parents[1]
    elif len(parents) > 3 and parents[2].name == "consumequeue":
        found, root = FileKind.CONSUMEQUEUE, parents[3]
    elif parents[0].name == "index":
        found, root = FileKind.INDEX, parents[1]
    elif path.name == "checkpoint":
        found, root = FileKind.CHECKPOINT, parents[0]
    if kind is None and found is None:
        raise InputError(
            f"cannot tell what {path} is from where it sits; give --kind commitlog, "
            "consumequeue, index or checkpoint"
        )
    chosen = kind or found
    assert chosen is not None
    return DumpTarget(path, chosen, root if chosen is found else None)


def checkpoint_items(path: Path) -> Iterator[dict[str, Any]]:
    """The checkpoint's fields and derived times, as one ``checkpoint`` item; a note (and a
    ``shortBy`` count) when the file is shorter than a broker makes it."""
    found = read_checkpoint_file(path)
    if found is None:  # gone since identify() saw it
        raise NotFoundError(f"{path} does not exist")
    short_by = CHECKPOINT_FILE_SIZE - found.size
    yield {"type": "checkpoint", "fileSize": found.size, "shortBy": short_by,
           **found.checkpoint.to_dict()}  # fmt: skip
    if short_by:
        yield {
            "type": "note",
            "message": f"the file is {found.size} bytes, {short_by} short of "
            f"{CHECKPOINT_FILE_SIZE} (a crash as it was made): read as a broker maps it, "
            "the missing bytes as zeros",
        }


def _base_offset(path: Path, file_size: int) -> tuple[int, str | None]:
    """The offset of a file's first byte, from its 20-digit name (0 and a note otherwise)."""
    if is_segment_name(path.name):
        return int(path.name), None
    return 0, f"{path.name} is not a 20-digit offset name: offsets are counted from 0"


def commitlog_items(path: Path, *, check_crc: bool = True) -> Iterator[dict[str, Any]]:
    """The records of one commit-log file, then how it ends (see the module docstring)."""
    size = path.stat().st_size
    base, name_note = _base_offset(path, size)
    if name_note:
        yield {"type": "note", "message": name_note}
    windows = FileWindows(path, size)
    with ExitStack() as cleanup:
        cleanup.callback(windows.close)
        position = 0
        limit = windows.limit
        while True:
            region = RegionScan(None, position, limit, base, check_crc, windows=windows)
            for offset, header, topic, _properties, crc_ok in region:
                yield {
                    "type": "record",
                    "commitLogOffset": offset,
                    "filePosition": offset - base,
                    "storeSize": header[H_TOTAL_SIZE],
                    "version": 2 if header[H_MAGIC] == MAGIC_V2 else 1,
                    "topic": topic,
                    "queueId": header[H_QUEUE_ID],
                    "queueOffset": header[H_QUEUE_OFFSET],
                    "sysFlag": header[H_SYS_FLAG],
                    "bornTimestamp": header[H_BORN_TIMESTAMP],
                    "storeTimestamp": header[H_STORE_TIMESTAMP],
                    "bodyLength": header[H_BODY_LENGTH],
                    "bodyCrcOk": crc_ok,
                }
            end = region.end_position
            if region.stop is ScanStop.BLANK:
                yield {
                    "type": "blank",
                    "commitLogOffset": base + end,
                    "filePosition": end,
                    "storeSize": region.blank_length,
                    "fillsFile": region.blank_length == limit - end,
                }
                return
            if region.stop is ScanStop.INVALID:
                resumed = find_next_record_in_file(windows, end, base)
                assert region.error is not None
                yield {
                    "type": "invalid",
                    "commitLogOffset": base + end,
                    "filePosition": end,
                    "reason": f"{region.error.field} {region.error.reason}",
                    "resumesAt": None if resumed is None else base + resumed,
                }
                if resumed is None:
                    return
                position = resumed
                continue
            extent = nonzero_extent(path, end, limit)
            yield {
                "type": "end",
                "commitLogOffset": base + end,
                "filePosition": end,
                "nonZeroBytesAfter": 0 if extent is None else extent[1] - end,
            }
            return


def consumequeue_items(
    target: DumpTarget, config: StoreConfig | None = None, *, check: bool = True
) -> Iterator[dict[str, Any]]:
    """The units of one consume-queue file; inside a store (and ``check``), each with its
    record looked up (``record``: ok, missing, differs; ``unchecked`` on its own)."""
    path = target.path
    size = path.stat().st_size
    start, name_note = _base_offset(path, size)
    if name_note:
        yield {"type": "note", "message": name_note}
    if start % 20:
        raise StoreFormatError(f"{path}: a consume-queue file name is a multiple of 20 bytes")
    whole = size - size % 20  # the units; a torn write or a grown file can leave a part
    if whole < size:
        yield {
            "type": "note",
            "message": f"{path.name} is {size} bytes, not a whole number of 20-byte units: "
            f"its last {size - whole} bytes are no unit",
        }
    topic = queue_id = None
    if target.store_root is not None:
        topic, queue_text = path.parent.parent.name, path.parent.name
        queue_id = int(queue_text) if queue_text.isascii() and queue_text.isdigit() else None
    with ExitStack() as cleanup:
        lookup = reader = None
        if check and target.store_root is not None:
            from rmqstore.commitlog import RecordLookup
            from rmqstore.reader import MessageReader
            from rmqstore.store import Store

            store = cleanup.enter_context(Store.open_read(target.store_root, config))
            lookup = RecordLookup(store.commitlog)
            if queue_id is not None and is_path_safe(topic or ""):
                reader = MessageReader(store)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        cleanup.callback(os.close, fd)
        position = 0
        while position < whole:
            want = min(_UNITS_PER_READ * 20, whole - position)
            data = _pread(fd, path, want, position)
            units = list(_UNIT.iter_unpack(data))
            in_place = _units_in_place(reader, topic, queue_id, units, (start + position) // 20)
            for step, (offset, unit_size, tags_code) in enumerate(units):
                at = position + step * 20
                if offset == 0 and unit_size == 0 and tags_code == 0:
                    extent = nonzero_extent(path, at, size)
                    yield {
                        "type": "end",
                        "queueOffset": (start + at) // 20,
                        "filePosition": at,
                        "nonZeroBytesAfter": 0 if extent is None else extent[1] - at,
                    }
                    return
                queue_offset = (start + at) // 20
                item = {
                    "type": "unit",
                    "queueOffset": queue_offset,
                    "filePosition": at,
                    "commitLogOffset": offset,
                    "size": unit_size,
                    "tagsCode": tags_code,
                    "preBlank": offset == 0 and unit_size == 0x7FFFFFFF,
                    "record": "unchecked",
                }
                if step < len(in_place) and in_place[step]:
                    item["record"], item["recordNote"] = "ok", None
                elif lookup is not None and not item["preBlank"]:
                    item["record"], item["recordNote"] = _unit_record(
                        lookup, offset, unit_size, (topic, queue_id, queue_offset)
                    )
                yield item
            position += len(data)
        extent = nonzero_extent(path, whole, size) if whole < size else None
        yield {
            "type": "end",
            "queueOffset": (start + whole) // 20,
            "filePosition": whole,
            "nonZeroBytesAfter": 0 if extent is None else extent[1] - whole,
        }


def _units_in_place(
    reader: MessageReader | None,
    topic: str | None,
    queue_id: int | None,
    units: list[tuple[int, int, int]],
    first_queue_offset: int,
) -> list[bool]:
    """Which of ``units`` (offset, size, tagsCode from ``first_queue_offset`` on) plainly
    point at their records (:meth:`MessageReader.units_in_place`: a span of the log read at
    once, not a read per unit), up to the first all-zero unit (the end); the others are
    looked up one by one. None is found so without a reader (no check, or no queue of a
    store)."""
    if reader is None or topic is None or queue_id is None:
        return []
    values = []
    for step, (offset, size, tags_code) in enumerate(units):
        if offset == 0 and size == 0 and tags_code == 0:
            break
        values.append((first_queue_offset + step, offset, size, tags_code))
    return reader.units_in_place(topic, queue_id, values)


def _unit_record(
    lookup: RecordLookup, offset: int, size: int, wanted: tuple
) -> tuple[str, str | None]:
    """Whether the record a unit points at is there and is the unit's (looked up through a
    window of the log: a damaged queue can have a quarter of a million such units): its own
    unit, or its copy in a further (LMQ) queue (spec 6.8), noted as such."""
    try:
        holder = lookup.holder(offset)
    except (RecordError, StoreFormatError, NotFoundError) as exc:
        return "missing", str(exc)
    note = None
    if holder[:3] != wanted:
        if wanted not in _copies_of(holder):
            return "differs", (
                f"the record there is {holder.topic}:{holder.queue_id} queue offset "
                f"{holder.queue_offset}"
            )
        note = (
            f"a copy of {holder.topic}:{holder.queue_id} queue offset {holder.queue_offset}, "
            "named in its INNER_MULTI_DISPATCH"
        )
    if holder.store_size != size:
        return "differs", f"the record there is {holder.store_size} bytes"
    return "ok", note


def _copies_of(holder: Any) -> list[tuple[str, int, int]]:
    """The units in further queues the record ``holder`` has, as its broker wrote them."""
    from rmqstore.multidispatch import stored_copies

    return stored_copies(holder.topic, holder.queue_id, holder.properties_bytes)


def index_items(
    path: Path, slots: int | None = None, entries: int | None = None, *, with_slots: bool = False
) -> Iterator[dict[str, Any]]:
    """The header of one index file, its non-empty slots (``with_slots``) and its entries.
    Without ``slots``/``entries`` the geometry is inferred (RocketMQ's default ratio)."""
    if slots is None or entries is None:
        inferred = infer_geometry(path.stat().st_size)
        if inferred is None:
            raise InputError(
                f"{path} is not an index file of the default slot/entry ratio; give "
                "--index-slots and --index-entries (the broker's maxHashSlotNum/maxIndexNum)"
            )
        slots, entries = inferred
    if not _INDEX_NAME.fullmatch(path.name):
        yield {"type": "note", "message": f"{path.name} is not a 17-digit index file name"}
    index = IndexFile.open(path, slots, entries)
    try:
        header = index.header
        yield {
            "type": "header",
            "beginTimestamp": header.begin_timestamp,
            "endTimestamp": header.end_timestamp,
            "beginPhyOffset": header.begin_phy_offset,
            "endPhyOffset": header.end_phy_offset,
            "hashSlotCount": header.hash_slot_count,
            "indexCount": header.index_count,
            "slots": slots,
            "entries": entries,
        }
        if with_slots:
            table = index.slot_table()
            for slot, (entry,) in enumerate(struct.iter_unpack(">i", table)):
                if entry:
                    yield {
                        "type": "slot",
                        "slot": slot,
                        "filePosition": HEADER_SIZE + slot * SLOT_SIZE,
                        "entry": entry,
                    }
        entries_at = HEADER_SIZE + slots * SLOT_SIZE
        for number, (key_hash, offset, time_diff, previous) in index.iter_entries():
            yield {
                "type": "entry",
                "entry": number,
                "filePosition": entries_at + number * ENTRY_SIZE,
                "keyHash": key_hash,
                "slot": key_hash % slots if key_hash >= 0 else None,
                "commitLogOffset": offset,
                "timeDiff": time_diff,
                "previous": previous,
            }
    finally:
        index.close(flush=False)


def _pread(fd: int, path: Path, length: int, position: int) -> bytes:
    try:
        data = os.pread(fd, length, position)
    except OSError as exc:
        raise StoreIOError(f"cannot read {path}: {exc.strerror}") from None
    if len(data) < length:
        raise StoreIOError(f"{path} ended at byte {position + len(data)} while it was read")
    return data
