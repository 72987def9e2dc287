"""Connections kept between requests, on the real server, counted at the wire.

Every request goes through :class:`bench.latency_proxy.DelayProxy` without delay: a
plain TCP relay that counts the connections it accepts, so what is counted is what
reached the network, not what the transport believes it did.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from bench.latency_proxy import DelayProxy

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.connectors.http_connections import POOL, REUSE_MARGIN_SECONDS
from dpone.localserver import ServerInfo
from dpone.ports.clickhouse_errors import ClickHouseServerError, TransportDeadline
from dpone.ports.clickhouse_request import Credentials, Endpoint, mutation, read
from tests import chhttp
from tests.plugins.managed_server import TEST_DATABASE

# The managed server's keep_alive_timeout (localserver/config.py).
SERVER_KEEP_ALIVE = 2.0


@pytest.fixture
def wire(clickhouse: ServerInfo) -> Iterator[DelayProxy]:
    chhttp.query(
        clickhouse.http_port, f"CREATE DATABASE IF NOT EXISTS {TEST_DATABASE} ENGINE = Atomic"
    )
    POOL.close_idle()  # nothing kept from another test leads here anyway: a new port
    with DelayProxy(clickhouse.http_port, 0.0) as proxy:
        yield proxy
    POOL.close_idle()


def transport(proxy: DelayProxy, credentials: Credentials) -> HttpTransport:
    return HttpTransport(Endpoint("127.0.0.1", proxy.port, 0, TEST_DATABASE), credentials)


def ask(http: HttpTransport, statement: str, seconds: float = 10.0) -> list[dict[str, object]]:
    result = http.execute(
        read(f"{statement} FORMAT JSONEachRow", f"kept-{uuid.uuid4().hex}"),
        deadline=time.monotonic() + seconds,
    )
    return [json.loads(line) for line in result.output.splitlines()]


def test_reads_share_a_kept_connection_and_mutations_open_their_own(
    wire: DelayProxy, admin_credentials: Credentials, tmp_path: Path
) -> None:
    http = transport(wire, admin_credentials)
    table = f"kept_{uuid.uuid4().hex[:8]}"
    before = POOL.traffic()
    deadline = time.monotonic() + 30
    http.execute(
        mutation(f"CREATE TABLE {table} (n UInt64) ENGINE = MergeTree ORDER BY n", f"c-{table}"),
        deadline=deadline,
    )
    body = tmp_path / "rows.rb"
    body.write_bytes(b"".join(n.to_bytes(8, "little") for n in range(5)))
    sent = http.execute(
        mutation(f"INSERT INTO {table} FORMAT RowBinary", f"i-{table}", body=body),
        deadline=deadline,
    )
    assert sent.sent_bytes == 40
    assert wire.connections() == 2  # each mutation on a new connection
    # A second transport (another user's, as the pool's principals are) takes a kept one.
    other = transport(wire, admin_credentials)
    assert ask(other, f"SELECT count() AS c, sum(n) AS s FROM {table}") == [{"c": 5, "s": 10}]
    assert ask(http, "SELECT 1 AS one") == [{"one": 1}]
    assert ask(http, "SELECT 7 AS seven") == [{"seven": 7}]
    assert wire.connections() == 2
    assert POOL.traffic().since(before).to_dict() == {"requests": 5, "new_connections": 2}


def test_a_server_error_closes_its_connection(
    wire: DelayProxy, admin_credentials: Credentials
) -> None:
    http = transport(wire, admin_credentials)
    assert ask(http, "SELECT 1 AS one") == [{"one": 1}]
    with pytest.raises(ClickHouseServerError) as failed:
        ask(http, "SELECT throwIf(1) AS x")
    assert failed.value.details["clickhouse_code"] == 395
    # Only an acknowledged answer keeps its connection: the next read opens a new one.
    assert ask(http, "SELECT 2 AS two") == [{"two": 2}]
    assert wire.connections() == 2


def test_a_response_cut_by_its_deadline_closes_its_connection(
    wire: DelayProxy, admin_credentials: Credentials
) -> None:
    http = transport(wire, admin_credentials)
    assert ask(http, "SELECT 1 AS one") == [{"one": 1}]
    with pytest.raises(TransportDeadline):
        ask(http, "SELECT sleepEachRow(0.3) AS s FROM numbers(5)", seconds=0.5)
    # The half-read answer is never read as the next request's: a new connection.
    assert ask(http, "SELECT 3 AS three") == [{"three": 3}]
    assert wire.connections() == 2


def test_a_connection_near_the_servers_idle_timeout_is_not_taken(
    wire: DelayProxy, admin_credentials: Credentials
) -> None:
    http = transport(wire, admin_credentials)
    assert ask(http, "SELECT 1 AS one") == [{"one": 1}]
    time.sleep(SERVER_KEEP_ALIVE - REUSE_MARGIN_SECONDS + 0.1)
    assert ask(http, "SELECT 4 AS four") == [{"four": 4}]
    assert wire.connections() == 2


def test_a_connection_the_server_closed_is_not_taken(
    wire: DelayProxy, admin_credentials: Credentials
) -> None:
    """The server closes an idle connection at its timeout; dpone, told the timeout, takes
    it within the margin. Here the idle time is stretched past the server's timeout by
    reading the kept connection's deadline from the pool's clock: the transport must see
    the close and open a new connection, never send into the closed one."""
    http = transport(wire, admin_credentials)
    assert ask(http, "SELECT 1 AS one") == [{"one": 1}]
    original = POOL._clock
    POOL._clock = lambda: original() - 10.0  # every kept connection looks fresh
    try:
        time.sleep(SERVER_KEEP_ALIVE + 0.5)  # the server has closed it by now
        assert ask(http, "SELECT 5 AS five") == [{"five": 5}]
    finally:
        POOL._clock = original
    assert wire.connections() == 2


def test_idle_connections_close_on_request(
    wire: DelayProxy, admin_credentials: Credentials
) -> None:
    http = transport(wire, admin_credentials)
    assert ask(http, "SELECT 1 AS one") == [{"one": 1}]
    POOL.close_idle()
    assert ask(http, "SELECT 6 AS six") == [{"six": 6}]
    assert wire.connections() == 2
