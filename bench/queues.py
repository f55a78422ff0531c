"""A store of many queues (a broker's thousands of topics): 1,000 topics x 4 queues, one
message each, default 6,000,000-byte consume-queue files (sparse, as a broker leaves them).
Whole commands (best of three, fresh process each) beside the least any tool must do there
(best of three too): list and stat every consume-queue file (``os.walk``), and open and
read each file's first 4 KiB.

    python bench/queues.py [--messages N] [--topics N] [--workdir DIR]

(``--topics`` defaults to one per thousand ``--messages``: 1,000 for ``make bench``, 200
for ``make bench-quick``.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, arguments, best_of, fresh_copy, row

RMQSTORE = [sys.executable, "-m", "rmqstore"]


def build(path: Path, topics: int) -> None:
    """``topics`` topics x 4 queues, one message in each queue, dispatched."""
    lines = "".join(
        json.dumps({"topic": f"T{number % topics}", "queueId": number // topics, "body": "x" * 50})
        + "\n"
        for number in range(4 * topics)
    )
    subprocess.run(
        [*RMQSTORE, "append", str(path), "--create", "--input", "-"],
        input=lines.encode(),
        check=True,
        capture_output=True,
    )
    subprocess.run([*RMQSTORE, "dispatch", str(path)], check=True, capture_output=True)


def walk_and_read(root: Path) -> tuple[int, float]:
    """The baseline: every queue file listed, stat'ed, opened and its first 4 KiB read."""
    files = 0
    began = time.perf_counter()
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            os.stat(path)
            fd = os.open(path, os.O_RDONLY)
            try:
                os.pread(fd, 4096, 0)
            finally:
                os.close(fd)
            files += 1
    return files, time.perf_counter() - began


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--topics", type=int, default=None)
    options = parser.parse_args()
    topics = options.topics or max(1, options.messages // 1000)
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(REPO / "rmqstore"), str(REPO / "commands")],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    store = options.workdir / f"queues-{topics}"
    if not store.exists():
        options.workdir.mkdir(parents=True, exist_ok=True)
        build(store, topics)
    # best of three, as the commands are (the first walk may find the folders out of the
    # cache, after the benchmarks before it)
    walks = [walk_and_read(store / "consumequeue") for _ in range(3)]
    files, baseline = min(walks, key=lambda walk: walk[1])
    print(f"queues: {topics:,} topics x 4 queues, one message each ({files:,} files)")
    row("baseline: walk, stat, open, read 4 KiB each", f"{baseline:.2f} s")
    for name, command in [
        ("info", ["info", str(store)]),
        ("verify", ["verify", str(store)]),
        ("recover --dry-run", ["recover", str(store), "--dry-run"]),
        ("stats --engine local", ["stats", str(store), "--engine", "local"]),
    ]:
        seconds = best_of([*RMQSTORE, *command])
        row(name, f"{seconds:.2f} s", f"{seconds / baseline:.1f}x the baseline")
    with tempfile.TemporaryDirectory(dir=options.workdir) as scratch:
        copy = Path(scratch) / "store"

        for name, command in [
            ("append one message", ["append", str(copy), "--topic", "T1", "--body", "x"]),
            ("flush", ["flush", str(copy)]),
            ("dispatch --rebuild", ["dispatch", str(copy), "--rebuild", "--yes"]),
        ]:
            seconds = best_of([*RMQSTORE, *command], prepare=lambda: fresh_copy(store, copy))
            row(name, f"{seconds:.2f} s", f"{seconds / baseline:.1f}x the baseline")


if __name__ == "__main__":
    main()
