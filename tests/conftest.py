from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

import rmqstore.fixtures

from kernel_corpus import scenario_workdir, seed_files
from support import ORACLE_STORES, GeneratedStores, Oracle, extract_oracle, generate_each_time

_MADE = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    """Tests that import ``generate`` from rmqstore.fixtures get it through a session cache
    of made stores (see support.GeneratedStores; the commands keep their own reference)."""
    directory = Path(tempfile.mkdtemp(prefix="rmqstore-made-stores-"))
    config.stash[_MADE] = directory
    rmqstore.fixtures.generate = GeneratedStores(generate_each_time, directory)  # type: ignore[assignment]


def pytest_unconfigure(config: pytest.Config) -> None:
    rmqstore.fixtures.generate = generate_each_time  # type: ignore[assignment]
    directory = config.stash.get(_MADE, None)
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)


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
