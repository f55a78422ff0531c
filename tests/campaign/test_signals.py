"""Commands stopped by the signals an operator's machine sends: Ctrl-C (SIGINT to the
terminal's whole process group), ``kill`` (SIGTERM to the command), a service manager
stopping a unit (SIGTERM to every process of it), a closed terminal or ssh session
(SIGHUP to the group), each sometimes twice (Ctrl-C pressed again, a hangup after a kill),
at a random moment of a random command: writers (``append`` of a few thousand messages,
``dispatch --rebuild --yes``, also with ``--jobs 2``, ``recover --yes``, ``dispatch``,
``flush``) and readers (``verify``, also ``--jobs 2``, ``export``, also ``--jobs 2`` and
as JSON lines, ``stats``, ``read``, ``replicate`` into a replica), each its own process in
a session of its own, one after the other. Each ends with a documented exit code, or the one of a
signal sent (or, once its work is done and the interpreter is ending, killed by it: the
same status to a shell), at most one error line and no traceback or other text; an
export stopped leaves nothing; an append's report and a read's JSON lines are whole lines;
no process of its session outlives it. Afterwards, with a
last ``recover`` and ``dispatch``, the store verifies sound and holds every message an
``append`` reported, and the replica is sound and a prefix of the store's log.

It found a second signal breaking into the rollback the first had begun (the unreported
messages left in the log behind 'abort', or click's 'Aborted!' and exit 1), a traceback
from the interpreter joining its threads, and worker processes printing their own
tracebacks for the terminal's Ctrl-C; an append's report ending in half a line; and, with
seed 3, a SIGTERM met as the workers ended after the walk of the log had stopped early,
printed as "Exception ignored" and lost (the command went on, exit 0)."""

from __future__ import annotations

import csv
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from campaigns import (
    DOCUMENTED_EXIT_CODES,
    campaign_random,
    child_env,
    log_bytes,
    lost_messages,
    new_campaign_store,
    recovered_sound,
    rmqstore,
    rounds,
    seed_note,
    sigint_delivered,
)

SECONDS = rounds(short=12, long=180)
GEOMETRY = ["--commitlog-file-size", "262144", "--consumequeue-file-size", "6000"]
INDEX = ["--index-slots", "500", "--index-entries", "4000"]
STOPS = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}
# what an append without --dispatch, or one stopped, leaves by design, until a dispatch
BY_DESIGN = {"abort-present", "dispatch-lag", "index-lag"}


def _command(store: Path, scratch: Path, rng: random.Random, number: int) -> list[str]:
    jobs = ["--jobs", "2", "--split-size", "262144"] if rng.random() < 0.5 else []
    kind = rng.choice(["append"] * 5 + ["rebuild", "recover", "dispatch", "flush", "verify",
                       "export", "stats", "read", "replicate"])  # fmt: skip
    if kind == "append":
        lines = scratch / f"messages-{number}.jsonl"
        with open(lines, "w") as out:
            for n in range(rng.choice([50, 1000, 4000])):
                message = {
                    "topic": f"T{rng.randrange(3)}",
                    "queueId": rng.randrange(4),
                    "keys": f"k{number}-{n}",
                    "body": f"m{number}-{n}-" + "x" * 200 + "\nof two lines" * (n % 2),
                }
                out.write(json.dumps(message) + "\n")
        dispatch = ["--dispatch"] if rng.random() < 0.7 else []
        flush = rng.choice([[], ["--flush", "sync"], ["--flush-interval", "50"]])
        return ["append", str(store), "--input", str(lines), "--jsonl", *dispatch, *flush,
                *GEOMETRY, *INDEX]  # fmt: skip
    out = scratch / f"export-{number}"
    output = rng.choice([["--jsonl"], ["--json"], ["--csv", "--fields", "msgId,body"]])
    form = rng.choice([[], ["--format", "jsonl"]]) if kind == "export" else []
    return {
        "rebuild": ["dispatch", str(store), "--rebuild", "--yes", *jobs, *INDEX],
        "recover": ["recover", str(store), "--yes", *INDEX],
        "dispatch": ["dispatch", str(store), *INDEX],
        "flush": ["flush", str(store)],
        "verify": ["verify", str(store), "--json", *jobs, *INDEX],
        "export": ["export", str(store), "--to", str(out), "--engine", "local", *jobs, *form],
        "stats": ["stats", str(store), "--json", *jobs],
        "read": ["read", str(store), "--from-offset", "0", "--count", "5000", *output],
        "replicate": ["replicate", str(store), str(scratch.parent / "replica"), *INDEX],
    }[kind]


def _not_whole(args: list[str], out: str) -> str | None:
    """What is wrong with the output of a stopped ``read --json`` (one JSON array, closed
    however the read ended) or ``read --csv`` (whole rows)."""
    if not out:
        return None  # stopped before it wrote anything
    if "--json" in args:
        try:
            json.loads(out)
        except json.JSONDecodeError as exc:
            return f"not a JSON array ({exc}): ...{out[-200:]!r}"
        return None
    try:
        rows = list(csv.reader(io.StringIO(out, newline=""), strict=True))
    except csv.Error as exc:
        return f"not CSV ({exc}): ...{out[-200:]!r}"
    cut = [row for row in rows if len(row) != len(rows[0])]
    return f"rows cut short: {cut[:2]}" if cut else None


def _run_stopped(
    args: list[str], rng: random.Random
) -> tuple[subprocess.CompletedProcess[str], list[signal.Signals], list[str]]:
    """``args`` in a session of its own, sent one or two stop signals (to it, or to its
    whole process group) at random moments, or none: how it ended, the signals sent, and
    the processes of its session left once it had."""
    process = subprocess.Popen(
        [sys.executable, "-m", "rmqstore", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
        start_new_session=True,
        preexec_fn=sigint_delivered,
    )
    sent: list[signal.Signals] = []
    plan = [rng.choice(list(STOPS)) for _ in range(rng.choice([0, 1, 1, 2]))]
    to_group = rng.random() < 0.6
    try:
        waits = [rng.uniform(0.05, 1.5), rng.choice([0.001, 0.02, 0.2])][: len(plan)]
        for number, wait in zip(plan, waits, strict=True):
            try:
                process.wait(timeout=wait)
                break  # it ended before the signal
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(process.pid, number) if to_group else process.send_signal(number)
            except ProcessLookupError:
                break
            sent.append(number)
        stdout, stderr = process.communicate(timeout=180)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    left: list[str] = []
    ended = time.monotonic()
    while time.monotonic() < ended + 10:  # its workers end with it, within moments
        left = [
            line
            for line in subprocess.run(
                ["ps", "-o", "pid=,args=", "-s", str(process.pid)], capture_output=True, text=True
            ).stdout.splitlines()
            if line.strip()
        ]
        if not left:
            break
        time.sleep(0.05)
    done = subprocess.CompletedProcess(args, process.returncode, stdout, stderr)
    return done, sent, left


def _ended_badly(done: subprocess.CompletedProcess[str], sent: list[signal.Signals]) -> str | None:
    """What is wrong with how a command ended, given the signals sent to it (None: fine)."""
    codes = set(DOCUMENTED_EXIT_CODES)
    if sent:  # a signal's code (two come close together: Python acts on the lower number
        # first, whichever came first); or killed by one once done (a shell sees 128+N)
        codes |= {*(STOPS[number] for number in sent), *(-number for number in sent)}
        if _in_interpreter_start(done.stderr):
            return None
    if done.returncode not in codes:
        return f"exit {done.returncode}"
    errors = [line for line in done.stderr.splitlines() if line.startswith("rmqstore: error")]
    if len(errors) > 1:
        return "more than one error line"
    stray = [line for line in done.stderr.splitlines() if not line.startswith("rmqstore")]
    if stray:
        return f"stderr holds {stray[:3]}"
    return None


def _in_interpreter_start(stderr: str) -> bool:
    """Whether a signal came while the interpreter was still starting, before any of
    rmqstore's code ran (its site module's imports): what Python prints then is its own."""
    return "Traceback" in stderr and not any(
        f"{os.sep}{part}{os.sep}" in stderr for part in ("rmqstore", "commands")
    )


@pytest.mark.campaign
@pytest.mark.plumbing  # a command's dealings with signals: no record kernel decides them
def test_commands_stopped_by_signals_end_in_one_line_and_lose_nothing(tmp_path: Path) -> None:
    rng = campaign_random("signals")
    store = tmp_path / "store"
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    new_campaign_store(store, *GEOMETRY, *INDEX)
    acknowledged: list[dict] = []
    failures: list[str] = []
    ran: dict[str, int] = {}
    said: set[str] = set()
    number = 0
    deadline = time.monotonic() + SECONDS
    while time.monotonic() < deadline and len(failures) < 5:
        args = _command(store, scratch, rng, number)
        number += 1
        done, sent, left = _run_stopped(args, rng)
        names = "+".join(signal.Signals(n).name for n in sent) or "none"
        key = f"{args[0]} {names} {done.returncode}"
        ran[key] = ran.get(key, 0) + 1
        if not sent and done.returncode in (2, 3, 4):  # refused, without a signal
            said.add(f"{args[0]}: {done.stderr.strip().splitlines()[-1][:300]}")
        wrong = _ended_badly(done, sent)
        if wrong:
            failures.append(f"{args} ({names}): {wrong}: {done.stderr[-800:]}")
        if left:
            failures.append(f"{args} ({names}): left running: {left[:3]}")
        if args[0] == "read" and "--jsonl" not in args:  # a whole array, or whole rows
            wrong = _not_whole(args, done.stdout)
            if wrong:
                failures.append(f"{args} ({names}): exit {done.returncode}, {wrong}")
        elif args[0] in ("append", "read"):  # whole JSON lines, however it ended
            for line in done.stdout.splitlines():
                try:
                    document = json.loads(line)
                except json.JSONDecodeError:  # a reported or read message cut short
                    failures.append(f"{args} ({names}): exit {done.returncode}, stdout {line!r}")
                    continue
                if args[0] == "append":
                    acknowledged.append(document)
        if args[0] == "export":
            exported = Path(args[args.index("--to") + 1])
            # killed by the signal (a negative code) only once its work was done: whole
            if done.returncode > 0 and exported.exists():
                failures.append(f"{args} ({names}): exit {done.returncode} left {exported}")
            shutil.rmtree(exported, ignore_errors=True)
            stagings = [p.name for p in scratch.iterdir() if p.name.startswith(".")]
            if stagings:
                failures.append(f"{args} ({names}): left {stagings}")
    assert not failures, f"{failures}{seed_note()}"
    recovered_sound(store, *INDEX)
    replica = tmp_path / "replica"
    if replica.exists():
        checked = rmqstore(["verify", str(replica), "--json", *INDEX])
        kinds = set(json.loads(checked.stdout)["findingsByKind"]) if checked.stdout else set()
        assert checked.returncode == 0 or kinds <= BY_DESIGN, f"{checked.stdout[-2000:]}"
        copied = log_bytes(replica)
        assert log_bytes(store)[: len(copied)] == copied, (
            f"the replica is not a prefix{seed_note()}"
        )
    lost = lost_messages(store, acknowledged)
    assert not lost, f"{len(lost)} lost, e.g. {lost[:3]}{seed_note()}"
    print(f"signals: {number} commands in {SECONDS} s, {len(acknowledged)} messages reported; "
          f"{dict(sorted(ran.items()))}")  # fmt: skip
    print(f"signals: what commands sent no signal were refused with: {sorted(said)}")
