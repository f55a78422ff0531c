"""The README's command examples work, in order, on a new directory, as the README says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
_BLOCK = re.compile(r"Run in this order on a new directory.*?```sh\n(.*?)```", re.S)


def _example_lines() -> list[str]:
    """The commands of the README's example block, continuation lines joined."""
    block = _BLOCK.search((REPO / "README.md").read_text(encoding="utf-8"))
    assert block, "the README's example block is missing"
    return [line.strip() for line in block.group(1).replace("\\\n", " ").splitlines() if line]


@pytest.mark.spark  # export writes Parquet, which needs the Spark extra's pyarrow
def test_the_readme_examples_run_in_order(tmp_path: Path) -> None:
    script = ["set -u"]
    for line in _example_lines():
        command, comment = [*re.split(r"\s# ", line, maxsplit=1), ""][:2]
        allowed = "0 1" if "exit 1" in comment else "0"
        script.append(
            f"{{ {command.strip()} ; }} >/dev/null\n"
            f'code=$?; case " {allowed} " in *" $code "*) ;; '
            f'*) echo "exit $code: {command.strip()!s}" >&2; exit 1;; esac'
        )
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    env.pop("RMQSTORE_KERNEL", None)
    done = subprocess.run(
        ["sh", "-c", "\n".join(script).replace("/tmp/orders", str(tmp_path / "orders"))],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "orders").is_dir()
