"""Handing a project's pool and target slots over from a store that is gone.

The server records one store as the owner of a pool and of each target slot
(:mod:`dpone.publication.principals.ownership`). When that store is really gone (its disk lost,
the project moved to a new store), its owner markers would refuse this project's store
for good. :func:`hand_over_project` gives this project's store what the named old
store owns, and nothing else: a marker owned by any third store is left and reported.
"""

from __future__ import annotations

from typing import Any

from dpone.errors import ConfigurationError
from dpone.ports.composition_snapshot import TargetSlot
from dpone.project.config import Project
from dpone.publication.principals.ownership import Owner, hand_over
from dpone.publication.store import open_store


def hand_over_project(project: Project, old_store: str) -> dict[str, Any]:
    """Give ``project``'s store the pool and the slots of its tables that ``old_store``
    owns; what each marker's owner is afterwards (``handed_over`` for those moved)."""
    store = open_store(project.store)
    me = Owner.of_store(store)
    if old_store == me.store:
        raise ConfigurationError(
            f"{old_store} is this project's own store ({project.store}); name the store "
            "that owns the pool or slot now, as the refusal printed it",
            code="hand_over_to_self",
            store=old_store,
        )
    slots = [TargetSlot(t.database, t.target) for t in project.tables.values()]
    markers = hand_over(project.clickhouse.access, me, old_store, slots)
    return {"store": me.to_dict(), "from": old_store, "markers": markers}
