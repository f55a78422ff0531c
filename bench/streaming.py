"""The streaming source: a query (trigger 1 s) tails a store while an ``append`` process is
fed 10,000 messages a second for 20 s; each body carries the time it was handed to the
writer, and the lag is measured when the Parquet sink commits the file holding it.

With ``--catch-up``: then an ``availableNow`` query with ``maxBytesPerTrigger`` exports the
benchmark store (``--messages``) to Parquet from a new checkpoint, beside the local engine's
export of the same store (best of three) in the same run.

    python bench/streaming.py [--workdir DIR] [--rate N] [--seconds S] [--catch-up]
        [--messages N] [--max-bytes BYTES]
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from common import arguments, build_store, commitlog_bytes, row, timed

TRIGGER = 1.0


def committed_files(sink: Path, seen: set[str]) -> list[str]:
    """Parquet files the sink's metadata log names that were not seen before."""
    found = []
    log = sink / "_spark_metadata"
    if not log.is_dir():
        return found
    for entry in sorted(log.iterdir()):
        if entry.name.startswith("."):
            continue
        for line in entry.read_text().splitlines()[1:]:
            path = json.loads(line)["path"].removeprefix("file://")
            if path not in seen:
                seen.add(path)
                found.append(path)
    return found


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--rate", type=int, default=10_000)
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--catch-up", action="store_true")
    parser.add_argument("--max-bytes", type=int, default=64 << 20)
    options = parser.parse_args()
    work = options.workdir / "streaming"
    shutil.rmtree(work, ignore_errors=True)
    store, sink, checkpoint = work / "store", work / "sink", work / "checkpoint"
    rmqstore = [sys.executable, "-m", "rmqstore"]
    subprocess.run([*rmqstore, "append", str(store), "--create", "--topic", "T", "--body", "0"],
                   check=True, capture_output=True)  # fmt: skip

    import pyarrow.parquet as pq

    from rmqstore.spark import spark_session

    spark = spark_session("local[2]")
    query = (
        spark.readStream.format("rocketmq-commitlog")
        .option("startingOffsets", "latest")
        .load(str(store))
        .select("body")
        .writeStream.format("parquet")
        .option("path", str(sink))
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime=f"{TRIGGER:.0f} second")
        .start()
    )
    # the writer starts now, so that its start-up (imports, opening the store) is over when
    # the first message is stamped: the lag is the pipeline's, from append to the sink
    writer = subprocess.Popen(
        [*rmqstore, "append", str(store), "--input", "-", "--jsonl"],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    time.sleep(5)  # the query's first (empty) batches
    assert writer.stdin is not None
    total = options.rate * options.seconds

    def feed() -> None:
        tick = 0.1
        per_tick = int(options.rate * tick)
        begin = time.time()
        for number in range(options.seconds * 10):
            now = time.time()
            line = json.dumps({"topic": "T", "body": f"{now:.6f}"}) + "\n"
            writer.stdin.write(line * per_tick)
            writer.stdin.flush()
            time.sleep(max(0.0, begin + (number + 1) * tick - time.time()))
        writer.stdin.close()

    feeding = threading.Thread(target=feed)
    started = time.time()
    feeding.start()
    lags: list[float] = []
    late_start: list[float] = []  # lags of the messages sent after the first 5 s
    seen: set[str] = set()
    deadline = time.time() + options.seconds + 60
    while len(lags) < total and time.time() < deadline:
        for path in committed_files(sink, seen):
            arrived = time.time()
            bodies = pq.read_table(path, columns=["body"]).column(0).to_pylist()
            lags += [arrived - float(body) for body in bodies]
            late_start += [arrived - float(b) for b in bodies if float(b) > started + 5]
        time.sleep(0.02)
    feeding.join()
    writer.wait()
    query.stop()
    if options.catch_up:
        catch_up = catch_up_figures(spark, options)
    spark.stop()
    lags.sort()
    rate, seconds = options.rate, options.seconds
    print(f"streaming: {rate:,} msg/s appended for {seconds} s, trigger {TRIGGER} s")
    row(
        "messages in the sink",
        f"{len(lags):,} of {total:,}",
    )
    if lags:
        row(
            "lag, append to the Parquet sink",
            f"median {lags[len(lags) // 2]:.2f} s, p99 {lags[int(len(lags) * 0.99)]:.2f} s, "
            f"max {lags[-1]:.2f} s",
            f"2 trigger intervals: {2 * TRIGGER:.1f} s",
        )
    if late_start:
        late_start.sort()
        row(
            "  the same after the first 5 s",
            f"median {late_start[len(late_start) // 2]:.2f} s, "
            f"p99 {late_start[int(len(late_start) * 0.99)]:.2f} s, max {late_start[-1]:.2f} s",
        )
    if options.catch_up:
        catch_up_rows(*catch_up)
    shutil.rmtree(work, ignore_errors=True)


def catch_up_figures(spark, options) -> tuple:  # type: ignore[no-untyped-def]
    """An availableNow query over the benchmark store from a new checkpoint (Parquet, every
    column), then the local engine's export of the same store, best of three."""
    from rmqstore.pipeline.local import LocalPipeline, PipelineOptions

    path, _ = build_store(options.workdir, options.messages)
    work = options.workdir / "catch-up"
    shutil.rmtree(work, ignore_errors=True)
    written = []  # the same rows by a batch read and Spark's Parquet writer, same session
    for number in range(2):
        with timed() as batch:
            spark.read.format("rocketmq-commitlog").load(str(path)).write.parquet(
                str(work / f"batch{number}")
            )
        written.append(batch.seconds)
    with timed() as clock:
        query = (
            spark.readStream.format("rocketmq-commitlog")
            .option("maxBytesPerTrigger", str(options.max_bytes))
            .load(str(path))
            .writeStream.format("parquet")
            .option("path", str(work / "sink"))
            .option("checkpointLocation", str(work / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
    batches = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    local = float("inf")
    for _ in range(3):
        shutil.rmtree(work / "local", ignore_errors=True)
        with timed() as run:
            LocalPipeline(str(path), PipelineOptions()).export(str(work / "local"), "parquet")
        local = min(local, run.seconds)
    shutil.rmtree(work, ignore_errors=True)
    return clock.seconds, batches, written, local, commitlog_bytes(path), options.max_bytes


def catch_up_rows(  # type: ignore[no-untyped-def]
    seconds: float,
    batches: list[int],
    written: list[float],
    local: float,
    size: int,
    max_bytes: int,
) -> None:
    messages = sum(batches)
    print(
        f"catch-up: availableNow, maxBytesPerTrigger {max_bytes:,}, {size / 1e6:.0f} MB of log, "
        "to Parquet (every column)"
    )
    row(
        "  availableNow query, start to stop",
        f"{seconds:.2f} s",
        f"{messages:,} messages in {len(batches)} batches (largest {max(batches, default=0):,}), "
        f"{messages / seconds:,.0f} msg/s",
    )
    row(
        "  baseline: batch read, Spark's Parquet writer",
        f"{written[-1]:.2f} s",
        f"first in the session {written[0]:.2f} s; the query {seconds / written[-1]:.1f}x",
    )
    row("  baseline: export --engine local", f"{local:.2f} s", f"the query {seconds / local:.1f}x")


if __name__ == "__main__":
    main()
