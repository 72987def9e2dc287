"""Binding an endpoint to a nonzero server identity and its target database.

``serverUUID()`` is the server's own identity. The managed local server (the chdb
engine) reports the Nil UUID, which is never an identity; there dpone keeps a
persistent identity of its own in ``_dpone_identity.server`` on that server, created
once, and records that this is where the identity came from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dpone.connectors.clickhouse_errors import ClickHouseServerError
from dpone.connectors.clickhouse_request import mutation, read
from dpone.errors import StateError
from dpone.ports.clickhouse import QueryPort
from dpone.sql import quote_literal

NIL_UUID = "00000000-0000-0000-0000-000000000000"
IDENTITY_DATABASE = "_dpone_identity"
SOURCE_SERVER_UUID = "server_uuid"
SOURCE_DPONE_TABLE = "dpone_identity_table"


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


def _one_row(rows: list[dict[str, Any]], what: str) -> dict[str, Any]:
    if len(rows) != 1:
        raise EndpointIdentityError(
            f"{what}: expected one row, got {len(rows)}", code="identity_unobservable"
        )
    return rows[0]


def observe_identity(
    transport: QueryPort, database: str, *, probe_prefix: str, deadline: float
) -> EndpointIdentity:
    """Observe (and, on a Nil-UUID server, establish once) the endpoint identity."""
    row = _one_row(
        transport.execute(
            read(
                "SELECT toString(serverUUID()) AS id FORMAT JSONEachRow", f"{probe_prefix}-server"
            ),
            deadline=deadline,
        ).json_rows(),
        "serverUUID()",
    )
    server_id, source = str(row["id"]), SOURCE_SERVER_UUID
    if server_id == NIL_UUID:
        server_id, source = _dpone_identity(transport, probe_prefix, deadline), SOURCE_DPONE_TABLE
    db = _one_row(
        transport.execute(
            read(
                "SELECT toString(uuid) AS uuid, engine FROM system.databases "
                f"WHERE name = {quote_literal(database)} FORMAT JSONEachRow",
                f"{probe_prefix}-database",
            ),
            deadline=deadline,
        ).json_rows(),
        f"database {database!r}",
    )
    if db["uuid"] == NIL_UUID:
        raise EndpointIdentityError(
            f"database {database!r} has the Nil UUID", code="nil_database_uuid"
        )
    if db["engine"] != "Atomic":
        raise EndpointIdentityError(
            f"database {database!r} has engine {db['engine']}, dpone needs Atomic",
            code="database_not_atomic", engine=db["engine"],
        )  # fmt: skip
    return EndpointIdentity(server_id, source, database, str(db["uuid"]), str(db["engine"]))


def _dpone_identity(transport: QueryPort, probe_prefix: str, deadline: float) -> str:
    # The database's own UUID, assigned by the server at creation and persisted with
    # it, is the identity: creating it is idempotent and needs no data rows.
    try:
        transport.execute(
            mutation(
                f"CREATE DATABASE IF NOT EXISTS {IDENTITY_DATABASE} ENGINE = Atomic",
                f"{probe_prefix}-identity-create",
            ),
            deadline=deadline,
        )
    except ClickHouseServerError as exc:
        raise EndpointIdentityError(
            "this server reports a Nil serverUUID() and dpone cannot create its identity "
            f"database {IDENTITY_DATABASE}: {exc.message}",
            code="identity_unavailable",
        ) from exc
    row = _one_row(
        transport.execute(
            read(
                "SELECT toString(uuid) AS uuid FROM system.databases "
                f"WHERE name = {quote_literal(IDENTITY_DATABASE)} FORMAT JSONEachRow",
                f"{probe_prefix}-identity",
            ),
            deadline=deadline,
        ).json_rows(),
        "dpone identity database",
    )
    if row["uuid"] == NIL_UUID:
        raise EndpointIdentityError(
            "dpone identity database has the Nil UUID", code="identity_unavailable"
        )
    return str(row["uuid"])
