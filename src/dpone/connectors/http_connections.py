"""HTTP connections kept between requests, and the count of what was sent.

A connection is kept only after a response framed completely from a server that offered
``Keep-Alive: timeout=N``, taken again only well within that time and only if nothing
arrived on it while idle, and keyed by where it leads, never by user. A request is never
sent again on another connection. :class:`PinnedConnection` lands on one pinned address,
proves it and completes a verified TLS handshake (:func:`tls_context`) before any byte
of a request. See docs/transports.md ("HTTP transport").
"""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import select
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import ParamSpec, Protocol, TypeVar

from dpone.errors import ConfigurationError
from dpone.ports.clickhouse_errors import NotSubmitted
from dpone.ports.clickhouse_request import Endpoint

SEND_CHUNK_BYTES = 64 * 1024
# Taken again only this long before the server's own idle timeout ends: a request
# that leaves at the edge of it could meet the server's close on the way.
REUSE_MARGIN_SECONDS = 1.0
# Idle connections kept per destination (a refresh uses one or two at a time).
IDLE_PER_KEY = 8
_TIMEOUT = re.compile(r"(?:^|,)\s*timeout\s*=\s*(\d+)\s*(?:,|$)", re.IGNORECASE)
P = ParamSpec("P")
T = TypeVar("T")
_MAX = re.compile(r"(?:^|,)\s*max\s*=\s*(\d+)\s*(?:,|$)", re.IGNORECASE)


class _Socket(Protocol):
    def fileno(self) -> int: ...


class Reusable(Protocol):
    """What the pool needs of a connection: its socket, and a way to close it."""

    @property
    def sock(self) -> _Socket | None: ...

    def close(self) -> None: ...


ConnectionKey = tuple[str, int, str, bool, str | None]


@dataclass(frozen=True)
class KeepAlive:
    """What a response allows: keep the connection ``timeout`` seconds, ``max`` requests."""

    timeout: float
    max_requests: int | None


def keep_alive(connection_header: str | None, keep_alive_header: str | None) -> KeepAlive | None:
    """The server's offer to keep the connection, or None (close it).

    HTTP/1.1 keeps a connection unless told otherwise, but how long the server keeps it
    idle is only known from ``Keep-Alive: timeout=N``; without it the connection is not
    kept (dpone would have to guess when the server closes it).
    """
    if (connection_header or "").strip().lower() == "close" or not keep_alive_header:
        return None
    timeout = _TIMEOUT.search(keep_alive_header)
    if timeout is None:
        return None
    most = _MAX.search(keep_alive_header)
    return KeepAlive(float(timeout.group(1)), int(most.group(1)) if most else None)


@dataclass
class _Idle:
    connection: Reusable
    usable_until: float
    served: int


@dataclass
class ThreadCounter:
    """Requests sent and connections opened by one thread and those working for it."""

    requests: int = 0
    connections: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass(frozen=True)
class Traffic:
    """Requests sent and new connections opened, by this process, since it started."""

    requests: int = 0
    connections: int = 0

    def since(self, earlier: Traffic) -> Traffic:
        """What was sent after ``earlier`` was read."""
        return Traffic(self.requests - earlier.requests, self.connections - earlier.connections)

    def to_dict(self) -> dict[str, int]:
        """As reports print it."""
        return {"requests": self.requests, "new_connections": self.connections}


class ConnectionPool:
    """Idle connections of this process, taken by one request at a time (thread-safe)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._idle: dict[ConnectionKey, list[_Idle]] = {}
        self._requests = 0
        self._connections = 0
        self._mine = threading.local()  # the calling thread's own counts

    def take(self, key: ConnectionKey) -> tuple[Reusable, int] | None:
        """A live idle connection to ``key`` and how many requests it has carried."""
        while True:
            with self._lock:
                idle = self._idle.get(key)
                if not idle:
                    return None
                kept = idle.pop()  # the most recently used: the least likely to be closed
            if self._clock() < kept.usable_until and _quiet(kept.connection):
                return kept.connection, kept.served
            self.discard(kept.connection)

    def give_back(
        self, key: ConnectionKey, connection: Reusable, offer: KeepAlive, served: int
    ) -> None:
        """Keep ``connection`` (which carried ``served`` requests) as ``offer`` allows, or
        close it."""
        usable_until = self._clock() + offer.timeout - REUSE_MARGIN_SECONDS
        # ``max`` read both ways servers write it (requests left, or in all): one short.
        spent = offer.max_requests is not None and served >= offer.max_requests - 1
        if spent or usable_until <= self._clock():
            self.discard(connection)
            return
        with self._lock:
            idle = self._idle.setdefault(key, [])
            idle.append(_Idle(connection, usable_until, served))
            overflow = idle[:-IDLE_PER_KEY]
            del idle[:-IDLE_PER_KEY]
        for extra in overflow:
            self.discard(extra.connection)

    def close_idle(self) -> None:
        """Close every idle connection (before the server they lead to stops, say)."""
        with self._lock:
            kept = [item for items in self._idle.values() for item in items]
            self._idle.clear()
        for item in kept:
            self.discard(item.connection)

    @staticmethod
    def discard(connection: Reusable) -> None:
        """Close a connection that is not kept (a failed close loses nothing: it carried
        no request any more)."""
        with contextlib.suppress(OSError):
            connection.close()

    def count(self, *, new_connection: bool) -> None:
        """One request is being sent (on a new connection or a kept one)."""
        with self._lock:
            self._requests += 1
            self._connections += int(new_connection)
        counter = self.counter()
        with counter.lock:
            counter.requests += 1
            counter.connections += int(new_connection)

    def traffic(self) -> Traffic:
        """The totals so far; subtract an earlier reading for one phase's share."""
        with self._lock:
            return Traffic(self._requests, self._connections)

    def thread_traffic(self) -> Traffic:
        """The calling thread's own totals so far, with what threads working for it sent
        (:meth:`carried`): one table's share when a run's tables go in threads."""
        counter = self.counter()
        with counter.lock:
            return Traffic(counter.requests, counter.connections)

    def counter(self) -> ThreadCounter:
        """The calling thread's counter (made at its first request)."""
        counter = getattr(self._mine, "counter", None)
        if not isinstance(counter, ThreadCounter):
            counter = self._mine.counter = ThreadCounter()
        return counter

    def carried(self, fn: Callable[P, T]) -> Callable[P, T]:
        """``fn``, counted as the calling thread's when another thread runs it (a
        thread working for it: the pool's sign-ins)."""
        counter = self.counter()

        def counted(*args: P.args, **kwargs: P.kwargs) -> T:
            previous = getattr(self._mine, "counter", None)
            self._mine.counter = counter
            try:
                return fn(*args, **kwargs)
            finally:
                self._mine.counter = previous

        return counted

    def after_fork(self) -> None:
        """In a forked child: a new lock (the parent's may have been held by another
        thread at the fork) and no connection of the parent's (a child must never send
        on its parent's sockets)."""
        self._lock = threading.Lock()
        self._idle = {}
        self._mine = threading.local()


def _quiet(connection: Reusable) -> bool:
    """Nothing arrived on the idle connection: not the peer's close, not stray bytes."""
    sock = connection.sock
    if sock is None:
        return False
    pending = getattr(sock, "pending", None)  # bytes a TLS layer already decrypted
    if pending is not None and pending():
        return False
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable


class PinnedConnection(http.client.HTTPConnection):
    """Connects to one pinned address and proves where it landed; with ``tls``, then
    completes a verified TLS handshake for the endpoint's host name before any byte of
    the request is written."""

    def __init__(
        self,
        address: str,
        port: int,
        host_header: str,
        timeout: float,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(address, port, timeout=timeout, blocksize=SEND_CHUNK_BYTES)
        self._pinned = address
        self._host_header = host_header
        self._tls = tls

    def connect(self) -> None:
        super().connect()
        peer = self.sock.getpeername()[0]
        if peer != self._pinned:
            self.sock.close()
            raise NotSubmitted(
                f"connected to {peer}, not the pinned address {self._pinned}", code="address_drift"
            )
        if self._tls is not None:
            self.sock = self._tls.wrap_socket(self.sock, server_hostname=self._host_header)


ConnectionFactory = Callable[[str, int, str, float, ssl.SSLContext | None], PinnedConnection]
"""Makes the connection of one request: ``(address, port, host_header, timeout, tls)``.

The HTTP transport's default is :class:`PinnedConnection`; a test or an embedding
program injects another (a subclass that produces a fault, a proxy's) and keeps
everything else: the pinned address, the response class the transport sets on it,
the deadline and the framing rules."""


def tls_context(endpoint: Endpoint) -> ssl.SSLContext | None:
    """The verifying TLS context of a ``secure`` endpoint (None for plain HTTP).

    The server's certificate must chain to ``ca_file`` (or, without one, to the
    system's trust store) and name the endpoint's host; nothing turns that off.
    """
    if not endpoint.secure:
        return None
    try:
        context = ssl.create_default_context(cafile=endpoint.ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigurationError(
            f"cannot read the CA file {endpoint.ca_file!r} for {endpoint.describe()}: "
            f"{getattr(exc, 'strerror', None) or exc}",
            code="ca_file_unreadable",
            path=endpoint.ca_file,
        ) from exc
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


POOL = ConnectionPool()
"""The process's pool, shared by every :class:`~dpone.connectors.clickhouse_http.HttpTransport`."""
os.register_at_fork(after_in_child=POOL.after_fork)


def side_by_side(calls: Sequence[Callable[[], T]]) -> list[T]:
    """Each call's result, in the order given. Independent requests run at once (one
    round trip for them all, not one each): the first in the calling thread, the
    others in threads beside it (at most :data:`IDLE_PER_KEY` at a time), their
    traffic counted as the caller's (:meth:`ConnectionPool.carried`). Once every call
    has ended, the first error in that order is raised, the others' noted on it.

    A signal passed to the calling thread stops it at its own next request; the
    requests beside it run to their end (each bounded by its deadline)."""
    if len(calls) <= 1:
        return [call() for call in calls]
    workers = min(len(calls) - 1, IDLE_PER_KEY)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dpone-beside") as run:
        others = [run.submit(POOL.carried(call)) for call in calls[1:]]
        first: list[T] = []
        errors: list[BaseException] = []
        try:
            first.append(calls[0]())
        except BaseException as exc:
            errors.append(exc)
        for answer in others:  # each waited for to its end
            error = answer.exception()
            if error is not None:
                errors.append(error)
    if errors:
        for later in errors[1:]:
            errors[0].add_note(f"also raised beside it: {later!r:.300}")
        raise errors[0]
    return [*first, *(answer.result() for answer in others)]
