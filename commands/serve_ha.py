"""``rmqstore serve-ha STORE --listen HOST:PORT``: a master's HA service over a store directory."""

from __future__ import annotations

import socket
from pathlib import Path

import click

from rmqstore.commands.options import Number, store_argument, store_config_options
from rmqstore.commands.output import note
from rmqstore.commands.signals import StopSignal
from rmqstore.config import StoreConfig
from rmqstore.errors import InputError
from rmqstore.ha import BATCH, HEARTBEAT, MAX_SLAVES, ServeOptions, serve
from rmqstore.hosts import split_host_port
from rmqstore.store import Store


@click.command("serve-ha")
@store_argument
@click.option(
    "--listen",
    required=True,
    metavar="HOST:PORT",
    help="Where to accept slaves (a broker's is its listenPort + 1, 10912 by default; port 0: "
    "any free one, said on stderr).",
)
@click.option(
    "--follow",
    "keep_following",
    is_flag=True,
    help="STORE is being written (a broker's, or an rmqstore append): serve what is added.",
)
@click.option(
    "--batch",
    type=Number(min=1, max=4 * 1024 * 1024 - 1),
    default=BATCH,
    show_default=True,
    metavar="BYTES",
    help="The most one frame carries (haTransferBatchSize).",
)
@click.option(
    "--max-slaves",
    type=Number(min=1, max=4096),
    default=MAX_SLAVES,
    show_default=True,
    metavar="N",
    help="Slaves served at once; a connection beyond them is closed at once, said on stderr "
    "(its slave connects again later, as a broker's does).",
)
@store_config_options
def command(
    store: Path,
    listen: str,
    keep_following: bool,
    batch: int,
    max_slaves: int,
    config: StoreConfig,
) -> int:
    """Serve STORE's commit log to slaves over RocketMQ's HA protocol, as a master does.

    A real RocketMQ slave broker (4.x or 5.x default HA) pointed at HOST:PORT (its
    haMasterAddress), or rmqstore replicate ha://HOST:PORT DEST, catches up from STORE: a
    slave that reports offset 0 gets STORE's last file on, one that reports its max offset
    gets what follows it. Frames carry at most --batch bytes of whole CRC-valid records (and the
    BLANKs that close files), never across a file end; a heartbeat goes out when a slave has
    everything and every 5 s after; one whose offset is in no file of STORE (its old files
    deleted) gets only heartbeats there, as from a broker. STORE is only read. Runs until
    SIGINT, SIGTERM or SIGHUP (run it under nohup to outlive its terminal). Peers are not
    trusted to stop connecting: past --max-slaves, or out of descriptors or memory, a
    connection is closed (said on stderr) and the master goes on serving the others.
    """
    host, port = split_host_port(listen)
    Store.open_read(store, config).close()  # not a store: said before a port is taken
    try:
        listener = socket.create_server((host, port), reuse_port=False)
    except OSError as exc:
        raise InputError(f"cannot listen on {listen}: {exc.strerror}") from None
    options = ServeOptions(
        follow=keep_following, heartbeat=HEARTBEAT, batch=batch, max_slaves=max_slaves
    )
    with listener, StopSignal() as stop:
        serve(store, listener, config, options, stop.requested, note)
    if stop.signal is not None:
        note(f"stopped by {stop.signal}")
    return 0
