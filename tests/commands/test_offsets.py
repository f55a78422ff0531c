"""``rmqstore offsets``, and the offsets ``verify`` and ``recover`` check, from the command
line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from rmqstore.fixtures import FixtureOptions, generate

from support import ORACLE_OPTIONS, run_cli, tree_digest


def consumed_store(tmp_path: Path, offsets: str, scenario: str = "basic") -> Path:
    store = tmp_path / scenario
    generate(scenario, store, FixtureOptions())
    (store / "config" / "consumerOffset.json").write_text(offsets)
    return store


def test_table_json_and_rows(tmp_path: Path) -> None:
    store = consumed_store(
        tmp_path, '{"offsetTable":{"BasicTopic@g1":{0:5},"BasicTopic@g2":{0:25}}}'
    )
    before = tree_digest(store)
    table = run_cli("--utc", "offsets", store)
    assert table.exit_code == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0] == "consumer offsets (config/consumerOffset.json)"
    assert lines[1].split() == [
        "group", "topic", "queue", "offset", "min", "max", "lag", "last", "consumed", "state",
    ]  # fmt: skip
    assert lines[2].split()[:7] == ["g1", "BasicTopic", "0", "5", "0", "20", "15"]
    assert lines[2].endswith("UTC  ok")
    assert lines[3].split() == ["g2", "BasicTopic", "0", "25", "0", "20", "0", "-", "past-end"]
    assert "g1: lag 15 over 1 queue" in lines
    assert "g2: lag 0 over 1 queue, 1 past the end" in lines
    assert "1 consumer offset past the end of its queue" in table.stderr
    document = json.loads(run_cli("offsets", store, "--json").stdout)
    assert [g["group"] for g in document["consumerOffsets"]["groups"]] == ["g1", "g2"]
    assert document["delayOffsets"] == {"file": None, "levels": []}
    rows = run_cli("offsets", store, "--csv", "--fields", "group,lag,state").stdout
    assert rows.splitlines() == ["group,lag,state", "g1,15,ok", "g2,0,past-end"]
    jsonl = run_cli("offsets", store, "--jsonl", "--group", "g2").stdout.splitlines()
    assert [json.loads(line)["state"] for line in jsonl] == ["past-end"]
    assert tree_digest(store) == before  # reads only


def test_filters_and_what_they_did_not_match(tmp_path: Path) -> None:
    store = consumed_store(tmp_path, '{"offsetTable":{"BasicTopic@g1":{0:5}}}')
    result = run_cli("offsets", store, "--group", "g1", "--group", "nobody", "--json")
    assert result.exit_code == 0
    document = json.loads(result.stdout)
    assert [g["group"] for g in document["consumerOffsets"]["groups"]] == ["g1"]
    assert document["delayOffsets"] is None  # the scheduler is not a group
    assert "no offsets of group 'nobody'" in result.stderr
    result = run_cli("offsets", store, "--topic", "Elsewhere", "--json")
    assert json.loads(result.stdout)["consumerOffsets"]["groups"] == []
    assert "no offsets in topic 'Elsewhere'" in result.stderr
    assert run_cli("offsets", store, "--group", "").exit_code == 2
    assert run_cli("offsets", store, "--json", "--csv").exit_code == 2


def test_the_delay_scheduler_of_a_real_store(oracle) -> None:
    store = oracle("s3_txn_delay")
    result = run_cli("--utc", "offsets", store.store, *ORACLE_OPTIONS)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("consumer offsets: none")
    assert lines[1] == "delay scheduler (config/delayOffset.json)"
    assert lines[3].split()[:7] == ["1", "1s", "3", "0", "3", "0", "-"]
    assert lines[-1].split()[:8] == ["18", "2h", "0", "(none", "recorded)", "0", "3", "3"]
    shown = run_cli("offsets", store.store, "--topic", "SCHEDULE_TOPIC_XXXX", "--json")
    assert len(json.loads(shown.stdout)["delayOffsets"]["levels"]) == 4


def test_a_delay_offset_past_its_queues_end_says_what_brokers_do_with_it(
    oracle, tmp_path: Path
) -> None:
    store = oracle("s3_txn_delay").copy_to(tmp_path)
    (store / "config" / "delayOffset.json").write_text('{"offsetTable":{"1":3,"2":5,"3":2}}')
    result = run_cli("verify", store, "--json", *ORACLE_OPTIONS)
    assert result.exit_code == 1
    (past,) = json.loads(result.stdout)["findings"]
    assert (past["kind"], past["file"]) == ("offset-past-end", "config/delayOffset.json")
    assert (past["topic"], past["queueId"], past["queueOffset"]) == ("SCHEDULE_TOPIC_XXXX", 1, 5)
    assert past["message"].startswith(
        "the delay scheduler's offset for level 2 is 5, past the end 2 of its queue "
        "SCHEDULE_TOPIC_XXXX:1: a 4.9.8 or 5.x broker sets it back to the end"
    )
    assert "mqadmin" not in past["message"]  # resetting offsets by time is for groups
    shown = run_cli("offsets", store, *ORACLE_OPTIONS)
    assert shown.exit_code == 0
    assert "a 4.9.8 or 5.x broker sets it back to the end as it loads the file" in shown.stderr


def test_files_that_do_not_load_are_warned_of_and_bad_input_is_one_line(tmp_path: Path) -> None:
    store = consumed_store(tmp_path, '{\n\t"offsetTable":{"BasicTopic@g1":{0:')
    result = run_cli("offsets", store)
    assert result.exit_code == 0
    assert "config/consumerOffset.json does not load" in result.stderr
    assert "a broker finds no offsets in it" in result.stderr
    missing = run_cli("offsets", tmp_path / "nowhere")
    assert missing.exit_code == 2 and missing.stderr.count("\n") == 1


def test_verify_fails_on_an_offset_past_its_queues_end(tmp_path: Path) -> None:
    store = consumed_store(tmp_path, '{"offsetTable":{"BasicTopic@g1":{0:20}}}')
    assert run_cli("verify", store).exit_code == 0  # at the end: nothing left to consume
    (store / "config" / "consumerOffset.json").write_text(
        '{"offsetTable":{"BasicTopic@g1":{0:21}}}'
    )
    (store / "config" / "delayOffset.json").write_text("{")
    result = run_cli("verify", store, "--json")
    assert result.exit_code == 1
    findings = json.loads(result.stdout)["findings"]
    assert {(f["kind"], f["severity"]) for f in findings} == {
        ("offset-past-end", "warning"),
        ("config-unreadable", "warning"),
    }
    past = next(f for f in findings if f["kind"] == "offset-past-end")
    assert (past["topic"], past["queueId"], past["queueOffset"]) == ("BasicTopic", 0, 21)
    assert past["file"] == "config/consumerOffset.json"
    # another topic's check leaves it out; a commit-log-only check reads no queues
    assert run_cli("verify", store, "--topic", "Other").exit_code == 0
    assert run_cli("verify", store, "--commitlog-only").exit_code == 0


def test_recover_names_the_offsets_its_cuts_leave_past_a_queues_end(tmp_path: Path) -> None:
    """torn-tail: the last record is half written and its queue holds a unit for it. A group
    that had consumed it has an offset past the queue's end once recovery cuts the unit: the
    next message stored in that queue gets an offset the group skips."""
    store = tmp_path / "torn"
    generate("torn-tail", store, FixtureOptions())
    plan = json.loads(run_cli("recover", store, "--dry-run", "--json").stdout)["plan"]
    cut = next(c for c in plan["cuts"] if "consumequeue" in c["file"])
    topic, queue_id = Path(cut["file"]).parts[-3], int(Path(cut["file"]).parts[-2])
    end = (cut["start"] // 20) + 1  # the queue's end before the cut
    (store / "config" / "consumerOffset.json").write_text(
        json.dumps({"offsetTable": {f"{topic}@g1": {str(queue_id): end}}})
    )
    dry = run_cli("recover", store, "--dry-run", "--json")
    assert json.loads(dry.stdout)["plan"]["offsetsPastEnd"] == [
        {"group": "g1", "topic": topic, "queueId": queue_id, "offset": end, "queueEnd": end - 1}
    ]
    shown = run_cli("recover", store, "--dry-run")
    assert f"left for you: group g1's offset {end} in {topic}:{queue_id}" in shown.stdout
    result = run_cli("recover", store, "--yes")
    assert result.exit_code == 1  # recovered, but the group's offset needs resetting
    assert f"group g1's offset {end} in {topic}:{queue_id} is past the queue's end" in (
        result.stderr
    )
    assert "offset-past-end: 1" in result.stderr


def test_a_fifo_or_folder_in_place_of_a_config_file_is_not_waited_on(tmp_path: Path) -> None:
    """A FIFO where topics.json or consumerOffset.json should be: verify, offsets and append
    (which adds its topics to topics.json) waited for a writer that never came."""
    store = tmp_path / "store"
    generate("basic", store, FixtureOptions())
    config = store / "config"
    (config / "topics.json").unlink()
    os.mkfifo(config / "topics.json")
    os.mkfifo(config / "consumerOffset.json")
    (config / "delayOffset.json").mkdir()

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "rmqstore", *args, str(store)],
            capture_output=True,
            text=True,
            timeout=60,
        )

    offsets = run("offsets")
    assert offsets.returncode == 0, offsets.stderr
    assert "consumer offsets: none (config/consumerOffset.json does not load)" in offsets.stdout
    assert "consumerOffset.json: not a regular file" in offsets.stderr
    verify = run("verify", "--json")
    assert verify.returncode == 1
    kinds = {f["kind"] for f in json.loads(verify.stdout)["findings"]}
    assert kinds == {"config-unreadable"}
    append = subprocess.run(
        [sys.executable, "-m", "rmqstore", "append", str(store), "--topic", "New", "--body", "x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert append.returncode == 0, append.stderr
    assert "topics.json was left as it is (it is not a regular file of JSON)" in append.stderr


def test_a_queue_that_does_not_load_is_left_out_and_verify_still_reports(tmp_path: Path) -> None:
    """A consume-queue file of the wrong size: verify failed with exit 2 once it read the
    group offsets of that queue, instead of reporting the file (cq-file-size)."""
    store = consumed_store(
        tmp_path,
        '{"offsetTable":{"%RETRY%group_a@g":{0:3,1:2}}}',
        scenario="cq-wrong-size",  # %RETRY%group_a:0's file is cut to half its size
    )
    verify = run_cli("verify", store, "--json")
    assert verify.exit_code == 1
    assert "cq-file-size" in json.loads(verify.stdout)["findingsByKind"]
    offsets = run_cli("offsets", store, "--json")
    assert offsets.exit_code == 0
    rows = json.loads(offsets.stdout)["consumerOffsets"]["groups"][0]["queues"]
    assert [row["state"] for row in rows] == ["unreadable", "ok"]
    assert "%RETRY%group_a:0 left out (state unreadable): consume-queue file" in offsets.stderr


def test_info_counts_the_groups_and_warns_of_offsets_past_an_end(tmp_path: Path) -> None:
    store = consumed_store(
        tmp_path, '{"offsetTable":{"BasicTopic@g1":{0:5},"BasicTopic@g2":{0:25},"Gone@g3":{0:1}}}'
    )
    result = run_cli("info", store, "--json")
    assert result.exit_code == 0
    assert json.loads(result.stdout)["consumerOffsets"] == {
        "file": "config/consumerOffset.json",
        "groups": 3,
        "lag": 15,
        "pastEnd": 1,
    }
    assert "1 consumer offset in config/consumerOffset.json is past the end" in result.stderr
    table = run_cli("info", store)
    assert "consumer groups     3, lag 15; 1 past a queue's end (rmqstore offsets)" in (
        table.stdout.splitlines()
    )
    (store / "config" / "consumerOffset.json").unlink()
    assert json.loads(run_cli("info", store, "--json").stdout)["consumerOffsets"] is None


def test_a_rebuild_names_the_offsets_past_its_queues_ends(tmp_path: Path) -> None:
    store = consumed_store(
        tmp_path, '{"offsetTable":{"BasicTopic@g1":{0:20},"BasicTopic@g2":{0:24}}}'
    )
    result = run_cli("dispatch", store, "--rebuild", "--yes")
    assert result.exit_code == 0
    assert "group g2's offset 24 in BasicTopic:0 is past the queue's end 20" in result.stderr
    assert "g1's" not in result.stderr
