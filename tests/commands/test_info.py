"""``rmqstore info`` on real-broker stores."""

from __future__ import annotations

import json
import shutil

import pytest

from support import ORACLE_OPTIONS, manifest_dump, run_cli


@pytest.mark.parametrize("name", ["s1_multi", "v533_s1_multi", "s3_txn_delay"])
def test_info_matches_the_broker_state(oracle, name: str) -> None:
    store = oracle(name)
    result = run_cli("info", store.store, "--json")
    assert result.exit_code == 0, result.stderr
    info = json.loads(result.stdout)
    state = manifest_dump(store.manifest)["storeState"]
    assert info["commitLog"]["maxOffset"] == state["maxPhyOffset"]
    assert info["commitLog"]["minOffset"] == state["minPhyOffset"]
    assert info["commitLog"]["files"] == len(state["commitLogMappedFiles"])
    assert info["commitLog"]["end"] == "clean"
    assert info["abort"] is store.manifest["abortFilePresent"]
    assert info["locked"] is False and info["lockHolder"] is None
    on_disk = store.manifest["checkpointFileOnDisk"]
    assert info["checkpoint"]["physicMsgTimestamp"] == on_disk["physicMsgTimestamp"]
    assert info["checkpoint"]["indexMsgTimestamp"] == on_disk["indexMsgTimestamp"]
    queues = {
        f"{t['topic']}-{q['queueId']}": q["maxOffset"]
        for t in info["topics"]
        for q in t["queues"]
        if q["maxOffset"]
    }
    table = state.get("commitLogTopicQueueTable") or state["queueStoreTopicQueueTable"]  # 5.x
    expected = {key: int(value) for key, value in table.items() if int(value)}
    assert queues == expected


def test_info_of_a_torn_store(oracle) -> None:
    crash = oracle("s2_crash")
    result = run_cli("info", crash.root / "store_torn_random_garbage", "--json", *ORACLE_OPTIONS)
    info = json.loads(result.stdout)
    assert info["abort"] is True
    assert info["commitLog"]["maxOffset"] == crash.manifest["lastValidEnd"]
    assert info["commitLog"]["end"] == "invalid"


def test_info_names_commit_log_files_missing_between_others(oracle, tmp_path) -> None:
    """A commit-log file deleted from the middle: the rest loads, and info said the log end
    was clean with nothing to warn of. Now it names the missing run of files."""
    store = oracle("s1_multi").copy_to(tmp_path)
    files = sorted((store / "commitlog").iterdir())
    for gone in files[3:5]:
        gone.unlink()
    info = json.loads(run_cli("info", store, "--json").stdout)
    assert info["commitLog"]["missingFiles"] == [
        {"from": files[3].name, "to": files[4].name, "files": 2}
    ]
    shown = run_cli("info", store)
    assert f"commit-log files missing: {files[3].name} .. {files[4].name} (2 files" in shown.stdout
    whole = oracle("s1_multi").store
    assert json.loads(run_cli("info", whole, "--json").stdout)["commitLog"]["missingFiles"] == []


def test_info_names_queue_folders_that_are_links(oracle, tmp_path) -> None:
    """A queue folder that is a symbolic link is not read (rmqstore follows no link there):
    info used to show the store without it and without a word."""
    store = oracle("s1_multi").copy_to(tmp_path / "copy")
    topic = next(path for path in sorted((store / "consumequeue").iterdir()) if path.is_dir())
    moved = tmp_path / "elsewhere"
    shutil.move(topic, moved)
    topic.symlink_to(moved)
    info = json.loads(run_cli("info", store, "--json").stdout)
    assert info["linkedQueueFolders"] == [
        {"folder": f"consumequeue/{topic.name}", "target": str(moved)}
    ]
    assert all(row["topic"] != topic.name for row in info["consumeQueues"])
    shown = run_cli("info", store).stdout
    assert f"consumequeue/{topic.name} -> {moved}: symbolic links, not read" in shown
    asked = run_cli("info", store, "--topic", topic.name)  # it said "has no consume queues"
    assert asked.exit_code == 2
    assert f"consumequeue/{topic.name} is a symbolic link (to {moved})" in asked.stderr
    whole = oracle("s1_multi").store
    assert json.loads(run_cli("info", whole, "--json").stdout)["linkedQueueFolders"] == []


def test_info_says_a_5x_broker_would_not_dispatch_a_lag_without_abort(oracle, tmp_path) -> None:
    """The real broker's crashed store (300 records never dispatched): under its 'abort' a
    broker's crash recovery dispatches them; without it a 5.x broker's start may not."""
    store = oracle("s2_crash").copy_to(tmp_path)
    hint = "no 'abort', so a 5.x broker's start may leave them out"
    shown = run_cli("info", store, *ORACLE_OPTIONS)
    assert "dispatch lag" in shown.stdout and hint not in shown.stdout
    (store / "abort").unlink()
    shown = run_cli("info", store, *ORACLE_OPTIONS)
    assert "records, " in shown.stdout and hint in " ".join(shown.stdout.split())
    caught_up = run_cli("info", oracle("s1_multi").store)
    assert "dispatch lag        0 records" in caught_up.stdout and hint not in caught_up.stdout


def test_info_human_output(oracle) -> None:
    result = run_cli("info", oracle("s1_multi").store)
    assert result.exit_code == 0
    for needle in ("3,346,149", "TopicTest", "physicMsgTimestamp", "52 files"):
        assert needle in result.stdout


@pytest.mark.parametrize("name", ["s1_multi", "v533_s1_multi"])
def test_topic_status_matches_the_broker(oracle, name: str) -> None:
    dump = manifest_dump(oracle(name).manifest)
    assert dump is not None
    store = oracle(name).store
    for topic, queues in dump["consumeQueues"].items():
        if not any(q["maxOffsetInQueue"] for q in queues.values()):
            continue
        result = run_cli("info", store, "--topic", topic, "--json", *ORACLE_OPTIONS)
        assert result.exit_code == 0, result.stderr
        (status,) = json.loads(result.stdout)["topics"]
        got = {q["queueId"]: q for q in status["queues"]}
        for queue_id, broker in queues.items():
            mine = got[int(queue_id)]
            assert (mine["minOffset"], mine["maxOffset"]) == (
                broker["minOffsetInQueue"],
                broker["maxOffsetInQueue"],
            )
            last = (
                broker["decodedMessages"][-1]["storeTimestamp"] if broker["decodedMessages"] else 0
            )
            assert mine["lastUpdated"] == last
    human = run_cli("info", store, "--topic", "TopicTest", *ORACLE_OPTIONS)
    assert "last updated" in human.stdout and "TopicTest" in human.stdout
    missing = run_cli("info", store, "--topic", "Nope", *ORACLE_OPTIONS)
    assert missing.exit_code == 2 and "has no consume queues" in missing.stderr
    deep = run_cli("info", store, "--topic", "TopicTest", "--deep", *ORACLE_OPTIONS)
    assert deep.exit_code == 2 and "--deep counts the records of the whole log" in deep.stderr


def test_topic_status_of_a_queue_whose_last_record_is_torn(oracle, tmp_path) -> None:
    """A broker killed while writing leaves its last record half written, and the queue's
    unit for it may be dispatched already. ``info --topic`` showed that queue as last updated
    at the time the torn record's header still held; now lastUpdated is 0, with a warning
    naming the queue, and the other queues keep their times."""
    store = oracle("s1_multi").copy_to(tmp_path)
    end = json.loads(run_cli("info", store, "--json").stdout)["commitLog"]["maxOffset"]
    (status,) = json.loads(run_cli("info", store, "--topic", "TopicTest", "--json").stdout)[
        "topics"
    ]
    last = None
    for queue in status["queues"]:
        tail = run_cli(
            "read", store, "--topic", "TopicTest", "--queue", str(queue["queueId"]),
            "--from", str(queue["maxOffset"] - 1), "--jsonl",
        )  # fmt: skip
        message = json.loads(tail.stdout)
        if message["commitLogOffset"] + message["storeSize"] == end:
            last = (queue["queueId"], queue["maxOffset"], message)
    assert last is not None, "TopicTest holds the log's last record"
    queue_id, max_offset, message = last
    segment = sorted((store / "commitlog").iterdir())[-1]
    position = message["commitLogOffset"] - int(segment.name)
    with open(segment, "r+b") as file:  # the record's second half never reached the disk
        file.seek(position + message["storeSize"] // 2)
        file.write(bytes(message["storeSize"] - message["storeSize"] // 2))
    result = run_cli("info", store, "--topic", "TopicTest", "--json")
    assert result.exit_code == 0, result.stderr
    (torn,) = json.loads(result.stdout)["topics"]
    for before, after in zip(status["queues"], torn["queues"], strict=True):
        expected = 0 if after["queueId"] == queue_id else before["lastUpdated"]
        assert after["lastUpdated"] == expected and after["maxOffset"] == before["maxOffset"]
    assert (
        f"warning: the last unit of TopicTest:{queue_id} (queue offset {max_offset - 1}) "
        "points at no whole record" in result.stderr
    )
