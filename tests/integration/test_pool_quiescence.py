"""Every pool principal accounted for, every request shape of the ingest user closed
(issue 37, items 3 and 4), on the real managed server.

Item 3: a pool principal this store never leased, or one another run's active lease
holds, has write grants the catalog allows; what it ran against B or the target is
read in the observation and blocks, naming it. The observed publication's own ingest
and publisher are not accounted. Item 4: an INSERT as the ingest user without the drain gate's session
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

from dpone.contracts.composition_snapshot import SnapshotIntent
from dpone.errors import DponeError
from dpone.ports.clickhouse_request import Credentials
from dpone.ports.composition_snapshot import TargetSlot
from dpone.publication.composition import pool_credentials
from dpone.publication.store import SqliteSnapshotStore, lease_step_key
from tests import chhttp
from tests.plugins.publication_rig import DB, ROWS, Case, Leased, P, prepare, stage, state_of
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


def test_a_never_leased_pool_user_writing_b_is_named_and_refuses_prepare(rig: Rig) -> None:
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


def test_a_never_leased_publisher_writing_the_target_stops_the_publish(case: Case) -> None:
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


def logged_query_ids(on: Rig, user: str, table: str) -> list[str]:
    """The query ids of ``user``'s logged queries (QueryStart) that name ``table``."""
    on.admin("SYSTEM FLUSH LOGS")
    found = chhttp.rows(
        on.http_port,
        "SELECT query_id FROM system.query_log WHERE type = 'QueryStart' "
        f"AND user = '{user}' AND has(tables, '{DB}.{table}') ORDER BY event_time_microseconds",
    )
    return [str(r["query_id"]) for r in found]


def as_user(on: Rig, who: Credentials, sql: str) -> None:
    answer = chhttp.post(on.http_port, sql, user=who.user, password=who.password)
    assert answer.status == 200, answer.text


def test_an_ingest_user_another_run_holds_writing_b_is_named_and_refuses_prepare(
    rig: Rig,
) -> None:
    """Another table's staging holds an ingest user (its lease active); that user
    writes this generation after it was sealed. Before: its active lease made it dpone's
    own custody, nothing read what it ran, and ``prepared``."""
    leased = stage(rig, "held-b")
    rig.existing_target(leased.staged, "t_held_b", [(7, "a", 7)])
    other: Leased = stage(rig, "held-other")  # another table's attempt: its lease stays
    assert other.credentials.user != leased.credentials.user
    # Its own table is not this slot's: that write is not named.
    as_user(rig, other.credentials, f"INSERT INTO {DB}.{other.staged.table} VALUES (8, 'o', 8)")
    as_user(rig, other.credentials, f"INSERT INTO {DB}.{leased.staged.table} VALUES (9, 'x', 9)")
    with pytest.raises(DponeError) as refused:
        prepare(rig, leased.staged, "t_held_b")
    assert refused.value.code == "side_effect_present"
    assert "pool_writer_query" in refused.value.details["blockers"]
    (query_id,) = logged_query_ids(rig, other.credentials.user, leased.staged.table)
    named = [d for d in refused.value.details["details"] if other.credentials.user in d]
    assert named == [
        f"pool user {other.credentials.user} (leased to another run, "
        f"attempt held-other) ran Insert {query_id} on {DB}.{leased.staged.table}"
    ]
    # This publication's own ingest user (closed by the prepare) is not named for its
    # staging INSERT into B, which ran inside its lease.
    assert not any(leased.credentials.user in d for d in refused.value.details["details"])
    assert SqliteSnapshotStore(rig.store_path, create=False).list_snapshots() == []


def publisher_of(case: Case) -> Credentials:
    """The credentials of the publisher ``case``'s intent binds (its lease active)."""
    intent = SnapshotIntent.from_bytes(case.store().load(case.intent).intent_bytes)
    return pool_credentials(case.rig.data_dir)[intent.publisher.user]


def writing_the_target_is_refused(
    case: Case,
    intent: str,
    writer: Credentials,
) -> tuple[list[str], str]:
    """``writer`` inserts a row into ``case``'s target; publishing ``intent`` is then
    refused with nothing sent and A kept. The refusal's blockers naming ``writer``, and
    the query id of its INSERT."""
    on = case.rig
    as_user(on, writer, f"INSERT INTO {DB}.{case.target} VALUES (5, 'by-hand', 5)")
    on.admin("SYSTEM FLUSH LOGS")
    published = on.components().publisher.publish(intent)
    assert state_of(published) == (P.NOT_PUBLISHED, 3)
    assert on.exchange_events(intent) == []  # no EXCHANGE reached the server
    assert on.uuid_of(case.target) == case.a_uuid
    (refused,) = [
        h.facts for h in case.store().history(intent) if h.facts.get("step") == "dispatch_refused"
    ]
    (query_id,) = logged_query_ids(on, writer.user, case.target)
    return [b for b in refused["blockers"] if writer.user in b], query_id


def test_a_publisher_another_run_holds_writing_the_target_stops_the_publish(
    case: Case,
) -> None:
    """Another slot's prepared publication holds a publisher (its lease active): what it
    ran against its own target does not block this slot; its write into this slot's
    target after B was sealed is named, and no EXCHANGE is sent. Before: nothing named,
    ``published@3``."""
    on = case.rig
    other = Case(on, f"{case.target}_other")
    held = publisher_of(other)
    assert held.user != publisher_of(case).user
    slot, generation = TargetSlot(DB, case.target), case.b.table
    as_user(on, held, f"INSERT INTO {DB}.{other.target} VALUES (6, 'own', 6)")
    on.admin("SYSTEM FLUSH LOGS")
    observed = on.components().publisher.catalog.observe(slot, generation)
    assert observed.target is not None and observed.generation is not None
    assert (observed.target.blockers, observed.generation.blockers) == ((), ())
    blockers, query_id = writing_the_target_is_refused(case, case.intent, held)
    assert blockers == [
        f"pool_writer_query: pool user {held.user} (leased to another run, attempt "
        f"{other.target}-b) ran Insert {query_id} on {DB}.{case.target}"
    ]
    # The other slot is still its own run's to publish.
    assert state_of(on.components().publisher.publish(other.intent)) == (P.PUBLISHED, 3)


def test_an_older_attempts_publisher_of_the_same_slot_writing_the_target_stops_the_publish(
    case: Case,
) -> None:
    """A newer attempt of the same slot prepares over an older one's intent; the older
    publisher's lease is still active. Its INSERT into the target (A, whose UUID stays)
    is named, and no EXCHANGE is sent. Before: its whole user was left to the slot's
    protocol, and ``published@3`` kept the written row in the rollback copy (review)."""
    on = case.rig
    older = publisher_of(case)
    second = on.stage([(1, "x", 1)], f"{case.target}-second")
    prepared = on.prepare(second, case.target)
    newer = SnapshotIntent.from_bytes(case.store().load(prepared.intent_sha256).intent_bytes)
    assert newer.publisher.user != older.user
    blockers, query_id = writing_the_target_is_refused(case, prepared.intent_sha256, older)
    assert blockers == [
        f"pool_writer_query: pool user {older.user} (publisher of another attempt of this "
        f"slot, {case.target}-b) ran Insert {query_id} on {DB}.{case.target}"
    ]


def test_a_first_publication_is_not_blocked_by_its_own_publishers_create(
    rig: Rig,
) -> None:
    """A first publication's publisher creates the target (a logged CREATE against it,
    after B was sealed) while another run holds a pool user: its own publisher is not
    accounted, so the observation after the CREATE and publish's both pass."""
    leased = stage(rig, "own-first")
    other = stage(rig, "own-first-other")  # another run's lease, active throughout
    store = SqliteSnapshotStore(rig.store_path, create=False)
    assert [
        r.lease.active for r in store.last_lease_records() if r.lease.user == other.credentials.user
    ] == [True]
    assert prepare(rig, leased.staged, "t_own_first") == "prepared"
    (summary,) = store.list_snapshots()
    intent = SnapshotIntent.from_bytes(summary.intent_bytes)
    assert logged_query_ids(rig, intent.publisher.user, "t_own_first")  # its CREATE
    published = rig.components().publisher.publish(intent.sha256)
    assert state_of(published) == (P.PUBLISHED, 3)
    assert rig.rows_of("t_own_first") == sorted(ROWS)


def test_a_held_users_running_queries_that_write_nothing_here_do_not_block(
    rig: Rig,
) -> None:
    """Another slot's publisher, held by its prepared run, running now: an INSERT into
    its own target, whose text names the database (here also this slot's target's
    name) as a qualifier, and a SELECT that reads this generation. Its grants cover
    every table of the database, but neither query writes this slot's tables, so the
    observation names neither (a name followed by a dot is a database's; a SELECT of a
    user another run holds writes nothing)."""
    leased = stage(rig, "mention-b")
    rig.existing_target(leased.staged, DB, [(7, "a", 7)])  # named as its database
    held = publisher_of(Case(rig, "t_mention_other"))
    insert = SLOW.format(table=f"{DB}.t_mention_other")
    select = (
        f"SELECT count() FROM {DB}.{leased.staged.table} WHERE id IN "
        "(SELECT sum(sleepEachRow(0.5)) FROM numbers(12) SETTINGS max_block_size = 1)"
    )
    threads = [running(rig, sql, held) for sql in (insert, select)]
    try:
        while len(
            chhttp.rows(
                rig.http_port, f"SELECT query_id FROM system.processes WHERE user = '{held.user}'"
            )
        ) < len(threads):
            pass
        observed = rig.components().publisher.catalog.observe(
            TargetSlot(DB, DB), leased.staged.table
        )
        still = [thread.is_alive() for thread, _ in threads]
    finally:
        for thread, _ in threads:
            thread.join()
    assert still == [True, True]  # both ran throughout the observation
    assert observed.target is not None and observed.generation is not None
    assert (observed.target.blockers, observed.generation.blockers) == ((), ())
    assert [answers[0].status for _, answers in threads] == [200, 200]


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


def test_an_ingest_insert_without_the_session_held_open_refuses_prepare(rig: Rig) -> None:
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
    rig: Rig,
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
