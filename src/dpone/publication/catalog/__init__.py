"""The ClickHouse snapshot catalog: a fresh, complete observation of a publication's names.

Implements :class:`dpone.ports.composition_snapshot.ClickHouseSnapshotCatalog` over one
:class:`~dpone.ports.clickhouse.QueryPort` that carries the catalog principal's
credentials. Every call reads the server again (only the content digest of a table whose
UUID, design and parts are unchanged is taken from :mod:`.contents`), every query has
its own read query id, and any failed, partial or malformed answer raises
:class:`CatalogUnobservable` instead of turning into an empty list or a zero. The
rules (what is part of the design, which side effects block, which grants count as
writers) are documented in docs/publication-catalog.md.

The parts, one concern a module: the reads and their typed failures
(:mod:`.reads`), the SQL text the server shows (:mod:`.sql`), a table's
design and content (:mod:`.design`), the side effects around it
(:mod:`.side_effects`), the tables that write into it (:mod:`.writers`), its
untrusted writers (:mod:`.grants`) and which principals are allowed per observation
(:mod:`.allowance`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
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
    allowed_pool_users,
    idle_pool_users,
    lease_allowance,
)
from dpone.publication.catalog.contents import (
    STORED_KINDS,
    ObservedContents,
    Parts,
    content_key,
    read_parts,
)
from dpone.publication.catalog.design import design_blockers, read_design, table_reads
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
from dpone.publication.catalog.side_effects import SideEffects
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
    "allowed_pool_users",
    "catalog_query_id",
    "column_elements",
    "column_ttls",
    "design_sha256",
    "engine_clauses",
    "idle_pool_users",
    "lease_allowance",
    "writer_grant_blockers",
    "writer_privileges",
]

# Staging's private tables are named ``dpone_stage_<attempt>`` and carry the ownership
# comment ``dpone-owned attempt=... semantic=...`` on their first column (see
# dpone.staging.service); a staged generation with no intent yet is recognised by both,
# every other retained table by the UUID the store recorded (docs/publication-storage.md).
STAGE_PREFIX = "dpone_stage_"
OWNERSHIP_MARK = "dpone-owned "
DEFAULT_TIMEOUT_SECONDS = 60.0
# database -> the UUIDs of the tables the store recorded there (targets and generations).
RecordedUuids = Callable[[str], Collection[str]]
EVENT_TYPES = ("QueryStart", "QueryFinish", "ExceptionBeforeStart", "ExceptionWhileProcessing")
NIL_UUID = "00000000-0000-0000-0000-000000000000"
# Both names' system.tables rows: the design, the outgoing dependents and the byte counter.
_TABLES_SQL = (
    "SELECT name, toString(uuid) AS uuid, engine, engine_full, create_table_query, "
    "partition_key, sorting_key, primary_key, sampling_key, total_bytes, "
    "dependencies_database, dependencies_table, loading_dependent_database, "
    "loading_dependent_table FROM system.tables WHERE database = {db} AND name IN {names}"
)


class ClickHouseSnapshotCatalog:
    """Observes a publication's target slot and generation table, fresh on every call.

    ``transport`` carries the catalog principal (read-only on the protected databases
    and the system tables, plus ``SYSTEM FLUSH LOGS``). ``trusted_users`` are the users
    whose write grants are allowed at every observation (the administrator, the
    catalog, the closer); ``allowed_writers``, when given, is asked once per
    observation for the principals allowed now (for a leased pool,
    :func:`lease_allowance`). Any other user able to write either table blocks.
    ``recorded_uuids``, when given, answers per database the table UUIDs the store
    recorded (:func:`dpone.publication.retained.recorded_table_uuids`), read once
    per observation: every table holding one counts toward the retained bytes, except
    a table under a name ``live_targets`` answers (another slot's live target,
    :func:`dpone.publication.retained.recorded_target_names`), which is that slot's A.
    ``idle_pool``, when given, answers per observation the pool's users without an
    active lease (:func:`idle_pool_users`): what they ran against either table is
    read in the observation's batch and blocks (:mod:`.pool_queries`).
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
        reads = CatalogReads(self._transport, self._clock() + self._timeout, self._clock)
        names = (slot.table, generation_table)
        if slot.table == generation_table:
            raise CatalogUnobservable(
                "the target and the generation are the same name",
                code="catalog_unobservable",
                table=slot.table,
            )
        # Both names' designs and parts and the retained storage are asked with the
        # database and the names in one request (a name that is not there answers
        # nothing), then both contents (their columns come from the designs) in another.
        designs_read = [
            *(read for name in names for read in table_reads(slot.database, name).items()),
            *self._retained_reads(slot, generation_table),
        ]
        around = self._around(reads, slot, names, also=designs_read)
        if around is None:
            return CatalogObservation(None, None, 0, _now())
        db_engine, db_uuid, tables, side = around
        present = [name for name in names if name in tables]
        designs = {name: read_design(reads, slot.database, name, tables[name]) for name in present}
        parts_sql = {name: table_reads(slot.database, name)["parts"] for name in present}
        parts = {name: read_parts(reads, parts_sql[name]) for name in present}
        blockers = {
            name: [
                *design_blockers(designs[name], db_engine),
                *side.blockers(slot.database, name, tables[name], reads),
            ]
            for name in present
        }
        # A digest of a table whose UUID, design and parts are unchanged proves nothing new.
        contents = ObservedContents(
            reads,
            slot.database,
            {
                name: (
                    content_key(
                        (db_uuid, text_field(tables[name], "uuid", reads)),
                        designs[name],
                        design_sha256(designs[name]),
                        parts[name],
                        blockers[name],
                    ),
                    designs[name],
                )
                for name in present
            },
        )
        answered = contents.read()
        observed = {
            name: self._table(
                reads,
                (slot.database, name),
                tables[name],
                designs[name],
                (answered[name], parts[name], blockers[name]),
            )
            for name in present
        }
        retained = self._retained_bytes(reads, slot, generation_table)
        target_bytes = observed[slot.table].total_bytes if slot.table in observed else 0
        # The observation spans several queries: both names must still be what they were,
        # and the parts read again say whether each digest belongs to the parts read before.
        self._recheck(reads, slot, names, observed, parts_sql)
        contents.settle(
            answered,
            {name: read_parts(reads, parts_sql[name]) for name in present},
            SideEffects.tables_with_content_effects(reads, slot.database, names),
        )
        return CatalogObservation(
            target=observed.get(slot.table),
            generation=observed.get(generation_table),
            retained_bytes=target_bytes + retained,
            observed_at=_now(),
            absent_writers=_absent_writers(side, slot.database, names, tables),
        )

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
        reads.prefetch("retained", [target_read, *self._retained_reads(slot, generation_table)])
        rows = reads.rows(*target_read)
        target = _total_bytes(rows[0], reads, slot.database, slot.table) if rows else 0
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
    ) -> tuple[str, str, dict[str, dict[str, Any]], SideEffects] | None:
        """The database's engine, both names' system.tables rows and the side effects
        around them, in one request with the reads ``also`` asks for (None: no such
        database). ``allowed``: the users whose write grants are accepted (default:
        this observation's allowance)."""
        db = quote_literal(slot.database)
        database_read = (
            "database",
            f"SELECT engine, toString(uuid) AS uuid FROM system.databases WHERE name = {db}",
        )
        tables_read = ("tables", _TABLES_SQL.format(db=db, names=in_list(names)))
        idle = self._idle(slot)
        reads.prefetch(
            "observe",
            [database_read, tables_read, *SideEffects.reads(slot.database, names, idle), *also],
        )
        databases = reads.rows(*database_read)
        if not databases:
            return None
        db_engine = text_field(databases[0], "engine", reads)
        db_uuid = text_field(databases[0], "uuid", reads)
        tables = {text_field(r, "name", reads): r for r in reads.rows(*tables_read)}
        if allowed is None:
            allowed = self._allowed(slot, names[1])
        side = SideEffects.read(reads, slot.database, names, allowed, idle)
        return db_engine, db_uuid, tables, side

    def _idle(self, slot: TargetSlot) -> dict[str, Idle]:
        """The pool's users without an active lease now (none without ``idle_pool``)."""
        if self._idle_pool is None:
            return {}
        idle = _read_for(
            slot, f"the pool's leases for {slot.database}.{slot.table}", self._idle_pool
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
        parts_sql: Mapping[str, str],
    ) -> None:
        """Both names still hold the tables (UUIDs) the observation read, or it raises.

        Asked in one request with what the kept digests are settled by (read next): both
        tables' parts, their mutations in flight and row policies.
        """
        reads.prefetch(
            "recheck",
            [
                self._recheck_read(slot, names),
                *(("parts", sql) for sql in parts_sql.values()),
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
            total_bytes=_total_bytes(row, reads, database, name),
            parts=parts.count,
            blockers=tuple(blockers),
        )

    @staticmethod
    def _recorded(source: RecordedUuids | None, database: str, what: str) -> frozenset[str]:
        """What ``source`` answers for ``database`` now (nothing without a source)."""
        if source is None:
            return frozenset()
        try:
            return frozenset(source(database))
        except DponeError as exc:
            raise CatalogUnobservable(
                f"the {what} recorded for {database} could not be read: {exc.message}",
                database=database,
                cause=exc.code,
            ) from exc

    @staticmethod
    def _retained_reads(slot: TargetSlot, generation_table: str) -> list[Read]:
        """The two reads of :meth:`_retained_bytes`: the other tables and staging's marks."""
        db = quote_literal(slot.database)
        return [
            (
                "retained",
                f"SELECT name, toString(uuid) AS uuid, total_bytes FROM system.tables WHERE "
                f"database = {db} AND name NOT IN {in_list((slot.table, generation_table))}",
            ),
            (
                "retained_marks",
                f"SELECT table, comment FROM system.columns WHERE database = {db} AND "
                f"startsWith(table, {quote_literal(STAGE_PREFIX)}) AND position = 1",
            ),
        ]

    def _retained_bytes(self, reads: CatalogReads, slot: TargetSlot, generation_table: str) -> int:
        """Bytes of every retained table of the slot's database, each counted once.

        Retained: a table whose UUID the store recorded (a previous target or a
        generation of any intent of the database, wherever it sits now), or a
        ``dpone_stage_*`` table with staging's ownership mark (a staged generation with
        no intent yet). The target (counted as A by the caller) and the generation
        are not. A recorded UUID no longer present was dropped: nothing to count.
        """
        recorded = self._recorded(self._recorded_uuids, slot.database, "tables")
        # Other slots' live targets hold recorded generation UUIDs: they are those
        # slots' A, never this one's retained storage.
        live = self._recorded(self._live_targets, slot.database, "targets")
        tables_read, marks_read = self._retained_reads(slot, generation_table)
        tables = reads.rows(*tables_read)
        marks = {
            text_field(r, "table", reads): text_field(r, "comment", reads)
            for r in reads.rows(*marks_read)
        }
        total = 0
        for row in tables:
            name = text_field(row, "name", reads)
            if name in live:
                continue
            marked = name.startswith(STAGE_PREFIX) and marks.get(name, "").startswith(
                OWNERSHIP_MARK
            )
            if not marked and text_field(row, "uuid", reads) not in recorded:
                continue  # neither recorded nor staged by dpone: not retained
            total += _total_bytes(row, reads, slot.database, name, "retained table ")
        return total


def design_sha256(design: Mapping[str, Any]) -> str:
    """SHA-256 of a design's canonical JSON: the digest an intent binds at prepare."""
    return canonical_json.sha256_hex(design)


def _total_bytes(
    row: Mapping[str, Any], reads: CatalogReads, database: str, name: str, what: str = ""
) -> int:
    """A table's ``total_bytes``; NULL is a missing observation, never 0."""
    if row.get("total_bytes") is None:
        raise ByteObservationMissing(
            f"total_bytes of {what}{database}.{name} is NULL: the byte observation is missing",
            database=database,
            table=name,
            query_id=reads.last_query_id,
        )
    return count_field(row, "total_bytes", reads)


def _absent_writers(
    side: SideEffects, database: str, names: tuple[str, str], tables: Mapping[str, Any]
) -> tuple[Blocker, ...]:
    """Who could write each of ``names`` that does not exist (yet)."""
    return tuple(b for name in names if name not in tables for b in side.writers(database, name))


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
