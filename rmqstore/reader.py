"""Message lookups over a store, the engine side of ``rmqstore read``."""

from __future__ import annotations

from collections.abc import Iterator

from rmqstore.commitlog import LogEnd
from rmqstore.errors import NotFoundError, RecordError
from rmqstore.msgid import decode_offset_msg_id
from rmqstore.record import BodyMode, Message, ScanStop
from rmqstore.store import Store


class MessageReader:
    """Reads messages by physical offset, offset message id or sequentially. ``notes``
    collects things worth telling the user (for example an id naming another broker)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.notes: list[str] = []
        self._end: LogEnd | None = None

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
        if recovery_start is not None and segment.start >= recovery_start.start:
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

    def by_msg_id(self, msg_id: str, *, body: BodyMode = BodyMode.READ) -> Message:
        host, offset = decode_offset_msg_id(msg_id)
        message = self.by_offset(offset, body=body)
        if message.store_host != host:
            self.notes.append(
                f"message id {msg_id} names broker {host}, but the record at "
                f"offset {offset} was stored by {message.store_host}"
            )
        return message

    def sequential(
        self, start_offset: int, count: int | None = None, *, body: BodyMode = BodyMode.READ
    ) -> Iterator[Message]:
        """Messages from the record starting at ``start_offset`` to the end of the log (or
        ``count`` of them), crossing files over BLANK records."""
        log = self.store.commitlog
        if log.queue.find(start_offset) is None:
            raise NotFoundError(f"offset {start_offset} is outside the commit-log files")
        scan = log.scan(start_offset)
        produced = 0
        for item in scan:
            yield log.read(item[0], body=body)
            produced += 1
            if count is not None and produced >= count:
                return
        if scan.stop is ScanStop.INVALID and scan.error is not None:
            if not produced and scan.end_offset == start_offset:
                raise NotFoundError(
                    f"no message starts at offset {start_offset}: "
                    f"{scan.error.field} {scan.error.reason}"
                )
            self.notes.append(f"the log ends with invalid bytes: {scan.error}")
