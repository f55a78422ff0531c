"""What ``read`` prints of a message, as a JSON-ready document: the fields under RocketMQ's
names (:meth:`rmqstore.record.Message.fields`) and the body in one of the body modes. The
CLI renders these; the record kernel's ``message_lines`` writes the same documents as JSON
lines straight from scanned records."""

from __future__ import annotations

import base64

from rmqstore.record import Message


def encode_body(body: bytes | None, mode: str) -> tuple[str | None, str | None]:
    """The body as (value, encoding) for JSON and tables; ``auto`` is text when the bytes are
    valid UTF-8, else base64."""
    if body is None or mode == "none":
        return None, None
    if mode in ("auto", "text"):
        try:
            return body.decode("utf-8"), "text"
        except UnicodeDecodeError:
            if mode == "text":
                return body.decode("utf-8", "replace"), "text-lossy"
    if mode == "hex":
        return body.hex().upper(), "hex"
    return base64.b64encode(body).decode("ascii"), "base64"


def message_document(message: Message, body_mode: str, body: bytes | None = None) -> dict:
    """A message under RocketMQ's field names plus ``body``/``bodyEncoding``."""
    document = message.fields()
    value, encoding = encode_body(message.body if body is None else body, body_mode)
    if encoding is not None:
        document["body"] = value
        document["bodyEncoding"] = encoding
    return document
