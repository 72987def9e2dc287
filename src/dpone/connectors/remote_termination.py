"""Proving that a query has stopped on the server.

A query keeps running when its connection is lost, so remote completion is proven only
by ``KILL QUERY WHERE query_id = '<id>' SYNC`` output naming that query as finished, or
by ``system.query_log`` entries recording its terminal event, and only for a query whose
user, database and start time match the request dispatched (:class:`QueryOrigin`);
empty or missing output is unknown, and a KILL always names one id. See
docs/transports.md ("Remote termination").
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass

from dpone.ports.clickhouse import QueryPort
from dpone.ports.clickhouse_errors import ClickHouseServerError, OutcomeUnknown
from dpone.ports.clickhouse_request import read
from dpone.sql import quote_literal

TERMINAL_LOG_TYPES = ("QueryFinish", "ExceptionBeforeStart", "ExceptionWhileProcessing")
UNKNOWN_TABLE = 60
# Server and client clocks differ a little; a start this far outside the dispatch
# window still counts. A larger skew makes the proof fail (unknown), never pass.
START_WINDOW_SLACK_SECONDS = 5.0


@dataclass(frozen=True)
class QueryOrigin:
    """Who sent a query, in which database, and the wall-clock window of its dispatch.

    ``not_before`` and ``not_after`` are seconds since the epoch (``time.time()``),
    taken just before the request was sent and once its outcome was known.
    """

    user: str
    database: str
    not_before: float
    not_after: float

    def matches(self, event: QueryLogEvent) -> bool:
        """Whether ``event`` was logged for a query sent from this origin."""
        start = event.query_start_time
        return (
            event.user == self.user
            and event.current_database == self.database
            and self.not_before - START_WINDOW_SLACK_SECONDS
            <= start
            <= self.not_after + START_WINDOW_SLACK_SECONDS
        )


@dataclass(frozen=True)
class QueryLogEvent:
    """One ``system.query_log`` row of a query id (times in microseconds since the epoch)."""

    type: str
    event_time_us: int
    query_start_time_us: int
    exception_code: int
    user: str
    current_database: str
    query_kind: str

    @property
    def event_time(self) -> float:
        """The event's time in seconds since the epoch."""
        return self.event_time_us / 1_000_000

    @property
    def query_start_time(self) -> float:
        """The query's start in seconds since the epoch."""
        return self.query_start_time_us / 1_000_000


@dataclass(frozen=True)
class QueryLogObservation:
    """Every logged event of one query id, in order; or the log could not be read.

    ``observable`` is False when ``system.query_log`` does not exist (it appears only
    at its first flush): that says nothing about the query, never "it did not run".
    A reused query id logs once per run, so ``events`` may hold several runs.
    """

    query_id: str
    observable: bool
    events: tuple[QueryLogEvent, ...]


class Termination(enum.Enum):
    """What is known about a query's remote state."""

    FINISHED_OK = "finished_ok"  # the query log records a successful finish
    FAILED = "failed"  # the query log records an exception: it ran and stopped
    KILLED = "killed"  # KILL ... SYNC reported it finished being killed
    NOT_FOUND = "not_found"  # neither running nor logged: never started or log not flushed
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class RemoteState:
    """The observed state of one query id and where the evidence came from."""

    query_id: str
    termination: Termination
    source: str  # "kill_sync", "query_log", "query_log_absent" or "none"

    @property
    def proven_terminal(self) -> bool:
        """True when the server proves the query can no longer change anything."""
        return self.termination in (Termination.FINISHED_OK, Termination.FAILED, Termination.KILLED)


def kill_query(
    transport: QueryPort,
    query_id: str,
    *,
    probe_id: str,
    deadline: float,
    user: str | None = None,
) -> RemoteState:
    """``KILL QUERY WHERE query_id = ... SYNC`` for exactly one id (and ``user`` if given)."""
    where = f"query_id = {quote_literal(query_id)}"
    if user is not None:
        where += f" AND user = {quote_literal(user)}"  # another user's run of the same id
    result = transport.execute(
        read(f"KILL QUERY WHERE {where} SYNC FORMAT JSONEachRow", probe_id), deadline=deadline
    )
    rows = result.json_rows()
    named = [r for r in rows if r.get("query_id") == query_id]
    if named and all(r.get("kill_status") == "finished" for r in named):
        return RemoteState(query_id, Termination.KILLED, "kill_sync")
    return RemoteState(query_id, Termination.UNKNOWN, "none")


def query_log_events(
    transport: QueryPort, query_id: str, *, probe_id: str, deadline: float
) -> QueryLogObservation:
    """All ``system.query_log`` rows of ``query_id`` after a log flush, oldest first."""
    transport.execute(read("SYSTEM FLUSH LOGS", probe_id + "-flush"), deadline=deadline)
    try:
        rows = transport.execute(
            read(
                "SELECT toString(type) AS type,"
                " toUnixTimestamp64Micro(event_time_microseconds) AS event_time_us,"
                " toUnixTimestamp64Micro(query_start_time_microseconds) AS query_start_time_us,"
                " exception_code, user, current_database, query_kind"
                f" FROM system.query_log WHERE query_id = {quote_literal(query_id)}"
                " ORDER BY event_time_microseconds, type FORMAT JSONEachRow",
                probe_id,
            ),
            deadline=deadline,
        ).json_rows()
    except ClickHouseServerError as exc:
        if exc.details.get("clickhouse_code") == UNKNOWN_TABLE:
            return QueryLogObservation(query_id, observable=False, events=())
        raise
    return QueryLogObservation(query_id, True, tuple(_event(row, query_id) for row in rows))


def query_log_state(
    transport: QueryPort,
    query_id: str,
    *,
    probe_id: str,
    deadline: float,
    origin: QueryOrigin | None = None,
) -> RemoteState:
    """The terminal event of ``query_id`` in ``system.query_log`` (after a log flush).

    With ``origin``, only events of a query sent by that user, in that database,
    started within that window count; any other run under the same id is ignored.
    """
    observed = query_log_events(transport, query_id, probe_id=probe_id, deadline=deadline)
    if not observed.observable:
        return RemoteState(query_id, Termination.UNKNOWN, "query_log_absent")
    kinds = {
        e.type
        for e in observed.events
        if e.type in TERMINAL_LOG_TYPES and (origin is None or origin.matches(e))
    }
    if kinds == {"QueryFinish"}:
        return RemoteState(query_id, Termination.FINISHED_OK, "query_log")
    if kinds and kinds <= {"ExceptionBeforeStart", "ExceptionWhileProcessing"}:
        return RemoteState(query_id, Termination.FAILED, "query_log")
    return RemoteState(query_id, Termination.UNKNOWN, "none")


def _event(row: dict[str, object], query_id: str) -> QueryLogEvent:
    try:
        event = QueryLogEvent(**row)  # type: ignore[arg-type]
    except TypeError as exc:
        raise OutcomeUnknown(
            f"query log row of {query_id} has members {sorted(row)}",
            code="invalid_control_output",
            query_id=query_id,
        ) from exc
    ints = (event.event_time_us, event.query_start_time_us, event.exception_code)
    texts = (event.type, event.user, event.current_database, event.query_kind)
    if not all(type(v) is int for v in ints) or not all(isinstance(v, str) for v in texts):
        raise OutcomeUnknown(
            f"query log row of {query_id} has unexpected value types",
            code="invalid_control_output",
            query_id=query_id,
        )
    return event


def prove_termination(
    transport: QueryPort,
    query_id: str,
    *,
    probe_prefix: str,
    deadline: float,
    origin: QueryOrigin | None = None,
    settle_seconds: float = 5.0,
    poll_seconds: float = 0.25,
) -> RemoteState:
    """Kill the query if it still runs, then read its terminal event from the log.

    A server notices a closed connection a moment later, so the observation is
    repeated (reads only, never the mutation) for up to ``settle_seconds``. The answer
    is terminal only with evidence; otherwise UNKNOWN (never a guess). ``origin``
    binds the query-log evidence to the dispatched request (see :class:`QueryOrigin`).
    """
    give_up = time.monotonic() + settle_seconds
    round_ = 0
    while True:
        round_ += 1
        prefix = f"{probe_prefix}-{round_}"
        killed = kill_query(
            transport,
            query_id,
            probe_id=f"{prefix}-kill",
            deadline=deadline,
            user=origin.user if origin is not None else None,
        )
        logged = query_log_state(
            transport, query_id, probe_id=f"{prefix}-log", deadline=deadline, origin=origin
        )
        if logged.proven_terminal:
            return logged
        if killed.proven_terminal:
            return killed
        if time.monotonic() >= give_up:
            return logged if logged.source == "query_log_absent" else killed
        time.sleep(poll_seconds)
