"""Store geometry and behaviour settings, with RocketMQ's defaults and ``broker.conf`` keys.

Precedence, highest first: explicit options, ``--broker-config``, what existing files say
(file sizes), RocketMQ's defaults. Keys mean what they mean to a broker (spec §5.1, §11).
"""

from __future__ import annotations

import math
import re
import string
from dataclasses import dataclass, field, replace
from pathlib import Path

from rmqstore.errors import InputError
from rmqstore.javavalues import java_boolean_word, java_trim, parse_java_int
from rmqstore.segments import read_given_file
from rmqstore.wording import quoted

DEFAULT_COMMITLOG_FILE_SIZE = 1024 * 1024 * 1024
DEFAULT_CONSUMEQUEUE_FILE_SIZE = 300_000 * 20
DEFAULT_INDEX_SLOTS = 5_000_000
DEFAULT_INDEX_ENTRIES = 5_000_000 * 4
DEFAULT_MAX_MESSAGE_SIZE = 1024 * 1024 * 4
BROKER_CONFIG_LIMIT = 4 * 1024 * 1024  # a broker.conf is a few KiB; /dev/zero is not one
# the smallest range of commit log the pipelines split into (--split-size, splitSize): below
# it, planning and per-range work cost more than the reading
SMALLEST_SPLIT_SIZE = 4096
DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
DEFAULT_LISTEN_PORT = 10911
CQ_UNIT_SIZE = 20
# a broker keeps file sizes and counts in Java ints and maps a file of at most this many bytes
JAVA_INT_MAX = 2**31 - 1
SMALLEST_COMMITLOG_FILE_SIZE = 4096
LARGEST_CONSUMEQUEUE_FILE_SIZE = JAVA_INT_MAX // CQ_UNIT_SIZE * CQ_UNIT_SIZE
SMALLEST_INDEX_SLOTS, SMALLEST_INDEX_ENTRIES = 1, 2
# the values rmqstore takes for the broker.conf keys it reads, smallest and largest
BROKER_INT_BOUNDS = {
    "mappedFileSizeCommitLog": (SMALLEST_COMMITLOG_FILE_SIZE, JAVA_INT_MAX),
    "mappedFileSizeConsumeQueue": (CQ_UNIT_SIZE, LARGEST_CONSUMEQUEUE_FILE_SIZE),
    "maxHashSlotNum": (SMALLEST_INDEX_SLOTS, JAVA_INT_MAX),
    "maxIndexNum": (SMALLEST_INDEX_ENTRIES, JAVA_INT_MAX),
    "maxMessageSize": (1, JAVA_INT_MAX),
    "flushIntervalCommitLog": (0, JAVA_INT_MAX),
    "flushCommitLogLeastPages": (0, JAVA_INT_MAX),
    "flushCommitLogThoroughInterval": (0, JAVA_INT_MAX),
    "commitIntervalCommitLog": (0, JAVA_INT_MAX),
    "commitCommitLogLeastPages": (0, JAVA_INT_MAX),
    "commitCommitLogThoroughInterval": (0, JAVA_INT_MAX),
    "listenPort": (0, 65535),
}


def _int(text: str, key: str) -> int:
    """``key``'s value as a broker reads it, ``Integer.parseInt`` of the whole value (space
    at its end included). A value it refuses is refused here too: the broker ignores the
    line and keeps its default, which is not what the file says."""
    try:
        value = parse_java_int(text)
    except ValueError:
        spaced = text != text.rstrip(_BLANK)
        hint = ": the space at its end is part of it" if spaced else ""
        raise InputError(
            f"{key}={quoted(text)} is not an integer to a broker "
            f"(Integer.parseInt refuses it{hint}; a broker ignores the line and keeps "
            "its default)"
        ) from None
    smallest, largest = BROKER_INT_BOUNDS.get(key, (None, None))
    if smallest is not None and largest is not None and not smallest <= value <= largest:
        raise InputError(
            f"{key}={value} is outside {smallest:,}..{largest:,} (what a broker takes)"
        )
    return value


def check_index_geometry(slots: int, entries: int) -> None:
    """InputError when ``slots`` and ``entries`` make index files larger than a broker can
    map (it computes the size in a Java int)."""
    from rmqstore.indexfile import index_file_size  # the format's own sum (every command
    # that checks a geometry opens a store, which imports it anyway)

    size = index_file_size(slots, entries)
    if size > JAVA_INT_MAX:
        raise InputError(
            f"maxHashSlotNum={slots:,} and maxIndexNum={entries:,} make index files of "
            f"{size:,} bytes; a broker maps at most {JAVA_INT_MAX:,}"
        )


# at most this many index slots a file per entry it holds, for a writer: a page of slots (4 KiB)
SLOTS_PER_ENTRY_AT_MOST = 1024


def check_index_reservation(slots: int, entries: int) -> None:
    """InputError when a writer would reserve far more disk for each index file than its
    entries use. rmqstore reserves a new index file's slot table whole before writing it
    through its map (so that a full disk is an error, not a crash); a broker's file is
    sparse, and its entries touch at most a page of slots each. With more slots than that a
    file (the default 5,000,000 slots, 20 MB, and ``--index-entries 2``), every few messages
    reserved another 20 MB: ``replicate`` of a 3,000-message store filled 75 GB of disk in a
    minute (the options campaign, seed 25). Readers take any geometry a broker does."""
    from rmqstore.indexfile import index_file_size

    if slots > entries * SLOTS_PER_ENTRY_AT_MOST:
        size = index_file_size(slots, entries)
        raise InputError(
            f"maxHashSlotNum={slots:,} (--index-slots) with maxIndexNum={entries:,} "
            f"(--index-entries) would reserve {size:,} bytes of disk for every {entries:,} "
            "index entries (a writer reserves each index file's slots whole; a broker's "
            f"sparse file uses a page of them an entry at most): give at most "
            f"{entries * SLOTS_PER_ENTRY_AT_MOST:,} slots, or at least "
            f"{-(-slots // SLOTS_PER_ENTRY_AT_MOST):,} entries"
        )


def _bool(text: str, key: str) -> bool:
    """``key``'s value as a broker reads it (``Boolean.parseBoolean``): true or false in any
    case. Any other text (``yes``, ``1``, ``true`` with a space after it) a broker reads as
    false, which is seldom what was meant, so it is refused."""
    value = java_boolean_word(text)
    if value is None:
        raise InputError(
            f"{key}={quoted(text)} is neither true nor false "
            "(a broker reads it as false: Boolean.parseBoolean takes only true, in any case, "
            "with nothing around it)"
        )
    return value


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """Settings that decide how store files are laid out and checked.

    ``None`` for a file size means "not said": take it from existing files, else the default.
    """

    commitlog_file_size: int | None = None
    consumequeue_file_size: int | None = None
    index_slots: int = DEFAULT_INDEX_SLOTS
    index_entries: int = DEFAULT_INDEX_ENTRIES
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    flush_disk_type: str = "ASYNC_FLUSH"
    # ASYNC_FLUSH: flush every flushIntervalCommitLog ms when flushCommitLogLeastPages pages
    # are dirty, and whatever is dirty every flushCommitLogThoroughInterval ms
    flush_interval_commitlog: int = 500
    flush_commitlog_least_pages: int = 4
    flush_commitlog_thorough_interval: int = 10_000
    # transientStorePoolEnable: records staged in memory, written to the file every
    # commitIntervalCommitLog ms (commitCommitLogLeastPages pages, all of them every
    # commitCommitLogThoroughInterval ms)
    transient_store_pool_enable: bool = False
    commit_interval_commitlog: int = 200
    commit_commitlog_least_pages: int = 4
    commit_commitlog_thorough_interval: int = 200
    warm_mapped_file_enable: bool = False  # new commit-log files written through at creation
    check_crc_on_recover: bool = True
    force_verify_prop_crc: bool = False
    append_prop_crc: bool = False  # 5.x enabledAppendPropCRC
    message_index_enable: bool = True
    enable_multi_dispatch: bool = False  # copies' offsets given at append (spec §6.8)
    # 5.x duplicationEnable: a broker's recovery then takes a record without a DUP_INFO
    # property of two parts for an invalid one (spec §2.7); rmqstore does not write it
    duplication_enable: bool = False
    message_delay_level: str = DEFAULT_DELAY_LEVELS
    cluster_name: str = "DefaultCluster"
    store_host: str | None = None  # brokerIP1:listenPort
    commitlog_dir: Path | None = None  # storePathCommitLog when it is not <root>/commitlog
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    def with_overrides(self, **values: object) -> StoreConfig:
        """A copy with every non-None value applied (recorded as coming from an option)."""
        given = {key: value for key, value in values.items() if value is not None}
        if not given:
            return self
        sources = dict(self.sources)
        sources.update(dict.fromkeys(given, "option"))
        return replace(self, sources=sources, **given)


def round_consumequeue_size(size: int) -> int:
    """The broker rounds the configured consume-queue file size up to a multiple of 20."""
    return math.ceil(size / CQ_UNIT_SIZE) * CQ_UNIT_SIZE


# Properties.load's line ends and the only characters it takes as white space
_LINE_END = re.compile(r"\r\n|[\r\n]")
_BLANK = " \t\f"
_HEX_DIGITS = frozenset(string.hexdigits)  # those of a \uXXXX escape


def parse_java_properties(text: str) -> dict[str, str]:
    """Parse Java ``.properties`` syntax as ``Properties.load`` does: ``#``/``!`` comments,
    ``=``/``:``/space separators, backslash line continuations and escapes; lines end at CR,
    LF or CRLF only, and white space is space, tab and form feed only. A malformed
    ``\\uXXXX`` escape (which stops a broker's start) is an InputError."""
    result: dict[str, str] = {}
    logical = ""
    for raw_line in _LINE_END.split(text):
        line = raw_line.lstrip(_BLANK)
        if not logical and (not line or line[0] in "#!"):
            continue
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:
            logical += line[:-1]
            continue
        logical += line
        key, value = _split_property(logical)
        result[key] = value
        logical = ""
    if logical:
        key, value = _split_property(logical)
        result[key] = value
    return result


def _split_property(line: str) -> tuple[str, str]:
    index = 0
    while index < len(line):
        char = line[index]
        if char == "\\":
            index += 2
            continue
        if char in "=:" or char in _BLANK:
            break
        index += 1
    key = line[:index]
    rest = line[index:].lstrip(_BLANK)
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(_BLANK)
    return _unescape(key, line), _unescape(rest, line)


def _unescape(text: str, line: str) -> str:
    if "\\" not in text:
        return text
    out: list[str] = []
    index = 0
    while index < len(text):
        char = text[index]
        if char != "\\" or index + 1 == len(text):
            out.append(char)
            index += 1
            continue
        following = text[index + 1]
        if following == "u":
            digits = text[index + 2 : index + 6]
            if len(digits) < 4 or not _HEX_DIGITS.issuperset(digits):
                raise InputError(
                    f"a malformed \\uXXXX escape in {quoted(line)} "
                    "(Properties.load refuses it: a broker does not start with this file)"
                )
            out.append(chr(int(digits, 16)))
            index += 6
            continue
        out.append({"t": "\t", "n": "\n", "r": "\r", "f": "\f"}.get(following, following))
        index += 2
    return "".join(out)


def left_broker_config(store_root: Path) -> Path | None:
    """The ``config/broker.properties`` a broker left in its store, when there is one: the
    store's settings when no ``--broker-config`` names others."""
    left = store_root / "config" / "broker.properties"
    return left if left.is_file() else None


def load_broker_config(path: Path, store_root: Path | None = None) -> StoreConfig:
    """Read the store-related keys of a broker's ``broker.conf``.

    ``storePathCommitLog`` under the configured ``storePathRootDir`` is re-rooted at
    ``store_root`` (the store may have been copied elsewhere); elsewhere it is used as is.
    """
    try:
        data = read_given_file(path, BROKER_CONFIG_LIMIT)
    except OSError as exc:
        raise InputError(f"cannot read broker config {path}: {exc.strerror}") from None
    if data is None:
        raise InputError(
            f"broker config {path} is longer than {BROKER_CONFIG_LIMIT} bytes; is it a broker.conf?"
        )
    # Properties.load(InputStream), as a broker reads its config: ISO 8859-1, one character
    # a byte, other characters written as \\uXXXX (UTF-8 text reaches a broker, and so the
    # CLUSTER property of every message, as the characters of its bytes)
    try:
        values = _settings(parse_java_properties(data.decode("latin-1")), store_root)
        config = StoreConfig(**values)  # type: ignore[arg-type]
        check_index_geometry(config.index_slots, config.index_entries)
    except InputError as exc:  # named, since STORE/config/broker.properties is read unasked
        raise InputError(f"broker config {path}: {exc}") from None
    sources = {name: f"broker config {path}" for name in values}
    return replace(config, sources=sources)


def _settings(props: dict[str, str], store_root: Path | None) -> dict[str, object]:
    """The StoreConfig fields the broker.conf keys in ``props`` set."""
    values: dict[str, object] = {}

    def take(key: str, *aliases: str) -> str | None:
        for name in (key, *aliases):
            if name in props:
                return props[name]
        return None

    if (size := take("mappedFileSizeCommitLog", "mapedFileSizeCommitLog")) is not None:
        values["commitlog_file_size"] = _int(size, "mappedFileSizeCommitLog")
    if (size := take("mappedFileSizeConsumeQueue", "mapedFileSizeConsumeQueue")) is not None:
        values["consumequeue_file_size"] = round_consumequeue_size(
            _int(size, "mappedFileSizeConsumeQueue")
        )
    for key, name in (
        ("maxHashSlotNum", "index_slots"),
        ("maxIndexNum", "index_entries"),
        ("maxMessageSize", "max_message_size"),
        ("flushIntervalCommitLog", "flush_interval_commitlog"),
        ("flushCommitLogLeastPages", "flush_commitlog_least_pages"),
        ("flushCommitLogThoroughInterval", "flush_commitlog_thorough_interval"),
        ("commitIntervalCommitLog", "commit_interval_commitlog"),
        ("commitCommitLogLeastPages", "commit_commitlog_least_pages"),
        ("commitCommitLogThoroughInterval", "commit_commitlog_thorough_interval"),
    ):
        if (raw := take(key)) is not None:
            values[name] = _int(raw, key)
    for key, name in (
        ("checkCRCOnRecover", "check_crc_on_recover"),
        ("forceVerifyPropCRC", "force_verify_prop_crc"),
        ("enabledAppendPropCRC", "append_prop_crc"),
        ("messageIndexEnable", "message_index_enable"),
        ("transientStorePoolEnable", "transient_store_pool_enable"),
        ("warmMapedFileEnable", "warm_mapped_file_enable"),
        ("enableMultiDispatch", "enable_multi_dispatch"),
        ("duplicationEnable", "duplication_enable"),
    ):
        if (raw := take(key)) is not None:
            values[name] = _bool(raw, key)
    if (raw := take("flushDiskType")) is not None:
        flush_type = java_trim(raw)  # FlushDiskType.valueOf: the name exactly, in capitals
        if flush_type not in ("ASYNC_FLUSH", "SYNC_FLUSH"):
            raise InputError(
                f"flushDiskType={quoted(raw)} is not ASYNC_FLUSH or SYNC_FLUSH "
                "(a broker takes only those, in capitals; it ignores any other value)"
            )
        values["flush_disk_type"] = flush_type
    # a broker takes a text setting with String.trim (java_trim); a value of spaces it sets,
    # empty: an empty delay table stops its start (refused here where the table is read),
    # an empty cluster name, host or folder is taken here as not given
    if (raw := take("messageDelayLevel")) is not None:
        values["message_delay_level"] = java_trim(raw)
    if (raw := take("brokerClusterName")) is not None and java_trim(raw):
        values["cluster_name"] = java_trim(raw)
    if (raw := take("brokerIP1")) is not None and java_trim(raw):
        port = _int(take("listenPort") or str(DEFAULT_LISTEN_PORT), "listenPort")
        host = java_trim(raw)
        values["store_host"] = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    commitlog = take("storePathCommitLog")
    if commitlog and java_trim(commitlog):
        root = take("storePathRootDir")
        values["commitlog_dir"] = _commitlog_dir(
            java_trim(commitlog), None if root is None else java_trim(root), store_root
        )
    return values


def _commitlog_dir(configured: str, configured_root: str | None, store_root: Path | None) -> Path:
    if "," in configured:
        raise InputError(
            "storePathCommitLog lists several directories "
            "(a multi-path commit log); rmqstore does not support that layout"
        )
    path = Path(configured)
    if store_root is not None and configured_root:
        try:
            relative = path.relative_to(Path(configured_root))
        except ValueError:
            return path
        return store_root / relative
    return path
