"""``rmqstore quarantine list|purge``: the folders of cut bytes, with their sizes; purging
takes the lock, asks first, and never leaves the store's quarantine folder."""

from __future__ import annotations

import json
from pathlib import Path

from rmqstore.fixtures import generate

from support import lock_held_elsewhere, run_cli


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


def test_names_outside_the_quarantine_and_links_are_refused(tmp_path: Path) -> None:
    store = recovered(tmp_path)
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "keep").write_text("x")
    for name in ("../precious", "..", "commitlog", "nope"):
        result = run_cli("quarantine", "purge", store, name, "--yes")
        assert result.exit_code == 2, (name, result.stderr)
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
