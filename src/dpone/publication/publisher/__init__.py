"""ClickHouseAtomicSnapshotPublisher: one sealed generation replaces a target, once.

The policy of seed 000 over four injected ports (:mod:`dpone.ports.composition_snapshot`),
with no I/O of its own; the decisions live in :mod:`dpone.contracts.composition_snapshot`.
The publisher is composed, never inherited: :class:`~.ports.PublisherPorts` holds the
ports, the settings and the steps every path shares, and each path is one class given
it (:class:`~.prepare.Prepare`, :class:`~.publish.Publish`,
:class:`~.reconcile.Reconcile`, :class:`~.cancel.Cancel`, :class:`~.abandon.Abandon`,
with :class:`~.created_target.CreatedTarget` for a first publication's empty target).
Only a call's own acknowledged, read-back claim permits the one EXCHANGE; the catalog
observes and :mod:`.rules` judges; the publisher never drops a table. See
docs/publication.md and docs/architecture.md ("publisher/").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from dpone.contracts.composition_snapshot import DEFAULT_LIMITS, SnapshotIntent, SnapshotLimits
from dpone.ports.composition_snapshot import (
    AttemptRef,
    CatalogObservation,
    ClickHouseSnapshotCatalog,
    ClickHouseSnapshotExecutor,
    SnapshotPublicationAuthority,
    SnapshotPublicationStore,
    TargetSlot,
)
from dpone.publication.publisher.abandon import Abandon, Abandonment
from dpone.publication.publisher.cancel import Cancel
from dpone.publication.publisher.created_target import CreatedTarget
from dpone.publication.publisher.ports import (
    CLAIM_POLL_SECONDS,
    CLAIM_WAIT_SECONDS,
    PublisherPorts,
)
from dpone.publication.publisher.prepare import Prepare
from dpone.publication.publisher.publish import Publish
from dpone.publication.publisher.receipts import (
    PublicationReceipt,
    SnapshotPublicationError,
    utc_now,
)
from dpone.publication.publisher.reconcile import Reconcile

__all__ = [
    "CLAIM_POLL_SECONDS",
    "CLAIM_WAIT_SECONDS",
    "ClickHouseAtomicSnapshotPublisher",
    "PublicationReceipt",
    "SnapshotPublicationError",
    "utc_now",
]


class ClickHouseAtomicSnapshotPublisher:
    """Publishes one complete, sealed generation with a single EXCHANGE (seed 000).

    Holds the ports (:class:`~dpone.publication.publisher.ports.PublisherPorts`) and
    one object per path, each given the ports and the paths it calls; every method
    here delegates to one of them.
    """

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
        accept_ungated_ingest: bool = False,
    ) -> None:
        """The four ports and the settings of :class:`PublisherPorts` (which see)."""
        self.ports = PublisherPorts(
            authority=authority,
            store=store,
            catalog=catalog,
            executor=executor,
            limits=limits,
            clock=clock,
            claim_wait_seconds=claim_wait_seconds,
            sleep=sleep,
            accept_ungated_ingest=accept_ungated_ingest,
        )
        self.reconcile_path = Reconcile(self.ports)
        self.prepare_path = Prepare(self.ports, CreatedTarget(self.ports))
        self.publish_path = Publish(self.ports, self.reconcile_path)
        self.cancel_path = Cancel(self.ports)
        self.abandon_path = Abandon(self.ports, self.reconcile_path)

    @property
    def authority(self) -> SnapshotPublicationAuthority:
        """The authority port: evidence, fences, principals and their credentials."""
        return self.ports.authority

    @property
    def store(self) -> SnapshotPublicationStore:
        """The store port: intents, records and their history."""
        return self.ports.store

    @property
    def catalog(self) -> ClickHouseSnapshotCatalog:
        """The catalog port: what the server shows."""
        return self.ports.catalog

    @property
    def executor(self) -> ClickHouseSnapshotExecutor:
        """The executor port: the CREATE, DROP and EXCHANGE it sends."""
        return self.ports.executor

    @property
    def limits(self) -> SnapshotLimits:
        """The ceilings prepare binds into each intent."""
        return self.ports.limits

    @property
    def clock(self) -> Callable[[], str]:
        """What records are stamped with (UTC, microseconds)."""
        return self.ports.clock

    @property
    def claim_wait_seconds(self) -> float:
        """How long a caller that lost the claim waits for the winner's outcome."""
        return self.ports.claim_wait_seconds

    @property
    def sleep(self) -> Callable[[float], None]:
        """How the bounded waits pause."""
        return self.ports.sleep

    @property
    def accept_ungated_ingest(self) -> bool:
        """Whether prepare accepts a generation staged without a drain gate."""
        return self.ports.accept_ungated_ingest

    def prepare(
        self, attempt: AttemptRef, generation_ref: str, *, design_change: bool = False
    ) -> PublicationReceipt:
        """See :meth:`.prepare.Prepare.prepare`."""
        return self.prepare_path.prepare(attempt, generation_ref, design_change=design_change)

    def publish(self, intent_sha256: str) -> PublicationReceipt:
        """See :meth:`.publish.Publish.publish`."""
        return self.publish_path.publish(intent_sha256)

    def reconcile(self, intent_sha256: str) -> PublicationReceipt:
        """See :meth:`.reconcile.Reconcile.reconcile`."""
        return self.reconcile_path.reconcile(intent_sha256)

    def cancel(self, intent_sha256: str) -> PublicationReceipt:
        """See :meth:`.cancel.Cancel.cancel`."""
        return self.cancel_path.cancel(intent_sha256)

    def abandon(self, intent_sha256: str) -> Abandonment:
        """See :meth:`.abandon.Abandon.abandon`."""
        return self.abandon_path.abandon(intent_sha256)

    def observe_settled(self, slot: TargetSlot, generation_table: str) -> CatalogObservation:
        """See :meth:`.ports.PublisherPorts.observe_settled`."""
        return self.ports.observe_settled(slot, generation_table)

    def require_recorded_database(self, database: str, recorded_uuid: str, what: str) -> None:
        """See :meth:`.ports.PublisherPorts.require_recorded_database`."""
        self.ports.require_recorded_database(database, recorded_uuid, what)

    def replaced_database(self, intent: SnapshotIntent) -> dict[str, Any] | None:
        """See :meth:`.ports.PublisherPorts.replaced_database`."""
        return self.ports.replaced_database(intent)
