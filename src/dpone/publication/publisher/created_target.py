"""A first publication's empty target: created after the checks, dropped if prepare is refused.

:class:`CreatedTarget` notes the CREATE durably before it is sent and its answer after,
and notes the table it made by UUID as soon as it is observed
(``create_target_observed``): that table, never a later one of the same name, is
dpone's own empty target. A prepare refused afterwards drops it again, through
:meth:`~dpone.publication.dispatch.executor.ClickHouseSnapshotExecutor.drop_created_target`,
unless something else may have a stake in it; a table left is recorded as this
generation's CREATE, and the next prepare publishes into it. When it is left is in
docs/publication-principals.md ("The executor").
"""

from __future__ import annotations

from dpone.contracts.composition_snapshot import (
    SnapshotIntent,
    create_target_query_id,
    drop_created_target_query_id,
)
from dpone.errors import DponeError
from dpone.ports.composition_snapshot import (
    CatalogObservation,
    DispatchOutcome,
    PrincipalRef,
    PublicationEvidence,
)
from dpone.publication.publisher.ports import PublisherPorts
from dpone.publication.publisher.receipts import SnapshotPublicationError
from dpone.publication.publisher.records import dispatch_facts
from dpone.publication.publisher.rules import raise_refusal, side_effects
from dpone.publication.store import SnapshotStore

OBSERVED_STEP = "create_target_observed"
DROP_STEP = "drop_created_target"
# Refusals after which the created table is left: others may have a stake in it.
_KEEP_AFTER = frozenset(
    {"side_effect_present", "attempt_fenced", "slot_blocked", "ownership_not_active"}
)


class CreatedTarget:
    """The CREATE of a first publication's empty target, and its DROP after a refusal."""

    def __init__(self, ports: PublisherPorts) -> None:
        """Over the publisher's ports."""
        self.ports = ports

    def create(
        self,
        evidence: PublicationEvidence,
        generation_ref: str,
        publisher: PrincipalRef,
        created_uuid: list[str],
    ) -> CatalogObservation:
        """First publication: note the step durably, CREATE the empty target, re-observe.

        The created table's UUID is noted and goes into ``created_uuid`` as soon as it
        is observed, before anything else is checked, so that a refusal after it can
        drop that table (see the module doc).
        """
        query_id = create_target_query_id(generation_ref)
        slot = evidence.slot
        self.ports.store.note_step(
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
        issued = self.ports.authority.principal_credentials(publisher)
        result = self.ports.executor.create_target(
            slot, evidence.generation.table, query_id, issued
        )
        self.ports.store.note_step(
            query_id, {"step": "create_target_answer", **dispatch_facts(result)}
        )
        if result.outcome is not DispatchOutcome.ACKNOWLEDGED:
            why = f": {result.error_code}" if result.error_code else ""
            raise SnapshotPublicationError(
                f"creating the empty target {slot.database}.{slot.table} was not acknowledged"
                f" ({result.outcome.value}{why})",
                code="create_target_failed",
                query_id=query_id,
                outcome=result.outcome.value,
                clickhouse_code=result.clickhouse_code,
                reason=result.error_code,
            )
        observation = self.ports.observe_settled(evidence.slot, evidence.generation.table)
        if observation.target is None:
            raise SnapshotPublicationError(
                f"the created target {slot.database}.{slot.table} is not visible",
                code="catalog_unobservable",
                query_id=query_id,
            )
        self.ports.store.note_step(
            query_id, {"step": OBSERVED_STEP, "table_uuid": observation.target.uuid}
        )
        created_uuid.append(observation.target.uuid)
        raise_refusal(side_effects(observation))
        return observation

    def drop(
        self,
        evidence: PublicationEvidence,
        generation_ref: str,
        table_uuid: str,
        publisher: PrincipalRef,
        exc: DponeError,
    ) -> None:
        """A prepare refused after its CREATE: drop the empty target it created, unless
        another may have a stake in it (see the module doc).

        The drop is noted beside the CREATE (before it is sent, and its answer after);
        the refusal's details say ``created_target``: ``dropped``, ``left`` (with
        ``created_target_kept`` or ``created_target_drop``: why) or ``unknown`` (the
        DROP's outcome is not known).
        """
        exc.add_details(created_target_uuid=table_uuid)
        kept = self._stake_in(evidence, table_uuid, exc)
        if kept is not None:
            exc.add_details(created_target="left", created_target_kept=kept)
            return
        create_id = create_target_query_id(generation_ref)
        drop_id = drop_created_target_query_id(generation_ref)
        facts = {"query_id": drop_id, "table_uuid": table_uuid, "refusal": exc.code}
        try:
            self.ports.store.note_step(create_id, {"step": DROP_STEP, **facts})
            issued = self.ports.authority.principal_credentials(publisher)
        except DponeError as drop_exc:  # nothing was sent
            exc.add_details(created_target="left", created_target_drop=drop_exc.code)
            return
        result = self.ports.executor.drop_created_target(evidence.slot, table_uuid, drop_id, issued)
        try:
            answer = {"step": f"{DROP_STEP}_answer", **dispatch_facts(result)}
            self.ports.store.note_step(create_id, answer)
        except DponeError as note_exc:  # the answer stands; its note is missing
            exc.add_details(created_target_note_failed=note_exc.code)
        outcome = {
            DispatchOutcome.ACKNOWLEDGED: "dropped",
            DispatchOutcome.UNKNOWN: "unknown",
        }.get(result.outcome, "left")
        exc.add_details(created_target=outcome)
        if outcome != "dropped":
            exc.add_details(created_target_drop=result.error_code or result.outcome.value)

    def _stake_in(
        self, evidence: PublicationEvidence, table_uuid: str, exc: DponeError
    ) -> str | None:
        """Why another may have a stake in the created table, or None when none can.

        The catalog is observed again first: a blocker that appeared since the checks
        (a Buffer, a Distributed table, a writer) keeps the table. What remains open is
        the moment between the executor's last read and its DROP, where only a trusted
        writer (an administrator) or a prepare of another attempt that stores its
        intent then could act; the latter's publish then finds no target and sends
        nothing (its recheck of the target's UUID fails), so no row is lost.
        """
        if exc.code in _KEEP_AFTER:
            return exc.code
        if not isinstance(self.ports.store, SnapshotStore):
            return "intents_unlisted"  # which intents name it cannot be read: keep it
        try:
            for summary in self.ports.store.list_snapshots():
                if SnapshotIntent.from_bytes(summary.intent_bytes).target_uuid == table_uuid:
                    return "named_by_an_intent"
            observation = self.ports.observe_settled(evidence.slot, evidence.generation.table)
        except DponeError as read_exc:
            return read_exc.code
        target = observation.target
        if target is None or target.uuid != table_uuid:
            return "target_not_ours"
        if target.blockers:
            return "side_effect_present"
        return None
