"""Crash recovery: the plan reads only; applying it reaches what a broker's recovery reaches
(the fixtures' expectations, the real broker's S4 store), cuts nothing it does not quarantine,
and leaves a store that verifies sound."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from pathlib import Path

import pytest

from rmqstore.checkpoint import read_checkpoint, write_checkpoint
from rmqstore.commitlog import CommitLog
from rmqstore.config import StoreConfig
from rmqstore.consumequeue import UNIT, ConsumeQueue, list_queues
from rmqstore.dispatch import Dispatcher
from rmqstore.errors import StoreFormatError
from rmqstore.fixtures import FixtureOptions, generate
from rmqstore.flush import flush_store
from rmqstore.indexfile import read_index_headers
from rmqstore.msgid import UniqKeyGenerator
from rmqstore.record import Message
from rmqstore.recovery import apply_recovery, plan_recovery
from rmqstore.store import Store
from rmqstore.verify import NOTE, verify_store

from support import ORACLE_CONFIG, run_cli, tree_digest

CRASHES = ["torn-tail", "crc-flip", "garbage-after-end", "abort-left", "short-checkpoint"]


def recovered(root: Path, config: StoreConfig | None = None):
    with Store.open_write(root, config) as store:
        plan = plan_recovery(store)
        result = apply_recovery(store, plan)
    return plan, result


def problems(root: Path, config: StoreConfig | None = None) -> list:
    with Store.open_read(root, config) as store:
        report = verify_store(store)
    return [f for f in report.findings if f.severity != NOTE]


def queue_maxima(root: Path) -> dict[str, int]:
    with Store.open_read(root) as store:
        return {
            f"{topic}:{queue_id}": store.consume_queue(topic, queue_id).max_offset
            for topic, queue_id in list_queues(store.consumequeue_dir)
        }


@pytest.mark.parametrize("name", CRASHES)
@pytest.mark.parametrize("seed", [1, 2])
def test_recovery_reaches_what_the_fixture_expects(tmp_path: Path, name: str, seed: int) -> None:
    out = tmp_path / name
    manifest = generate(name, out, FixtureOptions(seed=seed))
    expected = manifest["expect"]["recovery"]
    originals = {path: path.read_bytes() for path in out.rglob("*") if path.is_file()}

    plan, result = recovered(out)

    assert plan.log_end == expected["validEnd"]
    with Store.open_read(out) as store:
        assert sum(1 for _ in store.commitlog.scan()) == expected["recordsKept"]
    assert queue_maxima(out) == expected["queueMaxOffsets"]
    assert problems(out) == []
    assert not (out / "abort").exists()
    # the checkpoint's times, found from the queues as the replay's dispatch holds them, are
    # those a flush loading each queue from its files finds
    written = read_checkpoint(out / "checkpoint")
    with Store.open_write(out) as store:
        flush_store(store, replayed=True)
    assert read_checkpoint(out / "checkpoint") == written
    # every cut byte is in quarantine, as it was
    if plan.cuts or plan.moves:
        listed = json.loads((result.quarantine / "manifest.json").read_text())["pieces"]
        pieces = [piece for piece in listed if not {"made", "copied"} & set(piece)]
        assert len(pieces) == len(plan.cuts) + len(plan.moves)
        # what recover made in their place: the index files it rebuilt (and the temporary
        # names they were made under), and the checkpoint and abort (kept as it found
        # them), and only those
        made = {out / piece["made"] for piece in listed if "made" in piece}
        index_files = set((out / "index").iterdir())
        temporary = {path.with_name(f".{path.name}.creating") for path in index_files}
        assert made - {out / "checkpoint", out / "abort"} <= index_files | temporary
        kept = {piece["moved"] for piece in listed if "copied" in piece}
        assert kept == ({"checkpoint", "abort"} if plan.abnormal else {"checkpoint"})
        assert bool(made) == bool(plan.index_files_rebuilt)
        for piece in pieces:
            source = Path(piece["file"])
            copy = (result.quarantine / (piece.get("copy") or piece["moved"])).read_bytes()
            if "copy" in piece:
                assert copy == originals[source][piece["start"] : piece["end"]]
                assert not any(source.read_bytes()[piece["start"] : piece["end"]])
            else:
                assert copy == originals[source]


def test_the_plan_changes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "torn"
    generate("torn-tail", out, FixtureOptions())
    before = tree_digest(out)
    with Store.open_write(out) as store:
        plan = plan_recovery(store)
    assert plan.has_work and plan.abnormal and plan.cuts
    assert tree_digest(out) == before


def test_a_clean_store_has_nothing_to_recover(tmp_path: Path) -> None:
    out = tmp_path / "multi"
    generate("multi", out, FixtureOptions())
    before = tree_digest(out)
    plan, result = recovered(out)
    assert not plan.has_work and not plan.cuts and not plan.moves
    assert result.quarantine is None and result.dispatch.records == 0
    after = tree_digest(out)
    assert {path for path in before if before[path] != after.get(path)} <= {"checkpoint"}


@pytest.mark.parametrize("copy", ["store", "store_torn_half_record", "store_torn_random_garbage"])
def test_the_real_crashed_store_recovers_as_the_broker_did(
    oracle, tmp_path: Path, copy: str
) -> None:
    """S2 halted with 300 messages not dispatched (and two copies with torn tails); a real
    4.9.8 broker recovered a torn copy into S4."""
    crash = oracle("s2_crash")
    root = crash.copy_to(tmp_path, copy)
    config = StoreConfig(**ORACLE_CONFIG)
    plan, result = recovered(root, config)
    assert plan.abnormal and plan.log_end == crash.manifest["lastValidEnd"]
    assert bool(plan.cuts) == (copy != "store")
    assert result.dispatch.units_written == 300  # the phase-2 messages
    broker = {
        f["path"]: f["sha256"]
        for f in oracle("s4_recovered_from_torn_half_record").manifest["filesOnDisk"]
        if f["path"].startswith("consumequeue/")
    }
    ours = {p: hashlib.sha256((root / p).read_bytes()).hexdigest() for p in broker}
    assert ours == broker
    assert not (root / "abort").exists()
    assert problems(root, config) == []


def test_queue_truncation_follows_the_broker(tmp_path: Path) -> None:
    """Units for records at or after the cut go; a file whose first unit goes, goes whole."""
    directory = tmp_path / "cq" / "T" / "0"
    directory.mkdir(parents=True)
    units = [UNIT.pack(offset, 100, 7) for offset in range(0, 1000, 100)]
    (directory / "00000000000000000000").write_bytes(b"".join(units[:5]))
    (directory / "00000000000000000100").write_bytes(b"".join(units[5:]))
    queue = ConsumeQueue(tmp_path / "cq", "T", 0, 100)

    assert queue.truncation_at(1000) is None
    inside = queue.truncation_at(750)
    assert inside.dropped_files == () and inside.cut_file.name == "00000000000000000100"
    assert (inside.cut_position, inside.cut_end, inside.units_removed) == (60, 100, 2)
    whole = queue.truncation_at(500)
    assert [p.name for p in whole.dropped_files] == ["00000000000000000100"]
    assert whole.cut_file is None and whole.units_removed == 5
    both = queue.truncation_at(250)
    assert both.cut_file.name == "00000000000000000000" and both.cut_position == 60
    assert both.units_removed == 7


def test_a_record_whose_keys_span_two_index_files_is_indexed_whole(tmp_path: Path) -> None:
    """Nine entries per index file and two keys per record: the fifth record's keys straddle
    the first two files. After a crash whose checkpoint kept only the first file, recovery
    rebuilds that file too, so the record is not left with one key (UNIQ_KEY and KEYS)."""
    config = StoreConfig(commitlog_file_size=4096, index_slots=4, index_entries=10)
    root = tmp_path / "s"
    with Store.open_write(root, config, create=True) as store:
        clock = itertools.count(1_700_000_000_000, 1000).__next__  # a second per record
        store.appender(clock=clock, uniq_keys=UniqKeyGenerator()).append_many(
            [Message(topic="T", body=b"x", properties={"KEYS": f"k{n}"}) for n in range(8)]
        )
        dispatcher = Dispatcher(store)
        dispatcher.run()
        dispatcher.close()
    files = read_index_headers(root / "index")
    assert len(files) == 2
    checkpoint = read_checkpoint(root / "checkpoint")
    write_checkpoint(
        root / "checkpoint",
        checkpoint.updated(index_msg_timestamp=files[0][1].end_timestamp),
    )
    (root / "abort").touch()

    plan, result = recovered(root, config)

    assert plan.index_files_rebuilt == 2
    assert result.dispatch.index_records == 8
    assert problems(root, config) == []


def test_an_index_file_that_leads_out_of_the_store_stops_the_plan(tmp_path: Path) -> None:
    """The plan left such a file alone, but the re-dispatch after the cuts then refused to
    write the index through it: recover stopped part way. The plan refuses it now."""
    out = tmp_path / "torn"
    generate("torn-tail", out, FixtureOptions())
    outside = tmp_path / "outside"
    outside.mkdir()
    index_file = next((out / "index").iterdir())
    target = outside / index_file.name
    index_file.rename(target)
    os.symlink(target, index_file)
    with Store.open_write(out) as store, pytest.raises(StoreFormatError) as refused:
        plan_recovery(store)
    assert f"{index_file} is a symbolic link (to {target})" in str(refused.value)


def test_a_missing_commit_log_file_is_a_warning(tmp_path: Path) -> None:
    out = tmp_path / "gap"
    generate("missing-file", out, FixtureOptions())
    with Store.open_write(out) as store:
        plan = plan_recovery(store)
    assert any("missing" in warning for warning in plan.warnings)


def crc_property_store(root: Path, *, last_without_crc: bool) -> list[int]:
    """Five records with the 5.x __CRC32# property (enabledAppendPropCRC); the last one
    either without it or with its born time changed after the CRC was written. Returns the
    offsets. The body CRCs all stay right."""
    with Store.open_write(root, StoreConfig(commitlog_file_size=65536, append_prop_crc=True),
                          create=True) as store:  # fmt: skip
        appender = store.appender(uniq_keys=UniqKeyGenerator())
        offsets = [r.physical_offset for r in appender.append_many(
            [Message(topic="T", body=b"body") for _ in range(4)])]  # fmt: skip
    config = StoreConfig(commitlog_file_size=65536, append_prop_crc=not last_without_crc)
    with Store.open_write(root, config) as store:
        offsets.append(store.appender(uniq_keys=UniqKeyGenerator()).append(
            Message(topic="T", body=b"body")).physical_offset)  # fmt: skip
    if not last_without_crc:
        with open(root / "commitlog" / "00000000000000000000", "r+b") as handle:
            handle.seek(offsets[-1] + 47)  # the last byte of BORNTIMESTAMP
            byte = handle.read(1)[0]
            handle.seek(offsets[-1] + 47)
            handle.write(bytes([byte ^ 1]))
    (root / "abort").touch()
    return offsets


@pytest.mark.parametrize("last_without_crc", [False, True])
def test_forced_property_crc_ends_the_log_at_a_record_it_rejects(
    tmp_path: Path, last_without_crc: bool
) -> None:
    """5.x forceVerifyPropCRC=true: crash recovery treats a record whose __CRC32# does not
    match, or that has none, as the end of the valid log (spec §2.6, §10)."""
    forced = tmp_path / "forced"
    offsets = crc_property_store(forced, last_without_crc=last_without_crc)
    lenient = tmp_path / "lenient"
    crc_property_store(lenient, last_without_crc=last_without_crc)

    config = StoreConfig(force_verify_prop_crc=True)
    plan, _result = recovered(forced, config)
    assert plan.log_end == offsets[-1]
    assert "__CRC32#" in (plan.stopped_by or "")
    with Store.open_read(forced, config) as store:
        assert sum(1 for _ in store.commitlog.scan()) == 4

    plan, _result = recovered(lenient)  # forceVerifyPropCRC=false: the record stays
    assert plan.log_end > offsets[-1]
    with Store.open_read(lenient) as store:
        assert sum(1 for _ in store.commitlog.scan()) == 5


def test_a_truncated_consume_queue_gets_back_what_the_broker_re_dispatches(
    tmp_path: Path,
) -> None:
    """cq-truncated: a restart dispatches from where the consume queues end, so only the
    lost records after that point come back (the manifest says which)."""
    out = tmp_path / "cq"
    manifest = generate("cq-truncated", out, FixtureOptions())
    expected = manifest["expect"]["recovery"]
    plan, _result = recovered(out)
    assert plan.log_end == expected["validEnd"]
    assert queue_maxima(out) == expected["queueMaxOffsets"]
    info = json.loads(run_cli("info", out, "--json").stdout)
    shown = {f"{t['topic']}:{q['queueId']}": q["maxOffset"] for t in info["topics"]
             for q in t["queues"] if q["maxOffset"]}  # fmt: skip
    assert shown == expected["queueMaxOffsets"]  # info's maxima are the consume queues'


def _spoil_delay(log: CommitLog, offset: int) -> None:
    """Make the DELAY (a digit) of the record at ``offset`` a letter, as a flipped bit in a
    record's properties might (the body CRC does not cover them)."""
    segment = log.queue.find(offset)
    data = bytearray(segment.path.read_bytes())
    at = data.index(b"DELAY\x01", offset - segment.start)
    data[at + 6] = ord("x")
    segment.path.write_bytes(data)


def test_a_delay_a_broker_cannot_parse_ends_the_log_where_its_recovery_walks(
    tmp_path: Path,
) -> None:
    """A SCHEDULE_TOPIC_XXXX record whose DELAY is not a number is an invalid record to a
    broker (spec §2.7): in the files its recovery walks, the log ends there, and recover
    cuts it and what follows to quarantine (it kept them, and a broker's start then cut them
    itself, quarantine or not); before those files the record stays, as the broker keeps
    it, and verify reports it only."""
    root = tmp_path / "store"
    config = StoreConfig(commitlog_file_size=4096)
    with Store.open_write(root, config, create=True) as store:
        appender = store.appender()
        for number in range(150):
            sent = Message("T", f"m{number}".encode() * 20)
            if number % 10 == 0:
                sent.properties["DELAY"] = "2"
            appender.append(sent)
        Dispatcher(store).run()
    with Store.open_read(root) as store:
        assert len(store.commitlog.segments) >= 6
        scheduled = [
            offset
            for offset, _header, topic, _props, _crc in store.commitlog.scan()
            if topic == "SCHEDULE_TOPIC_XXXX"
        ]
        end_before = store.log_end().offset
        first_bad = scheduled[-1]  # in the last file holding data, or the one before it
        assert first_bad >= store.commitlog.segments[-3].start > scheduled[0]
        _spoil_delay(store.commitlog, scheduled[0])  # before the files recovery walks
        _spoil_delay(store.commitlog, first_bad)
    spoiled = {path.name: path.read_bytes() for path in (root / "commitlog").iterdir()}
    plan, _result = recovered(root)
    assert plan.log_end == first_bad < end_before
    assert "DELAY='x' is not a number" in (plan.stopped_by or "")
    with Store.open_read(root) as store:
        assert store.log_end().offset == first_bad
        kept = [offset for offset, *_ in store.commitlog.scan()]
        assert kept[0] == 0 and max(kept) < first_bad  # the first file's record stays
        report = verify_store(store)
    invalid = [f for f in report.findings if f.kind == "record-invalid"]
    assert len(invalid) == 1 and invalid[0].commit_log_offset == scheduled[0]
    assert invalid[0].report_only and "does not walk" in invalid[0].message
    # the cut bytes are in quarantine, and a restore brings them back
    (folder,) = (root / "quarantine").iterdir()
    restored = run_cli("quarantine", "restore", root, folder.name, "--yes")
    assert restored.exit_code == 0, restored.stderr
    assert {path.name: path.read_bytes() for path in (root / "commitlog").iterdir()} == spoiled
