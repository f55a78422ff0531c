"""The broker's flush policies in ``append``: ASYNC_FLUSH's interval flushes of a pipe that
stays open, and the transient store pool, whose staged records are not in the file until
they are committed (so a killed writer loses them, where bytes written through the map
survive)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rmqstore.config import StoreConfig, load_broker_config

from support import run_cli

GEOMETRY = ["--commitlog-file-size", "65536"]
CONFIG = StoreConfig(commitlog_file_size=65536)


def _writer(store: Path, *options: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "rmqstore", "append", str(store), "--input", "-", "--jsonl",
         *GEOMETRY, *options],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip


def _lines(count: int, size: int = 600) -> bytes:
    return b"".join(
        json.dumps({"topic": "T", "queueId": n % 2, "body": f"{n}-" + "x" * size}).encode() + b"\n"
        for n in range(count)
    )


def _reported_within(
    child: subprocess.Popen, seconds: float, expected: int | None = None
) -> list[dict]:
    """The acknowledgements the child prints within ``seconds`` (its input left open), or
    until ``expected`` of them have come."""
    assert child.stdout is not None
    reported: list[dict] = []
    deadline = time.monotonic() + seconds
    pending = b""
    while (left := deadline - time.monotonic()) > 0 and len(reported) != expected:
        if not select.select([child.stdout], [], [], left)[0]:
            break
        chunk = os.read(child.stdout.fileno(), 65536)
        if not chunk:
            break
        pending += chunk
        *complete, pending = pending.split(b"\n")
        reported += [json.loads(line) for line in complete]
    return reported


def _in_the_file_within(store: Path, line: bytes, seconds: float) -> bool:
    """Whether the body of JSON ``line`` is in the commit-log file (written or committed
    to it, not only staged) within ``seconds``."""
    body = json.loads(line)["body"].encode()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if any(body in path.read_bytes() for path in (store / "commitlog").iterdir()):
            return True
        time.sleep(0.05)
    return False


def _stored(store: Path) -> int:
    result = run_cli("read", store, "--from-offset", "0", "--jsonl", "--body", "none", *GEOMETRY)
    return len(result.stdout.splitlines())


pytestmark = pytest.mark.timers  # flush intervals, in real time


@pytest.fixture
def store(tmp_path: Path) -> Path:
    path = tmp_path / "store"
    created = run_cli("append", path, "--create", *GEOMETRY, "--topic", "T", "--body", "first")
    assert created.exit_code == 0, created.stderr
    return path


def test_async_flush_reports_a_pipe_that_stays_open_interval_by_interval(store: Path) -> None:
    child = _writer(store, "--flush", "async", "--flush-interval", "100")
    assert child.stdin is not None
    child.stdin.write(_lines(50))
    child.stdin.flush()
    reported = _reported_within(child, 3)  # the input is still open: no end-of-input flush
    assert len(reported) == 50
    child.stdin.close()
    assert child.wait(timeout=30) == 0


def test_least_pages_hold_a_small_tail_until_the_thorough_flush(store: Path) -> None:
    child = _writer(
        store, "--flush-interval", "50", "--flush-least-pages", "1000",
        "--flush-thorough-interval", "1500",
    )  # fmt: skip
    assert child.stdin is not None
    child.stdin.write(_lines(10))
    child.stdin.flush()
    assert _reported_within(child, 0.7) == []  # 10 records are far below 1000 pages
    assert len(_reported_within(child, 3)) == 10  # the thorough flush takes them
    child.stdin.close()
    assert child.wait(timeout=30) == 0


@pytest.mark.parametrize(
    "options, survive",
    [
        ([], True),  # written through the map: in the page cache, a killed process keeps them
        (["--transient-store-pool", "--commit-interval", "60000"], False),  # staged only
        (["--transient-store-pool", "--commit-interval", "50"], True),  # committed
    ],
)
def test_what_a_killed_writer_leaves_depends_on_where_records_are(
    store: Path, options: list[str], survive: bool
) -> None:
    before = _stored(store)
    child = _writer(store, "--flush-interval", "60000", "--flush-thorough-interval", "60000",
                    *options)  # fmt: skip
    assert child.stdin is not None
    child.stdin.write(_lines(40))
    child.stdin.flush()
    assert _reported_within(child, 1.0) == []  # nothing is flushed, so nothing is reported
    if survive:  # on a busy machine the writer may take longer to get the records that far
        assert _in_the_file_within(store, _lines(40).splitlines()[-1], 30)
    child.send_signal(signal.SIGKILL)
    child.wait()
    recovered = run_cli("recover", store, "--yes", *GEOMETRY)
    assert recovered.exit_code == 0, recovered.stderr
    assert _stored(store) == before + (40 if survive else 0)


def test_the_transient_pool_goes_with_async_flush_only(store: Path) -> None:
    refused = run_cli(
        "append", store, "--topic", "T", "--body", "x", "--flush", "sync", "--transient-store-pool"
    )
    assert refused.exit_code == 2 and "ASYNC_FLUSH" in refused.stderr


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        (["--flush", "sync", "--flush-interval", "100"], "--flush-interval goes with ASYNC"),
        (["--flush", "sync", "--flush-least-pages", "1", "--flush-thorough-interval", "9"],
         "--flush-least-pages/--flush-thorough-interval go with ASYNC"),
        (["--commit-interval", "40"], "--commit-interval goes with --transient-store-pool"),
        (["--flush", "sync", "--commit-least-pages", "2"], "goes with --transient-store-pool"),
    ],
)  # fmt: skip
def test_a_setting_the_flush_policy_would_not_use_is_refused(
    store: Path, options: list[str], needle: str
) -> None:
    refused = run_cli("append", store, "--topic", "T", "--body", "x", *options)
    assert refused.exit_code == 2 and needle in refused.stderr, refused.stderr
    assert "appended" not in refused.stderr


def test_a_transient_append_writes_what_a_mapped_one_writes(tmp_path: Path) -> None:
    lines = _lines(300, size=900).decode()  # rolls over several 64 KiB files
    digests = []
    for name, options in (("mapped", []), ("transient", ["--transient-store-pool"])):
        path = tmp_path / name
        done = run_cli("append", path, "--create", "--input", "-", "--no-uniq-key", "--dispatch",
                       *GEOMETRY,
                       *options, input=lines)  # fmt: skip
        assert done.exit_code == 0, done.stderr
        files = sorted((path / "commitlog").iterdir())
        assert len(files) > 3
        reads = run_cli("read", path, "--from-offset", "0", "--jsonl", "--body", "base64")
        clocks = ("storeTimestamp", "bornTimestamp")
        digests.append([
            {k: v for k, v in json.loads(line).items() if k not in clocks}
            for line in reads.stdout.splitlines()
        ])  # fmt: skip
        assert run_cli("verify", path, *GEOMETRY).exit_code == 0
    assert digests[0] == digests[1] and len(digests[0]) == 300


def test_the_broker_config_names_the_policy(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text(
        "flushDiskType=ASYNC_FLUSH\nflushIntervalCommitLog=250\nflushCommitLogLeastPages=8\n"
        "flushCommitLogThoroughInterval=5000\ntransientStorePoolEnable=true\n"
        "commitIntervalCommitLog=100\ncommitCommitLogLeastPages=2\n"
        "commitCommitLogThoroughInterval=400\nwarmMapedFileEnable=true\n"
    )
    config = load_broker_config(conf)
    assert (
        config.flush_interval_commitlog,
        config.flush_commitlog_least_pages,
        config.flush_commitlog_thorough_interval,
        config.transient_store_pool_enable,
        config.commit_interval_commitlog,
        config.commit_commitlog_least_pages,
        config.commit_commitlog_thorough_interval,
        config.warm_mapped_file_enable,
    ) == (250, 8, 5000, True, 100, 2, 400, True)
    store = tmp_path / "store"
    done = run_cli("append", store, "--create", "--broker-config", conf, "--topic", "T",
                   "--body", "x", *GEOMETRY)  # fmt: skip
    assert done.exit_code == 0, done.stderr
    (commitlog,) = (store / "commitlog").iterdir()
    assert os.stat(commitlog).st_blocks * 512 >= 65536  # warmed: every block allocated


def test_new_files_are_sparse_unless_preallocated(tmp_path: Path) -> None:
    sizes = {}
    for name, options in (("sparse", []), ("warm", ["--preallocate"])):
        store = tmp_path / name
        done = run_cli("append", store, "--create", "--topic", "T", "--body", "x", *options)
        assert done.exit_code == 0, done.stderr
        (commitlog,) = (store / "commitlog").iterdir()
        sizes[name] = os.stat(commitlog).st_blocks * 512
    assert sizes["sparse"] <= 64 * 1024 * 1024 < sizes["warm"]  # of a 1 GiB file


@pytest.mark.parametrize(
    "flush", [["--flush", "sync"], ["--flush", "async", "--flush-interval", "50"]]
)
def test_a_running_append_dispatch_moves_the_checkpoint_with_its_flushes(
    store: Path, flush: list[str]
) -> None:
    """While ``append --dispatch`` runs, the checkpoint says what its flushes made durable,
    as a broker's does: physicMsgTimestamp, the store time of the last record flushed (it
    moved only when the command ended, so a writer killed after hours of appending left a
    checkpoint whose recovery walks the log from its first file), and logicsMsgTimestamp,
    the last one in the consume queues; neither ahead of what was reported durable."""
    from rmqstore.checkpoint import read_checkpoint

    child = _writer(store, "--dispatch", *flush)
    assert child.stdin is not None
    try:
        for burst in range(2):
            child.stdin.write(_lines(50))  # over the 4 least pages
            child.stdin.flush()
            reported = _reported_within(child, 5, expected=50)  # the input is still open
            assert len(reported) == 50, burst
            checkpoint = read_checkpoint(store / "checkpoint")
            assert checkpoint is not None
            last = reported[-1]["storeTimestamp"]
            assert checkpoint.physic_msg_timestamp == last, burst
            assert checkpoint.logics_msg_timestamp == last, burst
    finally:
        child.stdin.close()
        assert child.wait(timeout=30) == 0
