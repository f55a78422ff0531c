"""Delay levels and ``SCHEDULE_TOPIC_XXXX`` (spec §2.11, §3.6)."""

from __future__ import annotations

from collections.abc import Mapping

from rmqstore.config import DEFAULT_DELAY_LEVELS
from rmqstore.errors import InputError, RecordError
from rmqstore.hashing import tags_code
from rmqstore.javavalues import (
    JAVA_LONG_RANGE,
    java_long,
    java_trim,
    parse_java_int,
    parse_java_integer,
)
from rmqstore.properties import DELAY, TAGS
from rmqstore.wording import quoted

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
_UNIT_MILLIS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


class DelayLevels:
    """The ``messageDelayLevel`` table: level n (1-based) waits ``millis[n-1]``."""

    def __init__(self, text: str = DEFAULT_DELAY_LEVELS) -> None:
        """Parse ``text`` as a broker's ``parseDelayLevel`` does: items split at each single
        space (trailing empty ones dropped, as Java's ``split`` drops them), each a
        ``Long.parseLong`` number and one unit letter; the delay is a Java long, so a product
        past its range wraps as the broker's does. A table a broker cannot parse (it then
        does not start) is an InputError."""
        pieces = java_trim(text).split(" ")  # trimmed, as a broker's config reader does
        while len(pieces) > 1 and not pieces[-1]:
            pieces.pop()
        self.millis: list[int] = []
        for item in pieces:
            unit = _UNIT_MILLIS.get(item[-1:])
            try:
                if unit is None:
                    raise ValueError(item)
                number = parse_java_integer(item[:-1], JAVA_LONG_RANGE)
            except ValueError:
                raise InputError(
                    f"messageDelayLevel item {quoted(item)} is not a number plus s/m/h/d "
                    "(one space between items: a broker does not start with this table)"
                ) from None
            self.millis.append(java_long(number * unit))

    @property
    def max_level(self) -> int:
        return len(self.millis)

    def clamp(self, level: int) -> int:
        return min(level, self.max_level)

    def deliver_timestamp(self, level: int, store_timestamp: int) -> int:
        """``computeDeliverTimestamp``: store time plus the level's delay (+1 s if unknown)."""
        if 1 <= level <= self.max_level:
            return java_long(store_timestamp + self.millis[level - 1])
        return java_long(store_timestamp + 1000)


def check_scheduled_delay(topic: str, properties: Mapping[str, str]) -> None:
    """InputError for a message to SCHEDULE_TOPIC_XXXX whose DELAY is not a Java int: a
    broker finds such a record invalid (spec §2.7), its recovery cutting the log there (a
    transaction's prepared or rollback message is stored as it is given, not rewritten)."""
    if topic == SCHEDULE_TOPIC and DELAY in properties:
        try:
            parse_java_int(properties[DELAY])
        except ValueError:
            raise InputError(
                f"DELAY={quoted(properties[DELAY])} in a message to {SCHEDULE_TOPIC} is not "
                "a number: a broker finds such a record invalid, and its recovery cuts it"
            ) from None


def level_to_queue_id(level: int) -> int:
    return level - 1


def bad_delay_error(physical_offset: int, level: str) -> RecordError:
    """The error of a SCHEDULE_TOPIC_XXXX record at ``physical_offset`` (-1: not known)
    whose DELAY, ``level``, a broker cannot parse: every walk that stops at one says it in
    these words."""
    return RecordError("PROPERTIES", physical_offset, f"DELAY={quoted(level)} is not a number")


def unit_tags_code(
    topic: str, properties: dict[str, str], store_timestamp: int, delay_levels: DelayLevels
) -> int:
    """A consume-queue unit's tagsCode: the Java hash of TAGS, or the deliver time for
    SCHEDULE_TOPIC_XXXX records with a DELAY level (spec §3.6). A DELAY that is not a number
    is a RecordError, as the broker treats such a record as invalid."""
    if topic == SCHEDULE_TOPIC and DELAY in properties:
        try:
            level = parse_java_int(properties[DELAY])
        except ValueError:
            raise bad_delay_error(-1, properties[DELAY]) from None
        level = delay_levels.clamp(level)
        if level > 0:
            return delay_levels.deliver_timestamp(level, store_timestamp)
    return tags_code(properties.get(TAGS))
