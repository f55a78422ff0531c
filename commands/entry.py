"""The ``rmqstore`` console script (and ``python -m rmqstore``): the stop signals handled
before the command line's modules load, so that a Ctrl-C, SIGTERM or hangup in the first
tenth of a second stops the command in its one line too, once it begins (a Ctrl-C there
printed the traceback of the import it met; SIGTERM or SIGHUP ended the process on the
spot)."""

from __future__ import annotations


def main() -> None:
    from rmqstore.commands.signals import defer_stops, interrupt_on_sigterm

    interrupt_on_sigterm()
    defer_stops()  # one that comes as the modules load is raised where the command begins
    from rmqstore.commands.main import main as run

    run()
