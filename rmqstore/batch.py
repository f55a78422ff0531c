"""Appending many messages: JSON-lines input, group commit and all-or-nothing rollback.

``--flush async`` (the default) makes one command one transaction: nothing is reported until
the whole input is appended and flushed, and on any error before that every message it appended
is rolled back and the store is as it was. ``--flush sync`` reports a message only after an
fsync that covers it; messages are committed in groups (a group closes when the input has
nothing more to read right now, or after ``group_size`` messages), and an error rolls back only
the group not yet flushed. Nothing reported is ever rolled back.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import select
import struct
import tempfile
import time
import zlib
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, BinaryIO

from rmqstore import kernel
from rmqstore.commitlog import AppendResult, CommitLogAppender
from rmqstore.errors import InputError, RmqStoreError, StoreFormatError, failure_text
from rmqstore.hosts import DEFAULT_BORN_HOST, HostAddress, parse_host
from rmqstore.jsontext import parse_json
from rmqstore.kernel import layout
from rmqstore.messagebatch import BatchBuilder, BatchUnsupported
from rmqstore.properties import DELAY, KEYS, TAGS, UNIQ_KEY, encode_properties
from rmqstore.record import (
    COMPRESSED_FLAG,
    TRANSACTION_COMMIT,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_PREPARED,
    TRANSACTION_ROLLBACK,
    Message,
)

TRANSACTION_TYPES = {
    "none": TRANSACTION_NOT_TYPE,
    "prepared": TRANSACTION_PREPARED,
    "commit": TRANSACTION_COMMIT,
    "rollback": TRANSACTION_ROLLBACK,
}
DOCUMENT_FIELDS = (
    "topic",
    "queueId",
    "tags",
    "keys",
    "properties",
    "body",
    "bodyBase64",
    "flag",
    "bornTimestamp",
    "bornHost",
    "reconsumeTimes",
    "transaction",
    "preparedTransactionOffset",
)
_INT32 = (-(1 << 31), (1 << 31) - 1)
_INT64 = (-(1 << 63), (1 << 63) - 1)
_READ_CHUNK = 1 << 20  # a pipe gives what it holds (64 KiB); a file this much at a time

try:  # orjson parses a line five times as fast; its errors are json.JSONDecodeErrors
    from orjson import loads as _loads

    _LOADS_CHECKS_UTF8 = True  # orjson refuses lone surrogates ("\ud800")
except ImportError:  # pragma: no cover - a dependency, but the engine works without it
    _loads = parse_json
    _LOADS_CHECKS_UTF8 = False


@dataclass
class MessageDefaults:
    """Values for fields a JSON line (or the options) leave out."""

    topic: str | None = None
    queue_id: int = 0
    tags: str | None = None
    keys: str | None = None
    properties: dict[str, str] = field(default_factory=dict)
    flag: int = 0
    born_host: HostAddress = DEFAULT_BORN_HOST
    born_timestamp: int | None = None
    transaction: str = "none"
    prepared_transaction_offset: int = 0
    reconsume_times: int = 0

    @property
    def utf8_checked(self) -> bool:
        """The defaults' text is valid Unicode (checked once, then remembered)."""
        known = self.__dict__.get("_utf8_checked")
        if known is None:
            texts = [self.topic, self.tags, self.keys, *self.properties, *self.properties.values()]
            known = all(text is None or _is_unicode(text) for text in texts)
            self.__dict__["_utf8_checked"] = known
        return known


def _integer(value: object, name: str, bounds: tuple[int, int], where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{where}: {name} must be an integer, not {json.dumps(value)}")
    if not bounds[0] <= value <= bounds[1]:
        raise InputError(f"{where}: {name} {value} is out of range")
    return value


def _text(value: object, name: str, where: str) -> str:
    if not isinstance(value, str):
        raise InputError(f"{where}: {name} must be a string, not {json.dumps(value)}")
    return value  # build_message checks that the text is Unicode


def _is_unicode(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _unicode(value: str, name: str, where: str) -> str:
    """``value`` when it can be stored as UTF-8: not a lone surrogate (JSON's ``"\ud800"``),
    not undecodable bytes from the command line."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(
            f"{where}: {name} is not valid text (a lone surrogate, or bytes that are not UTF-8)"
        ) from None
    return value


_KNOWN_FIELDS = frozenset(DOCUMENT_FIELDS)


def build_message(
    document: dict[str, Any],
    defaults: MessageDefaults,
    where: str,
    *,
    utf8_checked: bool = False,
) -> Message:
    """A message from one input object (a JSON line, or the command-line options); fields it
    leaves out come from ``defaults``. ``utf8_checked``: the document's strings are known to
    be valid Unicode (orjson refuses lone surrogates), so only the defaults' are checked."""
    if not isinstance(document, dict):
        raise InputError(f"{where}: expected a JSON object")
    if not _KNOWN_FIELDS.issuperset(document):
        unknown = sorted(set(document) - _KNOWN_FIELDS)
        raise InputError(
            f"{where}: unknown field(s) {', '.join(unknown)}; known fields are "
            f"{', '.join(DOCUMENT_FIELDS)}"
        )
    get = document.get
    topic = defaults.topic if (value := get("topic")) is None else _text(value, "topic", where)
    if not topic:
        raise InputError(f'{where}: no topic (give "topic" or --topic)')
    if "bodyBase64" in document:
        if "body" in document:
            raise InputError(f"{where}: give either body or bodyBase64, not both")
        try:
            body = base64.b64decode(
                _text(document["bodyBase64"], "bodyBase64", where), validate=True
            )
        except (binascii.Error, ValueError):
            raise InputError(f"{where}: bodyBase64 is not valid base64") from None
    else:
        body = _unicode(_text(get("body", ""), "body", where), "body", where).encode("utf-8")
    properties = dict(defaults.properties)
    if (extra := get("properties")) is not None:
        if not isinstance(extra, dict) or not all(
            isinstance(key, str) and isinstance(text, str) for key, text in extra.items()
        ):
            raise InputError(f"{where}: properties must be an object of string values")
        properties.update(extra)
    if not utf8_checked or not defaults.utf8_checked:
        for key, text in properties.items():
            _unicode(key, "a property name", where)
            _unicode(text, f"property {key}", where)
    tags = defaults.tags if (value := get("tags")) is None else _text(value, "tags", where)
    keys = defaults.keys if (value := get("keys")) is None else _text(value, "keys", where)
    if not utf8_checked or not defaults.utf8_checked:
        for name, text in (("topic", topic), ("tags", tags), ("keys", keys)):
            if text is not None:
                _unicode(text, name, where)
    if tags:
        properties[TAGS] = tags
    if keys:
        properties[KEYS] = keys
    transaction = defaults.transaction
    if (value := get("transaction")) is not None:
        transaction = _text(value, "transaction", where)
    if transaction not in TRANSACTION_TYPES:
        raise InputError(f"{where}: transaction must be one of {', '.join(TRANSACTION_TYPES)}")
    born_host = defaults.born_host
    if (value := get("bornHost")) is not None:
        born_host = parse_host(_text(value, "bornHost", where))
    born_timestamp = defaults.born_timestamp
    if (value := get("bornTimestamp")) is not None:
        born_timestamp = _integer(value, "bornTimestamp", (0, _INT64[1]), where)
    elif born_timestamp is None:
        born_timestamp = time.time_ns() // 1_000_000
    queue_id = defaults.queue_id
    if (value := get("queueId")) is not None:
        queue_id = _integer(value, "queueId", (0, _INT32[1]), where)
    flag = defaults.flag
    if (value := get("flag")) is not None:
        flag = _integer(value, "flag", _INT32, where)
    reconsume_times = defaults.reconsume_times
    if (value := get("reconsumeTimes")) is not None:
        reconsume_times = _integer(value, "reconsumeTimes", (0, _INT32[1]), where)
    prepared_offset = defaults.prepared_transaction_offset
    if (value := get("preparedTransactionOffset")) is not None:
        prepared_offset = _integer(value, "preparedTransactionOffset", (0, _INT64[1]), where)
    return Message(
        topic=topic,
        body=body,
        queue_id=queue_id,
        flag=flag,
        properties=properties,
        sys_flag=TRANSACTION_TYPES[transaction],
        born_timestamp=born_timestamp,
        born_host=born_host,
        reconsume_times=reconsume_times,
        prepared_transaction_offset=prepared_offset,
    )


LineBlock = tuple[int, list[bytes]]  # the number of the first line, and the lines


def read_line_blocks(
    stream: BinaryIO,
    on_idle: Callable[[], None] | None = None,
    tick: float | None = None,
    *,
    longest: int | None = None,
    source: str = "input",
) -> Iterator[LineBlock]:
    """The input in blocks of whole lines as they arrive: ``(number of the first line,
    lines)``, lines numbered from 1 and blank ones included (numbers are positions). Before
    waiting for more input ``on_idle`` is called, so a group commit happens whenever the
    writer on the other end pauses; with ``tick`` (seconds) it is called again that often
    while the input stays quiet (the interval flush of a pipe that stays open). A line
    longer than ``longest`` bytes (see :func:`longest_line`) is an InputError naming it
    (``source`` line N) once that much of it has come, so memory stays bounded."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        fd = None
    number = 1
    parts: list[bytes] = []  # the start of a line whose end has not come yet
    pending = 0  # its length
    while True:
        if fd is not None and on_idle is not None and not select.select([fd], [], [], 0)[0]:
            on_idle()
            while tick is not None and not select.select([fd], [], [], tick)[0]:
                on_idle()
        chunk = os.read(fd, _READ_CHUNK) if fd is not None else stream.read(_READ_CHUNK)
        if not chunk:
            if parts:
                yield number, [b"".join(parts)]
            return
        cut = chunk.rfind(b"\n")
        if cut < 0:
            parts.append(chunk)
            pending += len(chunk)
            if longest is not None and pending > longest:
                raise InputError(
                    f"{source} line {number}: longer than {longest} bytes, more than a "
                    "message of at most maxMessageSize takes as JSON"
                )
            continue
        parts.append(chunk[:cut])
        lines = b"".join(parts).split(b"\n") if len(parts) > 1 else chunk[:cut].split(b"\n")
        yield number, lines
        number += len(lines)
        parts = [chunk[cut + 1 :]] if cut + 1 < len(chunk) else []
        pending = len(parts[0]) if parts else 0


def longest_line(max_message_size: int) -> int:
    """The longest JSON line a message of at most ``max_message_size`` body bytes can take:
    six characters a body byte (a control character written as ``\\u0001``) and a MiB
    for the rest (topic, properties, numbers, spacing)."""
    return 6 * max_message_size + (1 << 20)


def read_lines(
    stream: BinaryIO,
    on_idle: Callable[[], None] | None = None,
    tick: float | None = None,
    *,
    longest: int | None = None,
    source: str = "input",
) -> Iterator[tuple[int, bytes]]:
    """Non-empty lines with their 1-based numbers (see :func:`read_line_blocks`)."""
    for first, lines in read_line_blocks(stream, on_idle, tick, longest=longest, source=source):
        for number, line in enumerate(lines, first):
            if line.strip():
                yield number, line


def _blocks_of(lines: Iterable[tuple[int, bytes]]) -> Iterator[LineBlock]:
    """Numbered lines as blocks of consecutive lines (a gap in the numbers starts a block)."""
    first, block = 0, []
    for number, line in lines:
        if block and number != first + len(block):
            yield first, block
            block = []
        if not block:
            first = number
        block.append(line)
    if block:
        yield first, block


ZLIB_COMPRESSION = 0x3 << 8  # 5.x: the compression type bits say ZLIB
PRODUCER_ZLIB_LEVEL = 5  # a producer's default zipCompressLevel


def compressed_bodies(
    messages: Iterable[Message], threshold: int, *, type_bits: bool
) -> Iterator[Message]:
    """``messages`` with each body of at least ``threshold`` bytes zlib-compressed and
    COMPRESSED_FLAG set, as a producer does over ``compressMsgBodyOverHowmuch``
    (``type_bits``: also the 5.x ZLIB compression-type bits). The store keeps bodies as given;
    ``read --decompress`` restores them."""
    for message in messages:
        body = message.body or b""
        if len(body) >= threshold and not message.sys_flag & COMPRESSED_FLAG:
            message.body = zlib.compress(body, PRODUCER_ZLIB_LEVEL)
            message.sys_flag |= COMPRESSED_FLAG | (ZLIB_COMPRESSION if type_bits else 0)
        yield message


_MOST_ENCODED = 4096  # property strings remembered by (tags, keys)


class DocumentRows:
    """Adds parsed JSON lines to a :class:`BatchBuilder`. Documents of the common shape (only
    topic, body, tags, keys and queueId, of the right types) go straight into the batch's
    columns through the record kernel (``document_rows``), their property strings taken from
    a cache by (tags, keys); any other goes through :func:`build_message`, so it gets that
    function's checks and errors. Both give the same message."""

    def __init__(self, defaults: MessageDefaults, trailing_separator: bool, source: str) -> None:
        self.defaults = defaults
        self.trailing_separator = trailing_separator
        self.source = source
        # the common shape takes what the defaults give; text needs no check when orjson
        # parsed it (it refuses lone surrogates) and the defaults' was checked
        self.enabled = (
            _LOADS_CHECKS_UTF8
            and defaults.utf8_checked
            and DELAY not in defaults.properties
            and defaults.transaction in TRANSACTION_TYPES
            and 0 <= defaults.queue_id <= _INT32[1]
        )
        self.sys_flag = TRANSACTION_TYPES.get(defaults.transaction, 0)
        self._encoded: dict[tuple[str | None, str | None], tuple[bytes, bool]] = {}

    def message(self, document: Any, number: int) -> Message:
        where = f"{self.source} line {number}"
        return build_message(document, self.defaults, where, utf8_checked=_LOADS_CHECKS_UTF8)

    def fill(self, builder: BatchBuilder, documents: list[Any], numbers: Sequence[int]) -> None:
        """Add ``documents`` (line ``numbers[i]`` for ``documents[i]``) to ``builder``."""
        count = len(documents)
        if not self.enabled:
            for document, number in zip(documents, numbers, strict=True):
                builder.add(self.message(document, number))
            return
        defaults = self.defaults
        born_timestamp = defaults.born_timestamp
        if born_timestamp is None:  # one clock reading for the documents of one call
            born_timestamp = time.time_ns() // 1_000_000
        values = (
            defaults.topic,
            defaults.queue_id,
            defaults.tags,
            defaults.keys,
            defaults.flag,
            self.sys_flag,
            born_timestamp,
            builder.hosts.setdefault(defaults.born_host, len(builder.hosts)),
            defaults.reconsume_times,
            defaults.prepared_transaction_offset,
        )
        state = array("q", (builder.longest_body, builder.longest_props, builder.queue_span))
        first = 0
        while first < count:
            first, stop, key = kernel.document_rows(
                documents, first, count, values, builder.topics, self._encoded, builder.rows,
                builder.body_spans, builder.bodies, builder.prop_spans, builder.props, state,
            )  # fmt: skip
            if stop == layout.DOC_OTHER:
                builder.longest_body, builder.longest_props, builder.queue_span = state
                builder.add(self.message(documents[first], numbers[first]))
                state[0], state[1], state[2] = (
                    builder.longest_body,
                    builder.longest_props,
                    builder.queue_span,
                )
                first += 1
            elif stop == layout.DOC_NEEDS_PROPERTIES:
                if len(self._encoded) >= _MOST_ENCODED:
                    self._encoded.clear()
                self._encoded[key] = self._encode(*key)
        builder.longest_body, builder.longest_props, builder.queue_span = state

    def _encode(self, tags: str | None, keys: str | None) -> tuple[bytes, bool]:
        """The property string of a document with these tags and keys, and whether it lacks
        a UNIQ_KEY (the appender then adds one)."""
        properties = dict(self.defaults.properties)
        if tags:
            properties[TAGS] = tags
        if keys:
            properties[KEYS] = keys
        return (
            encode_properties(properties, trailing_separator=self.trailing_separator),
            UNIQ_KEY not in properties,
        )


def messages_from_lines(
    lines: Iterable[tuple[int, bytes]], defaults: MessageDefaults, source: str
) -> Iterator[Message]:
    for number, line in lines:
        where = f"{source} line {number}"
        try:
            document = _loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InputError(f"{where}: not valid JSON ({exc})") from None
        yield build_message(document, defaults, where, utf8_checked=_LOADS_CHECKS_UTF8)


class ResultSpool:
    """Append results not reported yet: kept as they are up to a number of them, beyond that
    packed (40 bytes each) in a temporary file, so memory stays flat however many messages one
    command appends before it may report them."""

    _ROW = struct.Struct("<qqiqiII")  # offset, queue offset, size, time, queue, topic, host
    _IN_LIST = 65536
    _READ_ROWS = 4096

    def __init__(self) -> None:
        self._list: list[AppendResult] = []
        self._file: Any = None
        self._count = 0
        self._topics: dict[str, int] = {}
        self._hosts: dict[bytes, int] = {}

    def __len__(self) -> int:
        return self._count

    def extend(self, results: list[AppendResult]) -> None:
        self._count += len(results)
        if self._file is None:
            self._list.extend(results)
            if len(self._list) <= self._IN_LIST:
                return
            self._file = tempfile.TemporaryFile()  # noqa: SIM115 - closed by clear()
            results, self._list = self._list, []
        topics, hosts, pack = self._topics, self._hosts, self._ROW.pack
        rows = []
        for result in results:
            topic = topics.setdefault(result.topic, len(topics))
            host = hosts.setdefault(result.store_host_field, len(hosts))
            rows.append(
                pack(
                    result.physical_offset,
                    result.queue_offset,
                    result.store_size,
                    result.store_timestamp,
                    result.queue_id,
                    topic,
                    host,
                )
            )
        self._file.write(b"".join(rows))

    def drain(self) -> Iterator[AppendResult]:
        """The results in append order; each is gone from the spool once yielded."""
        if self._file is None:
            results, self._list = self._list, []
            for result in results:
                self._count -= 1
                yield result
            return
        topics = list(self._topics)
        hosts = list(self._hosts)
        new_result = tuple.__new__
        self._file.seek(0)
        while self._count:
            block = self._file.read(min(self._count, self._READ_ROWS) * self._ROW.size)
            for offset, queue_offset, size, stamp, queue_id, topic, host in self._ROW.iter_unpack(
                block
            ):
                self._count -= 1
                yield new_result(
                    AppendResult,
                    (offset, queue_offset, size, stamp, topics[topic], queue_id, hosts[host]),
                )
        self.clear()

    def clear(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._list = []
        self._count = 0


_KEY_BATCH = 4096  # results reported per read-back of their UNIQ_KEYs
_DOCUMENT_CHUNK = 4096  # JSON lines per batch with ASYNC_FLUSH
_PAGE = 4096  # what flushCommitLogLeastPages and commitCommitLogLeastPages count


@dataclass(frozen=True)
class FlushPolicy:
    """When an append makes its messages durable, with the broker.conf settings that say so.

    ``sync`` (flushDiskType=SYNC_FLUSH): group commit, each group fsynced before it is
    reported. Otherwise ASYNC_FLUSH: every ``interval_ms`` (flushIntervalCommitLog) the log is
    flushed when at least ``least_pages`` pages (flushCommitLogLeastPages) are dirty, and
    whatever is dirty every ``thorough_ms`` (flushCommitLogThoroughInterval), so a crash
    loses at most about one interval; messages are reported after the flush that covers them.
    ``transient`` (transientStorePoolEnable, ASYNC_FLUSH only): records are staged in memory
    and written to the file every ``commit_interval_ms`` (commitIntervalCommitLog) when at
    least ``commit_least_pages`` (commitCommitLogLeastPages) are staged, and all of them every
    ``commit_thorough_ms`` (commitCommitLogThoroughInterval); a flush commits first."""

    sync: bool = False
    interval_ms: int = 500
    least_pages: int = 4
    thorough_ms: int = 10_000
    transient: bool = False
    commit_interval_ms: int = 200
    commit_least_pages: int = 4
    commit_thorough_ms: int = 200

    @property
    def tick_seconds(self) -> float | None:
        """How often a quiet input must still wake the job (None: only when it pauses)."""
        if self.sync:
            return None
        interval = min(self.interval_ms, self.commit_interval_ms if self.transient else 1 << 30)
        return max(interval, 1) / 1000


class AppendJob:
    """Drives a :class:`CommitLogAppender` with group commit and rollback (see module doc).
    Messages are handed to ``append_many`` in chunks, the appender's fast path.

    A group is closed in this order: the commit log is flushed (from then on its messages
    stay), ``on_commit`` runs (a dispatch: consume queues, index, checkpoint after the log
    they point into), then each message is reported with ``on_result`` (or, with
    ``on_lines``, the group's report lines are read back from the log) and ``on_reported``
    runs once (flush the acknowledgements). A message is never reported before it is
    durable, so an error after a report (a closed stdout included) never undoes it."""

    def __init__(
        self,
        appender: CommitLogAppender,
        *,
        sync: bool | None = None,
        policy: FlushPolicy | None = None,
        on_result: Callable[..., None] | None = None,
        on_lines: Callable[[bytes], object] | None = None,
        lines_style: int = layout.LINES_JSONL,
        on_commit: Callable[[], object] | None = None,
        on_reported: Callable[[], None] | None = None,
        group_size: int = 1024,
        chunk_size: int = 256,
        uniq_keys: bool = False,
    ) -> None:
        """``uniq_keys``: report each message as ``on_result(result, uniq_key)``, the key
        read back from the durable record (``on_result(result)`` otherwise). ``on_lines``
        instead: each group is reported as text (``lines_style``, see
        :meth:`rmqstore.commitlog.CommitLog.result_lines`) read back from the records the
        group wrote, a block of lines at a time, no per-message objects. ``policy`` says when
        messages become durable (``sync`` alone: group commit, or one flush at the end)."""
        if (on_result is None) == (on_lines is None):
            raise ValueError("give on_result or on_lines")
        self.appender = appender
        self.uniq_keys = uniq_keys
        if policy is None:  # without a policy async means one flush at the end
            never = 1 << 40
            policy = FlushPolicy(sync=bool(sync), interval_ms=never, thorough_ms=never)
        self.policy = policy
        self.sync = policy.sync
        now = time.monotonic()  # the services first run one interval from now
        self._next_flush = now + policy.interval_ms / 1000
        self._next_commit = now + policy.commit_interval_ms / 1000
        self._last_thorough_flush = self._last_thorough_commit = now
        self.on_result = on_result
        self.on_lines = on_lines
        self.lines_style = lines_style
        self.on_commit = on_commit
        self.on_reported = on_reported
        self.group_size = group_size
        self.chunk_size = chunk_size
        self.committed = 0  # messages made durable (they stay whatever happens next)
        self.reported = 0  # messages reported (to on_result, or as lines to on_lines)
        self._chunk: list[Any] = []  # messages, or (run_line_blocks) parsed JSON lines
        self._numbers: list[int] = []  # the line of each document in the chunk
        self._documents: DocumentRows | None = None  # how run_line_blocks' documents become rows
        self._unreported = ResultSpool()  # reported by on_result, not yet reported
        self._waiting = 0  # messages appended and not reported yet
        self._savepoint = appender.savepoint()
        self._report_from = self._savepoint.offset  # with on_lines: where unreported records start
        # applied to the messages before they are appended (a producer's body compression)
        self.transform: Callable[[Iterable[Message]], Iterable[Message]] | None = None

    def add(self, message: Message) -> None:
        self._chunk.append(message)
        if len(self._chunk) >= self.chunk_size:
            self._write_chunk()

    def _add_documents(self, documents: list[Any], numbers: Sequence[int]) -> None:
        """Parsed JSON lines (``numbers``: their lines) into the chunk, written as it fills:
        chunks of ``chunk_size`` with SYNC_FLUSH (the group commit's granularity), else
        larger ones (fewer kernel calls)."""
        size = self.chunk_size if self.sync else max(self.chunk_size, _DOCUMENT_CHUNK)
        at = 0
        while at < len(documents):
            room = size - len(self._chunk)
            self._chunk.extend(documents[at : at + room])
            self._numbers.extend(numbers[at : at + room])
            at += room
            if len(self._chunk) >= size:
                self._write_chunk()

    def _write_chunk(self) -> None:
        chunk, self._chunk = self._chunk, []
        numbers, self._numbers = self._numbers, []
        if not chunk:
            return
        self._waiting += self._append(chunk, numbers)
        if self.sync:
            if self._waiting >= self.group_size:
                self._close_group()
        else:
            self._tick()

    def _tick(self) -> None:
        """ASYNC_FLUSH: the broker's commit and flush services, run when they are due."""
        policy, appender = self.policy, self.appender
        now = time.monotonic()
        if policy.transient and now >= self._next_commit:
            self._next_commit = now + policy.commit_interval_ms / 1000
            least = policy.commit_least_pages
            if now >= self._last_thorough_commit + policy.commit_thorough_ms / 1000:
                self._last_thorough_commit, least = now, 0
            staged = appender.uncommitted_bytes
            if staged and staged // _PAGE >= least:
                appender.commit()
        if now >= self._next_flush:
            self._next_flush = now + policy.interval_ms / 1000
            least = policy.least_pages
            if now >= self._last_thorough_flush + policy.thorough_ms / 1000:
                self._last_thorough_flush, least = now, 0
            dirty = appender.unflushed_bytes
            if dirty and dirty // _PAGE >= least:
                self._close_group()

    def _append(self, chunk: list[Any], numbers: list[int]) -> int:
        """The chunk packed by the record kernel as one batch; one message at a time when a
        message needs the per-message path (a DELAY, the __CRC32# property). Documents (JSON
        lines, with their line ``numbers``) become rows here, a batch at a time. Returns how
        many messages it appended; their results go to the spool unless reported as lines."""
        appender = self.appender
        builder = BatchBuilder(trailing_separator=appender.trailing_separator)
        documents = self._documents
        try:
            if documents is not None:
                documents.fill(builder, chunk, numbers)
            else:
                for message in chunk:
                    builder.add(message)
            appended = appender.append_batch(builder.build())
            if self.on_lines is None:
                self._unreported.extend(appended.results())
            return len(appended)
        except BatchUnsupported:
            messages = (
                chunk
                if documents is None
                else [documents.message(*item) for item in zip(chunk, numbers, strict=True)]
            )
            results = appender.append_many(messages)
            if self.on_lines is None:
                self._unreported.extend(results)
            return len(results)

    def commit(self) -> None:
        """Write what is queued; in sync mode also close the group (flush, then report); in
        async mode run the commit and flush services when they are due."""
        self._write_chunk()
        if self.sync:
            self._close_group()
        else:
            self._tick()

    def _close_group(self) -> None:
        uncommitted = self.appender.appended - self._savepoint.appended
        if uncommitted:
            self.appender.flush()
            self._savepoint = self.appender.savepoint()
            self.committed += uncommitted
            if self.on_commit is not None:
                self.on_commit()
        if not self._waiting:
            return
        if self.on_lines is not None:
            self._report_lines()
        elif self.uniq_keys:
            self._report_with_keys()
        else:
            for result in self._unreported.drain():
                self.on_result(result)  # type: ignore[misc]
                self.reported += 1
        self._waiting = 0
        if self.on_reported is not None:
            self.on_reported()

    def _report_lines(self) -> None:
        """Report the durable messages as the lines the log's records give, from where the
        last report ended to the end of what was flushed."""
        assert self.on_lines is not None
        expected = self.committed - self.reported
        start, end = self._report_from, self._savepoint.offset
        found = 0
        for block, count in self.appender.log.result_lines(start, end, self.lines_style):
            self.on_lines(block)
            found += count
            self.reported += count
        if found != expected:
            raise StoreFormatError(
                f"reading back the appended records from offset {start} to {end} found "
                f"{found}, not {expected}"
            )
        self._report_from = end

    def _report_with_keys(self) -> None:
        """Report the durable messages, _KEY_BATCH at a time with their UNIQ_KEYs read back
        from the log in one scan of the records they span."""
        pending: list[AppendResult] = []
        results = self._unreported.drain()
        while True:
            pending.extend(islice(results, _KEY_BATCH - len(pending)))
            if not pending:
                return
            first, last = pending[0], pending[-1]
            keys = self.appender.log.uniq_keys(
                first.physical_offset, last.physical_offset + last.store_size
            )
            for result in pending:
                self.on_result(result, keys.get(result.physical_offset))
                self.reported += 1
            pending.clear()

    def run_lines(
        self, lines: Iterable[tuple[int, bytes]], defaults: MessageDefaults, source: str
    ) -> int:
        """:meth:`run_line_blocks` of numbered lines."""
        return self.run_line_blocks(_blocks_of(lines), defaults, source)

    def run_line_blocks(
        self, blocks: Iterable[LineBlock], defaults: MessageDefaults, source: str
    ) -> int:
        """Append the messages of JSON lines (as :meth:`run` of
        :func:`messages_from_lines`, with the same errors), given as :func:`read_line_blocks`
        gives them: each block is parsed at once and turned into a batch's columns a chunk at
        a time, most without a :class:`Message` in between (see :class:`DocumentRows`). Blank
        lines are skipped."""
        if self.transform is not None:  # a transform takes messages
            lines = (
                (number, line)
                for first, block in blocks
                for number, line in enumerate(block, first)
                if line.strip()
            )
            return self.run(messages_from_lines(lines, defaults, source))
        self._documents = DocumentRows(defaults, self.appender.trailing_separator, source)

        def add_blocks() -> None:
            for first, block in blocks:
                self._add_block(first, block, source)

        return self._run(add_blocks)

    def _add_block(self, first: int, lines: list[bytes], source: str) -> None:
        """Parse a block of lines (all at once; line by line when one fails, to name it) and
        add the documents; a bad line raises after the lines before it are added."""
        try:
            documents = list(map(_loads, lines))
        except ValueError:  # a bad or blank line: (json or orjson).JSONDecodeError, Unicode...
            documents, numbers = [], []
            for number, line in enumerate(lines, first):
                if not line.strip():
                    continue
                try:
                    document = _loads(line)
                except ValueError as exc:
                    self._add_documents(documents, numbers)
                    raise InputError(f"{source} line {number}: not valid JSON ({exc})") from None
                documents.append(document)
                numbers.append(number)
            self._add_documents(documents, numbers)
            return
        self._add_documents(documents, range(first, first + len(lines)))

    def run(self, messages: Iterable[Message]) -> int:
        """Append everything; on failure roll back what is not durable yet and re-raise."""
        if self.transform is not None:
            messages = self.transform(messages)

        def add_messages() -> None:
            for message in messages:
                self.add(message)

        return self._run(add_messages)

    def _run(self, add_all: Callable[[], None]) -> int:
        try:
            add_all()
            self._write_chunk()
            self._close_group()
        except BaseException as exc:
            self._undo(exc)
            raise
        return self.committed

    def _undo(self, exc: BaseException) -> None:
        self._chunk.clear()
        undone = self.appender.appended - self._savepoint.appended
        rollback_failure = None
        if undone:
            try:
                self.appender.rollback(self._savepoint)
            except (RmqStoreError, OSError) as exc_rolling_back:  # the first error is the one
                rollback_failure = exc_rolling_back
        unreported = self.committed - self.reported
        self._unreported.clear()
        parts = []
        if self.reported:
            parts.append(f"{self.reported} messages were stored and reported")
        if unreported:
            parts.append(
                f"{unreported} more were stored durably but not reported (find them with "
                "rmqstore read)"
            )
        if undone and rollback_failure is None:
            parts.append(f"the {undone} unreported messages appended before it were rolled back")
        elif undone:
            parts.append(
                f"rolling back the {undone} unreported messages appended before it failed too "
                f"({failure_text(rollback_failure)}): the log may keep some of them"
                + (" after the reported ones" if self.reported else "")
            )
        if not self.committed and rollback_failure is None:
            parts.append("the store is unchanged")
        if self.appender.flush_failure is not None:
            parts.append(
                "'abort' stays and the checkpoint is not moved, so a broker's start checks the "
                "log's tail (crash recovery; or run rmqstore recover once the disk is mended)"
            )
        if isinstance(exc, RmqStoreError):
            exc.message = f"{exc.message} ({'; '.join(parts)})"
