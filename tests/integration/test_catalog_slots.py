"""Several slots of one database judged at once: what observing each alone would find.

``ClickHouseSnapshotCatalog.slots_blockers`` reads every name of every slot in one
request and judges each slot from its own rows with its own allowance; a refresh of
several tables uses it for their checks (project/refresh_checks.py). Each slot's
answer is compared with that slot's own observation on the managed server.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.localserver import ADMIN_USER, ServerInfo
from dpone.ports.clickhouse import QueryPort
from dpone.ports.clickhouse_request import ClickHouseRequest, Credentials, Endpoint
from dpone.ports.clickhouse_result import QueryResult
from dpone.ports.composition_snapshot import Blocker, TargetSlot
from dpone.publication.catalog import AllowedWriters, ClickHouseSnapshotCatalog, Idle, IdlePool
from tests import chhttp
from tests.plugins.catalog_queries import idle_by_target, running_as_cat_writer
from tests.plugins.managed_server import CATALOG_PASSWORD, SESSION_USERS

# cat_writer may ALTER UPDATE dpone_cat_table.target_t (tests/plugins/managed_server.py).
DB = "dpone_cat_table"
TRUSTED = frozenset({ADMIN_USER, *(u.name for u in SESSION_USERS)}) - {"cat_writer"}
# (target, its generation); the generation exists only for exist_t.
SLOTS = [
    ("target_t", "target_g"),
    ("clean_t", "clean_g"),
    ("mv_t", "mv_g"),
    ("proj_t", "proj_g"),
    ("buf_t", "buf_g"),
    ("mut_t", "mut_g"),
    ("missing_t", "missing_g"),
    ("exist_t", "exist_g"),
]


class Counted:
    """The real transport, counting the requests it sends."""

    name = "http"

    def __init__(self, inner: QueryPort) -> None:
        self.inner, self.sent = inner, 0

    def execute(self, request: ClickHouseRequest, *, deadline: float) -> QueryResult:
        self.sent += 1
        return self.inner.execute(request, deadline=deadline)


def sql(server: ServerInfo, statement: str) -> str:
    return chhttp.query(server.http_port, statement)


def catalog(
    server: ServerInfo, allowed: AllowedWriters | None = None, idle: IdlePool | None = None
) -> tuple[ClickHouseSnapshotCatalog, Counted]:
    endpoint = Endpoint("127.0.0.1", server.http_port, server.tcp_port, "default")
    counted = Counted(HttpTransport(endpoint, Credentials("cat_observer", CATALOG_PASSWORD)))
    found = ClickHouseSnapshotCatalog(
        counted, trusted_users=TRUSTED, allowed_writers=allowed, idle_pool=idle
    )
    return found, counted


def alone(cat: ClickHouseSnapshotCatalog, target: str, generation: str) -> list[tuple[str, str]]:
    """Every blocker and absent writer the slot's own observation finds."""
    seen = cat.observe(TargetSlot(DB, target), generation)
    tables = [t for t in (seen.target, seen.generation) if t is not None]
    return sorted((b.reason, b.detail) for t in tables for b in (*t.blockers,)) + sorted(
        (b.reason, b.detail) for b in seen.absent_writers
    )


def judged(found: tuple[Blocker, ...] | None) -> list[tuple[str, str]] | None:
    if found is None:
        return None
    return sorted((b.reason, b.detail) for b in found)


@pytest.fixture
def database(clickhouse: ServerInfo) -> Iterator[ServerInfo]:
    sql(clickhouse, f"CREATE DATABASE {DB} ENGINE = Atomic")
    table = "(id UInt64, s String) ENGINE = MergeTree ORDER BY id"
    try:
        for target, _ in SLOTS:
            if target != "missing_t":
                sql(clickhouse, f"CREATE TABLE {DB}.{target} {table}")
        sql(clickhouse, f"CREATE TABLE {DB}.exist_g {table}")
        sql(clickhouse, f"CREATE TABLE {DB}.src {table}")
        sql(clickhouse, f"CREATE MATERIALIZED VIEW {DB}.mv TO {DB}.mv_t AS SELECT * FROM {DB}.src")
        sql(clickhouse, f"ALTER TABLE {DB}.proj_t ADD PROJECTION p (SELECT s, id ORDER BY s)")
        sql(
            clickhouse,
            f"CREATE TABLE {DB}.buf (id UInt64, s String) "
            f"ENGINE = Buffer({DB}, buf_t, 1, 10, 100, 10, 100, 10, 100)",
        )
        sql(clickhouse, f"INSERT INTO {DB}.mut_t SELECT number, 'v' FROM numbers(10)")
        # A mutation that fails on every attempt stays in flight until it is killed.
        sql(
            clickhouse,
            f"ALTER TABLE {DB}.mut_t UPDATE s = toString(throwIf(id >= 0, 'held on purpose')) "
            "WHERE 1 SETTINGS mutations_sync = 0",
        )
        yield clickhouse
    finally:
        sql(clickhouse, f"KILL MUTATION WHERE database = '{DB}' SYNC")
        sql(clickhouse, f"DROP DATABASE {DB} SYNC")


def test_each_slot_is_judged_as_its_own_observation_judges_it(database: ServerInfo) -> None:
    cat, counted = catalog(database)
    found = cat.slots_blockers(DB, SLOTS)
    assert counted.sent == 1  # every slot, every read: one request
    assert set(found) == {target for target, _ in SLOTS}
    for target, generation in SLOTS:
        if target == "exist_t":
            assert found[target] is None  # a generation that exists: observed on its own
            continue
        assert judged(found[target]) == alone(cat, target, generation), target
    reasons = {t: sorted({b.reason for b in found[t] or ()}) for t, _ in SLOTS}
    assert reasons == {
        "target_t": ["writer_grant"],
        "clean_t": [],
        "mv_t": ["incoming_mv"],
        "proj_t": ["projection"],
        "buf_t": ["writer_table"],
        "mut_t": ["mutation_in_flight"],
        "missing_t": [],
        "exist_t": [],
    }


def test_each_slot_has_its_own_allowance(database: ServerInfo) -> None:
    # cat_writer is allowed for target_t's publication only: its grant blocks no other.
    cat, _ = catalog(
        database, lambda slot, generation: {"cat_writer"} if slot.table == "target_t" else set()
    )
    found = cat.slots_blockers(DB, [("target_t", "target_g"), ("clean_t", "clean_g")])
    assert found == {"target_t": (), "clean_t": ()}
    strict, _ = catalog(database)
    blocked = strict.slots_blockers(DB, [("target_t", "target_g"), ("clean_t", "clean_g")])
    assert [b.reason for b in blocked["target_t"] or ()] == ["writer_grant"]
    assert blocked["clean_t"] == ()


def test_each_slot_accounts_its_own_pool_users(database: ServerInfo) -> None:
    """cat_writer, which may write target_t, runs a SELECT naming it. For target_t's
    publication it is a pool user no lease holds: its running query counts. For
    clean_t's, another run holds it, whose running SELECTs are not counted; the read of
    both must still see what target_t's own observation sees."""
    held = Idle(0, True, held_by="another-attempt")
    pools = {
        "idle": {"target_t": {"cat_writer": Idle(0, False)}, "clean_t": {"cat_writer": held}},
        "held": {"target_t": {"cat_writer": held}, "clean_t": {"cat_writer": held}},
    }
    slots = [("target_t", "target_g"), ("clean_t", "clean_g")]
    # Its text names target_t (a running query is matched by its text).
    statement = (
        "SELECT sleepEachRow(0.5), 'target_t' AS t FROM system.numbers LIMIT 60 "
        "SETTINGS max_block_size = 1"
    )
    with running_as_cat_writer(database, statement):
        for kind, pool in pools.items():
            cat, _ = catalog(database, idle=idle_by_target(pool))
            found = cat.slots_blockers(DB, slots)
            for target, generation in slots:
                assert judged(found[target]) == alone(cat, target, generation), (kind, target)
            pooled = [b for b in found["target_t"] or () if b.reason == "pool_writer_query"]
            assert len(pooled) == (1 if kind == "idle" else 0), (kind, found)
            assert found["clean_t"] == ()


def test_no_database_judges_no_slot(clickhouse: ServerInfo) -> None:
    cat, _ = catalog(clickhouse)
    assert cat.slots_blockers("dpone_cat_nowhere", [("a", "a_g"), ("b", "b_g")]) == {
        "a": None,
        "b": None,
    }
