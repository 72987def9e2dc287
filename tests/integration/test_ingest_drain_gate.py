"""The ingest principal's drain gate on the real managed server (issue 22, finding 2).

Staging sends every write inside the attempt's HTTP session (``session_check=1``);
``prepare``'s closure closes that session (``close_session=1``) and proves it gone
(372). An INSERT as the ingest user, held with its headers
sent but not the blank line until ``prepare`` answered ``prepared``, then fails with
372 and B keeps its rows. Every closure's proof is stored under its lease's key.
"""

from __future__ import annotations

import contextlib
import re
import socket
import urllib.parse

import pytest

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.contracts.composition_snapshot import DEFAULT_LIMITS
from dpone.errors import DponeError
from dpone.ports.clickhouse_request import Credentials
from dpone.ports.composition_snapshot import StepNote
from dpone.publication.composition import (
    staging_policy,
)
from dpone.publication.dispatch.dispatch_notes import session_use
from dpone.publication.store import SqliteSnapshotStore, lease_step_key
from dpone.staging.ingest_session import ingest_session_id
from dpone.staging.journal import read_events
from tests.plugins.publication_rig import ROWS, T, prepare, stage
from tests.publication_harness import Rig


class HeldInsert:
    """A real INSERT as ``credentials`` whose request stops before the blank line."""

    def __init__(self, port: int, credentials: Credentials, sql: str, session_id: str) -> None:
        self.body = b"99\tlate\t9\n"
        params = urllib.parse.urlencode(
            {
                "query": sql,
                "session_id": session_id,
                "session_timeout": str(T),
                "session_check": "1",
                "async_insert": "0",
                "wait_end_of_query": "1",
            }
        )
        head = (
            f"POST /?{params} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"X-ClickHouse-User: {credentials.user}\r\nX-ClickHouse-Key: {credentials.password}\r\n"
            f"Content-Length: {len(self.body)}\r\nConnection: close\r\n"
        )
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.sock.sendall(head.encode())  # no blank line yet: the server waits for it

    def release(self) -> tuple[int, str]:
        """Send the blank line and the body; the status and the exception code, if any."""
        self.sock.sendall(b"\r\n" + self.body)
        answer = b""
        with contextlib.closing(self.sock):
            while chunk := self.sock.recv(65536):
                answer += chunk
        text = answer.decode(errors="replace")
        status = int(text.split(" ", 2)[1])
        code = re.search(r"X-ClickHouse-Exception-Code: (\d+)", text)
        return status, code.group(1) if code else ""


def test_a_held_insert_of_the_ingest_user_fails_after_prepare(rig: Rig) -> None:
    leased = stage(rig, "gate-held")
    staged = leased.staged
    rig.existing_target(staged, "t_gate_held", [(7, "a", 7)])
    held = HeldInsert(
        rig.http_port,
        leased.credentials,
        f"INSERT INTO {rig.database}.{staged.table} FORMAT TabSeparated",
        ingest_session_id("gate-held"),
    )
    assert prepare(rig, staged, "t_gate_held") == "prepared"
    status, code = held.release()
    assert (status, code) != (200, ""), "the late INSERT landed in B after PREPARED"
    assert code == "372"  # SESSION_NOT_FOUND: the closure closed the session, nothing ran
    assert rig.rows_of(staged.table) == ROWS
    # The closure's proof is stored under the lease, with the gate it probed.
    store = SqliteSnapshotStore(rig.store_path, create=False)
    closures = [
        n.facts
        for n in store.step_notes(lease_step_key(leased.lease_id))
        if n.facts.get("step") == "closure"
    ]
    assert len(closures) == 1 and closures[0]["proven"] is True
    facts = closures[0]["facts"]
    assert facts["ingest_gate"] == "http_session"
    assert [(s["session_id"], s["answer"]) for s in facts["sessions"]] == [
        (ingest_session_id("gate-held"), 372)
    ]
    # The closure closed the session (the last write had answered) and waited for nothing.
    assert facts["scope"]["sessions"][0]["settled_at_us"] is not None
    assert [(c["session_id"], c["answer"]) for c in facts["closes"]] == [
        (ingest_session_id("gate-held"), "closed")
    ]
    assert facts["gate_wait_ms"] == 0
    assert store.closure_proven(store.get_lease(leased.lease_id))


def test_staging_on_the_client_transport_has_no_gate(
    rig: Rig,
    clickhouse_client: str,
) -> None:
    leased = stage(rig, "gate-client", transport="client")
    rig.existing_target(leased.staged, "t_gate_client", [])
    # Without a drain gate prepare refuses, unless the caller accepts the weaker proof.
    with pytest.raises(DponeError) as refused:
        prepare(rig, leased.staged, "t_gate_client")
    assert refused.value.code == "ingest_ungated"
    assert "accept_ungated_ingest" in refused.value.message
    assert prepare(rig, leased.staged, "t_gate_client", accept_ungated=True) == "prepared"
    store = SqliteSnapshotStore(rig.store_path, create=False)
    notes = store.step_notes(lease_step_key(leased.lease_id))
    closure = [n.facts for n in notes if n.facts.get("step") == "closure"][-1]
    assert closure["proven"] is True
    facts = closure["facts"]
    assert facts["ingest_gate"] == "none"
    # No session was noted; the one gated writes would use was closed and probed: none.
    derived = ingest_session_id("gate-client")
    assert [(c["session_id"], c["answer"]) for c in facts["closes"]] == [(derived, 372)]
    assert [(s["session_id"], s["answer"]) for s in facts["sessions"]] == [(derived, 372)]
    assert facts["gate_wait_ms"] == 0


def test_a_transport_that_says_http_but_opens_no_gate_is_refused(rig: Rig) -> None:
    """Refused by what staging journaled (``drain_gate``), not by the transport's name:
    an HTTP transport a caller hands to the sink unwrapped writes outside any session."""
    staged, _ = rig.stage_leased(
        ROWS,
        "gate-unwrapped",
        # Not "http": ingest_gate wraps only the configured HTTP transport.
        transport_factory=lambda config: HttpTransport(config.endpoint, config.credentials),
        transport="client",
        policy=staging_policy(DEFAULT_LIMITS, session_timeout_seconds=T),
    )
    last = read_events(staged.journal_path)[-1].document
    assert (last["transport"], last["drain_gate"]) == ("http", False)
    rig.existing_target(staged, "t_gate_unwrapped", [])
    with pytest.raises(DponeError) as refused:
        prepare(rig, staged, "t_gate_unwrapped")
    assert refused.value.code == "ingest_ungated"
    assert "'http'" in refused.value.message
    assert prepare(rig, staged, "t_gate_unwrapped", accept_ungated=True) == "prepared"


def test_a_gated_stage_journals_its_gate(rig: Rig) -> None:
    last = read_events(stage(rig, "gate-journaled").staged.journal_path)[-1].document
    assert (last["transport"], last["drain_gate"]) == ("http", True)


def test_a_held_insert_of_a_stage_without_notes_fails_after_prepare(rig: Rig) -> None:
    """A caller staging over HTTP without session notes still ran gated; the closure
    closes the session its writes used (derived from the attempt), so a held INSERT
    carrying it fails after ``prepared`` (it landed before: nothing probed it)."""
    leased = stage(rig, "gate-unnoted", notes=False)
    staged = leased.staged
    rig.existing_target(staged, "t_gate_unnoted", [])
    session = ingest_session_id("gate-unnoted")
    held = HeldInsert(
        rig.http_port,
        leased.credentials,
        f"INSERT INTO {rig.database}.{staged.table} FORMAT TabSeparated",
        session,
    )
    assert prepare(rig, staged, "t_gate_unnoted") == "prepared"
    assert held.release() == (500, "372")
    assert rig.rows_of(staged.table) == ROWS
    store = SqliteSnapshotStore(rig.store_path, create=False)
    notes = store.step_notes(lease_step_key(leased.lease_id))
    facts = [n.facts for n in notes if n.facts.get("step") == "closure"][-1]["facts"]
    assert facts["ingest_gate"] == "http_session"
    assert [(c["session_id"], c["answer"]) for c in facts["closes"]] == [(session, "closed")]
    assert [(s["session_id"], s["answer"]) for s in facts["sessions"]] == [(session, 372)]


def test_an_unanswered_write_makes_the_closure_wait_from_its_start() -> None:
    """Read from notes alone: a write noted as sent, with no answer, may still run."""
    sid = ingest_session_id("gate-notes")
    notes = [
        StepNote(1, "k", "", {"step": "session_opening", "session_id": sid, "session_timeout": 3}),
        StepNote(
            2,
            "k",
            "",
            {
                "step": "session_open_answered",
                "session_id": sid,
                "answered_at_us": 10,
                "outcome": "acknowledged",
            },
        ),
        StepNote(3, "k", "", {"step": "write_sending", "session_id": sid}),
    ]
    use = session_use(sid, notes, "k")
    assert (use.opened, use.settled_at_us, use.session_timeout) == (True, None, 3)
    answered = StepNote(
        4,
        "k",
        "",
        {
            "step": "write_answered",
            "session_id": sid,
            "answered_at_us": 20,
            "outcome": "acknowledged",
        },
    )
    assert session_use(sid, [*notes, answered], "k").settled_at_us == 20
