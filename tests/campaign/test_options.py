"""Random option combinations: every command (but ``serve-ha``, which serves until stopped)
with options drawn at random, given values a careless or hostile hand gives (0, -1, 2**63,
10**30, empty text, ``..``, a path through a file, text where a number goes, a choice no
command offers), on copies of real broker stores. Each run ends in a documented exit code
and, on an error, a one-line message, never an internal error. The paths given lie in the
test's folder, and the runs start in a scratch folder of it (where a relative path lands).
It found ``fixtures generate --seed 9223372036854775808`` ending in an internal error (a
store time past what a clock shows), and ``quarantine purge`` of a name that is no folder
refused by the purge but taken by its dry run."""

from __future__ import annotations

import random
from pathlib import Path

import click
import pytest

from rmqstore.commands.main import cli

from campaigns import Outcome, campaign_random, rounds, run_commands, seed_note
from support import ORACLE_OPTIONS

COMMAND_LINES = rounds(short=12, long=400)
PLAUSIBLE = ["0", "1", "2", "5", "100", "266", "2000", "65536", "3346148"]
NUMBERS = [*PLAUSIBLE, "-1", "2147483648", "9223372036854775808", "-9223372036854775809",
           "1" + "0" * 30, "1e3", "0x10", "nan", "", " 7"]  # fmt: skip
TEXTS = ["", "..", "../up", "a/b", "TopicTest", "TopicTest:0", "%RETRY%group_a", "x" * 300,
         "*", "1,2", "TagA||TagB", "k1 k2", "{}", "[1]", "2026-11-29T10:00:00", "\t",
         "é", "local[2]"]  # fmt: skip
# options that start Spark (so does --engine spark, never drawn) or follow a store until
# stopped: each has its own tests; here they would only spend minutes
LEFT_OUT = {"follow", "keep_following", "master", "spark_conf", "help"}


def every_command() -> dict[str, click.Command]:
    """The commands by their words (``quarantine list``), groups walked."""
    context = click.Context(cli)
    found: dict[str, click.Command] = {}

    def walk(group: click.Group, words: list[str]) -> None:
        for name in group.list_commands(context):
            command = group.get_command(context, name)
            if isinstance(command, click.Group):
                walk(command, [*words, name])
            elif command is not None:
                found[" ".join([*words, name])] = command

    walk(cli, [])
    found.pop("serve-ha")
    return found


def drawn_value(parameter: click.Parameter, rng: random.Random, scratch: Path, store: Path) -> str:
    """A value for ``parameter``: most often one of its kind, now and then anything."""
    kind = parameter.type
    if rng.random() < 0.08:
        return rng.choice(NUMBERS + TEXTS)
    if parameter.name == "jobs":
        return rng.choice(["0", "1", "2", "-1"])
    if parameter.name == "engine":
        return rng.choice(["local", "bogus"])
    if isinstance(kind, click.Choice):
        return rng.choice([*kind.choices, "bogus"])
    if isinstance(kind, click.Path):
        return str(
            rng.choice(
                [
                    scratch / "out",
                    scratch / "missing" / "out",
                    scratch / "through-a-file" / "out",
                    store / "commitlog",
                    store / "checkpoint",
                    Path("/dev/null"),
                ]
            )
        )
    if isinstance(kind, (click.types.IntParamType, click.types.FloatParamType)):
        return rng.choice(PLAUSIBLE if rng.random() < 0.6 else NUMBERS)
    return rng.choice(TEXTS + NUMBERS)


def command_line(
    words: str, command: click.Command, rng: random.Random, scratch: Path, store: Path
) -> list[str]:
    """``words`` with its arguments (the store, a destination in ``scratch``, a store file)
    and a few options drawn at random."""
    line = words.split()
    files = sorted(path for path in store.rglob("*") if path.is_file())
    for parameter in command.params:
        if isinstance(parameter, click.Argument):
            name = parameter.name or ""
            if name in ("store", "source"):
                line.append(str(store))
            elif name == "dest":
                line.append(str(scratch / "dest"))
            elif name in ("out", "directory"):
                line.append(str(scratch / "generated"))
            elif name in ("file", "path"):
                line.append(str(rng.choice(files)))
            else:
                line.append(drawn_value(parameter, rng, scratch, store))
            continue
        if parameter.name in LEFT_OUT or not isinstance(parameter, click.Option):
            continue
        if rng.random() < 0.12:
            line.append(rng.choice(parameter.opts))
            if not parameter.is_flag and not parameter.count:
                line.append(drawn_value(parameter, rng, scratch, store))
    if words in ("append",) and "--input" not in line and rng.random() < 0.7:
        line += ["--input", "/dev/null"]
    takes_geometry = any("--commitlog-file-size" in p.opts for p in command.params)
    if takes_geometry and "--commitlog-file-size" not in line and rng.random() < 0.9:
        line += ORACLE_OPTIONS  # the real stores' file sizes (else most runs refuse them)
    return line


def unclean(outcomes: list[Outcome]) -> list[str]:
    return [
        f"{' '.join(outcome.command)} -> {outcome.code}: {outcome.stderr[-300:]}"
        for outcome in outcomes
        if not outcome.clean
    ]


@pytest.mark.campaign
def test_random_option_combinations_end_cleanly(oracle, tmp_path: Path) -> None:
    rng = campaign_random("options")
    commands = every_command()
    (tmp_path / "cwd").mkdir()  # where a relative path given as a value lands
    lines = []
    for number in range(COMMAND_LINES):
        words = rng.choice(sorted(commands))
        scratch = tmp_path / f"c{number}"
        scratch.mkdir()
        (scratch / "through-a-file").write_text("a file, not a folder")
        store = oracle(rng.choice(["s1_multi", "s2_crash", "v533_s1_multi"])).copy_to(scratch)
        lines.append(command_line(words, commands[words], rng, scratch, store))
    outcomes = run_commands(lines, timeout=600, cwd=tmp_path / "cwd")
    failures = unclean(outcomes)
    assert not failures, seed_note() + "\n" + "\n".join(failures[:20])
    assert len(outcomes) == len(lines)
