"""Generated credentials, private files, the query log across a restart, state recovery."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from dpone.errors import ConfigurationError
from dpone.localserver import (
    ADMIN_USER,
    ENGINE_USER,
    CredentialsCorrupt,
    LocalServer,
    ServerUser,
    admin_credentials,
    load_credentials,
    rotate_credentials,
    rotation_pending,
)
from dpone.localserver.layout import DataDirLayout
from tests import chhttp

USERS = (ServerUser("loader", grants=("GRANT SELECT ON system.one",)),)


def _private_tree(root: Path) -> list[str]:
    """Every path under ``root`` that someone other than the owner may read or enter."""
    wide = []
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        if stat.S_IMODE(path.lstat().st_mode) & 0o077:
            wide.append(f"{path} {stat.S_IMODE(path.lstat().st_mode):04o}")
    return wide


def test_declared_user_without_password_gets_a_private_generated_one(tmp_path: Path) -> None:
    layout = DataDirLayout.at(tmp_path / "d")
    with LocalServer(layout.root, users=USERS) as server:
        port = server.info.http_port
        loader = load_credentials(layout.root)["loader"]
        assert server.credentials("loader") == loader
        assert len(loader.password) >= 40  # 32 random bytes, URL-safe
        assert (
            chhttp.query(port, "SELECT currentUser()", user="loader", password=loader.password)
            == "loader\n"
        )
        # Refused by the real server: no password, and a wrong one.
        for password in ("", loader.password + "x"):
            refused = chhttp.post(port, "SELECT 1", user="loader", password=password)
            assert refused.status in (401, 403) and refused.exception_code == "516", refused.text
        # The password is in no argv, state file, users.xml or log.
        pid = server.info.pid
        assert loader.password.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
        admin = load_credentials(layout.root)[ADMIN_USER]
        assert server.credentials() == admin and len(admin.password) >= 40
        chhttp.query(port, "SYSTEM FLUSH LOGS", user=ADMIN_USER, password=admin.password)
    # The administrator and the declared user; never the engine's passwordless `default`.
    assert json.loads(layout.credentials_file.read_text()) == {
        "users": [
            {"user": ADMIN_USER, "password": admin.password},
            {"user": "loader", "password": loader.password},
        ]
    }
    assert stat.S_IMODE(layout.credentials_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(layout.run_dir.stat().st_mode) == 0o700
    for path in layout.root.rglob("*"):
        if path.is_file() and path != layout.credentials_file:
            assert loader.password.encode() not in path.read_bytes(), path
    # Parts, metadata, logs, lock: all private (the server child runs with umask 077).
    assert _private_tree(layout.root) == []


def test_restart_keeps_and_rotation_replaces_credentials(tmp_path: Path) -> None:
    data = tmp_path / "d"
    with LocalServer(data, users=USERS):
        first = load_credentials(data)["loader"]
        first_admin = admin_credentials(data)
    with LocalServer(data, users=USERS) as server:
        assert load_credentials(data)["loader"] == first
        assert admin_credentials(data) == first_admin
        assert rotate_credentials(data) == (ADMIN_USER, "loader")
        assert rotation_pending(data)
        # Not applied while running: dpone keeps the passwords the server accepts.
        assert load_credentials(data)["loader"] == first
        port = server.info.http_port
        assert chhttp.query(port, "SELECT 1", user="loader", password=first.password) == "1\n"
    with LocalServer(data, users=USERS) as server:
        rotated = load_credentials(data)["loader"]
        assert rotated.password != first.password and not rotation_pending(data)
        port = server.info.http_port
        assert chhttp.query(port, "SELECT 1", user="loader", password=rotated.password) == "1\n"
        old = chhttp.post(port, "SELECT 1", user="loader", password=first.password)
        assert old.exception_code == "516", old.text
        admin = admin_credentials(data)
        assert admin.password != first_admin.password
        assert chhttp.query(port, "SELECT 1", user=ADMIN_USER, password=admin.password) == "1\n"
        old = chhttp.post(port, "SELECT 1", user=ADMIN_USER, password=first_admin.password)
        assert old.exception_code == "516", old.text


def test_corrupt_credentials_file_is_refused_without_quoting_it(tmp_path: Path) -> None:
    layout = DataDirLayout.at(tmp_path / "d")
    layout.run_dir.mkdir(parents=True)
    layout.credentials_file.write_text('{"users": [{"user": "loader", "password": "s3cret-XYZ"')
    with pytest.raises(CredentialsCorrupt) as caught:
        load_credentials(layout.root)
    assert "s3cret-XYZ" not in str(caught.value) and caught.value.__cause__ is None
    assert caught.value.details["path"] == str(layout.credentials_file)


@pytest.mark.parametrize("name", [ENGINE_USER, ADMIN_USER])
def test_the_engine_user_and_the_administrator_are_reserved(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        LocalServer(tmp_path / "d", users=(ServerUser(name, password="x"),))
    assert caught.value.code == "reserved_user" and caught.value.details["user"] == name
    assert not (tmp_path / "d").exists()


def test_same_port_for_http_and_tcp_is_refused_before_starting(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError) as caught:
        LocalServer(tmp_path / "d", http_port=18123, tcp_port=18123)
    assert caught.value.code == "ports_must_differ" and "must differ" in caught.value.message
    assert not (tmp_path / "d").exists()


def test_wide_existing_data_dir_gets_a_warning_with_the_fix(tmp_path: Path) -> None:
    data = tmp_path / "d"
    data.mkdir(mode=0o755)
    os.chmod(data, 0o755)  # noqa: S103 (the wide directory under test)
    with LocalServer(data) as server:
        (warning,) = server.warnings
    assert f"chmod -R go-rwx {data}" in warning and "0755" in warning
    assert stat.S_IMODE(data.stat().st_mode) == 0o755  # reported, not changed


def test_query_log_survives_a_clean_restart(tmp_path: Path) -> None:
    data = tmp_path / "d"
    with LocalServer(data) as server:
        chhttp.register_server(server.info.http_port, data)
        chhttp.query(server.info.http_port, "SELECT 'before the restart'")
    with LocalServer(data) as server:
        port = server.info.http_port
        chhttp.register_server(port, data)
        chhttp.query(port, "SYSTEM FLUSH LOGS")
        found = chhttp.rows(
            port,
            "SELECT toString(type) AS type FROM system.query_log "
            "WHERE query = 'SELECT \\'before the restart\\'' ORDER BY event_time_microseconds",
        )
    assert found == [{"type": "QueryStart"}, {"type": "QueryFinish"}]
