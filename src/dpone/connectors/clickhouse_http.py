"""The controlled HTTP transport (standard library only).

One request per call, no retry, ever. The peer address is resolved once; a later
resolution that differs, or a connection that lands elsewhere, is refused. Redirects
are never followed. The request body streams from the spool in bounded chunks while
it is counted and hashed. Success needs a complete, bounded response with status 200
and no exception anywhere in it (ClickHouse can send one after a 200). A connection
whose response was framed completely is kept for the next request when the server
offers it (:mod:`dpone.connectors.http_connections`); any other is closed.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import ipaddress
import json
import os
import re
import socket
import ssl
import time
import urllib.parse
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import BinaryIO

from dpone.connectors.clickhouse_file_response import (
    BODY_BUDGET,
    METADATA_BUDGET,
    BoundedResponse,
    FramingError,
    ResponseDeadline,
)
from dpone.connectors.http_connections import (
    POOL,
    SEND_CHUNK_BYTES,
    ConnectionFactory,
    ConnectionKey,
    KeepAlive,
    PinnedConnection,
    keep_alive,
    tls_context,
)
from dpone.errors import ConfigurationError, DponeError, stop_point
from dpone.ports.clickhouse_errors import (
    ClickHouseServerError,
    DeadlineBeforeSend,
    NotSubmitted,
    OutcomeUnknown,
    TransportDeadline,
)
from dpone.ports.clickhouse_request import ClickHouseRequest, Credentials, Endpoint, RequestKind
from dpone.ports.clickhouse_result import QueryResult

_CODE = re.compile(rb"Code: (\d+)\. ")
# ClickHouse's own error text: what a proxy or another program never writes.
_CLICKHOUSE_EXCEPTION = re.compile(rb"\A\s*Code: (\d+)\. DB::Exception: ")
# What ClickHouse's native (TCP) port answers to an HTTP request.
_NATIVE_PORT_ANSWER = b"is for clickhouse-client program"
Resolver = Callable[[str, int], list[str]]


def resolve_ipv4_and_ipv6(host: str, port: int) -> list[str]:
    """All addresses of ``host``, sorted, via ``getaddrinfo`` (an address written out
    is itself, without a lookup: it is asked before every request)."""
    with contextlib.suppress(ValueError):
        return [str(ipaddress.ip_address(host))]
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


class _BodyLimit(Exception):
    """The body would exceed the request's ``max_body_bytes``."""


class _BodyStream:
    """A spool reader that counts, hashes, checks the deadline and the byte ceiling."""

    def __init__(
        self, stream: BinaryIO, on_read: Callable[[], None], limit: int | None = None
    ) -> None:
        self._stream = stream
        self._on_read = on_read
        self._limit = limit
        self.sent = 0
        self.digest = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        self._on_read()
        chunk = self._stream.read(min(size if size > 0 else SEND_CHUNK_BYTES, SEND_CHUNK_BYTES))
        # Checked before the chunk leaves: no byte over the ceiling is ever sent.
        if self._limit is not None and self.sent + len(chunk) > self._limit:
            raise _BodyLimit(f"{self.sent + len(chunk)} > {self._limit}")
        self.sent += len(chunk)
        self.digest.update(chunk)
        return chunk


class HttpTransport:
    """Executes :class:`ClickHouseRequest` objects over ClickHouse's HTTP interface."""

    name = "http"

    def __init__(
        self,
        endpoint: Endpoint,
        credentials: Credentials,
        *,
        resolver: Resolver = resolve_ipv4_and_ipv6,
        clock: Callable[[], float] = time.monotonic,
        metadata_budget: int = METADATA_BUDGET,
        body_budget: int = BODY_BUDGET,
        connection_factory: ConnectionFactory = PinnedConnection,
    ) -> None:
        """``connection_factory`` makes each request's connection (default: a
        :class:`PinnedConnection`); connections of an injected factory are never kept
        for another request, so what it makes serves only this transport's requests."""
        self.endpoint = endpoint
        self._connection_factory = connection_factory
        self._keeps = connection_factory is PinnedConnection
        self._credentials = credentials
        self._resolver = resolver
        self._clock = clock
        self._metadata_budget = metadata_budget
        self._body_budget = body_budget
        addresses = self._resolve(None)
        if len(addresses) != 1:
            # dpone binds one server; several addresses mean a balancer or failover.
            raise ConfigurationError(
                f"{endpoint.host} resolves to {len(addresses)} addresses; dpone needs exactly one "
                "server (no load balancer, no failover)",
                code="ambiguous_endpoint",
                addresses=addresses,
            )
        self.address = addresses[0]
        self._tls = tls_context(endpoint)
        # Kept connections are shared by every transport to the same place and trust.
        self._key: ConnectionKey = (
            self.address,
            endpoint.http_port,
            endpoint.host,
            endpoint.secure,
            endpoint.ca_file,
        )

    def execute(self, request: ClickHouseRequest, *, deadline: float) -> QueryResult:
        """Send ``request`` once; return its complete acknowledgment or raise a typed outcome."""
        stop_point()  # a table run in a thread stops here when its run was signalled
        if self._clock() >= deadline:
            raise DeadlineBeforeSend("deadline expired before sending", query_id=request.query_id)
        now = self._resolve(request.query_id)
        if now != [self.address]:
            raise NotSubmitted(
                f"{self.endpoint.host} now resolves to {now}, not the pinned {self.address}",
                code="address_drift",
                query_id=request.query_id,
            )
        spool, size = _open_body(request)
        remaining = partial(self._remaining, deadline)
        # A mutation, and any request in a session (the drain gate's), always goes on a
        # new connection: one that fails before its first byte left is then NotSubmitted,
        # never an unknown outcome to be proven.
        plain_read = request.kind is RequestKind.READ and not request.session_parameters()
        kept = POOL.take(self._key) if plain_read and self._keeps else None
        served = 0
        if kept is not None:
            reused, served = kept
            assert isinstance(reused, PinnedConnection)
            conn = reused
        else:
            conn = self._connection_factory(
                self.address,
                self.endpoint.http_port,
                self.endpoint.host,
                max(remaining(), 0.001),
                self._tls,
            )
        conn.response_class = partial(  # type: ignore[assignment]
            BoundedResponse,
            remaining=remaining,
            metadata_budget=self._metadata_budget,
            body_budget=self._body_budget,
        )
        exchange = _Exchange(self, request, conn, spool, deadline)
        try:
            body = exchange.run(size)
        except BaseException as exc:
            for failure in _cleanup(exchange.response, conn, spool):
                exc.add_note(f"cleanup also failed: {type(failure).__name__}: {failure}")
            raise
        # Cleanup runs before completion is recorded; if it fails there is no success. The
        # connection is kept only once this response is acknowledged as its request's.
        offer = _offer(exchange.response, request) if self._keeps else None
        failures = _cleanup(exchange.response, None if offer else conn, spool)
        try:
            if failures:
                raise OutcomeUnknown(
                    f"cleanup after query {request.query_id} failed: {failures[0]}",
                    code="cleanup_failed",
                    query_id=request.query_id,
                ) from failures[0]
            assert exchange.response is not None
            result = self._acknowledge(
                request, exchange.response, body, exchange.body_stream, kept is not None
            )
        except BaseException:
            if offer is not None:
                POOL.discard(conn)
            raise
        if offer is not None:
            POOL.give_back(self._key, conn, offer, served + 1)
        return result

    def _resolve(self, query_id: str | None) -> list[str]:
        """The host's addresses; a failed lookup means nothing was sent, host named."""
        host, port = self.endpoint.host, self.endpoint.http_port
        try:
            return self._resolver(host, port)
        except OSError as exc:  # socket.gaierror and friends
            where = {"query_id": query_id} if query_id is not None else {}
            raise NotSubmitted(
                f"cannot resolve ClickHouse host {host!r}: {exc.strerror or exc}",
                code="host_not_found",
                host=host,
                **where,
            ) from exc

    def _url(self, request: ClickHouseRequest) -> str:
        params = {"query_id": request.query_id, "database": self.endpoint.database}
        params.update(request.all_settings(http=True))
        params.update(request.session_parameters())
        if request.body is not None:
            params["query"] = request.statement
        return "/?" + urllib.parse.urlencode(params)

    def _headers(self) -> dict[str, bytes | str]:
        # UTF-8 bytes: http.client would encode text as Latin-1 (and fail beyond it);
        # ClickHouse reads both headers as UTF-8. Credentials forbid CR/LF/NUL.
        return {
            "X-ClickHouse-User": self._credentials.user.encode("utf-8"),
            "X-ClickHouse-Key": self._credentials.password.encode("utf-8"),
            "Host": f"{self.endpoint.host}:{self.endpoint.http_port}",
        }

    def _acknowledge(
        self,
        request: ClickHouseRequest,
        response: BoundedResponse,
        body: bytes,
        body_stream: _BodyStream | None,
        kept: bool = False,
    ) -> QueryResult:
        answered_for = response.getheader("X-ClickHouse-Query-Id")
        # Another query's answer is never read as this one's: the id is checked before
        # anything in the response is believed. On a kept connection a success must name
        # it (ClickHouse always does; an error before a query exists, a refused login,
        # names none, and only ever fails the request).
        unnamed = kept and answered_for is None and response.status == 200
        if answered_for not in (None, request.query_id) or unnamed:
            raise OutcomeUnknown(
                f"response names query {answered_for!r}, not {request.query_id!r}",
                code="query_id_mismatch",
                query_id=request.query_id,
            )
        tagged = self._exception_in_body(response, body, request)
        if tagged is not None:
            raise tagged
        header_code = response.getheader("X-ClickHouse-Exception-Code")
        evidence = _CLICKHOUSE_EXCEPTION.match(body)
        # Only ClickHouse's own evidence (its exception code header, its exception text)
        # makes a server answer; a proxy's 502 or an interim 1xx proves nothing.
        if header_code or (response.status != 200 and evidence is not None):
            raise _server_error(request, response.status, body, header_code)
        if 300 <= response.status < 400:
            raise OutcomeUnknown(
                f"HTTP {response.status} redirect to {response.getheader('Location')!r} refused "
                f"for query {request.query_id}; the query's outcome must be proven",
                code="redirect_refused",
                query_id=request.query_id,
                status=response.status,
            )
        if response.status != 200:
            raise OutcomeUnknown(
                f"HTTP {response.status} {response.reason} without a ClickHouse exception for "
                f"query {request.query_id} (a proxy or another program answered?); the query's "
                "outcome must be proven",
                code="unexpected_status",
                query_id=request.query_id,
                status=response.status,
            )
        summary = None
        raw_summary = response.getheader("X-ClickHouse-Summary")
        if raw_summary:
            # A hint only (never a count): an unreadable summary is simply absent.
            with contextlib.suppress(ValueError):
                summary = json.loads(raw_summary)
        return QueryResult(
            query_id=request.query_id,
            output=body,
            sent_bytes=None if body_stream is None else body_stream.sent,
            sent_sha256=None if body_stream is None else body_stream.digest.hexdigest(),
            transport=self.name,
            summary=summary,
        )

    def _remaining(self, deadline: float) -> float:
        return deadline - self._clock()

    def _before_send(
        self, conn: http.client.HTTPConnection, deadline: float, request: ClickHouseRequest
    ) -> None:
        """Before each chunk of a body, and once the request is sent: the deadline holds."""
        self._arm(conn, deadline, request)

    def _arm(
        self, conn: http.client.HTTPConnection, deadline: float, request: ClickHouseRequest
    ) -> None:
        """The socket's timeout is what is left of the deadline (refused if nothing is)."""
        left = self._remaining(deadline)
        if left <= 0:
            raise ResponseDeadline(f"deadline expired while sending query {request.query_id}")
        if conn.sock is not None:
            conn.sock.settimeout(left)

    def _framing_outcome(
        self,
        exc: FramingError,
        response: BoundedResponse | None,
        request: ClickHouseRequest,
        kept: bool = False,
    ) -> DponeError:
        tagged = self._exception_in_body(
            response, bytes(response.raw_body) if response is not None else b"", request
        )
        if tagged is not None:
            return tagged
        where = f"{self.endpoint.host}:{self.endpoint.http_port}"
        # ClickHouse's HTTP interface answers HTTP/1.1; its native port answers an HTTP
        # request with a fixed HTTP/1.0 text (no framing) and runs nothing.
        if (
            response is not None
            and response.version == 10
            and exc.code == "bad_framing"
            and _NATIVE_PORT_ANSWER in response.read_to_close()
        ):
            return NotSubmitted(
                f"port {where} is ClickHouse's native (TCP) port, not its HTTP port; "
                "nothing was run. Are the HTTP and native ports swapped?",
                code="native_port",
                query_id=request.query_id,
                port=self.endpoint.http_port,
            )
        hint = ""
        if kept and (response is None or response.status == 0):
            # It answered HTTP before: the kept connection was closed under the request.
            hint = "; the connection kept from an earlier request was closed under it"
        elif response is None or response.status == 0 or response.version != 11:
            hint = f"; port {where} does not speak HTTP as ClickHouse does: is it the native port?"
        return OutcomeUnknown(
            f"response to query {request.query_id} is not valid HTTP framing: {exc}{hint}",
            code=f"response_{exc.code}",
            query_id=request.query_id,
        )

    @staticmethod
    def _exception_in_body(
        response: BoundedResponse | None, body: bytes, request: ClickHouseRequest
    ) -> ClickHouseServerError | None:
        if response is None:
            return None
        tag = response.getheader("X-ClickHouse-Exception-Tag")
        marker = b"__exception__\r\n" + tag.encode("latin-1") + b"\r\n" if tag else b"__exception__"
        at = body.find(marker)
        if at < 0:
            return None
        message = body[at + len(marker) :].split(b"\r\n__exception__")[0]
        error = _server_error(request, response.status, message, None)
        return ClickHouseServerError(
            f"exception after HTTP {response.status}: {error.message}",
            code="exception_after_status",
            query_id=request.query_id,
            clickhouse_code=error.details.get("clickhouse_code"),
        )


class _Exchange:
    """One request on one connection; maps every low-level failure to a typed outcome."""

    def __init__(
        self,
        transport: HttpTransport,
        request: ClickHouseRequest,
        conn: PinnedConnection,
        spool: BinaryIO | None,
        deadline: float,
    ) -> None:
        self.transport = transport
        self.request = request
        self.conn = conn
        self.spool = spool
        self.deadline = deadline
        self.response: BoundedResponse | None = None
        self.body_stream: _BodyStream | None = None
        self.submitted = False
        self.kept = False  # the request went on a connection kept from an earlier one

    def run(self, size: int) -> bytes:
        request = self.request
        try:
            new_connection = self.conn.sock is None
            self.kept = not new_connection
            if new_connection:
                self._connect()
            POOL.count(new_connection=new_connection)
            if self.kept:
                # A kept connection still has its last request's timeout: this one's first
                # (a new one got it as it connected).
                self.transport._arm(self.conn, self.deadline, request)
            self._send(size)
            self.transport._before_send(self.conn, self.deadline, request)
            raw = self.conn.getresponse()
            assert isinstance(raw, BoundedResponse)
            self.response = raw
            return raw.read_body()
        except (ResponseDeadline, TimeoutError) as exc:
            raise TransportDeadline(
                f"deadline expired waiting for query {request.query_id}",
                submitted=self.submitted,
                query_id=request.query_id,
            ) from exc
        except _BodyLimit as exc:
            raise OutcomeUnknown(
                f"the body of query {request.query_id} exceeded its ceiling of "
                f"{request.max_body_bytes} bytes while it was sent; part of it left",
                code="body_limit_exceeded",
                query_id=request.query_id,
                limit=request.max_body_bytes,
                sent=self.body_stream.sent if self.body_stream else 0,
            ) from exc
        except FramingError as exc:
            raise self.transport._framing_outcome(exc, self.response, request, self.kept) from exc
        except (OSError, http.client.HTTPException) as exc:
            raise OutcomeUnknown(
                f"connection lost during query {request.query_id}: {type(exc).__name__}",
                code="connection_lost",
                query_id=request.query_id,
            ) from exc

    def _connect(self) -> None:
        request, endpoint = self.request, self.transport.endpoint
        try:
            self.conn.connect()
        except TimeoutError as exc:
            raise DeadlineBeforeSend(
                f"deadline expired while connecting to {endpoint.describe()}",
                query_id=request.query_id,
            ) from exc
        except ssl.SSLCertVerificationError as exc:
            raise NotSubmitted(
                f"the TLS certificate of {endpoint.describe()} was refused: "
                f"{exc.verify_message or exc.reason}; nothing was sent (check the CA file "
                "and that the certificate names this host and has not expired)",
                code="tls_certificate_refused",
                query_id=request.query_id,
                reason=exc.verify_message or exc.reason,
            ) from exc
        except ssl.SSLError as exc:
            raise NotSubmitted(
                f"no TLS handshake with {endpoint.describe()}: {exc.reason or exc}; nothing "
                "was sent (is the port a plain HTTP one?)",
                code="tls_handshake_failed",
                query_id=request.query_id,
                reason=exc.reason,
            ) from exc
        except OSError as exc:
            raise NotSubmitted(
                f"cannot connect to {endpoint.describe()}: {exc.strerror or exc}",
                code="connect_failed",
                query_id=request.query_id,
            ) from exc

    def _send(self, size: int) -> None:
        conn, request = self.conn, self.request
        conn.putrequest(
            "POST", self.transport._url(request), skip_host=True, skip_accept_encoding=True
        )
        for name, value in self.transport._headers().items():
            conn.putheader(name, value)
        conn.putheader("Content-Length", str(size))
        self.submitted = True  # from here on, bytes may reach the server
        if self.spool is None:
            conn.endheaders(request.statement.encode("utf-8"))
            return
        self.body_stream = _BodyStream(
            self.spool,
            partial(self.transport._before_send, conn, self.deadline, request),
            request.max_body_bytes,
        )
        conn.endheaders()
        while chunk := self.body_stream.read(SEND_CHUNK_BYTES):
            conn.send(chunk)
        if self.body_stream.sent != size:
            raise OutcomeUnknown(
                "spool changed size while it was sent",
                code="spool_changed",
                query_id=request.query_id,
            )


def _open_body(request: ClickHouseRequest) -> tuple[BinaryIO | None, int]:
    """The spool (open) and the body size; refused before connecting, so never sent."""
    if request.body is None:
        size = len(request.statement.encode("utf-8"))
        request.check_body_size(size)
        return None, size
    try:
        spool = open(Path(request.body), "rb")  # noqa: SIM115 - closed by the caller
    except OSError as exc:
        raise NotSubmitted(
            f"cannot open the body of query {request.query_id}: {exc.strerror or exc}",
            code="spool_unreadable",
            query_id=request.query_id,
            path=str(request.body),
        ) from exc
    try:
        size = os.fstat(spool.fileno()).st_size
        request.check_body_size(size)
    except BaseException:
        spool.close()
        raise
    return spool, size


def _offer(response: BoundedResponse | None, request: ClickHouseRequest) -> KeepAlive | None:
    """The server's offer to keep the connection: only after a 200 framed exactly that
    names the request's query id (never after an interim or an error answer)."""
    if response is None or response.version != 11 or not response.framed_exactly():
        return None
    if response.status != 200 or response.getheader("X-ClickHouse-Query-Id") != request.query_id:
        return None
    return keep_alive(response.getheader("Connection"), response.getheader("Keep-Alive"))


def _cleanup(
    response: BoundedResponse | None,
    conn: http.client.HTTPConnection | None,
    spool: BinaryIO | None,
) -> list[OSError]:
    """Close the response, the connection (None: it is kept) and the spool."""
    failures: list[OSError] = []
    for closer in (
        response.close if response else None,
        conn.close if conn else None,
        spool.close if spool else None,
    ):
        if closer is None:
            continue
        try:
            closer()
        except OSError as exc:
            failures.append(exc)
    return failures


def _server_error(
    request: ClickHouseRequest, status: int, body: bytes, header_code: str | None
) -> ClickHouseServerError:
    match = _CODE.search(body)
    code = (
        int(header_code)
        if header_code and header_code.isdigit()
        else (int(match.group(1)) if match else None)
    )
    text = body.decode("utf-8", errors="replace").strip()
    first = text.splitlines()[0][:400] if text else ""
    return ClickHouseServerError(
        f"query {request.query_id} failed with HTTP {status}"
        + (f", ClickHouse code {code}" if code is not None else "")
        + (f": {first}" if first else ""),
        query_id=request.query_id,
        clickhouse_code=code,
        status=status,
    )
