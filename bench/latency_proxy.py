"""A TCP proxy that puts a network between dpone and a server on loopback.

Each direction's bytes are delivered ``round_trip / 2`` after they arrived, in order,
without holding back the next chunk (a link with latency, not a slow one), and a new
connection's first bytes wait one more round trip, what the TCP handshake costs before
a client's first byte can leave. It counts the connections it accepted, so a figure
of new connections is read at the wire, not from dpone's own count.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time

_CHUNK = 64 * 1024


class DelayProxy:
    """Forwards 127.0.0.1:``port`` to 127.0.0.1:``upstream`` through a delayed link."""

    def __init__(self, upstream: int, round_trip: float) -> None:
        self.upstream = upstream
        self.round_trip = round_trip
        self.accepted = 0
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def __enter__(self) -> DelayProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop accepting; connections already open end when their peers close them."""
        self._closed.set()
        self._server.close()

    def connections(self) -> int:
        """Connections accepted so far."""
        with self._lock:
            return self.accepted

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            with self._lock:
                self.accepted += 1
            threading.Thread(target=self._link, args=(client,), daemon=True).start()

    def _link(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(("127.0.0.1", self.upstream))
        except OSError:
            client.close()
            return
        for sock in (client, server):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        handshake = time.monotonic() + self.round_trip
        one_way = self.round_trip / 2
        threading.Thread(
            target=_pump, args=(client, server, one_way, handshake), daemon=True
        ).start()
        threading.Thread(target=_pump, args=(server, client, one_way, 0.0), daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket, delay: float, not_before: float) -> None:
    """Read ``source`` and deliver each chunk to ``sink`` ``delay`` seconds later."""
    pending: queue.Queue[tuple[float, bytes]] = queue.Queue()

    def deliver() -> None:
        while True:
            due, data = pending.get()
            wait = max(due, not_before) - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            if not data:
                with contextlib.suppress(OSError):
                    sink.shutdown(socket.SHUT_WR)
                return
            try:
                sink.sendall(data)
            except OSError:
                return

    writer = threading.Thread(target=deliver, daemon=True)
    writer.start()
    while True:
        try:
            data = source.recv(_CHUNK)
        except OSError:
            data = b""
        pending.put((time.monotonic() + delay, data))
        if not data:
            break
    writer.join()
    with contextlib.suppress(OSError):
        source.close()
    # The other pump closes its own source; a half-closed sink is closed by its owner.
