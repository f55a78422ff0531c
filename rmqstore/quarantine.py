"""Where bytes go instead of being deleted.

Every operation that cuts bytes out of a store (a torn tail, stale bytes after the valid end, a
consume queue being rebuilt) first copies them into ``<store>/quarantine/<time>-<operation>/``
with a ``manifest.json`` saying where each piece came from, so nothing is ever lost.

A piece keeps its store-relative path inside the quarantine folder (``consumequeue/A/0/…``), so
two files with the same name in different folders never collide. Before any source byte is
changed, the copy, every directory on its path and the manifest are durable: a crash at any
point leaves either the untouched source or a complete, findable copy.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from rmqstore.errors import StoreFormatError, StoreIOError
from rmqstore.jsontext import parse_json
from rmqstore.segments import (
    all_zeros,
    creating_name,
    fsync_directory,
    make_directories,
    pwrite_fully,
    read_small_file,
    refuse_shared,
    write_whole_file,
)

QUARANTINE_DIR = "quarantine"
MANIFEST_FILE = "manifest.json"
_COPY_CHUNK = 8 * 1024 * 1024
# a manifest longer than this is not one rmqstore wrote (a piece takes about 250 bytes)
_MANIFEST_LIMIT = 64 * 1024 * 1024
# moves waiting to be listed in the manifest at most (see Quarantine.move_path)
_PENDING_PIECES = 256
# a copy of a file the operation rewrites, until it is whole (see Quarantine.keep_copy)
_COPYING_SUFFIX = ".copying"


@dataclass
class Quarantine:
    directory: Path
    operation: str
    store_root: Path
    pieces: list[dict[str, object]] = field(default_factory=list)
    # each piece as it stands in the manifest, serialized once (not again for every piece
    # after it: 4,000 pieces took 20 s of JSON encoding)
    _piece_texts: list[str] = field(default_factory=list, repr=False)
    _pending: list[dict[str, object]] = field(default_factory=list, repr=False)

    @classmethod
    def create(cls, store_root: Path, operation: str) -> Quarantine:
        """A new, durable, empty folder under ``<store>/quarantine/``. A ``quarantine`` that is
        a link (or not a directory) is refused: moved bytes must stay inside the store."""
        base = store_root / QUARANTINE_DIR
        try:
            mode = os.lstat(base).st_mode
        except FileNotFoundError:
            mode = None
        except OSError as exc:
            raise StoreIOError(f"cannot inspect {base}: {exc.strerror}") from None
        if mode is not None and not stat.S_ISDIR(mode):
            kind = "a symbolic link" if stat.S_ISLNK(mode) else "not a directory"
            raise StoreFormatError(
                f"{base} is {kind}; rmqstore keeps cut bytes only inside the store "
                "(move it away and run the command again)"
            )
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        try:
            make_directories(base)
        except OSError as exc:
            raise StoreIOError(f"cannot create {base}: {exc.strerror}") from None
        _remove_leftovers(base)
        for attempt in range(1000):
            suffix = f"-{attempt}" if attempt else ""
            directory = base / f"{stamp}-{operation}{suffix}"
            if os.path.lexists(directory):
                continue
            # made whole under a hidden name, its (empty) manifest in it, then renamed: a
            # kill leaves no folder, or one that restore reads (a folder without a manifest
            # could not be restored, whatever was moved into it before the first was written)
            staged = base / f".{directory.name}{_CREATING_SUFFIX}"
            try:
                staged.mkdir()
                folder = cls(staged, operation, store_root)
                folder._record()
                os.rename(staged, directory)
                fsync_directory(base)
            except FileExistsError:
                continue
            except OSError as exc:
                raise StoreIOError(f"cannot create {directory}: {exc.strerror}") from None
            folder.directory = directory
            return folder
        raise StoreIOError(f"cannot create a quarantine folder under {base}")

    def relative_place(self, source: Path) -> Path:
        """Where ``source`` goes inside this folder: its path relative to the store root, or
        under ``external/`` by its absolute path when it lies elsewhere (a commit log
        configured outside the store root)."""
        try:
            return source.relative_to(self.store_root)
        except ValueError:
            return Path("external", *source.absolute().parts[1:])

    def _free_target(self, relative: Path) -> Path:
        """A path for a new piece that no earlier piece of this operation uses, its parent
        directories created and durable."""
        target = self.directory / relative
        candidate = target
        number = 1
        while os.path.lexists(candidate):
            candidate = target.with_name(f"{target.name}~{number}")
            number += 1
        try:
            make_directories(candidate.parent)
        except OSError as exc:
            raise StoreIOError(f"cannot create {candidate.parent}: {exc.strerror}") from None
        return candidate

    def save_region(self, source: Path, start: int, end: int, description: str) -> Path:
        """Copy bytes ``[start, end)`` of ``source`` into the quarantine, durably; a source
        that ends before ``end`` is refused (the copy would be short of what is cut)."""
        relative = self.relative_place(source)
        target = self._free_target(relative.with_name(f"{relative.name}.{start}-{end}.bin"))
        try:
            reader_fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                writer_fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                try:
                    copied = _copy_range(reader_fd, writer_fd, start, end)
                    os.fsync(writer_fd)
                finally:
                    os.close(writer_fd)
            finally:
                os.close(reader_fd)
            fsync_directory(target.parent)
        except OSError as exc:
            raise StoreIOError(f"cannot quarantine {source}: {exc.strerror}") from None
        if copied != end - start:
            raise StoreFormatError(
                f"{source} ends at byte {start + copied}, before the bytes {start}-{end} to "
                "quarantine end; nothing was cut"
            )
        self._record(
            {
                "file": str(source),
                "start": start,
                "end": end,
                "copy": str(target.relative_to(self.directory)),
                "description": description,
            }
        )
        return target

    def cut_region(self, source: Path, start: int, end: int, description: str) -> Path:
        """Copy bytes ``[start, end)`` of ``source`` here, then zero them there (durably):
        how a cut is made in a file whose size must stay as it is. A file with other hard
        links is refused before anything is copied (:func:`refuse_shared`)."""
        refuse_shared(source)
        copy = self.save_region(source, start, end, description)
        try:
            fd = os.open(source, os.O_RDWR | os.O_NOFOLLOW)
            try:
                position = start
                while position < end:
                    length = min(end - position, _COPY_CHUNK)
                    pwrite_fully(fd, bytes(length), position)
                    position += length
                os.fdatasync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise StoreIOError(f"cannot cut bytes from {source}: {exc.strerror}") from None
        return copy

    def move_path(self, source: Path, description: str, *, list_later: bool = False) -> Path:
        """Move a whole file or directory into the quarantine. A rename on one filesystem;
        across filesystems a durable copy first, and only then the source is removed.

        ``list_later``: the move is listed in the manifest with the next piece listed at
        once, or by :meth:`list_pending` (at most :data:`_PENDING_PIECES` moves wait): for
        an operation moving thousands of files (rewriting the manifest for each, with its two
        fsyncs, was half of a recovery that moved 4,000 queue files). A move changes no byte,
        and a piece the manifest does not list yet goes back by its path all the same."""
        target = self._free_target(self.relative_place(source))
        try:
            try:
                os.rename(source, target)
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
                _durable_copy(source, target)
                fsync_directory(target.parent)
                if source.is_dir() and not source.is_symlink():
                    shutil.rmtree(source)
                else:
                    source.unlink()
            fsync_directory(target.parent)
            fsync_directory(source.parent)
        except OSError as exc:
            raise StoreIOError(f"cannot move {source} to quarantine: {exc.strerror}") from None
        piece = {
            "file": str(source),
            "moved": str(target.relative_to(self.directory)),
            "description": description,
        }
        if list_later and len(self._pending) + 1 < _PENDING_PIECES:
            self._pending.append(piece)
        else:
            self._record(piece)
        return target

    def list_pending(self) -> None:
        """List the moves waiting to be listed (see :meth:`move_path`)."""
        if self._pending:
            self._record()

    def keep_copy(self, source: Path, existed: bool, description: str) -> None:
        """Keep what ``source`` (a small file the operation rewrites, creates or removes:
        the checkpoint, ``abort``) holds now: a durable copy, listed as moved here, and
        ``source`` listed as made, so that a restore sets the operation's version aside and
        puts this one back. When it did not exist (``existed`` false: ``abort`` a writer has
        created since it began) it is only listed as made, for a restore to set aside. A
        link, or anything but a regular file, is neither copied nor listed."""
        try:
            mode: int | None = os.lstat(source).st_mode
        except FileNotFoundError:
            mode = None
        except OSError as exc:
            raise StoreIOError(f"cannot inspect {source}: {exc.strerror}") from None
        if mode is not None and not stat.S_ISREG(mode):
            return
        relative = self.relative_place(source)
        if relative.parts[0] == "external":
            return
        made = {
            "made": str(relative),
            "description": f"{description}: as the {self.operation} left it",
        }
        if mode is None or not existed:
            self._record(made)
            return
        # listed first, then copied under a name a restore passes over and renamed: a kill
        # before the rename leaves the copy missing, which a restore takes for a piece put
        # back already (the file is still the one copied), never half a copy put back
        target = self._free_target(relative)
        self._record(
            {
                "file": str(source),
                "moved": str(target.relative_to(self.directory)),
                "copied": True,
                "description": f"{description}: as it was before the {self.operation}",
            },
            made,
        )
        copying = target.with_name(f".{target.name}{_COPYING_SUFFIX}")
        try:
            _durable_copy(source, copying)
            os.rename(copying, target)
            fsync_directory(target.parent)
        except OSError as exc:
            raise StoreIOError(f"cannot quarantine {source}: {exc.strerror}") from None

    def discard(self) -> None:
        """Remove this folder, made by an operation that stopped before it changed the store
        (a full disk while it kept the checkpoint): it holds copies of files the store still
        holds as they were, never bytes cut out of it. As the removal of a restored folder:
        what a failure leaves goes with the next folder made."""
        with contextlib.suppress(StoreIOError):
            _remove_folder(self.directory.parent, self.directory.name)

    def note_made(self, paths: list[Path], description: str) -> None:
        """List ``paths``, which the operation makes (or is about to make) in the store, in
        place of what it moved here or beside it: ``quarantine restore`` sets them aside into a
        folder of their own before it puts this folder's pieces back, so that a restore undoes
        the operation instead of finding the pieces' places taken."""
        entries = [
            {"made": str(path.relative_to(self.store_root)), "description": description}
            for path in paths
            if path.is_relative_to(self.store_root)
        ]
        if entries:
            self._record(*entries)

    def _record(self, *pieces: dict[str, object]) -> None:
        """Add pieces to the manifest (after the moves waiting to be listed), written whole
        under a temporary name and renamed into place, so a crash leaves the previous
        manifest or the new one, never half of one."""
        pieces = (*self._pending, *pieces)
        self._pending.clear()
        for piece in pieces:
            self.pieces.append(piece)
            self._piece_texts.append(json.dumps(piece, indent=2).replace("\n", "\n    "))
        manifest = (  # what json.dumps(..., indent=2) writes for the whole document
            f'{{\n  "operation": {json.dumps(self.operation)},\n  "pieces": [\n    '
            + ",\n    ".join(self._piece_texts)
            + "\n  ]\n}\n"
        )
        try:
            write_whole_file(self.directory / MANIFEST_FILE, manifest.encode())
        except OSError as exc:
            raise StoreIOError(f"cannot write quarantine manifest: {exc.strerror}") from None


def _copy_range(reader_fd: int, writer_fd: int, start: int, end: int) -> int:
    """Bytes ``[start, end)`` of the reader to the start of the writer, every one written
    (see :func:`pwrite_fully`); how many there were (fewer if the reader ends first)."""
    position = start
    while position < end:
        chunk = os.pread(reader_fd, min(_COPY_CHUNK, end - position), position)
        if not chunk:
            break
        pwrite_fully(writer_fd, chunk, position - start)
        position += len(chunk)
    return position - start


def _durable_copy(source: Path, target: Path) -> None:
    """Copy a file or a directory tree (links copied as links), every file and directory
    fsynced; a regular file's holes stay holes (an index or commit-log file is mostly
    zeros a broker never wrote)."""
    if source.is_symlink() or not source.is_dir():
        if source.is_file() and not source.is_symlink():
            sparse_copy(source, target)
        else:
            shutil.copy2(source, target, follow_symlinks=False)
        if not target.is_symlink():
            _fsync_file(target)
        return
    shutil.copytree(source, target, symlinks=True, copy_function=sparse_copy)
    for directory, _subdirectories, names in os.walk(target):
        for name in names:
            path = Path(directory) / name
            if not path.is_symlink():
                _fsync_file(path)
        fsync_directory(Path(directory))


def sparse_copy(source: str | Path, target: str | Path) -> None:
    """``shutil.copy2`` of a regular file that copies only its data (SEEK_DATA/SEEK_HOLE)
    and leaves its holes as holes; where the filesystem cannot say, every byte. (A tree's
    links are copied as links by ``copytree`` itself.)"""
    reader_fd = os.open(source, os.O_RDONLY)
    try:
        size = os.fstat(reader_fd).st_size
        writer_fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            position = 0
            while position < size:
                try:
                    data = os.lseek(reader_fd, position, os.SEEK_DATA)
                    hole = os.lseek(reader_fd, data, os.SEEK_HOLE)
                except OSError as exc:
                    if exc.errno == errno.ENXIO:
                        break  # no data after here: a hole to the end
                    data, hole = position, size  # cannot say: every byte
                position = data
                while position < hole:  # the same positions in the copy
                    chunk = os.pread(reader_fd, min(_COPY_CHUNK, hole - position), position)
                    if not chunk:
                        break  # the file ended sooner
                    pwrite_fully(writer_fd, chunk, position)
                    position += len(chunk)
                if position < hole:
                    break
            os.ftruncate(writer_fd, size)
        finally:
            os.close(writer_fd)
    finally:
        os.close(reader_fd)
    shutil.copystat(source, target)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class QuarantineFolder:
    """One folder of cut bytes under ``<store>/quarantine/``: what made it, when, and how
    much it holds."""

    name: str
    operation: str
    created: str  # UTC, from the folder's name (YYYYmmddTHHMMSS)
    pieces: int
    bytes: int
    manifest_ok: bool

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "operation": self.operation,
            "created": self.created,
            "pieces": self.pieces,
            "bytes": self.bytes,
            "manifestOk": self.manifest_ok,
        }


def quarantine_base(store_root: Path) -> Path | None:
    """``<store>/quarantine`` when it is a directory (not a link); None when there is none.
    A link or a file there is refused: rmqstore never follows one out of the store."""
    base = store_root / QUARANTINE_DIR
    try:
        mode = os.lstat(base).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StoreIOError(f"cannot inspect {base}: {exc.strerror}") from None
    if not stat.S_ISDIR(mode):
        kind = "a symbolic link" if stat.S_ISLNK(mode) else "not a directory"
        raise StoreFormatError(f"{base} is {kind}; rmqstore does not follow it")
    return base


def list_quarantine(store_root: Path) -> list[QuarantineFolder]:
    """The quarantine folders of a store, oldest first."""
    base = quarantine_base(store_root)
    if base is None:
        return []
    folders = []
    for entry in sorted(os.scandir(base), key=lambda item: item.name):
        if not entry.is_dir(follow_symlinks=False) or entry.name.startswith("."):
            continue
        folder = Path(entry.path)
        pieces, manifest_ok, operation = 0, True, entry.name.partition("-")[2]
        try:
            manifest = _read_manifest(folder)
            pieces = sum(
                not (isinstance(piece, dict) and "made" in piece) for piece in manifest["pieces"]
            )
            operation = str(manifest.get("operation", operation))
        except (OSError, ValueError, KeyError, TypeError, StoreFormatError):
            manifest_ok = False
        size = 0
        for directory, _subdirectories, names in os.walk(folder):
            for name in names:
                try:
                    size += os.lstat(Path(directory) / name).st_size
                except OSError:
                    continue
        stamp = entry.name.partition("-")[0]
        try:
            created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.strptime(stamp, "%Y%m%dT%H%M%S"))
        except ValueError:
            created = ""
        folders.append(QuarantineFolder(entry.name, operation, created, pieces, size, manifest_ok))
    return folders


def _read_manifest(folder: Path) -> dict:
    """A folder's manifest: a regular file (a FIFO planted there is never waited on) of
    bounded size, holding a JSON object; ValueError, OSError or StoreFormatError if not."""
    manifest = parse_json(read_small_file(folder / MANIFEST_FILE, _MANIFEST_LIMIT))
    if not isinstance(manifest, dict):
        raise ValueError("not a JSON object")
    return manifest


def plan_purge(store_root: Path, names: list[str] | None) -> tuple[list[str], int]:
    """The quarantine folders a purge of ``names`` (None: every folder) deletes, each once,
    and the bytes they hold. Refuses (StoreFormatError) a name that is not a folder directly
    under ``<store>/quarantine``, as the purge itself does, so a dry run says what it would."""
    known = {folder.name: folder for folder in list_quarantine(store_root)}
    chosen = list(known) if names is None else list(dict.fromkeys(names))
    missing = [name for name in chosen if name not in known]
    if missing:
        raise StoreFormatError(f"no quarantine folder {', '.join(missing)} in {store_root}")
    return chosen, sum(known[name].bytes for name in chosen)


def purge_quarantine(store_root: Path, names: list[str]) -> int:
    """Delete quarantine folders ``names`` (their bytes are gone for good; a name given
    twice is deleted once); the bytes freed. Only names of folders directly under
    ``<store>/quarantine`` are taken."""
    base = quarantine_base(store_root)
    known = {folder.name: folder for folder in list_quarantine(store_root)}
    names = list(dict.fromkeys(names))
    missing = [name for name in names if name not in known]
    if base is None or missing:
        raise StoreFormatError(
            f"no quarantine folder {', '.join(missing or names)} in {store_root}"
        )
    _remove_leftovers(base)
    freed = 0
    for name in names:  # links inside are removed, never followed
        _remove_folder(base, name, _PURGED_SUFFIX)
        freed += known[name].bytes
    return freed


@dataclass(frozen=True)
class RestoreStep:
    """One piece of a quarantine folder going back where it came from."""

    # "move back" (a whole file or folder), "write back" (a cut byte range), or "set aside"
    # (what the operation made, moved into a new quarantine folder before the pieces go back)
    kind: str
    piece: Path  # inside the quarantine folder (for "set aside": the target again)
    target: Path  # inside the store
    start: int = 0
    end: int = 0

    def to_dict(self) -> dict[str, object]:
        document: dict[str, object] = {"kind": self.kind, "target": str(self.target)}
        if self.kind == "write back":
            document.update(start=self.start, end=self.end)
        return document


_RESTORED_SUFFIX = ".restored"  # a folder put back in full, being deleted
_PURGED_SUFFIX = ".purged"  # a folder quarantine purge is deleting
_CREATING_SUFFIX = ".creating"  # a folder being made, until its first manifest is in it
# the writers' lock (held while the restore runs) and the quarantine itself
_NEVER_SET_ASIDE = frozenset({"lock", QUARANTINE_DIR, "."})
_COPY_SUFFIX = re.compile(r"\.([0-9]+)-([0-9]+)\.bin$")
_TWIN_SUFFIX = re.compile(r"~[0-9]+$")


def plan_restore(store_root: Path, name: str) -> list[RestoreStep]:
    """How quarantine folder ``name`` goes back into the store; refuses (before anything is
    changed) a piece whose place is taken: a moved file whose path exists again, a cut range
    that is no longer all zeros (written since) or whose file is gone, and a piece missing
    from the folder or of another length than its range. A piece already back (a restore
    that stopped part-way: a moved one gone from the folder with its path there again, a
    range holding the piece's bytes) is left out, so running the restore again finishes
    it. Places come from the pieces' own paths inside the folder, never from the manifest's
    text, and must lie inside the store without passing through a link. A file in the
    folder that the manifest does not list (a kill between moving a piece and listing it)
    goes back too, by its path, rather than being deleted with the folder."""
    base = quarantine_base(store_root)
    if base is None or name not in {f.name for f in list_quarantine(store_root)}:
        raise StoreFormatError(f"no quarantine folder {name} in {store_root}")
    folder = base / name
    try:
        manifest = _read_manifest(folder)
        pieces = list(manifest["pieces"])
    except (OSError, ValueError, KeyError, TypeError, StoreFormatError):
        raise StoreFormatError(f"{folder} has no readable {MANIFEST_FILE}") from None
    places: list[tuple[Path, bool]] = []  # (place in the folder, a cut range)
    made: list[Path] = []  # what the operation made in the store
    for piece in pieces:
        if not isinstance(piece, dict):
            raise StoreFormatError(f"{folder}: {MANIFEST_FILE} lists a piece that is not one")
        if "made" in piece:
            relative = Path(str(piece["made"]))
            if (
                not relative.parts
                or relative.is_absolute()
                or ".." in relative.parts
                or relative.parts[0] in _NEVER_SET_ASIDE
            ):
                raise StoreFormatError(
                    f"{folder}: a made path names no place a restore may set aside"
                )
            _check_inside(store_root, store_root / relative)
            made.append(store_root / relative)
            continue
        relative = Path(str(piece.get("moved") or piece.get("copy") or ""))
        if not relative.parts or relative.is_absolute() or ".." in relative.parts:
            raise StoreFormatError(f"{folder}: a piece names no place inside the folder")
        places.append((relative, "moved" not in piece))
    listed = {relative for relative, _ in places}
    places += [
        (relative, _COPY_SUFFIX.search(_TWIN_SUFFIX.sub("", relative.name)) is not None)
        for relative in unlisted_pieces(folder, listed)
    ]
    every_step = [_restore_step(store_root, folder, relative, cut) for relative, cut in places]
    steps = []
    in_the_way: list[Path] = []
    for step in every_step:
        if step.kind == "move back" and step.target in made and os.path.lexists(step.piece):
            if os.path.lexists(step.target):  # the operation's own output holds the place
                in_the_way.append(step.target)
            steps.append(step)
        elif not _already_back(step):
            steps.append(step)
    # what the operation made beside its pieces' places (an index file recover rebuilt); one
    # already set aside by a restore that stopped part-way is not there any more
    targets = {step.target for step in every_step}
    in_the_way += [path for path in made if path not in targets and os.path.lexists(path)]
    aside = [RestoreStep("set aside", path, path) for path in dict.fromkeys(in_the_way)]
    return aside + steps


def _restore_step(store_root: Path, folder: Path, relative: Path, cut: bool) -> RestoreStep:
    """How the piece at ``relative`` in ``folder`` goes back: moved back, or (``cut``) its
    range written back into its file."""
    if relative.parts[0] == "external":
        raise StoreFormatError(
            f"{folder / relative} came from outside the store; put it back by hand"
        )
    stem = _TWIN_SUFFIX.sub("", relative.name)
    if not cut:
        target = store_root / relative.with_name(stem)
        step = RestoreStep("move back", folder / relative, target)
    else:
        matched = _COPY_SUFFIX.search(stem)
        if matched is None:
            raise StoreFormatError(f"{folder / relative} is not a cut range")
        start, end = int(matched.group(1)), int(matched.group(2))
        if start >= end:
            raise StoreFormatError(f"{folder / relative} is not a cut range")
        target = store_root / relative.with_name(stem[: matched.start()])
        refuse_shared(target)  # writing it back would change another path's bytes too
        step = RestoreStep("write back", folder / relative, target, start, end)
    _check_inside(store_root, target)
    return step


def unlisted_pieces(folder: Path, listed: set[Path]) -> list[Path]:
    """The files and links in a quarantine folder (by their place in it) that are neither a
    listed piece nor inside one, the manifest and its temporary aside, nor a copy a kill
    left unfinished (its file is still in the store)."""
    found = []
    for directory, subdirectories, names in os.walk(folder):
        here = Path(directory).relative_to(folder)
        subdirectories[:] = [d for d in subdirectories if here / d not in listed]
        for name in sorted(names) + [
            d for d in subdirectories if (Path(directory) / d).is_symlink()
        ]:
            relative = here / name
            if (
                relative in listed
                or (here == Path(".") and name in (MANIFEST_FILE, creating_name(MANIFEST_FILE)))
                or (name.startswith(".") and name.endswith(_COPYING_SUFFIX))
            ):
                continue
            found.append(relative)
    return found


def _check_inside(store_root: Path, target: Path) -> None:
    """No directory between the store root and ``target``, nor ``target``, is a link (the
    target's path, built from parts without "..", stays inside the store as written)."""
    current = store_root
    for part in target.relative_to(store_root).parts:
        current = current / part
        if current.is_symlink():
            raise StoreFormatError(f"{current} is a link; rmqstore does not follow it")


def _already_back(step: RestoreStep) -> bool:
    """Whether ``step``'s piece is back in place already; refuses one whose place is taken
    or whose piece is missing or damaged."""
    if step.kind == "move back":
        piece_there = os.path.lexists(step.piece)
        if not os.path.lexists(step.target):
            if not piece_there:
                raise StoreFormatError(f"{step.piece} is missing from its quarantine folder")
            return False
        if piece_there:
            raise StoreFormatError(f"{step.target} exists again; restoring would replace it")
        return True  # moved back by a restore that stopped before removing the folder
    try:
        status = os.lstat(step.piece)
        whole = stat.S_ISREG(status.st_mode) and status.st_size == step.end - step.start
    except OSError:
        whole = False
    if not whole:
        raise StoreFormatError(
            f"{step.piece} is not the {step.end - step.start} bytes it was cut as"
        )
    try:
        size = os.path.getsize(step.target)
    except OSError:
        raise StoreFormatError(f"{step.target} is gone; its cut range cannot go back") from None
    if size < step.end:
        raise StoreFormatError(f"{step.target} is shorter than its cut range")
    zeros = same = True
    with open(step.target, "rb") as handle, open(step.piece, "rb") as piece:
        position = step.start
        handle.seek(position)
        while position < step.end and (zeros or same):
            length = min(_COPY_CHUNK, step.end - position)
            held = handle.read(length)
            zeros = zeros and all_zeros(held)
            same = same and held == piece.read(length)
            position += length
    if same:
        return True  # written back by a restore that stopped before removing the folder
    if not zeros:
        raise StoreFormatError(
            f"bytes {step.start}-{step.end} of {step.target} were written since they were "
            "cut; restoring would overwrite them"
        )
    return False


@dataclass(frozen=True)
class RestoreOutcome:
    steps: list[RestoreStep]
    set_aside_in: Path | None  # the quarantine folder what the operation made was moved to


def restore_quarantine(store_root: Path, name: str) -> RestoreOutcome:
    """Put quarantine folder ``name`` back (see :func:`plan_restore`), each piece durably,
    then remove the emptied folder. What the operation made in the pieces' places (or listed
    as made beside them) is first moved into a new quarantine folder of operation
    ``restore``, whose own restore undoes this one. The caller holds the store's lock. A
    restore that stops part-way (a full disk, a kill) leaves the folder, and running it again
    finishes it."""
    steps = plan_restore(store_root, name)
    base = store_root / QUARANTINE_DIR
    _remove_leftovers(base)
    aside = [step for step in steps if step.kind == "set aside"]
    kept = None
    if aside:
        operation = _read_manifest(base / name).get("operation", "")
        kept = Quarantine.create(store_root, "restore")
        for step in aside:
            kept.move_path(step.target, f"made by {operation} ({name}), set aside by its restore")
        # restoring this folder in turn undoes the restore: the pieces put back give way
        kept.note_made(
            [step.target for step in steps if step.kind == "move back"],
            f"put back by the restore of {name}",
        )
    for step in steps:
        try:
            if step.kind == "set aside":
                continue
            if step.kind == "move back":
                make_directories(step.target.parent)
                os.rename(step.piece, step.target)
                fsync_directory(step.target.parent)
                fsync_directory(step.piece.parent)
            else:
                _write_back(step)
        except OSError as exc:
            raise StoreIOError(f"cannot restore {step.target}: {exc.strerror}") from None
    left = [  # all that may remain: the cut ranges' copies, their bytes back in the store
        relative
        for relative in unlisted_pieces(base / name, set())
        if _COPY_SUFFIX.search(_TWIN_SUFFIX.sub("", relative.name)) is None
    ]
    if left:
        raise StoreFormatError(
            f"{base / name} still holds {left[0]} after the restore; the folder was left in place"
        )
    _remove_folder(base, name)
    return RestoreOutcome(steps, kept.directory if kept is not None else None)


def _remove_folder(base: Path, name: str, suffix: str = _RESTORED_SUFFIX) -> None:
    """Remove a folder whose pieces are all back (or that holds copies of what the store
    still holds: :meth:`Quarantine.discard`; or that quarantine purge deletes): renamed out
    of the list first, so that a kill or a power cut while its files are deleted leaves no
    folder that looks restorable without its manifest or some of its pieces (what is left
    under the hidden name goes with the next operation that makes, restores or purges a
    quarantine folder)."""
    finished = base / f".{name}{suffix}"
    try:
        os.rename(base / name, finished)
        fsync_directory(base)
        shutil.rmtree(finished)
        fsync_directory(base)  # gone for good: a power cut leaves no leftover to remove
    except OSError as exc:
        raise StoreIOError(f"cannot remove {base / name}: {exc.strerror}") from None


def _remove_leftovers(base: Path) -> None:
    """Finish removing the folders a restore had put back fully, or a purge was deleting,
    when they were stopped, and those a kill left being made (holding no more than their
    first, empty manifest)."""
    for entry in os.scandir(base):
        if not entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
            continue
        if entry.name.endswith((_RESTORED_SUFFIX, _PURGED_SUFFIX)):
            shutil.rmtree(entry.path, ignore_errors=True)
        elif entry.name.endswith(_CREATING_SUFFIX):
            with contextlib.suppress(OSError):
                if {item.name for item in os.scandir(entry.path)} <= {MANIFEST_FILE}:
                    shutil.rmtree(entry.path)


def _write_back(step: RestoreStep) -> None:
    """A cut range's bytes back into its file, a chunk at a time, then synced."""
    refuse_shared(step.target)  # refused when the restore was planned; here as well
    fd = os.open(step.target, os.O_RDWR | os.O_NOFOLLOW)
    try:
        with open(step.piece, "rb") as copy:
            position = step.start
            while position < step.end:
                chunk = copy.read(min(_COPY_CHUNK, step.end - position))
                if not chunk:
                    raise OSError(errno.EIO, f"{step.piece} ended early")
                pwrite_fully(fd, chunk, position)
                position += len(chunk)
        os.fsync(fd)
    finally:
        os.close(fd)
