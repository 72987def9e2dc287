"""The controlled HTTP transport (standard library only).

One request per call, no retry, ever. The peer address is resolved once; a later
resolution that differs, or a connection that lands elsewhere, is refused. Redirects
are never followed. The request body streams from the spool in bounded chunks while
it is counted and hashed. Success needs a complete, bounded response with status 200
and no exception anywhere in it (ClickHouse can send one after a 200).
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import re
import socket
import time
import urllib.parse
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import BinaryIO

from dpone.connectors.clickhouse_errors import (
    ClickHouseServerError,
    NotSubmitted,
    OutcomeUnknown,
    TransportDeadline,
)
from dpone.connectors.clickhouse_file_response import (
    BODY_BUDGET,
    METADATA_BUDGET,
    BoundedResponse,
    FramingError,
    ResponseDeadline,
)
from dpone.connectors.clickhouse_request import ClickHouseRequest, Credentials, Endpoint
from dpone.connectors.clickhouse_result import QueryResult
from dpone.errors import ConfigurationError

SEND_CHUNK_BYTES = 64 * 1024
_CODE = re.compile(rb"Code: (\d+)\. ")
Resolver = Callable[[str, int], list[str]]


def resolve_ipv4_and_ipv6(host: str, port: int) -> list[str]:
    """All addresses of ``host``, sorted, via ``getaddrinfo``."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


class _BodyStream:
    """A spool reader for http.client that counts, hashes and checks the deadline."""

    def __init__(self, stream: BinaryIO, on_read: Callable[[], None]) -> None:
        self._stream = stream
        self._on_read = on_read
        self.sent = 0
        self.digest = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        self._on_read()
        chunk = self._stream.read(min(size if size > 0 else SEND_CHUNK_BYTES, SEND_CHUNK_BYTES))
        self.sent += len(chunk)
        self.digest.update(chunk)
        return chunk


class _PinnedConnection(http.client.HTTPConnection):
    """Connects to one pinned address and proves where it landed."""

    def __init__(self, address: str, port: int, host_header: str, timeout: float) -> None:
        super().__init__(address, port, timeout=timeout, blocksize=SEND_CHUNK_BYTES)
        self._pinned = address
        self._host_header = host_header

    def connect(self) -> None:
        super().connect()
        peer = self.sock.getpeername()[0]
        if peer != self._pinned:
            self.sock.close()
            raise NotSubmitted(
                f"connected to {peer}, not the pinned address {self._pinned}", code="address_drift"
            )


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
    ) -> None:
        self.endpoint = endpoint
        self._credentials = credentials
        self._resolver = resolver
        self._clock = clock
        self._metadata_budget = metadata_budget
        self._body_budget = body_budget
        addresses = resolver(endpoint.host, endpoint.http_port)
        if len(addresses) != 1:
            # dpone binds one server; several addresses mean a balancer or failover.
            raise ConfigurationError(
                f"{endpoint.host} resolves to {len(addresses)} addresses; dpone needs exactly one "
                "server (no load balancer, no failover)",
                code="ambiguous_endpoint", addresses=addresses,
            )  # fmt: skip
        self.address = addresses[0]

    def execute(self, request: ClickHouseRequest, *, deadline: float) -> QueryResult:
        """Send ``request`` once; return its complete acknowledgment or raise a typed outcome."""
        if self._clock() >= deadline:
            raise TransportDeadline(
                "deadline expired before sending", submitted=False, query_id=request.query_id
            )
        now = self._resolver(self.endpoint.host, self.endpoint.http_port)
        if now != [self.address]:
            raise NotSubmitted(
                f"{self.endpoint.host} now resolves to {now}, not the pinned {self.address}",
                code="address_drift", query_id=request.query_id,
            )  # fmt: skip
        params = {"query_id": request.query_id, "database": self.endpoint.database}
        params.update(request.all_settings(http=True))
        headers = {
            "X-ClickHouse-User": self._credentials.user,
            "Host": f"{self.endpoint.host}:{self.endpoint.http_port}",
            "Connection": "close",
        }
        password = self._credentials.password.encode("utf-8")
        if request.body is not None:
            params["query"] = request.statement
        remaining = partial(self._remaining, deadline)
        conn = _PinnedConnection(
            self.address, self.endpoint.http_port, self.endpoint.host, max(remaining(), 0.001)
        )
        conn.response_class = partial(  # type: ignore[assignment]
            BoundedResponse, remaining=remaining,
            metadata_budget=self._metadata_budget, body_budget=self._body_budget,
        )  # fmt: skip
        path = "/?" + urllib.parse.urlencode(params)
        body_stream: _BodyStream | None = None
        spool: BinaryIO | None = None
        response: BoundedResponse | None = None
        submitted = False
        try:
            try:
                try:
                    conn.connect()
                except OSError as exc:
                    raise NotSubmitted(
                        f"cannot connect to {self.endpoint.describe()}: {exc.strerror or exc}",
                        code="connect_failed", query_id=request.query_id,
                    ) from exc  # fmt: skip
                submitted = True  # from here on, bytes may reach the server
                conn.putrequest("POST", path, skip_host=True, skip_accept_encoding=True)
                for name, value in headers.items():
                    conn.putheader(name, value)
                conn.putheader("X-ClickHouse-Key", password)
                if request.body is not None:
                    spool = open(Path(request.body), "rb")  # noqa: SIM115 - closed in finally
                    size = Path(request.body).stat().st_size
                    body_stream = _BodyStream(
                        spool, partial(self._before_send, conn, deadline, request)
                    )
                    conn.putheader("Content-Length", str(size))
                    conn.endheaders()
                    while chunk := body_stream.read(SEND_CHUNK_BYTES):
                        conn.send(chunk)
                    if body_stream.sent != size:
                        raise OutcomeUnknown(
                            "spool changed size while it was sent",
                            code="spool_changed",
                            query_id=request.query_id,
                        )
                else:
                    data = request.statement.encode("utf-8")
                    conn.putheader("Content-Length", str(len(data)))
                    conn.endheaders(data)
                self._before_send(conn, deadline, request)
                raw = conn.getresponse()
                assert isinstance(raw, BoundedResponse)
                response = raw
                body = response.read_body()
            except (ResponseDeadline, TimeoutError) as exc:
                raise TransportDeadline(
                    f"deadline expired waiting for query {request.query_id}",
                    submitted=submitted, query_id=request.query_id,
                ) from exc  # fmt: skip
            except FramingError as exc:
                partial_body = bytes(response.raw_body) if response is not None else b""
                tagged = self._exception_in_body(response, partial_body, request)
                if tagged is not None:
                    raise tagged from exc
                raise OutcomeUnknown(
                    f"response to query {request.query_id} is not valid HTTP framing: {exc}",
                    code=f"response_{exc.code}", query_id=request.query_id,
                ) from exc  # fmt: skip
            except (OSError, http.client.HTTPException) as exc:
                raise OutcomeUnknown(
                    f"connection lost during query {request.query_id}: {type(exc).__name__}",
                    code="connection_lost", query_id=request.query_id,
                ) from exc  # fmt: skip
        except BaseException as exc:
            for failure in _cleanup(response, conn, spool):
                exc.add_note(f"cleanup also failed: {type(failure).__name__}: {failure}")
            raise
        # Cleanup runs before completion is recorded; if it fails there is no success.
        failures = _cleanup(response, conn, spool)
        if failures:
            raise OutcomeUnknown(
                f"cleanup after query {request.query_id} failed: {failures[0]}",
                code="cleanup_failed", query_id=request.query_id,
            ) from failures[0]  # fmt: skip
        assert response is not None
        return self._acknowledge(request, response, body, body_stream)

    def _acknowledge(
        self,
        request: ClickHouseRequest,
        response: BoundedResponse,
        body: bytes,
        body_stream: _BodyStream | None,
    ) -> QueryResult:
        tagged = self._exception_in_body(response, body, request)
        if tagged is not None:
            raise tagged
        if 300 <= response.status < 400:
            raise OutcomeUnknown(
                f"HTTP {response.status} redirect to {response.getheader('Location')!r} refused "
                f"for query {request.query_id}; the query's outcome must be proven",
                code="redirect_refused", query_id=request.query_id, status=response.status,
            )  # fmt: skip
        if response.status != 200 or response.getheader("X-ClickHouse-Exception-Code"):
            raise _server_error(
                request, response.status, body, response.getheader("X-ClickHouse-Exception-Code")
            )
        if response.getheader("X-ClickHouse-Query-Id") not in (None, request.query_id):
            raise OutcomeUnknown(
                f"response names query {response.getheader('X-ClickHouse-Query-Id')!r}, "
                f"not {request.query_id!r}",
                code="query_id_mismatch", query_id=request.query_id,
            )  # fmt: skip
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
        left = self._remaining(deadline)
        if left <= 0:
            raise ResponseDeadline(f"deadline expired while sending query {request.query_id}")
        if conn.sock is not None:
            conn.sock.settimeout(left)

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
            code="exception_after_status", query_id=request.query_id,
            clickhouse_code=error.details.get("clickhouse_code"),
        )  # fmt: skip


def _cleanup(
    response: BoundedResponse | None, conn: http.client.HTTPConnection, spool: BinaryIO | None
) -> list[OSError]:
    failures: list[OSError] = []
    for closer in (
        response.close if response else None,
        conn.close,
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
        + (f", ClickHouse code {code}" if code is not None else "") + (f": {first}" if first else ""),
        query_id=request.query_id, clickhouse_code=code, status=status,
    )  # fmt: skip
