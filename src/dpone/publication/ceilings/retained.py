"""Retained storage: the tables dpone retained or created, and the headroom they leave.

:func:`recorded_table_uuids` answers, per database and fresh at each call, the UUIDs of
the targets (A) and generations (B) every stored intent recorded at ``prepare``: an
EXCHANGE or a RENAME keeps a table's UUID, so wherever those tables sit now, their UUIDs
say they are dpone's, and the catalog counts them (with the staged generations that have
no intent yet) as retained. :func:`headroom_policy` narrows staging's streaming byte
bound to what the total transient ceiling leaves once that is counted. See
docs/publication-storage.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

from dpone.contracts.composition_snapshot import SnapshotIntent, SnapshotLimits
from dpone.errors import DponeError
from dpone.ports.composition_snapshot import TargetSlot
from dpone.publication.ceilings.stream_ceilings import STORED_CODE
from dpone.publication.publisher.receipts import SnapshotPublicationError
from dpone.publication.publisher.rules import ceiling_exceeded
from dpone.publication.store import SnapshotSummary
from dpone.publication.store.parsed_intents import IntentSource, recorded_tables
from dpone.staging.contract import StagingPolicy

RETAINED_CEILING = "retained_storage_bytes"
TRANSIENT_CEILING = "total_transient_storage_bytes"
# The codes staging raises when its streaming byte bound stops the spool or the body.
STREAM_BOUND_CODES = frozenset({"spool_budget_exceeded", "body_limit_exceeded"})


class SnapshotListing(IntentSource, Protocol):
    """The part of a snapshot store that lists every stored intent (and reads them by
    digest, :class:`~dpone.publication.store.parsed_intents.IntentSource`)."""

    def list_snapshots(self, slot: TargetSlot | None = None) -> Sequence[SnapshotSummary]:
        """Every intent (of ``slot``) with its current state, oldest first."""
        ...


class StoredIntent(NamedTuple):
    """One stored intent, parsed, beside its listing (state, creation time)."""

    summary: SnapshotSummary
    intent: SnapshotIntent


def stored_intents(
    store: SnapshotListing, database: str, target: str | None = None
) -> list[StoredIntent]:
    """Every intent the store holds for ``database`` (or its slot ``target``), oldest first.

    Only the listed intents are parsed: another database's or slot's documents are
    not read.
    """
    listed = store.list_snapshots(None if target is None else TargetSlot(database, target))
    return [
        StoredIntent(summary, SnapshotIntent.from_bytes(summary.intent_bytes))
        for summary in listed
        if summary.database == database and target in (None, summary.target_table)
    ]


def recorded_table_uuids(store: SnapshotListing) -> Callable[[str], frozenset[str]]:
    """database -> the UUIDs of every target and generation an intent of it recorded.

    The callable reads the store again at each call (the catalog asks once per
    observation), so an intent stored a moment ago is counted. Store and document
    failures are raised as they are; the catalog turns them into
    ``catalog_unobservable``.
    """

    def uuids(database: str) -> frozenset[str]:
        recorded = recorded_tables(store, database)
        return frozenset(u for r in recorded for u in (r.target_uuid, r.generation_uuid))

    return uuids


def headroom_policy(
    limits: SnapshotLimits, retained_now: int, base: StagingPolicy
) -> StagingPolicy:
    """``base`` with its byte bounds narrowed to the storage headroom left now.

    ``retained_now`` is what the slot's database retains now (the catalog's count). The
    headroom is the total transient ceiling less that; ``max_spool_bytes`` (normally the
    wire-bytes ceiling already) and ``max_stored_bytes`` each become the smaller of
    themselves and the headroom: an early stop, not a proof, since what the server stores
    exists only once the rows are in. Refuses (``limit_exceeded``, naming the ceiling, the
    observed value and the limit) when what is retained is already over its own ceiling or
    leaves no headroom. See docs/publication-storage.md ("When the storage ceilings are
    checked").
    """
    if retained_now > limits.retained_storage_bytes:
        raise ceiling_exceeded(RETAINED_CEILING, retained_now, limits.retained_storage_bytes)
    headroom = limits.total_transient_storage_bytes - retained_now
    if headroom <= 0:
        raise ceiling_exceeded(
            TRANSIENT_CEILING, retained_now, limits.total_transient_storage_bytes
        )
    return dataclasses.replace(
        base,
        max_spool_bytes=min(base.max_spool_bytes, headroom),
        # What the staged table stores, once its rows are in, is held to it too.
        max_stored_bytes=min(base.max_stored_bytes, headroom),
    )


def headroom_refusal(
    limits: SnapshotLimits,
    retained_now: int,
    policy: StagingPolicy,
    exc: DponeError,
    key: Callable[[str], str] = lambda ceiling: ceiling,
) -> SnapshotPublicationError | None:
    """The ceiling a stream stopped by ``policy``'s byte bound ran into, or None.

    ``policy`` is what :func:`headroom_policy` answered for ``retained_now``. None
    unless ``exc`` is staging's streaming byte bound and that bound was the headroom:
    a stop at the wire-bytes ceiling stays staging's own error. ``key(ceiling)``: where
    the ceiling is set, named in the message and the details.
    """
    headroom = limits.total_transient_storage_bytes - retained_now
    bound = policy.max_stored_bytes if exc.code == STORED_CODE else policy.max_spool_bytes
    if exc.code not in (*STREAM_BOUND_CODES, STORED_CODE) or bound != headroom:
        return None
    limit = limits.total_transient_storage_bytes
    return SnapshotPublicationError(
        f"{TRANSIENT_CEILING}: {retained_now} bytes are retained now, so the generation may"
        f" add at most {headroom} under the ceiling {limit}; its stream went over"
        f" ({exc.code}), nothing was published. Raise {key(TRANSIENT_CEILING)}, or drop"
        " rollback copies the database retains, if the table is meant to be this large",
        code="limit_exceeded",
        ceiling=TRANSIENT_CEILING,
        limit=limit,
        key=key(TRANSIENT_CEILING),
        retained_bytes=retained_now,
        headroom_bytes=headroom,
        cause=exc.code,
    )


def recorded_target_names(store: SnapshotListing) -> Callable[[str], frozenset[str]]:
    """database -> the names of the targets its intents publish into.

    A table under one of those names is that slot's live target: counted as A when its
    own slot is observed, never as another slot's retained storage (a generation UUID
    recorded by one intent is, after its EXCHANGE, that slot's live target).
    """

    def names(database: str) -> frozenset[str]:
        return frozenset(r.target_table for r in recorded_tables(store, database))

    return names
