"""Generated fixtures: deterministic, sound when clean, and damaged exactly as their manifest
says (what verify reports, what recovery must reach)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from rmqstore.errors import InputError, NotAStoreError
from rmqstore.fixtures import SCENARIOS, FixtureOptions, describe
from rmqstore.fixtures.plans import random_bytes
from rmqstore.reader import MessageReader
from rmqstore.store import Store
from rmqstore.verify import NOTE, verify_store

from support import generate_each_time as generate  # what is tested here: never a copy
from support import tree_digest

SMALL = sorted(name for name in SCENARIOS if name != "large")
CLEAN = [name for name in SMALL if SCENARIOS[name].damage is None]
DAMAGED = [name for name in SMALL if SCENARIOS[name].damage is not None]


def made(tmp_path: Path, name: str, **options: object) -> tuple[Path, dict]:
    out = tmp_path / f"{name}-{options.get('seed', 1)}"
    return out, generate(name, out, FixtureOptions(**options))


@pytest.mark.parametrize("name", [*SMALL, "large"])
def test_same_arguments_same_bytes_and_names(tmp_path: Path, name: str) -> None:
    options = {"messages": 3000, "commitlog_file_size": 65536} if name == "large" else {}
    first, _ = made(tmp_path / "a", name, seed=5, **options)
    second, _ = made(tmp_path / "b", name, seed=5, **options)
    other, _ = made(tmp_path / "c", name, seed=6, **options)
    assert tree_digest(first) == tree_digest(second)
    assert tree_digest(first) != tree_digest(other)


@pytest.mark.parametrize("name", ["large", "multi", "delay", "torn-tail"])
def test_worker_processes_write_the_same_bytes(tmp_path: Path, name: str) -> None:
    options = FixtureOptions(seed=3, messages=3000, commitlog_file_size=65536)
    if name != "large":
        options = FixtureOptions(seed=3, commitlog_file_size=4096)  # many files, many ranges
    generate(name, tmp_path / "here", options)
    generate(name, tmp_path / "workers", options, workers=2)
    assert tree_digest(tmp_path / "workers") == tree_digest(tmp_path / "here")


@pytest.mark.parametrize("name", SMALL)
def test_the_listed_message_count_is_what_is_stored(tmp_path: Path, name: str) -> None:
    _, manifest = made(tmp_path, name)
    assert manifest["messageCount"] == SCENARIOS[name].stored


@pytest.mark.parametrize("name", CLEAN)
@pytest.mark.parametrize("seed", [1, 2])
def test_clean_scenarios_verify_sound(tmp_path: Path, name: str, seed: int) -> None:
    out, manifest = made(tmp_path, name, seed=seed)
    with Store.open_read(out) as store:  # the geometry is inferred from the files
        report = verify_store(store)
        assert report.ok, report.findings
        assert report.checked["records"] == manifest["messageCount"]
        assert store.log_end().offset == manifest["commitLog"]["maxOffset"]


@pytest.mark.parametrize("name", DAMAGED)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_damage_is_reported_as_the_manifest_says(tmp_path: Path, name: str, seed: int) -> None:
    out, manifest = made(tmp_path, name, seed=seed)
    with Store.open_read(out) as store:
        report = verify_store(store)
        recovered_end = store.log_end().offset
    problems = {finding.kind for finding in report.findings if finding.severity != NOTE}
    expected = manifest["expect"]["verify"]
    assert problems == {item["kind"] for item in expected}
    found = [finding.to_dict() for finding in report.findings]
    for item in expected:
        assert any(all(f[key] == value for key, value in item.items()) for f in found), item
    assert recovered_end == manifest["expect"]["recovery"]["validEnd"]


@pytest.mark.parametrize("name", DAMAGED)
def test_finding_positions_each_mean_one_thing(tmp_path: Path, name: str) -> None:
    """The JSON contract of a finding's position: a commit-log file's name plus filePosition
    is commitLogOffset; a consume-queue file's path names topic and queueId, and its name plus
    filePosition is queueOffset units in; an index or checkpoint position is inside its file."""
    out, _ = made(tmp_path, name, seed=2)
    with Store.open_read(out) as store:
        findings = [finding.to_dict() for finding in verify_store(store).findings]
    assert findings
    for finding in findings:
        assert set(finding) == {
            "kind",
            "severity",
            "file",
            "filePosition",
            "commitLogOffset",
            "topic",
            "queueId",
            "queueOffset",
            "message",
        }
        file, position = finding["file"], finding["filePosition"]
        if position is not None:
            assert (out / file).is_file() or finding["kind"] == "file-gap", finding
            assert position >= 0
        parts = Path(file).parts if file else ()
        if parts[:1] == ("commitlog",) and position is not None:
            assert int(parts[1]) + position == finding["commitLogOffset"], finding
        if parts[:1] == ("consumequeue",) and len(parts) >= 3:
            assert (parts[1], int(parts[2])) == (finding["topic"], finding["queueId"]), finding
            if position is not None:
                assert int(parts[3]) + position == finding["queueOffset"] * 20, finding


def test_manifest_lists_the_stored_messages(tmp_path: Path) -> None:
    out, manifest = made(tmp_path, "txn", seed=3)
    assert manifest == describe("txn", out)
    with Store.open_read(out) as store:
        reader = MessageReader(store)
        for listed in manifest["messages"]:
            message = reader.by_offset(listed["commitLogOffset"])
            assert message.msg_id == listed["msgId"]
            assert message.properties.get("UNIQ_KEY") == listed["uniqKey"]
            assert (message.topic, message.queue_id, message.queue_offset) == (
                listed["topic"],
                listed["queueId"],
                listed["queueOffset"],
            )
    assert {m["transaction"] for m in manifest["messages"]} == {0x0, 0x4, 0x8, 0xC}


def test_scenario_contents(tmp_path: Path) -> None:
    out, _ = made(tmp_path, "multi")
    with Store.open_read(out) as store:
        messages = list(MessageReader(store).sequential(0))
    assert {m.topic for m in messages} == {"TopicTest", "Orders-EU_west", "%RETRY%group_a"}
    assert any(m.born_host.is_ipv6 for m in messages) and messages[0].store_host.is_ipv6
    assert any(not m.body for m in messages)
    assert not messages[0].properties_bytes.endswith(b"\x02")  # 4.9.x style by default
    assert len(list((out / "commitlog").iterdir())) > 3
    out, _ = made(tmp_path, "v2")
    with Store.open_read(out) as store:
        versions = {m.version for m in MessageReader(store).sequential(0)}
        first = store.commitlog.read(0)
    assert versions == {1, 2} and "__CRC32#" in first.properties
    assert first.properties_bytes.endswith(b"\x02")
    out, manifest = made(tmp_path, "delay")
    assert (out / "consumequeue" / "SCHEDULE_TOPIC_XXXX").is_dir()
    topics = json.loads((out / "config" / "topics.json").read_text())["topicConfigTable"]
    scheduled = {m["queueId"] for m in manifest["messages"] if m["topic"] == "SCHEDULE_TOPIC_XXXX"}
    assert topics["SCHEDULE_TOPIC_XXXX"]["readQueueNums"] == max(scheduled) + 1
    assert topics["DelayTopic"]["writeQueueNums"] == 2 and topics["DelayTopic"]["perm"] == 6


def test_output_directory_rules(tmp_path: Path) -> None:
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(NotAStoreError, match="not empty"):
        generate("basic", tmp_path / "busy")
    with pytest.raises(NotAStoreError, match="refusing"):
        generate("basic", tmp_path / "busy", force=True)
    assert (tmp_path / "busy" / "notes.txt").exists()
    out, _ = made(tmp_path, "basic")
    with pytest.raises(NotAStoreError):
        generate("basic", out)
    generate("basic", out, FixtureOptions(seed=9), force=True)
    assert describe("basic", out)["seed"] == 9
    with pytest.raises(InputError, match="holds scenario"):
        describe("multi", out)
    with pytest.raises(InputError, match="unknown scenario"):
        generate("nope", tmp_path / "x")


def test_random_bytes_are_the_bytes_drawn_one_at_a_time() -> None:
    """The fixtures' random bodies come from one draw per body: the same bytes, and the same
    generator state after, as drawing a byte at a time (fixtures stay byte-identical)."""
    for seed in range(20):
        one_at_a_time, at_once = random.Random(seed), random.Random(seed)
        for count in (0, 1, 3, 4, 5, 700, 2001):
            expected = bytes(one_at_a_time.getrandbits(8) for _ in range(count))
            assert random_bytes(at_once, count) == expected
        assert at_once.getrandbits(64) == one_at_a_time.getrandbits(64)
