"""The publisher's publish path: one claim, at most one EXCHANGE, then reconcile.

Only this call's acknowledged 1 -> 2 compare-and-set on the exact PREPARED bytes, read
back independently, permits the one EXCHANGE; then ``reconcile``. A claimed record
found by any call is reconciled, never dispatched again.
"""

from __future__ import annotations

import contextlib
import time
import uuid

from dpone.contracts.composition_snapshot import (
    TERMINAL,
    RecordClaim,
    SnapshotIntent,
    SnapshotRecord,
    SnapshotState,
    exchange_query_id,
)
from dpone.errors import DponeError, stop_point
from dpone.ports.composition_snapshot import DispatchOutcome, DispatchResult, ParentAuthority
from dpone.publication.publisher.ports import CLAIM_POLL_SECONDS, PublisherPorts
from dpone.publication.publisher.receipts import (
    PublicationReceipt,
    SnapshotPublicationError,
    historical_receipt,
    receipt_from_record,
)
from dpone.publication.publisher.reconcile import Reconcile
from dpone.publication.publisher.records import DESIGN_CHANGE_STEP, intent_slot
from dpone.publication.publisher.rules import Refusal, exchange_refusal

P = SnapshotState


class Publish:
    """``publish``: claim PREPARED@1 once, dispatch at most once, reconcile what happened."""

    def __init__(self, ports: PublisherPorts, reconciler: Reconcile) -> None:
        """Over the publisher's ports; ``reconciler`` decides what a claim did."""
        self.ports = ports
        self.reconciler = reconciler

    def publish(self, intent_sha256: str) -> PublicationReceipt:
        """Claim once, recheck, dispatch at most one EXCHANGE, reconcile."""
        loaded = self.ports.load(intent_sha256)
        record = loaded.record
        if record.state in TERMINAL:
            return historical_receipt(record)  # replay: no authority, no observation
        if record.state is P.EXCHANGE_INTENT:
            # Another call holds the claim and may be dispatching right now: closing its
            # publisher here could cut its EXCHANGE, so wait for its outcome instead.
            return self._await_claim_holder(intent_sha256)
        if record.state is P.COMMIT_UNKNOWN:
            # An old claim never grants another EXCHANGE: resolve it instead.
            return self.reconciler.reconcile(intent_sha256)
        intent = loaded.intent
        self.ports.require_recorded_database(
            intent.database, intent.database_uuid, f"the intent {intent_sha256}"
        )
        parent = self.ports.authority.recheck(intent)
        now = self.ports.clock()
        claim_id = uuid.uuid4().hex
        claimed = record.successor(
            P.EXCHANGE_INTENT, at=now, claim=RecordClaim(claim_id=claim_id, claimed_at=now)
        )
        try:
            self.ports.store.compare_and_set(
                intent_sha256,
                expected=record.raw,
                replacement=claimed.raw,
                authority=parent,
                facts={"step": "claim", "claim_id": claim_id},
            )
        except DponeError as exc:
            if exc.code != "claim_lost":
                raise  # claim_uncertain and store failures: no dispatch, nothing asserted
            return self._after_lost_claim(intent_sha256, record, exc)
        self._verify_claim(intent_sha256, claimed)
        dispatch = self._dispatch_once(intent, parent)
        return self.reconciler.claimed(intent, claimed, dispatch)

    def _verify_claim(self, intent_sha256: str, claimed: SnapshotRecord) -> None:
        try:
            back = self.ports.store.read_back(intent_sha256)
        except DponeError as exc:
            raise SnapshotPublicationError(
                f"the claim on {intent_sha256} could not be read back; nothing was dispatched",
                code="claim_uncertain",
                intent_sha256=intent_sha256,
            ) from exc
        if back != claimed.raw:
            raise SnapshotPublicationError(
                f"the claim on {intent_sha256} reads back different bytes; nothing was dispatched",
                code="readback_mismatch",
                intent_sha256=intent_sha256,
            )

    def _dispatch_once(self, intent: SnapshotIntent, parent: ParentAuthority) -> DispatchResult:
        """Recheck authority and both names, then send the one EXCHANGE (or nothing)."""
        query_id = exchange_query_id(intent.sha256)
        try:
            # Observed first: the observation may wait seconds for another process's
            # closure proof, and the authority is rechecked after that wait, just before
            # the EXCHANGE, so a run that took the slot meanwhile is seen.
            observation = self.ports.observe_settled(intent_slot(intent), intent.generation_table)
            if self.ports.authority.recheck(intent) != parent:
                return _not_sent(query_id, "authority_changed")
            refusal = exchange_refusal(intent, observation, self._replaced_design(intent))
            if refusal is not None:
                return self._refused(intent, query_id, refusal)
            issued = self.ports.authority.publisher_credentials(intent)
        except DponeError as exc:
            return _not_sent(query_id, exc.code)
        try:
            return self.ports.executor.exchange(intent, issued)
        except DponeError as exc:
            # The executor's contract is to answer, not raise; an exception after the
            # call began may follow a sent request, so it proves nothing.
            return DispatchResult(DispatchOutcome.UNKNOWN, query_id, None, error_code=exc.code)

    def _replaced_design(self, intent: SnapshotIntent) -> str | None:
        """The target design a design change decided at prepare replaces, or None."""
        for entry in self.ports.store.history(intent.sha256):
            if entry.facts.get("step") == DESIGN_CHANGE_STEP:
                return str(entry.facts["replaced_design_sha256"])
        return None

    def _refused(self, intent: SnapshotIntent, query_id: str, refusal: Refusal) -> DispatchResult:
        """Nothing is sent; the facts behind the refusal go to the history first."""
        facts = refusal.noted_facts()
        if facts:
            # A failed note loses only the facts: the reason itself still reaches the
            # history with the reconcile.
            with contextlib.suppress(DponeError):
                self.ports.store.observe(
                    intent.sha256,
                    {"step": "dispatch_refused", "reason": refusal.code, **facts},
                )
        return _not_sent(query_id, refusal.code)

    def _after_lost_claim(
        self, intent_sha256: str, prepared: SnapshotRecord, exc: DponeError
    ) -> PublicationReceipt:
        """Another caller won (or the authority refused): close nothing, report its record."""
        if self.ports.load(intent_sha256).record.raw == prepared.raw:
            raise exc  # nobody claimed: the authority refused this caller
        return self._await_claim_holder(intent_sha256)

    def _await_claim_holder(self, intent_sha256: str) -> PublicationReceipt:
        """Wait (bounded) until the claim's holder records its outcome; report that record.

        Raises ``claim_exists`` if the record is still EXCHANGE_INTENT after the wait (its
        holder may have died): only ``reconcile`` may resolve it, never another dispatch.
        """
        deadline = time.monotonic() + self.ports.claim_wait_seconds
        while True:
            current = self.ports.load(intent_sha256).record
            if current.state is not P.EXCHANGE_INTENT:
                return receipt_from_record(current, historical=current.state in TERMINAL)
            if time.monotonic() >= deadline:
                raise SnapshotPublicationError(
                    f"{intent_sha256} is claimed (EXCHANGE_INTENT@2) and its holder has not"
                    " recorded an outcome; run reconcile",
                    code="claim_exists",
                    intent_sha256=intent_sha256,
                )
            stop_point()  # a table of --jobs waiting here stops when its run does
            self.ports.sleep(CLAIM_POLL_SECONDS)


def _not_sent(query_id: str, reason: str) -> DispatchResult:
    return DispatchResult(DispatchOutcome.NOT_SENT, query_id, None, error_code=reason)
