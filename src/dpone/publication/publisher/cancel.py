"""``cancel``: PREPARED@1 -> NOT_PUBLISHED@2 (no claim was ever made); then close the publisher."""

from __future__ import annotations

from dpone.contracts.composition_snapshot import CANCELLED, SnapshotState
from dpone.publication.publisher.ports import PublisherPorts
from dpone.publication.publisher.receipts import (
    PublicationReceipt,
    SnapshotPublicationError,
    historical_receipt,
    receipt_from_record,
)
from dpone.publication.publisher.records import closure_document

P = SnapshotState


class Cancel:
    """``cancel``: end a PREPARED intent unpublished, then close its unused publisher."""

    def __init__(self, ports: PublisherPorts) -> None:
        """Over the publisher's ports."""
        self.ports = ports

    def cancel(self, intent_sha256: str) -> PublicationReceipt:
        """PREPARED@1 -> NOT_PUBLISHED@2 (no claim was ever made); then close the publisher."""
        ports = self.ports
        loaded = ports.load(intent_sha256)
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
        cancelled = record.successor(P.NOT_PUBLISHED, at=ports.clock(), reason=CANCELLED)
        ports.store.compare_and_set(
            intent_sha256,
            expected=record.raw,
            replacement=cancelled.raw,
            authority=ports.authority.recheck(intent),
            facts={"step": "cancel"},
        )
        # Only now, with no claim possible any more, is closing the publisher safe.
        closure = ports.close_publisher(intent)
        ports.store.observe(
            intent_sha256,
            {
                "step": "cancel_closure",
                "closure": None if closure is None else closure_document(closure),
            },
        )
        return receipt_from_record(cancelled, historical=False)
