"""The console-script entry point itself (``rmqstore.commands.entry:main``, then
``rmqstore.commands.main:main``), in a process of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rmqstore.fixtures import generate

from campaigns import sigint_delivered

pytestmark = pytest.mark.plumbing

# runs the entry point as the console script does, then says what the environment held
_ENTRY = """
import os, sys
from rmqstore.commands.main import main
sys.argv = ["rmqstore", "--version"]
try:
    main()
except SystemExit:
    pass
print(os.environ.get("OPENBLAS_NUM_THREADS"))
"""


@pytest.mark.parametrize(("given", "expected"), [(None, "1"), ("4", "4")])
def test_entry_point_keeps_openblas_to_one_thread_unless_told(
    given: str | None, expected: str
) -> None:
    environment = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if given is not None:
        environment["OPENBLAS_NUM_THREADS"] = given
    shown = subprocess.run(
        [sys.executable, "-c", _ENTRY],
        capture_output=True,
        text=True,
        check=True,
        env=environment,
    ).stdout.splitlines()
    assert shown[0].startswith("rmqstore")
    assert shown[-1] == expected


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity (Linux)")
def test_more_jobs_than_the_cpus_the_process_may_use_are_lowered_to_them(tmp_path) -> None:
    """--jobs 64 in a process allowed one CPU runs the work here, with a note, instead of 64
    worker processes each holding its own memory (on a broker's host, memory the broker
    needs); the counts are those of one process."""
    from rmqstore.fixtures import generate

    store = tmp_path / "store"
    generate("multi", store)
    one_cpu = min(os.sched_getaffinity(0))

    def stats(*options: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "rmqstore", "stats", str(store), "--json", *options],
            capture_output=True,
            text=True,
            preexec_fn=lambda: os.sched_setaffinity(0, {one_cpu}),
        )

    lowered, alone = stats("--jobs", "64", "--split-size", "9000"), stats()
    assert lowered.returncode == 0, lowered.stderr
    assert "rmqstore: --jobs 64: this process may use 1 CPU; running in this process alone" in (
        lowered.stderr.splitlines()
    )
    assert lowered.stdout == alone.stdout


@pytest.mark.parametrize("debug", [False, True])
def test_a_bug_is_exit_70_in_one_line_and_a_traceback_only_when_asked(
    tmp_path, monkeypatch, debug: bool
) -> None:
    """An exception no part of rmqstore expects (a bug): one line naming it and exit 70;
    with RMQSTORE_DEBUG=1 the traceback follows it."""
    from rmqstore.fixtures import FixtureOptions, generate

    from support import run_cli

    store = tmp_path / "store"
    generate("basic", store, FixtureOptions())

    def broken(*_args, **_kwargs):
        raise RuntimeError("a slip in the summary")

    monkeypatch.setattr("rmqstore.commands.info.summarize", broken)
    result = run_cli("info", store, env={"RMQSTORE_DEBUG": "1" if debug else ""})
    assert result.exit_code == 70
    first, *rest = result.stderr.strip().splitlines()
    assert first.startswith("rmqstore: error: internal error: RuntimeError: a slip in the summary")
    assert "RMQSTORE_DEBUG=1" in first
    if debug:
        assert rest and rest[0].startswith("Traceback") and "a slip in the summary" in rest[-1]
    else:
        assert rest == []


def test_what_py4j_logs_of_an_interruption_stays_off_stderr() -> None:
    """py4j logs an interruption met while it waits on the JVM (Ctrl-C, SIGTERM, SIGHUP
    during a Spark job) with ``logging.exception``: with no handler, Python printed it,
    traceback and all, on stderr beside the command's one line (seen on SIGTERM during
    ``verify --engine spark``). A command that starts Spark gives the root logger a handler
    that drops it first."""
    script = (
        "import logging\n"
        "from rmqstore.commands.options import quiet_root_logger\n"
        "quiet_root_logger()\n"
        "try:\n"
        "    raise KeyboardInterrupt\n"
        "except KeyboardInterrupt:\n"
        "    logging.exception('KeyboardInterrupt while sending command.')\n"
    )
    quiet = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert quiet.returncode == 0 and quiet.stderr == ""
    loud = script.replace("quiet_root_logger()\n", "")  # as it was
    said = subprocess.run([sys.executable, "-c", loud], capture_output=True, text=True)
    assert "Traceback" in said.stderr


# each stop signal, the exit code it gives and the line it says
EACH_STOP = pytest.mark.parametrize(
    ("name", "code", "said"),
    [
        ("SIGINT", 130, "interrupted"),
        ("SIGTERM", 143, "terminated (SIGTERM)"),
        ("SIGHUP", 129, "hung up (SIGHUP)"),
    ],
)


# a stop signal as the command line's modules begin to load (the first tenth of a second)
STOPPED_WHILE_LOADING = """
import importlib.abc, os, signal, sys
class StopOnLoad(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "rmqstore.commands.main":
            os.kill(os.getpid(), signal.SIGNAL)
        return None
sys.meta_path.insert(0, StopOnLoad())
from rmqstore.commands.entry import main
sys.argv = ["rmqstore", "info", sys.argv[1]]
main()
"""


@EACH_STOP
def test_a_stop_signal_while_the_modules_load_is_one_line(
    tmp_path, name: str, code: int, said: str
) -> None:  # type: ignore[no-untyped-def]
    """The console script handles the stop signals before it loads click and the commands:
    a Ctrl-C there printed the traceback of the import it met, and SIGTERM or SIGHUP ended
    the process on the spot, without a word."""
    script = STOPPED_WHILE_LOADING.replace("SIGNAL", name)
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        capture_output=True,
        text=True,
        preexec_fn=sigint_delivered,
    )
    assert done.returncode == code, done.stderr
    assert done.stderr == f"rmqstore: error: {said}\n"


# a stop signal as click sets the command up (parsing the command line), once the command is
# done (its exit code known), or as the interpreter ends, the command line's modules loaded
STOPPED_AROUND_THE_COMMAND = """
import os, signal, sys, time
from rmqstore.commands.main import cli
number = getattr(signal, sys.argv[2])

def stop():
    os.kill(os.getpid(), number)
    time.sleep(0.05)  # handled in here

if sys.argv[3] == "setup":
    make_context = cli.make_context
    cli.make_context = lambda *args, **kwargs: (stop(), make_context(*args, **kwargs))[1]
elif sys.argv[3] == "exit":  # as the interpreter ends (after rmqstore's own exit handlers)
    import atexit
    atexit.register(stop)
else:
    invoke = cli.invoke
    def after(ctx):
        try:
            return invoke(ctx)
        finally:
            stop()
    cli.invoke = after
from rmqstore.commands.entry import main
sys.argv = ["rmqstore", "info", sys.argv[1]]
main()
"""


@EACH_STOP
def test_a_stop_signal_around_the_command_is_its_line_or_none(
    tmp_path, name: str, code: int, said: str
) -> None:  # type: ignore[no-untyped-def]
    """A stop signal met in click's own code, as it set the command up or after the command
    was done, was click's: an empty line and "Aborted!" on stderr, exit 1 (the signals
    campaign, seed 15: a SIGTERM as an append began or ended). Met as the command is set
    up, it now stops the command in its one line; met once the command is done, it is
    ignored, and the command ends with its own exit code and output."""
    generate("multi", tmp_path / "store")
    setup = _python(STOPPED_AROUND_THE_COMMAND, str(tmp_path / "store"), name, "setup")
    assert (setup.returncode, setup.stderr, setup.stdout) == (
        code,
        f"rmqstore: error: {said}\n",
        "",
    )
    for when in ("done", "exit"):
        done = _python(STOPPED_AROUND_THE_COMMAND, str(tmp_path / "store"), name, when)
        assert (done.returncode, done.stderr) == (0, ""), when
        assert "commit log" in done.stdout


# a stop signal as a module the command imports defines a class: Python 3.11 wraps what the
# class's __set_name__ raises in a RuntimeError
STOPPED_AS_A_CLASS_IS_MADE = """
import os, signal, sys, time
from rmqstore.commands import info
number = getattr(signal, sys.argv[2])
run = info.command.callback

class Named:
    def __set_name__(self, owner, name):
        os.kill(os.getpid(), number)
        time.sleep(0.05)  # handled in here

def callback(*args, **kwargs):
    type("Defined", (), {"field": Named()})  # as a dataclass's Field is named
    return run(*args, **kwargs)

info.command.callback = callback
from rmqstore.commands.entry import main
sys.argv = ["rmqstore", "info", sys.argv[1]]
main()
"""


@EACH_STOP
def test_a_stop_signal_as_a_class_is_made_is_the_stop(
    tmp_path, name: str, code: int, said: str
) -> None:  # type: ignore[no-untyped-def]
    """A stop signal met while a module the command imports defines a class (the dataclass
    ``StoreConfig``, as an append began) reached the command wrapped in a RuntimeError
    ("Error calling __set_name__ on 'Field' instance 'sources' in 'StoreConfig'") and was
    an internal error, exit 70 (the signals campaign, seed 20). It is the stop."""
    generate("multi", tmp_path / "store")
    done = _python(STOPPED_AS_A_CLASS_IS_MADE, str(tmp_path / "store"), name)
    assert (done.returncode, done.stdout) == (code, "")
    assert done.stderr == f"rmqstore: error: {said}\n"


def test_the_console_script_and_python_m_start_at_the_entry() -> None:
    """Both ways in go through rmqstore.commands.entry (the signals first)."""
    from importlib.metadata import entry_points

    (script,) = [
        point for point in entry_points(group="console_scripts") if point.name == "rmqstore"
    ]
    assert script.value == "rmqstore.commands.entry:main"
    main_module = (Path(__file__).parents[2] / "rmqstore" / "__main__.py").read_text()
    assert "from rmqstore.commands.entry import main" in main_module


# each way a stop signal is handled, the modules the handling imported
HANDLERS_IMPORT = """
import json, os, signal, sys, time
from rmqstore.commands import signals
signals.interrupt_on_sigterm()
imported = {}

def imports_of(name, stopping):
    before = set(sys.modules)
    try:
        stopping()
    except KeyboardInterrupt:
        pass
    imported[name] = sorted(set(sys.modules) - before)

def held():
    with signals.held_stops():
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(0.01)

def follow_loop():
    with signals.StopSignal():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)

# one process a way: only the first stop signal of a process is acted on
{"raised": lambda: imports_of("raised", lambda: os.kill(os.getpid(), signal.SIGHUP)),
 "held": lambda: imports_of("held", held),
 "follow": lambda: imports_of("follow", follow_loop)}[sys.argv[1]]()
print(json.dumps(imported))
"""


@pytest.mark.parametrize("way", ["raised", "held", "follow"])
def test_a_stop_signal_s_handling_imports_nothing(way: str) -> None:
    """What a stop signal's handler runs imports no module: the first stop imported
    `atexit` (to end the process deaf to later ones), and a signal that came while the
    command was importing a module of its own then broke Python 3.11's import locks: the
    command ended in "internal error: KeyError: 139896121883520" (the thread's id, from
    importlib's table of the imports each thread waits on; the signals campaign, seed 9,
    `dispatch --rebuild` sent SIGHUP and SIGINT)."""
    done = _python(HANDLERS_IMPORT, way)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {way: []}


def _python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``code`` run by this Python with ``args``, SIGINT delivered (see sigint_delivered)."""
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=sigint_delivered,
    )


# a stop signal handled inside a weakref callback (where Python drops what is raised), then
# the command goes on for half a second
STOPPED_IN_A_CALLBACK = """
import os, signal, sys, time, weakref
from rmqstore.commands import signals
signals.interrupt_on_sigterm()

class Thing:
    pass

def callback(_reference):
    os.kill(os.getpid(), getattr(signal, sys.argv[1]))
    for _ in range(10000):  # the handler runs in here: what it raises is dropped
        pass

thing = Thing()
reference = weakref.ref(thing, callback)
try:
    del thing
    time.sleep(0.5)
    print("went on")
except KeyboardInterrupt as exc:
    print(type(exc).__name__)
"""


@pytest.mark.parametrize(
    ("name", "raised"),
    [("SIGINT", "KeyboardInterrupt"), ("SIGTERM", "Terminated"), ("SIGHUP", "HungUp")],
)
def test_a_stop_signal_met_in_a_weakref_callback_still_stops(name: str, raised: str) -> None:
    """A stop signal handled while Python runs a weakref callback (as importlib's cleanup
    of a module's lock does after each import: an export stopped as it imports pyarrow) was
    lost: Python printed "Exception ignored in: <function ...>" with a traceback and the
    command went on to the end. It is raised again, a moment later, where the command is."""
    done = _python(STOPPED_IN_A_CALLBACK, name)
    assert done.returncode == 0, done.stderr
    assert (done.stdout.strip(), done.stderr) == (raised, "")
