"""``export`` and ``stats`` over the ranges of :mod:`rmqstore.pipeline.ranges`: what they return,
and the local engine that runs them in this process (the Spark engine, in
:mod:`rmqstore.spark.jobs`, runs the same range functions on executors).

Each range is summarised (its records counted, where its file's records end noted) and only
the ranges one walk of the log visits count. ``stats`` and the local ``export`` do it in the
same pass as their own work, dropping what the walk does not visit; the Spark engine's export
(and an export to a URI) walks the log first and then reads the rows up to those ends.
"""

from __future__ import annotations

import base64
import fcntl
import os
import queue
import shutil
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, closing, contextmanager, nullcontext, suppress
from dataclasses import dataclass, field
from functools import partial
from itertools import chain, groupby
from pathlib import Path
from typing import Any

from rmqstore.config import StoreConfig
from rmqstore.delay import DelayLevels
from rmqstore.errors import InputError, StoreIOError
from rmqstore.kernel import layout
from rmqstore.pipeline import arrowcalls, columns
from rmqstore.pipeline.location import StoreLocation
from rmqstore.pipeline.ranges import (
    DEFAULT_SPLIT,
    FileRange,
    LogPlan,
    RangeScan,
    RangeSummary,
    SummaryJob,
    file_bounds,
    part_groups,
    plan_log,
    plan_ranges,
    record_margin,
    summarize_job,
    summarize_range,
    summary_jobs,
    walk_in_order,
    walk_summaries,
)
from rmqstore.pipeline.rows import (
    ALWAYS_PRESENT,
    COMMITLOG_COLUMNS,
    EXPORT_BATCH_ROWS,
    BatchGatherer,
    MessageBatcher,
    MessageRowOptions,
    arrow_schema,
    message_batches,
)
from rmqstore.properties import TAGS, decode_properties
from rmqstore.record import RecordHeader
from rmqstore.segments import (
    REMOVING_SUFFIX,
    fsync_directory,
    remove_from_under_writers,
    sync_file_data,
)
from rmqstore.stops import past_undoing, through_stops
from rmqstore.wording import quoted
from rmqstore.workers import Progress, Runner, process_map, process_runner

# what each phase is called while its ranges are worked on
_PHASES = {
    "summarize_job": "scanning the commit log",
    "write_part": "writing parts",
    "stats_range": "counting",
}

EXPORT_FORMATS = ("parquet", "jsonl")
TOP_TAGS = 5
ROW_GROUP_ROWS = 65536
_WRITE_BUFFER_BYTES = 1 << 20  # written to a part file at a time


@dataclass(frozen=True)
class PipelineOptions:
    split: int = DEFAULT_SPLIT
    max_message_size: int = 4 * 1024 * 1024
    delay_levels: str | None = None
    workers: int = 1  # the local engine's worker processes

    @classmethod
    def for_config(
        cls, config: StoreConfig, split: int = DEFAULT_SPLIT, workers: int = 1
    ) -> PipelineOptions:
        return cls(split, config.max_message_size, config.message_delay_level, workers)


@dataclass
class FileStats:
    file: str
    records: int = 0
    bytes: int = 0
    blank_bytes: int = 0
    crc_failures: int = 0
    invalid_regions: int = 0
    end: int | None = None  # where its records end (file position)
    ended_by: str | None = None  # blank, end, invalid (None: records run to the next range)

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "records": self.records,
            "bytes": self.bytes,
            "blankBytes": self.blank_bytes,
            "crcFailures": self.crc_failures,
            "invalidRegions": self.invalid_regions,
            "end": self.end,
            "endedBy": self.ended_by,
        }


def file_stats(walked: list[RangeSummary], plan: LogPlan) -> list[FileStats]:
    """Per commit-log file: the sums over the ranges one walk of ``plan`` visits; a file
    after the last one holding data (a broker's pre-allocated next file) as one whose data
    ends at 0. Of a store whose lock another process held, the files after where it was read
    up to are not listed: the writer may have filled them since."""
    stats: dict[str, FileStats] = {}
    last = walked[-1].file if walked else ""
    for summary in walked:
        entry = stats.setdefault(summary.file, FileStats(f"commitlog/{summary.file}"))
        entry.records += summary.records
        entry.bytes += summary.bytes
        entry.blank_bytes += summary.blank_bytes
        entry.crc_failures += summary.crc_failures
        entry.invalid_regions += summary.invalid_regions
        if summary.outcome in ("blank", "end", "invalid"):
            entry.end, entry.ended_by = summary.end, summary.outcome
    if plan.live_end is None:
        for name, _ in plan.segments:
            if name > last:
                stats[name] = FileStats(f"commitlog/{name}", end=0, ended_by="end")
    return list(stats.values())


@dataclass
class QueueStats:
    topic: str
    queue_id: int
    messages: int = 0
    bytes: int = 0
    min_queue_offset: int | None = None  # the lowest queue offset seen
    max_queue_offset: int | None = None  # the highest queue offset seen (JSON: maxOffset - 1)
    first_store_timestamp: int | None = None
    last_store_timestamp: int | None = None
    tags: Counter = field(default_factory=Counter)  # the most common tags (all when local)
    distinct_tags: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "queueId": self.queue_id,
            "messages": self.messages,
            "bytes": self.bytes,
            # RocketMQ's (and info's) meaning: minOffset is the first queue offset, maxOffset
            # the one after the last (the next a put would take)
            "minOffset": self.min_queue_offset,
            "maxOffset": None if self.max_queue_offset is None else self.max_queue_offset + 1,
            "firstStoreTimestamp": self.first_store_timestamp,
            "lastStoreTimestamp": self.last_store_timestamp,
            "distinctTags": self.distinct_tags,
            "topTags": [
                {"tag": tag, "messages": count}
                for tag, count in sorted(self.tags.items(), key=lambda item: (-item[1], item[0]))[
                    :TOP_TAGS
                ]
            ],
        }


@dataclass
class StoreStats:
    queues: list[QueueStats]
    files: list[FileStats]
    live_end: int | None = None  # the log was read up to here: another process held the lock

    def to_dict(self) -> dict[str, Any]:
        queues = sorted(self.queues, key=lambda q: (q.topic, q.queue_id))
        return {
            "messages": sum(q.messages for q in queues),
            "bytes": sum(q.bytes for q in queues),
            "queues": [q.to_dict() for q in queues],
            "files": [f.to_dict() for f in self.files],
            "liveEnd": self.live_end,
        }


@dataclass
class ExportResult:
    destination: str
    format: str
    messages: int
    files: list[str]
    commitlog_files: list[FileStats]
    live_end: int | None = None  # the log was read up to here: another process held the lock

    def to_dict(self) -> dict[str, Any]:
        return {
            "destination": self.destination,
            "format": self.format,
            "messages": self.messages,
            "files": self.files,
            "commitLogFiles": [f.to_dict() for f in self.commitlog_files],
            "liveEnd": self.live_end,
        }


def check_export(destination: str, fmt: str) -> None:
    """An export goes to a new or empty directory, never over earlier output."""
    if fmt not in EXPORT_FORMATS:
        raise InputError(f"unknown export format {quoted(fmt)} (parquet or jsonl)")
    if _remote(destination):
        filesystem, path = _filesystem(destination)
        from pyarrow import fs

        info = filesystem.get_file_info(path)
        if info.type != fs.FileType.NotFound and (
            info.type != fs.FileType.Directory
            or filesystem.get_file_info(fs.FileSelector(path, recursive=False))
        ):
            raise InputError(f"{destination} exists and is not empty; choose a new place")
        return
    path = Path(destination.removeprefix("file://"))
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise InputError(f"{path} exists and is not an empty directory; choose a new one")
    if not path.parent.is_dir():
        what = "is not a directory" if path.parent.exists() else "no such directory"
        raise InputError(f"{path.parent}: {what}")


def sync_tree(directory: Path) -> None:
    """Sync each file under ``directory`` (never through a link), then each folder,
    deepest first."""
    for folder, _folders, names in os.walk(directory, topdown=False):
        for name in names:
            sync_file_data(Path(folder, name))
        fsync_directory(Path(folder))


def _remote(destination: str) -> bool:
    return "://" in destination and not destination.startswith("file://")


def _filesystem(uri: str) -> tuple[Any, str]:
    try:
        from pyarrow import fs

        return fs.FileSystem.from_uri(uri)
    except ImportError:
        raise InputError("writing to a URI needs pyarrow: pip install 'rmqstore[spark]'") from None
    except Exception as exc:  # pyarrow raises ArrowInvalid and friends
        raise InputError(f"cannot open {uri}: {exc}") from None


@contextmanager
def staged_directory(destination: str) -> Iterator[Path]:
    """A sibling directory to write into, renamed to ``destination`` when the block
    completes and removed when it fails, so no half-written export is left behind. What it
    holds reaches the disk before the rename, and the rename before the block returns: a
    crash after the export says it is done leaves all of it, one before leaves none of it
    under ``destination`` (renamed unsynced, its files could be there empty or short), and a
    disk that cannot take it fails the export instead of its files going after it ends."""
    final = Path(destination.removeprefix("file://"))
    prefix = f".{final.name}{_STAGING_INFIX}"
    remove_abandoned_stagings(final.parent, prefix)
    staging = final.with_name(f"{prefix}{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    held = os.open(staging, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        # held while the export writes: one nobody holds was left by an export killed or
        # cut off by a power cut (see remove_abandoned_stagings)
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield staging
        sync_tree(staging)
        # all of it on the disk: renamed into place, the export is done, and a stop signal
        # from now on does not end the command as stopped (one between the rename and the
        # end of the command made it exit 143 with the export there, whole: the signals
        # campaign, seed 20261212)
        past_undoing()
        if final.exists():
            final.rmdir()  # empty, as checked
        os.replace(staging, final)
        fsync_directory(final.parent)
    except BaseException:
        remove_from_under_writers(staging)
        raise
    finally:
        os.close(held)


_STAGING_INFIX = ".rmqstore-"


def remove_abandoned_stagings(parent: Path, prefix: str) -> list[str]:
    """Remove the staging folders (``prefix`` + a process id) an earlier export to the same
    destination left when it was killed or the power went (``.removing`` after the process
    id: killed as it removed it): ones no running export holds (its lock) whose process is
    gone. They hold only part files of an export that never finished. Returns the names
    removed."""
    try:
        entries = [
            entry
            for entry in os.scandir(parent)
            if entry.name.startswith(prefix)
            and entry.name[len(prefix) :].removesuffix(REMOVING_SUFFIX).isdigit()
            and entry.is_dir(follow_symlinks=False)
        ]
    except OSError:
        return []
    removed = []
    for entry in entries:
        pid = int(entry.name[len(prefix) :].removesuffix(REMOVING_SUFFIX))
        if pid == os.getpid() or _process_running(pid):
            continue
        try:
            fd = os.open(entry.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # an export running now (on another machine sharing the folder)
        try:
            shutil.rmtree(entry.path)
            removed.append(entry.name)
        except OSError:
            pass  # left for the next export, as before
        finally:
            os.close(fd)
    return removed


def _process_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # there, another user's
    return True


@dataclass(frozen=True)
class PartJob:
    """The messages of consecutive ranges (one, or whole small files grouped:
    :func:`~rmqstore.pipeline.ranges.part_groups`) into one part file: picklable, for an
    executor."""

    store: str
    parts: tuple[FileRange, ...]
    rows: MessageRowOptions
    fmt: str
    target: str  # a path, or a URI for pyarrow.fs


def write_part(job: PartJob) -> tuple[str, int]:
    """Write the ranges' messages to their part file (none when they have no messages)."""
    location = StoreLocation(job.store)
    batches = message_batches(location, job.parts, job.rows, coded=job.fmt == "parquet")
    first = next(batches, None)
    if first is None:
        return job.target, 0
    everything = chain([first], batches)
    if _remote(job.target):
        filesystem, path = _filesystem(job.target)
        with filesystem.open_output_stream(path) as stream:
            return job.target, _WRITERS[job.fmt](stream, everything)
    with _native_file(job.target) if job.fmt == "parquet" else open(job.target, "wb") as stream:
        return job.target, _WRITERS[job.fmt](stream, everything)


def export_parts(
    store: str,
    ranges: list[FileRange],
    rows: MessageRowOptions,
    destination: str,
    fmt: str,
    walked: list[RangeSummary],
    plan: LogPlan,
    runner: Runner,
    split: int,
) -> ExportResult:
    """Write ``part-NNNNN`` files, one per range that has messages, with ``runner`` (here or
    on executors); ``ranges`` end where a walk found each file's records end, and are put
    in parts as the one-pass export puts ``plan``'s (:func:`_as_planned`). A local
    destination is written as a staging directory renamed at the end; a remote one (object
    stores cannot rename a directory) is written in place."""
    extension = "parquet" if fmt == "parquet" else "jsonl"

    def jobs(base: str) -> list[PartJob]:
        return [
            PartJob(store, tuple(group), rows, fmt, f"{base}/part-{number:05d}.{extension}")
            for number, group in enumerate(_as_planned(ranges, part_groups(plan.ranges, split)))
        ]

    try:
        if _remote(destination):
            filesystem, path = _filesystem(destination)
            filesystem.create_dir(path, recursive=True)
            written = runner(write_part, jobs(destination.rstrip("/")))
        else:
            with staged_directory(destination) as staging:
                written = runner(write_part, jobs(str(staging.resolve())))
    except OSError as exc:
        raise StoreIOError(f"cannot write {destination}: {exc.strerror or exc}") from None
    files = [target.rsplit("/", 1)[-1] for target, count in written if count]
    messages = sum(count for _, count in written)
    return ExportResult(destination, fmt, messages, files, file_stats(walked, plan), plan.live_end)


def _as_planned(ranges: list[FileRange], groups: list[list[FileRange]]) -> list[list[FileRange]]:
    """``ranges`` (bounded by a walk: the planned ones a walk visits, the last of a file cut
    where its records end) in the parts ``groups`` of the planned ranges put them in."""
    number = {(part.name, part.start): n for n, group in enumerate(groups) for part in group}
    # a range the plan did not have (none, as the walk's bounds cut the planned ranges) alone
    parts = groupby(
        ranges, lambda part: number.get((part.name, part.start), (part.name, part.start))
    )
    return [list(group) for _, group in parts]


class Pipeline:
    """What both engines do the same way; :meth:`run` (a function over a list of picklable
    jobs) is where they differ: in this process, or on Spark executors."""

    def __init__(self, store: str, options: PipelineOptions) -> None:
        self.location = StoreLocation(store)
        self.location.check_store()
        self.options = options
        self.margin = record_margin(options.max_message_size)
        self.progress: Progress | None = None  # the local engine reports its ranges to it

    def run(self, function: Callable[[Any], Any], jobs: list) -> list:
        return process_runner(self.options.workers)(function, jobs)

    def _watched(self, function: Callable[[Any], Any], jobs: list) -> Iterator[Any]:
        """:func:`process_map`, told to ``self.progress`` (if any) range by range."""
        description = _PHASES.get(getattr(function, "__name__", ""), "working")
        watch = self.progress(description, len(jobs)) if self.progress else None
        # closed here, not when it is collected: a signal met as its workers end (a caller
        # that stopped early) was printed as "Exception ignored" and lost
        with (
            watch or nullcontext(lambda done: None) as update,
            closing(process_map(self.options.workers, function, jobs)) as results,
        ):
            for done, result in enumerate(results, 1):
                update(done)
                yield result

    def plan(self) -> LogPlan:
        """The ranges of the whole log (of a store another process is writing, as it
        stands now)."""
        return plan_log(self.location, self.options.split, split_last=True, margin=self.margin)

    def walk(
        self,
        *,
        check_crc: bool,
        crc_from: int = 0,
        count_copies: bool = False,
        plan: LogPlan | None = None,
    ) -> list[RangeSummary]:
        """The summaries of the ranges one walk of the log (or of ``plan``) visits
        (``count_copies``: with the records that have units in LMQ queues counted)."""
        jobs = summary_jobs(
            self.location,
            self.options.split,
            check_crc=check_crc,
            crc_from=crc_from,
            delay_levels=self.options.delay_levels,
            margin=self.margin,
            count_copies=count_copies,
            plan=plan,
        )
        return walk_summaries(self.run(summarize_job, jobs))

    def bounded_ranges(self, walked: list[RangeSummary]) -> list[FileRange]:
        """The ranges of every file up to where its walked records end."""
        return plan_ranges(
            self.location,
            self.options.split,
            split_last=True,
            bounds=file_bounds(walked),
            margin=self.margin,
        )

    def export(
        self,
        destination: str,
        fmt: str,
        *,
        topics: frozenset[str] | None = None,
        include_body: bool = True,
        decompress: bool = True,
    ) -> ExportResult:
        """One part file per range, written by whoever reads the range; ``decompress``:
        ZLIB bodies of COMPRESSED records inflated, as a consumer receives them.

        One pass: each range is walked and its messages written to its part file together
        (:meth:`_exported`); part files of ranges past where a file's records end are then
        dropped, and the rest numbered in log order. A remote destination, which cannot
        rename, is written after a walk of the log, in place."""
        check_export(destination, fmt)
        if not self.location.remote and not _remote(destination):
            from rmqstore.store import refuse_output_inside

            refuse_output_inside(
                Path(self.location.uri),
                Path(destination.removeprefix("file://")),
                "the export destination",
            )
        rows = self.export_rows(topics, include_body, decompress)
        plan = self.plan()
        if _remote(destination):
            walked = self.walk(check_crc=False, plan=plan)
            return export_parts(
                self.location.uri,
                self.bounded_ranges(walked),
                rows,
                destination,
                fmt,
                walked,
                plan,
                self.run,
                self.options.split,
            )
        groups = part_groups(plan.ranges, self.options.split)
        extension = "parquet" if fmt == "parquet" else "jsonl"
        try:
            with staged_directory(destination) as staging:
                root = staging.resolve()  # the same path for executors of another directory
                jobs = [
                    PartJob(
                        self.location.uri,
                        tuple(group),
                        rows,
                        fmt,
                        str(root / f"range-{number:05d}.{extension}"),
                    )
                    for number, group in enumerate(groups)
                ]
                with closing(self._exported(jobs)) as done:
                    walked = list(walk_in_order(chain.from_iterable(done), lambda item: item[0]))
                # a part's messages, of the ranges the walk visits (all of a group's)
                counts: dict[str, int] = {}
                for _, target, count in walked:
                    counts[target] = counts.get(target, 0) + count
                # every part is closed (the encoder is done) before the files are renamed
                kept = _number_parts(root, list(counts), extension)
        except OSError as exc:
            raise StoreIOError(f"cannot write {destination}: {exc.strerror or exc}") from None
        files = [name for name, count in zip(kept, counts.values(), strict=True) if count]
        messages = sum(counts.values())
        return ExportResult(
            destination,
            fmt,
            messages,
            files,
            file_stats([item[0] for item in walked], plan),
            plan.live_end,
        )

    def _exported(self, jobs: list[PartJob]) -> Iterator[list[tuple[RangeSummary, str, int]]]:
        """Each part's ranges exported (:func:`export_range`), in log order, by :meth:`run`."""
        yield from self.run(export_range, jobs)

    def export_rows(
        self, topics: frozenset[str] | None, include_body: bool, decompress: bool
    ) -> MessageRowOptions:
        """The rows an export writes (see :meth:`export`)."""
        return MessageRowOptions(
            include_body=include_body,
            topics=topics,
            delay_levels=self.options.delay_levels,
            resync_last=True,  # the ranges end where the walk found each file's records end
            decompress=decompress,
        )


class LocalPipeline(Pipeline):
    """``export`` and ``stats`` here, one range after the other in flat memory, or in
    ``options.workers`` processes; ``progress`` (optional) watches the ranges complete."""

    def __init__(self, store: str, options: PipelineOptions, progress: Progress | None = None):
        super().__init__(store, options)
        self.progress = progress

    def run(self, function: Callable[[Any], Any], jobs: list) -> list:
        return list(self._watched(function, jobs))

    def _exported(self, jobs: list[PartJob]) -> Iterator[list[tuple[RangeSummary, str, int]]]:
        """Each part's ranges exported, in log order: here with one encoder thread for all parts, or
        in ``options.workers`` processes (each part encoded beside its building there)."""
        watch = self.progress("exporting", len(jobs)) if self.progress else None
        with watch or nullcontext(lambda done: None) as update, ExitStack() as stack:
            if self.options.workers == 1 or len(jobs) <= 1:
                encode = stack.enter_context(_Background(_run))
                results = (export_range(job, encode) for job in jobs)
            else:
                # a worker is rmqstore's own process: its pyarrow, as the command's, needs
                # no numpy (nor pandas, which pyarrow loads for scalars when numpy is there)
                without_numpy = arrowcalls.import_pyarrow_without_numpy
                results = stack.enter_context(
                    closing(
                        process_map(self.options.workers, export_range, jobs, prepare=without_numpy)
                    )
                )
            for done, result in enumerate(results, 1):
                update(done)
                yield result

    def stats(self, *, topics: frozenset[str] | None = None) -> StoreStats:
        """One pass: each range is summarised and its messages counted per queue together;
        the counts of the ranges one walk of the log visits are kept. Without pyarrow and
        numpy (the Spark extra brings both), the walk comes first and the walked ranges are
        then counted record by record."""
        try:
            import numpy  # noqa: F401
            import pyarrow  # noqa: F401
        except ImportError:
            return self._stats_by_record(topics)
        plan = self.plan()
        summaries = {
            job.part: job
            for job in summary_jobs(
                self.location,
                self.options.split,
                check_crc=True,
                delay_levels=self.options.delay_levels,
                margin=self.margin,
                plan=plan,
            )
        }
        jobs = [
            StatsJob(tuple(summaries[part] for part in group), topics)
            for group in part_groups(plan.ranges, self.options.split)
        ]
        queues: dict[tuple[str, int], QueueStats] = {}
        walked: list[RangeSummary] = []
        # in log order as they arrive, one job's counts at a time in memory
        with closing(self._watched(stats_range, jobs)) as counted_jobs:
            counted_ranges = chain.from_iterable(counted_jobs)
            for summary, counted in walk_in_order(counted_ranges, lambda item: item[0]):
                walked.append(summary)
                _fold(queues, counted)
        return _store_stats(queues, walked, plan)

    def _stats_by_record(self, topics: frozenset[str] | None) -> StoreStats:
        plan = self.plan()
        walked = self.walk(check_crc=True, plan=plan)
        queues: dict[tuple[str, int], QueueStats] = {}
        for part in self.bounded_ranges(walked):
            _fold(queues, count_range_by_record(self.location.uri, part, topics))
        return _store_stats(queues, walked, plan)


def export_range(
    job: PartJob, encode: Callable[[Callable[[], Any]], None] | None = None
) -> list[tuple[RangeSummary, str, int]]:
    """Walk the job's ranges and write their messages to ``job.target`` in the same pass (no
    file when they have none): per range, its summary, the target and how many of its
    messages were written. The part file is encoded (Parquet or JSON lines), written and
    closed by ``encode``'s thread, or (none given) by a thread of this call's own."""
    if encode is None:
        with _Background(_run) as own:
            return export_range(job, own)
    if job.fmt == "parquet":
        writer: ParquetPart | JsonlPart = ParquetPart(partial(_native_file, job.target), encode)
    else:
        writer = JsonlPart(partial(open, job.target, "wb"), encode)
    location = StoreLocation(job.store)
    levels = DelayLevels(job.rows.delay_levels) if job.rows.delay_levels else DelayLevels()
    summaries: list[RangeSummary] = []
    gatherer = BatchGatherer(MessageBatcher(job.rows, coded=job.fmt == "parquet"), writer.add)
    try:
        for number, part in enumerate(job.parts):
            summary = summarize_range(
                location,
                part,
                check_crc=job.rows.check_crc,
                delay_levels=levels,
                on_batch=partial(gatherer.add, label=f"commitlog/{part.name}", tag=number),
                batch_rows=EXPORT_BATCH_ROWS,
            )
            summaries.append(summary)
        gatherer.flush()
    finally:
        writer.close()
    return [
        (summary, job.target, gatherer.kept.get(number, 0))
        for number, summary in enumerate(summaries)
    ]


def _native_file(path: str) -> Any:
    """A new local file as an Arrow output stream: the Parquet writer's page writes then run
    without the GIL (a Python file object takes it back for every page, and waits for it
    while the caller's thread builds the next batches). Buffered: the writer writes each
    page and asks for the position after it, which on a bare file is a write and an lseek
    per page (3,800 and 2,400 system calls for 1M messages, against 38 writes)."""
    import pyarrow as pa

    return pa.BufferedOutputStream(pa.OSFile(path, "wb"), _WRITE_BUFFER_BYTES)


def _number_parts(directory: Path, targets: list[str], extension: str) -> list[str]:
    """Keep the part files of ``targets`` (in log order) as ``part-NNNNN``, numbered from 0
    in that order; every other file in ``directory`` (ranges the walk does not visit) is
    removed. Returns the new names."""
    keep = {Path(target) for target in targets}
    for path in directory.iterdir():
        if path not in keep:
            path.unlink()
    names = []
    for number, target in enumerate(targets):
        name = f"part-{number:05d}.{extension}"
        if Path(target).exists():
            Path(target).rename(directory / name)
        names.append(name)
    return names


def _fold(queues: dict[tuple[str, int], QueueStats], counted: dict) -> None:
    for key, entry in counted.items():
        total = queues.get(key)
        if total is None:
            queues[key] = entry
        else:
            _add(total, entry)


def _store_stats(
    queues: dict[tuple[str, int], QueueStats], walked: list, plan: LogPlan
) -> StoreStats:
    for entry in queues.values():
        entry.distinct_tags = len(entry.tags)
    return StoreStats(list(queues.values()), file_stats(walked, plan), plan.live_end)


@dataclass(frozen=True)
class StatsJob:
    """Ranges to summarise and count per queue (one, or whole small files grouped:
    :func:`~rmqstore.pipeline.ranges.part_groups`): picklable, for a worker process."""

    summaries: tuple[SummaryJob, ...]
    topics: frozenset[str] | None


_TALLY_ROWS = 65536  # rows aggregated at a time
# queueId, size, queueOffset, storeTimestamp: the row columns stats aggregates, as int64
_STATS_INTEGERS = (
    (layout.QUEUE_ID, 8),
    (layout.TOTAL_SIZE, 8),
    (layout.QUEUE_OFFSET, 8),
    (layout.STORE_TIMESTAMP, 8),
)


def stats_range(job: StatsJob) -> list[tuple[RangeSummary, dict[tuple[str, int], QueueStats]]]:
    """The summary of each of the job's ranges and the per-queue counts of their messages, in
    one pass: Arrow aggregates columns taken from the kernel's row batches. The counts of
    all the ranges come with the last one's summary (one walk of the log visits every range
    of a group, or the group is one range)."""
    import pyarrow as pa

    queues: dict[tuple[str, int], QueueStats] = {}
    wanted = None if job.topics is None else columns.strings(pa, sorted(job.topics))
    waiting: list[Any] = []
    rows_waiting = 0

    def count(buf: Any, rows: Any, count: int) -> None:
        nonlocal rows_waiting
        integers = columns.RowIntegers(pa, rows, count, _STATS_INTEGERS)
        table = pa.Table.from_arrays(
            [
                columns.topics(pa, buf, rows, count),
                *(integers.array(column, width) for column, width in _STATS_INTEGERS),
                columns.text(pa, columns.binary(pa, buf, rows, count, layout.FIELD_TAGS)),
            ],
            names=["topic", "queueId", "size", "queueOffset", "storeTimestamp", "tags"],
        )
        if wanted is not None:
            import pyarrow.compute as pc

            table = table.filter(pc.is_in(table["topic"], value_set=wanted))
        waiting.append(table)
        rows_waiting += table.num_rows
        if rows_waiting >= _TALLY_ROWS:
            _fold_table(queues, pa.concat_tables(waiting))
            waiting.clear()
            rows_waiting = 0

    summaries = [summarize_job(each, on_batch=count) for each in job.summaries]
    if waiting:
        _fold_table(queues, pa.concat_tables(waiting))
    return [(summary, {}) for summary in summaries[:-1]] + [(summaries[-1], queues)]


def _fold_table(queues: dict[tuple[str, int], QueueStats], table: Any) -> None:
    """Add the messages of ``table`` (one row per message) to the per-queue counts: rows
    grouped by (topic, queue id) with numpy (pyarrow's own group-by would load its query
    engine, which costs more than the counting)."""
    import numpy as np

    if not table.num_rows:
        return
    topics = arrowcalls.dictionary_encode(table["topic"].combine_chunks())
    names = topics.dictionary.to_pylist()
    queue_ids = _numbers(np, table["queueId"].combine_chunks(), np.int64)
    topic_of = _numbers(np, topics.indices, np.int32).astype(np.int64)
    keys = (topic_of << 32) | (queue_ids & 0xFFFFFFFF)
    groups, group_of = np.unique(keys, return_inverse=True)
    order = np.argsort(group_of, kind="stable")
    starts = np.flatnonzero(np.r_[True, np.diff(group_of[order]) != 0])
    counts = np.bincount(group_of, minlength=len(groups))

    def reduced(column: str, function: Any) -> Any:
        values = _numbers(np, table[column].combine_chunks(), np.int64)
        return function.reduceat(values[order], starts)

    sizes = reduced("size", np.add)
    low_offsets, high_offsets = (
        reduced("queueOffset", np.minimum),
        reduced("queueOffset", np.maximum),
    )
    first_times = reduced("storeTimestamp", np.minimum)
    last_times = reduced("storeTimestamp", np.maximum)
    queue_of = [(names[key >> 32], _queue_id(key)) for key in groups.tolist()]
    for number, (topic, queue_id) in enumerate(queue_of):
        part = QueueStats(
            topic,
            queue_id,
            messages=int(counts[number]),
            bytes=int(sizes[number]),
            min_queue_offset=int(low_offsets[number]),
            max_queue_offset=int(high_offsets[number]),
            first_store_timestamp=int(first_times[number]),
            last_store_timestamp=int(last_times[number]),
        )
        total = queues.get((topic, queue_id))
        if total is None:
            queues[(topic, queue_id)] = part
        else:
            _add(total, part)
    tags = arrowcalls.dictionary_encode(table["tags"].combine_chunks())
    tag_of = _numbers(np, tags.indices, np.int32)
    tagged = _valid(np, tags.indices)
    if not tagged.any():
        return
    tag_names = tags.dictionary.to_pylist()
    pairs, pair_counts = np.unique(
        group_of[tagged].astype(np.int64) * len(tag_names) + tag_of[tagged], return_counts=True
    )
    for pair, number in zip(pairs.tolist(), pair_counts.tolist(), strict=True):
        group, tag = divmod(pair, len(tag_names))
        queues[queue_of[group]].tags[tag_names[tag]] += number


def _numbers(np: Any, values: Any, kind: Any) -> Any:
    """An Arrow integer array without nulls as a numpy view of its buffer (``to_numpy``
    would import pandas)."""
    data = np.frombuffer(values.buffers()[1], dtype=kind)
    return data[values.offset : values.offset + len(values)]


def _valid(np: Any, values: Any) -> Any:
    """Where an Arrow array holds a value (not null), as a numpy boolean array."""
    if not values.null_count:
        return np.ones(len(values), dtype=bool)
    bits = np.unpackbits(np.frombuffer(values.buffers()[0], dtype=np.uint8), bitorder="little")
    return bits[values.offset : values.offset + len(values)].astype(bool)


def _queue_id(key: int) -> int:
    """The queue id in the low 32 bits of a group key (a signed 32-bit value)."""
    queue_id = key & 0xFFFFFFFF
    return queue_id - (1 << 32) if queue_id >= 1 << 31 else queue_id


def count_range_by_record(
    store: str, part: FileRange, topics: frozenset[str] | None
) -> dict[tuple[str, int], QueueStats]:
    """The per-queue counts of the messages of one range (bounded by the walk), one record at
    a time: the stats without pyarrow, and the reference the Arrow counts are tested
    against."""
    queues: dict[tuple[str, int], QueueStats] = {}
    for _, _, _, header, topic, props, _ in RangeScan(
        StoreLocation(store), part, False, resync_last=True
    ):
        if topics is not None and topic not in topics:
            continue
        key = (topic, header.queue_id)
        entry = queues.get(key)
        if entry is None:
            entry = queues[key] = QueueStats(topic, header.queue_id)
        _count(entry, header, props)
    return queues


def _add(total: QueueStats, part: QueueStats) -> None:
    """Fold one range's counts of a queue into the totals."""
    total.messages += part.messages
    total.bytes += part.bytes
    total.min_queue_offset = _least(total.min_queue_offset, part.min_queue_offset)
    total.max_queue_offset = _most(total.max_queue_offset, part.max_queue_offset)
    total.first_store_timestamp = _least(total.first_store_timestamp, part.first_store_timestamp)
    total.last_store_timestamp = _most(total.last_store_timestamp, part.last_store_timestamp)
    total.tags.update(part.tags)


def _least(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def _most(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _count(entry: QueueStats, header: RecordHeader, props: bytes) -> None:
    entry.messages += 1
    entry.bytes += header.total_size
    queue_offset = header.queue_offset
    stamp = header.store_timestamp
    if entry.min_queue_offset is None or queue_offset < entry.min_queue_offset:
        entry.min_queue_offset = queue_offset
    if entry.max_queue_offset is None or queue_offset > entry.max_queue_offset:
        entry.max_queue_offset = queue_offset
    if entry.first_store_timestamp is None or stamp < entry.first_store_timestamp:
        entry.first_store_timestamp = stamp
    if entry.last_store_timestamp is None or stamp > entry.last_store_timestamp:
        entry.last_store_timestamp = stamp
    if b"TAGS" in props:
        tag = decode_properties(props).get(TAGS)
        if tag is not None:
            entry.tags[tag] += 1


# columns with few distinct values, dictionary-encoded in Parquet (the others, bodies, offsets
# and ids, are not: their dictionaries would cost time and grow the file; nor is the property
# map, whose names alone would repeat: hashing them costs more than it saves)
_DICTIONARY_COLUMNS = [
    "topic",
    "queueId",
    "flag",
    "sysFlag",
    "bornHost",
    "storeHost",
    "reconsumeTimes",
    "tags",
    "tagsCode",
    "version",
    "file",
]


# columns whose min/max statistics go into the file (what a reader can skip row groups by):
# not those of bodies, properties, keys and ids (they would cost as much as the rest of the
# encoding), nor of CRCs, hosts and versions (no one selects a range of them, and each costs
# a pass over a dictionary column's indices)
_STATISTICS_COLUMNS = [
    name
    for name, _, _ in COMMITLOG_COLUMNS
    if name
    not in (
        "body",
        "properties",
        "keys",
        "uniqKey",
        "msgId",
        "bodyCRC",
        "bornHost",
        "storeHost",
        "version",
    )
]


# offsets and times: each close to the one before, so stored as deltas, bit-packed (Parquet's
# DELTA_BINARY_PACKED, which Spark, Arrow, DuckDB and Trino read): a fraction of the bytes of
# plain 8-byte values, and faster to write
_DELTA_COLUMNS = {
    name: "DELTA_BINARY_PACKED"
    for name in (
        "queueOffset",
        "commitLogOffset",
        "bornTimestamp",
        "storeTimestamp",
        "bornTime",
        "storeTime",
    )
}


def _stored_schema() -> dict[bytes, bytes]:
    """The file's ``ARROW:schema`` (what Arrow readers take column types from) for a part
    written from :class:`ParquetPart`'s batches: the plain export schema, strings where the
    batches carry dictionaries (``rows.CODED_TEXT``), so the file reads back with the types
    of :data:`COMMITLOG_COLUMNS`, as if written from strings (the columns every message has
    a value in not null, as written). Arrow stores the serialized schema in base64 under
    that key."""
    serialized = arrow_schema(COMMITLOG_COLUMNS, not_null=ALWAYS_PRESENT).serialize().to_pybytes()
    return {b"ARROW:schema": base64.b64encode(serialized)}


def _write_parquet(stream: Any, batches: Iterator[Any]) -> int:
    """All ``batches`` into one Parquet file on ``stream``, encoded in a second thread while
    the next ones are built (see :class:`ParquetPart`)."""
    with _Background(_run) as encode:
        part = ParquetPart(lambda: stream, encode, close_stream=False)
        try:
            for batch in batches:
                part.add(batch)
        finally:
            part.close()
    return part.messages


def _run(task: Callable[[], Any]) -> None:
    task()


class ParquetPart:
    """One Parquet part file: row groups of about ROW_GROUP_ROWS messages (the kernel's
    batches are smaller) made into tables here and handed to ``encode`` (a
    :class:`_Background` running tasks in order in another thread: the encoder releases the
    GIL, and at most two tasks wait, so memory stays flat). That thread opens the file
    (``open_stream()``, when the first row group is ready; none when no message comes),
    writes it and closes it, so the caller goes on building meanwhile."""

    def __init__(
        self,
        open_stream: Callable[[], Any],
        encode: Callable[[Callable[[], Any]], None],
        *,
        close_stream: bool = True,
    ) -> None:
        import pyarrow as pa

        self.pa = pa
        self.encode = encode
        self.schema = arrow_schema(COMMITLOG_COLUMNS, coded=True, not_null=ALWAYS_PRESENT)
        self.file = _ParquetFile(open_stream, self.schema, close_stream)
        self.waiting: list[Any] = []
        self.waiting_rows = 0
        self.messages = 0
        self.opened = False

    def add(self, batch: Any) -> None:
        self.waiting.append(batch)
        self.waiting_rows += batch.num_rows
        self.messages += batch.num_rows
        if self.waiting_rows >= ROW_GROUP_ROWS:
            self._hand_over()

    def _hand_over(self) -> None:
        # one dictionary per coded column in the row group: the writer then takes the
        # batches' indices as they are (a dictionary that changed would make it re-encode)
        table = self.pa.Table.from_batches(self.waiting, schema=self.schema).unify_dictionaries()
        self.encode(partial(self.file.write, table))
        self.opened = True
        self.waiting, self.waiting_rows = [], 0

    def close(self) -> None:
        """The last row group and the footer, written in order after the others."""
        if self.waiting:
            self._hand_over()
        if self.opened:
            self.encode(self.file.close)
            self.opened = False


class _ParquetFile:
    """The encoder thread's side of a :class:`ParquetPart`: the file and its writer, made
    when the first row group comes (importing pyarrow.parquet there, not in the caller)."""

    def __init__(self, open_stream: Callable[[], Any], schema: Any, close_stream: bool) -> None:
        self.open_stream = open_stream
        self.schema = schema
        self.close_stream = close_stream
        self.stream: Any = None
        self.writer: Any = None

    def write(self, table: Any) -> None:
        if self.writer is None:
            import pyarrow.parquet as pq

            self.stream = self.open_stream()
            try:
                self.writer = pq.ParquetWriter(
                    self.stream,
                    self.schema,
                    store_schema=False,  # the coded schema: the plain one is stored below
                    use_dictionary=_DICTIONARY_COLUMNS,
                    write_statistics=_STATISTICS_COLUMNS,
                    column_encoding=_DELTA_COLUMNS,
                    # values handed to the encoders at a time (Arrow's default is 1,024):
                    # a batch's worth costs 7% less encoding (a page may then pass 1 MiB)
                    write_batch_size=EXPORT_BATCH_ROWS,
                )
                # (an older pyarrow without this call leaves the key out: readers then take
                # the same types from the Parquet schema)
                if hasattr(self.writer, "add_key_value_metadata"):
                    self.writer.add_key_value_metadata(_stored_schema())
            except BaseException:
                self.close()
                raise
        try:
            self.writer.write_table(table)
        except BaseException:
            _abandon(self.close)
            raise

    def close(self) -> None:
        writer, stream = self.writer, self.stream
        self.writer = self.stream = None  # closed once, however it ends
        try:
            if writer is not None:
                writer.close()
        finally:
            if self.close_stream and stream is not None:
                stream.close()


class JsonlPart:
    """One JSON-lines part file, opened at its first batch: each batch's lines are made (see
    :func:`_write_jsonl`) and written by ``encode``'s thread, in order, so the caller goes
    on building the next batch meanwhile (1M messages to a tmpfs: 1.8-2.1 s, where the
    lines made and written between the batches took 2.2-2.3 s: the text is mostly Arrow's
    and the kernel's work, and the writes system calls, without the GIL)."""

    def __init__(
        self, open_stream: Callable[[], Any], encode: Callable[[Callable[[], Any]], None]
    ) -> None:
        self.open_stream = open_stream
        self.encode = encode
        self.stream: Any = None
        self.opened = False

    def add(self, batch: Any) -> None:
        if batch.num_rows:
            self.encode(partial(self._write, batch))
            self.opened = True

    def _write(self, batch: Any) -> None:
        if self.stream is None:
            self.stream = self.open_stream()
        try:
            _write_jsonl(self.stream, iter([batch]))
        except BaseException:
            _abandon(self._close)
            raise

    def close(self) -> None:
        """The file closed after the lines handed over before."""
        if self.opened:
            self.encode(self._close)
            self.opened = False

    def _close(self) -> None:
        stream, self.stream = self.stream, None
        if stream is not None:
            stream.close()


def _abandon(close: Callable[[], None]) -> None:
    """Close a part file whose write failed (the caller raises that failure): its stream is
    released now, not by the garbage collector at exit, where Arrow writes the failed
    flush's error to the terminal after the command's one error line. The writer thread
    skips the items after a failure, the part's close among them."""
    with suppress(Exception):
        close()


class _Background:
    """``work(item)`` for each item given, in order, in one thread of its own; a failure
    there is raised in the caller (at the next item, or on leaving, also when the caller is
    a generator closed early: the one-pass export's, which the walk leaves at the end of the
    log's last file. A failure of the last part file's encoding, a full disk as its last row
    group or footer was written, was lost there: the export said it was done, exit 0, with
    that part file cut short)."""

    def __init__(self, work: Callable[[Any], Any], waiting: int = 2) -> None:
        self.work = work
        self.items: queue.Queue[Any] = queue.Queue(maxsize=waiting)
        self.failure: BaseException | None = None
        self.abandoned = False  # the caller left on an error or a stop: items not worked
        self.ended = threading.Event()  # the thread's code is done
        self.thread = threading.Thread(target=self._run, name="rmqstore-encode", daemon=True)

    def __enter__(self) -> Callable[[Any], None]:
        self.thread.start()
        return self._give

    def _give(self, item: Any) -> None:
        if self.failure is not None:
            raise self.failure
        self.items.put(item)

    def _run(self) -> None:
        try:
            while (item := self.items.get()) is not _DONE:
                if self.failure is None and not self.abandoned:
                    try:
                        self.work(item)
                    except BaseException as exc:  # handed to the caller's thread
                        self.failure = exc
        finally:
            self.ended.set()

    def _abandon(self) -> None:
        """What waits is of no use (the caller leaves on an error or a stop): the thread
        ends after the item it is at."""
        self.abandoned = True

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        if kind is not None and not issubclass(kind, GeneratorExit):
            self._abandon()
        try:  # the thread is told to end, and ends before the interpreter does
            through_stops(lambda: self.items.put(_DONE), on_stop=self._abandon)
        finally:
            through_stops(self.ended.wait)
            self.thread.join()
        if self.failure is not None and (kind is None or issubclass(kind, GeneratorExit)):
            raise self.failure


_DONE = object()


def _write_jsonl(stream: Any, batches: Iterator[Any]) -> int:
    """One JSON object per message (see :mod:`rmqstore.pipeline.jsonlines`)."""
    import pyarrow as pa

    from rmqstore.pipeline.jsonlines import jsonl_text

    count = 0
    for batch in batches:
        if batch.num_rows:
            stream.write(jsonl_text(pa, batch))
            count += batch.num_rows
    return count


_WRITERS = {"parquet": _write_parquet, "jsonl": _write_jsonl}
