"""What a slot's database retains: the tables dpone keeps besides the live target.

Retained tables are the generations and previous targets the store recorded (by UUID,
wherever they sit now) and staging's own private tables not bound by an intent yet
(by name and ownership mark); their bytes count against the storage ceilings
(docs/publication-storage.md).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

from dpone.errors import DponeError
from dpone.ports.composition_snapshot import TargetSlot
from dpone.publication.catalog.reads import (
    ByteObservationMissing,
    CatalogReads,
    CatalogUnobservable,
    Read,
    count_field,
    text_field,
)
from dpone.sql import in_list, quote_literal

# Staging's private tables are named ``dpone_stage_<attempt>`` and carry the ownership
# comment ``dpone-owned attempt=... semantic=...`` on their first column (see
# dpone.staging.service); a staged generation with no intent yet is recognised by both,
# every other retained table by the UUID the store recorded (docs/publication-storage.md).
STAGE_PREFIX = "dpone_stage_"
OWNERSHIP_MARK = "dpone-owned "
# database -> the UUIDs of the tables the store recorded there (targets and generations).
RecordedUuids = Callable[[str], Collection[str]]


def recorded_for(source: RecordedUuids | None, database: str, what: str) -> frozenset[str]:
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


def retained_reads(slot: TargetSlot, generation_table: str) -> list[Read]:
    """The two reads of :func:`retained_bytes`: the other tables and staging's marks."""
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


def retained_bytes(
    reads: CatalogReads,
    slot: TargetSlot,
    generation_table: str,
    recorded: Collection[str],
    live: Collection[str],
) -> int:
    """Bytes of every retained table of the slot's database, each counted once.

    Retained: a table whose UUID the store recorded (a previous target or a
    generation of any intent of the database, wherever it sits now), or a
    ``dpone_stage_*`` table with staging's ownership mark (a staged generation with
    no intent yet). The target (counted as A by the caller) and the generation
    are not. A recorded UUID no longer present was dropped: nothing to count.
    """
    # ``live``: other slots' live targets hold recorded generation UUIDs: they are
    # those slots' A, never this one's retained storage.
    tables_read, marks_read = retained_reads(slot, generation_table)
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
        marked = name.startswith(STAGE_PREFIX) and marks.get(name, "").startswith(OWNERSHIP_MARK)
        if not marked and text_field(row, "uuid", reads) not in recorded:
            continue  # neither recorded nor staged by dpone: not retained
        total += total_bytes(row, reads, slot.database, name, "retained table ")
    return total


def total_bytes(
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
