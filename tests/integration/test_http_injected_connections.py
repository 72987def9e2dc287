"""The HTTP adapter's injected connection factory, and the fault it lets a test produce
on the real server (issue 37, items 14 and 15)."""

from __future__ import annotations

import ssl
import time
import uuid
from pathlib import Path
from typing import ClassVar

import pytest

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.connectors.http_connections import POOL, PinnedConnection
from dpone.localserver import ServerInfo
from dpone.ports.clickhouse_errors import OutcomeUnknown
from dpone.ports.clickhouse_request import Credentials, Endpoint, mutation, read
from tests import chhttp
from tests.plugins.managed_server import TEST_DATABASE


class ResponseCloseFails(PinnedConnection):
    """A connection whose response cannot be closed (the socket's close fails)."""

    made: ClassVar[list[ResponseCloseFails]] = []

    def __init__(
        self, address: str, port: int, host: str, timeout: float, tls: ssl.SSLContext | None
    ) -> None:
        super().__init__(address, port, host, timeout, tls)
        type(self).made.append(self)

    def getresponse(self):  # type: ignore[no-untyped-def]
        response = super().getresponse()
        real_close = response.close

        def close() -> None:
            real_close()
            raise OSError(5, "Input/output error (simulated close)")

        response.close = close  # type: ignore[method-assign]
        return response


@pytest.fixture
def database(clickhouse: ServerInfo) -> str:
    chhttp.query(
        clickhouse.http_port, f"CREATE DATABASE IF NOT EXISTS {TEST_DATABASE} ENGINE = Atomic"
    )
    return TEST_DATABASE


def test_a_cleanup_failure_after_an_acknowledged_insert_is_an_unknown_outcome(
    clickhouse: ServerInfo, admin_credentials: Credentials, database: str, tmp_path: Path
) -> None:
    """Reversal (issue 37, item 14): with the cleanup failure no longer raised as
    ``OutcomeUnknown``, the INSERT whose response could not be closed returned a
    success, although cleanup runs before completion is recorded."""
    endpoint = Endpoint("127.0.0.1", clickhouse.http_port, clickhouse.tcp_port, database)
    table = f"injected_{uuid.uuid4().hex[:8]}"
    deadline = time.monotonic() + 30
    HttpTransport(endpoint, admin_credentials).execute(
        mutation(f"CREATE TABLE {table} (n UInt64) ENGINE = MergeTree ORDER BY n", f"c-{table}"),
        deadline=deadline,
    )
    body = tmp_path / "rows.rb"
    body.write_bytes(b"".join(n.to_bytes(8, "little") for n in range(5)))
    faulty = HttpTransport(endpoint, admin_credentials, connection_factory=ResponseCloseFails)
    ResponseCloseFails.made.clear()
    with pytest.raises(OutcomeUnknown) as caught:
        faulty.execute(
            mutation(f"INSERT INTO {table} FORMAT RowBinary", f"i-{table}", body=body),
            deadline=deadline,
        )
    assert caught.value.code == "cleanup_failed"
    assert caught.value.details["query_id"] == f"i-{table}"
    assert "simulated close" in str(caught.value.__cause__)
    assert len(ResponseCloseFails.made) == 1  # the injected factory made its connection
    # Unknown, not failed: the server did run it.
    assert chhttp.query(clickhouse.http_port, f"SELECT count() FROM {database}.{table}") == "5\n"


def test_an_injected_factorys_connections_serve_only_their_request(
    clickhouse: ServerInfo, admin_credentials: Credentials, database: str
) -> None:
    made: list[PinnedConnection] = []

    def factory(
        address: str, port: int, host: str, timeout: float, tls: ssl.SSLContext | None
    ) -> PinnedConnection:
        made.append(PinnedConnection(address, port, host, timeout, tls))
        return made[-1]

    endpoint = Endpoint("127.0.0.1", clickhouse.http_port, clickhouse.tcp_port, database)
    POOL.close_idle()
    http = HttpTransport(endpoint, admin_credentials, connection_factory=factory)
    for n in range(2):
        result = http.execute(
            read(f"SELECT {n} AS n FORMAT JSONEachRow", f"injected-read-{uuid.uuid4().hex}"),
            deadline=time.monotonic() + 10,
        )
        assert result.output == f'{{"n":{n}}}\n'.encode()
    # Each read had a connection of its own from the factory, closed after it, and
    # none went to the process's pool for another transport.
    assert len(made) == 2 and all(c.sock is None for c in made)
    assert POOL.take(http._key) is None
