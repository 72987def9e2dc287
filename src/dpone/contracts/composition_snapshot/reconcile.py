"""What one reconcile established, and the state those facts prove."""

from __future__ import annotations

from dataclasses import dataclass

from dpone.contracts.composition_snapshot.intent import SnapshotIntent
from dpone.contracts.composition_snapshot.record import DispatchOutcome, RecordObservation
from dpone.contracts.composition_snapshot.states import P, SnapshotState

# This process's own answer that says the EXCHANGE never ran.
_NEVER_RAN = (DispatchOutcome.REFUSED.value, DispatchOutcome.NOT_SENT.value)


@dataclass(frozen=True)
class ReconcileFacts:
    """What one reconcile established; None means "not observed" (absent or unobservable).

    ``dispatch_outcome`` is the DispatchOutcome value this process got from its own
    EXCHANGE, if it sent one in this call (a crash leaves none).
    ``target_design_sha256`` is the design digest of the table the target name holds,
    computed as the one the intent bound at prepare.
    """

    closure_proven: bool
    target_uuid: str | None
    generation_uuid: str | None
    target_rows: int | None
    target_content_digest: str | None
    exchange_finishes: int | None
    dispatch_outcome: str | None = None
    target_design_sha256: str | None = None

    def observation(self) -> RecordObservation:
        """The facts as a record's ``observation`` member."""
        return RecordObservation(
            target_uuid=self.target_uuid,
            generation_uuid=self.generation_uuid,
            target_rows=self.target_rows,
            target_content_digest=self.target_content_digest,
            exchange_finishes=self.exchange_finishes,
        )


def decide_reconcile(intent: SnapshotIntent, facts: ReconcileFacts) -> SnapshotState:
    """The state the facts prove: PUBLISHED, NOT_PUBLISHED, or else COMMIT_UNKNOWN.

    PUBLISHED: closure proven, the target name holds B, the generation name holds A, and
    the target's rows, content digest and design digest equal the bound ones (an index,
    codec, setting or TTL added after the EXCHANGE is not the published design). NOT_PUBLISHED: closure
    proven, the names still hold A and B, and the EXCHANGE provably never ran (the query
    log, observable, has no QueryFinish for its id; or this process's own dispatch was
    refused or never sent, and the log shows no finish). An A/B pair with a logged finish
    may be a double exchange (a reused query id runs again): unknown.
    """
    if not facts.closure_proven:
        return P.COMMIT_UNKNOWN
    a, b = intent.target_uuid, intent.generation_uuid
    if (facts.target_uuid, facts.generation_uuid) == (b, a):
        parity = (
            facts.target_rows == intent.source_rows
            and facts.target_content_digest == intent.content_digest
            and facts.target_design_sha256 == intent.design_sha256
        )
        return P.PUBLISHED if parity else P.COMMIT_UNKNOWN
    if (facts.target_uuid, facts.generation_uuid) == (a, b):
        log_says_never = facts.exchange_finishes == 0
        answer_says_never = facts.dispatch_outcome in _NEVER_RAN and (
            facts.exchange_finishes in (None, 0)
        )
        if log_says_never or answer_says_never:
            return P.NOT_PUBLISHED
    return P.COMMIT_UNKNOWN
