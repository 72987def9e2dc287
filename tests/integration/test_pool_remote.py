"""``dpone pool render`` and ``verify`` against a real server an operator prepared.

Each case starts a server dpone did not start (tests/remote_server.py) with the users
file the render wrote, installed as an operator would, sometimes with an operator's
mistake in it; verify must name each mistake by its principal or database.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dpone.errors import ConfigurationError
from dpone.localserver.pool_sql import POOL_SETTINGS
from dpone.publication.principals.pool_verify import MIN_SERVER_VERSION, require_server_version
from dpone.publication.principals.server_access import RemoteServer, ServerAccess
from tests import chhttp
from tests.remote_server import remote_server


def dpone(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dpone", *args], capture_output=True, text=True, check=False
    )


def project_for(tmp_path: Path, server: dict[str, Any], databases: list[str]) -> Path:
    tables = "".join(
        f'[tables.t{i}]\nsource = "shop"\ntable = "items"\ntarget = "{db}.t{i}"\n'
        for i, db in enumerate(databases)
    )
    config = tmp_path / "dpone.toml"
    config.write_text(
        server["clickhouse_toml"] + '[sources.shop]\nkind = "sqlite"\npath = "shop.db"\n' + tables
    )
    return config


def test_render_writes_hashes_only_and_a_private_credentials_file(tmp_path: Path) -> None:
    out, secret = tmp_path / "users.xml", tmp_path / "creds.json"
    done = dpone(
        "pool",
        "render",
        "--protect",
        "a_db",
        "--protect",
        "b_db",
        "--out",
        str(out),
        "--credentials",
        str(secret),
        "--network",
        "10.0.0.0/8",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600
    users = json.loads(secret.read_text())["users"]
    names = [u["user"] for u in users]
    assert names[:2] == ["dpone_catalog", "dpone_closer"] and names[-1] == "dpone_keeper"
    text = out.read_text()
    for entry in users:
        # The server's file holds each password's SHA-256, never the password itself.
        assert entry["password"] not in text
        assert hashlib.sha256(entry["password"].encode()).hexdigest() in text
    assert "<ip>10.0.0.0/8</ip>" in text and "GRANT DROP TABLE ON `b_db`.*" in text
    # A second render never overwrites either file unless asked.
    again = dpone(
        "pool",
        "render",
        "--protect",
        "a_db",
        "--out",
        str(out),
        "--credentials",
        str(secret),
        "--json",
    )
    assert again.returncode != 0 and json.loads(again.stdout)["error"]["code"] == "output_exists"
    assert json.loads(secret.read_text())["users"] == users


def test_render_refuses_a_bad_network_and_a_bad_database(tmp_path: Path) -> None:
    bad_net = dpone(
        "pool",
        "render",
        "--protect",
        "a_db",
        "--out",
        str(tmp_path / "u"),
        "--credentials",
        str(tmp_path / "c"),
        "--network",
        "10.0.0.300/8",
        "--json",
    )
    assert json.loads(bad_net.stdout)["error"]["code"] == "networks_invalid"
    bad_db = dpone(
        "pool",
        "render",
        "--protect",
        "system",
        "--out",
        str(tmp_path / "u"),
        "--credentials",
        str(tmp_path / "c"),
        "--json",
    )
    assert json.loads(bad_db.stdout)["error"]["code"] == "invalid_database"
    assert not (tmp_path / "u").exists() and not (tmp_path / "c").exists()


def test_verify_accepts_the_installation_as_rendered(tmp_path: Path) -> None:
    for server in remote_server(tmp_path, ["good_db"]):
        config = project_for(tmp_path, server, ["good_db"])
        done = dpone("pool", "verify", "--config", str(config), "--json")
        found = json.loads(done.stdout)
        assert done.returncode == 0 and found["ok"], found
        assert len(found["principals"]) == 11
        assert all(p["authenticated"] and p["grants_exact"] for p in found["principals"])
        assert found["version"].startswith("26.") and found["identity"].startswith(
            "database _dpone_identity "
        )
        access = ServerAccess(
            tmp_path, RemoteServer("127.0.0.1", server["http_port"], 0, server["credentials_file"])
        )
        assert require_server_version(access) == found["version"]
        with pytest.raises(ConfigurationError) as caught:
            require_server_version(access, minimum=(99, 0))
        assert caught.value.code == "server_too_old"
        assert found["version"] in caught.value.message and "99.0" in caught.value.message
        assert MIN_SERVER_VERSION <= (26, 9)


def _mistakes(text: str) -> str:
    # An operator's mistakes: one principal given more than its role, one not installed.
    text = text.replace(
        "<query>GRANT TABLE ENGINE ON MergeTree</query>\n      </grants>\n    </dpone_publisher_1>",
        "<query>GRANT TABLE ENGINE ON MergeTree</query>\n        <query>GRANT INSERT ON *.*"
        "</query>\n      </grants>\n    </dpone_publisher_1>",
    )
    start = text.index("    <dpone_ingest_2>")
    end = text.index("    </dpone_ingest_2>\n") + len("    </dpone_ingest_2>\n")
    return text[:start] + text[end:]


def test_verify_names_every_mistake_of_the_installation(tmp_path: Path) -> None:
    for server in remote_server(tmp_path, ["ok_db"], tamper=_mistakes, identity=False):
        chhttp.query(server["http_port"], "CREATE DATABASE mem_db ENGINE = Memory")
        config = project_for(tmp_path, server, ["ok_db", "mem_db", "absent_db"])
        done = dpone("pool", "verify", "--config", str(config), "--json")
        found = json.loads(done.stdout)
        assert done.returncode == 1 and not found["ok"]
        by_code: dict[str, list[dict[str, Any]]] = {}
        for problem in found["problems"]:
            by_code.setdefault(problem["code"], []).append(problem)
        assert [p["user"] for p in by_code["principal_login_failed"]] == ["dpone_ingest_2"]
        # The installation protects ok_db only: grants are judged over it, so only
        # publisher_1's one grant more than its role differs; the other two databases
        # are named as not protected, with a render that keeps ok_db protected.
        (differ,) = by_code["principal_grants_differ"]
        assert differ["user"] == "dpone_publisher_1" and differ["extra"] == ["INSERT ON *.*"]
        unprotected = {p["database"]: p["message"] for p in by_code["database_not_protected"]}
        assert sorted(unprotected) == ["absent_db", "mem_db"]
        assert "--protect ok_db --protect mem_db" in unprotected["mem_db"]
        assert [p["database"] for p in by_code["database_not_atomic"]] == ["mem_db"]
        assert [p["database"] for p in by_code["database_missing"]] == ["absent_db"]
        assert (
            "CREATE DATABASE absent_db ENGINE = Atomic" in by_code["database_missing"][0]["message"]
        )
        (identity,) = by_code["identity_missing"]
        assert (
            identity["statement"] == "CREATE DATABASE IF NOT EXISTS _dpone_identity ENGINE = Atomic"
        )
        # The text says, per problem, what is wrong, about whom, and what fixes it.
        assert all(p["fix"] for p in found["problems"]), found["problems"]
        assert "render the pool again" in by_code["principal_login_failed"][0]["fix"]
        fixes = {p["database"]: p["fix"] for p in by_code["database_not_protected"]}
        assert "--protect ok_db --protect mem_db " in fixes["mem_db"], fixes
        text = dpone("pool", "verify", "--config", str(config)).stderr
        assert text.count("\n  fix: ") == len(found["problems"]), text
        assert "problem [principal_grants_differ] (user dpone_publisher_1): " in text, text
        assert "  extra grants: INSERT ON *.*\n" in text
        assert "problem [database_missing] (database absent_db): " in text
        assert "  fix: as the server's administrator: `CREATE DATABASE absent_db" in text


def test_a_credentials_file_others_can_read_is_refused(tmp_path: Path) -> None:
    for server in remote_server(tmp_path, ["cred_db"]):
        config = project_for(tmp_path, server, ["cred_db"])
        os.chmod(server["credentials_file"], 0o644)
        done = dpone("check", "--config", str(config), "--json")
        problems = json.loads(done.stdout)["problems"]
        assert done.returncode == 1
        assert [p["code"] for p in problems if p["key"] == "clickhouse.host"] == [
            "credentials_file_exposed"
        ]
        assert "chmod 600" in problems[-1]["message"]


def test_a_project_over_some_of_the_protected_databases_verifies(tmp_path: Path) -> None:
    for server in remote_server(tmp_path, ["one_db", "two_db"]):
        config = project_for(tmp_path, server, ["one_db"])
        done = dpone("pool", "verify", "--config", str(config), "--json")
        assert done.returncode == 0 and json.loads(done.stdout)["ok"], done.stdout


def _extra_grant(text: str) -> str:
    return text.replace(
        "<query>GRANT TABLE ENGINE ON MergeTree</query>\n      </grants>\n    </dpone_publisher_2>",
        "<query>GRANT TABLE ENGINE ON MergeTree</query>\n        <query>GRANT ALTER ON *.*"
        "</query>\n      </grants>\n    </dpone_publisher_2>",
    )


def test_every_refresh_proves_the_installation_again(tmp_path: Path) -> None:
    for server in remote_server(tmp_path, ["run_db"], tamper=_extra_grant):
        with sqlite3.connect(tmp_path / "shop.db") as conn:
            conn.execute("CREATE TABLE items (id bigint NOT NULL)")
            conn.execute("INSERT INTO items VALUES (1)")
        conn.close()
        config = project_for(tmp_path, server, ["run_db"])
        config.write_text(config.read_text() + 'order_by = "id"\n')
        done = dpone("refresh", "--all", "--config", str(config), "--json")
        table = json.loads(done.stdout)["tables"][0]
        assert done.returncode == 1 and table["phase"] == "check", table
        assert table["error"]["code"] == "principal_grants_differ", table
        assert "dpone_publisher_2" in table["error"]["message"]
        assert table["error"]["details"]["next_command"].startswith("dpone pool verify --config")
        assert table["rows"] is None and table["journal"] is None
        assert (
            chhttp.query(
                server["http_port"], "SELECT count() FROM system.tables WHERE database = 'run_db'"
            )
            == "0\n"
        )
        # A target database the installation does not protect: the render it names keeps
        # the protected one.
        other = project_for(tmp_path, server, ["new_db"])
        done = dpone("refresh", "--all", "--config", str(other), "--json")
        error = json.loads(done.stdout)["tables"][0]["error"]
        assert "--protect run_db --protect new_db" in error["message"], error


def _queries_unlogged(text: str) -> str:
    # An operator's mistake: the pool's profile stops the query log for its users.
    return text.replace("<log_queries>1</log_queries>", "<log_queries>0</log_queries>")


def test_verify_names_a_query_log_that_does_not_log_the_pool(tmp_path: Path) -> None:
    for server in remote_server(tmp_path, ["qlog_db"], tamper=_queries_unlogged):
        config = project_for(tmp_path, server, ["qlog_db"])
        done = dpone("pool", "verify", "--config", str(config), "--json")
        found = json.loads(done.stdout)
        assert done.returncode == 1 and not found["ok"]
        # The grants are exact; only the query log is wrong, for every principal.
        (problem,) = found["problems"]
        assert problem["code"] == "query_log_off", problem
        users = [p["user"] for p in found["principals"]]
        assert problem["users"] == sorted(users) and len(users) == 11
        assert problem["settings"]["dpone_closer"] == {
            "log_queries": 0,
            "probability": 1,
            "min_type": "QUERY_START",
            "min_ms": 0,
        }
        assert "system.query_log" in problem["message"] and "log_queries" in problem["fix"]
        text = dpone("pool", "verify", "--config", str(config))
        assert text.returncode == 1
        assert "problem [query_log_off] (users dpone_catalog, " in text.stderr, text.stderr
        assert f"  fix: {problem['fix']}" in text.stderr
        assert f"once fixed, run `dpone pool verify --config {config}` again" in text.stderr
        # Every refresh proves it too: refused at check, before any export.
        with sqlite3.connect(tmp_path / "shop.db") as conn:
            conn.execute("CREATE TABLE items (id bigint NOT NULL)")
        conn.close()
        config.write_text(config.read_text() + 'order_by = "id"\n')
        refused = dpone("refresh", "--all", "--config", str(config), "--json")
        table = json.loads(refused.stdout)["tables"][0]
        assert (table["phase"], table["error"]["code"]) == ("check", "query_log_off"), table


def _starts_unlogged(text: str) -> str:
    # A busy server's setting: only queries of 100 ms or more are logged, and those
    # without their QueryStart row.
    return text.replace(
        "<log_queries_min_query_duration_ms>0</log_queries_min_query_duration_ms>",
        "<log_queries_min_query_duration_ms>100</log_queries_min_query_duration_ms>",
    )


def test_verify_names_a_query_log_that_logs_no_query_start(tmp_path: Path) -> None:
    for server in remote_server(tmp_path, ["qstart_db"], tamper=_starts_unlogged):
        config = project_for(tmp_path, server, ["qstart_db"])
        done = dpone("pool", "verify", "--config", str(config), "--json")
        found = json.loads(done.stdout)
        assert done.returncode == 1 and not found["ok"]
        (problem,) = found["problems"]
        assert problem["code"] == "query_log_off", problem
        assert len(problem["users"]) == 11
        assert problem["settings"]["dpone_closer"]["min_ms"] == 100
        assert "log_queries_min_query_duration_ms" in problem["fix"]


# Another value than the profile's for each setting it pins.
_OTHER = {
    "async_insert": "1",
    "log_queries": "0",
    "log_queries_probability": "0.5",
    "log_queries_min_type": "'EXCEPTION_WHILE_PROCESSING'",
    "log_queries_min_query_duration_ms": "100",
}


def test_no_principal_can_change_what_the_proofs_read_for_its_query(tmp_path: Path) -> None:
    """Before: the profile set async_insert only and pinned nothing, so a principal's
    query with SETTINGS log_queries = 0 ran, missing from the query log (issue 37)."""
    for server in remote_server(tmp_path, ["pin_db"]):
        port = server["http_port"]
        passwords = {
            u["user"]: u["password"]
            for u in json.loads(server["credentials_file"].read_text())["users"]
        }
        assert [name for name, _ in POOL_SETTINGS] == list(_OTHER)
        for user, password in passwords.items():
            for name, value in _OTHER.items():
                for sql in (f"SELECT 1 SETTINGS {name} = {value}", f"SET {name} = {value}"):
                    refused = chhttp.post(port, sql, user=user, password=password)
                    assert refused.exception_code == "452", (user, sql, refused.text)
                    assert "SETTING_CONSTRAINT_VIOLATION" in refused.text
                    assert f"Setting {name} should not be changed" in refused.text
            # The profile's own values, which dpone's requests send, are taken.
            same = ", ".join(f"{name} = {_literal(value)}" for name, value in POOL_SETTINGS)
            taken = chhttp.post(port, f"SELECT 1 SETTINGS {same}", user=user, password=password)
            assert (taken.status, taken.text) == (200, "1\n"), taken.text
        admin = chhttp.post(port, "SELECT 1 SETTINGS log_queries = 0")  # not a pool user
        assert admin.status == 200


def _literal(value: int | str) -> str:
    return str(value) if isinstance(value, int) else f"'{value}'"


def _unpinned(text: str) -> str:
    # A pool rendered before the profile made its settings constant.
    start = text.index("      <constraints>")
    return text[:start] + text[text.index("</constraints>\n") + len("</constraints>\n") :]


def test_verify_refuses_a_profile_that_lets_the_pool_change_its_logging(tmp_path: Path) -> None:
    """Before: verify read the values only, so a profile without the constraints (an
    older render) passed, and any principal could turn its own query's logging off."""
    for server in remote_server(tmp_path, ["unpin_db"], tamper=_unpinned):
        port = server["http_port"]
        (catalog,) = [
            u["password"]
            for u in json.loads(server["credentials_file"].read_text())["users"]
            if u["user"] == "dpone_catalog"
        ]
        sneaked = chhttp.post(
            port, "SELECT 1 SETTINGS log_queries = 0", user="dpone_catalog", password=catalog
        )
        assert sneaked.status == 200  # what the constraint stops
        config = project_for(tmp_path, server, ["unpin_db"])
        done = dpone("pool", "verify", "--config", str(config), "--json")
        found = json.loads(done.stdout)
        assert done.returncode == 1 and not found["ok"]
        (problem,) = found["problems"]  # the values are right; only the constraints lack
        assert problem["code"] == "pool_settings_changeable", problem
        assert len(problem["users"]) == 11
        assert all(s == list(_OTHER) for s in problem["settings"].values()), problem
        assert "log_queries = 0" in problem["message"]
        assert "dpone pool render --protect unpin_db" in problem["fix"]
        assert "constant" in problem["fix"]
        # Every refresh proves it too: refused at check, before any export.
        with sqlite3.connect(tmp_path / "shop.db") as conn:
            conn.execute("CREATE TABLE items (id bigint NOT NULL)")
        conn.close()
        config.write_text(config.read_text() + 'order_by = "id"\n')
        refused = dpone("refresh", "--all", "--config", str(config), "--json")
        table = json.loads(refused.stdout)["tables"][0]
        assert (table["phase"], table["error"]["code"]) == ("check", "pool_settings_changeable")
