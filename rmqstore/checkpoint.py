"""The ``checkpoint`` file (spec §8.1): 4096 bytes; 24 meaningful in 4.x, 40 in 5.x."""

from __future__ import annotations

import os
import stat
import struct
from dataclasses import dataclass, replace
from pathlib import Path

from rmqstore.errors import StoreFormatError, StoreIOError
from rmqstore.segments import pwrite_fully, shared_file_error, write_whole_file

CHECKPOINT_FILE_SIZE = 4096
RECOVERY_SAFETY_MILLIS = 3000
_FIELDS = struct.Struct(">qqqqq")


@dataclass(frozen=True, slots=True)
class Checkpoint:
    physic_msg_timestamp: int = 0  # store time of the last record known flushed
    logics_msg_timestamp: int = 0  # store time of the last record flushed into consume queues
    index_msg_timestamp: int = 0  # end timestamp of the last full, flushed index file
    master_flushed_offset: int = 0  # 5.x
    confirm_phy_offset: int = 0  # 5.x

    @property
    def min_timestamp(self) -> int:
        """What abnormal recovery compares store times against: min(physic, logics) - 3 s."""
        return max(
            0, min(self.physic_msg_timestamp, self.logics_msg_timestamp) - RECOVERY_SAFETY_MILLIS
        )

    @property
    def min_timestamp_index(self) -> int:
        return min(self.min_timestamp, self.index_msg_timestamp)

    @property
    def layout(self) -> str:
        """``5.x`` when the 5.x fields are set; otherwise the bytes fit both layouts."""
        return "5.x" if self.master_flushed_offset or self.confirm_phy_offset else "4.x"

    def encode(self) -> bytes:
        """The whole 4096-byte file (the 5.x fields are zeros unless set; 4.x ignores them)."""
        return _FIELDS.pack(
            self.physic_msg_timestamp,
            self.logics_msg_timestamp,
            self.index_msg_timestamp,
            self.master_flushed_offset,
            self.confirm_phy_offset,
        ).ljust(CHECKPOINT_FILE_SIZE, b"\0")

    @classmethod
    def decode(cls, data: bytes) -> Checkpoint:
        if len(data) < _FIELDS.size:
            data = data.ljust(_FIELDS.size, b"\0")
        return cls(*_FIELDS.unpack_from(data, 0))

    def to_dict(self) -> dict[str, int | str]:
        return {
            "physicMsgTimestamp": self.physic_msg_timestamp,
            "logicsMsgTimestamp": self.logics_msg_timestamp,
            "indexMsgTimestamp": self.index_msg_timestamp,
            "masterFlushedOffset": self.master_flushed_offset,
            "confirmPhyOffset": self.confirm_phy_offset,
            "minTimestamp": self.min_timestamp,
            "minTimestampIndex": self.min_timestamp_index,
        }

    def updated(self, **changes: int) -> Checkpoint:
        return replace(self, **changes)


@dataclass(frozen=True, slots=True)
class CheckpointFile:
    """The checkpoint as a broker reads it, and how many bytes its file holds."""

    checkpoint: Checkpoint
    size: int  # 4096, or fewer when a crash left the file short

    @property
    def short(self) -> bool:
        return self.size < CHECKPOINT_FILE_SIZE


def read_checkpoint(path: Path) -> Checkpoint | None:
    """The checkpoint, or None when the file does not exist (which a broker reads as zeros);
    see :func:`read_checkpoint_file`."""
    found = read_checkpoint_file(path)
    return None if found is None else found.checkpoint


def read_checkpoint_file(path: Path) -> CheckpointFile | None:
    """The checkpoint file, or None when it does not exist. A file shorter than 4096 bytes (a
    crash while the broker created it) is read as the broker maps it: the bytes it holds, then
    zeros. The times are big-endian, so the missing bytes only make them earlier, and a
    recovery from them starts no later than one from the whole file. Only a regular file of
    at most 4096 bytes is read (a FIFO is not waited on; a longer file is not a checkpoint a
    broker or a crash leaves, and rmqstore does not write into it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StoreIOError(f"cannot read {path}: {exc.strerror}") from None
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise StoreFormatError(f"{path} is not a regular file; a checkpoint is")
        if status.st_size > CHECKPOINT_FILE_SIZE:
            raise StoreFormatError(
                f"{path} is {status.st_size} bytes; a checkpoint is {CHECKPOINT_FILE_SIZE} "
                "(neither a broker nor a crash leaves a longer one: move it aside, and "
                "rmqstore flush writes a new one)"
            )
        data = os.pread(fd, CHECKPOINT_FILE_SIZE, 0)
    except OSError as exc:
        raise StoreIOError(f"cannot read {path}: {exc.strerror}") from None
    finally:
        os.close(fd)
    return CheckpointFile(Checkpoint.decode(data), len(data))


def write_checkpoint(path: Path, checkpoint: Checkpoint) -> None:
    """Write the 40 field bytes in place and fsync. A missing checkpoint is made whole under
    a temporary name and renamed into place, its directory entry made durable. A checkpoint
    with other hard links is refused (:func:`rmqstore.segments.shared_file_error`)."""
    try:
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        except FileNotFoundError:
            write_whole_file(path, checkpoint.encode())
            return
        try:
            status = os.fstat(fd)
            if not stat.S_ISREG(status.st_mode):
                raise StoreFormatError(f"{path} is not a regular file")
            if status.st_nlink > 1:
                raise shared_file_error(path, status.st_nlink)
            if status.st_size < CHECKPOINT_FILE_SIZE:
                os.ftruncate(fd, CHECKPOINT_FILE_SIZE)
            pwrite_fully(fd, checkpoint.encode()[: _FIELDS.size], 0)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise StoreIOError(f"cannot write {path}: {exc.strerror}") from None
