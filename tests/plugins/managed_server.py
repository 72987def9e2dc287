"""The session's managed local ClickHouse server: its users, their passwords, its fixtures."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from dpone.localserver import LocalServer, ServerInfo, ServerUser, admin_credentials
from dpone.localserver.principal_pool import pool_names, pool_users
from dpone.ports.clickhouse_request import Credentials
from tests import chhttp

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
