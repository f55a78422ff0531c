"""``config/consumerOffset.json`` and ``config/delayOffset.json`` (spec §8.4): where each
consumer group stands in each queue it consumes, and where the delay scheduler stands in each
``SCHEDULE_TOPIC_XXXX`` queue. Read as a broker loads them: fastjson writes integer map keys
bare (``{0:250}``), which plain JSON refuses, and a missing, empty or unparseable file gives
way to its ``.bak``. Read only: rmqstore never writes these files."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rmqstore.errors import StoreFormatError, TopicError
from rmqstore.jsontext import parse_json
from rmqstore.segments import read_small_file
from rmqstore.topics import check_topic_path_safe
from rmqstore.wording import quoted

CONSUMER_OFFSETS_FILE = "consumerOffset.json"
DELAY_OFFSETS_FILE = "delayOffset.json"
TOPIC_GROUP_SEPARATOR = "@"  # ConsumerOffsetManager's "<topic>@<group>" keys
# a broker with many thousands of groups writes a few MB; past this the file is not read
MAX_CONFIG_BYTES = 256 << 20
_JAVA_INT_MAX = 2**31 - 1
_JAVA_LONG_MAX = 2**63 - 1

# a JSON string (kept as it is), or a bare integer object key (quoted)
_STRING_OR_BARE_KEY = re.compile(r'"(?:[^"\\]|\\.)*"|([{,]\s*)(-?\d+)(\s*:)', re.DOTALL)


def loads_fastjson(text: str) -> Any:
    """``text`` parsed as JSON, with the bare integer object keys fastjson writes accepted
    (as strings, as quoted keys are). Raises ValueError when it does not parse."""
    quoted_keys = _STRING_OR_BARE_KEY.sub(
        lambda match: (
            match.group(0)
            if match.group(2) is None
            else (f'{match.group(1)}"{match.group(2)}"{match.group(3)}')
        ),
        text,
    )
    return parse_json(quoted_keys)


@dataclass(frozen=True)
class LoadedConfig:
    """What loading one config file found, as a broker loads it."""

    path: Path  # the file asked for
    source: Path | None  # the file the document came from (the .bak after a fallback)
    document: dict[str, Any] | None  # None: neither file gave one
    failures: tuple[str, ...] = ()  # why a file there did not load (empty when none failed)

    def failure_text(self, root: Path) -> str | None:
        """Why the file did not load, and what was read instead, in one sentence (None when
        nothing failed)."""
        if not self.failures:
            return None
        name = self.path.relative_to(root).as_posix()
        fallback = (
            f"; read {self.source.name} instead, as a broker does"
            if self.source is not None and self.source != self.path
            else ": a broker finds no offsets in it"
        )
        return f"{name} does not load ({'; '.join(self.failures)}){fallback}"

    def source_name(self, root: Path) -> str | None:
        """The file the document came from, relative to the store ``root`` (None: none)."""
        return None if self.source is None else self.source.relative_to(root).as_posix()

    @property
    def unreadable(self) -> bool:
        """A file is there, but neither it nor its ``.bak`` loads."""
        return self.document is None and bool(self.failures)


def load_config(config_dir: Path, name: str) -> LoadedConfig:
    """``config_dir/name`` as a broker's ConfigManager loads it: the file, or its ``.bak``
    when the file is missing, empty or does not parse."""
    path = config_dir / name
    failures = []
    for candidate in (path, path.with_name(name + ".bak")):
        try:  # a FIFO or device is not waited on
            data = read_small_file(candidate, MAX_CONFIG_BYTES, follow_links=True)
        except FileNotFoundError:
            continue
        except OSError as exc:
            failures.append(f"{candidate.name}: {exc.strerror or exc}")
            continue
        except StoreFormatError:
            failures.append(
                f"{candidate.name}: not a regular file of at most {MAX_CONFIG_BYTES >> 20} MiB"
            )
            continue
        if not data.strip():
            continue  # empty: the broker goes on to the .bak, and loads nothing without one
        try:
            document = loads_fastjson(data.decode("utf-8"))
        except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError included
            failures.append(f"{candidate.name}: not JSON ({_first_line(exc)})")
            continue
        if not isinstance(document, dict):
            failures.append(f"{candidate.name}: not a JSON object")
            continue
        return LoadedConfig(path, candidate, document, tuple(failures))
    return LoadedConfig(path, None, None, tuple(failures))


@dataclass(frozen=True)
class ConsumerOffsets:
    """``consumerOffset.json``'s offsetTable: (topic, group) -> {queue id: the next queue
    offset the group consumes}, and the entries left out because they make no sense (a
    queue id or offset that is not a non-negative integer, a key without ``@``, a topic that
    cannot name a consume-queue directory)."""

    loaded: LoadedConfig
    table: dict[tuple[str, str], dict[int, int]] = field(default_factory=dict)
    left_out: list[str] = field(default_factory=list)


def read_consumer_offsets(config_dir: Path) -> ConsumerOffsets:
    offsets = ConsumerOffsets(load_config(config_dir, CONSUMER_OFFSETS_FILE))
    for key, queues in _offset_table(offsets.loaded, offsets.left_out).items():
        topic, separator, group = key.partition(TOPIC_GROUP_SEPARATOR)
        if not separator or not topic or not group:
            offsets.left_out.append(f"key {quoted(key)} is not <topic>@<group>")
            continue
        try:
            check_topic_path_safe(topic)
        except TopicError as exc:
            offsets.left_out.append(f"{quoted(key)}: {exc}")
            continue
        if not isinstance(queues, dict):
            offsets.left_out.append(f"{quoted(key)}: not an object of queue offsets")
            continue
        table = offsets.table.setdefault((topic, group), {})
        for queue_text, offset in queues.items():
            queue_id = _int_key(queue_text, _JAVA_INT_MAX)
            if queue_id is None or not _is_int(offset, _JAVA_LONG_MAX):
                offsets.left_out.append(
                    f"{quoted(key)}: queue {quoted(queue_text)} offset {quoted(offset)}"
                )
                continue
            table[queue_id] = offset
    return offsets


@dataclass(frozen=True)
class DelayOffsets:
    """``delayOffset.json``'s offsetTable: delay level -> the next offset the scheduler
    delivers from in ``SCHEDULE_TOPIC_XXXX`` queue level - 1."""

    loaded: LoadedConfig
    table: dict[int, int] = field(default_factory=dict)
    left_out: list[str] = field(default_factory=list)


def read_delay_offsets(config_dir: Path) -> DelayOffsets:
    offsets = DelayOffsets(load_config(config_dir, DELAY_OFFSETS_FILE))
    for level_text, offset in _offset_table(offsets.loaded, offsets.left_out).items():
        level = _int_key(level_text, _JAVA_INT_MAX)
        if level is None or level < 1 or not _is_int(offset, _JAVA_LONG_MAX):
            offsets.left_out.append(f"level {quoted(level_text)} offset {quoted(offset)}")
            continue
        offsets.table[level] = offset
    return offsets


def _offset_table(loaded: LoadedConfig, left_out: list[str]) -> dict[str, Any]:
    """The loaded document's offsetTable (empty when there is none, or it is not an
    object: said in ``left_out``)."""
    if loaded.document is None:
        return {}
    entries = loaded.document.get("offsetTable", {})
    if not isinstance(entries, dict):
        left_out.append("offsetTable is not an object")
        return {}
    return entries


def _int_key(text: str, limit: int) -> int | None:
    """A JSON object key that is a non-negative decimal integer up to ``limit``, or None."""
    if not text.isascii() or not text.isdigit() or len(text) > 19:
        return None
    value = int(text)
    return value if value <= limit else None


def _is_int(value: Any, limit: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= limit


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
