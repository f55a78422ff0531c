"""Messages as columns, for :meth:`rmqstore.commitlog.CommitLogAppender.append_batch`: the
record kernel packs a whole batch into the commit log (``pack_records``), where ``append_many``
packs one :class:`~rmqstore.record.Message` at a time. Both write the same bytes.

A batch holds each message as a row of integers (:data:`rmqstore.kernel.layout.PACK_WIDTH`),
its body and encoded properties as spans of two buffers (so messages may share a body or a
property string), and the distinct topics and born hosts. Messages whose DELAY moves them to
SCHEDULE_TOPIC_XXXX do not go into batches: the appender's per-message path rewrites them.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from rmqstore.delay import check_scheduled_delay
from rmqstore.errors import InputError
from rmqstore.hosts import HostAddress
from rmqstore.kernel import layout
from rmqstore.properties import DELAY, UNIQ_KEY, encode_properties
from rmqstore.record import QUEUED_TRANSACTIONS, TRANSACTION_MASK, Message

_WIDTH = layout.PACK_WIDTH


class BatchUnsupported(InputError):
    """These messages need the per-message path (``append_many``)."""


@dataclass
class MessageBatch:
    """``count`` messages in columns (see the module). ``trailing_separator``: how the
    properties were encoded (5.x ends them with 0x02, 4.9.x does not), which must be the
    appender's own."""

    count: int
    rows: array  # PACK_WIDTH integers a message; PACK_NOW is the appender's to fill
    topics: list[str]
    hosts: list[HostAddress]
    bodies: bytes | bytearray
    body_spans: array
    props: bytes | bytearray
    prop_spans: array
    trailing_separator: bool
    longest_body: int = 0
    longest_props: int = 0
    queue_span: int = 1  # queue ids are below it

    @classmethod
    def from_messages(
        cls, messages: Sequence[Message], *, trailing_separator: bool
    ) -> MessageBatch:
        """The batch of ``messages`` (one Python step per message: for callers that have
        Message objects). Raises :class:`BatchUnsupported` for a DELAY message."""
        builder = BatchBuilder(trailing_separator=trailing_separator)
        for message in messages:
            builder.add(message)
        return builder.build()


@dataclass
class BatchBuilder:
    """Collects messages into a :class:`MessageBatch`, sharing equal bodies and property
    strings between neighbours."""

    trailing_separator: bool
    rows: array = field(default_factory=lambda: array("q"))
    topics: dict[str, int] = field(default_factory=dict)
    hosts: dict[HostAddress, int] = field(default_factory=dict)
    bodies: bytearray = field(default_factory=bytearray)
    body_spans: array = field(default_factory=lambda: array("q"))
    props: bytearray = field(default_factory=bytearray)
    prop_spans: array = field(default_factory=lambda: array("q"))
    longest_body: int = 0
    longest_props: int = 0
    queue_span: int = 1
    _last_body: bytes | None = None
    _last_properties: dict[str, str] | None = None
    _last_encoded: bytes | None = None  # the property string the last message added

    def add(self, message: Message) -> None:
        properties = message.properties
        queued = message.sys_flag & TRANSACTION_MASK in QUEUED_TRANSACTIONS
        if DELAY in properties and queued:
            raise BatchUnsupported("a DELAY message is moved to SCHEDULE_TOPIC_XXXX one by one")
        check_scheduled_delay(message.topic, properties)
        if message.queue_id < 0:
            raise InputError(f"queue id {message.queue_id} is negative")
        if properties != self._last_properties:
            self._encoded = encode_properties(
                properties, trailing_separator=self.trailing_separator
            )
            self._last_properties = dict(properties)
            self._encoded_needs_key = UNIQ_KEY not in properties
        self.add_encoded(
            message.topic,
            message.queue_id,
            message.body or b"",
            self._encoded,
            self._encoded_needs_key,
            message.flag,
            message.sys_flag,
            message.born_timestamp,
            message.born_host,
            message.reconsume_times,
            message.prepared_transaction_offset,
        )

    def add_encoded(
        self,
        topic: str,
        queue_id: int,
        body: bytes,
        properties: bytes,
        needs_key: bool,
        flag: int,
        sys_flag: int,
        born_timestamp: int,
        born_host: HostAddress,
        reconsume_times: int,
        prepared_transaction_offset: int,
    ) -> None:
        """A message given by its fields, its properties already encoded (with this batch's
        ``trailing_separator``; ``needs_key``: they hold no UNIQ_KEY, the appender adds one).
        The caller has checked what :meth:`add` checks: no DELAY, a queue id of 0 or more."""
        topic_id = self.topics.setdefault(topic, len(self.topics))
        host = self.hosts.setdefault(born_host, len(self.hosts))
        if body is not self._last_body:
            self._body_at = len(self.bodies)
            self.bodies += body
            self._last_body = body
            self.longest_body = max(self.longest_body, len(body))
        self.body_spans.extend((self._body_at, len(body)))
        if properties is not self._last_encoded:
            self._props_at = len(self.props)
            self.props += properties
            self._last_encoded = properties
            self.longest_props = max(self.longest_props, len(properties))
        self.prop_spans.extend((self._props_at, len(properties)))
        if queue_id >= self.queue_span:
            self.queue_span = queue_id + 1
        self.rows.extend(
            (
                topic_id,
                queue_id,
                flag,
                sys_flag,
                born_timestamp,
                host,
                reconsume_times,
                prepared_transaction_offset,
                0,  # PACK_NOW: the appender's
                1 if needs_key else 0,
            )
        )

    def build(self) -> MessageBatch:
        return MessageBatch(
            count=len(self.rows) // _WIDTH,
            rows=self.rows,
            topics=list(self.topics),
            hosts=list(self.hosts),
            bodies=self.bodies,
            body_spans=self.body_spans,
            props=self.props,
            prop_spans=self.prop_spans,
            trailing_separator=self.trailing_separator,
            longest_body=self.longest_body,
            longest_props=self.longest_props,
            queue_span=self.queue_span,
        )


def uniform_batch(
    *,
    topic: str,
    body: bytes,
    properties: dict[str, str],
    queue_ids: Iterable[int],
    born_host: HostAddress,
    born_timestamp: int,
    trailing_separator: bool,
) -> MessageBatch:
    """Messages that differ only in their queue: one topic, body, property string and born
    host (a benchmark or fixture load), built without a Python step per message."""
    queues = array("q", queue_ids)
    count = len(queues)
    if count and min(queues) < 0:
        raise InputError("queue ids are not negative")
    encoded = encode_properties(properties, trailing_separator=trailing_separator)
    row = array("q", (0, 0, 0, 0, born_timestamp, 0, 0, 0, 0, 0 if UNIQ_KEY in properties else 1))
    rows = row * count
    rows[layout.PACK_QUEUE_ID :: _WIDTH] = queues
    return MessageBatch(
        count=count,
        rows=rows,
        topics=[topic],
        hosts=[born_host],
        bodies=body,
        body_spans=array("q", (0, len(body))) * count,
        props=encoded,
        prop_spans=array("q", (0, len(encoded))) * count,
        trailing_separator=trailing_separator,
        longest_body=len(body),
        longest_props=len(encoded),
        queue_span=(max(queues) + 1) if count else 1,
    )
