"""The managed local ClickHouse server, exercised over real HTTP and native protocols."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from dpone.localserver import LocalServer, ServerInfo, ServerUser, find_running
from dpone.localserver.layout import DataDirLayout
from dpone.localserver.probe import accepts_connections, http_ping
from dpone.ports.clickhouse_request import Credentials
from tests import chhttp
from tests.plugins.managed_server import READER_PASSWORD, TEST_DATABASE


def test_ready_server_answers_on_both_ports(clickhouse: ServerInfo) -> None:
    assert accepts_connections(clickhouse.http_port)
    assert accepts_connections(clickhouse.tcp_port)
    assert http_ping(clickhouse.http_port)
    assert clickhouse.http_port != clickhouse.tcp_port
    assert chhttp.query(clickhouse.http_port, "SELECT version()").strip() == clickhouse.version
    assert clickhouse.version.startswith("26.")


def test_http_query_returns_typed_values(clickhouse: ServerInfo) -> None:
    got = chhttp.rows(
        clickhouse.http_port,
        "SELECT toInt64(9223372036854775807) AS big, 'a\\tb' AS s, 1 + 1 AS two",
    )
    assert got == [{"big": 9223372036854775807, "s": "a\tb", "two": 2}]


def client_config(path: Path, credentials: Credentials) -> Path:
    """A 0600 clickhouse-client configuration: the password stays out of argv."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(
            f"<config><user>{credentials.user}</user>"
            f"<password>{credentials.password}</password></config>\n"
        )
    return path


def test_native_protocol_query_and_rowbinary_insert(
    clickhouse: ServerInfo, clickhouse_client: str, admin_credentials: Credentials, tmp_path: Path
) -> None:
    port = clickhouse.http_port
    chhttp.query(port, "CREATE DATABASE IF NOT EXISTS native_db ENGINE = Atomic")
    chhttp.query(
        port, "CREATE TABLE native_db.t (id Int32, s String) ENGINE = MergeTree ORDER BY id"
    )
    # Two RowBinary rows: Int32 little-endian, String as LEB128 length + bytes.
    payload = (7).to_bytes(4, "little", signed=True) + b"\x03abc"
    payload += (-1).to_bytes(4, "little", signed=True) + b"\x00"
    config = client_config(tmp_path / "client.xml", admin_credentials)
    base = [
        clickhouse_client,
        "--config-file",
        str(config),
        "--host",
        "127.0.0.1",
        "--port",
        str(clickhouse.tcp_port),
    ]
    done = subprocess.run(
        [
            *base,
            "--query_id",
            "dpone-test-native-insert",
            "--query",
            "INSERT INTO native_db.t FORMAT RowBinary",
        ],
        input=payload,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = subprocess.run(
        [*base, "--query", "SELECT id, s FROM native_db.t ORDER BY id FORMAT TabSeparated"],
        capture_output=True,
        timeout=60,
        check=True,
    )
    assert out.stdout == b"-1\t\n7\tabc\n"
    chhttp.query(port, "SYSTEM FLUSH LOGS")
    logged = chhttp.rows(
        port,
        "SELECT count() AS n FROM system.query_log "
        "WHERE query_id = 'dpone-test-native-insert' AND type = 'QueryFinish'",
    )
    assert logged == [{"n": 1}]


def test_exchange_tables_in_atomic_database(clickhouse: ServerInfo) -> None:
    port = clickhouse.http_port
    chhttp.query(port, "CREATE DATABASE IF NOT EXISTS swap_db ENGINE = Atomic")
    for name, rows in (("target", "(1), (2)"), ("generation", "(10), (20), (30)")):
        chhttp.query(port, f"CREATE TABLE swap_db.{name} (v Int32) ENGINE = MergeTree ORDER BY v")
        chhttp.query(port, f"INSERT INTO swap_db.{name} VALUES {rows}")

    def uuids() -> dict[str, str]:
        got = chhttp.rows(
            port, "SELECT name, toString(uuid) AS u FROM system.tables WHERE database = 'swap_db'"
        )
        return {r["name"]: r["u"] for r in got}

    before = uuids()
    assert chhttp.rows(port, "SELECT engine FROM system.databases WHERE name = 'swap_db'") == [
        {"engine": "Atomic"}
    ]
    chhttp.query(port, "EXCHANGE TABLES swap_db.target AND swap_db.generation")
    after = uuids()
    assert after == {"target": before["generation"], "generation": before["target"]}
    assert (
        chhttp.query(port, "SELECT groupArray(v) FROM (SELECT v FROM swap_db.target ORDER BY v)")
        == "[10,20,30]\n"
    )


def test_grants_are_enforced_for_declared_users(clickhouse: ServerInfo) -> None:
    port = clickhouse.http_port
    chhttp.query(port, f"CREATE DATABASE IF NOT EXISTS {TEST_DATABASE} ENGINE = Atomic")
    chhttp.query(port, f"CREATE TABLE IF NOT EXISTS {TEST_DATABASE}.g (v Int32) ENGINE = Memory")
    chhttp.query(port, f"INSERT INTO {TEST_DATABASE}.g VALUES (5)")
    reader: dict[str, Any] = {"user": "reader", "password": READER_PASSWORD}
    assert chhttp.query(port, f"SELECT sum(v) FROM {TEST_DATABASE}.g", **reader) == "5\n"

    denied = chhttp.post(
        port, f"CREATE TABLE {TEST_DATABASE}.nope (v Int8) ENGINE = Memory", **reader
    )
    assert denied.status != 200 and denied.exception_code == "497"  # ACCESS_DENIED
    denied = chhttp.post(port, f"INSERT INTO {TEST_DATABASE}.g VALUES (6)", **reader)
    assert denied.exception_code == "497"
    assert (
        chhttp.post(port, "SELECT 1 FROM swap_db.target LIMIT 1", **reader).exception_code == "497"
    )

    wrong = chhttp.post(port, "SELECT 1", user="reader", password="not-the-password")
    assert wrong.exception_code == "516"  # AUTHENTICATION_FAILED
    nobody = chhttp.post(
        port, f"SELECT 1 FROM {TEST_DATABASE}.g", user="nobody", password="nobody-secret"
    )
    assert nobody.exception_code == "497"
    assert chhttp.query(port, f"SELECT sum(v) FROM {TEST_DATABASE}.g") == "5\n"


def test_users_file_is_private_and_holds_no_clear_password(
    clickhouse: ServerInfo, session_data_dir: Path
) -> None:
    layout = DataDirLayout.at(session_data_dir)
    text = layout.users_file.read_text(encoding="utf-8")
    assert READER_PASSWORD not in text
    assert ServerUser("x", password=READER_PASSWORD).password_sha256_hex in text
    assert stat.S_IMODE(layout.users_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(layout.run_dir.stat().st_mode) == 0o700
    for log in layout.log_dir.iterdir():
        assert READER_PASSWORD not in log.read_text(encoding="utf-8", errors="replace")


def test_data_and_uuids_survive_restart(tmp_path: Path) -> None:
    with LocalServer(tmp_path / "data") as first:
        port = first.info.http_port
        chhttp.register_server(port, tmp_path / "data")
        chhttp.query(port, "CREATE DATABASE keep ENGINE = Atomic")
        chhttp.query(port, "CREATE TABLE keep.t (v String) ENGINE = MergeTree ORDER BY v")
        chhttp.query(port, "INSERT INTO keep.t VALUES ('x'), ('y')")
        sql = (
            "SELECT toString(d.uuid) AS db, toString(t.uuid) AS tbl FROM system.databases d "
            "JOIN system.tables t ON t.database = d.name WHERE d.name = 'keep'"
        )
        before = chhttp.rows(port, sql)
        first_pid = first.info.pid
    assert find_running(tmp_path / "data") is None
    with LocalServer(tmp_path / "data") as second:
        port = second.info.http_port
        chhttp.register_server(port, tmp_path / "data")
        assert second.info.pid != first_pid
        assert chhttp.rows(port, sql) == before
        assert (
            chhttp.query(port, "SELECT groupArray(v) FROM (SELECT v FROM keep.t ORDER BY v)")
            == "['x','y']\n"
        )
    nil = "00000000-0000-0000-0000-000000000000"
    assert before[0]["db"] != nil and before[0]["tbl"] != nil


def test_two_servers_on_two_data_dirs(clickhouse: ServerInfo, tmp_path: Path) -> None:
    with LocalServer(tmp_path / "other") as other:
        chhttp.register_server(other.info.http_port, tmp_path / "other")
        assert {other.info.http_port, other.info.tcp_port}.isdisjoint(
            {clickhouse.http_port, clickhouse.tcp_port}
        )
        chhttp.query(other.info.http_port, "CREATE DATABASE only_here ENGINE = Atomic")
        assert (
            chhttp.query(
                other.info.http_port,
                "SELECT count() FROM system.databases WHERE name = 'only_here'",
            )
            == "1\n"
        )
        assert (
            chhttp.query(
                clickhouse.http_port,
                "SELECT count() FROM system.databases WHERE name = 'only_here'",
            )
            == "0\n"
        )
        running = find_running(tmp_path / "other")
        assert running is not None and running.pid == other.info.pid


def test_stop_is_clean_and_bounded(tmp_path: Path) -> None:
    server = LocalServer(tmp_path / "d")
    info = server.start()
    report = server.stop()
    assert report.pid == info.pid and not report.forced
    assert report.seconds < 5
    assert not accepts_connections(info.http_port)
    assert not (tmp_path / "d" / "state.json").exists()
    # Reaped by stop itself, not left a zombie for the garbage collector to find.
    with pytest.raises(ChildProcessError):
        os.waitpid(info.pid, os.WNOHANG)


def test_stop_falls_back_to_signals_when_clean_stop_is_ignored(tmp_path: Path) -> None:
    server = LocalServer(tmp_path / "d", stop_timeout=0.5)
    info = server.start()
    # Without its FIFO the clean stop request reaches nobody.
    DataDirLayout.at(tmp_path / "d").control_fifo.unlink()
    report = server.stop()
    assert report.forced and report.pid == info.pid
    assert find_running(tmp_path / "d") is None
    assert not os.path.exists(f"/proc/{info.pid}")
