"""What ``--transport client`` says when it is pointed at the wrong port."""

from __future__ import annotations

import time

import pytest

from dpone.connectors.clickhouse_client import ClientTransport
from dpone.connectors.clickhouse_errors import NotSubmitted, OutcomeUnknown
from dpone.connectors.clickhouse_request import Credentials, Endpoint, read
from dpone.localserver import ServerInfo


def test_the_http_port_as_native_port_is_named(
    clickhouse: ServerInfo, admin_credentials: Credentials, clickhouse_client: str
) -> None:
    """Item 24: swapped ports name the likely cause, not only "Attempt to read after eof"."""
    swapped = Endpoint("127.0.0.1", clickhouse.tcp_port, clickhouse.http_port, "default")
    transport = ClientTransport(swapped, admin_credentials, client_path=clickhouse_client)
    with pytest.raises((OutcomeUnknown, NotSubmitted)) as caught:
        transport.execute(read("SELECT 1", f"dpone-test-swap-{time.time_ns()}"),
                          deadline=time.monotonic() + 60)  # fmt: skip
    message = caught.value.message
    assert f"127.0.0.1:{clickhouse.http_port}" in message
    assert "native port (often 9000) as --tcp-port" in message
    assert caught.value.code in ("not_native_port", "client_failed")
