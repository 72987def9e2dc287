"""A remote server over TLS, as a user reaches one: through a real TLS terminator.

The server is one dpone did not start (tests/remote_server.py); Debian's stunnel4
terminates TLS in front of its HTTP and native ports (tests/tls_terminator.py) with a
certificate of a test CA. The project names it with ``secure = true`` and the CA file.
A wrong CA, an expired certificate and a plain-HTTP port are each refused before any
work, by name; nothing turns verification off.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import chhttp
from tests.plugins.cli import as_json, dpone
from tests.plugins.refresh import make_source, rows_of, target_rows
from tests.remote_server import remote_server
from tests.tls_terminator import Terminator, tls_terminator

DATABASE = "refresh_db"  # target_rows reads this database


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, Any], Terminator]]:
    root = tmp_path_factory.mktemp("remote-tls")
    for server in remote_server(root, [DATABASE]):
        with tls_terminator(root / "tls", server["http_port"], server["tcp_port"]) as tls:
            yield server, tls


def tls_project(
    tmp_path: Path,
    served: tuple[dict[str, Any], Terminator],
    target: str,
    *,
    http_port: int | None = None,
    tcp_port: int | None = None,
    ca_file: Path | None = None,
    transport: str = "http",
    secure: bool = True,
) -> Path:
    server, tls = served
    config = tmp_path / "dpone.toml"
    config.write_text(
        '[project]\nwork_dir = "work"\nstore = "store.sqlite"\n'
        "[clickhouse]\n"
        f'host = "127.0.0.1"\nsecure = {str(secure).lower()}\n'
        f"http_port = {http_port or tls.ports['https']}\n"
        f"tcp_port = {tcp_port or tls.ports['native']}\n"
        + (f'ca_file = "{ca_file or tls.ca_file}"\n' if secure else "")
        + f'credentials_file = "{server["credentials_file"]}"\n'
        'trusted_writers = ["dpone_admin"]\n'
        f'transport = "{transport}"\n'
        # The client transport stages without a drain gate: accepted for these tests.
        + ("[publication]\naccept_ungated_ingest = true\n" if transport == "client" else "")
        + '[sources.shop]\nkind = "sqlite"\npath = "shop.db"\n'
        f'[tables.items]\nsource = "shop"\ntable = "items"\ntarget = "{DATABASE}.{target}"\n'
        'order_by = "id"\n'
    )
    return config


def run(config: Path, *args: str) -> tuple[int, dict[str, Any]]:
    done = dpone(*args, "--config", str(config), "--json")
    return done.returncode, as_json(done)


def test_refresh_status_and_rollback_over_https(
    tmp_path: Path, served: tuple[dict[str, Any], Terminator]
) -> None:
    server, _ = served
    make_source(tmp_path / "shop.db", rows_of(12))
    config = tls_project(tmp_path, served, "t_tls")
    code, verified = run(config, "pool", "verify")
    assert code == 0 and verified["ok"], verified
    assert verified["server"].startswith("https://127.0.0.1:")
    code, first = run(config, "refresh", "--all")
    assert code == 0 and first["tables"][0]["outcome"] == "published", first
    with sqlite3.connect(tmp_path / "shop.db") as conn:
        conn.execute("DELETE FROM items WHERE id > 10")
    conn.close()
    code, second = run(config, "refresh", "--all")
    assert code == 0 and second["tables"][0]["rows"] == 10, second
    # Read back on the plain port by the test's own client: the values, not a count.
    expected = [[i, f"n{i}\ttab", f"{i}.25"] for i in range(1, 11)]
    assert target_rows(server["http_port"], "t_tls") == expected
    code, status = run(config, "status")
    assert code == 0 and status["server_running"] is True, status
    assert status["targets"][0]["last_publication"]["rows"] == 10
    code, undone = run(config, "rollback", "items")
    assert code == 0 and undone["outcome"] == "published", undone
    assert [r[0] for r in target_rows(server["http_port"], "t_tls")] == list(range(1, 13))


def test_a_certificate_for_another_host_is_refused_by_both_transports(
    tmp_path: Path, served: tuple[dict[str, Any], Terminator], clickhouse_client: str
) -> None:
    server, tls = served
    make_source(tmp_path / "shop.db", rows_of(4))
    http = tls_project(tmp_path, served, "t_other_http", http_port=tls.ports["https_other_host"])
    code, refused = run(http, "refresh", "--all")
    assert code == 1 and refused["tables"][0]["error"]["code"] == "tls_certificate_refused"
    assert "mismatch" in refused["tables"][0]["error"]["message"], refused
    # The client transport: HTTP reaches the right certificate, the native port another
    # host's; the stage must refuse it (the certificate's name is checked, not only its CA).
    client = tls_project(
        tmp_path,
        served,
        "t_other_client",
        transport="client",
        tcp_port=tls.ports["native_other_host"],
    )
    code, report = run(client, "refresh", "--all")
    table = report["tables"][0]
    assert code == 1 and table["outcome"] != "published", report
    assert table["phase"] == "stage" and "127.0.0.1" in table["error"]["message"], table
    assert (
        chhttp.query(
            server["http_port"],
            f"SELECT count() FROM system.tables WHERE database = '{DATABASE}' "
            "AND name IN ('t_other_http', 't_other_client')",
        )
        == "0\n"
    )


def test_the_client_transport_speaks_tls_to_the_native_port(
    tmp_path: Path, served: tuple[dict[str, Any], Terminator], clickhouse_client: str
) -> None:
    server, _ = served
    make_source(tmp_path / "shop.db", rows_of(7, name="c"))
    config = tls_project(tmp_path, served, "t_tls_client", transport="client")
    code, report = run(config, "refresh", "--all")
    assert code == 0 and report["tables"][0]["outcome"] == "published", report
    assert [r[1] for r in target_rows(server["http_port"], "t_tls_client")] == [
        f"c{i}\ttab" for i in range(1, 8)
    ]


@pytest.mark.parametrize(
    ("case", "code", "words"),
    [
        ("wrong_ca", "tls_certificate_refused", "unable to get local issuer certificate"),
        ("expired", "tls_certificate_refused", "expired"),
        ("plain_port", "tls_handshake_failed", "plain HTTP"),
    ],
)
def test_an_untrusted_or_plain_endpoint_is_refused_before_any_work(
    tmp_path: Path,
    served: tuple[dict[str, Any], Terminator],
    case: str,
    code: str,
    words: str,
) -> None:
    server, tls = served
    make_source(tmp_path / "shop.db", rows_of(3))
    choices: dict[str, dict[str, Any]] = {
        "wrong_ca": {"ca_file": tls.wrong_ca_file},
        "expired": {"http_port": tls.ports["https_expired"]},
        "plain_port": {"http_port": server["http_port"]},
    }
    options = choices[case]
    config = tls_project(tmp_path, served, f"t_refused_{case}", **options)
    exit_code, checked = run(config, "check")
    assert exit_code == 1
    (problem,) = checked["problems"]
    assert problem["code"] == code and words in problem["message"], problem
    exit_code, refused = run(config, "refresh", "--all")
    table = refused["tables"][0]
    assert exit_code == 1 and table["phase"] == "check", refused
    assert table["error"]["code"] == code, table
    # Nothing was exported, staged or created.
    assert not (tmp_path / "work" / "attempts").exists() or not any(
        (tmp_path / "work" / "attempts").iterdir()
    )
    assert (
        chhttp.query(
            server["http_port"],
            f"SELECT count() FROM system.tables WHERE database = '{DATABASE}' "
            f"AND name = 't_refused_{case}'",
        )
        == "0\n"
    )


def test_plain_http_to_the_tls_port_is_named_once_by_check_refresh_and_status(
    tmp_path: Path, served: tuple[dict[str, Any], Terminator]
) -> None:
    """Before: 11 principal_login_failed with a fix about passwords (issue 35, item 3)."""
    server, tls = served
    make_source(tmp_path / "shop.db", rows_of(3))
    config = tls_project(tmp_path, served, "t_plain_to_tls", secure=False)
    exit_code, checked = run(config, "check")
    assert exit_code == 1
    (problem,) = checked["problems"]
    assert problem["code"] == "plain_http_to_tls_port", problem
    assert f"127.0.0.1:{tls.ports['https']} speaks TLS" in problem["message"], problem
    assert "secure = true" in problem["fix"], problem
    exit_code, refused = run(config, "refresh", "--all")
    table = refused["tables"][0]
    assert exit_code == 1 and table["phase"] == "check", refused
    assert table["error"]["code"] == "plain_http_to_tls_port", table
    exit_code, status = run(config, "status")
    assert (exit_code, status["ok"]) == (3, False), status
    why = status["server_unreachable"]
    assert (why["code"], why["reason"]) == ("plain_http_to_tls_port", "plain HTTP to a TLS port")
    assert "secure = true" in why["fix"], why
    assert (
        chhttp.query(
            server["http_port"],
            f"SELECT count() FROM system.tables WHERE database = '{DATABASE}' "
            "AND name = 't_plain_to_tls'",
        )
        == "0\n"
    )
