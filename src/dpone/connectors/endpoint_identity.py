"""Binding an endpoint to a nonzero server identity and its target database.

``serverUUID()`` is the server's own identity. The managed local server (the chdb
engine) reports the Nil UUID, which is never an identity; there dpone keeps a
persistent identity of its own: the UUID of the database ``_dpone_identity`` on that
server, created once, and records that this is where the identity came from. Creating
it is a mutation: the caller passes ``establish``, which journals a durable intent
and sends the statement under its own query id; without ``establish`` a missing
identity database is an error (a re-check must never create one).

Also here: who the server says the caller is (:func:`observe_principal`) and how
long it has been running (:func:`observe_server_start`).
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
    server_id, source = observe_server_id(
        transport, probe_prefix=probe_prefix, deadline=deadline, establish=establish
    )
    query_id = f"{probe_prefix}-database"
    dbs = _rows(
        transport,
        f"SELECT toString(uuid) AS uuid, engine FROM system.databases WHERE name = {quote_literal(database)}",
        query_id,
        deadline,
    )
    if not dbs:
        raise EndpointIdentityError(
            f"database {database!r} does not exist (or this user may not see it); "
            f"create it with CREATE DATABASE {database} ENGINE = Atomic",
            code="database_missing",
            database=database,
        )
    db = _one_row(dbs, f"database {database!r}", query_id, "uuid", "engine")
    if db["uuid"] == NIL_UUID:
        raise EndpointIdentityError(
            f"database {database!r} has the Nil UUID", code="nil_database_uuid"
        )
    if db["engine"] != "Atomic":
        raise EndpointIdentityError(
            f"database {database!r} has engine {db['engine']}, dpone needs Atomic",
            code="database_not_atomic",
            engine=db["engine"],
        )
    return EndpointIdentity(server_id, source, database, str(db["uuid"]), str(db["engine"]))


def observe_server_id(
    transport: QueryPort,
    *,
    probe_prefix: str,
    deadline: float,
    establish: Callable[[str], object] | None = None,
) -> tuple[str, str]:
    """The server's identity and where it came from (see :func:`observe_identity`)."""
    statement = "SELECT toString(serverUUID()) AS id"
    row = _one(transport, statement, f"{probe_prefix}-server", deadline, "id")
    if str(row["id"]) != NIL_UUID:
        return str(row["id"]), SOURCE_SERVER_UUID
    return _dpone_identity(transport, probe_prefix, deadline, establish), SOURCE_DPONE_TABLE


def _dpone_identity(
    transport: QueryPort,
    probe_prefix: str,
    deadline: float,
    establish: Callable[[str], object] | None,
) -> str:
    # The database's own UUID, assigned by the server at creation and persisted with
    # it, is the identity: it needs no data rows. It is created only when missing, so
    # a user without CREATE DATABASE can stage once an administrator created it.
    statement = (
        "SELECT toString(uuid) AS uuid FROM system.databases "
        f"WHERE name = {quote_literal(IDENTITY_DATABASE)}"
    )
    query_id = f"{probe_prefix}-identity"
    rows = _rows(transport, statement, query_id, deadline)
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
        rows = _rows(transport, statement, query_id, deadline)
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
    server's word). ``system.users`` needs a grant
    that a user limited to its databases lacks (checked on the managed server: code
    497); then ``user_uuid`` is None and only an administrator can observe it
    (:func:`observe_user_uuid`).
    """
    row = _one(transport, "SELECT currentUser() AS user", f"{probe_prefix}-user", deadline, "user")
    user = user if user is not None else str(row["user"])
    if row["user"] != user:
        raise EndpointIdentityError(
            f"the server serves user {row['user']!r}, the credentials name {user!r}",
            code="principal_mismatch",
        )
    try:
        uuid = observe_user_uuid(
            transport, user, query_id=f"{probe_prefix}-user-id", deadline=deadline
        )
    except ClickHouseServerError as exc:
        if exc.details.get("clickhouse_code") not in (ACCESS_DENIED, str(ACCESS_DENIED)):
            raise
        uuid = None
    return {"user": user, "user_uuid": uuid}


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
