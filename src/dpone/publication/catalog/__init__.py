"""The ClickHouse snapshot catalog: a fresh, complete observation of a publication's names.

:class:`ClickHouseSnapshotCatalog` implements
:class:`dpone.ports.composition_snapshot.ClickHouseSnapshotCatalog` over one
:class:`~dpone.ports.clickhouse.QueryPort` carrying the catalog principal's credentials.
Every call reads the server again (only a content digest of an unchanged table is
reused, :mod:`.contents`), and a failed, partial or malformed answer raises
:class:`CatalogUnobservable`, never an empty list or a zero. Its parts, one concern a
module: :mod:`.reads`, :mod:`.sql`, :mod:`.design`, :mod:`.side_effects`,
:mod:`.writers`, :mod:`.grants` and :mod:`.allowance`; several slots of one database
are observed at once by :mod:`.observations`. The rules are in
docs/publication-catalog.md.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from dpone.errors import DponeError
from dpone.ports.clickhouse import QueryPort
from dpone.ports.composition_snapshot import (
    Blocker,
    CatalogObservation,
    ExchangeEvent,
    RecordedPresence,
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
from dpone.publication.catalog.contents import STORED_KINDS
from dpone.publication.catalog.design import design_sha256
from dpone.publication.catalog.grants import (
    WRITER_ROOTS,
    GrantRow,
    writer_grant_blockers,
    writer_privileges,
)
from dpone.publication.catalog.observations import (
    SlotsOverlap,
    observe_slots,
    read_around,
    slot_names,
)
from dpone.publication.catalog.presence import read_presence
from dpone.publication.catalog.reads import (
    ByteObservationMissing,
    CatalogReads,
    CatalogUnobservable,
    catalog_query_id,
    text_field,
)
from dpone.publication.catalog.retained_storage import (
    OWNERSHIP_MARK,
    STAGE_PREFIX,
    RecordedUuids,
    Retained,
    recorded_for,
    retained_reads,
    total_bytes,
)
from dpone.publication.catalog.slots import SlotView, slots_blockers
from dpone.publication.catalog.sql import column_elements, column_ttls, engine_clauses
from dpone.sql import quote_literal

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
    "SlotsOverlap",
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
        # Set by a run whose tables go in threads (publication/sharing/): observe and
        # identities are then answered with every slot asked at once, each its own.
        self.shared: Callable[[TargetSlot, str, bool], CatalogObservation] | None = None
        # And side_effects_now, with every slot asked at once.
        self.shared_side_effects: Callable[[TargetSlot, str], tuple[Blocker, ...]] | None = None

    def observe(self, slot: TargetSlot, generation_table: str) -> CatalogObservation:
        """Names, UUIDs, design, side effects, content and byte counters of both tables."""
        if self.shared is not None:
            return self.shared(slot, generation_table, True)
        pair = (slot.table, generation_table)
        return self.observe_many(slot.database, [pair])[pair]

    def identities(self, slot: TargetSlot, generation_table: str) -> CatalogObservation:
        """What a reconcile decides by: both names' UUIDs, designs, rows and content
        digests, read as :meth:`observe` reads them, without the side effects around
        the tables or the retained storage (about a third of its reads).

        Nothing of those is observed: every table's ``blockers`` is empty,
        ``absent_writers`` too, and ``retained_bytes`` is 0. A digest is still taken
        from the kept ones only for a plain MergeTree table with no mutation in flight
        and no row policy (read in the same request), as :meth:`observe` takes it.
        """
        if self.shared is not None:
            return self.shared(slot, generation_table, False)
        pair = (slot.table, generation_table)
        return self.observe_many(slot.database, [pair], side_effects=False)[pair]

    def observe_many(
        self, database: str, pairs: Sequence[tuple[str, str]], *, side_effects: bool = True
    ) -> dict[tuple[str, str], CatalogObservation]:
        """Each ``(target, generation)`` slot of ``database`` observed at once
        (:mod:`.observations`), by pair: what :meth:`observe` (or, without
        ``side_effects``, :meth:`identities`) answers for that slot alone, in the three
        requests one observation makes, however many slots.

        Each slot is judged by its own rules: its allowance (asked once the server was
        read), its accounted pool users, its content digests and its retained storage.
        Any name of any slot that changed during the observation raises
        :class:`CatalogUnobservable` for the whole call. A name in two slots (two slots
        of one run never share a target) raises
        :class:`~.observations.SlotsOverlap`; no such database: every slot is
        ``CatalogObservation(None, None, 0, ...)``.
        """
        reads = CatalogReads(self._transport, self._clock() + self._timeout, self._clock)
        slot_names(pairs)  # refused before anything is read
        views = [self._view(TargetSlot(database, t), g, side_effects) for t, g in pairs]
        return observe_slots(
            reads,
            database,
            views,
            functools.partial(self._retained_uuids, database),
            side_effects=side_effects,
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
            slot_names([(target, generation)])
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
        if self.shared_side_effects is not None:
            return self.shared_side_effects(slot, generation_table)
        pair = (slot.table, generation_table)
        return self.side_effects_many(slot.database, [pair])[pair]

    def side_effects_many(
        self, database: str, pairs: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], tuple[Blocker, ...]]:
        """:meth:`side_effects_now` of each ``(target, generation)`` slot of
        ``database``, looked at once (one read of everything around their names), by
        pair; each slot's blockers are those of its own names."""
        reads = CatalogReads(self._transport, self._clock() + self._timeout, self._clock)
        slot_names(pairs)  # refused before anything is read
        allowed = self.trusted_users | self.pool_members
        views = [
            dataclasses.replace(
                self._view(TargetSlot(database, target), generation, True),
                allowed=lambda: allowed,
            )
            for target, generation in pairs
        ]
        around = read_around(reads, database, views)
        if around is None:
            missing = (Blocker("database_missing", f"no database {database}"),)
            return {pair: missing for pair in pairs}
        looks: dict[tuple[str, str], tuple[Blocker, ...]] = {}
        for target, generation in pairs:
            side, found = around.sides[target], []
            for name in (target, generation):
                if name not in around.tables:
                    found.append(Blocker("table_missing", f"no table {database}.{name}"))
                else:
                    found.extend(side.blockers(database, name, around.tables[name], reads))
            looks[(target, generation)] = tuple(found)
        return looks

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
        names = (slot.table, generation_table)
        reads.prefetch("retained", [target_read, *retained_reads(slot.database, names)])
        rows = reads.rows(*target_read)
        target = total_bytes(rows[0], reads, slot.database, slot.table) if rows else 0
        kept = Retained.read(reads, slot.database, names, *self._retained_uuids(slot.database))
        return target + kept.bytes_of(reads, names)

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

    def _view(self, slot: TargetSlot, generation_table: str, side_effects: bool) -> SlotView:
        """The slot as :mod:`.observations` reads it: its names, its accounted pool users
        (none without side effects) and its allowance, asked when the server was read."""
        idle = self._idle(slot, generation_table) if side_effects else {}
        allowed = functools.partial(self._allowed, slot, generation_table)
        return SlotView(slot.table, generation_table, idle, allowed)

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

    def _retained_uuids(self, database: str) -> tuple[frozenset[str], frozenset[str]]:
        """The store's recorded UUIDs and live targets of ``database``, read now."""
        recorded = recorded_for(self._recorded_uuids, database, "tables")
        return recorded, recorded_for(self._live_targets, database, "targets")


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
