"""ClickHouseAtomicSnapshotPublisher: one sealed generation replaces a target, once.

The policy of seed 000 over four injected ports (:mod:`dpone.ports.composition_snapshot`);
no I/O of its own. The decisions live in :mod:`dpone.contracts.composition_snapshot`
(edges, record shapes, :func:`decide_reconcile`); the publisher sequences the ports,
one module a path:

- ``prepare`` (:mod:`.prepare`): the authority reopens the evidence, the
  ingest principal is closed and proven quiescent, the catalog is observed (a first
  publication creates the empty target here, as its own noted step), design, content
  and limits are checked (:mod:`.checks`), a publisher is issued, and the
  intent is stored with its PREPARED record.
- ``publish`` (:mod:`.publish`): only this call's acknowledged 1 -> 2
  compare-and-set on the exact PREPARED bytes, read back independently, permits the one
  EXCHANGE; then ``reconcile``. A claimed record found by any call is reconciled, never
  dispatched again.
- ``reconcile`` (:mod:`.reconcile`): closes the publisher, observes both
  names, the query log and B's content, and moves the record only along an allowed
  edge. It never issues credentials and never calls the executor.
- ``cancel`` (here): PREPARED@1 -> NOT_PUBLISHED@2, then the unused publisher is closed.
- ``abandon`` (:mod:`.abandon`): a claim whose database was dropped on this server
  ends COMMIT_UNKNOWN with its publisher closed, and an operator's note frees its slot.

The publisher retains A: it never drops a table, advances a checkpoint or releases a
fence.
"""

from __future__ import annotations

from dpone.contracts.composition_snapshot import CANCELLED, SnapshotState
from dpone.publication.publisher.abandon import AbandonPath
from dpone.publication.publisher.ports import CLAIM_POLL_SECONDS, CLAIM_WAIT_SECONDS
from dpone.publication.publisher.prepare import PreparePath
from dpone.publication.publisher.publish import PublishPath
from dpone.publication.publisher.receipts import (
    PublicationReceipt,
    SnapshotPublicationError,
    historical_receipt,
    receipt_from_record,
    utc_now,
)
from dpone.publication.publisher.records import closure_document

__all__ = [
    "CLAIM_POLL_SECONDS",
    "CLAIM_WAIT_SECONDS",
    "ClickHouseAtomicSnapshotPublisher",
    "PublicationReceipt",
    "SnapshotPublicationError",
    "utc_now",
]

P = SnapshotState


class ClickHouseAtomicSnapshotPublisher(PreparePath, PublishPath, AbandonPath):
    """Publishes one complete, sealed generation with a single EXCHANGE (seed 000).

    Constructed with keyword arguments ``authority``, ``store``, ``catalog``,
    ``executor`` and optionally ``limits``, ``clock``, ``claim_wait_seconds`` and
    ``sleep`` (see :class:`~dpone.publication.publisher.ports.PublisherPorts`).
    """

    def cancel(self, intent_sha256: str) -> PublicationReceipt:
        """PREPARED@1 -> NOT_PUBLISHED@2 (no claim was ever made); then close the publisher."""
        loaded = self._load(intent_sha256)
        intent, record = loaded.intent, loaded.record
        if record.state is P.NOT_PUBLISHED and record.reason == CANCELLED:
            return historical_receipt(record)
        if record.state is not P.PREPARED:
            raise SnapshotPublicationError(
                f"{intent_sha256} is {record.state.value}@{record.revision}: only a PREPARED"
                " record can be cancelled",
                code="claim_exists",
                intent_sha256=intent_sha256,
                state=record.state.value,
            )
        cancelled = record.successor(P.NOT_PUBLISHED, at=self.clock(), reason=CANCELLED)
        self.store.compare_and_set(
            intent_sha256,
            expected=record.raw,
            replacement=cancelled.raw,
            authority=self.authority.recheck(intent),
            facts={"step": "cancel"},
        )
        # Only now, with no claim possible any more, is closing the publisher safe.
        closure = self._close_publisher(intent)
        self.store.observe(
            intent_sha256,
            {
                "step": "cancel_closure",
                "closure": None if closure is None else closure_document(closure),
            },
        )
        return receipt_from_record(cancelled, historical=False)
