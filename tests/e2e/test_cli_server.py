"""The ``dpone`` command in a subprocess: server lifecycle, demo, exit codes."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from tests import chhttp
from tests.plugins.cli import as_json, dpone


def test_version_and_help() -> None:
    import dpone as package

    done = dpone("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"dpone, version {package.__version__}"
    helped = dpone("--help")
    assert helped.returncode == 0
    assert "server" in helped.stdout and "demo" in helped.stdout and "Exit codes" in helped.stdout


def test_usage_error_exits_2() -> None:
    done = dpone("server", "start", "--http-port", "not-a-port")
    assert done.returncode == 2
    assert "--http-port" in done.stderr


def test_server_lifecycle_through_the_cli(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    started = dpone("server", "start", "--data-dir", data, "--json")
    assert started.returncode == 0, started.stderr
    info = as_json(started)
    try:
        assert info["running"] is True and info["data_dir"] == data
        chhttp.register_server(info["http_port"], data)
        assert chhttp.query(info["http_port"], "SELECT currentUser(), 42") == "dpone_admin\t42\n"

        status = dpone("server", "status", "--data-dir", data, "--json")
        assert status.returncode == 0
        reported = as_json(status)
        assert {k: reported[k] for k in ("pid", "http_port", "tcp_port", "version")} == {
            k: info[k] for k in ("pid", "http_port", "tcp_port", "version")
        }
        assert reported["ok"] is True and reported["running"] is True
        assert reported["credentials_file"] == f"{data}/run/credentials.json"
        assert info["credentials_file"] == reported["credentials_file"]
        url = dpone("server", "url", "--data-dir", data)
        assert url.stdout.strip() == f"http://127.0.0.1:{info['http_port']}"

        again = dpone("server", "start", "--data-dir", data)
        assert again.returncode == 1
        assert "server_already_running" in again.stderr and str(info["pid"]) in again.stderr
    finally:
        stopped = dpone("server", "stop", "--data-dir", data, "--json")
    assert stopped.returncode == 0, stopped.stderr
    report = as_json(stopped)
    assert report["ok"] is True and report["pid"] == info["pid"] and report["forced"] is False

    status = dpone("server", "status", "--data-dir", data, "--json")
    assert status.returncode == 1
    assert as_json(status) == {
        "ok": False,
        "running": False,
        "data_dir": data,
        "error": {"code": "server_not_running", "message": "no server is running", "details": {}},
        # The data directory remembers what it protects, and how to start it as it was.
        "protected_databases": ["dpone_demo"],
        "pools": {},
        "start_command": f"dpone server start --data-dir {data} --protect dpone_demo",
    }
    missing = dpone("server", "stop", "--data-dir", data)
    assert missing.returncode == 1 and "server_not_running" in missing.stderr
    assert dpone("server", "url", "--data-dir", data).returncode == 1


def test_demo_uses_default_data_dir_under_working_directory(tmp_path: Path) -> None:
    done = dpone("demo", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    payload = as_json(done)
    assert payload["data_dir"] == str(tmp_path / ".dpone" / "clickhouse")
    assert payload["version"].startswith("26.")
    assert payload["server_was_running"] is False
    # Two refreshes: 1,000 rows, then 102 deleted and 25 inserted; the target equals the source.
    assert payload["database"] == "dpone_demo" and payload["target_equals_source"] is True
    first, second = payload["refreshes"]
    assert (first["rows"], second["rows"], payload["rows"]) == (1000, 923, 923)
    assert second["target_uuid_before"] == first["target_uuid_after"]
    verified = dpone("journal", "verify", second["journal"], "--json")
    assert verified.returncode == 0 and json.loads(verified.stdout)["state"] == "staged"
    # A second run rebuilds the source and publishes fresh generations.
    again = as_json(dpone("demo", "--json", cwd=tmp_path))
    assert (
        again["rows"] == 923
        and again["refreshes"][0]["generation_table"] != first["generation_table"]
    )
    # The demo stopped the server it started.
    assert dpone("server", "status", cwd=tmp_path).returncode == 1


def test_start_error_is_reported_with_exit_1(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    done = dpone("server", "start", "--data-dir", str(blocker / "d"), "--json")
    assert done.returncode == 1
    assert as_json(done)["error"]["code"] == "data_dir_not_writable"


def test_same_port_for_http_and_tcp_is_refused_with_what_is_wrong(tmp_path: Path) -> None:
    data = tmp_path / "data"
    done = dpone(
        "server",
        "start",
        "--data-dir",
        str(data),
        "--http-port",
        "18124",
        "--tcp-port",
        "18124",
        "--json",
    )
    assert done.returncode == 2
    error = as_json(done)["error"]
    assert error["code"] == "ports_must_differ" and "must differ" in error["message"]
    assert not data.exists()


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_status_and_stop_find_the_server_without_its_state_file(
    tmp_path: Path, damage: str
) -> None:
    data = tmp_path / "data"
    started = dpone("server", "start", "--data-dir", str(data), "--json")
    assert started.returncode == 0, started.stderr
    info = as_json(started)
    try:
        if damage == "missing":
            (data / "state.json").unlink()
        else:
            (data / "state.json").write_text("{not json")
        status = dpone("server", "status", "--data-dir", str(data), "--json")
        assert status.returncode == 0, status.stdout
        found = as_json(status)
        keys = ("pid", "http_port", "tcp_port", "version")
        assert {k: found[k] for k in keys} == {k: info[k] for k in keys}
        again = dpone("server", "start", "--data-dir", str(data))
        assert again.returncode == 1 and str(info["pid"]) in again.stderr
    finally:
        stopped = dpone("server", "stop", "--data-dir", str(data), "--json")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert as_json(stopped)["pid"] == info["pid"] and as_json(stopped)["forced"] is False
    assert dpone("server", "status", "--data-dir", str(data)).returncode == 1


def test_demo_leaves_only_private_files(tmp_path: Path) -> None:
    done = dpone("demo", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    root = tmp_path / ".dpone"
    entries = [root, *root.rglob("*")]
    assert len(entries) > 20  # the server's data, logs, the demo's files and journals
    wide = [
        f"{p} {stat.S_IMODE(p.lstat().st_mode):04o}"
        for p in entries
        if not p.is_symlink() and stat.S_IMODE(p.lstat().st_mode) & 0o077
    ]
    assert wide == []


def test_server_client_runs_clickhouse_client_without_credentials_in_argv(
    tmp_path: Path, clickhouse_client: str
) -> None:
    data = tmp_path / "data"
    assert dpone("server", "start", "--data-dir", str(data)).returncode == 0
    try:
        done = dpone(
            "server",
            "client",
            "--data-dir",
            str(data),
            "--client-path",
            clickhouse_client,
            "--",
            "--query",
            "SELECT currentUser(), 7",
        )
    finally:
        dpone("server", "stop", "--data-dir", str(data))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "dpone_admin\t7\n"


def test_rotate_credentials_says_when_it_applies(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert dpone("server", "start", "--data-dir", str(data)).returncode == 0
    try:
        done = dpone("server", "rotate-credentials", "--data-dir", str(data))
        status = as_json(dpone("server", "status", "--data-dir", str(data), "--json"))
    finally:
        dpone("server", "stop", "--data-dir", str(data))
    assert done.returncode == 0, done.stderr
    # The administrator and the publication pool have generated passwords to rotate.
    first, second = done.stdout.splitlines()
    assert first.startswith("new passwords prepared for: dpone_admin, ")
    assert "dpone_ingest_1" in first and "dpone_publisher_1" in first
    assert second == (
        "they take effect when the server restarts: "
        f"dpone server stop --data-dir {data}; "
        f"dpone server start --data-dir {data} --protect dpone_demo"
    )
    assert status["ok"] is True and status["credentials_rotation_pending"] is True


def test_a_stopped_server_starts_again_on_the_same_ports_at_once(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    started = as_json(dpone("server", "start", "--data-dir", data, "--json"))
    ports = ["--http-port", str(started["http_port"]), "--tcp-port", str(started["tcp_port"])]
    chhttp.register_server(started["http_port"], data)
    assert chhttp.query(started["http_port"], "SELECT 1") == "1\n"
    assert dpone("server", "stop", "--data-dir", data).returncode == 0
    # Its closed connections may sit in TIME-WAIT for a minute: the ports are free all
    # the same (before: port_in_use until they expired).
    again = dpone("server", "start", "--data-dir", data, *ports, "--json")
    try:
        assert again.returncode == 0, again.stdout + again.stderr
        assert as_json(again)["http_port"] == started["http_port"]
    finally:
        dpone("server", "stop", "--data-dir", data)


def test_another_engine_version_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """Before: chdb accepted chdb-core 26.7.3, with which the server does not start again
    after a clean stop (issue 35, item 2). The installed version is what the package
    metadata says: here a chdb-core 26.7.3 found first on the path (installing a second
    real engine would take 0.5 GB)."""
    from dpone.localserver.engine import TESTED_ENGINE

    site = tmp_path / "site"
    info = site / "chdb_core-26.7.3.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: chdb-core\nVersion: 26.7.3\n")
    data = tmp_path / "data"
    done = dpone(
        "server", "start", "--data-dir", str(data), "--json", extra_env={"PYTHONPATH": str(site)}
    )
    assert done.returncode == 1, done.stdout + done.stderr
    error = as_json(done)["error"]
    assert error["code"] == "engine_version_unsupported", error
    assert (error["details"]["found"], error["details"]["tested"]) == ("26.7.3", TESTED_ENGINE)
    assert "pip install 'dpone[embedded]'" in error["message"], error
    assert not data.exists()  # nothing created, nothing started
