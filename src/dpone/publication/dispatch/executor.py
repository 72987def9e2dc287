"""The publication's mutations, rendered here and sent once as the publisher principal.

:class:`ClickHouseSnapshotExecutor` sends three statements, each with its own query id
and never retried: ``create_target`` (a first publication's empty target, rendered from
``system.columns`` and ``engine_full``, since ``CREATE TABLE ... AS`` would copy the
generation's ownership mark), ``drop_created_target`` (that table again, when its
prepare was refused after the CREATE) and ``exchange`` (the EXCHANGE, in a drain-gated
HTTP session). Each holds the dispatch gate
(:mod:`~dpone.publication.dispatch.dispatch_gate`), re-checks its lease and the claim
(:class:`~dpone.publication.dispatch.dispatch_notes.DispatchGuard`) and notes its steps
before a request leaves. A complete acknowledgment is ACKNOWLEDGED, ClickHouse's own
numbered exception REFUSED, a request provably never sent NOT_SENT, anything else
UNKNOWN. A reused query id protects nothing (the server swaps the tables back), so only
the store's single claim may lead here. See docs/publication-principals.md ("The
executor").
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.connectors.clickhouse_tables import table_rows
from dpone.contracts.composition_snapshot import (
    QUERY_ID_PREFIX,
    SnapshotIntent,
    exchange_query_id,
    exchange_session_id,
)
from dpone.errors import DponeError, StateError
from dpone.ports.clickhouse import QueryPort
from dpone.ports.clickhouse_errors import (
    ClickHouseServerError,
    NotSubmitted,
    TransportDeadline,
)
from dpone.ports.clickhouse_request import (
    ClickHouseRequest,
    Credentials,
    Endpoint,
    RequestKind,
    read,
)
from dpone.ports.composition_snapshot import (
    DispatchOutcome,
    DispatchResult,
    IssuedPrincipal,
    TargetSlot,
)
from dpone.publication.dispatch.dispatch_gate import Gate
from dpone.publication.dispatch.dispatch_notes import (
    BEFORE_EXCHANGE,
    BEFORE_SESSION,
    OPENING,
    REFUSED,
    DispatchGuard,
    DispatchRefused,
)
from dpone.sql import quote_identifier, quote_literal

# T: how long the drain-gate session outlives its last request. The authority's
# closure waits this long plus the margin after the last answer before its probe, so
# both are kept short: the shortest measured safe on the managed server (372 came
# reliably from T + 2 s for T = 1, 2 and 5).
SESSION_TIMEOUT_SECONDS = 1
SESSION_MARGIN_SECONDS = 2.0
REQUEST_SECONDS = 30.0
TransportFactory = Callable[[Endpoint, Credentials], QueryPort]
# Parts of a column list that the rendering below does not reproduce.
_UNRENDERED = (" TTL ", "INDEX ", "PROJECTION ", "CONSTRAINT ")


class ExecutorError(StateError):
    """A dispatch was refused before anything was sent (see ``code``)."""

    code = "executor_error"


def session_open_query_id(intent_sha256: str) -> str:
    """The query id of the request that opens an intent's drain-gate session."""
    return f"{QUERY_ID_PREFIX}-{intent_sha256[:32]}-session-open"


def session_request(
    statement: str,
    query_id: str,
    kind: RequestKind,
    *,
    session_id: str,
    session_timeout: int,
    check: bool,
    close: bool = False,
) -> ClickHouseRequest:
    """A request inside HTTP session ``session_id``.

    ``session_id``, ``session_timeout``, ``session_check`` and ``close_session`` (the
    server ends the session with this request) are URL parameters of the HTTP
    interface; the request's settings travel as URL parameters too, which is all the
    HTTP transport needs (the client transport has no sessions).
    """
    settings = [("session_id", session_id), ("session_timeout", str(int(session_timeout)))]
    if check:
        settings.append(("session_check", "1"))
    if close:
        settings.append(("close_session", "1"))
    return ClickHouseRequest(statement, query_id, kind, settings=tuple(settings))


def settle(send: Callable[[], Any], query_id: str, session_id: str | None = None) -> DispatchResult:
    """Send once and map the outcome; never retries."""
    try:
        send()
    except ClickHouseServerError as exc:
        code = exc.details.get("clickhouse_code")
        if isinstance(code, int):
            return DispatchResult(DispatchOutcome.REFUSED, query_id, session_id, code, exc.code)
        return DispatchResult(DispatchOutcome.UNKNOWN, query_id, session_id, None, exc.code)
    except NotSubmitted as exc:
        return DispatchResult(DispatchOutcome.NOT_SENT, query_id, session_id, None, exc.code)
    except TransportDeadline as exc:
        # The transport checks the deadline before the first byte and says so.
        sent = exc.details.get("submitted") is not False
        outcome = DispatchOutcome.UNKNOWN if sent else DispatchOutcome.NOT_SENT
        return DispatchResult(outcome, query_id, session_id, None, exc.code)
    except Exception as exc:  # whatever else happened, the statement may have run
        code = exc.code if isinstance(exc, DponeError) else type(exc).__name__
        return DispatchResult(DispatchOutcome.UNKNOWN, query_id, session_id, None, code)
    return DispatchResult(DispatchOutcome.ACKNOWLEDGED, query_id, session_id)


class ClickHouseSnapshotExecutor:
    """Sends the publication's statements as the issued publisher; see the module doc."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        dispatch_gate: Gate,
        guard: DispatchGuard,
        transport_factory: TransportFactory = HttpTransport,
        session_timeout: int = SESSION_TIMEOUT_SECONDS,
        request_seconds: float = REQUEST_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """``guard`` re-checks the lease and the claim and notes each step durably;
        ``wall_clock`` (Unix seconds) stamps the answers closure counts its wait from."""
        self.endpoint = endpoint
        self.dispatch_gate = dispatch_gate
        self.guard = guard
        self._wall_clock = wall_clock
        self.session_timeout = session_timeout
        self._factory = transport_factory
        self._request_seconds = request_seconds
        self._clock = clock

    # ------------------------------------------------------------------ create

    def create_target(
        self, slot: TargetSlot, generation_table: str, query_id: str, principal: IssuedPrincipal
    ) -> DispatchResult:
        """Create the empty target with the generation's design (see the module doc)."""
        with self.dispatch_gate.held_for_slot(slot.database, slot.table, principal.ref.user):
            refused = self._lease_refused(principal, "before_create", query_id)
            if refused is not None:
                return refused
            transport = self._factory(self.endpoint, principal.credentials)
            try:
                statement = self.render_create_target(transport, slot, generation_table, query_id)
            except DponeError as exc:
                # Only reads ran: the CREATE itself provably never left.
                return DispatchResult(DispatchOutcome.NOT_SENT, query_id, None, None, exc.code)
            request = ClickHouseRequest(statement, query_id, RequestKind.MUTATION)
            return settle(lambda: transport.execute(request, deadline=self._deadline()), query_id)

    def render_create_target(
        self, transport: QueryPort, slot: TargetSlot, generation_table: str, query_id: str
    ) -> str:
        """``CREATE TABLE db.target (<columns>) ENGINE = <engine_full>``, from the server."""
        where = (
            f"database = {quote_literal(slot.database)} AND "
            f"{{name}} = {quote_literal(generation_table)}"
        )
        tables = transport.execute(
            read(
                "SELECT engine, engine_full, create_table_query FROM system.tables WHERE "
                + where.format(name="name")
                + " FORMAT JSONEachRow",
                f"{query_id}-read-table",
            ),
            deadline=self._deadline(),
        ).json_rows()
        if len(tables) != 1 or not tables[0].get("engine_full"):
            raise ExecutorError(
                f"generation {slot.database}.{generation_table} is not one table with an engine",
                code="generation_unobservable",
                rows=len(tables),
            )
        head = str(tables[0]["create_table_query"]).split(") ENGINE = ")[0]
        unrendered = [token.strip() for token in _UNRENDERED if token in head]
        if unrendered:
            raise ExecutorError(
                f"generation {generation_table} has {', '.join(unrendered)} in its column list, "
                "which the empty target's CREATE does not reproduce",
                code="design_unrenderable",
                parts=unrendered,
            )
        columns = transport.execute(
            read(
                "SELECT name, type, default_kind, default_expression, compression_codec "
                "FROM system.columns WHERE "
                + where.format(name="table")
                + " ORDER BY position FORMAT JSONEachRow",
                f"{query_id}-read-columns",
            ),
            deadline=self._deadline(),
        ).json_rows()
        if not columns:
            raise ExecutorError(
                f"generation {generation_table} shows no columns", code="generation_unobservable"
            )
        rendered = ", ".join(_column(c) for c in columns)
        return (
            f"CREATE TABLE {_qualified(slot.database, slot.table)} ({rendered}) "
            f"ENGINE = {tables[0]['engine_full']}"
        )

    def drop_created_target(
        self, slot: TargetSlot, table_uuid: str, query_id: str, principal: IssuedPrincipal
    ) -> DispatchResult:
        """A refused first prepare: DROP the empty target it created, verified first.

        Under the dispatch gate, the target is read: the DROP is sent only while the
        name still holds the table of ``table_uuid`` (the one the prepare observed right
        after its CREATE) with no row; otherwise it is NOT_SENT with the reason. An
        acknowledged DROP is verified: no table of that UUID is left.
        """
        with self.dispatch_gate.held_for_slot(slot.database, slot.table, principal.ref.user):
            refused = self._lease_refused(principal, "before_drop", query_id)
            if refused is not None:
                return refused
            transport = self._factory(self.endpoint, principal.credentials)
            try:
                rows = self._rows_of(transport, slot, table_uuid, f"{query_id}-read")
            except DponeError as exc:
                return DispatchResult(DispatchOutcome.NOT_SENT, query_id, None, None, exc.code)
            if rows != 0:
                reason = "target_not_ours" if rows is None else "target_not_empty"
                return DispatchResult(DispatchOutcome.NOT_SENT, query_id, None, None, reason)
            statement = f"DROP TABLE {_qualified(slot.database, slot.table)} SYNC"
            request = ClickHouseRequest(statement, query_id, RequestKind.MUTATION)
            result = settle(lambda: transport.execute(request, deadline=self._deadline()), query_id)
            if result.outcome is not DispatchOutcome.ACKNOWLEDGED:
                return result
            try:
                left = self._rows_of(transport, slot, table_uuid, f"{query_id}-verify")
            except DponeError as exc:
                return DispatchResult(DispatchOutcome.UNKNOWN, query_id, None, None, exc.code)
            if left is not None:
                return DispatchResult(
                    DispatchOutcome.UNKNOWN, query_id, None, None, "target_still_present"
                )
            return result

    def _lease_refused(
        self, principal: IssuedPrincipal, step: str, query_id: str
    ) -> DispatchResult | None:
        """Under the gate: NOT_SENT (``lease_ended``...) unless the lease still holds."""
        try:
            self.guard.check_lease(principal, step)
        except DispatchRefused as exc:
            return DispatchResult(DispatchOutcome.NOT_SENT, query_id, None, None, exc.code)
        return None

    def _rows_of(
        self, transport: QueryPort, slot: TargetSlot, table_uuid: str, query_id: str
    ) -> int | None:
        return table_rows(
            transport, slot.database, slot.table, table_uuid, query_id, self._deadline()
        )

    # ------------------------------------------------------------------ exchange

    def exchange(self, intent: SnapshotIntent, principal: IssuedPrincipal) -> DispatchResult:
        """Open the intent's session, then send its one EXCHANGE in it (see the module doc)."""
        bound = intent.publisher
        ref = principal.ref
        if (ref.user, ref.user_uuid, ref.lease_id) != (bound.user, bound.user_uuid, bound.lease_id):
            raise ExecutorError(
                f"principal {ref.user} (lease {ref.lease_id}) is not the intent's publisher "
                f"{bound.user} (lease {bound.lease_id})",
                code="principal_mismatch",
                intent_sha256=intent.sha256,
            )
        query_id = exchange_query_id(intent.sha256)
        session_id = exchange_session_id(intent.sha256)
        with self.dispatch_gate.held_for_slot(
            intent.database, intent.target_table, principal.ref.user
        ):
            refused = self._recheck(intent, principal, BEFORE_SESSION, session_id)
            if refused is not None:
                return refused
            transport = self._factory(self.endpoint, principal.credentials)
            opened = self._send(
                intent,
                "session_open_answered",
                lambda: transport.execute(
                    self._request(intent, "SELECT 1", session_open_query_id(intent.sha256), False),
                    deadline=self._deadline(),
                ),
                query_id,
                session_id,
            )
            if opened.outcome is not DispatchOutcome.ACKNOWLEDGED:
                # No session, no EXCHANGE: the statement itself never left.
                return DispatchResult(
                    DispatchOutcome.NOT_SENT,
                    query_id,
                    session_id,
                    opened.clickhouse_code,
                    f"session_open_{opened.outcome.value}",
                )
            refused = self._recheck(intent, principal, BEFORE_EXCHANGE, session_id)
            if refused is not None:
                return refused
            statement = (
                f"EXCHANGE TABLES {_qualified(intent.database, intent.target_table)} "
                f"AND {_qualified(intent.database, intent.generation_table)}"
            )
            request = self._request(intent, statement, query_id, True)
            return self._send(
                intent,
                "exchange_answered",
                lambda: transport.execute(request, deadline=self._deadline()),
                query_id,
                session_id,
            )

    def _request(
        self, intent: SnapshotIntent, statement: str, query_id: str, check: bool
    ) -> ClickHouseRequest:
        kind = RequestKind.MUTATION if check else RequestKind.READ
        return session_request(
            statement,
            query_id,
            kind,
            session_id=exchange_session_id(intent.sha256),
            session_timeout=self.session_timeout,
            check=check,
        )

    def _recheck(
        self, intent: SnapshotIntent, principal: IssuedPrincipal, step: str, session_id: str
    ) -> DispatchResult | None:
        """Under the gate: the lease and the claim still hold, and the step is noted first.

        Returns the NOT_SENT result (noted with its reason) when they do not, or when the
        note cannot be written (nothing may leave without its note).
        """
        query_id = exchange_query_id(intent.sha256)
        try:
            self.guard.check(intent, principal, step)
        except DispatchRefused as exc:
            with _ignored():  # the refusal is returned either way; the note is best effort
                self.guard.note(
                    intent.sha256,
                    {"step": REFUSED, "at": step, "session_id": session_id, "reason": exc.code},
                )
            opened = None if step == BEFORE_SESSION else session_id
            return DispatchResult(DispatchOutcome.NOT_SENT, query_id, opened, None, exc.code)
        if step != BEFORE_SESSION:
            return None
        try:
            self.guard.note(
                intent.sha256,
                {"step": OPENING, "session_id": session_id, "at_us": self._wall_us()},
            )
        except DponeError as exc:
            return DispatchResult(DispatchOutcome.NOT_SENT, query_id, None, None, exc.code)
        return None

    def _send(
        self,
        intent: SnapshotIntent,
        step: str,
        send: Callable[[], Any],
        query_id: str,
        session_id: str,
    ) -> DispatchResult:
        """Send once (:func:`settle`), then note when and how the request answered."""
        result = settle(send, query_id, session_id)
        note = {
            "step": step,
            "session_id": session_id,
            "answered_at_us": self._wall_us(),
            "outcome": result.outcome.value,
            "clickhouse_code": result.clickhouse_code,
            "reason": result.error_code,
        }
        # Without this note closure waits the full T from its own start: still safe.
        with _ignored():
            self.guard.note(intent.sha256, note)
        return result

    def _wall_us(self) -> int:
        return int(self._wall_clock() * 1_000_000)

    def _deadline(self) -> float:
        return self._clock() + self._request_seconds


def _ignored() -> contextlib.AbstractContextManager[None]:
    return contextlib.suppress(DponeError)


def _qualified(database: str, table: str) -> str:
    return f"{quote_identifier(database)}.{quote_identifier(table)}"


def _column(row: dict[str, Any]) -> str:
    parts = [quote_identifier(str(row["name"])), str(row["type"])]
    if row.get("default_kind"):
        parts.append(str(row["default_kind"]))
        if row.get("default_expression"):
            parts.append(str(row["default_expression"]))
    if row.get("compression_codec"):
        parts.append(str(row["compression_codec"]))
    return " ".join(parts)
