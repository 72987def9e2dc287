"""Proving that a query has stopped on the server.

Stopping local I/O says nothing about the server: a query keeps running when its
connection is lost. Remote completion is proven only by
``KILL QUERY WHERE query_id = '<id>' SYNC`` output that names that query as finished,
or by ``system.query_log`` entries that record the query's terminal event. Empty or
missing output is unknown. Never a wildcard KILL: the statement always names one id.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass

from dpone.connectors.clickhouse_request import read
from dpone.ports.clickhouse import QueryPort
from dpone.sql import quote_literal

TERMINAL_LOG_TYPES = ("QueryFinish", "ExceptionBeforeStart", "ExceptionWhileProcessing")


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
    source: str  # "kill_sync", "query_log" or "none"

    @property
    def proven_terminal(self) -> bool:
        """True when the server proves the query can no longer change anything."""
        return self.termination in (Termination.FINISHED_OK, Termination.FAILED, Termination.KILLED)


def kill_query(
    transport: QueryPort, query_id: str, *, probe_id: str, deadline: float
) -> RemoteState:
    """``KILL QUERY WHERE query_id = ... SYNC`` for exactly one id."""
    result = transport.execute(
        read(
            f"KILL QUERY WHERE query_id = {quote_literal(query_id)} SYNC FORMAT JSONEachRow",
            probe_id,
        ),
        deadline=deadline,
    )
    rows = result.json_rows()
    named = [r for r in rows if r.get("query_id") == query_id]
    if named and all(r.get("kill_status") == "finished" for r in named):
        return RemoteState(query_id, Termination.KILLED, "kill_sync")
    return RemoteState(query_id, Termination.UNKNOWN, "none")


def query_log_state(
    transport: QueryPort, query_id: str, *, probe_id: str, deadline: float
) -> RemoteState:
    """The terminal event of ``query_id`` in ``system.query_log`` (after a log flush)."""
    transport.execute(read("SYSTEM FLUSH LOGS", probe_id + "-flush"), deadline=deadline)
    types = ", ".join(quote_literal(t) for t in TERMINAL_LOG_TYPES)
    rows = transport.execute(
        read(
            "SELECT toString(type) AS type FROM system.query_log "
            f"WHERE query_id = {quote_literal(query_id)} AND type IN ({types}) FORMAT JSONEachRow",
            probe_id,
        ),
        deadline=deadline,
    ).json_rows()
    kinds = {r.get("type") for r in rows}
    if "QueryFinish" in kinds and len(kinds) == 1:
        return RemoteState(query_id, Termination.FINISHED_OK, "query_log")
    if kinds and kinds <= {"ExceptionBeforeStart", "ExceptionWhileProcessing"}:
        return RemoteState(query_id, Termination.FAILED, "query_log")
    return RemoteState(query_id, Termination.UNKNOWN, "none")


def prove_termination(
    transport: QueryPort,
    query_id: str,
    *,
    probe_prefix: str,
    deadline: float,
    settle_seconds: float = 5.0,
    poll_seconds: float = 0.25,
) -> RemoteState:
    """Kill the query if it still runs, then read its terminal event from the log.

    A server notices a closed connection a moment later, so the observation is
    repeated (reads only, never the mutation) for up to ``settle_seconds``. The answer
    is terminal only with evidence; otherwise UNKNOWN (never a guess).
    """
    give_up = time.monotonic() + settle_seconds
    round_ = 0
    while True:
        round_ += 1
        prefix = f"{probe_prefix}-{round_}"
        killed = kill_query(transport, query_id, probe_id=f"{prefix}-kill", deadline=deadline)
        logged = query_log_state(transport, query_id, probe_id=f"{prefix}-log", deadline=deadline)
        if logged.proven_terminal:
            return logged
        if killed.proven_terminal or time.monotonic() >= give_up:
            return killed
        time.sleep(poll_seconds)
