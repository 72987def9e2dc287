"""Shared fixtures: one managed local ClickHouse server per test session."""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from dpone.localserver import LocalServer, ServerInfo, ServerUser, admin_credentials
from dpone.localserver.principal_pool import pool_names, pool_users
from dpone.ports.clickhouse_request import Credentials
from tests import chhttp
from tests.postgres_cluster import PostgresCluster, postgres_cluster

# Property tests draw the same examples on every run, so a green suite stays green on
# the same code (a run that loses a submission must not depend on luck). To search
# afresh, run with DPONE_HYPOTHESIS=explore (random examples each run).
settings.register_profile("reproducible", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("DPONE_HYPOTHESIS", "reproducible"))

# The suite interrupts real dpone processes with SIGINT. A shell that starts it in the
# background without job control (``cmd &`` in a script) hands it SIGINT ignored, and
# an ignored signal is inherited across exec: every child would ignore the tests'
# SIGINT too. A handler is not inherited (exec resets it to the default), so one set
# here gives each child the default disposition again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

READER_PASSWORD = "reader-secret-Δ-42"
TEST_DATABASE = "dpone_test"
CATALOG_PASSWORD = "catalog-secret-7"
# A user who may stage into one database and nothing else; its password is searched for
# in every file a stage writes.
STAGER_PASSWORD = "stager-Pw-9f3c1e-secret"
STAGING_DATABASE = "staging_db"
# The publication principal pool, protecting these databases (explicit test passwords).
POOL_DATABASE = "dpone_pool"
POOL_PASSWORDS = {name: f"pool-{name}-secret" for name in pool_names()}

# dpone itself declares the engine's powerless `default` and the administrator.
SESSION_USERS = (
    ServerUser(
        "reader",
        password=READER_PASSWORD,
        grants=(f"GRANT SELECT ON {TEST_DATABASE}.*",),
    ),
    ServerUser("nobody", password="nobody-secret", grants=()),
    # The snapshot catalog's tests: a read-only observer and a writer on their databases.
    ServerUser(
        "cat_observer",
        password=CATALOG_PASSWORD,
        grants=(
            "GRANT SELECT ON *.*",
            "GRANT SYSTEM FLUSH LOGS ON *.*",
            "GRANT SHOW USERS, SHOW ROLES, SHOW ROW POLICIES ON *.*",
        ),
    ),
    ServerUser(
        "cat_writer",
        password=CATALOG_PASSWORD,
        grants=(
            "GRANT SELECT ON system.*",
            "GRANT INSERT ON dpone_cat_dbwide.*",
            "GRANT ALTER UPDATE ON dpone_cat_table.target_t",
            "GRANT INSERT ON dpone_cat_prefix.gen_*",
            "GRANT TRUNCATE ON dpone_cat_dbpre*.*",
        ),
    ),
    ServerUser(
        "stager",
        password=STAGER_PASSWORD,
        grants=(
            f"GRANT SELECT, INSERT, CREATE TABLE, DROP TABLE ON {STAGING_DATABASE}.*",
            "GRANT SHOW DATABASES ON _dpone_identity.*",
            "GRANT TABLE ENGINE ON MergeTree",
        ),
    ),
    *pool_users(POOL_PASSWORDS, (TEST_DATABASE, POOL_DATABASE)),
)


@pytest.fixture(autouse=True)
def _servers_handed_over() -> Iterator[None]:
    """After each test, its project is gone: the servers it used are handed over
    (chhttp.hand_over_servers), so the next test's store may own their pools."""
    yield
    chhttp.hand_over_servers()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresCluster]:
    """The session's throwaway PostgreSQL cluster (tests/postgres_cluster.py); its
    password file is the process's ``PGPASSFILE`` while it runs, as libpq reads it."""
    with postgres_cluster() as cluster:
        before = os.environ.get("PGPASSFILE")
        os.environ.update(cluster.env())
        try:
            yield cluster
        finally:
            if before is None:
                os.environ.pop("PGPASSFILE", None)
            else:
                os.environ["PGPASSFILE"] = before


@pytest.fixture
def postgres_store(postgres: PostgresCluster) -> str:
    """The URL of an empty PostgreSQL store (the previous test's schema dropped)."""
    import psycopg

    with psycopg.connect(postgres.url, autocommit=True) as conn:
        conn.execute("DROP SCHEMA IF EXISTS dpone CASCADE")
    return postgres.url


@pytest.fixture(scope="session")
def session_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("clickhouse")


@pytest.fixture(scope="session")
def clickhouse(session_data_dir: Path) -> Iterator[ServerInfo]:
    """The session's managed local ClickHouse server."""
    server = LocalServer(session_data_dir, users=SESSION_USERS)
    info = server.start()
    chhttp.register_server(info.http_port, session_data_dir)
    try:
        yield info
    finally:
        server.stop()


@pytest.fixture(scope="session", name="admin_credentials")
def admin_credentials_fixture(clickhouse: ServerInfo) -> Credentials:
    """The managed server's administrator ``dpone_admin`` (generated password, from its file)."""
    return admin_credentials(clickhouse.data_dir)


@pytest.fixture(scope="session")
def pool_credentials(clickhouse: ServerInfo) -> dict[str, Credentials]:
    """Credentials of every pool user declared on the session's server."""
    return {name: Credentials(name, password) for name, password in POOL_PASSWORDS.items()}


@pytest.fixture(scope="session")
def clickhouse_client() -> str:
    """Path of Debian's ``clickhouse-client``; skips when absent unless required."""
    path = shutil.which("clickhouse-client")
    if path is None:
        if os.environ.get("DPONE_REQUIRE_CLICKHOUSE_CLIENT") == "1":
            pytest.fail("clickhouse-client is required (DPONE_REQUIRE_CLICKHOUSE_CLIENT=1)")
        pytest.skip("clickhouse-client is not installed (apt-get install clickhouse-client)")
    return path


@pytest.fixture(params=["http", "client"])
def transport_kind(request: pytest.FixtureRequest) -> str:
    """Each controlled transport in turn; the client needs its binary (see above)."""
    if request.param == "client":
        request.getfixturevalue("clickhouse_client")
    return str(request.param)
