"""Dispatch hot path: rebuild consume queues and index for the benchmark store (each message
indexed by its UNIQ_KEY), beside a plain commit-log scan and RocketMQ 4.9.8's own rebuild.

    python bench/dispatch.py [--messages N] [--workdir DIR]
"""

from __future__ import annotations

import shutil

from common import ROCKETMQ_REDISPATCH_SECONDS, arguments, build_store, row, timed


def main() -> None:
    options = arguments(__doc__).parse_args()
    path, _ = build_store(options.workdir, options.messages)
    from rmqstore.dispatch import Dispatcher
    from rmqstore.pipeline.ranges import DEFAULT_SPLIT
    from rmqstore.pipeline.rebuild import rebuild_in_workers
    from rmqstore.store import Store

    shutil.rmtree(path / "consumequeue", ignore_errors=True)
    shutil.rmtree(path / "index", ignore_errors=True)
    print(
        f"dispatch: {options.messages:,} messages, default geometry (6 MB queue files, "
        "5M-slot index)"
    )
    with Store.open_read(path) as store, timed() as scan_clock:
        scanned = sum(1 for _ in store.commitlog.scan())
    with Store.open_write(path) as store:
        dispatcher = Dispatcher(store)
        with timed() as clock:
            result = dispatcher.run()
        dispatcher.close()
    row(
        "rebuild consume queues + index",
        f"{result.records / clock.seconds:,.0f} msg/s",
        f"{clock.seconds:.2f} s; RocketMQ 4.9.8: {ROCKETMQ_REDISPATCH_SECONDS:.2f} s "
        f"({1_000_000 / ROCKETMQ_REDISPATCH_SECONDS:,.0f} msg/s)",
    )
    row("  of which units / index entries", f"{result.units_written:,} / {result.index_entries:,}")
    for workers in (2,):
        shutil.rmtree(path / "consumequeue", ignore_errors=True)
        shutil.rmtree(path / "index", ignore_errors=True)
        with Store.open_write(path) as store:
            start = store.commitlog.min_offset
            with timed() as clock:
                in_workers = rebuild_in_workers(
                    store,
                    from_offset=start,
                    topics=None,
                    build_index=True,
                    workers=workers,
                    split=DEFAULT_SPLIT,
                )
        assert in_workers.to_dict() == result.to_dict()
        row(
            f"  ranges read in {workers} worker processes (--jobs {workers})",
            f"{in_workers.records / clock.seconds:,.0f} msg/s",
            f"{clock.seconds:.2f} s",
        )
    row(
        "baseline: plain commit-log scan",
        f"{scanned / scan_clock.seconds:,.0f} rec/s",
        f"{scan_clock.seconds:.2f} s",
    )


if __name__ == "__main__":
    main()
