"""Removing a staging table that is proven to be the attempt's own.

Shared by the actors that drop a staging table (the service's cleanup, ``attempts
cleanup``, ``attempts discard`` and the finalizer): each drop has a durable intent, its
own query id and a verified outcome (an acknowledgment or a proven termination, then an
exact observation that the table is gone). :func:`check_bound_endpoint` checks first
that a later actor talks to the server the journal bound. See docs/staging.md ("Failure
and cleanup", "Operator recovery").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dpone.connectors.clickhouse_tables import Ownership, TableObservationError, table_exists
from dpone.connectors.endpoint_identity import (
    EndpointIdentityError,
    observe_identity,
    raise_if_database_missing,
)
from dpone.connectors.remote_termination import prove_termination
from dpone.errors import (
    DeadlineError,
    DponeError,
    StateError,
    TransportError,
    stopping_signals_held,
)
from dpone.ports.clickhouse import QueryPort
from dpone.ports.clickhouse_errors import ClickHouseServerError
from dpone.ports.clickhouse_request import mutation, mutation_query_id
from dpone.sql import quote_identifier
from dpone.staging.contract import StagingError
from dpone.staging.run import (
    SETTLED_ACKNOWLEDGED,
    SETTLED_NOT_SUBMITTED,
    SETTLED_SERVER_ERROR,
    AttemptRun,
    settlement,
)
from dpone.staging.states import StageState

# Failures of an observation: the remote state stays unknown (never assumed).
UNOBSERVABLE = (TransportError, DeadlineError, TableObservationError, EndpointIdentityError)


class CleanupRefused(StagingError):
    """A cleanup step ran and failed: the server refused the DROP, or the table remains."""

    code = "cleanup_failed"


class EndpointMismatch(StateError):
    """The endpoint is not the server (or database) the attempt's journal bound."""

    code = "endpoint_mismatch"


def check_bound_endpoint(
    transport: QueryPort,
    bound: Mapping[str, Any] | None,
    database: str,
    *,
    attempt_id: str,
    probe_prefix: str,
    deadline: float,
) -> dict[str, Any]:
    """The endpoint's identity (reads only); refuses unless it is ``bound``.

    ``bound`` is the identity the attempt's journal recorded (None: it recorded none,
    and the observation is returned unchecked). Raises :class:`EndpointMismatch`
    naming both identities, or the :class:`EndpointIdentityError` of an endpoint
    without a usable identity (with the journal's identity added to its details).
    """
    try:
        observed = observe_identity(
            transport, database, probe_prefix=probe_prefix, deadline=deadline
        ).to_document()
    except EndpointIdentityError as exc:
        exc.add_details(journal_identity=bound, attempt_id=attempt_id)
        raise
    except ClickHouseServerError as exc:
        raise_if_database_missing(
            exc,
            database,
            f"database {database!r} does not exist on this endpoint: it is not where attempt "
            f"{attempt_id} staged; nothing done",
            journal_identity=bound,
            attempt_id=attempt_id,
        )
        raise
    if bound is not None and observed != dict(bound):
        raise EndpointMismatch(
            f"attempt {attempt_id} worked on server {bound.get('server_id')} (database "
            f"{bound.get('database')} uuid {bound.get('database_uuid')}), as its journal binds; "
            f"this endpoint is server {observed['server_id']} (database {observed['database']} "
            f"uuid {observed['database_uuid']}). Nothing was done: point the command at the "
            "server the attempt staged on",
            attempt_id=attempt_id,
            journal_identity=dict(bound),
            observed_identity=observed,
        )
    return observed


def drop_owned_table(
    transport: QueryPort,
    run: AttemptRun,
    state: StageState,
    *,
    kind: str,
    database: str,
    table: str,
    found: Ownership,
    request_seconds: float,
    clock: Callable[[], float],
    read_id: Callable[[str], str],
) -> bool:
    """DROP ``database.table`` (already proven owned as ``found``); True when it is gone.

    False when the DROP's outcome is unknown and its termination is unproven (the
    table may still exist). Raises :class:`CleanupRefused` when the server refused the
    DROP, nothing was sent, or the table is still there afterwards.
    """
    drop_id = mutation_query_id(run.attempt_id, kind)
    deadline = clock() + request_seconds  # before the intent: its window is conservative
    statement = f"DROP TABLE {quote_identifier(database)}.{quote_identifier(table)}"
    try:
        # As for every mutation: a signal while the intent is written is raised once it is
        # durable, and the DROP it announced provably never left.
        with stopping_signals_held():
            run.intent(
                state, kind, drop_id, request_seconds, observed_ownership={"table_uuid": found.uuid}
            )
    except BaseException:
        if run.in_flight == drop_id:
            run.settle(drop_id, SETTLED_NOT_SUBMITTED)
        raise
    try:
        transport.execute(mutation(statement, drop_id), deadline=deadline)
    except DponeError as exc:
        how = settlement(exc)
        if how is not None:
            run.settle(drop_id, how)
            what = "refused" if how == SETTLED_SERVER_ERROR else "never received"
            raise CleanupRefused(
                f"the server {what} the DROP of {database}.{table}: {exc.message}",
                query_id=drop_id,
            ) from exc
        run.returned(drop_id)
        proof = prove_termination(
            transport,
            drop_id,
            probe_prefix=read_id("termination"),
            deadline=clock() + request_seconds,
            origin=run.origin(drop_id),
        )
        run.event(
            state,
            "termination_observed",
            remote={
                "query_id": drop_id,
                "termination": proof.termination.value,
                "source": proof.source,
            },
        )
        if not proof.proven_terminal:
            return False
        run.settle(drop_id, proof.termination.value)
    else:
        run.settle(drop_id, SETTLED_ACKNOWLEDGED)
    if table_exists(transport, database, table, read_id("dropped"), clock() + request_seconds):
        raise CleanupRefused(
            f"{database}.{table} still exists after its DROP",
            code="drop_unverified",
            query_id=drop_id,
        )
    return True
