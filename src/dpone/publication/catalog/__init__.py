"""The ClickHouse snapshot catalog: a fresh, complete observation of a publication's names.

:class:`ClickHouseSnapshotCatalog` implements
:class:`dpone.ports.composition_snapshot.ClickHouseSnapshotCatalog` over one
:class:`~dpone.ports.clickhouse.QueryPort` carrying the catalog principal's credentials.
Every call reads the server again (only a content digest of an unchanged table is
reused, :mod:`.contents`), and a failed, partial or malformed answer raises
:class:`CatalogUnobservable`, never an empty list or a zero. Its parts, one concern a
module: :mod:`.reads`, :mod:`.sql`, :mod:`.design`, :mod:`.side_effects`,
:mod:`.writers`, :mod:`.grants` and :mod:`.allowance`. The rules are in
docs/publication-catalog.md.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from dpone.contracts import canonical_json
from dpone.errors import DponeError
from dpone.ports.clickhouse import QueryPort
from dpone.ports.composition_snapshot import (
    Blocker,
    CatalogObservation,
    ExchangeEvent,
    RecordedPresence,
    TableObservation,
    TargetSlot,
)
from dpone.publication.catalog.allowance import (
    AllowedWriters,
    Idle,
    IdlePool,
    accounted_pool_users,
    allowed_pool_users,
    lease_allowance,
)
from dpone.publication.catalog.contents import (
    STORED_KINDS,
    ObservedContents,
    Parts,
    content_key,
    read_parts,
)
from dpone.publication.catalog.design import (
    database_read,
    design_blockers,
    read_designs,
    table_reads,
    tables_read,
)
from dpone.publication.catalog.grants import (
    WRITER_ROOTS,
    GrantRow,
    writer_grant_blockers,
    writer_privileges,
)
from dpone.publication.catalog.presence import read_presence
from dpone.publication.catalog.reads import (
    ByteObservationMissing,
    CatalogReads,
    CatalogUnobservable,
    Read,
    catalog_query_id,
    count_field,
    text_field,
)
from dpone.publication.catalog.retained_storage import (
    OWNERSHIP_MARK,
    STAGE_PREFIX,
    RecordedUuids,
    recorded_for,
    retained_bytes,
    retained_reads,
    total_bytes,
)
from dpone.publication.catalog.side_effects import SideEffects
from dpone.publication.catalog.slots import SlotView, slots_blockers
from dpone.publication.catalog.sql import column_elements, column_ttls, engine_clauses
from dpone.sql import in_list, quote_literal

__all__ = [
    "DEFAULT_TIMEOUT_SECONDS",
    "EVENT_TYPES",
    "NIL_UUID",
    "OWNERSHIP_MARK",
    "STAGE_PREFIX",
    "STORED_KINDS",
    "WRITER_ROOTS",
    "AllowedWriters",
    "ByteObservationMissing",
    "CatalogUnobservable",
    "ClickHouseSnapshotCatalog",
    "GrantRow",
    "Idle",
    "IdlePool",
    "RecordedUuids",
    "accounted_pool_users",
    "allowed_pool_users",
    "catalog_query_id",
    "column_elements",
    "column_ttls",
    "design_sha256",
    "engine_clauses",
    "lease_allowance",
    "writer_grant_blockers",
    "writer_privileges",
]

DEFAULT_TIMEOUT_SECONDS = 60.0
EVENT_TYPES = ("QueryStart", "QueryFinish", "ExceptionBeforeStart", "ExceptionWhileProcessing")
NIL_UUID = "00000000-0000-0000-0000-000000000000"


class ClickHouseSnapshotCatalog:
    """Observes a publication's target slot and generation table, fresh on every call.

    ``transport`` carries the catalog principal. ``trusted_users`` may hold write grants at
    every observation; ``allowed_writers`` (for a leased pool, :func:`lease_allowance`) is
    asked once per observation for the principals allowed now, and any other user able to
    write either table blocks. ``recorded_uuids`` and ``live_targets``
    (:mod:`dpone.publication.ceilings.retained`) say which tables count as retained, read
    once per observation; ``idle_pool`` (:func:`accounted_pool_users`) names the pool users
    whose queries against either table are read and block (:mod:`.pool_queries`). See
    docs/publication-catalog.md and docs/publication-storage.md.
    """

    def __init__(
        self,
        transport: QueryPort,
        *,
        trusted_users: frozenset[str] = frozenset(),
        allowed_writers: AllowedWriters | None = None,
        recorded_uuids: RecordedUuids | None = None,
        live_targets: RecordedUuids | None = None,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        pool_members: frozenset[str] = frozenset(),
        operator: QueryPort | None = None,
        idle_pool: IdlePool | None = None,
    ) -> None:
        """``operator``: a transport, in a database that always exists, of one who sees
        every database (the server's administrator), for :meth:`recorded_presence`."""
        self._transport = transport
        self._operator = operator
        self.trusted_users = frozenset(trusted_users)
        # The pool's principals: the last look before an EXCHANGE leaves their grants to
        # the observation, which waits for a closure in progress (observe_settled).
        self.pool_members = frozenset(pool_members)
        self._allowed_writers = allowed_writers
        self._idle_pool = idle_pool
        self._recorded_uuids = recorded_uuids
        self._live_targets = live_targets
        self._timeout = timeout_seconds
        self._clock = clock

    def observe(self, slot: TargetSlot, generation_table: str) -> CatalogObservation:
        """Names, UUIDs, design, side effects, content and byte counters of both tables."""
        return self._observe(slot, generation_table, side_effects=True)

    def identities(self, slot: TargetSlot, generation_table: str) -> CatalogObservation:
        """What a reconcile decides by: both names' UUIDs, designs, rows and content
        digests, read as :meth:`observe` reads them, without the side effects around
        the tables or the retained storage (about a third of its reads).

        Nothing of those is observed: every table's ``blockers`` is empty,
        ``absent_writers`` too, and ``retained_bytes`` is 0. A digest is still taken
        from the kept ones only for a plain MergeTree table with no mutation in flight
        and no row policy (read in the same request), as :meth:`observe` takes it.
        """
        return self._observe(slot, generation_table, side_effects=False)

    def _observe(
        self, slot: TargetSlot, generation_table: str, *, side_effects: bool
    ) -> CatalogObservation:
        reads = CatalogReads(self._transport, self._clock() + self._timeout, self._clock)
        names = _two_names(slot, generation_table)
        # Both names' designs and parts and the retained storage (or, for identities
        # alone, what changes rows with no part to show it) are asked with the
        # database and the names in one request (a name that is not there answers
        # nothing), then both contents (their columns come from the designs) in another.
        sql = table_reads(slot.database, names)
        also = (
            retained_reads(slot, generation_table)
            if side_effects
            else SideEffects.content_effect_reads(slot.database, names)
        )
        around = self._around(
            reads, slot, names, also=[*sql.items(), *also], side_effects=side_effects
        )
        if around is None:
            return CatalogObservation(None, None, 0, _now())
        db_engine, db_uuid, tables, side = around
        present = [name for name in names if name in tables]
        designs = read_designs(reads, sql, {n: tables[n] for n in present})
        # The parts SQL asked with the designs (both names): read again at the recheck.
        parts_sql = sql["parts"]
        parts = read_parts(reads, parts_sql, names)
        # Identities alone: a table whose rows can change with no part to show it.
        with_effects = SideEffects.tables_with_content_effects
        effects = set() if side else with_effects(reads, slot.database, names)
        blockers = {
            name: [
                *design_blockers(designs[name], db_engine),
                *(side.blockers(slot.database, name, tables[name], reads) if side else []),
            ]
            for name in present
        }
        # A digest of a table whose UUID, design and parts are unchanged proves nothing new.
        keys = {
            name: None
            if name in effects
            else content_key(
                (db_uuid, text_field(tables[name], "uuid", reads)),
                designs[name],
                design_sha256(designs[name]),
                parts[name],
                blockers[name],
            )
            for name in present
        }
        contents = ObservedContents(
            reads, slot.database, {name: (keys[name], designs[name]) for name in present}
        )
        answered = contents.read()
        observed = {
            name: self._table(
                reads,
                (slot.database, name),
                tables[name],
                designs[name],
                (answered[name], parts[name], blockers[name] if side else []),
            )
            for name in present
        }
        retained = self._retained_bytes(reads, slot, generation_table) if side else 0
        target_bytes = observed[slot.table].total_bytes if side and slot.table in observed else 0
        # The observation spans several queries: both names must still be what they were,
        # and the parts read again say whether each digest belongs to the parts read before.
        self._recheck(reads, slot, names, observed, parts_sql)
        contents.settle(
            answered,
            read_parts(reads, parts_sql, names),
            SideEffects.tables_with_content_effects(reads, slot.database, names),
        )
        return CatalogObservation(
            target=observed.get(slot.table),
            generation=observed.get(generation_table),
            retained_bytes=target_bytes + retained,
            observed_at=_now(),
            absent_writers=_absent_writers(side, slot.database, names, tables) if side else (),
        )

    def slots_blockers(
        self, database: str, pairs: Sequence[tuple[str, str]]
    ) -> dict[str, tuple[Blocker, ...] | None]:
        """What would refuse each ``(target, generation)`` slot of ``database``, read for
        all of them at once (:mod:`.slots`): by target, its blockers and the writers of
        its absent names, as :meth:`observe` would find them; None for a slot to be
        observed on its own (no such database, or its generation exists)."""
        reads = CatalogReads(self._transport, self._clock() + self._timeout, self._clock)
        views = []
        for target, generation in pairs:
            slot = TargetSlot(database, target)
            _two_names(slot, generation)
            allowed = functools.partial(self._allowed, slot, generation)
            views.append(SlotView(target, generation, self._idle(slot, generation), allowed))
        return slots_blockers(reads, database, views)

    def side_effects_now(self, slot: TargetSlot, generation_table: str) -> tuple[Blocker, ...]:
        """The side effects on both names now, in one request (or, past the response
        budget, one per read): the executor's last look under the dispatch gate, before
        the EXCHANGE's session opens (a view, a Buffer, a mutation or an outside writer
        that appeared since the observation). The pool's own
        principals are judged by the observation (which waits for a closure another
        process is proving); a missing database or name is a blocker."""
        reads = CatalogReads(self._transport, self._clock() + self._timeout, self._clock)
        names = (slot.table, generation_table)
        around = self._around(reads, slot, names, self.trusted_users | self.pool_members)
        if around is None:
            return (Blocker("database_missing", f"no database {slot.database}"),)
        _, _, tables, side = around
        if side is None:  # read whenever side_effects is asked, as here: never
            raise CatalogUnobservable("the side effects were not read", database=slot.database)
        found: list[Blocker] = []
        for name in names:
            if name not in tables:
                found.append(Blocker("table_missing", f"no table {slot.database}.{name}"))
            else:
                found.extend(side.blockers(slot.database, name, tables[name], reads))
        return tuple(found)

    def exchange_events(self, query_id: str) -> list[ExchangeEvent]:
        """Every query-log row of ``query_id`` after ``SYSTEM FLUSH LOGS``, in order."""
        reads = CatalogReads(self._transport, self._clock() + self._timeout, self._clock)
        reads.rows("flush", "SYSTEM FLUSH LOGS", output=False)
        rows = reads.rows(
            "query_log",
            "SELECT toString(type) AS type, exception_code, user, "
            "toString(event_time_microseconds, 'UTC') AS event_time FROM system.query_log "
            f"WHERE query_id = {quote_literal(query_id)} ORDER BY event_time_microseconds, type",
        )
        events = []
        for row in rows:
            kind, code = row.get("type"), row.get("exception_code")
            if kind not in EVENT_TYPES or not isinstance(code, int) or isinstance(code, bool):
                raise reads.malformed("query_log", row)
            events.append(
                ExchangeEvent(
                    kind, code, text_field(row, "user", reads), text_field(row, "event_time", reads)
                )
            )
        return events

    def database_uuid(self, database: str) -> str | None:
        """The UUID of ``database`` on this server now (None: it does not exist).

        An intent records the UUID of its database as staging observed it: another
        UUID under the same name is another server (the project points elsewhere) or a
        database dropped and created again, where nothing the intent names can be.
        """
        reads = CatalogReads(self._transport, self._clock() + self._timeout, self._clock)
        rows = reads.rows(
            "database_uuid",
            "SELECT toString(uuid) AS uuid FROM system.databases "
            f"WHERE name = {quote_literal(database)}",
        )
        return text_field(rows[0], "uuid", reads) if rows else None

    def recorded_presence(
        self, database: str, database_uuid: str, table_uuids: tuple[str, ...]
    ) -> RecordedPresence:
        """Whether a database and tables of these UUIDs exist on the server now, under any
        name, and the server's identity (:func:`~.presence.read_presence`), read as the
        operator: the catalog's own principal sees only the protected names, so a
        database renamed away would look gone. ``catalog_unobservable`` without one."""
        if self._operator is None:
            raise CatalogUnobservable(
                "this catalog has no operator transport to look for recorded UUIDs",
                code="catalog_unobservable",
            )
        deadline = self._clock() + self._timeout
        return read_presence(
            self._operator, deadline, self._clock, database, database_uuid, table_uuids
        )

    def retained_bytes(self, slot: TargetSlot, generation_table: str) -> int:
        """What the slot's database retains now: the target's bytes plus the retained.

        The same count as :meth:`observe`'s ``retained_bytes``, without the designs,
        contents and side effects (no content digest is computed): a refresh asks it
        before staging, for the storage headroom left. A missing target (or database)
        counts 0; a NULL byte counter raises :class:`ByteObservationMissing`.
        """
        reads = CatalogReads(self._transport, self._clock() + self._timeout, self._clock)
        target_read = (
            "retained_target",
            "SELECT total_bytes FROM system.tables WHERE "
            f"database = {quote_literal(slot.database)} AND name = {quote_literal(slot.table)}",
        )
        reads.prefetch("retained", [target_read, *retained_reads(slot, generation_table)])
        rows = reads.rows(*target_read)
        target = total_bytes(rows[0], reads, slot.database, slot.table) if rows else 0
        return target + self._retained_bytes(reads, slot, generation_table)

    # ------------------------------------------------------------------ internals

    def _allowed(self, slot: TargetSlot, generation_table: str) -> frozenset[str]:
        """The trusted users and the principals the caller allows for this observation."""
        writers = self._allowed_writers
        if writers is None:
            return self.trusted_users
        allowed = _read_for(
            slot,
            f"the principals allowed to write {slot.database}.{slot.table}",
            lambda: frozenset(writers(slot, generation_table)),
        )
        return self.trusted_users | allowed

    def _around(
        self,
        reads: CatalogReads,
        slot: TargetSlot,
        names: tuple[str, str],
        allowed: frozenset[str] | None = None,
        also: Sequence[Read] = (),
        *,
        side_effects: bool = True,
    ) -> tuple[str, str, dict[str, dict[str, Any]], SideEffects | None] | None:
        """The database's engine, both names' system.tables rows and the side effects
        around them, in one request with the reads ``also`` asks for (None: no such
        database). ``allowed``: the users whose write grants are accepted (default:
        this observation's allowance)."""
        database = database_read(slot.database)
        names_read = tables_read(slot.database, names)
        idle = self._idle(slot, names[1]) if side_effects else {}
        around = SideEffects.reads(slot.database, names, idle) if side_effects else []
        reads.prefetch("observe", [database, names_read, *around, *also])
        databases = reads.rows(*database)
        if not databases:
            return None
        db_engine = text_field(databases[0], "engine", reads)
        db_uuid = text_field(databases[0], "uuid", reads)
        tables = {text_field(r, "name", reads): r for r in reads.rows(*names_read)}
        if not side_effects:
            return db_engine, db_uuid, tables, None
        if allowed is None:
            allowed = self._allowed(slot, names[1])
        side = SideEffects.read(reads, slot.database, names, allowed, idle)
        return db_engine, db_uuid, tables, side

    def _idle(self, slot: TargetSlot, generation_table: str) -> dict[str, Idle]:
        """The pool's users no lease of this publication holds now (none without
        ``idle_pool``)."""
        pool = self._idle_pool
        if pool is None:
            return {}
        idle = _read_for(
            slot,
            f"the pool's leases for {slot.database}.{slot.table}",
            lambda: pool(slot, generation_table),
        )
        return {u: t for u, t in idle.items() if u not in self.trusted_users}

    @staticmethod
    def _recheck_read(slot: TargetSlot, names: tuple[str, str]) -> Read:
        return (
            "recheck",
            f"SELECT name, toString(uuid) AS uuid FROM system.tables WHERE database = "
            f"{quote_literal(slot.database)} AND name IN {in_list(names)}",
        )

    def _recheck(
        self,
        reads: CatalogReads,
        slot: TargetSlot,
        names: tuple[str, str],
        observed: Mapping[str, TableObservation],
        parts_sql: str,
    ) -> None:
        """Both names still hold the tables (UUIDs) the observation read, or it raises.

        Asked in one request with what the kept digests are settled by (read next): both
        tables' parts, their mutations in flight and row policies.
        """
        reads.prefetch(
            "recheck",
            [
                self._recheck_read(slot, names),
                ("parts", parts_sql),
                *SideEffects.content_effect_reads(slot.database, names),
            ],
        )
        again = {
            text_field(r, "name", reads): text_field(r, "uuid", reads)
            for r in reads.rows(*self._recheck_read(slot, names))
        }
        if again != {name: table.uuid for name, table in observed.items()}:
            raise CatalogUnobservable(
                f"{slot.database}.{slot.table} or {names[1]} changed during the observation",
                code="catalog_unobservable",
                database=slot.database,
            )

    def _retained_bytes(self, reads: CatalogReads, slot: TargetSlot, generation_table: str) -> int:
        """Bytes of every retained table of the slot's database (:func:`retained_bytes`)."""
        recorded = recorded_for(self._recorded_uuids, slot.database, "tables")
        live = recorded_for(self._live_targets, slot.database, "targets")
        return retained_bytes(reads, slot, generation_table, recorded, live)

    def _table(
        self,
        reads: CatalogReads,
        where: tuple[str, str],
        row: Mapping[str, Any],
        design: dict[str, Any],
        found: tuple[Mapping[str, Any], Parts, list[Blocker]],
    ) -> TableObservation:
        (database, name), (content, parts, blockers) = where, found
        return TableObservation(
            database=database,
            name=name,
            uuid=text_field(row, "uuid", reads),
            engine=design["engine"],
            design=design,
            design_sha256=design_sha256(design),
            rows=count_field(content, "rows", reads),
            content_digest=str(content["digest"]),
            total_bytes=total_bytes(row, reads, database, name),
            parts=parts.count,
            blockers=tuple(blockers),
        )


def design_sha256(design: Mapping[str, Any]) -> str:
    """SHA-256 of a design's canonical JSON: the digest an intent binds at prepare."""
    return canonical_json.sha256_hex(design)


def _absent_writers(
    side: SideEffects, database: str, names: tuple[str, str], tables: Mapping[str, Any]
) -> tuple[Blocker, ...]:
    """Who could write each of ``names`` that does not exist (yet)."""
    return tuple(b for name in names if name not in tables for b in side.writers(database, name))


def _two_names(slot: TargetSlot, generation_table: str) -> tuple[str, str]:
    """The slot's target and its generation, two names, or ``catalog_unobservable``."""
    if slot.table == generation_table:
        raise CatalogUnobservable(
            "the target and the generation are the same name",
            code="catalog_unobservable",
            table=slot.table,
        )
    return slot.table, generation_table


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


T = TypeVar("T")


def _read_for(slot: TargetSlot, what: str, read: Callable[[], T]) -> T:
    """``read()``, what the store answers an observation of ``slot``; its failure is
    ``catalog_unobservable`` naming ``what`` (nothing is assumed instead)."""
    try:
        return read()
    except DponeError as exc:
        raise CatalogUnobservable(
            f"{what} could not be read: {exc.message}",
            database=slot.database,
            table=slot.table,
            cause=exc.code,
        ) from exc
