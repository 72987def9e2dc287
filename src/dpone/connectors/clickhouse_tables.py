"""Tables dpone owns on a ClickHouse server: their names, ownership marks and existence.

One neutral owner for what staging, recovery and publication all need to know about a
table before they touch it: the private staging name of an attempt (an injective
mapping, so two attempt ids never share a table), the ownership mark dpone writes
into the first column's comment, and reads of ``system.tables`` / ``system.columns``
that either answer exactly or raise (a missing observation is never "absent").
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from dpone.connectors.batched_reads import batched_columns, split_answers
from dpone.errors import StateError
from dpone.ports.clickhouse import QueryPort
from dpone.ports.clickhouse_request import check_attempt_id, read
from dpone.sql import in_list, quote_literal

STAGING_PREFIX = "dpone_stage_"
# Attempt ids may hold letters, digits, "_", "-" and ".". Letters and digits stay as
# they are; "_" is the escape character, so each of the three others becomes "_" plus
# a letter of its own. Decoding is unambiguous, hence the mapping is injective:
# a-b -> a_hb, a_b -> a__b, a.b -> a_db.
_ESCAPES = {"_": "__", "-": "_h", ".": "_d"}


class TableObservationError(StateError):
    """What the server shows about a table could not be observed exactly."""

    code = "table_unobservable"


def staging_table_name(attempt_id: str) -> str:
    """The private staging table of an attempt; distinct attempt ids give distinct names."""
    return STAGING_PREFIX + "".join(_ESCAPES.get(c, c) for c in check_attempt_id(attempt_id))


def ownership_comment(attempt_id: str, semantic_id: str) -> str:
    """The first column's COMMENT that marks a table as created by this attempt."""
    return f"dpone-owned attempt={attempt_id} semantic={semantic_id}"


@dataclass(frozen=True)
class Ownership:
    """What the server shows about a table: its UUID and ownership mark."""

    uuid: str
    comment: str | None

    def belongs_to(self, attempt_id: str, semantic_id: str, table_uuid: str | None) -> bool:
        """True when the mark is the attempt's and the UUID is the one it observed (if any)."""
        return self.comment == ownership_comment(attempt_id, semantic_id) and (
            table_uuid is None or self.uuid == table_uuid
        )


def _where(database: str, table: str, name_column: str = "name") -> str:
    return f"database = {quote_literal(database)} AND {name_column} = {quote_literal(table)}"


def table_exists(
    transport: QueryPort, database: str, table: str, query_id: str, deadline: float
) -> bool:
    """Whether ``database.table`` exists now; anything but one exact count is an error."""
    statement = f"SELECT count() AS n FROM system.tables WHERE {_where(database, table)}"
    rows = transport.execute(
        read(f"{statement} FORMAT JSONEachRow", query_id), deadline=deadline
    ).json_rows()
    if rows not in ([{"n": 0}], [{"n": 1}]):
        raise TableObservationError(
            f"existence of {database}.{table} is unobservable: {rows!r:.200}",
            query_id=query_id,
        )
    return rows == [{"n": 1}]


def table_rows(
    transport: QueryPort,
    database: str,
    table: str,
    table_uuid: str,
    query_id: str,
    deadline: float,
) -> int | None:
    """The exact row count of ``database.table`` while the name holds the table of
    ``table_uuid``; None when it holds no table or another one. A count the server does
    not give (an engine without a row counter) raises :class:`TableObservationError`."""
    statement = (
        "SELECT toString(uuid) AS uuid, total_rows FROM system.tables "
        f"WHERE {_where(database, table)} FORMAT JSONEachRow"
    )
    rows = transport.execute(read(statement, query_id), deadline=deadline).json_rows()
    if len(rows) != 1 or rows[0].get("uuid") != table_uuid:
        return None
    count = rows[0].get("total_rows")  # a 64-bit count may come quoted
    if isinstance(count, str) and count.isdigit():
        count = int(count)
    if not isinstance(count, int) or isinstance(count, bool):
        raise TableObservationError(
            f"the row count of {database}.{table} is unobservable: {count!r:.200}",
            query_id=query_id,
        )
    return count


def observe_ownership(
    transport: QueryPort, database: str, table: str, next_id: Callable[[], str], deadline: float
) -> Ownership | None:
    """The table's UUID and its first column's comment, or None when it does not exist."""
    return observe_ownerships(transport, database, [table], next_id, deadline).get(table)


def observe_ownerships(
    transport: QueryPort,
    database: str,
    tables: Collection[str],
    next_id: Callable[[], str],
    deadline: float,
) -> dict[str, Ownership]:
    """Each named table that exists: its UUID and first column's comment.

    One read however many names: a slot's rollback copies are observed in one go, not
    one request per publication the store remembers. The tables and their first
    columns are two scalar subqueries of that one request, each answered as the
    JSONEachRow lines it would have answered alone and checked as strictly.
    """
    wanted = sorted(set(tables))
    if not wanted:
        return {}
    where = f"database = {quote_literal(database)} AND "
    query_id = next_id()
    reads = [
        (
            "t",
            f"SELECT name, toString(uuid) AS uuid FROM system.tables WHERE {where}name IN "
            f"{in_list(wanted)}",
        ),
        (
            "c",
            f"SELECT table, comment FROM system.columns WHERE {where}table IN "
            f"{in_list(wanted)} AND position = 1",
        ),
    ]
    result = transport.execute(
        read(f"SELECT {', '.join(batched_columns(reads))} FORMAT JSONEachRow", query_id),
        deadline=deadline,
    )
    split = split_answers(result, ["t", "c"])
    if split is None:
        raise TableObservationError(
            f"tables of {database} observed as {result.output!r:.200}", query_id=query_id
        )
    rows, columns = split[1]
    uuids: dict[str, str] = {}
    for row in rows:
        name, uuid = row.get("name"), row.get("uuid")
        if not isinstance(name, str) or not isinstance(uuid, str) or name in uuids:
            raise TableObservationError(
                f"tables of {database} observed as {rows!r:.200}", query_id=query_id
            )
        uuids[name] = uuid
    comments = {
        row["table"]: row["comment"]
        for row in columns
        if isinstance(row.get("table"), str) and isinstance(row.get("comment"), str)
    }
    return {name: Ownership(uuid, comments.get(name)) for name, uuid in uuids.items()}
