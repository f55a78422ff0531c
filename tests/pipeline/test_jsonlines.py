"""An export's JSON lines, made a column at a time by Arrow, against the same lines made a
row at a time by ``json.dumps`` (the writer they replace, kept here as the reference): on
hostile values and slices of them, and on whole exports of real-broker stores and fixtures."""

from __future__ import annotations

import base64
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

pa = pytest.importorskip("pyarrow")

import rmqstore.pipeline.local as local  # noqa: E402
from rmqstore.fixtures import generate  # noqa: E402
from rmqstore.pipeline.jsonlines import jsonl_text  # noqa: E402

from support import ORACLE_STORES, compiled_pass_only, run_cli  # noqa: E402


def reference_lines(batch: Any) -> bytes:
    """One ``json.dumps`` per row (the writer before jsonlines)."""
    lines = []
    for row in batch.to_pylist():
        document = {}
        for name, value in row.items():
            if value is None:
                pass
            elif isinstance(value, bytes):  # the body, or any binary column
                value = base64.b64encode(value).decode("ascii")
            elif name == "properties":
                value = dict(value)
            elif isinstance(value, datetime):
                value = value.isoformat(timespec="milliseconds").replace("+00:00", "Z")
            document[name] = value
        lines.append(json.dumps(document, ensure_ascii=False, separators=(",", ":")))
    return ("\n".join(lines) + "\n").encode("utf-8") if lines else b""


HOSTILE_TEXTS = [
    "TopicTest",
    "",
    None,
    'a "quoted" \\ back\\slash',
    "\x00\x01\x08\t\n\x0b\x0c\r\x1f end",
    "\x7f del, \u2028 line and \u2029 paragraph separators",
    "ünïcödé 中文 emoji 😀",
    "/ slash",
]
HOSTILE_PROPERTIES = [
    [("TAGS", "TagA"), ("KEYS", "k1 k2"), ("UNIQ_KEY", "0A00")],
    [],
    None,
    [('"k"', "v\\1"), ("\n", "\x00"), ("é", "😀")],
    [("a", "1"), ("b", "2"), ("a", "3")],  # a key given twice: where first, the last value
    [("only", None)],
]
MILLIS = [
    1_700_086_400_123,
    0,
    -1,
    None,
    253_402_300_799_999,  # 9999-12-31T23:59:59.999
    -62_135_596_800_000,  # 0001-01-01: a year datetime writes with leading zeros
    -30_610_224_000_001,  # the last millisecond before the year 1000
]


def hostile_batch(rows: int, *, repeated_keys: bool = True) -> Any:
    def cycle(values: list[Any]) -> list[Any]:
        return [values[number % len(values)] for number in range(rows)]

    properties = [p for p in HOSTILE_PROPERTIES if repeated_keys or p is None or len(p) < 3]
    times = [None if m is None else m * 1000 for m in MILLIS]
    return pa.RecordBatch.from_arrays(
        [
            pa.array(cycle(HOSTILE_TEXTS), pa.string()),
            pa.array(cycle([0, -1, 2**31 - 1, None]), pa.int32()),
            pa.array(cycle([2**63 - 1, -(2**63), 0, None]), pa.int64()),
            pa.array(cycle([b"", None, b"\x00\xff binary", b"x" * 1000]), pa.binary()),
            pa.array(cycle(properties), pa.map_(pa.string(), pa.string())),
            pa.array(cycle([True, False, None]), pa.bool_()),
            pa.array(cycle(times), pa.timestamp("us", tz="UTC")),
        ],
        names=["topic", "queueId", "queueOffset", "body", "properties", "crcOk", "storeTime"],
    )


@pytest.mark.parametrize("repeated_keys", [True, False])
def test_hostile_values_and_slices_are_written_as_json_dumps_writes_them(
    repeated_keys: bool,
) -> None:
    batch = hostile_batch(97, repeated_keys=repeated_keys)
    assert bytes(jsonl_text(pa, batch)) == reference_lines(batch)
    for start, length in [(0, 1), (3, 5), (11, 40), (96, 1), (50, 47), (5, 0)]:
        part = batch.slice(start, length)  # a map column's offsets then point into the whole
        assert bytes(jsonl_text(pa, part)) == reference_lines(part), (start, length)
    lines = bytes(jsonl_text(pa, batch)).decode("utf-8").split("\n")[:-1]  # U+2028 stays
    assert len(lines) == 97 and all(isinstance(json.loads(line), dict) for line in lines)


def test_the_kernels_join_writes_what_arrows_join_writes(monkeypatch) -> None:
    """Columns with no null, which the compiled kernel writes itself (a body in base64, a
    32- or 64-bit integer in decimal, text as it is, 32- and 64-bit offsets), whole and
    sliced: the same bytes as Arrow's join (the pure-Python kernel's path) and as json.dumps."""
    rows = 61

    def cycle(values: list[Any]) -> list[Any]:
        return [values[number % len(values)] for number in range(rows)]

    texts = [text for text in HOSTILE_TEXTS if text is not None]
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array(cycle(texts), pa.string()),
            pa.array(cycle(texts[::-1]), pa.large_string()),
            pa.array(cycle([0, -1, 7, 2**31 - 1, -(2**31), 10, 99]), pa.int32()),
            pa.array(cycle([2**63 - 1, -(2**63), 0, 1000, -(10**18)]), pa.int64()),
            pa.array(cycle([b"", b"\x00", b"ab", b"abc", b"\xff" * 1000]), pa.binary()),
            pa.array(cycle([b"x" * n for n in range(5)]), pa.large_binary()),
            pa.array(
                cycle([p for p in HOSTILE_PROPERTIES if p is not None]),
                pa.map_(pa.string(), pa.string()),
            ),
        ],
        names=["topic", "keys", "queueId", "queueOffset", "body", "other", "properties"],
    )
    parts = [batch, *(batch.slice(at, length) for at, length in [(0, 1), (3, 17), (60, 1), (9, 0)])]
    written = [bytes(jsonl_text(pa, part)) for part in parts]
    monkeypatch.setattr("rmqstore.kernel.NAME", "python")  # Arrow joins, base64 in Python
    assert written == [bytes(jsonl_text(pa, part)) for part in parts]
    assert written == [reference_lines(part) for part in parts]


def test_columns_all_null_or_in_the_usual_years_only() -> None:
    nulls = pa.RecordBatch.from_arrays(
        [
            pa.nulls(4, pa.string()),
            pa.nulls(4, pa.binary()),
            pa.nulls(4, pa.map_(pa.string(), pa.string())),
            pa.nulls(4, pa.timestamp("us", tz="UTC")),
        ],
        names=["topic", "body", "properties", "bornTime"],
    )
    assert bytes(jsonl_text(pa, nulls)) == reference_lines(nulls)
    usual = pa.RecordBatch.from_arrays(
        [
            pa.array(
                [1_700_086_400_000_000, 86_399_999_000, -1000, None], pa.timestamp("us", tz="UTC")
            )
        ],
        names=["storeTime"],
    )
    assert bytes(jsonl_text(pa, usual)) == reference_lines(usual)
    assert b'"1969-12-31T23:59:59.999Z"' in bytes(jsonl_text(pa, usual))


def _reference_writer(stream: Any, batches: Any) -> int:
    count = 0
    for batch in batches:
        stream.write(reference_lines(batch))
        count += batch.num_rows
    return count


def _export(store: Path, out: Path, *options: str) -> list[tuple[str, bytes]]:
    result = run_cli("export", store, "--to", out, "--format", "jsonl", *options)
    assert result.exit_code == 0, result.stderr
    return [(path.name, path.read_bytes()) for path in sorted(out.iterdir())]


@compiled_pass_only  # real-broker stores and fixture scenarios: kernel corpus seeds
@pytest.mark.parametrize(
    "name", [*ORACLE_STORES, "multi", "txn", "delay", "lmq", "v2", "torn-tail", "garbage-after-end"]
)
def test_exports_of_real_stores_and_fixtures_are_the_reference_writers_bytes(
    tmp_path: Path, oracle: Any, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if name in ORACLE_STORES:
        store = oracle(name).store
    else:
        store = tmp_path / "store"
        generate(name, store)
    for options in ([], ["--split-size", "9000", "--decompress"]):
        written = _export(store, tmp_path / f"new{len(options)}", *options)
        with monkeypatch.context() as patched:
            patched.setitem(local._WRITERS, "jsonl", _reference_writer)
            patched.setattr(local, "_write_jsonl", _reference_writer)
            expected = _export(store, tmp_path / f"reference{len(options)}", *options)
        assert written and written == expected
