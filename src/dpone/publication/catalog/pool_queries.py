"""Queries of the pool's idle principals against a publication's tables: found, never assumed.

A pool principal with no active lease (never leased by this store, or its last lease
ended) holds no credential dpone handed out, so nothing of dpone's runs as it; but its
grants still let it write the generation (B) and the target. Its write grant alone is
allowed (:mod:`.allowance`); what it *did* is read, in the observation's one batched
request (:meth:`~dpone.publication.catalog.reads.CatalogReads.prefetch`), from the
server itself:

- ``system.processes``: every query of such a user whose text names B or the target
  (as a whole word), running now;
- ``system.query_log``: every query other than a SELECT of such a user that started
  against B or the target (its ``tables``) since B was created (its
  ``metadata_modification_time``, a lower bound of B's sealing; with no B under the
  name, nothing is read from the log) and after the user's last lease ended (what ran
  inside a lease is that lease's, and its closure accounted for it) or, for a user
  never leased, after the store was made.

Each one found, for a user whose grants let it write that table, is a
``pool_writer_query`` blocker naming the user, the query and the table. The read
answers rows or fails (:class:`~dpone.publication.catalog.reads.CatalogUnobservable`):
an empty answer is the proof of absence. The query log holds what the server
flushed: the prepare's closure flushes it right before the observation; a later
observation sees what the server's own flush (every second on the managed server)
wrote, and a write into B that finished in between shows in B's content digest.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from dpone.ports.composition_snapshot import Blocker
from dpone.publication.catalog.allowance import Idle
from dpone.publication.catalog.reads import CatalogReads, Read, count_field, text_field
from dpone.sql import in_list, quote_literal

POOL_QUERY_REASON = "pool_writer_query"
RUNNING = "running"
LOGGED = "logged"
_SQL = (
    "SELECT 'running' AS seen, user, query_id, '' AS kind, "
    "toInt64(0) AS at_us, "
    "arrayFilter((n, p) -> match(query, p), {names}, {words}) AS names "
    "FROM system.processes WHERE user IN {users} "
    "AND arrayExists(p -> match(query, p), {words}) "
    "UNION ALL "
    "SELECT 'logged' AS seen, user, query_id, toString(query_kind) AS kind, "
    "toInt64(toUnixTimestamp64Micro(event_time_microseconds)) AS at_us, "
    "arrayFilter(n -> has(tables, concat({db}, '.', n)), {names}) AS names "
    "FROM system.query_log WHERE user IN {users} AND type = 'QueryStart' "
    "AND query_kind != 'Select' AND ({since}) > toDateTime(0) "
    "AND event_date >= toDate(({since})) AND event_time >= ({since}) "
    "AND hasAny(tables, {qualified})"
)
# B's creation: the window's lower bound (the epoch when there is no B: nothing read).
_SINCE = (
    "SELECT max(metadata_modification_time) FROM system.tables "
    "WHERE database = {db} AND name = {generation}"
)


@dataclass(frozen=True)
class PoolQuery:
    """One query of a pool user against the observed tables, running or logged."""

    seen: str
    user: str
    query_id: str
    kind: str
    at_us: int
    names: tuple[str, ...]


def pool_queries_read(database: str, names: tuple[str, str], pool: Collection[str]) -> Read:
    """The read of every query of ``pool``'s users against ``names`` (see the module doc)."""
    db = quote_literal(database)
    array = "[" + ", ".join(quote_literal(n) for n in names) + "]"
    qualified = "[" + ", ".join(quote_literal(f"{database}.{n}") for n in names) + "]"
    since = _SINCE.format(db=db, generation=quote_literal(names[1]))
    users = in_list(sorted(pool)) if pool else "('')"
    # A running query names a table as a whole word of its text (a short target name
    # is not found inside every other word).
    words = "[" + ", ".join(quote_literal(rf"\b{re.escape(n)}\b") for n in names) + "]"
    return "pool_queries", _SQL.format(
        names=array, words=words, users=users, db=db, since=since, qualified=qualified
    )


def read_pool_queries(reads: CatalogReads, read: Read) -> list[PoolQuery]:
    """The rows of :func:`pool_queries_read`, typed (a malformed row raises)."""
    found = []
    for row in reads.rows(*read):
        seen, names = text_field(row, "seen", reads), row.get("names")
        if seen not in (RUNNING, LOGGED) or not isinstance(names, list):
            raise reads.malformed("pool_queries", row)
        if not all(isinstance(n, str) for n in names):
            raise reads.malformed("pool_queries", row)
        found.append(
            PoolQuery(
                seen,
                text_field(row, "user", reads),
                text_field(row, "query_id", reads),
                text_field(row, "kind", reads),
                count_field(row, "at_us", reads),
                tuple(names),
            )
        )
    return found


def pool_query_blockers(
    found: Collection[PoolQuery],
    idle_since: Mapping[str, Idle],
    writers_of: Callable[[str], Collection[str]],
    database: str,
    name: str,
) -> list[Blocker]:
    """One blocker per query of an idle pool user able to write ``database.name``.

    ``idle_since``: each pool user with no active lease (:func:`.allowance.idle_pool_users`).
    A logged query counts only from its ``since_us`` on; a running one always does.
    """
    writers = set(writers_of(name))
    blockers = []
    for query in found:
        idle = idle_since.get(query.user)
        if idle is None or query.user not in writers or name not in query.names:
            continue
        if query.seen == LOGGED and query.at_us < idle.since_us:
            continue  # inside its last lease (its closure accounted for it), or no store's
        what = "is running" if query.seen == RUNNING else f"ran {query.kind or 'a query'}"
        lease = "its lease ended" if idle.leased else "never leased by this store"
        blockers.append(
            Blocker(
                POOL_QUERY_REASON,
                f"pool user {query.user} ({lease}) {what} {query.query_id} on {database}.{name}",
            )
        )
    return blockers
