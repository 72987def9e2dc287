"""Binding an endpoint to a nonzero server identity and its target database.

``serverUUID()`` is the server's own identity; where it is Nil (the managed server)
dpone uses the UUID of its ``_dpone_identity`` database and records that source.
Creating that database is a mutation: only a caller that passes ``establish`` (which
journals a durable intent and sends it under its own query id) creates it, and a
re-check never does. Also here: who the server says the caller is
(:func:`observe_principal`) and when it started (:func:`observe_server_start`). See
docs/transports.md ("Endpoint identity").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dpone.errors import StateError
from dpone.ports.clickhouse import QueryPort
from dpone.ports.clickhouse_errors import ClickHouseServerError
from dpone.ports.clickhouse_request import read
from dpone.sql import quote_literal

NIL_UUID = "00000000-0000-0000-0000-000000000000"
IDENTITY_DATABASE = "_dpone_identity"
SOURCE_SERVER_UUID = "server_uuid"
SOURCE_DPONE_TABLE = "dpone_identity_table"
IDENTITY_CREATE = f"CREATE DATABASE IF NOT EXISTS {IDENTITY_DATABASE} ENGINE = Atomic"
ACCESS_DENIED = 497


class EndpointIdentityError(StateError):
    """The endpoint has no usable identity or the database is not what dpone needs."""

    code = "endpoint_identity"


@dataclass(frozen=True)
class EndpointIdentity:
    """Server identity (with its source) and the target database's UUID and engine."""

    server_id: str
    server_id_source: str
    database: str
    database_uuid: str
    database_engine: str

    def to_document(self) -> dict[str, Any]:
        return {
            "server_id": self.server_id,
            "server_id_source": self.server_id_source,
            "database": self.database,
            "database_uuid": self.database_uuid,
            "database_engine": self.database_engine,
        }


def _one_row(rows: list[dict[str, Any]], what: str, query_id: str, *members: str) -> dict[str, Any]:
    """The only row of ``rows`` with ``members``; a row without one is unobservable."""
    if len(rows) != 1:
        raise EndpointIdentityError(
            f"{what}: expected one row from query {query_id}, got {len(rows)}",
            code="identity_unobservable",
            query_id=query_id,
        )
    try:
        return {member: rows[0][member] for member in members}
    except KeyError as exc:
        raise EndpointIdentityError(
            f"{what}: the row from query {query_id} has no member {exc.args[0]!r} "
            f"(it has {sorted(rows[0])!r:.200})",
            code="identity_unobservable",
            query_id=query_id,
            member=exc.args[0],
        ) from exc


def _rows(
    transport: QueryPort, statement: str, query_id: str, deadline: float
) -> list[dict[str, Any]]:
    return transport.execute(
        read(f"{statement} FORMAT JSONEachRow", query_id), deadline=deadline
    ).json_rows()


def _one(
    transport: QueryPort, statement: str, query_id: str, deadline: float, *members: str
) -> dict[str, Any]:
    """The one row ``statement`` answers, with ``members`` (named by the statement)."""
    return _one_row(_rows(transport, statement, query_id, deadline), statement, query_id, *members)


# ClickHouse's error code for a database that does not exist. Every request names its
# endpoint's database, so the first request on a wrong endpoint answers with it.
UNKNOWN_DATABASE = 81


def raise_if_database_missing(
    exc: ClickHouseServerError, database: str, message: str, **details: Any
) -> None:
    """Raise ``database_missing`` (``message``) when ``exc`` says ``database`` does not exist.

    Otherwise return, and the caller re-raises ``exc`` itself.
    """
    if exc.details.get("clickhouse_code") == UNKNOWN_DATABASE:
        raise EndpointIdentityError(
            message, code="database_missing", database=database, **details
        ) from exc


def observe_identity(
    transport: QueryPort,
    database: str,
    *,
    probe_prefix: str,
    deadline: float,
    establish: Callable[[str], object] | None = None,
) -> EndpointIdentity:
    """Observe the endpoint identity; on a Nil-UUID server, ``establish`` creates it once.

    Also proves the target database exists and is ``Atomic`` (EXCHANGE TABLES needs it).
    """
    # The server's identity, the identity database's and the target database's rows in
    # one request: one round trip, and one moment of the server for all three.
    query_id = f"{probe_prefix}-endpoint"
    rows = _rows(transport, _endpoint_sql(database), query_id, deadline)
    return identity_of_rows(
        transport,
        database,
        rows,
        query_id,
        probe_prefix=probe_prefix,
        deadline=deadline,
        establish=establish,
    )


def identity_of_rows(
    transport: QueryPort,
    database: str,
    rows: list[dict[str, Any]],
    query_id: str,
    *,
    probe_prefix: str,
    deadline: float,
    establish: Callable[[str], object] | None = None,
) -> EndpointIdentity:
    """The identity :func:`observe_identity` proves from ``rows``, the answer of query
    ``query_id`` to a SELECT of :func:`endpoint_columns` (alone or with other columns).
    """
    row = _one_row(rows, "endpoint identity", query_id, *ENDPOINT_MEMBERS)
    identities, uuids, engines = (_texts(row, m, query_id) for m in ENDPOINT_MEMBERS[1:])
    server_id, source = _text(row, "id", query_id), SOURCE_SERVER_UUID
    if server_id == NIL_UUID:
        server_id, source = (
            _dpone_identity(transport, identities, probe_prefix, deadline, establish, query_id),
            SOURCE_DPONE_TABLE,
        )
    if not uuids:
        raise EndpointIdentityError(
            f"database {database!r} does not exist (or this user may not see it); "
            f"create it with CREATE DATABASE {database} ENGINE = Atomic",
            code="database_missing",
            database=database,
        )
    if len(uuids) != 1 or len(engines) != 1:
        raise EndpointIdentityError(
            f"database {database!r}: expected one row from query {query_id}, got {len(uuids)}",
            code="identity_unobservable",
            query_id=query_id,
        )
    if uuids[0] == NIL_UUID:
        raise EndpointIdentityError(
            f"database {database!r} has the Nil UUID", code="nil_database_uuid"
        )
    if engines[0] != "Atomic":
        raise EndpointIdentityError(
            f"database {database!r} has engine {engines[0]}, dpone needs Atomic",
            code="database_not_atomic",
            engine=engines[0],
        )
    return EndpointIdentity(server_id, source, database, uuids[0], engines[0])


ENDPOINT_MEMBERS = ("id", "identity", "database_uuid", "database_engine")
# An aggregate over nothing (a database that does not exist) answers an empty array,
# whatever a user's profile sets (empty_result_for_aggregation_by_empty_set = 1 would
# make the scalar subquery an error).
EMPTY_SET_ANSWERS = " SETTINGS empty_result_for_aggregation_by_empty_set = 0"
_IDENTITY_SQL = (
    "SELECT toString(uuid) AS uuid FROM system.databases "
    f"WHERE name = {quote_literal(IDENTITY_DATABASE)}"
)


def endpoint_columns(database: str) -> str:
    """The select list of the endpoint read (:data:`ENDPOINT_MEMBERS`): serverUUID(),
    and as arrays (empty: no such database) the identity database's UUID and the target
    database's UUID and engine. Its statement needs :data:`EMPTY_SET_ANSWERS`."""
    named = f"FROM system.databases WHERE name = {quote_literal(database)}"
    return (
        "toString(serverUUID()) AS id, "
        f"(SELECT groupArray(uuid) FROM ({_IDENTITY_SQL})) AS identity, "
        f"(SELECT groupArray(toString(uuid)) {named}) AS database_uuid, "
        f"(SELECT groupArray(engine) {named}) AS database_engine"
    )


def _endpoint_sql(database: str) -> str:
    return f"SELECT {endpoint_columns(database)}{EMPTY_SET_ANSWERS}"


def _text(row: dict[str, Any], member: str, query_id: str) -> str:
    value = row[member]
    if not isinstance(value, str):
        raise EndpointIdentityError(
            f"the row from query {query_id} has {member} {value!r:.100}, not a text",
            code="identity_unobservable",
            query_id=query_id,
            member=member,
        )
    return value


def _texts(row: dict[str, Any], member: str, query_id: str) -> list[str]:
    value = row[member]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise EndpointIdentityError(
            f"the row from query {query_id} has {member} {value!r:.100}, not a list of texts",
            code="identity_unobservable",
            query_id=query_id,
            member=member,
        )
    return value


def observe_server_id(
    transport: QueryPort,
    *,
    probe_prefix: str,
    deadline: float,
    establish: Callable[[str], object] | None = None,
) -> tuple[str, str]:
    """The server's identity and where it came from (see :func:`observe_identity`)."""
    query_id = f"{probe_prefix}-server"
    statement = (
        f"SELECT toString(serverUUID()) AS id, (SELECT groupArray(uuid) FROM ({_IDENTITY_SQL})) "
        f"AS identity{EMPTY_SET_ANSWERS}"
    )
    row = _one(transport, statement, query_id, deadline, "id", "identity")
    server_id = _text(row, "id", query_id)
    if server_id != NIL_UUID:
        return server_id, SOURCE_SERVER_UUID
    identities = _texts(row, "identity", query_id)
    return _dpone_identity(transport, identities, probe_prefix, deadline, establish, query_id), (
        SOURCE_DPONE_TABLE
    )


def _dpone_identity(
    transport: QueryPort,
    identities: list[str],
    probe_prefix: str,
    deadline: float,
    establish: Callable[[str], object] | None,
    query_id: str,
) -> str:
    # The database's own UUID, assigned by the server at creation and persisted with
    # it, is the identity: it needs no data rows. It is created only when missing, so
    # a user without CREATE DATABASE can stage once an administrator created it.
    rows = [{"uuid": uuid} for uuid in identities]
    if not rows and establish is not None:
        try:
            establish(IDENTITY_CREATE)
        except ClickHouseServerError as exc:
            raise EndpointIdentityError(
                "this server reports a Nil serverUUID() and dpone cannot create its identity "
                f"database {IDENTITY_DATABASE}: {exc.message}",
                code="identity_unavailable",
            ) from exc
        query_id = f"{probe_prefix}-identity-created"
        rows = _rows(transport, _IDENTITY_SQL, query_id, deadline)
    if not rows:
        raise EndpointIdentityError(
            f"this server reports a Nil serverUUID() and its dpone identity database "
            f"{IDENTITY_DATABASE} does not exist (or this user may not see it)",
            code="identity_unavailable",
        )
    row = _one_row(rows, "dpone identity database", query_id, "uuid")
    if row["uuid"] == NIL_UUID:
        raise EndpointIdentityError(
            "dpone identity database has the Nil UUID", code="identity_unavailable"
        )
    return str(row["uuid"])


def observe_principal(
    transport: QueryPort, user: str | None, *, probe_prefix: str, deadline: float
) -> dict[str, str | None]:
    """``{"user", "user_uuid"}``: the user the server says it serves, and its id.

    The server must name the user the credentials name (``user``; None takes the
    server's word). Both are asked in one request. ``system.users`` needs a grant
    that a user limited to its databases lacks (checked on the managed server: code
    497); then ``currentUser()`` is asked alone, ``user_uuid`` is None and only an
    administrator can observe it (:func:`observe_user_uuid`).
    """
    query_id = f"{probe_prefix}-user"
    named = "currentUser()" if user is None else quote_literal(user)
    both = (
        "SELECT currentUser() AS user, (SELECT groupArray(toString(id)) FROM system.users "
        f"WHERE name = {named}) AS ids{EMPTY_SET_ANSWERS}"
    )
    try:
        row = _one(transport, both, query_id, deadline, "user", "ids")
    except ClickHouseServerError as exc:
        if exc.details.get("clickhouse_code") not in (ACCESS_DENIED, str(ACCESS_DENIED)):
            raise
        query_id = f"{probe_prefix}-user-only"
        row = _one(transport, "SELECT currentUser() AS user", query_id, deadline, "user")
    user = user if user is not None else str(row["user"])
    if row["user"] != user:
        raise EndpointIdentityError(
            f"the server serves user {row['user']!r}, the credentials name {user!r}",
            code="principal_mismatch",
        )
    if "ids" not in row:
        return {"user": user, "user_uuid": None}
    ids = [{"id": i} for i in _texts(row, "ids", query_id)]
    uuid = _one_row(ids, f"the id of user {user!r}", query_id, "id")["id"]
    return {"user": user, "user_uuid": str(uuid)}


def observe_user_uuid(transport: QueryPort, user: str, *, query_id: str, deadline: float) -> str:
    """``system.users.id`` of ``user`` as text (needs SELECT on system.users)."""
    statement = f"SELECT toString(id) AS id FROM system.users WHERE name = {quote_literal(user)}"
    row = _one(transport, statement, query_id, deadline, "id")
    return str(row["id"])


def observe_server_start(
    transport: QueryPort,
    *,
    query_id: str,
    deadline: float,
    wall_clock: Callable[[], float] = time.time,
) -> float:
    """A lower bound of the server's start, on this machine's wall clock (seconds).

    The server started ``uptime()`` whole seconds (rounded down) before it answered,
    and it answered after this call began: ``began - uptime - 1`` is earlier than the
    start whatever the two clocks say (no clock skew enters).
    """
    began = wall_clock()
    row = _one(transport, "SELECT uptime() AS up", query_id, deadline, "up")
    up = row["up"]
    if isinstance(up, bool) or not isinstance(up, int) or up < 0:
        raise EndpointIdentityError(f"uptime() returned {up!r}", code="identity_unobservable")
    return began - up - 1
