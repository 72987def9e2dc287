"""What the publisher writes down: record parts, history documents and the names it converts.

The ports speak in dispatch results, closure proofs and principal references; the
record and the store's history speak in their own shapes. These are the one-to-one
conversions between the two.
"""

from __future__ import annotations

from typing import Any

from dpone.contracts.composition_snapshot import (
    IntentPrincipal,
    ReconcileFacts,
    RecordClosure,
    RecordDispatch,
    SnapshotIntent,
)
from dpone.ports.composition_snapshot import (
    ClosureProof,
    DispatchResult,
    ParentAuthority,
    PrincipalRef,
    TargetSlot,
)

# The history step that binds a decided design change to its intent: written by
# prepare, read by publish before it sends the EXCHANGE.
DESIGN_CHANGE_STEP = "design_change"


def dispatch_facts(result: DispatchResult) -> dict[str, Any]:
    """A dispatch answer as a history note."""
    return {
        "query_id": result.query_id,
        "session_id": result.session_id,
        "outcome": result.outcome.value,
        "clickhouse_code": result.clickhouse_code,
        "error_code": result.error_code,
    }


def record_dispatch(result: DispatchResult) -> RecordDispatch:
    """A dispatch answer as the record holds it."""
    return RecordDispatch(
        query_id=result.query_id,
        session_id=result.session_id,
        outcome=result.outcome.value,
        clickhouse_code=result.clickhouse_code,
    )


def record_closure(proof: ClosureProof) -> RecordClosure:
    """A closure proof as the record holds it."""
    return RecordClosure(
        strength=proof.strength.value, proven=proof.proven, lease_id=proof.principal.lease_id
    )


def closure_document(proof: ClosureProof) -> dict[str, Any]:
    """A closure proof as a history note."""
    return {
        "user": proof.principal.user,
        "lease_id": proof.principal.lease_id,
        "proven": proof.proven,
        "strength": proof.strength.value,
        "facts": dict(proof.facts),
    }


def facts_document(facts: ReconcileFacts) -> dict[str, Any]:
    """A reconcile's observation as a history note."""
    return {
        "closure_proven": facts.closure_proven,
        "target_uuid": facts.target_uuid,
        "generation_uuid": facts.generation_uuid,
        "target_rows": facts.target_rows,
        "target_content_digest": facts.target_content_digest,
        "exchange_finishes": facts.exchange_finishes,
        "dispatch_outcome": facts.dispatch_outcome,
        "target_design_sha256": facts.target_design_sha256,
    }


def intent_slot(intent: SnapshotIntent) -> TargetSlot:
    """The target slot an intent publishes into."""
    return TargetSlot(intent.database, intent.target_table)


def cas_authority(intent: SnapshotIntent) -> ParentAuthority:
    """The authority a compare-and-set that resolves a claim presents."""
    # Resolving a claim needs no fresh admission: the store rechecks that this run
    # still holds the slot at the intent's epoch, ACTIVE or RETIRING.
    return ParentAuthority(intent.request_id, intent_slot(intent), intent.slot_epoch)


def principal_ref(principal: IntentPrincipal) -> PrincipalRef:
    """An intent's principal as the authority names it."""
    return PrincipalRef(principal.user, principal.user_uuid, principal.lease_id)


def intent_principal(principal: PrincipalRef) -> IntentPrincipal:
    """An authority's principal as the intent records it."""
    return IntentPrincipal(principal.user, principal.user_uuid, principal.lease_id)
