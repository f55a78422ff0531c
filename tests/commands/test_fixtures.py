"""``rmqstore fixtures`` from the command line, used the way a CI job would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rmqstore.fixtures import SCENARIOS

from support import peak_rss_mib, run_cli, tree_digest


def test_list() -> None:
    result = run_cli("fixtures", "list", "--json")
    rows = json.loads(result.stdout)
    assert [row["scenario"] for row in rows] == list(SCENARIOS)
    assert {row["scenario"] for row in rows if row["damaged"]} >= {"torn-tail", "crc-flip"}
    assert "torn-tail" in run_cli("fixtures", "list").stdout


@pytest.mark.parametrize("name", ["crc-flip", "missing-file", "stale-checkpoint"])
def test_generate_then_verify_like_a_ci_job(tmp_path: Path, name: str) -> None:
    out = tmp_path / "store"
    generated = run_cli("fixtures", "generate", name, out, "--seed", "42", "--json")
    assert generated.exit_code == 0, generated.stderr
    summary = json.loads(generated.stdout)
    described = json.loads(run_cli("fixtures", "describe", name, out, "--json").stdout)
    assert described["expect"] == summary["expect"]
    assert json.loads((out / "fixture.json").read_text()) == described
    verified = run_cli("verify", out, "--json")
    assert verified.exit_code == 1
    findings = json.loads(verified.stdout)["findings"]
    for expected in described["expect"]["verify"]:
        assert any(all(f[key] == value for key, value in expected.items()) for f in findings)


def test_generate_with_worker_processes(tmp_path: Path) -> None:
    options = ["--messages", "2000", "--commitlog-file-size", "65536", "--json"]
    here = run_cli("fixtures", "generate", "large", tmp_path / "here", *options)
    workers = run_cli("fixtures", "generate", "large", tmp_path / "w", *options, "--jobs", "2")
    assert here.exit_code == 0 and workers.exit_code == 0, workers.stderr
    assert tree_digest(tmp_path / "w") == tree_digest(tmp_path / "here")


def test_clean_fixture_is_usable_by_every_command(tmp_path: Path) -> None:
    out = tmp_path / "store"
    assert run_cli("fixtures", "generate", "multi", out, "--messages", "300").exit_code == 0
    assert run_cli("verify", out).exit_code == 0
    info = json.loads(run_cli("info", out, "--deep", "--json").stdout)
    assert (
        info["commitLog"]["messages"]
        == json.loads((out / "fixture.json").read_text())["messageCount"]
    )
    assert info["dispatch"]["behindRecords"] == 0
    read = run_cli("read", out, "--topic", "TopicTest", "--key", "shared-key", "--json")
    assert read.exit_code == 0 and json.loads(read.stdout)
    appended = run_cli("append", out, "--topic", "TopicTest", "--body", "more", "--dispatch")
    assert appended.exit_code == 0, appended.stderr
    assert run_cli("verify", out).exit_code == 0


def test_bad_input(tmp_path: Path) -> None:
    assert run_cli("fixtures", "generate", "nope", tmp_path / "x").exit_code == 2
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "file").write_text("x")
    busy = run_cli("fixtures", "generate", "basic", tmp_path / "busy")
    assert busy.exit_code == 2 and "not empty" in busy.stderr
    missing = run_cli("fixtures", "describe", "basic", tmp_path / "nowhere")
    assert missing.exit_code == 2 and "fixture.json" in missing.stderr
    forced = run_cli("fixtures", "generate", "v2", tmp_path / "v2", "--broker-version", "4.9")
    assert forced.exit_code == 2 and "v2 is a 5.x store" in forced.stderr
    assert not (tmp_path / "v2").exists()
    made = run_cli("fixtures", "generate", "v2", tmp_path / "v2", "--broker-version", "5")
    assert made.exit_code == 0, made.stderr


def test_seeds_are_those_whose_store_times_stay_before_the_year_10000(tmp_path: Path) -> None:
    """A seed moves the store's times a day later each: seed 2**63 stopped with an internal
    error (a time no clock can show), and 2**32 made a store whose index file was named by a
    21-digit time, which verify itself does not take for an index file. The seeds refused
    make nothing; the largest taken makes a sound store."""
    from rmqstore.errors import InputError
    from rmqstore.fixtures import FixtureOptions, generate
    from rmqstore.fixtures.plans import MAX_SEED

    for seed in (-1, MAX_SEED + 1, 2**32, 2**63):
        refused = run_cli("fixtures", "generate", "basic", tmp_path / "x", f"--seed={seed}")
        assert refused.exit_code == 2 and "--seed" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr and not (tmp_path / "x").exists()
        with pytest.raises(InputError, match="--seed must be 0 to"):
            generate("basic", tmp_path / "x", FixtureOptions(seed=seed))
        assert not (tmp_path / "x").exists()
    made = run_cli("fixtures", "generate", "delay", tmp_path / "last", f"--seed={MAX_SEED}")
    assert made.exit_code == 0, made.stderr
    (index_file,) = (tmp_path / "last" / "index").iterdir()
    assert len(index_file.name) == 17 and index_file.name.startswith("9999")
    assert run_cli("verify", tmp_path / "last").exit_code == 0


def test_a_forced_generation_is_undone_by_its_restore(tmp_path: Path) -> None:
    """``--force`` moves the earlier store into quarantine (the lock stays: it is held) and
    lists what the new fixture makes: restoring the folder sets the new fixture aside and
    gives the earlier store back, byte for byte."""
    out = tmp_path / "out"
    assert run_cli("fixtures", "generate", "torn-tail", out).exit_code == 0
    (out / "lock").touch()
    before = tree_digest(out)
    forced = run_cli("fixtures", "generate", "multi", out, "--force")
    assert forced.exit_code == 0, forced.stderr
    (folder,) = json.loads(run_cli("quarantine", "list", out, "--json").stdout)["folders"]
    assert folder["operation"] == "fixtures-generate"
    restored = run_cli("quarantine", "restore", out, folder["name"], "--yes", "--json")
    assert restored.exit_code == 0, restored.stderr
    after = tree_digest(out)
    assert {k: v for k, v in after.items() if not k.startswith("quarantine/")} == before
    aside = Path(json.loads(restored.stdout)["setAsideIn"])
    assert json.loads((aside / "fixture.json").read_text())["scenario"] == "multi"


@pytest.mark.plumbing
@pytest.mark.slow  # 120,000 messages generated in a process of its own
def test_a_large_clean_fixture_is_generated_in_flat_memory(tmp_path: Path) -> None:
    """Every message put was kept for the manifest's list (left out above 100,000) and the
    damage: `multi --messages 120000` peaked at 179 MiB, 400,000 at 558 MiB, and 3,346,148
    ran out of a 4 GiB address space. A clean scenario keeps them only when they are listed;
    a damaged one, which needs them, is refused above the list's limit."""
    out = tmp_path / "store"
    code, peak = peak_rss_mib(["fixtures", "generate", "multi", str(out), "--messages", "120000"])
    assert code == 0 and peak < 100
    manifest = json.loads((out / "fixture.json").read_text())
    assert manifest["messageCount"] == 120_002 and manifest["messages"] is None
    assert run_cli("verify", out).exit_code == 0
    refused = run_cli("fixtures", "generate", "torn-tail", tmp_path / "t", "--messages", "100001")
    assert refused.exit_code == 2 and "at most 100,000 messages" in refused.stderr
    assert not (tmp_path / "t").exists()


# a generation given SIGTERM as it reports what it made
TERMINATED_AS_IT_REPORTS = """
import os, signal, sys
import rmqstore.commands.fixtures as fixtures
from rmqstore.commands.main import main
noted = fixtures.note
def note(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    noted(*args, **kwargs)
fixtures.note = note
sys.argv = ["rmqstore", "fixtures", "generate", *sys.argv[1:]]
main()
"""


def test_a_stop_once_the_fixture_is_made_does_not_fail_it(tmp_path: Path) -> None:
    """A stop signal that comes once the fixture is made, all of it on the disk, finds the
    generation done: exit 0 and its report. It ended the command as stopped (exit 143) with
    the whole fixture there."""
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-c", TERMINATED_AS_IT_REPORTS, "basic", str(out)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith("rmqstore: wrote scenario basic"), done.stderr
    assert run_cli("verify", out).exit_code == 0
