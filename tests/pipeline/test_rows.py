"""rmqstore.pipeline.rows: the consume-queue source's units taken out of a chunk at once."""

from __future__ import annotations

import random
import struct
from array import array

from rmqstore.pipeline.rows import _unit_fields

UNIT = struct.Struct(">qiq")


def test_unit_fields_are_the_units_big_endian_values() -> None:
    """Offsets, sizes and tagsCodes read a fifth of the 32-bit words at a time give what
    unpacking each unit gives: every sign, both ends of a long and an int, and random bytes
    (the count may stop before the data's end)."""
    chooser = random.Random(20261127)
    longs = [0, 1, -1, 2**31 - 1, -(2**31), 2**32 - 1, 2**32, 2**63 - 1, -(2**63)]
    units = [(edge, 100, ~edge) for edge in longs]  # (~edge: the other end, also a long)
    units += [(7, edge, 7) for edge in (0, 1, -1, 2**31 - 1, -(2**31))]
    data = b"".join(UNIT.pack(*unit) for unit in units)
    data += bytes(chooser.getrandbits(8) for _ in range(20 * 500))
    for count in (0, 1, len(units), len(data) // 20 - 3, len(data) // 20):
        offsets, sizes, codes = (array(code) for code in "qiq")
        for values, words in zip((offsets, sizes, codes), _unit_fields(data, count), strict=True):
            values.frombytes(words.tobytes())
        expected = list(UNIT.iter_unpack(data[: count * 20]))
        assert list(zip(offsets, sizes, codes, strict=True)) == expected
