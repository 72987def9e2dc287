"""The closer's reads of a closure, shared by every lease closed at once.

Each read is one request that names the user of every lease being closed, each with
that lease's own filter (:func:`process_filter`: its marks once the user was leased
again, the closure's own requests as that user left out), and answers one column per
lease from one subquery. ClickHouse answers a subquery of one column as its value and
one of several columns as an object keyed by their names (``q0``, ``q1``, ..., in the
order of the leases, :func:`per_lease`), so closing one lease reads and parses what it
always did, and each lease's answer comes only from rows that name its own user. See
docs/publication.md ("Many tables in one run").
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dpone.ports.clickhouse_errors import OutcomeUnknown
from dpone.publication.authority.lease_scope import LeaseScope
from dpone.sql import quote_literal

# A closure's read: (SQL, purpose) -> the JSON rows, as the closer.
Rows = Callable[[str, str], list[dict[str, Any]]]

# A profile's empty_result_for_aggregation_by_empty_set must not turn "none" into no
# row, nor its output_format_json_named_tuples_as_objects the leases' object into a list.
SETTINGS = (
    " SETTINGS empty_result_for_aggregation_by_empty_set = 0, "
    "output_format_json_named_tuples_as_objects = 1 FORMAT JSONEachRow"
)


@dataclass(frozen=True)
class LeaseFilter:
    """One lease's part of a shared read: its user, its scope and the closure's own
    query ids as that user (never the lease's)."""

    user: str
    scope: LeaseScope
    own: tuple[str, ...] = ()


def marked(scope: LeaseScope) -> str:
    """SQL: the query id carries one of the lease's marks."""
    return " OR ".join(f"startsWith(query_id, {quote_literal(m)})" for m in scope.marks)


def per_lease(value: object, count: int) -> list[object]:
    """The value of each of ``count`` leases in a shared column (see the module doc);
    a lease whose value is missing gets None (its caller refuses it as malformed)."""
    if count == 1:
        return [value]
    if not isinstance(value, dict):
        return [None] * count
    return [value.get(f"q{i}") for i in range(count)]


def columns(template: str, conditions: Sequence[str]) -> str:
    """One column per lease, ``template`` filled with its condition, named ``q<i>``."""
    return ", ".join(f"{template.format(cond=cond)} AS q{i}" for i, cond in enumerate(conditions))


def any_of(conditions: Sequence[str]) -> str:
    """SQL: a row any lease's condition holds for."""
    return " OR ".join(f"({c})" for c in conditions)


def kill(rows: Rows, leases: Sequence[LeaseFilter]) -> list[list[dict[str, Any]]] | None:
    """KILL the leases' queries in one request: all of a user's while the lease is its
    latest, only the lease's marked ones once the user was leased again. Each lease's
    rows are those naming its user; None when no lease has a query to kill."""
    wheres: list[str] = []
    for lease in leases:
        where = f"user = {quote_literal(lease.user)}"
        if lease.scope.relet:
            if not lease.scope.marks:
                continue
            where += f" AND ({marked(lease.scope)})"
        wheres.append(where)
    if not wheres:
        return None
    killed = rows(f"KILL QUERY WHERE {any_of(wheres)} SYNC FORMAT JSONEachRow", "kill")
    return [[r for r in killed if r.get("user") == lease.user] for lease in leases]


def process_filter(lease: LeaseFilter) -> str:
    """SQL: a process that is the lease's and not the closure's own request."""
    # The server's own FIFO query runs as user '' over the Local interface; the
    # filter on a nonempty user name excludes it. Once the user was leased again,
    # only this lease's marked queries are its own (the new lease's are not).
    where = f"user = {quote_literal(lease.user)}"
    if lease.own:
        where += f" AND query_id NOT IN ({', '.join(quote_literal(q) for q in lease.own)})"
    if lease.scope.relet:
        where += f" AND ({marked(lease.scope) if lease.scope.marks else '0'})"
    return where


def sample(rows: Rows, leases: Sequence[LeaseFilter]) -> list[dict[str, Any]]:
    """One sample of ``system.processes`` for every lease: the server's clock (read as
    the query starts) and the lease's queries it lists then, in one request."""
    wheres = [process_filter(lease) for lease in leases]
    # A SELECT without FROM answers one row, whatever runs.
    found = rows(
        "SELECT toUnixTimestamp64Micro(now64(6)) AS us, (SELECT "
        + columns("groupArrayIf(query_id, {cond})", wheres)
        + f" FROM system.processes WHERE {any_of(wheres)}) AS queries"
        + SETTINGS,
        "sample",
    )
    row = found[0] if len(found) == 1 else {}
    at_us = row.get("us")
    listed = per_lease(row.get("queries"), len(leases))
    if not isinstance(at_us, int) or not all(isinstance(q, list) for q in listed):
        raise OutcomeUnknown(
            f"the closure's process sample of {', '.join(le.user for le in leases)} "
            f"answered {found!r:.200}",
            code="closure_sample_malformed",
            user=leases[0].user if len(leases) == 1 else [le.user for le in leases],
        )
    return [
        {"at_us": at_us, "queries": sorted(str(q) for q in queries)}
        for queries in listed
        if isinstance(queries, list)
    ]


def account_column(leases: Sequence[LeaseFilter], started_us: int) -> str:
    """A column (``rows``) of every lease's query-log account: each query id of the
    lease (see :class:`LeaseScope`) without its finish, or started after the closure
    began, as JSON lines, one list a lease."""
    wheres, owned = [], []
    for lease in leases:
        scope = lease.scope
        excluded = ", ".join(quote_literal(p) for p in ("", *lease.own))
        wheres.append(f"user = {quote_literal(lease.user)} AND query_id NOT IN ({excluded})")
        # A query id is the lease's when its latest start is inside the lease (the lower
        # bound) and, once the user was leased again, it is marked or began before the end.
        mine = f"user = {quote_literal(lease.user)} AND last >= {int(scope.issued_at_us)}"
        if scope.relet:
            ended = scope.ended_at_us if scope.ended_at_us is not None else started_us
            mine += f" AND (({marked(scope) if scope.marks else '0'}) OR first <= {int(ended)})"
        owned.append(mine)
    account = (
        "SELECT user, query_id, countIf(type = 'QueryStart') AS starts, "
        "countIf(type IN ('QueryFinish', 'ExceptionWhileProcessing')) AS ends, "
        "maxIf(toUnixTimestamp64Micro(event_time_microseconds), type = 'QueryStart') AS last, "
        "minIf(toUnixTimestamp64Micro(event_time_microseconds), type = 'QueryStart') AS first "
        f"FROM system.query_log WHERE {any_of(wheres)} GROUP BY user, query_id "
        f"HAVING starts > 0 AND ({any_of(owned)}) "
        f"AND (starts != ends OR last >= {int(started_us)}) ORDER BY query_id"
    )
    users = [f"user = {quote_literal(lease.user)}" for lease in leases]
    line = "formatRowNoNewline('JSONEachRow', query_id, starts, ends, last, first)"
    return f"(SELECT {columns(f'groupArrayIf({line}, {{cond}})', users)} FROM ({account})) AS rows"


def account_rows(value: object, count: int) -> list[list[dict[str, Any]]]:
    """Each lease's account rows (each a JSON line of ``rows``), or why they are not."""
    found: list[list[dict[str, Any]]] = []
    try:
        for lines in per_lease(value, count):
            if not isinstance(lines, list):
                raise ValueError(lines)
            parsed = [json.loads(line) for line in lines]
            if not all(isinstance(r, dict) for r in parsed):
                raise ValueError(parsed)
            found.append(sorted(parsed, key=lambda r: str(r.get("query_id"))))
    except (TypeError, ValueError) as exc:
        raise OutcomeUnknown(
            f"the closure's query-log account answered {value!r:.200}",
            code="closure_account_malformed",
        ) from exc
    return found
