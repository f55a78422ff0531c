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
