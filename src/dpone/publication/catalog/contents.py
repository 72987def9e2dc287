"""A table's content digest, computed by the server once for each state of the table.

The content (row count and digest of the stored columns, :func:`read_content`) is a
full scan, and a refresh observes the same tables several times. A table whose UUID,
design and active parts are what they were when its digest was computed holds the same
rows, so the process keeps each digest under that key (:data:`MEMO`, never across
processes) for a plain MergeTree table with no blocker (:func:`content_key`), only when
the parts read before and after it agree. See docs/publication-catalog.md ("What an
observation contains").
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dpone.contracts.preparation import rows_digest_sql
from dpone.ports.composition_snapshot import Blocker
from dpone.publication.catalog.reads import (
    CatalogReads,
    CatalogUnobservable,
    Read,
    count_field,
    text_field,
)
from dpone.sql import quote_identifier

STORED_KINDS = ("", "DEFAULT")  # the columns RowBinary carries, hence the content digest's

# Kept digests per process: a run observes a few tables at a time.
MEMO_ENTRIES = 256
# Each table's active parts: a table with none (or no parts at all) answers no row.
PARTS_SQL = (
    "SELECT table, count() AS parts, lower(hex(SHA256(arrayStringConcat(arraySort(groupArray("
    "concat(name, ' ', hash_of_all_files))), '\\n')))) AS signature FROM system.parts "
    "WHERE {where} AND active GROUP BY table"
)
# The signature of no parts, as the server computes it (SHA-256 of the empty string).
NO_PARTS_SIGNATURE = hashlib.sha256(b"").hexdigest()


@dataclass(frozen=True)
class Parts:
    """A table's active parts as one observation read them: their number and signature."""

    count: int
    signature: str


def read_parts(reads: CatalogReads, sql: str, names: Collection[str]) -> dict[str, Parts]:
    """The ``parts`` read (:data:`PARTS_SQL`) of ``names``: at most one row each, both
    fields typed; a name with no row has no active part."""
    found: dict[str, Parts] = {}
    for row in reads.rows("parts", sql):
        name = text_field(row, "table", reads)
        if name not in names or name in found:
            raise reads.malformed("parts", row)
        found[name] = Parts(count_field(row, "parts", reads), text_field(row, "signature", reads))
    return {name: found.get(name, Parts(0, NO_PARTS_SIGNATURE)) for name in names}


@dataclass(frozen=True)
class ContentKey:
    """What a digest belongs to: the table (in its database), its design and the active
    parts it covered."""

    database_uuid: str
    uuid: str
    design_sha256: str
    parts_signature: str


def content_key(
    where: tuple[str, str],
    design: Mapping[str, Any],
    design_sha256: str,
    parts: Parts,
    blockers: Sequence[Blocker],
) -> ContentKey | None:
    """The key of a table's digest, or None when no digest of it is ever kept.

    Only a plain MergeTree table with no blocker qualifies: the rows of another engine
    (Memory, Log...) change with no part to show it, and a mutation in flight (whose
    effect reads can apply on the fly), a row policy or any other side effect could
    change what the digest reads while the parts stay.
    """
    if design.get("engine") != "MergeTree" or blockers:
        return None
    return ContentKey(where[0], where[1], design_sha256, parts.signature)


class ContentMemo:
    """Digests of tables in a known state, the most recent :data:`MEMO_ENTRIES` (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: OrderedDict[ContentKey, dict[str, Any]] = OrderedDict()
        self.computed = 0  # digests asked of the server (what the tests count)

    def get(self, key: ContentKey) -> dict[str, Any] | None:
        """The content kept for ``key`` (a copy), or None."""
        with self._lock:
            found = self._kept.get(key)
            if found is None:
                return None
            self._kept.move_to_end(key)
            return dict(found)

    def put(self, key: ContentKey, content: Mapping[str, Any]) -> None:
        """Keep ``content`` for ``key`` (only after the parts were the same around it)."""
        with self._lock:
            self._kept[key] = dict(content)
            self._kept.move_to_end(key)
            while len(self._kept) > MEMO_ENTRIES:
                self._kept.popitem(last=False)

    def count_computed(self) -> None:
        """One digest is being asked of the server."""
        with self._lock:
            self.computed += 1


MEMO = ContentMemo()
"""The process's kept digests, shared by every catalog."""


def content_read(database: str, name: str, design: Mapping[str, Any]) -> Read | None:
    """The read of ``database.name``'s row count and digest of its stored columns (None:
    it stores no column)."""
    stored = [
        quote_identifier(c["name"]) for c in design["columns"] if c["default_kind"] in STORED_KINDS
    ]
    if not stored:
        return None
    where = f"{quote_identifier(database)}.{quote_identifier(name)}"
    # The stored rows only: a pending mutation applied on the fly by a profile would
    # change what is read while the parts (what a kept digest is keyed by) stay.
    return (
        "content",
        f"SELECT count() AS rows, {rows_digest_sql(stored)} AS digest FROM {where} "
        "SETTINGS apply_mutations_on_fly = 0",
    )


def read_content(
    reads: CatalogReads, database: str, name: str, design: Mapping[str, Any]
) -> dict[str, Any]:
    """The one row ``{"rows", "digest"}`` of ``database.name``'s stored columns."""
    asked = content_read(database, name, design)
    if asked is None:
        raise reads.malformed("columns", {"table": name, "stored_columns": 0})
    MEMO.count_computed()
    content = reads.rows(*asked)
    if len(content) != 1 or not re.fullmatch(r"[0-9a-f]{32}", str(content[0].get("digest"))):
        raise reads.malformed("content", content)
    return content[0]


class ObservedContents:
    """The contents of one observation's tables: kept digests taken, the rest asked.

    ``tables`` maps each table's name to its key (:func:`content_key`; None: never kept)
    and design. :meth:`read` answers every table's content, asking the ones not kept in
    one request; :meth:`settle`, given the parts read again after the recheck, keeps the
    digests asked while the parts held still, and refuses an observation whose table
    changed after its parts were read when the digest reported was a kept one.
    """

    def __init__(
        self,
        reads: CatalogReads,
        database: str,
        tables: Mapping[str, tuple[ContentKey | None, Mapping[str, Any]]],
    ) -> None:
        self._reads, self._database, self._tables = reads, database, tables
        self._kept = {
            name: MEMO.get(key) if key is not None else None
            for name, (key, _design) in tables.items()
        }

    def read(self) -> dict[str, dict[str, Any]]:
        """Each table's ``{"rows", "digest"}``."""
        asked = [
            content_read(self._database, name, design)
            for name, (_key, design) in self._tables.items()
            if self._kept[name] is None
        ]
        self._reads.prefetch("contents", [read for read in asked if read is not None])
        return {
            name: self._kept[name] or read_content(self._reads, self._database, name, design)
            for name, (_key, design) in self._tables.items()
        }

    def settle(
        self,
        answered: Mapping[str, Mapping[str, Any]],
        after: Mapping[str, Parts],
        unsettled: Collection[str] = (),
    ) -> None:
        """Keep each digest asked while its parts held still and no mutation or row
        policy (``unsettled``: the tables with one, read again after the digests) could
        have changed what it read; refuse a kept one that went stale (the table changed
        after its parts were read: another state's digest)."""
        for name, (key, _design) in self._tables.items():
            if key is None:
                continue
            if after[name].signature == key.parts_signature:
                if self._kept[name] is None and name not in unsettled:
                    MEMO.put(key, answered[name])
            elif self._kept[name] is not None:
                raise CatalogUnobservable(
                    f"{self._database}.{name} changed during the observation (its parts are "
                    "not the ones its digest was taken for)",
                    code="catalog_unobservable",
                    database=self._database,
                    table=name,
                )
