"""The principal pool on the managed server: every grant is accepted at start, and each
user can do exactly its job. Also the issuers: pool leases and the SQL RBAC rendering."""

from __future__ import annotations

import hashlib
import time
import uuid

import pytest

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.errors import ConfigurationError, StateError
from dpone.localserver import ServerInfo
from dpone.localserver.principal_pool import (
    CATALOG_USER,
    CLOSER_USER,
    ROLE_INGEST,
    ROLE_PUBLISHER,
    Grant,
    ingest_users,
    pool_names,
    pool_users,
    publisher_users,
    role_grants,
    role_of,
)
from dpone.ports.clickhouse_request import ClickHouseRequest, Credentials, Endpoint
from dpone.ports.clickhouse_result import QueryResult
from dpone.ports.composition_snapshot import ClosureStrength, PrincipalRef
from dpone.publication.principals.principal_issuers import (
    LocalPoolIssuer,
    PrincipalError,
    SqlRbacIssuer,
    observe_user_ids,
    render_create_user,
    render_drop_user,
    render_grant,
)
from tests import chhttp
from tests.fakes.registry import MemoryRunRegistry
from tests.plugins.managed_server import POOL_DATABASE, POOL_PASSWORDS, TEST_DATABASE
from tests.plugins.publication_pool import SLOW_TABLE, RunningQuery

INGEST = ingest_users()[0]
PUBLISHER = publisher_users()[0]
OTHER_DB = "dpone_unprotected"


def as_user(port: int, sql: str, user: str) -> chhttp.Answer:
    return chhttp.post(port, sql, user=user, password=POOL_PASSWORDS[user])


def refused(answer: chhttp.Answer) -> bool:
    return answer.status != 200 and answer.exception_code == "497"


def uuids(port: int, db: str, *names: str) -> dict[str, str]:
    listed = ", ".join(f"'{n}'" for n in names)
    return {
        r["name"]: r["uuid"]
        for r in chhttp.rows(
            port,
            f"SELECT name, toString(uuid) AS uuid FROM system.tables "
            f"WHERE database = '{db}' AND name IN ({listed})",
        )
    }


@pytest.fixture(scope="module")
def port(clickhouse: ServerInfo) -> int:
    for db in (POOL_DATABASE, TEST_DATABASE, OTHER_DB):
        chhttp.query(clickhouse.http_port, f"CREATE DATABASE IF NOT EXISTS {db} ENGINE = Atomic")
    return clickhouse.http_port


@pytest.fixture
def names() -> tuple[str, str]:
    token = uuid.uuid4().hex[:10]
    return f"dpone_stage_t{token}", f"target_{token}"


# ---------------------------------------------------------------------- declaration


def test_pool_is_declared_with_every_grant(port: int) -> None:
    users = {r["name"] for r in chhttp.rows(port, "SELECT name FROM system.users")}
    assert set(pool_names()) <= users
    grants = chhttp.rows(
        port,
        "SELECT user_name, access_type, database, table FROM system.grants "
        f"WHERE user_name = '{PUBLISHER}' ORDER BY access_type, database",
    )
    shown = {(g["access_type"], g["database"], g["table"]) for g in grants}
    for db in (TEST_DATABASE, POOL_DATABASE):
        assert {("SELECT", db, None), ("INSERT", db, None), ("DROP TABLE", db, None)} <= shown
    assert not any(g["database"] == OTHER_DB for g in grants)


def test_pool_users_validate_their_inputs() -> None:
    with pytest.raises(ConfigurationError) as missing:
        pool_users({CATALOG_USER: "x"}, ["db"])
    assert missing.value.code == "pool_passwords"
    with pytest.raises(ConfigurationError) as bad:
        pool_users(POOL_PASSWORDS, ["bad-name"])
    assert bad.value.code == "invalid_database"
    with pytest.raises(ConfigurationError) as system:
        pool_users(POOL_PASSWORDS, ["system"])
    assert system.value.code == "invalid_database"
    assert role_of("dpone_ingest_3") == ROLE_INGEST
    assert role_of("dpone_publisher_12") == ROLE_PUBLISHER
    assert role_of("dpone_ingest_x") is None and role_of("default") is None
    assert [g.statement() for g in role_grants(ROLE_PUBLISHER, ["a"])] == [
        "GRANT SELECT, INSERT, CREATE TABLE, DROP TABLE ON `a`.*",
        "GRANT TABLE ENGINE ON MergeTree",
    ]


# ---------------------------------------------------------------------- what each user can do


def test_ingest_works_on_staging_tables_only(port: int, names: tuple[str, str]) -> None:
    stage, other = names
    for db in (POOL_DATABASE, TEST_DATABASE):
        ok = [
            f"CREATE TABLE {db}.{stage} (a Int32) ENGINE = MergeTree ORDER BY a",
            f"INSERT INTO {db}.{stage} VALUES (1), (2)",
        ]
        for sql in ok:
            answer = as_user(port, sql, INGEST)
            assert answer.status == 200, answer.text
        assert as_user(port, f"SELECT count() FROM {db}.{stage}", INGEST).text == "2\n"
        assert as_user(port, f"DROP TABLE {db}.{stage}", INGEST).status == 200
    chhttp.query(
        port, f"CREATE TABLE {POOL_DATABASE}.{other} (a Int32) ENGINE = MergeTree ORDER BY a"
    )
    chhttp.query(port, f"CREATE TABLE {OTHER_DB}.{stage} (a Int32) ENGINE = MergeTree ORDER BY a")
    for sql in (
        f"CREATE TABLE {POOL_DATABASE}.x{other} (a Int32) ENGINE = MergeTree ORDER BY a",
        f"INSERT INTO {POOL_DATABASE}.{other} VALUES (1)",
        f"SELECT * FROM {POOL_DATABASE}.{other}",
        f"DROP TABLE {POOL_DATABASE}.{other}",
        f"INSERT INTO {OTHER_DB}.{stage} VALUES (1)",
        f"DROP TABLE {OTHER_DB}.{stage}",
        f"EXCHANGE TABLES {POOL_DATABASE}.{other} AND {POOL_DATABASE}.{stage}",
    ):
        assert refused(as_user(port, sql, INGEST)), sql
    assert chhttp.query(port, f"SELECT count() FROM {POOL_DATABASE}.{other}") == "0\n"
    assert as_user(port, "SYSTEM FLUSH LOGS", INGEST).status == 200


def test_publisher_exchanges_in_protected_databases_only(port: int, names: tuple[str, str]) -> None:
    stage, target = names
    for db in (POOL_DATABASE, OTHER_DB):
        for name in (stage, target):
            chhttp.query(port, f"CREATE TABLE {db}.{name} (a Int32) ENGINE = MergeTree ORDER BY a")
    before = uuids(port, POOL_DATABASE, stage, target)
    answer = as_user(
        port, f"EXCHANGE TABLES {POOL_DATABASE}.{target} AND {POOL_DATABASE}.{stage}", PUBLISHER
    )
    assert answer.status == 200, answer.text
    after = uuids(port, POOL_DATABASE, stage, target)
    assert after == {stage: before[target], target: before[stage]}
    elsewhere = uuids(port, OTHER_DB, stage, target)
    assert refused(
        as_user(port, f"EXCHANGE TABLES {OTHER_DB}.{target} AND {OTHER_DB}.{stage}", PUBLISHER)
    )
    assert uuids(port, OTHER_DB, stage, target) == elsewhere
    assert refused(as_user(port, "SELECT count() FROM system.processes", PUBLISHER))
    assert refused(as_user(port, f"KILL QUERY WHERE user = '{INGEST}' SYNC", PUBLISHER))


def test_closer_kills_any_users_queries_and_reads_the_logs(port: int) -> None:
    query_id = f"pool-slow-{uuid.uuid4().hex}"
    with RunningQuery(port, INGEST, POOL_PASSWORDS[INGEST], query_id) as running:
        seen = chhttp.rows(
            port,
            "SELECT user, query_id FROM system.processes",
            user=CLOSER_USER,
            password=POOL_PASSWORDS[CLOSER_USER],
        )
        assert {"user": INGEST, "query_id": query_id} in seen
        # Another ingest user cannot kill it: KILL QUERY of other users is the closer's.
        other = ingest_users()[1]
        answer = as_user(port, f"KILL QUERY WHERE query_id = '{query_id}' SYNC", other)
        assert refused(answer) and "attempts to kill query created by" in answer.text
        killed = as_user(
            port, f"KILL QUERY WHERE user = '{INGEST}' SYNC FORMAT JSONEachRow", CLOSER_USER
        )
        assert killed.status == 200 and query_id in killed.text and "finished" in killed.text
        running.thread.join(timeout=60)
        assert running.answer is not None and running.answer.exception_code == "394"
    assert as_user(port, "SYSTEM FLUSH LOGS", CLOSER_USER).status == 200
    logged = chhttp.rows(
        port,
        f"SELECT toString(type) AS type FROM system.query_log WHERE query_id = '{query_id}'",
        user=CLOSER_USER,
        password=POOL_PASSWORDS[CLOSER_USER],
    )
    assert {r["type"] for r in logged} == {"QueryStart", "ExceptionWhileProcessing"}
    assert refused(as_user(port, f"SELECT count() FROM {SLOW_TABLE}", CLOSER_USER))


def test_catalog_reads_system_tables_and_protected_databases(
    port: int, names: tuple[str, str]
) -> None:
    _, table = names
    chhttp.query(
        port, f"CREATE TABLE {POOL_DATABASE}.{table} (a Int32) ENGINE = MergeTree ORDER BY a"
    )
    chhttp.query(port, f"INSERT INTO {POOL_DATABASE}.{table} VALUES (7)")
    password = POOL_PASSWORDS[CATALOG_USER]
    for sql in (
        "SELECT count() AS n FROM system.grants",
        "SELECT count() AS n FROM system.row_policies",
        "SELECT count() AS n FROM system.users",
        "SELECT count() AS n FROM system.tables",
        f"SELECT count() AS n FROM {POOL_DATABASE}.{table}",
    ):
        rows = chhttp.rows(port, sql, user=CATALOG_USER, password=password)
        assert len(rows) == 1 and rows[0]["n"] >= 0, sql
    assert chhttp.rows(
        port, f"SELECT a FROM {POOL_DATABASE}.{table}", user=CATALOG_USER, password=password
    ) == [{"a": 7}]
    users = chhttp.rows(port, "SELECT name FROM system.users", user=CATALOG_USER, password=password)
    assert set(pool_names()) <= {u["name"] for u in users}
    assert refused(as_user(port, f"INSERT INTO {POOL_DATABASE}.{table} VALUES (8)", CATALOG_USER))
    assert refused(as_user(port, f"DROP TABLE {POOL_DATABASE}.{table}", CATALOG_USER))


# ---------------------------------------------------------------------- the pool issuer


@pytest.fixture
def user_ids(
    port: int, clickhouse: ServerInfo, pool_credentials: dict[str, Credentials]
) -> dict[str, str]:
    endpoint = Endpoint("127.0.0.1", clickhouse.http_port, clickhouse.tcp_port, POOL_DATABASE)
    catalog = HttpTransport(endpoint, pool_credentials[CATALOG_USER])
    return observe_user_ids(
        catalog,
        list(pool_names()),
        query_id=f"ids-{uuid.uuid4().hex}",
        deadline=time.monotonic() + 30,
    )


def test_observed_ids_are_the_servers(port: int, user_ids: dict[str, str]) -> None:
    admin = {
        r["name"]: r["id"]
        for r in chhttp.rows(port, "SELECT name, toString(id) AS id FROM system.users")
    }
    assert user_ids == {name: admin[name] for name in pool_names()}


def test_pool_issuer_leases_distinct_users_until_exhausted(
    port: int, user_ids: dict[str, str], pool_credentials: dict[str, Credentials]
) -> None:
    registry = MemoryRunRegistry()
    issuer = LocalPoolIssuer(registry, pool_credentials, user_ids)
    assert issuer.strength is ClosureStrength.CUSTODIAL
    issued = [issuer.issue(ROLE_PUBLISHER, f"attempt-{i}") for i in range(4)]
    assert [p.ref.user for p in issued] == list(publisher_users())
    assert [p.ref.user_uuid for p in issued] == [user_ids[u] for u in publisher_users()]
    with pytest.raises(StateError) as exhausted:
        issuer.issue(ROLE_PUBLISHER, "attempt-5")
    assert exhausted.value.code == "pool_exhausted"
    ingest = issuer.issue(ROLE_INGEST, "attempt-0")
    assert ingest.ref.user == INGEST
    # The credentials are real: the server serves exactly that user.
    answer = chhttp.post(
        port,
        "SELECT currentUser()",
        user=ingest.credentials.user,
        password=ingest.credentials.password,
    )
    assert answer.text == f"{INGEST}\n"
    assert issuer.credentials(issued[0].ref).credentials == pool_credentials[PUBLISHER]
    issuer.revoke(issued[0].ref)
    with pytest.raises(PrincipalError) as ended:
        issuer.credentials(issued[0].ref)
    assert ended.value.code == "principal_not_active"
    again = issuer.issue(ROLE_PUBLISHER, "attempt-6")
    assert again.ref.user == PUBLISHER and again.ref.lease_id != issued[0].ref.lease_id
    forged = PrincipalRef(again.ref.user, user_ids[INGEST], again.ref.lease_id)
    with pytest.raises(PrincipalError) as mismatch:
        issuer.credentials(forged)
    assert mismatch.value.code == "principal_mismatch"
    with pytest.raises(PrincipalError) as role:
        issuer.issue("closer", "attempt-7")
    assert role.value.code == "unknown_role"


# ---------------------------------------------------------------------- SQL RBAC (rendering only)

HASH = hashlib.sha256(b"secret").hexdigest()


def test_rbac_rendering_is_exact() -> None:
    assert render_create_user("dpone_publisher_ab", HASH, ["127.0.0.1", "::1"]) == (
        f"CREATE USER `dpone_publisher_ab` IDENTIFIED WITH sha256_hash BY '{HASH}' "
        "HOST IP '127.0.0.1/32', IP '::1/128'"
    )
    assert render_grant(Grant("SELECT, INSERT", "`db`.*"), "we`ird") == (
        "GRANT SELECT, INSERT ON `db`.* TO `we\\`ird`"
    )
    assert render_drop_user("a\\b") == "DROP USER IF EXISTS `a\\\\b`"
    with pytest.raises(ConfigurationError):
        render_create_user("u", "XYZ", ["127.0.0.1"])
    with pytest.raises(ConfigurationError) as host:
        render_create_user("u", HASH, ["not an address"])
    assert host.value.code == "invalid_host"


def test_rbac_statements_parse_on_the_server_which_refuses_to_run_them(port: int) -> None:
    issuer = SqlRbacIssuer(MemoryRunRegistry(), _Recorder({}), [POOL_DATABASE])
    statements = issuer.statements(ROLE_PUBLISHER, "dpone_publisher_x1", HASH)
    statements.append(render_drop_user("dpone_publisher_x1"))
    for statement in statements:
        escaped = statement.replace("\\", "\\\\").replace("'", "\\'")
        answer = chhttp.post(port, f"SELECT formatQuery('{escaped}')")
        assert answer.status == 200, (statement, answer.text)
    # The embedded server cannot create users at runtime: this issuer is not runnable here.
    answer = chhttp.post(port, statements[0])
    assert answer.status != 200 and answer.exception_code in ("497", "514")


class _Recorder:
    """A QueryPort that records statements and answers the id query (pure policy test)."""

    name = "recorder"

    def __init__(self, ids: dict[str, str]) -> None:
        self.ids = ids
        self.sent: list[tuple[str, str]] = []

    def execute(self, request: ClickHouseRequest, *, deadline: float) -> QueryResult:
        self.sent.append((request.statement, request.query_id))
        output = b""
        if "FROM system.users" in request.statement:
            output = b"".join(
                f'{{"name":"{n}","id":"{i}"}}\n'.encode() for n, i in self.ids.items()
            )
        return QueryResult(request.query_id, output, None, None, self.name, None)


def test_rbac_issuer_leases_first_then_creates_grants_and_drops() -> None:
    registry = MemoryRunRegistry()
    recorder = _Recorder({"dpone_publisher_fixed": "11111111-2222-3333-4444-555555555555"})
    issuer = SqlRbacIssuer(
        registry,
        recorder,
        [POOL_DATABASE],
        name_factory=lambda role: f"dpone_{role}_fixed",
        password_factory=lambda: "pw",
    )
    assert issuer.strength is ClosureStrength.REVOKED
    issued = issuer.issue(ROLE_PUBLISHER, "attempt-r")
    digest = hashlib.sha256(b"pw").hexdigest()
    assert [s for s, _ in recorder.sent[:-1]] == issuer.statements(
        ROLE_PUBLISHER, "dpone_publisher_fixed", digest
    )
    assert "pw" not in " ".join(s for s, _ in recorder.sent)  # only the hash is sent
    assert issued.ref.user_uuid == "11111111-2222-3333-4444-555555555555"
    assert registry.leases_of("attempt-r")[0].user == "dpone_publisher_fixed"
    assert issuer.credentials(issued.ref).credentials.password == "pw"
    issuer.revoke(issued.ref)
    assert recorder.sent[-1][0] == "DROP USER IF EXISTS `dpone_publisher_fixed`"
    assert not registry.get_lease(issued.ref.lease_id).active
    with pytest.raises(PrincipalError):
        issuer.credentials(issued.ref)
