"""Shared helpers for the benchmark scripts: the benchmark store, timing, peak memory, and
printing figures beside their baselines."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_WORKDIR = REPO / "bench" / "out"
TOPIC = "BenchmarkTopic"
BODY = b"x" * 100
GIB = 1024**3

# RocketMQ's own figures on this machine (fixtures/oracle/README.md, medians of 3 runs)
ROCKETMQ_PUT_SECONDS = 2.86  # 4.9.8 DefaultMessageStore.putMessage, 1M messages
ROCKETMQ_REDISPATCH_SECONDS = 1.05  # 4.9.8 consume queues + index rebuilt for 1M messages
ROCKETMQ_CRC_RECOVERY_MB_S = 290  # 4.9.8 load() with CRC over the 298 MB file


def arguments(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    return parser


@contextmanager
def timed() -> object:
    """``with timed() as clock: ...`` then ``clock.seconds``."""

    class Clock:
        seconds = 0.0

    clock = Clock()
    start = time.perf_counter()
    yield clock
    clock.seconds = time.perf_counter() - start


def best_of(
    command: list[str],
    environment: dict[str, str] | None = None,
    runs: int = 3,
    prepare=None,  # type: ignore[no-untyped-def]
) -> float:
    """The fastest of ``runs`` runs of ``command``, a fresh process each (its output
    discarded; ``environment`` instead of this one's); ``prepare()`` runs before each, untimed."""
    best = float("inf")
    for _ in range(runs):
        if prepare is not None:
            prepare()
        began = time.perf_counter()
        subprocess.run(
            command,
            check=True,
            env=environment,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        best = min(best, time.perf_counter() - began)
    return best


def fresh_copy(source: Path, target: Path, abort: bool = False) -> None:
    """A copy of the store (sparse files stay sparse), synced before the timed run so that
    writing the copy back is not counted in it."""
    import shutil

    shutil.rmtree(target, ignore_errors=True)
    subprocess.run(["cp", "-a", "--sparse=always", str(source), str(target)], check=True)
    if abort:
        (target / "abort").touch()
    os.sync()


def row(name: str, figure: str, baseline: str = "") -> None:
    print(f"  {name:<44} {figure:<34} {baseline}")


def peak_rss_mib_of(code: str, *args: str) -> float:
    """Peak resident memory (VmHWM) of a fresh interpreter running ``code``, in MiB. The child
    reports its own high-water mark: ``ru_maxrss`` would include the parent's memory, which
    Linux carries across exec."""
    report = "\nprint([l for l in open('/proc/self/status') if l.startswith('VmHWM')][0])"
    output = subprocess.run(
        [sys.executable, "-c", code + report, *args],
        check=True,
        cwd=REPO,
        capture_output=True,
        text=True,
    ).stdout
    return int(output.split()[-2]) / 1024


def store_path(workdir: Path, messages: int, body: bytes = BODY) -> Path:
    suffix = "" if body == BODY else f"-{len(body)}B"
    return workdir / f"large-{messages}{suffix}"


def build_store(
    workdir: Path, messages: int, *, force: bool = False, body: bytes = BODY, workers: int = 1
) -> tuple[Path, float]:
    """The benchmark store, returned as (path, seconds to build; 0 when it already existed).

    With the default body it is ``rmqstore fixtures generate large`` (one topic, 4 queues
    round robin, 100-byte bodies, TAGS, UNIQ_KEY and CLUSTER, 1 GiB files, consume queues and
    index; ``workers``: its ``--jobs``). Another body size gives a commit log of the same
    shape without queues or index."""
    path = store_path(workdir, messages, body)
    if path.exists() and not force:
        return path, 0.0
    if path.exists():
        subprocess.run(["rm", "-rf", str(path)], check=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    if body == BODY:
        from rmqstore.fixtures import FixtureOptions, generate

        with timed() as clock:
            generate("large", path, FixtureOptions(messages=messages), workers=workers)
        return path, clock.seconds
    seconds, _, _ = append_messages(path, messages, body)
    return path, seconds


def append_messages(path: Path, count: int, body: bytes = BODY) -> tuple[float, int, float]:
    """Append ``count`` messages of the benchmark shape (one topic, 4 queues round robin,
    TAGS, CLUSTER, a UNIQ_KEY each) to a new store at ``path``, building a Message object for
    each: (seconds in all, bytes written, seconds inside ``append_many``)."""
    from rmqstore.msgid import UniqKeyGenerator
    from rmqstore.record import Message
    from rmqstore.store import Store

    properties = {"TAGS": "TagA", "CLUSTER": "DefaultCluster"}
    in_engine = 0.0
    with timed() as clock, Store.open_write(path, create=True) as store:
        appender = store.appender(uniq_keys=UniqKeyGenerator())
        for start in range(0, count, 1024):
            batch = [
                Message(
                    topic=TOPIC,
                    body=body,
                    queue_id=index & 3,
                    properties=properties,
                    born_timestamp=1,
                )
                for index in range(start, min(count, start + 1024))
            ]
            began = time.perf_counter()
            appender.append_many(batch)
            in_engine += time.perf_counter() - began
    return clock.seconds, appender.end_offset, in_engine


def cache_log(path: Path) -> None:
    """Read every commit-log file of the store at ``path`` once, so that the next timed run
    finds it in the page cache, as a run just before it left it. This machine pages out
    what nobody touched for about a minute (the kernel's DAMON, a pageout scheme on cold
    memory): a Spark session's first export, its JVM started in between, read part of the
    log from the disk again (1.04 s against 0.72 s with the log read just before)."""
    for file in sorted((path / "commitlog").iterdir()):
        with open(file, "rb") as handle:
            while handle.read(1 << 24):
                pass


def commitlog_bytes(path: Path) -> int:
    from rmqstore.store import Store

    with Store.open_read(path) as store:
        return store.log_end().offset - store.commitlog.min_offset


def dd_write_mb_s(workdir: Path, megabytes: int) -> float:
    """``dd`` writing zeros with a final fdatasync: the disk's sequential-write baseline."""
    target = workdir / "dd.out"
    with timed() as clock:
        subprocess.run(
            ["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={megabytes}", "conv=fdatasync"],
            check=True,
            capture_output=True,
        )
    os.unlink(target)
    return megabytes * 1024 * 1024 / clock.seconds / 1e6


def zlib_crc_gb_s(path: Path, limit: int) -> float:
    """Raw ``zlib.crc32`` over the first ``limit`` bytes of the commit log (page cache)."""
    import mmap
    import zlib

    total = 0
    with timed() as clock:
        for file in sorted((path / "commitlog").iterdir()):
            with (
                open(file, "rb") as handle,
                mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data,
            ):
                view = memoryview(data)
                length = min(len(data), limit - total)
                for start in range(0, length, 1 << 20):
                    zlib.crc32(view[start : min(length, start + (1 << 20))])
                view.release()
                total += length
            if total >= limit:
                break
    return total / clock.seconds / 1e9
