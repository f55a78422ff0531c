"""States a SIGKILL can leave, each mended by recover or by the next dispatch: empty files at
the end of a queue of files, files still under their temporary name, an index whose last
record's entries were written but not counted, a record whose keys were split over two index
files when the kill came."""

from __future__ import annotations

import json
from pathlib import Path

from rmqstore.config import StoreConfig
from rmqstore.indexfile import read_index_headers
from rmqstore.store import Store
from rmqstore.verify import NOTE, verify_store

from support import run_cli

GEOMETRY = ["--commitlog-file-size", "4096", "--index-slots", "10", "--index-entries", "40"]
CONFIG = StoreConfig(commitlog_file_size=4096, index_slots=10, index_entries=40)


def store_of(tmp_path: Path, count: int, keys: str = "k") -> Path:
    store = tmp_path / "store"
    lines = tmp_path / "in.jsonl"
    lines.write_text((json.dumps({"topic": "T", "keys": keys, "body": "x" * 200}) + "\n") * count)
    result = run_cli("append", store, "--create", *GEOMETRY, "--input", lines, "--dispatch")
    assert result.exit_code == 0, result.stderr
    return store


def sound(store: Path) -> list:
    with Store.open_read(store, CONFIG) as opened:
        return [f for f in verify_store(opened).findings if f.severity != NOTE]


def test_recover_moves_empty_and_half_made_files_and_the_store_is_sound(tmp_path: Path) -> None:
    store = store_of(tmp_path, 12)  # the 12th record rolled into a second file
    second = store / "commitlog" / "00000000000000004096"
    second.write_bytes(b"")  # killed between create and size: the record is gone
    (store / "commitlog" / ".00000000000000008192.creating").write_bytes(bytes(100))
    (store / "abort").touch()
    first = run_cli("recover", store, "--yes")
    assert first.exit_code == 0, first.stderr + first.stdout
    assert not second.exists() and not list((store / "commitlog").glob(".*"))
    assert sound(store) == []
    again = run_cli("recover", store, "--yes", "--json")  # nothing left to do, exit 0
    assert again.exit_code == 0 and json.loads(again.stdout)["plan"]["moves"] == []
    appended = run_cli("append", store, "--topic", "T", "--body", "after", "--dispatch")
    assert appended.exit_code == 0, appended.stderr
    assert sound(store) == []


def test_verify_names_half_made_files_and_recover_as_their_mend(tmp_path: Path) -> None:
    """Files a killed writer left under their temporary names, in the commit log's, a
    queue's and the index's folders: verify called them unknown files (`file-name`) that no
    command mends, though recover moves them to quarantine (an index file's is named by the
    time it was made, so no later dispatch makes it again). Now `file-half-made`, whose next
    step is recover; after it the store is sound."""
    store = store_of(tmp_path, 3)
    half_made = [
        store / "commitlog" / ".00000000000000004096.creating",
        store / "consumequeue" / "T" / "0" / ".00000000000000000000.creating",
        store / "index" / ".20261201021911071.creating",
    ]
    for path in half_made:
        path.write_bytes(bytes(100))
    checked = run_cli("verify", store, "--json")
    report = json.loads(checked.stdout)
    assert checked.exit_code == 1 and report["findingsByKind"] == {"file-half-made": 3}
    assert sorted(finding["file"] for finding in report["findings"]) == sorted(
        str(path.relative_to(store)) for path in half_made
    )
    assert "rmqstore recover" in run_cli("verify", store).stdout.splitlines()[-1]
    assert run_cli("recover", store, "--yes").exit_code == 0
    assert not any(path.exists() for path in half_made) and sound(store) == []


def test_an_empty_consume_queue_file_is_replaced_by_the_next_put(tmp_path: Path) -> None:
    store = store_of(tmp_path, 3)
    queue_dir = store / "consumequeue" / "T" / "0"
    for path in queue_dir.iterdir():
        path.unlink()
    (queue_dir / "00000000000000000000").write_bytes(b"")  # killed between create and size
    result = run_cli("dispatch", store)
    assert result.exit_code == 0, result.stderr
    assert (queue_dir / "00000000000000000000").stat().st_size == 6_000_000
    appended = run_cli("append", store, "--topic", "T", "--body", "y", "--dispatch")
    assert appended.exit_code == 0, appended.stderr
    assert sound(store) == []


def test_entries_past_the_count_are_dropped_and_their_slots_repaired(tmp_path: Path) -> None:
    """A kill after the last record's entries and slots were written, before the header:
    without the repair, the resumed put overwrites the uncounted entry its slot already
    points to and chains it to itself; older entries of the slot become unreachable."""
    store = store_of(tmp_path, 7, keys="same")  # every record: UNIQ_KEY and the shared key
    (index_file,) = (store / "index").iterdir()
    header_before = index_file.read_bytes()[:40]
    appended = run_cli("append", store, "--topic", "T", "--keys", "same", "--body", "8th",
                       "--dispatch")  # fmt: skip
    assert appended.exit_code == 0, appended.stderr
    with open(index_file, "r+b") as handle:
        handle.write(header_before)  # the header as the kill left it
    (store / "abort").touch()
    result = run_cli("dispatch", store, *GEOMETRY)
    assert result.exit_code == 0, result.stderr
    assert sound(store) == []
    found = run_cli("read", store, "--topic", "T", "--key", "same", "--jsonl")
    assert len(found.stdout.splitlines()) == 8  # the whole chain is reachable


def test_a_record_whose_keys_were_split_over_two_files_gets_the_rest(tmp_path: Path) -> None:
    """The first file filled in the middle of a record's keys and the kill came before the
    next file got them: resuming indexes exactly the missing keys."""
    store = store_of(tmp_path, 7, keys="a b c d e")  # 6 keys a record, 39 entries a file
    headers = read_index_headers(store / "index")
    assert len(headers) == 2
    split_record = headers[0][1].end_phy_offset
    second = headers[1][0]
    second.unlink()  # the kill came before the second file was made
    result = run_cli("dispatch", store, *GEOMETRY)
    assert result.exit_code == 0, result.stderr
    assert sound(store) == []
    for key in "abcde":
        found = run_cli("read", store, "--topic", "T", "--key", key, "--jsonl")
        offsets = [json.loads(line)["commitLogOffset"] for line in found.stdout.splitlines()]
        assert sorted(offsets) == sorted(set(offsets)) and split_record in offsets
        assert len(offsets) == 7


def test_a_kill_right_after_a_roll_is_recovered(tmp_path: Path) -> None:
    """The last file ends with a BLANK and the next file exists, all zeros (the kill came
    after the roll, before the record): the valid end is that file's start, and recover
    reaches it (it used to exit 1 forever, 'dispatch did not reach the valid end')."""
    store = store_of(tmp_path, 12)
    second = store / "commitlog" / "00000000000000004096"
    second.write_bytes(bytes(4096))  # the 12th record never written
    (store / "abort").touch()
    first = run_cli("recover", store, "--yes")
    assert first.exit_code == 0, first.stderr + first.stdout
    assert not (store / "abort").exists()
    again = run_cli("recover", store, "--yes", "--json")
    assert again.exit_code == 0 and json.loads(again.stdout)["plan"]["moves"] == []
    assert sound(store) == []
