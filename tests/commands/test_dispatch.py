"""``rmqstore dispatch`` and the queue/key/unique-key/time reads on real-broker stores."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rmqstore.consumerprogress import offsets_past_end
from rmqstore.fixtures import FixtureOptions, generate
from rmqstore.properties import split_keys

from campaigns import sigint_delivered
from support import (
    ORACLE_OPTIONS,
    crashed_with_a_queue_behind,
    file_digest,
    full_disk_stop,
    inodes_left_with,
    lock_held_elsewhere,
    manifest_dump,
    run_cli,
    small_filesystem,
    stops_on_a_full_disk,
    tree_digest,
    tree_state,
)


def rebuilt(oracle, name: str, tmp_path: Path) -> Path:
    store = oracle(name).copy_to(tmp_path)
    shutil.rmtree(store / "consumequeue")
    shutil.rmtree(store / "index")
    result = run_cli("dispatch", store, "--json", *ORACLE_OPTIONS)
    assert result.exit_code == 0, result.stderr
    return store


def queue_digests(store: Path) -> dict[str, str]:
    return {k: v for k, v in tree_digest(store).items() if k.startswith("consumequeue/")}


def rebuild_in_ranges(store: Path, jobs: str, *options: str):  # type: ignore[no-untyped-def]
    """``dispatch --rebuild --yes --json`` with ``jobs`` worker processes, 20 KB ranges."""
    return run_cli(
        "dispatch", store, "--rebuild", "--yes", "--jobs", jobs, "--split-size", "20000",
        *options, "--json", *ORACLE_OPTIONS,
    )  # fmt: skip


def test_dispatch_json_and_idempotence(oracle, tmp_path: Path) -> None:
    store = oracle("s1_multi").copy_to(tmp_path)
    shutil.rmtree(store / "consumequeue")
    shutil.rmtree(store / "index")
    first = json.loads(run_cli("dispatch", store, "--json", *ORACLE_OPTIONS).stdout)
    assert first["records"] == 3002 and first["unitsWritten"] == 3002
    assert first["indexedRecords"] == 3002 and first["toOffset"] == first["logEnd"] == 3346149
    assert first["queuesTouched"] == 12 and first["problems"] == []
    digest = tree_digest(store)
    second = json.loads(run_cli("dispatch", store, "--json", *ORACLE_OPTIONS).stdout)
    assert (second["records"], second["unitsWritten"], second["indexEntries"]) == (0, 0, 0)
    assert tree_digest(store) == digest
    dry = run_cli("dispatch", store, "--dry-run", *ORACLE_OPTIONS)
    assert dry.exit_code == 0  # nothing to do


@pytest.mark.parametrize("name", ["s1_multi", "v533_s1_multi"])
def test_key_and_unique_key_reads_match_the_brokers_queries(
    oracle, tmp_path: Path, name: str
) -> None:
    store = rebuilt(oracle, name, tmp_path)
    for query in manifest_dump(oracle(name).manifest)["queries"]:
        uniq = any(r["uniqKey"] == query["key"] for r in query["queryMessage_results"])
        option = "--uniq-key" if uniq else "--key"
        result = run_cli(
            "read",
            store,
            "--topic",
            query["topic"],
            option,
            query["key"],
            "--max",
            query["maxNum"],
            "--begin",
            query["begin"],
            "--end",
            query["end"],
            "--jsonl",
            "--body",
            "none",
            *ORACLE_OPTIONS,
        )
        if not query["key"]:
            assert result.exit_code == 2  # an empty key is an input error for the CLI
            continue
        got = [json.loads(line)["commitLogOffset"] for line in result.stdout.splitlines()]
        expected = sorted(
            r["commitLogOffset"]
            for r in query["queryMessage_results"]
            if r["topic"] == query["topic"]
            and (r["uniqKey"] == query["key"] if uniq else query["key"] in split_keys(r["keys"]))
        )
        assert got == expected, query
        assert result.exit_code == (0 if expected else 1), result.stderr  # no hit: as grep


def test_queue_read_matches_the_consume_queue(oracle, tmp_path: Path) -> None:
    store = rebuilt(oracle, "s3_txn_delay", tmp_path)
    queue = manifest_dump(oracle("s3_txn_delay").manifest)["consumeQueues"]["SCHEDULE_TOPIC_XXXX"][
        "2"
    ]
    result = run_cli(
        "read",
        store,
        "--topic",
        "SCHEDULE_TOPIC_XXXX",
        "--queue",
        "2",
        "--jsonl",
        "--body",
        "none",
        *ORACLE_OPTIONS,
    )
    assert result.exit_code == 0, result.stderr
    documents = [json.loads(line) for line in result.stdout.splitlines()]
    assert [d["commitLogOffset"] for d in documents] == [e[1] for e in queue["entries"]]
    assert all(d["properties"]["REAL_TOPIC"] == "DelayTopic" for d in documents)
    result = run_cli(
        "read",
        store,
        "--topic",
        "SCHEDULE_TOPIC_XXXX",
        "--queue",
        "2",
        "--from",
        "1",
        "--count",
        "1",
        "--json",
        "--body",
        "none",
        *ORACLE_OPTIONS,
    )
    assert [d["queueOffset"] for d in json.loads(result.stdout)] == [1]


def test_time_reads(oracle, tmp_path: Path) -> None:
    store = rebuilt(oracle, "v533_s1_multi", tmp_path)
    probes = [
        p
        for p in manifest_dump(oracle("v533_s1_multi").manifest)["offsetInQueueByTime"]
        if "timestamp" in p and p["topic"] == "TopicTest"
    ]
    for probe in probes:
        result = run_cli(
            "read",
            store,
            "--topic",
            "TopicTest",
            "--queue",
            probe["queueId"],
            "--time",
            probe["timestamp"],
            "--json",
            "--body",
            "none",
            *ORACLE_OPTIONS,
        )
        document = json.loads(result.stdout)
        assert document["queueOffset"] == probe["offsetInQueueByTime"]
        if document["message"] is not None:
            assert document["message"]["queueOffset"] == probe["offsetInQueueByTime"]
            assert document["message"]["storeTimestamp"] >= min(
                probe["timestamp"], document["message"]["storeTimestamp"]
            )


def test_info_shows_the_brokers_queue_offsets_and_lag(oracle) -> None:
    crash = oracle("s2_crash")
    result = run_cli("info", crash.store, "--json", *ORACLE_OPTIONS)
    info = json.loads(result.stdout)
    assert info["dispatch"]["behindBytes"] == crash.manifest["stateAtHalt"]["dispatchBehindBytes"]
    assert info["dispatch"]["behindRecords"] == 300
    at_halt = crash.manifest["consumeQueuesAtHalt"]
    for row in info["consumeQueues"]:
        expected = at_halt[row["topic"]][str(row["queueId"])]
        assert row["maxOffset"] == expected["maxOffsetInQueue"]
        assert row["minOffset"] == expected["minOffsetInQueue"]


def test_rebuild_needs_confirmation_and_dry_run_changes_nothing(oracle, tmp_path: Path) -> None:
    store = oracle("s1_multi").copy_to(tmp_path)
    before = tree_digest(store)
    dry = run_cli("dispatch", store, "--rebuild", "--dry-run", "--json", *ORACLE_OPTIONS)
    assert dry.exit_code == 1
    plan = json.loads(dry.stdout)["plan"]
    assert plan["files"] == 40 and plan["dispatchFrom"] == 0
    refused = run_cli("dispatch", store, "--rebuild", *ORACLE_OPTIONS)
    assert refused.exit_code == 2 and "--yes" in refused.stderr
    assert tree_digest(store) == before
    done = run_cli("dispatch", store, "--rebuild", "--yes", "--json", *ORACLE_OPTIONS)
    assert done.exit_code == 0, done.stderr
    document = json.loads(done.stdout)
    assert Path(document["quarantine"]).is_dir()
    after = tree_digest(store)
    for path, digest in before.items():
        if path.startswith("consumequeue/"):
            assert after[path] == digest  # rebuilt byte-identical


def test_a_rebuild_reads_its_queues_for_consumer_offsets_before_another_writer_may_take_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rebuild looks for consumer offsets past the ends of the queues it made with the
    store's lock still held: an append another process starts then is refused (exit 3)."""
    import subprocess
    import sys

    from rmqstore.commands import dispatch

    store = tmp_path / "store"
    generate("multi", store, FixtureOptions())
    tried = []

    def read_with_a_writer_beside(opened):
        append = [sys.executable, "-m", "rmqstore", "append", str(store), "--topic", "T9",
                  "--body", "beside"]  # fmt: skip
        tried.append(subprocess.run(append, capture_output=True, text=True))
        return offsets_past_end(opened)

    monkeypatch.setattr(dispatch, "offsets_past_end", read_with_a_writer_beside)
    result = run_cli("dispatch", store, "--rebuild", "--yes")
    assert result.exit_code == 0, result.stderr
    assert tried and tried[0].returncode == 3, tried[0].stderr
    assert "is locked by another process" in tried[0].stderr


def test_rebuild_in_worker_processes(oracle, tmp_path: Path) -> None:
    documents, digests = [], []
    for jobs in ("1", "2"):
        store = oracle("s1_multi").copy_to(tmp_path / jobs)
        broker_queues = queue_digests(store)
        done = rebuild_in_ranges(store, jobs)
        assert done.exit_code == 0, done.stderr
        document = json.loads(done.stdout)
        documents.append({k: v for k, v in document.items() if k not in ("quarantine", "plan")})
        after = tree_digest(store)
        assert queue_digests(store) == broker_queues
        # index files are named by the time they are made: compare what they hold
        digests.append(sorted(v for k, v in after.items() if k.startswith("index/")))
        verified = run_cli("verify", store, "--json", *ORACLE_OPTIONS)
        assert verified.exit_code == 0, verified.stdout
    assert documents[0] == documents[1] and documents[0]["unitsWritten"] == 3002
    assert digests[0] == digests[1]
    store = oracle("s1_multi").copy_to(tmp_path / "refused")
    for args in (["--jobs", "2"], ["--rebuild", "--yes", "--jobs", "2", "--max-records", "5"],
                 ["--rebuild", "--yes", "--jobs", "2", "--engine", "spark"]):  # fmt: skip
        refused = run_cli("dispatch", store, *args, *ORACLE_OPTIONS)
        assert refused.exit_code == 2 and "--jobs" in refused.stderr, args
    for args, needle in (
        (["--rebuild", "--from-offset", "266", "--dry-run"], "--rebuild replays the whole"),
        (["--master", "local[1]"], "--master is for --engine spark"),
    ):
        refused = run_cli("dispatch", store, *args, *ORACLE_OPTIONS)
        assert refused.exit_code == 2 and needle in refused.stderr, args


@pytest.mark.parametrize(
    "args",
    [[], ["--rebuild", "--yes"], ["--rebuild", "--yes", "--jobs", "2", "--split-size", "20000"]],
    ids=["dispatch", "rebuild", "rebuild-jobs-2"],
)
def test_a_dispatch_reads_the_log_once(
    oracle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    """The walk that dispatches the log (or the workers' walks) finds its valid end: no
    walk of this process reads the log for the end as well. One did, to size the progress
    bar (drawn only on a terminal), a second reading of the whole log (a quarter of a
    rebuild's time)."""
    from rmqstore.commitlog import CommitLog

    store = oracle("s1_multi").copy_to(tmp_path)
    shutil.rmtree(store / "consumequeue")
    shutil.rmtree(store / "index")
    walks: list[int | None] = []
    valid_end = CommitLog.valid_end

    def counted(self: CommitLog, *positional: object, **named: object):  # type: ignore[no-untyped-def]
        end = valid_end(self, *positional, **named)  # type: ignore[arg-type]
        walks.append(end.offset)
        return end

    monkeypatch.setattr(CommitLog, "valid_end", counted)
    done = run_cli("dispatch", store, *args, "--json", *ORACLE_OPTIONS)
    assert done.exit_code == 0, done.stderr
    assert json.loads(done.stdout)["unitsWritten"] == 3002
    assert walks == []
    monkeypatch.undo()
    verified = run_cli("verify", store, "--json", *ORACLE_OPTIONS)
    assert verified.exit_code == 0, verified.stdout


def test_a_rebuild_of_a_log_damaged_before_its_end_is_refused(oracle, tmp_path: Path) -> None:
    """A record damaged in a commit-log file a broker's recovery does not walk (the first of
    52): a broker serves the records after it, but a replay of the log stops there. The
    rebuild used to move the queues and index to quarantine and build them up to the
    damage, leaving 2,969 records out of them, exit 0 (found by a fuzzer rebuilding mutated
    real stores). The dry run names the damage, the rebuild is refused on every engine with
    nothing changed, and --up-to-damage rebuilds up to it all the same, exit 1, naming it
    (as a dispatch that stops there does), the log's end the valid one."""
    store = oracle("s1_multi").copy_to(tmp_path)
    damaged = 31261  # a record's start in the first file
    with open(store / "commitlog" / "00000000000000000000", "r+b") as log_file:
        log_file.seek(damaged)
        log_file.write((-(2**31)).to_bytes(4, "big", signed=True))  # its TOTALSIZE
    before = tree_digest(store)
    dry = run_cli("dispatch", store, "--rebuild", "--dry-run", "--json", *ORACLE_OPTIONS)
    assert dry.exit_code == 1
    assert json.loads(dry.stdout)["plan"]["damage"] == {
        "offset": damaged,
        "reason": "TOTALSIZE -2147483648 is out of bounds",
        "logEnd": 3346149,
    }
    shown = run_cli("dispatch", store, "--rebuild", "--dry-run", *ORACLE_OPTIONS)
    assert "damaged at offset 31,261" in shown.stdout and "--up-to-damage" in shown.stdout
    for jobs in ("1", "2"):
        refused = rebuild_in_ranges(store, jobs)
        assert refused.exit_code == 2 and refused.stderr.count("\n") == 1, refused.stderr
        assert "damaged at offset 31,261" in refused.stderr
        assert "nothing was changed" in refused.stderr
        assert tree_digest(store) == before
    wrong = run_cli("dispatch", store, "--up-to-damage", *ORACLE_OPTIONS)
    assert wrong.exit_code == 2 and "works with --rebuild" in wrong.stderr
    documents = []
    for jobs in ("1", "2"):
        copy = tmp_path / jobs / "store"
        shutil.copytree(store, copy)
        done = rebuild_in_ranges(copy, jobs, "--up-to-damage")
        assert done.exit_code == 1, done.stderr  # completed, and says what it left out
        assert done.stderr.count("damaged at offset 31,261") == 1
        document = json.loads(done.stdout)
        assert document["plan"]["damage"]["offset"] == damaged
        documents.append({k: v for k, v in document.items() if k not in ("plan", "quarantine")})
    assert documents[0] == documents[1]
    assert documents[0]["damage"] == {**json.loads(dry.stdout)["plan"]["damage"]}
    assert documents[0]["toOffset"] == damaged and documents[0]["records"] == 33
    assert documents[0]["logEnd"] == 3346149  # the valid end, not the damage

    # a plain dispatch of queues deleted under it stops at the damage and says so
    shutil.rmtree(store / "consumequeue")
    shutil.rmtree(store / "index")
    stopped = run_cli("dispatch", store, "--json", *ORACLE_OPTIONS)
    assert stopped.exit_code == 1 and "damaged at offset 31,261" in stopped.stderr
    assert json.loads(stopped.stdout)["damage"] == documents[0]["damage"]
    assert json.loads(stopped.stdout)["logEnd"] == 3346149


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_body_crc_where_recovery_does_not_walk_stops_no_replay(
    oracle, tmp_path: Path, jobs: str
) -> None:
    """A body CRC that fails in a file a broker's recovery does not walk (the 26th of 52):
    a broker's dispatcher never checks CRCs, and its recovery does only in the files it
    walks. A rebuild checked them from the first file (the abort it makes and the
    checkpoint times it resets took it for a crash's recovery from the start) and stopped
    there: half the records were left out of the queues, exit 0. It now dispatches every
    record, the queues byte-identical to the broker's, as does a plain dispatch. A dispatch
    of the queues only (--no-index) is refused: the 'abort' it kept (its queues reach past
    the index) made a broker's crash recovery walk from the first file, check the CRC and
    delete the half of the log after it, and so is a rebuild of the queues only
    (--rebuild --no-index, --rebuild --topic), with worker processes too: its 'abort' and
    the checkpoint time it resets did the same."""
    store = oracle("s1_multi").copy_to(tmp_path)
    put = oracle("s1_multi").manifest["puts"][1500]
    offset = put["physicalOffset"]
    with open(store / "commitlog" / f"{offset - offset % 65536:020d}", "r+b") as log_file:
        log_file.seek(offset % 65536 + 8)
        log_file.write((put["bodyCRC"] ^ 7).to_bytes(4, "big", signed=True))
    broker = queue_digests(store)
    done = rebuild_in_ranges(store, jobs)
    assert done.exit_code == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["unitsWritten"] == 3002 and document["damage"] is None
    assert queue_digests(store) == broker
    # queues that reach the log's end: a rebuild of one topic's cannot take them further
    one = rebuild_in_ranges(store, jobs, "--topic", "TopicTest")
    assert one.exit_code == 0, one.stderr
    assert queue_digests(store) == broker and not (store / "abort").exists()
    shutil.rmtree(store / "consumequeue")
    before = tree_digest(store)
    partial = [["--no-index"], ["--topic", "TopicTest"], ["--from-offset", str(offset)]]
    rebuilds = [["--rebuild", "--jobs", jobs, "--split-size", "20000", *o] for o in partial[:2]]
    for more in [*partial, *rebuilds]:
        for dry in ["--dry-run"], ["--yes"]:
            refused = run_cli("dispatch", store, *more, *dry, "--json", *ORACLE_OPTIONS)
            assert refused.exit_code == 2 and tree_digest(store) == before
            assert f"would then end the log at offset {offset:,} (BODYCRC" in refused.stderr
    again = run_cli("dispatch", store, "--json", *ORACLE_OPTIONS)
    assert again.exit_code == 0 and json.loads(again.stdout)["unitsWritten"] == 3002
    assert queue_digests(store) == broker and not (store / "abort").exists()


def test_a_rebuild_of_a_sound_log_names_no_damage(oracle, tmp_path: Path) -> None:
    """Damage in the files a broker's recovery walks ends the log there (a torn tail): the
    rebuild replays up to it as recovery would, with no damage in its plan."""
    store = oracle("s2_crash").copy_to(tmp_path, "store_torn_half_record")
    dry = run_cli("dispatch", store, "--rebuild", "--dry-run", "--json", *ORACLE_OPTIONS)
    assert dry.exit_code == 1 and json.loads(dry.stdout)["plan"]["damage"] is None
    done = run_cli("dispatch", store, "--rebuild", "--yes", "--json", *ORACLE_OPTIONS)
    assert done.exit_code == 0, done.stderr


@pytest.mark.plumbing
@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_rebuild_a_full_disk_stops_says_how_far_it_got_and_keeps_abort(
    tmp_path: Path, jobs: str
) -> None:
    """A full disk stopping a dispatch --rebuild (here or in worker processes) at each
    point in turn: one line that says whether it changed the store. Before it did, the
    store is as it was; after, 'abort' stays (a broker starting on the store runs its crash
    recovery) and the line names the folder holding the files it replaces. Run again with
    room, the rebuild finishes: every record in its queue and the index, no 'abort'."""
    with small_filesystem(tmp_path, "6m") as disk:
        base = disk / "base"
        generate("multi", base, FixtureOptions())
        messages = json.loads((base / "fixture.json").read_text())["messageCount"]
        options = ("--yes", "--jobs", jobs, "--split-size", "65536")
        # worker processes: every other point (each run starts two)
        rooms = range(0, 132 << 10, (12 if jobs == "1" else 24) << 10)
        said = "the files it replaces are kept in"
        for store in stops_on_a_full_disk(disk, base, "dispatch --rebuild", options, rooms, said):
            _finishes_with_every_record(store, messages, "--rebuild", *options)


def test_a_dispatch_stopped_before_it_put_anything_leaves_no_empty_file_or_folder(
    tmp_path: Path,
) -> None:
    """A store whose consume queues and index are gone, dispatched on a disk with room for
    no more than 0 to 9 more files and folders: a stop before it put a unit or an entry says
    it "stopped before it changed the store", and the store is as it was: the folders it
    made (consumequeue/, a topic's, a queue's) and the files it made for its queues and
    index, holding nothing, are gone again (they were left, for verify and a listing to
    show). A later stop leaves 'abort'; run again with room, dispatch finishes."""
    with small_filesystem(tmp_path, "6m") as disk:
        base = disk / "base"
        generate("multi", base, FixtureOptions())
        messages = json.loads((base / "fixture.json").read_text())["messageCount"]
        shutil.rmtree(base / "consumequeue")
        shutil.rmtree(base / "index")
        outcomes: list[str] = []
        for left in range(10):
            store = disk / "store"
            shutil.rmtree(store, ignore_errors=True)
            shutil.copytree(base, store)
            before = tree_state(store)
            with inodes_left_with(disk, left):
                result = run_cli("dispatch", store)
            if result.exit_code == 0:
                outcomes.append("done")
                continue
            line = result.stderr.strip()
            assert result.exit_code == 4 and "\n" not in line, result.stderr
            assert "No space left on device" in line, line
            if line.endswith("; dispatch stopped before it changed the store"):
                outcomes.append("before")
                assert tree_state(store) == before, (left, line)
                continue
            outcomes.append("part way")
            assert (store / "abort").exists(), line
            _finishes_with_every_record(store, messages)
        assert outcomes[:5] == ["before"] * 5 and "part way" in outcomes, outcomes


# a dispatch stopped (Ctrl-C) at the WHICH-th consume-queue or index file it makes: as the
# file is made under its temporary name (before the rename), or once it is in place (before
# it is listed)
INTERRUPTED_AS_A_FILE_IS_MADE = """
import os, sys
from pathlib import Path
from rmqstore.commands.entry import main
kind, moment, which = sys.argv[1], sys.argv[2], int(sys.argv[3])
made = []
def ours(path):
    path = Path(path)
    return "consumequeue" in path.parts if kind == "queue" else path.parent.name == "index"
def stop_at(name, path):
    if ours(path) and (moment == "temporary") == name.endswith(".creating"):
        made.append(path)
        if len(made) == which:
            raise KeyboardInterrupt
rename = os.rename
def renaming(source, target, *args, **kwargs):
    if moment == "temporary":
        stop_at(str(source), target)
    rename(source, target, *args, **kwargs)
    stop_at(str(target), target)
os.rename = renaming
sys.argv = ["rmqstore", "dispatch", *sys.argv[4:]]
main()
"""


@pytest.mark.parametrize(
    ("kind", "moment", "which"),
    [("queue", "in place", 3), ("queue", "temporary", 1), ("index", "temporary", 1)],
)
def test_a_dispatch_stopped_as_it_makes_a_file_leaves_nothing_of_it(
    tmp_path: Path, kind: str, moment: str, which: int
) -> None:
    """Ctrl-C as a consume-queue or index file is made: stopped before it put a unit, the
    dispatch left the queue file it had just made (in place, not yet listed), though it said
    the store was unchanged, or the temporary of one; an index file's temporary (named by
    the time it was made) stayed even after the dispatch that finished the work, and verify
    kept calling it an unknown file. Nothing of such a file stays now; stopped part way,
    'abort' stays and the next dispatch finishes."""
    store = tmp_path / "store"
    generate("multi", store, FixtureOptions())
    messages = json.loads((store / "fixture.json").read_text())["messageCount"]
    shutil.rmtree(store / "consumequeue")
    shutil.rmtree(store / "index")
    before = tree_state(store)
    done = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_AS_A_FILE_IS_MADE, kind, moment, str(which), str(store)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    line = done.stderr.strip()
    assert done.returncode == 130 and line.startswith("rmqstore: error: interrupted;"), line
    assert not [name for name in tree_state(store) if name.endswith(".creating")]
    if line.endswith("dispatch stopped before it changed the store"):
        assert tree_state(store) == before
    else:
        assert (store / "abort").exists(), line
    _finishes_with_every_record(store, messages)
    assert not [name for name in tree_state(store) if name.endswith(".creating")]


# a dispatch sent a signal (argv[2]) as the walk puts a run of units into a queue (the
# argv[1]-th run): it comes between two queues of one batch
STOPPED_BETWEEN_QUEUES = """
import os, signal, sys
import rmqstore.dispatch, rmqstore.pipeline.rebuild
from rmqstore.commands.entry import main
at, number = int(sys.argv[1]), getattr(signal, sys.argv[2])
walk = rmqstore.dispatch._BatchWalk  # a dispatch's batches; a rebuild with --jobs: its ranges
walk = rmqstore.pipeline.rebuild._Applier if "--jobs" in sys.argv else walk
put_run, runs = walk._put_run, []
def put_run_then_stopped(self, *args, **kwargs):
    put = put_run(self, *args, **kwargs)
    runs.append(put)
    if len(runs) == at:
        os.kill(os.getpid(), number)
    return put
walk._put_run = put_run_then_stopped
sys.argv = ["rmqstore", "dispatch", *sys.argv[3:]]
main()
"""


@pytest.mark.parametrize(
    ("run", "name", "rebuild"),
    [(20, "SIGINT", ()), (45, "SIGINT", ()), (20, "SIGKILL", ()),
     (20, "SIGINT", ("--rebuild", "--yes", "--jobs", "2", "--split-size", "200000"))],
)  # fmt: skip
def test_a_stop_waits_for_the_batch_so_no_queue_is_left_behind(
    tmp_path: Path, run: int, name: str, rebuild: tuple[str, ...]
) -> None:
    """Ctrl-C in the middle of a batch, between one queue's units and the next's: the stop
    left the queues written before it ahead of the others, and the next `append` was refused
    ("records of T0:2 are missing from its consume queue ... run rmqstore dispatch --rebuild
    --yes first"; the signals campaign met it again and again). The stop now waits for the
    batch to be in every queue: exit 130, 'abort' kept, and the store takes appends. Killed
    there (kill -9), the queues are left uneven: `append` is refused, and now names a plain
    `dispatch` (whose crash replay puts the missing units back) instead of a rebuild of every
    queue, and verify's "hole" it named was not there (`dispatch-lag`). A rebuild with
    `--jobs` stopped as it put a worker's range into the queues left them uneven too (14 of
    about 30 stopped at random); a stop now waits for the range."""
    store = tmp_path / "store"
    messages = tmp_path / "messages.jsonl"
    messages.write_text(
        "".join(
            json.dumps({"topic": f"T{n % 3}", "queueId": n % 4, "body": "x" * 100}) + "\n"
            for n in range(20000)
        )
    )
    assert run_cli("append", store, "--create", "--input", messages).exit_code == 0
    stopped = subprocess.run(
        [sys.executable, "-c", STOPPED_BETWEEN_QUEUES, str(run), name, str(store), *rebuild],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=sigint_delivered,
    )
    assert stopped.returncode == (130 if name == "SIGINT" else -9), stopped.stderr
    assert (store / "abort").exists()
    appended = run_cli("append", store, "--topic", "T1", "--queue", "1", "--body", "after")
    if name == "SIGKILL":
        assert appended.exit_code == 2, appended.stderr
        assert "missing from its consume queue" in appended.stderr
        assert appended.stderr.strip().endswith("putting the missing units back)")
        assert run_cli("dispatch", store).exit_code == 0
        appended = run_cli("append", store, "--topic", "T1", "--queue", "1", "--body", "after")
    assert appended.exit_code == 0, appended.stderr
    _finishes_with_every_record(store, 20001)


def _finishes_with_every_record(store: Path, messages: int, *options: str) -> None:
    """``rmqstore dispatch STORE OPTIONS`` run again after a stop: it finishes, 'abort' goes,
    and every one of ``messages`` is in its consume queue and the index."""
    again = run_cli("dispatch", store, *options)
    assert again.exit_code == 0, again.stderr
    assert not (store / "abort").exists()
    checked = json.loads(run_cli("verify", store, "--json").stdout)
    assert checked["ok"], checked["findings"]
    assert checked["checked"]["records"] == checked["checked"]["units"] == messages
    assert checked["checked"]["indexedRecords"] == messages


@pytest.mark.plumbing
def test_a_dispatch_a_full_disk_stops_keeps_abort(tmp_path: Path) -> None:
    """A store a broker stopped cleanly with its index gone and junk after one queue's valid
    end: a full disk stops dispatch at each point in turn. A stop before it put a unit or an
    entry leaves the store as it was and says so; any later stop leaves 'abort' (some queues
    or the index may now reach further than others, and a 4.9 broker starting without it
    dispatches only what follows the furthest queue: spec 10.4) and says so in one line,
    naming the folder that keeps the junk once it was moved. Run again with room, dispatch
    finishes: every record in its queue and the index, no 'abort'."""
    with small_filesystem(tmp_path, "6m") as disk:
        base = disk / "base"
        generate("multi", base, FixtureOptions())
        messages = json.loads((base / "fixture.json").read_text())["messageCount"]
        queue = base / "consumequeue" / "TopicTest" / "0" / ("0" * 20)
        units = bytearray(queue.read_bytes())
        units[39 * 20 : 49 * 20] = b"\xff" * 200  # the last ten units, junk
        queue.write_bytes(units)
        shutil.rmtree(base / "index")
        said = (
            "; dispatch stopped part way and left 'abort' in place (a broker starting on the "
            "store runs its crash recovery); run rmqstore dispatch again once the cause is mended"
        )
        outcomes = set()
        for room in range(0, 64 << 10, 4 << 10):
            store = disk / "store"
            shutil.rmtree(store, ignore_errors=True)
            shutil.copytree(base, store)
            before = tree_state(store)
            line = full_disk_stop(disk, room, "dispatch", store)
            if line is None:
                outcomes.add("done")
                continue
            if line.endswith("; dispatch stopped before it changed the store"):
                outcomes.add("before")  # (an index file it could not make: nor its folder)
                assert tree_state(store) == before, line
                continue
            assert said in line and (store / "abort").exists(), line
            if line.endswith(said):
                outcomes.add("part way")
            else:
                assert line.endswith(
                    f"{said}; the bytes it wrote over are kept in "
                    f"{store / 'quarantine'}/" + line.rsplit("/", 1)[1]
                ), line
                outcomes.add("part way, junk kept")
            _finishes_with_every_record(store, messages)
            kept = [
                path.read_bytes() for path in (store / "quarantine").rglob("*") if path.is_file()
            ]
            assert any(b"\xff" * 200 in data for data in kept)
        assert outcomes == {"before", "part way", "part way, junk kept", "done"}


def test_a_dispatch_after_a_crash_replays_what_its_recovery_would(tmp_path: Path) -> None:
    """A power loss took T:1's last units while T:0 kept its own: dispatch on the store
    (with 'abort') starts where a broker's crash recovery does, at the file the checkpoint
    picks, and gives them back before it removes 'abort'. It used to resume where the
    queues end, past them, and remove 'abort' all the same: no broker would then put
    them back (a 4.9 broker's clean start resumes where the furthest queue ends)."""
    store = tmp_path / "store"
    crashed = crashed_with_a_queue_behind(store)
    planned = run_cli("dispatch", store, "--dry-run", "--json", *crashed.options)
    assert planned.exit_code == 1 and json.loads(planned.stdout)["fromOffset"] == 0
    result = run_cli("dispatch", store, "--json", *crashed.options)
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["fromOffset"] == 0 and document["unitsWritten"] == 20
    assert not (store / "abort").exists()
    checked = json.loads(run_cli("verify", store, "--json", *crashed.options).stdout)
    assert checked["ok"], checked["findings"]
    assert checked["checked"]["units"] == crashed.messages


def test_max_records_after_a_crash_counts_from_where_the_queues_end(tmp_path: Path) -> None:
    """--max-records on a store with 'abort': the records of the crash's replay before
    where the queues end do not count, so each run gets on (counted from the replay start,
    every run would take the same five records already there, and none got further)."""
    store = tmp_path / "store"
    crashed = crashed_with_a_queue_behind(store)
    result = run_cli("dispatch", store, "--max-records", "5", "--json", *crashed.options)
    assert result.exit_code == 0, result.stderr
    # T:1's lost units, the last of them past where the queues end
    assert json.loads(result.stdout)["unitsWritten"] == 20
    assert not (store / "abort").exists()
    checked = json.loads(run_cli("verify", store, "--json", *crashed.options).stdout)
    assert checked["ok"], checked["findings"]


def test_topic_only_rebuild_leaves_the_index(oracle, tmp_path: Path) -> None:
    store = oracle("s1_multi").copy_to(tmp_path)
    index_before = {k: v for k, v in tree_digest(store).items() if k.startswith("index/")}
    result = run_cli(
        "dispatch", store, "--rebuild", "--yes", "--topic", "TopicTest", "--json", *ORACLE_OPTIONS
    )
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["unitsWritten"] == 1002 and document["indexEntries"] == 0
    after = tree_digest(store)
    assert {k: v for k, v in after.items() if k.startswith("index/")} == index_before


def _two_topics_undispatched(store: Path, *, abort: bool) -> list[int]:
    """A store whose records of A and B (interleaved, the last one B's) are in no consume
    queue or index; with ``abort`` as append leaves it, or without (queues behind the log
    of a store a broker stopped cleanly, or one a foreign writer appended to). Returns the
    records' offsets."""
    lines = "".join(
        json.dumps({"topic": topic, "body": f"{topic}{number}", "keys": f"k{topic}{number}"}) + "\n"
        for number in range(5)
        for topic in ("A", "B")
    )
    result = run_cli("append", store, "--create", "--input", "-", "--json", input=lines)
    assert result.exit_code == 0, result.stderr
    assert (store / "abort").exists()
    if not abort:
        (store / "abort").unlink()
    return [message["commitLogOffset"] for message in json.loads(result.stdout)["messages"]]


@pytest.mark.parametrize("abort", [True, False])
@pytest.mark.parametrize(
    "options",
    [
        ["--topic", "A"],
        ["--no-index"],
        ["--rebuild", "--yes", "--topic", "A"],
        ["--from-offset", "FOURTH"],  # the fourth record's offset: three left out
    ],
    ids=["topic", "no-index", "rebuild-topic", "from-offset"],
)
def test_a_dispatch_leaving_records_out_keeps_abort(
    tmp_path: Path, options: list[str], abort: bool
) -> None:
    """--topic A (or --no-index) built A's queue to the log's end and said the queues and
    index covered the whole log, so 'abort' was removed (and the checkpoint's consume-queue
    time moved to A's last message). A broker starting without 'abort' dispatches only what
    follows the furthest queue's end (spec 10.2, 10.4): B's records before it, and the keys
    of every record, would never have been dispatched. 'abort' now stays (or is made), and
    the checkpoint's consume-queue time stays where it was."""
    from rmqstore.checkpoint import read_checkpoint

    store = tmp_path / "store"
    offsets = _two_topics_undispatched(store, abort=abort)
    before = read_checkpoint(store / "checkpoint")
    options = [str(offsets[3]) if option == "FOURTH" else option for option in options]
    result = run_cli("dispatch", store, *options)
    assert result.exit_code == 0, result.stderr
    assert (store / "abort").exists()
    assert "so 'abort' is kept" in result.stderr and "was removed" not in result.stderr
    after = read_checkpoint(store / "checkpoint")
    if "--topic" in options or "--from-offset" in options:
        expected = 0 if "--rebuild" in options else (before.logics_msg_timestamp if before else 0)
        assert after is not None and after.logics_msg_timestamp == expected
    lagging = json.loads(run_cli("verify", store, "--json").stdout)["findingsByKind"]
    assert {"dispatch-lag", "index-lag", "cq-unit"} & set(lagging)  # --from-offset: cq-unit
    # verify's next steps, taken one after the other, catch everything up, and 'abort' goes
    for _ in range(4):
        report = json.loads(run_cli("verify", store, "--json").stdout)
        if report["ok"]:
            break
        step = shlex.split(report["nextStep"])
        assert step[0] == "rmqstore", step
        assert run_cli(*step[1:]).exit_code in (0, 1), step  # 1: recover found problems
    assert report["ok"] and not (store / "abort").exists(), report


def test_a_dispatch_of_some_queues_of_a_caught_up_store_makes_no_abort(tmp_path: Path) -> None:
    """Queues of some topics rebuilt (or caught up) on a store whose queues already reach
    the log's end reach no further than before: no 'abort' is left behind."""
    from rmqstore.fixtures import generate

    store = tmp_path / "store"
    generate("multi", store)
    for options in (
        ["--topic", "TopicTest"],
        ["--rebuild", "--yes", "--topic", "TopicTest"],
        ["--rebuild", "--yes", "--topic", "TopicTest", "--jobs", "2"],
        ["--rebuild", "--yes", "--no-index"],
    ):
        result = run_cli("dispatch", store, *options)
        assert result.exit_code == 0, (options, result.stderr)
        assert not (store / "abort").exists(), options
        assert "'abort' is kept" not in result.stderr, options
    assert json.loads(run_cli("verify", store, "--json").stdout)["ok"]


def test_a_from_offset_where_no_record_starts_is_refused_and_the_end_is_the_logs(
    tmp_path: Path,
) -> None:
    """dispatch --from-offset N where no record starts (inside a record, where its bytes are
    zeros or not) stopped its scan at N and took N for the log's end: the queues then seemed
    to point past it, and the error said to rebuild them; with --topic of no queue it
    reported logEnd N, exit 0. Now it is refused, the dry run too, and nothing changes. From
    the end or past it in the last file, the log end shown is the valid end."""
    from rmqstore.fixtures import generate

    store = tmp_path / "store"
    generate("multi", store)
    first = json.loads(run_cli("read", store, "--from-offset", "0", "--count", "1",
                               "--jsonl").stdout)  # fmt: skip
    end = json.loads(run_cli("info", store, "--json").stdout)["commitLog"]["maxOffset"]
    before = tree_digest(store)
    for inside in (first["commitLogOffset"] + 20, first["commitLogOffset"] + 7):
        for options in ([], ["--topic", "NoSuch", "--no-index"], ["--dry-run"]):
            result = run_cli("dispatch", store, "--from-offset", inside, *options)
            assert result.exit_code == 2, (inside, options, result.stderr)
            assert (
                f"no record starts at offset {inside}; the log goes on to its valid end at "
                f"{end}" in result.stderr
            )
            assert "rebuild" not in result.stderr
    assert tree_digest(store) == before
    for start in (end, end + 1000):
        result = run_cli("dispatch", store, "--from-offset", start, "--json")
        assert result.exit_code == 0, result.stderr
        done = json.loads(result.stdout)
        assert (done["records"], done["logEnd"]) == (0, end)
        planned = run_cli("dispatch", store, "--from-offset", start, "--dry-run", "--json")
        assert planned.exit_code == 0 and json.loads(planned.stdout)["logEnd"] == end
    assert json.loads(run_cli("verify", store, "--json").stdout)["ok"]


def test_append_with_dispatch_is_queryable_and_clean(tmp_path: Path) -> None:
    store = tmp_path / "store"
    lines = "".join(
        json.dumps(
            {
                "topic": "Orders",
                "queueId": i % 2,
                "keys": f"order-{i}",
                "tags": "paid",
                "body": str(i),
            }
        )
        + "\n"
        for i in range(40)
    )
    result = run_cli(
        "append",
        store,
        "--create",
        "--commitlog-file-size",
        "8192",
        "--consumequeue-file-size",
        "200",
        "--input",
        "-",
        "--dispatch",
        "--flush",
        "sync",
        input=lines,
    )
    assert result.exit_code == 0, result.stderr
    assert not (store / "abort").exists()
    found = run_cli("read", store, "--topic", "Orders", "--key", "order-7", "--json")
    (message,) = json.loads(found.stdout)
    assert message["body"] == "7" and message["queueId"] == 1
    queue = run_cli("read", store, "--topic", "Orders", "--queue", "0", "--jsonl")
    assert len(queue.stdout.splitlines()) == 20
    info = json.loads(run_cli("info", store, "--json").stdout)
    assert info["dispatch"]["behindRecords"] == 0


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--topic", "Nope", "--queue", "0"], "no consume queue"),
        (["--topic", "TopicTest", "--key", "x", "--index-slots", "7"], "maxHashSlotNum"),
        (["--key", "x", "--index-slots", "7"], "maxHashSlotNum"),  # every topic: the index
        (["--topic", "TopicTest", "--time", "5"], "needs --queue"),
        (["--topic", "T", "--queue", "0", "--from", "1", "--key", "k"], "--from goes with"),
    ],
)
def test_bad_reads(oracle, args: list[str], needle: str) -> None:
    result = run_cli("read", oracle("s1_multi").store, *args)
    assert result.exit_code == 2
    assert needle in result.stderr


def tree_with_mtimes(root: Path) -> dict[str, tuple[int, str]]:
    """Every path under ``root`` with its mtime and contents' digest."""
    return {
        str(path.relative_to(root)): (
            path.stat().st_mtime_ns,
            file_digest(path) if path.is_file() else "dir",
        )
        for path in sorted(root.rglob("*"))
    }


@pytest.mark.parametrize("command", [["dispatch", "--dry-run"], ["recover", "--dry-run"],
                                     ["dispatch", "--rebuild", "--dry-run"]])  # fmt: skip
def test_a_dry_run_opens_nothing_for_writing(oracle, tmp_path: Path, command: list[str]) -> None:
    """No byte, no mtime, no lock file changes; an index file with an all-zero header keeps
    its zero indexCount (a writable open used to rewrite it as 1)."""
    store = oracle("s1_multi").copy_to(tmp_path)
    (store / "lock").unlink()
    index_file = sorted((store / "index").iterdir())[-1]
    with open(index_file, "r+b") as handle:
        handle.write(bytes(40))
    (store / "abort").touch()
    import time

    before = tree_with_mtimes(store)
    time.sleep(0.02)
    result = run_cli(command[0], store, *command[1:], *ORACLE_OPTIONS)
    assert result.exit_code in (0, 1), result.stderr
    assert tree_with_mtimes(store) == before
    assert not (store / "lock").exists()


def test_a_dry_run_of_a_held_store_is_busy(oracle, tmp_path: Path) -> None:
    store = oracle("s1_multi").copy_to(tmp_path)
    with lock_held_elsewhere(store / "lock"):
        for command in (["dispatch", "--dry-run"], ["recover", "--dry-run"]):
            result = run_cli(command[0], store, *command[1:], *ORACLE_OPTIONS)
            assert result.exit_code == 3, result.stderr


def test_a_missing_optional_module_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    store = tmp_path / "s"
    assert run_cli("append", store, "--create", "--topic", "T", "--body", "x").exit_code == 0
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    result = run_cli("export", store, "--to", tmp_path / "out", "--engine", "local")
    assert result.exit_code == 2, result.stderr
    assert "optional module pyarrow" in result.stderr and "internal error" not in result.stderr


def test_a_dry_run_says_where_max_records_stops_it(oracle, tmp_path: Path) -> None:
    """``--max-records N --dry-run`` showed the whole replay, as if N were not given; the plan
    now says the dispatch stops after N records (and JSON has maxRecords)."""
    store = oracle("s1_multi").copy_to(tmp_path)
    shutil.rmtree(store / "consumequeue")
    plain = run_cli("dispatch", store, "--dry-run", "--max-records", "5", *ORACLE_OPTIONS)
    assert plain.exit_code == 1 and "stopping after 5 records" in plain.stdout
    rebuild = run_cli(
        "dispatch", store, "--rebuild", "--dry-run", "--max-records", "5", *ORACLE_OPTIONS
    )
    assert rebuild.exit_code == 1 and "then dispatch from offset 0, stopping after 5" in (
        rebuild.stdout
    )
    for extra, expected in (([], None), (["--max-records", "7"], 7)):
        result = run_cli("dispatch", store, "--dry-run", "--json", *extra, *ORACLE_OPTIONS)
        assert json.loads(result.stdout)["maxRecords"] == expected


def test_a_dry_run_names_the_linked_queue_folders_the_dispatch_names(
    oracle, tmp_path: Path
) -> None:
    """A consume-queue folder that is a symbolic link is named by each dispatch (it writes
    nothing through it); its dry run said nothing of it, so a script reading the plan did not
    learn why those queues stay behind. ``--topic`` names the selected topics' links only."""
    store = oracle("s1_multi").copy_to(tmp_path / "s")
    outside = tmp_path / "outside"
    outside.mkdir()
    linked = store / "consumequeue" / "TopicTest"
    shutil.move(linked, outside / "TopicTest")
    linked.symlink_to(outside / "TopicTest")
    named = f"warning: {linked} is a symbolic link (to {outside / 'TopicTest'})"
    for options in ([], ["--dry-run", "--json"], ["--dry-run", "--topic", "TopicTest"]):
        result = run_cli("dispatch", store, *options, *ORACLE_OPTIONS)
        assert result.exit_code == 0 and named in result.stderr, (options, result.stderr)
    other = run_cli("dispatch", store, "--dry-run", "--topic", "orders.eu-west_1", *ORACLE_OPTIONS)
    assert other.exit_code == 0 and "symbolic link" not in other.stderr


def test_a_dispatch_of_one_topic_leaves_no_work_behind(oracle, tmp_path: Path) -> None:
    """``dispatch --topic T``, on a log whose last records are other topics': its dry run
    reported those records as work after every dispatch (exit 1 for ever: a script waiting
    for "nothing to do" waited for ever), though they give T's queues nothing."""
    store = oracle("s1_multi").copy_to(tmp_path / "s")
    shutil.rmtree(store / "consumequeue" / "orders.eu-west_1")
    topic = ["--topic", "orders.eu-west_1"]
    before = run_cli("dispatch", store, "--dry-run", "--json", *topic, *ORACLE_OPTIONS)
    assert before.exit_code == 1, before.stderr
    plan = json.loads(before.stdout)
    first = json.loads(run_cli("dispatch", store, "--json", *topic, *ORACLE_OPTIONS).stdout)
    assert first["fromOffset"] == plan["fromOffset"] and first["unitsWritten"] > 0
    assert first["toOffset"] == first["logEnd"] == plan["logEnd"]
    after = run_cli("dispatch", store, "--dry-run", "--json", *topic, *ORACLE_OPTIONS)
    assert after.exit_code == 0 and json.loads(after.stdout)["behindBytes"] == 0
    again = json.loads(run_cli("dispatch", store, "--json", *topic, *ORACLE_OPTIONS).stdout)
    assert again["records"] == again["unitsWritten"] == 0


@pytest.mark.parametrize("command", [["dispatch"], ["recover", "--yes"]])
def test_a_last_index_file_a_power_cut_left_unwritten_is_carried_on(
    tmp_path: Path, command: list[str]
) -> None:
    """An index file made just before a power cut, its header never on the disk (all zero):
    the dispatch goes on from where the file before it ends, writing what it would have
    written into the file had the header been there (with the header's end offset of 0 it
    indexed every record again after the files that held them: verify found each entry
    "between records", and recover exited 1)."""
    geometry = ["--index-slots", "4", "--index-entries", "5"]  # two messages (4 keys) a file
    lines = tmp_path / "in.jsonl"
    lines.write_text("".join(json.dumps({"topic": "T", "keys": f"k{n}", "body": "b"}) + "\n"
                             for n in range(4)))  # fmt: skip
    cut, uncut = tmp_path / "cut", tmp_path / "uncut"
    made = run_cli("append", cut, "--create", "--input", lines, "--dispatch", *geometry)
    assert made.exit_code == 0, made.stderr
    more = run_cli("append", cut, "--input", lines, *geometry)  # left undispatched
    assert more.exit_code == 0, more.stderr
    shutil.copytree(cut, uncut)
    full = sorted((cut / "index").iterdir())
    assert len(full) == 2  # both full: the next entry needs a new file
    unwritten = cut / "index" / str(int(full[-1].name) + 1)
    unwritten.write_bytes(bytes(full[-1].stat().st_size))
    for store in (cut, uncut):
        done = run_cli(command[0], store, *command[1:])
        assert done.exit_code == 0, done.stderr
        assert run_cli("verify", store).exit_code == 0
    assert [path.read_bytes() for path in sorted((cut / "index").iterdir())] == [
        path.read_bytes() for path in sorted((uncut / "index").iterdir())
    ]
