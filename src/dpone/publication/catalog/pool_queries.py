"""Queries of the pool's other principals against a publication's tables: found, never assumed.

Every pool principal but the observed publication's own may hold a write grant on the
generation (B) and the target (:mod:`.allowance`); what it *did* is read from the server
in the observation's one batched request
(:meth:`~dpone.publication.catalog.reads.CatalogReads.prefetch`): its queries naming
either table in ``system.processes`` now, and its non-SELECT queries against either in
``system.query_log`` since B was created and since the user's own lower bound
(:func:`.allowance.accounted_pool_users`). Each one found, for a user able to write that
table, is a ``pool_writer_query`` blocker; an empty answer is the proof of absence. See
docs/publication-catalog.md ("Who may write").
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from dpone.ports.composition_snapshot import Blocker
from dpone.publication.catalog.allowance import SLOT_PROTOCOL_KINDS, Idle
from dpone.publication.catalog.reads import CatalogReads, Read, count_field, text_field
from dpone.sql import in_list, quote_literal

POOL_QUERY_REASON = "pool_writer_query"
RUNNING = "running"
LOGGED = "logged"
_SQL = (
    "SELECT 'running' AS seen, user, query_id, toString(query_kind) AS kind, "
    "toInt64(0) AS at_us, "
    "arrayFilter((n, p) -> match(query, p), {names}, {words}) AS names "
    "FROM system.processes WHERE user IN {users} "
    "AND NOT (query_kind = 'Select' AND user IN {held}) "
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
# A name as a whole word of a query's text, not followed by a dot (see pool_queries_read).
_WORD = r"\b{}\b[`\"]?([^.`\"]|$)"
# B's creation: the window's lower bound (the epoch when there is no B: nothing read).
# Observed with other slots, the earliest of their generations' creations; each slot
# then keeps the rows its own bound reads (:func:`slot_queries`).
_SINCE = (
    "SELECT min(metadata_modification_time) FROM system.tables "
    "WHERE database = {db} AND name {generation}"
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


def pool_queries_read(
    database: str,
    names: Sequence[str],
    pool: Mapping[str, Idle],
    generations: Sequence[str] | None = None,
    held: Collection[str] | None = None,
) -> Read:
    """The read of every query of ``pool``'s users against ``names`` (see the module doc).

    ``generations``: the Bs whose creation bounds the logged queries (default: the
    second name, the observed publication's B); ``held``: the users whose running
    SELECTs are not read (default: those ``pool`` says another run holds).
    """
    db = quote_literal(database)
    array = "[" + ", ".join(quote_literal(n) for n in names) + "]"
    qualified = "[" + ", ".join(quote_literal(f"{database}.{n}") for n in names) + "]"
    bs = [names[1]] if generations is None else list(generations)
    which = f"= {quote_literal(bs[0])}" if len(bs) == 1 else f"IN {in_list(bs)}"
    since = _SINCE.format(db=db, generation=which)
    users = in_list(sorted(pool)) if pool else "('')"
    not_selects = sorted(
        (user for user, idle in pool.items() if idle.held_by) if held is None else held
    )
    # A running query names a table as a whole word of its text (a short target name
    # is not found inside every other word), not followed by a dot (closing quote or
    # not): there it names a database, the slot's own or another that shares the name.
    words = "[" + ", ".join(quote_literal(_WORD.format(re.escape(n))) for n in names) + "]"
    return "pool_queries", _SQL.format(
        names=array,
        words=words,
        users=users,
        held=in_list(not_selects) if not_selects else "('')",
        db=db,
        since=since,
        qualified=qualified,
    )


def slot_queries(
    found: Sequence[PoolQuery], idle: Mapping[str, Idle], made_s: int | None
) -> list[PoolQuery]:
    """The rows of ``found`` (read for several slots at once) that one slot's own read
    would have answered: a running query unless it is a SELECT of a user another run
    holds (``idle``, the slot's accounted users), a logged one only from the slot's own
    generation's creation on (``made_s``, Unix seconds; None: no generation, none).

    Both conditions are the ones :data:`_SQL` asks, so for a read of one slot this
    keeps every row.
    """
    kept = []
    for query in found:
        if query.seen == RUNNING:
            user = idle.get(query.user)
            if query.kind == "Select" and user is not None and user.held_by:
                continue
        elif made_s is None or made_s <= 0 or query.at_us // 1_000_000 < made_s:
            continue  # before the slot's own B (event_time is the query's whole second)
        kept.append(query)
    return kept


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
    """One blocker per query of an accounted pool user able to write ``database.name``.

    ``idle_since``: each pool user no lease of this publication holds
    (:func:`.allowance.accounted_pool_users`).
    A logged query counts only from its ``since_us`` on; a running one always does.
    """
    writers = set(writers_of(name))
    blockers = []
    for query in found:
        idle = idle_since.get(query.user)
        if idle is None or query.user not in writers or name not in query.names:
            continue
        if query.seen == LOGGED and query.at_us < idle.since_us:
            continue  # inside its last closed lease (its closure accounted for it), or no store's
        if idle.slot_peer and query.seen == LOGGED and query.kind in SLOT_PROTOCOL_KINDS:
            continue  # another attempt's CREATE or EXCHANGE of this slot: the claim decides
        what = "is running" if query.seen == RUNNING else f"ran {query.kind or 'a query'}"
        blockers.append(
            Blocker(
                POOL_QUERY_REASON,
                f"pool user {query.user} ({_standing(idle)}) {what} {query.query_id} on "
                f"{database}.{name}",
            )
        )
    return blockers


def _standing(idle: Idle) -> str:
    """Why the user is accounted for, as a blocker says it."""
    if idle.slot_peer:
        return f"publisher of another attempt of this slot, {idle.held_by}"
    if idle.held_by:
        return f"leased to another run, attempt {idle.held_by}"
    return "its lease ended" if idle.leased else "never leased by this store"
