"""``rmqstore quarantine list|purge``: the folders of cut bytes, with their sizes; purging
takes the lock, asks first, and never leaves the store's quarantine folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rmqstore.fixtures import FixtureOptions, generate
from rmqstore.quarantine import Quarantine, plan_restore

from support import lock_held_elsewhere, run_cli, tree_digest

pytestmark = pytest.mark.plumbing


def recovered(tmp_path: Path) -> Path:
    store = tmp_path / "store"
    generate("torn-tail", store)
    assert run_cli("recover", store, "--yes").exit_code == 0
    return store


def test_list_and_purge(tmp_path: Path) -> None:
    store = recovered(tmp_path)
    listed = json.loads(run_cli("quarantine", "list", store, "--json").stdout)
    (folder,) = listed["folders"]
    assert folder["operation"] == "recover" and folder["manifestOk"] and folder["pieces"] >= 1
    on_disk = sum(p.stat().st_size for p in (store / "quarantine").rglob("*") if p.is_file())
    assert folder["bytes"] == listed["bytes"] == on_disk
    human = run_cli("quarantine", "list", store)
    assert folder["name"] in human.stdout
    dry = run_cli("quarantine", "purge", store, "--all", "--dry-run")
    assert dry.exit_code == 1 and (store / "quarantine" / folder["name"]).is_dir()
    refused = run_cli("quarantine", "purge", store, folder["name"])  # no terminal, no --yes
    assert refused.exit_code == 2 and "--yes" in refused.stderr
    with lock_held_elsewhere(store / "lock"):
        busy = run_cli("quarantine", "purge", store, folder["name"], "--yes")
        assert busy.exit_code == 3
    done = run_cli("quarantine", "purge", store, folder["name"], "--yes", "--json")
    assert done.exit_code == 0 and json.loads(done.stdout)["bytes"] == on_disk
    assert not (store / "quarantine" / folder["name"]).exists()
    assert json.loads(run_cli("quarantine", "list", store, "--json").stdout)["folders"] == []


def test_a_name_given_twice_is_purged_once(tmp_path: Path) -> None:
    """It was deleted, then the second delete failed: exit 4, "cannot delete", with the
    work done."""
    store = recovered(tmp_path)
    (folder,) = json.loads(run_cli("quarantine", "list", store, "--json").stdout)["folders"]
    name = folder["name"]
    dry = run_cli("quarantine", "purge", store, name, name, "--dry-run", "--json")
    assert dry.exit_code == 1 and json.loads(dry.stdout)["wouldPurge"] == [name]
    assert json.loads(dry.stdout)["bytes"] == folder["bytes"]
    done = run_cli("quarantine", "purge", store, name, name, "--yes", "--json")
    assert done.exit_code == 0, done.stderr
    assert json.loads(done.stdout) == {"purged": [name], "bytes": folder["bytes"]}
    assert not (store / "quarantine" / name).exists()


def test_names_outside_the_quarantine_and_links_are_refused(tmp_path: Path) -> None:
    store = recovered(tmp_path)
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "keep").write_text("x")
    for name in ("../precious", "..", "commitlog", "nope"):
        result = run_cli("quarantine", "purge", store, name, "--yes")
        assert result.exit_code == 2, (name, result.stderr)
        # the dry run says so too (it said "would delete 1 folder", exit 1)
        dry = run_cli("quarantine", "purge", store, name, "--dry-run")
        assert dry.exit_code == 2 and f"no quarantine folder {name} in" in dry.stderr
    assert (outside / "keep").exists() and (store / "commitlog").is_dir()
    other = tmp_path / "other"
    generate("basic", other)
    (other / "quarantine").symlink_to(outside)
    linked = run_cli("quarantine", "list", other)
    assert linked.exit_code == 2 and "symbolic link" in linked.stderr
    assert run_cli("quarantine", "purge", other, "--all", "--yes").exit_code == 2
    assert (outside / "keep").exists()
    usage = run_cli("quarantine", "purge", store)
    assert usage.exit_code == 2 and "--all" in usage.stderr


def test_restore_puts_the_store_back_as_it_was_before_the_cut(tmp_path: Path) -> None:
    store = tmp_path / "store"
    generate("torn-tail", store)
    before = tree_digest(store)
    assert run_cli("recover", store, "--yes").exit_code == 0
    (folder,) = json.loads(run_cli("quarantine", "list", store, "--json").stdout)["folders"]
    dry = run_cli("quarantine", "restore", store, folder["name"], "--dry-run", "--json")
    assert dry.exit_code == 1 and json.loads(dry.stdout)["wouldRestore"]
    restored = run_cli("quarantine", "restore", store, folder["name"], "--yes", "--json")
    assert restored.exit_code == 0, restored.stderr
    document = json.loads(restored.stdout)
    after = tree_digest(store)
    # every cut byte range and moved file is back, the checkpoint and 'abort' as they were
    # (a broker's start recovers the torn tail again), and the index files and checkpoint
    # recover made are set aside in a folder of their own
    assert "abort" in before and "checkpoint" in before
    assert {k: v for k, v in after.items() if not k.startswith("quarantine/")} == before
    assert [step["kind"] for step in document["restored"]].count("set aside") >= 1
    aside = Path(document["setAsideIn"])
    assert aside.parent == store / "quarantine" and aside.name.endswith("-restore")
    assert not (store / "quarantine" / folder["name"]).exists()


def test_a_restore_gives_back_the_checkpoint_and_no_abort_of_a_store_closed_cleanly(
    tmp_path: Path,
) -> None:
    """A store closed cleanly (no abort) with junk after its log's end: recover cuts it and
    writes the checkpoint; its restore puts the junk and the old checkpoint back and
    leaves no abort, as before. A recovery that stopped part-way leaves abort (a writer's
    mark): its restore sets that aside too."""
    store = tmp_path / "store"
    generate("garbage-after-end", store)
    (store / "abort").unlink()
    before = tree_digest(store)
    assert run_cli("recover", store, "--yes").exit_code == 0
    (folder,) = json.loads(run_cli("quarantine", "list", store, "--json").stdout)["folders"]
    (store / "abort").touch()  # as a recovery stopped part-way leaves it
    restored = run_cli("quarantine", "restore", store, folder["name"], "--yes", "--json")
    assert restored.exit_code == 0, restored.stderr
    after = tree_digest(store)
    assert {k: v for k, v in after.items() if not k.startswith("quarantine/")} == before
    aside = Path(json.loads(restored.stdout)["setAsideIn"])
    assert (aside / "abort").exists() and (aside / "checkpoint").exists()


def test_a_rebuild_is_undone_by_its_restore_and_that_restore_by_its_own(tmp_path: Path) -> None:
    """``dispatch --rebuild`` moves the consume queues and index to quarantine and makes new
    ones in their places: its restore sets the new ones aside (into a folder of operation
    restore) and moves the old ones back; restoring that folder swaps them again. Nothing
    is deleted either way (the restore used to be refused: the places were taken)."""
    store = tmp_path / "store"
    generate("multi", store)
    (store / "consumequeue" / "TopicTest" / "0" / "00000000000000000000").write_bytes(b"\0" * 20)
    original = tree_digest(store)
    assert run_cli("dispatch", store, "--rebuild", "--yes").exit_code == 0
    rebuilt = tree_digest(store)
    (folder,) = json.loads(run_cli("quarantine", "list", store, "--json").stdout)["folders"]
    # the consume queues, the index and a copy of the checkpoint; what it made is not one
    assert folder["pieces"] == 3
    dry = run_cli("quarantine", "restore", store, folder["name"], "--dry-run")
    assert dry.exit_code == 1 and f"would set aside {store / 'consumequeue'}" in dry.stderr

    def outside_quarantine(digest: dict[str, str]) -> dict[str, str]:
        return {k: v for k, v in digest.items() if not k.startswith("quarantine/")}

    restored = run_cli("quarantine", "restore", store, folder["name"], "--yes")
    assert restored.exit_code == 0, restored.stderr
    assert "set aside 3 paths the operation made, then put 3 pieces back" in restored.stderr
    assert outside_quarantine(tree_digest(store)) == outside_quarantine(original)
    (aside,) = json.loads(run_cli("quarantine", "list", store, "--json").stdout)["folders"]
    assert aside["operation"] == "restore" and aside["pieces"] == 3
    again = run_cli("quarantine", "restore", store, aside["name"], "--yes")
    assert again.exit_code == 0, again.stderr
    assert outside_quarantine(tree_digest(store)) == outside_quarantine(rebuilt)
    assert run_cli("verify", store).exit_code == 0


def test_a_topic_rebuild_s_restore_sets_aside_the_queues_it_made_where_there_were_none(
    tmp_path: Path,
) -> None:
    """``dispatch --rebuild --topic T`` for a topic whose queues were lost: it makes them,
    and its restore (of the index it moved) sets them aside, as they were not there."""
    store = tmp_path / "store"
    generate("multi", store)
    shutil.rmtree(store / "consumequeue" / "TopicTest")
    original = tree_digest(store)
    rebuilt = run_cli("dispatch", store, "--rebuild", "--topic", "TopicTest", "--yes")
    assert rebuilt.exit_code == 0, rebuilt.stderr
    assert (store / "consumequeue" / "TopicTest").is_dir()
    (folder,) = json.loads(run_cli("quarantine", "list", store, "--json").stdout)["folders"]
    restored = run_cli("quarantine", "restore", store, folder["name"], "--yes")
    assert restored.exit_code == 0, restored.stderr
    after = tree_digest(store)
    assert {k: v for k, v in after.items() if not k.startswith("quarantine/")} == original
    (aside,) = json.loads(run_cli("quarantine", "list", store, "--json").stdout)["folders"]
    assert (store / "quarantine" / aside["name"] / "consumequeue" / "TopicTest").is_dir()


def test_a_restore_killed_after_setting_aside_finishes_when_run_again(tmp_path: Path) -> None:
    """The states a kill can leave a restore of a rebuild in: what the rebuild made set aside
    (all of it or part), and some pieces moved back. Run again, the restore finishes, and
    never sets aside a piece it has already moved back."""
    for stop_after in range(1, 4):  # steps done: set aside 1, set aside 2, moved back 1
        store = tmp_path / f"store-{stop_after}"
        generate("basic", store)
        original = tree_digest(store)
        assert run_cli("dispatch", store, "--rebuild", "--yes").exit_code == 0
        (folder,) = json.loads(run_cli("quarantine", "list", store, "--json").stdout)["folders"]
        steps = plan_restore(store, folder["name"])
        assert [step.kind for step in steps] == ["set aside"] * 3 + ["move back"] * 3
        kept = Quarantine.create(store, "restore")
        for step in steps[:stop_after]:
            if step.kind == "set aside":
                kept.move_path(step.target, "set aside")
            else:
                step.piece.rename(step.target)
        finished = run_cli("quarantine", "restore", store, folder["name"], "--yes", "--json")
        assert finished.exit_code == 0, (stop_after, finished.stderr)
        after = tree_digest(store)
        for path in ("consumequeue/", "index/", "commitlog/"):
            assert {k: v for k, v in after.items() if k.startswith(path)} == {
                k: v for k, v in original.items() if k.startswith(path)
            }, (stop_after, path)
        assert not (store / "quarantine" / folder["name"]).exists()


def test_a_made_path_a_restore_may_not_set_aside_is_refused(tmp_path: Path) -> None:
    store = tmp_path / "store"
    generate("basic", store)
    before = tree_digest(store)
    for number, place in enumerate(["lock", "quarantine", "../x", "/etc", "", "index/../.."]):
        folder = store / "quarantine" / f"20240101T00000{number}-recover"
        folder.mkdir(parents=True)
        (folder / "manifest.json").write_text(json.dumps({"pieces": [{"made": place}]}))
        result = run_cli("quarantine", "restore", store, folder.name, "--yes")
        assert result.exit_code == 2, (place, result.stderr)
    after = tree_digest(store)
    assert {k: v for k, v in after.items() if not k.startswith("quarantine/")} == before


def test_a_folder_put_back_in_full_but_not_yet_deleted_is_not_listed(tmp_path: Path) -> None:
    """A restore renames the folder it has put back out of the list before deleting it, so a
    kill while deleting leaves no folder without its manifest that ``restore`` would refuse
    and ``list`` would show; the next restore or purge deletes what is left."""
    store = recovered(tmp_path)
    (folder,) = json.loads(run_cli("quarantine", "list", store, "--json").stdout)["folders"]
    leftover = store / "quarantine" / f".{folder['name']}.restored"
    (leftover / "consumequeue").mkdir(parents=True)
    (leftover / "consumequeue" / "piece.0-20.bin").write_bytes(b"x" * 20)
    listed = json.loads(run_cli("quarantine", "list", store, "--json").stdout)["folders"]
    assert [entry["name"] for entry in listed] == [folder["name"]]
    assert run_cli("quarantine", "restore", store, folder["name"], "--yes").exit_code == 0
    assert not leftover.exists()
    left = json.loads(run_cli("quarantine", "list", store, "--json").stdout)["folders"]
    assert all(entry["operation"] == "restore" for entry in left)  # what recover rebuilt


def test_restore_refuses_a_place_that_is_taken(tmp_path: Path) -> None:
    store = recovered(tmp_path)
    (folder,) = json.loads(run_cli("quarantine", "list", store, "--json").stdout)["folders"]
    assert run_cli("append", store, "--topic", "T", "--body", "new").exit_code == 0
    refused = run_cli("quarantine", "restore", store, folder["name"], "--yes")
    assert refused.exit_code == 2 and "written since" in refused.stderr
    assert (store / "quarantine" / folder["name"]).is_dir()


def test_a_manifest_naming_places_outside_the_store_is_refused(tmp_path: Path) -> None:
    store = tmp_path / "store"
    generate("basic", store)
    for number, place in enumerate(["../../outside", "/etc/passwd", "external/x", "index/../.."]):
        folder = store / "quarantine" / f"20240101T00000{number}-recover"
        folder.mkdir(parents=True)
        (folder / "manifest.json").write_text(json.dumps({"pieces": [{"moved": place}]}))
        result = run_cli("quarantine", "restore", store, folder.name, "--yes")
        assert result.exit_code == 2, (place, result.stderr)
    assert (store / "commitlog").is_dir()


def test_a_restore_that_stopped_part_way_finishes_when_run_again(tmp_path: Path) -> None:
    """A restore that stopped after some pieces (a full disk, a kill) left the folder: run
    again, it leaves out the pieces already back and puts the rest back."""
    store = tmp_path / "store"
    generate("torn-tail", store)
    before = tree_digest(store)
    assert run_cli("recover", store, "--yes").exit_code == 0
    (folder,) = json.loads(run_cli("quarantine", "list", store, "--json").stdout)["folders"]
    steps = plan_restore(store, folder["name"])
    kinds = [step.kind for step in steps]
    assert "write back" in kinds and "move back" in kinds
    made = {step.target for step in steps if step.kind == "set aside"}
    moved = next(step for step in steps if step.kind == "move back" and step.target not in made)
    done = [steps[kinds.index("write back")], moved]
    for step in done:  # as the stopped restore left them
        if step.kind == "move back":
            step.piece.rename(step.target)
        else:
            with open(step.target, "r+b") as target:
                target.seek(step.start)
                target.write(step.piece.read_bytes())
    again = run_cli("quarantine", "restore", store, folder["name"], "--dry-run", "--json")
    assert len(json.loads(again.stdout)["wouldRestore"]) == len(steps) - 2
    finished = run_cli("quarantine", "restore", store, folder["name"], "--yes", "--json")
    assert finished.exit_code == 0, finished.stderr
    assert len(json.loads(finished.stdout)["restored"]) == len(steps) - 2
    after = tree_digest(store)
    assert {k: after.get(k) for k in before if k.startswith("commitlog/")} == {
        k: v for k, v in before.items() if k.startswith("commitlog/")
    }
    assert not (store / "quarantine" / folder["name"]).exists()


def test_a_damaged_or_missing_piece_is_refused_before_anything_goes_back(
    tmp_path: Path,
) -> None:
    for damage in ("short", "missing"):
        store = recovered(tmp_path / damage)
        (folder,) = json.loads(run_cli("quarantine", "list", store, "--json").stdout)["folders"]
        manifest = json.loads((store / "quarantine" / folder["name"] / "manifest.json").read_text())
        cut = next(p for p in manifest["pieces"] if "copy" in p)
        # (not a copy of a file the recovery rewrote: with that gone, the one in its place
        # is taken for the piece moved back by a restore that stopped part-way)
        moved = next(p for p in manifest["pieces"] if "moved" in p and "copied" not in p)
        folder_path = store / "quarantine" / folder["name"]
        if damage == "short":  # a range copy of fewer bytes than were cut
            piece = folder_path / cut["copy"]
            piece.write_bytes(piece.read_bytes()[:-1])
            expected = "is not the"
        else:
            (folder_path / moved["moved"]).unlink()
            expected = "is missing from its quarantine folder"
        before = tree_digest(store)
        refused = run_cli("quarantine", "restore", store, folder["name"], "--yes")
        assert refused.exit_code == 2 and expected in refused.stderr, refused.stderr
        assert tree_digest(store) == before


def test_a_piece_moved_but_not_yet_listed_goes_back_too(tmp_path: Path) -> None:
    """A kill between moving a piece into quarantine and listing it in the manifest leaves a
    piece the manifest does not name: restore puts it back by its path (it used to delete it
    with the folder)."""
    store = tmp_path / "store"
    generate("torn-tail", store)
    before = tree_digest(store)
    assert run_cli("recover", store, "--yes").exit_code == 0
    (folder,) = json.loads(run_cli("quarantine", "list", store, "--json").stdout)["folders"]
    manifest_path = store / "quarantine" / folder["name"] / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    unlisted = [piece for piece in manifest["pieces"] if "moved" in piece][-1]
    manifest["pieces"].remove(unlisted)
    manifest_path.write_text(json.dumps(manifest))
    restored = run_cli("quarantine", "restore", store, folder["name"], "--yes", "--json")
    assert restored.exit_code == 0, restored.stderr
    targets = [step["target"] for step in json.loads(restored.stdout)["restored"]]
    assert str(store / unlisted["moved"]) in targets
    after = tree_digest(store)
    assert after[unlisted["moved"]] == before[unlisted["moved"]]
    assert not (store / "quarantine" / folder["name"]).exists()


@pytest.mark.parametrize(
    ("scenario", "command"),
    [("torn-tail", ["recover", "--yes"]), ("multi", ["dispatch", "--rebuild", "--yes"])],
)
def test_a_repair_keeps_the_store_state_before_it_makes_abort(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scenario: str, command: list[str]
) -> None:
    """A repair makes 'abort' (the store is being written) only once its quarantine folder
    keeps the checkpoint and abort as they were: killed between the two (found by the crash
    campaign under load), a rebuild left an 'abort' that no folder's restore removed."""
    from rmqstore.store import Store

    store = tmp_path / "store"
    generate(scenario, store)
    (store / "abort").unlink(missing_ok=True)
    seen: list[list[str]] = []
    begin_write = Store.begin_write

    def watched(self: Store) -> None:
        seen.append(
            [str(path.relative_to(store)) for path in (store / "quarantine").glob("*/*")]
            if (store / "quarantine").is_dir()
            else []
        )
        begin_write(self)

    monkeypatch.setattr(Store, "begin_write", watched)
    result = run_cli(command[0], store, *command[1:])
    assert result.exit_code in (0, 1), result.stderr
    assert seen and all(any(name.endswith("manifest.json") for name in kept) for kept in seen)
    (folder,) = (store / "quarantine").iterdir()
    manifest = json.loads((folder / "manifest.json").read_text())
    assert "abort" in json.dumps(manifest)


def test_the_restore_of_a_recovery_gives_back_the_index_file_its_dispatch_added_to(
    oracle, tmp_path: Path
) -> None:
    """A real 4.9.8 crash store without its ``abort`` (recovered as a cleanly closed store)
    whose index is behind the log: recover moves a file after the valid end to quarantine and
    its dispatch adds entries to the last index file in place. The restore used to leave that
    file as the recovery left it (found by the mutants campaign, seed 20261205); the folder now
    keeps a copy of it, and the restore gives back every byte."""
    from support import ORACLE_OPTIONS

    store = oracle("s2_crash").copy_to(tmp_path)
    (store / "abort").unlink()
    before = tree_digest(store)
    result = run_cli("recover", store, "--yes", *ORACLE_OPTIONS)
    assert result.exit_code == 0, result.stderr
    assert "index           750 entries added" in result.stdout
    recovered_store = tree_digest(store)
    index_keys = [key for key in before if key.startswith("index/")]
    assert index_keys and any(recovered_store[key] != before[key] for key in index_keys)
    (folder,) = [path.name for path in (store / "quarantine").iterdir()]
    result = run_cli("quarantine", "restore", store, folder, "--yes")
    assert result.exit_code == 0, result.stderr
    after = tree_digest(store)
    for key, digest in before.items():
        if not key.startswith("consumequeue/"):  # (units dispatched after a queue's end stay)
            assert after.get(key) == digest, key


def test_the_restore_of_a_recovery_whose_replay_made_a_moved_queue_file_again(
    oracle, tmp_path: Path
) -> None:
    """A unit zeroed in the first file of a queue of a real 4.9.8 crash store: recover moves
    the queue's next file (after a unit that is not valid) to quarantine, and its replay
    makes that file again under the same name. The restore refused ("exists again; restoring
    would replace it"; found by the mutants campaign, seed 77); the recovery now lists the
    file as made, and the restore sets it aside and puts the moved one back."""
    from support import ORACLE_OPTIONS

    store = oracle("s2_crash").copy_to(tmp_path)
    queues = sorted(store.glob("consumequeue/*/*"))
    first, second = next(sorted(q.iterdir())[:2] for q in queues if len(list(q.iterdir())) > 1)
    with first.open("r+b") as units:
        units.seek(20 * 67)
        units.write(bytes(20))
    before = tree_digest(store)
    result = run_cli("recover", store, "--yes", *ORACLE_OPTIONS)
    assert result.exit_code in (0, 1), result.stderr
    relative = str(second.relative_to(store))
    (folder,) = [path.name for path in (store / "quarantine").glob("*-recover")]
    assert (store / "quarantine" / folder / relative).exists() and second.exists()
    made_again = second.read_bytes()
    result = run_cli("quarantine", "restore", store, folder, "--yes", "--json")
    assert result.exit_code == 0, result.stderr
    after = tree_digest(store)
    assert after[relative] == before[relative]
    for key, digest in before.items():
        if not key.startswith("consumequeue/"):  # (units dispatched after a queue's end stay)
            assert after.get(key) == digest, key
    aside = Path(json.loads(result.stdout)["setAsideIn"])
    assert (aside / relative).read_bytes() == made_again


def test_a_recovery_keeps_no_copy_of_an_index_file_it_does_not_add_to(tmp_path: Path) -> None:
    """Junk after the valid end of a store whose index holds every record: recover cuts the
    junk and adds nothing to the index, so its folder keeps the junk and the checkpoint but
    no copy of the last index file (with the default geometry one of 420 MB, copied for
    nothing); the restore still gives back every byte."""
    store = tmp_path / "store"
    generate("basic", store, FixtureOptions())
    end = json.loads((store / "fixture.json").read_text())["commitLog"]["maxOffset"]
    with (store / "commitlog" / ("0" * 20)).open("r+b") as log:
        log.seek(end + 50)
        log.write(b"\x07" * 64)
    before = tree_digest(store)
    result = run_cli("recover", store, "--yes", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["dispatch"]["indexEntries"] == 0
    (folder,) = (store / "quarantine").iterdir()
    kept = sorted(str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file())
    assert kept == [
        "checkpoint",
        f"commitlog/{'0' * 20}.{end}-{end + 114}.bin",
        "manifest.json",
    ]
    result = run_cli("quarantine", "restore", store, folder.name, "--yes")
    assert result.exit_code == 0, result.stderr
    after = tree_digest(store)  # (the restore keeps the recovered checkpoint in a folder)
    assert {k: v for k, v in after.items() if not k.startswith("quarantine/")} == before


def test_a_purge_stopped_part_way_leaves_no_folder_that_looks_restorable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A purge killed (or cut off by a power cut) while it deletes a folder's files used to
    leave the folder under its name with some of its pieces or its manifest gone: listed,
    and refused by restore. It is renamed out of the list first now; what is left under the
    hidden name goes with the next operation that makes, restores or purges a folder."""
    import rmqstore.quarantine as quarantine

    store = recovered(tmp_path)
    (folder,) = json.loads(run_cli("quarantine", "list", store, "--json").stdout)["folders"]
    real_rmtree = shutil.rmtree

    def stopped_part_way(path, *args, **kwargs):  # the first file goes, then the kill
        first = next(item for item in Path(path).rglob("*") if item.is_file())
        first.unlink()
        raise KeyboardInterrupt

    monkeypatch.setattr(quarantine.shutil, "rmtree", stopped_part_way)
    with pytest.raises(KeyboardInterrupt):
        quarantine.purge_quarantine(store, [folder["name"]])
    monkeypatch.setattr(quarantine.shutil, "rmtree", real_rmtree)
    assert json.loads(run_cli("quarantine", "list", store, "--json").stdout)["folders"] == []
    assert [path.name for path in (store / "quarantine").iterdir()] == [f".{folder['name']}.purged"]
    made = Quarantine.create(store, "test")  # the next folder made
    assert sorted(path.name for path in (store / "quarantine").iterdir()) == [made.directory.name]
