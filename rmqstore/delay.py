"""Delay levels and ``SCHEDULE_TOPIC_XXXX`` (spec §2.11, §3.6)."""

from __future__ import annotations

import re

from rmqstore.config import DEFAULT_DELAY_LEVELS
from rmqstore.errors import InputError, RecordError
from rmqstore.hashing import tags_code
from rmqstore.properties import DELAY, TAGS
from rmqstore.wording import quoted

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
_UNIT_MILLIS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_LEVEL = re.compile(r"(\d+)([smhd])")
_JAVA_INT = re.compile(r"[+-]?\d+")


class DelayLevels:
    """The ``messageDelayLevel`` table: level n (1-based) waits ``millis[n-1]``."""

    def __init__(self, text: str = DEFAULT_DELAY_LEVELS) -> None:
        self.millis: list[int] = []
        for item in text.split():
            match = _LEVEL.fullmatch(item)
            if not match:
                raise InputError(
                    f"messageDelayLevel item {quoted(item)} is not a number plus s/m/h/d"
                )
            self.millis.append(int(match.group(1)) * _UNIT_MILLIS[match.group(2)])
        if not self.millis:
            raise InputError("messageDelayLevel is empty")

    @property
    def max_level(self) -> int:
        return len(self.millis)

    def clamp(self, level: int) -> int:
        return min(level, self.max_level)

    def deliver_timestamp(self, level: int, store_timestamp: int) -> int:
        """``computeDeliverTimestamp``: store time plus the level's delay (+1 s if unknown)."""
        if 1 <= level <= self.max_level:
            return store_timestamp + self.millis[level - 1]
        return store_timestamp + 1000


def parse_java_int(text: str) -> int:
    """``Integer.parseInt``: optional sign and digits only, within the int range. Java takes
    any script's decimal digits (``٣`` is 3) but reads UTF-16 units one by one, so a digit
    beyond the BMP (``𝟑``, a surrogate pair in Java) is not one: a broker refuses a DELAY of
    it, and would find such a record in SCHEDULE_TOPIC_XXXX invalid."""
    if not _JAVA_INT.fullmatch(text) or not all(character < "\U00010000" for character in text):
        raise ValueError(f"not an integer: {quoted(text)}")
    value = int(text)
    if not -(1 << 31) <= value < (1 << 31):
        raise ValueError(f"out of int range: {quoted(text)}")
    return value


def level_to_queue_id(level: int) -> int:
    return level - 1


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
            raise RecordError(
                "PROPERTIES", -1, f"DELAY={quoted(properties[DELAY])} is not a number"
            ) from None
        level = delay_levels.clamp(level)
        if level > 0:
            return delay_levels.deliver_timestamp(level, store_timestamp)
    return tags_code(properties.get(TAGS))
