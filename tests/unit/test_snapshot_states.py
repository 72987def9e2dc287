"""The publication state machine against the seed's edge list, and the reconcile decision."""

from __future__ import annotations

import hashlib
import itertools

import pytest

from dpone.contracts.composition_snapshot import (
    IntentPrincipal,
    ReconcileFacts,
    RecordClaim,
    RecordClosure,
    SnapshotIntent,
    SnapshotLimits,
    SnapshotRecord,
    SnapshotState,
    check_transition,
    create_target_query_id,
    decide_reconcile,
    exchange_query_id,
    exchange_session_id,
    revision_ok,
    transition_ok,
)
from dpone.errors import StateError

P = SnapshotState
STATES: list[SnapshotState | None] = [None, *SnapshotState]
REVISIONS: list[int | None] = [None, 0, 1, 2, 3, 4, 5, 6]
AT = "2024-05-01T12:00:00Z"

# The seed's edges, written out: none -> P1, P1 -> EI2 | NP2, EI2 -> PUB3 | NP3 | CU3,
# CUn -> PUBn+1 | NPn+1. Nothing leaves PUBLISHED or NOT_PUBLISHED. A COMMIT_UNKNOWN that
# stays unknown keeps its revision (PUBLICATION.md, "Decided"), so n is 3 alone.
EDGES = {
    (None, None, P.PREPARED, 1),
    (P.PREPARED, 1, P.EXCHANGE_INTENT, 2),
    (P.PREPARED, 1, P.NOT_PUBLISHED, 2),
    (P.EXCHANGE_INTENT, 2, P.PUBLISHED, 3),
    (P.EXCHANGE_INTENT, 2, P.NOT_PUBLISHED, 3),
    (P.EXCHANGE_INTENT, 2, P.COMMIT_UNKNOWN, 3),
} | {(P.COMMIT_UNKNOWN, 3, target, 4) for target in (P.PUBLISHED, P.NOT_PUBLISHED)}

REACHABLE = {
    (P.PREPARED, 1),
    (P.EXCHANGE_INTENT, 2),
    *((P.NOT_PUBLISHED, n) for n in range(2, 5)),
    *((P.PUBLISHED, n) for n in range(3, 5)),
    (P.COMMIT_UNKNOWN, 3),
}


@pytest.mark.parametrize(("state", "revision"), list(itertools.product(SnapshotState, range(0, 7))))
def test_revision_ok_is_the_seed_table(state: SnapshotState, revision: int) -> None:
    assert revision_ok(state, revision) is ((state, revision) in REACHABLE)


@pytest.mark.parametrize(
    ("current", "revision", "target"), list(itertools.product(STATES, REVISIONS, SnapshotState))
)
def test_every_transition_against_the_edge_list(
    current: SnapshotState | None, revision: int | None, target: SnapshotState
) -> None:
    for new_revision in range(0, 8):
        allowed = (current, revision, target, new_revision) in EDGES
        assert transition_ok(current, revision, target, new_revision) is allowed
        if allowed:
            check_transition(current, revision, target, new_revision)
        else:
            with pytest.raises(StateError) as exc:
                check_transition(current, revision, target, new_revision)
            assert exc.value.code == "invalid_transition"


def test_prepared_never_becomes_commit_unknown() -> None:
    assert not any(transition_ok(P.PREPARED, 1, P.COMMIT_UNKNOWN, n) for n in range(0, 8))


def test_commit_unknown_to_itself_is_not_an_edge() -> None:
    # Staying unknown is recorded as an observation, never as a new revision.
    assert not any(transition_ok(P.COMMIT_UNKNOWN, n, P.COMMIT_UNKNOWN, n + 1) for n in range(8))


def test_query_and_session_ids() -> None:
    sha = hashlib.sha256(b"x").hexdigest()
    assert exchange_query_id(sha) == f"dpone-s00-{sha[:32]}-exchange"
    assert exchange_session_id(sha) == f"dpone-s00-{sha[:32]}-session"
    assert create_target_query_id(sha) == f"dpone-s00-{sha[:32]}-create-target"


def test_successor_follows_edges_and_chains_digests() -> None:
    sha = hashlib.sha256(b"intent").hexdigest()
    first = SnapshotRecord.prepared(sha, at=AT)
    claimed = first.successor(P.EXCHANGE_INTENT, at=AT, claim=RecordClaim("c", AT))
    assert claimed.previous_record_sha256 == first.sha256 == hashlib.sha256(first.raw).hexdigest()
    assert (claimed.state, claimed.revision) == (P.EXCHANGE_INTENT, 2)
    with pytest.raises(StateError) as exc:
        first.successor(P.COMMIT_UNKNOWN, at=AT, claim=RecordClaim("c", AT))
    assert exc.value.code == "invalid_transition"
    unknown = claimed.successor(P.COMMIT_UNKNOWN, at=AT, reason="closure_unproven")
    done = unknown.successor(
        P.NOT_PUBLISHED,
        at=AT,
        closure=RecordClosure("custodial", True, "lease"),
        observation=_facts(A, B, None, None, 0).observation(),
        reason=None,
    )
    assert (done.revision, done.previous_record_sha256) == (4, unknown.sha256)


# ---------------------------------------------------------------------- decide_reconcile

A = "aaaaaaaa-0000-4000-8000-00000000000a"
B = "bbbbbbbb-0000-4000-8000-00000000000b"
OTHER = "cccccccc-0000-4000-8000-00000000000c"
ROWS = 5
DIGEST = "1" * 32
DESIGN = "3" * 64


def _intent() -> SnapshotIntent:
    return SnapshotIntent(
        request_id="req",
        attempt_id="att",
        slot_epoch=1,
        attempt_epoch=1,
        server_id="s",
        server_id_source="dpone_identity",
        database="db",
        database_uuid="dddddddd-0000-4000-8000-00000000000d",
        target_table="t",
        target_uuid=A,
        generation_table="g",
        generation_uuid=B,
        staged_event_sha256="2" * 64,
        semantic_id="sem",
        design_sha256=DESIGN,
        receipt_sha256="4" * 64,
        source_rows=ROWS,
        source_bytes=10,
        wire_bytes=10,
        content_digest=DIGEST,
        ingest=IntentPrincipal("in", "eeeeeeee-0000-4000-8000-00000000000e", "l1"),
        publisher=IntentPrincipal("pub", "ffffffff-0000-4000-8000-00000000000f", "l2"),
        limits=SnapshotLimits(10, 10, 10, 10, 10, 10),
        prepared_at=AT,
    ).seal()


def _facts(
    target: str | None,
    generation: str | None,
    rows: int | None,
    digest: str | None,
    finishes: int | None,
    closure: bool = True,
    dispatch: str | None = None,
    design: str | None = DESIGN,
) -> ReconcileFacts:
    return ReconcileFacts(closure, target, generation, rows, digest, finishes, dispatch, design)


UUIDS = [A, B, OTHER, None]
FINISHES = [None, 0, 1, 2, 3]
DISPATCH = [None, "acknowledged", "refused", "unknown", "not_sent"]


def _oracle(
    closure: bool,
    target: str | None,
    generation: str | None,
    rows: int | None,
    digest: str | None,
    finishes: int | None,
    dispatch: str | None,
) -> SnapshotState:
    """The issue's rule, stated once more as a list of the only two ways out of unknown."""
    published = closure and target == B and generation == A and rows == ROWS and digest == DIGEST
    if published:
        return P.PUBLISHED
    never_ran = finishes == 0 or (dispatch in {"refused", "not_sent"} and not finishes)
    not_published = closure and target == A and generation == B and never_ran
    return P.NOT_PUBLISHED if not_published else P.COMMIT_UNKNOWN


def test_decide_reconcile_over_every_combination() -> None:
    intent = _intent()
    seen = set()
    for closure, target, generation, rows, digest, finishes, dispatch, design in itertools.product(
        [True, False],
        UUIDS,
        UUIDS,
        [ROWS, ROWS + 1, None],
        [DIGEST, "9" * 32, None],
        FINISHES,
        DISPATCH,
        [DESIGN, "8" * 64, None],
    ):
        facts = _facts(target, generation, rows, digest, finishes, closure, dispatch, design)
        decided = decide_reconcile(intent, facts)
        expected = _oracle(closure, target, generation, rows, digest, finishes, dispatch)
        if expected is P.PUBLISHED and design != DESIGN:
            expected = P.COMMIT_UNKNOWN  # an altered (or unobserved) design is not published
        assert decided is expected
        seen.add(decided)
    assert seen == {P.PUBLISHED, P.NOT_PUBLISHED, P.COMMIT_UNKNOWN}


@pytest.mark.parametrize(
    ("facts", "expected"),
    [
        (_facts(B, A, ROWS, DIGEST, 1), P.PUBLISHED),
        (_facts(B, A, ROWS, DIGEST, None), P.PUBLISHED),
        (_facts(B, A, ROWS, DIGEST, 1, closure=False), P.COMMIT_UNKNOWN),
        (_facts(B, A, ROWS - 1, DIGEST, 1), P.COMMIT_UNKNOWN),
        (_facts(B, A, ROWS, DIGEST, 1, design="8" * 64), P.COMMIT_UNKNOWN),  # altered design
        (_facts(B, A, ROWS, DIGEST, 1, design=None), P.COMMIT_UNKNOWN),  # design unobserved
        (_facts(A, B, None, None, 0), P.NOT_PUBLISHED),
        (_facts(A, B, None, None, None, dispatch="refused"), P.NOT_PUBLISHED),
        (_facts(A, B, None, None, None, dispatch="not_sent"), P.NOT_PUBLISHED),
        (_facts(A, B, None, None, None, dispatch="unknown"), P.COMMIT_UNKNOWN),
        (_facts(A, B, None, None, 2), P.COMMIT_UNKNOWN),  # exchanged twice: swapped back
        (_facts(A, B, None, None, 1, dispatch="refused"), P.COMMIT_UNKNOWN),  # contradiction
        (_facts(OTHER, B, None, None, 0), P.COMMIT_UNKNOWN),  # replaced target
        (_facts(None, None, None, None, 0), P.COMMIT_UNKNOWN),  # unobservable catalog
    ],
)
def test_decide_reconcile_named_cases(facts: ReconcileFacts, expected: SnapshotState) -> None:
    assert decide_reconcile(_intent(), facts) is expected
