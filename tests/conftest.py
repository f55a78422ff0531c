from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from kernel_corpus import scenario_workdir, seed_files
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


@pytest.fixture(scope="session")
def seeds() -> list[tuple[str, bytes, int]]:
    """The kernel corpus's seed files (every real-broker and fixture commit-log file), built
    once per session for the differential tests of the kernel and the pipeline's columns."""
    with scenario_workdir() as workdir:
        return seed_files(Path(workdir))
