"""The drain gate's requests of a closure: close each opened HTTP session, then probe it.

A lease's writes run in HTTP sessions whose every request after the opening carries
``session_check=1``, so once the session is gone a request delayed in flight fails with
372 SESSION_NOT_FOUND and changes nothing. With the principal's own credentials
(sessions are per user) the closure closes each session (``close_session=1``), waits T
plus the margin only for one the close did not end, and probes it: the proof is a 372.
See docs/publication-principals.md ("The authority", step 4, and "What the closure rests
on").
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dpone.errors import DponeError
from dpone.ports.clickhouse_errors import ClickHouseServerError
from dpone.ports.clickhouse_request import Credentials, Endpoint, RequestKind
from dpone.publication.dispatch.dispatch_notes import PROBE_OPEN, SessionUse
from dpone.publication.dispatch.executor import TransportFactory, session_request

SESSION_NOT_FOUND = 372
CLOSED = "closed"
# What a close may answer that leaves nothing to wait for.
_ENDED = (CLOSED, SESSION_NOT_FOUND)


@dataclass(frozen=True)
class SessionDrain:
    """Closes and probes one lease's sessions for a closure (see the module doc)."""

    endpoint: Endpoint
    credentials: Callable[[str], Credentials]
    factory: TransportFactory
    next_id: Callable[[str], str]
    deadline: Callable[[], float]
    wall_clock: Callable[[], float]
    session_timeout: int
    margin_seconds: float
    note_step: Callable[[str, Mapping[str, Any]], object] | None = None

    def close(self, user: str, session: SessionUse) -> dict[str, Any]:
        """End ``session`` now: its answer (``closed``, a ClickHouse code, or an error code),
        and whether it is proven ended: a probe right after the close answered 372.

        The probe is what counts, not the close's 200: a server that does not honour
        ``close_session`` (``enable_http_close_session = false``, or a build that
        releases the session before it closes it) answers 200 and keeps the session.
        """
        found = self._ask(user, session.session_id, "close", close=True)
        found["ended"] = False
        if found["answer"] in _ENDED:
            checked = self._ask(user, session.session_id, "check", close=False)
            found["check_query_id"] = checked["probe_query_id"]
            found["checked"] = checked["answer"]
            found["ended"] = checked["answer"] == SESSION_NOT_FOUND
        return found

    def fallback_seconds(self, sessions: Sequence[SessionUse], ended: Collection[str]) -> float:
        """How long to wait for the sessions the close did not end: T plus the margin,
        from now (a request may hold the session now, or a probe re-armed it)."""
        waits = [
            max(self.session_timeout, s.session_timeout or 0) + self.margin_seconds
            for s in sessions
            if s.may_exist and s.session_id not in ended
        ]
        return max(waits, default=0.0)

    def probe(self, user: str, session: SessionUse) -> dict[str, Any]:
        """Whether ``session`` is gone (answer 372); an open one is noted for later closures."""
        found = self._ask(user, session.session_id, "probe", close=False)
        if found["answer"] != SESSION_NOT_FOUND and self.note_step and session.note_key:
            with contextlib.suppress(DponeError):  # unproven either way; the note helps later
                self.note_step(
                    session.note_key,
                    {
                        "step": PROBE_OPEN,
                        "session_id": session.session_id,
                        "at_us": int(self.wall_clock() * 1_000_000),
                        "answer": found["answer"],
                    },
                )
        return found

    def _ask(self, user: str, session_id: str, purpose: str, *, close: bool) -> dict[str, Any]:
        digest = hashlib.sha256(session_id.encode()).hexdigest()[:12]
        query_id = self.next_id(f"{purpose}-{digest}")
        request = session_request(
            "SELECT 1",
            query_id,
            RequestKind.READ,
            session_id=session_id,
            session_timeout=1,
            check=True,
            close=close,
        )
        answer: int | str
        try:
            self.factory(self.endpoint, self.credentials(user)).execute(
                request, deadline=self.deadline()
            )
            answer = CLOSED if close else "open"
        except ClickHouseServerError as exc:
            code = exc.details.get("clickhouse_code")
            answer = code if isinstance(code, int) else exc.code
        except DponeError as exc:
            answer = exc.code
        key = "close_query_id" if close else "probe_query_id"
        return {"session_id": session_id, key: query_id, "answer": answer}
