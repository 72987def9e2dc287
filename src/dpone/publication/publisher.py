"""ClickHouseAtomicSnapshotPublisher: one sealed generation replaces a target, once.

The policy of seed 000 over four injected ports (:mod:`dpone.ports.composition_snapshot`);
no I/O of its own. The decisions live in :mod:`dpone.contracts.composition_snapshot`
(edges, record shapes, :func:`decide_reconcile`); this module sequences the ports:

- ``prepare``: the authority reopens the evidence, the ingest principal is closed and
  proven quiescent, the catalog is observed (a first publication creates the empty
  target here, as its own noted step), design, content and limits are checked, a
  publisher is issued, and the intent is stored with its PREPARED record.
- ``publish``: only this call's acknowledged 1 -> 2 compare-and-set on the exact PREPARED
  bytes, read back independently, permits the one EXCHANGE; then ``reconcile``. A
  claimed record found by any call is reconciled, never dispatched again.
- ``reconcile``: closes the publisher, observes both names, the query log and B's
  content, and moves the record only along an allowed edge. It never issues
  credentials and never calls the executor.
- ``cancel``: PREPARED@1 -> NOT_PUBLISHED@2, then the unused publisher is closed.

The publisher retains A: it never drops a table, advances a checkpoint or releases a
fence.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dpone.contracts.composition_snapshot import (
    CANCELLED,
    DEFAULT_LIMITS,
    TERMINAL,
    IntentPrincipal,
    ReconcileFacts,
    RecordClaim,
    RecordClosure,
    RecordDispatch,
    SnapshotIntent,
    SnapshotLimits,
    SnapshotRecord,
    SnapshotState,
    create_target_query_id,
    decide_reconcile,
    exchange_query_id,
)
from dpone.errors import DponeError, StateError
from dpone.ports.composition_snapshot import (
    AttemptRef,
    CatalogObservation,
    ClickHouseSnapshotCatalog,
    ClickHouseSnapshotExecutor,
    ClosureProof,
    DispatchOutcome,
    DispatchResult,
    OwnershipState,
    ParentAuthority,
    PrincipalRef,
    PublicationEvidence,
    SnapshotPublicationAuthority,
    SnapshotPublicationStore,
    TableObservation,
    TargetSlot,
)

P = SnapshotState
# How long a caller that lost the claim waits for the winner's outcome, and how often
# it looks. The wait only delays the loser's answer; it never changes what happens.
CLAIM_WAIT_SECONDS = 30.0
CLAIM_POLL_SECONDS = 0.05
_RETAINED = frozenset({OwnershipState.ACTIVE, OwnershipState.RETIRING})


class SnapshotPublicationError(StateError):
    """A publication step was refused or its outcome is not known (see ``code``)."""

    code = "publication_error"


def utc_now() -> str:
    """The current UTC time as the documents write it."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class PublicationReceipt:
    """What one call established: the record it reached and what was observed.

    ``historical``: a replay of a terminal record's own observation, not a claim
    about the target today. Otherwise the UUIDs, rows and digest are this call's
    observation (None where it could not observe).
    """

    state: SnapshotState
    revision: int
    intent_sha256: str
    record_bytes: bytes
    record_sha256: str
    target_uuid: str | None
    generation_uuid: str | None
    target_rows: int | None
    target_content_digest: str | None
    historical: bool

    def to_document(self) -> dict[str, Any]:
        """A JSON-ready description (without the record bytes)."""
        return {
            "state": self.state.value,
            "revision": self.revision,
            "intent_sha256": self.intent_sha256,
            "record_sha256": self.record_sha256,
            "target_uuid": self.target_uuid,
            "generation_uuid": self.generation_uuid,
            "target_rows": self.target_rows,
            "target_content_digest": self.target_content_digest,
            "historical": self.historical,
        }


@dataclass(frozen=True)
class _Loaded:
    intent: SnapshotIntent
    record: SnapshotRecord


class ClickHouseAtomicSnapshotPublisher:
    """Publishes one complete, sealed generation with a single EXCHANGE (seed 000)."""

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

    # ------------------------------------------------------------------ prepare

    def prepare(self, attempt: AttemptRef, generation_ref: str) -> PublicationReceipt:
        """Reopen the evidence, prove ingest closed, check the catalog, store PREPARED@1."""
        evidence = self.authority.reopen(attempt, generation_ref)
        _check_evidence(evidence, generation_ref)
        closure = self.authority.close_principal(evidence.ingest)
        if not closure.proven:
            raise SnapshotPublicationError(
                f"the ingest principal {evidence.ingest.user} is not proven closed and quiescent",
                code="ingest_not_quiescent",
                user=evidence.ingest.user,
                strength=closure.strength.value,
            )
        observation = self._observe_checked(evidence)
        _generation_of(observation, evidence)  # B must be there before anything is created
        publisher: PrincipalRef | None = None
        created = observation.target is None
        try:
            if created:
                publisher = self.authority.issue_publisher(evidence)
                observation = self._create_target(evidence, generation_ref, publisher)
            target, generation = _both(observation, evidence)
            self._check_generation(evidence, observation, target, generation)
            if publisher is None:
                publisher = self.authority.issue_publisher(evidence)
            intent = _intent(evidence, target, generation, publisher, self.limits, self.clock())
            record = SnapshotRecord.prepared(intent.sha256, at=self.clock())
            self.store.create(intent.raw, record.raw, self.authority.recheck(intent))
        except DponeError as exc:
            # An uncertain create may have stored the intent: its publisher stays leased.
            if publisher is not None and exc.code != "prepare_uncertain":
                self._release_unused(publisher, exc)
            raise
        if created:  # link the pre-intent step note into the intent's own history
            self.store.observe(
                intent.sha256,
                {"step": "create_target", "query_id": create_target_query_id(generation_ref)},
            )
        return _receipt(
            record,
            target.uuid,
            generation.uuid,
            generation.rows,
            generation.content_digest,
            historical=False,
        )

    def _observe_checked(self, evidence: PublicationEvidence) -> CatalogObservation:
        observation = self.catalog.observe(evidence.slot, evidence.generation.table)
        for table in (observation.target, observation.generation):
            if table is not None and table.blockers:
                first = table.blockers[0]
                raise SnapshotPublicationError(
                    f"{table.database}.{table.name} has a side effect the publisher does not"
                    f" handle: {first.reason} ({first.detail})",
                    code="side_effect_present",
                    reason=first.reason,
                    table=table.name,
                    blockers=[b.reason for b in table.blockers],
                )
        return observation

    def _create_target(
        self, evidence: PublicationEvidence, generation_ref: str, publisher: PrincipalRef
    ) -> CatalogObservation:
        """First publication: note the step durably, CREATE the empty target, re-observe."""
        query_id = create_target_query_id(generation_ref)
        slot = evidence.slot
        self.store.note_step(
            query_id,
            {
                "step": "create_target",
                "query_id": query_id,
                "database": slot.database,
                "target_table": slot.table,
                "generation_table": evidence.generation.table,
                "generation_uuid": evidence.generation.table_uuid,
                "publisher": publisher.user,
            },
        )
        issued = self.authority.principal_credentials(publisher)
        result = self.executor.create_target(slot, evidence.generation.table, query_id, issued)
        self.store.note_step(query_id, {"step": "create_target_answer", **_dispatch_facts(result)})
        if result.outcome is not DispatchOutcome.ACKNOWLEDGED:
            raise SnapshotPublicationError(
                f"creating the empty target {slot.database}.{slot.table} was not acknowledged"
                f" ({result.outcome.value})",
                code="create_target_failed",
                query_id=query_id,
                outcome=result.outcome.value,
                clickhouse_code=result.clickhouse_code,
            )
        observation = self._observe_checked(evidence)
        if observation.target is None:
            raise SnapshotPublicationError(
                f"the created target {slot.database}.{slot.table} is not visible",
                code="catalog_unobservable",
                query_id=query_id,
            )
        return observation

    def _check_generation(
        self,
        evidence: PublicationEvidence,
        observation: CatalogObservation,
        target: TableObservation,
        generation: TableObservation,
    ) -> None:
        if target.design_sha256 != generation.design_sha256:
            raise SnapshotPublicationError(
                f"{target.name} and {generation.name} differ in physical design",
                code="design_mismatch",
                target_design=target.design_sha256,
                generation_design=generation.design_sha256,
            )
        staged = evidence.generation
        if not generation.rows == staged.rows == evidence.source.rows:
            raise SnapshotPublicationError(
                f"{generation.name} holds {generation.rows} rows; staging counted {staged.rows},"
                f" the receipt {evidence.source.rows}",
                code="content_mismatch",
                table=generation.name,
            )
        if generation.content_digest != staged.rows_digest:
            raise SnapshotPublicationError(
                f"{generation.name}'s content digest {generation.content_digest} differs from"
                f" the one computed at preparation {staged.rows_digest}",
                code="content_mismatch",
                table=generation.name,
            )
        _check_limits(self.limits, evidence, observation, generation)

    def _release_unused(self, publisher: PrincipalRef, exc: DponeError) -> None:
        # No intent names this publisher, so no other caller can be using it.
        try:
            self.authority.close_principal(publisher)
        except DponeError as close_exc:
            exc.add_details(publisher_release_failed=close_exc.code)

    # ------------------------------------------------------------------ publish

    def publish(self, intent_sha256: str) -> PublicationReceipt:
        """Claim once, recheck, dispatch at most one EXCHANGE, reconcile."""
        loaded = self._load(intent_sha256)
        record = loaded.record
        if record.state in TERMINAL:
            return _historical(record)  # replay: no authority, no observation
        if record.state is P.EXCHANGE_INTENT:
            # Another call holds the claim and may be dispatching right now: closing its
            # publisher here could cut its EXCHANGE, so wait for its outcome instead.
            return self._await_claim_holder(intent_sha256)
        if record.state is P.COMMIT_UNKNOWN:
            # An old claim never grants another EXCHANGE: resolve it instead.
            return self.reconcile(intent_sha256)
        intent = loaded.intent
        parent = self.authority.recheck(intent)
        now = self.clock()
        claim_id = uuid.uuid4().hex
        claimed = record.successor(
            P.EXCHANGE_INTENT, at=now, claim=RecordClaim(claim_id=claim_id, claimed_at=now)
        )
        try:
            self.store.compare_and_set(
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
        return self._reconcile_claimed(intent, claimed, dispatch)

    def _verify_claim(self, intent_sha256: str, claimed: SnapshotRecord) -> None:
        try:
            back = self.store.read_back(intent_sha256)
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
            if self.authority.recheck(intent) != parent:
                return _not_sent(query_id, "authority_changed")
            problem = _precheck(
                intent, self.catalog.observe(_slot(intent), intent.generation_table)
            )
            if problem is not None:
                return _not_sent(query_id, problem)
            issued = self.authority.publisher_credentials(intent)
        except DponeError as exc:
            return _not_sent(query_id, exc.code)
        try:
            return self.executor.exchange(intent, issued)
        except DponeError as exc:
            # The executor's contract is to answer, not raise; an exception after the
            # call began may follow a sent request, so it proves nothing.
            return DispatchResult(DispatchOutcome.UNKNOWN, query_id, None, error_code=exc.code)

    def _after_lost_claim(
        self, intent_sha256: str, prepared: SnapshotRecord, exc: DponeError
    ) -> PublicationReceipt:
        """Another caller won (or the authority refused): close nothing, report its record."""
        if self._load(intent_sha256).record.raw == prepared.raw:
            raise exc  # nobody claimed: the authority refused this caller
        return self._await_claim_holder(intent_sha256)

    def _await_claim_holder(self, intent_sha256: str) -> PublicationReceipt:
        """Wait (bounded) until the claim's holder records its outcome; report that record.

        Raises ``claim_exists`` if the record is still EXCHANGE_INTENT after the wait (its
        holder may have died): only ``reconcile`` may resolve it, never another dispatch.
        """
        deadline = time.monotonic() + self.claim_wait_seconds
        while True:
            current = self._load(intent_sha256).record
            if current.state is not P.EXCHANGE_INTENT:
                return _receipt_from_record(current, historical=current.state in TERMINAL)
            if time.monotonic() >= deadline:
                raise SnapshotPublicationError(
                    f"{intent_sha256} is claimed (EXCHANGE_INTENT@2) and its holder has not"
                    " recorded an outcome; run reconcile",
                    code="claim_exists",
                    intent_sha256=intent_sha256,
                )
            self.sleep(CLAIM_POLL_SECONDS)

    # ------------------------------------------------------------------ reconcile

    def reconcile(self, intent_sha256: str) -> PublicationReceipt:
        """Close the publisher, observe, and move a claimed record to what is proven.

        Needs retained ownership (ACTIVE or RETIRING). A terminal record is observed and
        reported but never rewritten; a PREPARED one has no publisher in use to close.
        """
        loaded = self._load(intent_sha256)
        intent, record = loaded.intent, loaded.record
        ownership = self.authority.ownership(intent)
        if ownership not in _RETAINED:
            raise SnapshotPublicationError(
                f"the run of {intent_sha256} no longer retains its slot ({ownership.value})",
                code="ownership_not_retained",
                intent_sha256=intent_sha256,
                ownership=ownership.value,
            )
        if record.state in TERMINAL or record.state is P.PREPARED:
            return self._report(intent, record)
        return self._reconcile_claimed(intent, record, None)

    def _report(self, intent: SnapshotIntent, record: SnapshotRecord) -> PublicationReceipt:
        facts = self._facts(intent, closure=None, dispatch=None)
        self.store.observe(intent.sha256, {"step": "observe", **_facts_document(facts)})
        return _receipt(
            record,
            facts.target_uuid,
            facts.generation_uuid,
            facts.target_rows,
            facts.target_content_digest,
            historical=False,
        )

    def _reconcile_claimed(
        self, intent: SnapshotIntent, record: SnapshotRecord, dispatch: DispatchResult | None
    ) -> PublicationReceipt:
        closure = self._close_publisher(intent)
        known = _record_dispatch(dispatch) if dispatch is not None else record.dispatch
        facts = self._facts(intent, closure=closure, dispatch=known)
        decided = decide_reconcile(intent, facts)
        history = {
            "step": "reconcile",
            "decided": decided.value,
            **_facts_document(facts),
            "closure": None if closure is None else _closure_document(closure),
        }
        if decided is P.COMMIT_UNKNOWN and record.state is P.COMMIT_UNKNOWN:
            # Staying unknown is not a transition: same revision, one more observation.
            self.store.observe(intent.sha256, history)
            return _receipt_observed(record, facts)
        successor = record.successor(
            decided,
            at=self.clock(),
            observation=facts.observation(),
            dispatch=known,
            closure=None if closure is None else _record_closure(closure),
            reason=_reason(intent, decided, facts),
        )
        try:
            self.store.compare_and_set(
                intent.sha256,
                expected=record.raw,
                replacement=successor.raw,
                authority=_cas_authority(intent),
                facts=history,
            )
        except DponeError as exc:
            if exc.code != "claim_lost":
                raise
            # A concurrent reconcile moved the record first: report what it wrote.
            return _receipt_from_record(self._load(intent.sha256).record, historical=False)
        return _receipt_observed(successor, facts)

    def _close_publisher(self, intent: SnapshotIntent) -> ClosureProof | None:
        try:
            return self.authority.close_principal(_principal_ref(intent.publisher))
        except DponeError:
            return None  # an unproven closure keeps the record unknown

    def _facts(
        self,
        intent: SnapshotIntent,
        *,
        closure: ClosureProof | None,
        dispatch: RecordDispatch | None,
    ) -> ReconcileFacts:
        try:
            observation: CatalogObservation | None = self.catalog.observe(
                _slot(intent), intent.generation_table
            )
        except DponeError:
            observation = None
        try:
            events = self.catalog.exchange_events(exchange_query_id(intent.sha256))
            finishes: int | None = sum(1 for e in events if e.type == "QueryFinish")
        except DponeError:
            finishes = None
        target = None if observation is None else observation.target
        generation = None if observation is None else observation.generation
        return ReconcileFacts(
            closure_proven=closure is not None and closure.proven,
            target_uuid=None if target is None else target.uuid,
            generation_uuid=None if generation is None else generation.uuid,
            target_rows=None if target is None else target.rows,
            target_content_digest=None if target is None else target.content_digest,
            exchange_finishes=finishes,
            dispatch_outcome=None if dispatch is None else dispatch.outcome,
        )

    # ------------------------------------------------------------------ cancel

    def cancel(self, intent_sha256: str) -> PublicationReceipt:
        """PREPARED@1 -> NOT_PUBLISHED@2 (no claim was ever made); then close the publisher."""
        loaded = self._load(intent_sha256)
        intent, record = loaded.intent, loaded.record
        if record.state is P.NOT_PUBLISHED and record.reason == CANCELLED:
            return _historical(record)
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
                "closure": None if closure is None else _closure_document(closure),
            },
        )
        return _receipt_from_record(cancelled, historical=False)

    # ------------------------------------------------------------------ loading

    def _load(self, intent_sha256: str) -> _Loaded:
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
        return _Loaded(intent, record)


# ---------------------------------------------------------------------- helpers


def _check_evidence(evidence: PublicationEvidence, generation_ref: str) -> None:
    problems = []
    if evidence.generation.staged_event_sha256 != generation_ref:
        problems.append("the reopened generation record is not the one named")
    if evidence.endpoint.get("database") != evidence.slot.database:
        problems.append("the staged endpoint is another database than the target slot's")
    if evidence.ingest.user == "" or evidence.ingest.user_uuid == "":
        problems.append("the staging journal names no ingest principal")
    if problems:
        raise SnapshotPublicationError(
            f"the evidence does not verify: {'; '.join(problems)}",
            code="evidence_unverified",
            generation_ref=generation_ref,
        )


def _generation_of(
    observation: CatalogObservation, evidence: PublicationEvidence
) -> TableObservation:
    generation = observation.generation
    if generation is None or generation.uuid != evidence.generation.table_uuid:
        raise SnapshotPublicationError(
            f"the generation {evidence.generation.table} is not the staged table"
            f" {evidence.generation.table_uuid}",
            code="evidence_unverified",
            table=evidence.generation.table,
            observed_uuid=None if generation is None else generation.uuid,
        )
    return generation


def _both(
    observation: CatalogObservation, evidence: PublicationEvidence
) -> tuple[TableObservation, TableObservation]:
    generation = _generation_of(observation, evidence)
    if observation.target is None:
        raise SnapshotPublicationError(
            f"the target {evidence.slot.table} is not visible",
            code="catalog_unobservable",
            table=evidence.slot.table,
        )
    return observation.target, generation


def _check_limits(
    limits: SnapshotLimits,
    evidence: PublicationEvidence,
    observation: CatalogObservation,
    generation: TableObservation,
) -> None:
    observed = {
        "source_rows": evidence.source.rows,
        "source_bytes": evidence.source.bytes,
        "wire_bytes": evidence.generation.rowbinary_bytes,
        "generation_storage_bytes": generation.total_bytes,
        # The catalog's retained bytes already hold A and every retained generation.
        "retained_storage_bytes": observation.retained_bytes,
        "total_transient_storage_bytes": observation.retained_bytes + generation.total_bytes,
    }
    ceilings = limits.to_document()
    for name, value in observed.items():
        if value > ceilings[name]:
            raise SnapshotPublicationError(
                f"{name} {value} exceeds its ceiling {ceilings[name]}",
                code="limit_exceeded",
                ceiling=name,
                observed=value,
                limit=ceilings[name],
            )


def _intent(
    evidence: PublicationEvidence,
    target: TableObservation,
    generation: TableObservation,
    publisher: PrincipalRef,
    limits: SnapshotLimits,
    prepared_at: str,
) -> SnapshotIntent:
    endpoint = evidence.endpoint
    return SnapshotIntent(
        request_id=evidence.parent_request,
        attempt_id=evidence.attempt_id,
        slot_epoch=evidence.epochs.slot_epoch,
        attempt_epoch=evidence.epochs.attempt_epoch,
        server_id=str(endpoint.get("server_id", "")),
        server_id_source=str(endpoint.get("server_id_source", "")),
        database=evidence.slot.database,
        database_uuid=str(endpoint.get("database_uuid", "")),
        target_table=evidence.slot.table,
        target_uuid=target.uuid,
        generation_table=generation.name,
        generation_uuid=generation.uuid,
        staged_event_sha256=evidence.generation.staged_event_sha256,
        semantic_id=evidence.generation.semantic_id,
        design_sha256=generation.design_sha256,
        receipt_sha256=evidence.source.receipt_sha256,
        source_rows=evidence.source.rows,
        source_bytes=evidence.source.bytes,
        wire_bytes=evidence.generation.rowbinary_bytes,
        content_digest=evidence.generation.rows_digest,
        ingest=_intent_principal(evidence.ingest),
        publisher=_intent_principal(publisher),
        limits=limits,
        prepared_at=prepared_at,
    ).seal()


def _precheck(intent: SnapshotIntent, observation: CatalogObservation) -> str | None:
    """Why the EXCHANGE must not be sent now (a stable reason), or None."""
    target, generation = observation.target, observation.generation
    if target is None or generation is None:
        return "table_missing"
    if (target.uuid, generation.uuid) != (intent.target_uuid, intent.generation_uuid):
        return "uuid_pair_changed"
    if target.blockers or generation.blockers:
        return "side_effect_present"
    if target.design_sha256 != generation.design_sha256:
        return "design_mismatch"
    if (generation.rows, generation.content_digest) != (intent.source_rows, intent.content_digest):
        return "content_mismatch"
    return None


def _not_sent(query_id: str, reason: str) -> DispatchResult:
    return DispatchResult(DispatchOutcome.NOT_SENT, query_id, None, error_code=reason)


def _dispatch_facts(result: DispatchResult) -> dict[str, Any]:
    return {
        "query_id": result.query_id,
        "session_id": result.session_id,
        "outcome": result.outcome.value,
        "clickhouse_code": result.clickhouse_code,
        "error_code": result.error_code,
    }


def _record_dispatch(result: DispatchResult) -> RecordDispatch:
    return RecordDispatch(
        query_id=result.query_id,
        session_id=result.session_id,
        outcome=result.outcome.value,
        clickhouse_code=result.clickhouse_code,
    )


def _record_closure(proof: ClosureProof) -> RecordClosure:
    return RecordClosure(
        strength=proof.strength.value, proven=proof.proven, lease_id=proof.principal.lease_id
    )


def _closure_document(proof: ClosureProof) -> dict[str, Any]:
    return {
        "user": proof.principal.user,
        "lease_id": proof.principal.lease_id,
        "proven": proof.proven,
        "strength": proof.strength.value,
        "facts": dict(proof.facts),
    }


def _facts_document(facts: ReconcileFacts) -> dict[str, Any]:
    return {
        "closure_proven": facts.closure_proven,
        "target_uuid": facts.target_uuid,
        "generation_uuid": facts.generation_uuid,
        "target_rows": facts.target_rows,
        "target_content_digest": facts.target_content_digest,
        "exchange_finishes": facts.exchange_finishes,
        "dispatch_outcome": facts.dispatch_outcome,
    }


def _reason(intent: SnapshotIntent, decided: SnapshotState, facts: ReconcileFacts) -> str | None:
    """Why the record is where it is, for the operator (a stable short code)."""
    if decided is P.PUBLISHED:
        return None
    if decided is P.NOT_PUBLISHED:
        return "exchange_not_run"
    if not facts.closure_proven:
        return "closure_unproven"
    if facts.target_uuid is None or facts.generation_uuid is None:
        return "tables_unobserved"
    pair = (facts.target_uuid, facts.generation_uuid)
    if pair == (intent.generation_uuid, intent.target_uuid):
        return "content_mismatch"
    if pair == (intent.target_uuid, intent.generation_uuid):
        return "exchange_logged" if facts.exchange_finishes else "query_log_unobservable"
    return "uuid_pair_unexpected"


def _slot(intent: SnapshotIntent) -> TargetSlot:
    return TargetSlot(intent.database, intent.target_table)


def _cas_authority(intent: SnapshotIntent) -> ParentAuthority:
    # Resolving a claim needs no fresh admission: the store rechecks that this run
    # still holds the slot at the intent's epoch, ACTIVE or RETIRING.
    return ParentAuthority(intent.request_id, _slot(intent), intent.slot_epoch)


def _principal_ref(principal: IntentPrincipal) -> PrincipalRef:
    return PrincipalRef(principal.user, principal.user_uuid, principal.lease_id)


def _intent_principal(principal: PrincipalRef) -> IntentPrincipal:
    return IntentPrincipal(principal.user, principal.user_uuid, principal.lease_id)


def _receipt(
    record: SnapshotRecord,
    target_uuid: str | None,
    generation_uuid: str | None,
    rows: int | None,
    digest: str | None,
    *,
    historical: bool,
) -> PublicationReceipt:
    return PublicationReceipt(
        state=record.state,
        revision=record.revision,
        intent_sha256=record.intent_sha256,
        record_bytes=record.raw,
        record_sha256=record.sha256,
        target_uuid=target_uuid,
        generation_uuid=generation_uuid,
        target_rows=rows,
        target_content_digest=digest,
        historical=historical,
    )


def _receipt_observed(record: SnapshotRecord, facts: ReconcileFacts) -> PublicationReceipt:
    return _receipt(
        record,
        facts.target_uuid,
        facts.generation_uuid,
        facts.target_rows,
        facts.target_content_digest,
        historical=False,
    )


def _receipt_from_record(record: SnapshotRecord, *, historical: bool) -> PublicationReceipt:
    seen = record.observation
    if seen is None:
        return _receipt(record, None, None, None, None, historical=historical)
    return _receipt(
        record,
        seen.target_uuid,
        seen.generation_uuid,
        seen.target_rows,
        seen.target_content_digest,
        historical=historical,
    )


def _historical(record: SnapshotRecord) -> PublicationReceipt:
    return _receipt_from_record(record, historical=True)
