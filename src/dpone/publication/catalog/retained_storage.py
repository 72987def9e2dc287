"""What a slot's database retains: the tables dpone keeps besides the live target.

Retained tables are the generations and previous targets the store recorded (by UUID,
wherever they sit now) and staging's own private tables not bound by an intent yet
(by name and ownership mark); their bytes count against the storage ceilings
(docs/publication-storage.md).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dpone.errors import DponeError
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


def retained_reads(database: str, excluded: Sequence[str] = ()) -> list[Read]:
    """The two reads of :class:`Retained`: the tables of ``database`` but ``excluded``
    (none left out: every table) and staging's marks."""
    db = quote_literal(database)
    but = f" AND name NOT IN {in_list(excluded)}" if excluded else ""
    return [
        (
            "retained",
            "SELECT name, toString(uuid) AS uuid, total_bytes FROM system.tables WHERE "
            f"database = {db}{but}",
        ),
        (
            "retained_marks",
            f"SELECT table, comment FROM system.columns WHERE database = {db} AND "
            f"startsWith(table, {quote_literal(STAGE_PREFIX)}) AND position = 1",
        ),
    ]


@dataclass(frozen=True)
class Retained:
    """A database's tables (but the names every observed slot leaves out) and staging's
    marks, read once for every slot of one observation, and the store's UUIDs."""

    database: str
    tables: list[dict[str, Any]]
    marks: Mapping[str, str]
    recorded: Collection[str]
    live: Collection[str]

    @classmethod
    def read(
        cls,
        reads: CatalogReads,
        database: str,
        excluded: Sequence[str],
        recorded: Collection[str],
        live: Collection[str],
    ) -> Retained:
        """The rows of :func:`retained_reads` (``excluded``: a name of every slot, or none)."""
        tables_read, marks_read = retained_reads(database, excluded)
        tables = reads.rows(*tables_read)
        marks = {
            text_field(r, "table", reads): text_field(r, "comment", reads)
            for r in reads.rows(*marks_read)
        }
        return cls(database, tables, marks, recorded, live)

    def bytes_of(self, reads: CatalogReads, names: Collection[str]) -> int:
        """Bytes of every retained table for the slot of ``names`` (its target and its
        generation, never retained for it), each counted once.

        Retained: a table whose UUID the store recorded (a previous target or a
        generation of any intent of the database, wherever it sits now), or a
        ``dpone_stage_*`` table with staging's ownership mark (a staged generation with
        no intent yet). A recorded UUID no longer present was dropped: nothing to count.
        """
        # ``live``: other slots' live targets hold recorded generation UUIDs: they are
        # those slots' A, never this one's retained storage.
        total = 0
        for row in self.tables:
            name = text_field(row, "name", reads)
            if name in names or name in self.live:
                continue
            mark = self.marks.get(name, "")
            marked = name.startswith(STAGE_PREFIX) and mark.startswith(OWNERSHIP_MARK)
            if not marked and text_field(row, "uuid", reads) not in self.recorded:
                continue  # neither recorded nor staged by dpone: not retained
            total += total_bytes(row, reads, self.database, name, "retained table ")
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
