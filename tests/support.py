"""Helpers shared by the tests: golden vectors, the real-broker oracle stores, the CLI runner."""

from __future__ import annotations

import errno
import ipaddress
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import rmqstore.fixtures
from rmqstore.commands.main import cli
from rmqstore.quarantine import sparse_copy
from rmqstore.store import Store

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "fixtures"
ORACLE_ARCHIVES = FIXTURES / "oracle"
VECTORS_FILE = FIXTURES / "spec" / "store-vectors.json"
ORACLE_CONFIG = {
    "commitlog_file_size": 65536,
    "consumequeue_file_size": 2000,
    "index_slots": 1000,
    "index_entries": 2000,
}
# the Spark JVMs of the tests: the quick compiler only and the serial collector. Their
# queries are small; a JVM's default C2 compiles and parallel GC threads took a third of
# the machine's CPU time in a run of the Spark tests (167 s, 115 s with these)
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
ORACLE_OPTIONS = [
    "--commitlog-file-size",
    "65536",
    "--consumequeue-file-size",
    "2000",
    "--index-slots",
    "1000",
    "--index-entries",
    "2000",
]

# archive name -> folder inside the archive
ORACLE_STORES = {
    "s1_multi": "s1_multi",
    "s2_crash": "s2_crash",
    "s3_txn_delay": "s3_txn_delay",
    "s4_recovered_from_torn_half_record": "s4_recovered_from_torn_half_record",
    "v533_s1_multi": "s1_multi",
    "v533_s3_txn": "s3_txn",
}


@cache
def vectors() -> dict[str, Any]:
    return json.loads(VECTORS_FILE.read_text(encoding="utf-8"))


@dataclass(frozen=True)
class Oracle:
    """An extracted oracle archive: ``root/store`` plus its manifest."""

    name: str
    root: Path

    @property
    def store(self) -> Path:
        return self.root / "store"

    @property
    def manifest(self) -> dict[str, Any]:
        return _manifest(self.root / "manifest.json")

    def copy_to(self, target: Path, which: str = "store") -> Path:
        destination = target / which
        shutil.copytree(self.root / which, destination)
        return destination


@cache
def _manifest(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def extract_oracle(name: str, destination: Path) -> Oracle:
    target = destination / name
    if not target.exists():
        with tarfile.open(ORACLE_ARCHIVES / f"{name}.tar.gz") as archive:
            archive.extractall(target, filter="data")
    return Oracle(name, target / ORACLE_STORES[name])


def java_host(text: str) -> str:
    """A host as Java prints it (``/1.2.3.4:5``, ``/[2001:db8:0:0:0:0:0:1]:5``, or the puts'
    ``2001:db8:0:0:0:0:0:1:5``) in rmqstore's form (``1.2.3.4:5``, ``[2001:db8::1]:5``)."""
    raw = text.lstrip("/")
    if raw.startswith("["):
        host, _, port = raw[1:].partition("]:")
    else:
        host, _, port = raw.rpartition(":")
    address = ipaddress.ip_address(host)
    return f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"


def fresh_python(code: str, *args: str | Path) -> str:
    """The standard output of ``code`` run in a fresh interpreter (``sys.argv[1:]`` =
    ``args``), for what one process's imports decide; fails the test on a nonzero exit."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def peak_rss_mib(command: list[str]) -> tuple[int, int]:
    """Exit code and peak resident memory (MiB) of ``rmqstore COMMAND`` in a child."""
    code = (  # VmHWM: this process's own peak (ru_maxrss would count the parent's at fork)
        "import re,sys; from rmqstore.commands.main import run; rc = run(sys.argv[1:]); "
        "status = open('/proc/self/status').read(); "
        "print(int(re.search(r'VmHWM:\\s+(\\d+)', status).group(1)) // 1024, file=sys.stderr); "
        "sys.exit(rc)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, *command], capture_output=True, text=True, timeout=120
    )
    return result.returncode, int(result.stderr.strip().splitlines()[-1])


def files_held(directory: Path) -> int:
    """How many files under ``directory`` this process holds open, by a descriptor or a map
    (Python's map of a file holds a descriptor of its own). Told by the paths' text: a test
    asks after each of hundreds of writes, and the maps of a process with Arrow loaded run to
    thousands of lines."""
    inside = f"{directory}/"
    held = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed meanwhile (the listing's own descriptor)
        if target.startswith(inside):
            held.add(target)
    with open("/proc/self/maps") as maps:
        for line in maps:
            target = line.split(maxsplit=5)[-1].rstrip("\n")
            if target.startswith(inside):
                held.add(target)
    return len(held)


def run_cli(*args: str | Path, input: str | bytes | None = None, env: dict[str, str] | None = None):
    """Run ``rmqstore ARGS`` in-process; returns click's Result (exit_code, stdout, stderr)."""
    runner = CliRunner()
    return runner.invoke(
        cli, [str(arg) for arg in args], input=input, env=env, catch_exceptions=False
    )


def manifest_dump(manifest: dict[str, Any]) -> dict[str, Any] | None:
    """The store dump of a manifest (S4 names it dumpAfterRecovery; S2 has none)."""
    return manifest.get("dump") or manifest.get("dumpAfterRecovery")


SCAN_FIELDS = (
    "topic",
    "queueId",
    "queueOffset",
    "storeTimestamp",
    "sysFlag",
    "preparedTransactionOffset",
    "keys",
    "uniqKey",
    "msgId",
    "bodyCRC",
    "bornTimestamp",
    "flag",
    "reconsumeTimes",
    "tags",
)


def assert_read_matches_scan_record(document: dict[str, Any], record: dict[str, Any]) -> None:
    """A message as ``rmqstore read --json --body base64`` prints it equals what the broker's
    own ``checkMessageAndReturnSize`` reported for that record."""
    import base64
    import hashlib

    where = f"record at {record['offset']}"
    assert document["commitLogOffset"] == record["offset"], where
    assert document["storeSize"] == record["size"] == record["totalSizeField"], where
    for name in SCAN_FIELDS:
        assert document[name] == record[name], f"{where}: {name}"
    assert document["bornHost"] == java_host(record["bornHost"]), where
    assert document["storeHost"] == java_host(record["storeHost"]), where
    body = base64.b64decode(document["body"]) if document.get("body") else b""
    assert hashlib.sha256(body).hexdigest() == record["bodySha256"], where


_DIGEST_BLOCK = 1 << 16


def file_digest(path: Path, ignored: int = 0) -> str:
    """A digest of a file's contents: sha256 of its size and of each 64 KiB block that is
    not all zeros, with the block's offset. Equal contents give equal digests however
    sparse the files are; only the blocks holding data are read (a 420 MB index file a
    broker's defaults make holds a few pages), not the whole file into memory. The first
    ``ignored`` bytes (at most a block) count as zeros."""
    import errno
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        fd = handle.fileno()
        size = os.fstat(fd).st_size
        digest.update(size.to_bytes(8, "big"))
        zeros = bytes(_DIGEST_BLOCK)
        block = 0  # the first block not yet hashed
        while block * _DIGEST_BLOCK < size:
            try:
                data = os.lseek(fd, block * _DIGEST_BLOCK, os.SEEK_DATA)
                hole = os.lseek(fd, data, os.SEEK_HOLE)
            except OSError as exc:
                if exc.errno == errno.ENXIO:  # nothing but a hole from here to the end
                    break
                data, hole = block * _DIGEST_BLOCK, size  # no sparse-file support: read it all
            block = max(block, data // _DIGEST_BLOCK)
            while block * _DIGEST_BLOCK < hole:
                chunk = os.pread(fd, _DIGEST_BLOCK, block * _DIGEST_BLOCK)
                if block == 0 and ignored:
                    chunk = bytes(min(ignored, len(chunk))) + chunk[ignored:]
                if chunk != zeros[: len(chunk)]:
                    digest.update((block * _DIGEST_BLOCK).to_bytes(8, "big"))
                    digest.update(chunk)
                block += 1
    return digest.hexdigest()


def tree_digest(root: Path) -> dict[str, str]:
    """:func:`file_digest` of every file under ``root`` by relative path: 'the store is
    unchanged'."""
    return {
        str(path.relative_to(root)): file_digest(path)
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def tree_state(root: Path) -> dict[str, str]:
    """Every path under ``root`` (links not followed) with what it is: :func:`file_digest`,
    link target, or directory: "the store is unchanged", no empty folder made either."""
    state = {}
    for directory, subdirectories, names in os.walk(root):
        for name in [*subdirectories, *names]:
            path = Path(directory) / name
            key = str(path.relative_to(root))
            if path.is_symlink():
                state[key] = f"link:{os.readlink(path)}"
            elif path.is_dir():
                state[key] = "dir"
            elif path.is_file():
                state[key] = file_digest(path)
            else:
                state[key] = "special"
    return state


def outside_quarantine(state: dict[str, str]) -> dict[str, str]:
    """``state`` (:func:`tree_state`) without the store's quarantine folder."""
    return {k: v for k, v in state.items() if k != "quarantine" and not k.startswith("quarantine/")}


def parquet_rows(directory: Path) -> list[dict]:
    """The rows of the Parquet part files of an export, by commit-log offset."""
    import pyarrow.parquet as pq

    rows = []
    for part in sorted(directory.glob("part-*.parquet")):
        rows.extend(pq.read_table(part).to_pylist())
    return sorted(rows, key=lambda row: row["commitLogOffset"])


def as_read_document(row: dict) -> dict:
    """A Parquet row in the shape ``rmqstore read --json --body base64`` prints."""
    import base64

    document = dict(row)
    document["body"] = base64.b64encode(row["body"]).decode("ascii") if row["body"] else None
    document["properties"] = dict(row["properties"])
    return document


def check_against_broker(rows: list[dict], manifest: dict) -> None:
    """Exported rows are the messages the broker's own scan found, with the values it put."""
    from rmqstore.properties import decode_properties

    records = [r for r in manifest_dump(manifest)["commitLogScan"]["records"]]
    messages = [r for r in records if r["type"] == "MESSAGE"]
    assert len(rows) == len(messages)
    for row, record in zip(rows, messages, strict=True):
        assert_read_matches_scan_record(as_read_document(row), record)
        assert row["msgSize"] == row["storeSize"]
    puts = {put["physicalOffset"]: put for put in manifest["puts"]}
    by_offset = {row["commitLogOffset"]: row for row in rows}
    assert set(puts) <= set(by_offset)  # the store also holds what the broker wrote itself
    for offset, put in puts.items():
        row = by_offset[offset]
        assert dict(row["properties"]) == decode_properties(put["propertiesString"])
        assert row["msgId"] == put["msgId"] and row["bodyCRC"] == put["bodyCRC"]


@contextmanager
def lock_held_elsewhere(lock_file: Path) -> Iterator[None]:
    """Another process holds the store lock as a broker's JVM does: a POSIX record lock on
    byte 0 of ``lock``, for the duration of the block."""
    import subprocess
    import sys

    code = (
        "import fcntl,sys; f=open(sys.argv[1],'r+'); "
        "fcntl.lockf(f, fcntl.LOCK_EX|fcntl.LOCK_NB, 1, 0); print('ok', flush=True); "
        "sys.stdin.read()"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(lock_file)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ok"
        yield
    finally:
        holder.communicate("", timeout=30)


def square_and_pid(value: int) -> tuple[int, int]:
    """A job for worker-process tests (module level, so a spawned worker can import it)."""
    return value * value, os.getpid()


def mark_started(job: tuple[str, int]) -> int:
    """A job that leaves a file behind when it starts (for look-ahead tests)."""
    directory, number = job
    Path(directory, f"started-{number}").touch()
    return number


def die_in_worker(_: int) -> None:
    os._exit(3)  # a worker killed mid-job (as by the OOM killer)


def record_pid_and_sleep(job: tuple[str, int]) -> int:
    """A long job that leaves its worker's pid in a file (for tests that kill the caller)."""
    import time

    directory, number = job
    staged = Path(directory, f"worker-{number}.pid.tmp")
    staged.write_text(str(os.getpid()))
    staged.rename(Path(directory, f"worker-{number}.pid"))  # the test reads a whole pid
    time.sleep(120)
    return number


def torn_replica(source: Path, dest: Path, cut_before_end: int = 3) -> None:
    """DEST as a copy killed after writing most of a record, before dispatching it: the
    record's last bytes (its properties) still zeros, which passes the record checks."""
    with Store.open_read(source) as opened:
        file_size = opened.commitlog_file_size
        records = [(offset, header[0]) for offset, header, *_ in opened.commitlog.scan()]
    torn, size = records[10]
    copied = run_cli("replicate", source, dest, "--until", str(torn))
    assert copied.exit_code == 0, copied.stderr
    name = f"{torn - torn % file_size:020d}"
    data = (source / "commitlog" / name).read_bytes()
    start = torn % file_size
    with open(dest / "commitlog" / name, "r+b") as handle:
        handle.seek(start)
        handle.write(data[start : start + size - cut_before_end])
    with Store.open_read(dest) as opened:
        assert opened.log_end().offset == torn + size  # the torn record passes the checks


def log_bytes(store: Path, end: int | None = None) -> dict[str, bytes]:
    """Each commit-log file's bytes (those before ``end``, an offset, when given), trailing
    zeros left out (a sparse copy and a pre-allocated file hold the same)."""
    files = {}
    for path in sorted((store / "commitlog").iterdir()):
        data = path.read_bytes()
        if end is not None:
            data = data[: max(0, end - int(path.name))]
        files[path.name] = data.rstrip(b"\0")
    return {name: data for name, data in files.items() if data or end is None}


def queue_files(store: Path) -> dict[str, bytes]:
    """Each consume-queue file's bytes by its path under consumequeue/."""
    root = store / "consumequeue"
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def replicate(source: str | Path, dest: Path, *options: object) -> dict:
    """``rmqstore replicate SOURCE DEST --json``, which must succeed: its JSON."""
    result = run_cli("replicate", source, dest, "--json", *options)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


@contextmanager
def small_filesystem(
    tmp_path: Path,
    size: str,
    kind: str = "tmpfs",
    *,
    image_dir: Path | None = None,
    options: str = "",
) -> Iterator[Path]:
    """A file system of ``size`` (``24m``) mounted for the test (root only; skipped
    elsewhere): a tmpfs, or ``kind`` ``ext4`` on a loop device (block allocation, a journal
    and directory blocks as a disk's file system has them; its ``lost+found`` removed, so
    it holds nothing either), its image in ``image_dir`` (else ``tmp_path``), mounted with
    ``options`` besides."""
    if kind not in ("tmpfs", "ext4"):
        raise ValueError(f"no small file system of kind {kind!r} (tmpfs or ext4)")
    mount_point = tmp_path / f"fs-{uuid.uuid4().hex[:8]}"
    mount_point.mkdir()
    image = (image_dir or tmp_path) / f"{mount_point.name}.img"
    if kind == "ext4":
        with open(image, "wb") as handle:
            handle.truncate(int(size.rstrip("m")) << 20)
        made = subprocess.run(  # no blocks kept for root: the tests run as root
            ["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], capture_output=True
        )
        if made.returncode != 0:
            pytest.skip(f"cannot make an ext4 file system here: {made.stderr!r}")
        mount_options = ",".join(["loop", *([options] if options else [])])
        command = ["mount", "-o", mount_options, str(image), str(mount_point)]
    else:
        command = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)]
    mounted = subprocess.run(command, capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small {kind} here (needs root)")
    try:
        if kind == "ext4":
            (mount_point / "lost+found").rmdir()
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)
        image.unlink(missing_ok=True)


@contextmanager
def failing_disk(
    tmp_path: Path, holds: str = "8m", size: str = "64m", options: str = ""
) -> Iterator[tuple[Path, Path]]:
    """An ext4 file system of ``size`` on a device that takes only ``holds`` of writes (root
    only; skipped elsewhere): its loop device's image is a sparse file on a tmpfs of
    ``holds``, so once that is full each write the device is given fails, as on a disk
    going bad: fsync and msync fail (EIO, ENOSPC), the journal aborts and the file system
    goes read-only. ``holds`` at least ``size``: a disk that does not fail. ``options``:
    more mount options (``commit=300``: no journal commit but those a sync asks for). Yields
    the mount point and the image; a copy of the image is the disk as a crash at that
    moment would leave it (see :func:`mounted_copy`)."""
    with (
        small_filesystem(tmp_path, holds) as device,
        small_filesystem(tmp_path, size, "ext4", image_dir=device, options=options) as disk,
    ):
        (image,) = device.glob("*.img")
        yield disk, image


@contextmanager
def mounted_copy(image: Path, tmp_path: Path) -> Iterator[Path]:
    """A copy of the ext4 ``image`` mounted (its journal replayed, as at a start after a
    crash), unmounted after."""
    copy = tmp_path / f"copy-{uuid.uuid4().hex[:8]}.img"
    subprocess.run(["cp", "--sparse=always", str(image), str(copy)], check=True)
    mount_point = tmp_path / copy.stem
    mount_point.mkdir()
    subprocess.run(["mount", "-o", "loop", str(copy), str(mount_point)], check=True)
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)
        copy.unlink(missing_ok=True)


def assert_reported_are_stored(store: Path, reported: list[dict], where: str = "") -> None:
    """Every message ``append --jsonl`` reported (``reported``, its lines) is in ``store``
    with its id and its body, which begins with its queue offset in six digits."""
    read = run_cli("read", store, "--from-offset", "0", "--jsonl", "--body", "text")
    stored = {
        message["commitLogOffset"]: message for message in map(json.loads, read.stdout.splitlines())
    }
    for message in reported:
        found = stored.get(message["commitLogOffset"])
        assert found is not None, f"{where}: {message['msgId']} lost"
        assert found["msgId"] == message["msgId"], where
        assert found["body"].startswith(f"{message['queueOffset']:06d}x"), where


def _filesystem_kind(mount_point: Path) -> str:
    """The type of the file system mounted at ``mount_point`` (from /proc/self/mounts)."""
    with open("/proc/self/mounts", encoding="utf-8") as mounts:
        for line in mounts:
            fields = line.split()
            if fields[1] == str(mount_point):
                return fields[2]
    raise AssertionError(f"nothing is mounted at {mount_point}")


@contextmanager
def disk_left_with(disk: Path, room: int) -> Iterator[None]:
    """All of ``disk``'s free space but ``room`` bytes taken by a file, removed after. On
    ext4 reserving all of it at once can fail (the file's extent blocks need room too):
    then a little less is taken, and the rest in steps, to within a block or so of ``room``."""
    filler = disk / f"filler-{uuid.uuid4().hex[:8]}"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        taken, halved = 0, False
        while True:
            stat = os.statvfs(disk)
            wanted = stat.f_bavail * stat.f_frsize - room
            if halved:  # the last try did not fit: half as much
                wanted = wanted // 2 // stat.f_frsize * stat.f_frsize
            if wanted < stat.f_frsize:
                break
            try:
                os.posix_fallocate(fd, taken, wanted)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                os.ftruncate(fd, taken)  # what the failed call reserved, given back
                halved = True
            else:
                taken, halved = taken + wanted, False
        yield
    finally:
        os.close(fd)
        filler.unlink()


@contextmanager
def inodes_left_with(disk: Path, left: int) -> Iterator[None]:
    """``disk`` (of :func:`small_filesystem`) able to hold only ``left`` more files and
    folders, as before after: a tmpfs remounted with that many inodes, an ext4 (whose count
    is fixed) with the others taken by empty files."""
    stat = os.statvfs(disk)
    if _filesystem_kind(disk) == "ext4":
        fillers = disk / f"inodes-{uuid.uuid4().hex[:8]}"
        fillers.mkdir()
        for number in range(os.statvfs(disk).f_ffree - left):
            (fillers / str(number)).touch()
        try:
            yield
        finally:
            shutil.rmtree(fillers)
        return
    used = stat.f_files - stat.f_ffree
    subprocess.run(["mount", "-o", f"remount,nr_inodes={used + left}", str(disk)], check=True)
    try:
        yield
    finally:
        subprocess.run(["mount", "-o", f"remount,nr_inodes={stat.f_files}", str(disk)], check=True)


def full_disk_stop(disk: Path, room: int, *args: str | Path) -> str | None:
    """``rmqstore ARGS`` with ``room`` bytes free on ``disk``: None when it succeeds, else
    its error, which must be exit 4 and one line naming the full disk."""
    with disk_left_with(disk, room):
        result = run_cli(*args)
    if result.exit_code == 0:
        return None
    assert result.exit_code == 4, result.stderr
    line = result.stderr.strip()
    assert "\n" not in line and "No space left on device" in line
    return line


def stops_on_a_full_disk(
    disk: Path, base: Path, operation: str, options: tuple[str, ...], rooms: range, kept_in: str
) -> Iterator[Path]:
    """``rmqstore OPERATION STORE OPTIONS`` (``recover``, ``dispatch --rebuild``) on a fresh
    copy of ``base`` with ``room`` bytes free on ``disk``, for each of ``rooms``. A stop
    must be exit 4 and one line (a full disk) that ends "... stopped before it changed the
    store", the store then as it was, or says it "stopped part way" and left 'abort', to be
    run again, and where what it moved is kept (``kept_in``), with 'abort' there. Yields each
    store it stopped on, for the caller to finish; each of the three outcomes must occur."""
    outcomes = set()
    for room in rooms:
        store = disk / "store"
        shutil.rmtree(store, ignore_errors=True)
        shutil.copytree(base, store)
        before = tree_state(store)
        line = full_disk_stop(disk, room, *operation.split(), store, *options)
        if line is None:
            outcomes.add("done")
            continue
        if line.endswith(f"; {operation} stopped before it changed the store"):
            outcomes.add("before")
            assert outside_quarantine(tree_state(store)) == before, line
            # nor a quarantine folder (one made, then a stop while it kept the checkpoint)
            quarantine = store / "quarantine"
            assert not quarantine.exists() or all(
                path.name.startswith(".") for path in quarantine.iterdir()
            ), line
        else:
            outcomes.add("part way")
            assert (
                f"; {operation} stopped part way and left 'abort' in place (a broker starting "
                f"on the store runs its crash recovery); run rmqstore {operation} again once "
                f"the cause is mended; {kept_in} {store / 'quarantine'}/" in line
            ), line
            assert (store / "abort").exists()
        yield store
    assert outcomes == {"before", "part way", "done"}


def mutate_units(store_dir: Path, rng: random.Random, changes: int) -> None:
    """Rewrite ``changes`` random units of the consume queues: offsets moved a little or
    anywhere, sizes off by a little, zero, negative or huge, pre-blank units, zeros."""
    files = sorted(
        path
        for path in (store_dir / "consumequeue").rglob("*")
        if path.is_file() and len(path.name) == 20
    )
    for _ in range(changes):
        path = rng.choice(files)
        data = bytearray(path.read_bytes())
        units = [n for n in range(len(data) // 20) if any(data[n * 20 : n * 20 + 20])]
        if not units:
            continue
        at = rng.choice(units) * 20
        offset = int.from_bytes(data[at : at + 8], "big", signed=True)
        size = int.from_bytes(data[at + 8 : at + 12], "big", signed=True)
        kind = rng.randrange(7)
        if kind == 0:
            offset += rng.choice([-1, 1, -size, size, 4, -4])
        elif kind == 1:
            offset = rng.randrange(0, 1 << 20)
        elif kind == 2:
            size += rng.choice([-1, 1, -8, 8, 100])
        elif kind == 3:
            size = rng.choice([0, -1, -(1 << 31), (1 << 31) - 1, 1 << 26])
        elif kind == 4:
            offset, size = 0, 20  # a pre-blank unit
        elif kind == 5:
            offset, size = (1 << 62), 200  # far past the log
        else:
            data[at : at + 20] = bytes(20)
            path.write_bytes(data)
            continue
        data[at : at + 8] = offset.to_bytes(8, "big", signed=True)
        size = (size + (1 << 31)) % (1 << 32) - (1 << 31)  # a 32-bit field: it wraps
        data[at + 8 : at + 12] = size.to_bytes(4, "big", signed=True)
        path.write_bytes(data)


@dataclass(frozen=True)
class QueueBehind:
    """A store after a power loss (:func:`crashed_with_a_queue_behind`)."""

    messages: int
    first_lost: int  # the commit-log offset of the first record whose unit was lost
    options: tuple[str, ...]  # the store's settings, for the commands run on it


def crashed_with_a_queue_behind(root: Path, *, index: bool = True) -> QueueBehind:
    """60 messages a second apart in queues T:0 and T:1 (commit-log files of 4096 bytes),
    dispatched; then as a power loss leaves a store: 'abort', the checkpoint of the last
    thorough flush, 50 seconds back, and the units T:1 had from 20 seconds on lost (zeros:
    a low-traffic queue's pages are flushed less often), while T:0 kept all of its own.
    A broker's crash recovery replays from the file the checkpoint picks and gives them
    back; a dispatch from where the queues end would not. ``index``: messageIndexEnable."""
    import itertools

    from rmqstore.checkpoint import Checkpoint, write_checkpoint
    from rmqstore.config import StoreConfig
    from rmqstore.dispatch import Dispatcher
    from rmqstore.msgid import UniqKeyGenerator
    from rmqstore.record import Message

    config = StoreConfig(
        commitlog_file_size=4096, index_slots=64, index_entries=256, message_index_enable=index
    )
    clock = itertools.count(1_700_000_000_000, 1000).__next__
    with Store.open_write(root, config, create=True) as store:
        appended = store.appender(clock=clock, uniq_keys=UniqKeyGenerator()).append_many(
            [Message(topic="T", body=b"x" * 300, queue_id=n % 2) for n in range(60)]
        )
        dispatcher = Dispatcher(store)
        dispatcher.run()
        dispatcher.close()
    flushed_at = appended[10].store_timestamp
    write_checkpoint(
        root / "checkpoint",
        Checkpoint(physic_msg_timestamp=flushed_at, logics_msg_timestamp=flushed_at),
    )
    lost = [result for result in appended[20:] if result.queue_id == 1]
    queue = root / "consumequeue" / "T" / "1" / ("0" * 20)
    units = bytearray(queue.read_bytes())
    units[lost[0].queue_offset * 20 :] = bytes(len(units) - lost[0].queue_offset * 20)
    queue.write_bytes(units)
    (root / "abort").touch()
    options = ("--commitlog-file-size", "4096", "--index-slots", "64", "--index-entries", "256")
    return QueueBehind(len(appended), lost[0].physical_offset, options)


def streamed_offsets(store: Path, **options: str) -> tuple[list[int], int]:
    """The commit-log offsets a Trigger.AvailableNow query of the streaming source reads,
    batch after batch, as Spark calls its reader (no session), and where its last batch
    ended."""
    from rmqstore.spark.sources import CommitLogStreamReader

    reader = CommitLogStreamReader({"path": str(store), **options})
    start = reader.initialOffset()
    reader.prepareForTriggerAvailableNow()
    offsets: list[int] = []
    while (end := reader.latestOffset(start)) != start:
        for partition in reader.partitions(start, end):
            for batch in reader.read(partition):
                offsets.extend(batch.column("commitLogOffset").to_pylist())
        start = end
    return offsets, start["offset"]


# make test's reference pass (RMQSTORE_KERNEL=python) leaves to the compiled pass the tests
# that run both kernels themselves, and those whose every input is a tests/kernel_corpus.py
# seed (every real-broker commit-log file and fixture scenario): the corpus compares both
# kernels on those seeds (and mutations of them), so the reference's output is the
# compiled kernel's there and what such a test checks of it carries over
compiled_pass_only = pytest.mark.skipif(
    os.environ.get("RMQSTORE_KERNEL") == "python",
    reason="both kernels compared on its inputs: the compiled pass runs it",
)


# the engine's own fixture maker, bound before conftest.py wraps it in GeneratedStores: the
# tests of the maker itself make every store (two calls must each make the same bytes)
generate_each_time = rmqstore.fixtures.generate


class GeneratedStores:
    """Fixture scenarios made once per test session and copied into each test that asks for
    the same one again (``rmqstore.fixtures.generate`` is wrapped by conftest.py): a
    scenario costs a tenth to a third of a second to make, and the suite asks for the same
    few hundreds of times. Only a plain call is served from the cache (a new output folder,
    no ``force``, ``workers`` or ``progress``), and only on the same filesystem as the cache,
    so that a test's small filesystem still gets a store made in it. The copy keeps files
    sparse where the made store's are, and the manifest is returned as a new object."""

    LARGEST = 32 << 20  # stores of more bytes than this are made each time

    def __init__(self, generate: Any, directory: Path) -> None:
        self._generate = generate
        self._directory = directory
        self._made: dict[tuple[str, Any], tuple[Path, str] | None] = {}

    def __call__(self, name: str, out: Path, options: Any = None, **more: Any) -> Any:
        out = Path(out)
        if more or out.exists() or not self._same_filesystem(out.parent):
            return self._generate(name, out, options, **more)
        key = (name, options)
        try:
            made = self._made.get(key, False)
        except TypeError:  # options that cannot be a key: made each time
            return self._generate(name, out, options)
        if made is False:
            made = self._make(name, options)
            self._made[key] = made
        if made is None:
            return self._generate(name, out, options)
        source, manifest = made
        shutil.copytree(source, out, symlinks=True, copy_function=sparse_copy)
        return json.loads(manifest)

    def _make(self, name: str, options: Any) -> tuple[Path, str] | None:
        source = self._directory / uuid.uuid4().hex
        manifest = self._generate(name, source, options)
        size = sum(path.stat().st_size for path in source.rglob("*") if path.is_file())
        if size > self.LARGEST:
            shutil.rmtree(source)
            return None
        return source, json.dumps(manifest)

    def _same_filesystem(self, folder: Path) -> bool:
        try:
            return folder.stat().st_dev == self._directory.stat().st_dev
        except OSError:
            return False


class WriterFinishing:
    """A ``time.sleep`` for the reader that waits for a store being written to settle: while
    it waits, the writer finishes the record it was writing and writes one more (the bytes
    given). ``waited``: the waits asked for."""

    def __init__(self, log: Path, data: bytes, position: int) -> None:
        self.log, self.data, self.position = log, data, position
        self.waited: list[float] = []

    def __call__(self, seconds: float) -> None:
        import time

        self.waited.append(seconds)
        fd = os.open(self.log, os.O_WRONLY)
        try:
            os.pwrite(fd, self.data, self.position)
        finally:
            os.close(fd)
        time.sleep(seconds)

    def patch_into(self, monkeypatch: Any, module: Any) -> None:
        """Make ``module``'s ``time.sleep`` this (its other ``time`` calls, and every other
        module's, stay as they are)."""
        import time

        finishing = self

        class TimeThatFinishesWrites:
            sleep = staticmethod(finishing)

            def __getattr__(self, name: str) -> Any:
                return getattr(time, name)

        monkeypatch.setattr(module, "time", TimeThatFinishesWrites())


def store_being_written(tmp_path: Path) -> tuple[Path, dict, WriterFinishing]:
    """A store of 12 messages (keys ``key-0``...) whose last record but one is being written
    (its last 16 bytes, and the whole last record, still zeros): the store, that record as
    ``read --jsonl`` gives it whole, and the sleep that finishes the writes (patch it in)."""
    import json

    store = tmp_path / "store"
    lines = "".join(
        json.dumps({"topic": "T", "keys": f"key-{n}", "body": f"message {n}"}) + "\n"
        for n in range(12)
    )
    created = run_cli("append", store, "--create", "--commitlog-file-size", "65536",
                      "--input", "-", input=lines)  # fmt: skip
    assert created.exit_code == 0, created.stderr
    read = run_cli("read", store, "--from-offset", "0", "--jsonl").stdout
    being_written = [json.loads(line) for line in read.splitlines()][-2]
    log = next((store / "commitlog").iterdir())
    whole = log.read_bytes()
    torn_from = being_written["commitLogOffset"] + being_written["storeSize"] - 16
    with open(log, "r+b") as handle:  # as a writer copying the record in leaves it
        handle.seek(torn_from)
        handle.write(bytes(len(whole) - torn_from))
    return store, being_written, WriterFinishing(log, whole[torn_from:], torn_from)


@contextmanager
def serving(store: Path, *options: str, port: int = 0) -> Iterator[str]:
    """``rmqstore serve-ha STORE`` on loopback (a free port unless given): yields
    ``ha://127.0.0.1:PORT``."""
    with serving_process(store, *options, port=port) as (address, _server):
        yield address


@contextmanager
def serving_logged(
    store: Path, log: Path, *options: str, preexec_fn: Any = None
) -> Iterator[tuple[int, subprocess.Popen]]:
    """``rmqstore serve-ha STORE`` on a free port of loopback, its stderr kept in ``log``
    (what it says all along): yields its port and process once it serves, and stops it with
    SIGTERM at the end."""
    with log.open("w") as said:
        server = subprocess.Popen(
            [sys.executable, "-m", "rmqstore", "serve-ha", str(store), "--listen",
             "127.0.0.1:0", *options],
            stdout=subprocess.DEVNULL, stderr=said, preexec_fn=preexec_fn,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (bound := re.search(r"on 127\.0\.0\.1:(\d+)", log.read_text())):
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        yield int(bound.group(1)), server
    finally:
        server.terminate()
        server.wait(timeout=60)


@contextmanager
def serving_process(
    store: Path, *options: str, port: int = 0
) -> Iterator[tuple[str, subprocess.Popen]]:
    """:func:`serving`, yielding the server's process too (its stderr says what happens)."""
    server = subprocess.Popen(
        [sys.executable, "-m", "rmqstore", "serve-ha", str(store), "--listen", f"127.0.0.1:{port}",
         *options],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert server.stderr is not None
    line = server.stderr.readline()
    bound = re.search(r"on 127\.0\.0\.1:(\d+)", line)
    assert bound, line
    try:
        yield f"ha://127.0.0.1:{bound.group(1)}", server
    finally:
        server.terminate()
        server.wait(timeout=30)


def wait_to_write(process: Any) -> None:
    """Until ``process`` waits for room in a pipe (its reader lags: the pipe is full)."""
    waiting = ""
    for _ in range(1200):
        waiting = Path(f"/proc/{process.pid}/wchan").read_text()
        if "pipe" in waiting:
            return
        time.sleep(0.05)
    raise AssertionError(f"not waiting to write: {waiting}")


def stopped_while_the_reader_lags(process: Any, number: int) -> tuple[bytes, bytes]:
    """Signal ``number`` to ``process`` (its stdout and stderr pipes) while the reader of its
    stdout lags: once the pipe is full, the reader takes a little, and the process goes on
    writing until the pipe is full again. Returns all it wrote to stdout and stderr."""
    try:
        wait_to_write(process)
        first = os.read(process.stdout.fileno(), 10_000)  # the reader takes a little
        wait_to_write(process)  # and the write goes on part way, until the pipe is full
        process.send_signal(number)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    return first + out, err


def recorded_calls(monkeypatch: Any, module: Any, name: str) -> list[Any]:
    """The first argument of each call of ``module.name``, in order, from now on (the real
    function is still called, its result returned)."""
    calls: list[Any] = []
    real = getattr(module, name)

    def recording(first: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(first)
        return real(first, *args, **kwargs)

    monkeypatch.setattr(module, name, recording)
    return calls


def sync_calls(command: list[str], where: Path) -> dict[str, int]:
    """How many times ``rmqstore COMMAND`` calls each sync, counted by strace."""
    summary = where / "syncs.txt"
    done = subprocess.run(
        ["strace", "-f", "-qq", "-c", "-o", str(summary), "-e", "trace=fsync,fdatasync,syncfs",
         sys.executable, "-m", "rmqstore", *command],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    counts = {"fsync": 0, "fdatasync": 0, "syncfs": 0}
    for line in summary.read_text().splitlines():
        fields = line.split()
        if fields and fields[-1] in counts:
            counts[fields[-1]] = int(fields[3])
    return counts
