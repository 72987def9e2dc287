"""Stored intents, parsed once a process: the store's history is read by digest.

The catalog asks at every look which UUIDs the database's intents recorded, and a
publisher's closure which intents its lease dispatched; the history they read grows by
every table of every run (a year of a nightly run of 20 tables is 7,300 intents, each
about 220 us to parse). An intent's bytes never change under their digest (the store
never rewrites or removes one), so each is parsed once in a process and kept by its
digest: a read lists the digests (:meth:`SnapshotRecords.intent_keys`, no bytes) and
fetches and parses only the intents stored since.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from dpone.contracts.composition_snapshot import SnapshotIntent
from dpone.publication.store.errors import SnapshotStoreError

# Kept intents; past this many, the memo starts again (a parse is never wrong, only slow).
_AT_MOST = 50_000
_PARSED: dict[str, SnapshotIntent] = {}


class IntentSource(Protocol):
    """The part of a snapshot store that lists intents by digest and gives their bytes."""

    def intent_keys(self, database: str | None = None) -> Sequence[str]:
        """The digest of every intent (of ``database``), oldest first."""
        ...

    def intent_bytes(self, keys: Sequence[str]) -> dict[str, bytes]:
        """The stored bytes of the intents of these digests."""
        ...


def parsed_intents(store: IntentSource, database: str | None = None) -> list[SnapshotIntent]:
    """Every intent of ``store`` (of ``database``), oldest first, parsed.

    Only intents not parsed before in this process are read in full. A listed digest
    whose bytes the store does not give back, or give back under another digest, is
    ``store_unavailable`` (the store was not read consistently), never a shorter answer.
    """
    keys = list(store.intent_keys(database))
    missing = [key for key in keys if key not in _PARSED]
    if missing:
        if len(_PARSED) + len(missing) > _AT_MOST:
            _PARSED.clear()
            missing = keys
        found = store.intent_bytes(missing)
        for key in missing:
            intent = SnapshotIntent.from_bytes(found[key]) if key in found else None
            if intent is None or intent.sha256 != key:
                raise SnapshotStoreError(
                    f"the store lists the intent {key} but does not give back its bytes",
                    code="store_unavailable",
                    intent_sha256=key,
                )
            _PARSED[key] = intent
    return [_PARSED[key] for key in keys]
