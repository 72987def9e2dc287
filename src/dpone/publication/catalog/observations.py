"""Slots of one database observed at once, each exactly as observing it alone would.

An observation costs the server the same whatever names it asks about, so the slots
(target and generation) of one database at the same step are observed together: every
read asks every name of every slot, and each slot's observation is taken from the rows
of its own names, with its own allowance (asked once the server was read), its own
accounted pool users and its own retained storage. One slot is the case
:meth:`~dpone.publication.catalog.ClickHouseSnapshotCatalog.observe` asks. See
docs/publication-catalog.md ("Several slots at once") and docs/publication.md ("Many
tables in one run").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dpone.errors import ConfigurationError
from dpone.ports.composition_snapshot import Blocker, CatalogObservation, TableObservation
from dpone.publication.catalog.allowance import Idle
from dpone.publication.catalog.contents import ObservedContents, Parts, content_key, read_parts
from dpone.publication.catalog.design import (
    database_read,
    design_blockers,
    design_sha256,
    read_designs,
    table_reads,
    tables_read,
)
from dpone.publication.catalog.pool_queries import pool_queries_read, slot_queries
from dpone.publication.catalog.reads import (
    CatalogReads,
    CatalogUnobservable,
    Read,
    count_field,
    text_field,
)
from dpone.publication.catalog.retained_storage import Retained, retained_reads, total_bytes
from dpone.publication.catalog.side_effects import SideEffects
from dpone.publication.catalog.slots import SlotView
from dpone.sql import in_list, quote_literal

# The store's recorded UUIDs and live targets of the database, asked once per observation.
RetainedSource = Callable[[], tuple[frozenset[str], frozenset[str]]]


class SlotsOverlap(ConfigurationError):
    """Two slots of one observation share a name: each name is one slot's (the code is
    ``configuration_error``: a caller's mistake, nothing was read)."""


@dataclass(frozen=True)
class Around:
    """The first request's answer: the database's engine and UUID, the names'
    system.tables rows, and each slot's own side effects by target (none when they were
    not asked)."""

    engine: str
    uuid: str
    tables: dict[str, dict[str, Any]]
    sides: dict[str, SideEffects]


def slot_names(pairs: Sequence[tuple[str, str]]) -> tuple[str, ...]:
    """Every name of the ``(target, generation)`` pairs in order: two per slot, none in
    two slots."""
    names: list[str] = []
    for target, generation in pairs:
        if target == generation:
            raise CatalogUnobservable(
                "the target and the generation are the same name",
                code="catalog_unobservable",
                table=target,
            )
        for name in (target, generation):
            if name in names:
                raise SlotsOverlap(
                    f"{name} is a name of two slots observed together",
                    table=name,
                )
            names.append(name)
    return tuple(names)


def read_around(
    reads: CatalogReads,
    database: str,
    views: Sequence[SlotView],
    also: Sequence[Read] = (),
    *,
    side_effects: bool = True,
) -> Around | None:
    """The database, every name's system.tables row and the side effects around them,
    in one request with the reads ``also`` asks for (None: no such database); each
    slot's side effects are its own: its allowance, asked once the server was read, and
    its accounted pool users' queries (:func:`~.pool_queries.slot_queries`)."""
    names = tuple(dict.fromkeys(n for v in views for n in (v.target, v.generation)))
    database_of, names_read = database_read(database), tables_read(database, names)
    accounted: dict[str, Idle] = {}
    for view in views:
        accounted.update(view.idle)
    pool_read = (
        _pool_read(database, names, views, accounted) if accounted and side_effects else None
    )
    around = SideEffects.reads(database, names, accounted, pool_read) if side_effects else []
    reads.prefetch("observe", [database_of, names_read, *around, *also])
    databases = reads.rows(*database_of)
    if not databases:
        return None
    engine = text_field(databases[0], "engine", reads)
    db_uuid = text_field(databases[0], "uuid", reads)
    tables = {text_field(r, "name", reads): r for r in reads.rows(*names_read)}
    if not side_effects:
        return Around(engine, db_uuid, tables, {})
    allowed = {view.target: view.allowed() for view in views}
    side = SideEffects.read(reads, database, names, frozenset(), accounted, pool_read)
    sides = {}
    for view in views:
        made = tables.get(view.generation)
        sides[view.target] = dataclasses.replace(
            side,
            trusted=allowed[view.target],
            idle_since=dict(view.idle),
            pool_queries=slot_queries(
                side.pool_queries,
                view.idle,
                None if made is None else count_field(made, "made_s", reads),
            ),
        )
    return Around(engine, db_uuid, tables, sides)


def _pool_read(
    database: str, names: Sequence[str], views: Sequence[SlotView], accounted: Mapping[str, Idle]
) -> Read:
    """The pool queries' read for every slot: the running SELECTs of a user left out
    only where every slot accounting it says another run holds it, the logged ones
    from the earliest generation's creation; each slot keeps its own rows."""
    held = [
        user for user in accounted if all(v.idle[user].held_by for v in views if user in v.idle)
    ]
    generations = [v.generation for v in views]
    return pool_queries_read(database, names, accounted, generations, held)


def observe_slots(
    reads: CatalogReads,
    database: str,
    views: Sequence[SlotView],
    retained: RetainedSource,
    *,
    side_effects: bool,
) -> dict[tuple[str, str], CatalogObservation]:
    """Each slot's observation, by ``(target, generation)`` (see the module doc).

    Three requests whatever the number of slots: the reads, the contents not kept,
    the recheck. Any name of any slot that changed during the observation refuses the
    whole of it (:class:`CatalogUnobservable`). Without ``side_effects``, what
    :meth:`~dpone.publication.catalog.ClickHouseSnapshotCatalog.identities` answers.
    """
    names = slot_names([(v.target, v.generation) for v in views])
    if not names:
        return {}
    sql = table_reads(database, names)
    # One slot leaves its own names out of the retained read; several read every table.
    excluded = names if len(views) == 1 else ()
    also = (
        retained_reads(database, excluded)
        if side_effects
        else SideEffects.content_effect_reads(database, names)
    )
    around = read_around(reads, database, views, [*sql.items(), *also], side_effects=side_effects)
    if around is None:
        return {(v.target, v.generation): CatalogObservation(None, None, 0, _now()) for v in views}
    observed, contents, answered = _observe_tables(
        reads, database, views, (around, sql), side_effects=side_effects
    )
    retained_of = None
    if side_effects:  # each slot's, read before the recheck as one slot's always was
        kept = Retained.read(reads, database, excluded, *retained())
        retained_of = {v.target: kept.bytes_of(reads, (v.target, v.generation)) for v in views}
    _recheck(reads, database, names, observed, sql["parts"])
    contents.settle(
        answered,
        read_parts(reads, sql["parts"], names),
        SideEffects.tables_with_content_effects(reads, database, names),
    )
    return {
        (view.target, view.generation): _slot_observation(
            database, view, around, observed, retained_of
        )
        for view in views
    }


def _observe_tables(
    reads: CatalogReads,
    database: str,
    views: Sequence[SlotView],
    read: tuple[Around, Mapping[str, str]],
    *,
    side_effects: bool,
) -> tuple[dict[str, TableObservation], ObservedContents, dict[str, dict[str, Any]]]:
    """Every present name's observation (its blockers by its own slot's rules, none
    without side effects), with the contents to settle after the recheck and their
    answers."""
    around, sql = read
    names = tuple(n for v in views for n in (v.target, v.generation))
    tables = around.tables
    present = [name for name in names if name in tables]
    designs = read_designs(reads, sql, {n: tables[n] for n in present})
    parts = read_parts(reads, sql["parts"], names)
    # Identities alone: a table whose rows can change with no part to show it.
    effects = (
        set() if side_effects else SideEffects.tables_with_content_effects(reads, database, names)
    )
    owner = {name: view.target for view in views for name in (view.target, view.generation)}
    blockers = {
        name: design_blockers(designs[name], around.engine)
        + (
            around.sides[owner[name]].blockers(database, name, tables[name], reads)
            if side_effects
            else []
        )
        for name in present
    }
    # A digest of a table whose UUID, design and parts are unchanged proves nothing new.
    keys = {
        name: None
        if name in effects
        else content_key(
            (around.uuid, text_field(tables[name], "uuid", reads)),
            designs[name],
            design_sha256(designs[name]),
            parts[name],
            blockers[name],
        )
        for name in present
    }
    contents = ObservedContents(
        reads, database, {name: (keys[name], designs[name]) for name in present}
    )
    answered = contents.read()
    observed = {
        name: table_observation(
            reads,
            (database, name),
            tables[name],
            designs[name],
            (answered[name], parts[name]),
            blockers[name] if side_effects else (),
        )
        for name in present
    }
    return observed, contents, answered


def _slot_observation(
    database: str,
    view: SlotView,
    around: Around,
    observed: Mapping[str, TableObservation],
    retained_of: Mapping[str, int] | None,
) -> CatalogObservation:
    """One slot's observation from the rows of its own names."""
    target, generation = observed.get(view.target), observed.get(view.generation)
    if retained_of is None:  # identities: nothing around the tables was read
        return CatalogObservation(target, generation, 0, _now())
    own = (view.target, view.generation)
    side = around.sides[view.target]
    absent = tuple(
        b for name in own if name not in around.tables for b in side.writers(database, name)
    )
    target_bytes = target.total_bytes if target is not None else 0
    return CatalogObservation(
        target=target,
        generation=generation,
        retained_bytes=target_bytes + retained_of[view.target],
        observed_at=_now(),
        absent_writers=absent,
    )


def _recheck(
    reads: CatalogReads,
    database: str,
    names: Sequence[str],
    observed: Mapping[str, TableObservation],
    parts_sql: str,
) -> None:
    """Every name still holds the table (UUID) the observation read, or it raises.

    Asked in one request with what the kept digests are settled by (read next): the
    tables' parts, their mutations in flight and row policies.
    """
    recheck: Read = (
        "recheck",
        f"SELECT name, toString(uuid) AS uuid FROM system.tables WHERE database = "
        f"{quote_literal(database)} AND name IN {in_list(names)}",
    )
    reads.prefetch(
        "recheck",
        [recheck, ("parts", parts_sql), *SideEffects.content_effect_reads(database, names)],
    )
    again = {
        text_field(r, "name", reads): text_field(r, "uuid", reads) for r in reads.rows(*recheck)
    }
    before = {name: table.uuid for name, table in observed.items()}
    changed = [name for name in names if again.get(name) != before.get(name)]
    if changed:
        raise CatalogUnobservable(
            f"{database}.{', '.join(changed)} changed during the observation",
            code="catalog_unobservable",
            database=database,
            table=changed[0],
        )


def table_observation(
    reads: CatalogReads,
    where: tuple[str, str],
    row: Mapping[str, Any],
    design: dict[str, Any],
    found: tuple[Mapping[str, Any], Parts],
    blockers: Sequence[Blocker] = (),
) -> TableObservation:
    """One table's observation from its system.tables row, design, content and parts."""
    (database, name), (content, parts) = where, found
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


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")
