"""The publication authority: reopens a staging attempt's evidence, issues and closes principals.

:class:`SnapshotAuthority` implements the authority port. ``reopen`` never trusts a
caller's object: it reads the staging journal, the receipt, the ingest principal and its
lease and the admission from disk and store, and any inconsistency is
``evidence_unverified`` naming what was wrong. ``close_principal`` acts on one lease,
``close_principals`` on several at once (one a user), both through
:mod:`~dpone.publication.authority.closure`: under the dispatch gates it ends each
lease, kills and samples its queries, drains its HTTP sessions, accounts for its query
log and its open sign-ins, and appends each proof to the store under its lease's step
key, proven or not. The steps and what each proves are in
docs/publication-principals.md ("The authority").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.contracts import canonical_json
from dpone.contracts.composition_snapshot import QUERY_ID_PREFIX, SnapshotIntent
from dpone.errors import DponeError
from dpone.localserver.principal_pool import ROLE_INGEST, ROLE_PUBLISHER
from dpone.ports.clickhouse import QueryPort
from dpone.ports.clickhouse_request import Credentials, Endpoint
from dpone.ports.composition_snapshot import (
    Admission,
    AttemptEpochs,
    AttemptRef,
    ClosureProof,
    IssuedPrincipal,
    OwnershipState,
    ParentAuthority,
    PrincipalRef,
    PublicationEvidence,
    SnapshotRunRegistry,
    SourceEvidence,
)

# ClosurePolicy is imported from here too, as before the closure had its own module.
from dpone.publication.authority.closure import ClosurePolicy as ClosurePolicy
from dpone.publication.authority.closure import LeaseCloser
from dpone.publication.authority.journal_evidence import (
    AuthorityError,
    generation_evidence,
    journal_member,
    journal_receipt,
    unverified,
)
from dpone.publication.authority.lease_scope import LeaseScope
from dpone.publication.authority.session_drain import SessionDrain
from dpone.publication.dispatch.dispatch_gate import Gate
from dpone.publication.dispatch.executor import TransportFactory
from dpone.publication.principals.principal_issuers import PrincipalIssuer
from dpone.staging.journal import JournalEvent, read_events


class SnapshotAuthority:
    """Implements ``SnapshotPublicationAuthority`` over a run registry and an issuer."""

    def __init__(
        self,
        *,
        registry: SnapshotRunRegistry,
        issuer: PrincipalIssuer,
        closer: QueryPort,
        endpoint: Endpoint,
        probe_credentials: Callable[[str], Credentials],
        scope_of: Callable[[PrincipalRef], LeaseScope],
        dispatch_gate: Gate,
        policy: ClosurePolicy | None = None,
        transport_factory: TransportFactory = HttpTransport,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        wall_clock: Callable[[], float] = time.time,
        note_step: Callable[[str, Mapping[str, Any]], object] | None = None,
    ) -> None:
        """``closer`` runs as the closer principal; ``scope_of`` reads what belongs to a
        lease (:func:`dpone.publication.authority.lease_scope.lease_scope`): its window, marks and
        sessions with their dispatch notes. ``wall_clock`` is the clock the executor
        notes its answers in (Unix seconds); ``note_step`` (the store's) keeps a probe
        that found a session open, so that the next closure waits the full T again."""
        self.registry = registry
        self.issuer = issuer
        self.closer = closer
        self.endpoint = endpoint
        self.probe_credentials = probe_credentials
        self.scope_of = scope_of
        self.dispatch_gate = dispatch_gate
        self.policy = policy or ClosurePolicy()
        self._factory = transport_factory
        self._clock = clock
        self._sleep = sleep
        self._wall_clock = wall_clock
        self._note_step = note_step
        self._reads = 0
        # Set by a run whose tables go in threads (publication/sharing/): a closure is
        # then proven with the other leases asked at once, each with its own proof.
        self.shared_close: Callable[[PrincipalRef], ClosureProof] | None = None
        self._drain = SessionDrain(
            endpoint,
            probe_credentials,
            transport_factory,
            self._next_id,
            self._deadline,
            wall_clock,
            self.policy.session_timeout,
            self.policy.session_margin_seconds,
            note_step,
        )

    # ------------------------------------------------------------------ reopen

    def reopen(self, attempt: AttemptRef, generation_ref: str) -> PublicationEvidence:
        """Reopen the journal's evidence and admit (or find) the attempt; see the module doc."""
        try:
            events = read_events(attempt.journal_dir)
        except DponeError as exc:
            raise unverified(
                f"journal {attempt.journal_dir} does not verify: {exc.message}",
                "journal_invalid",
                journal=str(attempt.journal_dir),
                cause=exc.code,
            ) from exc
        if not events:
            raise unverified(f"journal {attempt.journal_dir} has no events", "journal_empty")
        final = events[-1]
        doc = final.document
        where = {"journal": str(attempt.journal_dir), "event": final.sequence}
        if doc.get("state") != "staged" or doc.get("outcome") != "staged":
            raise unverified(
                f"the final event is {doc.get('state')}/{doc.get('outcome')}, not staged",
                "final_not_staged",
                **where,
            )
        if generation_ref != final.sha256:
            raise unverified(
                f"generation_ref {generation_ref[:16]}... is not the final event's digest",
                "generation_ref_mismatch",
                expected=final.sha256,
                **where,
            )
        attempt_id = str(doc["attempt_id"])
        receipt, receipt_sha = journal_receipt(events, where)
        generation = generation_evidence(events, final, receipt_sha, where)
        planned = journal_member(doc, "planned_ownership", dict, where)
        if planned.get("database") != attempt.slot.database:
            raise unverified(
                f"the generation is in database {planned.get('database')!r}, the target slot in "
                f"{attempt.slot.database!r}",
                "database_mismatch",
                **where,
            )
        if not receipt.rows_validated == generation.rows:
            raise unverified(
                f"the receipt validated {receipt.rows_validated} rows, staging counted "
                f"{generation.rows}",
                "row_count_mismatch",
                **where,
            )
        endpoint = journal_member(doc, "endpoint_identity", dict, where)
        ingest = self._ingest(events, attempt_id, where)
        admission = self._admit(attempt, attempt_id)
        return PublicationEvidence(
            parent_request=admission.parent_request,
            attempt_id=attempt_id,
            epochs=admission.epochs,
            slot=attempt.slot,
            endpoint=endpoint,
            generation=generation,
            source=SourceEvidence(receipt_sha, receipt.rows_validated, receipt.artifact_size),
            ingest=ingest,
            ingest_transport=doc["transport"] if isinstance(doc.get("transport"), str) else None,
            ingest_gated=doc["drain_gate"] if isinstance(doc.get("drain_gate"), bool) else None,
        )

    def _ingest(
        self, events: list[JournalEvent], attempt_id: str, where: Mapping[str, Any]
    ) -> PrincipalRef:
        named = {
            canonical_json.dumps(journal_member(e.document, "principal", dict, where))
            for e in events
        }
        if len(named) != 1:
            raise unverified(
                "the journal's events name different principals", "principal_inconsistent", **where
            )
        principal = journal_member(events[-1].document, "principal", dict, where)
        user = principal.get("user")
        if not isinstance(user, str) or not user:
            raise unverified("the journal names no ingest user", "principal_missing", **where)
        try:
            known = self.issuer.user_uuid(user)
        except DponeError as exc:
            raise unverified(
                f"ingest user {user} is not an issued principal",
                "principal_unknown",
                user=user,
                **where,
            ) from exc
        recorded = principal.get("user_uuid")
        if recorded is not None and recorded != known:
            raise unverified(
                f"the journal says {user} has id {recorded}, the server {known}",
                "principal_uuid_mismatch",
                user=user,
                **where,
            )
        leases = [
            lease
            for lease in self.registry.leases_of(attempt_id)
            if lease.role == ROLE_INGEST and lease.user == user
        ]
        if len(leases) != 1:
            raise unverified(
                f"attempt {attempt_id} has {len(leases)} ingest leases of {user}, not one",
                "ingest_lease_missing",
                user=user,
                **where,
            )
        return PrincipalRef(user, known, leases[0].lease_id)

    def _admit(self, attempt: AttemptRef, attempt_id: str) -> Admission:
        admission = self.registry.admit(attempt.slot, attempt_id)
        if admission.slot != attempt.slot or admission.attempt_id != attempt_id:
            raise unverified(
                f"attempt {attempt_id} is admitted for {admission.slot}, not {attempt.slot}",
                "slot_mismatch",
                attempt_id=attempt_id,
            )
        self._current(admission, admission.epochs)
        return admission

    def _current(self, admission: Admission, epochs: AttemptEpochs) -> None:
        current = self.registry.current_epoch(admission.slot)
        # A run takes its reserved epoch only when its intent is stored: until then the
        # slot must still be at the epoch before it (no newer attempt has prepared).
        expected = epochs.slot_epoch - (0 if admission.activated else 1)
        if admission.epochs != epochs or current != expected:
            raise AuthorityError(
                f"attempt {admission.attempt_id} was admitted for slot epoch "
                f"{admission.epochs.slot_epoch}; the slot is at {current}",
                code="attempt_fenced",
                attempt_id=admission.attempt_id,
                slot_epoch=epochs.slot_epoch,
                current_epoch=current,
            )
        if admission.ownership is not OwnershipState.ACTIVE:
            raise AuthorityError(
                f"run {admission.parent_request} is {admission.ownership.value}, not active",
                code="ownership_not_active",
                ownership=admission.ownership.value,
            )

    # ------------------------------------------------------------------ principals

    def issue_publisher(self, evidence: PublicationEvidence) -> PrincipalRef:
        """Lease a publisher for the attempt (still admitted, current and ACTIVE)."""
        admission = self._admission(evidence.attempt_id)
        self._current(admission, evidence.epochs)
        issued = self.issuer.issue(ROLE_PUBLISHER, evidence.attempt_id)
        ref = issued.ref
        if ref.user == evidence.ingest.user or ref.user_uuid == evidence.ingest.user_uuid:
            self.issuer.revoke(ref)
            raise AuthorityError(
                f"publisher {ref.user} is the ingest principal", code="principals_not_distinct"
            )
        return ref

    def publisher_credentials(self, intent: SnapshotIntent) -> IssuedPrincipal:
        """The intent's exact publisher while its lease (for this attempt) is active."""
        bound = intent.publisher
        ref = PrincipalRef(bound.user, bound.user_uuid, bound.lease_id)
        lease = self.registry.get_lease(ref.lease_id)
        if lease.role != ROLE_PUBLISHER or lease.attempt_id != intent.attempt_id:
            raise AuthorityError(
                f"lease {ref.lease_id} is a {lease.role} lease of {lease.attempt_id}, not the "
                f"publisher of {intent.attempt_id}",
                code="principal_mismatch",
            )
        return self.issuer.credentials(ref)

    def principal_credentials(self, principal: PrincipalRef) -> IssuedPrincipal:
        """Credentials of an issued principal while its exact lease is active."""
        return self.issuer.credentials(principal)

    def recheck(self, intent: SnapshotIntent) -> ParentAuthority:
        """The run is admitted as the intent says, not fenced and ACTIVE."""
        admission = self._admission(intent.attempt_id)
        if admission.parent_request != intent.request_id or (
            admission.slot.database,
            admission.slot.table,
        ) != (intent.database, intent.target_table):
            raise AuthorityError(
                f"attempt {intent.attempt_id} is admitted under {admission.parent_request} for "
                f"{admission.slot}, not as the intent says",
                code="attempt_fenced",
            )
        self._current(admission, AttemptEpochs(intent.slot_epoch, intent.attempt_epoch))
        return ParentAuthority(admission.parent_request, admission.slot, intent.slot_epoch)

    def ownership(self, intent: SnapshotIntent) -> OwnershipState:
        """The run's ownership of its slot now."""
        return self._admission(intent.attempt_id).ownership

    def _admission(self, attempt_id: str) -> Admission:
        admission = self.registry.admission(attempt_id)
        if admission is None:
            raise AuthorityError(
                f"attempt {attempt_id} is not admitted",
                code="attempt_fenced",
                attempt_id=attempt_id,
            )
        return admission

    # ------------------------------------------------------------------ closure

    def close_principal(self, principal: PrincipalRef) -> ClosureProof:
        """End the lease, stop the lease's queries and prove it quiescent (custodial).

        The proof is appended to the store under the lease's step key (``note_step``),
        proven or not, so that who may write later is answered from what was proven
        (:meth:`~dpone.publication.store.leases.PrincipalLeases.closure_proven`); a
        proof that cannot be stored raises the store's error.
        """
        if self.shared_close is not None:
            return self.shared_close(principal)
        return self.close_principals([principal])[0]

    def close_principals(self, principals: Sequence[PrincipalRef]) -> list[ClosureProof]:
        """Close several leases at once (one a user, ``principals_not_distinct``
        otherwise): each proven and stored as :meth:`close_principal` proves it alone,
        with the closer's reads shared (:mod:`~dpone.publication.authority.closure`)."""
        return LeaseCloser(
            issuer=self.issuer,
            closer=self.closer,
            scope_of=self.scope_of,
            gate=self.dispatch_gate,
            policy=self.policy,
            drain=self._drain,
            clock=self._clock,
            sleep=self._sleep,
            next_id=self._next_id,
            deadline=self._deadline,
            note_step=self._note_step,
        ).close(principals)

    def _next_id(self, purpose: str) -> str:
        self._reads += 1
        return f"{QUERY_ID_PREFIX}-close-{purpose}-{time.time_ns()}-{self._reads}"

    def _deadline(self) -> float:
        return self._clock() + self.policy.request_seconds
