"""A short pass of the sanitizer fuzz run (``make fuzz-native`` runs 100,000 inputs): the
compiled kernel built with AddressSanitizer and UndefinedBehaviorSanitizer scans every seed
file and mutations of them with no finding and no divergence from the reference."""

from __future__ import annotations

import os
import shutil

import pytest

import kernel_fuzz


@pytest.mark.long
@pytest.mark.slow
def test_sanitized_kernel_short_pass() -> None:
    if os.environ.get("RMQSTORE_KERNEL") == "python":
        pytest.skip("the reference pass of make test leaves the compiled kernel alone")
    if shutil.which(os.environ.get("CC", "gcc")) is None:
        pytest.skip("no C compiler")
    result = kernel_fuzz.fuzz(inputs=600, seed=7)
    assert result.returncode == 0, result.stdout + result.stderr[-5000:]
    assert "no finding, no divergence" in result.stdout
