"""Message lookups over a store, the engine side of ``rmqstore read``."""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any, NamedTuple

from rmqstore import kernel
from rmqstore.commitlog import LogEnd, LogScan
from rmqstore.consumequeue import ConsumeQueue, Unit, is_pre_blank, list_queues
from rmqstore.documents import DelimitedLayout
from rmqstore.errors import InputError, NotFoundError, RecordError, RmqStoreError
from rmqstore.indexfile import LONG_MAX, MAX_QUERY_RESULTS
from rmqstore.javavalues import java_trim
from rmqstore.kernel.layout import (
    BODY_MODE_NAMES,
    CRC_BAD,
    CRC_STATUS,
    FIELD_TAGS,
    MESSAGE_COLUMNS,
    PHYSICAL_OFFSET,
    PROPERTIES_AT,
    PROPERTIES_LENGTH,
    QUEUE_OFFSET,
    ROW_WIDTH,
    STORE_TIMESTAMP,
    TOTAL_SIZE,
    VERSION,
    new_rows,
    rows_before,
    zeroed,
)
from rmqstore.msgid import HEX_DIGITS, decode_offset_msg_id
from rmqstore.multidispatch import queue_copies
from rmqstore.properties import TAGS, decode_properties, split_keys
from rmqstore.record import (
    BodyMode,
    Message,
    ScanStop,
    data_ends_at,
    message_from_row,
    next_record_in_segment,
)
from rmqstore.segments import Segment
from rmqstore.store import Store
from rmqstore.wording import clipped, counted, missing_files, quoted

_UNITS_PER_BLOCK = 4096  # units read, and records decoded, together by queue_lines
_RUN_SPAN = 16 * 1024 * 1024  # at most this much of the commit log read at once for them


class TextBlock(NamedTuple):
    """Text the record kernel wrote of ``messages`` messages: their JSON lines, or their
    CSV/TSV rows (a row may hold newlines, in a quoted cell)."""

    text: bytes
    messages: int


def _text_writer(body_mode: str, layout: DelimitedLayout | None) -> tuple[str, tuple[Any, ...]]:
    """The kernel's text writer (for :func:`rmqstore.kernel.write_lines`) and its modes:
    JSON lines of message documents in ``body_mode``, or rows of ``layout``."""
    mode = BODY_MODE_NAMES.index(body_mode)
    if layout is None:
        return "message_lines", (mode,)
    columns = bytes(MESSAGE_COLUMNS.index(name) for name in layout.fields)
    return "message_rows", (mode, columns, ord(layout.delimiter))


SUBSCRIBE_ALL = "*"
TAG_SEPARATOR = "||"


def subscription_tags(expression: str) -> frozenset[str] | None:
    """The TAGS a tag subscription expression (``TagA || TagB``, as a consumer subscribes
    and mqadmin takes one) picks, as a broker's ``FilterAPI.buildSubscriptionData`` reads
    it: ``*`` is every message (None); else the pieces between ``||``, each trimmed as Java
    trims, empty ones dropped. A message is picked when its TAGS is one of them exactly. An
    expression with no tag in it is an InputError (a broker refuses ``||``)."""
    if expression == SUBSCRIBE_ALL:
        return None
    tags = frozenset(filter(None, (java_trim(piece) for piece in expression.split(TAG_SEPARATOR))))
    if not tags:
        raise InputError(
            f"tags {quoted(expression)} name no tag: give TagA, TagA||TagB or * (every tag)"
        )
    return tags


@dataclass(frozen=True)
class MessageSelection:
    """The messages a read keeps (``read --begin/--end/--tags``): stored within ``[begin,
    end]`` (epoch ms), and, ``tags`` not None, whose TAGS is one of them."""

    begin: int = 0
    end: int = LONG_MAX
    tags: frozenset[str] | None = None

    def keeps(self, message: Message) -> bool:
        return self.begin <= message.store_timestamp <= self.end and (
            self.tags is None or message.tags in self.tags
        )

    def rows_kept(self, buf: Any, rows: Any, count: int, limit: int | None) -> tuple[Any, int]:
        """The rows ``[0, count)`` of a scan of ``buf`` it keeps (:meth:`kept_rows`), at most
        ``limit`` of them, in rows of their own (``rows`` itself when it keeps them all), and
        how many."""
        kept = self.kept_rows(buf, rows, count)
        if limit is not None:
            del kept[limit:]
        if len(kept) == count:
            return rows, count
        chosen = array("q")
        for row in kept:
            chosen.extend(rows[row * ROW_WIDTH : (row + 1) * ROW_WIDTH])
        return chosen, len(kept)

    def kept_rows(self, buf: Any, rows: Any, count: int) -> list[int]:
        """The numbers of the rows ``[0, count)`` of a scan of ``buf`` it keeps: the store
        time from the row, then, of the rows in the time window, the TAGS
        (:meth:`_with_tags`)."""
        begin, end = self.begin, self.end
        stamps = rows[STORE_TIMESTAMP : count * ROW_WIDTH : ROW_WIDTH]
        kept = [row for row, stamp in enumerate(stamps) if begin <= stamp <= end]
        if self.tags is not None and kept:
            kept = self._with_tags(buf, rows, count, kept)
        return kept

    def _with_tags(self, buf: Any, rows: Any, count: int, candidates: list[int]) -> list[int]:
        """The ``candidates`` (rows of a scan of ``buf``) whose TAGS is one of :attr:`tags`:
        found by the record kernel (the value a message's properties give it), compared as
        bytes when ASCII (one text only encodes to them), else decoded as the message is."""
        assert self.tags is not None
        tags = self.tags
        ascii_tags = {tag.encode("ascii") for tag in tags if tag.isascii()}
        spans = zeroed(2 * count)
        kernel.field_spans(buf, rows, 0, count, FIELD_TAGS, spans)
        kept = []
        for row in candidates:
            at, length = spans[2 * row], spans[2 * row + 1]
            if length < 0:
                continue  # no TAGS: None is no tag asked for
            raw = bytes(buf[at : at + length])
            if raw in ascii_tags or (not raw.isascii() and _row_tags(buf, rows, row) in tags):
                kept.append(row)
        return kept


def _rows_taken(
    selection: MessageSelection | None, buf: Any, rows: Any, count: int, limit: int | None
) -> tuple[Any, int]:
    """The rows of ``[0, count)`` of a scan of ``buf`` a read takes, at most ``limit``:
    those ``selection`` keeps (:meth:`MessageSelection.rows_kept`), else the first ones."""
    if selection is not None:
        return selection.rows_kept(buf, rows, count, limit)
    return rows, (count if limit is None else min(count, limit))


def _row_tags(buf: Any, rows: Any, row: int) -> str | None:
    """The TAGS of the message in row ``row`` of a scan of ``buf``, as :class:`Message` has
    it (None when it has none)."""
    at = row * ROW_WIDTH
    start = rows[at + PROPERTIES_AT]
    return decode_properties(bytes(buf[start : start + rows[at + PROPERTIES_LENGTH]])).get(TAGS)


class MessageReader:
    """Reads messages by physical offset, offset message id, sequentially, by queue, by key
    or unique key, and finds queue offsets by time. ``notes`` collects things worth telling
    the user (an id naming another broker, a unit pointing at the wrong record)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.notes: list[str] = []
        self._end: LogEnd | None = None
        self.queue_cut = False  # the last queue read stopped at units past the valid end
        self._missing: list[int] = []  # see _note_missing
        self._block_rows: Any = None  # rows for queue_lines' blocks, made once

    def log_end(self) -> LogEnd:
        if self._end is None:
            self._end = self.store.log_end()
        return self._end

    def by_offset(self, offset: int, *, body: BodyMode = BodyMode.READ) -> Message:
        """The message starting at ``offset``; refuses offsets outside the valid log, like the
        broker's ``lookMessageByOffset``."""
        log = self.store.commitlog
        if not log.segments:
            raise NotFoundError("the commit log has no files")
        if offset < log.min_offset:
            raise NotFoundError(
                f"offset {offset} is below the first commit-log offset "
                f"{log.min_offset} (its file has been deleted or never existed)"
            )
        segment = log.queue.find(offset)
        if segment is None:
            raise NotFoundError(f"offset {offset} is beyond the commit-log files")
        recovery_start = log.recovery_start(None, abnormal=False)
        if (
            recovery_start is not None
            and segment.start >= recovery_start.start
            and not self._valid_end_after(offset)
        ):
            end = self.log_end().offset
            if offset >= end:
                raise NotFoundError(f"offset {offset} is at or after the end of the log ({end})")
        try:
            return log.read(
                offset, body=body, verify_property_crc=self.store.config.force_verify_prop_crc
            )
        except RecordError as exc:
            if exc.field in ("BODYCRC", "PROPERTIES"):
                raise
            raise NotFoundError(
                f"no message starts at offset {offset}: {exc.field} {exc.reason}"
            ) from None

    def _valid_end_after(self, offset: int) -> bool:
        """Whether the log's valid end is known to lie after ``offset`` without finding it
        (see :meth:`CommitLog.ends_after`): the end, once found, is kept for later reads."""
        if self._end is not None:
            return self._end.offset > offset
        store = self.store
        rules = store.end_rules()
        return store.commitlog.ends_after(
            offset,
            check_crc=store.config.check_crc_on_recover,
            abnormal=rules.abnormal,
            checkpoint=rules.checkpoint,
            property_crc=store.config.force_verify_prop_crc,
        )

    def by_msg_id(self, msg_id: str, *, body: BodyMode = BodyMode.READ) -> Message:
        """The message an id names: an offset message id (store host and commit-log offset,
        what the broker returns), or else a client id (the UNIQ_KEY a producer logs as its
        msgId, looked up in the index across every topic, as mqadmin's queryMsgById does)."""
        try:
            host, offset = decode_offset_msg_id(msg_id)
            message = self.by_offset(offset, body=body)
        except (InputError, NotFoundError) as not_offset:
            text = msg_id.strip()
            if not text or any(c not in HEX_DIGITS for c in text):
                raise  # not an id of either kind
            as_offset_id = (
                f"as an offset message id, {not_offset}"
                if isinstance(not_offset, NotFoundError)
                else f"it has {len(text):,} hex digits, not the 32 or 56 of an offset message id"
            )
            noted = len(self.notes)
            try:
                found = self._by_client_id(text, body)
                if found is None and text != text.upper():
                    # a producer writes its client ids in upper-case hex; an id pasted in
                    # lower case names the same message (the offset id above ignores case too)
                    found = self._by_client_id(text.upper(), body)
            except RmqStoreError as exc:
                raise NotFoundError(
                    f"no message has id {clipped(text)}: {as_offset_id}; as a client id "
                    f"(UNIQ_KEY), the index cannot be searched: {exc}"
                ) from None
            if found is None:
                left_out = "".join(f" ({note})" for note in self.notes[noted:])
                raise NotFoundError(
                    f"no message has id {clipped(text)}: {as_offset_id}; as a client id "
                    f"(UNIQ_KEY), the index has no message with it{left_out}"
                ) from None
            return found
        if message.store_host != host:
            self.notes.append(
                f"message id {msg_id} names broker {host}, but the record at "
                f"offset {offset} was stored by {message.store_host}"
            )
        return message

    def _by_client_id(self, key: str, body: BodyMode) -> Message | None:
        if not key or not self.store.index_dir.is_dir():
            return None
        try:
            found = self.by_key(None, key, uniq=True, body=body)
        except NotFoundError:
            return None
        if not found:
            return None
        self.notes.append(f"{clipped(key)} is a client id (UNIQ_KEY): found through the index")
        if len(found) > 1:
            self.notes.append(
                f"{counted(len(found), 'message')} carry UNIQ_KEY {clipped(key)}; showing the first"
            )
        return found[0]

    def topics(self) -> list[str]:
        """The topics that have consume queues (the ones a search of every topic covers)."""
        return self.store.topics_with_queues()

    def by_queue(
        self,
        topic: str,
        queue_id: int,
        start: int | None = None,
        count: int | None = None,
        *,
        body: BodyMode = BodyMode.READ,
    ) -> Iterator[Message]:
        """Messages of one queue through its consume queue, from queue offset ``start``
        (default: the queue's min offset)."""
        queue = self.store.consume_queue(topic, queue_id)
        start = self._queue_start(queue, topic, queue_id, start)
        self._missing.clear()
        yield from self._unit_messages(topic, queue_id, queue.units(start, count), body)
        self._note_missing(topic, queue_id)

    def _queue_start(
        self, queue: ConsumeQueue, topic: str, queue_id: int, start: int | None
    ) -> int | None:
        """Where a read of ``queue`` from ``start`` begins (a note when it is past its end,
        or below its min offset, where it then starts)."""
        if start is not None and start >= queue.max_offset:
            self.notes.append(
                f"queue offset {start} is at or after the end of {topic}:"
                f"{queue_id} ({queue.max_offset})"
            )
        elif start is not None and start < queue.min_offset:
            self.notes.append(
                f"queue offset {start} is below the min offset of {topic}:"
                f"{queue_id} ({queue.min_offset}); starting there"
            )
            start = queue.min_offset
        return start

    def _unit_messages(
        self, topic: str, queue_id: int, units: Iterable[Unit], body: BodyMode
    ) -> Iterator[Message]:
        """The message each unit points at, read one by one; units from one pointing at or
        past the log's valid end, where no whole record is, end it (``self.queue_cut`` set)."""
        log = self.store.commitlog
        missing = self._missing  # queue offsets of a run of units pointing into missing files
        for unit in units:
            if unit.is_pre_blank:
                continue
            if (
                log.segments
                and log.min_offset <= unit.physical_offset < log.segments[-1].start
                and log.queue.find(unit.physical_offset) is None
            ):
                missing.append(unit.queue_offset)  # a broker's consumer skips it too
                continue
            self._note_missing(topic, queue_id)
            try:
                message = log.read(unit.physical_offset, body=body)
            except (RecordError, NotFoundError):
                end = self.log_end().offset
                if unit.physical_offset < end:
                    raise
                self.notes.append(
                    f"units of {topic}:{queue_id} from queue offset {unit.queue_offset} point "
                    f"at or past the commit log's valid end ({end}), where no whole record "
                    "is: a broker's recovery truncates them (rmqstore recover)"
                )
                self.queue_cut = True
                return
            if (message.topic, message.queue_id, message.store_size) != (
                topic,
                queue_id,
                unit.size,
            ) and not _copy_of(message, topic, queue_id, unit):
                self.notes.append(
                    f"unit {unit.queue_offset} of {topic}:{queue_id} points at offset "
                    f"{unit.physical_offset}, a {message.store_size}-byte record of "
                    f"{message.topic}:{message.queue_id}, not a {unit.size}-byte record of "
                    "this queue"
                )
            yield message

    def _note_missing(self, topic: str, queue_id: int) -> None:
        """A note for the run of units (of the queue being read) seen pointing into
        commit-log files that are missing, once a unit after them is read or the queue
        ends."""
        missing = self._missing
        if not missing:
            return
        span = f"{missing[0]}" if len(missing) == 1 else f"{missing[0]} to {missing[-1]}"
        points = "points" if len(missing) == 1 else "point"
        self.notes.append(
            f"{counted(len(missing), 'unit')} of {topic}:{queue_id} (queue offset {span}) "
            f"{points} into commit-log files that are missing: left out, as a broker's "
            "consumers skip them (run rmqstore verify)"
        )
        missing.clear()

    def by_topic(
        self, topic: str, count: int | None = None, *, body: BodyMode = BodyMode.READ
    ) -> Iterator[Message]:
        """Messages of every queue of ``topic``, queue after queue (as mqadmin printMsg
        walks them), each through its consume queue."""
        produced = 0
        for queue_id in self._topic_queues(topic):
            for message in self.by_queue(topic, queue_id, body=body):
                yield message
                produced += 1
                if count is not None and produced >= count:
                    return

    def _topic_queues(self, topic: str) -> list[int]:
        queue_ids = sorted(q for _, q in list_queues(self.store.consumequeue_dir, topic=topic))
        if not queue_ids:
            unread = self.store.queues_unread(topic)
            if unread is not None:
                raise NotFoundError(f"topic {quoted(topic)} has no consume-queue files: {unread}")
            raise NotFoundError(f"topic {quoted(topic)} has no consume queues")
        return queue_ids

    def queue_lines(
        self,
        topic: str,
        queue_id: int,
        start: int | None = None,
        count: int | None = None,
        *,
        body_mode: str,
        layout: DelimitedLayout | None = None,
        selection: MessageSelection | None = None,
    ) -> Iterator[TextBlock | Message]:
        """What :meth:`by_queue` reads (of it, what ``selection`` keeps), as the JSON lines
        ``read --jsonl`` prints (or the rows of ``layout``): blocks of text written by the
        record kernel (:class:`TextBlock`). The units of a block are read together, cut into
        runs whose records lie close together in one file, and each run's records are decoded
        from one read where their units point. A unit that is not plainly a whole record of
        this queue there (a pre-blank unit, a record of another queue or size, none at all, a
        missing file) comes as :meth:`by_queue` gives it (a :class:`Message`, or a note, an
        error, the end), and the kernel goes on after it."""
        writer = _text_writer(body_mode, layout)
        yield from self._queue_items(topic, queue_id, start, count, writer, selection)

    def queue_messages(
        self,
        topic: str,
        queue_id: int,
        start: int | None = None,
        count: int | None = None,
        *,
        selection: MessageSelection,
        body: BodyMode = BodyMode.READ,
    ) -> Iterator[Message]:
        """The messages of :meth:`by_queue` ``selection`` keeps, read as :meth:`queue_lines`
        reads them: a :class:`Message` made only of each record kept (``body`` SKIP or READ;
        a body CRC check goes through by_queue)."""
        for item in self._queue_items(topic, queue_id, start, count, body, selection):
            assert isinstance(item, Message)
            yield item

    def _queue_items(
        self,
        topic: str,
        queue_id: int,
        start: int | None,
        count: int | None,
        writer: tuple[str, tuple[Any, ...]] | BodyMode,
        selection: MessageSelection | None,
    ) -> Iterator[TextBlock | Message]:
        queue = self.store.consume_queue(topic, queue_id)
        start = self._queue_start(queue, topic, queue_id, start)
        units = queue.unit_values(start, count if selection is None else None)
        yield from self._lines_of_units(
            topic, queue_id, units, writer, limit=count, selection=selection
        )

    def topic_lines(
        self,
        topic: str,
        count: int | None = None,
        *,
        body_mode: str,
        layout: DelimitedLayout | None = None,
        selection: MessageSelection | None = None,
    ) -> Iterator[TextBlock | Message]:
        """What :meth:`by_topic` reads (of it, what ``selection`` keeps), as
        :meth:`queue_lines` gives it."""
        yield from self._topic_items(topic, count, _text_writer(body_mode, layout), selection)

    def topic_messages(
        self,
        topic: str,
        count: int | None = None,
        *,
        selection: MessageSelection,
        body: BodyMode = BodyMode.READ,
    ) -> Iterator[Message]:
        """The messages of :meth:`by_topic` ``selection`` keeps, as :meth:`queue_messages`
        reads them."""
        for item in self._topic_items(topic, count, body, selection):
            assert isinstance(item, Message)
            yield item

    def _topic_items(
        self,
        topic: str,
        count: int | None,
        writer: tuple[str, tuple[Any, ...]] | BodyMode,
        selection: MessageSelection | None,
    ) -> Iterator[TextBlock | Message]:
        left = count
        for queue_id in self._topic_queues(topic):
            queue = self.store.consume_queue(topic, queue_id)
            values = queue.unit_values()
            for item in self._lines_of_units(
                topic, queue_id, values, writer, limit=left, selection=selection
            ):
                yield item
                if left is not None:
                    left -= item.messages if isinstance(item, TextBlock) else 1
            if left is not None and left <= 0:
                return

    def _lines_of_units(
        self,
        topic: str,
        queue_id: int,
        units: Iterable[tuple[int, int, int, int]],
        writer: tuple[str, tuple[Any, ...]] | BodyMode,
        *,
        limit: int | None = None,
        selection: MessageSelection | None = None,
    ) -> Iterator[TextBlock | Message]:
        """The text (or messages) of the units (:meth:`ConsumeQueue.unit_values` tuples), of
        the messages ``selection`` keeps (all without one), at most ``limit`` of them,
        written by ``writer`` (:func:`_text_writer`; a BodyMode: messages only, their bodies
        read or skipped)."""
        name = topic.encode("utf-8")
        if self._block_rows is None:
            self._block_rows = new_rows(_UNITS_PER_BLOCK)
        rows = self._block_rows
        self.queue_cut = False
        self._missing.clear()
        iterator = iter(units)
        left = limit
        while left is None or left > 0:
            wanted = (
                min(_UNITS_PER_BLOCK, left)
                if left is not None and selection is None
                else _UNITS_PER_BLOCK
            )
            block = list(islice(iterator, wanted))
            if not block:
                break
            for run, segment in self._record_runs(block):
                items = self._run_items(
                    run, segment, topic, queue_id, name, rows, writer, selection, left
                )
                for item in items:
                    if left is not None:
                        left -= item.messages if isinstance(item, TextBlock) else 1
                    yield item
                if self.queue_cut:
                    return
                if left is not None and left <= 0:
                    break
        self._note_missing(topic, queue_id)

    def _record_runs(
        self, units: list[tuple[int, int, int, int]]
    ) -> Iterator[tuple[list[tuple[int, int, int, int]], Segment | None]]:
        """``units`` cut into runs whose records lie in one commit-log file (given with each
        run), in order, within :data:`_RUN_SPAN` bytes (one read each); a unit no file holds
        is a run of its own (its file None)."""
        find = self.store.commitlog.queue.find
        run: list[tuple[int, int, int, int]] = []
        segment: Segment | None = None
        first = end = 0  # the run's first record offset, and where its file ends
        for values in units:
            offset, size = values[1], values[2]
            if (
                run
                and size > 0
                and first <= offset
                and offset + size <= end
                and offset + size - first <= _RUN_SPAN
            ):
                run.append(values)
                continue
            if run:
                yield run, segment
            run = [values]
            segment = find(offset)
            first, end = offset, (segment.start + segment.size if segment is not None else -1)
        if run:
            yield run, segment

    def _run_items(
        self,
        run: list[tuple[int, int, int, int]],
        segment: Segment | None,
        topic: str,
        queue_id: int,
        name: bytes,
        rows: Any,
        writer: tuple[str, tuple[Any, ...]] | BodyMode,
        selection: MessageSelection | None,
        limit: int | None,
    ) -> Iterator[TextBlock | Message]:
        """The text of the records ``run`` points at in ``segment`` (of those ``selection``
        keeps, at most ``limit``; with a BodyMode ``writer``, a :class:`Message` of each):
        their span read once, and decoded by the record kernel
        (:func:`rmqstore.kernel.records_at`) as far as each unit is plainly a whole record
        of the queue; a unit that is not is read as by_queue reads it (a :class:`Message`,
        or its note), and the kernel goes on after it."""
        left = limit
        for done, decoded, buf in self._decoded_runs(run, segment, queue_id, name, rows):
            if left is not None and left <= 0:
                return
            if decoded:
                self._note_missing(topic, queue_id)
                kept_rows, kept = _rows_taken(selection, buf, rows, decoded, left)
                if isinstance(writer, BodyMode):
                    for row in range(kept):
                        yield message_from_row(
                            buf, kept_rows, row, body=writer is not BodyMode.SKIP
                        )
                elif kept:
                    out = bytearray()
                    kernel.write_lines(writer[0], buf, kept_rows, kept, out, *writer[1])
                    yield TextBlock(bytes(out), kept)
                left = None if left is None else left - kept
                continue
            body = writer if isinstance(writer, BodyMode) else BodyMode.READ
            for message in self._unit_messages(topic, queue_id, [Unit(*run[done])], body):
                if selection is None or selection.keeps(message):
                    yield message
                    left = None if left is None else left - 1
            if self.queue_cut:
                return

    def _decoded_runs(
        self,
        run: list[tuple[int, int, int, int]],
        segment: Segment | None,
        queue_id: int,
        name: bytes,
        rows: Any,
    ) -> Iterator[tuple[int, int, bytes]]:
        """``(first, decoded, buf)`` for the units of ``run`` in order: ``decoded`` units from
        unit ``first`` on whose records the record kernel (:func:`rmqstore.kernel.records_at`)
        found plainly in place and scanned into ``rows`` (of ``buf``, the span of the log they
        lie in, read once), or 0: unit ``first`` is not plainly one (its caller reads it on its
        own). Rows are overwritten at the next step."""
        first_offset = run[0][1]
        buf, spans = self._run_span(run, segment)
        span_view = memoryview(spans)
        done = 0
        while done < len(run):
            decoded = 0
            if buf:
                decoded = kernel.records_at(
                    buf, span_view[2 * done :], len(run) - done, first_offset, queue_id, name, rows
                )
            yield done, decoded, buf
            done += decoded or 1

    def _run_span(
        self, run: list[tuple[int, int, int, int]], segment: Segment | None
    ) -> tuple[bytes, array]:
        """The bytes of ``segment`` from the first record ``run`` points at to the end of the
        last (empty when they are not all in the file, or below the log's min offset), and
        each unit's ``(position, size)`` in them for :func:`rmqstore.kernel.records_at`
        (``(-1, 0)``, where it stops, for a unit that is no plain record's: a pre-blank
        unit, a size of 0 or less, a record beyond the span)."""
        log = self.store.commitlog
        first = run[0][1]
        spans = array("q")
        last = first
        for _queue_offset, offset, size, _tags_code in run:
            relative = offset - first
            if size <= 0 or is_pre_blank(offset, size) or not 0 <= relative <= _RUN_SPAN - size:
                spans.extend((-1, 0))  # records_at stops at it: read as by_queue reads it
            else:
                spans.extend((relative, size))
                last = max(last, offset + size)
        buf = b""
        if segment is not None and first >= log.min_offset:
            position = first - segment.start
            if position + last - first <= segment.size:  # (unit sizes come from a file)
                buf = log.pread(segment, position, last - first)
        return buf, spans

    def units_in_place(
        self, topic: str, queue_id: int, units: list[tuple[int, int, int, int]]
    ) -> list[bool]:
        """For each unit (:meth:`ConsumeQueue.unit_values` tuples) of ``topic``/``queue_id``:
        True when it points at a whole record of its size, queue and queue offset, found as
        :meth:`queue_lines` finds the records (a span of the log read at once, the record
        kernel's ``records_at``); False when that is not plain, for the caller to read one
        by one."""
        if self._block_rows is None:
            self._block_rows = new_rows(_UNITS_PER_BLOCK)
        rows = self._block_rows
        name = topic.encode("utf-8")
        found: list[bool] = []
        for start in range(0, len(units), _UNITS_PER_BLOCK):
            for run, segment in self._record_runs(units[start : start + _UNITS_PER_BLOCK]):
                for done, decoded, _buf in self._decoded_runs(run, segment, queue_id, name, rows):
                    found.extend(
                        rows[row * ROW_WIDTH + QUEUE_OFFSET] == run[done + row][0]
                        for row in range(decoded)
                    )
                    if not decoded:
                        found.append(False)
        return found

    def by_key(
        self,
        topic: str | None,
        key: str,
        *,
        begin: int = 0,
        end: int = LONG_MAX,
        max_results: int = MAX_QUERY_RESULTS,
        uniq: bool = False,
        body: BodyMode = BodyMode.READ,
    ) -> list[Message]:
        """Messages of ``topic`` (None: of every topic with consume queues) whose KEYS (or,
        with ``uniq``, UNIQ_KEY) contain ``key``, found through the index like
        ``queryMsgByKey``/``queryMsgByUniqueKey``: the index matches 32-bit hashes only, so
        each hit is checked against its record, as a client does. In commit-log order."""
        if not key:
            raise InputError("the key to look up is empty")
        topics = [topic] if topic is not None else self.topics()
        index = self.store.index_service()
        try:
            if not index.files:
                raise NotFoundError(
                    "the store has no index files"
                    + (
                        " (another process holds its lock: a broker or a rebuild may be "
                        "making them; run the command again once it is done)"
                        if self.store.written_elsewhere
                        else "; run rmqstore dispatch"
                    )
                )
            hits = sorted(
                {
                    (offset, name)
                    for name in topics
                    for offset in index.query(name, key, max_results, begin, end)
                }
            )
        finally:
            index.close()
        found = []
        other_kind = 0  # hits that are the key, but as the other kind (UNIQ_KEY / KEYS)
        unreadable = 0
        for offset, name in hits:
            try:
                message = self.store.commitlog.read(offset, body=body)
            except (RecordError, NotFoundError) as exc:
                unreadable += 1
                valid_end = self.log_end().offset
                self.notes.append(
                    f"an index hit at offset {offset} is past the commit log's valid end "
                    f"({valid_end}), where no whole record is (a crash's torn tail): left out"
                    if offset >= valid_end
                    else f"an index hit at offset {offset} is not a readable record ({exc}): "
                    "left out"
                )
                continue
            is_uniq = message.uniq_key == key
            in_keys = key in split_keys(message.keys)
            if message.topic != name:
                continue
            if is_uniq if uniq else in_keys:
                found.append(message)
            elif is_uniq or in_keys:
                other_kind += 1
        if other_kind:
            self.notes.append(
                counted(other_kind, "message")
                + (
                    f" carries {clipped(key)} as its "
                    if other_kind == 1
                    else f" carry {clipped(key)} as their "
                )
                + ("KEYS (use --key)" if uniq else "UNIQ_KEY (use --uniq-key, or --msg-id)")
            )
        collisions = len(hits) - len(found) - other_kind - unreadable
        if collisions:
            self.notes.append(
                f"{counted(collisions, 'index hit')} "
                + ("was another key" if collisions == 1 else "were other keys")
                + " with the same hash, and left out"
            )
        return found

    def offset_by_time(
        self, topic: str, queue_id: int, timestamp: int, *, rule: str = "5.x"
    ) -> int:
        """The queue offset for a store time. ``5.x``: the first message stored at or after
        ``timestamp`` (the max offset when all are earlier). ``4.x``: the 4.9 broker's
        nearest match within a file chosen by file time, taking a file's time as the store
        time of its first unit (its first write, which is the mtime of a one-page file)."""
        queue = self.store.consume_queue(topic, queue_id)
        log = self.store.commitlog
        end = self.log_end().offset

        def store_time(offset: int, size: int) -> int:
            return log.store_timestamp_at(offset, size, end)

        if rule == "4.x":
            return queue.offset_by_time_4x(
                timestamp,
                store_time,
                lambda segment: queue.first_unit_store_time(segment, store_time),
                log.min_offset,
            )
        return queue.offset_by_time(timestamp, store_time)

    def broker_generation(self) -> str | None:
        """ "4.x" or "5.x": which broker wrote the log, told from its first messages with
        properties (4.9 drops the final 0x02 of the properties, 5.x keeps it; a V2 record
        is 5.x). None when no message says (no properties in the first records)."""
        looked = 0
        for window, _, rows, batch in self.store.commitlog.scan().batches():
            for row in range(batch):
                at = row * ROW_WIDTH
                if rows[at + VERSION] == 2:
                    return "5.x"
                length = rows[at + PROPERTIES_LENGTH]
                if length > 0:
                    last = window[rows[at + PROPERTIES_AT] + length - 1]
                    return "5.x" if last == 2 else "4.x"
                looked += 1
                if looked >= 64:
                    return None
        return None

    def next_record_start(self, offset: int) -> int:
        """The first offset at or after ``offset`` where a valid message record starts: in
        the file holding ``offset``, or the start of the next file (files begin with a
        record). A NotFoundError when none follows."""
        log = self.store.commitlog
        segment = log.queue.find(offset)
        if segment is None:
            raise NotFoundError(f"offset {offset} is outside the commit-log files")
        found = next_record_in_segment(
            segment.path, segment.size, segment.start, offset - segment.start
        )
        if found is not None:
            return segment.start + found
        if self._data_ends_before(offset):
            return offset  # the end of the log: no record yet, as at the end itself
        following = [s for s in log.segments if s.start > segment.start]
        if following:
            return following[0].start
        raise NotFoundError(f"no record starts at or after offset {offset}")

    def _data_ends_before(self, offset: int) -> bool:
        """Whether the log's data ends at or before ``offset``: only zeros follow it in its
        file as far as a record reaches (a zero byte there is otherwise part of a record: an
        empty or zero-filled body is followed by its topic), and the files after it begin
        with zeros (pre-allocated by a broker, not yet written)."""
        log = self.store.commitlog
        if not log.segments:
            return offset == 0
        segment = log.queue.find(offset)
        if segment is None or not data_ends_at(
            lambda position, length: log.pread(segment, position, length),
            offset - segment.start,
            segment.size,
            self.store.config.max_message_size,
        ):
            return False
        return not any(
            any(log.pread(later, 0, 8)) for later in log.segments if later.start > segment.start
        )

    def sequential(
        self,
        start_offset: int,
        count: int | None = None,
        *,
        body: BodyMode = BodyMode.READ,
        seek: bool = False,
        selection: MessageSelection | None = None,
    ) -> Iterator[Message]:
        """Messages from the record starting at ``start_offset`` to the end of the log (or
        ``count`` of them), crossing files over BLANK records; with ``selection``, those it
        keeps (picked from the scan's rows, a message made of each kept one only; a body
        CRC checked, BodyMode.VERIFY, on every record read). ``seek``: when no record
        starts at ``start_offset``, start at the next one that does (with a note)."""
        start_offset = self._sequential_start(start_offset, seek)
        verify = body is BodyMode.VERIFY
        live_end = self._live_end()
        scan = self.store.commitlog.scan(start_offset, check_crc=verify)
        produced = records = 0
        for window, _window_start, rows, scanned in scan.batches():
            self._note_gaps(scan)
            batch = scanned if live_end is None else rows_before(rows, scanned, live_end)
            kept = None if selection is None else set(selection.kept_rows(window, rows, batch))
            for row in range(batch):
                if verify and rows[row * ROW_WIDTH + CRC_STATUS] == CRC_BAD:
                    offset = rows[row * ROW_WIDTH + PHYSICAL_OFFSET]
                    raise RecordError("BODYCRC", offset, "does not match the body")
                if kept is not None and row not in kept:
                    continue
                yield message_from_row(window, rows, row, body=body is not BodyMode.SKIP)
                produced += 1
                if count is not None and produced >= count:
                    return
            records += batch
            if batch < scanned:
                return  # the records after were written since the read began
        self._sequential_end(scan, records, start_offset)

    def sequential_lines(
        self,
        start_offset: int,
        count: int | None = None,
        *,
        body_mode: str,
        layout: DelimitedLayout | None = None,
        selection: MessageSelection | None = None,
        seek: bool = False,
    ) -> Iterator[tuple[bytes, int, int]]:
        """What :meth:`sequential` reads (of it, what ``selection`` keeps), as the JSON lines
        ``read --jsonl`` prints of each message (:func:`rmqstore.documents.message_document`
        in ``body_mode``: none, auto, text, hex or base64), or as the rows of ``layout``,
        written by the record kernel a scan batch at a time: ``(text, how many, the physical
        offset after the batch)``; the text of a batch it keeps nothing of is empty. The same
        start, end, notes and errors as :meth:`sequential`."""
        kind, modes = _text_writer(body_mode, layout)
        start_offset = self._sequential_start(start_offset, seek)
        live_end = self._live_end()
        scan = self.store.commitlog.scan(start_offset)
        produced = records = 0
        for window, _window_start, rows, scanned in scan.batches():
            self._note_gaps(scan)
            batch = scanned if live_end is None else rows_before(rows, scanned, live_end)
            if not batch:
                if scanned:
                    return  # the records from here on were written since the read began
                continue
            left = None if count is None else count - produced
            kept_rows, kept = _rows_taken(selection, window, rows, batch, left)
            out = bytearray()
            kernel.write_lines(kind, window, kept_rows, kept, out, *modes)
            last = (batch - 1) * ROW_WIDTH
            yield bytes(out), kept, rows[last + PHYSICAL_OFFSET] + rows[last + TOTAL_SIZE]
            produced += kept
            records += batch
            if (count is not None and produced >= count) or batch < scanned:
                return
        self._sequential_end(scan, records, start_offset)

    def _live_end(self) -> int | None:
        """Of a store another process holds (a broker writing it): where its log's data
        ended when a sequential read began (:meth:`CommitLog.live_end`); the read stops at
        the first record starting past it, so a record being written is read whole or not
        at all. None for a store nobody else holds."""
        return self.store.commitlog.live_end() if self.store.held_elsewhere else None

    def _sequential_start(self, start_offset: int, seek: bool) -> int:
        """Where a sequential read starts (``seek``: the next record start, with a note)."""
        log = self.store.commitlog
        if not log.segments and start_offset == 0:
            return start_offset  # an empty log ends at 0: nothing to read yet, as at any end
        if log.queue.find(start_offset) is None:
            raise NotFoundError(f"offset {start_offset} is outside the commit-log files")
        if seek:
            found = self.next_record_start(start_offset)
            if found != start_offset:
                self.notes.append(
                    f"no record starts at offset {start_offset}; reading from the next one, "
                    f"at {found}"
                )
                start_offset = found
        return start_offset

    def _note_gaps(self, scan: LogScan) -> None:
        """A note for each run of missing files a sequential read went on past, once, as
        soon as it has gone past (a read cut short after it still says so)."""
        while scan.gaps:
            start, end = scan.gaps.pop(0)
            self.notes.append(
                f"{missing_files(start, end, self.store.commitlog.file_size)}: the read went "
                "on past them, and their messages are not in it (run rmqstore verify)"
            )

    def _sequential_end(self, scan: LogScan, produced: int, start_offset: int) -> None:
        """How a sequential read that ran to the end of the log ended: an error when no
        message starts where it began, a note when the log ends with invalid bytes (and
        :meth:`_note_gaps`)."""
        self._note_gaps(scan)
        if (
            scan.stop is ScanStop.END
            and not produced
            and scan.end_offset == start_offset
            and not self._data_ends_before(start_offset)
        ):
            raise NotFoundError(
                f"no message starts at offset {start_offset}: the log goes on after it "
                "(--seek starts at the next record)"
            )
        if scan.stop is ScanStop.INVALID and scan.error is not None:
            if not produced and scan.end_offset == start_offset:
                raise NotFoundError(
                    f"no message starts at offset {start_offset}: "
                    f"{scan.error.field} {scan.error.reason}"
                )
            self.notes.append(f"the log ends with invalid bytes: {scan.error}")


def selected(
    messages: Iterator[Message] | list[Message],
    *,
    tags: frozenset[str] | None = None,
    begin: int = 0,
    end: int = LONG_MAX,
    count: int | None = None,
) -> Iterator[Message]:
    """The messages with one of ``tags`` (None: any) stored within ``[begin, end]``, at most
    ``count`` of them."""
    if count is not None and count <= 0:
        return
    keeps = MessageSelection(begin, end, tags).keeps
    produced = 0
    for message in messages:
        if not keeps(message):
            continue
        yield message
        produced += 1
        if count is not None and produced >= count:
            return  # before the next is read: it may be where a read fails


def _copy_of(message: Message, topic: str, queue_id: int, unit: Unit) -> bool:
    """Whether ``unit`` of ``topic``/``queue_id`` is ``message``'s unit in a further (LMQ)
    queue (spec 6.8): the record lists that queue at that queue offset (and its broker gave
    it copies: :func:`rmqstore.multidispatch.queue_copies`)."""
    stored = message.properties_bytes
    return message.store_size == unit.size and (topic, queue_id, unit.queue_offset) in (
        queue_copies(message.topic, message.queue_id, message.properties, stored)
    )
