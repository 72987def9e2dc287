"""The ingest principal's drain gate: every staging write inside one HTTP session.

:class:`IngestSessionGate` wraps the HTTP transport staging sends through: right before
each write of an attempt (``dpone-b02-<attempt>-<kind>``), a ``SELECT 1`` opens or
re-arms the session :func:`ingest_session_id` ``(attempt)`` with ``session_timeout`` T,
and the write is sent with ``session_check=1``, so once the publication's closure has
closed the session a delayed write fails with 372 and changes nothing. Reads stay
outside the session. With ``notes`` the gate notes each request durably before it
leaves and its answer after; a request whose note cannot be written is not sent
(:class:`NotSubmitted`). The ``client`` transport has no sessions and gets no gate. See
docs/publication-principals.md ("The ingest drain gate").
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from dpone.errors import DponeError
from dpone.ports.clickhouse import QueryPort
from dpone.ports.clickhouse_errors import NotSubmitted
from dpone.ports.clickhouse_request import (
    MUTATION_KINDS,
    ClickHouseRequest,
    Endpoint,
    RequestKind,
    check_attempt_id,
    read_query_id,
)
from dpone.ports.clickhouse_result import QueryResult
from dpone.staging.run import (
    SETTLED_ACKNOWLEDGED,
    SETTLED_NOT_SUBMITTED,
    SETTLED_SERVER_ERROR,
    settlement,
)

SESSION_OPENING = "session_opening"
SESSION_OPEN_ANSWERED = "session_open_answered"
WRITE_SENDING = "write_sending"
WRITE_ANSWERED = "write_answered"
# An answer after which the request no longer runs on the server (T counts from it).
SETTLED_OUTCOMES = frozenset({SETTLED_ACKNOWLEDGED, SETTLED_SERVER_ERROR, SETTLED_NOT_SUBMITTED})
UNSETTLED = "unknown"
_WRITE_ID = re.compile(rf"^dpone-b02-(?P<attempt>.+)-(?:{'|'.join(MUTATION_KINDS)})$")

SessionNotes = Callable[[Mapping[str, Any]], object]


def ingest_session_id(attempt_id: str) -> str:
    """``dpone-b02-<attempt>-session``: the HTTP session of one attempt's writes."""
    return f"dpone-b02-{check_attempt_id(attempt_id)}-session"


class IngestSessionGate:
    """A :class:`QueryPort` that sends every attempt write inside its gated session."""

    # Journaled by staging (``drain_gate``): prepare refuses a generation staged
    # through a transport that does not say this, whatever its name.
    drain_gate = True

    def __init__(
        self,
        inner: QueryPort,
        *,
        session_timeout: int,
        notes: SessionNotes | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """``inner`` is the HTTP transport; ``notes(facts)`` appends one durable note."""
        self.inner = inner
        self.name = inner.name
        self.session_timeout = session_timeout
        self._notes = notes
        self._wall_clock = wall_clock
        self._opened = 0

    @property
    def endpoint(self) -> Endpoint | None:
        """The inner transport's endpoint (the journal describes it)."""
        endpoint = getattr(self.inner, "endpoint", None)
        return endpoint if isinstance(endpoint, Endpoint) else None

    def execute(self, request: ClickHouseRequest, *, deadline: float) -> QueryResult:
        """Reads as they are; a write after opening its attempt's session (module doc)."""
        if request.kind is not RequestKind.MUTATION or request.session_id is not None:
            return self.inner.execute(request, deadline=deadline)
        match = _WRITE_ID.fullmatch(request.query_id)
        if match is None:
            raise NotSubmitted(
                f"write {request.query_id} names no staging attempt, so it has no drain-gate "
                "session; nothing was sent",
                code="session_unassignable",
                query_id=request.query_id,
            )
        attempt_id = match.group("attempt")
        session_id = ingest_session_id(attempt_id)
        self._open(attempt_id, session_id, request.query_id, deadline)
        gated = dataclasses.replace(
            request,
            session_id=session_id,
            session_timeout=self.session_timeout,
            session_check=True,
        )
        self._note_first(
            {"step": WRITE_SENDING, "session_id": session_id, "query_id": request.query_id},
            request.query_id,
        )
        return self._answered(WRITE_ANSWERED, session_id, gated, deadline)

    def _open(self, attempt_id: str, session_id: str, write_id: str, deadline: float) -> None:
        """Open (or re-arm) the session; the write is not sent unless this answered."""
        self._opened += 1
        opening = ClickHouseRequest(
            "SELECT 1",
            read_query_id(attempt_id, "session_open", self._opened),
            RequestKind.READ,
            session_id=session_id,
            session_timeout=self.session_timeout,
        )
        self._note_first(
            {
                "step": SESSION_OPENING,
                "session_id": session_id,
                "session_timeout": self.session_timeout,
                "query_id": opening.query_id,
                "at_us": self._wall_us(),
            },
            write_id,
        )
        try:
            self._answered(SESSION_OPEN_ANSWERED, session_id, opening, deadline)
        except DponeError as exc:
            raise NotSubmitted(
                f"the drain-gate session {session_id} could not be opened ({exc.code}); "
                f"write {write_id} was not sent",
                code="session_open_failed",
                query_id=write_id,
                session_id=session_id,
                cause=exc.code,
            ) from exc

    def _answered(
        self, step: str, session_id: str, request: ClickHouseRequest, deadline: float
    ) -> QueryResult:
        """Send once, then note when and how it answered (the note is best effort)."""
        outcome = UNSETTLED
        try:
            result = self.inner.execute(request, deadline=deadline)
            outcome = SETTLED_ACKNOWLEDGED
            return result
        except BaseException as exc:
            outcome = settlement(exc) or UNSETTLED
            raise
        finally:
            facts = {
                "step": step,
                "session_id": session_id,
                "query_id": request.query_id,
                "answered_at_us": self._wall_us(),
                "outcome": outcome,
            }
            # Without it closure sees no answer and waits the full T from its own start.
            with contextlib.suppress(DponeError):
                if self._notes is not None:
                    self._notes(facts)

    def _note_first(self, facts: Mapping[str, Any], write_id: str) -> None:
        """A note before a request leaves; without it the write is not sent."""
        if self._notes is None:
            return
        try:
            self._notes(facts)
        except DponeError as exc:
            raise NotSubmitted(
                f"the drain-gate note {facts['step']} could not be written ({exc.code}); "
                f"write {write_id} was not sent",
                code="session_note_failed",
                query_id=write_id,
                cause=exc.code,
            ) from exc

    def _wall_us(self) -> int:
        return int(self._wall_clock() * 1_000_000)
