"""Where bytes go instead of being deleted.

Every operation that cuts bytes out of a store (a torn tail, stale bytes after the valid end, a
consume queue being rebuilt) first copies them into ``<store>/quarantine/<time>-<operation>/``
with a ``manifest.json`` saying where each piece came from, so nothing is ever lost.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from rmqstore.errors import StoreIOError
from rmqstore.segments import fsync_directory

QUARANTINE_DIR = "quarantine"
_COPY_CHUNK = 8 * 1024 * 1024


@dataclass
class Quarantine:
    directory: Path
    operation: str
    pieces: list[dict[str, object]] = field(default_factory=list)

    @classmethod
    def create(cls, store_root: Path, operation: str) -> Quarantine:
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        base = store_root / QUARANTINE_DIR
        for attempt in range(1000):
            suffix = f"-{attempt}" if attempt else ""
            directory = base / f"{stamp}-{operation}{suffix}"
            try:
                directory.mkdir(parents=True)
            except FileExistsError:
                continue
            except OSError as exc:
                raise StoreIOError(f"cannot create {directory}: {exc.strerror}") from None
            return cls(directory, operation)
        raise StoreIOError(f"cannot create a quarantine folder under {base}")

    def save_region(self, source: Path, start: int, end: int, description: str) -> Path:
        """Copy bytes ``[start, end)`` of ``source`` into the quarantine, durably."""
        target = self.directory / f"{source.parent.name}-{source.name}-{start}-{end}.bin"
        try:
            with open(source, "rb") as reader, open(target, "wb") as writer:
                reader.seek(start)
                remaining = end - start
                while remaining > 0:
                    chunk = reader.read(min(_COPY_CHUNK, remaining))
                    if not chunk:
                        break
                    writer.write(chunk)
                    remaining -= len(chunk)
                writer.flush()
                os.fsync(writer.fileno())
        except OSError as exc:
            raise StoreIOError(f"cannot quarantine {source}: {exc.strerror}") from None
        self._record(
            {
                "file": str(source),
                "start": start,
                "end": end,
                "copy": target.name,
                "description": description,
            }
        )
        return target

    def cut_region(self, source: Path, start: int, end: int, description: str) -> Path:
        """Copy bytes ``[start, end)`` of ``source`` here, then zero them there (durably):
        how a cut is made in a file whose size must stay as it is."""
        copy = self.save_region(source, start, end, description)
        try:
            fd = os.open(source, os.O_RDWR | os.O_NOFOLLOW)
            try:
                position = start
                while position < end:
                    length = min(end - position, _COPY_CHUNK)
                    os.pwrite(fd, bytes(length), position)
                    position += length
                os.fdatasync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise StoreIOError(f"cannot cut bytes from {source}: {exc.strerror}") from None
        return copy

    def move_path(self, source: Path, description: str) -> Path:
        """Move a whole file or directory into the quarantine (same filesystem: a rename)."""
        target = self.directory / source.name
        try:
            shutil.move(str(source), target)
            fsync_directory(source.parent)
        except OSError as exc:
            raise StoreIOError(f"cannot move {source} to quarantine: {exc.strerror}") from None
        self._record({"file": str(source), "moved": target.name, "description": description})
        return target

    def _record(self, piece: dict[str, object]) -> None:
        self.pieces.append(piece)
        manifest = {"operation": self.operation, "pieces": self.pieces}
        try:
            path = self.directory / "manifest.json"
            path.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
            fsync_directory(self.directory)
        except OSError as exc:
            raise StoreIOError(f"cannot write quarantine manifest: {exc.strerror}") from None
