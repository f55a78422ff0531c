"""Option bundles shared by the commands (the sqlite-utils style: one decorator per bundle)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from rmqstore.config import StoreConfig, load_broker_config, round_consumequeue_size

F = Callable[..., Any]

store_argument = click.argument(
    "store", type=click.Path(path_type=Path, file_okay=True, dir_okay=True), metavar="STORE"
)

_CONFIG_OPTIONS = [
    click.option(
        "--broker-config",
        type=click.Path(path_type=Path, dir_okay=False),
        help="Read store settings (file sizes, index geometry, CRC switches, "
        "storePathCommitLog, ...) from the broker's broker.conf.",
    ),
    click.option(
        "--commitlog-file-size",
        type=click.IntRange(min=4096),
        metavar="BYTES",
        help="Commit-log file size (mappedFileSizeCommitLog); default: the size of "
        "the existing files, else 1073741824.",
    ),
    click.option(
        "--consumequeue-file-size",
        type=click.IntRange(min=20),
        metavar="BYTES",
        help="Consume-queue file size (mappedFileSizeConsumeQueue), rounded up to a "
        "multiple of 20; default: existing files, else 6000000.",
    ),
    click.option(
        "--index-slots",
        type=click.IntRange(min=1),
        metavar="N",
        help="Index hash slots per file (maxHashSlotNum); default 5000000.",
    ),
    click.option(
        "--index-entries",
        type=click.IntRange(min=2),
        metavar="N",
        help="Index entries per file (maxIndexNum); default 20000000.",
    ),
]


def store_config_options(func: F) -> F:
    """Adds ``--broker-config`` and the geometry overrides; passes ``config: StoreConfig``."""

    @functools.wraps(func)
    def wrapper(**kwargs: Any) -> Any:
        broker_config = kwargs.pop("broker_config")
        config = (
            load_broker_config(broker_config, kwargs.get("store"))
            if broker_config
            else StoreConfig()
        )
        cq_size = kwargs.pop("consumequeue_file_size")
        kwargs["config"] = config.with_overrides(
            commitlog_file_size=kwargs.pop("commitlog_file_size"),
            consumequeue_file_size=round_consumequeue_size(cq_size) if cq_size else None,
            index_slots=kwargs.pop("index_slots"),
            index_entries=kwargs.pop("index_entries"),
        )
        return func(**kwargs)

    for option in reversed(_CONFIG_OPTIONS):
        wrapper = option(wrapper)
    return wrapper


def json_option(func: F) -> F:
    return click.option(
        "--json", "as_json", is_flag=True, help="Print one JSON document instead of tables."
    )(func)


def jsonl_option(func: F) -> F:
    return click.option(
        "--jsonl", "as_jsonl", is_flag=True, help="Stream one JSON object per line (per message)."
    )(func)


def progress_option(func: F) -> F:
    return click.option(
        "--no-progress", is_flag=True, help="Do not show a progress bar on a terminal."
    )(func)
