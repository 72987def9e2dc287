"""Faults a real server cannot produce, from a small socket peer written here."""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dpone.connectors.clickhouse_http import HttpTransport, resolve_ipv4_and_ipv6
from dpone.connectors.http_connections import POOL
from dpone.errors import ConfigurationError
from dpone.ports.clickhouse_errors import (
    ClickHouseServerError,
    NotSubmitted,
    OutcomeUnknown,
    TransportDeadline,
)
from dpone.ports.clickhouse_request import Credentials, Endpoint, mutation, read


class Peer:
    """Accepts one connection, reads one request, answers with scripted bytes."""

    def __init__(self, answer: bytes, *, stall: float = 0.0, reset: bool = False) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.answer = answer
        self.stall = stall
        self.reset = reset
        self.request = b""
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            conn.settimeout(10)
            data = b""
            while b"\r\n\r\n" not in data and (more := conn.recv(65536)):
                data += more
            head, _, rest = data.partition(b"\r\n\r\n")
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                ),
                0,
            )
            while len(rest) < length and (more := conn.recv(65536)):
                rest += more
            self.request = head + b"\r\n\r\n" + rest
            if self.stall:
                time.sleep(self.stall)
            with contextlib.suppress(OSError):
                conn.sendall(self.answer)
            if self.reset:
                # A zero linger makes the close a reset (RST), as a loaded native port's can be.
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    def close(self) -> None:
        # Every test connects; the peer may accept only after the client gave up.
        self.thread.join(15)
        self.listener.close()


@pytest.fixture
def peer_factory() -> Iterator[list[Peer]]:
    peers: list[Peer] = []
    yield peers
    for p in peers:
        p.close()


def run(
    peers: list[Peer],
    answer: bytes,
    *,
    stall: float = 0.0,
    deadline: float = 5.0,
    body: Path | None = None,
    reset: bool = False,
) -> Peer:
    peer = Peer(answer, stall=stall, reset=reset)
    peers.append(peer)
    t = HttpTransport(Endpoint("127.0.0.1", peer.port, 0, "db"), Credentials("u", "s3cret-pw"))
    request = (
        mutation("INSERT INTO t FORMAT RowBinary", "q-1", body=body)
        if body
        else read("SELECT 1", "q-1")
    )
    t.execute(request, deadline=time.monotonic() + deadline)
    return peer


OK_HEAD = b"HTTP/1.1 200 OK\r\nX-ClickHouse-Query-Id: q-1\r\n"


@pytest.mark.parametrize(
    ("answer", "code"),
    [
        (
            b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"a" * 70000 + b"\r\n\r\n",
            "response_metadata_budget_exceeded",
        ),
        (
            OK_HEAD + b"Content-Length: 70000\r\n\r\n" + b"x" * 70000,
            "response_body_budget_exceeded",
        ),
        (
            OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n",
            "response_bad_chunk_size",
        ),
        (OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n-1\r\n", "response_bad_chunk_size"),
        (
            OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n2;ext=1\r\nab\r\n0\r\n\r\n",
            "response_bad_chunk_size",
        ),
        (
            OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n2\r\nabXX0\r\n\r\n",
            "response_bad_chunk_terminator",
        ),
        (OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n2\r\nab\r\n", "response_truncated"),
        (
            OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\nTrailer: x\r\n",
            "response_truncated",
        ),
        (OK_HEAD + b"Content-Length: 10\r\n\r\nabc", "response_truncated"),
        (OK_HEAD + b"\r\nabc", "response_bad_framing"),
        (b"HTTP/1.1 200 OK\nContent-Length: 0\r\n\r\n", "response_bad_line_terminator"),
        (b"HTTP/2 200 OK\r\n\r\n", "response_bad_status_line"),
        (
            b"HTTP/1.1 302 Found\r\nLocation: http://elsewhere/\r\nContent-Length: 0\r\n\r\n",
            "redirect_refused",
        ),
    ],
)
def test_framing_faults_are_outcome_unknown(
    peer_factory: list[Peer], answer: bytes, code: str
) -> None:
    with pytest.raises(OutcomeUnknown) as caught:
        run(peer_factory, answer)
    assert caught.value.code == code
    assert caught.value.details["query_id"] == "q-1"
    assert "s3cret-pw" not in str(caught.value)


def test_complete_chunked_response_with_trailer_is_accepted(peer_factory: list[Peer]) -> None:
    peer = run(
        peer_factory,
        OK_HEAD
        + b'Transfer-Encoding: chunked\r\n\r\n3\r\n{"a\r\n5\r\n":1}\n\r\n0\r\nX-T: 1\r\n\r\n',
    )
    # Credentials travel only in headers, never in the request line.
    request_line = peer.request.split(b"\r\n")[0]
    assert b"s3cret-pw" not in request_line and b"X-ClickHouse-Key: s3cret-pw" in peer.request


def test_exception_code_header_on_200_is_an_error(peer_factory: list[Peer]) -> None:
    with pytest.raises(ClickHouseServerError) as caught:
        run(
            peer_factory,
            OK_HEAD
            + b"X-ClickHouse-Exception-Code: 241\r\nContent-Length: 30\r\n\r\nCode: 241. DB::Exception: oom\n",
        )
    assert caught.value.details["clickhouse_code"] == 241


def test_stalled_peer_hits_the_absolute_deadline(peer_factory: list[Peer]) -> None:
    started = time.monotonic()
    with pytest.raises(TransportDeadline) as caught:
        run(peer_factory, OK_HEAD + b"Content-Length: 0\r\n\r\n", stall=3.0, deadline=0.5)
    assert caught.value.details["submitted"] is True
    assert time.monotonic() - started < 2.0


def test_body_streams_with_count_and_hash(peer_factory: list[Peer], tmp_path: Path) -> None:
    body = tmp_path / "spool"
    body.write_bytes(bytes(range(256)) * 1000)
    peer = run(peer_factory, OK_HEAD + b"Content-Length: 0\r\n\r\n", body=body)
    assert peer.request.endswith(body.read_bytes())


def test_address_drift_and_ambiguous_endpoints_are_refused() -> None:
    answers = iter([["127.0.0.1"], ["127.0.0.2"]])
    t = HttpTransport(
        Endpoint("db.example", 8123, 9000, "db"),
        Credentials("u"),
        resolver=lambda h, p: next(answers),
    )
    with pytest.raises(NotSubmitted) as drift:
        t.execute(read("SELECT 1", "q-drift"), deadline=time.monotonic() + 5)
    assert drift.value.code == "address_drift"
    with pytest.raises(ConfigurationError) as ambiguous:
        HttpTransport(
            Endpoint("lb.example", 8123, 9000, "db"),
            Credentials("u"),
            resolver=lambda h, p: ["10.0.0.1", "10.0.0.2"],
        )
    assert ambiguous.value.code == "ambiguous_endpoint"


def test_an_address_written_out_is_not_looked_up(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    def lookup(host: str, port: int, **_: object) -> list[tuple[object, ...]]:
        asked.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.1.2.3", port))]

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    assert resolve_ipv4_and_ipv6("127.0.0.1", 8123) == ["127.0.0.1"]
    assert resolve_ipv4_and_ipv6("::1", 8123) == ["::1"]
    assert asked == []
    assert resolve_ipv4_and_ipv6("db.example", 8123) == ["10.1.2.3"]
    assert asked == ["db.example"]


def test_connect_refused_is_not_submitted() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t = HttpTransport(Endpoint("127.0.0.1", port, 0, "db"), Credentials("u"))
    with pytest.raises(NotSubmitted) as caught:
        t.execute(read("SELECT 1", "q-refused"), deadline=time.monotonic() + 5)
    assert caught.value.code == "connect_failed"


# --- only ClickHouse's own evidence makes a server error (issue 9, item 7)


@pytest.mark.parametrize(
    ("answer", "status"),
    [
        (
            b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/html\r\nContent-Length: 41\r\n\r\n"
            b"<html><h1>502 Bad Gateway</h1></html>\r\n\r\n",
            502,
        ),
        (b"HTTP/1.1 100 Continue\r\n\r\n", 100),
        (b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nnot found", 404),
        (b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\noops", 500),
    ],
)
def test_a_status_without_clickhouse_evidence_is_unknown(
    peer_factory: list[Peer], answer: bytes, status: int
) -> None:
    with pytest.raises(OutcomeUnknown) as caught:
        run(peer_factory, answer)
    assert not isinstance(caught.value, ClickHouseServerError)
    assert caught.value.code == "unexpected_status"
    assert caught.value.details["status"] == status
    assert caught.value.details["query_id"] == "q-1"


@pytest.mark.parametrize(
    ("answer", "status", "clickhouse_code"),
    [
        # The exception code header alone is ClickHouse's evidence, whatever the status.
        (
            b"HTTP/1.1 404 Not Found\r\nX-ClickHouse-Exception-Code: 60\r\nContent-Length: 0\r\n\r\n",
            404,
            60,
        ),
        # So is its exception text, when a header was lost on the way.
        (
            b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 52\r\n\r\n"
            b"Code: 62. DB::Exception: Syntax error. (SYNTAX_ERROR)",
            500,
            62,
        ),
    ],
)
def test_clickhouse_evidence_makes_a_server_error(
    peer_factory: list[Peer], answer: bytes, status: int, clickhouse_code: int
) -> None:
    with pytest.raises(ClickHouseServerError) as caught:
        run(peer_factory, answer)
    assert caught.value.details["status"] == status
    assert caught.value.details["clickhouse_code"] == clickhouse_code


# --- ports, hosts and deadlines that mean "nothing was sent" (items 13, 24)

NATIVE_PORT_ANSWER = (
    b"HTTP/1.0 400 Bad Request\r\n\r\nPort 9000 is for clickhouse-client program\r\n"
    b"You must use port 8123 for HTTP.\r\n"
)


def test_the_native_port_answer_is_named(peer_factory: list[Peer]) -> None:
    with pytest.raises(NotSubmitted) as caught:
        run(peer_factory, NATIVE_PORT_ANSWER)
    assert caught.value.code == "native_port"
    assert "native (TCP) port" in str(caught.value) and "swapped" in str(caught.value)


def test_a_reset_before_the_native_port_answer_is_read_is_unknown(
    peer_factory: list[Peer],
) -> None:
    # The answer's status line arrived, its text did not: who answered cannot be told,
    # so the outcome is unknown (typed, never the socket's own ConnectionResetError).
    with pytest.raises(OutcomeUnknown) as caught:
        run(peer_factory, b"HTTP/1.0 400 Bad Request\r\n\r\n", reset=True)
    assert caught.value.code == "response_bad_framing"
    assert "native port" in str(caught.value)


def test_a_peer_that_does_not_speak_http_gets_a_hint(peer_factory: list[Peer]) -> None:
    with pytest.raises(OutcomeUnknown) as caught:
        run(peer_factory, b"\x00\x01\x02 binary hello\r\n")
    assert caught.value.code == "response_bad_status_line"
    assert "does not speak HTTP" in str(caught.value) and "native port" in str(caught.value)


def test_an_unresolvable_host_is_named_and_not_submitted() -> None:
    def no_dns(host: str, port: int) -> list[str]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    with pytest.raises(NotSubmitted) as at_start:
        HttpTransport(
            Endpoint("db.nowhere.example", 8123, 9000, "db"), Credentials("u"), resolver=no_dns
        )
    assert at_start.value.code == "host_not_found"
    assert "'db.nowhere.example'" in str(at_start.value)
    assert at_start.value.details["host"] == "db.nowhere.example"
    assert isinstance(at_start.value.__cause__, socket.gaierror)
    answers: list[Callable[[], list[str]]] = [lambda: ["127.0.0.1"], lambda: no_dns("", 0)]
    later = HttpTransport(
        Endpoint("db.example", 8123, 9000, "db"),
        Credentials("u"),
        resolver=lambda h, p: answers.pop(0)(),
    )
    with pytest.raises(NotSubmitted) as at_request:
        later.execute(read("SELECT 1", "q-dns"), deadline=time.monotonic() + 5)
    assert at_request.value.code == "host_not_found"
    assert at_request.value.details["query_id"] == "q-dns"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_deadline_spent_before_sending_is_not_submitted() -> None:
    t = HttpTransport(Endpoint("127.0.0.1", closed_port(), 0, "db"), Credentials("u"))
    with pytest.raises(TransportDeadline) as caught:
        t.execute(
            mutation("CREATE TABLE t (a Int8) ENGINE = Memory", "q-late"),
            deadline=time.monotonic() - 1,
        )
    # Both a deadline and provably not sent: callers settle it without any probe.
    assert isinstance(caught.value, NotSubmitted)
    assert caught.value.details["submitted"] is False
    assert caught.value.code == "transport_deadline"


# --- credentials (item 8)


def test_a_utf8_user_name_travels_as_utf8(peer_factory: list[Peer]) -> None:
    peer = Peer(OK_HEAD + b"Content-Length: 0\r\n\r\n")
    peer_factory.append(peer)
    user = "Łukasz-пользователь"
    t = HttpTransport(Endpoint("127.0.0.1", peer.port, 0, "db"), Credentials(user, "pässwörd-€"))
    t.execute(read("SELECT 1", "q-1"), deadline=time.monotonic() + 5)
    assert b"\r\nX-ClickHouse-User: " + user.encode("utf-8") + b"\r\n" in peer.request
    assert b"\r\nX-ClickHouse-Key: " + "pässwörd-€".encode() + b"\r\n" in peer.request


# --- the wire-byte ceiling (publication addition c)


def test_a_body_over_its_ceiling_is_refused_before_connecting(tmp_path: Path) -> None:
    body = tmp_path / "spool"
    body.write_bytes(b"x" * 1001)
    # Nothing listens on this port: a connect attempt would be connect_failed.
    t = HttpTransport(Endpoint("127.0.0.1", closed_port(), 0, "db"), Credentials("u"))
    request = dataclasses.replace(
        mutation("INSERT INTO t FORMAT RowBinary", "q-big", body=body), max_body_bytes=1000
    )
    with pytest.raises(NotSubmitted) as caught:
        t.execute(request, deadline=time.monotonic() + 5)
    assert caught.value.code == "body_limit_exceeded"
    assert caught.value.details["size"] == 1001 and caught.value.details["limit"] == 1000


def test_the_ceiling_holds_while_the_body_streams(peer_factory: list[Peer], tmp_path: Path) -> None:
    body = tmp_path / "spool"
    body.write_bytes(b"a" * 100_000)  # under the ceiling when it is opened
    peer = Peer(OK_HEAD + b"Content-Length: 0\r\n\r\n", stall=1.0)
    peer_factory.append(peer)
    calls = 0

    def growing_clock() -> float:
        # The spool grows while it is sent (a second writer, a reused path...).
        nonlocal calls
        calls += 1
        if calls > 1:
            with body.open("ab") as more:
                more.write(b"b" * 65536)
        return time.monotonic()

    t = HttpTransport(
        Endpoint("127.0.0.1", peer.port, 0, "db"), Credentials("u"), clock=growing_clock
    )
    request = dataclasses.replace(
        mutation("INSERT INTO t FORMAT RowBinary", "q-grow", body=body), max_body_bytes=150_000
    )
    with pytest.raises(OutcomeUnknown) as caught:
        t.execute(request, deadline=time.monotonic() + 5)
    assert caught.value.code == "body_limit_exceeded"
    assert caught.value.details["limit"] == 150_000
    assert caught.value.details["sent"] <= 150_000


KEPT = (
    b"Connection: Keep-Alive\r\nKeep-Alive: timeout=10, max=9999\r\nX-ClickHouse-Query-Id: q-1\r\n"
)
OFFER = b"Connection: Keep-Alive\r\nKeep-Alive: timeout=10, max=9999\r\n"


@pytest.mark.parametrize(
    ("answer", "kept"),
    [
        (b"HTTP/1.1 200 OK\r\n" + KEPT + b"Content-Length: 2\r\n\r\n1\n", True),
        # Bytes after the framed response: what they belong to is unknown.
        (b"HTTP/1.1 200 OK\r\n" + KEPT + b"Content-Length: 2\r\n\r\n1\nHTTP/1.1", False),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n1\n", False),  # no timeout offered
        (b"HTTP/1.0 200 OK\r\n" + KEPT + b"Content-Length: 2\r\n\r\n1\n", False),
        # An answer that does not name the request's query id is not known to be its own.
        (b"HTTP/1.1 200 OK\r\n" + OFFER + b"Content-Length: 2\r\n\r\n1\n", False),
    ],
)
def test_only_an_exactly_framed_offered_response_keeps_its_connection(
    answer: bytes, kept: bool
) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    seen: dict[str, bytes | bool] = {}

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(5)
            request = b""
            while not request.endswith(b"SELECT 1"):  # the head, then the body
                request += conn.recv(65536)
            seen["request"] = request
            conn.sendall(answer)
            conn.settimeout(0.5)  # the client closes at once, or keeps the connection
            try:
                seen["client_closed"] = conn.recv(1) == b""
            except TimeoutError:
                seen["client_closed"] = False

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        port = listener.getsockname()[1]
        http = HttpTransport(Endpoint("127.0.0.1", port, 0, "db"), Credentials("u", "pw"))
        result = http.execute(read("SELECT 1", "q-1"), deadline=time.monotonic() + 5)
        assert result.output == b"1\n"
        thread.join(5)
        assert b"connection: close" not in bytes(seen["request"]).lower()
        assert seen["client_closed"] is not kept
    finally:
        POOL.close_idle()
        listener.close()


class ScriptedKeepAlivePeer:
    """Answers each request on one connection with the next scripted bytes, then waits."""

    def __init__(self, answers: list[bytes]) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.answers = answers
        self.connections = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.listener.settimeout(5)
        with contextlib.suppress(OSError):
            while self.answers:
                conn, _ = self.listener.accept()
                self.connections += 1
                with conn:
                    conn.settimeout(5)
                    while self.answers:
                        request = b""
                        while not request.endswith(b"SELECT 1"):
                            more = conn.recv(65536)
                            if not more:
                                break
                            request += more
                        if not request:
                            break
                        conn.sendall(self.answers.pop(0))

    def close(self) -> None:
        self.listener.close()
        self.thread.join(10)


def _ok(query_id: str, extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\n"
        + OFFER
        + b"X-ClickHouse-Query-Id: "
        + query_id.encode()
        + b"\r\nContent-Length: 2\r\n\r\n1\n"
        + extra
    )


def test_a_late_answer_on_a_kept_connection_is_never_taken_for_the_next() -> None:
    """The peer answers the first read, then, for the second, an answer naming the first
    (a stray or late response): it is refused as another query's, and the connection
    is not kept for a third."""
    peer = ScriptedKeepAlivePeer([_ok("q-1"), _ok("q-1"), _ok("q-3")])
    try:
        http = HttpTransport(Endpoint("127.0.0.1", peer.port, 0, "db"), Credentials("u", "pw"))
        assert http.execute(read("SELECT 1", "q-1"), deadline=time.monotonic() + 5).output == b"1\n"
        with pytest.raises(OutcomeUnknown) as stray:
            http.execute(read("SELECT 1", "q-2"), deadline=time.monotonic() + 5)
        assert stray.value.code == "query_id_mismatch"
        http.execute(read("SELECT 1", "q-3"), deadline=time.monotonic() + 5)
        assert peer.connections == 2
    finally:
        POOL.close_idle()
        peer.close()


def test_an_interim_answer_is_not_an_acknowledgment_and_closes_the_connection() -> None:
    peer = ScriptedKeepAlivePeer(
        [b"HTTP/1.1 102 Processing\r\n" + OFFER + b"\r\n" + _ok("q-1")[len(b"") :], _ok("q-2")]
    )
    try:
        http = HttpTransport(Endpoint("127.0.0.1", peer.port, 0, "db"), Credentials("u", "pw"))
        with pytest.raises(OutcomeUnknown) as interim:
            http.execute(read("SELECT 1", "q-1"), deadline=time.monotonic() + 5)
        assert interim.value.code == "unexpected_status"
        # Its final answer, still on the wire, is never read as the next request's.
        assert http.execute(read("SELECT 1", "q-2"), deadline=time.monotonic() + 5).output == b"1\n"
        assert peer.connections == 2
    finally:
        POOL.close_idle()
        peer.close()
