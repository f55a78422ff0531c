"""The quarantine keeps every byte it is given: unique places by construction (store-relative
paths), an atomic manifest, and directories made durable before a source byte changes."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from rmqstore.config import StoreConfig
from rmqstore.consumequeue import list_queues
from rmqstore.dispatch import Dispatcher
from rmqstore.errors import StoreFormatError, StoreIOError
from rmqstore.msgid import UniqKeyGenerator
from rmqstore.quarantine import Quarantine
from rmqstore.record import Message
from rmqstore.recovery import apply_recovery, plan_recovery
from rmqstore.store import Store

from support import small_filesystem

CONFIG = StoreConfig(
    commitlog_file_size=64 * 1024, consumequeue_file_size=40, index_slots=8, index_entries=32
)


def two_topics_with_a_torn_tail(root: Path) -> int:
    """Topics A and B, both with queue 0 and four 2-unit consume-queue files (7 units each);
    then the log loses its last four records (as if never written) while the queues keep
    pointing at them. Returns the new end of the log."""
    with Store.open_write(root, CONFIG, create=True) as store:
        appender = store.appender(uniq_keys=UniqKeyGenerator())
        results = appender.append_many(
            [Message(topic="AB"[n % 2], body=b"x" * 50) for n in range(14)]
        )
        dispatcher = Dispatcher(store)
        dispatcher.run()
        dispatcher.close()
    cut = results[-4].physical_offset
    segment = root / "commitlog" / "00000000000000000000"
    with open(segment, "r+b") as handle:
        handle.seek(cut)
        handle.write(bytes(results[-1].physical_offset + results[-1].store_size - cut))
    (root / "abort").touch()
    return cut


def test_same_named_queue_files_of_two_topics_are_both_kept(tmp_path: Path) -> None:
    root = tmp_path / "s"
    end = two_topics_with_a_torn_tail(root)
    originals = {p: p.read_bytes() for p in (root / "consumequeue").rglob("*") if p.is_file()}
    assert {q for q in list_queues(root / "consumequeue")} == {("A", 0), ("B", 0)}

    with Store.open_write(root, CONFIG) as store:
        plan = plan_recovery(store)
        result = apply_recovery(store, plan)

    assert plan.log_end == end
    moved = [m.path for m in plan.moves if "consumequeue" in m.path.parts]
    cut = [c.path for c in plan.cuts if "consumequeue" in c.path.parts]
    # both topics lose a whole file of the same name, and both are cut in another one
    assert sorted(str(p.relative_to(root)) for p in moved) == [
        "consumequeue/A/0/00000000000000000120",
        "consumequeue/B/0/00000000000000000120",
    ]
    assert sorted(p.name for p in cut) == ["00000000000000000080"] * 2
    assert result.quarantine is not None
    manifest = json.loads((result.quarantine / "manifest.json").read_text())
    pieces = [piece for piece in manifest["pieces"] if not {"made", "copied"} & set(piece)]
    assert len(pieces) == len(plan.cuts) + len(plan.moves)
    made = [piece["made"] for piece in manifest["pieces"] if "made" in piece]
    # the checkpoint and abort (kept as they were: a restore gives them back), the queue files
    # moved, which the replay may make again (and the temporary names they are made under),
    # and the index files recover rebuilt
    assert made[:2] == ["checkpoint", "abort"]
    again = [
        str(p.relative_to(root))
        for path in moved
        for p in (path.with_name(f".{path.name}.creating"), path)
    ]
    assert made[2:6] == again
    assert made[6:] and all((root / path).parent == root / "index" for path in made[6:])
    kept = [piece["moved"] for piece in manifest["pieces"] if "copied" in piece]
    assert kept == ["checkpoint", "abort"]  # abort: the store was recovered after a crash
    places = [piece.get("copy") or piece["moved"] for piece in pieces]
    assert len(set(places)) == len(places)  # no piece overwrote another
    for piece in pieces:
        source = Path(piece["file"])
        if source not in originals:
            continue
        saved = (result.quarantine / (piece.get("copy") or piece["moved"])).read_bytes()
        if "copy" in piece:
            assert saved == originals[source][piece["start"] : piece["end"]]
        else:
            assert saved == originals[source]
            assert not source.exists()
    assert not list(result.quarantine.glob(".manifest.json*"))  # no temporary left


def test_pieces_keep_their_store_relative_place(tmp_path: Path) -> None:
    root = tmp_path / "s"
    (root / "consumequeue" / "A" / "0").mkdir(parents=True)
    (root / "consumequeue" / "B" / "0").mkdir(parents=True)
    for topic in "AB":
        (root / "consumequeue" / topic / "0" / "00000000000000000000").write_bytes(
            topic.encode() * 40
        )
    quarantine = Quarantine.create(root, "test")
    a = quarantine.cut_region(
        root / "consumequeue" / "A" / "0" / "00000000000000000000", 20, 40, "a"
    )
    b = quarantine.move_path(root / "consumequeue" / "B" / "0" / "00000000000000000000", "b")
    assert a == quarantine.directory / "consumequeue/A/0/00000000000000000000.20-40.bin"
    assert a.read_bytes() == b"A" * 20
    assert b == quarantine.directory / "consumequeue/B/0/00000000000000000000"
    assert b.read_bytes() == b"B" * 40
    # the same place asked for twice in one operation gets a second name
    (root / "consumequeue" / "B" / "0" / "00000000000000000000").write_bytes(b"again")
    again = quarantine.move_path(root / "consumequeue" / "B" / "0" / "00000000000000000000", "c")
    assert again != b and again.read_bytes() == b"again" and b.read_bytes() == b"B" * 40
    # the manifest, built from each piece's text serialized once, is what json.dumps writes
    written = (quarantine.directory / "manifest.json").read_text(encoding="utf-8")
    document = {"operation": "test", "pieces": quarantine.pieces}
    assert written == json.dumps(document, indent=2) + "\n" and len(quarantine.pieces) == 3


def test_directories_are_durable_before_a_source_byte_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every directory made for the copy, and the quarantine folders themselves, are fsynced
    in their parents before the source is zeroed."""
    root = tmp_path / "s"
    source = root / "consumequeue" / "A" / "0" / "00000000000000000000"
    source.parent.mkdir(parents=True)
    source.write_bytes(b"z" * 40)
    events: list[tuple[str, str]] = []
    import rmqstore.quarantine as quarantine_module
    import rmqstore.segments as segments_module

    real_fsync_directory = segments_module.fsync_directory
    real_pwrite = os.pwrite

    def recording_fsync_directory(directory: Path) -> None:
        events.append(("fsync-dir", str(Path(directory).relative_to(tmp_path))))
        real_fsync_directory(directory)

    def recording_pwrite(fd: int, data: bytes, offset: int) -> int:
        events.append(("pwrite", os.readlink(f"/proc/self/fd/{fd}")))
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(segments_module, "fsync_directory", recording_fsync_directory)
    monkeypatch.setattr(quarantine_module, "fsync_directory", recording_fsync_directory)
    monkeypatch.setattr(quarantine_module.os, "pwrite", recording_pwrite)

    quarantine = Quarantine.create(root, "cut")
    quarantine.cut_region(source, 20, 40, "test")

    first_write = events.index(("pwrite", str(source)))
    synced = {name for kind, name in events[:first_write] if kind == "fsync-dir"}
    folder = str(quarantine.directory.relative_to(tmp_path))
    assert {
        "s",  # quarantine/ made in the store root
        "s/quarantine",  # the operation's folder
        folder,
        f"{folder}/consumequeue",
        f"{folder}/consumequeue/A",
        f"{folder}/consumequeue/A/0",  # the copy and the manifest
    } <= synced


def test_a_quarantine_that_is_a_link_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "s"
    root.mkdir()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (root / "quarantine").symlink_to(outside)
    with pytest.raises(StoreFormatError, match="symbolic link"):
        Quarantine.create(root, "recover")
    assert not any(outside.iterdir())


def test_a_range_past_the_end_of_its_file_is_not_cut(tmp_path: Path) -> None:
    """The copy must hold every byte that is cut: a source that ends first is refused, the
    source left as it was and no piece recorded."""
    root = tmp_path / "s"
    root.mkdir()
    source = root / "data"
    source.write_bytes(b"abc" * 100)
    quarantine = Quarantine.create(root, "recover")
    with pytest.raises(StoreFormatError, match="ends at byte 300, before the bytes 200-400"):
        quarantine.cut_region(source, 200, 400, "past the end")
    assert source.read_bytes() == b"abc" * 100 and quarantine.pieces == []


def test_a_quarantine_copy_on_a_full_disk_cuts_nothing(tmp_path: Path) -> None:
    with small_filesystem(tmp_path, "1m") as disk:
        root = disk / "s"
        root.mkdir()
        source = root / "data"
        source.write_bytes(os.urandom(600_000))
        kept = source.read_bytes()
        quarantine = Quarantine.create(root, "recover")
        with pytest.raises(StoreIOError, match="No space left"):
            quarantine.cut_region(source, 0, 600_000, "more than the disk has room for")
        assert source.read_bytes() == kept and quarantine.pieces == []


def test_a_kept_copy_a_kill_left_unfinished_is_passed_over_by_the_restore(tmp_path: Path) -> None:
    """The checkpoint and abort are listed before they are copied, under a name a restore
    passes over until the copy is renamed into place: a kill in between leaves a folder whose
    restore changes nothing in the store (the file is still the one being copied) and
    removes the folder; a finished copy goes back in place of what the operation wrote."""
    from rmqstore.fixtures import generate
    from rmqstore.quarantine import restore_quarantine

    for finished in (False, True):
        root = tmp_path / f"store-{finished}"
        generate("torn-tail", root)
        original = (root / "checkpoint").read_bytes()
        with Store.open_write(root) as store:
            quarantine = Quarantine.create(root, "recover")
            store.keep_state(quarantine)
        kept = quarantine.directory / "checkpoint"
        assert kept.read_bytes() == original and (quarantine.directory / "abort").exists()
        if not finished:  # as a kill before the renames leaves it
            kept.rename(quarantine.directory / ".checkpoint.copying")
            (quarantine.directory / "abort").unlink()
        (root / "checkpoint").write_bytes(bytes(len(original)))  # what the operation wrote
        outcome = restore_quarantine(root, quarantine.directory.name)
        assert not quarantine.directory.exists()
        expected = original if finished else bytes(len(original))
        assert (root / "checkpoint").read_bytes() == expected
        assert (root / "abort").exists()
        assert [step.kind for step in outcome.steps].count("move back") == (2 if finished else 0)


def test_moves_listed_later_are_in_the_manifest_by_the_next_listing(tmp_path: Path) -> None:
    """Moves made with ``list_later`` wait (at most 256 of them) until a piece is listed at
    once or :meth:`Quarantine.list_pending`; a restore finds those not listed yet by their
    paths, so none is lost in between."""
    from rmqstore.quarantine import _PENDING_PIECES, restore_quarantine

    root = tmp_path / "store"
    (root / "commitlog").mkdir(parents=True)
    files = []
    for number in range(_PENDING_PIECES + 10):
        path = root / "consumequeue" / f"T{number}" / "0" / "00000000000000000000"
        path.parent.mkdir(parents=True)
        path.write_bytes(number.to_bytes(20, "big"))
        files.append(path)
    quarantine = Quarantine.create(root, "recover")

    def listed() -> list[str]:
        manifest = json.loads((quarantine.directory / "manifest.json").read_text())
        return [piece["file"] for piece in manifest["pieces"]]

    quarantine.save_region(files[0], 0, 20, "listed at once")
    for path in files[1:5]:
        quarantine.move_path(path, "moved", list_later=True)
    assert listed() == [str(files[0])]  # not yet
    restored_early = tmp_path / "early"
    shutil.copytree(root, restored_early)  # as a kill here leaves the store
    quarantine.list_pending()
    assert listed() == [str(path) for path in files[:5]]
    for path in files[5:]:
        quarantine.move_path(path, "moved", list_later=True)
    assert len(listed()) >= len(files) - _PENDING_PIECES  # never more than that many wait
    quarantine.list_pending()
    assert listed() == [str(path) for path in files]
    early = restore_quarantine(restored_early, quarantine.directory.name)
    assert [step.kind for step in early.steps] == ["move back"] * 4  # (the copy: in place)
    for number, path in enumerate(files[1:5], start=1):
        again = restored_early / path.relative_to(root)
        assert again.read_bytes() == number.to_bytes(20, "big")


def test_a_folder_is_born_with_its_manifest_so_a_kill_before_the_first_listing_restores(
    tmp_path: Path,
) -> None:
    """The campaign killed a ``dispatch --rebuild`` after it had made its quarantine folder
    and moved the consume queues there, before the first manifest was written: the restore
    refused the folder ("no readable manifest.json"), and the queues stayed in it. A folder
    now appears under its name only with a manifest in it (made under a hidden name, then
    renamed), so the moves not yet listed go back by their paths; a hidden folder a kill
    left half made (a manifest and nothing else) is removed by the next operation."""
    from rmqstore.fixtures import generate
    from rmqstore.quarantine import list_quarantine, restore_quarantine

    from support import tree_digest

    store = tmp_path / "store"
    generate("basic", store)
    before = tree_digest(store)
    folder = Quarantine.create(store, "dispatch-rebuild")
    assert json.loads((folder.directory / "manifest.json").read_text())["pieces"] == []
    folder.move_path(store / "consumequeue", "the old queues", list_later=True)
    # a kill here: the move is not listed yet
    (listed,) = list_quarantine(store)
    assert listed.manifest_ok
    restore_quarantine(store, folder.directory.name)
    assert tree_digest(store) == before
    half = store / "quarantine" / ".20990101T000000-recover.creating"
    half.mkdir()
    (half / "manifest.json").write_text('{"operation": "recover", "pieces": []}')
    kept = store / "quarantine" / ".other.creating"  # not one rmqstore leaves: stays
    kept.mkdir()
    (kept / "data.bin").write_bytes(b"x")
    Quarantine.create(store, "recover")
    assert not half.exists() and (kept / "data.bin").exists()


def test_a_kept_copy_leaves_the_holes_of_a_sparse_file_as_holes(tmp_path: Path) -> None:
    """A copy the quarantine keeps (the last index file a recovery adds to, files moved
    across filesystems) has the file's bytes, and its holes stay holes: an index file of the
    broker's default geometry is 420 MB, mostly never written."""
    from rmqstore.quarantine import _durable_copy

    source = tmp_path / "sparse"
    with open(source, "wb") as handle:
        handle.write(b"head")
        handle.seek(64 << 20)
        handle.write(b"middle")
        handle.truncate(200 << 20)  # a hole to the end
    for target in (tmp_path / "copy", tmp_path / "tree"):
        if target.name == "tree":
            folder = tmp_path / "folder"
            folder.mkdir()
            os.link(source, folder / "sparse")
            _durable_copy(folder, target)
            copied = target / "sparse"
        else:
            _durable_copy(source, target)
            copied = target
        assert copied.stat().st_size == source.stat().st_size
        with open(copied, "rb") as handle:
            assert handle.read(4) == b"head"
            handle.seek(64 << 20)
            assert handle.read(6) == b"middle"
            handle.seek(100 << 20)
            assert handle.read(1 << 20) == bytes(1 << 20)
        assert copied.stat().st_blocks * 512 < 8 << 20  # not 200 MB of zeros written
