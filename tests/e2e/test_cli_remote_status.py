"""``dpone attempts list`` and ``dpone status`` on a remote server, named by the project file.

The server is one dpone did not start (tests/remote_server.py), reached only through
``[clickhouse] host``, the ports and the credentials file. ``attempts list --config``
reads the project's attempts and store and prints commands that name the server with
``--config``; ``status`` on a server it cannot reach says why, by the typed error's
code, without any credential.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import chhttp
from tests.plugins.cli import as_json, dpone
from tests.plugins.refresh import make_source, rows_of
from tests.remote_server import remote_server

DATABASE = "rstatus_db"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    yield from remote_server(tmp_path_factory.mktemp("remote-status"), [DATABASE])


def project(tmp_path: Path, clickhouse: str, target: str = "items") -> Path:
    config = tmp_path / "dpone.toml"
    config.write_text(
        '[project]\nwork_dir = "work"\nstore = "store.sqlite"\n'
        + clickhouse
        + '[sources.shop]\nkind = "sqlite"\npath = "shop.db"\n'
        f'[tables.items]\nsource = "shop"\ntable = "items"\ntarget = "{DATABASE}.{target}"\n'
        'order_by = "id"\n'
    )
    return config


def _remote(server: dict[str, Any], **changes: Any) -> str:
    """A ``[clickhouse]`` section naming ``server`` with some keys changed."""
    keys: dict[str, Any] = {
        "host": "127.0.0.1",
        "http_port": server["http_port"],
        "tcp_port": server["tcp_port"],
        "credentials_file": str(server["credentials_file"]),
        "secure": False,
    } | changes
    lines = [
        f"{k} = {json.dumps(v) if not isinstance(v, bool) else str(v).lower()}"
        for k, v in keys.items()
    ]
    return "[clickhouse]\n" + "\n".join(lines) + '\ntrusted_writers = ["dpone_admin"]\n'


def _export(tmp_path: Path) -> tuple[Path, Path]:
    make_source(tmp_path / "shop.db", rows_of(5))
    out, receipt = tmp_path / "items.tsv", tmp_path / "items.receipt.json"
    done = dpone(
        "export",
        *("--source", f"sqlite:{tmp_path / 'shop.db'}", "--table", "items"),
        *("--out", str(out), "--receipt-out", str(receipt)),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out, receipt


def test_attempts_list_with_config_reads_the_projects_attempts_and_names_its_server(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    config = project(tmp_path, _remote(server))
    out, receipt = _export(tmp_path)
    attempts, store = tmp_path / "work" / "attempts", tmp_path / "store.sqlite"
    staged = dpone(
        *("stage", str(out), "--receipt", str(receipt), "--work-dir", str(attempts)),
        *("--database", DATABASE, "--config", str(config), "--store", str(store)),
        *("--attempt-id", "left-1", "--json"),
    )
    assert staged.returncode == 0, staged.stdout + staged.stderr
    table = as_json(staged)["table"]
    # Staged, never published: the project's attempts, read through --config alone.
    done = dpone("attempts", "list", "--config", str(config), "--all", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    (entry,) = as_json(done)["attempts"]
    assert (entry["attempt_id"], entry["state"]) == ("left-1", "staged")
    discard = shlex.join(
        [
            *("dpone", "attempts", "discard", "left-1", "--work-dir", str(attempts)),
            *("--database", DATABASE, "--config", str(config), "--store", str(store)),
        ]
    )
    assert entry["next_command"] == discard
    text = dpone("attempts", "list", "--config", str(config), "--all")
    assert text.returncode == 0 and f"drop it with: {discard}" in text.stdout, text.stdout
    # The command as printed reaches the remote server and ends the attempt there.
    finished = dpone(*shlex.split(discard)[1:], "--json")
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert as_json(finished)["state"] == "discarded"
    gone = f"SELECT count() FROM system.tables WHERE database = '{DATABASE}' AND name = '{table}'"
    assert chhttp.query(server["http_port"], gone) == "0\n"
    # Without --work-dir or --config there is nothing to list: said, with its code.
    bare = dpone("attempts", "list", "--json")
    assert bare.returncode != 0 and as_json(bare)["error"]["code"] == "work_dir_missing"


def _wrong_keeper_password(server: dict[str, Any], tmp_path: Path) -> Path:
    """A copy of the credentials file whose keeper password is not the installed one."""
    document = json.loads(Path(server["credentials_file"]).read_text())
    for entry in document["users"]:
        if entry["user"] == "dpone_keeper":
            entry["password"] = "not-the-installed-password-" + "x" * 20
    path = tmp_path / "wrong-credentials.json"
    path.write_text(json.dumps(document))
    os.chmod(path, 0o600)
    return path


@pytest.mark.parametrize(
    ("case", "code", "reason", "words"),
    [
        ("refused", "connect_failed", "connection refused", "Connection refused"),
        ("plain_port", "tls_handshake_failed", "TLS handshake failed", "plain HTTP"),
        ("login", "authentication_refused", "authentication refused", "Authentication failed"),
        ("silent", "transport_deadline", "(timeout)", "deadline"),
    ],
)
def test_status_says_why_a_remote_server_is_not_reachable(
    tmp_path: Path, server: dict[str, Any], case: str, code: str, reason: str, words: str
) -> None:
    with socket.socket() as closed, socket.socket() as silent:
        closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # accepts into its backlog and never answers
        changes: dict[str, Any] = {
            "refused": {"http_port": closed.getsockname()[1]},
            "plain_port": {"secure": True},  # the server's plain HTTP port, with TLS
            "login": {"credentials_file": str(_wrong_keeper_password(server, tmp_path))},
            "silent": {"http_port": silent.getsockname()[1]},
        }[case]
        config = project(tmp_path, _remote(server, **changes))
        done = dpone("status", "--config", str(config), "--json")
        text = dpone("status", "--config", str(config)) if case != "silent" else None
    found = as_json(done)
    # Not "all is well": a monitor sees ok false and exit 3 (cannot know), not 0 or 1.
    assert (done.returncode, found["ok"], found["server_running"]) == (3, False, False), found
    why = found["server_unreachable"]
    assert (why["code"], why["reason"].endswith(reason)) == (code, True), why
    assert words in why["message"] and str(config) in why["fix"], why
    if case == "login":
        assert "dpone_keeper" in why["message"] and "pool verify" in why["fix"], why
    if text is not None:
        assert f"is not reachable: {why['reason']}" in text.stdout, text.stdout
        assert f"  [{code}] " in text.stdout and words in text.stdout, text.stdout
        assert f"  fix: {why['fix']}" in text.stdout, text.stdout
        assert text.returncode == 3 and "status is incomplete" in text.stdout, text.stdout
        assert "nothing needs a person" not in text.stdout, text.stdout
    # No password of either credentials file is ever printed.
    files = [Path(server["credentials_file"]), tmp_path / "wrong-credentials.json"]
    for path in (p for p in files if p.exists()):
        for entry in json.loads(path.read_text())["users"]:
            for output in (done, text):
                if output is not None:
                    assert entry["password"] not in output.stdout + output.stderr


def test_status_of_a_managed_server_that_is_not_running_names_its_start(tmp_path: Path) -> None:
    config = project(tmp_path, f'[clickhouse]\ndata_dir = "{tmp_path / "ch"}"\n')
    done = dpone("status", "--config", str(config), "--json")
    found = as_json(done)
    assert (done.returncode, found["ok"]) == (3, False), found
    why = found["server_unreachable"]
    assert (found["server_running"], why["code"], why["reason"]) == (
        False,
        "server_not_running",
        "not running",
    )
    shown = dpone("status", "--config", str(config))
    text = shown.stdout
    assert shown.returncode == 3 and "status is incomplete" in text, text
    assert "is not running (rollback copies unknown)" in text, text
    assert f"  fix: start it with `dpone server start --data-dir {tmp_path / 'ch'}" in text, text


def test_the_example_of_init_reaches_a_remote_server_once_its_block_is_uncommented(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    """Before: `dpone init` offered no remote keys (issue 35, item 5)."""
    config = tmp_path / "dpone.toml"
    assert dpone("init", "--config", str(config)).returncode == 0
    lines = []
    values = {
        "host": '"127.0.0.1"',
        "http_port": str(server["http_port"]),
        "tcp_port": str(server["tcp_port"]),
        "secure": "false",
        "credentials_file": json.dumps(str(server["credentials_file"])),
        "trusted_writers": '["dpone_admin"]',
    }
    offered, section = set(), ""
    for line in config.read_text().splitlines():
        section = line if line.startswith("[") else section
        key = line.removeprefix("# ").split(" = ")[0]
        if line.startswith("data_dir = "):
            continue  # the managed server's key: a remote block replaces it
        remote = section == "[clickhouse]" and line.startswith("# ") and " = " in line
        if remote and key in values | {"ca_file": ""}:
            offered.add(key)
            if key in values:
                line = f"{key} = {values[key]}"
            else:
                continue  # no CA file: this server speaks plain HTTP
        lines.append(line.replace("dpone_demo.customers", f"{DATABASE}.t_init"))
    assert offered == {*values, "ca_file"}, offered
    config.write_text("\n".join(lines) + "\n")
    with sqlite3.connect(tmp_path / "shop.db") as conn:
        conn.execute("CREATE TABLE customers (id bigint NOT NULL)")
    conn.close()
    checked = dpone("check", "--config", str(config), "--json")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    status = dpone("status", "--config", str(config), "--json")
    assert status.returncode == 0 and as_json(status)["server_running"] is True, status.stdout


def test_rollback_and_retire_name_a_refused_sign_in_and_its_fix(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    """Before: the raw AUTHENTICATION_FAILED text with no fix (issue 35, item 5)."""
    make_source(tmp_path / "shop.db", rows_of(4))
    good = project(tmp_path, _remote(server), "t_refused_login")
    for _ in range(2):  # a rollback copy to restore
        done = dpone("refresh", "items", "--config", str(good), "--json")
        assert done.returncode == 0, done.stdout + done.stderr
    before = as_json(dpone("status", "--config", str(good), "--json"))["targets"]
    wrong = _wrong_keeper_password(server, tmp_path)
    config = tmp_path / "wrong.toml"  # the same project, another credentials file
    text = good.read_text()
    config.write_text(text.replace(str(server["credentials_file"]), str(wrong)))
    rolled = dpone("rollback", "items", "--config", str(config), "--json")
    report = as_json(rolled)
    retired = dpone("retire", "items", "--yes", "--config", str(config), "--json")
    for done, error in ((rolled, report["error"]), (retired, as_json(retired)["error"])):
        assert done.returncode == 1, done.stdout
        assert error["code"] == "authentication_refused", error
        assert "dpone_keeper" in error["message"] and "pool verify" in error["details"]["fix"]
        assert "not-the-installed-password" not in done.stdout + done.stderr
    shown = dpone("retire", "items", "--yes", "--config", str(config))
    assert "[authentication_refused]" in shown.stderr and "fix: " in shown.stderr, shown.stderr
    # Nothing was rolled back or retired.
    assert as_json(dpone("status", "--config", str(good), "--json"))["targets"] == before


def test_a_writer_outside_the_pool_is_found_by_check_and_before_the_export(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    """Before: check passed and the refresh failed at prepare, after its export and its
    stage, with a hint that did not name trusted_writers (issue 35, item 4)."""
    make_source(tmp_path / "shop.db", rows_of(3))
    # The server's own administrator can write every table, and nobody vouched for it.
    untrusted = _remote(server).replace('trusted_writers = ["dpone_admin"]\n', "")
    config = project(tmp_path, untrusted, "t_untrusted_writer")
    checked = dpone("check", "--config", str(config), "--json")
    assert checked.returncode == 1, checked.stdout
    (problem,) = as_json(checked)["problems"]
    assert (problem["key"], problem["code"]) == ("tables.items.target", "side_effect_present")
    assert "user dpone_admin can write" in problem["message"], problem
    assert "trusted_writers" in problem["message"], problem
    assert not (tmp_path / "store.sqlite").exists()  # check creates no store
    refused = dpone("refresh", "items", "--config", str(config), "--json")
    (report,) = as_json(refused)["tables"]
    assert (report["phase"], report["error"]["code"]) == ("check", "side_effect_present")
    assert "trusted_writers" in report["error"]["message"], report
    assert "export" not in report["timings"], report  # nothing exported, nothing staged
    attempts = tmp_path / "work" / "attempts"
    assert not attempts.exists() or not any(attempts.iterdir())
    # Vouched for: the same project checks and publishes.
    trusted = project(tmp_path, _remote(server), "t_untrusted_writer")
    assert dpone("check", "--config", str(trusted), "--json").returncode == 0
    done = dpone("refresh", "items", "--config", str(trusted), "--json")
    assert as_json(done)["tables"][0]["outcome"] == "published", done.stdout
