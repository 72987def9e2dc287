"""What every path of the publisher holds: its four ports, its settings, its stored documents."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from dpone.contracts.composition_snapshot import (
    DEFAULT_LIMITS,
    SnapshotIntent,
    SnapshotLimits,
    SnapshotRecord,
)
from dpone.errors import DponeError
from dpone.ports.composition_snapshot import (
    ClickHouseSnapshotCatalog,
    ClickHouseSnapshotExecutor,
    ClosureProof,
    SnapshotPublicationAuthority,
    SnapshotPublicationStore,
)
from dpone.publication.publisher.receipts import SnapshotPublicationError, utc_now
from dpone.publication.publisher.records import principal_ref

# How long a caller that lost the claim waits for the winner's outcome, and how often
# it looks. The wait only delays the loser's answer; it never changes what happens.
CLAIM_WAIT_SECONDS = 30.0
CLAIM_POLL_SECONDS = 0.05


@dataclass(frozen=True)
class LoadedIntent:
    """A stored intent and its current record, checked to belong together."""

    intent: SnapshotIntent
    record: SnapshotRecord


class PublisherPorts:
    """The injected ports and settings, and the two steps every path shares."""

    def __init__(
        self,
        *,
        authority: SnapshotPublicationAuthority,
        store: SnapshotPublicationStore,
        catalog: ClickHouseSnapshotCatalog,
        executor: ClickHouseSnapshotExecutor,
        limits: SnapshotLimits = DEFAULT_LIMITS,
        clock: Callable[[], str] = utc_now,
        claim_wait_seconds: float = CLAIM_WAIT_SECONDS,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.authority = authority
        self.store = store
        self.catalog = catalog
        self.executor = executor
        self.limits = limits
        self.clock = clock
        self.claim_wait_seconds = claim_wait_seconds
        self.sleep = sleep

    def _load(self, intent_sha256: str) -> LoadedIntent:
        stored = self.store.load(intent_sha256)
        intent = SnapshotIntent.from_bytes(stored.intent_bytes)
        record = SnapshotRecord.from_bytes(stored.record_bytes)
        if intent.sha256 != intent_sha256 or record.intent_sha256 != intent_sha256:
            raise SnapshotPublicationError(
                f"the store returned documents of another intent for {intent_sha256}",
                code="store_unavailable",
                intent_sha256=intent_sha256,
            )
        if record.revision != stored.revision:
            raise SnapshotPublicationError(
                f"the stored revision {stored.revision} differs from its record's",
                code="store_unavailable",
                intent_sha256=intent_sha256,
            )
        return LoadedIntent(intent, record)

    def _close_publisher(self, intent: SnapshotIntent) -> ClosureProof | None:
        try:
            return self.authority.close_principal(principal_ref(intent.publisher))
        except DponeError:
            return None  # an unproven closure keeps the record unknown
