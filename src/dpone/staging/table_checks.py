"""What the staging service reads back about an attempt's staging table.

Reads only: the name is free before the CREATE; after it, the table is the one this
attempt made (UUID, engine, physical design, columns, ownership comment) and, after
the INSERT, holds exactly the prepared rows. Every refusal is a :class:`StagingError`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dpone.connectors.clickhouse_tables import table_exists
from dpone.connectors.endpoint_identity import NIL_UUID, observe_identity
from dpone.contracts.preparation import TargetColumn
from dpone.ports.clickhouse import QueryPort
from dpone.ports.clickhouse_request import read
from dpone.sql import quote_identifier, quote_literal
from dpone.staging.contract import PhysicalDesign, StagingError


class EndpointChanged(StagingError):
    """The endpoint answers as another server (or database) than when the attempt began.

    Whatever the attempt created is on the server it began with: nothing seen through
    this endpoint now says anything about it, so cleanup retains everything.
    """

    code = "endpoint_changed"


def check_endpoint(
    transport: QueryPort,
    database: str,
    before: Mapping[str, Any],
    *,
    probe_prefix: str,
    deadline: float,
    when: str,
) -> None:
    """Refuse an endpoint whose identity is no longer ``before`` (the attempt's)."""
    now = observe_identity(
        transport, database, probe_prefix=probe_prefix, deadline=deadline
    ).to_document()
    if now != before:
        raise EndpointChanged(
            f"the endpoint's identity changed during the attempt: {now} {when}, "
            f"{dict(before)} when it began",
            before=dict(before),
            after=now,
        )


def qualified_name(database: str, table: str) -> str:
    """``database.table``, both quoted."""
    return f"{quote_identifier(database)}.{quote_identifier(table)}"


class StagingTableChecks:
    """One attempt's reads of its staging tables in ``database``.

    ``read_id(purpose)`` names each read; ``bounded(deadline)`` caps a phase's
    deadline by one request's, at the moment each read is sent.
    """

    def __init__(
        self,
        transport: QueryPort,
        database: str,
        design: PhysicalDesign,
        *,
        read_id: Callable[[str], str],
        bounded: Callable[[float], float],
    ) -> None:
        self.transport = transport
        self.database = database
        self.design = design
        self._read_id = read_id
        self._bounded = bounded

    def absent(self, table: str, deadline: float) -> None:
        """Refuse a ``table`` that exists before this attempt created it."""
        if table_exists(
            self.transport,
            self.database,
            table,
            self._read_id("absent"),
            self._bounded(deadline),
        ):
            raise StagingError(
                f"staging table {table} already exists; it is not this attempt's",
                code="table_exists",
            )

    def identity(
        self, table: str, comment: str, schema: Sequence[TargetColumn], deadline: float
    ) -> str:
        """The UUID of ``table``, once it is proven the one this attempt created."""
        rows = self._control_rows(
            "SELECT toString(uuid) AS uuid, engine, is_temporary, sorting_key, partition_key "
            f"FROM system.tables WHERE database = {quote_literal(self.database)} "
            f"AND name = {quote_literal(table)}",
            "table",
            ("uuid", "engine", "is_temporary", "sorting_key", "partition_key"),
            deadline,
        )
        if len(rows) != 1:
            raise StagingError(
                f"staging table {table} observed {len(rows)} times", code="table_missing"
            )
        t = rows[0]
        problems = []
        if t["uuid"] in ("", NIL_UUID):
            problems.append("Nil table UUID")
        if t["engine"] != self.design.engine:
            problems.append(f"engine {t['engine']}")
        if t["is_temporary"] not in (0, False):
            problems.append("temporary table")
        if (
            t["sorting_key"] != self.design.expected_sorting_key
            or t["partition_key"] != self.design.expected_partition_key
        ):
            problems.append("physical design differs")
        cols = self._control_rows(
            "SELECT name, type, comment FROM system.columns "
            f"WHERE database = {quote_literal(self.database)} AND table = {quote_literal(table)} "
            "ORDER BY position",
            "columns",
            ("name", "type", "comment"),
            deadline,
        )
        expected = [{"name": c.name, "type": c.clickhouse_type} for c in schema]
        if [{"name": c["name"], "type": c["type"]} for c in cols] != expected:
            problems.append("columns differ from the prepared schema")
        if not cols or cols[0]["comment"] != comment:
            problems.append("ownership comment differs")
        if problems:
            raise StagingError(
                f"staging table {table} fails its identity check: {'; '.join(problems)}",
                code="table_identity_mismatch",
                problems=problems,
            )
        return str(t["uuid"])

    def _control_rows(
        self, statement: str, purpose: str, members: Sequence[str], deadline: float
    ) -> list[dict[str, Any]]:
        """The rows of one control read; each must carry every member asked for."""
        query_id = self._read_id(purpose)
        rows = self.transport.execute(
            read(f"{statement} FORMAT JSONEachRow", query_id), deadline=self._bounded(deadline)
        ).json_rows()
        for ordinal, row in enumerate(rows, start=1):
            missing = [m for m in members if not isinstance(row, dict) or m not in row]
            if missing:
                raise StagingError(
                    f"control read {query_id} returned row {ordinal} without {missing[0]!r}: "
                    f"{row!r:.200}",
                    code="control_row_incomplete",
                    query_id=query_id,
                    member=missing[0],
                    row=ordinal,
                )
        return rows

    def count(self, table: str, deadline: float) -> int:
        """The exact row count of ``table``, as an integer the server returned."""
        rows = self.transport.execute(
            read(
                f"SELECT count() AS n FROM {qualified_name(self.database, table)} "
                "FORMAT JSONEachRow",
                self._read_id("count"),
            ),
            deadline=self._bounded(deadline),
        ).json_rows()
        if len(rows) != 1 or set(rows[0]) != {"n"}:
            raise StagingError(
                f"COUNT returned {len(rows)} rows {rows!r:.200}", code="count_unobservable"
            )
        value = rows[0]["n"]
        if isinstance(value, bool) or not isinstance(value, int):
            raise StagingError(
                f"COUNT returned a {type(value).__name__}, not an integer",
                code="count_unobservable",
            )
        return value

    def within_storage(self, table: str, limit: int, deadline: float) -> int:
        """``table``'s stored bytes (``total_bytes``), refused over ``limit``.

        ``storage_budget_exceeded`` over it; a missing counter is
        ``stored_bytes_unobservable``, never zero.
        """
        rows = self._control_rows(
            "SELECT total_bytes AS b FROM system.tables "
            f"WHERE database = {quote_literal(self.database)} AND name = {quote_literal(table)}",
            "stored_bytes",
            ("b",),
            deadline,
        )
        value = rows[0]["b"] if len(rows) == 1 else None
        if isinstance(value, bool) or not isinstance(value, int):
            raise StagingError(
                f"the stored size of {table} is not observable ({rows!r:.200})",
                code="stored_bytes_unobservable",
            )
        if value > limit:
            raise StagingError(
                f"staging table {table} holds {value} bytes on the server, over the bound {limit}",
                code="storage_budget_exceeded",
                observed=value,
                limit=limit,
            )
        return value
