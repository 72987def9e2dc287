"""Reads asked together in one request, on the managed server: the same answers, fewer trips.

Each batch is checked against the same reads asked one at a time (the answers must be
equal, value for value), and the requests are counted by the transport's pool.
"""

from __future__ import annotations

import dataclasses
import functools
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.connectors.clickhouse_tables import observe_ownership, observe_ownerships
from dpone.connectors.http_connections import POOL
from dpone.localserver import ADMIN_USER, ServerInfo, admin_credentials
from dpone.ports.clickhouse_request import ClickHouseRequest, Credentials, Endpoint
from dpone.ports.clickhouse_result import QueryResult
from dpone.ports.composition_snapshot import CatalogObservation, TargetSlot
from dpone.publication.catalog import CatalogUnobservable, ClickHouseSnapshotCatalog
from dpone.publication.catalog.contents import MEMO
from dpone.publication.catalog.reads import CatalogReads
from tests import chhttp
from tests.plugins.managed_server import CATALOG_PASSWORD, SESSION_USERS
from tests.profile_settings import ProfileSettings

DB = "dpone_batch_t"
TRUSTED = frozenset({ADMIN_USER, *(u.name for u in SESSION_USERS)}) - {"cat_writer"}


def sql(server: ServerInfo, statement: str) -> str:
    return chhttp.query(server.http_port, statement)


@pytest.fixture(scope="module")
def server(clickhouse: ServerInfo) -> Iterator[ServerInfo]:
    with chhttp.scratch_database(clickhouse.http_port, DB):
        yield clickhouse


def observer(server: ServerInfo) -> HttpTransport:
    endpoint = Endpoint("127.0.0.1", server.http_port, server.tcp_port, "default")
    return HttpTransport(endpoint, Credentials("cat_observer", CATALOG_PASSWORD))


def fresh_reads(server: ServerInfo) -> CatalogReads:
    return CatalogReads(observer(server), time.monotonic() + 30, time.monotonic)


def requests_of(step: object) -> int:
    before = POOL.traffic()
    assert callable(step)
    step()
    return POOL.traffic().since(before).requests


@pytest.fixture
def odd_table(server: ServerInfo) -> str:
    name = f"odd_{uuid.uuid4().hex[:8]}"
    sql(
        server,
        f"CREATE TABLE {DB}.{name} (id UInt64, big Int128, n Nullable(Int32), s String, "
        "a Array(String)) ENGINE = MergeTree ORDER BY id",
    )
    sql(
        server,
        f"INSERT INTO {DB}.{name} VALUES (18446744073709551615, "
        "-170141183460469231731687303715884105728, NULL, 'tab\\there\\nline \u0085 \"q\" \\\\', "
        "['x', '']), (1, 2, 3, '', [])",
    )
    return name


def test_a_batch_answers_exactly_what_each_read_answers(server: ServerInfo, odd_table: str) -> None:
    reads = [
        ("rows", f"SELECT * FROM {DB}.{odd_table} ORDER BY id"),
        (
            "columns",
            f"SELECT name, type FROM system.columns WHERE database = '{DB}' AND "
            f"table = '{odd_table}' ORDER BY position",
        ),
        ("nothing", f"SELECT id FROM {DB}.{odd_table} WHERE 0"),
        ("count", f"SELECT count() AS c FROM {DB}.{odd_table}"),
    ]
    alone = fresh_reads(server)
    expected = [alone.rows(*read) for read in reads]
    assert expected[0][1]["id"] == 18446744073709551615 and expected[0][1]["n"] is None
    assert expected[2] == [] and expected[3] == [{"c": 2}]
    batched = fresh_reads(server)
    assert requests_of(lambda: batched.prefetch("odd", reads)) == 1
    got: list[list[dict[str, object]]] = []
    assert requests_of(lambda: got.extend(batched.rows(*read) for read in reads)) == 0
    assert got == expected
    assert (
        batched.last_query_id.startswith("dpone-s00-catalog-") and "-odd-" in batched.last_query_id
    )
    # Each answer is taken once: the same read again goes to the server.
    assert requests_of(lambda: batched.rows(*reads[3])) == 1


def test_a_failing_batch_leaves_each_read_its_own_failure(
    server: ServerInfo, odd_table: str
) -> None:
    reads = [
        ("count", f"SELECT count() AS c FROM {DB}.{odd_table}"),
        ("missing", f"SELECT 1 AS one FROM {DB}.no_such_{uuid.uuid4().hex[:8]}"),
    ]
    batched = fresh_reads(server)
    assert requests_of(lambda: batched.prefetch("mixed", reads)) == 1
    assert requests_of(lambda: batched.rows(*reads[0])) == 1  # asked again, on its own
    with pytest.raises(CatalogUnobservable) as failed:
        batched.rows(*reads[1])
    assert failed.value.details["purpose"] == "missing"
    assert failed.value.details["unknown_table"] is True
    assert "-missing-" in failed.value.details["query_id"]


def test_an_observation_batched_equals_one_read_at_a_time(
    server: ServerInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    target, generation = f"t_{uuid.uuid4().hex[:8]}", f"g_{uuid.uuid4().hex[:8]}"
    for name in (target, generation):
        sql(
            server,
            f"CREATE TABLE {DB}.{name} (id UInt64, s String, INDEX ix s TYPE bloom_filter "
            "GRANULARITY 1, CONSTRAINT c CHECK id > 0) ENGINE = MergeTree ORDER BY id",
        )
        sql(server, f"INSERT INTO {DB}.{name} VALUES (1, 'a'), (2, 'b')")
    sql(
        server,
        f"CREATE MATERIALIZED VIEW {DB}.mv_{target} TO {DB}.{target} AS "
        f"SELECT id, s FROM {DB}.{generation}",
    )
    slot = TargetSlot(DB, target)
    catalog = ClickHouseSnapshotCatalog(observer(server), trusted_users=TRUSTED)
    batched: list[object] = []
    batched_requests = requests_of(lambda: batched.append(catalog.observe(slot, generation)))
    monkeypatch.setattr(CatalogReads, "prefetch", lambda *args: None)
    alone: list[object] = []
    alone_requests = requests_of(lambda: alone.append(catalog.observe(slot, generation)))
    one, other = batched[0], alone[0]
    assert dataclasses.replace(one, observed_at="") == dataclasses.replace(  # type: ignore[type-var]
        other, observed_at=""
    )
    assert one.target is not None and one.generation is not None  # type: ignore[attr-defined]
    assert [b.reason for b in one.target.blockers] == ["incoming_mv"]  # type: ignore[attr-defined]
    assert (batched_requests, alone_requests) == (3, 23)


def test_ownerships_of_many_names_in_one_read(server: ServerInfo, odd_table: str) -> None:
    other = f"own_{uuid.uuid4().hex[:8]}"
    sql(
        server,
        f"CREATE TABLE {DB}.{other} (id UInt64 COMMENT 'dpone-owned x') ENGINE = MergeTree "
        "ORDER BY id",
    )
    names = [odd_table, other, f"gone_{uuid.uuid4().hex[:8]}"]
    admin = HttpTransport(
        Endpoint("127.0.0.1", server.http_port, server.tcp_port, "default"),
        admin_credentials(server.data_dir),
    )
    ids = iter(range(1, 100))

    def next_id() -> str:
        return f"batch-own-{uuid.uuid4().hex}-{next(ids)}"

    deadline = time.monotonic() + 30
    found: dict[str, object] = {}
    assert (
        requests_of(lambda: found.update(observe_ownerships(admin, DB, names, next_id, deadline)))
        == 1
    )
    each = {n: observe_ownership(admin, DB, n, next_id, deadline) for n in names}
    assert found == {n: o for n, o in each.items() if o is not None}
    assert set(found) == {odd_table, other}
    marked = each[other]
    assert marked is not None and marked.comment == "dpone-owned x"


# --------------------------------------------------------------- digests kept per state


class InsertBeforeRecheck:
    """The catalog's port, which inserts a row into ``table`` just before the recheck is
    asked: a write between the parts read and the parts read again."""

    name = "http"

    def __init__(self, inner: HttpTransport, server: ServerInfo, table: str) -> None:
        self.inner, self.server, self.table = inner, server, table
        self.armed = False

    def execute(self, request: ClickHouseRequest, *, deadline: float) -> QueryResult:
        if self.armed and "-recheck-" in request.query_id:
            self.armed = False
            sql(self.server, f"INSERT INTO {DB}.{self.table} VALUES (99, 'late')")
        return self.inner.execute(request, deadline=deadline)


@pytest.fixture
def pair_of_tables(server: ServerInfo) -> tuple[str, str]:
    target, generation = f"t_{uuid.uuid4().hex[:8]}", f"g_{uuid.uuid4().hex[:8]}"
    for name in (target, generation):
        sql(
            server, f"CREATE TABLE {DB}.{name} (id UInt64, s String) ENGINE = MergeTree ORDER BY id"
        )
        sql(server, f"INSERT INTO {DB}.{name} VALUES (1, 'a'), (2, 'b')")
    return target, generation


def digests_asked(step: Callable[[], CatalogObservation]) -> tuple[int, CatalogObservation]:
    before = MEMO.computed
    observation = step()
    return MEMO.computed - before, observation


def contents(observation: CatalogObservation) -> list[tuple[int, str]]:
    tables = (observation.target, observation.generation)
    return [(t.rows, t.content_digest) for t in tables if t is not None]


def test_a_digest_is_asked_once_per_state_of_a_table(
    server: ServerInfo, pair_of_tables: tuple[str, str]
) -> None:
    target, generation = pair_of_tables
    slot = TargetSlot(DB, target)
    catalog = ClickHouseSnapshotCatalog(observer(server), trusted_users=TRUSTED)
    observe = functools.partial(catalog.observe, slot, generation)
    asked, first = digests_asked(observe)
    assert asked == 2
    asked, again = digests_asked(observe)
    assert asked == 0 and contents(again) == contents(first)
    # Every change of rows changes the parts: the digest is asked again, and differs.
    for change, rows in (
        (f"INSERT INTO {DB}.{generation} VALUES (3, 'c')", 3),
        (
            f"ALTER TABLE {DB}.{generation} UPDATE s = 'z' WHERE id = 1 SETTINGS mutations_sync = 2",
            3,
        ),
        (f"DELETE FROM {DB}.{generation} WHERE id = 2", 2),
        (f"OPTIMIZE TABLE {DB}.{generation} FINAL", 2),
    ):
        sql(server, change)
        asked, changed = digests_asked(observe)
        assert asked == 1, change
        assert changed.generation is not None and changed.generation.rows == rows, change
        assert contents(changed)[0] == contents(first)[0]  # the target's kept digest
    assert changed.generation.content_digest != first.generation.content_digest  # type: ignore[union-attr]
    # A column added without rewriting a part changes the design: asked again.
    sql(server, f"ALTER TABLE {DB}.{target} ADD COLUMN extra UInt8")
    asked, widened = digests_asked(observe)
    assert asked == 1 and widened.target is not None
    assert widened.target.content_digest != first.target.content_digest  # type: ignore[union-attr]


def test_a_write_during_the_observation_is_never_hidden_by_a_kept_digest(
    server: ServerInfo, pair_of_tables: tuple[str, str]
) -> None:
    target, generation = pair_of_tables
    slot = TargetSlot(DB, target)
    port = InsertBeforeRecheck(observer(server), server, generation)
    catalog = ClickHouseSnapshotCatalog(port, trusted_users=TRUSTED)
    # A row lands after the digests were asked, before the recheck: the generation's
    # digest belongs to no one set of parts and is not kept (the target's is).
    port.armed = True
    asked, first = digests_asked(lambda: catalog.observe(slot, generation))
    assert asked == 2 and first.generation is not None and first.generation.rows == 2
    asked, second = digests_asked(lambda: catalog.observe(slot, generation))
    assert asked == 1 and second.generation is not None and second.generation.rows == 3
    asked, third = digests_asked(lambda: catalog.observe(slot, generation))
    assert asked == 0 and contents(third) == contents(second)
    # Kept digests taken, then a row lands before the recheck: the digest reported would
    # be another state's, so the observation is refused, never answered with it.
    port.armed = True
    with pytest.raises(CatalogUnobservable) as changed:
        catalog.observe(slot, generation)
    assert changed.value.details["table"] == generation
    asked, fourth = digests_asked(lambda: catalog.observe(slot, generation))
    assert asked == 1 and fourth.generation is not None and fourth.generation.rows == 4


def test_no_digest_is_kept_for_a_table_whose_parts_cannot_show_its_rows(
    server: ServerInfo,
) -> None:
    """A Memory table has no parts: its digest is asked every time (reviewer's case)."""
    target, generation = f"t_{uuid.uuid4().hex[:8]}", f"m_{uuid.uuid4().hex[:8]}"
    sql(server, f"CREATE TABLE {DB}.{target} (id UInt64) ENGINE = MergeTree ORDER BY id")
    sql(server, f"CREATE TABLE {DB}.{generation} (id UInt64) ENGINE = Memory")
    sql(server, f"INSERT INTO {DB}.{generation} VALUES (1)")
    slot = TargetSlot(DB, target)
    catalog = ClickHouseSnapshotCatalog(observer(server), trusted_users=TRUSTED)
    asked, first = digests_asked(lambda: catalog.observe(slot, generation))
    assert asked == 2 and first.generation is not None and first.generation.rows == 1
    sql(server, f"INSERT INTO {DB}.{generation} VALUES (2), (3)")
    asked, again = digests_asked(lambda: catalog.observe(slot, generation))
    assert asked == 1 and again.generation is not None and again.generation.rows == 3


def test_a_batch_cut_by_its_deadline_is_never_asked_again(
    server: ServerInfo, odd_table: str
) -> None:
    late = CatalogReads(observer(server), time.monotonic() - 1, time.monotonic)
    reads = [
        ("count", f"SELECT count() AS c FROM {DB}.{odd_table}"),
        ("columns", f"SELECT name FROM system.columns WHERE table = '{odd_table}'"),
    ]
    sent: list[BaseException] = []

    def prefetch() -> None:
        try:
            late.prefetch("late", reads)
        except CatalogUnobservable as exc:
            sent.append(exc)

    assert requests_of(prefetch) == 0
    (failure,) = sent
    assert failure.details["purpose"] == "late"  # type: ignore[attr-defined]


def test_a_profile_applying_mutations_on_the_fly_never_changes_a_kept_digest(
    server: ServerInfo, pair_of_tables: tuple[str, str]
) -> None:
    """The catalog user's profile sets apply_mutations_on_fly = 1 and a mutation waits: the
    digest reads the stored rows only (what the parts show), and the mutation in
    flight keeps the table's digest from being kept at all (reviewer's case)."""
    target, generation = pair_of_tables
    slot = TargetSlot(DB, target)
    catalog = ClickHouseSnapshotCatalog(
        ProfileSettings(observer(server), apply_mutations_on_fly="1"), trusted_users=TRUSTED
    )
    observe = functools.partial(catalog.observe, slot, generation)
    asked, first = digests_asked(observe)
    assert asked == 2
    sql(server, f"SYSTEM STOP MERGES {DB}.{generation}")
    try:
        sql(
            server,
            f"ALTER TABLE {DB}.{generation} UPDATE s = 'changed' WHERE 1 "
            "SETTINGS mutations_sync = 0",
        )
        asked, pending = digests_asked(observe)
        assert asked == 1 and pending.generation is not None
        assert "mutation_in_flight" in [b.reason for b in pending.generation.blockers]
        assert contents(pending)[1] == contents(first)[1]  # the stored rows, unchanged
        asked, _ = digests_asked(observe)
        assert asked == 1  # never kept while the mutation waits
        sql(server, f"KILL MUTATION WHERE database = '{DB}' AND table = '{generation}' SYNC")
        asked, settled = digests_asked(observe)
        assert asked == 0 and contents(settled) == contents(first)
    finally:
        sql(server, f"SYSTEM START MERGES {DB}.{generation}")


def identity(observation: CatalogObservation) -> list[tuple[object, ...]]:
    tables = (observation.target, observation.generation)
    return [
        (t.name, t.uuid, t.rows, t.content_digest, t.design_sha256, t.parts, t.total_bytes)
        for t in tables
        if t is not None
    ]


def test_identities_answer_what_an_observation_answers_but_side_effects(
    server: ServerInfo, pair_of_tables: tuple[str, str]
) -> None:
    target, generation = pair_of_tables
    sql(
        server,
        f"CREATE MATERIALIZED VIEW {DB}.mv_{target} TO {DB}.{target} AS "
        f"SELECT id, s FROM {DB}.{generation}",
    )
    slot = TargetSlot(DB, target)
    catalog = ClickHouseSnapshotCatalog(observer(server), trusted_users=TRUSTED)
    asked, full = digests_asked(lambda: catalog.observe(slot, generation))
    assert asked == 2 and full.target is not None
    assert [b.reason for b in full.target.blockers] == ["incoming_mv"]
    # The MV writes the target and reads the generation: neither digest was kept by the
    # observation; identities ask both, keep them (their parts show every write) and
    # take them next time.
    asked, light = digests_asked(lambda: catalog.identities(slot, generation))
    assert asked == 2
    asked, again = digests_asked(lambda: catalog.identities(slot, generation))
    assert asked == 0 and identity(again) == identity(light)
    assert identity(light) == identity(full) and len(identity(light)) == 2
    assert light.target is not None and light.target.blockers == ()
    assert light.retained_bytes == 0 and light.absent_writers == ()
    # A name that is not there is absent, as in an observation.
    gone = catalog.identities(slot, f"none_{uuid.uuid4().hex[:8]}")
    assert gone.generation is None and identity(gone)[0] == identity(full)[0]


def test_identities_never_take_a_kept_digest_of_a_table_with_a_mutation_in_flight(
    server: ServerInfo, pair_of_tables: tuple[str, str]
) -> None:
    """A mutation in flight may be applied on the fly by reads while the parts stay: the
    digest is asked again, as an observation asks it (it sees the mutation as a blocker)."""
    target, generation = pair_of_tables
    slot = TargetSlot(DB, target)
    catalog = ClickHouseSnapshotCatalog(observer(server), trusted_users=TRUSTED)
    asked, _ = digests_asked(lambda: catalog.observe(slot, generation))
    assert asked == 2
    asked, _ = digests_asked(lambda: catalog.identities(slot, generation))
    assert asked == 0  # both kept
    # A mutation that fails on every try stays in flight and leaves the parts as they are.
    sql(
        server,
        f"ALTER TABLE {DB}.{target} UPDATE s = toString(throwIf(id > 0)) WHERE 1 "
        "SETTINGS mutations_sync = 0",
    )
    try:
        asked, light = digests_asked(lambda: catalog.identities(slot, generation))
        assert asked == 1 and light.target is not None and light.target.rows == 2
        asked, _ = digests_asked(lambda: catalog.identities(slot, generation))
        assert asked == 1  # never kept while the mutation is in flight
    finally:
        sql(server, f"KILL MUTATION WHERE database = '{DB}' AND table = '{target}' SYNC")


# The design digest of GOLDEN_DDL as the catalog computed it at a086ec5 (one read per
# table of each system table): an intent prepared then binds it, so the reads of a
# later version must compute the same digest for the same table.
GOLDEN_DDL = (
    "CREATE TABLE {db}.{name} (id UInt64 CODEC(Delta, ZSTD(3)), s String DEFAULT 'x', "
    "m UInt64 MATERIALIZED id * 2, d Date, INDEX ix s TYPE bloom_filter GRANULARITY 1, "
    "INDEX iy id TYPE minmax GRANULARITY 2, PROJECTION p (SELECT id, s ORDER BY s), "
    "PROJECTION q (SELECT count() GROUP BY d), CONSTRAINT c CHECK id > 0, "
    "CONSTRAINT e ASSUME d > '2000-01-01') ENGINE = MergeTree PARTITION BY toYYYYMM(d) "
    "ORDER BY id SETTINGS index_granularity = 1024"
)
GOLDEN_DESIGN_SHA256 = "c1fea68b51fe3f5fa19f98e864ccbfc4eddfc1af248a370c993f915e8cb85562"


def test_a_designs_digest_is_the_one_earlier_versions_computed(server: ServerInfo) -> None:
    name = f"golden_{uuid.uuid4().hex[:8]}"
    sql(server, GOLDEN_DDL.format(db=DB, name=name))
    catalog = ClickHouseSnapshotCatalog(observer(server), trusted_users=TRUSTED)
    observed = catalog.observe(TargetSlot(DB, name), f"none_{uuid.uuid4().hex[:8]}")
    assert observed.target is not None
    assert observed.target.design_sha256 == GOLDEN_DESIGN_SHA256
