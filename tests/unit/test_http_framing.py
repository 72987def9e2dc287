"""Faults a real server cannot produce, from a small socket peer written here."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dpone.connectors.clickhouse_errors import (
    ClickHouseServerError,
    NotSubmitted,
    OutcomeUnknown,
    TransportDeadline,
)
from dpone.connectors.clickhouse_http import HttpTransport
from dpone.connectors.clickhouse_request import Credentials, Endpoint, mutation, read
from dpone.errors import ConfigurationError


class Peer:
    """Accepts one connection, reads one request, answers with scripted bytes."""

    def __init__(self, answer: bytes, *, stall: float = 0.0) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.answer = answer
        self.stall = stall
        self.request = b""
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            conn.settimeout(10)
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, rest = data.partition(b"\r\n\r\n")
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                ),
                0,
            )
            while len(rest) < length:
                rest += conn.recv(65536)
            self.request = head + b"\r\n\r\n" + rest
            if self.stall:
                time.sleep(self.stall)
            with contextlib.suppress(OSError):
                conn.sendall(self.answer)

    def close(self) -> None:
        self.listener.close()
        self.thread.join(15)


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
) -> Peer:
    peer = Peer(answer, stall=stall)
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


def test_connect_refused_is_not_submitted() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t = HttpTransport(Endpoint("127.0.0.1", port, 0, "db"), Credentials("u"))
    with pytest.raises(NotSubmitted) as caught:
        t.execute(read("SELECT 1", "q-refused"), deadline=time.monotonic() + 5)
    assert caught.value.code == "connect_failed"
