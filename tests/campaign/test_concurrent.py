"""Processes beside each other on one store, as on an operator's machine: writers
(``append`` with and without ``--dispatch``, ``dispatch``, ``dispatch --rebuild --yes``,
``recover --yes``, ``flush``, ``quarantine purge``) and readers (``verify``, whole and
with ``--jobs 2``, ``read`` by offset, queue and key, ``stats``, ``info``, ``offsets``,
``quarantine list``, ``export``, and ``replicate`` of it into a replica, from its folder
and over HA from a ``serve-ha --follow`` serving it all along, as slaves catch up) drawn at
random in threads, each command its own process. Every command ends in a documented exit
code with at most one error line; a writer runs or is refused (exit 3: the lock);
``verify`` reports a problem only with ``store-changed`` (another process wrote the store
while it read) or ``store-live`` (a writer held the lock), or what an append without
``--dispatch`` leaves by design. Afterwards, with a last ``recover`` and ``dispatch``, the
store verifies sound and holds every message an ``append`` reported, each replica verifies
sound and holds a prefix of its commit log, and ``serve-ha`` still serves, then stops with
exit 0.

It found ``verify`` reporting a record half written by an append that started after it as
a ``torn-tail`` error with ``recover --yes`` as the next step, ``recover`` letting its
lock go before its own check, which then reported another writer's messages as what the
recovery left (exit 1), readers meeting a file a rebuild had moved since they listed the
store with a bare "No such file or directory" (exit 2), and an HA slave given a larger
file size than its master's taking the master's next file in behind its BLANK."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from campaigns import (
    campaign_random,
    child_env,
    log_bytes,
    lost_messages,
    new_campaign_store,
    recovered_sound,
    rmqstore,
    rounds,
    seed_note,
    unclean,
)
from support import serving_logged

SECONDS = rounds(short=10, long=150)
GEOMETRY = ["--commitlog-file-size", "65536", "--consumequeue-file-size", "600"]
INDEX = ["--index-slots", "50", "--index-entries", "200"]
# what an append without --dispatch leaves by design, until a dispatch or recover
BY_DESIGN = {"abort-present", "dispatch-lag", "index-lag"}
MOVING = {"store-changed", "store-live"}  # a report of a store another process wrote


def _writer(store: Path, rng: random.Random, number: int) -> tuple[list[str], list[dict]]:
    """One writer's command line, and the messages it would append (none but for append)."""
    kind = rng.choice(["append"] * 4 + ["dispatch", "rebuild", "recover", "flush", "purge"])
    if kind == "append":
        messages = [
            {
                "topic": f"T{rng.randrange(4)}",
                "queueId": rng.randrange(4),
                "keys": f"k{number}-{n} k{n % 7}",
                "body": f"m{number}-{n}-" + "x" * rng.choice([0, 90, 2500, 20000]),
            }
            for n in range(rng.randint(1, 40))
        ]
        dispatch = ["--dispatch"] if rng.random() < 0.6 else []
        return ["append", str(store), "--input", "-", "--jsonl", *dispatch, *GEOMETRY,
                *INDEX], messages  # fmt: skip
    return {
        "dispatch": ["dispatch", str(store), *INDEX],
        "rebuild": ["dispatch", str(store), "--rebuild", "--yes", *INDEX],
        "recover": ["recover", str(store), "--yes", *INDEX],
        "flush": ["flush", str(store)],
        "purge": ["quarantine", "purge", str(store), "--all", "--yes"],
    }[kind], []


def _reader(store: Path, rng: random.Random, scratch: Path, port: int) -> list[str]:
    out = scratch / f"export-{rng.randrange(1 << 30)}"
    replicas = scratch.parent
    return rng.choice(
        [
            # a slave catching up: from the store's folder, and over HA from serve-ha
            ["replicate", str(store), str(replicas / "replica-dir"), *INDEX],
            [
                "replicate",
                f"ha://127.0.0.1:{port}",
                str(replicas / "replica-ha"),
                *GEOMETRY,
                *INDEX,
            ],
            ["verify", str(store), "--json", *INDEX],
            ["verify", str(store), "--json", "--jobs", "2", "--split-size", "65536", *INDEX],
            ["verify", str(store), "--json", "--commitlog-only"],
            ["read", str(store), "--from-offset", "0", "--count", "300", "--json"],
            ["read", str(store), "--topic", "T1", "--queue", "2", "--json"],
            ["read", str(store), "--key", "k5", "--json", *INDEX],
            ["stats", str(store), "--json"],
            ["info", str(store)],
            ["offsets", str(store), "--json"],
            ["quarantine", "list", str(store), "--json"],
            ["export", str(store), "--format", "jsonl", "--to", str(out)],
        ]
    )


@pytest.mark.campaign
def test_writers_and_readers_beside_each_other_lose_nothing_and_report_no_false_damage(
    tmp_path: Path,
) -> None:
    rng = campaign_random("concurrent")
    store = tmp_path / "store"
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    new_campaign_store(store, *GEOMETRY, *INDEX)
    deadline = time.monotonic() + SECONDS
    failures: list[str] = []
    acknowledged: list[dict] = []
    ran: dict[tuple[str, int], int] = {}
    said: set[str] = set()  # the errors readers met
    guard = threading.Lock()

    def note(args: list[str], code: int) -> None:
        with guard:
            key = (args[0] + (" --rebuild" if "--rebuild" in args else ""), code)
            ran[key] = ran.get(key, 0) + 1

    def writing(worker: int) -> None:
        own = random.Random(rng.random())
        number = 0
        while time.monotonic() < deadline:
            args, messages = _writer(store, own, worker * 100_000 + number)
            number += 1
            lines = "".join(json.dumps(message) + "\n" for message in messages)
            done = subprocess.run(
                [sys.executable, "-m", "rmqstore", *args],
                input=lines,
                capture_output=True,
                text=True,
                timeout=120,
                env=child_env(),
            )
            note(args, done.returncode)
            if unclean(done) or done.returncode not in (0, 3):
                failures.append(f"{args}: exit {done.returncode}: {done.stderr[-600:]}")
            if messages:
                with guard:
                    acknowledged.extend(json.loads(line) for line in done.stdout.splitlines())

    def reading(worker: int) -> None:
        own = random.Random(rng.random())
        while time.monotonic() < deadline:
            args = _reader(store, own, scratch, port)
            done = rmqstore(args)
            note(args, done.returncode)
            if args[0] == "export":
                shutil.rmtree(args[-1], ignore_errors=True)
            if done.returncode in (2, 4):  # a file a writer moved as it was read: said
                with guard:
                    said.add(f"{args[0]}: {done.stderr.strip().splitlines()[-1][:300]}")
            if unclean(done):
                failures.append(f"{args}: exit {done.returncode}: {done.stderr[-600:]}")
            elif args[0] == "verify" and done.returncode == 1:
                kinds = set(json.loads(done.stdout)["findingsByKind"])
                if not kinds & MOVING and kinds - BY_DESIGN:
                    failures.append(f"{args}: found {sorted(kinds)}, without store-changed")

    threads = [threading.Thread(target=writing, args=(n,)) for n in range(2)]
    threads += [threading.Thread(target=reading, args=(n,)) for n in range(2)]
    with serving_logged(store, tmp_path / "serve-ha.log", "--follow", *GEOMETRY, *INDEX) as (
        port,
        master,
    ):
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert master.poll() is None, (tmp_path / "serve-ha.log").read_text()[-2000:]
    assert master.returncode == 0, (tmp_path / "serve-ha.log").read_text()[-2000:]
    assert not failures, f"{failures[:5]}{seed_note()}"
    recovered_sound(store, *INDEX)
    log = log_bytes(store)
    for replica in sorted(tmp_path.glob("replica-*")):  # what each copied is the store's
        verified = rmqstore(["verify", str(replica), "--json", *INDEX])
        assert verified.returncode == 0, f"{replica}: {verified.stdout[-2000:]}{seed_note()}"
        copied = log_bytes(replica)
        assert log[: len(copied)] == copied, f"{replica} is not a prefix{seed_note()}"
    lost = lost_messages(store, acknowledged)
    assert acknowledged and not lost, f"{len(lost)} lost, e.g. {lost[:3]}{seed_note()}"
    print(f"concurrent: {sum(ran.values())} commands in {SECONDS} s, {len(acknowledged)} "
          f"messages appended; {dict(sorted(ran.items()))}")  # fmt: skip
    print(f"concurrent: the errors readers met: {sorted(said)}")
