"""RocketMQ's default master/slave HA protocol (4.9.8 and 5.3.3 speak the same one; see
``ha-protocol.md``): a slave reports its commit-log max offset as 8 bytes, the master streams
frames ``[offset int64][size int32][size bytes of commit log]``, a size of 0 being a heartbeat.

:func:`serve` is a master's HA service over a store directory (read only): a real slave broker,
or :func:`replicate_from_master`, catches up from it. :func:`replicate_from_master` is a slave
writing into a store it holds: it checks each frame's offset against its own end, writes the raw
bytes at that offset, reports after each frame and dispatches the records that are whole (a
record cut by a frame boundary waits for its rest). Both are bounded against a hostile peer: a
frame over :data:`MAX_FRAME`, one that crosses a file end or starts where the slave does not
end, a peer silent for :data:`SILENCE` seconds: a clear error, and the slave's bytes after its
last whole record are zeroed again.
"""

from __future__ import annotations

import errno
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rmqstore.commitlog import LogEnd
from rmqstore.config import StoreConfig
from rmqstore.errors import ExitCode, RmqStoreError, StoreIOError
from rmqstore.record import ScanStop
from rmqstore.replication import (
    confirmed_end,
    dispatch_copied,
    readable_end,
    whole_records_end,
)
from rmqstore.segments import (
    WRITE_SETTLE,
    Segment,
    open_for_writing,
    pwrite_fully,
    sync_file_data,
)
from rmqstore.store import Store
from rmqstore.windows import read_range

REPORT = struct.Struct(">q")
HEADER = struct.Struct(">qi")
BATCH = 32 * 1024  # haTransferBatchSize: the most a frame carries
MAX_FRAME = 4 * 1024 * 1024  # a Java slave's read buffer: a bigger frame is refused
HEARTBEAT = 5.0  # haSendHeartbeatInterval, seconds
SILENCE = 20.0  # haHousekeepingInterval: a peer silent this long is gone
_IDLE_WAIT = 0.1  # how long the master's writer waits for new data
MAX_SLAVES = 32  # slaves a master serves at once (a connection beyond them is closed)
# accept() failing for want of descriptors or memory: the connection waits in the listen
# backlog, and the master tries again after this long instead of stopping
_ACCEPT_PAUSE = 0.5
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# accept() passing on a network error of the connection it took (Linux's accept(2)): that
# connection is gone, the next one is taken
_CONNECTION_GONE = frozenset(
    {
        errno.ECONNABORTED,
        errno.EPROTO,
        errno.ENOPROTOOPT,
        errno.EHOSTDOWN,
        errno.EHOSTUNREACH,
        errno.ENETDOWN,
        errno.ENETUNREACH,
        errno.EOPNOTSUPP,
        errno.EPERM,
    }
)
RECONNECT = 5.0  # seconds before a following slave connects again (a 5.x slave's wait)
SETTLE = 0.2  # seconds without data after a heartbeat at its end before a slave is done
DISPATCH_EVERY = 32 * 1024 * 1024  # a slave receiving steadily syncs and dispatches this often
DISPATCH_PAUSE = 0.05  # ... and whenever the master pauses this long


class HAError(RmqStoreError):
    """The HA peer broke the protocol, stalled or went away."""

    exit_code = ExitCode.IO


class HALinkError(HAError):
    """The connection failed (refused, closed, lost, silent): a slave that follows its master
    connects again, as a broker's slave does. ``progress``: what the failed session did."""

    progress: SlaveProgress | None = None


class FrameReader:
    """Frames out of a byte stream that arrives in pieces of any size, bounded: a size over
    ``limit`` or negative is an error before its body is awaited."""

    def __init__(self, limit: int = MAX_FRAME) -> None:
        self.limit = limit
        self.buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """The frames ``data`` completes, in order: ``(offset, body)``; body empty for a
        heartbeat."""
        self.buffer += data
        frames = []
        while len(self.buffer) >= HEADER.size:
            offset, size = HEADER.unpack_from(self.buffer)
            if size < 0 or size > self.limit or offset < 0:
                raise HAError(
                    f"the master sent a frame of {size} bytes at offset {offset} (at most "
                    f"{self.limit}): not the HA protocol"
                )
            if len(self.buffer) < HEADER.size + size:
                break
            frames.append((offset, bytes(self.buffer[HEADER.size : HEADER.size + size])))
            del self.buffer[: HEADER.size + size]
        return frames

    @property
    def pending_offset(self) -> int | None:
        """The offset of a frame whose header has arrived and whose body has not."""
        return HEADER.unpack_from(self.buffer)[0] if len(self.buffer) >= HEADER.size else None


# -- the master ------------------------------------------------------------------------------


@dataclass
class ServeOptions:
    follow: bool = False  # re-read the store's end: a store a broker is writing
    heartbeat: float = HEARTBEAT
    batch: int = BATCH
    silence: float = SILENCE
    max_slaves: int = MAX_SLAVES  # served at once; a connection beyond them is closed


def serve(
    store_root: Path,
    listener: socket.socket,
    config: StoreConfig,
    options: ServeOptions,
    should_stop: Callable[[], bool],
    on_event: Callable[[str], None] = lambda text: None,
) -> None:
    """Serve slaves on ``listener`` (bound and listening) until ``should_stop``: each
    connection in its own thread, as the broker's HA service does. ``on_event`` hears
    "serving ... on HOST:PORT" once the store's end is known, then each slave's comings and
    goings.

    A peer is not trusted to stop connecting: at most ``options.max_slaves`` are served at
    once (a connection beyond them is closed at once, said), and running out of descriptors
    or memory, taking a connection or serving one, ends that connection, not the master
    (it used to exit when a flood of connections used up its descriptors)."""
    with Store.open_read(store_root, config) as store:
        file_size = store.commitlog_file_size
    end = readable_end(store_root, config)
    lock = threading.Lock()
    state = {"end": end, "found": end, "at": time.monotonic()}
    threads: list[threading.Thread] = []

    def current_end() -> int:
        """Following a store being written, an end is served once it was found
        WRITE_SETTLE seconds ago (see :data:`rmqstore.segments.WRITE_SETTLE`)."""
        if options.follow:
            with lock:
                now = time.monotonic()
                if now - state["at"] >= WRITE_SETTLE:
                    state["end"] = state["found"]
                    state["found"] = readable_end(store_root, config, state["found"])
                    state["at"] = now
        return state["end"]

    host, port = listener.getsockname()[:2]
    on_event(f"serving {store_root} (its records end at {end}) on {host}:{port}; stop with Ctrl-C")
    listener.settimeout(0.2)
    starved = False  # accept() ran out of descriptors or memory (said once until it recovers)
    while not should_stop():
        try:
            connection, peer = listener.accept()
        except TimeoutError:
            continue
        except OSError as exc:
            if exc.errno in _CONNECTION_GONE:
                continue
            if exc.errno not in _OUT_OF_RESOURCES:
                raise
            if not starved:
                on_event(f"cannot take a slave's connection now ({exc.strerror}): trying again")
            starved = True
            time.sleep(_ACCEPT_PAUSE)
            continue
        starved = False
        # slaves that reconnect (a 4.9 slave ahead of the master does every few seconds)
        # leave ended threads behind: not kept, however long the master serves
        threads = [thread for thread in threads if thread.is_alive()]
        if len(threads) >= options.max_slaves:
            on_event(
                f"slave {peer[0]}:{peer[1]} refused: {len(threads)} slaves are being served "
                "(--max-slaves)"
            )
            connection.close()
            continue
        on_event(f"slave {peer[0]}:{peer[1]} connected")
        worker = threading.Thread(
            target=_serve_connection,
            args=(
                connection,
                store_root,
                config,
                file_size,
                current_end,
                options,
                should_stop,
                on_event,
            ),
            daemon=True,
        )
        try:
            worker.start()
        except RuntimeError as exc:  # no thread to be had (memory, a process limit)
            on_event(f"slave {peer[0]}:{peer[1]} refused: {exc}")
            connection.close()
            continue
        threads.append(worker)
    for worker in threads:
        worker.join(timeout=2)


def _serve_connection(
    connection: socket.socket,
    store_root: Path,
    config: StoreConfig,
    file_size: int,
    current_end: Callable[[], int],
    options: ServeOptions,
    should_stop: Callable[[], bool],
    on_event: Callable[[str], None],
) -> None:
    """One slave: nothing until its first report, then frames from the start that report
    asks for, a heartbeat once it has everything (and every ``heartbeat`` seconds idle).
    What ends it (the slave going, an error, no descriptor left) is said and closes this
    connection only."""
    reports = bytearray()
    start: int | None = None
    last_report = last_write = time.monotonic()
    position = 0
    told_caught_up = False
    # the position is in no file of the store (below its first, the master's old files
    # deleted, or in a missing one): as a broker does, only heartbeats go out there, and the
    # files are looked at again after a wait as for new data, not in a busy loop
    nowhere = False
    looked_again = 0.0
    store: Store | None = None
    reading: _OpenFile | None = None
    try:
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection.setblocking(False)
        store = Store.open_read(store_root, config)
        while not should_stop():
            sending = start is not None and position < current_end() and not nowhere
            readable = _ready(connection, select.POLLIN, 0 if sending else _IDLE_WAIT)
            now = time.monotonic()
            if readable:
                data = connection.recv(65536)
                if not data:
                    return
                reports += data
                whole = len(reports) - len(reports) % REPORT.size
                if whole:  # the newest complete report counts
                    (reported,) = REPORT.unpack_from(reports, whole - REPORT.size)
                    del reports[:whole]
                    last_report = now
                    if start is None:
                        start = reported or _last_file_start(current_end(), file_size)
                        position = start
                        on_event(f"slave reported {reported}: sending from {start}")
            elif now - last_report > options.silence:
                on_event("a slave sent no report for a while: closed")
                return
            if start is None:
                continue
            end = current_end()
            segment = store.commitlog.queue.find(position) if position < end else None
            if position < end and segment is None and now - looked_again >= _IDLE_WAIT:
                # a file created since? looked for once a wait, however often the slave writes
                looked_again = now
                store.close()
                store = None  # closed: not closed again should the next open fail
                store = Store.open_read(store_root, config)
                segment = store.commitlog.queue.find(position)
            nowhere = position < end and segment is None
            if segment is not None:
                stop = min(end, segment.start + file_size, position + options.batch)
                if reading is None or reading.path != segment.path:
                    if reading is not None:
                        reading.close()
                    reading = _OpenFile(segment.path)
                _send(connection, HEADER.pack(position, stop - position), more=True)
                reading.send(connection, position - segment.start, stop - position)
                position = stop
                last_write, told_caught_up = now, False
                continue
            if not told_caught_up or now - last_write >= options.heartbeat:
                _send(connection, HEADER.pack(position, 0))
                last_write, told_caught_up = now, True
    except (OSError, RmqStoreError) as exc:
        on_event(f"a slave connection ended: {exc}")
    finally:
        if reading is not None:
            reading.close()
        if store is not None:
            store.close()
        connection.close()


class _OpenFile:
    """A commit-log file a master sends from: its bytes go from the page cache to the socket
    (``sendfile``), not through Python."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise StoreIOError(f"cannot read {path}: {exc.strerror}") from None

    def send(self, connection: socket.socket, position: int, count: int) -> None:
        while count:
            _wait_writable(connection)
            try:
                sent = os.sendfile(connection.fileno(), self.fd, position, count)
            except BlockingIOError:
                continue
            if not sent:
                raise StoreIOError(f"{self.path} ended at {position} while it was sent")
            position += sent
            count -= sent

    def close(self) -> None:
        os.close(self.fd)


def _last_file_start(end: int, file_size: int) -> int:
    """Where a master starts a slave that reports 0: its last file's start."""
    return end - end % file_size


def _send(connection: socket.socket, data: bytes, *, more: bool = False) -> None:
    """All of ``data``; ``more``: the bytes that follow belong in the same packet."""
    view = memoryview(data)
    flags = socket.MSG_MORE if more else 0
    while view:
        _wait_writable(connection)
        try:
            sent = connection.send(view, flags)
        except BlockingIOError:
            continue
        view = view[sent:]


def _ready(connection: socket.socket, events: int, timeout: float) -> bool:
    """Whether ``connection`` is ready for ``events`` (or has an error or hang-up to tell)
    within ``timeout`` seconds: poll(2), which a master serving many slaves needs (select(2)
    takes no descriptor numbered past 1,023, and a master's limit may be far above it)."""
    poller = select.poll()
    poller.register(connection, events)
    return bool(poller.poll(timeout * 1000))


def _wait_writable(connection: socket.socket) -> None:
    writable = _ready(connection, select.POLLOUT, SILENCE)
    if not writable:
        raise HALinkError("the peer stopped reading")


# -- the slave -------------------------------------------------------------------------------


@dataclass
class SlaveProgress:
    """What a slave's session did so far."""

    from_offset: int
    to_offset: int = 0  # the end of the bytes written
    whole_end: int = 0  # the end of the whole records among them (dispatched)
    bytes_received: int = 0
    frames: int = 0
    records_dispatched: int = 0

    def to_dict(self) -> dict[str, int]:
        return {
            "fromOffset": self.from_offset,
            "toOffset": self.whole_end,
            "bytesReceived": self.bytes_received,
            "frames": self.frames,
            "recordsDispatched": self.records_dispatched,
        }


def connect(address: tuple[str, int]) -> socket.socket:
    """A connection to a master's HA port (before DEST is touched: a master that is not
    there changes nothing)."""
    try:
        connection = socket.create_connection(address, timeout=5)
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise HALinkError(f"cannot connect to {address[0]}:{address[1]}: {reason}") from None
    connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return connection


def replicate_from_master(
    connection: socket.socket,
    dest: Store,
    *,
    follow: bool,
    should_stop: Callable[[], bool],
    on_progress: Callable[[SlaveProgress], None] = lambda progress: None,
    silence: float = SILENCE,
) -> SlaveProgress:
    """Catch DEST up from a master over ``connection`` (:func:`connect`; closed when done),
    and keep following with ``follow``: the slave's side of the protocol. Without ``follow``
    it ends once a heartbeat has found DEST at the master's end and no data followed it for
    :data:`SETTLE` seconds (a Java master may send a heartbeat just before its data). DEST's
    bytes after its last whole record are zeroed again when the session ends with an error."""
    dest.reload_files()  # a session after another: what the last one left is read again
    # 'abort' before a frame is written, as a slave broker has it while it runs: a kill
    # before the reput dispatched the frame's records leaves them to a broker's crash
    # recovery (a 5.x broker's normal start may not dispatch them: spec 10.2, 10.4)
    dest.begin_write()
    file_size = dest.commitlog_file_size
    progress = _at_dests_end(dest)
    mine = progress.from_offset
    frames = FrameReader()
    files = threading.Lock()  # DEST's list of commit-log files: the writer adds to it
    writer = _LogWriter(dest, files)
    reput = _Reput(dest, progress.whole_end, files)
    try:
        _send(connection, REPORT.pack(mine))
        last_heard = last_report = time.monotonic()
        reported = requested = mine
        settled_since: float | None = None  # a heartbeat at DEST's end, no data since
        while not should_stop():
            reput.check()
            if reput.whole_end != progress.whole_end:
                progress.whole_end, progress.records_dispatched = reput.whole_end, reput.records
                on_progress(progress)
            readable, _, _ = select.select([connection], [], [], 0.1)
            now = time.monotonic()
            if not follow and settled_since is not None and now - settled_since >= SETTLE:
                break
            if not readable:
                if now - last_heard > silence:
                    raise HALinkError(f"the master sent nothing for {silence:.0f} s")
                if now - last_report >= HEARTBEAT:
                    _send(connection, REPORT.pack(reported))
                    last_report = now
                continue
            try:
                data = connection.recv(1 << 20)
            except OSError as exc:
                raise HALinkError(f"lost the connection to the master: {exc.strerror}") from None
            if not data:
                raise HALinkError("the master closed the connection")
            last_heard = now
            pending = frames.pending_offset
            if pending is not None and progress.to_offset and pending != progress.to_offset:
                raise _mismatch(pending, progress.to_offset)
            for offset, body in frames.feed(data):
                if not progress.to_offset:  # an empty DEST starts where the master says
                    if offset % file_size:
                        raise HAError(
                            f"the master starts an empty DEST at {offset}, which is not the "
                            f"start of a commit-log file of {file_size} bytes: " + _SIZE_MUST_MATCH
                        )
                    progress.to_offset = progress.whole_end = offset
                    reput.start_at(offset)
                if offset != progress.to_offset:
                    raise _mismatch(offset, progress.to_offset)
                if body:
                    writer.write(offset, body)
                    progress.to_offset = offset + len(body)
                    progress.bytes_received += len(body)
                    progress.frames += 1
                    settled_since = None
                else:  # a heartbeat at our end: the master may have nothing more
                    settled_since = settled_since or now
            if progress.to_offset != reported:
                _send(connection, REPORT.pack(progress.to_offset))
                reported, last_report = progress.to_offset, now
            if progress.to_offset > requested and (
                progress.to_offset - requested >= DISPATCH_EVERY or not _more_waiting(connection)
            ):
                reput.request(progress.to_offset)
                requested = progress.to_offset
        reput.request(progress.to_offset)
        reput.finish()
        progress.whole_end, progress.records_dispatched = reput.whole_end, reput.records
        writer.close()
        _settle(dest, progress)
    except BaseException as exc:
        reput.abandon()
        progress.whole_end, progress.records_dispatched = reput.whole_end, reput.records
        writer.close()
        _zero_partial(dest, progress)
        if isinstance(exc, HALinkError):
            exc.progress = progress
        raise
    finally:
        writer.close()
        connection.close()
    return progress


def follow_master(
    address: tuple[str, int],
    dest: Store,
    *,
    should_stop: Callable[[], bool],
    on_progress: Callable[[SlaveProgress], None] = lambda progress: None,
    on_event: Callable[[str], None] = lambda text: None,
    retry: float = RECONNECT,
) -> SlaveProgress:
    """Follow the master at ``address`` until ``should_stop``, as a slave broker does from
    its start: a connection that cannot be made (no master there yet) or that fails (the
    master restarts, the network drops, it falls silent) is made again after ``retry``
    seconds, DEST left at its last whole record. A master that breaks the protocol ends it
    (:class:`HAError`)."""
    total: SlaveProgress | None = None
    while True:
        try:
            current = connect(address)
        except HALinkError as exc:
            failed = exc
        else:
            try:
                session = replicate_from_master(
                    current,
                    dest,
                    follow=True,
                    should_stop=should_stop,
                    on_progress=lambda p, before=total: on_progress(_combined(before, p)),
                )
                return _combined(total, session)
            except HALinkError as exc:
                failed = exc
                if exc.progress is not None:
                    total = _combined(total, exc.progress)
        if should_stop():  # asked for during the attempt: nothing more to say
            break
        on_event(f"{failed}; connecting again in {retry:.0f} s")
        deadline = time.monotonic() + retry
        while time.monotonic() < deadline and not should_stop():
            time.sleep(0.05)
        if should_stop():
            break
    if total is not None:
        return total
    dest.reload_files()  # stopped before a master answered: DEST as it was
    return _at_dests_end(dest)


def _at_dests_end(dest: Store) -> SlaveProgress:
    """A slave's progress before a session: at the end of DEST's confirmed records (0 while
    DEST has no commit-log file)."""
    mine = confirmed_end(dest) if dest.commitlog.segments else 0
    return SlaveProgress(mine, mine, mine)


def _combined(before: SlaveProgress | None, session: SlaveProgress) -> SlaveProgress:
    """Several sessions' progress as one."""
    if before is None:
        return session
    return SlaveProgress(
        before.from_offset,
        session.to_offset,
        session.whole_end,
        before.bytes_received + session.bytes_received,
        before.frames + session.frames,
        before.records_dispatched + session.records_dispatched,
    )


def _more_waiting(connection: socket.socket) -> bool:
    readable, _, _ = select.select([connection], [], [], DISPATCH_PAUSE)
    return bool(readable)


class _LogWriter:
    """Frames' bytes into DEST's commit-log files, one file held open at a time (synced
    when the next is opened and at :meth:`close`)."""

    def __init__(self, dest: Store, files: threading.Lock) -> None:
        self.dest = dest
        self.files = files
        self.file_size = dest.commitlog_file_size
        self.start = -1
        self.fd = -1
        self.path: Path | None = None

    def write(self, offset: int, body: bytes) -> None:
        start = offset - offset % self.file_size
        if offset + len(body) > start + self.file_size:
            raise HAError(
                f"the master sent a frame crossing the end of DEST's commit-log file at "
                f"{start + self.file_size} (a master's frames end with its files): its files "
                f"are larger than DEST's {self.file_size} bytes; " + _SIZE_MUST_MATCH
            )
        if start != self.start:
            self.close()
            log = self.dest.commitlog
            with self.files:
                segment = log.queue.find(start) or log.queue.create(start)
            self.fd, self.start, self.path = open_for_writing(segment.path), start, segment.path
        view = memoryview(body)
        position = offset - start
        try:
            while view:
                written = os.pwrite(self.fd, view, position)
                view, position = view[written:], position + written
        except OSError as exc:
            raise StoreIOError(f"cannot write {self.path}: {exc.strerror}") from None

    def close(self) -> None:
        if self.fd >= 0:
            try:
                os.fdatasync(self.fd)
            except OSError as exc:
                raise StoreIOError(f"cannot sync {self.path}: {exc.strerror}") from None
            finally:
                os.close(self.fd)
                self.fd, self.start = -1, -1


class _Reput:
    """The slave's reput, in a thread of its own as a broker's ReputMessageService: it syncs
    the bytes received up to where it is asked to go, then dispatches the whole records
    among them (consume queues, index, checkpoint), while the session goes on receiving."""

    def __init__(self, dest: Store, whole_end: int, files: threading.Lock) -> None:
        self.dest = dest
        self.files = files
        self.whole_end = whole_end  # where the dispatched records end
        self.records = 0
        self.error: BaseException | None = None
        self._changed = threading.Condition()
        self._target = whole_end  # the received end asked for
        self._tried = whole_end  # the received end last dispatched up to
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="rmqstore-reput", daemon=True)
        self._thread.start()

    def start_at(self, offset: int) -> None:
        """An empty DEST: the master's first frame says where its log begins."""
        with self._changed:
            self.whole_end = self._target = self._tried = offset

    def request(self, received: int) -> None:
        with self._changed:
            if received > self._target:
                self._target = received
                self._changed.notify_all()

    def check(self) -> None:
        """Raise what stopped the reput thread, in the session's thread."""
        if self.error is not None:
            raise self.error

    def finish(self) -> None:
        """Wait for everything asked for to be dispatched."""
        self._stop()
        self.check()

    def abandon(self) -> None:
        """The session failed: stop after the dispatch in progress."""
        with self._changed:
            self._target = self._tried
        self._stop()

    def _stop(self) -> None:
        with self._changed:
            self._closing = True
            self._changed.notify_all()
        self._thread.join()

    def _run(self) -> None:
        try:
            while True:
                with self._changed:
                    while self._target <= self._tried and not self._closing:
                        self._changed.wait()
                    if self._target <= self._tried:
                        return
                    target = self._target
                with self.files:
                    _sync_received(self.dest, self.whole_end, target)
                    end, records = _dispatch_whole(self.dest, self.whole_end, target)
                with self._changed:
                    self._tried = target
                    self.whole_end, self.records = end, self.records + records
        except BaseException as exc:  # handed to the session's thread by check()
            self.error = exc


def _sync_received(dest: Store, begin: int, end: int) -> None:
    """Sync the commit-log files that hold ``[begin, end)`` (the writer's file included,
    through a descriptor of its own): records are durable before queues say they exist."""
    log = dest.commitlog
    for segment in log.segments:
        if segment.start + log.file_size <= begin or segment.start >= end:
            continue
        try:
            sync_file_data(segment.path)
        except OSError as exc:
            raise StoreIOError(f"cannot sync {segment.path}: {exc.strerror}") from None


def _settle(dest: Store, progress: SlaveProgress) -> None:
    """At a session's clean end: when DEST's log ends where its dispatched records do and
    only zeros follow, its store is consistent (an ``abort`` a killed session left goes)."""
    if dest.dispatched_through is None:
        dispatch_copied(dest, progress.whole_end)
    dest.reload_files()  # the end found when DEST was opened is behind what was received
    end = dest.log_end()
    if end.offset == progress.whole_end:
        dest.check_tail(end)
    elif (
        end.stop is ScanStop.BLANK
        and end.segment is not None
        and end.segment.start + dest.commitlog_file_size == progress.whole_end
    ):
        # the last file ends with the BLANK the master sent, and no file follows it yet (the
        # master's next file not begun, or damaged at its start): the BLANK and the bytes
        # after it are the master's; only what lies past that file's end is residue
        dest.check_tail(LogEnd(progress.whole_end, end.stop, end.error, end.segment))


def _mismatch(offset: int, mine: int) -> HAError:
    return HAError(
        f"the master sent data for offset {offset}, but DEST ends at {mine}: not this "
        "store's master, or its log changed"
    )


def _dispatch_whole(dest: Store, whole_end: int, received: int) -> tuple[int, int]:
    """Dispatch the records that are whole among the bytes received (``[whole_end,
    received)``; a record cut by a frame waits): returns (where they end, how many)."""
    log = dest.commitlog
    position = whole_end
    for segment in list(log.segments):
        if segment.start + log.file_size <= position:
            continue
        if segment.start > position:
            break
        limit = min(log.file_size, received - segment.start)
        end, complete, _ = whole_records_end(segment, position - segment.start, received=limit)
        if complete:
            _check_file_end(segment, end, log.file_size)
        if complete and segment.start + log.file_size > received:
            complete = False  # the BLANK's padding is still on its way: wait at the BLANK
        position = segment.start + (log.file_size if complete else end)
        if not complete:
            break
    position = min(position, received)
    if position <= whole_end:
        return whole_end, 0
    return position, dispatch_copied(dest, position)


_SIZE_MUST_MATCH = (
    "DEST's file size must be the master's mappedFileSizeCommitLog (pass "
    "--commitlog-file-size or --broker-config)"
)


def _check_file_end(segment: Segment, blank: int, file_size: int) -> None:
    """A master closes each commit-log file with a BLANK that reaches its end: one at
    ``blank`` in DEST's file that ends elsewhere closes a master's file of another size than
    DEST's (a slave broker configured so writes the master's next file on in the same file,
    and its walk takes the BLANK for the file's end: whatever follows is lost to it)."""
    declared = int.from_bytes(read_range(segment.path, blank, 4), "big", signed=True)
    if blank + declared != file_size:
        raise HAError(
            f"the master closes a commit-log file with a BLANK at offset "
            f"{segment.start + blank} that ends at {segment.start + blank + declared}, not "
            f"where DEST's files of {file_size} bytes end: its files are of another size; "
            + _SIZE_MUST_MATCH
        )


def _zero_partial(dest: Store, progress: SlaveProgress) -> None:
    """After an error: zero the bytes written after the last whole record, so DEST holds no
    torn record (the next session fetches them again)."""
    if progress.to_offset <= progress.whole_end:
        return
    log = dest.commitlog
    offset = progress.whole_end
    while offset < progress.to_offset:
        segment = log.queue.find(offset)
        if segment is None:
            break
        stop = min(progress.to_offset, segment.start + log.file_size)
        fd = open_for_writing(segment.path)
        try:
            pwrite_fully(fd, bytes(stop - offset), offset - segment.start)
            os.fdatasync(fd)
        finally:
            os.close(fd)
        offset = stop
    progress.to_offset = progress.whole_end


__all__ = [
    "BATCH",
    "HEADER",
    "MAX_FRAME",
    "REPORT",
    "FrameReader",
    "HAError",
    "HALinkError",
    "ServeOptions",
    "SlaveProgress",
    "connect",
    "follow_master",
    "replicate_from_master",
    "serve",
]
