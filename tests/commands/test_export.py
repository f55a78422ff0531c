"""``rmqstore export`` as its console script runs it, and run from Python."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rmqstore.fixtures import generate
from rmqstore.pipeline.local import remove_abandoned_stagings

from campaigns import sigint_delivered
from support import (
    fresh_python,
    full_disk_stop,
    parquet_rows,
    run_cli,
    small_filesystem,
    store_being_written,
    tree_digest,
)


def test_the_command_line_exports_without_importing_numpy(tmp_path: Path) -> None:
    """pyarrow imports numpy (30-35 ms) only for conversions an export never makes: the
    command's own process imports pyarrow without it."""
    store_dir = tmp_path / "store"
    generate("multi", store_dir)
    export = ["export", str(store_dir), "--engine", "local", "--to", str(tmp_path / "out")]
    imported = _imported_by(*export, "--split-size", "9000")
    assert "pyarrow.parquet" in imported
    assert not [name for name in imported if name.split(".")[0] == "numpy"]
    # nor its worker processes (-X importtime goes on to them), whose JSON lines encoder
    # made pyarrow load pandas too: 0.5 s more for each worker to start
    workers = [*export[:-1], str(tmp_path / "jsonl"), "--format", "jsonl", "--jobs", "2"]
    imported = _imported_by(*workers, "--split-size", "9000")
    assert imported.count("rmqstore.pipeline.jsonlines") >= 2  # the workers' imports are here
    assert not [name for name in imported if name.split(".")[0] in ("numpy", "pandas")]
    from rmqstore.pipeline.local import LocalPipeline, PipelineOptions

    # what an export in this process writes (pyarrow with numpy here)
    LocalPipeline(str(store_dir), PipelineOptions(split=9000)).export(
        str(tmp_path / "here"), "parquet"
    )
    assert parquet_rows(tmp_path / "out") == parquet_rows(tmp_path / "here") != []


def _imported_by(*args: str) -> list[str]:
    """The modules ``rmqstore ARGS`` imports, in its own process and any it starts."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "rmqstore", *args],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    return [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()]


def test_run_from_python_the_export_leaves_pyarrow_as_it_loads(tmp_path: Path) -> None:
    """Called from a program (``run()``, a test's CliRunner), the process is not rmqstore's:
    pyarrow is imported as it imports itself, numpy included."""
    store_dir = tmp_path / "store"
    generate("multi", store_dir)
    code = (
        "import sys\n"
        "from rmqstore.commands.main import run\n"
        "code = run(['export', sys.argv[1], '--engine', 'local', '--to', sys.argv[2]])\n"
        "print(code, 'pyarrow' in sys.modules, 'numpy' in sys.modules)\n"
    )
    found = fresh_python(code, store_dir, tmp_path / "out")
    assert found.split()[-3:] == ["0", "True", "True"]


def test_an_export_into_the_store_is_refused(tmp_path: Path) -> None:
    """A folder in the commit-log directory stops a 4.x broker's start: an export never
    writes inside the store, whichever folder it names."""
    store_dir = tmp_path / "store"
    generate("basic", store_dir)
    before = tree_digest(store_dir)
    inside_places = ("commitlog/out", "export", "index/x")
    for inside in (store_dir / place for place in inside_places):
        refused = run_cli("export", store_dir, "--to", inside, "--format", "jsonl")
        assert refused.exit_code == 2 and "is inside the store" in refused.stderr
    assert tree_digest(store_dir) == before
    done = run_cli("export", store_dir, "--to", tmp_path / "out", "--format", "jsonl")
    assert done.exit_code == 0


def test_to_dash_is_refused_as_stdout_and_dot_slash_dash_is_a_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--to -`` made a folder named ``-`` where a script meant stdout."""
    store_dir = tmp_path / "store"
    generate("basic", store_dir)
    monkeypatch.chdir(tmp_path)
    refused = run_cli("export", store_dir, "--to", "-", "--format", "jsonl")
    assert refused.exit_code == 2 and "--from-offset 0 --jsonl" in refused.stderr
    assert not (tmp_path / "-").exists()
    done = run_cli("export", store_dir, "--to", "./-", "--format", "jsonl")
    assert done.exit_code == 0 and (tmp_path / "-" / "part-00000.jsonl").is_file()


def test_a_topic_that_matches_no_message_is_named_with_the_store_topics(tmp_path: Path) -> None:
    """``--topic TopicTset`` (a typo) exported or counted 0 messages with no word why: export
    and stats still exit 0 with their usual output (an empty topic is an answer), and warn on
    stderr, naming the topic and the topics that have consume queues."""
    store = tmp_path / "store"
    generate("multi", store)
    hint = (
        "rmqstore: warning: no message of topic 'TopicTset' in the commit log (topics with "
        "consume queues: %RETRY%group_a, Orders-EU_west, TopicTest)"
    )
    export = run_cli("export", store, "--to", tmp_path / "out", "--topic", "TopicTset", "--json")
    assert export.exit_code == 0, export.stderr
    assert json.loads(export.stdout)["messages"] == 0
    assert hint in export.stderr
    stats = run_cli("stats", store, "--topic", "TopicTset", "--topic", "TopicTest", "--json")
    assert stats.exit_code == 0, stats.stderr
    assert {queue["topic"] for queue in json.loads(stats.stdout)["queues"]} == {"TopicTest"}
    assert hint in stats.stderr
    for command in (
        ["stats", store, "--topic", "TopicTest"],
        ["export", store, "--to", tmp_path / "out2", "--topic", "TopicTest"],
    ):
        result = run_cli(*command)
        assert result.exit_code == 0 and "warning" not in result.stderr, result.stderr


def test_export_and_stats_of_a_log_with_missing_files_say_so(tmp_path: Path) -> None:
    """A commit-log file deleted between others: export wrote the messages of the files that
    are there and stats counted them, exit 0, with no word of the missing ones. Both warn."""
    store = tmp_path / "store"
    generate("missing-file", store)
    gone = "commit-log files are missing from offset 81920 to 98304 (1 file): their messages"
    export = run_cli("export", store, "--to", tmp_path / "out", "--json")
    assert export.exit_code == 0 and f"{gone} are not in the export" in export.stderr
    stats = run_cli("stats", store, "--json")
    assert stats.exit_code == 0 and f"{gone} are not in the counts" in stats.stderr
    whole = tmp_path / "whole"
    generate("multi", whole)
    assert "missing" not in run_cli("stats", whole).stderr


def test_small_commit_log_files_share_part_files(tmp_path: Path) -> None:
    """A store of 4 KiB commit-log files (fixtures for tests) was exported as a part file
    per commit-log file, 52 of them for a real broker's 3,000 messages in 64 KiB files:
    consecutive whole files now share a part up to --split-size bytes, in both ways of
    running, and ``stats`` counts them in the same groups."""
    store = tmp_path / "store"
    messages = tmp_path / "messages.jsonl"
    messages.write_text(
        "".join(
            json.dumps({"topic": f"T{n % 3}", "body": f"m{n:04d}" * 10, "keys": f"k{n}"}) + "\n"
            for n in range(1200)
        )
    )
    created = run_cli(
        "append", store, "--create", "--commitlog-file-size", "4096", "--input", messages
    )
    assert created.exit_code == 0, created.stderr
    logs = len(list((store / "commitlog").iterdir()))
    assert logs > 40
    shown = run_cli("export", store, "--to", tmp_path / "one", "--split-size", "1048576")
    assert shown.exit_code == 0, shown.stderr
    assert "1 part file (part-00000.parquet)" in shown.stdout
    exports = []
    for jobs in ("1", "2"):
        out = tmp_path / f"jobs-{jobs}"
        result = run_cli(
            "export", store, "--to", out, "--split-size", "40000", "--jobs", jobs, "--json"
        )
        assert result.exit_code == 0, result.stderr
        exports.append((json.loads(result.stdout) | {"destination": ""}, tree_digest(out)))
        parts = sorted(out.iterdir())
        assert len(parts) == len(json.loads(result.stdout)["files"]) < logs / 8
    assert exports[0] == exports[1]
    rows = parquet_rows(tmp_path / "jobs-1")
    assert [row["body"] for row in rows] == [f"m{n:04d}".encode() * 10 for n in range(1200)]
    assert rows == parquet_rows(tmp_path / "one")
    counts = [
        json.loads(run_cli("stats", store, "--json", "--split-size", split, *jobs).stdout)
        for split, jobs in (("4096", ()), ("40000", ()), ("40000", ("--jobs", "2")))
    ]
    assert counts[0] == counts[1] == counts[2]
    assert sum(queue["messages"] for queue in counts[0]["queues"]) == 1200


def test_a_store_being_written_is_exported_as_it_stood_with_each_record_whole(
    tmp_path: Path, monkeypatch
) -> None:
    """Another process holds the lock and is writing the last record but one (its tail
    still zeros, which the checks let through: the properties are outside the body CRC),
    and then the last. The export reads what was there when it began, 50 ms later: that
    record whole, with its keys, and not the one written after it."""
    import rmqstore.segments as segments

    from support import lock_held_elsewhere

    store, being_written, finishing = store_being_written(tmp_path)
    finishing.patch_into(monkeypatch, segments)
    out = tmp_path / "out"
    with lock_held_elsewhere(store / "lock"):
        result = run_cli("export", store, "--engine", "local", "--to", out, "--format", "jsonl")
    assert result.exit_code == 0, result.stderr
    assert finishing.waited == [0.05]
    exported = [json.loads(line) for part in sorted(out.glob("*.jsonl")) for line in part.open()]
    assert [row["keys"] for row in exported] == [f"key-{n}" for n in range(11)]
    assert exported[-1]["properties"] == being_written["properties"]
    assert exported[-1]["uniqKey"] == being_written["uniqKey"]


def test_export_and_stats_of_a_store_being_written_say_where_they_read_it_up_to(
    tmp_path: Path, monkeypatch
) -> None:
    """Read as it stood, a store another process writes is counted and exported up to where
    its data ended when the command began: the JSON gives that offset as liveEnd, and stderr
    warns that what was written after is not in the output. The commit-log file the writer
    starts meanwhile (a broker's next file) is not listed as one whose data ends at 0: it
    was not read."""
    import rmqstore.segments as segments

    from support import lock_held_elsewhere

    store, being_written, finishing = store_being_written(tmp_path)
    next_file = store / "commitlog" / f"{65536:020d}"

    def finish_and_roll(seconds: float) -> None:
        finishing(seconds)  # the record being written, and the next one, written whole
        if not next_file.exists():
            next_file.write_bytes(bytes(65536))

    monkeypatch.setattr(
        segments, "time", type("Time", (), {"sleep": staticmethod(finish_and_roll)})
    )
    with lock_held_elsewhere(store / "lock"):
        counted = run_cli("stats", store, "--engine", "local", "--json")
        exported = run_cli("export", store, "--engine", "local", "--to", tmp_path / "out",
                           "--json")  # fmt: skip
    log_end = (store / "commitlog" / f"{0:020d}").read_bytes().rstrip(b"\0")
    start = being_written["commitLogOffset"]
    for result, what, messages in ((counted, "counts", 11), (exported, "export", 12)):
        assert result.exit_code == 0, result.stderr
        document = json.loads(result.stdout)
        live_end = document["liveEnd"]
        if what == "counts":  # where the record being written had its tail still zeros
            assert start < live_end <= start + being_written["storeSize"] - 16
        else:  # the writes were finished by then
            assert live_end == len(log_end)
        assert (
            f"as it stood when the command began, up to commit-log offset {live_end:,}; the "
            f"messages written after are not in the {what}"
        ) in " ".join(result.stderr.split())
        files = document["files" if what == "counts" else "commitLogFiles"]
        assert [entry["file"] for entry in files] == [f"commitlog/{0:020d}"]
        assert document["messages"] == messages
    at_rest = json.loads(run_cli("stats", store, "--engine", "local", "--json").stdout)
    assert at_rest["liveEnd"] is None and at_rest["messages"] == 12
    assert at_rest["files"][-1] == {
        "file": f"commitlog/{65536:020d}", "records": 0, "bytes": 0, "blankBytes": 0,
        "crcFailures": 0, "invalidRegions": 0, "end": 0, "endedBy": "end",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("form", "jobs", "most"),
    [("parquet", "2", 384 << 10), ("parquet", "1", 384 << 10), ("jsonl", "1", 1 << 20)],
)
def test_an_export_a_full_disk_stops_leaves_nothing_behind(
    tmp_path: Path, form: str, jobs: str, most: int
) -> None:
    """An export onto a disk that fills up part way (a small file system left with 0 up to
    the room the export takes, in steps), here or in worker processes: exit 4 in one line naming the
    full disk, and nothing of it on the disk, no part file and no folder under a temporary
    name. With room enough, the same export writes every message. (Parquet in this process:
    a full disk as the last part file's last row group or footer was written said the export
    was done, exit 0, with that part cut short.)"""
    store = tmp_path / "store"
    generate("multi", store)
    with small_filesystem(tmp_path, "4m") as disk:
        outcomes = set()
        for room in range(0, most + 1, most // 6):
            out = disk / "out"
            export = ["export", store, "--engine", "local", "--to", out, "--format", form]
            line = full_disk_stop(disk, room, *export, "--split-size", "65536", "--jobs", jobs)
            left = sorted(path.name for path in disk.iterdir())
            if line is None:
                outcomes.add("done")
                assert left == ["out"]
                assert sum(1 for _ in out.glob(f"part-*.{form}")) == 9
                if form == "parquet":  # every part whole
                    assert len(parquet_rows(out)) == 602
                else:
                    assert sum(len(p.read_bytes().splitlines()) for p in out.iterdir()) == 602
                shutil.rmtree(out)
                continue
            outcomes.add("stopped")
            assert left == [], line
        assert outcomes == {"stopped", "done"}


TERMINATED_EXPORT = """
import os, signal, sys
import rmqstore.pipeline.local as local
from rmqstore.commands.main import main
exported = local.export_range
def export_range(*args, **kwargs):  # SIGTERM once the first part file is written
    result = exported(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGTERM)
    return result
local.export_range = export_range
sys.argv = ["rmqstore", "export", *sys.argv[1:]]
main()
"""


def _export_stopped_by(
    script: str, tmp_path: Path
) -> tuple[Path, Path, subprocess.CompletedProcess]:
    """``script`` (an export that signals itself once a part file is written) exporting a
    fixture store to ``exports/out``: the store, the destination and how it ended."""
    store = tmp_path / "store"
    generate("multi", store)
    out = tmp_path / "exports" / "out"
    out.parent.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", script, str(store), "--engine", "local", "--to", str(out),
         "--split-size", "65536"],
        capture_output=True,
        text=True,
    )  # fmt: skip
    return store, out, done


def test_sigterm_stops_an_export_as_ctrl_c_does(tmp_path: Path) -> None:
    """SIGTERM (kill PID, a service manager, timeout) once the export has written a part
    file: exit 143 and one line, and nothing of the export left (the process used to die on
    the spot, leaving its folder under a temporary name, part files and all)."""
    _store, out, done = _export_stopped_by(TERMINATED_EXPORT, tmp_path)
    assert done.returncode == 143, done.stderr
    assert done.stderr.strip() == "rmqstore: error: terminated (SIGTERM)"
    assert list(out.parent.iterdir()) == []


# an export given SIGTERM just as its folder is renamed into place, then SIGINT as it ends
DONE_THEN_TERMINATED_EXPORT = """
import os, signal, sys
from rmqstore.commands.main import main
renamed = os.replace
def replace(source, target, *args, **kwargs):
    renamed(source, target, *args, **kwargs)
    if os.path.basename(target) == "out":  # the export's folder, in place
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
os.replace = replace
sys.argv = ["rmqstore", "export", *sys.argv[1:]]
main()
"""


def test_a_stop_once_the_exports_folder_is_in_place_does_not_fail_it(tmp_path: Path) -> None:
    """A stop signal that comes once the export's folder is renamed into place (every byte
    of it synced before) finds the export done: exit 0, its report, the export whole. It
    ended the command as stopped (exit 143) with the whole export there, which a script
    takes for an export that failed and that the next export refuses (the signals campaign,
    seed 20261212)."""
    store, out, done = _export_stopped_by(DONE_THEN_TERMINATED_EXPORT, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert sorted(path.name for path in out.parent.iterdir()) == ["out"]
    written = {path.name for path in out.iterdir()}
    assert written and all(name.startswith("part-") for name in written)
    again = tmp_path / "again"
    assert run_cli("export", store, "--to", again, "--split-size", "65536").exit_code == 0
    assert {path.name: path.read_bytes() for path in again.iterdir()} == {
        path.name: path.read_bytes() for path in out.iterdir()
    }


HUNG_UP_EXPORT = TERMINATED_EXPORT.replace("signal.SIGTERM", "signal.SIGHUP")


def test_a_hangup_stops_an_export_as_ctrl_c_does(tmp_path: Path) -> None:
    """SIGHUP (the terminal or ssh session the export ran in went away) once the export
    has written a part file: exit 129 and one line, nothing of the export left (the
    process used to die on the spot, leaving its folder under a temporary name)."""
    _store, out, done = _export_stopped_by(HUNG_UP_EXPORT, tmp_path)
    assert done.returncode == 129, done.stderr
    assert done.stderr.strip() == "rmqstore: error: hung up (SIGHUP)"
    assert list(out.parent.iterdir()) == []


HUNG_UP_GROUP_EXPORT = """
import os, signal, sys
import rmqstore.pipeline.local as local
from rmqstore.commands.main import main
mapped = local.process_map
def process_map(*args, **kwargs):  # the terminal goes once the workers wrote a part
    for number, result in enumerate(mapped(*args, **kwargs)):
        if number == 1:
            os.killpg(0, signal.SIGHUP)  # to every process of the group, workers too
        yield result
local.process_map = process_map
sys.argv = ["rmqstore", "export", *sys.argv[1:]]
main()
"""


def test_a_hangup_of_the_process_group_stops_an_export_in_workers_in_one_line(
    tmp_path: Path,
) -> None:
    """A terminal that goes sends SIGHUP to its whole process group: the export's worker
    processes and multiprocessing's helper get it too. The command stops on it (exit 129,
    one line, nothing of the export left); the helper died of it before, and the pool
    started another, with a warning and tracebacks from it on stderr."""
    store = tmp_path / "store"
    generate("multi", store)
    out = tmp_path / "exports" / "out"
    out.parent.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", HUNG_UP_GROUP_EXPORT, str(store), "--engine", "local", "--to",
         str(out), "--split-size", "65536", "--jobs", "2"],
        capture_output=True,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's job has
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 129, done.stderr
    assert done.stderr.strip() == "rmqstore: error: hung up (SIGHUP)"
    assert list(out.parent.iterdir()) == []


# Ctrl-C in the terminal: SIGINT to the whole process group, workers too, as soon as the
# first worker process is started (still importing its modules) or once a part is written
# (the workers between jobs, or in one)
INTERRUPTED_GROUP_EXPORT = """
import os, signal, sys
import rmqstore.workers as workers
from rmqstore.commands.main import main
submit, submitted = workers._submit, []
def interrupt_at_start(*args):
    future = submit(*args)
    submitted.append(future)
    if len(submitted) == 1:
        os.killpg(0, signal.SIGINT)
    return future
def interrupt_after_a_part(*args):
    future = submit(*args)
    submitted.append(future)
    if len(submitted) == 5:  # the fifth job is handed out once the first is done
        os.killpg(0, signal.SIGINT)
    return future
workers._submit = WHEN
sys.argv = ["rmqstore", "export", *sys.argv[1:]]
main()
"""


@pytest.mark.parametrize("when", ["interrupt_at_start", "interrupt_after_a_part"])
def test_ctrl_c_to_the_process_group_stops_an_export_in_workers_in_one_line(
    tmp_path: Path, when: str
) -> None:
    """Each worker process got the terminal's SIGINT too, and one still importing its
    modules, or waiting for its next job, printed a KeyboardInterrupt traceback beside the
    command's one line. Workers now ignore the stop signals: the command acts on them."""
    store = tmp_path / "store"
    generate("multi", store)
    out = tmp_path / "exports" / "out"
    out.parent.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_GROUP_EXPORT.replace("WHEN", when), str(store),
         "--engine", "local", "--to", str(out), "--split-size", "65536", "--jobs", "2"],
        capture_output=True,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's job has
        timeout=120,
        preexec_fn=sigint_delivered,
    )  # fmt: skip
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip() == "rmqstore: error: interrupted"
    assert list(out.parent.iterdir()) == []


KILLED_EXPORT = TERMINATED_EXPORT.replace("signal.SIGTERM", "signal.SIGKILL")


def test_a_killed_exports_staging_folder_goes_with_the_next_export(tmp_path: Path) -> None:
    """An export killed (or cut off by a power cut) leaves its folder under a temporary
    name; the next export to the same destination removes it, and exports whole."""
    store, out, killed = _export_stopped_by(KILLED_EXPORT, tmp_path)
    assert killed.returncode == -9, killed.stderr
    left = [path.name for path in out.parent.iterdir()]
    assert left == [f".out.rmqstore-{killed_pid(left[0])}"], left
    again = run_cli("export", store, "--engine", "local", "--to", out, "--json")
    assert again.exit_code == 0, again.stderr
    assert [path.name for path in out.parent.iterdir()] == ["out"]
    fresh = run_cli("export", store, "--engine", "local", "--to", tmp_path / "fresh", "--json")
    assert json.loads(again.stdout)["messages"] == json.loads(fresh.stdout)["messages"] > 0


def killed_pid(name: str) -> int:
    return int(name.rsplit("-", 1)[1])


def test_a_staging_folder_an_export_still_holds_is_left(tmp_path: Path) -> None:
    """Only folders left behind go: not one whose process runs (this test's own), nor one
    whose lock is held (an export on another machine sharing the folder), nor anything
    else beside the destination."""
    running = tmp_path / f".out.rmqstore-{os.getpid()}"
    held = tmp_path / ".out.rmqstore-999999999"
    gone = tmp_path / ".out.rmqstore-999999998"
    # killed as it removed its folder (renamed first, see remove_from_under_writers)
    gone_removing = tmp_path / ".out.rmqstore-999999995.removing"
    others = [tmp_path / ".out.rmqstore-x", tmp_path / ".other.rmqstore-999999997"]
    for folder in [running, held, gone, gone_removing, *others]:
        folder.mkdir()
        (folder / "part-00000.parquet").write_bytes(b"x")
    (tmp_path / ".out.rmqstore-999999996").symlink_to(gone)
    fd = os.open(held, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        removed = remove_abandoned_stagings(tmp_path, ".out.rmqstore-")
    finally:
        os.close(fd)
    assert sorted(removed) == sorted([gone.name, gone_removing.name])
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
        [running.name, held.name, *(path.name for path in others), ".out.rmqstore-999999996"]
    )
