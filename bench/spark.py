"""Spark pipeline: export to Parquet (bodies included) and full verify of the benchmark
store on the local engine, then on Spark with local[1] and local[2] — each master in a fresh
process, so Spark's start-up is measured too — and the scaling from 1 to 2 cores; count()
through the rocketmq-commitlog data source (every column, and a one-column schema) against
stats on the local engine (best of three, after a first query).

    python bench/spark.py [--messages N] [--workdir DIR] [--split BYTES]
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

from common import REPO, arguments, build_store, cache_log, commitlog_bytes, row, timed

SPARK_RUN = """
import json, os, shutil, sys, time
started = time.perf_counter()
from rmqstore.spark import spark_session
from rmqstore.spark.jobs import SparkPipeline
from rmqstore.pipeline.local import PipelineOptions
from rmqstore.store import Store
from rmqstore.verify import VerifyOptions
store, out, master, split = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
queues_store = sys.argv[5] if len(sys.argv) > 5 else None
spark = spark_session(master)
figures = {"session": time.perf_counter() - started}
# the first job starts the Python workers (and their imports): part of start-up, once per
# command, so it is measured apart from the jobs
cores = spark.sparkContext.defaultParallelism
warm = lambda _: len(__import__("pyarrow").__name__ + __import__("rmqstore.spark.jobs").__name__)
spark.sparkContext.parallelize(range(cores), cores).map(warm).collect()
figures["startup"] = time.perf_counter() - started
# the export first, as `rmqstore export --engine spark` runs it (its session's first job),
# then once more in the same session; the log read just before each, as the local engine's
# runs find it (see cache_log)
sys.path.insert(0, os.path.join(os.getcwd(), "bench"))
from common import cache_log
from pathlib import Path
pipeline = SparkPipeline(spark, store, PipelineOptions(split=split))
for key in ("export", "export_again"):
    cache_log(Path(store))
    begin = time.perf_counter()
    figures["exported"] = pipeline.export(out, "parquet").messages
    figures[key] = time.perf_counter() - begin
    shutil.rmtree(out)
def busy():
    # CPU seconds the whole machine has spent busy (Linux; None elsewhere): the JVM, its
    # Python workers and the planning daemons together
    try:
        with open("/proc/stat") as stat:
            ticks = [int(field) for field in stat.readline().split()[1:]]
    except OSError:
        return None
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # not idle or iowait
reader = spark.read.format("rocketmq-commitlog")  # the source's own splitSize, as a user gets
cache_log(Path(store))
begin = time.perf_counter()
figures["counted"] = reader.load(store).count()
figures["count_first"] = time.perf_counter() - begin  # the first query warms the JVM's paths
# then the best of three of each (the JVM compiles its hot paths over the first few)
for key, schema in (("count", None), ("count_one", "commitLogOffset BIGINT")):
    times = []
    for _ in range(3):
        begin, cpu = time.perf_counter(), busy()
        frame = spark.read.format("rocketmq-commitlog")  # schema() changes the reader it is given
        frame = frame if schema is None else frame.schema(schema)
        figures["counted" if key == "count" else "counted_one"] = frame.load(store).count()
        wall = time.perf_counter() - begin
        times.append((wall, None if cpu is None else (busy() - cpu) / wall))
    figures[key], figures[key + "_cores"] = min(times)
# the consume-queue source: the store's units, and a store of thousands of small queues
for key, path in (("cq", store), ("cq_queues", queues_store)):
    if path is None:
        continue
    times = []
    for _ in range(3):
        begin = time.perf_counter()
        frame = spark.read.format("rocketmq-consumequeue").load(path)
        figures[key + "_units"] = frame.count()
        times.append(time.perf_counter() - begin)
    figures[key] = min(times)
    figures[key + "_partitions"] = frame.rdd.getNumPartitions()
with Store.open_read(store) as opened:
    cache_log(Path(store))
    begin = time.perf_counter()
    report = pipeline.verify(opened, VerifyOptions())
    figures["verify"] = time.perf_counter() - begin
figures["verified"] = report.checked["records"]
figures["ok"] = report.ok
spark.stop()
print(json.dumps(figures))
"""


def best_of_three(run, after=lambda: None):
    """(the shortest of three runs of ``run``, in seconds, and what its last run returned);
    ``after`` runs after each, untimed."""
    times = []
    for _ in range(3):
        with timed() as clock:
            result = run()
        times.append(clock.seconds)
        after()
    return min(times), result


def local_engine(path, out, split: int) -> dict:
    from rmqstore.pipeline.local import LocalPipeline, PipelineOptions
    from rmqstore.store import Store
    from rmqstore.verify import VerifyOptions, verify_store

    figures = {}
    cache_log(path)
    # best of three, as count() is (a single export here varied from 0.37 s to 0.69 s)
    figures["export"], figures["exported"] = best_of_three(
        lambda: (
            LocalPipeline(str(path), PipelineOptions(split=split))
            .export(str(out), "parquet")
            .messages
        ),
        after=lambda: shutil.rmtree(out),
    )
    cache_log(path)
    with Store.open_read(path) as store, timed() as clock:
        report = verify_store(store, VerifyOptions())
    figures["verify"] = clock.seconds
    figures["verified"] = report.checked["records"]
    figures["stats"], stats = best_of_three(
        lambda: LocalPipeline(str(path), PipelineOptions(split=split)).stats()
    )
    figures["counted"] = stats.to_dict()["messages"]
    return figures


def on_spark(path, out, master: str, split: int, queues=None) -> dict:
    started = time.perf_counter()
    extra = [] if queues is None else [str(queues)]
    output = subprocess.run(
        [sys.executable, "-c", SPARK_RUN, str(path), str(out), master, str(split), *extra],
        check=True,
        cwd=REPO,
        capture_output=True,
        text=True,
    ).stdout
    figures = json.loads(output.strip().splitlines()[-1])
    figures["process"] = time.perf_counter() - started
    return figures


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--split", type=int, default=32 * 1024 * 1024)
    options = parser.parse_args()
    path, _ = build_store(options.workdir, options.messages)
    size = commitlog_bytes(path)
    out = options.workdir / "export-out"
    shutil.rmtree(out, ignore_errors=True)
    count = options.messages
    print(
        f"spark: {count:,} messages, {size / 1e6:.0f} MB, export to Parquet (with bodies) and "
        f"full verify (CRC, consume queues, index); ranges of {options.split / 2**20:.0f} MiB "
        "(count(): the data source's default, 128 MiB)"
    )
    here = local_engine(path, out, options.split)
    # a store of many small queues, when bench/queues.py made one
    queues = options.workdir / f"queues-{max(1, count // 1000)}"
    queues = queues if queues.is_dir() else None
    spark = {
        master: on_spark(path, out, master, options.split, queues)
        for master in ("local[1]", "local[2]")
    }
    for name, figures in [("local engine", here), *(("spark " + m, f) for m, f in spark.items())]:
        assert figures["exported"] == count and figures["verified"] == count, figures
        again = (
            f"; again in the session {figures['export_again']:.2f} s; first "
            f"{figures['export'] / here['export']:.1f}x the local engine (target <= 2x)"
            if "export_again" in figures
            else ""
        )
        row(
            f"export, {name}",
            f"{figures['export']:6.2f} s  {count / figures['export']:>9,.0f} msg/s",
            f"{size / figures['export'] / 1e6:.0f} MB/s{again}",
        )
    for name, figures in [("local engine", here), *(("spark " + m, f) for m, f in spark.items())]:
        row(
            f"verify, {name}",
            f"{figures['verify']:6.1f} s  {count / figures['verify']:>9,.0f} rec/s",
            f"{size / figures['verify'] / 1e6:.0f} MB/s",
        )
    one, two = spark["local[1]"], spark["local[2]"]
    row("stats, local engine", f"{here['stats']:6.2f} s", "the count() baseline")
    for master, figures in spark.items():
        assert figures["counted"] == figures["counted_one"] == here["counted"] == count, figures
        row(
            f"count(), spark {master}",
            f"{figures['count']:6.2f} s",
            f"first query {figures['count_first']:.2f} s; {figures['count'] / here['stats']:.1f}x "
            f"stats; one-column schema {figures['count_one']:.2f} s = "
            f"{figures['count_one'] / here['stats']:.1f}x stats (target <= 3x)",
        )
    for master, figures in spark.items():
        row(
            f"consume-queue source count(), spark {master}",
            f"{figures['cq']:6.2f} s",
            f"{figures['cq_units']:,} units, {figures['cq_partitions']} partitions",
        )
        if "cq_queues" in figures:
            row(
                f"  the same, {queues.name} (many small queues)",
                f"{figures['cq_queues']:6.2f} s",
                f"{figures['cq_queues_units']:,} units, {figures['cq_queues_partitions']} "
                "partitions",
            )
    row(
        "scaling local[1] -> local[2], count()",
        f"{one['count'] / two['count']:6.2f}x",
        f"one-column {one['count_one'] / two['count_one']:.2f}x; target >= 1.6x",
    )
    if one["count_cores"] is not None:
        # local[1] runs one task at a time, but its Python worker decodes while the JVM copies
        # the previous batch into rows (and compiles): more than one core busy already
        cores = os.cpu_count() or 1
        row(
            "cores busy in count(), local[1] / local[2]",
            f"{one['count_cores']:6.2f} / {two['count_cores']:.2f}",
            f"of {cores}: local[2] can be at most {cores / one['count_cores']:.2f}x local[1]",
        )
    row(
        "spark start-up, local[2]",
        f"{two['startup']:6.1f} s",
        f"JVM + session {two['session']:.1f} s, then Python workers",
    )
    row(
        "scaling local[1] -> local[2], export",
        f"{one['export'] / two['export']:6.2f}x",
        "target >= 1.6x",
    )
    row(
        "scaling local[1] -> local[2], verify",
        f"{one['verify'] / two['verify']:6.2f}x",
        "target >= 1.6x",
    )


if __name__ == "__main__":
    main()
