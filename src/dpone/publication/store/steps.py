"""Step notes: durable, append-only facts noted under a key (``steps``)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from dpone.contracts import canonical_json
from dpone.ports.composition_snapshot import StepNote
from dpone.publication.store.connections import StoreConnection, StoreConnections
from dpone.publication.store.schema import decode_facts, now

# The store's identity: the first note of this key (created once, never changed).
STORE_IDENTITY_KEY = "store/identity"


class StepNotes:
    """Steps noted before any record exists, and read back by key."""

    def __init__(self, connections: StoreConnections) -> None:
        self.connections = connections

    def note_step(self, key: str, facts: Mapping[str, Any]) -> StepNote:
        """Durably note a step before any record exists (e.g. a first publication's CREATE).

        Not part of the port: the first publication writes it before dispatching.
        """
        facts_bytes = canonical_json.dumps(dict(facts))
        at = now()
        with self.connections.write("note_step", "store_commit_unknown") as conn:
            sequence = append_step(conn, key, facts_bytes, at)
        assert sequence is not None
        return StepNote(sequence, key, at, decode_facts(facts_bytes))

    def step_notes(self, key: str) -> list[StepNote]:
        """Every note of ``key``, oldest first."""
        with self.connections.reading("step_notes") as conn:
            rows = conn.execute(
                "SELECT id, key, at, facts FROM steps WHERE key = ? ORDER BY id", (key,)
            ).fetchall()
        return [StepNote(row[0], row[1], row[2], decode_facts(row[3])) for row in rows]

    def store_identity(self) -> str:
        """This store's identity: a UUID made once, when it is first asked for.

        What the server's ownership markers name (:mod:`dpone.publication.principals.ownership`):
        a store made again at the same path is another store. Made in the write
        transaction that checks none exists, so two processes agree on it.
        """
        found = self._first_identity("store_identity")
        if found is not None:
            return found
        with self.connections.write("store_identity", "store_commit_unknown") as conn:
            row = conn.execute(
                "SELECT facts FROM steps WHERE key = ? ORDER BY id LIMIT 1", (STORE_IDENTITY_KEY,)
            ).fetchone()
            if row is not None:
                return str(decode_facts(row[0])["store"])
            made = str(uuid.uuid4())
            append_step(conn, STORE_IDENTITY_KEY, canonical_json.dumps({"store": made}), now())
        return made

    def _first_identity(self, operation: str) -> str | None:
        with self.connections.reading(operation) as conn:
            row = conn.execute(
                "SELECT facts FROM steps WHERE key = ? ORDER BY id LIMIT 1", (STORE_IDENTITY_KEY,)
            ).fetchone()
        return None if row is None else str(decode_facts(row[0])["store"])


def append_step(conn: StoreConnection, key: str, facts: bytes, at: str) -> int | None:
    """Append one note in ``conn``'s transaction; returns its sequence number."""
    cursor = conn.execute("INSERT INTO steps (key, facts, at) VALUES (?, ?, ?)", (key, facts, at))
    return cursor.lastrowid
