"""When a connection is kept, and when it is taken again: the pool's policy alone."""

from __future__ import annotations

import functools
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from dpone.connectors.http_connections import (
    IDLE_PER_KEY,
    POOL,
    REUSE_MARGIN_SECONDS,
    ConnectionKey,
    ConnectionPool,
    KeepAlive,
    keep_alive,
    side_by_side,
)

KEY: ConnectionKey = ("127.0.0.1", 8123, "localhost", False, None)


@pytest.mark.parametrize(
    ("connection", "header", "offer"),
    [
        ("Keep-Alive", "timeout=2, max=9999", KeepAlive(2.0, 9999)),
        (None, "timeout=10", KeepAlive(10.0, None)),
        ("keep-alive", "max=5, timeout=30", KeepAlive(30.0, 5)),
        ("Close", "timeout=2, max=9999", None),  # the server will close it
        ("Keep-Alive", None, None),  # how long it stays open is unknown
        ("Keep-Alive", "max=100", None),
        ("Keep-Alive", "timeout=soon", None),
        ("Keep-Alive", "xtimeout=5", None),
    ],
)
def test_the_servers_offer(connection: str | None, header: str | None, offer: object) -> None:
    assert keep_alive(connection, header) == offer


OPENED: list[FakeConnection] = []


class FakeConnection:
    """A socket pair's one end: ``peer`` can close it or write into it."""

    def __init__(self) -> None:
        self.sock, self.peer = socket.socketpair()
        self.closed = False
        OPENED.append(self)

    def close(self) -> None:
        self.closed = True
        self.sock.close()
        self.peer.close()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def pool(clock: Clock) -> Iterator[ConnectionPool]:
    made = ConnectionPool(clock)
    yield made
    made.close_idle()
    while OPENED:
        opened = OPENED.pop()
        opened.sock.close()
        opened.peer.close()


def test_taken_within_the_offer_less_the_margin(pool: ConnectionPool, clock: Clock) -> None:
    conn = FakeConnection()
    pool.give_back(KEY, conn, KeepAlive(3.0, None), 1)
    clock.now += 3.0 - REUSE_MARGIN_SECONDS - 0.01
    assert pool.take(KEY) == (conn, 1)
    pool.give_back(KEY, conn, KeepAlive(3.0, None), 2)
    clock.now += 3.0 - REUSE_MARGIN_SECONDS
    assert pool.take(KEY) is None
    assert conn.closed


def test_an_offer_shorter_than_the_margin_is_declined(pool: ConnectionPool) -> None:
    conn = FakeConnection()
    pool.give_back(KEY, conn, KeepAlive(REUSE_MARGIN_SECONDS, None), 1)
    assert conn.closed and pool.take(KEY) is None


def test_the_servers_request_limit_is_kept_with_one_to_spare(pool: ConnectionPool) -> None:
    conn = FakeConnection()
    pool.give_back(KEY, conn, KeepAlive(10.0, 5), 3)
    assert pool.take(KEY) == (conn, 3)
    pool.give_back(KEY, conn, KeepAlive(10.0, 5), 4)
    assert conn.closed and pool.take(KEY) is None


def test_a_closed_or_talking_peer_is_never_taken(pool: ConnectionPool) -> None:
    closed, talking, good = FakeConnection(), FakeConnection(), FakeConnection()
    for conn in (good, closed, talking):
        pool.give_back(KEY, conn, KeepAlive(10.0, None), 1)
    closed.peer.close()
    talking.peer.sendall(b"HTTP/1.1 200 OK\r\n")  # bytes no request asked for
    assert pool.take(KEY) == (good, 1)  # the other two were closed on the way
    assert closed.closed and talking.closed
    assert pool.take(KEY) is None


def test_other_destinations_never_share(pool: ConnectionPool) -> None:
    conn = FakeConnection()
    pool.give_back(KEY, conn, KeepAlive(10.0, None), 1)
    tls = (*KEY[:3], True, None)
    assert pool.take(tls) is None
    assert pool.take(("127.0.0.1", 8124, "localhost", False, None)) is None
    assert pool.take(KEY) == (conn, 1)


def test_idle_connections_are_bounded(pool: ConnectionPool) -> None:
    made = [FakeConnection() for _ in range(IDLE_PER_KEY + 2)]
    for conn in made:
        pool.give_back(KEY, conn, KeepAlive(10.0, None), 1)
    assert [c.closed for c in made] == [True, True] + [False] * IDLE_PER_KEY
    pool.close_idle()
    assert all(c.closed for c in made)


def test_traffic_is_counted(pool: ConnectionPool) -> None:
    start = pool.traffic()
    pool.count(new_connection=True)
    pool.count(new_connection=False)
    pool.count(new_connection=False)
    assert pool.traffic().since(start).to_dict() == {"requests": 3, "new_connections": 1}


def test_a_thread_working_for_another_counts_its_requests_as_that_ones() -> None:
    pool = ConnectionPool()
    before = pool.thread_traffic()
    pool.count(new_connection=True)  # the caller's own

    def for_the_caller() -> None:
        pool.count(new_connection=True)

    worker = threading.Thread(target=pool.carried(for_the_caller))
    worker.start()
    worker.join(5)
    stranger = threading.Thread(target=lambda: pool.count(new_connection=False))
    stranger.start()
    stranger.join(5)
    mine = pool.thread_traffic().since(before)
    assert (mine.requests, mine.connections) == (2, 2)  # not the stranger's
    assert pool.traffic().requests == 3  # the process's totals count every one


def test_side_by_side_runs_calls_together_answers_in_order_counted_as_the_callers() -> None:
    # Three calls that each wait for the other two: run one after another, they would
    # break the barrier.
    together = threading.Barrier(3, timeout=10)
    before = POOL.thread_traffic()

    def call(n: int) -> tuple[int, bool]:
        together.wait()
        POOL.count(new_connection=n == 0)
        return n, threading.current_thread() is threading.main_thread()

    answers = side_by_side([functools.partial(call, n) for n in range(3)])
    # The first in the calling thread (here the main one), the others beside it.
    assert answers == [(0, True), (1, False), (2, False)]
    mine = POOL.thread_traffic().since(before)
    assert (mine.requests, mine.connections) == (3, 1)
    # One call runs where it is: no thread for it.
    assert side_by_side([lambda: threading.current_thread()]) == [threading.current_thread()]
    assert side_by_side([]) == []


def test_side_by_side_raises_the_first_error_in_order_once_every_call_ended() -> None:
    ended: list[int] = []

    def fails(n: int, after: float) -> int:
        time.sleep(after)
        ended.append(n)
        raise ValueError(f"call {n}")

    # Call 2 fails first in time, the calling thread's call 0 last: the error raised is
    # call 0's, the first in order, the others noted on it.
    calls: list[Callable[[], int]] = [
        functools.partial(fails, 0, 0.1),
        lambda: 1,
        functools.partial(fails, 2, 0.0),
        functools.partial(fails, 3, 0.05),
    ]
    with pytest.raises(ValueError, match="call 0") as raised:
        side_by_side(calls)
    assert sorted(ended) == [0, 2, 3]
    assert [n for n in raised.value.__notes__ if "call 2" in n or "call 3" in n] == [
        "also raised beside it: ValueError('call 2')",
        "also raised beside it: ValueError('call 3')",
    ]
