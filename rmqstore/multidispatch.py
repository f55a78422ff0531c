"""Multi-dispatch and LMQ queues (spec §6.8): a broker with ``enableMultiDispatch`` (and
``enableLmq``) writes a unit for a record into further queues besides its own. The producer
names them in the record's ``INNER_MULTI_DISPATCH`` property (comma separated, read with
Java's ``String.split``: commas at the end name no queue, :func:`split_queues`); at append the
broker wrote the queue offset it chose in each of them into ``INNER_MULTI_QUEUE_OFFSET`` (in
the same order). LMQ queues are named ``%LMQ%...`` and are always queue 0; another name takes
the record's own queue id. Each copy is the record's unit (offset, size, tagsCode) at that
queue offset.

The broker adds ``INNER_MULTI_QUEUE_OFFSET`` only when it dispatches the copies, so a record
carrying both properties, with as many offsets as queues, is one whose copies a broker wrote:
rmqstore writes and checks them from the record alone, whatever the broker's settings. But
a 5.x broker gives no copies to the records of some topics (:func:`gets_no_copies`:
``%RETRY%`` and ``rmq_sys_`` topics, ``SCHEDULE_TOPIC_XXXX``): a message resent for a retry,
or waiting for its delay or timer, keeps the properties of the message it was made from,
offsets in the LMQ queues that message already holds. A 4.9 broker leaves out no topic, and
its records say so: it writes properties without the ``0x02`` a 5.x broker puts after the
last pair (spec 3.1; :func:`written_by_49`): rmqstore dispatches, checks and reads each
record's copies as the broker that wrote it did.
``append --multi-dispatch`` gives offsets as a broker does (:func:`copy_queues` names the
queues it takes them in), leaving out the topics as the broker its records look written by."""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from typing import Any, NamedTuple

from rmqstore import kernel
from rmqstore.errors import InputError, TopicError
from rmqstore.javavalues import java_ascii_long, java_blank, java_split
from rmqstore.kernel import layout
from rmqstore.properties import JAVA_REPLACE, decode_properties
from rmqstore.topics import RETRY_PREFIX, SCHEDULE_TOPIC, SYSTEM_TOPIC_PREFIX, check_topic
from rmqstore.wording import quoted

INNER_MULTI_DISPATCH = "INNER_MULTI_DISPATCH"
INNER_MULTI_QUEUE_OFFSET = "INNER_MULTI_QUEUE_OFFSET"
LMQ_PREFIX = "%LMQ%"
_LMQ_BYTES = LMQ_PREFIX.encode()
_SPLITTER = ","
_MOST_NAMES = 65536  # queue names kept decoded between calls (rows_copies, copy_run_keys)
# how a record's properties hold each of them (name, then the name/value separator)
DISPATCH_MARK = f"{INNER_MULTI_DISPATCH}\x01".encode()
COPIES_MARK = f"{INNER_MULTI_QUEUE_OFFSET}\x01".encode()


def split_queues(text: str) -> list[str]:
    """The comma-separated pieces of ``text`` as a broker's ``String.split(",")`` gives them
    (:func:`rmqstore.javavalues.java_split`: ``"a,b,"`` is two queues, ``","`` none)."""
    return java_split(text, _SPLITTER)


class QueueCopy(NamedTuple):
    """One further queue a record's unit goes into, at ``queue_offset``."""

    topic: str
    queue_id: int
    queue_offset: int


_new_copy = tuple.__new__  # a QueueCopy from a tuple, without its keyword-taking __new__


def gets_no_copies(topic: str) -> bool:
    """Whether a 5.x broker dispatches no copy of a record of ``topic``, whatever its
    properties (``MultiDispatchUtils.isNeedHandleMultiDispatch``): a ``%RETRY%`` topic, a
    system topic (``rmq_sys_``, such as the timer's ``rmq_sys_wheel_timer``) and
    ``SCHEDULE_TOPIC_XXXX``. Such a record is a message resent for a retry, or waiting for
    its delay or timer, with the properties of the message it was made from: its
    ``INNER_MULTI_QUEUE_OFFSET`` names the units that message has (the delivery gets its
    own). A 4.9 broker leaves out no topic (:func:`written_by_49`)."""
    return topic.startswith((RETRY_PREFIX, SYSTEM_TOPIC_PREFIX)) or topic == SCHEDULE_TOPIC


def written_by_49(stored: bytes | memoryview) -> bool:
    """Whether a record's stored properties are as a 4.9 broker writes them: not empty, and
    without the ``0x02`` after the last pair that a 5.x (and 4.3) broker writes (spec 3.1;
    a 5.x record's CRC property ends with one too). A 4.9 broker gives every topic's records
    their copies; rmqstore's ``append`` writes as a 5.x broker does."""
    return len(stored) > 0 and stored[-1] != 0x02


def queue_copies(
    topic: str, queue_id: int, properties: dict[str, str], stored: bytes | memoryview = b""
) -> list[QueueCopy]:
    """The further queues a record of ``topic``/``queue_id`` with ``properties`` has a unit
    in, as the broker that wrote it dispatched them: :func:`named_copies`, but none for a
    topic :func:`gets_no_copies` unless the record's stored properties (``stored``; none:
    as a 5.x broker writes them) are a 4.9 broker's. (:func:`rows_copies` reads them from
    kernel rows.)"""
    if gets_no_copies(topic) and not written_by_49(stored):
        return []
    return named_copies(topic, queue_id, properties)


def stored_copies(topic: str, queue_id: int, stored: bytes) -> list[QueueCopy]:
    """:func:`queue_copies` of a record from its stored properties (``stored``), decoded only
    when they hold INNER_MULTI_QUEUE_OFFSET (most records' are not)."""
    if COPIES_MARK not in stored:
        return []
    return queue_copies(topic, queue_id, decode_properties(stored), stored)


def named_copies(topic: str, queue_id: int, properties: dict[str, str]) -> list[QueueCopy]:
    """The units in further queues a record's properties name, whatever its topic (none when
    the two properties do not pair up, each split by :func:`split_queues`: the broker logs an
    error and writes no copy; those before an offset ``Long.parseLong`` refuses, where the
    broker's dispatch throws: :func:`dispatch_stop`). A queue whose name is no safe folder
    name (``..``, a slash) is kept: the writers and ``verify`` name it as they name such a
    topic of a record's own, and write no unit for it. (:func:`queue_copies` are those its
    broker wrote.)"""
    return _dispatched(queue_id, properties)[0]


class DispatchStop(NamedTuple):
    """Where a broker's dispatch of a record's further queues throws: the offset piece
    ``Long.parseLong`` refuses (``piece``, the ``number``-th from 0) and the queue it is for."""

    number: int
    piece: str
    queue: str


def dispatch_stop(
    topic: str, queue_id: int, properties: dict[str, str], stored: bytes | memoryview = b""
) -> DispatchStop | None:
    """Whether a broker's dispatch throws at a queued record (None: it does not): the record
    names further queues (as :func:`queue_copies` takes them) and one of their offsets is no
    number to ``Long.parseLong`` (an empty piece: a 5.x broker gives a name that is not an
    LMQ queue none, so ``"Plain,%LMQ%a"`` gets ``",7"``). The broker writes the units
    before that piece (:func:`named_copies`), then throws; its dispatcher tries the record
    again for ever, so no later record reaches a consume queue or the index, and a recovery
    that dispatches it after a crash fails the broker's start-up."""
    if gets_no_copies(topic) and not written_by_49(stored):
        return None
    return _dispatched(queue_id, properties)[1]


def dispatch_stop_problem(
    offset: int, topic: str, queue_id: int, properties: dict[str, str], stored: bytes
) -> str | None:
    """What a dispatch says of the queued record at ``offset`` when a broker's dispatch stops
    at it (:func:`dispatch_stop`; ``stored``: its stored properties, or their last byte),
    else None."""
    stop = dispatch_stop(topic, queue_id, properties, stored)
    if stop is None:
        return None
    return (
        f"record at {offset}: a broker's dispatch stops here for ever (piece {stop.number + 1} "
        f"of INNER_MULTI_QUEUE_OFFSET, {quoted(stop.piece)}, for {quoted(stop.queue)}, is no "
        "number to its Long.parseLong); the units before that piece were written, as the "
        "broker writes them, and the dispatch went on"
    )


def _dispatched(
    queue_id: int, properties: dict[str, str]
) -> tuple[list[QueueCopy], DispatchStop | None]:
    """The units a broker's ``multiDispatchLmqQueue`` writes for a record's further queues,
    and the piece it throws at, if any: nothing when either property is blank
    (``StringUtils.isBlank``) or the two do not pair up once split; else each piece in
    turn, up to the first that ``Long.parseLong`` refuses
    (:func:`rmqstore.javavalues.java_ascii_long`: ASCII digits; Java takes the digits of
    other scripts too, a broker writes none), a negative offset writing no unit (its
    queue's end is past it)."""
    queues = properties.get(INNER_MULTI_DISPATCH)
    offsets = properties.get(INNER_MULTI_QUEUE_OFFSET)
    if queues is None or offsets is None or java_blank(queues) or java_blank(offsets):
        return [], None
    names = split_queues(queues)
    numbers = split_queues(offsets)
    if len(names) != len(numbers):
        return [], None  # the broker logs an error and writes none
    copies = []
    for number, (name, piece) in enumerate(zip(names, numbers, strict=True)):
        queue_offset = java_ascii_long(piece)
        if queue_offset is None:
            return copies, DispatchStop(number, piece, name)
        if queue_offset >= 0:
            unit = (name, 0 if name.startswith(LMQ_PREFIX) else queue_id, queue_offset)
            copies.append(_new_copy(QueueCopy, unit))
    return copies, None


def rows_copies(
    buf: Any, rows: Any, numbers: list[int], names: dict[bytes, str]
) -> list[list[QueueCopy]]:
    """:func:`queue_copies` of each of the kernel rows ``numbers`` of ``buf`` (none for a
    record no queue takes: prepared, rolled back), read from the stored properties by the
    record kernel (``names``: queue-name bytes to text, kept from call to call)."""
    if len(names) > _MOST_NAMES:
        names.clear()  # (memory stays bounded on a store of very many queues)
    found: list[list[QueueCopy]] = []
    kernel.row_copies(buf, rows, array("q", numbers), QueueCopy, names, found)
    return found


def copy_run_keys(
    buf: Any, runs: Any, found: int, names: dict[bytes, str]
) -> list[tuple[str, int]]:
    """The queue (name, queue id) of each of the ``found`` runs the kernel's ``copy_runs``
    gathered from ``buf``, the names decoded as :func:`rows_copies` decodes them (``names``:
    bytes to text, kept from call to call)."""
    if len(names) > _MOST_NAMES:
        names.clear()
    keys = []
    width = layout.COPY_RUN_WIDTH
    for number in range(found):
        at = number * width
        name_at = runs[at + layout.COPY_RUN_NAME_AT]
        raw = bytes(buf[name_at : name_at + runs[at + layout.COPY_RUN_NAME_LENGTH]])
        name = names.get(raw)
        if name is None:
            name = names[raw] = raw.decode("utf-8", JAVA_REPLACE)
        keys.append((name, runs[at + layout.COPY_RUN_QUEUE_ID]))
    return keys


# units in further queues gathered for a batch at first, and at most (a caller takes a batch
# past it another way)
_COPY_UNITS = 4 * 4096
_MOST_COPY_UNITS = 1 << 20


class GatheredCopies(NamedTuple):
    """The further-queue units of kernel rows ``numbers`` as the kernel's ``copy_runs``
    gathered them: ``found`` runs (in :class:`CopyRunTables`' ``runs`` and ``units``), the
    queue (name, queue id) of each in ``keys``."""

    numbers: array
    found: int
    keys: list[tuple[str, int]]


class CopyRunTables:
    """The tables of the kernel's ``copy_runs``, kept from batch to batch and grown (four
    times, up to a bound) until a batch's units fit; the rows' copies last gathered. Empty
    until the first gather: most logs have no record with further queues, and a verify
    range or a dispatch that meets none pays nothing for them."""

    def __init__(self) -> None:
        self.units = bytearray()
        self.runs = array("q")
        self.scratch = array("q")
        self.stops = array("q")
        self.gathered = GatheredCopies(array("q"), 0, [])

    def scratch_for(self, rows: int) -> array:
        """Scratch space of at least ``rows`` integers (the kernel's ``copy_stops`` output),
        grown as needed."""
        if len(self.stops) < rows:
            self.stops = layout.zeroed(max(rows, 2 * len(self.stops)))
        return self.stops

    def _size(self, units: int) -> None:
        self.units = bytearray(layout.UNIT_SIZE * units)
        self.runs = layout.zeroed(layout.COPY_RUN_WIDTH * units)
        self.scratch = layout.zeroed(2 * units)

    def gather(self, buf: Any, rows: Any, numbers: array, dispatch_out: Any) -> int | None:
        """Gather the further-queue units of kernel rows ``numbers`` (in log order) into runs
        (``runs``, their units in ``units``); how many runs, None when they would not fit the
        largest tables."""
        if not self.units:
            self._size(_COPY_UNITS)
        while True:
            done, found, _placed = kernel.copy_runs(
                buf, rows, numbers, dispatch_out, self.units, self.runs, self.scratch
            )
            if done == len(numbers):
                return found
            units = 4 * len(self.units) // layout.UNIT_SIZE
            if units > _MOST_COPY_UNITS:
                return None
            self._size(units)

    def gather_named(
        self, buf: Any, rows: Any, numbers: array, dispatch_out: Any, names: dict[bytes, str]
    ) -> GatheredCopies | None:
        """:meth:`gather`, with each run's queue named (:func:`copy_run_keys`; ``names``:
        bytes to text, kept from call to call), kept as :attr:`gathered`; None when the runs
        do not fit the tables, or when two names that are not UTF-8 name one queue (gathered
        apart, their units would not go in in log order)."""
        found = self.gather(buf, rows, numbers, dispatch_out)
        if found is None:
            return None
        keys = copy_run_keys(buf, self.runs, found, names)
        if not names_decoded_apart(buf, self.runs, keys):
            return None
        self.gathered = GatheredCopies(numbers, found, keys)
        return self.gathered

    def gathered_for(
        self, buf: Any, rows: Any, numbers: array, dispatch_out: Any, names: dict[bytes, str]
    ) -> GatheredCopies:
        """The copies of ``numbers``: those last gathered, or gathered again for a part of
        them (a row taking the reference way between), which fits when the whole did."""
        if self.gathered.numbers == numbers:
            return self.gathered
        gathered = self.gather_named(buf, rows, numbers, dispatch_out, names)
        assert gathered is not None, "a part of rows that fit the tables fits them"
        return gathered


def kernel_copy_rows(
    tables: CopyRunTables,
    buf: Any,
    rows: Any,
    dispatch_out: Any,
    first: int,
    stop: int,
    special: set[int],
    names: dict[bytes, str],
) -> tuple[list[int], array]:
    """How a dispatch takes the kernel-prepared rows ``[first, stop)``: the rows going the
    reference way, in order (``special``, the caller's, and those flagged NEEDS_REFERENCE),
    and the rows flagged HAS_COPIES whose further-queue units the kernel gathered into runs
    (``tables.gathered``), which the caller puts after the rows' own units. When a further
    queue could be one of the rows' own (:func:`may_share_queues`), or the runs do not fit
    the tables, the rows with further queues go the reference way too: a queue's units must
    go in in log order. So do rows a broker's dispatch stops at (the kernel's
    ``copy_stops``), for the caller to name them (:func:`dispatch_stop_problem`)."""
    width = layout.DISPATCH_WIDTH
    flags = dispatch_out[layout.DISPATCH_FLAGS + first * width : stop * width : width]
    special, with_copies = split_rows(flags, first, special)
    numbers = array("q", with_copies)
    if numbers:
        stops = tables.scratch_for(len(numbers))
        found = kernel.copy_stops(buf, rows, numbers, stops)
        if found:  # rows a broker's dispatch stops at: the reference way names them
            stopped = set(stops[:found])
            special.update(stopped)
            numbers = array("q", (number for number in numbers if number not in stopped))
    if numbers:
        gathered = tables.gather_named(buf, rows, numbers, dispatch_out, names)
        if gathered is None or may_share_queues(
            buf, rows, first, stop, (name for name, _ in gathered.keys)
        ):
            special.update(numbers)
            numbers = array("q")
    return sorted(special), numbers


def names_decoded_apart(buf: Any, runs: Any, keys: list[tuple[str, int]]) -> bool:
    """Whether runs the kernel's ``copy_runs`` gathered into one queue (their ``keys``,
    :func:`copy_run_keys`') had the same name bytes: names not UTF-8 that decode alike were
    gathered apart, and their units would not go into the one queue in log order."""
    width = layout.COPY_RUN_WIDTH
    seen: dict[tuple[str, int], bytes] = {}
    for number, key in enumerate(keys):
        at = number * width
        name_at = runs[at + layout.COPY_RUN_NAME_AT]
        raw = bytes(buf[name_at : name_at + runs[at + layout.COPY_RUN_NAME_LENGTH]])
        if seen.setdefault(key, raw) != raw:
            return False
    return True


def may_share_queues(buf: Any, rows: Any, first: int, stop: int, names: Iterable[str]) -> bool:
    """Whether a unit in a further queue of one of ``names`` could go into the queue of a unit
    of kernel rows ``[first, stop)``'s own: a further queue that is not an LMQ queue, or a
    record of an LMQ topic among the rows (a broker never writes one). A caller putting the
    rows' own units first and their copies after keeps each queue's units in log order only
    when not."""
    if any(not name.startswith(LMQ_PREFIX) for name in names):
        return True
    topic_at = layout.TOPIC_AT
    width = layout.ROW_WIDTH
    own = rows[topic_at + first * width : topic_at + stop * width : width]
    return any(buf[at : at + len(_LMQ_BYTES)] == _LMQ_BYTES for at in own)


def split_rows(flags: Any, first: int, special: set[int]) -> tuple[set[int], list[int]]:
    """Kernel rows ``[first, first + len(flags))`` (``flags``: their DISPATCH_FLAGS) parted:
    those going the reference way (``special``, the caller's, and those flagged
    NEEDS_REFERENCE), and the others flagged HAS_COPIES, in order."""
    special = set(special)
    with_copies: list[int] = []
    if flags.count(0) == len(flags):
        return special, with_copies
    for number, flag in enumerate(flags, first):
        if flag == layout.HAS_COPIES and number not in special:
            with_copies.append(number)
        elif flag:
            special.add(number)
    return special, with_copies


def record_units(
    topic: str,
    queue_id: int,
    queue_offset: int,
    properties: dict[str, str],
    stored: bytes | memoryview = b"",
) -> list[QueueCopy]:
    """Every unit a queued record has: in its own queue, then in the further queues it
    names (:func:`queue_copies`; ``stored``: its stored properties)."""
    copies = queue_copies(topic, queue_id, properties, stored)
    return [QueueCopy(topic, queue_id, queue_offset), *copies]


def copy_queues(topic: str, queue_id: int, queues: str) -> list[tuple[str, int]]:
    """The queues (topic, queue id) a broker with ``enableMultiDispatch`` gives a record of
    ``topic``/``queue_id`` whose ``INNER_MULTI_DISPATCH`` is ``queues`` an offset in, in the
    property's order: the queue 0 of a ``%LMQ%`` name, else the record's own queue id of the
    name. The names are split by :func:`split_queues`, as the broker splits them
    (``"%LMQ%a,"`` is one queue). A name that is no topic name by RocketMQ's rules (an empty
    one, ``..``, a slash) is an :class:`InputError`: no queue of it could be dispatched; so
    is a value of commas."""
    keys = []
    names = split_queues(queues)
    if not names:
        raise InputError(f"{INNER_MULTI_DISPATCH} names no queue: {quoted(queues)}")
    for name in names:
        try:
            check_topic(name, allow_v2=False)
        except TopicError as exc:
            raise InputError(f"{INNER_MULTI_DISPATCH} names no queue: {exc}") from None
        keys.append((name, 0 if name.startswith(LMQ_PREFIX) else queue_id))
    return keys


def copies_marked(buf: Any, rows: Any, count: int, first: int = 0) -> int:
    """How often INNER_MULTI_QUEUE_OFFSET appears from row ``first`` to the last of ``count``
    kernel rows' properties in ``buf`` (a search in C, about 0.2 ms per MiB)."""
    if first >= count:
        return 0
    width = layout.ROW_WIDTH
    low = rows[first * width + layout.PROPERTIES_AT]
    last = (count - 1) * width
    high = rows[last + layout.PROPERTIES_AT] + rows[last + layout.PROPERTIES_LENGTH]
    data = buf
    if not hasattr(buf, "find"):  # a memoryview: its bytes
        data, low, high = bytes(buf[low:high]), 0, high - low
    found = 0
    at = data.find(COPIES_MARK, low, high)
    while at >= 0:
        found += 1
        at = data.find(COPIES_MARK, at + len(COPIES_MARK), high)
    return found
