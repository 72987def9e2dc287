"""The publisher's prepare path: from reopened evidence to a stored PREPARED@1 intent.

The authority reopens the evidence, the ingest principal is closed and proven
quiescent, the catalog is observed, design, content and limits are checked, a
publisher is issued, and the intent is stored with its PREPARED record. A first
publication creates the empty target (a noted step) only after B's checks passed; a
refusal after the CREATE drops that table again while it is still the one created and
empty (also noted), so a refused prepare leaves no table behind.
"""

from __future__ import annotations

from dpone.contracts.composition_snapshot import (
    SnapshotIntent,
    SnapshotLimits,
    SnapshotRecord,
    create_target_query_id,
)
from dpone.errors import DponeError
from dpone.ports.composition_snapshot import (
    AttemptRef,
    CatalogObservation,
    PrincipalRef,
    PublicationEvidence,
    TableObservation,
)
from dpone.publication.authority.login_account import logins_unobserved
from dpone.publication.publisher.created_target import CreatedTarget
from dpone.publication.publisher.ports import PublisherPorts
from dpone.publication.publisher.receipts import (
    PublicationReceipt,
    SnapshotPublicationError,
    receipt,
)
from dpone.publication.publisher.records import (
    DESIGN_CHANGE_STEP,
    intent_principal,
)
from dpone.publication.publisher.rules import (
    evidence_observed,
    generation_refusal,
    raise_refusal,
    reopened_evidence,
    side_effects,
    staged_generation,
    target_visible,
)


class Prepare:
    """``prepare``: check everything, issue a publisher, store the intent as PREPARED@1."""

    def __init__(self, ports: PublisherPorts, created: CreatedTarget) -> None:
        """Over the publisher's ports; ``created`` creates (and drops) a first target."""
        self.ports = ports
        self.created = created

    def prepare(
        self, attempt: AttemptRef, generation_ref: str, *, design_change: bool = False
    ) -> PublicationReceipt:
        """Reopen the evidence, prove ingest closed, check the catalog, store PREPARED@1.

        ``design_change``: the caller decided to publish the generation's design even
        where it differs from the target's (a changed source schema, a rollback across
        one). The replaced design is noted in the intent's history, and publish sends
        the EXCHANGE only while the target still has exactly that design.
        """
        evidence = self.ports.authority.reopen(attempt, generation_ref)
        raise_refusal(reopened_evidence(evidence, generation_ref))
        self.ports.require_recorded_database(
            evidence.slot.database,
            str(evidence.endpoint.get("database_uuid", "")),
            f"the staged generation {evidence.generation.table}",
        )
        self._close_ingest(evidence)
        observation = self._observe_checked(evidence)
        staged = _staged(observation, evidence)  # B must be there before any CREATE
        publisher: PrincipalRef | None = None
        created = observation.target is None
        created_uuid: list[str] = []  # the created target's UUID, once observed
        if created:
            # A first publication creates the target only once everything else holds: B's
            # rows, digest and the limits are checked first (the new target takes B's
            # design, which the check after the CREATE compares), so a refused prepare
            # leaves no table behind.
            raise_refusal(
                generation_refusal(self.ports.limits, evidence, observation, staged, staged)
            )
        try:
            if created:
                publisher = self.ports.authority.issue_publisher(evidence)
                observation = self.created.create(evidence, generation_ref, publisher, created_uuid)
            target, generation = _both(observation, evidence)
            raise_refusal(
                generation_refusal(
                    self.ports.limits, evidence, observation, target, generation, design_change
                )
            )
            if publisher is None:
                publisher = self.ports.authority.issue_publisher(evidence)
            intent = seal_intent(
                evidence, target, generation, publisher, self.ports.limits, self.ports.clock()
            )
            record = SnapshotRecord.prepared(intent.sha256, at=self.ports.clock())
            self.ports.store.create(intent.raw, record.raw, self.ports.authority.recheck(intent))
        except DponeError as exc:
            # An uncertain create may have stored the intent: its target and publisher stay.
            if exc.code != "prepare_uncertain":
                if publisher is not None and created_uuid:
                    self.created.drop(evidence, generation_ref, created_uuid[0], publisher, exc)
                if publisher is not None:
                    self._release_unused(publisher, exc)
            raise
        if created:  # link the pre-intent step note into the intent's own history
            self.ports.store.observe(
                intent.sha256,
                {"step": "create_target", "query_id": create_target_query_id(generation_ref)},
            )
        self._note_design_change(intent.sha256, target, generation)
        # The final observations the ceilings were checked against, kept with the intent.
        self.ports.store.observe(
            intent.sha256,
            {
                "step": "limits_checked",
                "observed": evidence_observed(evidence, observation, generation),
                "observed_at": observation.observed_at,
            },
        )
        return receipt(
            record,
            target.uuid,
            generation.uuid,
            generation.rows,
            generation.content_digest,
            historical=False,
        )

    def _close_ingest(self, evidence: PublicationEvidence) -> None:
        """Prove the ingest principal closed and quiescent, or refuse the prepare; and
        refuse a generation staged without a drain gate unless the caller accepts it."""
        closure = self.ports.authority.close_principal(evidence.ingest)
        # Named before the closure's other findings: it has its own ways out.
        if (
            logins_unobserved(closure.facts.get("logins", {}))
            and not self.ports.accept_ungated_ingest
        ):
            raise SnapshotPublicationError(
                f"the closer cannot read the server's session log, so a request of "
                f"{evidence.ingest.user} that the server authenticated but has not "
                "registered as a query (an INSERT whose body is held open) cannot be seen "
                "by the closure: add the <session_log> section to the server's "
                "configuration (docs/remote.md; a managed server started by an older dpone: "
                "`dpone server stop`, then `dpone server start`), give the closer its SELECT "
                "on system.session_log (a pool rendered by an older dpone: render it again "
                "and install it), or accept the closure on process samples and the query "
                "log alone ([publication] accept_ungated_ingest = true, or "
                "--accept-ungated-ingest)",
                code="ingest_logins_unobservable",
                user=evidence.ingest.user,
            )
        if not closure.proven:
            raise SnapshotPublicationError(
                f"the ingest principal {evidence.ingest.user} is not proven closed and quiescent",
                code="ingest_not_quiescent",
                user=evidence.ingest.user,
                strength=closure.strength.value,
            )
        ungated = evidence.ingest_gated is False or (
            evidence.ingest_gated is None and evidence.ingest_transport == "client"
        )
        if ungated and not self.ports.accept_ungated_ingest:
            raise SnapshotPublicationError(
                f"the generation was staged without a drain gate (its journal names transport "
                f"{evidence.ingest_transport!r} and no drain-gate session; the client "
                f"transport has none), so a write of {evidence.ingest.user} held in flight could still "
                "land in it; stage it again over HTTP, or accept its closure on process "
                "samples and the query log alone ([publication] accept_ungated_ingest = "
                "true, or --accept-ungated-ingest)",
                code="ingest_ungated",
                user=evidence.ingest.user,
            )

    def _note_design_change(
        self, intent_sha256: str, target: TableObservation, generation: TableObservation
    ) -> None:
        """Bind a decided design change to its intent: publish reads it before it sends."""
        if target.design_sha256 != generation.design_sha256:
            self.ports.store.observe(
                intent_sha256,
                {
                    "step": DESIGN_CHANGE_STEP,
                    "replaced_design_sha256": target.design_sha256,
                    "design_sha256": generation.design_sha256,
                },
            )

    def _observe_checked(self, evidence: PublicationEvidence) -> CatalogObservation:
        observation = self.ports.observe_settled(evidence.slot, evidence.generation.table)
        raise_refusal(side_effects(observation))
        return observation

    def _release_unused(self, publisher: PrincipalRef, exc: DponeError) -> None:
        # No intent names this publisher, so no other caller can be using it.
        try:
            self.ports.authority.close_principal(publisher)
        except DponeError as close_exc:
            exc.add_details(publisher_release_failed=close_exc.code)


def _staged(observation: CatalogObservation, evidence: PublicationEvidence) -> TableObservation:
    """The observed generation, refused unless it is the staged table itself."""
    raise_refusal(staged_generation(observation, evidence))
    return _present(observation.generation)


def _both(
    observation: CatalogObservation, evidence: PublicationEvidence
) -> tuple[TableObservation, TableObservation]:
    """The observed target and generation: a visible target and the staged table."""
    generation = _staged(observation, evidence)
    raise_refusal(target_visible(observation, evidence))
    return _present(observation.target), generation


def _present(table: TableObservation | None) -> TableObservation:
    if table is None:  # never: the rule just applied refuses an unobserved table
        raise SnapshotPublicationError(
            "a table checked present is not", code="catalog_unobservable"
        )
    return table


def seal_intent(
    evidence: PublicationEvidence,
    target: TableObservation,
    generation: TableObservation,
    publisher: PrincipalRef,
    limits: SnapshotLimits,
    prepared_at: str,
) -> SnapshotIntent:
    """The sealed intent that names exactly these tables, this evidence and this publisher."""
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
        ingest=intent_principal(evidence.ingest),
        publisher=intent_principal(publisher),
        limits=limits,
        prepared_at=prepared_at,
    ).seal()
