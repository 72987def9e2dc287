"""What the staging service reads back about an attempt's staging table.

Reads only: the name is free before the CREATE; after it, the table is the one this
attempt made (UUID, engine, physical design, columns, ownership comment) and, after
the INSERT, holds exactly the prepared rows. Every refusal is a :class:`StagingError`.

Reads the service knows it will make are asked together first, in one request
(:meth:`StagingTableChecks.prefetch`): each check then takes its own rows from that
answer, in the same order and with the same checks, naming the batch's query id. A
batch the server refused (a missing table, a missing grant) or answered in another
shape keeps nothing: each check then asks its own read, as if there were no batch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dpone.connectors.batched_reads import ask_together, batched_columns
from dpone.connectors.clickhouse_tables import table_exists
from dpone.connectors.endpoint_identity import (
    EMPTY_SET_ANSWERS,
    NIL_UUID,
    endpoint_columns,
    identity_of_rows,
    observe_identity,
)
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
    answered: tuple[str, list[dict[str, Any]]] | None = None,
) -> None:
    """Refuse an endpoint whose identity is no longer ``before`` (the attempt's).

    ``answered``: the query id and rows of a batch that already read the endpoint.
    """
    if answered is None:
        identity = observe_identity(
            transport, database, probe_prefix=probe_prefix, deadline=deadline
        )
    else:
        identity = identity_of_rows(
            transport,
            database,
            answered[1],
            answered[0],
            probe_prefix=probe_prefix,
            deadline=deadline,
        )
    now = identity.to_document()
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


ENDPOINT = "endpoint"


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
        # A prefetched answer per read (ENDPOINT: the endpoint's): its query id, its rows.
        self._ready: dict[str, tuple[str, list[dict[str, Any]]]] = {}

    def prefetch(
        self,
        purpose: str,
        table: str,
        reads: Sequence[str],
        deadline: float,
        *,
        endpoint: bool = False,
    ) -> None:
        """Ask ``reads`` of ``table`` (``table``, ``columns``, ``stored_bytes``)
        and, with ``endpoint``, the endpoint's identity, in one request (``purpose``)
        for the checks that will take them. Only a saving of round trips: a batch the
        server refused, answered over the response budget or in another shape keeps
        nothing; a batch lost or late is the failure its first read would have had.
        """
        names = [f"r_{name}" for name in reads]
        columns = batched_columns(
            [(n, self._sql(r, table)) for n, r in zip(names, reads, strict=True)]
        )
        if endpoint:
            columns.insert(0, endpoint_columns(self.database))
        query_id = self._read_id(purpose)
        split = ask_together(
            self.transport,
            columns,
            names,
            query_id,
            self._bounded(deadline),
            suffix=EMPTY_SET_ANSWERS,
        )
        if split is None:
            return  # refused, too large or of another shape: each check asks its own read
        row, answers = split
        for name, answer in zip(reads, answers, strict=True):
            self._ready[name] = (query_id, answer)
        if endpoint:
            self._ready[ENDPOINT] = (query_id, [{k: v for k, v in row.items() if k not in names}])

    def _sql(self, name: str, table: str) -> str:
        """The SELECT of the read ``name`` about ``table`` (without FORMAT)."""
        database, named = quote_literal(self.database), quote_literal(table)
        if name == "table":
            return (
                "SELECT toString(uuid) AS uuid, engine, is_temporary, sorting_key, "
                f"partition_key FROM system.tables WHERE database = {database} AND name = {named}"
            )
        if name == "columns":
            return (
                "SELECT name, type, comment FROM system.columns "
                f"WHERE database = {database} AND table = {named} ORDER BY position"
            )
        if name == "stored_bytes":
            return (
                "SELECT total_bytes AS b FROM system.tables "
                f"WHERE database = {database} AND name = {named}"
            )
        raise ValueError(f"no staging read {name!r}")

    def endpoint(
        self, before: Mapping[str, Any], *, probe_prefix: str, deadline: float, when: str
    ) -> None:
        """:func:`check_endpoint`, on the prefetched answer if there is one."""
        check_endpoint(
            self.transport,
            self.database,
            before,
            probe_prefix=probe_prefix,
            deadline=self._bounded(deadline),
            when=when,
            answered=self._ready.pop(ENDPOINT, None),
        )

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
        if "table" not in self._ready:
            self.prefetch("table", table, ("table", "columns"), deadline)
        rows = self._control_rows(
            table,
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
        cols = self._control_rows(table, "columns", ("name", "type", "comment"), deadline)
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

    def _answer(
        self, table: str, purpose: str, deadline: float
    ) -> tuple[str, list[dict[str, Any]]]:
        """The query id and rows of the read ``purpose``: prefetched, or asked now."""
        ready = self._ready.pop(purpose, None)
        if ready is not None:
            return ready
        query_id = self._read_id(purpose)
        statement = f"{self._sql(purpose, table)} FORMAT JSONEachRow"
        result = self.transport.execute(read(statement, query_id), deadline=self._bounded(deadline))
        return query_id, result.json_rows()

    def _control_rows(
        self, table: str, purpose: str, members: Sequence[str], deadline: float
    ) -> list[dict[str, Any]]:
        """The rows of one control read; each must carry every member asked for."""
        query_id, rows = self._answer(table, purpose, deadline)
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
        """The exact row count of ``table``, as an integer the server returned: the
        single COUNT, always its own identified request (seed 001), never batched."""
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
        rows = self._control_rows(table, "stored_bytes", ("b",), deadline)
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
