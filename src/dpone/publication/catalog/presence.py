"""Where the server holds what an intent recorded: its database and tables, by UUID.

Read as the server's operator, who must see every database: a reader with a narrower
sight would take a database renamed out of it for one dropped.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from dpone.connectors.endpoint_identity import observe_server_id
from dpone.errors import DponeError
from dpone.ports.clickhouse import QueryPort
from dpone.ports.composition_snapshot import RecordedPresence
from dpone.publication.catalog.reads import (
    CatalogReads,
    CatalogUnobservable,
    catalog_query_id,
    count_field,
    text_field,
)
from dpone.sql import in_list, quote_literal

# Global privileges that let a reader see every database and table.
_SEES_ALL = ("ALL", "SHOW", "SHOW TABLES")


def read_presence(
    operator: QueryPort,
    deadline: float,
    clock: Callable[[], float],
    database: str,
    database_uuid: str,
    table_uuids: tuple[str, ...],
) -> RecordedPresence:
    """The server's identity, ``database``'s UUID now, and whether a database of
    ``database_uuid`` and tables of ``table_uuids`` exist under any name.

    ``catalog_unobservable`` when any of it cannot be read, or the reader cannot see
    every database (its own global SHOW, revoked nowhere).
    """
    reads = CatalogReads(operator, deadline, clock)
    try:
        server_id, _ = observe_server_id(
            operator,
            probe_prefix=catalog_query_id(uuid.uuid4().hex[:16], "server", 1),
            deadline=deadline,
        )
    except DponeError as exc:
        raise CatalogUnobservable(
            f"the server's identity could not be read: {exc.message}", cause=exc.code
        ) from exc
    # A reader that cannot see every database would take one renamed out of its
    # sight for one dropped: its own global SHOW, unrevoked anywhere, is required.
    sight = reads.rows(
        "operator_sight",
        "SELECT countIf(database IS NULL AND NOT is_partial_revoke AND access_type IN "
        f"{in_list(_SEES_ALL)}) AS sees, countIf(is_partial_revoke AND access_type IN "
        f"{in_list((*_SEES_ALL, 'SHOW DATABASES'))}) AS hidden FROM system.grants "
        "WHERE user_name = currentUser()",
    )
    if len(sight) != 1 or count_field(sight[0], "sees", reads) == 0:
        raise CatalogUnobservable(
            "the operator's own grants do not show every database (a global SHOW), so "
            "a database renamed out of its sight would look dropped",
            code="catalog_unobservable",
            query_id=reads.last_query_id,
        )
    if count_field(sight[0], "hidden", reads):
        raise CatalogUnobservable(
            "the operator's SHOW is revoked on some database, which would look dropped",
            code="catalog_unobservable",
            query_id=reads.last_query_id,
        )
    named = reads.rows(
        "named_database",
        "SELECT toString(uuid) AS uuid FROM system.databases "
        f"WHERE name = {quote_literal(database)}",
    )
    databases = reads.rows(
        "recorded_database",
        "SELECT count() AS n FROM system.databases "
        f"WHERE uuid = toUUIDOrZero({quote_literal(database_uuid)})",
    )
    tables = reads.rows(
        "recorded_tables",
        "SELECT toString(uuid) AS uuid FROM system.tables WHERE toString(uuid) IN "
        f"{in_list(table_uuids)}",
    )
    if len(databases) != 1:
        raise reads.malformed("recorded_database", databases)
    return RecordedPresence(
        server_id,
        text_field(named[0], "uuid", reads) if named else None,
        count_field(databases[0], "n", reads) > 0,
        tuple(sorted({text_field(row, "uuid", reads) for row in tables})),
    )
