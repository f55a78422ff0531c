"""Scan hot path: a full read scan of the benchmark store with and without body CRC checks,
beside raw zlib.crc32 over the same bytes; and peak memory for a quarter of the store versus
all of it (it must not grow with store size).

    python bench/scan.py [--messages N] [--workdir DIR]
"""

from __future__ import annotations

from common import (
    arguments,
    build_store,
    commitlog_bytes,
    peak_rss_mib_of,
    row,
    timed,
    zlib_crc_gb_s,
)

SCAN_CODE = """
import sys
from rmqstore.store import Store
limit = int(sys.argv[2])
with Store.open_read(sys.argv[1]) as store:
    for count, _ in enumerate(store.commitlog.scan(check_crc=True), 1):
        if count >= limit:
            break
"""


def scan(path, check_crc: bool) -> tuple[int, float]:
    from rmqstore.store import Store

    with Store.open_read(path) as store, timed() as clock:
        records = sum(1 for _ in store.commitlog.scan(check_crc=check_crc))
    return records, clock.seconds


def main() -> None:
    options = arguments(__doc__).parse_args()
    path, _ = build_store(options.workdir, options.messages)
    size = commitlog_bytes(path)
    print(f"scan: {options.messages:,} records, {size / 1e6:.0f} MB")
    for check_crc in (False, True):
        records, seconds = scan(path, check_crc)
        row(
            f"scan {'with' if check_crc else 'without'} body CRC",
            f"{records / seconds:,.0f} rec/s  {size / seconds / 1e6:.0f} MB/s",
            "target >= 1,000,000 rec/s",
        )
    row("baseline: zlib.crc32 over the same bytes", f"{zlib_crc_gb_s(path, size):.2f} GB/s")
    quarter = peak_rss_mib_of(SCAN_CODE, str(path), str(options.messages // 4))
    whole = peak_rss_mib_of(SCAN_CODE, str(path), str(options.messages))
    row(
        "peak RSS: scan 1/4 of the store vs all",
        f"{quarter:.0f} MiB vs {whole:.0f} MiB",
        "flat = memory does not grow with store size",
    )


if __name__ == "__main__":
    main()
