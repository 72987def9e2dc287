"""Several slots of one database observed at once: each exactly its own observation.

``ClickHouseSnapshotCatalog.observe_many`` reads every name of every slot in the three
requests one observation makes and takes each slot's observation from its own rows,
with its own allowance, pool users and retained storage. Each slot's answer is
compared, field for field, with that slot observed alone on the managed server.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator

import pytest

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.localserver import ADMIN_USER, ServerInfo
from dpone.ports.clickhouse import QueryPort
from dpone.ports.clickhouse_request import ClickHouseRequest, Credentials, Endpoint
from dpone.ports.clickhouse_result import QueryResult
from dpone.ports.composition_snapshot import CatalogObservation, TargetSlot
from dpone.publication.catalog import (
    AllowedWriters,
    CatalogUnobservable,
    ClickHouseSnapshotCatalog,
    Idle,
    IdlePool,
    SlotsOverlap,
)
from dpone.publication.catalog.contents import MEMO
from tests import chhttp
from tests.plugins.catalog_queries import idle_by_target, running_as_cat_writer
from tests.plugins.managed_server import CATALOG_PASSWORD, SESSION_USERS

# cat_writer may ALTER UPDATE dpone_cat_table.target_t (tests/plugins/managed_server.py).
DB = "dpone_cat_table"
TRUSTED = frozenset({ADMIN_USER, *(u.name for u in SESSION_USERS)}) - {"cat_writer"}
TABLE = "(id UInt64, s String) ENGINE = MergeTree ORDER BY id"
# (target, generation): both with rows and an outside writer's grant on the target;
# an incoming view, no generation; a mutation in flight; no target, a generation.
SLOTS = [("target_t", "target_g"), ("mv_t", "mv_g"), ("mut_t", "mut_g"), ("new_t", "new_g")]
# Retained for a slot when it is not one of its names (the store recorded its UUID).
RECORDED = ("target_g", "mut_g", "old_t")
HELD = Idle(0, True, held_by="another-attempt")


class Counted:
    """The real transport, counting the requests it sends; when ``change`` is set, it
    is run (once) just before the recheck is asked."""

    name = "http"

    def __init__(self, inner: QueryPort, http_port: int) -> None:
        self.inner, self.http_port, self.sent = inner, http_port, 0
        self.change: str | None = None

    def execute(self, request: ClickHouseRequest, *, deadline: float) -> QueryResult:
        if self.change is not None and "-recheck-" in request.query_id:
            statement, self.change = self.change, None
            chhttp.query(self.http_port, statement)
        self.sent += 1
        return self.inner.execute(request, deadline=deadline)


def sql(server: ServerInfo, statement: str) -> str:
    return chhttp.query(server.http_port, statement)


def uuids(server: ServerInfo, names: tuple[str, ...]) -> set[str]:
    listed = ", ".join(f"'{n}'" for n in names)
    rows = chhttp.rows(
        server.http_port,
        f"SELECT toString(uuid) AS u FROM system.tables WHERE database = '{DB}' "
        f"AND name IN ({listed})",
    )
    return {str(r["u"]) for r in rows}


def catalog(
    server: ServerInfo,
    allowed: AllowedWriters | None = None,
    idle: IdlePool | None = None,
    recorded: frozenset[str] = frozenset(),
) -> tuple[ClickHouseSnapshotCatalog, Counted]:
    endpoint = Endpoint("127.0.0.1", server.http_port, server.tcp_port, "default")
    inner = HttpTransport(endpoint, Credentials("cat_observer", CATALOG_PASSWORD))
    counted = Counted(inner, server.http_port)
    found = ClickHouseSnapshotCatalog(
        counted,
        trusted_users=TRUSTED,
        allowed_writers=allowed,
        idle_pool=idle,
        recorded_uuids=lambda database: recorded,
    )
    return found, counted


def timeless(observation: CatalogObservation) -> CatalogObservation:
    return dataclasses.replace(observation, observed_at="")


def each_alone(
    cat: ClickHouseSnapshotCatalog,
    slots: list[tuple[str, str]],
    *,
    side_effects: bool = True,
    db: str = DB,
) -> dict[tuple[str, str], CatalogObservation]:
    ask = cat.observe if side_effects else cat.identities
    return {(t, g): timeless(ask(TargetSlot(db, t), g)) for t, g in slots}


def together(
    cat: ClickHouseSnapshotCatalog,
    slots: list[tuple[str, str]],
    *,
    side_effects: bool = True,
    db: str = DB,
) -> dict[tuple[str, str], CatalogObservation]:
    found = cat.observe_many(db, slots, side_effects=side_effects)
    return {pair: timeless(seen) for pair, seen in found.items()}


def reasons(observation: CatalogObservation) -> list[list[str]]:
    tables = (observation.target, observation.generation)
    return [sorted(b.reason for b in t.blockers) if t else ["absent"] for t in tables]


@pytest.fixture
def database(clickhouse: ServerInfo) -> Iterator[ServerInfo]:
    sql(clickhouse, f"CREATE DATABASE {DB} ENGINE = Atomic")
    try:
        for name in ("target_t", "target_g", "mv_t", "mut_t", "mut_g", "new_g", "old_t", "src"):
            sql(clickhouse, f"CREATE TABLE {DB}.{name} {TABLE}")
        for name, rows in (("target_t", 3), ("target_g", 5), ("mut_t", 10), ("new_g", 2)):
            sql(clickhouse, f"INSERT INTO {DB}.{name} SELECT number, 'v' FROM numbers({rows})")
        sql(clickhouse, f"INSERT INTO {DB}.old_t SELECT number, 'old' FROM numbers(7)")
        sql(clickhouse, f"CREATE MATERIALIZED VIEW {DB}.mv TO {DB}.mv_t AS SELECT * FROM {DB}.src")
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


@pytest.mark.parametrize("allowance", ["strict", "target_t_allows_its_writer"])
def test_each_slot_equals_its_own_observation(database: ServerInfo, allowance: str) -> None:
    def allowed(slot: TargetSlot, generation: str) -> set[str]:
        return {"cat_writer"} if allowance != "strict" and slot.table == "target_t" else set()

    recorded = frozenset(uuids(database, RECORDED))
    assert len(recorded) == 3
    cat, _ = catalog(database, allowed, recorded=recorded)
    found = together(cat, SLOTS)
    assert list(found) == SLOTS
    assert found == each_alone(cat, SLOTS)
    grant = [] if allowance != "strict" else ["writer_grant"]
    assert {pair: reasons(seen) for pair, seen in found.items()} == {
        ("target_t", "target_g"): [grant, []],
        ("mv_t", "mv_g"): [["incoming_mv"], ["absent"]],
        ("mut_t", "mut_g"): [["mutation_in_flight"], []],
        ("new_t", "new_g"): [["absent"], []],
    }
    rows = {
        pair: [t.rows if t else None for t in (s.target, s.generation)] for pair, s in found.items()
    }
    assert rows == {
        ("target_t", "target_g"): [3, 5],
        ("mv_t", "mv_g"): [0, None],
        ("mut_t", "mut_g"): [10, 0],
        ("new_t", "new_g"): [None, 2],
    }
    # Retained relative to each slot's own names: its own generation never counts.
    size = {
        str(r["name"]): int(r["total_bytes"])
        for r in chhttp.rows(
            database.http_port,
            f"SELECT name, total_bytes FROM system.tables WHERE database = '{DB}' AND engine = 'MergeTree'",
        )
    }
    assert {pair: seen.retained_bytes for pair, seen in found.items()} == {
        ("target_t", "target_g"): size["target_t"] + size["mut_g"] + size["old_t"],
        ("mv_t", "mv_g"): size["mv_t"] + size["target_g"] + size["mut_g"] + size["old_t"],
        ("mut_t", "mut_g"): size["mut_t"] + size["target_g"] + size["old_t"],
        ("new_t", "new_g"): size["target_g"] + size["mut_g"] + size["old_t"],
    }
    assert found[("mv_t", "mv_g")].absent_writers == ()


def test_each_slot_is_judged_by_its_own_allowance(clickhouse: ServerInfo) -> None:
    """cat_writer may TRUNCATE every table of this database: only the middle slot's
    publication allows it, so only that slot's names are clear."""
    db = "dpone_cat_dbpre_many"  # under cat_writer's TRUNCATE ON dpone_cat_dbpre*.*
    slots = [("a_t", "a_g"), ("b_t", "b_g"), ("c_t", "c_g")]
    sql(clickhouse, f"CREATE DATABASE {db} ENGINE = Atomic")
    try:
        for pair in slots:
            for name in pair:
                sql(clickhouse, f"CREATE TABLE {db}.{name} {TABLE}")
        cat, _ = catalog(
            clickhouse, lambda slot, generation: {"cat_writer"} if slot.table == "b_t" else set()
        )
        found = together(cat, slots, db=db)
        assert found == each_alone(cat, slots, db=db)
        assert [reasons(found[pair]) for pair in slots] == [
            [["writer_grant"], ["writer_grant"]],
            [[], []],
            [["writer_grant"], ["writer_grant"]],
        ]
    finally:
        sql(clickhouse, f"DROP DATABASE {db} SYNC")


def test_identities_of_each_slot_equal_its_own(database: ServerInfo) -> None:
    cat, _ = catalog(database, recorded=frozenset(uuids(database, RECORDED)))
    found = together(cat, SLOTS, side_effects=False)
    assert found == each_alone(cat, SLOTS, side_effects=False)
    assert all(seen.retained_bytes == 0 for seen in found.values())
    assert found[("mut_t", "mut_g")].target is not None


def test_each_slots_digests_are_kept_by_its_own_rules(database: ServerInfo) -> None:
    """A digest is kept only for a plain MergeTree table with no blocker of its own slot:
    target_t (an outside writer), mv_t (an incoming view) and mut_t (a mutation in
    flight) are asked at every observation, the others once per state."""
    cat, _ = catalog(database)
    asked = []
    for change in ("", "", f"INSERT INTO {DB}.new_g VALUES (9, 'late')"):
        if change:
            sql(database, change)
        before = MEMO.computed
        found = cat.observe_many(DB, SLOTS)
        asked.append(MEMO.computed - before)
    assert asked == [6, 3, 4]
    generation = found[("new_t", "new_g")].generation
    assert generation is not None and generation.rows == 3


@pytest.mark.parametrize("target_t_holds", [True, False], ids=["held", "idle"])
def test_each_slot_accounts_its_own_pool_users(database: ServerInfo, target_t_holds: bool) -> None:
    """cat_writer (which may write target_t) runs a SELECT naming target_t. Held by
    another run for target_t's publication, its running SELECT is not target_t's
    blocker, even though mv_t's publication, for which no lease holds it, reads it."""
    idle = Idle(0, False)
    pool = {
        "target_t": {"cat_writer": HELD if target_t_holds else idle},
        "mv_t": {"cat_writer": idle},
    }
    statement = (
        "SELECT sleepEachRow(0.5), 'target_t' AS t FROM system.numbers LIMIT 60 "
        "SETTINGS max_block_size = 1"
    )
    with running_as_cat_writer(database, statement):
        cat, _ = catalog(database, idle=idle_by_target(pool))
        found = together(cat, SLOTS)
        assert found == each_alone(cat, SLOTS)
    seen = found[("target_t", "target_g")].target
    assert seen is not None
    pooled = [b for b in seen.blockers if b.reason == "pool_writer_query"]
    assert len(pooled) == (0 if target_t_holds else 1)


def test_a_logged_write_before_a_slots_own_generation_is_not_its_blocker(
    clickhouse: ServerInfo,
) -> None:
    """cat_writer writes target_t after clean_g was made and before target_g was: the
    read for both slots reads the query log from clean_g's creation, but target_t's
    slot, observed alone, reads it from target_g's, and never sees that write."""
    sql(clickhouse, f"CREATE DATABASE {DB} ENGINE = Atomic")
    try:
        for name in ("target_t", "clean_t", "clean_g"):
            sql(clickhouse, f"CREATE TABLE {DB}.{name} {TABLE}")
        time.sleep(1.1)  # the log's window is bounded by whole seconds
        chhttp.query(
            clickhouse.http_port,
            f"ALTER TABLE {DB}.target_t UPDATE s = 'w' WHERE 1 SETTINGS mutations_sync = 2",
            user="cat_writer",
            password=CATALOG_PASSWORD,
        )
        time.sleep(1.1)
        sql(clickhouse, f"CREATE TABLE {DB}.target_g {TABLE}")
        sql(clickhouse, "SYSTEM FLUSH LOGS")
        slots = [("target_t", "target_g"), ("clean_t", "clean_g")]
        # The write is cat_writer's as soon as target_t's own window covers it.
        early = [("target_t", "clean_g")]
        cat, _ = catalog(
            clickhouse, idle=idle_by_target({t: {"cat_writer": Idle(0, False)} for t, _ in slots})
        )
        found = together(cat, slots)
        assert found == each_alone(cat, slots)
        assert reasons(found[slots[0]]) == [["writer_grant"], []]
        widened = each_alone(cat, early)[early[0]]
        assert reasons(widened)[0] == ["pool_writer_query", "writer_grant"]
    finally:
        sql(clickhouse, f"DROP DATABASE {DB} SYNC")


def test_one_slot_and_four_cost_the_same_requests(database: ServerInfo) -> None:
    cat, counted = catalog(database)
    sent = []
    for slots in (SLOTS[:1], SLOTS):
        for side_effects in (True, False):
            counted.sent = 0
            cat.observe_many(DB, slots, side_effects=side_effects)
            sent.append(counted.sent)
    counted.sent = 0
    cat.observe(TargetSlot(DB, "mut_t"), "mut_g")  # a mutation in flight: never kept
    sent.append(counted.sent)
    assert sent == [3, 3, 3, 3, 3]


@pytest.mark.parametrize("changed", ["target_g", "new_g"])
def test_a_name_changed_during_the_observation_refuses_every_slot(
    database: ServerInfo, changed: str
) -> None:
    cat, counted = catalog(database)
    counted.change = f"EXCHANGE TABLES {DB}.{changed} AND {DB}.old_t"
    with pytest.raises(CatalogUnobservable) as refused:
        cat.observe_many(DB, SLOTS)
    assert counted.change is None  # it ran, before the recheck
    assert refused.value.code == "catalog_unobservable"
    assert refused.value.details["table"] == changed
    assert refused.value.details["database"] == DB
    # Observed again, every slot is answered.
    assert set(cat.observe_many(DB, SLOTS)) == set(SLOTS)


def test_a_missing_database_answers_every_slot_absent(clickhouse: ServerInfo) -> None:
    cat, counted = catalog(clickhouse)
    slots = [("a", "a_g"), ("b", "b_g")]
    for side_effects in (True, False):
        found = cat.observe_many("dpone_cat_nowhere", slots, side_effects=side_effects)
        assert {pair: timeless(seen) for pair, seen in found.items()} == {
            pair: CatalogObservation(None, None, 0, "") for pair in slots
        }
    assert counted.sent == 2  # one request each: the database is not there


def test_two_slots_never_share_a_name(clickhouse: ServerInfo) -> None:
    cat, counted = catalog(clickhouse)
    for slots in ([("a", "a_g"), ("a", "b_g")], [("a", "a_g"), ("b", "a_g")]):
        with pytest.raises(SlotsOverlap) as refused:
            cat.observe_many(DB, slots)
        assert refused.value.code == "configuration_error"
    with pytest.raises(CatalogUnobservable):
        cat.observe_many(DB, [("a", "a")])
    assert cat.observe_many(DB, []) == {}
    assert counted.sent == 0  # refused before anything was read


def test_each_slots_last_look_equals_its_own(database: ServerInfo) -> None:
    """The executor's last look before an EXCHANGE, for several slots at once: each
    slot's blockers are those of its own names, as its own look finds them, in the
    one request its own look takes."""
    cat, counted = catalog(database)
    alone = {(t, g): cat.side_effects_now(TargetSlot(DB, t), g) for t, g in SLOTS}
    counted.sent = 0
    found = cat.side_effects_many(DB, SLOTS)
    assert counted.sent == 1
    assert found == alone
    assert {pair: sorted(b.reason for b in seen) for pair, seen in found.items()} == {
        # cat_writer may ALTER UPDATE target_t: an outside writer, trusted by no slot.
        ("target_t", "target_g"): ["writer_grant"],
        ("mv_t", "mv_g"): ["incoming_mv", "table_missing"],
        ("mut_t", "mut_g"): ["mutation_in_flight"],
        ("new_t", "new_g"): ["table_missing"],
    }


def test_a_last_look_at_a_missing_database_blocks_every_slot(clickhouse: ServerInfo) -> None:
    cat, _ = catalog(clickhouse)
    found = cat.side_effects_many("dpone_no_such_db", [("a_t", "a_g"), ("b_t", "b_g")])
    assert {pair: [b.reason for b in seen] for pair, seen in found.items()} == {
        ("a_t", "a_g"): ["database_missing"],
        ("b_t", "b_g"): ["database_missing"],
    }
