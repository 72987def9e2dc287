"""Every pool principal accounted for, every request shape of the ingest user closed
(issue 37, items 3 and 4), on the real managed server.

Item 3: a pool principal this store never leased holds write grants the catalog
allows; what it ran against B or the target is read in the observation and blocks,
naming it. Item 4: an INSERT as the ingest user without the drain gate's session
parameters is in no process sample or query log while the server still reads its body;
the closure counts the user's open sign-ins and refuses while one is open.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import urllib.parse
from collections.abc import Mapping
from typing import Any

import pytest

from dpone.errors import DponeError
from dpone.ports.clickhouse_request import Credentials
from dpone.publication.composition import pool_credentials
from dpone.publication.store import SqliteSnapshotStore, lease_step_key
from tests import chhttp
from tests.integration.test_ingest_drain_gate import ROWS, prepare, stage
from tests.integration.test_publication_faults import (  # noqa: F401 (fixtures)
    DB,
    Case,
    P,
    case,
    managed,
    rig,
    state_of,
)
from tests.publication_harness import Rig

# An INSERT ... SELECT that runs for about 6 s (12 one-row blocks of 0.5 s) and then
# writes one row: it outlasts a prepare.
SLOW = (
    "INSERT INTO {table} SELECT 99, 'late', 9 FROM "
    "(SELECT sum(sleepEachRow(0.5)) AS s FROM numbers(12) SETTINGS max_block_size = 1)"
)


def never_leased(on: Rig, role: str) -> Credentials:
    """A pool user of ``role`` that the on's store never leased, with its credentials."""
    leased = set()
    with contextlib.suppress(DponeError):
        store = SqliteSnapshotStore(on.store_path, create=False)
        leased = {r.lease.user for r in store.last_lease_records()}
    credentials = pool_credentials(on.data_dir)
    free = sorted(u for u in credentials if u.startswith(f"dpone_{role}_") and u not in leased)
    return credentials[free[-1]]


def running(on: Rig, sql: str, who: Credentials) -> tuple[threading.Thread, list[chhttp.Answer]]:
    """``sql`` as ``who`` in a thread, started now; its answer lands in the list."""
    answers: list[chhttp.Answer] = []
    thread = threading.Thread(
        target=lambda: answers.append(
            chhttp.post(on.http_port, sql, user=who.user, password=who.password)
        )
    )
    thread.start()
    return thread, answers


def wait_until_running(on: Rig, user: str) -> None:
    """Until the server lists a query of ``user`` (bounded by the test's own timeout)."""
    while not chhttp.rows(
        on.http_port, f"SELECT query_id FROM system.processes WHERE user = '{user}'"
    ):
        pass


def test_a_never_leased_pool_user_writing_b_is_named_and_refuses_prepare(rig: Rig) -> None:  # noqa: F811
    """Before: the never-leased user's grant was allowed and nothing read what it ran:
    ``prepared``, and its row landed in B after it."""
    leased = stage(rig, "pool-b")
    a_uuid = rig.existing_target(leased.staged, "t_pool_b", [(7, "a", 7)])
    other = never_leased(rig, "ingest")
    thread, answers = running(rig, SLOW.format(table=f"{DB}.{leased.staged.table}"), other)
    try:
        wait_until_running(rig, other.user)
        with pytest.raises(DponeError) as refused:
            prepare(rig, leased.staged, "t_pool_b")
    finally:
        thread.join()
    assert refused.value.code == "side_effect_present"
    assert "pool_writer_query" in refused.value.details["blockers"]
    named = [d for d in refused.value.details["details"] if other.user in d]
    assert named and all("never leased by this store" in d for d in named)
    assert any(leased.staged.table in d for d in named)
    # Nothing was prepared, so nothing can be sent; the target is as it was.
    store = SqliteSnapshotStore(rig.store_path, create=False)
    assert store.list_snapshots() == []
    assert (rig.uuid_of("t_pool_b"), rig.rows_of("t_pool_b")) == (a_uuid, [(7, "a", 7)])
    assert answers[0].status == 200  # it did write: only the refusal kept it out


def test_a_never_leased_publisher_writing_the_target_stops_the_publish(case: Case) -> None:  # noqa: F811
    """A write into the target after prepare, by a publisher principal this store never
    leased: logged since B was sealed, it is named, and no EXCHANGE is sent. Before:
    ``published@3``, nothing named."""
    on = case.rig
    other = never_leased(on, "publisher")
    answer = chhttp.post(
        on.http_port,
        f"INSERT INTO {DB}.{case.target} VALUES (5, 'by-hand', 5)",
        user=other.user,
        password=other.password,
    )
    assert answer.status == 200, answer.text
    on.admin("SYSTEM FLUSH LOGS")  # the server's own flush, a second later at most
    published = case.rig.components().publisher.publish(case.intent)
    assert state_of(published) == (P.NOT_PUBLISHED, 3)
    record = case.record()
    assert record.dispatch is not None and record.dispatch.outcome == "not_sent", record
    assert on.exchange_events(case.intent) == []  # no EXCHANGE reached the server
    assert on.uuid_of(case.target) == case.a_uuid
    (refused,) = [
        h.facts
        for h in case.store().history(case.intent)
        if h.facts.get("step") == "dispatch_refused"
    ]
    assert refused["reason"] == "side_effect_present"
    named = [b for b in refused["blockers"] if other.user in b]
    lead = f"pool_writer_query: pool user {other.user} (never leased by this store) ran Insert "
    assert named and all(b.startswith(lead) for b in named)
    assert any(f"on {DB}.{case.target}" in b and other.user in b for b in refused["blockers"])


class HeldBody:
    """An INSERT as ``credentials`` with no session parameters, its chunked body held open
    after its first row: the server reads the body before it registers the query."""

    def __init__(self, port: int, credentials: Credentials, sql: str) -> None:
        params = urllib.parse.urlencode({"query": sql, "async_insert": "0"})
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.sock.sendall(
            (
                f"POST /?{params} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                f"X-ClickHouse-User: {credentials.user}\r\n"
                f"X-ClickHouse-Key: {credentials.password}\r\n"
                "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            ).encode()
        )
        row = b"99\tlate\t9\n"
        self.sock.sendall(b"%x\r\n%s\r\n" % (len(row), row))

    def release(self) -> int:
        """End the body; the answer's HTTP status."""
        self.sock.sendall(b"0\r\n\r\n")
        answer = b""
        with contextlib.closing(self.sock):
            while chunk := self.sock.recv(65536):
                answer += chunk
        return int(answer.split(b" ", 2)[1])


def closures(on: Rig, lease_id: str) -> list[Mapping[str, Any]]:
    store = SqliteSnapshotStore(on.store_path, create=False)
    return [
        n.facts
        for n in store.step_notes(lease_step_key(lease_id))
        if n.facts.get("step") == "closure"
    ]


def test_an_ingest_insert_without_the_session_held_open_refuses_prepare(rig: Rig) -> None:  # noqa: F811
    """Before: no sample, query log or session saw it; ``prepared``, then its row landed
    in B (publish: ``not_sent_content_mismatch``)."""
    leased = stage(rig, "held-body")
    rig.existing_target(leased.staged, "t_held_body", [(7, "a", 7)])
    held = HeldBody(
        rig.http_port, leased.credentials, f"INSERT INTO {DB}.{leased.staged.table} FORMAT TSV"
    )
    try:
        assert not chhttp.rows(
            rig.http_port,
            f"SELECT 1 FROM system.processes WHERE user = '{leased.credentials.user}'",
        )  # invisible as a query
        with pytest.raises(DponeError) as refused:
            prepare(rig, leased.staged, "t_held_body")
    finally:
        status = held.release()
    assert refused.value.code == "ingest_not_quiescent"
    (closure,) = closures(rig, leased.lease_id)
    facts = closure["facts"]
    assert isinstance(facts, dict)
    assert closure["proven"] is False and facts["unproven"] == ["logins_open"]
    assert facts["logins"]["observed"] is True and facts["logins"]["open"] == 1
    assert facts["logins"]["reads"] > 1  # read again before refusing
    assert status == 200  # it landed, in a generation that was never prepared
    assert SqliteSnapshotStore(rig.store_path, create=False).list_snapshots() == []
    # Once it ended, the closure is proven, and the catalog names the write that came
    # after the lease ended.
    with pytest.raises(DponeError) as again:
        prepare(rig, leased.staged, "t_held_body")
    assert closures(rig, leased.lease_id)[-1]["proven"] is True
    assert again.value.code == "side_effect_present"
    assert any(
        f"pool user {leased.credentials.user} (its lease ended) ran Insert" in d
        for d in again.value.details["details"]
    )


def test_a_slow_ingest_insert_without_the_session_never_lands_after_prepared(
    rig: Rig,  # noqa: F811
) -> None:
    """A registered INSERT ... SELECT of the ingest user without the session: the closure
    kills it (every query of the user), so it never lands after ``prepared``."""
    leased = stage(rig, "slow-ingest")
    rig.existing_target(leased.staged, "t_slow_ingest", [(7, "a", 7)])
    thread, answers = running(
        rig, SLOW.format(table=f"{DB}.{leased.staged.table}"), leased.credentials
    )
    try:
        wait_until_running(rig, leased.credentials.user)
        assert prepare(rig, leased.staged, "t_slow_ingest") == "prepared"
    finally:
        thread.join()
    assert answers[0].status != 200 and answers[0].exception_code == "394"  # QUERY_WAS_CANCELLED
    assert rig.rows_of(leased.staged.table) == ROWS
    (closure,) = closures(rig, leased.lease_id)
    facts = closure["facts"]
    assert isinstance(facts, dict)
    assert closure["proven"] is True and facts["killed"]
    assert facts["logins"] == {"observed": True, "open": 0, "reads": 1}
