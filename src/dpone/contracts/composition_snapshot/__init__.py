"""Documents of atomic snapshot publication: the intent, the record, the limits.

Pure: no I/O. The intent is immutable and binds everything a publication depends on;
the record says where the publication is (state and revision) and what was observed.
Both are canonical JSON (:mod:`dpone.contracts.canonical_json`); their digests are
SHA-256 of the exact canonical bytes that were stored, never of a re-serialisation.

States and revisions (the seed's table)::

    PREPARED        exactly 1   no dispatch claim yet
    EXCHANGE_INTENT exactly 2   the single claim is durable, the SQL outcome unknown
    PUBLISHED       3 or 4      closed publisher, observed B/A UUID pair, full B parity
    NOT_PUBLISHED   2 to 4      closed publisher and A/B observed; 2 only by cancellation
    COMMIT_UNKNOWN  exactly 3   something uncertain; ownership retained (it keeps its
                                revision while it stays unknown, so 4 and later are refused)

Edges: none -> PREPARED(1); PREPARED(1) -> EXCHANGE_INTENT(2) | NOT_PUBLISHED(2);
EXCHANGE_INTENT(2) -> PUBLISHED(3) | NOT_PUBLISHED(3) | COMMIT_UNKNOWN(3);
COMMIT_UNKNOWN(n) -> PUBLISHED(n+1) | NOT_PUBLISHED(n+1). Never PREPARED -> COMMIT_UNKNOWN.

The parts: :mod:`.states` (the states, revisions, edges and the members each state
needs), :mod:`.intent` (the intent and its principals), :mod:`.limits` (its ceilings),
:mod:`.record` (the record, its members and their vocabulary), :mod:`.reconcile`
(which state observed facts prove), :mod:`.query_ids` (the statements' ids) and
:mod:`.checks` (the value checks the documents share).
"""

from dpone.contracts.composition_snapshot.intent import (
    INTENT_KIND,
    INTENT_VERSION,
    IntentPrincipal,
    PrincipalIdentity,
    SnapshotIntent,
)
from dpone.contracts.composition_snapshot.limits import DEFAULT_LIMITS, SnapshotLimits
from dpone.contracts.composition_snapshot.query_ids import (
    QUERY_ID_PREFIX,
    create_target_query_id,
    drop_created_target_query_id,
    exchange_query_id,
    exchange_session_id,
)
from dpone.contracts.composition_snapshot.reconcile import ReconcileFacts, decide_reconcile
from dpone.contracts.composition_snapshot.record import (
    CLOSURE_STRENGTHS,
    DISPATCH_OUTCOMES,
    RECORD_KIND,
    RECORD_VERSION,
    ClosureStrength,
    DispatchOutcome,
    RecordClaim,
    RecordClosure,
    RecordDispatch,
    RecordObservation,
    SnapshotRecord,
)
from dpone.contracts.composition_snapshot.states import (
    CANCELLED,
    TERMINAL,
    P,
    SnapshotState,
    check_record_shape,
    check_transition,
    revision_ok,
    transition_ok,
)

__all__ = [
    "CANCELLED",
    "CLOSURE_STRENGTHS",
    "DEFAULT_LIMITS",
    "DISPATCH_OUTCOMES",
    "INTENT_KIND",
    "INTENT_VERSION",
    "QUERY_ID_PREFIX",
    "RECORD_KIND",
    "RECORD_VERSION",
    "TERMINAL",
    "ClosureStrength",
    "DispatchOutcome",
    "IntentPrincipal",
    "P",
    "PrincipalIdentity",
    "ReconcileFacts",
    "RecordClaim",
    "RecordClosure",
    "RecordDispatch",
    "RecordObservation",
    "SnapshotIntent",
    "SnapshotLimits",
    "SnapshotRecord",
    "SnapshotState",
    "check_record_shape",
    "check_transition",
    "create_target_query_id",
    "decide_reconcile",
    "drop_created_target_query_id",
    "exchange_query_id",
    "exchange_session_id",
    "revision_ok",
    "transition_ok",
]
