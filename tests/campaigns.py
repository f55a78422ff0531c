"""Helpers of the adversarial campaigns (tests/campaign/): how many rounds, a store mutated the
ways damaged disks and hostile hands mutate one, rmqstore commands run in a child process
with their outcome, and verify's next steps followed as a script follows them (with the
records a store held, to tell whether one was lost). ``make test-long`` runs the short form;
``make campaigns`` the long one (``RMQSTORE_CAMPAIGN=long``)."""

from __future__ import annotations

import json
import os
import random
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from rmqstore.config import StoreConfig
from rmqstore.errors import RmqStoreError
from rmqstore.store import Store

from support import ORACLE_CONFIG, ORACLE_OPTIONS, ORACLE_STORES, tree_state

LONG = os.environ.get("RMQSTORE_CAMPAIGN") == "long"
# another seed gives other kills and mutations than every run's own (make campaigns SEED=N)
SEED = os.environ.get("RMQSTORE_CAMPAIGN_SEED", "")
# the full-disk campaign's file system: a tmpfs, or ext4 on a loop device (FS=ext4)
FILESYSTEM = os.environ.get("RMQSTORE_CAMPAIGN_FS", "") or "tmpfs"
DOCUMENTED_EXIT_CODES = {0, 1, 2, 3, 4}


def rounds(short: int, long: int) -> int:
    return long if LONG else short


def campaign_random(label: str) -> random.Random:
    """The random source of one campaign: the same in every run unless a seed is given, so
    a failure names what reproduces it (see :func:`seed_note`)."""
    return random.Random(f"{label}-{SEED}" if SEED else label)


def seed_note() -> str:
    """How to run a failed campaign again."""
    settings = [f"RMQSTORE_CAMPAIGN_SEED={SEED}"] if SEED else []
    if FILESYSTEM != "tmpfs":
        settings.append(f"RMQSTORE_CAMPAIGN_FS={FILESYSTEM}")
    return f" ({' '.join(settings)})" if settings else ""


def stop_signal(rng: random.Random) -> signal.Signals:
    """How a campaign stops a child rmqstore: mostly SIGKILL (as a crash or a power cut
    leaves it), sometimes SIGTERM or SIGINT (kill PID, a service manager, Ctrl-C), which the
    command turns into an orderly stop wherever it is."""
    return rng.choice([signal.SIGKILL, signal.SIGKILL, signal.SIGTERM, signal.SIGINT])


def sigint_delivered() -> None:
    """``preexec_fn`` of a child that :func:`stop_signal` may stop with SIGINT: a test run in
    the background of a shell without job control (``make test-long``'s other streams) starts
    its children with SIGINT ignored, as a shell does for background jobs, and such a child
    would never see it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def repair_outcome(store: Path) -> dict[str, str]:
    """What a repair (``recover``, ``dispatch --rebuild``) is meant to produce: the commit
    log, consume queues and checkpoint by path, and the index files' contents in name order
    (their names come from the clock)."""
    state = tree_state(store)
    kept = {
        path: digest
        for path, digest in state.items()
        if path.split("/")[0] in ("commitlog", "consumequeue", "checkpoint")
    }
    index = [digest for path, digest in sorted(state.items()) if path.startswith("index/")]
    kept["index files, in order"] = ",".join(index)
    return kept


def child_env() -> dict[str, str]:
    """The environment for a child rmqstore: stdout block-buffered as in a user's shell."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}


@dataclass
class Outcome:
    command: list[str]
    code: int | None  # None: it did not end in time
    stderr: str

    @property
    def clean(self) -> bool:
        """A documented exit code and a one-line error, never a traceback."""
        return (
            self.code in DOCUMENTED_EXIT_CODES
            and "Traceback" not in self.stderr
            and "internal error" not in self.stderr
        )


_DRIVER = """
import json, os, resource, sys, threading, time
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
from click.testing import CliRunner
from rmqstore.commands.main import cli
running = {"command": None, "free": 0}

def free():
    found = os.statvfs(".")
    return found.f_bavail * found.f_frsize

def watch():  # a command that fills the disk is stopped before the machine's disk is full
    while True:
        time.sleep(0.2)
        command, before = running["command"], running["free"]
        if command is not None and before - free() > DISK_AT_MOST:
            said = f"{command} took more than {DISK_AT_MOST:,} bytes of disk\\n"
            os.write(2, said.encode())  # not sys.stderr: the runner holds it for the command
            os._exit(3)

threading.Thread(target=watch, daemon=True).start()
outcomes = []
for command in json.loads(sys.argv[1]):
    running["free"], running["command"] = free(), command
    result = CliRunner().invoke(cli, command, catch_exceptions=True)
    running["command"] = None
    error = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        error += f"Traceback: {type(result.exception).__name__}: {result.exception}"
    data = {"--json", "--jsonl", "--csv", "--tsv", "raw"} & set(command)
    if "\x1b" in result.stderr or ("\x1b" in result.stdout and not data):
        error += " internal error: an ESC byte in human output"  # a terminal would act on it
    outcomes.append([command, result.exit_code, error[-2000:]])
print(json.dumps(outcomes))
"""


# what one command of run_commands may take of the disk: more, and the run is stopped (an
# index geometry that reserved 20 MB for every two entries filled 75 GB in a minute)
DISK_AT_MOST = 4 << 30


def run_commands(
    commands: list[list[str]], timeout: float = 120, cwd: Path | None = None
) -> list[Outcome]:
    """Run rmqstore command lines one after the other in one child process (memory capped at
    4 GiB, the disk a command takes at :data:`DISK_AT_MOST`; in folder ``cwd`` when given);
    a hang is an outcome with no exit code."""
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-c",
                _DRIVER.replace("DISK_AT_MOST", str(DISK_AT_MOST)),
                json.dumps(commands),
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd,
        )
    except subprocess.TimeoutExpired:
        return [Outcome(commands[0], None, "did not end in time")]
    if result.returncode != 0:
        return [Outcome(commands[0], None, result.stderr[-2000:])]
    return [Outcome(*row) for row in json.loads(result.stdout)]


# -- following verify's next steps ------------------------------------------------------------

MOST_STEPS = 5  # verify's next steps a store may take before it is sound or names no command


def records_by_file(store: Path) -> dict[int, bytes]:
    """Each CRC-valid record of the commit log, by offset: every file walked from its start
    until a record fails (so records after damage in an earlier file count too); {} when
    the store cannot be opened."""
    found: dict[int, bytes] = {}
    try:
        with Store.open_read(store, StoreConfig(**ORACLE_CONFIG)) as opened:
            log = opened.commitlog
            for segment in list(log.queue.segments):
                end = segment.start + log.queue.file_size
                scan = log.scan(segment.start, check_crc=True, stop_on_crc_error=True)
                for offset, header, _, _, crc_ok in scan:
                    if offset >= end or crc_ok is False:
                        break
                    found[offset] = commitlog_bytes_at(
                        store, offset, header.total_size, log.queue.file_size
                    )
    except (RmqStoreError, OSError):
        return {}
    return found


def commitlog_bytes_at(store: Path, offset: int, length: int, file_size: int) -> bytes:
    """``length`` bytes at commit-log ``offset``, read from the file itself (b"" if absent)."""
    start = offset - offset % file_size
    path = store / "commitlog" / f"{start:020d}"
    if path.is_symlink() or not path.is_file():
        return b""
    with open(path, "rb") as handle:
        handle.seek(offset - start)
        return handle.read(length)


def first_lost_record(store: Path, before: dict[int, bytes]) -> int | None:
    """The offset of the first of the records ``before`` (:func:`records_by_file` of the
    store earlier) that is neither at its offset any more nor among the bytes in quarantine;
    None when none is lost."""
    kept = quarantined(store)
    file_size = ORACLE_CONFIG["commitlog_file_size"]
    for offset, data in before.items():
        if commitlog_bytes_at(store, offset, len(data), file_size) == data:
            continue
        if not any(data in blob for blob in kept):
            return offset
    return None


def quarantined(store: Path) -> list[bytes]:
    folder = store / "quarantine"
    if not folder.is_dir():
        return []
    return [p.read_bytes() for p in folder.rglob("*") if p.is_file() and not p.is_symlink()]


def rmqstore(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rmqstore", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_env(),
    )


def new_campaign_store(store: Path, *options: str) -> None:
    """A store made by an append of one message to T0, dispatched, with ``options``."""
    first = rmqstore(["append", str(store), "--create", "--dispatch", "--topic", "T0",
                      "--body", "first", *options])  # fmt: skip
    assert first.returncode == 0, first.stderr


def recovered_sound(store: Path, *options: str) -> None:
    """A last ``recover`` and ``dispatch``, then the store must verify sound."""
    for args in (["recover", str(store), "--yes", *options], ["dispatch", str(store), *options]):
        done = rmqstore(args)
        assert done.returncode == 0, f"{args}: {done.stderr}{seed_note()}"
    verified = rmqstore(["verify", str(store), "--json", *options])
    assert verified.returncode == 0, f"{verified.stdout[-2000:]}{seed_note()}"


def log_bytes(store: Path) -> bytes:
    """The commit log's bytes, in file order, without the zeros after the data."""
    files = sorted((store / "commitlog").iterdir())
    return b"".join(path.read_bytes() for path in files).rstrip(b"\0")


def lost_messages(store: Path, acknowledged: list[dict]) -> list[dict]:
    """The messages of ``acknowledged`` (an append's report) the store does not hold."""
    read = rmqstore(["read", str(store), "--from-offset", "0", "--count", "100000000",
                     "--jsonl", "--body", "none"])  # fmt: skip
    held = {json.loads(line)["msgId"] for line in read.stdout.splitlines()}
    return [message for message in acknowledged if message["msgId"] not in held]


def unclean(result: subprocess.CompletedProcess[str]) -> bool:
    errors = [line for line in result.stderr.splitlines() if line.startswith("rmqstore: error")]
    return (
        result.returncode not in DOCUMENTED_EXIT_CODES
        or "Traceback" in result.stderr
        or len(errors) > 1
    )


def follow_next_steps(store: Path) -> tuple[list[str], list[str]]:
    """Verify, then its next step, until none: (the steps run, the failures)."""
    steps: list[str] = []
    seen: set[tuple[str, str]] = set()
    for _ in range(MOST_STEPS + 1):
        verify = rmqstore(["verify", str(store), "--json", *ORACLE_OPTIONS])
        if unclean(verify):
            return steps, [f"verify: {verify.returncode} {verify.stderr[-500:]}"]
        try:
            report = json.loads(verify.stdout)
        except json.JSONDecodeError:
            return steps, []  # refused in one line (not a store any more): nothing to follow
        step = report.get("nextStep")
        if not step:
            return steps, []
        findings = json.dumps(sorted(json.dumps(f, sort_keys=True) for f in report["findings"]))
        if (step, findings) in seen:
            return steps, [f"{step} again for the same findings: it mends nothing"]
        seen.add((step, findings))
        steps.append(step)
        command = shlex.split(step)
        assert command[0] == "rmqstore", step
        result = rmqstore([*command[1:], *ORACLE_OPTIONS])
        if unclean(result):
            return steps, [f"{step}: {result.returncode} {result.stderr[-500:]}"]
    return steps, [f"still a next step after {MOST_STEPS}: {steps}"]


# the stores a disk may damage: every real-broker store, and the crashed one's torn copies
DISK_BASES = [(name, "store") for name in ORACLE_STORES] + [
    ("s2_crash", "store_torn_half_record"),
    ("s2_crash", "store_torn_random_garbage"),
]


# -- mutations ---------------------------------------------------------------------------------


def _files(store: Path) -> list[Path]:
    return sorted(
        p for p in store.rglob("*") if p.is_file() and not p.is_symlink() and p.name != "lock"
    )


def _record_offsets(store: Path) -> list[tuple[Path, int]]:
    """(commit-log file, position) of the records of the first commit-log file (a regular
    one: an earlier mutation may have put a folder, a FIFO or a link in its place)."""
    commitlog = store / "commitlog"
    if not commitlog.is_dir() or commitlog.is_symlink():
        return []
    files = sorted(p for p in commitlog.iterdir() if p.is_file() and not p.is_symlink())
    if not files:
        return []
    first = files[0]
    data = first.read_bytes()
    positions, position = [], 0
    while position + 8 <= len(data):
        size = int.from_bytes(data[position : position + 4], "big", signed=True)
        magic = data[position + 4 : position + 8]
        if size <= 0 or magic not in (b"\xda\xa3\x20\xa7", b"\xda\xa3\x20\xab"):
            break
        positions.append((first, position))
        position += size
    return positions


def _write_at(path: Path, position: int, data: bytes) -> None:
    with open(path, "r+b") as handle:
        handle.seek(position)
        handle.write(data)


def _flip_bit(path: Path, position: int, rng: random.Random) -> None:
    """Flip one bit, chosen by ``rng``, of the byte at ``position`` of ``path``."""
    with open(path, "r+b") as handle:
        handle.seek(position)
        byte = handle.read(1)[0]
        handle.seek(position)
        handle.write(bytes([byte ^ (1 << rng.randrange(8))]))


def _real_folders(paths: list[Path]) -> list[Path]:
    """The folders among ``paths`` that are not links."""
    return [path for path in paths if path.is_dir() and not path.is_symlink()]


def mutate(store: Path, outside: Path, rng: random.Random) -> str:
    """Damage ``store`` one way, chosen by ``rng``; returns what was done. ``outside`` is a
    folder links may lead to (nothing may be written there)."""
    kind = rng.choice(
        ["bit-flip", "bit-flip", "truncate", "length-field", "delete", "junk", "grow",
         "dir-for-file", "empty", "link-out", "topic-traversal", "zero-run", "fifo",
         "folder-link-out", "hard-link-out"]
    )  # fmt: skip
    files = _files(store)
    target = rng.choice(files)
    name = str(target.relative_to(store))
    size = target.stat().st_size
    if kind == "bit-flip" and size:
        position = rng.randrange(size)
        _flip_bit(target, position, rng)
        return f"bit-flip {name}@{position}"
    if kind == "truncate":
        length = rng.randrange(size + 1)
        os.truncate(target, length)
        return f"truncate {name} to {length}"
    if kind == "length-field":
        records = _record_offsets(store)
        if records:
            path, position = rng.choice(records)
            field = rng.choice([0, 84, 40])  # TOTALSIZE, BODYLENGTH (IPv4), BORNTIMESTAMP
            value = rng.choice([0, -1, (1 << 31) - 1, -(1 << 31), 1 << 30])
            _write_at(path, position + field, value.to_bytes(4, "big", signed=True))
            return f"length-field {path.name}@{position}+{field}={value}"
    if kind == "delete":
        target.unlink()
        return f"delete {name}"
    if kind == "junk":
        folder = rng.choice(
            [p for p in store.rglob("*") if p.is_dir() and not p.is_symlink()] + [store]
        )
        junk = folder / rng.choice(["00000000000000009999", "junk", "20990101000000000", "x.tmp"])
        junk.write_bytes(rng.randbytes(rng.randrange(1, 5000)))
        return f"junk {junk.relative_to(store)}"
    if kind == "grow":
        os.truncate(target, size + rng.choice([1, 20, 4096, 1 << 20]))
        return f"grow {name}"
    if kind == "dir-for-file":
        target.unlink()
        target.mkdir()
        return f"dir-for-file {name}"
    if kind == "empty":
        os.truncate(target, 0)
        return f"empty {name}"
    if kind == "link-out":
        copy = outside / f"{target.name}-{rng.randrange(1 << 30)}"
        copy.write_bytes(target.read_bytes())
        target.unlink()
        target.symlink_to(copy)
        return f"link-out {name}"
    if kind == "hard-link-out":  # the file's bytes shared with a path outside (cp -al)
        os.link(target, outside / f"{target.name}-{rng.randrange(1 << 30)}")
        return f"hard-link-out {name}"
    if kind == "topic-traversal":
        records = _record_offsets(store)
        if records:
            path, position = rng.choice(records)
            data = path.read_bytes()
            body_length = int.from_bytes(data[position + 84 : position + 88], "big")
            at = position + 88 + body_length
            # (an earlier mutation may have made the body length point past the file: then
            # another mutation is chosen)
            length = data[at] if at < len(data) else 0
            if length >= 3 and at + 1 + length <= len(data):
                _write_at(path, at + 1, b"../" + b"x" * (length - 3))
                return f"topic-traversal {path.name}@{position}"
    if kind == "fifo":  # a FIFO no one writes to: opening it to read would wait for ever
        target.unlink()
        os.mkfifo(target)
        return f"fifo {name}"
    if kind == "folder-link-out":  # a topic's, queue's or the index folder, moved out and linked
        folders = _real_folders(list((store / "consumequeue").glob("*")))
        folders += _real_folders([p for topic in folders for p in topic.glob("*")])
        folders += _real_folders([store / "index"])
        if folders:
            folder = rng.choice(folders)
            moved = outside / f"{folder.name}-{rng.randrange(1 << 30)}"
            folder.rename(moved)
            folder.symlink_to(moved)
            return f"folder-link-out {folder.relative_to(store)}"
    if kind == "zero-run" and size:
        position = rng.randrange(size)
        _write_at(target, position, bytes(min(size - position, rng.randrange(1, 4096))))
        return f"zero-run {name}@{position}"
    return mutate(store, outside, rng)


def mutated_copy(oracle, name: str, root: Path, rng: random.Random) -> tuple[Path, Path, str]:
    """A copy of real store ``name`` under ``root``, mutated one to three times, beside a
    folder ``outside`` it may be linked to: (store, outside, what was done, for messages)."""
    root.mkdir()
    outside = root / "outside"
    outside.mkdir()
    store = oracle(name).copy_to(root)
    # a consumer group at the end of every queue, as a broker's fastjson writes it: the
    # mutations may hit this file too, and recover may leave the group past a queue's end
    (store / "config").mkdir(exist_ok=True)
    (store / "config" / "consumerOffset.json").write_text(_consumer_offsets(store))
    done = [mutate(store, outside, rng) for _ in range(rng.randint(1, 3))]
    number = root.name.removeprefix("m")
    return store, outside, f"{name} mutant {number} ({'; '.join(done)})"


def _consumer_offsets(store: Path) -> str:
    """``consumerOffset.json`` with group g1 at the end of each queue of the store."""
    entries = []
    for topic in sorted((store / "consumequeue").iterdir()):
        ends = []
        for queue in sorted(topic.iterdir(), key=lambda path: int(path.name)):
            units = sum(-(-len(f.read_bytes().rstrip(b"\0")) // 20) for f in queue.iterdir())
            ends.append(f"{queue.name}:{units}")
        entries.append(f'\t\t"{topic.name}@g1":{{{",".join(ends)}\n\t\t}}')
    return '{\n\t"offsetTable":{\n' + ",\n".join(entries) + "\n\t}\n}"


def damage_segment(store: Path, folder: str, rng: random.Random) -> str:
    """Damage one segment file below ``folder`` of ``store`` (``commitlog`` or
    ``consumequeue``) one way a disk or a cut copy does: a flipped bit, a run of zeros, an
    int field overwritten, the file cut short, a file in the middle deleted, bytes of
    another file copied over. Returns what was done ("" when nothing was)."""
    files = sorted(
        path
        for path in (store / folder).rglob("*")
        if path.is_file() and len(path.name) == 20 and path.stat().st_size
    )
    if not files:
        return ""
    target = rng.choice(files)
    name, size = str(target.relative_to(store)), target.stat().st_size
    kind = rng.choice(["bit-flip", "bit-flip", "zero-run", "int", "cut", "delete", "copy"])
    position = rng.randrange(min(size, 200_000))  # where the records or units are
    if kind == "cut":
        length = rng.randrange(size)
        os.truncate(target, length)
        return f"cut {name} to {length}"
    if kind == "delete" and len(files) > 2 and target not in (files[0], files[-1]):
        target.unlink()
        return f"delete {name}"
    if kind == "copy" and len(files) > 1:
        source = rng.choice([path for path in files if path != target])
        length = rng.randrange(1, min(4096, source.stat().st_size) + 1)
        start = rng.randrange(source.stat().st_size - length + 1)
        with open(source, "rb") as handle:
            handle.seek(start)
            data = handle.read(length)
        at = rng.randrange(max(1, size - length))
        _write_at(target, at, data)
        return f"copy {source.relative_to(store)}@{start}+{length} over {name}@{at}"
    if kind == "zero-run":
        length = rng.randrange(1, 64)
        _write_at(target, position, bytes(length))
        return f"zero-run {name}@{position}+{length}"
    if kind == "int":
        value = rng.choice([0, -1, (1 << 31) - 1, 1 << 20, rng.randrange(1, 400)])
        _write_at(target, position, value.to_bytes(4, "big", signed=True))
        return f"int {value} {name}@{position}"
    _flip_bit(target, position, rng)
    return f"bit-flip {name}@{position}"
