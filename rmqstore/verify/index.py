"""Index checks of ``verify``.

Per file: replaying the entries in order must give exactly the file's slot table and every
entry's previous-entry link (so every chain stays in the file and terminates), and the header
must agree with the entries. Across files, entries are merged with the records of the commit
log: the entries of a record must be the hashes of its ``topic#UNIQ_KEY`` and ``topic#key``s.
"""

from __future__ import annotations

import os
import struct
import sys
from array import array
from bisect import bisect_left
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from rmqstore import kernel
from rmqstore.consumequeue import link_target
from rmqstore.errors import RmqStoreError, StoreFormatError
from rmqstore.hashing import index_key_hash_with_prefix, java_string_hash
from rmqstore.indexfile import (
    ENTRY_SIZE,
    HASHED_KEY,
    HEADER_SIZE,
    SLOT_SIZE,
    IndexFile,
    IndexHeader,
    IndexService,
    is_index_name,
)
from rmqstore.kernel import layout as kernel_layout
from rmqstore.properties import KEYS, UNIQ_KEY, split_keys
from rmqstore.record import TRANSACTION_MASK, TRANSACTION_ROLLBACK, RecordHeader
from rmqstore.store import Store
from rmqstore.verify.findings import LIVE_DISPATCH, NOTE, WARNING, VerifyReport
from rmqstore.verify.queues import behind_damage, replay_damage
from rmqstore.verify.records import (
    UNWALKED_DAMAGE,
    RecordBatch,
    UnwalkedDamage,
    half_made,
    relative,
)
from rmqstore.wording import counted

if TYPE_CHECKING:
    from rmqstore.dispatch import LogDamage

_CHAIN_FINDINGS_PER_FILE = 5
_ENTRY_CHUNK = 65536  # index entries read at a time

# a place in the stream of entries across files: (file ordinal, entry number)
EntryPosition = tuple[int, int]
_ENTRY_FIELDS = struct.Struct(">iqii")  # keyHash, physical offset, timeDiff, previous entry


def index_geometry_known(store: Store) -> bool:
    """The index's slot and entry counts were given (an option, a broker config, the
    remembered geometry), not assumed from the defaults."""
    sources = store.config.sources
    return any(
        sources.get(name, "default") != "default" for name in ("index_slots", "index_entries")
    )


def _one_size_for_all(index_dir: Path) -> bool:
    """Whether ``index_dir`` holds more than one index file, all of one size."""
    try:
        sizes = [
            entry.stat().st_size
            for entry in os.scandir(index_dir)
            if is_index_name(entry.name) and entry.is_file(follow_symlinks=False)
        ]
    except OSError:
        return False
    return len(sizes) > 1 and len(set(sizes)) == 1


_BETWEEN_RECORDS = "points between records"


def _indexed_again_below(files: list[IndexFile]) -> dict[int, int]:
    """The files (by ordinal) whose entries begin before the files before them end, each
    with that end (the offset of the last record they index). A broker's crash recovery
    makes such a file: a power cut left its last index file's header unwritten (all zero: a
    broker flushes an index file only once it is full), so the file ends at offset 0 and the
    replay indexes into it every record from where it starts, some of which the files
    before index already."""
    again: dict[int, int] = {}
    reached = -1
    for ordinal, index in enumerate(files):
        header = index.header
        if header.index_count <= 1:
            continue
        if 0 <= header.begin_phy_offset < reached:
            again[ordinal] = reached
        reached = max(reached, header.end_phy_offset)
    return again


class _IndexPlan(NamedTuple):
    """A clean batch taken as a whole: the records whose entries it took up and where the
    entries go on (None: none left), or the records with keys past the index's end (lag)
    and the first of them."""

    indexed: int
    position: EntryPosition | None
    lag: int = 0
    first_lag: int | None = None


class IndexChecks:
    """Structural checks at construction; a record-pass listener afterwards.

    For a range of a parallel verify (``structural`` off) the entries compared with the
    records are those from ``entries_from``; the range then hands the entries before the
    next range to :meth:`drain`. :meth:`partial` and :meth:`absorb` carry its counts over.
    """

    def __init__(
        self,
        store: Store,
        report: VerifyReport,
        topics: set[str] | None,
        *,
        structural: bool = True,
        entries_from: EntryPosition | None = None,
        after_records: bool = False,
        defer_scans: bool = False,
        view: dict[str, IndexHeader] | None = None,
    ) -> None:
        self.store = store
        self._unwalked_damage = UnwalkedDamage(store)  # what no command mends
        self.report = report
        self.topics = topics
        self.service: IndexService | None = None
        self.lag = 0
        self.first_lag: int | None = None
        self.missing = 0  # records inside the indexed range without entries
        self.missing_after_damage = 0  # of those, after damage a replay stops at
        self._replay_damage: LogDamage | None = None
        self._replay_damage_looked_for = False
        self._prefixes: dict[str, int] = {}
        # entries before the first record checked are older than the pass (expired, or before
        # --from-offset) unless records came before (an earlier range)
        self._started = after_records
        self._indexed_records = 0  # into report.checked when done
        self._entries: Iterator[tuple[str, int, int, int, int]] = iter(())
        self._deferred: list[IndexFile] = []
        self._pending: tuple[str, int, int, int, int] | None = None
        self.indexed_end = -1
        self.last_full_end_timestamp = 0  # checkpoint indexMsgTimestamp may not exceed it
        self.unchecked = False  # the index geometry is unknown: nothing about it is checked
        try:
            self.service = IndexService(
                store.index_dir, store.config.index_slots, store.config.index_entries
            )
        except StoreFormatError as exc:
            wrong_size = "bytes" in str(exc)
            self.unchecked = wrong_size and not index_geometry_known(store)
            if structural and self.unchecked:
                report.add(
                    "index-unchecked",
                    "the index files are not the default geometry's size and the broker's "
                    "maxHashSlotNum/maxIndexNum are not known, so the index was not checked; "
                    "to check it, pass --broker-config or --index-slots/--index-entries",
                    NOTE,
                    file=relative(store, store.index_dir),
                )
            elif structural:
                report.add(
                    "index-file-size" if wrong_size else "index-header",
                    str(exc),
                    file=relative(store, store.index_dir),
                    # every file one size the geometry given does not make: more likely the
                    # counts given are not the broker's than every file damaged, and a
                    # rebuild would write the index again in the counts given
                    report_only=wrong_size and _one_size_for_all(store.index_dir),
                )
            return
        if view is not None:  # the index as another reader read it (see RangeJob)
            kept = []
            for file in self.service.files:
                if file.path.name in view:
                    file.header = view[file.path.name]
                    kept.append(file)
                else:
                    file.close(flush=False)  # made after that reader looked
            self.service.files = kept
        # files whose entries begin before the previous files' end, and that end: their
        # entries up to it index records again (see _indexed_again_below)
        self._again_below = _indexed_again_below(self.service.files)
        if structural:
            self._report_indexed_again()
            for path in self.service.links:
                report.add(
                    "file-link",
                    f"a symbolic link (to {link_target(path)}): a broker reads and writes the "
                    "index through it, and rmqstore reads it, but its writers refuse the store "
                    "(rmqstore dispatch --rebuild --yes moves the index files, the link among "
                    "them, to quarantine and builds the index in the store)",
                    WARNING,
                    file=relative(store, path),
                )
            for path in self.service.unexpected:
                if half_made(report, store, path):
                    continue
                report.add(
                    "file-name",
                    "not a regular file, under an index file's name (a broker cannot load it)"
                    if is_index_name(path.name)
                    else "not an index file (names are 17-digit creation times)",
                    WARNING,
                    file=relative(store, path),
                )
            self._deferred = list(self.service.files)
            if not defer_scans:
                self.run_deferred()
        full = [f for f in self.service.files if f.is_full]
        self.last_full_end_timestamp = full[-1].header.end_timestamp if full else 0
        last = self.service.last
        self.indexed_end = (
            last.header.end_phy_offset if last is not None and last.header.index_count > 1 else -1
        )
        self._entries = self._entry_stream(entries_from or (0, 1))
        self._pending = next(self._entries, None)

    def _report_indexed_again(self) -> None:
        assert self.service is not None
        files = self.service.files
        for ordinal, below in self._again_below.items():
            header = files[ordinal].header
            self.report.add(
                "index-again",
                f"its entries begin at offset {header.begin_phy_offset}, before the index files "
                f"before it end ({below}): the records between are indexed again, as a "
                "broker's crash recovery does into a last index file a power cut left with its "
                "header unwritten (it indexes again from where its replay starts); a query by "
                "key can find such a message twice, and rmqstore dispatch --rebuild --yes "
                "writes the index anew",
                NOTE,
                file=relative(self.store, files[ordinal].path),
                file_position=0,
                commit_log_offset=header.begin_phy_offset,
            )

    def _again(self, entry: tuple[str, int, int, int, int]) -> bool:
        """Whether ``entry`` indexes again a record an earlier file indexes, up to the last
        record they index (its offset is their end): it is not checked against the records,
        which were met before it in the stream."""
        reached = self._again_below.get(entry[4])
        return reached is not None and entry[3] <= reached

    def run_deferred(self) -> None:
        """The per-file checks put off with ``defer_scans`` (run while ranges are checked)."""
        for index in self._deferred:
            self._check_file(index)
        self._deferred.clear()

    # -- one file ------------------------------------------------------------------------------

    def _check_file(self, index: IndexFile) -> None:
        name = relative(self.store, index.path)
        header = index.header
        count = header.index_count
        slots = index.slots
        entries_at = HEADER_SIZE + slots * SLOT_SIZE
        newest = array("i", (0,)) * slots  # the slot table the entries imply
        chain = array("q", [-1, 0, -1, 0, 0])
        bad = kernel_layout.zeroed(kernel_layout.BAD_WIDTH * _CHAIN_FINDINGS_PER_FILE)
        reported = 0
        for number, data in index.entry_chunks():
            found = kernel.index_chain(
                data, number, slots, newest, chain, bad, _CHAIN_FINDINGS_PER_FILE - reported
            )
            for at in range(0, found * kernel_layout.BAD_WIDTH, kernel_layout.BAD_WIDTH):
                entry, key_hash, offset, time_diff, previous, newest_then = bad[at : at + 6]
                self.report.add(
                    "index-chain",
                    f"entry {entry} (hash {key_hash}, offset {offset}, timeDiff {time_diff}) "
                    f"links to entry {previous}, but the newest earlier entry of its slot is "
                    f"{newest_then}"
                    if previous != newest_then
                    else f"entry {entry} is out of order or has a negative hash or time",
                    file=name,
                    file_position=entries_at + entry * ENTRY_SIZE,
                    commit_log_offset=offset,
                )
            reported += found
        chain_heads = chain[kernel_layout.CHAIN_HEADS]
        walked = chain[kernel_layout.CHAIN_ENTRIES]
        first = chain[kernel_layout.CHAIN_FIRST_OFFSET] if walked else None
        last = chain[kernel_layout.CHAIN_LAST_OFFSET]
        self.report.checked["indexEntries"] += count - 1
        self.report.checked["indexFiles"] += 1
        stored = array("i", index.slot_table())
        if sys.byteorder == "little":
            stored.byteswap()
        # the file a broker writing the store adds to: its slot table is read after its
        # header, so slots may hold entries added since (the header counted ``count``), and
        # the header may be read between the updates of one entry (hashSlotCount counted,
        # then indexCount, then endPhyOffset)
        being_written = self.store.written_elsewhere and index is self.service.last
        slot = (
            None
            if stored == newest
            else _first_differing_slot(stored, newest, count if being_written else None)
        )
        if slot is not None:
            self.report.add(
                "index-chain",
                f"hash slot {slot} holds entry {stored[slot]}, but the newest entry "
                f"of that slot is {newest[slot]}",
                file=name,
                file_position=HEADER_SIZE + slot * SLOT_SIZE,
            )
        problems = []
        if chain_heads != header.hash_slot_count and not (
            being_written and header.hash_slot_count == chain_heads + 1
        ):
            problems.append(f"hashSlotCount {header.hash_slot_count} but {chain_heads} chains")
        if (
            first is not None
            and (header.begin_phy_offset, header.end_phy_offset) != (first, last)
            and not (
                being_written and header.begin_phy_offset == first and header.end_phy_offset <= last
            )
        ):
            problems.append(
                f"begin/end offsets {header.begin_phy_offset}/"
                f"{header.end_phy_offset} but entries span {first}..{last}"
            )
        if header.begin_timestamp > header.end_timestamp:
            problems.append("beginTimestamp is after endTimestamp")
        if problems:
            self.report.add("index-header", "; ".join(problems), file=name, file_position=0)

    # -- merged with the records -----------------------------------------------------------------

    def _entry_stream(self, begin: EntryPosition) -> Iterator[tuple[str, int, int, int, int]]:
        """(file name, entry number, key hash, physical offset, file ordinal) across files,
        in order, from ``begin``."""
        assert self.service is not None
        for ordinal, index in enumerate(self.service.files):
            if ordinal < begin[0]:
                continue
            name = relative(self.store, index.path)
            first = begin[1] if ordinal == begin[0] else 1
            for number, (key_hash, offset, _, _) in index.iter_entries(first):
                yield name, number, key_hash, offset, ordinal

    def positions_of(self, offsets: list[int]) -> list[EntryPosition]:
        """For each of the ascending physical ``offsets``, where the range of records from
        it takes up the stream: at the first entry pointing at or after it (at or after the
        previous one's position). Entries before that position and after the previous one
        are the previous range's. Read a chunk of offsets at a time: a chunk pointing
        nowhere that far is passed over, the others searched (:func:`_first_at_or_after`)."""
        positions: list[EntryPosition] = []
        end = self.stream_end()
        if self.service is None or not offsets:
            return [end] * len(offsets)
        wanted = 0
        for ordinal, index in enumerate(self.service.files):
            for number, pointed in index.offset_chunks():
                if max(pointed) < offsets[wanted]:
                    continue
                at = 0
                while wanted < len(offsets):
                    at = _first_at_or_after(pointed, offsets[wanted], at)
                    if at == len(pointed):
                        break
                    positions.append((ordinal, number + at))
                    wanted += 1
                if wanted == len(offsets):
                    return positions
        return positions + [end] * (len(offsets) - wanted)

    def view(self) -> dict[str, IndexHeader] | None:
        """Each index file's header as read here, for the checks of the ranges of a store
        being written: they then read the entries read here, and no later ones."""
        if self.service is None:
            return None
        return {file.path.name: file.header for file in self.service.files}

    def stream_end(self) -> EntryPosition:
        files = self.service.files if self.service is not None else []
        return (len(files), 1)

    def drain(self, until: EntryPosition | None, log_end: int | None = None) -> None:
        """Report the entries left before ``until`` (None: all of them): they point between
        records, or past ``log_end`` when the log ended."""
        pending = self._pending
        report = self.report
        live_end = self.store.live_end
        while pending is not None and (until is None or (pending[4], pending[1]) < until):
            if live_end is not None and pending[3] >= live_end:
                pass  # the entry of a record written after verify began
            elif log_end is not None and pending[3] >= log_end:
                if report.keeps():
                    self._orphan(pending, f"points past the end of the commit log ({log_end})")
                else:  # counted only: no message is built for a full report
                    report.count("index-entry")
            elif self._started and not self._again(pending):
                self._orphan(pending, _BETWEEN_RECORDS)
            # else: before the first record checked (a walk from past it found none)
            pending = next(self._entries, None)
        self._pending = pending

    def skip_to(self, position: EntryPosition) -> None:
        """Leave the entries before ``position`` to others (the ranges that checked them)."""
        if self.service is None:
            return
        self._entries = self._entry_stream(position)
        self._pending = next(self._entries, None)

    def partial(self) -> dict[str, int | None]:
        return {
            "lag": self.lag,
            "firstLag": self.first_lag,
            "missing": self.missing,
            "missingAfterDamage": self.missing_after_damage,
        }

    def absorb(self, partial: dict[str, int | None]) -> None:
        self.lag += partial["lag"] or 0
        self.missing += partial["missing"] or 0
        self.missing_after_damage += partial["missingAfterDamage"] or 0
        if self.first_lag is None:
            self.first_lag = partial["firstLag"]

    def _count_checked(self) -> None:
        if self._indexed_records:
            self.report.checked["indexedRecords"] += self._indexed_records
            self._indexed_records = 0

    def close(self) -> None:
        self._count_checked()
        self._unwalked_damage.close()
        if self.service is not None:
            self.service.close()

    def _expected(self, topic: str, properties: dict[str, str]) -> list[int]:
        prefix = self._prefixes.get(topic)
        if prefix is None:
            prefix = self._prefixes[topic] = java_string_hash(f"{topic}#")
        uniq = properties.get(UNIQ_KEY)
        keys_text = properties.get(KEYS)
        if not keys_text:  # the common case: a UNIQ_KEY only
            return [] if uniq is None else [index_key_hash_with_prefix(prefix, uniq)]
        keys = split_keys(keys_text)
        return [
            index_key_hash_with_prefix(prefix, key)
            for key in ([uniq, *keys] if uniq is not None else keys)
        ]

    def batch_check(self, batch: RecordBatch) -> _IndexPlan | None:
        """A clean batch whose records' keys are exactly the next entries of the index, in
        order, with no other entry pointing at or before its last record, or whose records
        all lie past the index's end with no entry left (lag, as the records would count it
        one by one). None otherwise: then record by record."""
        if self.service is None:
            return _IndexPlan(0, None)  # no index: nothing to compare
        if self.topics is not None or not self._started:
            return None
        last_offset = batch.offsets[batch.count - 1]
        key_count = batch.key_count
        width = kernel_layout.DISPATCH_WIDTH
        counts = batch.dispatch_out[kernel_layout.KEYS_COUNT : batch.count * width : width]
        if key_count:
            last_key = HASHED_KEY.unpack_from(batch.keys, (key_count - 1) * HASHED_KEY.size)
            if last_key[0] > self.indexed_end:
                first_key = HASHED_KEY.unpack_from(batch.keys, 0)
                if self._pending is None and first_key[0] > self.indexed_end:
                    return _IndexPlan(0, None, batch.count - counts.count(0), first_key[0])
                return None  # the index ends inside the batch: record by record
        matched, following = self._match_next_entries(batch.keys, key_count)
        if matched != key_count or (following is not None and following[3] <= last_offset):
            return None
        indexed = batch.count - counts.count(0)
        return _IndexPlan(indexed, (following[4], following[1]) if following is not None else None)

    def batch_apply(self, plan: _IndexPlan) -> None:
        if self.service is None:
            return
        if plan.lag:
            self.lag += plan.lag
            if self.first_lag is None:
                self.first_lag = plan.first_lag
            return  # no entry was left to take up
        self._indexed_records += plan.indexed
        if plan.position is None:
            self._entries = iter(())
            self._pending = None
        else:
            self._entries = self._entry_stream(plan.position)
            self._pending = next(self._entries, None)

    def _match_next_entries(
        self, keys: Any, count: int
    ) -> tuple[int, tuple[str, int, int, int, int] | None]:
        """How many of the next ``count`` entries (from the pending one) match ``keys``
        (HASHED_KEY entries) in hash and offset, and, when all do, the entry after them (None
        at the end). Entries are read in chunks and compared by the record kernel; nothing
        is consumed."""
        assert self.service is not None
        pending = self._pending
        if pending is None:
            return 0, None
        files = self.service.files
        ordinal, number = pending[4], pending[1]
        matched = 0
        while ordinal < len(files):
            index = files[ordinal]
            available = index.header.index_count - number
            wanted = min(available, count - matched + 1, _ENTRY_CHUNK)
            if wanted > 0:
                data = index.read(index._entries_at + number * ENTRY_SIZE, wanted * ENTRY_SIZE)
                compared = min(wanted, count - matched)
                same = kernel.match_keys(keys, matched, compared, data)
                matched += same
                if same < compared:
                    return matched, None
                if compared < wanted:  # the entry after the last key is in this chunk
                    key_hash, offset, _diff, _previous = _ENTRY_FIELDS.unpack_from(
                        data, compared * ENTRY_SIZE
                    )
                    name = relative(self.store, index.path)
                    return matched, (name, number + compared, key_hash, offset, ordinal)
                number += wanted
                if number < index.header.index_count:
                    continue
            ordinal, number = ordinal + 1, 1
        return matched, None

    def on_record(
        self,
        offset: int,
        header: RecordHeader,
        topic: str,
        properties: dict[str, str],
        stored: bytes,
    ) -> None:
        if self.service is None or header.sys_flag & TRANSACTION_MASK == TRANSACTION_ROLLBACK:
            return
        pending = self._pending
        entries = self._entries
        while pending is not None and pending[3] < offset:
            if self._started and not self._again(pending):
                self._orphan(pending, _BETWEEN_RECORDS)
            pending = next(entries, None)
        self._started = True
        got = []
        while pending is not None and pending[3] == offset:
            got.append(pending)
            pending = next(entries, None)
        self._pending = pending
        expected = self._expected(topic, properties)
        if not expected:
            for entry in got:
                self._orphan(entry, "points at a record without keys")
            return
        if offset > self.indexed_end and not got:
            self.lag += 1
            if self.first_lag is None:
                self.first_lag = offset
            return
        self._indexed_records += 1
        if self.topics is not None and topic not in self.topics:
            return
        hashes = [entry[2] for entry in got]
        if hashes == expected:
            return
        if pending is None and self.store.written_elsewhere and hashes == expected[: len(hashes)]:
            # the index, as read when verify began, ends inside this record's entries (the
            # rest were added after, or went to a file made after)
            self.lag += 1
            if self.first_lag is None:
                self.first_lag = offset
            return
        if not hashes:
            if self._after_replay_damage(offset):
                self.missing_after_damage += 1
            else:
                self.missing += 1
            return
        if _indexed_again(hashes, expected):
            self.report.add(
                "index-entry",
                f"the record at {offset} was indexed again (a broker re-indexes the record "
                "at the end of its index after a restart)",
                NOTE,
                file=got[-1][0],
                file_position=self._entry_position(got[-1][1]),
                commit_log_offset=offset,
            )
            return
        self.report.add(
            "index-entry",
            f"index entries for the record at {offset} have hashes {hashes}, but its "
            f"topic#keys hash to {expected}",
            file=got[0][0],
            file_position=self._entry_position(got[0][1]),
            commit_log_offset=offset,
        )

    def _orphan(self, entry: tuple[str, int, int, int, int], reason: str) -> None:
        unmendable = reason == _BETWEEN_RECORDS and self._unwalked_damage(entry[3])
        self.report.add(
            "index-entry",
            f"entry {entry[1]} (offset {entry[3]}) "
            + (f"points at a damaged record: {UNWALKED_DAMAGE}" if unmendable else reason),
            file=entry[0],
            file_position=self._entry_position(entry[1]),
            commit_log_offset=entry[3],
            report_only=unmendable,
        )

    def _after_replay_damage(self, offset: int) -> bool:
        """Whether the record at ``offset`` lies after the damage a replay of the whole log
        (a rebuild) stops at before the log's valid end: no rebuild indexes it."""
        damage = self.damage_a_rebuild_stops_at()
        return damage is not None and offset > damage.offset

    def damage_a_rebuild_stops_at(self) -> LogDamage | None:
        """The damage a replay of the whole log stops at before its valid end (looked for
        once, when a record or the report first asks)."""
        if not self._replay_damage_looked_for:
            self._replay_damage = replay_damage(self.store, self.store.commitlog.min_offset)
            self._replay_damage_looked_for = True
        return self._replay_damage

    def _dispatch_start(self) -> int | None:
        """Where ``rmqstore dispatch`` would start (None: not known)."""
        from rmqstore.dispatch import plan_dispatch

        try:
            return plan_dispatch(self.store)[0]
        except (RmqStoreError, OSError):
            return None

    def _entry_position(self, number: int) -> int:
        """The byte position of entry ``number`` in an index file of this store's geometry."""
        return HEADER_SIZE + self.store.config.index_slots * SLOT_SIZE + number * ENTRY_SIZE

    def finish(self, log_end: int) -> None:
        self._count_checked()
        if self.service is None:
            return
        self.drain(None, log_end)
        index_dir = relative(self.store, self.store.index_dir)
        # a broker with messageIndexEnable=false indexes nothing: records after where the
        # index ends (if it has files from before) are no lag
        if self.lag and self.store.config.message_index_enable and self.store.written_elsewhere:
            self.report.add(
                "index-lag",
                f"{counted(self.lag, 'record')} from offset {self.first_lag} "
                f"{'was' if self.lag == 1 else 'were'} not indexed yet ({LIVE_DISPATCH})",
                NOTE,
                file=index_dir,
                commit_log_offset=self.first_lag,
            )
        elif self.lag and self.store.config.message_index_enable:
            unreached = behind_damage(
                replay_damage(self.store, self._dispatch_start()), self.lag, self.first_lag
            )
            self.report.add(
                "index-lag",
                f"{counted(self.lag, 'record')} from offset {self.first_lag} "
                f"{'is' if self.lag == 1 else 'are'} not indexed yet "
                f"({unreached or 'rmqstore dispatch adds them'})",
                WARNING,
                file=index_dir,
                commit_log_offset=self.first_lag,
                report_only=unreached is not None,
            )
        if self.missing:
            self.report.add(
                "index-hole",
                f"{counted(self.missing, 'record')} inside the indexed range "
                f"{'has' if self.missing == 1 else 'have'} no entries (a broker's crash "
                "recovery loses such entries when messageIndexSafe=false): a dispatch resumes "
                "where the index ends, a rebuild of the index adds them",
                WARNING,
                file=index_dir,
            )
        if self.missing_after_damage:  # (counted here, or by the ranges' checks)
            damage = self.damage_a_rebuild_stops_at()
            at = f" at offset {damage.offset:,}" if damage is not None else ""
            self.report.add(
                "index-hole",
                f"{counted(self.missing_after_damage, 'record')} inside the indexed range "
                f"{'has' if self.missing_after_damage == 1 else 'have'} no entries, after the "
                f"damage{at} where a replay of the log stops before its valid end: no "
                "rebuild reaches them (a broker's crash recovery replays only the files it "
                "walks)",
                WARNING,
                file=index_dir,
                report_only=True,
            )
        self._unwalked_damage.close()
        self.service.close()


def _first_differing_slot(stored: array, newest: array, added_from: int | None) -> int | None:
    """The first slot whose stored entry differs from the one the entries imply, compared a
    chunk at a time; with ``added_from``, a stored entry numbered from it on (added after
    the entries were counted) is passed over."""
    step = 4096
    for base in range(0, len(stored), step):
        chunk = stored[base : base + step]
        implied = newest[base : base + step]
        if chunk == implied:
            continue
        for at, (value, expected) in enumerate(zip(chunk, implied, strict=True)):
            if value != expected and (added_from is None or value < added_from):
                return base + at
    return None


def _indexed_again(hashes: list[int], expected: list[int]) -> bool:
    """Entries that are the record's keys in full, preceded by a partial or full earlier
    indexing of the same keys (what a broker's re-dispatch after a restart leaves)."""
    count = len(expected)
    if len(hashes) <= count or hashes[-count:] != expected:
        return False
    before = hashes[:-count]
    return before == (expected * (len(before) // count + 1))[: len(before)]


def _first_at_or_after(pointed: array, target: int, at: int) -> int:
    """The first position from ``at`` of ``pointed`` holding ``target`` or more
    (``len(pointed)`` when none): found by bisection, as a broker appends entries in log
    order (bisection stops at such a position or at the end), then checked: where an entry
    before it holds that much (entries out of order), the first such entry."""
    candidate = bisect_left(pointed, target, at)
    if candidate == at or max(pointed[at:candidate]) < target:
        return candidate
    return next(n for n in range(at, candidate) if pointed[n] >= target)
