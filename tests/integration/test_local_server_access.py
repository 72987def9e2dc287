"""Who may do what on the managed server: `default` opens listeners, nothing more.

The engine's own session signs in as `default` without a password, so any local
process can too. These tests prove on the real server that `default` can read,
change and reach nothing, that every other user authenticates, and that the
administrator `dpone_admin` (password from the credentials file) does the rest.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from dpone.localserver import (
    ADMIN_USER,
    ENGINE_USER,
    CredentialsMissing,
    LocalServer,
    ServerDiedDuringStart,
    ServerInfo,
    admin_credentials,
    find_running,
)
from dpone.localserver.layout import DataDirLayout
from dpone.localserver.probe import accepts_connections
from dpone.ports.clickhouse_request import Credentials
from tests import chhttp
from tests.plugins.managed_server import TEST_DATABASE

ACCESS_DENIED = "497"
AUTHENTICATION_FAILED = "516"
TABLE = f"{TEST_DATABASE}.access_secret"


@pytest.fixture(scope="module")
def secret_table(clickhouse: ServerInfo) -> str:
    port = clickhouse.http_port
    chhttp.query(port, f"CREATE DATABASE IF NOT EXISTS {TEST_DATABASE} ENGINE = Atomic")
    chhttp.query(
        port, f"CREATE TABLE IF NOT EXISTS {TABLE} (v String) ENGINE = MergeTree ORDER BY v"
    )
    chhttp.query(port, f"TRUNCATE TABLE {TABLE}")
    chhttp.query(port, f"INSERT INTO {TABLE} VALUES ('only the owner may read this')")
    return TABLE


def as_engine_user(port: int, sql: str) -> chhttp.Answer:
    """``sql`` as `default` without a password: what any local process can send."""
    return chhttp.post(port, sql, user=ENGINE_USER, password="")


@pytest.mark.parametrize(
    "sql",
    [
        f"SELECT * FROM {TABLE}",
        f"INSERT INTO {TABLE} VALUES ('forged')",
        f"CREATE TABLE {TEST_DATABASE}.planted (v Int8) ENGINE = Memory",
        "CREATE DATABASE planted ENGINE = Atomic",
        f"DROP TABLE {TABLE}",
        f"TRUNCATE TABLE {TABLE}",
        f"ALTER TABLE {TABLE} DELETE WHERE 1",
        f"RENAME TABLE {TABLE} TO {TEST_DATABASE}.moved",
        "SELECT * FROM file('/etc/hostname', 'LineAsString')",
        "INSERT INTO FUNCTION file('dpone-planted.txt', 'LineAsString') VALUES ('x')",
        "SELECT * FROM url('http://127.0.0.1:1/', 'LineAsString')",
        "SELECT * FROM remote('127.0.0.1:1', system.one)",
        "SELECT * FROM executable('id', 'TSV', 'x String')",
        "SELECT query FROM system.processes",
        "SELECT query FROM system.query_log",
        "SELECT name FROM system.users",
        "KILL QUERY WHERE 1 ASYNC",
        "SYSTEM FLUSH LOGS",
        "SYSTEM SHUTDOWN",
    ],
)
def test_default_is_refused_everything_but_listening(
    clickhouse: ServerInfo, secret_table: str, sql: str
) -> None:
    refused = as_engine_user(clickhouse.http_port, sql)
    assert refused.status == 403 and refused.exception_code == ACCESS_DENIED, refused.text
    assert f"{ENGINE_USER}: Not enough privileges" in refused.text
    # Nothing changed behind the refusal.
    port = clickhouse.http_port
    assert chhttp.query(port, f"SELECT v FROM {secret_table}") == "only the owner may read this\n"
    assert chhttp.query(port, "EXISTS DATABASE planted") == "0\n"


def test_default_sees_no_other_database_in_system_tables(
    clickhouse: ServerInfo, secret_table: str
) -> None:
    port = clickhouse.http_port
    sql = f"SELECT name FROM system.tables WHERE database = '{TEST_DATABASE}' AND name = 'access_secret'"
    assert chhttp.query(port, sql) == "access_secret\n"
    # Not an error: the engine filters the rows down to what the user may see.
    seen = as_engine_user(port, sql)
    assert seen.status == 200 and seen.text == ""
    assert as_engine_user(port, "SELECT count() FROM system.tables").text == "0\n"
    assert as_engine_user(port, "SELECT count() FROM system.databases").text == "0\n"


def test_default_is_refused_over_the_native_protocol_too(
    clickhouse: ServerInfo, clickhouse_client: str, secret_table: str
) -> None:
    done = subprocess.run(
        [
            clickhouse_client,
            "--host",
            "127.0.0.1",
            "--port",
            str(clickhouse.tcp_port),
            "--query",
            f"SELECT * FROM {secret_table}",
        ],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0 and done.stdout == b""
    assert b"Code: 497" in done.stderr and b"default: Not enough privileges" in done.stderr


@pytest.mark.parametrize(
    ("user", "password"),
    [
        (ADMIN_USER, ""),  # unauthenticated
        (ADMIN_USER, "not-the-password"),
        ("reader", ""),
        ("nobody", ""),
        ("no_such_user", ""),
    ],
)
def test_every_other_user_must_authenticate(
    clickhouse: ServerInfo, secret_table: str, user: str, password: str
) -> None:
    refused = chhttp.post(
        clickhouse.http_port, f"SELECT * FROM {secret_table}", user=user, password=password
    )
    assert refused.exception_code == AUTHENTICATION_FAILED, refused.text
    assert "only the owner" not in refused.text


def test_the_administrator_comes_from_the_credentials_file(
    clickhouse: ServerInfo,
    session_data_dir: Path,
    admin_credentials: Credentials,
    secret_table: str,
) -> None:
    document = json.loads(DataDirLayout.at(session_data_dir).credentials_file.read_text())
    stored = {entry["user"]: entry["password"] for entry in document["users"]}
    assert admin_credentials == Credentials(ADMIN_USER, stored[ADMIN_USER])
    assert ENGINE_USER not in stored
    port = clickhouse.http_port
    assert (
        chhttp.query(
            port, "SELECT currentUser()", user=ADMIN_USER, password=admin_credentials.password
        )
        == f"{ADMIN_USER}\n"
    )
    own = as_engine_user(port, "SHOW GRANTS")
    assert own.text == f"GRANT SYSTEM LISTEN ON *.* TO {ENGINE_USER}\n"


def test_default_can_close_the_listeners_and_stop_still_works(tmp_path: Path) -> None:
    # The residual risk, stated in docs/local-server.md: a denial of service.
    server = LocalServer(tmp_path / "d")
    info = server.start()
    closed = as_engine_user(info.http_port, "SYSTEM STOP LISTEN HTTP")
    assert closed.status == 200, closed.text
    assert not accepts_connections(info.http_port)
    report = server.stop()  # the administrator cannot reach it: the server exits hard
    assert report.pid == info.pid and find_running(tmp_path / "d") is None
    assert "cannot end the engine's batch" in DataDirLayout.at(tmp_path / "d").child_log.read_text()


def test_a_query_log_that_cannot_be_restored_stops_the_start(tmp_path: Path) -> None:
    data = tmp_path / "d"
    with LocalServer(data):
        pass
    (saved,) = DataDirLayout.at(data).log_dir.glob("query_log.*.native")
    saved.write_bytes(b"not a Native block")
    with pytest.raises(ServerDiedDuringStart) as caught:
        LocalServer(data).start()
    tail = caught.value.details["log_tail"]
    assert "query_log_restore_failed" in tail and str(saved) in tail
    assert find_running(data) is None


def test_a_credentials_file_without_the_administrator_is_named(tmp_path: Path) -> None:
    # A data directory last started by a dpone without `dpone_admin`.
    layout = DataDirLayout.at(tmp_path / "d")
    layout.run_dir.mkdir(parents=True)
    layout.credentials_file.write_text('{"users": [{"user": "loader", "password": "s3cret-L"}]}')
    with pytest.raises(CredentialsMissing) as caught:
        admin_credentials(layout.root)
    assert caught.value.details["user"] == ADMIN_USER
    assert "restart the server" in caught.value.message and "s3cret-L" not in str(caught.value)
