"""The pool as an operator runs it over time: rendered as SQL, one principal retired,
the passwords rotated (issue 35, items 6 and 8).

The server is one dpone did not start (tests/remote_server.py), reached only through
``[clickhouse] host``, the ports and the credentials file. The engine reads users files
at start only, so an operator's install is a restart with the new file in ``users.d``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sqlite3
import stat
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from dpone.localserver.pool_file import remote_grants, remote_role, remote_users, render_pool
from dpone.publication.store import open_store
from dpone.sql import quote_literal
from tests import chhttp
from tests.plugins.cli import as_json, dpone
from tests.plugins.refresh import make_source, rows_of
from tests.remote_server import SQL_ACCESS_RUN_FILES, OperatedServer

DATABASE = "pool_ops_db"
_CREATE = re.compile(
    r"CREATE USER OR REPLACE `(\w+)` IDENTIFIED WITH sha256_hash BY '([0-9a-f]{64})' "
    r"HOST (.+) SETTINGS PROFILE '(\w+)'"
)


def project(tmp_path: Path, server: dict[str, Any], credentials: Path | None = None) -> Path:
    toml = server["clickhouse_toml"]
    if credentials is not None:
        toml = toml.replace(str(server["credentials_file"]), str(credentials))
    config = tmp_path / "dpone.toml"
    config.write_text(
        '[project]\nwork_dir = "work"\nstore = "store.sqlite"\n'
        + toml
        + '[sources.shop]\nkind = "sqlite"\npath = "shop.db"\n'
        f'[tables.items]\nsource = "shop"\ntable = "items"\ntarget = "{DATABASE}.items"\n'
        'order_by = "id"\n'
    )
    return config


def published(port: int) -> list[list[Any]]:
    found = chhttp.rows(
        port, f"SELECT id, name, toString(price) AS p FROM {DATABASE}.items ORDER BY id"
    )
    return [[int(r["id"]), r["name"], r["p"]] for r in found]


def refresh_exactly(tmp_path: Path, config: Path, port: int, count: int) -> None:
    """A refresh through the CLI publishes the source's ``count`` rows, exactly."""
    make_source(tmp_path / "shop.db", rows_of(count))
    done = dpone("refresh", "items", "--config", str(config), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert as_json(done)["tables"][0]["outcome"] == "published", done.stdout
    assert published(port) == [[i, n, p] for i, n, p in rows_of(count)]


def render(tmp_path: Path, name: str, *extra: str) -> tuple[Path, Path, dict[str, Any]]:
    out, secret = tmp_path / f"{name}.out", tmp_path / f"{name}.json"
    done = dpone(
        "pool",
        "render",
        *("--protect", DATABASE, "--out", str(out), "--credentials", str(secret)),
        *extra,
        "--json",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out, secret, as_json(done)


def passwords_of(credentials: Path) -> dict[str, str]:
    return {u["user"]: u["password"] for u in json.loads(credentials.read_text())["users"]}


def sql_as_users_file(sql: str) -> str:
    """The SQL's principals, hashes, hosts, profile and grants, as a users.d file: the
    only form in which this engine takes users (it refuses them by SQL)."""
    users: dict[str, dict[str, Any]] = {}
    profile, pinned = "", []
    for statement in (s.rstrip(";") for s in sql.splitlines() if s and not s.startswith("--")):
        if statement.startswith("CREATE SETTINGS PROFILE"):
            found = re.fullmatch(
                r"CREATE SETTINGS PROFILE OR REPLACE `(\w+)` SETTINGS (.+)", statement
            )
            assert found, statement
            profile = found.group(1)
            # Each setting made constant: a principal's query cannot change it.
            settings = [
                re.fullmatch(r"(\w+) = '?(\w+)'? CONST", s) for s in found.group(2).split(", ")
            ]
            assert all(settings), statement
            pinned = [(m.group(1), m.group(2)) for m in settings if m]
        elif (created := _CREATE.fullmatch(statement)) is not None:
            name, digest, hosts, used = created.groups()
            ips = re.findall(r"IP '([^']+)'", hosts)
            users[name] = {"hash": digest, "ips": ips, "profile": used, "grants": []}
        elif (grant := re.fullmatch(r"(GRANT .+) TO `(\w+)`", statement)) is not None:
            users[grant.group(2)]["grants"].append(grant.group(1))
        else:
            raise AssertionError(f"unexpected statement {statement!r}")
    body = "".join(
        f"<{n}><password_sha256_hex>{u['hash']}</password_sha256_hex>"
        f"<networks>{''.join(f'<ip>{ip}</ip>' for ip in u['ips'])}</networks>"
        f"<profile>{u['profile']}</profile><quota>default</quota><grants>"
        + "".join(f"<query>{g}</query>" for g in u["grants"])
        + f"</grants></{n}>"
        for n, u in users.items()
    )
    values = "".join(f"<{n}>{v}</{n}>" for n, v in pinned)
    constraints = "".join(f"<{n}><const/></{n}>" for n, _ in pinned)
    return (
        f"<clickhouse><profiles><{profile}>{values}<constraints>{constraints}</constraints>"
        f"</{profile}></profiles><users>{body}</users></clickhouse>\n"
    )


def profile_of(text: str) -> dict[str, Any]:
    """The dpone_pool profile's settings and the constant ones, as the server reads them."""
    (profile,) = ET.fromstring(text).iter("dpone_pool")
    constraints = profile.find("constraints")
    assert constraints is not None
    return {
        "values": {e.tag: e.text for e in profile if e.tag != "constraints"},
        "const": sorted(e.tag for e in constraints if e.find("const") is not None),
    }


def xml_users(text: str) -> dict[str, dict[str, Any]]:
    root = ET.fromstring(text)
    return {
        user.tag: {
            "hash": user.findtext("password_sha256_hex"),
            "ips": [ip.text for ip in user.iter("ip")],
            "profile": user.findtext("profile"),
            "grants": [q.text for q in user.iter("query")],
        }
        for user in root.find("users") or ()
    }


def test_the_sql_render_is_the_users_files_pool_and_publishes(tmp_path: Path) -> None:
    """Before: `dpone pool render` wrote the users file only (issue 35, item 8)."""
    out, secret, report = render(tmp_path, "pool-sql", "--format", "sql")
    assert report["format"] == "sql" and len(report["users"]) == 11
    for path in (out, secret):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path
    sql, passwords = out.read_text(), passwords_of(secret)
    assert all(password not in sql for password in passwords.values())
    # Exactly the users file's pool: the same principals, hashes, hosts, profile and
    # grants as the XML rendered from the same passwords.
    as_xml = xml_users(render_pool([DATABASE], passwords=passwords).users_xml)
    assert xml_users(sql_as_users_file(sql)) == as_xml
    assert profile_of(sql_as_users_file(sql)) == profile_of(
        render_pool([DATABASE], passwords=passwords).users_xml
    )
    assert list(as_xml) == list(remote_users())
    for user, entry in as_xml.items():
        assert entry["hash"] == hashlib.sha256(passwords[user].encode()).hexdigest()
        role = remote_role(user)
        assert role is not None
        assert entry["grants"] == list(remote_grants(role, [DATABASE]))
    operated = OperatedServer(tmp_path, [DATABASE])
    server = operated.start("<clickhouse/>\n", secret, SQL_ACCESS_RUN_FILES)
    try:
        port = server["http_port"]
        statements = [s.rstrip(";") for s in sql.splitlines() if not s.startswith("--")]
        assert len(statements) == 1 + 11 + sum(len(u["grants"]) for u in as_xml.values())
        for statement in statements:  # each is one the server's parser takes as it is
            assert chhttp.query(port, f"SELECT formatQuery({quote_literal(statement)})")
        # The profile makes every setting the proofs read constant, as the server parses it.
        profile = chhttp.query(port, f"SELECT formatQuery({quote_literal(statements[0])})")
        assert profile.strip() == (
            "CREATE SETTINGS PROFILE OR REPLACE `dpone_pool` SETTINGS async_insert = 0 CONST, "
            "log_queries = 1 CONST, log_queries_probability = 1 CONST, "
            "log_queries_min_type = \\'QUERY_START\\' CONST, "
            "log_queries_min_query_duration_ms = 0 CONST"
        ), profile
        # The administrator, with access management (without it the refusal is 497,
        # ACCESS_DENIED), installs it through SQL: this engine (clickhouse-local) keeps
        # users in its users files only.
        grants = chhttp.query(port, "SHOW GRANTS")
        assert "CREATE USER" in grants and "CREATE SETTINGS PROFILE" in grants
        refused = chhttp.post(port, statements[0])
        assert refused.exception_code == "514", refused.text
        assert "no writeable access storage" in refused.text
        assert "dpone_catalog" not in chhttp.query(port, "SELECT name FROM system.users")
    finally:
        operated.stop()
    # The statements installed in the form this engine takes; the pool verifies and a
    # refresh through the CLI publishes exactly, with the SQL render's credentials file.
    server = operated.start(sql_as_users_file(sql), secret)
    try:
        config = project(tmp_path, server)
        verified = dpone("pool", "verify", "--config", str(config), "--json")
        found = as_json(verified)
        assert verified.returncode == 0 and found["ok"], found
        assert [p["user"] for p in found["principals"]] == list(remote_users())
        assert all(p["authenticated"] and p["grants_exact"] for p in found["principals"])
        refresh_exactly(tmp_path, config, server["http_port"], 7)
    finally:
        operated.stop()


def _leased_users(store: Path) -> list[str]:
    with sqlite3.connect(store) as conn:
        found = [str(r[0]) for r in conn.execute('SELECT "user" FROM leases ORDER BY rowid')]
    conn.close()
    return found


def test_a_retired_principal_is_never_leased_again_and_the_pool_publishes(
    tmp_path: Path,
) -> None:
    """Before: no principal could be taken out of the pool alone (issue 35, item 6)."""
    out, secret, _ = render(tmp_path, "pool")
    operated = OperatedServer(tmp_path, [DATABASE])
    server = operated.start(out.read_text(), secret)
    try:
        config = project(tmp_path, server)
        refresh_exactly(tmp_path, config, server["http_port"], 3)
        first = _leased_users(tmp_path / "store.sqlite")
        assert {"dpone_ingest_1", "dpone_publisher_1"} <= set(first), first
        # A principal whose lease is active is not retired: its closure needs its password.
        held = open_store(tmp_path / "store.sqlite").lease("ingest", ("dpone_ingest_3",), "a1")
        refused = dpone("pool", "retire", "dpone_ingest_3", "--config", str(config), "--json")
        error = as_json(refused)["error"]
        assert (refused.returncode, error["code"]) == (1, "principal_leased"), error
        assert error["details"]["next_command"].startswith(
            f"dpone snapshot close-lease {held.lease_id} --store "
        )
        assert "dpone_ingest_3" in passwords_of(secret)
        for user in ("dpone_ingest_1", "dpone_publisher_1"):
            done = dpone("pool", "retire", user, "--config", str(config), "--json")
            assert done.returncode == 0, done.stdout + done.stderr
        retired = as_json(done)
        assert retired["retired"] == ["dpone_ingest_1", "dpone_publisher_1"]
        assert "--retired dpone_ingest_1 --retired dpone_publisher_1" in retired["next_command"]
        # A rotation from the file in use (no password changes at once), and a reminder
        # of what the command cannot know: the networks and the form rendered with.
        assert f"--rotate-from {secret}" in retired["next_command"]
        assert "--network" in retired["note"]
        entries = {u["user"]: u for u in json.loads(secret.read_text())["users"]}
        assert entries["dpone_ingest_1"] == {"user": "dpone_ingest_1", "retired": True}
        assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600
        # The server still takes its password: its write grant is an outside writer's,
        # refused before the export.
        make_source(tmp_path / "shop.db", rows_of(4))
        refused = dpone("refresh", "items", "--config", str(config), "--json")
        (report,) = as_json(refused)["tables"]
        assert (report["phase"], report["error"]["code"]) == ("check", "side_effect_present")
        assert "dpone_publisher_1" in report["error"]["message"], report
        assert published(server["http_port"]) == [[i, n, p] for i, n, p in rows_of(3)]
    finally:
        operated.stop()
    # The operator's next render leaves both out; installed, the pool publishes without them.
    out, new_secret, rendered = render(
        tmp_path, "pool-next", "--retired", "dpone_ingest_1", "--retired", "dpone_publisher_1"
    )
    assert rendered["retired"] == ["dpone_ingest_1", "dpone_publisher_1"]
    assert "dpone_ingest_1" not in out.read_text()
    server = operated.start(out.read_text(), new_secret)
    try:
        config = project(tmp_path, server, new_secret)
        verified = as_json(dpone("pool", "verify", "--config", str(config), "--json"))
        assert verified["ok"], verified
        assert [p["user"] for p in verified["principals"] if p.get("retired")] == [
            "dpone_ingest_1",
            "dpone_publisher_1",
        ]
        before = len(_leased_users(tmp_path / "store.sqlite"))
        for count in (5, 6):
            refresh_exactly(tmp_path, config, server["http_port"], count)
        later = _leased_users(tmp_path / "store.sqlite")[before:]
        assert len(later) == 4, later  # dpone_ingest_3 is held throughout
        assert not {"dpone_ingest_1", "dpone_publisher_1"} & set(later), later
    finally:
        operated.stop()


def signs_in(port: int, user: str, password: str) -> bool:
    answer = chhttp.post(port, "SELECT 1", user=user, password=password)
    assert answer.status == 200 or answer.exception_code == "516", answer.text
    return answer.status == 200


def test_a_rotation_overlaps_until_the_old_passwords_are_removed(tmp_path: Path) -> None:
    """Before: a new render changed every password at once, and a run between the install
    and the switch of credentials_file failed (issue 35, item 6)."""
    out, old_secret, _ = render(tmp_path, "pool")
    old = passwords_of(old_secret)
    operated = OperatedServer(tmp_path, [DATABASE])
    server = operated.start(out.read_text(), old_secret)
    new_out, new_secret, rotated = render(tmp_path, "pool-new", "--rotate-from", str(old_secret))
    try:
        refresh_exactly(tmp_path, project(tmp_path, server), server["http_port"], 3)
        assert rotated["rotation"] is True
        assert stat.S_IMODE(os.stat(new_secret).st_mode) == 0o600
        entries = json.loads(new_secret.read_text())["users"]
        assert {u["user"]: u["previous_password"] for u in entries} == old
        new = passwords_of(new_secret)
        assert not set(new.values()) & set(old.values())
        # Rendered, not installed: the project already names the new file, and dpone
        # signs in with the previous passwords the server still takes.
        config = project(tmp_path, server, new_secret)
        verified = as_json(dpone("pool", "verify", "--config", str(config), "--json"))
        assert verified["ok"], verified
        assert {p["password"] for p in verified["principals"]} == {"previous"}
        refresh_exactly(tmp_path, config, server["http_port"], 4)
        again = dpone(
            "pool",
            "render",
            "--protect",
            DATABASE,
            "--rotate-from",
            str(new_secret),
            "--out",
            str(tmp_path / "x.xml"),
            "--credentials",
            str(tmp_path / "x.json"),
            "--json",
        )  # from a rotation not finished: its previous passwords would be lost
        assert as_json(again)["error"]["code"] == "rotation_pending", again.stdout
        assert not (tmp_path / "x.json").exists()
        early = dpone("pool", "finish-rotation", "--config", str(config), "--json")
        assert early.returncode == 1 and as_json(early)["error"]["code"] == (
            "rotation_not_installed"
        ), early.stdout
        assert json.loads(new_secret.read_text())["users"] == entries  # unchanged
    finally:
        operated.stop()
    server = operated.start(new_out.read_text(), new_secret)  # the operator's install
    try:
        port = server["http_port"]
        assert not signs_in(port, "dpone_catalog", old["dpone_catalog"])
        assert signs_in(port, "dpone_catalog", new["dpone_catalog"])
        config = project(tmp_path, server, new_secret)
        verified = as_json(dpone("pool", "verify", "--config", str(config), "--json"))
        assert {p["password"] for p in verified["principals"]} == {"new"}, verified
        refresh_exactly(tmp_path, config, port, 5)
        sql_out = tmp_path / "remove-old.sql"
        done = dpone(
            "pool", "finish-rotation", "--config", str(config), "--sql-out", str(sql_out), "--json"
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert as_json(done)["users"] == list(remote_users())
        assert all(
            "previous_password" not in u for u in json.loads(new_secret.read_text())["users"]
        )
        assert passwords_of(new_secret) == new
        removal = [s.rstrip(";") for s in sql_out.read_text().splitlines() if s[:2] != "--"]
        assert removal == [
            f"ALTER USER `{u}` IDENTIFIED WITH sha256_hash BY "
            f"'{hashlib.sha256(new[u].encode()).hexdigest()}'"
            for u in remote_users()
        ]
        step_one = render(
            tmp_path, "pool-sql", "--rotate-from", str(new_secret), "--format", "sql"
        )[0].read_text()
        adds = [s.rstrip(";") for s in step_one.splitlines() if s[:2] != "--"]
        assert len(adds) == 11 and all(" ADD IDENTIFIED WITH sha256_hash BY '" in s for s in adds)
        for statement in (*removal, *adds):  # the server's parser takes each as it is
            assert chhttp.query(port, f"SELECT formatQuery({quote_literal(statement)})")
        refresh_exactly(tmp_path, config, port, 6)
    finally:
        operated.stop()


def test_a_users_file_takes_one_password_per_user(tmp_path: Path) -> None:
    """Why a users-file rotation cannot overlap on the server: of two password hashes
    given one user, the server takes the first and ignores the second."""
    first, second = (hashlib.sha256(p.encode()).hexdigest() for p in ("pw-one", "pw-two"))
    users = (
        f"<clickhouse><users><u2><password_sha256_hex>{first}</password_sha256_hex>"
        f"<password_sha256_hex>{second}</password_sha256_hex>"
        "<networks><ip>::/0</ip></networks><profile>default</profile>"
        "<quota>default</quota></u2></users></clickhouse>\n"
    )
    operated = OperatedServer(tmp_path, [DATABASE])
    server = operated.start(users, tmp_path / "unused.json")
    try:
        assert signs_in(server["http_port"], "u2", "pw-one")
        assert not signs_in(server["http_port"], "u2", "pw-two")
    finally:
        operated.stop()
