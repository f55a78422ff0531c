from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from support import ORACLE_STORES, Oracle, extract_oracle


@pytest.fixture(scope="session")
def oracle_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("oracle")


@pytest.fixture(scope="session")
def oracle(oracle_dir: Path) -> Callable[[str], Oracle]:
    """``oracle(name)``: a real-broker store, extracted once per session. Never modify it;
    copy it first (``Oracle.copy_to``)."""

    def load(name: str) -> Oracle:
        assert name in ORACLE_STORES, name
        return extract_oracle(name, oracle_dir)

    return load
