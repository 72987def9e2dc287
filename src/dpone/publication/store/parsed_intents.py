"""Stored intents read by digest, each parsed once a process; see docs/publication.md.

The history these reads walk grows by every table of every run (a year of a nightly
run of 20 tables is 7,300 intents). An intent's bytes never change under their digest
(the store's triggers refuse an update or a delete), so what was read from one is kept
by its digest: a read lists the digests it needs (:meth:`SnapshotRecords.intent_keys`,
no bytes) and fetches only the intents not read before in this process.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol, TypeVar

from dpone.contracts import canonical_json
from dpone.contracts.composition_snapshot import SnapshotIntent
from dpone.publication.store.errors import SnapshotStoreError

# Kept per kind of read; past this many, a memo starts again (a read is never wrong,
# only slower).
_AT_MOST = 50_000
T = TypeVar("T")


class IntentSource(Protocol):
    """The part of a snapshot store that lists intents by digest and gives their bytes."""

    def intent_keys(
        self, database: str | None = None, *, attempt_id: str | None = None
    ) -> Sequence[str]:
        """The digest of every intent (of ``database``; of ``attempt_id``'s run)."""
        ...

    def intent_bytes(self, keys: Sequence[str]) -> dict[str, bytes]:
        """The stored bytes of the intents of these digests."""
        ...


class RecordedTables(NamedTuple):
    """What an intent recorded of its slot: the target's name, A's and B's UUIDs."""

    target_table: str
    target_uuid: str
    generation_uuid: str


_LOCK = threading.Lock()
_PARSED: dict[str, SnapshotIntent] = {}
_RECORDED: dict[str, RecordedTables] = {}


def parsed_intents(
    store: IntentSource, database: str | None = None, *, attempt_id: str | None = None
) -> list[SnapshotIntent]:
    """Every intent of ``store`` (of ``database``; of ``attempt_id``'s run), oldest
    first, parsed as a document (:meth:`SnapshotIntent.from_bytes`)."""
    keys = list(store.intent_keys(database, attempt_id=attempt_id))
    return _read(store, keys, _PARSED, SnapshotIntent.from_bytes)


def recorded_tables(store: IntentSource, database: str) -> list[RecordedTables]:
    """What each intent of ``database`` recorded of its slot, oldest first.

    Read from the canonical document (``canonical_json.loads``: the bytes are exactly
    canonical) without the intent's other rules, which the publisher's prepare checked
    when it sealed the intent (the store itself checks only that it is canonical JSON):
    the catalog asks this at every look, for the whole database's history. A document
    without these members, or with other values than strings, is read in full, and its
    own coded error raised.
    """
    return _read(store, list(store.intent_keys(database)), _RECORDED, _recorded)


def _recorded(data: bytes) -> RecordedTables:
    document = canonical_json.loads(data, what="snapshot intent")
    try:
        protected, generation = document["protected"], document["generation"]
        found = (protected["target_table"], protected["target_uuid"], generation["table_uuid"])
    except (KeyError, TypeError):
        found = None
    if found is None or not all(isinstance(value, str) for value in found):
        intent = SnapshotIntent.from_bytes(data)  # not an intent: its own coded error
        return RecordedTables(intent.target_table, intent.target_uuid, intent.generation_uuid)
    return RecordedTables(*found)


def _read(
    store: IntentSource, keys: list[str], kept: dict[str, T], parse: Callable[[bytes], T]
) -> list[T]:
    """What ``parse`` reads from each intent of ``keys``, kept by digest in ``kept``.

    A listed digest whose bytes the store does not give back is ``store_unavailable``
    (the store was not read consistently), never a shorter answer.
    """
    with _LOCK:  # a process's threads share the memo
        return _read_locked(store, keys, kept, parse)


def _read_locked(
    store: IntentSource, keys: list[str], kept: dict[str, T], parse: Callable[[bytes], T]
) -> list[T]:
    missing = [key for key in keys if key not in kept]
    if missing:
        if len(kept) + len(missing) > _AT_MOST:
            kept.clear()
            missing = keys
        found = store.intent_bytes(missing)
        for key in missing:
            if key not in found:
                raise SnapshotStoreError(
                    f"the store lists the intent {key} but does not give back its bytes",
                    code="store_unavailable",
                    intent_sha256=key,
                )
            kept[key] = parse(found[key])
    return [kept[key] for key in keys]
