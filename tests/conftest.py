"""Shared fixtures: one managed local ClickHouse server per test session."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from dpone.connectors.clickhouse_request import Credentials
from dpone.localserver import LocalServer, ServerInfo, ServerUser, admin_credentials
from tests import chhttp

READER_PASSWORD = "reader-secret-Δ-42"
TEST_DATABASE = "dpone_test"

# dpone itself declares the engine's powerless `default` and the administrator.
SESSION_USERS = (
    ServerUser(
        "reader",
        password=READER_PASSWORD,
        grants=(f"GRANT SELECT ON {TEST_DATABASE}.*",),
    ),
    ServerUser("nobody", password="nobody-secret", grants=()),
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
