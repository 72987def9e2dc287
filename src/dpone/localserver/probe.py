"""Small standard-library probes used to decide readiness and port availability."""

from __future__ import annotations

import errno
import http.client
import socket

LOOPBACK = "127.0.0.1"


def port_is_free(port: int, host: str = LOOPBACK) -> bool:
    """True when a server can listen on ``port`` on ``host`` now (0 is always free).

    Bound as ClickHouse binds its listening sockets, with ``SO_REUSEADDR``: the
    connections of a server that just stopped (in TIME-WAIT for up to a minute) do not
    keep the port, only a socket still bound or listening there does.
    """
    if port == 0:
        return True
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
            raise
    return True


def accepts_connections(port: int, host: str = LOOPBACK, timeout: float = 0.5) -> bool:
    """True when a TCP connection to ``host:port`` is accepted."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def http_ping(port: int, host: str = LOOPBACK, timeout: float = 1.0) -> bool:
    """True when ClickHouse's ``/ping`` answers exactly ``Ok.``."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", "/ping")
        response = conn.getresponse()
        body = response.read(64)
        return response.status == 200 and body == b"Ok.\n"
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()
