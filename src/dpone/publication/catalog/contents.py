"""A table's content digest, computed by the server once for each state of the table.

The content (row count and digest of the stored columns, :func:`read_content`) is the
expensive read of an observation: a full scan. A refresh observes the same two tables
several times (its check, prepare, the recheck before the EXCHANGE and the reconcile
after it), and the digest of a table whose UUID, design and active parts are what they
were when its digest was computed proves nothing new. Its rows are those rows: a part
never changes under its name, its ``hash_of_all_files`` covers every file it has, and
whatever changes rows (an insert, a merge, a mutation, a lightweight delete or update,
an attach, a truncate) changes the set of active parts, names or hashes.

So the process keeps each digest under that key (:data:`MEMO`), and an observation
that finds its key takes the digest instead of asking for it again. A digest is kept
only when the parts read before it equal the parts read after it, in the
observation's recheck: it belongs to exactly that set of parts. An observation that
took a kept digest and then sees other parts at its recheck asks for the digest after
all. Nothing else is kept, and nothing is kept across processes.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dpone.publication.catalog.reads import CatalogReads, count_field, text_field

# Kept digests per process: a run observes a few tables at a time.
MEMO_ENTRIES = 256
PARTS_SQL = (
    "SELECT count() AS parts, lower(hex(SHA256(arrayStringConcat(arraySort(groupArray("
    "concat(name, ' ', hash_of_all_files))), '\\n')))) AS signature FROM system.parts "
    "WHERE {where} AND active"
)


@dataclass(frozen=True)
class Parts:
    """A table's active parts as one observation read them: their number and signature."""

    count: int
    signature: str


def read_parts(reads: CatalogReads, sql: str) -> Parts:
    """The ``parts`` read (:data:`PARTS_SQL`): exactly one row, both fields typed."""
    rows = reads.rows("parts", sql)
    row = rows[0] if len(rows) == 1 else {}
    return Parts(count_field(row, "parts", reads), text_field(row, "signature", reads))


@dataclass(frozen=True)
class ContentKey:
    """What a digest belongs to: the table, its design and the active parts it covered."""

    uuid: str
    design_sha256: str
    parts_signature: str


class ContentMemo:
    """Digests of tables in a known state, the most recent :data:`MEMO_ENTRIES` (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: OrderedDict[ContentKey, dict[str, Any]] = OrderedDict()
        self.computed = 0  # digests asked of the server (a count for reports and benches)
        self.reused = 0

    def get(self, key: ContentKey) -> dict[str, Any] | None:
        """The content kept for ``key`` (a copy), or None."""
        with self._lock:
            found = self._kept.get(key)
            if found is None:
                return None
            self._kept.move_to_end(key)
            self.reused += 1
            return dict(found)

    def put(self, key: ContentKey, content: Mapping[str, Any]) -> None:
        """Keep ``content`` for ``key`` (only after the parts were the same around it)."""
        with self._lock:
            self._kept[key] = dict(content)
            self._kept.move_to_end(key)
            while len(self._kept) > MEMO_ENTRIES:
                self._kept.popitem(last=False)

    def clear(self) -> None:
        """Forget every kept digest."""
        with self._lock:
            self._kept.clear()


MEMO = ContentMemo()
"""The process's kept digests, shared by every catalog."""
