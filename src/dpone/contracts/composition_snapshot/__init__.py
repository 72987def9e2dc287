"""Documents of atomic snapshot publication: the intent, the record, the limits.

Pure: no I/O. The intent is immutable and binds everything a publication depends on;
the record says where the publication is (state and revision) and what was observed.
Both are canonical JSON (:mod:`dpone.contracts.canonical_json`), and their digests are
SHA-256 of the exact stored bytes, never of a re-serialisation. The parts:
:mod:`.states` (the states, revisions, edges and the members each state needs),
:mod:`.intent`, :mod:`.limits`, :mod:`.record`, :mod:`.reconcile` (which state observed
facts prove), :mod:`.query_ids` and :mod:`.checks`. The states, their revisions and the
allowed moves are in docs/publication.md ("The model").
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
