"""Queries of a pool user against the catalog's tables, for the catalog's slot tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from dpone.localserver import ServerInfo
from dpone.publication.catalog import Idle, IdlePool
from tests import chhttp
from tests.plugins.managed_server import CATALOG_PASSWORD


@contextmanager
def running_as_cat_writer(server: ServerInfo, statement: str) -> Iterator[None]:
    """``statement`` running as cat_writer (a pool user here) for the block."""
    done: list[chhttp.Answer] = []
    thread = threading.Thread(
        target=lambda: done.append(
            chhttp.post(server.http_port, statement, user="cat_writer", password=CATALOG_PASSWORD)
        )
    )
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not chhttp.rows(
            server.http_port, "SELECT 1 FROM system.processes WHERE user = 'cat_writer'"
        ):
            assert time.monotonic() < deadline and thread.is_alive(), done
            time.sleep(0.05)
        yield
    finally:
        chhttp.query(server.http_port, "KILL QUERY WHERE user = 'cat_writer' SYNC")
        thread.join()


def idle_by_target(pool: Mapping[str, Mapping[str, Idle]]) -> IdlePool:
    """The idle pool users of each slot, by its target."""
    return lambda slot, generation: dict(pool.get(slot.table, {}))
