"""The Spark engine on a real local Spark session: the data sources from plain PySpark, export
of the real-broker stores, and verify / rebuild / stats / export giving what the local
engine gives (the same findings, byte-identical files)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zlib
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from rmqstore.config import StoreConfig
from rmqstore.consumequeue import list_queues
from rmqstore.dispatch import Dispatcher, apply_rebuild, plan_rebuild
from rmqstore.fixtures import FixtureOptions, generate
from rmqstore.pipeline.local import LocalPipeline, PipelineOptions
from rmqstore.record import Message
from rmqstore.spark import SparkUnavailable
from rmqstore.spark.jobs import SparkPipeline
from rmqstore.store import Store
from rmqstore.verify import VerifyOptions, verify_store

from campaigns import sigint_delivered
from support import (
    ORACLE_CONFIG,
    ORACLE_OPTIONS,
    TEST_JVM_OPTIONS,
    check_against_broker,
    parquet_rows,
    run_cli,
    tree_digest,
)

pytestmark = pytest.mark.spark

BROKER_STORES = ["s1_multi", "s3_txn_delay", "v533_s1_multi", "v533_s3_txn"]


def clock() -> int:
    return 1_700_000_000_000  # index file names are creation times


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("generated")
    for name in ("multi", "txn", "delay", "v2", "torn-tail", "garbage-after-end", "crc-flip",
                 "missing-file", "cq-truncated", "index-broken-chain", "abort-left",
                 "lmq"):  # fmt: skip
        generate(name, root / name)
    return root


# -- the data sources, from plain PySpark -------------------------------------------------------


def test_commitlog_source_from_plain_pyspark(spark: Any, stores: Path) -> None:
    frame = spark.read.format("rocketmq-commitlog").option("splitSize", "60000")
    rows = frame.load(str(stores / "multi")).orderBy("commitLogOffset").collect()
    with Store.open_read(stores / "multi") as store:
        expected = [(o, t, h) for o, h, t, *_ in store.commitlog.scan()]
    assert [row.commitLogOffset for row in rows] == [offset for offset, _, _ in expected]
    assert [row.topic for row in rows] == [topic for _, topic, _ in expected]
    with Store.open_read(stores / "multi") as store:
        message = store.commitlog.read(rows[7].commitLogOffset)
    assert rows[7].body == message.body and rows[7].msgId == message.msg_id
    assert dict(rows[7].properties) == message.properties
    assert rows[7].storeSize == rows[7].msgSize == message.store_size
    assert rows[7].crcOk is None  # not checked unless asked
    epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
    assert rows[7].storeTime.astimezone(timezone.utc) == epoch + timedelta(
        milliseconds=message.store_timestamp
    )
    assert dict(frame.load(str(stores / "multi")).dtypes)["bornTime"] == "timestamp"


def test_the_source_inflates_compressed_bodies_when_asked(spark: Any, oracle) -> None:
    store = str(oracle("s1_multi").store)
    stored = spark.read.format("rocketmq-commitlog").load(store)
    inflated = spark.read.format("rocketmq-commitlog").option("decompress", "true").load(store)
    raw = {r.commitLogOffset: r for r in stored.where("sysFlag % 2 = 1").collect()}
    assert raw
    for row in inflated.where("sysFlag % 2 = 1").collect():
        assert row.body == zlib.decompress(raw[row.commitLogOffset].body)


def test_commitlog_source_options(spark: Any, stores: Path) -> None:
    reader = spark.read.format("rocketmq-commitlog")
    crc = reader.option("verifyCrc", "true").option("includeBody", "false")
    rows = crc.load(str(stores / "crc-flip")).select("crcOk", "body").collect()
    assert sum(1 for row in rows if row.crcOk is False) == 1
    assert all(row.body is None for row in rows)
    topic = reader.option("topics", "TopicTest").load(str(stores / "multi"))
    assert {row.topic for row in topic.select("topic").distinct().collect()} == {"TopicTest"}
    summary = reader.option("summary", "files").load(str(stores / "torn-tail")).collect()
    assert [row.outcome for row in summary if row.lastFile] == ["invalid"]


def test_a_file_uri_is_read_like_a_path(spark: Any, stores: Path) -> None:
    reader = spark.read.format("rocketmq-commitlog").option("splitSize", "20000")
    by_path = reader.load(str(stores / "multi")).select("commitLogOffset", "msgId").collect()
    by_uri = reader.load(f"file://{stores / 'multi'}").select("commitLogOffset", "msgId")
    assert sorted(by_uri.collect()) == sorted(by_path)


def test_a_torn_tail_is_not_read_as_messages(spark: Any, oracle) -> None:
    crash = oracle("s2_crash")
    frame = spark.read.format("rocketmq-commitlog").load(str(crash.root / "store_torn_half_record"))
    last = frame.orderBy("commitLogOffset", ascending=False).first()
    assert last.commitLogOffset + last.storeSize == crash.manifest["lastValidEnd"]


def test_the_source_splits_the_last_file_and_coalesces_small_ones(
    spark: Any, oracle, tmp_path: Path
) -> None:
    """A load() parallelises by splitSize over every file, the last (pre-allocated, 1 GiB)
    one included, and gathers small files into partitions of up to splitSize."""
    one_file = tmp_path / "one-file"
    generate("large", one_file, FixtureOptions(messages=20_000))
    frame = spark.read.format("rocketmq-commitlog").option("splitSize", str(1 << 20))
    loaded = frame.load(str(one_file))
    assert loaded.rdd.getNumPartitions() >= 5  # 5.6 MB of records in one 1 GiB file
    offsets = [row.commitLogOffset for row in loaded.select("commitLogOffset").collect()]
    with Store.open_read(one_file) as store:
        expected = [offset for offset, *_ in store.commitlog.scan()]
    assert sorted(offsets) == expected  # each record once, none from the zeros
    small = oracle("s1_multi").store  # 30 files of 64 KiB
    files = len(list((small / "commitlog").iterdir()))
    split = 4 * 65536
    coalesced = spark.read.format("rocketmq-commitlog").option("splitSize", str(split))
    frame = coalesced.load(str(small))
    assert frame.rdd.getNumPartitions() <= files // 4 + 1
    assert frame.count() == 3002  # every message of the broker's store
    torn = oracle("s2_crash")
    cut = spark.read.format("rocketmq-commitlog").option("splitSize", "20000")
    last = cut.load(str(torn.root / "store_torn_half_record"))
    assert last.rdd.getNumPartitions() > 1
    newest = last.orderBy("commitLogOffset", ascending=False).first()
    assert newest.commitLogOffset + newest.storeSize == torn.manifest["lastValidEnd"]


def test_consumequeue_source(spark: Any, stores: Path) -> None:
    frame = spark.read.format("rocketmq-consumequeue").load(str(stores / "multi"))
    assert "storeSize" in frame.columns  # the commit-log source's name for a record's size
    rows = frame.collect()
    with Store.open_read(stores / "multi") as store:
        expected = sorted(
            (topic, queue_id, unit.queue_offset, unit.physical_offset, unit.size, unit.tags_code)
            for topic, queue_id in list_queues(store.consumequeue_dir)
            for unit in store.consume_queue(topic, queue_id).units()
        )
    assert sorted(tuple(row)[:6] for row in rows) == expected


# -- export and stats ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", BROKER_STORES)
def test_broker_stores_export_to_parquet_as_the_broker_reported(
    spark: Any, oracle, tmp_path: Path, name: str
) -> None:
    pipeline = SparkPipeline(spark, str(oracle(name).store), PipelineOptions(split=400_000))
    result = pipeline.export(str(tmp_path / "out"), "parquet", decompress=False)
    rows = parquet_rows(tmp_path / "out")
    assert result.messages == len(rows) == len({row["commitLogOffset"] for row in rows})
    check_against_broker(rows, oracle(name).manifest)


def test_export_and_stats_equal_the_local_engine(spark: Any, stores: Path, tmp_path: Path):
    # both export in one pass (the part files of ranges past a file's end are dropped after):
    # a torn tail cut in ranges of 5,000 bytes leaves such ranges; in ranges of 40,000, files
    # of 16 KiB share parts
    for name, split in (("multi", 30000), ("crc-flip", 40000), ("torn-tail", 5000)):
        options = PipelineOptions(split=split)
        on_spark = SparkPipeline(spark, str(stores / name), options)
        here = LocalPipeline(str(stores / name), options)
        for fmt in ("parquet", "jsonl"):
            exported = on_spark.export(str(tmp_path / f"{name}-{fmt}-spark"), fmt)
            assert exported.to_dict()["messages"] > 0
            here.export(str(tmp_path / f"{name}-{fmt}-local"), fmt)
            assert tree_digest(tmp_path / f"{name}-{fmt}-spark") == tree_digest(
                tmp_path / f"{name}-{fmt}-local"
            )
        assert on_spark.stats().to_dict() == here.stats().to_dict()


# -- verify and rebuild -------------------------------------------------------------------------


def _verify_both(spark: Any, store_dir: Path, config: StoreConfig | None, split: int):
    settings = VerifyOptions(max_findings=None)
    with Store.open_read(store_dir, config) as store:
        local = verify_store(store, settings)
    with Store.open_read(store_dir, config) as store:
        pipeline = SparkPipeline(spark, str(store_dir), PipelineOptions(split=split))
        remote = pipeline.verify(store, settings)
    return local, remote


def test_verify_on_spark_finds_what_the_local_engine_finds(spark: Any, stores: Path, oracle):
    # ranges are checked in-process against every scenario in tests/engine/test_verify_ranges;
    # here: the same merge with the ranges checked on executors
    damaged = ("multi", "torn-tail", "missing-file", "index-broken-chain", "cq-truncated", "lmq")
    cases = [(stores / name, None, 20000) for name in damaged]
    oracle_config = StoreConfig(**ORACLE_CONFIG)
    cases += [(oracle("s2_crash").root / "store_torn_random_garbage", oracle_config, 300_000)]
    for store_dir, config, split in cases:
        local, remote = _verify_both(spark, store_dir, config, split)
        assert sorted(map(repr, remote.findings)) == sorted(map(repr, local.findings)), store_dir
        assert remote.checked == local.checked and remote.ok == local.ok


def _rebuild(
    store_dir: Path, config: StoreConfig | None, spark: Any | None, split: int = 5000
) -> dict:
    with Store.open_write(store_dir, config) as store:
        plan = plan_rebuild(store)
        apply_rebuild(store, plan)
        if spark is None:
            dispatcher = Dispatcher(store, clock=clock)
            try:
                result = dispatcher.run(plan.from_offset)
            finally:
                dispatcher.close()
        else:
            pipeline = SparkPipeline(spark, str(store_dir), PipelineOptions(split=split))
            result = pipeline.rebuild(
                store, from_offset=plan.from_offset, topics=None, build_index=True, clock=clock
            )
    for quarantined in store_dir.glob("quarantine"):
        shutil.rmtree(quarantined)
    return result.to_dict()


REBUILT = ["multi", "txn", "delay", "v2", "torn-tail", "garbage-after-end", "crc-flip",
           "missing-file", "lmq"]  # fmt: skip


@pytest.mark.parametrize("name", REBUILT)
def test_rebuild_on_spark_writes_the_same_bytes(
    spark: Any, stores: Path, tmp_path: Path, name: str
) -> None:
    shutil.copytree(stores / name, tmp_path / "local")
    shutil.copytree(stores / name, tmp_path / "spark")
    # staging folders of Spark rebuilds killed before they removed them (the second as it
    # removed it): this rebuild removes them
    for left in (".consumequeue.rebuild-0123456789ab", ".consumequeue.rebuild-ba98.removing"):
        (tmp_path / "spark" / left / "TopicTest" / "0").mkdir(parents=True)
        (tmp_path / "spark" / left / "TopicTest" / "0" / f"{0:020d}").write_bytes(bytes(40))
    local = _rebuild(tmp_path / "local", None, None)
    remote = _rebuild(tmp_path / "spark", None, spark)
    assert remote == local
    assert tree_digest(tmp_path / "spark") == tree_digest(tmp_path / "local")
    assert not list((tmp_path / "spark").glob(".consumequeue.rebuild-*"))


def _lmq_files(store_dir: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(store_dir)): path.read_bytes()
        for path in sorted((store_dir / "consumequeue").glob("%LMQ%*/0/*"))
    }


def test_rebuild_on_spark_gives_copies_as_each_records_broker_did(
    spark: Any, stores: Path, tmp_path: Path
) -> None:
    """A 5.x broker's retried LMQ message waiting in SCHEDULE_TOPIC_XXXX (properties ending
    with 0x02, the original's offsets) gets no copy; a 4.9 broker's delayed one (properties
    ending without) gets units of its own. The Spark rebuild reads the last byte of such
    records to tell them apart, and writes what the local engine and a dispatch write. A
    record a broker's dispatch stops at (an empty offset piece before an LMQ name) gets the
    units before that piece, and the same warning, from both engines."""
    base = tmp_path / "base"
    shutil.copytree(stores / "lmq", base)
    with Store.open_read(base) as store:
        records = [store.commitlog.read(offset) for offset, *_ in store.commitlog.scan()]
    original = [m for m in records if "INNER_MULTI_QUEUE_OFFSET" in m.properties][-1]
    names = ("INNER_MULTI_DISPATCH", "INNER_MULTI_QUEUE_OFFSET")
    retried = {name: original.properties[name] for name in names} | {"DELAY": "3"}
    delayed = {"INNER_MULTI_DISPATCH": original.properties["INNER_MULTI_DISPATCH"], "DELAY": "2"}
    for topic, properties, as_5x in (("%RETRY%g", retried, True), ("MqttTopic", delayed, False)):
        with Store.open_write(base) as store:
            appender = store.appender(multi_dispatch=True, trailing_separator=as_5x)
            appender.append_many([Message(topic=topic, body=b"x", properties=properties)])
    with Store.open_write(base) as store:
        next_offset = store.consume_queue("%LMQ%room-1", 0).max_offset + 1  # after the delayed
        stuck = {"INNER_MULTI_DISPATCH": "%LMQ%room-1,Plain,%LMQ%room-2"}
        stuck["INNER_MULTI_QUEUE_OFFSET"] = f"{next_offset},,0"
        appender = store.appender(multi_dispatch=False, trailing_separator=True)
        appender.append_many([Message(topic="MqttTopic", body=b"y", properties=stuck)])
    with Store.open_write(base) as store:
        dispatcher = Dispatcher(store, clock=clock)
        try:
            dispatcher.run(0)
        finally:
            dispatcher.close()
    dispatched = _lmq_files(base)
    shutil.copytree(base, tmp_path / "local")
    shutil.copytree(base, tmp_path / "spark")
    local = _rebuild(tmp_path / "local", None, None)
    remote = _rebuild(tmp_path / "spark", None, spark)
    assert remote == local
    assert [text for text in local["problems"] if "stops here for ever" in text]
    assert tree_digest(tmp_path / "spark") == tree_digest(tmp_path / "local")
    assert _lmq_files(tmp_path / "spark") == dispatched
    with Store.open_read(tmp_path / "spark") as store:
        assert verify_store(store).counts == {"dispatch-stop": 1}


@pytest.mark.parametrize("copy", ["store", "store_torn_half_record"])
def test_rebuild_of_broker_stores_on_spark(spark: Any, oracle, tmp_path: Path, copy: str):
    config = StoreConfig(**ORACLE_CONFIG)
    for engine in ("local", "spark"):
        shutil.copytree(oracle("s2_crash").root / copy, tmp_path / engine)
    local = _rebuild(tmp_path / "local", config, None)
    remote = _rebuild(tmp_path / "spark", config, spark, split=300_000)
    assert remote == local
    assert tree_digest(tmp_path / "spark") == tree_digest(tmp_path / "local")


def test_spark_reads_a_local_export_as_arrow_does(spark: Any, stores: Path, tmp_path: Path):
    """The local engine's Parquet (dictionary-coded text, offsets and times as deltas) reads
    in Spark's own Parquet reader as it reads in Arrow."""
    LocalPipeline(str(stores / "multi"), PipelineOptions(split=9000)).export(
        str(tmp_path / "out"), "parquet"
    )
    arrow_rows = parquet_rows(tmp_path / "out")
    spark_rows = [
        row.asDict()
        for row in spark.read.parquet(str(tmp_path / "out")).orderBy("commitLogOffset").collect()
    ]
    assert len(spark_rows) == len(arrow_rows) == 602
    for name in ("topic", "queueOffset", "commitLogOffset", "bornTimestamp", "storeTimestamp",
                 "bornHost", "storeHost", "tags", "version", "file", "bornTime", "storeTime",
                 "body", "uniqKey"):  # fmt: skip
        expected = [row[name] for row in arrow_rows]
        found = [row[name] for row in spark_rows]
        if name.endswith("Time"):  # Spark gives naive local times; compare the instants
            expected = [value.timestamp() for value in expected]
            found = [value.timestamp() for value in found]
        elif name == "body":
            found = [bytes(value) for value in found]
        assert found == expected, name


# -- the command line ---------------------------------------------------------------------------


def test_commands_with_the_spark_engine(spark: Any, oracle, tmp_path: Path) -> None:
    store_dir = oracle("s1_multi").copy_to(tmp_path)
    exported = run_cli(
        "export", store_dir, "--to", tmp_path / "out", "--engine", "spark", "--json",
        *ORACLE_OPTIONS,
    )  # fmt: skip
    assert exported.exit_code == 0, exported.stderr
    assert json.loads(exported.stdout)["messages"] == 3002
    stats = run_cli("stats", store_dir, "--master", "local[2]", "--json", *ORACLE_OPTIONS)
    assert "engine: spark (Spark settings" in stats.stderr
    assert json.loads(stats.stdout)["messages"] == 3002
    verified = run_cli("verify", store_dir, "--engine", "spark", "--json", *ORACLE_OPTIONS)
    assert verified.exit_code == 0 and json.loads(verified.stdout)["ok"] is True
    before = tree_digest(store_dir / "consumequeue")
    rebuilt = run_cli(
        "dispatch", store_dir, "--rebuild", "--yes", "--engine", "spark", "--json", *ORACLE_OPTIONS
    )
    assert rebuilt.exit_code == 0, rebuilt.stderr
    assert json.loads(rebuilt.stdout)["unitsWritten"] == 3002
    assert tree_digest(store_dir / "consumequeue") == before  # the broker's own bytes
    assert (store_dir / "quarantine").is_dir()
    refused = run_cli("dispatch", store_dir, "--engine", "spark")
    assert refused.exit_code == 2 and "--rebuild" in refused.stderr
    # a rebuild of A's queues on Spark, with B's records before A's last in no queue and no
    # 'abort': a broker would never dispatch them, so 'abort' is made and kept
    lagging = tmp_path / "lagging"
    lines = "".join(f'{{"topic": "{topic}", "body": "x"}}\n' for _ in range(3) for topic in "AB")
    assert run_cli("append", lagging, "--create", "--input", "-", input=lines).exit_code == 0
    (lagging / "abort").unlink()
    partial = run_cli(
        "dispatch", lagging, "--rebuild", "--yes", "--topic", "A", "--engine", "spark", "--json"
    )
    assert partial.exit_code == 0, partial.stderr
    assert json.loads(partial.stdout)["unitsWritten"] == 3
    assert (lagging / "abort").exists() and "'abort' is kept" in partial.stderr


def test_consecutive_ranges_share_a_task_up_to_the_sources_split() -> None:
    from rmqstore.spark.jobs import task_count
    from rmqstore.spark.sources import SOURCE_SPLIT

    mib = 1024 * 1024
    assert task_count(9, 32 * mib, 2) == 2  # the 1M store's 279 MB: about 128 MiB a task
    assert task_count(9, 32 * mib, 1) == 2
    assert task_count(9, 32 * mib, 8) == 8  # at least one task per core
    assert task_count(3, 32 * mib, 8) == 3  # never more than the jobs
    assert task_count(10_000, 32 * mib, 100) == 10_000 * 32 * mib // SOURCE_SPLIT
    assert task_count(5, 0, 2) == 5  # whole files: a task each
    assert task_count(1, 4096, 2) == 1


def test_a_failed_jobs_error_is_one_line_without_javas_class_names() -> None:
    from rmqstore.spark.jobs import spark_errors

    class Py4JJavaError(Exception):  # as py4j words a Java exception (its module is py4j's)
        __module__ = "py4j.protocol"

    def fails() -> None:
        raise Py4JJavaError(
            "An error occurred while calling o45.collect.\n"
            ": org.apache.spark.SparkException: Job aborted due to stage failure: lost\n"
            "\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages\n"
        )

    with pytest.raises(SparkUnavailable) as raised:
        spark_errors(fails)()
    assert str(raised.value) == "the Spark job failed: Job aborted due to stage failure: lost"


def test_a_py4j_error_met_while_a_job_was_interrupted_is_the_interruption() -> None:
    """PySpark leaving an interrupted job talks to the JVM (``setCallSite``), which got the
    same hangup and may be gone: py4j's error then took the interruption's place, and the
    command said the job failed (exit 2) instead of stopping on the signal (exit 129)."""
    from rmqstore.commands.signals import HungUp
    from rmqstore.spark.jobs import spark_errors

    class Py4JNetworkError(Exception):
        __module__ = "py4j.protocol"

    def interrupted() -> None:
        try:
            raise HungUp
        finally:  # as SCCallSiteSync.__exit__ does
            raise Py4JNetworkError("Answer from Java side is empty")

    with pytest.raises(HungUp):
        spark_errors(interrupted)()


def _run_as_a_terminals_job(
    command: list[str], env: dict[str, str]
) -> tuple[subprocess.Popen, str]:
    """Run ``command`` (with ``env`` added) in a process group of its own, as a terminal's
    job is, SIGINT delivered to it; the process and its stderr once it has ended (its group
    killed after 240 s)."""
    done = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, **env},
        preexec_fn=sigint_delivered,
    )
    try:
        _, stderr = done.communicate(timeout=240)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(done.pid, signal.SIGKILL)
    return done, stderr


# a Spark rebuild whose executor sends SIGINT to the command's process group (a Ctrl-C in the
# terminal: the driver acts on it, the JVM ignores it, the Python workers are in a group of
# their own) as it begins writing the queues, then, once the command has removed its staging
# folder, goes on writing the queues, as a cancelled task does until Spark ends its worker
SIGNALLED_SPARK_REBUILD = """
import os, signal, sys, time
import rmqstore.spark.jobs as jobs
from rmqstore.commands.main import main
os.environ["COMMAND_GROUP"] = str(os.getpgrp())
written = jobs.write_sorted_units
def write_sorted_units(root, file_size, min_offset, rows, topics):  # shipped by value
    def late(rows):
        try:  # once: the first task's worker
            os.close(os.open(os.environ["SIGNAL_MARK"], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            yield from rows
            return
        os.killpg(int(os.environ["COMMAND_GROUP"]), signal.SIGINT)
        for _ in range(500):
            if not root.exists():
                break
            time.sleep(0.01)
        yield from rows
    return written(root, file_size, min_offset, late(rows), topics)
jobs.write_sorted_units = write_sorted_units
sys.argv = ["rmqstore", "dispatch", *sys.argv[1:]]
main()
"""


def test_a_ctrl_c_during_a_spark_rebuild_leaves_no_staging_folder(tmp_path: Path) -> None:
    """A Ctrl-C during ``dispatch --rebuild --engine spark`` stops it in one line (exit 130),
    and its staging folder goes, though a task goes on writing queues after the command
    removed it: the writers do not make it again (they made it, and the queues after, with
    mkdir -p, and it was left in the store's root). The store then rebuilds and verifies."""
    store = tmp_path / "store"
    generate("multi", store, FixtureOptions(messages=3000))
    command = [sys.executable, "-c", SIGNALLED_SPARK_REBUILD, str(store), "--rebuild", "--yes",
               "--engine", "spark", "--spark-conf",
               f"spark.driver.extraJavaOptions={TEST_JVM_OPTIONS}"]  # fmt: skip
    done, stderr = _run_as_a_terminals_job(command, {"SIGNAL_MARK": str(tmp_path / "signalled")})
    assert (tmp_path / "signalled").exists()
    assert done.returncode == 130, stderr
    assert stderr.strip().startswith("rmqstore: error: interrupted"), stderr
    assert not [path.name for path in store.iterdir() if path.name.startswith(".consumequeue")]
    assert run_cli("dispatch", store, "--rebuild", "--yes").exit_code == 0
    assert run_cli("verify", store).exit_code == 0


# an export whose executor sends ``SIGNAL`` to the command's process group once it has
# written a part file, as a terminal closing (SIGHUP) or a service manager stopping a unit
# (SIGTERM) reaches the command and its JVM together (PySpark's daemon, which starts the
# Python workers, puts itself and them in a group of their own)
SIGNALLED_SPARK_EXPORT = """
import os, signal, sys
import rmqstore.pipeline.local as local
from rmqstore.commands.main import main
os.environ["COMMAND_GROUP"] = str(os.getpgrp())  # the JVM, and its workers, inherit it
exported = local.export_range
def export_range(*args):  # defined here, so Spark ships it to the executors by value
    result = exported(*args)
    try:  # once: the first part file's worker
        os.close(os.open(os.environ["FIRST_PART_MARK"], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return result
    os.killpg(int(os.environ["COMMAND_GROUP"]), signal.SIGNAL)
    return result
local.export_range = export_range
sys.argv = ["rmqstore", "export", *sys.argv[1:]]
main()
"""


@pytest.mark.parametrize(
    ("name", "code", "said"),
    [
        ("SIGHUP", 129, "hung up (SIGHUP)"),
        ("SIGTERM", 143, "terminated (SIGTERM)"),
        ("SIGINT", 130, "interrupted"),
    ],
)
def test_a_signal_to_the_commands_group_stops_a_spark_export_in_one_line(
    tmp_path: Path, name: str, code: int, said: str
) -> None:
    """The command stops as on the signal alone (its one line, its exit code, nothing of the
    export left), whatever its JVM, which got it too (but SIGINT, which PySpark starts it
    ignoring), prints as it goes: no py4j or Java text on stderr, and no process of the
    session left running, the JVM's Python workers included."""
    store = tmp_path / "store"
    generate("multi", store, FixtureOptions(messages=3000))
    out = tmp_path / "exports" / "out"
    out.parent.mkdir()
    script = SIGNALLED_SPARK_EXPORT.replace("SIGNAL", name)
    command = [sys.executable, "-c", script, str(store), "--engine", "spark", "--to", str(out),
               "--split-size", "65536", "--spark-conf",
               f"spark.driver.extraJavaOptions={TEST_JVM_OPTIONS}"]  # fmt: skip
    done, stderr = _run_as_a_terminals_job(
        command, {"FIRST_PART_MARK": str(tmp_path / "signalled")}
    )
    assert done.returncode == code, stderr
    assert stderr.strip() == f"rmqstore: error: {said}"
    assert list(out.parent.iterdir()) == []
    left = []
    for _ in range(100):  # the JVM's shutdown ends within moments of the command's
        left = subprocess.run(
            ["ps", "-o", "pid=,args=", "-s", str(done.pid)], capture_output=True, text=True
        ).stdout.split("\n")
        left = [line for line in left if line.strip()]
        if not left:
            break
        time.sleep(0.1)
    assert left == []
