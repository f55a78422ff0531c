"""RocketMQ's HA protocol: ``serve-ha`` and ``replicate ha://`` over loopback, and the slave
side against a scripted master (frames split at every byte, heartbeats, a record cut by a
frame, a wrong offset, an oversized frame, a master that stalls)."""

from __future__ import annotations

import json
import random
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from rmqstore.config import StoreConfig
from rmqstore.fixtures import SCENARIOS, FixtureOptions, generate
from rmqstore.ha import (
    HEADER,
    MAX_FRAME,
    REPORT,
    FrameReader,
    HAError,
    connect,
    replicate_from_master,
)
from rmqstore.store import Store

from campaigns import sigint_delivered
from support import (
    ORACLE_OPTIONS,
    log_bytes,
    queue_files,
    replicate,
    run_cli,
    serving,
    serving_logged,
    serving_process,
    torn_replica,
)

pytestmark = pytest.mark.plumbing

FILE = 65536
CLEAN = sorted(n for n in SCENARIOS if n != "large" and SCENARIOS[n].damage is None)


def wait_for_a_line(process: subprocess.Popen, text: str, timeout: float = 60) -> str:
    """Until ``process`` says ``text`` on stderr (however slowly a process starts on a busy
    machine): that line."""
    assert process.stderr is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([process.stderr], [], [], 0.2)[0]:
            line = process.stderr.readline()
            if text in line:
                return line
    raise AssertionError(f"{text!r} never said")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def following_slave(address: str, dest: Path, *options: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "rmqstore", "replicate", address, str(dest), "--follow",
         *options],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip


@pytest.mark.parametrize("name", CLEAN)
def test_a_half_copied_replica_catches_up_over_ha(tmp_path: Path, name: str) -> None:
    source = tmp_path / "source"
    generate(name, source, FixtureOptions())
    dest = tmp_path / "dest"
    with Store.open_read(source, StoreConfig()) as opened:
        end = opened.log_end().offset
    half = replicate(source, dest, "--until", str(end // 2))  # seeded from a backup
    with serving(source) as address:
        done = replicate(address, dest)
    assert done["fromOffset"] <= half["toOffset"] < done["toOffset"]
    assert log_bytes(dest) == log_bytes(source)
    assert queue_files(dest) == queue_files(source)
    assert run_cli("verify", dest).exit_code == 0
    if name != "multi":
        return
    with serving(source) as address:  # again: nothing new, a heartbeat at DEST's end
        again = replicate(address, dest)
    assert again["bytesReceived"] == 0 and again["toOffset"] == done["toOffset"]


def test_a_session_ending_where_a_file_ends_settles_the_abort_a_stopped_one_left(
    tmp_path: Path,
) -> None:
    """The master's records end where a file ends (its BLANK, then a file whose first record
    is not written yet: zeros in its length field), and DEST is a replica an earlier session
    left with 'abort' (killed, a full disk). The session that brings DEST to the file's end
    removes 'abort', and verify finds the replica sound; it kept 'abort' (the end a broker's
    recovery finds is at the BLANK, not where the master's records end), and verify then
    took the BLANK for a torn tail, with recover as the next step."""
    source = tmp_path / "source"
    generate("multi", source, FixtureOptions())
    with open(source / "commitlog" / f"{4 * 65536:020d}", "r+b") as rolled:
        rolled.write(bytes(4))
    dest = tmp_path / "dest"
    replicate(source, dest, "--until", "100000")
    (dest / "abort").touch()
    with serving(source) as address:
        done = replicate(address, dest)
    assert done["toOffset"] == 4 * 65536 and not (dest / "abort").exists()
    assert log_bytes(dest) == log_bytes(source, 4 * 65536)
    checked = run_cli("verify", dest, "--json")
    assert checked.exit_code == 0, checked.stdout


def test_an_empty_replica_starts_at_the_masters_last_file(tmp_path: Path) -> None:
    """As with a Java master, a slave reporting 0 gets the master's last file on."""
    source = tmp_path / "source"
    generate("multi", source, FixtureOptions())
    last = sorted((source / "commitlog").iterdir())[-1]
    dest = tmp_path / "dest"
    with serving(source) as address:
        done = replicate(address, dest, "--commitlog-file-size", str(FILE),
                         "--consumequeue-file-size", "2000")  # fmt: skip
    assert done["fromOffset"] == 0 and done["toOffset"] > int(last.name)
    assert list(log_bytes(dest)) == [last.name]
    assert log_bytes(dest)[last.name] == log_bytes(source)[last.name]
    verified = run_cli("verify", dest, "--json")
    assert verified.exit_code == 0, verified.stdout


@pytest.mark.parametrize("dest_file_size", [1 << 30, 16384])
def test_a_replica_of_another_file_size_than_its_masters_is_refused_at_the_files_end(
    tmp_path: Path, dest_file_size: int
) -> None:
    """A slave given another commit-log file size than its master's, begun while the master
    had one file (so its first frame starts a file either way): a frame crosses DEST's file
    end (a smaller DEST), or, when the master closes that file, its BLANK does not end where
    DEST's file ends (a larger one). The larger one used to take the master's next file
    into the same file as a slave broker does, the BLANK then hiding everything after it
    from a broker's walk (verify: blank-size); now the session ends there (exit 4, one line
    saying to give DEST the master's size), DEST sound up to its last whole record (the
    smaller one, refused in its first session, is not made at all)."""
    source = tmp_path / "source"
    lines = "".join(json.dumps({"topic": "T", "body": "x" * 900}) + "\n" for _ in range(300))
    created = run_cli("append", source, "--create", "--input", "-", "--commitlog-file-size",
                      str(FILE), input=lines[: len(lines) // 6])  # fmt: skip
    assert created.exit_code == 0, created.stderr
    dest = tmp_path / "dest"
    with serving(source) as address:
        refused = run_cli("replicate", address, dest, "--commitlog-file-size", str(dest_file_size))
    if dest_file_size > FILE:  # it took the master's first file
        assert refused.exit_code == 0, refused.stderr
        assert run_cli("append", source, "--input", "-", input=lines).exit_code == 0  # rolls
        with serving(source) as address:
            refused = run_cli("replicate", address, dest)
    assert refused.exit_code == 4
    assert "DEST's file size must be the master's mappedFileSizeCommitLog" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    if dest_file_size < FILE:
        assert not dest.exists()
        return
    verified = run_cli("verify", dest, "--json")
    assert verified.exit_code == 0, verified.stdout
    master = b"".join(log_bytes(source).values())
    with open(dest / "commitlog" / f"{0:020d}", "rb") as replica:  # 1 GiB, sparse
        copied = replica.read(len(master)).rstrip(b"\0")
    assert copied and copied == master[: len(copied)]


@pytest.mark.parametrize(
    "name",
    ["s1_multi", "s3_txn_delay", "s4_recovered_from_torn_half_record", "v533_s1_multi",
     "v533_s3_txn"],
)  # fmt: skip
def test_broker_stores_over_ha(oracle, tmp_path: Path, name: str) -> None:
    store = oracle(name).store
    dest = tmp_path / "dest"
    replicate(store, dest, "--until", "1000000", *ORACLE_OPTIONS)
    with serving(store, *ORACLE_OPTIONS) as address:
        done = replicate(address, dest, *ORACLE_OPTIONS)
    # S4's files keep the torn bytes its broker's recovery stepped back from
    assert log_bytes(dest) == log_bytes(store, done["toOffset"])
    assert queue_files(dest) == queue_files(store)
    assert run_cli("verify", dest, *ORACLE_OPTIONS).exit_code == 0


def test_a_crashed_master_store_is_served_up_to_its_valid_end(oracle, tmp_path: Path) -> None:
    crash = oracle("s2_crash")
    store = crash.root / "store_torn_half_record"
    end = crash.manifest["lastValidEnd"]
    dest = tmp_path / "dest"
    replicate(store, dest, "--until", "1000000", *ORACLE_OPTIONS)
    with serving(store, *ORACLE_OPTIONS) as address:
        done = replicate(address, dest, *ORACLE_OPTIONS)
    assert done["toOffset"] == end  # the torn record is not served
    assert log_bytes(dest) == {name: data for name, data in log_bytes(store, end).items() if data}
    assert run_cli("verify", dest, *ORACLE_OPTIONS).exit_code == 0


def test_an_empty_slave_of_a_broker_store_is_what_a_java_slave_makes(
    oracle, tmp_path: Path
) -> None:
    """ha-protocol.md, measured with the 4.9.8 store code on S1: an empty slave starts at the
    master's last file (3,342,336 of 3,346,149) and its TopicTest/0 queue holds only the file
    at 4000, 50 filler entries (queue offsets 200-249) in front of the real entry 250."""
    store = oracle("s1_multi").store
    dest = tmp_path / "dest"
    with serving(store, *ORACLE_OPTIONS) as address:
        done = replicate(address, dest, *ORACLE_OPTIONS)
    assert done["toOffset"] == 3_346_149
    assert [p.name for p in (dest / "commitlog").iterdir()] == [f"{3_342_336:020d}"]
    queue = dest / "consumequeue" / "TopicTest" / "0"
    assert [p.name for p in queue.iterdir()] == [f"{4000:020d}"]
    entries = [
        struct.unpack_from(">qiq", (queue / f"{4000:020d}").read_bytes(), n * 20) for n in range(51)
    ]
    assert entries[:50] == [(0, 0x7FFFFFFF, 0)] * 50
    assert entries[50][0] >= 3_342_336 and entries[50][1] > 0
    assert run_cli("verify", dest, *ORACLE_OPTIONS).exit_code == 0
    with serving(store, *ORACLE_OPTIONS) as address:  # a slave without the master's file size
        refused = run_cli("replicate", address, tmp_path / "unsized")
    assert refused.exit_code == 4 and "--commitlog-file-size" in refused.stderr
    assert not (tmp_path / "unsized").exists()


@pytest.mark.campaign
def test_slaves_killed_at_random_points_then_a_rerun_reach_the_same_replica(
    tmp_path: Path,
) -> None:
    source = tmp_path / "source"
    generate("large", source, FixtureOptions(messages=150_000, commitlog_file_size=1 << 22))
    files = len(list((source / "commitlog").iterdir()))
    dest = tmp_path / "dest"
    replicate(source, dest, "--until", "4096")  # an empty slave would start at the last file
    rng = random.Random(11)
    cut_short = 0
    with serving(source) as address:
        for _ in range(4):
            child = subprocess.Popen(
                [sys.executable, "-m", "rmqstore", "replicate", address, str(dest)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            at = rng.randint(2, files - 1)  # killed once DEST has this many files
            while child.poll() is None and len(list((dest / "commitlog").iterdir())) < at:
                time.sleep(0.001)
            time.sleep(rng.uniform(0, 0.02))
            cut_short += child.poll() is None
            child.send_signal(signal.SIGKILL)
            child.wait()
        replicate(address, dest)
    assert cut_short  # some kills came mid-transfer
    assert log_bytes(dest) == log_bytes(source)
    assert queue_files(dest) == queue_files(source)
    assert run_cli("verify", dest).exit_code == 0


def test_a_slave_killed_inside_a_records_properties_fetches_it_again(tmp_path: Path) -> None:
    source = tmp_path / "source"
    generate("multi", source, FixtureOptions())
    dest = tmp_path / "dest"
    torn_replica(source, dest)
    with serving(source) as address:
        replicate(address, dest)
    assert log_bytes(dest) == log_bytes(source)
    assert queue_files(dest) == queue_files(source)
    assert run_cli("verify", dest).exit_code == 0


def test_follow_over_ha_while_the_master_store_is_written(tmp_path: Path) -> None:
    source = tmp_path / "source"
    run_cli("append", source, "--create", "--topic", "T", "--body", "x",
            "--commitlog-file-size", str(FILE))  # fmt: skip
    dest = tmp_path / "dest"
    replicate(source, dest)
    with serving(source, "--follow") as address:
        slave = following_slave(address, dest)
        lines = "".join(
            json.dumps({"topic": "T", "body": f"{n}-" + "y" * (n % 900)}) + "\n" for n in range(600)
        )
        written = run_cli("append", source, "--input", "-", "--flush", "sync", "--jsonl",
                          input=lines)  # fmt: skip
        assert written.exit_code == 0, written.stderr
        deadline = time.monotonic() + 30
        while log_bytes(dest) != log_bytes(source) and time.monotonic() < deadline:
            time.sleep(0.2)
        slave.terminate()
        _, err = slave.communicate(timeout=30)
    assert slave.returncode == 0, err
    assert log_bytes(dest) == log_bytes(source)
    assert run_cli("verify", dest).exit_code == 0


def test_bad_addresses_and_stores_are_one_line_errors(tmp_path: Path) -> None:
    source = tmp_path / "source"
    generate("multi", source, FixtureOptions())
    closed = free_port()  # a port nobody listens on
    refused = run_cli("replicate", f"ha://127.0.0.1:{closed}", tmp_path / "dest")
    assert refused.exit_code == 4 and "cannot connect to 127.0.0.1" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "dest").exists()  # nothing made for a master that is not there
    for bad in ("ha://nohost", "ha://h:99999"):
        result = run_cli("replicate", bad, tmp_path / "dest")
        assert result.exit_code == 2 and "expected HOST:PORT" in result.stderr
    not_a_store = run_cli("serve-ha", tmp_path / "nothing", "--listen", "127.0.0.1:0")
    assert not_a_store.exit_code == 2 and "serving" not in not_a_store.stderr
    busy = socket.create_server(("127.0.0.1", 0))
    with busy:
        taken = run_cli("serve-ha", source, "--listen", f"127.0.0.1:{busy.getsockname()[1]}")
    assert taken.exit_code == 2 and "cannot listen on" in taken.stderr


@pytest.mark.timers
def test_a_following_slave_connects_again_when_the_master_restarts(tmp_path: Path) -> None:
    source = tmp_path / "source"
    run_cli("append", source, "--create", "--topic", "T", "--body", "x",
            "--commitlog-file-size", str(FILE))  # fmt: skip
    dest = tmp_path / "dest"
    replicate(source, dest)
    with serving_process(source) as (address, server):
        port = int(address.rsplit(":", 1)[1])
        slave = following_slave(address, dest)
        wait_for_a_line(server, "connected")  # the master stops once the slave is connected
        time.sleep(0.5)
    lines = "".join(json.dumps({"topic": "T", "body": f"{n}-"}) + "\n" for n in range(300))
    written = run_cli("append", source, "--input", "-", "--jsonl", input=lines)  # master is down
    assert written.exit_code == 0, written.stderr
    with serving(source, port=port):
        deadline = time.monotonic() + 30
        while log_bytes(dest) != log_bytes(source) and time.monotonic() < deadline:
            time.sleep(0.2)
        slave.terminate()
        _, err = slave.communicate(timeout=30)
    assert slave.returncode == 0, err
    assert "connecting again in 5 s" in err
    assert log_bytes(dest) == log_bytes(source)
    assert run_cli("verify", dest).exit_code == 0


@pytest.mark.timers
def test_a_following_slave_waits_for_a_master_that_is_not_up_yet(tmp_path: Path) -> None:
    """As a slave broker from its start: DEST is taken (its lock held), each refused
    connection is one line, and the slave catches up once the master listens."""
    source = tmp_path / "source"
    generate("multi", source, FixtureOptions())
    dest = tmp_path / "dest"
    port = free_port()
    slave = following_slave(f"ha://127.0.0.1:{port}", dest, "--commitlog-file-size", str(FILE),
                            "--consumequeue-file-size", "2000")  # fmt: skip
    try:
        line = wait_for_a_line(slave, "connecting again in 5 s")
        assert f"cannot connect to 127.0.0.1:{port}" in line
        assert run_cli("dispatch", dest).exit_code == 3  # DEST's lock is the slave's
        with serving(source, port=port):
            last = sorted((source / "commitlog").iterdir())[-1].name
            deadline = time.monotonic() + 30
            while log_bytes(dest).get(last) != log_bytes(source)[last]:
                assert time.monotonic() < deadline, "the slave did not catch up"
                time.sleep(0.2)
            slave.send_signal(signal.SIGINT)
            _, err = slave.communicate(timeout=30)
    finally:
        slave.kill()
    assert slave.returncode == 0, err
    assert run_cli("verify", dest).exit_code == 0


def test_a_following_slave_stopped_before_any_master_answered_leaves_dest_as_it_was(
    tmp_path: Path,
) -> None:
    source = tmp_path / "source"
    generate("multi", source, FixtureOptions())
    dest = tmp_path / "dest"
    half = replicate(source, dest, "--until", "300000")
    before = log_bytes(dest)
    slave = following_slave(f"ha://127.0.0.1:{free_port()}", dest)
    try:
        wait_for_a_line(slave, "connecting again in 5 s")
        slave.send_signal(signal.SIGTERM)
        _, err = slave.communicate(timeout=30)
    finally:
        slave.kill()
    assert slave.returncode == 0, err
    assert f"stopped by SIGTERM; DEST ends at {half['toOffset']} and is sound" in err
    assert log_bytes(dest) == before
    assert run_cli("verify", dest).exit_code == 0


# -- the slave against a scripted master ------------------------------------------------------


@contextmanager
def master_with_few_descriptors(
    store: Path, log: Path, descriptors: int, *options: str
) -> Iterator[tuple[int, subprocess.Popen]]:
    """``serve-ha STORE`` whose open-file limit (soft and hard) is ``descriptors``, its
    stderr in ``log``: yields its port and process."""
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (descriptors, descriptors))

    with serving_logged(store, log, *options, preexec_fn=limit) as (port, server):
        yield port, server


def flood(port: int, count: int) -> list[socket.socket]:
    """``count`` connections to ``port``, each reporting offset 0 and reading nothing."""
    held = []
    for _ in range(count):
        peer = socket.create_connection(("127.0.0.1", port), timeout=5)
        peer.sendall(REPORT.pack(0))
        held.append(peer)
    return held


@pytest.mark.parametrize("case", ["max-slaves", "descriptors"])
def test_a_flood_of_connections_neither_stops_the_master_nor_keeps_slaves_out(
    tmp_path: Path, case: str
) -> None:
    """A peer opening connection after connection (a hostile one, or slaves reconnecting in
    a loop) used the master's descriptors up, and ``serve-ha`` exited ("Too many open
    files"), leaving every slave without a master. Past ``--max-slaves`` a connection is
    closed at once, said; run out of descriptors anyway, the master says so, waits, and goes
    on: the slaves it serves keep being served, and one that comes once the flood is gone
    catches up."""
    store = tmp_path / "store"
    generate("multi", store, FixtureOptions())
    log = tmp_path / "serve.log"
    options = ["--max-slaves", "4"] if case == "max-slaves" else ["--max-slaves", "200"]
    with master_with_few_descriptors(store, log, 48, *options) as (port, server):
        early = connect(("127.0.0.1", port))  # a slave served before the flood
        early.sendall(REPORT.pack(0))
        held = flood(port, 120)
        expected = (
            "refused: 4 slaves are being served (--max-slaves)"
            if case == "max-slaves"
            else "cannot take a slave's connection now (Too many open files)"
        )
        deadline = time.monotonic() + 60
        while expected not in log.read_text() and time.monotonic() < deadline:
            assert server.poll() is None, log.read_text()
            time.sleep(0.05)
        assert expected in log.read_text()
        early.settimeout(10)
        assert len(early.recv(HEADER.size)) > 0  # still being sent to
        for peer in held:
            peer.close()
        early.close()
        replica = tmp_path / "replica"
        address = f"ha://127.0.0.1:{port}"
        for _ in range(40):  # once the master has seen the flood's connections end
            result = run_cli("replicate", address, replica, "--commitlog-file-size", str(FILE))
            if result.exit_code == 0:
                break
            time.sleep(0.25)
        assert result.exit_code == 0, result.stderr + log.read_text()
        assert server.poll() is None, log.read_text()
    said = log.read_text()
    assert "Traceback" not in said and "error" not in said, said
    last = sorted((store / "commitlog").iterdir())[-1]
    assert (replica / "commitlog" / last.name).read_bytes() == last.read_bytes()


def test_frames_split_at_every_byte_are_put_together() -> None:
    frames = [(100, b"abc"), (103, b""), (103, bytes(range(256)) * 3)]
    stream = b"".join(HEADER.pack(offset, len(body)) + body for offset, body in frames)
    for cut in range(len(stream) + 1):
        reader = FrameReader()
        got = reader.feed(stream[:cut]) + reader.feed(stream[cut:])
        assert got == frames
    reader = FrameReader()
    assert [f for byte in stream for f in reader.feed(bytes([byte]))] == frames
    with pytest.raises(HAError, match="not the HA protocol"):
        FrameReader().feed(HEADER.pack(0, MAX_FRAME + 1))


@contextmanager
def scripted_master(script) -> Iterator[tuple[str, int]]:  # type: ignore[no-untyped-def]
    """A master on a loopback port that runs ``script(connection, reported_offset)``."""
    listener = socket.create_server(("127.0.0.1", 0))
    failed: list[AssertionError] = []

    def run() -> None:
        connection, _ = listener.accept()
        with connection:
            (reported,) = REPORT.unpack(connection.recv(8, socket.MSG_WAITALL))
            try:
                script(connection, reported)
            except AssertionError as exc:  # the script's own checks fail the test
                failed.append(exc)
            time.sleep(0.6)  # longer than a slave waits after a heartbeat at its end

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[:2]
    finally:
        thread.join(timeout=10)
        listener.close()
    if failed:
        raise failed[0]


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path, int]:
    """A source store of records and a replica holding its first record; returns (source,
    dest, the replica's end)."""
    source = tmp_path / "source"
    generate("multi", source, FixtureOptions())
    dest = tmp_path / "dest"
    replicate(source, dest, "--until", "223")  # DEST holds the first record, dispatched
    return source, dest, 223


def _slave(dest: Path, address: tuple[str, int], silence: float = 5) -> dict:
    config = StoreConfig(commitlog_file_size=FILE, consumequeue_file_size=2000)
    with Store.open_write(dest, config) as store:
        return replicate_from_master(
            connect(address), store, follow=False, should_stop=lambda: False, silence=silence
        ).to_dict()


def _source_bytes(source: Path, start: int, stop: int) -> bytes:
    return (source / "commitlog" / f"{0:020d}").read_bytes()[start:stop]


@pytest.mark.parametrize("cut_before_end", [150, 3])  # in the body; in the properties
def test_a_record_cut_by_a_frame_is_kept_and_dispatched_once_whole(
    pair, cut_before_end: int
) -> None:  # type: ignore[no-untyped-def]
    """A record's tail still zeros can pass the checks (the body CRC does not cover its
    properties): the slave counts only bytes it has received."""
    source, dest, end = pair
    body = _source_bytes(source, end, 2000)
    (second_size,) = struct.unpack_from(">i", body)
    cut = second_size - cut_before_end

    def script(connection: socket.socket, reported: int) -> None:
        assert reported == end
        connection.sendall(HEADER.pack(end, 0))  # a heartbeat first, at the slave's end
        for start, stop in ((0, cut), (cut, len(body))):
            frame = HEADER.pack(end + start, stop - start) + body[start:stop]
            for byte in frame:  # every byte on its own
                connection.sendall(bytes([byte]))
        connection.sendall(HEADER.pack(end + len(body), 0))

    with scripted_master(script) as address:
        done = _slave(dest, address)
    assert done["bytesReceived"] == len(body) and done["frames"] == 2
    data = (dest / "commitlog" / f"{0:020d}").read_bytes()
    assert data[: end + len(body)] == _source_bytes(source, 0, end + len(body))
    with Store.open_read(source) as store:
        whole = [
            offset + header[0]
            for offset, header, *_ in store.commitlog.scan()
            if offset + header[0] <= end + len(body)
        ]
    assert done["toOffset"] == whole[-1]  # dispatched up to the last whole record
    assert done["recordsDispatched"] == len(whole) - 1  # the first was there before


def test_a_slave_has_abort_before_it_writes_a_frame(pair) -> None:  # type: ignore[no-untyped-def]
    """A slave writes 'abort' before the first bytes a master sends, as a slave broker has
    it while it runs: killed before its reput dispatched them, the records it wrote are left
    to a broker's crash recovery (a 5.x broker's normal start may not dispatch them). Here
    the first frame holds part of a record, which no reput dispatches; once the session
    ends with the record whole and dispatched, 'abort' goes."""
    source, dest, end = pair
    body = _source_bytes(source, end, 2000)
    (second_size,) = struct.unpack_from(">i", body)
    log_file = dest / "commitlog" / f"{0:020d}"
    seen: list[bool] = []

    def script(connection: socket.socket, reported: int) -> None:
        connection.sendall(HEADER.pack(end, 100) + body[:100])
        deadline = time.monotonic() + 10
        while log_file.read_bytes()[end : end + 100] != body[:100]:
            assert time.monotonic() < deadline, "the slave did not write the frame"
            time.sleep(0.01)
        seen.append((dest / "abort").exists())
        connection.sendall(HEADER.pack(end + 100, second_size - 100) + body[100:second_size])
        connection.sendall(HEADER.pack(end + second_size, 0))

    assert not (dest / "abort").exists()
    with scripted_master(script) as address:
        done = _slave(dest, address)
    assert seen == [True]
    assert done["toOffset"] == end + second_size and done["recordsDispatched"] == 1
    assert not (dest / "abort").exists()


@pytest.mark.parametrize(
    "frames, message",
    [
        ([(500, b"x" * 10)], "DEST ends at 323"),  # a wrong offset
        ([(223, None)], "not the HA protocol"),  # an oversized frame
    ],
)
def test_a_hostile_master_is_refused_and_dest_keeps_no_torn_bytes(
    pair, frames, message: str
) -> None:  # type: ignore[no-untyped-def]
    source, dest, end = pair
    partial = _source_bytes(source, end, end + 100)  # the start of a record, no more

    def script(connection: socket.socket, reported: int) -> None:
        connection.sendall(HEADER.pack(end, len(partial)) + partial)
        offset = end + len(partial)
        for at, body in frames:
            at = offset if at == 223 else at
            if body is None:
                connection.sendall(struct.pack(">qi", at, MAX_FRAME + 1))
            else:
                connection.sendall(HEADER.pack(at, len(body)) + body)

    before = (dest / "commitlog" / f"{0:020d}").read_bytes()
    with scripted_master(script) as address, pytest.raises(HAError, match=re.escape(message)):
        _slave(dest, address)
    assert (dest / "commitlog" / f"{0:020d}").read_bytes() == before  # torn bytes zeroed


@pytest.mark.timers
def test_a_master_that_stalls_is_given_up(pair) -> None:  # type: ignore[no-untyped-def]
    _, dest, _ = pair

    def script(connection: socket.socket, reported: int) -> None:
        time.sleep(1.2)

    with scripted_master(script) as address, pytest.raises(HAError, match="sent nothing"):
        _slave(dest, address, silence=0.5)


@pytest.mark.timers
@pytest.mark.parametrize("reported", [100, -5], ids=["deleted-file", "negative"])
def test_a_slave_in_no_file_of_the_master_gets_heartbeats_from_an_idle_master(
    oracle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reported: int
) -> None:  # type: ignore[no-untyped-def]
    """A slave whose offset is in no file of the master (the master's old files deleted, a
    known operational problem, apache/rocketmq issue 3388; or an offset below 0) gets
    heartbeats at that offset, as from a broker, and the master looks for such a file again
    once a wait, as it waits for new data. It looked again in a busy loop, opening the
    store each time: a core kept busy for as long as the slave stayed connected."""
    from rmqstore.ha import ServeOptions, serve

    store = oracle("s1_multi").copy_to(tmp_path)
    (store / "commitlog" / f"{0:020d}").unlink()  # offsets 0 .. 65,535 are in no file
    config = StoreConfig(commitlog_file_size=FILE, consumequeue_file_size=2000)
    opens: list[Path] = []
    open_read = Store.open_read

    def counted(cls: type[Store], root: Path, *args: object, **kwargs: object) -> Store:
        opens.append(root)
        return open_read(root, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Store, "open_read", classmethod(counted))
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    server = threading.Thread(
        target=serve, args=(store, listener, config, ServeOptions(), stop.is_set), daemon=True
    )
    server.start()
    try:
        with socket.create_connection(listener.getsockname()[:2], timeout=5) as slave:
            slave.sendall(REPORT.pack(reported))
            slave.settimeout(0.1)
            received = b""
            opened_before = len(opens)
            waited_until = time.monotonic() + 1.0
            while time.monotonic() < waited_until:
                try:
                    received += slave.recv(65536)
                except TimeoutError:
                    continue
            looks = len(opens) - opened_before
    finally:
        stop.set()
        server.join(timeout=10)
        listener.close()
    assert received == HEADER.pack(reported, 0)  # a heartbeat at its offset, no data
    # about ten waits of 0.1 s in that second (a busy loop opened it thousands of times)
    assert 1 <= looks <= 20, looks


# a following slave whose closing of DEST begins with a second SIGINT (Ctrl-C pressed again
# as the first stops it), once the file its first argument names is there
INTERRUPTED_AGAIN_SLAVE = """
import os, signal, sys
from rmqstore.store import Store
from rmqstore.commands.entry import main
close, mark = Store.close, sys.argv[1]
def close_interrupted_again(self, **kwargs):
    if os.path.exists(mark):  # the first Ctrl-C is on its way
        os.kill(os.getpid(), signal.SIGINT)
    return close(self, **kwargs)
Store.close = close_interrupted_again
sys.argv = ["rmqstore", "replicate", *sys.argv[2:]]
main()
"""


def test_a_second_ctrl_c_does_not_break_into_a_stopped_slaves_closing(tmp_path: Path) -> None:
    """Ctrl-C stops a following slave; a second one as it closed DEST (its flush, its
    checkpoint, its 'abort' removed) raised there: exit 130, DEST left as after a crash.
    Once a follow loop is asked to stop, the signals after it are ignored: it ends as on
    one, exit 0, DEST sound."""
    source = tmp_path / "source"
    generate("multi", source, FixtureOptions())
    dest = tmp_path / "dest"
    mark = tmp_path / "interrupted"
    with serving(source) as address:
        slave = subprocess.Popen(
            [sys.executable, "-c", INTERRUPTED_AGAIN_SLAVE, str(mark), address, str(dest),
             "--follow", "--commitlog-file-size", str(FILE), "--consumequeue-file-size", "2000"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=sigint_delivered,
        )  # fmt: skip
        try:
            last = sorted((source / "commitlog").iterdir())[-1].name
            deadline = time.monotonic() + 30
            while not (dest / "commitlog").is_dir() or (
                log_bytes(dest).get(last) != log_bytes(source)[last]
            ):
                assert time.monotonic() < deadline, "the slave did not catch up"
                time.sleep(0.2)
            mark.touch()
            slave.send_signal(signal.SIGINT)
            _, err = slave.communicate(timeout=30)
        finally:
            slave.kill()
    assert slave.returncode == 0, err
    assert "stopped by SIGINT" in err
    assert not (dest / "abort").exists()
    assert run_cli("verify", dest).exit_code == 0
