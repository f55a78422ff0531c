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
import stat
from pathlib import Path

from rmqstore.errors import StoreFormatError, StoreIOError
from rmqstore.segments import fsync_directory, make_directories

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
_MAX_VALUE = (1 << 62) - 1


def geometry_path(root: Path) -> Path:
    return root / CONFIG_DIR / GEOMETRY_FILE


def read_geometry(root: Path) -> dict[str, int]:
    """The remembered sizes by StoreConfig field name (empty when none are remembered)."""
    path = geometry_path(root)
    try:
        status = os.lstat(path)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise StoreIOError(f"cannot read {path}: {exc.strerror}") from None
    if not stat.S_ISREG(status.st_mode) or status.st_size > _MAX_FILE_BYTES:
        raise StoreFormatError(f"{path} is not a small regular file")
    try:
        with open(path, "rb") as handle:
            document = json.loads(handle.read(_MAX_FILE_BYTES))
    except OSError as exc:
        raise StoreIOError(f"cannot read {path}: {exc.strerror}") from None
    except (ValueError, UnicodeDecodeError):
        raise StoreFormatError(f"{path} is not valid JSON") from None
    if not isinstance(document, dict):
        raise StoreFormatError(f"{path} is not a JSON object")
    values: dict[str, int] = {}
    for name, key in GEOMETRY_KEYS.items():
        if key not in document:
            continue
        value = document[key]
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= _MAX_VALUE:
            raise StoreFormatError(f"{path}: {key} must be a positive integer, not {value!r}")
        values[name] = value
    return values


def write_geometry(root: Path, values: dict[str, int]) -> None:
    """Record ``values`` (StoreConfig field names) durably: written under a temporary name,
    fsynced and renamed into place."""
    path = geometry_path(root)
    document = {GEOMETRY_KEYS[name]: value for name, value in sorted(values.items())}
    temporary = path.with_name(f".{GEOMETRY_FILE}.tmp")
    try:
        make_directories(path.parent)
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        try:
            os.write(fd, (json.dumps(document, indent=2, sort_keys=True) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
        fsync_directory(path.parent)
    except OSError as exc:
        raise StoreIOError(f"cannot write {path}: {exc.strerror}") from None
