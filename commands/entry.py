"""The ``rmqstore`` console script (and ``python -m rmqstore``): the stop signals handled
before the command line's modules load, so that a Ctrl-C, SIGTERM or hangup in the first
tenth of a second stops the command in its one line too (a Ctrl-C there printed the
traceback of the import it met; SIGTERM or SIGHUP ended the process on the spot)."""

from __future__ import annotations

import sys


def main() -> None:
    from rmqstore.commands.signals import (
        defer_stops,
        interrupt_on_sigterm,
        stop_listening,
        stopped_by,
    )

    interrupt_on_sigterm()
    defer_stops()  # one that comes now is raised where the command begins
    try:
        from rmqstore.commands.main import main as run
    except KeyboardInterrupt as exc:
        stop_listening()
        said, code = stopped_by(exc)
        try:
            sys.stderr.write(f"rmqstore: error: {said}\n")
            sys.stderr.flush()
        except OSError:  # stderr went with the terminal
            pass
        raise SystemExit(code) from None
    run()
