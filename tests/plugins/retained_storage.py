"""Retained storage on a server of its own: one protected database per test of
test_retained_storage.py and test_publish_headroom.py, the real publisher and the
catalog that counts what the store recorded, and the tables' sizes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.contracts.composition_snapshot import DEFAULT_LIMITS, SnapshotLimits
from dpone.localserver import LocalServer
from dpone.localserver.principal_pool import (
    CATALOG_USER,
    CLOSER_USER,
    managed_server_users,
    pool_names,
)
from dpone.ports.clickhouse_request import Endpoint
from dpone.publication.catalog import (
    ClickHouseSnapshotCatalog,
    RecordedUuids,
)
from dpone.publication.ceilings.retained import recorded_table_uuids
from dpone.publication.composition import pool_credentials, provision_protected_databases
from dpone.publication.publisher import ClickHouseAtomicSnapshotPublisher
from dpone.publication.store import SqliteSnapshotStore
from tests import chhttp
from tests.publication_harness import Rig, Row

# One protected database per test: the marked staging tables of one test never count
# in another's retained bytes.
DATABASES = (
    *("ret_copy", "ret_first", "ret_gone", "ret_null", "ret_fail", "ret_ref", "ret_two"),
    "ret_once",
    *("head_stream", "head_zero", "head_retained", "head_publish"),  # test_publish_headroom
)


B_ROWS: list[Row] = [(1, "b-one", 10), (4, "b-four", 40)]


NEXT = "dpone_stage_next"  # a generation that does not exist yet


@pytest.fixture(scope="module")
def retained_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int, int]]:
    """A managed server whose pool protects every database in ``DATABASES`` (one per module
    that uses it)."""
    data_dir = tmp_path_factory.mktemp("retained") / "ch"
    server = LocalServer(data_dir, users=managed_server_users(DATABASES))
    info = server.start()
    try:
        provision_protected_databases(data_dir, info.http_port, DATABASES)
        chhttp.register_server(info.http_port, data_dir)
        yield data_dir, info.http_port, info.tcp_port
    finally:
        server.stop()


def rig_for(retained_server: tuple[Path, int, int], tmp_path: Path, database: str) -> Rig:
    data_dir, http_port, tcp_port = retained_server
    return Rig(data_dir, http_port, tcp_port, database, tmp_path)


def catalog_of(rig: Rig, recorded: RecordedUuids | None) -> ClickHouseSnapshotCatalog:
    """The catalog as ``dpone_catalog``, counting the tables ``recorded`` answers."""
    endpoint = Endpoint("127.0.0.1", rig.http_port, rig.tcp_port, rig.database)
    credentials = pool_credentials(rig.data_dir)[CATALOG_USER]
    return ClickHouseSnapshotCatalog(
        HttpTransport(endpoint, credentials),
        trusted_users=frozenset({"dpone_admin", CATALOG_USER, CLOSER_USER, *pool_names()}),
        recorded_uuids=recorded,
    )


def recording_catalog(rig: Rig) -> ClickHouseSnapshotCatalog:
    """The catalog with the store's recorded UUIDs, as ``build_publication`` wires it."""
    return catalog_of(rig, recorded_table_uuids(SqliteSnapshotStore(rig.store_path)))


def publisher_of(
    rig: Rig, limits: SnapshotLimits = DEFAULT_LIMITS
) -> ClickHouseAtomicSnapshotPublisher:
    """The real publisher of ``rig``, observing through :func:`recording_catalog`."""
    parts = rig.components()
    return ClickHouseAtomicSnapshotPublisher(
        authority=parts.publisher.authority,
        store=parts.store,
        catalog=recording_catalog(rig),
        executor=parts.publisher.executor,
        limits=limits,
    )


def sizes(rig: Rig) -> dict[str, int]:
    """``total_bytes`` of every table of the rig's database, as the administrator sees it."""
    return {
        r["name"]: int(r["total_bytes"])
        for r in chhttp.rows(
            rig.http_port,
            "SELECT name, total_bytes FROM system.tables WHERE database = "
            f"'{rig.database}' AND total_bytes IS NOT NULL",
        )
    }
