"""The publisher's evidence checks: what must hold before an intent is stored or sent.

``prepare`` refuses with a :class:`SnapshotPublicationError` naming the check;
the dispatch path asks :func:`exchange_precheck` for a stable reason not to send
(with the facts behind it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from dpone.contracts.composition_snapshot import SnapshotIntent, SnapshotLimits
from dpone.ports.composition_snapshot import (
    CatalogObservation,
    PublicationEvidence,
    TableObservation,
)
from dpone.publication.publisher.receipts import SnapshotPublicationError


def check_evidence(evidence: PublicationEvidence, generation_ref: str) -> None:
    """The reopened evidence names this generation, the slot's database and an ingest user."""
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


def generation_of(
    observation: CatalogObservation, evidence: PublicationEvidence
) -> TableObservation:
    """The observed generation, which must be the staged table itself."""
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


def both_tables(
    observation: CatalogObservation, evidence: PublicationEvidence
) -> tuple[TableObservation, TableObservation]:
    """The observed target and generation, both of which must be there."""
    generation = generation_of(observation, evidence)
    if observation.target is None:
        raise SnapshotPublicationError(
            f"the target {evidence.slot.table} is not visible",
            code="catalog_unobservable",
            table=evidence.slot.table,
        )
    return observation.target, generation


def check_generation(
    limits: SnapshotLimits,
    evidence: PublicationEvidence,
    observation: CatalogObservation,
    target: TableObservation,
    generation: TableObservation,
    design_change: bool = False,
) -> None:
    """Same physical design as the target (unless the caller decided a ``design_change``:
    the generation's design is then published as it is), the staged content, and
    within the limits."""
    if target.design_sha256 != generation.design_sha256 and not design_change:
        raise SnapshotPublicationError(
            f"{target.name} and {generation.name} differ in physical design (columns, or "
            "an index, codec, TTL, setting or constraint added to one of them); a refresh "
            'publishes the generation\'s design only with on_design_change = "replace" '
            "(or --design-change replace)",
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
    check_limits(limits, evidence, observation, generation)


def check_limits(
    limits: SnapshotLimits,
    evidence: PublicationEvidence,
    observation: CatalogObservation,
    generation: TableObservation,
) -> None:
    """Every observed size is within its ceiling."""
    observed = {
        "source_rows": evidence.source.rows,
        "source_bytes": evidence.source.bytes,
        "wire_bytes": evidence.generation.rowbinary_bytes,
        **storage_observed(observation, generation),
    }
    excess = first_excess(limits, observed)
    if excess is not None:
        raise ceiling_exceeded(*excess)


def storage_observed(
    observation: CatalogObservation, generation: TableObservation
) -> dict[str, int]:
    """The three storage sizes an observation shows, by the name of their ceiling."""
    return {
        "generation_storage_bytes": generation.total_bytes,
        # The catalog's retained bytes already hold A and every retained table.
        "retained_storage_bytes": observation.retained_bytes,
        "total_transient_storage_bytes": observation.retained_bytes + generation.total_bytes,
    }


def first_excess(
    limits: SnapshotLimits, observed: Mapping[str, int]
) -> tuple[str, int, int] | None:
    """The first ``(ceiling, observed, limit)`` whose observed value is over it, or None."""
    ceilings = limits.to_document()
    for name, value in observed.items():
        if value > ceilings[name]:
            return name, value, ceilings[name]
    return None


def ceiling_exceeded(ceiling: str, observed: int, limit: int) -> SnapshotPublicationError:
    """The ``limit_exceeded`` refusal of one ceiling, naming it, the value and the limit."""
    return SnapshotPublicationError(
        f"{ceiling} {observed} {'exceeds' if observed > limit else 'leaves no room under'}"
        f" its ceiling {limit}",
        code="limit_exceeded",
        ceiling=ceiling,
        observed=observed,
        limit=limit,
    )


class DispatchRefusal(NamedTuple):
    """Why the EXCHANGE must not be sent: a stable reason and the facts behind it."""

    reason: str
    facts: Mapping[str, Any]


def exchange_precheck(
    intent: SnapshotIntent, observation: CatalogObservation, replaced_design: str | None = None
) -> DispatchRefusal | None:
    """Why the EXCHANGE must not be sent now, or None.

    ``replaced_design``: the target's design a design change decided at prepare
    replaces (from the intent's history), else the target must have the intent's.

    The storage ceilings are the intent's own (``intent.limits``, bound at prepare):
    retained storage may have grown since, and the dispatch is refused with
    ``limit_exceeded`` when the fresh observation's generation, retained or total
    transient storage is over its ceiling.
    """
    target, generation = observation.target, observation.generation
    if target is None or generation is None:
        return DispatchRefusal("table_missing", {})
    if (target.uuid, generation.uuid) != (intent.target_uuid, intent.generation_uuid):
        return DispatchRefusal("uuid_pair_changed", {})
    if target.blockers or generation.blockers:
        # Named in the intent's history (dispatch_refused), each with what it is.
        found = [*target.blockers, *generation.blockers]
        return DispatchRefusal(
            "side_effect_present", {"blockers": [f"{b.reason}: {b.detail}" for b in found]}
        )
    # The target keeps the design it had at prepare: its own, or the one a decided
    # design change replaces; the generation keeps the design the intent publishes.
    if target.design_sha256 != (replaced_design or intent.design_sha256):
        return DispatchRefusal("design_mismatch", {"table": "target"})
    if generation.design_sha256 != intent.design_sha256:
        return DispatchRefusal("design_mismatch", {"table": "generation"})
    if (generation.rows, generation.content_digest) != (intent.source_rows, intent.content_digest):
        return DispatchRefusal("content_mismatch", {})
    excess = first_excess(intent.limits, storage_observed(observation, generation))
    if excess is not None:
        ceiling, value, limit = excess
        return DispatchRefusal(
            "limit_exceeded", {"ceiling": ceiling, "observed": value, "limit": limit}
        )
    return None


# A pool user blocks as a writer when its last lease ended without a proven closure.
_WRITER_HINT = (
    "; a user outside the pool that you vouch for (the server's administrator, say) is "
    "accepted by listing it in [clickhouse] trusted_writers; if it is a pool user whose "
    "last lease ended without a proven closure, `dpone snapshot leases` (or `dpone "
    "status`) names the close-lease command that proves it"
)


def refuse_absent_writers(observation: CatalogObservation, where: str) -> None:
    """Raise ``side_effect_present`` when someone could write a name of ``where`` (the
    target slot's database) that does not exist yet, as the generation's prepare would."""
    if observation.absent_writers:
        first = observation.absent_writers[0]
        raise SnapshotPublicationError(
            f"{where}: a table created there now could be written by another: "
            f"{first.reason} ({first.detail}){_WRITER_HINT}",
            code="side_effect_present",
            reason=first.reason,
            blockers=[b.reason for b in observation.absent_writers],
            details=[b.detail for b in observation.absent_writers],
        )


def refuse_side_effects(observation: CatalogObservation) -> None:
    """Raise ``side_effect_present`` naming the first blocker of either table, if any."""
    for table in (observation.target, observation.generation):
        if table is not None and table.blockers:
            first = table.blockers[0]
            hint = _WRITER_HINT if first.reason == "writer_grant" else ""
            raise SnapshotPublicationError(
                f"{table.database}.{table.name} has a side effect the publisher does not"
                f" handle: {first.reason} ({first.detail}){hint}",
                code="side_effect_present",
                reason=first.reason,
                table=table.name,
                blockers=[b.reason for b in table.blockers],
                details=[b.detail for b in table.blockers],
            )
