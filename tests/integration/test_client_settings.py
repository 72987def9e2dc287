"""Pinned settings an old ``clickhouse-client`` cannot send are never dropped on a mutation.

Debian's clickhouse-client 18.16 does not know ``async_insert``. The managed server pins
it to 0 in every profile, so there a mutation runs as pinned; a server that does not pin
it (recent servers default to 1) must see nothing: the transport refuses before sending.
Real client, real servers.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from dpone.connectors.clickhouse_client import ClientTransport
from dpone.connectors.clickhouse_http import HttpTransport
from dpone.localserver import LocalServer, ServerInfo, admin_credentials
from dpone.localserver.config import ServerUser, render_users_xml
from dpone.ports.clickhouse_errors import NotSubmitted
from dpone.ports.clickhouse_request import Endpoint, mutation, read
from tests import chhttp

pytestmark = pytest.mark.clickhouse_client
DB = "client_settings_db"
PINNED = "<async_insert>0</async_insert>"


@pytest.fixture(scope="module")
def unpinned(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerInfo]:
    """A real server whose profiles leave ``async_insert`` to the server's default (1)."""

    def without_pin(users: Sequence[ServerUser]) -> str:
        users_xml = render_users_xml(users)
        assert PINNED in users_xml
        return users_xml.replace(PINNED, "")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("dpone.localserver.server.render_users_xml", without_pin)
        server = LocalServer(tmp_path_factory.mktemp("unpinned"))
        info = server.start()
    try:
        chhttp.register_server(info.http_port, info.data_dir)
        yield info
    finally:
        server.stop()


def setup_table(info: ServerInfo) -> str:
    chhttp.query(info.http_port, f"CREATE DATABASE IF NOT EXISTS {DB} ENGINE = Atomic")
    table = f"{DB}.t_{time.time_ns()}"
    chhttp.query(info.http_port, f"CREATE TABLE {table} (id Int32) ENGINE = MergeTree ORDER BY id")
    return table


def client(info: ServerInfo, path: str) -> ClientTransport:
    endpoint = Endpoint("127.0.0.1", info.http_port, info.tcp_port, DB)
    return ClientTransport(endpoint, admin_credentials(info.data_dir), client_path=path)


def spool(tmp_path: Path, rows: int) -> Path:
    path = tmp_path / "spool.rowbinary"
    path.write_bytes(b"".join(i.to_bytes(4, "little", signed=True) for i in range(rows)))
    return path


def logged(info: ServerInfo, query_id: str) -> list[dict[str, object]]:
    chhttp.query(info.http_port, "SYSTEM FLUSH LOGS")
    return chhttp.rows(
        info.http_port,
        "SELECT query_kind, Settings['async_insert'] AS async_insert FROM system.query_log "
        f"WHERE query_id = '{query_id}' AND type = 'QueryFinish'",
    )


def test_the_server_default_is_what_the_refusal_guards_against(unpinned: ServerInfo) -> None:
    """The unpinned server really would run an unpinned insert asynchronously."""
    [row] = chhttp.rows(
        unpinned.http_port, "SELECT value FROM system.settings WHERE name = 'async_insert'"
    )
    assert row == {"value": "1"}


def test_an_insert_the_server_would_not_pin_is_refused_before_sending(
    unpinned: ServerInfo, clickhouse_client: str, tmp_path: Path
) -> None:
    table = setup_table(unpinned)
    qid = f"dpone-test-unpinned-{time.time_ns()}-insert"
    insert = mutation(f"INSERT INTO {table} FORMAT RowBinary", qid, body=spool(tmp_path, 100))
    with pytest.raises(NotSubmitted) as caught:
        client(unpinned, clickhouse_client).execute(insert, deadline=time.monotonic() + 60)
    error = caught.value
    assert error.code == "pinned_settings_not_sent"
    assert dict(error.details["settings"]) == {"async_insert": "0"}
    assert dict(error.details["observed"]) == {"async_insert": "1"}
    assert error.details["client_version"] == "18.16"
    assert error.details["query_id"] == qid
    assert "clickhouse-client 18.16" in error.message and "async_insert=0" in error.message
    assert chhttp.query(unpinned.http_port, f"SELECT count() FROM {table}") == "0\n"
    assert logged(unpinned, qid) == []  # the INSERT never reached the server
    # The proof ran (its query log lists changed settings only: async_insert was not).
    assert logged(unpinned, f"{qid}-settings") == [{"query_kind": "Select", "async_insert": ""}]


def test_reads_and_the_http_transport_are_not_affected(
    unpinned: ServerInfo, clickhouse_client: str, tmp_path: Path
) -> None:
    """Only a mutation needs the pin: a read runs, and HTTP sends the setting itself."""
    table = setup_table(unpinned)
    answer = client(unpinned, clickhouse_client).execute(
        read("SELECT 1 AS one FORMAT JSONEachRow", f"dpone-test-unpinned-read-{time.time_ns()}"),
        deadline=time.monotonic() + 60,
    )
    assert answer.json_rows() == [{"one": 1}]
    assert answer.settings_not_sent == ("async_insert",)
    endpoint = Endpoint("127.0.0.1", unpinned.http_port, unpinned.tcp_port, DB)
    qid = f"dpone-test-unpinned-http-{time.time_ns()}-insert"
    HttpTransport(endpoint, admin_credentials(unpinned.data_dir)).execute(
        mutation(f"INSERT INTO {table} FORMAT RowBinary", qid, body=spool(tmp_path, 100)),
        deadline=time.monotonic() + 60,
    )
    assert logged(unpinned, qid) == [{"query_kind": "Insert", "async_insert": "0"}]


def test_where_the_profile_pins_it_the_insert_runs_as_pinned(
    clickhouse: ServerInfo, clickhouse_client: str, tmp_path: Path
) -> None:
    table = setup_table(clickhouse)
    qid = f"dpone-test-pinned-{time.time_ns()}-insert"
    result = client(clickhouse, clickhouse_client).execute(
        mutation(f"INSERT INTO {table} FORMAT RowBinary", qid, body=spool(tmp_path, 100)),
        deadline=time.monotonic() + 60,
    )
    assert result.settings_not_sent == ("async_insert",)
    assert chhttp.query(clickhouse.http_port, f"SELECT count() FROM {table}") == "100\n"
    # Proven first (the profile's value), then run with that value.
    assert logged(clickhouse, f"{qid}-settings") == [{"query_kind": "Select", "async_insert": "0"}]
    assert logged(clickhouse, qid) == [{"query_kind": "Insert", "async_insert": "0"}]
