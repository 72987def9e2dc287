"""The side effects around a table that the publisher does not handle, read from system tables.

Materialized views writing into a table (refreshable or not), tables that write into
it or follow its name (:mod:`dpone.publication.catalog.writers`), views and
dictionaries reading from it, mutations in flight, row policies, and untrusted writers
(:mod:`dpone.publication.catalog.grants`): each becomes a :class:`Blocker`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dpone.ports.composition_snapshot import Blocker
from dpone.publication.catalog.allowance import Idle
from dpone.publication.catalog.grants import ServerAccess
from dpone.publication.catalog.pool_queries import (
    PoolQuery,
    pool_queries_read,
    pool_query_blockers,
    read_pool_queries,
)
from dpone.publication.catalog.reads import CatalogReads, Read, text_field
from dpone.publication.catalog.writers import WriterTables
from dpone.sql import in_list, quote_literal


@dataclass(frozen=True)
class SideEffects:
    """Server-wide facts read once per observation: views, writers, mutations, access."""

    incoming: list[dict[str, Any]]
    writer_tables: WriterTables
    refreshable: frozenset[tuple[str, str]]
    mutations: list[dict[str, Any]]
    policies: list[dict[str, Any]]
    access: ServerAccess
    trusted: frozenset[str]
    # The pool's accounted principals' queries against both names (:mod:`.pool_queries`),
    # and since when what each of those users runs is accounted for.
    pool_queries: list[PoolQuery] = field(default_factory=list)
    idle_since: Mapping[str, Idle] = field(default_factory=dict)

    @staticmethod
    def reads(
        database: str,
        names: Sequence[str],
        pool: Mapping[str, Idle] | None = None,
        pool_read: Read | None = None,
    ) -> list[Read]:
        """The reads of :meth:`read` that depend on no other answer, in its order
        (the pool's queries only for a nonempty ``pool``: the accounted users, see
        :func:`~dpone.publication.catalog.allowance.accounted_pool_users`; ``pool_read``:
        their read when several slots are observed at once, :mod:`.slots`)."""
        db = quote_literal(database)
        return [
            (
                "incoming_views",
                "SELECT database, name, target_table FROM system.tables WHERE engine = "
                f"'MaterializedView' AND target_database = {db} AND target_table IN "
                f"{in_list(names)}",
            ),
            WriterTables.first_read(),
            ("refreshes", "SELECT database, view FROM system.view_refreshes"),
            (
                "mutations",
                f"SELECT table, mutation_id, command FROM system.mutations WHERE database = {db} "
                f"AND table IN {in_list(names)} AND is_done = 0",
            ),
            (
                "row_policies",
                "SELECT name, database, table FROM system.row_policies WHERE "
                f"database IN ({db}, '') AND table IN ({in_list(names)[1:-1]}, '')",
            ),
            *ServerAccess.reads(database),
            *([pool_read or pool_queries_read(database, names, pool)] if pool else []),
        ]

    @classmethod
    def read(
        cls,
        reads: CatalogReads,
        database: str,
        names: Sequence[str],
        trusted: frozenset[str],
        idle_since: Mapping[str, Idle] | None = None,
        pool_read: Read | None = None,
    ) -> SideEffects:
        """Read the facts for both names, in one fixed order of queries.

        ``idle_since``: the pool's users no lease of this publication holds (see
        :func:`~dpone.publication.catalog.pool_queries.pool_query_blockers`); their
        queries against both names are read too (none given: not read).
        """
        idle = dict(idle_since or {})
        sql = dict(cls.reads(database, names, idle, pool_read))
        incoming = reads.rows("incoming_views", sql["incoming_views"])
        writer_tables = WriterTables.read(reads, database, names)
        refreshable = frozenset(
            (text_field(r, "database", reads), text_field(r, "view", reads))
            for r in reads.rows("refreshes", sql["refreshes"])
        )
        mutations = reads.rows("mutations", sql["mutations"])
        policies = reads.rows("row_policies", sql["row_policies"])
        access = ServerAccess.read(reads, database)
        found = read_pool_queries(reads, ("pool_queries", sql["pool_queries"])) if idle else []
        return cls(
            incoming, writer_tables, refreshable, mutations, policies, access, trusted, found, idle
        )

    @classmethod
    def content_effect_reads(cls, database: str, names: Sequence[str]) -> list[Read]:
        """The reads of what can change a table's rows with no part to show it."""
        return [r for r in cls.reads(database, names) if r[0] in ("mutations", "row_policies")]

    @classmethod
    def tables_with_content_effects(
        cls, reads: CatalogReads, database: str, names: Sequence[str]
    ) -> set[str]:
        """Which of ``names`` have a mutation in flight or a row policy now (read again)."""
        sql = dict(cls.content_effect_reads(database, names))
        found = {text_field(m, "table", reads) for m in reads.rows("mutations", sql["mutations"])}
        for policy in reads.rows("row_policies", sql["row_policies"]):
            table = text_field(policy, "table", reads)
            found |= set(names) if table == "" else {table}
        return found

    def writers(self, database: str, name: str) -> list[Blocker]:
        """Who can write ``name`` (existing or not): a table writing into it, or an
        untrusted user's grant that covers it."""
        return [
            *self.writer_tables.blockers(name),
            *self.access.blockers(self.trusted, database, name),
            *self._pool_blockers(database, name),
        ]

    def _pool_blockers(self, database: str, name: str) -> list[Blocker]:
        """The queries of the pool's accounted principals that can write ``name``."""
        return pool_query_blockers(
            self.pool_queries,
            self.idle_since,
            lambda table: self.access.writers_of(database, table),
            database,
            name,
        )

    def blockers(
        self, database: str, name: str, row: Mapping[str, Any], reads: CatalogReads
    ) -> list[Blocker]:
        """Every side effect on ``name`` (whose system.tables row is ``row``), in a fixed order."""
        found: list[Blocker] = []
        for view in self.incoming:
            if text_field(view, "target_table", reads) != name:
                continue
            key = (text_field(view, "database", reads), text_field(view, "name", reads))
            if key in self.refreshable:
                found.append(
                    Blocker(
                        "refreshable_mv", f"refreshable view {key[0]}.{key[1]} writes to {name}"
                    )
                )
            else:
                found.append(
                    Blocker("incoming_mv", f"materialized view {key[0]}.{key[1]} writes to {name}")
                )
        found.extend(self.writer_tables.blockers(name))
        for kind, reason, what in (
            ("dependencies", "outgoing_mv", "materialized view {} reads from {}"),
            ("loading_dependent", "dictionary", "{} loads from {}"),
        ):
            dbs, objects = row.get(f"{kind}_database"), row.get(f"{kind}_table")
            if (
                not isinstance(dbs, list)
                or not isinstance(objects, list)
                or len(dbs) != len(objects)
            ):
                raise reads.malformed("tables", {"table": name, kind: [dbs, objects]})
            for db, obj in sorted(zip(dbs, objects, strict=True)):
                found.append(Blocker(reason, what.format(f"{db}.{obj}", name)))
        for mutation in self.mutations:
            if text_field(mutation, "table", reads) == name:
                found.append(
                    Blocker(
                        "mutation_in_flight",
                        f"mutation {text_field(mutation, 'mutation_id', reads)}: {text_field(mutation, 'command', reads)}",
                    )
                )
        for policy in self.policies:
            if text_field(policy, "table", reads) in (name, ""):
                found.append(
                    Blocker("row_policy", f"row policy {text_field(policy, 'name', reads)}")
                )
        found.extend(self.access.blockers(self.trusted, database, name))
        found.extend(self._pool_blockers(database, name))
        return found
