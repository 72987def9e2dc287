"""Query-log proof when the log cannot be read (a fault a running server rarely shows)."""

from __future__ import annotations

from dpone.connectors.remote_termination import Termination, query_log_events, query_log_state
from dpone.ports.clickhouse_errors import ClickHouseServerError
from dpone.ports.clickhouse_request import ClickHouseRequest
from dpone.ports.clickhouse_result import QueryResult


class LogNotYetFlushed:
    """A server whose system.query_log does not exist yet (before its first flush)."""

    name = "fake"

    def __init__(self) -> None:
        self.sent: list[str] = []

    def execute(self, request: ClickHouseRequest, *, deadline: float) -> QueryResult:
        self.sent.append(request.statement)
        if "system.query_log" in request.statement:
            raise ClickHouseServerError(
                "Code: 60. DB::Exception: Unknown table expression identifier 'system.query_log'",
                query_id=request.query_id,
                clickhouse_code=60,
                status=404,
            )
        return QueryResult(request.query_id, b"", None, None, self.name)


def test_an_absent_query_log_is_unobservable_never_not_run() -> None:
    port = LogNotYetFlushed()
    seen = query_log_events(port, "q-1", probe_id="p-1", deadline=1e18)
    assert seen.observable is False and seen.events == ()
    assert port.sent[0] == "SYSTEM FLUSH LOGS"  # the flush comes first, always
    state = query_log_state(port, "q-1", probe_id="p-2", deadline=1e18)
    assert state.termination is Termination.UNKNOWN and state.source == "query_log_absent"
