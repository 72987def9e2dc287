"""Several slots of one database observed at once, for what would refuse each one.

A refresh of several tables first asks, for each, whether its target has a side effect
or a writer the publisher would refuse (``project/refresh_checks.py``). A read costs the
server the same whatever names it asks for, so the slots of one database are read
together and each judged from its own rows as observing it alone would judge it. Only a
slot whose generation does not exist yet is judged here; any other answers None, for the
caller to observe on its own. See docs/publication.md ("Many tables in one run").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from dpone.ports.composition_snapshot import Blocker
from dpone.publication.catalog.allowance import Idle
from dpone.publication.catalog.design import (
    database_read,
    design_blockers,
    read_designs,
    table_reads,
    tables_read,
)
from dpone.publication.catalog.pool_queries import pool_queries_read, slot_queries
from dpone.publication.catalog.reads import CatalogReads, text_field
from dpone.publication.catalog.side_effects import SideEffects


@dataclass(frozen=True)
class SlotView:
    """One slot to judge: its target, its (not yet created) generation, the pool users
    it accounts for, and the users whose write grants it allows (asked once the server
    was read, as a single observation asks it: a lease that ends meanwhile can only
    make it stricter)."""

    target: str
    generation: str
    idle: Mapping[str, Idle]
    allowed: Callable[[], frozenset[str]]


def slots_blockers(
    reads: CatalogReads, database: str, views: Sequence[SlotView]
) -> dict[str, tuple[Blocker, ...] | None]:
    """Each slot's blockers (its target's side effects and design, and the writers of
    each of its names that does not exist), by target; None for a slot not judged
    here (no such database, or its generation exists)."""
    names = tuple(dict.fromkeys(n for v in views for n in (v.target, v.generation)))
    database_of = database_read(database)
    names_read = tables_read(database, names)
    accounted: dict[str, Idle] = {}
    for view in views:
        accounted.update(view.idle)
    # A running SELECT is left out only for a user every slot accounting it says
    # another run holds: never fewer queries than each slot's own read would find.
    held = [
        user for user in accounted if all(v.idle[user].held_by for v in views if user in v.idle)
    ]
    generations = [v.generation for v in views]
    pool_read = (
        pool_queries_read(database, names, accounted, generations, held) if accounted else None
    )
    design_sql = {k: v for k, v in table_reads(database, names).items() if k != "parts"}
    reads.prefetch(
        "slots",
        [
            database_of,
            names_read,
            *SideEffects.reads(database, names, accounted, pool_read),
            *design_sql.items(),
        ],
    )
    databases = reads.rows(*database_of)
    if not databases:
        return {v.target: None for v in views}
    db_engine = text_field(databases[0], "engine", reads)
    tables = {text_field(r, "name", reads): r for r in reads.rows(*names_read)}
    side = SideEffects.read(reads, database, names, frozenset(), accounted, pool_read)
    present = {n: tables[n] for n in names if n in tables}
    designs = read_designs(reads, design_sql, present)
    judged: dict[str, tuple[Blocker, ...] | None] = {}
    for view in views:
        if view.generation in tables:
            judged[view.target] = None
            continue
        # Its generation does not exist: its own read would find no logged query.
        queries = slot_queries(side.pool_queries, view.idle, None)
        own = dataclasses.replace(
            side, trusted=view.allowed(), idle_since=dict(view.idle), pool_queries=queries
        )
        found: list[Blocker] = []
        for name in (view.target, view.generation):
            if name in present:
                found += design_blockers(designs[name], db_engine)
                found += own.blockers(database, name, present[name], reads)
            else:
                found += own.writers(database, name)
        judged[view.target] = tuple(found)
    return judged
