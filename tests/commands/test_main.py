"""The console-script entry point itself (``rmqstore.commands.main:main``), in a process of
its own."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# runs the entry point as the console script does, then says what the environment held
_ENTRY = """
import os, sys
from rmqstore.commands.main import main
sys.argv = ["rmqstore", "--version"]
try:
    main()
except SystemExit:
    pass
print(os.environ.get("OPENBLAS_NUM_THREADS"))
"""


@pytest.mark.parametrize(("given", "expected"), [(None, "1"), ("4", "4")])
def test_entry_point_keeps_openblas_to_one_thread_unless_told(
    given: str | None, expected: str
) -> None:
    environment = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if given is not None:
        environment["OPENBLAS_NUM_THREADS"] = given
    shown = subprocess.run(
        [sys.executable, "-c", _ENTRY],
        capture_output=True,
        text=True,
        check=True,
        env=environment,
    ).stdout.splitlines()
    assert shown[0].startswith("rmqstore")
    assert shown[-1] == expected
