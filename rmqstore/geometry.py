"""``config/rmqstore-geometry.json``: the file sizes a store was made with, remembered with it.

An index file does not record its slot and entry counts, and a consume queue not yet written
does not record its file size, so a store created with non-default sizes would be written with
the defaults by the next command that is not told them again (and a broker configured for the
store would then refuse those files). The first writer that is given the sizes (or creates
the store) records them here; every later command uses them, and an option that contradicts
them is refused. Brokers ignore files under ``config/`` they do not know. Keys are the broker's
own configuration keys, so the file reads like the ``broker.conf`` it stands for.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from rmqstore.config import (
    BROKER_INT_BOUNDS,
    DEFAULT_COMMITLOG_FILE_SIZE,
    DEFAULT_CONSUMEQUEUE_FILE_SIZE,
    DEFAULT_INDEX_ENTRIES,
    DEFAULT_INDEX_SLOTS,
    StoreConfig,
    left_broker_config,
    load_broker_config,
)
from rmqstore.consumequeue import CQ_UNIT_SIZE
from rmqstore.errors import InputError, StoreFormatError, StoreIOError
from rmqstore.indexfile import infer_geometry, read_index_headers
from rmqstore.jsontext import parse_json
from rmqstore.segments import (
    BY_NAME,
    is_segment_name,
    make_directories,
    read_small_file,
    usual_size,
    write_whole_file,
)
from rmqstore.wording import quoted

CONFIG_DIR = "config"
GEOMETRY_FILE = "rmqstore-geometry.json"
# StoreConfig field -> broker.conf key
GEOMETRY_KEYS = {
    "commitlog_file_size": "mappedFileSizeCommitLog",
    "consumequeue_file_size": "mappedFileSizeConsumeQueue",
    "index_slots": "maxHashSlotNum",
    "index_entries": "maxIndexNum",
}
_MAX_FILE_BYTES = 64 * 1024


def geometry_path(root: Path) -> Path:
    return root / CONFIG_DIR / GEOMETRY_FILE


# how to get past a damaged geometry file: every command of the store stops on it
_DAMAGED = (
    " (rmqstore's record of the file sizes given before: put it right, or move it aside and "
    "give the sizes, as options or with --broker-config)"
)


def read_geometry(root: Path) -> dict[str, int]:
    """The remembered sizes by StoreConfig field name (empty when none are remembered)."""
    path = geometry_path(root)
    try:
        document = parse_json(read_small_file(path, _MAX_FILE_BYTES))
    except (FileNotFoundError, NotADirectoryError):  # no config/ folder, or a file in its place
        return {}
    except OSError as exc:
        raise StoreIOError(f"cannot read {path}: {exc.strerror}") from None
    except (ValueError, UnicodeDecodeError):
        raise StoreFormatError(f"{path} is not valid JSON{_DAMAGED}") from None
    if not isinstance(document, dict):
        raise StoreFormatError(f"{path} is not a JSON object{_DAMAGED}")
    values: dict[str, int] = {}
    for name, key in GEOMETRY_KEYS.items():
        if key not in document:
            continue
        value = document[key]
        smallest, largest = BROKER_INT_BOUNDS[key]
        whole = isinstance(value, int) and not isinstance(value, bool)
        if not whole or not smallest <= value <= largest:
            raise StoreFormatError(
                f"{path}: {key} must be an integer from {smallest:,} to {largest:,}, "
                f"not {quoted(value)}{_DAMAGED}"
            )
        values[name] = value
    return values


def write_geometry(root: Path, values: dict[str, int]) -> None:
    """Record ``values`` (StoreConfig field names) durably, written whole."""
    path = geometry_path(root)
    document = {GEOMETRY_KEYS[name]: value for name, value in sorted(values.items())}
    try:
        make_directories(path.parent)
        write_whole_file(path, (json.dumps(document, indent=2, sort_keys=True) + "\n").encode())
    except OSError as exc:
        raise StoreIOError(f"cannot write {path}: {exc.strerror}") from None


def stated_file_size(root: Path, name: str) -> int | None:
    """The size of the files of kind ``name`` (``commitlog_file_size`` or
    ``consumequeue_file_size``) the store itself states: its remembered geometry (rmqstore
    writes it), else the ``broker.properties`` a broker left in its ``config/`` (as the
    commands take it); None when neither names one."""
    size = read_geometry(root).get(name)
    if size is None and (left := left_broker_config(root)) is not None:
        size = getattr(load_broker_config(left, root), name)
    return size


def store_queue_file_size(root: Path) -> int | None:
    """The consume-queue file size of a store as the commands take it without options: the
    one it states, else the most common one of its queues' files (None: no queue files)."""
    stated = stated_file_size(root, "consumequeue_file_size")
    return (
        stated
        if stated is not None
        else _infer_file_size(root / "consumequeue", 2, _QUEUE_SIZES, CQ_UNIT_SIZE)
    )


_COMMITLOG_SIZES = BROKER_INT_BOUNDS["mappedFileSizeCommitLog"]
_QUEUE_SIZES = BROKER_INT_BOUNDS["mappedFileSizeConsumeQueue"]


def _infer_file_size(
    directory: Path, depth: int, sizes_allowed: tuple[int, int], unit: int = 1
) -> int | None:
    """The most common size of the segment files ``depth`` levels below ``directory`` (the
    first file of each queue), among sizes a broker can configure (``sizes_allowed``, the
    smallest and the largest, and a multiple of ``unit``: 20 for consume queues). The most
    common one (:func:`usual_size`: of two files, a truncated one and a whole one, the whole
    one's), so a single damaged file cannot skew it; the folders are taken in order until
    one size leads every other by _CLEAR_LEAD files (a store of thousands of queues, all of
    one size, is not listed whole at every start). A commit log's only file cut to 1,457
    bytes was taken for the size of its files: a replica made from it remembered that size,
    which no command then accepted (now the store's files are said not to be of the size a
    broker loads, as for any other cut file)."""
    if not directory.is_dir():
        return None
    sizes: Counter[int] = Counter()
    for folder in _folders(str(directory), depth):
        for entry in sorted(os.scandir(folder), key=BY_NAME):
            if is_segment_name(entry.name) and entry.is_file():
                size = entry.stat().st_size
                if sizes_allowed[0] <= size <= sizes_allowed[1] and size % unit == 0:
                    sizes[size] += 1
                if depth:
                    break  # one file per queue is enough
        if depth and _clear_lead(sizes):
            break
    return usual_size(sizes) if sizes else None


# how many files more than any other size the most common one needs for the count to stop
_CLEAR_LEAD = 32


def _clear_lead(sizes: Counter[int]) -> bool:
    ranked = sizes.most_common(2)
    if not ranked:
        return False
    runner_up = ranked[1][1] if len(ranked) > 1 else 0
    return ranked[0][1] - runner_up >= _CLEAR_LEAD


def _folders(directory: str, depth: int) -> Iterator[str]:
    """The folders ``depth`` levels below ``directory``, sorted as paths, listed as they are
    reached (directory entries tell their kinds: no stat of each)."""
    if not depth:
        yield directory
        return
    for entry in sorted(os.scandir(directory), key=BY_NAME):
        if entry.is_dir():
            yield from _folders(entry.path, depth - 1)


_REMEMBERED = f"the store's {CONFIG_DIR}/{GEOMETRY_FILE}"
_INDEX_DEFAULTS = {"index_slots": DEFAULT_INDEX_SLOTS, "index_entries": DEFAULT_INDEX_ENTRIES}
INDEX_GEOMETRY = frozenset(_INDEX_DEFAULTS)
QUEUE_GEOMETRY = frozenset({"consumequeue_file_size"})


def _given_geometry(config: StoreConfig) -> dict[str, int]:
    """The sizes the caller said (an option, ``--broker-config``, or a StoreConfig built with
    them), not defaults: file sizes that are set, index counts named in the sources or
    other than RocketMQ's defaults."""
    given = {}
    for name in GEOMETRY_KEYS:
        value = getattr(config, name)
        default = _INDEX_DEFAULTS.get(name)
        if value is not None and (name in config.sources or value != default):
            given[name] = value
    return given


def resolve_geometry(
    root: Path, config: StoreConfig, replacing: frozenset[str] = frozenset()
) -> StoreConfig:
    """Fill unset file sizes from the store's remembered geometry, else existing files, else
    RocketMQ's defaults. A size given that contradicts the remembered one is refused, but
    for files being replaced whole (``replacing``)."""
    remembered = read_geometry(root)
    values: dict[str, int] = {}
    sources = dict(config.sources)
    given = _given_geometry(config)
    for name, value in remembered.items():
        if name in given and given[name] != value and name not in replacing:
            raise InputError(
                f"{GEOMETRY_KEYS[name]} is {given[name]} by {sources.get(name, 'the caller')}, "
                f"but the store was made with {value} ({_REMEMBERED}); files of another size "
                "would not load"
            )
        if name not in given:
            values[name] = value
            sources[name] = _REMEMBERED
    if config.commitlog_file_size is None and "commitlog_file_size" not in values:
        inferred = _infer_file_size(config.commitlog_dir or root / "commitlog", 0, _COMMITLOG_SIZES)
        values["commitlog_file_size"] = inferred or DEFAULT_COMMITLOG_FILE_SIZE
        sources["commitlog_file_size"] = "existing files" if inferred else "default"
    if config.consumequeue_file_size is None and "consumequeue_file_size" not in values:
        inferred = _infer_file_size(root / "consumequeue", 2, _QUEUE_SIZES, CQ_UNIT_SIZE)
        values["consumequeue_file_size"] = inferred or DEFAULT_CONSUMEQUEUE_FILE_SIZE
        sources["consumequeue_file_size"] = "existing files" if inferred else "default"
    if not {"index_slots", "index_entries"} & (set(given) | set(values)):
        sizes = {path.stat().st_size for path, _ in read_index_headers(root / "index")}
        inferred = infer_geometry(sizes.pop()) if len(sizes) == 1 else None
        if inferred is not None and inferred != (config.index_slots, config.index_entries):
            values["index_slots"], values["index_entries"] = inferred
            sources["index_slots"] = sources["index_entries"] = (
                "existing files (at RocketMQ's ratio of 4 entries per slot)"
            )
    for name in ("index_slots", "index_entries", "max_message_size"):
        sources.setdefault(name, "default")
    return replace(config, sources=sources, **values)


def remember_geometry(
    root: Path, given: StoreConfig, resolved: StoreConfig, *, created: bool
) -> None:
    """Record with the store, once a writer finished with it, the sizes the caller gave that
    it did not remember yet, and for a new store the commit-log file size it was made with.
    Sizes nobody gave stay free: no file of theirs exists yet to contradict."""
    remembered = read_geometry(root)
    wanted = {**remembered, **_given_geometry(given)}
    if created:
        wanted["commitlog_file_size"] = resolved.commitlog_file_size
    if wanted != remembered:
        write_geometry(root, wanted)
