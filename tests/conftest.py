"""Shared fixtures: one managed local ClickHouse server per test session."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from dpone.connectors.clickhouse_request import Credentials
from dpone.localserver import LocalServer, ServerInfo, ServerUser
from dpone.localserver.principal_pool import pool_names, pool_users

READER_PASSWORD = "reader-secret-Δ-42"
TEST_DATABASE = "dpone_test"
# The publication principal pool, protecting these databases (explicit test passwords).
POOL_DATABASE = "dpone_pool"
POOL_PASSWORDS = {name: f"pool-{name}-secret" for name in pool_names()}

SESSION_USERS = (
    ServerUser("default"),
    ServerUser(
        "reader",
        password=READER_PASSWORD,
        grants=(f"GRANT SELECT ON {TEST_DATABASE}.*",),
    ),
    ServerUser("nobody", password="nobody-secret", grants=()),
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
    try:
        yield info
    finally:
        server.stop()


@pytest.fixture(scope="session")
def admin_credentials(clickhouse: ServerInfo) -> Credentials:
    """The managed server's administrator; tests never spell these out themselves."""
    return Credentials("default")


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
