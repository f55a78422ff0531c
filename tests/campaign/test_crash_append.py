"""SIGKILL (or SIGTERM, SIGINT) during ``append``, at random points, with each flush policy:
after every kill
``recover --yes`` mends the store, every acknowledged message is there with its body, no torn
record is visible and verify finds the store sound."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rmqstore.config import StoreConfig
from rmqstore.record import BodyMode
from rmqstore.store import Store
from rmqstore.verify import NOTE, verify_store

from campaigns import campaign_random, child_env, rounds, seed_note, sigint_delivered, stop_signal
from support import run_cli

KILLS = rounds(short=2, long=50)  # per flush policy and dispatch setting: 6 x 50 = 300 long
# each policy as append's options: group commit; ASYNC_FLUSH's interval flushes (short, so
# kills land between them); the transient store pool, committing between flushes
POLICIES = {
    "sync": ["--flush", "sync"],
    "async": ["--flush", "async", "--flush-interval", "100"],
    "transient": ["--flush", "async", "--flush-interval", "150", "--transient-store-pool",
                  "--commit-interval", "40"],
}  # fmt: skip
GEOMETRY = ["--commitlog-file-size", "65536", "--consumequeue-file-size", "2000",
            "--index-slots", "100", "--index-entries", "400"]  # fmt: skip
CONFIG = StoreConfig(
    commitlog_file_size=65536, consumequeue_file_size=2000, index_slots=100, index_entries=400
)


def append_until_killed(
    store: Path, rng: random.Random, label: str, flush: str, dispatch: bool
) -> dict[str, str]:
    """Feed messages to a child ``append --input -`` and stop it at a random moment (see
    :func:`stop_signal`);
    returns msgId -> body of every message it acknowledged."""
    command = [sys.executable, "-m", "rmqstore", "append", str(store), "--input", "-",
               *POLICIES[flush], "--jsonl", *(["--dispatch"] if dispatch else [])]  # fmt: skip
    child = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=child_env(),
        preexec_fn=sigint_delivered,
    )
    assert child.stdin is not None and child.stdout is not None
    bodies: list[str] = []
    acknowledged: dict[str, str] = {}
    closing = rng.random() < 0.4  # sometimes the input ends first (async then reports)

    def feed() -> None:
        try:
            for number in range(rng.randint(50, 3000)):
                body = f"{label}-{number}-" + "x" * rng.randint(0, 300)
                bodies.append(body)
                topic = rng.choice(["A", "B", "C"])
                line = {"topic": topic, "queueId": rng.randint(0, 3), "keys": f"k{number}",
                        "body": body}  # fmt: skip
                child.stdin.write((json.dumps(line) + "\n").encode())
                if number % rng.choice([1, 10, 100]) == 0:
                    child.stdin.flush()
                    time.sleep(rng.random() / 1000)
            if closing:
                child.stdin.close()
        except (BrokenPipeError, ValueError, OSError):
            pass

    first_acknowledged = threading.Event()

    def read() -> None:
        for count, line in enumerate(child.stdout):
            if not line.endswith(b"\n"):  # killed while writing it: not an acknowledgement
                break
            acknowledged[json.loads(line)["msgId"]] = bodies[count]
            first_acknowledged.set()

    feeder = threading.Thread(target=feed)
    reader = threading.Thread(target=read)
    feeder.start()
    reader.start()
    if rng.random() < 0.7:  # a kill after the first acknowledgement, however slow the start
        first_acknowledged.wait(timeout=60)
        time.sleep(rng.uniform(0, 1.0))
    else:  # any moment, at start-up too
        time.sleep(rng.uniform(0.2, 1.5))
    child.send_signal(stop_signal(rng))
    child.wait(timeout=300)
    feeder.join()
    reader.join()
    return acknowledged


@pytest.mark.campaign
@pytest.mark.parametrize("dispatch", [False, True])
@pytest.mark.parametrize("flush", list(POLICIES))
def test_no_acknowledged_message_is_lost_to_a_kill(
    tmp_path: Path, flush: str, dispatch: bool
) -> None:
    rng = campaign_random(f"crash-append-{flush}-{dispatch}")
    store = tmp_path / "store"
    created = run_cli("append", store, "--create", *GEOMETRY, "--topic", "A", "--body", "first")
    assert created.exit_code == 0, created.stderr
    acknowledged: dict[str, str] = {}
    for kill in range(KILLS):
        acknowledged.update(append_until_killed(store, rng, f"k{kill}", flush, dispatch))
        recovered = run_cli("recover", store, "--yes")
        assert recovered.exit_code == 0, (
            f"kill {kill}{seed_note()}: {recovered.stderr}{recovered.stdout}"
        )
        with Store.open_read(store, CONFIG) as opened:
            stored = {}
            for offset, *_ in opened.commitlog.scan(check_crc=True):
                message = opened.commitlog.read(offset, body=BodyMode.VERIFY)
                stored[message.msg_id] = (message.body or b"").decode()
            lost = {m for m in acknowledged if stored.get(m) != acknowledged[m]}
            assert not lost, f"kill {kill}{seed_note()}: {len(lost)} acknowledged messages lost"
            findings = [f for f in verify_store(opened).findings if f.severity != NOTE]
            assert findings == [], f"kill {kill}{seed_note()}: {findings[:3]}"
    assert acknowledged  # the kills came after acknowledgements, not only before
