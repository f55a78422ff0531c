"""Fixed-size segment files named by their start offset (spec §5, RocketMQ's MappedFileQueue).

A queue of segments lives in one directory; every file has the same configured size and is
named by the 20-digit zero-padded offset of its first byte. The commit log and each consume
queue are such queues. This module knows names, sizes and file lookup; what is inside a file
belongs to the module of that file kind.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import re
import shutil
import stat
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from itertools import pairwise
from operator import attrgetter
from pathlib import Path
from typing import Any

from rmqstore.errors import StoreFormatError, StoreIOError, read_failure

SEGMENT_NAME_DIGITS = 20
# A record a writer is copying in can already pass the checks with its tail still zeros (its
# properties are outside the body CRC): a reader of a store being written reads the bytes it
# found this long after it found them, by when a writer that had begun them has finished.
WRITE_SETTLE = 0.05
_SEGMENT_NAME = re.compile(r"[0-9]{20}")  # ASCII digits: a regex's \d takes any script's

BY_NAME = attrgetter("name")  # directory entries, sorted by name


def link_target(link: Path) -> str:
    """Where a symbolic link leads, as the link says it ("?" when it cannot be read)."""
    try:
        return os.readlink(link)
    except OSError:
        return "?"


def is_segment_name(name: str) -> bool:
    """Whether ``name`` is a segment file's name: its start offset in 20 digits."""
    return _SEGMENT_NAME.fullmatch(name) is not None


def usual_size(sizes: Mapping[int, int]) -> int:
    """The file size most files have (``sizes``: size to count, not empty); of sizes as
    common as each other, the largest: a file cut short (a torn copy, a full disk) is
    smaller than its neighbours, never larger."""
    return max(sizes, key=lambda size: (sizes[size], size))


def segment_name(start_offset: int) -> str:
    """``UtilAll.offset2FileName``: the offset as 20 zero-padded decimal digits."""
    return f"{start_offset:0{SEGMENT_NAME_DIGITS}d}"


@dataclass(frozen=True, slots=True)
class Segment:
    start: int
    path: Path
    size: int  # size on disk

    @property
    def name(self) -> str:
        return self.path.name


@dataclass(slots=True)
class SegmentQueue:
    """The segment files of one directory, ordered by name (= by start offset)."""

    directory: Path
    file_size: int
    segments: list[Segment] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # found with strict=False
    unexpected: list[Path] = field(default_factory=list)  # entries that are not segments
    links: list[Path] = field(default_factory=list)  # segments that are symbolic links
    # segments sharing their bytes with another path (hard links), and how many links each has
    shared: list[tuple[Path, int]] = field(default_factory=list)
    empty_last: Path | None = None  # a zero-length last file, skipped (a 5.x broker deletes it)

    @classmethod
    def load(
        cls, directory: Path, file_size: int, *, strict: bool = True, kind: str = "segment"
    ) -> SegmentQueue:
        """List the segments of ``directory``. With ``strict`` a file whose size differs from
        ``file_size`` is an error (a 4.9 broker refuses to start); otherwise it is recorded in
        ``problems``. A zero-length last file is skipped, as a 5.x broker deletes it."""
        queue = cls(directory, file_size)
        try:
            entries = sorted(os.scandir(directory), key=BY_NAME)
        except (FileNotFoundError, NotADirectoryError):
            return queue  # not there (or moved or deleted since it was found: a rebuild)
        except OSError as exc:
            raise StoreIOError(f"cannot list {directory}: {exc.strerror}") from None
        for entry in entries:
            if not is_segment_name(entry.name):  # a broker lists folders with the files
                queue.unexpected.append(Path(entry.path))
                continue
            if not entry.is_file():
                queue.unexpected.append(Path(entry.path))
                continue
            try:
                status = entry.stat()
            except FileNotFoundError:
                continue  # deleted since the listing (a broker's retention): not there
            except OSError as exc:
                raise read_failure(entry.path, exc) from None
            path = directory / entry.name
            if entry.is_symlink():
                queue.links.append(path)
            elif status.st_nlink > 1:
                queue.shared.append((path, status.st_nlink))
            queue.segments.append(Segment(int(entry.name), path, status.st_size))
        for index, segment in enumerate(queue.segments):
            if segment.size == file_size:
                continue
            last = index == len(queue.segments) - 1
            if segment.size == 0 and last:
                queue.problems.append(
                    f"{kind} file {segment.path} is empty (a 5.x broker "
                    "deletes it at start-up); ignored"
                )
                queue.segments.pop()
                queue.empty_last = segment.path
                break
            message = (
                f"{kind} file {segment.path} is {segment.size} bytes; "
                f"the configured size is {file_size}"
            )
            if kind == "commit-log":
                message += (
                    " (a broker does not load the store with it; rmqstore verify reports "
                    "what else it finds)"
                )
            elif kind == "consume-queue":
                message += (
                    " (a broker does not load the store with it: where the file is damaged, "
                    "rmqstore dispatch --rebuild --yes builds the consume queues again; where "
                    "the size is the broker's, pass its mappedFileSizeConsumeQueue with "
                    "--broker-config or --consumequeue-file-size)"
                )
            if strict:
                raise StoreFormatError(message)
            queue.problems.append(message)
        return queue

    @property
    def min_offset(self) -> int | None:
        return self.segments[0].start if self.segments else None

    def find(self, offset: int) -> Segment | None:
        """The segment holding ``offset`` (spec §5.4), or None."""
        if not self.segments:
            return None
        index = offset // self.file_size - self.segments[0].start // self.file_size
        if 0 <= index < len(self.segments):
            candidate = self.segments[index]
            if candidate.start <= offset < candidate.start + self.file_size:
                return candidate
        for segment in self.segments:
            if segment.start <= offset < segment.start + self.file_size:
                return segment
        return None

    def gaps(self) -> list[tuple[Segment, Segment]]:
        """Each pair of neighbouring segments with files missing between them: the second
        does not start where the first ends."""
        return [
            (previous, following)
            for previous, following in pairwise(self.segments)
            if following.start != previous.start + self.file_size
        ]

    def forget_after(self, count: int) -> None:
        """Drop segments beyond the first ``count`` from the list (the files stay)."""
        del self.segments[count:]

    def create(
        self,
        start_offset: int,
        *,
        reserve: bool = False,
        head: bytes = b"",
        unsynced_folders: list[Path] | None = None,
        floor: Path | None = None,
    ) -> Segment:
        """Create the segment starting at ``start_offset`` at its full size, as the broker's
        allocator does: sparse, or with every block allocated when ``reserve`` (so writes
        through a map can never meet a full disk). The file is made under a temporary name and
        renamed into place at full size, so a kill never leaves a short segment; an empty file
        left at the name by an older writer's kill is replaced (it holds nothing). ``head``,
        bytes the file begins with (a consume queue's pre-blank units), is written and synced
        before the rename: the file is never on the disk without them.

        The new names (the file's, and those of the folders made for it) are made durable
        before this returns, a folder at a time, unless ``unsynced_folders`` is given: the
        folders whose entries changed are then added to it, for the caller to make durable
        later (each one fsynced, or one syncfs of their file system). ``floor``: a folder
        above the directory that is not made when missing (see :func:`make_directories`)."""
        if start_offset % self.file_size:
            raise StoreFormatError(
                f"segment offset {start_offset} is not a multiple of the file size {self.file_size}"
            )
        path = self.directory / segment_name(start_offset)
        temporary = self.directory / creating_name(path.name)
        was_there = True  # an empty file at the name, left by an older writer's kill
        try:
            made = make_directories(self.directory, durable=unsynced_folders is None, floor=floor)
            _refuse_existing(path)
            was_there = os.path.lexists(path)
            fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
            try:
                os.ftruncate(fd, self.file_size)
                if reserve:
                    os.posix_fallocate(fd, 0, self.file_size)
                if head:
                    pwrite_fully(fd, head, 0)
                    os.fdatasync(fd)
            finally:
                os.close(fd)
            os.rename(temporary, path)
            if unsynced_folders is None:
                fsync_directory(self.directory)
            else:
                unsynced_folders.extend(folder.parent for folder in made)
                unsynced_folders.append(self.directory)
            segment = Segment(start_offset, path, self.file_size)
            self.segments.append(segment)
        except BaseException as exc:
            # stopped (an error, or a signal) before the file was listed: nothing of it stays
            # (a temporary left, or a file in place that no list holds, which a writer's
            # rollback or tidying would not find)
            if not self.segments or self.segments[-1].path != path:
                discard_made(temporary, None if was_there else path)
            if isinstance(exc, FileExistsError):
                what = "a folder" if path.is_dir() else "not an empty regular file"
                raise StoreFormatError(f"{path} already exists ({what})") from None
            if isinstance(exc, NotADirectoryError):
                raise StoreFormatError(
                    f"{exc.filename or path.parent} is a file where a folder must be (for {path})"
                ) from None
            if isinstance(exc, OSError):
                raise StoreIOError(f"cannot create {path}: {exc.strerror}") from None
            raise
        return segment


CREATING_SUFFIX = ".creating"


def creating_name(name: str) -> str:
    """The temporary name a file is made under before it is renamed to ``name`` at full
    size; a kill can leave one behind (recovery moves it to quarantine)."""
    return f".{name}{CREATING_SUFFIX}"


def is_creating_name(name: str) -> bool:
    return name.startswith(".") and name.endswith(CREATING_SUFFIX)


def pwrite_fully(fd: int, data: bytes | memoryview, position: int) -> None:
    """Write all of ``data`` at ``position``. A file system that writes only part (a disk
    filling up writes what fits and says how much) is asked for the rest, so the failure is
    raised instead of the rest going unwritten. OSError is the caller's to report."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, position)
        if written <= 0:  # no progress and no error: never taken as done
            raise OSError(errno.EIO, f"wrote nothing of the last {len(view)} bytes")
        view, position = view[written:], position + written


def read_small_file(path: Path, limit: int, *, follow_links: bool = False) -> bytes:
    """A small file the store keeps (a quarantine manifest): a regular file, not a link, FIFO
    or device (never waited on), of at most ``limit`` bytes; ``follow_links`` reads the file
    a link leads to (a broker's config file, which a broker reads through a link). OSError
    when it cannot be opened or read; StoreFormatError when it is not such a file."""
    refused = StoreFormatError(f"{path} is not a regular file of at most {limit} bytes")
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a link (O_NOFOLLOW)
            raise refused from None
        raise
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode) or status.st_size > limit:
            raise refused
        data = _read_up_to(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:  # grown since
        raise refused
    return data


def read_given_file(path: Path, limit: int) -> bytes | None:
    """A file a user names (a broker config, a message body): its bytes, or None when it
    holds more than ``limit``, found by reading at most ``limit`` + 1 of them, so a device
    that never ends (``/dev/zero``) costs no more. A pipe is read as it comes (process
    substitution, ``<(...)``). OSError is the caller's to report."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = _read_up_to(fd, limit + 1)
    finally:
        os.close(fd)
    return data if len(data) <= limit else None


def _read_up_to(fd: int, most: int) -> bytes:
    """Up to ``most`` bytes of ``fd``: fewer only at its end."""
    parts: list[bytes] = []
    got = 0
    while got < most:
        chunk = os.read(fd, min(most - got, 1 << 20))
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def write_whole_file(path: Path, data: bytes) -> None:
    """Write ``path`` whole: under its temporary name, fsynced, renamed into place (over an
    older version), then its directory fsynced. A crash leaves the old file or the new one,
    never part of one. OSError is the caller's to report."""
    temporary = path.with_name(creating_name(path.name))
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        try:
            pwrite_fully(fd, data, 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except BaseException:  # an error or a signal before the new file was in place
        discard_made(temporary, None)
        raise
    fsync_directory(path.parent)


def discard_made(temporary: Path, path: Path | None) -> None:
    """A file being made under ``temporary`` (then renamed to ``path``, when given) was not
    taken up, stopped by an error or a signal: whichever of the two is there is removed and
    the folder synced. As well as it can: what cannot be removed stays, as after a kill (a
    temporary is moved to quarantine by recovery; a file in place holds nothing)."""
    removed = False
    for name in (temporary, path):
        if name is None:
            continue
        try:
            os.unlink(name)
            removed = True
        except OSError:
            pass
    if removed:
        with contextlib.suppress(OSError):
            fsync_directory(temporary.parent)


def _refuse_existing(path: Path) -> None:
    """FileExistsError unless ``path`` is missing or an empty regular file."""
    try:
        status = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(status.st_mode) or status.st_size:
        raise FileExistsError(path)


def make_directories(path: Path, *, durable: bool = True, floor: Path | None = None) -> list[Path]:
    """``mkdir -p`` whose every created directory is durable: after each ``mkdir`` the
    parent directory is fsynced (syncing only the leaf would not keep its ancestors). Not
    ``durable``: no fsync, the caller makes the parents of what it made durable later.
    ``floor``: a folder above ``path`` that is never made, nor any folder above it: when it
    is missing, FileNotFoundError (a staging folder removed while a writer of another
    process still ran, which made it again and left it behind). Returns the directories
    made, outermost first."""
    missing: list[Path] = []
    current = path
    while not current.is_dir():
        if current == floor:
            raise FileNotFoundError(errno.ENOENT, "the folder written into is gone", str(floor))
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    made: list[Path] = []
    for directory in reversed(missing):
        try:
            directory.mkdir()
        except FileExistsError:
            if not directory.is_dir():
                raise NotADirectoryError(
                    errno.ENOTDIR, "a file where a folder must be", str(directory)
                ) from None
            continue
        made.append(directory)
        if durable:
            fsync_directory(directory.parent)
    return made


# what :func:`remove_from_under_writers` renames a folder to before removing it
REMOVING_SUFFIX = ".removing"


def remove_from_under_writers(folder: Path) -> None:
    """Remove ``folder`` (an unfinished export's or rebuild's staging folder) and what it
    holds, while writers of other processes may still be writing into it (Spark tasks being
    cancelled go on for a moment): it is renamed first (``REMOVING_SUFFIX``), so a file or
    folder they make by its path after that fails instead of landing in it, where one made
    during the removal left the folder behind. Errors are ignored: what is left is removed
    by the next run (see the callers)."""
    doomed = folder.with_name(folder.name + REMOVING_SUFFIX)
    try:
        os.rename(folder, doomed)
    except OSError:
        doomed = folder  # not there, or the name taken: removed where it is
    shutil.rmtree(doomed, ignore_errors=True)


def remove_empty_directory(directory: Path) -> None:
    """Remove ``directory`` when it is a folder with nothing in it, the removal made
    durable; anything else (a folder not empty, nothing there, a link) is left as it is."""
    with contextlib.suppress(OSError):
        directory.rmdir()
        fsync_directory(directory.parent)


def fsync_directory(directory: Path) -> None:
    """Make created/renamed/removed directory entries durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_directory(directory: Path) -> None:
    """:func:`fsync_directory`, an operating-system failure reported as a StoreIOError."""
    try:
        fsync_directory(directory)
    except OSError as exc:
        raise StoreIOError(f"cannot flush {directory}: {exc.strerror}") from None


# Linux 5.8 and later report a write-back error of the file system to syncfs(2) (one not seen
# by an open file since it was opened); before that syncfs said nothing of such errors
_SYNCFS_REPORTS_ERRORS = (5, 8)

# file systems whose syncfs writes every dirty page and directory entry and flushes the disk
# (statfs f_type): ext2/3/4, XFS, Btrfs, F2FS, and tmpfs, which holds nothing past a reboot
# anyway. Elsewhere (NFS, a FUSE file system whose server may keep what syncfs hands it, ...)
# each file is fsynced as before
_SYNCFS_FILE_SYSTEMS = frozenset({0xEF53, 0x58465342, 0x9123683E, 0xF2F52010, 0x01021994})


@cache
def _c_library() -> Any:
    """This process's C library through ctypes (errno kept), loaded once; None where it
    cannot be loaded. ctypes is imported here: only the writers' rarer steps need it."""
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


@cache
def _libc() -> Any:
    """The C library, where its syncfs can be trusted with write-back errors (Linux 5.8 and
    later); None elsewhere."""
    numbers = re.match(r"(\d+)\.(\d+)", os.uname().release) if sys.platform == "linux" else None
    if not numbers or (int(numbers[1]), int(numbers[2])) < _SYNCFS_REPORTS_ERRORS:
        return None
    import ctypes

    libc = _c_library()
    try:
        libc.syncfs.argtypes = (ctypes.c_int,)
        libc.fstatfs.argtypes = (ctypes.c_int, ctypes.c_void_p)
    except AttributeError:  # (no library, or one without them)
        return None
    return libc


def can_sync_file_system(directory: Path) -> bool:
    """Whether :func:`sync_file_system` makes what lies in ``directory``'s file system
    durable, and reports a failure to: Linux 5.8 and later, on a local file system of
    :data:`_SYNCFS_FILE_SYSTEMS`."""
    libc = _libc()
    if libc is None:
        return False
    import ctypes

    status = ctypes.create_string_buffer(256)  # struct statfs: f_type, a long, comes first
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        if libc.fstatfs(fd, status) != 0:
            return False
    finally:
        os.close(fd)
    kind = ctypes.c_long.from_buffer(status).value & 0xFFFFFFFF
    return kind in _SYNCFS_FILE_SYSTEMS


def sync_file_system(directory: Path) -> None:
    """syncfs(2) on the file system holding ``directory`` (see :func:`can_sync_file_system`):
    every dirty page and directory entry of it made durable in one call, and one flush of
    the disk's write cache (an fsync per file and folder flushes that cache each time, even
    of a file with nothing to write: a store of thousands of queues paid it thousands of
    times). A write-back error, or no syncfs here, is an OSError."""
    libc = _libc()
    if libc is None:
        raise OSError(errno.ENOSYS, "syncfs is not trusted here", str(directory))
    import ctypes

    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if libc.syncfs(fd) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), str(directory))
    finally:
        os.close(fd)


def sync_file_data(path: Path) -> None:
    """fdatasync the store's own file ``path`` (its dirty pages, whoever wrote them); an
    OSError is the caller's to name. A file with other hard links is synced too: syncing
    changes no byte."""
    fd = _open_own(path)
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)


def open_file_limit() -> int | None:
    """This process's soft limit on open files (``ulimit -n``), which the engine keeps
    within (consume-queue maps, index files held open): ``sys.maxsize`` when unlimited,
    None when it cannot tell."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return None
    return sys.maxsize if soft == resource.RLIM_INFINITY else soft


def shared_file_error(path: Path, links: int) -> StoreFormatError:
    """The refusal to write ``path`` in place: it has ``links`` hard links, so another path
    (a copy made with ``cp -al`` or ``ln``, a backup deduplicated with hard links) holds the
    same bytes, which writing them here would change there too."""
    return StoreFormatError(
        f"{path} has {links} hard links: another path shares its bytes, and writing it "
        "would change them there too; rmqstore's writers refuse it (give the store files "
        "of its own: copy it with cp -a, not cp -al)"
    )


def hard_links(path: Path) -> int:
    """How many hard links the file ``path`` (not followed, if a link) has: 1 for anything
    that is not a regular file. An OSError (none there) is the caller's."""
    status = os.lstat(path)
    return status.st_nlink if stat.S_ISREG(status.st_mode) else 1


def refuse_shared(path: Path) -> None:
    """Raise :func:`shared_file_error` when ``path`` (not followed, if a link) is a file
    with more than one hard link; nothing when it is not there."""
    try:
        links = hard_links(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StoreIOError(f"cannot look at {path}: {exc.strerror}") from None
    if links > 1:
        raise shared_file_error(path, links)


def open_for_writing(path: Path, flags: int = 0) -> int:
    """A descriptor open for writing on the store's own file ``path``: never through a
    symbolic link (a link could lead out of the store), nor on a file with other hard links
    (writing would change the bytes another path holds: :func:`shared_file_error`)."""
    fd = _open_own(path, flags)
    try:
        links = os.fstat(fd).st_nlink
    except OSError:
        links = 1  # the write that follows names the failure
    if links > 1:
        os.close(fd)
        raise shared_file_error(path, links)
    return fd


def _open_own(path: Path, flags: int = 0) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_NOFOLLOW | flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StoreFormatError(
                f"{path} is a symbolic link; rmqstore writes only the store's own files, "
                "never through a link"
            ) from None
        raise StoreIOError(f"cannot open {path} for writing: {exc.strerror}") from None


def reserve_range(path: Path, start: int, length: int) -> None:
    """Allocate the disk blocks of ``[start, start + length)`` of ``path`` (see
    :func:`reserve_blocks`)."""
    fd = open_for_writing(path)
    try:
        os.posix_fallocate(fd, start, length)
    except OSError as exc:
        raise StoreIOError(f"cannot reserve space in {path}: {exc.strerror}") from None
    finally:
        os.close(fd)


_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02


def release_range(path: Path, start: int, length: int) -> bool:
    """Give back the disk blocks of ``[start, start + length)`` of ``path`` (which must hold
    only zeros: blocks reserved and never written), keeping the file's size, so a store uses
    about the disk its records take. Best effort: False where the file system cannot."""
    if length <= 0:
        return True
    import ctypes

    try:
        fallocate = _c_library().fallocate
    except AttributeError:  # (no library, or one without it)
        return False
    fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    fd = open_for_writing(path)
    try:
        mode = _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE
        return fallocate(fd, mode, start, length) == 0
    finally:
        os.close(fd)


def reserve_blocks(path: Path, size: int) -> None:
    """Allocate disk blocks for the first ``size`` bytes of ``path`` before writing there
    through a map: a write into a hole of a sparse file on a full disk would otherwise kill
    the process with SIGBUS instead of failing with an error (exit 4)."""
    fd = open_for_writing(path)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        raise StoreIOError(f"cannot reserve space in {path}: {exc.strerror}") from None
    finally:
        os.close(fd)


def map_writable(path: Path) -> mmap.mmap:
    fd = open_for_writing(path)
    try:
        return mmap.mmap(fd, 0, access=mmap.ACCESS_WRITE)
    except OSError as exc:
        raise StoreIOError(f"cannot map {path} for writing: {exc.strerror}") from None
    finally:
        os.close(fd)


_ZERO_CHUNK = bytes(4 * 1024 * 1024)


def nonzero_extent(path: Path, start: int, end: int) -> tuple[int, int] | None:
    """The smallest ``[first, last_end)`` within ``[start, end)`` holding every non-zero byte
    of ``path``, or None when that range is all zeros. Holes of sparse files are skipped."""
    first: int | None = None
    last_end = start
    chunk_size = len(_ZERO_CHUNK)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise read_failure(path, exc) from None
    try:
        for position, hole in _data_regions(fd, start, end):
            while position < hole:
                chunk = os.pread(fd, min(chunk_size, hole - position), position)
                if not chunk:
                    break
                zeros = _ZERO_CHUNK if len(chunk) == chunk_size else bytes(len(chunk))
                stripped = b"" if chunk == zeros else chunk.lstrip(b"\0")  # memcmp first
                if stripped:
                    if first is None:
                        first = position + len(chunk) - len(stripped)
                    last_end = position + len(chunk.rstrip(b"\0"))
                position += len(chunk)
    finally:
        os.close(fd)
    return None if first is None else (first, last_end)


def last_nonzero_end(path: Path, size: int) -> int:
    """Where the non-zero bytes of the first ``size`` bytes of ``path`` end (0: all zeros),
    read backwards from the end in chunks, the holes of a sparse file skipped: a file a
    writer fills from its start costs a read of its zero tail, not of its data."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise read_failure(path, exc) from None
    try:
        for start, end in reversed(list(_data_regions(fd, 0, size))):
            high = end
            while high > start:
                low = max(start, high - len(_ZERO_CHUNK))
                chunk = os.pread(fd, high - low, low)
                zeros = _ZERO_CHUNK if len(chunk) == len(_ZERO_CHUNK) else bytes(len(chunk))
                if chunk != zeros:  # (memcmp first: a zero tail is most of what is read)
                    return low + len(chunk.rstrip(b"\0"))
                high = low
        return 0
    except OSError as exc:
        raise StoreIOError(f"cannot read {path}: {exc.strerror}") from None
    finally:
        os.close(fd)


def settled_data_end(path: Path, size: int) -> int:
    """Where the data of a file another process is writing ends now
    (:func:`last_nonzero_end`), returned :data:`WRITE_SETTLE` later, when a record a writer
    had begun before it is whole: the records starting before it can be read."""
    end = last_nonzero_end(path, size)
    time.sleep(WRITE_SETTLE)
    return end


def _data_regions(fd: int, start: int, end: int) -> Iterator[tuple[int, int]]:
    """The ``[first, last)`` regions of ``[start, end)`` of ``fd`` that are not holes of a
    sparse file, in order (where the file system cannot tell, the rest of the range)."""
    position = start
    while position < end:
        try:
            position = os.lseek(fd, position, os.SEEK_DATA)
            hole = min(os.lseek(fd, position, os.SEEK_HOLE), end)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                return  # only a hole remains
            hole = end  # no sparse-file support: every byte may be data
        if position >= end:
            return
        yield position, hole
        position = hole


def all_zeros(data: bytes) -> bool:
    """Whether every byte of ``data`` is zero: compared with zeros at memory speed (``any``
    took each byte as a Python int, 80 times as long: 0.4 ms a 64 KiB block)."""
    return data == bytes(len(data))


def data_end_estimate(read: Callable[[int, int], bytes], size: int, block: int = 65536) -> int:
    """Roughly where the data of a file filled from its start ends: a binary search for the
    first all-zero ``block`` (``read(position, length)``), about 15 small reads for 1 GiB.
    Zeros inside the data (an all-zero body) can make it low, so callers use it to plan work,
    never as the end itself."""
    low, high = 0, (size + block - 1) // block
    while high - low > 1:
        middle = (low + high) // 2
        if not all_zeros(read(middle * block, block)):
            low = middle
        else:
            high = middle
    return min(size, high * block)


def file_reader(path: Path) -> Callable[[int, int], bytes]:
    """``read(position, length)`` on a file, for :func:`data_end_estimate`."""

    def read(position: int, length: int) -> bytes:
        try:
            with open(path, "rb") as handle:
                return os.pread(handle.fileno(), length, position)
        except OSError as exc:
            raise read_failure(path, exc) from None

    return read
