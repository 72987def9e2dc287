"""Whether a port speaks TLS: to name plain HTTP sent to a server's HTTPS port.

With ``secure = false`` pointed at a TLS port, every request is cut without an HTTP
answer (the server reads ``POST`` as a broken handshake), which on its own looks like a
lost connection or, to a sign-in, like a refused password. After such a failure this
probe tries one TLS handshake with the same verifying context a secure endpoint uses:
a handshake that completes, or a certificate that is presented and refused, shows a
TLS server. Nothing is sent after the handshake; no credential is ever sent.
"""

from __future__ import annotations

import dataclasses
import socket
import ssl
from typing import Any

from dpone.connectors.http_connections import tls_context
from dpone.errors import DponeError
from dpone.ports.clickhouse_errors import ClickHouseServerError, NotSubmitted
from dpone.ports.clickhouse_request import Endpoint

PROBE_SECONDS = 2.0
PLAIN_TO_TLS = "plain_http_to_tls_port"
TLS_PORT_FIX = (
    "set secure = true in [clickhouse] (the port is the server's HTTPS one; give ca_file "
    "when its certificate is not signed by a CA of the system's trust store), or point "
    "http_port at the server's plain HTTP port"
)


def speaks_tls(endpoint: Endpoint, timeout: float = PROBE_SECONDS) -> bool:
    """Whether ``endpoint``'s HTTP port answers a TLS handshake (False when unsure)."""
    try:
        context = tls_context(dataclasses.replace(endpoint, secure=True))
        assert context is not None
        with (
            socket.create_connection((endpoint.host, endpoint.http_port), timeout) as raw,
            context.wrap_socket(raw, server_hostname=endpoint.host),
        ):
            return True
    except ssl.SSLCertVerificationError:
        return True  # it presented a certificate: a TLS server, whatever its CA
    except (OSError, DponeError):  # ssl.SSLError is an OSError
        return False


def plain_http_to_tls(endpoint: Endpoint, failure: DponeError) -> dict[str, Any] | None:
    """``{"code", "message"}`` naming plain HTTP sent to a TLS port, when ``failure``
    (a request over ``endpoint`` that got no HTTP answer) is that; else None."""
    if endpoint.secure or isinstance(failure, ClickHouseServerError):
        return None  # TLS was spoken, or ClickHouse itself answered over HTTP
    if isinstance(failure, NotSubmitted) or not speaks_tls(endpoint):
        return None  # nothing listens, or the request never left: not a TLS port's doing
    return {
        "code": PLAIN_TO_TLS,
        "message": f"{endpoint.host}:{endpoint.http_port} speaks TLS, but [clickhouse] "
        f"secure = false sends plain HTTP to it; the server cut the request "
        f"({failure.code}) before any HTTP answer",
    }
