"""Message ids (spec §4): the broker's offset message id and the producer's UNIQ_KEY."""

from __future__ import annotations

import os
import string
import time
from collections.abc import Callable
from typing import NamedTuple

from rmqstore.errors import InputError
from rmqstore.hosts import HostAddress
from rmqstore.wording import quoted

_IPV4_ID_LEN = 32  # hex chars: 4 address + 4 port + 8 offset bytes
_IPV6_ID_LEN = 56  # hex chars: 16 address + 4 port + 8 offset bytes


def offset_msg_id(store_host: HostAddress, physical_offset: int) -> str:
    """``hex(store address ‖ port ‖ commit-log offset)``, upper case, no separators."""
    return (store_host.to_field() + physical_offset.to_bytes(8, "big", signed=True)).hex().upper()


# the characters of a message id or UNIQ_KEY (bytes.fromhex would also pass over spaces)
HEX_DIGITS = frozenset(string.hexdigits)


def decode_offset_msg_id(msg_id: str) -> tuple[HostAddress, int]:
    """Return the store host and commit-log offset named by an offset message id."""
    text = msg_id.strip()
    if len(text) not in (_IPV4_ID_LEN, _IPV6_ID_LEN):
        raise InputError(
            f"bad message id {quoted(msg_id)}: an offset message id has 32 (IPv4) or 56 (IPv6) hex "
            "digits; a UNIQ_KEY is found with --uniq-key instead"
        )
    if not HEX_DIGITS.issuperset(text):
        raise InputError(f"bad message id {quoted(msg_id)}: not hexadecimal")
    raw = bytes.fromhex(text)
    host = HostAddress.from_field(raw[:-8])
    return host, int.from_bytes(raw[-8:], "big", signed=True)


class UniqKeyInfo(NamedTuple):
    """What a producer-generated UNIQ_KEY encodes (the month itself is not stored)."""

    ip: str
    pid: int
    class_loader_hash: int
    millis_since_month_start: int
    counter: int


def decode_uniq_key(uniq_key: str) -> UniqKeyInfo:
    text = uniq_key.strip()
    if len(text) not in (_IPV4_ID_LEN, _IPV6_ID_LEN):
        raise InputError(f"bad UNIQ_KEY {quoted(uniq_key)}: expected 32 or 56 hex digits")
    if not HEX_DIGITS.issuperset(text):
        raise InputError(f"bad UNIQ_KEY {quoted(uniq_key)}: not hexadecimal")
    raw = bytes.fromhex(text)
    address_length = len(raw) - 12
    ip = str(HostAddress(raw[:address_length], 0)).rsplit(":", 1)[0].strip("[]")
    tail = raw[address_length:]
    return UniqKeyInfo(
        ip=ip,
        pid=int.from_bytes(tail[0:2], "big"),
        class_loader_hash=int.from_bytes(tail[2:6], "big", signed=True),
        millis_since_month_start=int.from_bytes(tail[6:10], "big", signed=True),
        counter=int.from_bytes(tail[10:12], "big"),
    )


def _start_of_month_millis(now_millis: int) -> tuple[int, int]:
    """Start of the local month containing ``now_millis`` and of the next month, epoch ms."""
    local = time.localtime(now_millis / 1000)
    start = time.mktime((local.tm_year, local.tm_mon, 1, 0, 0, 0, 0, 0, -1))
    # month 13 is January of the next year to mktime (calendar cost every command 3 ms)
    following = time.mktime((local.tm_year, local.tm_mon + 1, 1, 0, 0, 0, 0, 0, -1))
    return int(start * 1000), int(following * 1000)


class UniqKeyGenerator:
    """Generates UNIQ_KEYs laid out like ``MessageClientIDSetter``: ip, pid, class-loader hash,
    milliseconds since the start of the month, counter. Deterministic when given all inputs."""

    def __init__(
        self,
        ip: bytes = b"\x7f\x00\x00\x01",
        pid: int | None = None,
        class_loader_hash: int | None = None,
        clock: Callable[[], int] | None = None,
        first_counter: int = 0,
    ) -> None:
        pid = os.getpid() if pid is None else pid
        loader = (
            int.from_bytes(os.urandom(4), "big") if class_loader_hash is None else class_loader_hash
        )
        self._prefix = (
            (ip + (pid & 0xFFFF).to_bytes(2, "big") + (loader & 0xFFFFFFFF).to_bytes(4, "big"))
            .hex()
            .upper()
        )
        self._clock = clock or (lambda: time.time_ns() // 1_000_000)
        self._counter = first_counter & 0xFFFF
        self._month_start = 0
        self._next_month_start = 0
        self._stem_millis = -1
        self._stem = b""  # prefix + millis hex of the current millisecond, ASCII

    def batch_state(self, now_millis: int) -> tuple[bytes, int, int, int]:
        """For a generator of keys elsewhere (the record kernel): the ASCII prefix (ip, pid,
        class-loader hash), the next counter, and the start of the month holding
        ``now_millis`` and of the next one. :meth:`resume` takes the counter back."""
        if not self._month_start <= now_millis < self._next_month_start:
            self._month_start, self._next_month_start = _start_of_month_millis(now_millis)
            self._stem_millis = -1
        return (
            self._prefix.encode("ascii"),
            self._counter,
            self._month_start,
            self._next_month_start,
        )

    @property
    def key_length(self) -> int:
        """How long the keys are (hex digits)."""
        return len(self._prefix) + 12

    def resume(self, counter: int) -> None:
        """Continue from ``counter`` (after keys were generated elsewhere)."""
        self._counter = counter & 0xFFFF

    def next_key(self, now_millis: int | None = None) -> str:
        """The next key; ``now_millis`` saves a clock read when the caller has the time."""
        return self.next_key_ascii(now_millis).decode("ascii")

    def next_key_ascii(self, now_millis: int | None = None) -> bytes:
        """:meth:`next_key` as ASCII bytes, as a record stores it."""
        now = self._clock() if now_millis is None else now_millis
        if now != self._stem_millis:
            if not self._month_start <= now < self._next_month_start:
                self._month_start, self._next_month_start = _start_of_month_millis(now)
            millis = (now - self._month_start) & 0xFFFFFFFF
            self._stem = f"{self._prefix}{millis:08X}".encode("ascii")
            self._stem_millis = now
        counter = self._counter
        self._counter = (counter + 1) & 0xFFFF
        return self._stem + _HEX_BYTES[counter >> 8] + _HEX_BYTES[counter & 0xFF]


_HEX_BYTES = tuple(b"%02X" % value for value in range(256))
