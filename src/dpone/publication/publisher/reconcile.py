"""The publisher's reconcile path: move a claimed record only to what is proven.

``reconcile`` closes the publisher, observes both names, the query log and B's
content, and moves the record only along an allowed edge
(:func:`dpone.contracts.composition_snapshot.decide_reconcile`). It never issues
credentials and never calls the executor.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dpone.contracts.composition_snapshot import (
    TERMINAL,
    ReconcileFacts,
    RecordDispatch,
    SnapshotIntent,
    SnapshotRecord,
    SnapshotState,
    decide_reconcile,
    exchange_query_id,
)
from dpone.errors import DponeError
from dpone.ports.composition_snapshot import (
    CatalogObservation,
    ClosureProof,
    DispatchOutcome,
    DispatchResult,
    OwnershipState,
)
from dpone.publication.authority.login_account import LOGINS_UNOBSERVABLE
from dpone.publication.publisher.ports import PublisherPorts
from dpone.publication.publisher.receipts import (
    PublicationReceipt,
    SnapshotPublicationError,
    receipt_from_record,
    receipt_observed,
)
from dpone.publication.publisher.records import (
    cas_authority,
    closure_document,
    facts_document,
    intent_slot,
    record_closure,
    record_dispatch,
)

P = SnapshotState
# A COMMIT_UNKNOWN record's reason when its database was dropped on this server (with
# its publisher closed): only `dpone snapshot abandon` ends what it blocks.
DATABASE_REPLACED = "database_replaced"
_RETAINED = frozenset({OwnershipState.ACTIVE, OwnershipState.RETIRING})

# A publisher's closure that cannot read the server's session log: not proven.
PUBLISHER_LOGINS_UNOBSERVABLE = "publisher_logins_unobservable"


class Reconcile:
    """``reconcile``: observe, decide, and compare-and-set along an allowed edge."""

    def __init__(self, ports: PublisherPorts) -> None:
        """Over the publisher's ports."""
        self.ports = ports

    def reconcile(self, intent_sha256: str) -> PublicationReceipt:
        """Close the publisher, observe, and move a claimed record to what is proven.

        Needs retained ownership (ACTIVE or RETIRING). A terminal record is observed and
        reported but never rewritten; a PREPARED one has no publisher in use to close.
        """
        loaded = self.ports.load(intent_sha256)
        intent, record = loaded.intent, loaded.record
        self.require_retained(intent)
        if record.state in TERMINAL or record.state is P.PREPARED:
            return self._report(intent, record)
        # A database dropped (and maybe created again) on this same server took A and B
        # with it: the claim can only end unknown, but its publisher is still closed
        # here, on this server's evidence. Any other database under the name refuses.
        # The proof is asked only when the database's UUID is not the recorded one: one
        # read in the usual case, as before.
        replaced = None
        if self._database_changed(intent):
            replaced = self.ports.replaced_database(intent)
            if replaced is None:
                self.ports.require_recorded_database(
                    intent.database, intent.database_uuid, f"the intent {intent_sha256}"
                )
        return self.claimed(intent, record, None, replaced=replaced)

    def require_retained(self, intent: SnapshotIntent) -> None:
        """Refuse (``ownership_not_retained``) unless the intent's run still retains its
        slot (ACTIVE or RETIRING): only such a run may close its publisher and decide."""
        ownership = self.ports.authority.ownership(intent)
        if ownership not in _RETAINED:
            raise SnapshotPublicationError(
                f"the run of {intent.sha256} no longer retains its slot ({ownership.value})",
                code="ownership_not_retained",
                intent_sha256=intent.sha256,
                ownership=ownership.value,
            )

    def _database_changed(self, intent: SnapshotIntent) -> bool:
        """Whether the intent's database now has another UUID or none (an unreadable
        one is left to the observations that follow, which refuse)."""
        if not intent.database_uuid:
            return False  # nothing recorded to compare (the evidence checks refuse that)
        try:
            return self.ports.catalog.database_uuid(intent.database) != intent.database_uuid
        except DponeError:
            return False

    def _report(self, intent: SnapshotIntent, record: SnapshotRecord) -> PublicationReceipt:
        facts = self._facts(intent, closure=None, dispatch=None)
        self.ports.store.observe(intent.sha256, {"step": "observe", **facts_document(facts)})
        return receipt_observed(record, facts)

    def claimed(
        self,
        intent: SnapshotIntent,
        record: SnapshotRecord,
        dispatch: DispatchResult | None,
        *,
        replaced: Mapping[str, Any] | None = None,
    ) -> PublicationReceipt:
        """``replaced``: the proof the intent's database is gone (:meth:`replaced_database`);
        its names then denote other tables or none, and are not observed."""
        closure = self.ports.close_publisher(intent)
        known = record_dispatch(dispatch) if dispatch is not None else record.dispatch
        facts = self._facts(intent, closure=closure, dispatch=known, tables=replaced is None)
        decided = decide_reconcile(intent, facts)
        history = {
            "step": "reconcile",
            "decided": decided.value,
            **facts_document(facts),
            # Why this call's dispatch ended as it did (None when it made none).
            "dispatch_reason": None if dispatch is None else dispatch.error_code,
            "closure": None if closure is None else closure_document(closure),
            "database_replaced": None if replaced is None else dict(replaced),
        }
        if decided is P.COMMIT_UNKNOWN and record.state is P.COMMIT_UNKNOWN:
            # Staying unknown is not a transition: same revision, one more observation.
            self.ports.store.observe(intent.sha256, history)
            return receipt_observed(record, facts)
        successor = record.successor(
            decided,
            at=self.ports.clock(),
            observation=facts.observation(),
            dispatch=known,
            closure=None if closure is None else record_closure(closure),
            reason=DATABASE_REPLACED
            if replaced is not None and decided is P.COMMIT_UNKNOWN and facts.closure_proven
            else _reason(intent, decided, facts, dispatch, closure),
        )
        try:
            self.ports.store.compare_and_set(
                intent.sha256,
                expected=record.raw,
                replacement=successor.raw,
                authority=cas_authority(intent),
                facts=history,
            )
        except DponeError as exc:
            if exc.code != "claim_lost":
                raise
            # A concurrent reconcile moved the record first: keep what this call saw
            # (its closure and observation) in the history, then report what it wrote.
            current = self.ports.load(intent.sha256).record
            self.ports.store.observe(
                intent.sha256,
                {
                    **history,
                    "step": "reconcile_lost",
                    "found": f"{current.state.value}@{current.revision}",
                },
            )
            return receipt_from_record(current, historical=False)
        return receipt_observed(successor, facts)

    def _facts(
        self,
        intent: SnapshotIntent,
        *,
        closure: ClosureProof | None,
        dispatch: RecordDispatch | None,
        tables: bool = True,
    ) -> ReconcileFacts:
        # In this order, never side by side: the query log is flushed and read after
        # the names were, so an EXCHANGE that made the names observed is in it.
        observation = self._identities(intent, tables)
        finishes = self._exchange_finishes(intent)
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
            target_design_sha256=None if target is None else target.design_sha256,
        )

    def _identities(self, intent: SnapshotIntent, tables: bool) -> CatalogObservation | None:
        """Both names' identities now (None: not asked, or unobservable)."""
        if not tables:
            return None
        try:
            return self.ports.catalog.identities(intent_slot(intent), intent.generation_table)
        except DponeError:
            return None

    def _exchange_finishes(self, intent: SnapshotIntent) -> int | None:
        """How many times the query log says the EXCHANGE finished (None: unreadable)."""
        try:
            events = self.ports.catalog.exchange_events(exchange_query_id(intent.sha256))
        except DponeError:
            return None
        return sum(1 for e in events if e.type == "QueryFinish")


def _reason(
    intent: SnapshotIntent,
    decided: SnapshotState,
    facts: ReconcileFacts,
    dispatch: DispatchResult | None,
    closure: ClosureProof | None = None,
) -> str | None:
    """The record's reason: a dispatch this call did not send keeps why it was not sent;
    a publisher closure blind to the server's session log says so (the operator's way
    out differs: the log, the closer's grant, or accepting it)."""
    if (
        decided is P.COMMIT_UNKNOWN
        and closure is not None
        and not closure.proven
        and LOGINS_UNOBSERVABLE in closure.facts.get("unproven", ())
    ):
        return PUBLISHER_LOGINS_UNOBSERVABLE
    if (
        decided is P.NOT_PUBLISHED
        and dispatch is not None
        and dispatch.outcome is DispatchOutcome.NOT_SENT
        and dispatch.error_code
    ):
        return f"not_sent_{dispatch.error_code}"
    return reconcile_reason(intent, decided, facts)


def reconcile_reason(
    intent: SnapshotIntent, decided: SnapshotState, facts: ReconcileFacts
) -> str | None:
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
        if facts.target_design_sha256 != intent.design_sha256:
            return "design_changed"
        return "content_mismatch"
    if pair == (intent.target_uuid, intent.generation_uuid):
        return "exchange_logged" if facts.exchange_finishes else "query_log_unobservable"
    return "uuid_pair_unexpected"
