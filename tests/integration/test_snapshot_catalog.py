"""The snapshot catalog on the managed server: design, blockers, content digest, bytes, log."""

from __future__ import annotations

import hashlib
import math
import struct
import time
import uuid
from collections.abc import Iterator

import pytest

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.connectors.clickhouse_tables import ownership_comment, staging_table_name
from dpone.contracts.preparation import rows_digest
from dpone.localserver import ADMIN_USER, ServerInfo, ServerUser
from dpone.ports.clickhouse_errors import ClickHouseServerError
from dpone.ports.clickhouse_request import Credentials, Endpoint, mutation
from dpone.ports.composition_snapshot import Blocker, TableObservation, TargetSlot
from dpone.publication.catalog import (
    OWNERSHIP_MARK,
    STAGE_PREFIX,
    ByteObservationMissing,
    CatalogUnobservable,
    ClickHouseSnapshotCatalog,
    GrantRow,
    writer_grant_blockers,
)
from tests import chhttp
from tests.own_servers import own_server
from tests.plugins.managed_server import CATALOG_PASSWORD, SESSION_USERS

DB = "dpone_cat_t"
# Every session user is trusted except the one declared to hold ambient write grants.
# The administrator (dpone_admin, always declared) is trusted like the session users.
TRUSTED = frozenset({ADMIN_USER, *(u.name for u in SESSION_USERS)}) - {"cat_writer"}


def catalog(
    server: ServerInfo,
    *,
    user: str = "cat_observer",
    password: str = CATALOG_PASSWORD,
    trusted: frozenset[str] = TRUSTED,
) -> ClickHouseSnapshotCatalog:
    endpoint = Endpoint("127.0.0.1", server.http_port, server.tcp_port, "default")
    return ClickHouseSnapshotCatalog(
        HttpTransport(endpoint, Credentials(user, password)), trusted_users=trusted
    )


def sql(server: ServerInfo, statement: str, data: bytes | None = None) -> str:
    return chhttp.query(server.http_port, statement, data=data)


def reasons(table: TableObservation | None) -> list[str]:
    assert table is not None
    return sorted(b.reason for b in table.blockers)


def pair(
    server: ServerInfo, db: str, target: str, generation: str, columns: str = "id UInt64, s String"
) -> None:
    for name in (target, generation):
        sql(server, f"CREATE TABLE {db}.{name} ({columns}) ENGINE = MergeTree ORDER BY tuple()")


@pytest.fixture(scope="module")
def server(clickhouse: ServerInfo) -> Iterator[ServerInfo]:
    with chhttp.scratch_database(clickhouse.http_port, DB):
        yield clickhouse


def observe(
    server: ServerInfo, target: str, generation: str, db: str = DB
) -> tuple[TableObservation | None, TableObservation | None]:
    seen = catalog(server).observe(TargetSlot(db, target), generation)
    return seen.target, seen.generation


# ---------------------------------------------------------------------- clean pair, design


def varstr(data: bytes) -> bytes:
    out, n = bytearray(), len(data)
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out) + data


def test_a_clean_pair_has_no_blockers_and_equal_designs(server: ServerInfo) -> None:
    pair(server, DB, "clean_t", "dpone_stage_clean")
    rows = [struct.pack("<Q", i) + varstr(f"v{i}".encode()) for i in range(100)]
    sql(server, f"INSERT INTO {DB}.dpone_stage_clean FORMAT RowBinary", b"".join(rows))
    target, generation = observe(server, "clean_t", "dpone_stage_clean")
    assert target is not None and generation is not None
    assert target.blockers == () and generation.blockers == ()
    assert target.design == generation.design and target.design_sha256 == generation.design_sha256
    assert (target.rows, target.total_bytes, target.parts) == (0, 0, 0)
    assert target.content_digest == "0" * 32
    assert (generation.rows, generation.parts) == (100, 1) and generation.total_bytes > 0
    assert generation.content_digest == rows_digest(rows)
    uuids = chhttp.rows(
        server.http_port,
        f"SELECT name, toString(uuid) AS u FROM system.tables WHERE database = '{DB}' "
        "AND name IN ('clean_t', 'dpone_stage_clean') ORDER BY name",
    )
    assert [(target.uuid, generation.uuid)] == [(uuids[0]["u"], uuids[1]["u"])]
    assert target.engine == "MergeTree" and [c["name"] for c in target.design["columns"]] == [
        "id",
        "s",
    ]


def test_missing_names_are_none(server: ServerInfo) -> None:
    sql(server, f"CREATE TABLE {DB}.only_gen (id UInt64) ENGINE = MergeTree ORDER BY id")
    target, generation = observe(server, "never_created", "only_gen")
    assert target is None and generation is not None and generation.blockers == ()
    seen = catalog(server).observe(TargetSlot("dpone_cat_no_such_db", "t"), "g")
    assert (seen.target, seen.generation, seen.retained_bytes) == (None, None, 0)


def test_design_is_equal_after_an_exchange_that_moves_comments(server: ServerInfo) -> None:
    mark = ownership_comment("attempt-x", "f" * 64)
    columns = "id UInt64 COMMENT {c}, s String CODEC(ZSTD(3)), d Date"
    for name, comment in (("ex_t", "'owned by the business'"), ("dpone_stage_ex", f"'{mark}'")):
        sql(
            server,
            f"CREATE TABLE {DB}.{name} ({columns.format(c=comment)}) ENGINE = MergeTree "
            f"PARTITION BY toYYYYMM(d) ORDER BY (id, s) SETTINGS index_granularity = 512 "
            f"COMMENT {comment}",
        )
    before_target, before_generation = observe(server, "ex_t", "dpone_stage_ex")
    assert before_target is not None and before_generation is not None
    assert before_target.design_sha256 == before_generation.design_sha256
    sql(server, f"EXCHANGE TABLES {DB}.ex_t AND {DB}.dpone_stage_ex")
    after_target, after_generation = observe(server, "ex_t", "dpone_stage_ex")
    assert after_target is not None and after_generation is not None
    assert (after_target.uuid, after_generation.uuid) == (
        before_generation.uuid,
        before_target.uuid,
    )
    assert after_target.design == before_target.design
    assert after_target.design_sha256 == before_generation.design_sha256
    # The comments did travel: the ownership mark is on the target's first column now.
    moved = chhttp.rows(
        server.http_port,
        f"SELECT comment FROM system.columns WHERE database = '{DB}' AND table = 'ex_t' "
        "AND position = 1",
    )
    assert moved == [{"comment": mark}]
    design = after_target.design
    assert (design["partition_key"], design["sorting_key"], design["settings"]) == (
        "toYYYYMM(d)",
        "id, s",
        "index_granularity = 512",
    )
    assert design["columns"][1]["codec"] == "CODEC(ZSTD(3))"


def test_a_design_difference_changes_the_design_digest(server: ServerInfo) -> None:
    sql(server, f"CREATE TABLE {DB}.dd_t (id UInt64, s String) ENGINE = MergeTree ORDER BY id")
    sql(server, f"CREATE TABLE {DB}.dd_g (id UInt64, s String) ENGINE = MergeTree ORDER BY s")
    target, generation = observe(server, "dd_t", "dd_g")
    assert target is not None and generation is not None
    assert target.design_sha256 != generation.design_sha256
    assert (target.design["sorting_key"], generation.design["sorting_key"]) == ("id", "s")


# ---------------------------------------------------------------------- content digest


HOSTILE_COLUMNS = (
    "id UInt32, f Float64, nf Nullable(Float32), s Nullable(String), "
    "dt DateTime64(9, 'UTC'), dec Decimal(38, 10), "
    "dto Nullable(Tuple(utc DateTime64(3, 'UTC'), offset_minutes Int16)), "
    "lc LowCardinality(Nullable(String)), u UUID, b Bool, fs FixedString(3)"
)


def hostile_row(i: int, f: float, nf: float | None, s: bytes | None, ticks: int) -> bytes:
    dto = b"\x01" if i % 2 else b"\x00" + struct.pack("<qh", ticks // 10**6, -840 + i)
    return b"".join(
        [
            struct.pack("<I", i),
            struct.pack("<d", f),
            b"\x01" if nf is None else b"\x00" + struct.pack("<f", nf),
            b"\x01" if s is None else b"\x00" + varstr(s),
            struct.pack("<q", ticks),
            (-(10**37) + i).to_bytes(16, "little", signed=True),
            dto,
            b"\x01" if s is None else b"\x00" + varstr(s[:5]),
            struct.pack("<QQ", 0x6F9619FF8B86D011, 0xB42D00C04FC964FF - i),
            bytes([i % 2]),
            bytes([i % 256, 0, 255]),
        ]
    )


def test_content_digest_equals_python_on_hostile_values(server: ServerInfo) -> None:
    values = [
        (math.nan, math.nan, b"\x00\x01\xff"),
        (-0.0, -0.0, b""),
        (math.inf, None, None),
        (-math.inf, 0.0, "👩\u200d👩\u200d👧 \t\n\\N".encode()),
        (5e-324, 3.4028234663852886e38, b"NULL"),
        (1.5, -1.0, b"x" * 70000),
    ]
    ticks = [-(2**62), -1, 0, 1, 2**62, 1_700_000_000_123_456_789]
    rows = [
        hostile_row(i, f, nf, s, t)
        for i, ((f, nf, s), t) in enumerate(zip(values * 3, ticks * 3, strict=True))
    ]
    rows.append(rows[0])  # a duplicate row counts twice
    sql(
        server,
        f"CREATE TABLE {DB}.hostile_t ({HOSTILE_COLUMNS}) ENGINE = MergeTree ORDER BY (fs, id)",
    )
    sql(
        server,
        f"CREATE TABLE {DB}.hostile_g ({HOSTILE_COLUMNS}) ENGINE = MergeTree ORDER BY tuple()",
    )
    # Two inserts in different orders: two parts, rows kept in different physical orders.
    sql(server, f"INSERT INTO {DB}.hostile_t FORMAT RowBinary", b"".join(rows[:7]))
    sql(server, f"INSERT INTO {DB}.hostile_t FORMAT RowBinary", b"".join(rows[7:]))
    sql(server, f"INSERT INTO {DB}.hostile_g FORMAT RowBinary", b"".join(reversed(rows)))
    target, generation = observe(server, "hostile_t", "hostile_g")
    assert target is not None and generation is not None
    assert target.rows == generation.rows == len(rows) and target.parts == 2
    assert target.content_digest == generation.content_digest == rows_digest(rows)
    assert target.content_digest == format(
        sum(int.from_bytes(hashlib.sha256(r).digest()[:16], "little") for r in rows) % 2**128,
        "032x",
    )
    assert rows_digest(rows[:-1]) != target.content_digest


def test_content_digest_keeps_leading_zero_digits(server: ServerInfo) -> None:
    # A row whose digest's most significant byte is 0: hex() alone would drop it.
    i = next(i for i in range(100_000) if hashlib.sha256(struct.pack("<I", i)).digest()[15] == 0)
    expected = rows_digest([struct.pack("<I", i)])
    assert expected.startswith("00")
    sql(server, f"CREATE TABLE {DB}.zero_t (id UInt32) ENGINE = MergeTree ORDER BY id")
    sql(server, f"CREATE TABLE {DB}.zero_g (id UInt32) ENGINE = MergeTree ORDER BY id")
    sql(server, f"INSERT INTO {DB}.zero_g VALUES ({i})")
    target, generation = observe(server, "zero_t", "zero_g")
    assert target is not None and generation is not None
    assert generation.content_digest == expected and len(expected) == 32
    assert target.content_digest == "0" * 32 and target.total_bytes == 0


# ---------------------------------------------------------------------- bytes, retained


def test_a_missing_byte_counter_is_an_error_never_zero(server: ServerInfo) -> None:
    sql(server, f"CREATE TABLE {DB}.nb_t (id UInt64) ENGINE = MergeTree ORDER BY id")
    sql(server, f"CREATE VIEW {DB}.nb_g AS SELECT toUInt64(1) AS id")
    null = chhttp.rows(
        server.http_port,
        f"SELECT isNull(total_bytes) AS n FROM system.tables WHERE database = '{DB}' "
        "AND name = 'nb_g'",
    )
    assert null == [{"n": 1}]
    with pytest.raises(ByteObservationMissing) as caught:
        observe(server, "nb_t", "nb_g")
    assert caught.value.code == "byte_observation_missing"
    assert caught.value.details["table"] == "nb_g"
    assert isinstance(caught.value, CatalogUnobservable)


def test_retained_bytes_count_the_target_and_dpone_owned_generations(server: ServerInfo) -> None:
    db = "dpone_cat_retained"
    sql(server, f"CREATE DATABASE {db} ENGINE = Atomic")
    try:
        mark = ownership_comment("old", "0" * 64)
        for name, comment in (
            ("target_t", "x"),
            ("dpone_stage_old", mark),
            ("dpone_stage_foreign", "x"),
            ("dpone_stage_new", mark),
            ("other", mark),
        ):
            sql(
                server,
                f"CREATE TABLE {db}.{name} (id UInt64 COMMENT '{comment}') "
                "ENGINE = MergeTree ORDER BY id",
            )
            sql(server, f"INSERT INTO {db}.{name} SELECT number FROM numbers(1000)")
        sizes = {
            r["name"]: r["total_bytes"]
            for r in chhttp.rows(
                server.http_port,
                f"SELECT name, total_bytes FROM system.tables WHERE database = '{db}'",
            )
        }
        seen = catalog(server).observe(TargetSlot(db, "target_t"), "dpone_stage_new")
        assert all(v > 0 for v in sizes.values())
        assert seen.retained_bytes == sizes["target_t"] + sizes["dpone_stage_old"]
        assert seen.generation is not None
        assert seen.generation.total_bytes == sizes["dpone_stage_new"]
    finally:
        sql(server, f"DROP DATABASE {db} SYNC")


def test_the_retained_naming_is_stagings() -> None:
    assert staging_table_name("attempt-1").startswith(STAGE_PREFIX)
    assert ownership_comment("attempt-1", "a" * 64).startswith(OWNERSHIP_MARK)


# ---------------------------------------------------------------------- blockers


def test_incoming_materialized_view(server: ServerInfo) -> None:
    pair(server, DB, "in_t", "in_g")
    sql(server, f"CREATE TABLE {DB}.in_src (id UInt64, s String) ENGINE = MergeTree ORDER BY id")
    sql(
        server, f"CREATE MATERIALIZED VIEW {DB}.in_mv TO {DB}.in_t AS SELECT id, s FROM {DB}.in_src"
    )
    target, generation = observe(server, "in_t", "in_g")
    assert reasons(target) == ["incoming_mv"] and reasons(generation) == []
    assert target is not None and "in_mv" in target.blockers[0].detail


def test_outgoing_materialized_view(server: ServerInfo) -> None:
    pair(server, DB, "out_t", "out_g")
    sql(server, f"CREATE TABLE {DB}.out_sink (id UInt64) ENGINE = MergeTree ORDER BY id")
    sql(
        server,
        f"CREATE MATERIALIZED VIEW {DB}.out_mv TO {DB}.out_sink AS SELECT id FROM {DB}.out_g",
    )
    target, generation = observe(server, "out_t", "out_g")
    assert reasons(target) == [] and reasons(generation) == ["outgoing_mv"]


def test_refreshable_materialized_view(server: ServerInfo) -> None:
    pair(server, DB, "rmv_t", "rmv_g")
    sql(server, f"CREATE TABLE {DB}.rmv_src (id UInt64, s String) ENGINE = MergeTree ORDER BY id")
    sql(
        server,
        # EMPTY: no refresh at creation, so none replaces the target during the observation.
        f"CREATE MATERIALIZED VIEW {DB}.rmv REFRESH EVERY 1 HOUR TO {DB}.rmv_t EMPTY "
        f"AS SELECT id, s FROM {DB}.rmv_src",
    )
    target, generation = observe(server, "rmv_t", "rmv_g")
    assert reasons(target) == ["refreshable_mv"] and reasons(generation) == []


def test_dictionary_sourced_from_a_table(server: ServerInfo) -> None:
    pair(server, DB, "dict_t", "dict_g")
    sql(
        server,
        f"CREATE DICTIONARY {DB}.dict_d (id UInt64, s String) PRIMARY KEY id "
        f"SOURCE(CLICKHOUSE(DB '{DB}' TABLE 'dict_t')) LAYOUT(FLAT()) LIFETIME(0)",
    )
    target, generation = observe(server, "dict_t", "dict_g")
    assert reasons(target) == ["dictionary"] and reasons(generation) == []


@pytest.mark.parametrize(
    ("columns", "tail"),
    [
        ("id UInt64, d DateTime", "TTL d + INTERVAL 1 YEAR"),
        ("id UInt64, d DateTime TTL d + INTERVAL 1 DAY", ""),
    ],
    ids=["table", "column"],
)
def test_ttl(server: ServerInfo, columns: str, tail: str) -> None:
    name = f"ttl_{uuid.uuid4().hex[:8]}"
    sql(server, f"CREATE TABLE {DB}.{name} ({columns}) ENGINE = MergeTree ORDER BY id {tail}")
    sql(
        server, f"CREATE TABLE {DB}.{name}_g (id UInt64, d DateTime) ENGINE = MergeTree ORDER BY id"
    )
    target, generation = observe(server, name, f"{name}_g")
    assert reasons(target) == ["ttl"] and reasons(generation) == []
    assert target is not None and "1" in target.blockers[0].detail


def test_a_comment_mentioning_ttl_is_not_a_ttl(server: ServerInfo) -> None:
    pair(server, DB, "cttl_t", "cttl_g", "id UInt64 COMMENT 'TTL d + 1', s String")
    target, _ = observe(server, "cttl_t", "cttl_g")
    assert reasons(target) == []


def test_projection(server: ServerInfo) -> None:
    pair(server, DB, "proj_t", "proj_g")
    sql(server, f"ALTER TABLE {DB}.proj_t ADD PROJECTION p (SELECT s, count() GROUP BY s)")
    target, generation = observe(server, "proj_t", "proj_g")
    assert reasons(target) == ["projection"] and reasons(generation) == []
    assert target is not None and generation is not None
    assert [p["name"] for p in target.design["projections"]] == ["p"]
    assert target.design_sha256 != generation.design_sha256


@pytest.mark.parametrize(
    "kind", ["DEFAULT 'x'", "MATERIALIZED toString(id)", "ALIAS toString(id)", "EPHEMERAL"]
)
def test_computed_column(server: ServerInfo, kind: str) -> None:
    name = f"cc_{uuid.uuid4().hex[:8]}"
    pair(server, DB, name, f"{name}_g", f"id UInt64, c String {kind}")
    target, generation = observe(server, name, f"{name}_g")
    assert reasons(target) == reasons(generation) == ["computed_column"]
    assert target is not None and kind.split()[0] in target.blockers[0].detail


def test_skipping_indices_and_constraints_are_design_not_blockers(server: ServerInfo) -> None:
    pair(server, DB, "ix_t", "ix_g")
    sql(server, f"ALTER TABLE {DB}.ix_t ADD INDEX ix s TYPE bloom_filter GRANULARITY 1")
    sql(server, f"ALTER TABLE {DB}.ix_t ADD CONSTRAINT positive CHECK id >= 0")
    target, generation = observe(server, "ix_t", "ix_g")
    assert target is not None and generation is not None
    assert reasons(target) == [] and target.design_sha256 != generation.design_sha256
    assert [i["name"] for i in target.design["skipping_indices"]] == ["ix"]
    assert [c["name"] for c in target.design["constraints"]] == ["positive"]


def test_mutation_in_flight(server: ServerInfo) -> None:
    pair(server, DB, "mut_t", "mut_g")
    sql(server, f"INSERT INTO {DB}.mut_t SELECT number, 'v' FROM numbers(10)")
    # A mutation that fails on every attempt stays in flight until it is killed.
    sql(
        server,
        f"ALTER TABLE {DB}.mut_t UPDATE s = toString(throwIf(id >= 0, 'held on purpose')) "
        "WHERE 1 SETTINGS mutations_sync = 0",
    )
    try:
        target, generation = observe(server, "mut_t", "mut_g")
        assert reasons(target) == ["mutation_in_flight"] and reasons(generation) == []
    finally:
        sql(server, f"KILL MUTATION WHERE database = '{DB}' AND table = 'mut_t' SYNC")
    target, _ = observe(server, "mut_t", "mut_g")
    assert reasons(target) == []


@pytest.mark.parametrize(
    ("db", "generation", "grant", "blocked"),
    [
        ("dpone_cat_dbwide", "gen_t", "INSERT ON dpone_cat_dbwide.*", (True, True)),
        ("dpone_cat_table", "gen_t", "ALTER UPDATE ON dpone_cat_table.target_t", (True, False)),
        ("dpone_cat_prefix", "gen_1", "INSERT ON dpone_cat_prefix.gen_*", (False, True)),
        ("dpone_cat_dbprefix", "gen_t", "TRUNCATE ON dpone_cat_dbpre*.*", (True, True)),
    ],
    ids=["database", "table", "table-prefix", "database-prefix"],
)
def test_writer_grant(
    server: ServerInfo, db: str, generation: str, grant: str, blocked: tuple[bool, bool]
) -> None:
    sql(server, f"CREATE DATABASE {db} ENGINE = Atomic")
    try:
        pair(server, db, "target_t", generation)
        seen = catalog(server).observe(TargetSlot(db, "target_t"), generation)
        assert seen.target is not None and seen.generation is not None
        assert [reasons(seen.target), reasons(seen.generation)] == [
            ["writer_grant"] if b else [] for b in blocked
        ]
        for table in (seen.target, seen.generation):
            for blocker in table.blockers:
                assert blocker.detail == (f"user cat_writer can write {db}.{table.name}: {grant}")
        trusted = catalog(server, trusted=TRUSTED | {"cat_writer"}).observe(
            TargetSlot(db, "target_t"), generation
        )
        assert reasons(trusted.target) == reasons(trusted.generation) == []
    finally:
        sql(server, f"DROP DATABASE {db} SYNC")


def test_writer_grants_through_roles_and_what_is_not_a_writer() -> None:
    writers = frozenset({"ALL", "INSERT", "ALTER", "ALTER TABLE", "ALTER UPDATE", "TRUNCATE"})
    grants = [
        GrantRow(None, "loader", "INSERT", "db", "t", False, False),
        GrantRow(None, "reader", "SELECT", None, None, False, False),
        GrantRow("auditor", None, "SELECT", "db", None, False, False),
        GrantRow("pool_1", None, "ALL", None, None, False, False),
        GrantRow("other", None, "INSERT", "db", "t2", False, False),
        GrantRow("revoked", None, "INSERT", "db", "t", True, False),
    ]
    role_grants: list[tuple[str | None, str | None, str]] = [
        ("alice", None, "etl"),
        (None, "etl", "loader"),
        ("bob", None, "reader"),
        ("pool_1", None, "loader"),
    ]
    found = writer_grant_blockers(grants, role_grants, writers, frozenset({"pool_1"}), "db", "t")
    assert found == [
        Blocker("writer_grant", "user alice can write db.t: INSERT ON db.t through role loader")
    ]


def test_not_atomic_and_non_mergetree(server: ServerInfo) -> None:
    name = f"cat_na_{uuid.uuid4().hex[:8]}"
    sql(server, f"CREATE TABLE default.{name} (id UInt64) ENGINE = MergeTree ORDER BY id")
    sql(
        server, f"CREATE TABLE default.{name}_g (id UInt64) ENGINE = ReplacingMergeTree ORDER BY id"
    )
    try:
        target, generation = observe(server, name, f"{name}_g", db="default")
        assert reasons(target) == ["not_atomic"]
        assert reasons(generation) == ["non_mergetree", "not_atomic"]
    finally:
        sql(server, f"DROP TABLE default.{name}")
        sql(server, f"DROP TABLE default.{name}_g")


# ---------------------------------------------------------------------- row policy, *.*


@pytest.fixture(scope="module")
def policy_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerInfo]:
    """A server of its own: row policies come only from users.d, and a global writer."""
    policy = (
        "<clickhouse><users><limited><databases><dpone_cat_rp><target_t>"
        "<filter>id &gt; 1</filter></target_t></dpone_cat_rp></databases></limited>"
        "</users></clickhouse>"
    )
    observer = next(u for u in SESSION_USERS if u.name == "cat_observer")
    users = [
        observer,
        ServerUser("limited", password="l", grants=("GRANT SELECT ON dpone_cat_rp.*",)),
        ServerUser("everywhere", password="e", grants=("GRANT INSERT ON *.*",)),
    ]
    data = tmp_path_factory.mktemp("catalog-server")
    with own_server(data, users, {"users.d/policy.xml": policy}) as info:
        chhttp.query(info.http_port, "CREATE DATABASE dpone_cat_rp ENGINE = Atomic")
        pair(info, "dpone_cat_rp", "target_t", "gen_t")
        yield info


def test_row_policy_and_a_global_writer(policy_server: ServerInfo) -> None:
    trusted = frozenset({ADMIN_USER, "cat_observer", "limited"})
    seen = catalog(policy_server, trusted=trusted).observe(
        TargetSlot("dpone_cat_rp", "target_t"), "gen_t"
    )
    assert reasons(seen.target) == ["row_policy", "writer_grant"]
    assert reasons(seen.generation) == ["writer_grant"]
    assert seen.target is not None and seen.generation is not None
    assert {b.detail for b in seen.generation.blockers} == {
        "user everywhere can write dpone_cat_rp.gen_t: INSERT ON *.*"
    }
    everyone = catalog(policy_server, trusted=trusted | {"everywhere"}).observe(
        TargetSlot("dpone_cat_rp", "target_t"), "gen_t"
    )
    assert reasons(everyone.target) == ["row_policy"] and reasons(everyone.generation) == []


# ---------------------------------------------------------------------- log, failures


def test_exchange_events_after_a_log_flush(
    server: ServerInfo, admin_credentials: Credentials
) -> None:
    pair(server, DB, "xe_t", "xe_g")
    admin = HttpTransport(
        Endpoint("127.0.0.1", server.http_port, server.tcp_port, "default"), admin_credentials
    )
    done = f"dpone-test-exchange-{uuid.uuid4().hex}"
    admin.execute(
        mutation(f"EXCHANGE TABLES {DB}.xe_t AND {DB}.xe_g", done), deadline=time.monotonic() + 60
    )
    refused = f"dpone-test-exchange-{uuid.uuid4().hex}"
    with pytest.raises(ClickHouseServerError):
        admin.execute(
            mutation(f"EXCHANGE TABLES {DB}.xe_t AND {DB}.absent", refused),
            deadline=time.monotonic() + 60,
        )
    events = catalog(server).exchange_events(done)
    assert [(e.type, e.exception_code, e.user) for e in events] == [
        ("QueryStart", 0, ADMIN_USER),
        ("QueryFinish", 0, ADMIN_USER),
    ]
    assert events[0].event_time <= events[1].event_time
    failed = catalog(server).exchange_events(refused)
    assert [(e.type, e.exception_code) for e in failed] == [("ExceptionBeforeStart", 60)]
    assert catalog(server).exchange_events(f"dpone-test-never-{uuid.uuid4().hex}") == []


def test_exchange_events_without_the_flush_grant_are_unobservable(server: ServerInfo) -> None:
    with pytest.raises(CatalogUnobservable) as caught:
        catalog(server, user="cat_writer").exchange_events("dpone-test-anything")
    assert caught.value.code == "catalog_unobservable"
    assert caught.value.details["purpose"] == "flush"
    assert str(caught.value.details["query_id"]).startswith("dpone-s00-catalog-")


def test_a_wrong_password_is_unobservable(server: ServerInfo) -> None:
    pair(server, DB, "pw_t", "pw_g")
    wrong = catalog(server, password="not-the-password")
    with pytest.raises(CatalogUnobservable) as caught:
        wrong.observe(TargetSlot(DB, "pw_t"), "pw_g")
    assert caught.value.code == "catalog_unobservable"
    assert caught.value.details["clickhouse_code"] == 516
    assert "not-the-password" not in str(caught.value)
    with pytest.raises(CatalogUnobservable):
        wrong.exchange_events("dpone-test-anything")


def test_every_catalog_query_has_its_own_catalog_id(server: ServerInfo) -> None:
    pair(server, DB, "qid_t", "qid_g")
    catalog(server).observe(TargetSlot(DB, "qid_t"), "qid_g")
    sql(server, "SYSTEM FLUSH LOGS")
    ids = chhttp.rows(
        server.http_port,
        "SELECT query_id, count() AS n FROM system.query_log WHERE user = 'cat_observer' "
        "AND type = 'QueryStart' GROUP BY query_id",
    )
    assert ids and all(r["n"] == 1 for r in ids)
    assert all(str(r["query_id"]).startswith("dpone-s00-catalog-") for r in ids)
