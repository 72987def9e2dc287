"""Hidden writers, writers outside the leases, and the design digest, on the managed server.

Issue 22: a Buffer over the target flushed a row into it after the record said
``published`` (finding 4); pool users holding no lease could write the target and any
generation (finding 8); a design altered after the EXCHANGE still reconciled (finding 5,
the catalog's half: the observed design digest must change).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.connectors.clickhouse_tables import staging_table_name
from dpone.errors import StateError
from dpone.localserver import ADMIN_USER, ServerInfo
from dpone.localserver.principal_pool import ingest_users, pool_names, publisher_users
from dpone.ports.clickhouse_request import Credentials, Endpoint
from dpone.ports.composition_snapshot import Lease, TableObservation, TargetSlot
from dpone.publication.catalog import (
    AllowedWriters,
    CatalogUnobservable,
    ClickHouseSnapshotCatalog,
    design_sha256,
    lease_allowance,
)
from dpone.publication.store import SqliteSnapshotStore
from tests import chhttp
from tests.own_servers import own_server
from tests.plugins.managed_server import CATALOG_PASSWORD, POOL_DATABASE, SESSION_USERS

DB = "dpone_cw_t"
OTHER = "dpone_cw_other"
# Trusted at every observation: the administrator and the test users, never the pool.
TRUSTED = frozenset({ADMIN_USER, *(u.name for u in SESSION_USERS)}) - {
    "cat_writer",
    *pool_names(),
}
BUFFER_ARGS = "1, 100000, 100000, 1000000, 1000000, 100000000, 100000000"


def catalog(
    server: ServerInfo,
    *,
    trusted: frozenset[str] = TRUSTED,
    allowed: AllowedWriters | None = None,
) -> ClickHouseSnapshotCatalog:
    endpoint = Endpoint("127.0.0.1", server.http_port, server.tcp_port, "default")
    return ClickHouseSnapshotCatalog(
        HttpTransport(endpoint, Credentials("cat_observer", CATALOG_PASSWORD)),
        trusted_users=trusted,
        allowed_writers=allowed,
    )


def sql(server: ServerInfo, statement: str) -> str:
    return chhttp.query(server.http_port, statement)


def observe(
    server: ServerInfo,
    db: str,
    target: str,
    generation: str,
    *,
    trusted: frozenset[str] = TRUSTED,
    allowed: AllowedWriters | None = None,
) -> tuple[TableObservation, TableObservation]:
    seen = catalog(server, trusted=trusted, allowed=allowed).observe(
        TargetSlot(db, target), generation
    )
    assert seen.target is not None and seen.generation is not None
    return seen.target, seen.generation


def details(table: TableObservation, reason: str) -> list[str]:
    return [b.detail for b in table.blockers if b.reason == reason]


def pair(server: ServerInfo, db: str, target: str, generation: str) -> None:
    for name in (target, generation):
        sql(server, f"CREATE TABLE {db}.{name} (id UInt64) ENGINE = MergeTree ORDER BY id")


@pytest.fixture(scope="module")
def server(clickhouse: ServerInfo) -> Iterator[ServerInfo]:
    for name in (DB, OTHER):
        sql(clickhouse, f"CREATE DATABASE {name} ENGINE = Atomic")
    try:
        yield clickhouse
    finally:
        for name in (DB, OTHER):
            sql(clickhouse, f"DROP DATABASE {name} SYNC")


# ---------------------------------------------------------------------- hidden writers


def test_a_buffer_over_the_target_in_another_database_is_a_writer(server: ServerInfo) -> None:
    pair(server, DB, "buf_t", "buf_g")
    sql(
        server,
        f"CREATE TABLE {OTHER}.buf AS {DB}.buf_t ENGINE = Buffer({DB}, buf_t, {BUFFER_ARGS})",
    )
    # A row held in the Buffer: the target does not have it yet.
    sql(server, f"INSERT INTO {OTHER}.buf VALUES (7)")
    target, generation = observe(server, DB, "buf_t", "buf_g")
    assert details(target, "writer_table") == [
        f"Buffer table {OTHER}.buf flushes its rows into {DB}.buf_t "
        f"(Buffer('{DB}', 'buf_t', {BUFFER_ARGS}))"
    ]
    assert target.rows == 0 and generation.blockers == ()
    # What it hides: a flush writes the held row into whatever table has the name now.
    sql(server, f"OPTIMIZE TABLE {OTHER}.buf")
    assert chhttp.rows(server.http_port, f"SELECT id FROM {DB}.buf_t") == [{"id": 7}]


def test_a_buffer_over_the_generation_is_a_writer(server: ServerInfo) -> None:
    generation_table = staging_table_name("cw-buffer-b")
    pair(server, DB, "bufb_t", generation_table)
    sql(
        server,
        f"CREATE TABLE {OTHER}.bufb AS {DB}.{generation_table} "
        f"ENGINE = Buffer('{DB}', '{generation_table}', {BUFFER_ARGS})",
    )
    target, generation = observe(server, DB, "bufb_t", generation_table)
    assert target.blockers == ()
    assert [b.reason for b in generation.blockers] == ["writer_table"]
    assert generation.blockers[0].detail.startswith(
        f"Buffer table {OTHER}.bufb flushes its rows into {DB}.{generation_table} "
    )


def test_a_merge_table_whose_regexp_matches_the_target(server: ServerInfo) -> None:
    pair(server, DB, "mrg_t", "mrg_g")
    sql(server, f"CREATE TABLE {OTHER}.by_db AS {DB}.mrg_t ENGINE = Merge({DB}, '^mrg_t$')")
    sql(
        server,
        f"CREATE TABLE {OTHER}.by_regexp AS {DB}.mrg_t "
        f"ENGINE = Merge(REGEXP('^dpone_cw_.$'), '^mrg_[a-t]$')",
    )
    # The server's own regexp decides: these match neither name.
    sql(server, f"CREATE TABLE {OTHER}.elsewhere AS {DB}.mrg_t ENGINE = Merge(REGEXP('^x'), '.')")
    sql(server, f"CREATE TABLE {OTHER}.no_match AS {DB}.mrg_t ENGINE = Merge({DB}, '^mrg_q')")
    target, generation = observe(server, DB, "mrg_t", "mrg_g")
    assert details(target, "writer_table") == [
        f"Merge table {OTHER}.by_db reads by regular expression {DB}.mrg_t '^mrg_t$' "
        f"(Merge('{DB}', '^mrg_t$'))",
        f"Merge table {OTHER}.by_regexp reads by regular expression {DB}.mrg_t '^mrg_[a-t]$' "
        f"(Merge(REGEXP('^dpone_cw_.$'), '^mrg_[a-t]$'))",
    ]
    # '^mrg_[a-t]$' matches mrg_g as well; '^mrg_t$' does not.
    assert [d.split(" reads")[0] for d in details(generation, "writer_table")] == [
        f"Merge table {OTHER}.by_regexp"
    ]


def test_an_alias_names_the_target_and_a_column_name_does_not(server: ServerInfo) -> None:
    pair(server, DB, "al_t", "al_g")
    sql(server, f"CREATE TABLE {OTHER}.al ENGINE = Alias('{DB}.al_t')")
    # A Buffer beside the generation whose column is named like it: not a writer of it.
    sql(server, f"CREATE TABLE {OTHER}.unrelated (al_g UInt64) ENGINE = MergeTree ORDER BY al_g")
    sql(
        server,
        f"CREATE TABLE {DB}.unrelated_buf (al_g UInt64) "
        f"ENGINE = Buffer({OTHER}, unrelated, {BUFFER_ARGS})",
    )
    target, generation = observe(server, DB, "al_t", "al_g")
    assert details(target, "writer_table") == [
        f"Alias table {OTHER}.al writes through to {DB}.al_t (Alias('{DB}.al_t'))"
    ]
    assert generation.blockers == ()


@pytest.fixture(scope="module")
def cluster_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerInfo]:
    """A server of its own: a Distributed table needs a cluster, declared in config.d."""
    cluster = (
        "<clickhouse><remote_servers><dpone_loop><shard><replica><host>127.0.0.1</host>"
        "<port>9</port></replica></shard></dpone_loop></remote_servers></clickhouse>"
    )
    observer = next(u for u in SESSION_USERS if u.name == "cat_observer")
    data = tmp_path_factory.mktemp("catalog-cluster")
    with own_server(data, [observer], {"config.d/cluster.xml": cluster}) as info:
        for name in (DB, OTHER):
            chhttp.query(info.http_port, f"CREATE DATABASE {name} ENGINE = Atomic")
        yield info


def test_a_distributed_table_over_the_target_is_a_writer(cluster_server: ServerInfo) -> None:
    server = cluster_server
    pair(server, DB, "dist_t", "dist_g")
    sql(
        server,
        f"CREATE TABLE {OTHER}.dist AS {DB}.dist_t ENGINE = Distributed(dpone_loop, {DB}, dist_t)",
    )
    sql(
        server,
        f"CREATE TABLE {OTHER}.remote AS {DB}.dist_t "
        f"ENGINE = Remote('127.0.0.1:9', '{DB}', 'dist_g')",
    )
    target, generation = observe(server, DB, "dist_t", "dist_g")
    assert details(target, "writer_table") == [
        f"Distributed table {OTHER}.dist sends inserts to {DB}.dist_t "
        f"(Distributed('dpone_loop', '{DB}', 'dist_t'))"
    ]
    assert details(generation, "writer_table") == [
        f"Distributed table {OTHER}.remote sends inserts to {DB}.dist_g "
        f"(Remote('127.0.0.1:9', '{DB}', 'dist_g'))"
    ]


# ---------------------------------------------------------------------- writers outside leases


def grant_holders(table: TableObservation) -> set[str]:
    return {b.detail.split()[1] for b in table.blockers if b.reason == "writer_grant"}


@pytest.fixture
def pool_pair(server: ServerInfo) -> Iterator[tuple[str, str]]:
    """A target and an attempt's generation in the database the pool protects."""
    generation_table = staging_table_name("cw-lease-1")
    sql(server, f"CREATE DATABASE IF NOT EXISTS {POOL_DATABASE} ENGINE = Atomic")
    pair(server, POOL_DATABASE, "cw_lease_t", generation_table)
    try:
        yield "cw_lease_t", generation_table
    finally:
        for name in ("cw_lease_t", generation_table):
            sql(server, f"DROP TABLE {POOL_DATABASE}.{name} SYNC")


def test_pool_users_are_writers_unless_allowed_per_observation(
    server: ServerInfo, pool_pair: tuple[str, str]
) -> None:
    target_table, generation_table = pool_pair
    asked: list[tuple[TargetSlot, str]] = []

    def holder_only(slot: TargetSlot, generation: str) -> frozenset[str]:
        asked.append((slot, generation))
        return frozenset({"dpone_publisher_1"})

    target, generation = observe(
        server, POOL_DATABASE, target_table, generation_table, allowed=holder_only
    )
    assert asked == [(TargetSlot(POOL_DATABASE, target_table), generation_table)]
    others = set(publisher_users()) - {"dpone_publisher_1"}
    assert grant_holders(target) == others
    assert grant_holders(generation) == others | set(ingest_users())
    assert (
        f"user dpone_publisher_4 can write {POOL_DATABASE}.{target_table}: CREATE TABLE ON "
        f"{POOL_DATABASE}.*; DROP TABLE ON {POOL_DATABASE}.*; INSERT ON {POOL_DATABASE}.*"
    ) in details(target, "writer_grant")
    # The old constructor, trusting the whole pool, still works (and sees none of them).
    trusting, trusting_generation = observe(
        server, POOL_DATABASE, target_table, generation_table, trusted=TRUSTED | set(pool_names())
    )
    assert trusting.blockers == trusting_generation.blockers == ()


def test_lease_allowance_allows_active_leases_and_proven_closures_only(
    server: ServerInfo, pool_pair: tuple[str, str], tmp_path: Path
) -> None:
    target_table, generation_table = pool_pair
    store = SqliteSnapshotStore(tmp_path / "snapshots.sqlite")
    ingest_1 = store.lease("ingest", ("dpone_ingest_1",), "cw-lease-1")
    store.end_lease(ingest_1.lease_id)  # closed, and its closure proven
    store.end_lease(store.lease("ingest", ("dpone_ingest_2",), "cw-lease-0").lease_id)
    store.lease("publisher", ("dpone_publisher_1",), "cw-lease-1")  # the current holder
    store.lease("publisher", ("dpone_publisher_2",), "cw-lease-2")  # another attempt's: custody
    store.end_lease(store.lease("publisher", ("dpone_publisher_3",), "cw-lease-0").lease_id)
    proven = {ingest_1.lease_id}

    def closure_proven(lease: Lease) -> bool:
        return lease.lease_id in proven

    allowance = lease_allowance(
        lambda: [r.lease for r in store.lease_records(active_only=False)],
        closure_proven,
        pool_names(),
    )
    target, generation = observe(
        server, POOL_DATABASE, target_table, generation_table, allowed=allowance
    )
    # ingest_3, ingest_4 and publisher_4 were never leased: nothing of dpone runs as them;
    # publisher_1 and publisher_2 hold active leases (dpone's own principals in custody).
    # Reported: the users whose last lease ended without a proven closure.
    assert grant_holders(target) == {"dpone_publisher_3"}
    assert grant_holders(generation) == {"dpone_publisher_3", "dpone_ingest_2"}
    # Once the closure of publisher_3's last lease is proven, it is no longer reported.
    proven.add(store.leases_of("cw-lease-0")[-1].lease_id)
    target, generation = observe(
        server, POOL_DATABASE, target_table, generation_table, allowed=allowance
    )
    assert grant_holders(target) == set()
    assert grant_holders(generation) == {"dpone_ingest_2"}


def test_an_unreadable_allowance_is_unobservable(
    server: ServerInfo, pool_pair: tuple[str, str]
) -> None:
    target_table, generation_table = pool_pair

    def broken(slot: TargetSlot, generation: str) -> frozenset[str]:
        raise StateError("the store is gone", code="store_missing")

    with pytest.raises(CatalogUnobservable) as caught:
        catalog(server, allowed=broken).observe(
            TargetSlot(POOL_DATABASE, target_table), generation_table
        )
    assert caught.value.code == "catalog_unobservable"
    assert caught.value.details["cause"] == "store_missing"


# ---------------------------------------------------------------------- design digest


@pytest.mark.parametrize(
    "alteration",
    [
        "ADD INDEX ix_s s TYPE bloom_filter GRANULARITY 1",
        "MODIFY COLUMN s String CODEC(ZSTD(5))",
        "MODIFY SETTING merge_with_ttl_timeout = 3600",
        "MODIFY TTL d + INTERVAL 1 DAY",
    ],
    ids=["skipping-index", "column-codec", "table-setting", "ttl"],
)
def test_an_alteration_after_the_exchange_changes_the_design_digest(
    server: ServerInfo, alteration: str
) -> None:
    name = alteration.split()[1].lower().replace("column", "codec")
    target_table, generation_table = f"dd_{name}_t", staging_table_name(f"cw-dd-{name}")
    for table in (target_table, generation_table):
        sql(
            server,
            f"CREATE TABLE {DB}.{table} (id UInt64, s String, d DateTime) "
            "ENGINE = MergeTree ORDER BY id",
        )
    _, before = observe(server, DB, target_table, generation_table)
    bound = before.design_sha256  # what prepare seals into the intent (design_sha256)
    assert bound == design_sha256(before.design)
    sql(server, f"EXCHANGE TABLES {DB}.{target_table} AND {DB}.{generation_table}")
    exchanged, _ = observe(server, DB, target_table, generation_table)
    assert (exchanged.uuid, exchanged.design_sha256) == (before.uuid, bound)
    sql(server, f"ALTER TABLE {DB}.{target_table} {alteration}")
    altered, _ = observe(server, DB, target_table, generation_table)
    assert altered.uuid == before.uuid
    assert altered.design_sha256 != bound
    assert altered.design_sha256 == design_sha256(altered.design)
