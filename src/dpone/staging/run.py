"""The journal-facing state of one staging attempt, changed in one place.

:class:`AttemptRun` writes every event of an attempt: it moves the state machine (never
implicitly), keeps the base fields every event carries, and records how each sent
mutation settled (``settled``), or that its sending call returned without a settled
outcome (``returned``, which closes its dispatch window). Query-log evidence about a
mutation counts only for a query of the attempt's principal, in its database, within
that window (:func:`dispatch_origin`). See docs/staging.md ("The journal", "Operator
recovery").
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from dpone.connectors.remote_termination import QueryOrigin
from dpone.errors import DeadlineError, DponeError, StateError
from dpone.ports.attempt_journal import ClickHouseFileJournalResource, JournalEvent
from dpone.ports.clickhouse_errors import ClickHouseServerError, NotSubmitted
from dpone.preparation.spool import PreparedSpool
from dpone.staging.states import StageState, check_reentry, check_transition

SETTLED_ACKNOWLEDGED = "acknowledged"
SETTLED_SERVER_ERROR = "server_error"
SETTLED_NOT_SUBMITTED = "not_submitted"
# Members of every event that describe where and as whom the attempt works.
BASE_FIELDS = (
    "endpoint",
    "endpoint_identity",
    "transport",
    "drain_gate",
    "planned_ownership",
    "principal",
)
# The counts every event records: null until known (prepared once the spool is
# sealed, observed once the COUNT answered).
COUNTS = ("prepared_rows", "observed_count")


def settlement(exc: BaseException) -> str | None:
    """How a failed request settled: the server answered, or nothing was sent; else None."""
    if isinstance(exc, ClickHouseServerError):
        return SETTLED_SERVER_ERROR
    if isinstance(exc, NotSubmitted) or (
        isinstance(exc, DeadlineError) and exc.details.get("submitted") is False
    ):
        return SETTLED_NOT_SUBMITTED
    return None


def dispatch_origin(intent: Mapping[str, Any], now: float) -> QueryOrigin:
    """Who sent the mutation whose intent event is ``intent``, where, and when.

    The user is the attempt's principal, the database its planned one (every request
    names it), and the window opens at the intent's ``not_before_ms``. It closes at
    ``now`` (the outcome is being decided), never after ``not_after_ms``: the
    transport never starts sending after it. Raises :class:`StateError`
    (``origin_unrecorded``) when the intent lacks any of them: without an origin a
    query-log entry could be anyone's run of the same id.
    """
    principal = intent.get("principal") or {}
    planned = intent.get("planned_ownership") or {}
    window = intent.get("dispatch") or {}
    user, database = principal.get("user"), planned.get("database")
    not_before, not_after = window.get("not_before_ms"), window.get("not_after_ms")
    query_id = (intent.get("query") or {}).get("query_id")
    if not (
        isinstance(user, str)
        and isinstance(database, str)
        and type(not_before) is int
        and type(not_after) is int
    ):
        raise StateError(
            f"the intent of {query_id} does not record its principal, database and "
            "dispatch window; its query-log entries cannot be told from another's",
            code="origin_unrecorded",
            query_id=query_id,
        )
    return QueryOrigin(user, database, not_before / 1000, min(now, not_after / 1000))


def error_code(exc: BaseException) -> str:
    """The stable code of ``exc`` (its class name for exceptions that are not dpone's)."""
    return exc.code if isinstance(exc, DponeError) else type(exc).__name__


class AttemptRun:
    """The mutable state of one attempt and the only writer of its events."""

    def __init__(
        self,
        journal: ClickHouseFileJournalResource,
        base: dict[str, Any],
        *,
        state: StageState = StageState.CHECKING,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.journal = journal
        self.state = state
        self.base = base
        self.wall_clock = wall_clock
        self.last: JournalEvent | None = None
        self.table_uuid: str | None = None
        self.table_created_maybe = False
        self.inventory: dict[str, Any] = {}
        self.counts: dict[str, int | None] = dict.fromkeys(COUNTS)
        self.prepared: PreparedSpool | None = None
        self.in_flight: str | None = None  # a mutation sent and not yet settled
        self.intents: dict[str, dict[str, Any]] = {}  # query id -> its intent event
        self._settled: dict[str, str] | None = None  # to be carried by the next event
        self._returned: dict[str, Any] | None = None  # likewise

    @property
    def attempt_id(self) -> str:
        return self.journal.attempt_id

    def move(self, target: StageState) -> None:
        """A move without an event of its own (checked against the machine)."""
        if target is not self.state:
            self.state = check_transition(self.state, target)

    def event(self, state: StageState, outcome: str, **fields: Any) -> JournalEvent:
        """Publish one event in ``state`` and then move there; it records the counts known.

        The move is checked first and made only once the event is durable: an event that
        could not be published leaves the attempt where its journal says it is, so the
        cleanup that follows starts from there (a failed ``staged`` record is cleaned up
        like any failure before it, not refused as a move out of ``staged``).
        """
        moved = self.state if state is self.state else check_transition(self.state, state)
        carried = {"settled": self._settled} if self._settled else {}
        if self._returned:
            carried["returned"] = self._returned
        document = {
            **self.base,
            "state": state.value,
            "outcome": outcome,
            "cleanup_inventory": dict(self.inventory),
            "counts": dict(self.counts),
            **carried,
            **fields,
        }
        self.last = self.journal.record(document)
        self.state = moved
        self._settled = self._returned = None
        return self.last

    def intent(
        self, state: StageState, kind: str, query_id: str, window_seconds: float, **fields: Any
    ) -> JournalEvent:
        """The durable intent of one mutation, with its dispatch window."""
        # Milliseconds since the epoch (canonical JSON has no floats), rounded outward.
        now = self.wall_clock()
        window = {
            "not_before_ms": math.floor(now * 1000),
            "not_after_ms": math.ceil((now + window_seconds) * 1000),
        }
        event = self.event(
            state,
            "drop_intent" if kind in ("drop", "discard") else "intent",
            query={"kind": kind, "query_id": query_id},
            dispatch=window,
            **fields,
        )
        self.in_flight = query_id
        self.intents[query_id] = event.document
        return event

    def origin(self, query_id: str) -> QueryOrigin:
        """The origin of the mutation ``query_id`` this run intended, as of now."""
        return dispatch_origin(self.intents[query_id], self.wall_clock())

    def settle(self, query_id: str, how: str) -> None:
        """The mutation ``query_id`` can no longer change anything; the next event says so."""
        self._settled = {"query_id": query_id, "by": how}
        if self.in_flight == query_id:
            self.in_flight = None

    def returned(self, query_id: str) -> None:
        """The call that sent ``query_id`` has returned unsettled; the next event says when.

        Call only once the transport can send nothing more of it (it raised: its
        connection is closed, its child reaped). The recorded time closes the
        mutation's dispatch window early: a server start after it proves the query gone.
        """
        self._returned = {"query_id": query_id, "at_ms": math.ceil(self.wall_clock() * 1000)}

    def prepared_spool(self, prepared: PreparedSpool) -> None:
        """The spool is sealed (its entry durable): it is listed and its rows are known."""
        self.journal.spool_prepared()
        self.prepared = prepared
        # Named by the attempt's path (what an operator finds), not the descriptor's.
        self.inventory["spool"] = str(
            self.journal.attempt_dir / prepared.path.parent.name / prepared.path.name
        )
        self.counts["prepared_rows"] = prepared.identity.prepared_rows

    def release_spool(self) -> None:
        """Remove the spool; the inventory stops listing it once it is gone."""
        self.journal.release_spool()
        self.inventory.pop("spool", None)

    def terminal(self, state: StageState, exc: BaseException) -> JournalEvent:
        """The attempt's last event; what may remain on the server is in the inventory."""
        if state is not StageState.FAILED_CLEANED and self.table_created_maybe:
            self.inventory["table"] = {**self.base["planned_ownership"], "uuid": self.table_uuid}
        return self.event(state, "terminal", error_code=error_code(exc))

    def record_failure(
        self, state: StageState, exc: BaseException, *, primary: BaseException | None = None
    ) -> None:
        """``terminal``, but a journal failure becomes a note on the primary, never raised.

        The primary exception (``exc`` unless given) is what the caller sees; losing the
        failure record must not replace it (the journal then ends without a terminal
        state, which asks an operator to look).
        """
        try:
            self.terminal(state, exc)
        except Exception as journal_exc:
            (primary or exc).add_note(f"the failure record could not be published: {journal_exc}")

    @classmethod
    def resume(
        cls, journal: ClickHouseFileJournalResource, *, wall_clock: Callable[[], float] = time.time
    ) -> AttemptRun:
        """The run of an existing journal, for a later actor (operator cleanup, discard)."""
        events = journal.resume()
        if not events:
            raise StateError(
                f"attempt {journal.attempt_id} has no event: nothing was sent; archive it",
                code="journal_empty",
            )
        last = events[-1].document
        base = {k: last[k] for k in BASE_FIELDS if k in last}
        run = cls(journal, base, state=StageState(last["state"]), wall_clock=wall_clock)
        run.last = events[-1]
        run.inventory = dict(last.get("cleanup_inventory") or {})
        known = last.get("counts") or {}
        run.counts.update({k: known[k] for k in COUNTS if type(known.get(k)) is int})
        return run

    def enter(self, target: StageState) -> None:
        """A later actor enters the machine again (see ``REENTRY``)."""
        self.state = check_reentry(self.state, target)
