"""Store times as an operator writes and reads them: epoch milliseconds, ISO-8601, or mqadmin's
``yyyy-MM-dd#HH:mm:ss:SSS``; shown as local (or UTC) time with the zone."""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone

from rmqstore.errors import InputError
from rmqstore.wording import quoted

_MQADMIN = re.compile(r"(\d{4})-(\d{2})-(\d{2})#(\d{2}):(\d{2}):(\d{2}):(\d{3})")
# a time as rmqstore shows it (format_store_time), so one can be copied from a read into
# --begin: the zone after a space, +0800 or UTC
_SHOWN = re.compile(r"(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d{3})?) (UTC|[+-]\d{4})")


_LONG_MAX = 2**63 - 1  # a Java long: what a record's timestamps hold


def parse_store_time(text: str) -> int:
    """Epoch milliseconds from ``text``: digits (epoch ms), ISO-8601 (``2024-03-01T12:00:00``,
    with ``Z`` or ``+08:00``; without a zone, local time), mqadmin's
    ``2024-03-01#12:00:00:000`` (local time, as mqadmin reads it) or a time as rmqstore
    shows one (``2024-03-01 12:00:00.000 +0800``, or ``UTC``)."""
    value = text.strip()
    if value.isascii() and value.isdigit():
        if int(value) > _LONG_MAX:
            raise InputError(f"{quoted(text)} is beyond the epoch milliseconds a broker can store")
        return int(value)
    matched = _MQADMIN.fullmatch(value)
    try:
        if matched:
            year, month, day, hour, minute, second, millis = (int(p) for p in matched.groups())
            moment = datetime(year, month, day, hour, minute, second, millis * 1000)
        else:
            shown = _SHOWN.fullmatch(value)
            if shown:
                wall, zone = shown.groups()
                value = wall + ("+00:00" if zone == "UTC" else zone)
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise InputError(
            f"{quoted(text)} is not a time: give epoch milliseconds, ISO-8601 "
            "(2024-03-01T12:00:00[.123][Z|+08:00]), yyyy-MM-dd#HH:mm:ss:SSS or a time as "
            "rmqstore shows one (2024-03-01 12:00:00.123 +0800)"
        ) from None
    if moment.tzinfo is None:
        moment = _local(moment, text)  # local time, as the shell's user means it
    millis = round(moment.timestamp() * 1000)
    if millis < 0:
        raise InputError(f"{quoted(text)} is before 1970")
    return millis


def _local(moment: datetime, text: str) -> datetime:
    """``moment`` (a wall-clock time without a zone) in local time; refused when the local
    clock showed it twice (the clocks went back over it: which instant is meant is not
    known, and a range ending at the wrong one leaves out an hour of messages) or never
    (they went forward over it)."""
    try:
        first = moment.replace(fold=0).astimezone()
        second = moment.replace(fold=1).astimezone()
    except (OverflowError, OSError, ValueError):
        # a zone a full day or more from UTC (TZ=UTC+24: the C library takes it, Python's
        # datetime does not), or a time the C library cannot place: it was exit 70
        raise InputError(
            f"{quoted(text)} cannot be placed in the local time zone: give it with its "
            "offset (2024-03-01T12:00:00+08:00) or as epoch milliseconds"
        ) from None
    if first == second:
        return first
    if datetime.fromtimestamp(first.timestamp()) == moment.replace(fold=0):
        spec = "milliseconds" if moment.microsecond else "seconds"
        offsets = " or ".join(instant.isoformat(timespec=spec) for instant in (first, second))
        raise InputError(
            f"{quoted(text)} happened twice in local time (the clocks went back over it): "
            f"give its offset ({offsets}) or epoch milliseconds"
        )
    raise InputError(
        f"{quoted(text)} never happened in local time (the clocks went forward over it): "
        "give a time the clock showed, with its offset, or epoch milliseconds"
    )


def format_store_time(millis: int, *, utc: bool = False) -> str:
    """``2024-03-01 12:00:00.123 +0800`` (``UTC`` with ``utc``); ``-`` for 0 or less."""
    if millis <= 0:
        return "-"
    second, rest = divmod(millis, 1000)
    key = (second, utc, time.tzname)  # the zone too: a process may change it (time.tzset)
    if _last_second[0] == key:  # records in a row mostly share their second
        before, after = _last_second[1]
    else:
        try:
            before, after = _second_text(second, utc)
        except (OverflowError, OSError, ValueError):
            return str(millis)
        _last_second[:] = [key, (before, after)]
    return f"{before}.{rest:03d}{after}"


_last_second: list = [None, None]  # (second, utc, zone) and its text, last asked for


def _second_text(second: int, utc: bool) -> tuple[str, str]:
    """The text before and after the milliseconds of a time in ``second`` (epoch seconds)."""
    if utc:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(second)), " UTC"
    moment = datetime.fromtimestamp(second, timezone.utc)
    try:
        moment = moment.astimezone()
    except ValueError:  # a zone a full day from UTC (TZ=UTC+24), which datetime cannot hold
        return _second_text(second, True)
    return f"{moment:%Y-%m-%d %H:%M:%S}", f" {moment:%z}"
