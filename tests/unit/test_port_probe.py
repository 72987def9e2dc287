"""``port_is_free``: a port held only by connections in TIME-WAIT is free to listen on.

Before: ``dpone server start --http-port N`` failed ``port_in_use`` for up to a minute
after a stop, while the stopped server's closed connections sat in TIME-WAIT
(issue 35, item 5). The probe now binds as ClickHouse does, with ``SO_REUSEADDR``.
"""

from __future__ import annotations

import socket

from dpone.localserver.probe import port_is_free


def _time_wait_port() -> int:
    """A loopback port whose listener is gone and whose server side closed first, so
    that side's connection sits in TIME-WAIT, as a stopped server's do."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = int(listener.getsockname()[1])
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = listener.accept()
    accepted.close()  # the server closes first: its end (local port `port`) waits
    client.recv(1)  # the client sees the end of stream, then closes too
    client.close()
    listener.close()
    return port


def test_a_port_in_time_wait_is_free_and_a_listening_one_is_not() -> None:
    port = _time_wait_port()
    # The kernel still holds the connection: a bind without SO_REUSEADDR is refused.
    with socket.socket() as plain:
        try:
            plain.bind(("127.0.0.1", port))
            held = False
        except OSError:
            held = True
    assert held, "the connection left no TIME-WAIT to test with"
    assert port_is_free(port) is True
    with socket.create_server(("127.0.0.1", port), reuse_port=False) as listening:
        assert listening.getsockname()[1] == port
        assert port_is_free(port) is False
    assert port_is_free(0) is True
