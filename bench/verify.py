"""Verify hot path: verify of the benchmark store with body CRCs (commit log only, and with
consume queues and index after a dispatch), and of a store with 1 KiB bodies, beside raw
zlib.crc32 over the same bytes and RocketMQ's own CRC recovery scan; then full verify of
damaged copies of the benchmark store (what an operator checks after an incident) beside the
sound store's.

    python bench/verify.py [--messages N] [--workdir DIR]
"""

from __future__ import annotations

import struct
import subprocess
import sys
import tempfile
from pathlib import Path

from common import (
    REPO,
    ROCKETMQ_CRC_RECOVERY_MB_S,
    arguments,
    build_store,
    commitlog_bytes,
    fresh_copy,
    peak_rss_mib_of,
    row,
    timed,
    zlib_crc_gb_s,
)

VERIFY_CODE = """
import sys
from rmqstore.store import Store
from rmqstore.verify import VerifyOptions, verify_store
with Store.open_read(sys.argv[1]) as store:
    verify_store(store, VerifyOptions(commitlog_only=True))
"""


def verify(path, commitlog_only: bool) -> tuple[int, float, bool]:
    from rmqstore.store import Store
    from rmqstore.verify import VerifyOptions, verify_store

    with Store.open_read(path) as store, timed() as clock:
        report = verify_store(store, VerifyOptions(commitlog_only=commitlog_only))
    return report.checked["records"], clock.seconds, report.ok


def verify_in_workers(path, workers: int) -> tuple[int, float]:
    """Full verify with the commit log checked in ranges by ``workers`` processes."""
    from rmqstore.store import Store
    from rmqstore.verify import VerifyOptions
    from rmqstore.verify.ranges import RangedVerify
    from rmqstore.workers import process_runner

    with Store.open_read(path) as store, timed() as clock:
        report = RangedVerify.for_options(store, VerifyOptions()).run(process_runner(workers))
    return report.checked["records"], clock.seconds


def dispatched(path) -> None:
    from rmqstore.dispatch import Dispatcher
    from rmqstore.store import Store

    with Store.open_write(path) as store:
        dispatcher = Dispatcher(store)
        dispatcher.run()
        dispatcher.close()


def _first_queue_file(store: Path, queue: int) -> Path:
    folder = next((store / "consumequeue").iterdir()) / str(queue)
    return min(folder.iterdir())


def _lagging(store: Path, messages: int) -> str:
    """The queues and index rebuilt over the first 60% of the records only (a crash before
    dispatch caught up)."""
    dispatched_records = messages * 6 // 10
    subprocess.run(
        [sys.executable, "-m", "rmqstore", "dispatch", str(store), "--rebuild", "--yes",
         "--max-records", str(dispatched_records), "--no-progress"],
        check=True, stdout=subprocess.DEVNULL, cwd=REPO,
    )  # fmt: skip
    return f"{messages - dispatched_records:,} records undispatched"


def _one_wrong_unit(store: Path, messages: int) -> str:
    """One unit of queue 2 one byte too long."""
    with open(_first_queue_file(store, 2), "r+b") as handle:
        handle.seek(min(1000, messages // 8) * 20 + 8)
        size = struct.unpack(">i", handle.read(4))[0]
        handle.seek(-4, 1)
        handle.write(struct.pack(">i", size + 1))
    return "one unit of a queue wrong"


def _shifted_queue(store: Path, messages: int) -> str:
    """Queue 0's units moved one place down: each names the next record of its queue."""
    path = _first_queue_file(store, 0)
    units = bytearray(path.read_bytes())
    count = messages // 4
    units[: (count - 1) * 20] = units[20 : count * 20]
    path.write_bytes(units)
    return "a queue shifted by one unit"


def damaged_copies(path: Path, messages: int, workdir: Path, seconds_sound: float) -> None:
    """Full verify of copies of the benchmark store, each damaged one way, beside the sound
    store's verify."""
    with tempfile.TemporaryDirectory(dir=workdir) as scratch:
        copy = Path(scratch) / "store"
        for damage in (_lagging, _one_wrong_unit, _shifted_queue):
            fresh_copy(path, copy)
            what = damage(copy, messages)
            best = min(verify(copy, commitlog_only=False)[1] for _ in range(2))
            row(
                f"verify, {what}",
                f"{best:.2f} s",
                f"{best / seconds_sound:.1f}x the sound store ({seconds_sound:.2f} s)",
            )


def main() -> None:
    options = arguments(__doc__).parse_args()
    path, _ = build_store(options.workdir, options.messages)
    size = commitlog_bytes(path)
    print(f"verify: {options.messages:,} records, {size / 1e6:.0f} MB, body CRC checked")
    records, seconds, _ = verify(path, commitlog_only=True)
    row(
        "verify --commitlog-only (100 B bodies)",
        f"{records / seconds:,.0f} rec/s  {size / seconds / 1e6:.0f} MB/s",
        "target >= 1,000,000 rec/s",
    )
    dispatched(path)
    records, seconds, ok = verify(path, commitlog_only=False)
    seconds_sound = seconds
    row(
        "verify, with consume queues + index",
        f"{records / seconds:,.0f} rec/s  {size / seconds / 1e6:.0f} MB/s",
        f"sound={ok}",
    )
    records, seconds = verify_in_workers(path, 2)
    row(
        "  the same in 2 worker processes (--jobs 2)",
        f"{records / seconds:,.0f} rec/s  {size / seconds / 1e6:.0f} MB/s",
    )
    row(
        "baseline: zlib.crc32 over the same bytes",
        f"{zlib_crc_gb_s(path, size):.2f} GB/s",
        f"RocketMQ 4.9.8 CRC recovery scan: {ROCKETMQ_CRC_RECOVERY_MB_S} MB/s",
    )
    big_count = max(1, options.messages // 4)
    big, _ = build_store(options.workdir, big_count, body=b"y" * 1024)
    big_size = commitlog_bytes(big)
    records, seconds, _ = verify(big, commitlog_only=True)
    row(
        "verify --commitlog-only (1 KiB bodies)",
        f"{records / seconds:,.0f} rec/s  {big_size / seconds / 1e9:.2f} GB/s",
        "target >= 1 GB/s",
    )
    row("baseline: zlib.crc32 over the same bytes", f"{zlib_crc_gb_s(big, big_size):.2f} GB/s")
    damaged_copies(path, options.messages, options.workdir, seconds_sound)
    quarter = peak_rss_mib_of(VERIFY_CODE, str(big))
    whole = peak_rss_mib_of(VERIFY_CODE, str(path))
    row(
        "peak RSS: 1 KiB store vs 100 B store",
        f"{quarter:.0f} MiB vs {whole:.0f} MiB",
        "flat = memory does not grow with store size",
    )


if __name__ == "__main__":
    main()
