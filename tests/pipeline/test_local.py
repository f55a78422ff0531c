"""export and stats on the local engine: every message exported as ``read`` shows it and as
the real broker reported it; statistics add up; bad destinations are refused cleanly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from rmqstore.errors import InputError, StoreIOError
from rmqstore.fixtures import generate
from rmqstore.pipeline.local import (
    LocalPipeline,
    Pipeline,
    PipelineOptions,
    _Background,
    export_parts,
)
from rmqstore.pipeline.ranges import LogPlan
from rmqstore.record import COMPRESSED_FLAG
from rmqstore.store import Store

from support import check_against_broker, fresh_python, parquet_rows, run_cli

BROKER_STORES = ["s1_multi", "s3_txn_delay", "v533_s1_multi", "v533_s3_txn"]


@pytest.mark.parametrize("name", BROKER_STORES)
def test_broker_stores_export_as_the_broker_reported(oracle, tmp_path: Path, name: str) -> None:
    store_dir = oracle(name).store
    pipeline = LocalPipeline(str(store_dir), PipelineOptions(split=20000))
    result = pipeline.export(str(tmp_path / "out"), "parquet", decompress=False)
    rows = parquet_rows(tmp_path / "out")
    assert result.messages == len(rows)
    check_against_broker(rows, oracle(name).manifest)  # the bodies as stored
    pipeline.export(str(tmp_path / "inflated"), "parquet")  # the default: as consumed
    inflated = {row["commitLogOffset"]: row for row in parquet_rows(tmp_path / "inflated")}
    compressed = [row for row in rows if row["sysFlag"] & COMPRESSED_FLAG]
    for row in rows:
        expected = zlib.decompress(row["body"]) if row["sysFlag"] & COMPRESSED_FLAG else row["body"]
        assert inflated[row["commitLogOffset"]]["body"] == expected
        stamp = inflated[row["commitLogOffset"]]["storeTime"]
        assert stamp == datetime.fromtimestamp(row["storeTimestamp"] / 1000, timezone.utc)
    if name == "s1_multi":
        assert compressed  # the broker store holds compressed bodies


def _damaged(store_dir: Path, which: int, records_in: int) -> None:
    """``multi`` with a record's size field overwritten: in commit-log file ``which`` (0 the
    first, -1 the last), ``records_in`` records after the file's start."""
    generate("multi", store_dir)
    path = sorted((store_dir / "commitlog").iterdir())[which]
    with open(path, "r+b") as handle:
        position = 0
        for _ in range(records_in):
            handle.seek(position)
            position += int.from_bytes(handle.read(4), "big")
        handle.seek(position)
        handle.write((0x7FFF0000).to_bytes(4, "big"))  # its size: more than the file holds


@pytest.mark.parametrize(
    "scenario",
    ["multi", "torn-tail", "garbage-after-end", "missing-file", "crc-flip", "first", "last"],
)
@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_one_pass_export_writes_what_a_walk_first_writes(
    tmp_path: Path, scenario: str, fmt: str
) -> None:
    """The local engine walks and writes in one pass; the Spark engine walks the log first and
    then writes up to where each file's records end (as an export to a URI does). Both give
    the same files, whole small files sharing a part (splits of 40,000 and 1 MiB) or not."""
    store_dir = tmp_path / "store"
    if scenario in ("first", "last"):  # a damaged record early in the first or last file
        _damaged(store_dir, 0 if scenario == "first" else -1, 30 if scenario == "first" else 3)
    else:
        generate(scenario, store_dir)
    workers = 2 if scenario == "multi" else 1  # worker processes: one scenario is enough
    for split in (9000, 40000, 1 << 20):
        pipeline = LocalPipeline(str(store_dir), PipelineOptions(split=split, workers=workers))
        one_pass = pipeline.export(str(tmp_path / f"one-{split}-{fmt}"), fmt)
        in_runner = Pipeline.export(pipeline, str(tmp_path / f"run-{split}-{fmt}"), fmt)
        plan = pipeline.plan()
        walked = pipeline.walk(check_crc=False, plan=plan)
        walk_first = export_parts(
            str(store_dir),
            pipeline.bounded_ranges(walked),
            pipeline.export_rows(None, True, True),
            str(tmp_path / f"walk-{split}-{fmt}"),
            fmt,
            walked,
            plan,
            pipeline.run,
            split,
        )
        assert one_pass.to_dict() | {"destination": ""} == in_runner.to_dict() | {"destination": ""}
        # written in place, a walk-first export numbers its parts as planned (gaps and all)
        assert one_pass.to_dict() | {"destination": "", "files": []} == walk_first.to_dict() | {
            "destination": "",
            "files": [],
        }
        assert one_pass.messages > 0
        written = sorted((tmp_path / f"one-{split}-{fmt}").iterdir())
        logs = sorted((store_dir / "commitlog").iterdir())
        whole = split >= 2 * logs[0].stat().st_size  # files that share parts
        assert (len(written) < len(logs) - 1) == whole
        expected = sorted((tmp_path / f"run-{split}-{fmt}").iterdir())
        assert [p.name for p in written] == [p.name for p in expected]
        assert [p.read_bytes() for p in written] == [p.read_bytes() for p in expected]
        parts = sorted((tmp_path / f"walk-{split}-{fmt}").iterdir())
        if fmt == "jsonl":  # the same lines in the same order
            lines = b"".join(p.read_bytes() for p in written)
            assert lines == b"".join(p.read_bytes() for p in parts)
        else:
            assert parquet_rows(parts[0].parent) == parquet_rows(written[0].parent)
        if split == 1 << 20:  # every file whole, and in one part
            assert len(written) == len(parts) == 1


def test_jsonl_export_holds_what_read_prints(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    generate("multi", store_dir)
    result = run_cli(
        "export", store_dir, "--to", tmp_path / "out", "--engine", "local", "--format", "jsonl"
    )
    assert result.exit_code == 0, result.output
    lines = [
        line
        for part in sorted((tmp_path / "out").glob("part-*.jsonl"))
        for line in part.read_text(encoding="utf-8").splitlines()
    ]
    exported = [json.loads(line) for line in lines]
    assert len(exported) == 602
    read = run_cli(
        "read", store_dir, "--from-offset", "0", "--count", "1000", "--jsonl", "--body", "base64"
    )
    documents = [json.loads(line) for line in read.stdout.splitlines()]
    assert len(documents) == len(exported)
    for row, document in zip(exported, documents, strict=True):
        for name in ("msgId", "topic", "queueId", "queueOffset", "storeSize", "bornHost",
                     "storeHost", "properties", "tags", "keys", "uniqKey", "sysFlag"):  # fmt: skip
            assert name in row and name in document, name  # nulls written, as read does
            assert row[name] == document[name], name
        assert row["body"] == (document.get("body") or "")


def test_parquet_layout_text_of_few_values_as_dictionaries_offsets_as_deltas(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file, version, host and tags columns reach the Parquet writer as Arrow
    dictionaries, one per row group (batches whose hosts come in another order included), so
    it writes them dictionary-encoded throughout; they read back as the strings the other
    outputs give, under the schema a file written from strings stores. Offsets and times are
    stored as deltas."""
    import pyarrow.parquet as pq

    from rmqstore.pipeline import local as local_module
    from rmqstore.pipeline.rows import ALWAYS_PRESENT, CODED_TEXT, COMMITLOG_COLUMNS, arrow_schema

    store_dir = tmp_path / "store"
    generate("multi", store_dir)  # born hosts: IPv6 every fourth message, IPv4 the others
    monkeypatch.setattr(local_module, "EXPORT_BATCH_ROWS", 7)  # many batches a row group
    pipeline = LocalPipeline(str(store_dir), PipelineOptions(split=1 << 20))
    pipeline.export(str(tmp_path / "parquet"), "parquet")
    pipeline.export(str(tmp_path / "jsonl"), "jsonl")
    rows = parquet_rows(tmp_path / "parquet")
    documents = [
        json.loads(line)
        for part in sorted((tmp_path / "jsonl").glob("part-*.jsonl"))
        for line in part.read_text(encoding="utf-8").splitlines()
    ]
    assert len(rows) == len(documents) == 602
    assert len({row["bornHost"] for row in rows}) == 2
    for name in sorted(CODED_TEXT):
        assert [row[name] for row in rows] == [document[name] for document in documents], name
    for part in sorted((tmp_path / "parquet").glob("part-*.parquet")):
        written = pq.ParquetFile(part)
        assert written.schema_arrow == arrow_schema(COMMITLOG_COLUMNS, not_null=ALWAYS_PRESENT)
        # columns every message has a value in are REQUIRED (no definition levels stored);
        # the map's key leaf has one level for its repeated pairs
        top_level: dict[str, Any] = {}
        for index in range(len(written.schema)):
            column = written.schema.column(index)
            top_level.setdefault(column.path.split(".")[0], column)  # the map's key leaf
        for name, column in top_level.items():
            optional = column.max_definition_level - column.max_repetition_level
            assert optional == (name not in ALWAYS_PRESENT), name
        # the same rows written from strings (the writer hashing them) take as many bytes
        again = tmp_path / "again.parquet"
        pq.write_table(
            pq.read_table(part),
            again,
            row_group_size=local_module.ROW_GROUP_ROWS,
            use_dictionary=local_module._DICTIONARY_COLUMNS,
            write_statistics=local_module._STATISTICS_COLUMNS,
        )
        hashed = pq.ParquetFile(again).metadata
        for group in range(written.metadata.num_row_groups):
            chunks = written.metadata.row_group(group)
            for index in range(chunks.num_columns):  # a leaf column each (a map has two)
                chunk = chunks.column(index)
                name = chunk.path_in_schema.split(".")[0]
                if name in local_module._DELTA_COLUMNS:  # offsets and times: as deltas
                    assert "DELTA_BINARY_PACKED" in chunk.encodings, name
                if name in CODED_TEXT:
                    size = chunk.total_compressed_size
                    plain = hashed.row_group(group).column(index).total_compressed_size
                    assert size <= plain + 16, (part.name, group, name, size, plain)


def test_topics_and_no_body(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    generate("multi", store_dir)
    pipeline = LocalPipeline(str(store_dir), PipelineOptions(split=9000))
    pipeline.export(
        str(tmp_path / "a"), "parquet", topics=frozenset({"TopicTest"}), include_body=False
    )
    rows = parquet_rows(tmp_path / "a")
    assert rows and {row["topic"] for row in rows} == {"TopicTest"}
    assert all(row["body"] is None for row in rows)


def test_export_refuses_an_existing_non_empty_directory(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    generate("basic", store_dir)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    result = run_cli("export", store_dir, "--to", tmp_path / "out", "--engine", "local")
    assert result.exit_code == 2
    assert "not an empty directory" in result.stderr
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"
    with pytest.raises(InputError):
        LocalPipeline(str(store_dir), PipelineOptions()).export(str(tmp_path / "out"), "csv")


@pytest.mark.parametrize("failing", ["building", "encoding"])
def test_a_failed_export_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    store_dir = tmp_path / "store"
    generate("multi", store_dir)
    pipeline = LocalPipeline(str(store_dir), PipelineOptions(split=9000))
    calls = 0

    def no_space(*args: object, **kwargs: object) -> None:
        nonlocal calls
        calls += 1
        if calls == 3:  # some parts are written by then
            raise OSError(28, "No space left on device")
        return original(*args, **kwargs)

    import pyarrow.parquet as pq

    import rmqstore.pipeline.local as pipeline_module

    owner = pipeline_module.MessageBatcher if failing == "building" else pq.ParquetWriter
    name = "__call__" if failing == "building" else "write_table"
    original = getattr(owner, name)
    monkeypatch.setattr(owner, name, lambda *args, **kwargs: no_space(*args, **kwargs))
    with pytest.raises(StoreIOError, match="No space left"):
        pipeline.export(str(tmp_path / "out"), "parquet")
    assert calls == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]


def test_a_failed_worker_process_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A range a worker process cannot read (its file went away after planning) fails the
    export; the parts other workers wrote go with it."""
    store_dir = tmp_path / "store"
    generate("multi", store_dir)
    import rmqstore.pipeline.local as pipeline_module

    planned = pipeline_module.plan_log

    def with_a_missing_file(*args: object, **kwargs: object) -> LogPlan:
        plan = planned(*args, **kwargs)
        ranges = plan.ranges
        middle = len(ranges) // 2
        gone = replace(ranges[middle], name=f"{ranges[middle].file_start + 1:020d}")
        return replace(plan, ranges=[*ranges[:middle], gone, *ranges[middle:]])

    monkeypatch.setattr(pipeline_module, "plan_log", with_a_missing_file)
    pipeline = LocalPipeline(str(store_dir), PipelineOptions(split=9000, workers=2))
    with pytest.raises(StoreIOError, match="is gone since the store was listed"):
        pipeline.export(str(tmp_path / "out"), "parquet")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]


def test_a_part_file_made_as_a_stopped_export_removes_its_folder_is_not_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Spark task being cancelled (a Ctrl-C) goes on writing for a moment: a part file it
    made in the staging folder while the export removed it left the folder behind, with
    that file (the folder could not be removed once not empty). The folder is renamed
    first: a part file made by its path after that fails."""
    store_dir = tmp_path / "store"
    generate("multi", store_dir)
    out = tmp_path / "exports" / "out"
    out.parent.mkdir()
    real_rmdir = os.rmdir
    made: list[str] = []

    def rmdir_as_a_part_is_made(path: Any, *args: Any, **kwargs: Any) -> None:
        staging = [entry for entry in out.parent.iterdir() if entry.name.startswith(".out.")]
        if staging and not made:  # the export's folder is being removed: a late writer
            late = out.parent / staging[0].name.removesuffix(".removing") / "range-00009.jsonl"
            try:
                late.write_bytes(b"late")
                made.append("in the folder")
            except FileNotFoundError:
                made.append("refused")
        real_rmdir(path, *args, **kwargs)

    import rmqstore.pipeline.local as pipeline_module

    monkeypatch.setattr(pipeline_module, "_number_parts", _interrupted)
    monkeypatch.setattr(os, "rmdir", rmdir_as_a_part_is_made)
    with pytest.raises(KeyboardInterrupt):
        LocalPipeline(str(store_dir), PipelineOptions(split=9000)).export(str(out), "jsonl")
    assert made == ["refused"]
    assert list(out.parent.iterdir()) == []


def _interrupted(*args: object) -> None:
    raise KeyboardInterrupt


def test_not_a_store(tmp_path: Path) -> None:
    result = run_cli("stats", tmp_path / "nothing", "--engine", "local")
    assert result.exit_code == 2 and "no such directory" in result.stderr
    result = run_cli("export", tmp_path, "--to", tmp_path / "out", "--engine", "local")
    assert result.exit_code == 2 and "not a RocketMQ store" in result.stderr


def test_stats_add_up(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    generate("crc-flip", store_dir)
    stats = LocalPipeline(str(store_dir), PipelineOptions(split=5000)).stats().to_dict()
    with Store.open_read(store_dir) as store:
        records = [(o, h, t) for o, h, t, *_ in store.commitlog.scan()]
    assert stats["messages"] == len(records) == sum(f["records"] for f in stats["files"])
    assert sum(f["crcFailures"] for f in stats["files"]) == 1
    assert sum(f["blankBytes"] for f in stats["files"]) > 0
    queues = {(q["topic"], q["queueId"]): q for q in stats["queues"]}
    assert sum(q["messages"] for q in queues.values()) == len(records)
    for queue in queues.values():
        assert queue["maxOffset"] - queue["minOffset"] == queue["messages"]
        assert len(queue["topTags"]) <= 5
    human = run_cli("stats", store_dir, "--engine", "local")
    assert human.exit_code == 0 and "TopicTest" in human.stdout


def test_a_pre_allocated_file_has_its_row_in_stats_and_export(tmp_path: Path) -> None:
    """A broker creates the next commit-log file before it needs it: stats and export left
    that file out of their per-file lists, which verify and info count. It is listed with no
    records, its data ending at 0, as dump shows it."""
    store_dir = tmp_path / "store"
    generate("multi", store_dir)
    files = sorted(path.name for path in (store_dir / "commitlog").iterdir())
    following = f"{int(files[-1]) + 65536:020d}"
    with open(store_dir / "commitlog" / following, "wb") as file:
        file.truncate(65536)
    empty = {
        "file": f"commitlog/{following}", "records": 0, "bytes": 0, "blankBytes": 0,
        "crcFailures": 0, "invalidRegions": 0, "end": 0, "endedBy": "end",
    }  # fmt: skip
    pipeline = LocalPipeline(str(store_dir), PipelineOptions(split=5000))
    stats = pipeline.stats().to_dict()
    assert [entry["file"] for entry in stats["files"]] == [
        f"commitlog/{name}" for name in [*files, following]
    ]
    assert stats["files"][-1] == empty and stats["messages"] == 602
    exported = pipeline.export(str(tmp_path / "out"), "jsonl").to_dict()
    assert exported["commitLogFiles"] == stats["files"]


def test_uris_for_the_store_and_the_destination(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    generate("multi", store_dir)
    result = run_cli(
        "export",
        f"file://{store_dir}",
        "--to",
        f"file://{tmp_path / 'out'}",
        "--engine",
        "local",
        "--json",
        "--commitlog-file-size",
        "65536",
    )
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["messages"] == 602
    assert len(parquet_rows(tmp_path / "out")) == 602


def test_export_in_worker_processes_writes_the_same_files(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    generate("multi", store_dir)
    for jobs in ("1", "2"):
        result = run_cli(
            "export", store_dir, "--to", tmp_path / jobs, "--engine", "local",
            "--jobs", jobs, "--split-size", "9000", "--json",
        )  # fmt: skip
        assert result.exit_code == 0, result.output
    one, two = sorted((tmp_path / "1").iterdir()), sorted((tmp_path / "2").iterdir())
    assert len(one) > 2 and [p.name for p in one] == [p.name for p in two]
    assert all(a.read_bytes() == b.read_bytes() for a, b in zip(one, two, strict=True))
    spark = run_cli("export", store_dir, "--to", tmp_path / "3", "--engine", "spark", "--jobs", "2")
    assert spark.exit_code == 2 and "--jobs is for --engine local" in spark.output
    both = run_cli("stats", store_dir, "--jobs", "2", "--master", "local[1]")
    assert both.exit_code == 2 and "give one of them" in both.output
    local = run_cli("stats", store_dir, "--engine", "local", "--spark-conf", "a=b")
    assert local.exit_code == 2 and "--spark-conf is for --engine spark" in local.output
    auto = run_cli(
        "export", store_dir, "--to", tmp_path / "4", "--jobs", "2", "--split-size", "9000"
    )
    assert auto.exit_code == 0 and "engine: local (--jobs 2 asks for local" in auto.stderr
    assert [p.read_bytes() for p in sorted((tmp_path / "4").iterdir())] == [
        p.read_bytes() for p in two
    ]


def test_stats_the_same_whatever_the_ranges_and_workers(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    generate("multi", store_dir)
    whole = LocalPipeline(str(store_dir), PipelineOptions(split=1 << 30)).stats().to_dict()
    ranged = LocalPipeline(str(store_dir), PipelineOptions(split=5000)).stats().to_dict()
    assert ranged["queues"] == whole["queues"] and ranged["messages"] == whole["messages"]
    args = ("stats", store_dir, "--engine", "local", "--split-size", "5000", "--json")
    one, two = run_cli(*args), run_cli(*args, "--jobs", "2")
    assert one.exit_code == two.exit_code == 0
    assert json.loads(one.stdout) == json.loads(two.stdout)
    assert json.loads(one.stdout)["queues"] == whole["queues"]


@pytest.mark.parametrize(
    "scenario", ["multi", "delay", "crc-flip", "v2", "txn", "garbage-after-end", "torn-tail"]
)
def test_stats_in_one_arrow_pass_are_the_record_by_record_counts(
    tmp_path: Path, scenario: str
) -> None:
    store_dir = tmp_path / "store"
    generate(scenario, store_dir)
    for split in (3000, 1 << 30):
        for topics in (None, frozenset({"TopicTest", "%RETRY%g"})):
            pipeline = LocalPipeline(str(store_dir), PipelineOptions(split=split))
            in_arrow = pipeline.stats(topics=topics).to_dict()
            by_record = pipeline._stats_by_record(topics).to_dict()
            assert in_arrow == by_record, (split, topics)
    assert in_arrow["files"]


def test_stats_without_pyarrow_count_record_by_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    store_dir = tmp_path / "store"
    generate("multi", store_dir)
    pipeline = LocalPipeline(str(store_dir), PipelineOptions(split=5000))
    expected = pipeline.stats().to_dict()
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow now fails
    assert pipeline.stats().to_dict() == expected


def test_a_stop_while_the_encoder_ends_waits_for_it() -> None:
    """A stop signal (here SIGALRM raising KeyboardInterrupt) that breaks into the wait for
    the encoding thread to end is raised once it has ended, and the work still waiting is
    dropped: a thread left encoding as the interpreter ended met Arrow's memory pool torn
    down (an abort, exit -6, after the export's one line; the signals campaign, seed
    20261215)."""
    done: list[int] = []

    def slow(item: int) -> None:
        time.sleep(0.3)
        done.append(item)

    def stop(_number: int, _frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, stop)
    try:
        with pytest.raises(KeyboardInterrupt), _Background(slow) as give:
            give(1)
            give(2)
            give(3)
            signal.setitimer(signal.ITIMER_REAL, 0.1)
            raise KeyboardInterrupt  # the first stop; the alarm breaks into the wait
        assert done == [1]  # the item being encoded finished; those waiting were dropped
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_background_work_runs_in_order_and_its_failure_reaches_the_caller() -> None:
    done: list[int] = []
    with _Background(done.append) as give:
        for item in range(100):
            give(item)
    assert done == list(range(100))

    def fails_at_three(item: int) -> None:
        if item == 3:
            raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"), _Background(fails_at_three) as give:
        for item in range(100):
            give(item)
            time.sleep(0.001)

    # a generator's, closed early as the one-pass export's is once the walk reaches the end
    # of the log: the failure of the last work handed over was lost there (exit 0 with the
    # last part file cut short by a full disk)
    def parts() -> Iterator[int]:
        with _Background(fails_at_three) as give:
            for item in range(4):
                give(item)
                yield item

    walked = parts()
    assert [next(walked) for _ in range(4)] == [0, 1, 2, 3]  # all given, the last not done
    with pytest.raises(OSError, match="No space left"):
        walked.close()


def test_export_and_stats_do_without_pyarrow_compute(tmp_path: Path) -> None:
    """Importing ``pyarrow.compute`` costs 20 ms of start-up: the column builders call Arrow's
    functions by name instead (rmqstore.pipeline.arrowcalls). Nor is pyarrow imported with
    the engine (stats and the commands that do not write Arrow run without it)."""

    store_dir = tmp_path / "store"
    generate("multi", store_dir)
    code = (
        "import sys\n"
        "from rmqstore.pipeline.local import LocalPipeline, PipelineOptions\n"
        "assert 'pyarrow' not in sys.modules, 'imported with the engine'\n"
        "pipeline = LocalPipeline(sys.argv[1], PipelineOptions(split=9000))\n"
        "pipeline.export(sys.argv[2], 'parquet')\n"
        "pipeline.stats()\n"
        "print(sorted(name for name in sys.modules if name.startswith(('pyarrow.', 'pandas'))))\n"
    )
    loaded = fresh_python(code, store_dir, tmp_path / "out")
    assert "pyarrow.parquet" in loaded  # it did export
    assert "pyarrow.compute" not in loaded and "pandas" not in loaded, loaded


@pytest.mark.parametrize("lock", ["directory", "held"])
def test_the_lock_is_asked_only_to_read_a_store_being_written_as_it_stood(
    tmp_path: Path, lock: str
) -> None:
    """The pipelines ask a local store's lock whether another process writes the store (it
    is then read up to where its data ended when the read began, which the result says): one
    held reads every record of a store at rest the same, and a lock that is no file, which
    cannot be asked, leaves the store read as it is."""
    from support import lock_held_elsewhere

    store_dir = tmp_path / "store"
    generate("multi", store_dir)
    at_rest = LocalPipeline(str(store_dir), PipelineOptions(split=20000)).stats()
    if lock == "directory":
        (store_dir / "lock").unlink()
        (store_dir / "lock").mkdir()
        read = LocalPipeline(str(store_dir), PipelineOptions(split=20000)).stats()
    else:
        with lock_held_elsewhere(store_dir / "lock"):
            read = LocalPipeline(str(store_dir), PipelineOptions(split=20000)).stats()
    last = at_rest.files[-1]
    log_end = int(last.file.removeprefix("commitlog/")) + (last.end or 0)
    assert at_rest.live_end is None and log_end > 0
    assert read.live_end == (log_end if lock == "held" else None)
    assert replace(read, live_end=None).to_dict() == at_rest.to_dict()
    assert at_rest.to_dict()["messages"] > 0


# stats whose workers' pool, as it ends, gets SIGTERM (a kill as the command finishes)
TERMINATED_AS_THE_WORKERS_END = """
import os, signal, sys, threading
import concurrent.futures.process as process
from rmqstore.commands.entry import main
shutdown = process.ProcessPoolExecutor.shutdown
def shutdown_terminated(self, *args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    return shutdown(self, *args, **kwargs)
process.ProcessPoolExecutor.shutdown = shutdown_terminated
sys.argv = ["rmqstore", "stats", *sys.argv[1:]]
try:
    main()
finally:
    if any(isinstance(t, process._ExecutorManagerThread) for t in threading.enumerate()):
        print("a worker pool left running", file=sys.stderr)
"""


def test_a_signal_as_the_workers_end_after_the_walk_stopped_early_is_not_lost(
    tmp_path: Path,
) -> None:
    """The walk of the log stops after the last file's records, with ranges left that
    workers were given: their generator was closed when it was collected, and a SIGTERM
    met as the workers ended was printed as "Exception ignored" with a traceback, then
    lost (the command went on, exit 0). The generators are now closed where they stop.
    The signal cut the pool's shutdown short, leaving the pool running: its thread closed
    its wakeup pipe as the process ended, racing Python 3.11's exit hook, which now and then
    printed "Bad file descriptor" with a traceback after the one line (once in make test's
    reference pass); the shutdown is now finished, the stop going on after it."""
    store = tmp_path / "store"
    generate("garbage-after-end", store)  # ranges of junk after the last file's records
    done = subprocess.run(
        [sys.executable, "-c", TERMINATED_AS_THE_WORKERS_END, str(store), "--engine", "local",
         "--jobs", "2", "--split-size", "4096", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 143, done.stderr
    assert done.stderr == "rmqstore: error: terminated (SIGTERM)\n"
