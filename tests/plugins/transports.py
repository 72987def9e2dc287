"""The controlled transports (HTTP and ``clickhouse-client``) on the session's server,
their deadline, and a fake client binary."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from dpone.connectors.clickhouse_client import ClientTransport
from dpone.connectors.clickhouse_http import HttpTransport
from dpone.localserver import ServerInfo, admin_credentials
from dpone.ports.clickhouse_request import (
    Credentials,
    Endpoint,
)

DB = "transport_db"


def soon(seconds: float = 30.0) -> float:
    return time.monotonic() + seconds


def make_transport(
    kind: str,
    info: ServerInfo,
    *,
    user: str | None = None,
    password: str = "",
    database: str = DB,
    **kwargs: Any,
) -> HttpTransport | ClientTransport:
    """A transport as ``user``, by default the server's administrator."""
    endpoint = Endpoint("127.0.0.1", info.http_port, info.tcp_port, database)
    credentials = admin_credentials(info.data_dir) if user is None else Credentials(user, password)
    if kind == "http":
        return HttpTransport(endpoint, credentials, **kwargs)
    return ClientTransport(endpoint, credentials, **kwargs)


def fake_client(tmp_path: Path, body: str) -> str:
    script = tmp_path / "fake-client"
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(0o755)
    return str(script)
