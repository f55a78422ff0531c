"""The record kernel: whole commands on the benchmark store with the compiled kernel beside the
pure-Python reference (RMQSTORE_KERNEL=native / python), and beside RocketMQ 4.9.8's own store
on the same work (issue 13's figures, measured on this machine kind when it was quiet).

    python bench/kernel.py [--messages N] [--workdir DIR] [--skip-python]

Each figure is the wall time of a fresh ``rmqstore`` process (start-up included), the best of
three runs; the scan row is the in-process time of a batch scan with body CRC, beside raw
``zlib.crc32`` over the same bytes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from common import (
    REPO,
    arguments,
    best_of,
    build_store,
    commitlog_bytes,
    fresh_copy,
    row,
    zlib_crc_gb_s,
)

RMQSTORE = Path(sys.executable).parent / "rmqstore"
ROCKETMQ = {  # seconds, RocketMQ 4.9.8's store on 1,000,000 messages (issue 13)
    "rebuild": 0.6,
    "recover": 0.78,
    "verify": 0.4,
}

SCAN_CODE = """
import sys, time
from rmqstore.store import Store
with Store.open_read(sys.argv[1]) as store:
    began = time.perf_counter()
    scan = store.commitlog.scan(check_crc=True)
    records = sum(count for _w, _s, _r, count in scan.batches())
    print(records, time.perf_counter() - began)
"""
RSS_CODE = """
import resource, subprocess, sys
subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
"""


def env(kernel: str) -> dict[str, str]:
    return {**os.environ, "RMQSTORE_KERNEL": kernel}


def _only_topic(path: Path) -> str:
    """The benchmark store's one topic."""
    (topic,) = sorted(entry.name for entry in (path / "consumequeue").iterdir())
    return topic


def small_file_store(workdir: Path) -> Path:
    """40,000 messages of the benchmark shape in commit-log files of 4 KiB (2,858 files)."""
    path = workdir / "small-files-40000"
    if not path.exists():
        from rmqstore.fixtures import FixtureOptions, generate

        generate("large", path, FixtureOptions(messages=40000, commitlog_file_size=4096))
    return path


def peak_rss_mib(command: list[str]) -> float:
    output = subprocess.run(
        [sys.executable, "-c", RSS_CODE, *command], check=True, capture_output=True, text=True
    ).stdout
    return float(output.split()[-1])


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--skip-python", action="store_true", help="only the compiled kernel")
    parser.add_argument(
        "--rss-messages", type=int, default=0, help="the larger store for memory (4x)"
    )
    options = parser.parse_args()
    # start-up as an installed package has it: pip byte-compiles at install, an editable
    # checkout compiles its sources on every run when PYTHONDONTWRITEBYTECODE is set
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(REPO / "rmqstore"), str(REPO / "commands")],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    path, _ = build_store(options.workdir, options.messages)
    small, _ = build_store(options.workdir, 20)
    size = commitlog_bytes(path)
    work = options.workdir / "kernel-work"
    kernels = ["native"] if options.skip_python else ["native", "python"]
    print(f"kernel: {options.messages:,} messages, {size / 1e6:.0f} MB; kernels {kernels}")

    for kernel in kernels:
        output = subprocess.run(
            [sys.executable, "-c", SCAN_CODE, str(path)],
            check=True,
            env=env(kernel),
            capture_output=True,
            text=True,
            cwd=REPO,
        ).stdout.split()
        seconds = float(output[1])
        row(
            f"[{kernel}] scan with body CRC (batches)",
            f"{seconds:.3f} s  {int(output[0]) / seconds / 1e6:.2f}M rec/s",
            f"{size / seconds / 1e9:.2f} GB/s",
        )
    crc = zlib_crc_gb_s(path, size)
    row("baseline: zlib.crc32 over the same bytes", f"{size / crc / 1e9:.3f} s", f"{crc:.2f} GB/s")

    commands = [
        ("verify --commitlog-only", ["verify", str(path), "--commitlog-only"], None, "verify"),
        ("verify (queues and index too)", ["verify", str(path)], None, None),
        ("info", ["info", str(path)], None, None),
        (
            "read --from-offset 0 --jsonl (the whole log)",
            ["read", str(path), "--from-offset", "0", "--jsonl"],
            None,
            None,
        ),
        (
            "read --topic T --jsonl (every queue of it)",
            ["read", str(path), "--topic", _only_topic(path), "--jsonl"],
            None,
            None,
        ),
        (
            "read --topic T --jsonl --begin 1 (message by message)",
            ["read", str(path), "--topic", _only_topic(path), "--jsonl", "--begin", "1"],
            None,
            None,
        ),
        (
            "read --topic T --csv",
            ["read", str(path), "--topic", _only_topic(path), "--csv"],
            None,
            None,
        ),
        (
            "dispatch --rebuild (one process)",
            ["dispatch", str(work), "--rebuild", "--yes"],
            lambda: fresh_copy(path, work),
            "rebuild",
        ),
        (
            "recover after a crash (abort present), --no-check",
            ["recover", str(work), "--yes", "--no-check"],
            lambda: fresh_copy(path, work, abort=True),
            "recover",
        ),
        (
            "recover after a crash, then its verify (the default)",
            ["recover", str(work), "--yes"],
            lambda: fresh_copy(path, work, abort=True),
            None,
        ),
    ]
    for name, arguments_, prepare, baseline in commands:
        for kernel in kernels:
            command = [str(RMQSTORE), *arguments_, "--no-progress"]
            seconds = best_of(command, env(kernel), prepare=prepare)
            note = ""
            if baseline:
                note = f"RocketMQ 4.9.8: {ROCKETMQ[baseline]:.2f} s"
            row(f"[{kernel}] {name}", f"{seconds:.2f} s", note)
    verify_seconds = best_of(
        [str(RMQSTORE), "verify", str(path), "--commitlog-only", "--no-progress"], env("native")
    )
    exported = options.workdir / "kernel-export"
    for name, arguments_, prepare in (
        ("stats --engine local", ["stats", str(path), "--engine", "local"], None),
        (
            "export --engine local (Parquet, bodies)",
            ["export", str(path), "--engine", "local", "--to", str(exported)],
            lambda: shutil.rmtree(exported, ignore_errors=True),
        ),
        (
            "export --engine local --format jsonl (bodies in base64)",
            ["export", str(path), "--engine", "local", "--to", str(exported), "--format", "jsonl"],
            lambda: shutil.rmtree(exported, ignore_errors=True),
        ),
    ):
        seconds = best_of([str(RMQSTORE), *arguments_], env("native"), prepare=prepare)
        row(
            f"[native] {name}",
            f"{seconds:.2f} s",
            f"{seconds / verify_seconds:.1f}x verify --commitlog-only ({verify_seconds:.2f} s)",
        )
    # many small files: each file's few records gathered into the Arrow batches of others
    small_files = small_file_store(options.workdir)
    stats_seconds = best_of(
        [str(RMQSTORE), "stats", str(small_files), "--engine", "local"], env("native")
    )
    row(
        "[native] stats --engine local, 40,000 messages in 4 KiB files",
        f"{stats_seconds:.2f} s",
        f"{len(list((small_files / 'commitlog').iterdir())):,} files",
    )
    seconds = best_of(
        [str(RMQSTORE), "export", str(small_files), "--engine", "local", "--to", str(exported)],
        env("native"),
        prepare=lambda: shutil.rmtree(exported, ignore_errors=True),
    )
    row(
        "[native] export --engine local of them (Parquet)",
        f"{seconds:.2f} s",
        f"{seconds / stats_seconds:.1f}x their stats",
    )
    shutil.rmtree(exported, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)
    for name, arguments_ in (
        ("--version", ["--version"]),
        ("info, 20-message store", ["info", str(small)]),
    ):
        seconds = best_of([str(RMQSTORE), *arguments_], env("native"), runs=5)
        row(f"[native] start-up: rmqstore {name}", f"{seconds:.3f} s", "target <= 0.1 s")
    bigger, _ = build_store(options.workdir, options.rss_messages or 4 * options.messages)
    for store in (path, bigger):
        for name, extra in (("verify --commitlog-only", ["--commitlog-only"]), ("verify", [])):
            rss = peak_rss_mib([str(RMQSTORE), "verify", str(store), "--no-progress", *extra])
            row(f"peak RSS: {name}, {store.name}", f"{rss:.0f} MiB", "flat = same for both")


if __name__ == "__main__":
    main()
