"""The pre-publish rules: what must hold of the catalog's observations before a publication.

Each rule is one function that judges observations (read by :mod:`dpone.publication.catalog`)
and returns a :class:`Refusal` (a stable code, the facts behind it and a message) or
None. ``prepare`` raises a refusal as its typed error (:meth:`Refusal.error`); the
dispatch before the EXCHANGE returns its code as the NOT_SENT reason and notes its facts
in the intent's history (:meth:`Refusal.noted_facts`). A new check before publish is one
more function here, added to :func:`generation_refusal` (prepare) and
:func:`exchange_refusal` (dispatch) alike.

Rules both paths apply:

- :func:`side_effects`: neither table has a blocker (``side_effect_present``; prepare
  applies it as soon as it observes, and again after a CREATE);
- :func:`design`: the target keeps the design it had, the generation has the one
  published (``design_mismatch``);
- :func:`content`: the generation holds the staged rows and digest (``content_mismatch``);
- :func:`ceilings`: every observed size is within its ceiling (``limit_exceeded``).

Rules of one path, whose codes say which path refused:

- prepare: :func:`reopened_evidence` (``evidence_unverified``), :func:`staged_generation`
  (``evidence_unverified``), :func:`target_visible` (``catalog_unobservable``);
- dispatch: :func:`named_tables` (``table_missing``, ``uuid_pair_changed``);
- a refresh's first checks: :func:`absent_writers` (``side_effect_present``).
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


class Refusal(NamedTuple):
    """Why a publication must not go on: a stable code, the facts behind it, a message.

    ``noted``: what the dispatch notes in the intent's history when that differs from
    ``facts`` (the typed error's details); None notes ``facts``.
    """

    code: str
    facts: Mapping[str, Any]
    message: str
    noted: Mapping[str, Any] | None = None

    def error(self) -> SnapshotPublicationError:
        """The refusal as prepare raises it."""
        return SnapshotPublicationError(self.message, code=self.code, **self.facts)

    def noted_facts(self) -> Mapping[str, Any]:
        """The facts the dispatch notes in the intent's history beside the reason."""
        return self.facts if self.noted is None else self.noted


def raise_refusal(refusal: Refusal | None) -> None:
    """Raise ``refusal`` as its typed error, if there is one."""
    if refusal is not None:
        raise refusal.error()


# ---------------------------------------------------------------- rules of both paths

# A pool user blocks as a writer when its last lease ended without a proven closure.
_WRITER_HINT = (
    "; a user outside the pool that you vouch for (the server's administrator, say) is "
    "accepted by listing it in [clickhouse] trusted_writers; if it is a pool user whose "
    "last lease ended without a proven closure, `dpone snapshot leases` (or `dpone "
    "status`) names the close-lease command that proves it"
)


def side_effects(observation: CatalogObservation) -> Refusal | None:
    """``side_effect_present`` naming the first blocker of either table, if any.

    The error names the first table's blockers; the dispatch notes every blocker of
    both tables, each with what it is.
    """
    tables = [t for t in (observation.target, observation.generation) if t is not None]
    blocked = [t for t in tables if t.blockers]
    if not blocked:
        return None
    table = blocked[0]
    first = table.blockers[0]
    hint = _WRITER_HINT if first.reason == "writer_grant" else ""
    return Refusal(
        "side_effect_present",
        {
            "reason": first.reason,
            "table": table.name,
            "blockers": [b.reason for b in table.blockers],
            "details": [b.detail for b in table.blockers],
        },
        f"{table.database}.{table.name} has a side effect the publisher does not"
        f" handle: {first.reason} ({first.detail}){hint}",
        noted={"blockers": [f"{b.reason}: {b.detail}" for t in tables for b in t.blockers]},
    )


def design(
    target: TableObservation,
    generation: TableObservation,
    *,
    published: str,
    replaced: str | None = None,
) -> Refusal | None:
    """``design_mismatch`` unless the generation has the ``published`` design and the
    target the one it is to replace: ``replaced`` when a design change was decided,
    else ``published`` itself (a generation publishes the target's own design)."""
    if target.design_sha256 != (replaced or published):
        return Refusal(
            "design_mismatch",
            _design_facts("target", target, generation),
            f"{target.name}'s physical design {target.design_sha256} is no longer the one"
            f" prepared ({replaced or published})",
        )
    if generation.design_sha256 == published:
        return None
    if published == target.design_sha256:
        message = (
            f"{target.name} and {generation.name} differ in physical design (columns, or "
            "an index, codec, TTL, setting or constraint added to one of them); a refresh "
            'publishes the generation\'s design only with on_design_change = "replace" '
            "(or --design-change replace)"
        )
    else:
        message = (
            f"{generation.name}'s physical design {generation.design_sha256} is no longer"
            f" the one prepared ({published})"
        )
    return Refusal("design_mismatch", _design_facts("generation", target, generation), message)


def _design_facts(
    table: str, target: TableObservation, generation: TableObservation
) -> dict[str, Any]:
    return {
        "table": table,
        "target_design": target.design_sha256,
        "generation_design": generation.design_sha256,
    }


def content(
    generation: TableObservation, *, counted: int, receipt_rows: int, digest: str
) -> Refusal | None:
    """``content_mismatch`` unless the generation holds the rows staging ``counted``
    (and the receipt's ``receipt_rows``) with the content ``digest`` computed at
    preparation."""
    if not generation.rows == counted == receipt_rows:
        return Refusal(
            "content_mismatch",
            {"table": generation.name},
            f"{generation.name} holds {generation.rows} rows; staging counted {counted},"
            f" the receipt {receipt_rows}",
        )
    if generation.content_digest != digest:
        return Refusal(
            "content_mismatch",
            {"table": generation.name},
            f"{generation.name}'s content digest {generation.content_digest} differs from"
            f" the one computed at preparation {digest}",
        )
    return None


def ceilings(limits: SnapshotLimits, observed: Mapping[str, int]) -> Refusal | None:
    """``limit_exceeded`` for the first observed size over its ceiling, if any."""
    excess = first_excess(limits, observed)
    return None if excess is None else ceiling_refusal(*excess)


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


def evidence_observed(
    evidence: PublicationEvidence, observation: CatalogObservation, generation: TableObservation
) -> dict[str, int]:
    """Every size prepare holds to a ceiling: the source's, the wire's and the storage's."""
    return {
        "source_rows": evidence.source.rows,
        "source_bytes": evidence.source.bytes,
        "wire_bytes": evidence.generation.rowbinary_bytes,
        **storage_observed(observation, generation),
    }


def first_excess(
    limits: SnapshotLimits, observed: Mapping[str, int]
) -> tuple[str, int, int] | None:
    """The first ``(ceiling, observed, limit)`` whose observed value is over it, or None."""
    limit_of = limits.to_document()
    for name, value in observed.items():
        if value > limit_of[name]:
            return name, value, limit_of[name]
    return None


def ceiling_refusal(ceiling: str, observed: int, limit: int) -> Refusal:
    """The ``limit_exceeded`` refusal of one ceiling, naming it, the value and the limit."""
    return Refusal(
        "limit_exceeded",
        {"ceiling": ceiling, "observed": observed, "limit": limit},
        f"{ceiling} {observed} {'exceeds' if observed > limit else 'leaves no room under'}"
        f" its ceiling {limit}",
    )


def ceiling_exceeded(ceiling: str, observed: int, limit: int) -> SnapshotPublicationError:
    """:func:`ceiling_refusal` as the typed error (for checks outside the publisher)."""
    return ceiling_refusal(ceiling, observed, limit).error()


# ------------------------------------------------------------- each path's composition


def generation_refusal(
    limits: SnapshotLimits,
    evidence: PublicationEvidence,
    observation: CatalogObservation,
    target: TableObservation,
    generation: TableObservation,
    design_change: bool = False,
) -> Refusal | None:
    """Prepare's judgement of the observed generation against the target and evidence.

    Same physical design as the target (unless the caller decided a ``design_change``:
    the generation's design is then published as it is), the staged content, and
    within the limits.
    """
    staged = evidence.generation
    return (
        design(
            target,
            generation,
            published=generation.design_sha256 if design_change else target.design_sha256,
            replaced=target.design_sha256 if design_change else None,
        )
        or content(
            generation,
            counted=staged.rows,
            receipt_rows=evidence.source.rows,
            digest=staged.rows_digest,
        )
        or ceilings(limits, evidence_observed(evidence, observation, generation))
    )


def exchange_refusal(
    intent: SnapshotIntent, observation: CatalogObservation, replaced_design: str | None = None
) -> Refusal | None:
    """Why the EXCHANGE must not be sent now, or None.

    ``replaced_design``: the target's design a design change decided at prepare
    replaces (from the intent's history), else the target must have the intent's.

    The storage ceilings are the intent's own (``intent.limits``, bound at prepare):
    retained storage may have grown since, and the dispatch is refused with
    ``limit_exceeded`` when the fresh observation's generation, retained or total
    transient storage is over its ceiling.
    """
    missing = named_tables(intent, observation)
    target, generation = observation.target, observation.generation
    if missing is not None or target is None or generation is None:
        return missing or _TABLE_MISSING
    return (
        side_effects(observation)
        or design(target, generation, published=intent.design_sha256, replaced=replaced_design)
        or content(
            generation,
            counted=intent.source_rows,
            receipt_rows=intent.source_rows,
            digest=intent.content_digest,
        )
        or ceilings(intent.limits, storage_observed(observation, generation))
    )


# ------------------------------------------------------------------ rules of one path


def reopened_evidence(reopened: PublicationEvidence, generation_ref: str) -> Refusal | None:
    """Prepare: the reopened evidence names this generation, the slot's database and an
    ingest user (``evidence_unverified``)."""
    problems = []
    if reopened.generation.staged_event_sha256 != generation_ref:
        problems.append("the reopened generation record is not the one named")
    if reopened.endpoint.get("database") != reopened.slot.database:
        problems.append("the staged endpoint is another database than the target slot's")
    if reopened.ingest.user == "" or reopened.ingest.user_uuid == "":
        problems.append("the staging journal names no ingest principal")
    if not problems:
        return None
    return Refusal(
        "evidence_unverified",
        {"generation_ref": generation_ref},
        f"the evidence does not verify: {'; '.join(problems)}",
    )


def staged_generation(
    observation: CatalogObservation, reopened: PublicationEvidence
) -> Refusal | None:
    """Prepare: the observed generation is the staged table itself (``evidence_unverified``)."""
    generation = observation.generation
    if generation is not None and generation.uuid == reopened.generation.table_uuid:
        return None
    return Refusal(
        "evidence_unverified",
        {
            "table": reopened.generation.table,
            "observed_uuid": None if generation is None else generation.uuid,
        },
        f"the generation {reopened.generation.table} is not the staged table"
        f" {reopened.generation.table_uuid}",
    )


def target_visible(
    observation: CatalogObservation, reopened: PublicationEvidence
) -> Refusal | None:
    """Prepare, once the target exists: it is observed (``catalog_unobservable``)."""
    if observation.target is not None:
        return None
    return Refusal(
        "catalog_unobservable",
        {"table": reopened.slot.table},
        f"the target {reopened.slot.table} is not visible",
    )


_TABLE_MISSING = Refusal("table_missing", {}, "the target or the generation is not observed")


def named_tables(intent: SnapshotIntent, observation: CatalogObservation) -> Refusal | None:
    """Dispatch: both names are there (``table_missing``) and still hold the tables the
    intent names (``uuid_pair_changed``)."""
    target, generation = observation.target, observation.generation
    if target is None or generation is None:
        return _TABLE_MISSING
    if (target.uuid, generation.uuid) != (intent.target_uuid, intent.generation_uuid):
        return Refusal(
            "uuid_pair_changed",
            {},
            f"{intent.target_table} and {intent.generation_table} no longer hold the tables"
            " the intent names",
        )
    return None


def absent_writers(observation: CatalogObservation, where: str) -> Refusal | None:
    """A refresh's first checks: ``side_effect_present`` when someone could write a name
    of ``where`` (the target slot's database) that does not exist yet, as the
    generation's prepare would."""
    if not observation.absent_writers:
        return None
    first = observation.absent_writers[0]
    return Refusal(
        "side_effect_present",
        {
            "reason": first.reason,
            "blockers": [b.reason for b in observation.absent_writers],
            "details": [b.detail for b in observation.absent_writers],
        },
        f"{where}: a table created there now could be written by another: "
        f"{first.reason} ({first.detail}){_WRITER_HINT}",
    )


def refuse_side_effects(observation: CatalogObservation) -> None:
    """Raise :func:`side_effects`' refusal, if any."""
    raise_refusal(side_effects(observation))


def refuse_absent_writers(observation: CatalogObservation, where: str) -> None:
    """Raise :func:`absent_writers`' refusal, if any."""
    raise_refusal(absent_writers(observation, where))
