"""Host text: what --born-host, --store-host, brokerIP1 and Java's forms parse to."""

from __future__ import annotations

import pytest

from rmqstore.errors import InputError
from rmqstore.hosts import HostAddress, parse_host


@pytest.mark.parametrize(
    ("text", "address", "port"),
    [
        ("1.2.3.4:10911", "01020304", 10911),
        ("/1.2.3.4:10911", "01020304", 10911),  # InetSocketAddress.toString
        ("[2001:db8::1]:0", "20010db8000000000000000000000001", 0),
        ("2001:db8:0:0:0:0:0:1:65535", "20010db8000000000000000000000001", 65535),
    ],
)
def test_host_forms(text: str, address: str, port: int) -> None:
    assert parse_host(text) == HostAddress(bytes.fromhex(address), port)


@pytest.mark.parametrize(
    "text",
    ["1.2.3.4", "1.2.3.4:", "1.2.3.4:65536", "1.2.3.4:1_0", "1.2.3.4:+1", "1.2.3.4:٣", "a:1"],
)
def test_bad_hosts_are_input_errors(text: str) -> None:
    """A port is ASCII digits only (``int()`` took ``1_0`` as 10 and ``٣`` as 3)."""
    with pytest.raises(InputError, match="bad host"):
        parse_host(text)
