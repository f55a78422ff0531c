"""Born/store host fields: raw address bytes (4 for IPv4, 16 for IPv6) and a port int."""

from __future__ import annotations

import ipaddress
from typing import NamedTuple

from rmqstore.errors import InputError
from rmqstore.wording import quoted


class HostAddress(NamedTuple):
    address: bytes
    port: int

    @property
    def is_ipv6(self) -> bool:
        return len(self.address) == 16

    def __str__(self) -> str:
        text = _HOST_TEXT.get(self)
        if text is None:  # a store holds few hosts: each is formatted once
            if len(_HOST_TEXT) >= _MOST_HOST_TEXTS:
                _HOST_TEXT.clear()
            if self.is_ipv6:
                text = f"[{ipaddress.IPv6Address(self.address)}]:{self.port}"
            else:
                text = f"{ipaddress.IPv4Address(self.address)}:{self.port}"
            _HOST_TEXT[self] = text
        return text

    def to_field(self) -> bytes:
        """The record field: address bytes followed by the port as a big-endian int."""
        return self.address + (self.port & 0xFFFFFFFF).to_bytes(4, "big")

    @classmethod
    def from_field(cls, field: bytes) -> HostAddress:
        port = int.from_bytes(field[-4:], "big", signed=True)
        return cls(bytes(field[:-4]), port)


_HOST_TEXT: dict[HostAddress, str] = {}  # host -> its text (str of HostAddress)
_MOST_HOST_TEXTS = 4096

LOOPBACK = b"\x7f\x00\x00\x01"
DEFAULT_BORN_HOST = HostAddress(LOOPBACK, 0)
DEFAULT_STORE_HOST = HostAddress(LOOPBACK, 10911)  # the broker's default listenPort


def parse_host(text: str) -> HostAddress:
    """Parse ``1.2.3.4:10911``, ``[2001:db8::1]:10911`` or Java's forms (``/1.2.3.4:10911``,
    ``2001:db8:0:0:0:0:0:1:10911``)."""
    raw = text.strip().lstrip("/")
    try:
        if raw.startswith("["):
            host, _, port = raw[1:].partition("]:")
        else:
            host, _, port = raw.rpartition(":")
        if not host or not port:
            raise ValueError("expected HOST:PORT")
        address = ipaddress.ip_address(host)
        if not (port.isascii() and port.isdigit()):  # int() would take " 1", "1_0", "٣"
            raise ValueError(f"port {quoted(port)} is not a number")
        port_number = int(port)
    except ValueError as exc:
        raise InputError(f"bad host {quoted(text)}: {exc}") from None
    if not 0 <= port_number <= 65535:
        raise InputError(f"bad host {quoted(text)}: port {port_number} is outside 0-65535")
    return HostAddress(address.packed, port_number)


def split_host_port(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (a name or an address; ``[v6]:PORT`` for IPv6) as (host, port), for a
    socket to listen on or connect to."""
    raw = text.strip()
    if raw.startswith("["):
        host, _, port = raw[1:].partition("]:")
    else:
        host, _, port = raw.rpartition(":")
    if not host or not (port.isascii() and port.isdigit()) or not 0 <= int(port) <= 65535:
        raise InputError(f"bad address {quoted(text)}: expected HOST:PORT")
    return host, int(port)
