"""Step notes: durable, append-only facts noted under a key (``steps``)."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import Any

from dpone.contracts import canonical_json
from dpone.ports.composition_snapshot import StepNote
from dpone.publication.store.connections import StoreConnections
from dpone.publication.store.schema import decode_facts, now


class StepNotes(StoreConnections):
    """Steps noted before any record exists, and read back by key."""

    def note_step(self, key: str, facts: Mapping[str, Any]) -> StepNote:
        """Durably note a step before any record exists (e.g. a first publication's CREATE).

        Not part of the port: the first publication writes it before dispatching.
        """
        facts_bytes = canonical_json.dumps(dict(facts))
        at = now()
        with self._write("note_step", "store_commit_unknown") as conn:
            sequence = append_step(conn, key, facts_bytes, at)
        assert sequence is not None
        return StepNote(sequence, key, at, decode_facts(facts_bytes))

    def step_notes(self, key: str) -> list[StepNote]:
        """Every note of ``key``, oldest first."""
        with self._reading("step_notes") as conn:
            rows = conn.execute(
                "SELECT id, key, at, facts FROM steps WHERE key = ? ORDER BY id", (key,)
            ).fetchall()
        return [StepNote(row[0], row[1], row[2], decode_facts(row[3])) for row in rows]


def append_step(conn: sqlite3.Connection, key: str, facts: bytes, at: str) -> int | None:
    """Append one note in ``conn``'s transaction; returns its sequence number."""
    cursor = conn.execute("INSERT INTO steps (key, facts, at) VALUES (?, ?, ?)", (key, facts, at))
    return cursor.lastrowid
