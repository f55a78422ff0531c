"""Append hot path: the engine appending 1,000,000 messages (100-byte bodies, 1 topic, 4
queues, 1 GiB files, async flush) and the CLI --input path, beside dd and RocketMQ 4.9.8.

    python bench/append.py [--messages N] [--workdir DIR]
"""

from __future__ import annotations

import json
import subprocess
import sys

from common import (
    BODY,
    ROCKETMQ_PUT_SECONDS,
    TOPIC,
    append_messages,
    arguments,
    build_store,
    dd_write_mb_s,
    row,
    timed,
)


def engine_append(workdir, count: int) -> tuple[float, int, float]:
    """Append ``count`` messages of the benchmark shape to a new store:
    (seconds in all, bytes, seconds inside append_many)."""
    path = workdir / f"append-{count}"
    subprocess.run(["rm", "-rf", str(path)], check=True)
    measured = append_messages(path, count)
    subprocess.run(["rm", "-rf", str(path)], check=True)
    return measured


def engine_append_batch(workdir, count: int) -> float:  # type: ignore[no-untyped-def]
    """Seconds inside ``append_batch`` appending ``count`` messages of the benchmark shape
    to a new store, in column batches of 65,536 (the record kernel packs them)."""
    from array import array

    from rmqstore.config import StoreConfig
    from rmqstore.hosts import HostAddress
    from rmqstore.messagebatch import uniform_batch
    from rmqstore.msgid import UniqKeyGenerator
    from rmqstore.store import Store

    path = workdir / f"append-batch-{count}"
    subprocess.run(["rm", "-rf", str(path)], check=True)
    inside = 0.0
    born = HostAddress(bytes([10, 0, 0, 1]), 5000)
    with Store.open_write(path, StoreConfig(commitlog_file_size=1 << 30), create=True) as store:
        appender = store.appender(uniq_keys=UniqKeyGenerator())
        for start in range(0, count, 65536):
            stop = min(count, start + 65536)
            batch = uniform_batch(
                topic=TOPIC,
                body=BODY,
                properties={"TAGS": "TagA"},
                queue_ids=(array("q", range(4)) * ((stop - start) // 4 + 1))[: stop - start],
                born_host=born,
                born_timestamp=1,
                trailing_separator=True,
            )
            with timed() as clock:
                appender.append_batch(batch)
            inside += clock.seconds
    subprocess.run(["rm", "-rf", str(path)], check=True)
    return inside


def _disk_used(store) -> int:  # type: ignore[no-untyped-def]
    """Bytes of disk blocks a store's files take (sparse files count what is allocated)."""
    return sum(p.stat().st_blocks * 512 for p in store.rglob("*") if p.is_file())


def _log_bytes(store) -> int:  # type: ignore[no-untyped-def]
    """The bytes of records in a store: the commit log's data (and its queues and index)."""
    from rmqstore.store import Store

    with Store.open_read(store) as opened:
        log = opened.commitlog.data_extent() - opened.commitlog.min_offset
    return log


def _sync_pipe(store, count: int) -> tuple[int, float, int]:  # type: ignore[no-untyped-def]
    """A producer that writes one JSON line and waits for its acknowledgement, ``count``
    times, into ``append --flush sync``: (acknowledged, seconds, record size)."""
    created = subprocess.run(
        [sys.executable, "-m", "rmqstore", "append", str(store), "--create", "--topic", TOPIC,
         "--body", "x"], capture_output=True, check=True,
    )  # fmt: skip
    del created
    child = subprocess.Popen(
        [sys.executable, "-m", "rmqstore", "append", str(store), "--input", "-", "--flush",
         "sync", "--jsonl"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    assert child.stdin is not None and child.stdout is not None
    line = (json.dumps({"topic": TOPIC, "tags": "TagA", "body": BODY.decode()}) + "\n").encode()
    size = 0
    with timed() as clock:
        for _ in range(count):
            child.stdin.write(line)
            child.stdin.flush()
            size = json.loads(child.stdout.readline())["storeSize"]
    child.stdin.close()
    child.wait()
    return count, clock.seconds, size


def _dd_dsync_per_s(workdir, size: int, count: int) -> float:  # type: ignore[no-untyped-def]
    """``dd oflag=dsync``: ``count`` synchronous writes of ``size`` bytes, per second."""
    target = workdir / "dd-dsync.out"
    with timed() as clock:
        subprocess.run(
            ["dd", "if=/dev/zero", f"of={target}", f"bs={size}", f"count={count}",
             "oflag=dsync"], check=True, capture_output=True,
        )  # fmt: skip
    target.unlink()
    return count / clock.seconds


def main() -> None:
    options = arguments(__doc__).parse_args()
    workdir, count = options.workdir, options.messages
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"append: {count:,} messages, 100-byte bodies, 1 topic x 4 queues, 1 GiB files")

    seconds, size, in_engine = engine_append(workdir, count)
    row(
        "engine append (time inside append_many)",
        f"{count / in_engine:,.0f} msg/s  {size / in_engine / 1e6:.0f} MB/s",
        f"RocketMQ 4.9.8 putMessage: {1_000_000 / ROCKETMQ_PUT_SECONDS:,.0f} msg/s",
    )
    row(
        "  with building the Message objects",
        f"{count / seconds:,.0f} msg/s  {seconds:.2f} s",
        f"RocketMQ: {ROCKETMQ_PUT_SECONDS:.2f} s",
    )
    row("  record size", f"{size / count:.0f} B", "RocketMQ: 298 B")
    batched = engine_append_batch(workdir, count)
    row(
        "engine append_batch (columns, the record kernel packs)",
        f"{count / batched:,.0f} msg/s  {batched:.2f} s",
        f"RocketMQ 4.9.8 putMessage: {1_000_000 / ROCKETMQ_PUT_SECONDS:,.0f} msg/s",
    )
    for workers in (1, 2):
        _, generated = build_store(workdir, count, force=True, workers=workers)
        row(
            f"fixtures generate large --jobs {workers}",
            f"{count / generated:,.0f} msg/s",
            f"{generated:.2f} s; RocketMQ puts (dispatch concurrent): {ROCKETMQ_PUT_SECONDS} s",
        )

    lines = workdir / f"input-{count}.jsonl"
    if not lines.exists():
        line = json.dumps({"topic": TOPIC, "tags": "TagA", "body": BODY.decode()})
        with open(lines, "w") as handle:
            for index in range(count):
                handle.write(line[:-1] + f', "queueId": {index & 3}}}\n')
    cli_store = workdir / f"cli-{count}"
    for label, options in (
        ("CLI append --input FILE --jsonl (process)", []),
        ("  the same through the transient store pool", ["--transient-store-pool"]),
    ):
        subprocess.run(["rm", "-rf", str(cli_store)], check=True)
        with timed() as clock, open("/dev/null", "w") as sink:
            subprocess.run(
                [sys.executable, "-m", "rmqstore", "append", str(cli_store), "--create",
                 "--input", str(lines), "--jsonl", *options],
                check=True,
                stdout=sink,
            )  # fmt: skip
        row(label, f"{count / clock.seconds:,.0f} msg/s", f"{clock.seconds:.2f} s incl. start-up")
        if not options:
            held = sum(p.stat().st_size for p in (cli_store / "commitlog").iterdir())
            used = _disk_used(cli_store)
            data = _log_bytes(cli_store)
            row(
                "  disk used by the new store / bytes it holds",
                f"{used / data:.2f}x",
                f"{used / 1e6:.0f} MB on disk for {data / 1e6:.0f} MB of records "
                f"({held / 1e9:.1f} GB of files)",
            )
    subprocess.run(["rm", "-rf", str(cli_store)], check=True)

    sync_store = workdir / "sync-pipe"
    subprocess.run(["rm", "-rf", str(sync_store)], check=True)
    acknowledged, seconds, record = _sync_pipe(sync_store, 2000)
    row(
        "append --flush sync, one line at a time through a pipe (waits for each ack)",
        f"{acknowledged / seconds:,.0f} msg/s  {acknowledged / seconds:,.0f} fsyncs/s",
        f"dd oflag=dsync of {record}-byte writes: {_dd_dsync_per_s(workdir, record, 2000):,.0f}"
        " writes/s",
    )
    subprocess.run(["rm", "-rf", str(sync_store)], check=True)

    row(
        "baseline: dd write + fdatasync (same bytes)",
        f"{dd_write_mb_s(workdir, max(1, size >> 20)):.0f} MB/s",
    )


if __name__ == "__main__":
    main()
