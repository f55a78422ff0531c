"""The append job's bookkeeping: results held back until they may be reported."""

from __future__ import annotations

import pytest

from rmqstore.batch import ResultSpool
from rmqstore.commitlog import AppendResult


def results(count: int, start: int = 0) -> list[AppendResult]:
    host = bytes([127, 0, 0, 1, 0, 0, 0x2A, 0x9F])
    return [
        AppendResult(n * 100, n, 100, 1_700_000_000_000 + n, f"T{n % 3}", n % 4, host)
        for n in range(start, start + count)
    ]


@pytest.mark.parametrize("kept_in_list", [1_000_000, 5])
def test_the_spool_gives_back_what_it_was_given_in_order(
    kept_in_list: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whether the results stay in a list or spill to the temporary file past the limit."""
    monkeypatch.setattr(ResultSpool, "_IN_LIST", kept_in_list)
    spool = ResultSpool()
    given = results(7) + results(20, start=7)
    spool.extend(given[:7])
    spool.extend(given[7:])
    assert len(spool) == 27
    assert list(spool.drain()) == given
    assert len(spool) == 0
    spool.extend(results(3))
    spool.clear()
    assert len(spool) == 0 and list(spool.drain()) == []


# -- JSON lines into batches: the document lane against the Message lane ------------------------

LINES = [
    '{"topic": "T", "body": "plain"}',
    '{"topic": "T", "body": "tagged", "tags": "A", "queueId": 3}',
    '{"topic": "U", "body": "keyed", "tags": "A", "keys": "k1 k2", "queueId": 1}',
    '{"body": "the default topic"}',
    '{"topic": "T", "body": "", "tags": ""}',
    '{"topic": "T", "body": "caf\\u00e9 \\u4e2d", "tags": "\\u00e9t\\u00e9", "keys": "cl\\u00e9"}',
    '{"topic": "T", "body": "props", "properties": {"p": "v", "TAGS": "P"}}',
    '{"topic": "T", "bodyBase64": "AAEC", "flag": 7, "bornTimestamp": 123}',
    '{"topic": "T", "body": "null tags", "tags": null, "queueId": null}',
    '{"topic": "T", "body": "txn", "transaction": "prepared"}',
    '{"topic": "T", "body": "host", "bornHost": "10.0.0.1:9", "reconsumeTimes": 2}',
    '{"topic": "T", "body": "again", "tags": "A", "queueId": 3}',
]


def _append_lines(root, lines: list[str], defaults, documents: bool) -> bytes:  # type: ignore[no-untyped-def]
    from rmqstore.batch import AppendJob, messages_from_lines
    from rmqstore.config import StoreConfig
    from rmqstore.msgid import UniqKeyGenerator
    from rmqstore.store import Store

    with Store.open_write(root, StoreConfig(commitlog_file_size=1 << 20), create=True) as store:
        ticks = iter(range(1_700_000_000_000, 1_800_000_000_000))
        keys = UniqKeyGenerator(bytes(4), pid=1, class_loader_hash=2, clock=lambda: 3)
        appender = store.appender(clock=lambda: next(ticks), uniq_keys=keys)
        job = AppendJob(appender, on_result=lambda *_: None)
        numbered = [(n, line.encode()) for n, line in enumerate(lines, 1)]
        if documents:
            job.run_lines(numbered, defaults, "in")
        else:
            job.run(messages_from_lines(numbered, defaults, "in"))
    return b"".join(path.read_bytes() for path in sorted((root / "commitlog").iterdir()))


@pytest.mark.parametrize(
    "given",
    [
        {"topic": "D", "born_timestamp": 5},
        {"topic": "D", "born_timestamp": 5, "tags": "DT", "keys": "dk", "queue_id": 2},
        {"topic": "D", "born_timestamp": 5, "properties": {"CLUSTER": "c", "UNIQ_KEY": "u"}},
        {"topic": "D", "born_timestamp": 5, "transaction": "commit", "flag": 9},
    ],
)
def test_json_lines_give_the_same_records_through_either_lane(tmp_path, given) -> None:  # type: ignore[no-untyped-def]
    from rmqstore.batch import MessageDefaults

    defaults = MessageDefaults(**given)
    by_documents = _append_lines(tmp_path / "documents", LINES * 30, defaults, True)
    by_messages = _append_lines(tmp_path / "messages", LINES * 30, defaults, False)
    assert by_documents.rstrip(b"\0") == by_messages.rstrip(b"\0")
    assert len(by_documents.rstrip(b"\0")) > 20_000


@pytest.mark.parametrize(
    "line",
    [
        '{"topic": 5, "body": "x"}',
        '{"topic": "", "body": "x"}',
        '{"topic": "T", "body": null}',
        '{"topic": "T", "body": "x", "queueId": -1}',
        '{"topic": "T", "body": "x", "queueId": true}',
        '{"topic": "T", "body": "x", "queueId": 4294967296}',
        '{"topic": "T", "body": "x", "tags": 3}',
        '{"topic": "T", "body": "x", "nope": 1}',
        '["not", "an", "object"]',
        "{not json",
    ],
)
def test_a_bad_line_fails_alike_in_either_lane(tmp_path, line: str) -> None:  # type: ignore[no-untyped-def]
    from rmqstore.batch import MessageDefaults
    from rmqstore.errors import InputError

    defaults = MessageDefaults(born_timestamp=5)
    lines = ['{"topic": "T", "body": "fine"}', line]
    errors = []
    for documents in (True, False):
        with pytest.raises(InputError) as caught:
            _append_lines(tmp_path / str(documents), lines, defaults, documents)
        errors.append(str(caught.value))
    assert errors[0] == errors[1] and "in line 2" in errors[0]
