"""Reading raw HTTP from a socket, for the proxies that stand between a transport and
the server (one request per connection)."""

from __future__ import annotations

import socket


def read_request(sock: socket.socket) -> bytes:
    """One request from ``sock``, marked ``Connection: close``: these proxies answer one
    request per connection, so the server's answer must say so (or the transport, told
    the connection is kept, would send its next request on it)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\nConnection: close\r\n\r\n" + body


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)
