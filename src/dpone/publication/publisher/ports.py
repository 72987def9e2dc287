"""What every path of the publisher holds: its four ports, its settings, its stored documents."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dpone.contracts.composition_snapshot import (
    DEFAULT_LIMITS,
    SnapshotIntent,
    SnapshotLimits,
    SnapshotRecord,
)
from dpone.errors import DponeError
from dpone.ports.composition_snapshot import (
    CatalogObservation,
    ClickHouseSnapshotCatalog,
    ClickHouseSnapshotExecutor,
    ClosureProof,
    SnapshotPublicationAuthority,
    SnapshotPublicationStore,
    TargetSlot,
)
from dpone.publication.publisher.receipts import SnapshotPublicationError, utc_now
from dpone.publication.publisher.records import principal_ref
from dpone.publication.store import SnapshotStore
from dpone.publication.store.holder_process import (
    Liveness,
    closed_here_now,
    current_process,
    holder_liveness,
    wait_closures_here,
)

# How long a caller that lost the claim waits for the winner's outcome, and how often
# it looks. The wait only delays the loser's answer; it never changes what happens.
CLAIM_WAIT_SECONDS = 30.0
CLAIM_POLL_SECONDS = 0.05


# How long an observation waits for another process's closure of a pool user to be
# proven (it ended the lease and is proving it quiescent: a few seconds), and how often.
CLOSING_WAIT_SECONDS = 60.0
CLOSING_POLL_SECONDS = 0.25


def closing_elsewhere(store: object) -> bool:
    """Whether a pool user's last lease ended unproven while its holder still runs, or
    another thread of this process is closing it.

    That holder is closing it now (a refresh ends its lease, then proves it quiescent
    and stores the proof); a holder that is gone or unknown will prove nothing.
    """
    if not isinstance(store, SnapshotStore):
        return False
    last = {record.lease.user: record for record in store.last_lease_records()}
    here = current_process().pid
    for record in last.values():
        if record.lease.active or store.closure_proven(record.lease):
            continue
        if closed_here_now(record.lease.lease_id):  # another thread of this process
            return True
        holder = record.holder
        elsewhere = holder is not None and holder.pid != here
        if elsewhere and holder_liveness(holder)[0] is Liveness.ALIVE:
            return True
    return False


def allowance_inputs(store: object) -> frozenset[tuple[str, str, bool, bool]]:
    """Each pool user's last lease as a writer allowance decides by it: (user, lease,
    active, closure proven). It changes when a lease is issued, ends or is proven."""
    if not isinstance(store, SnapshotStore):
        return frozenset()
    last = {record.lease.user: record.lease for record in store.last_lease_records()}
    return frozenset(
        (user, lease.lease_id, lease.active, not lease.active and store.closure_proven(lease))
        for user, lease in last.items()
    )


@dataclass(frozen=True)
class LoadedIntent:
    """A stored intent and its current record, checked to belong together."""

    intent: SnapshotIntent
    record: SnapshotRecord


class PublisherPorts:
    """The injected ports and settings, and the two steps every path shares."""

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
        accept_ungated_ingest: bool = False,
    ) -> None:
        """``accept_ungated_ingest``: prepare publishes a generation staged over the
        client transport (no drain gate: its ingest closure rests on process samples
        and the query log alone); refused (``ingest_ungated``) by default."""
        self.authority = authority
        self.store = store
        self.catalog = catalog
        self.executor = executor
        self.limits = limits
        self.clock = clock
        self.claim_wait_seconds = claim_wait_seconds
        self.sleep = sleep
        self.accept_ungated_ingest = accept_ungated_ingest

    def observe_settled(self, slot: TargetSlot, generation_table: str) -> CatalogObservation:
        """The catalog's observation, once no pool user is in the middle of its closure.

        A user another process is closing right now (its lease ended, its proof not
        stored yet) blocks as a writer (``writer_grant``) for those seconds only:
        observe again once its proof is stored (bounded). Any other blocker, or a
        closure nobody runs, is in the observation returned at once.
        """
        deadline = time.monotonic() + CLOSING_WAIT_SECONDS
        while True:
            inputs = allowance_inputs(self.store)
            closing = closing_elsewhere(self.store)  # before: its proof may land meanwhile
            observation = self.catalog.observe(slot, generation_table)
            blockers = [
                *(
                    b
                    for table in (observation.target, observation.generation)
                    if table is not None
                    for b in table.blockers
                ),
                *observation.absent_writers,  # judged alike by the check before an export
            ]
            only_writers = all(b.reason == "writer_grant" for b in blockers)
            if not blockers or not only_writers or time.monotonic() >= deadline:
                return observation
            if allowance_inputs(self.store) != inputs:
                # A lease ended, or its proof was stored, while the observation ran: the
                # allowance it read may be stale (a lease that ended and was proven
                # between the two checks is seen by neither). Observe again.
                continue
            if not (closing or closing_elsewhere(self.store)):
                return observation
            # One this process runs is awaited to its end, not to the next poll.
            if not wait_closures_here(CLOSING_POLL_SECONDS):
                self.sleep(CLOSING_POLL_SECONDS)

    def require_recorded_database(self, database: str, recorded_uuid: str, what: str) -> None:
        """Refuse (``database_mismatch``) when ``database`` now has another UUID than the
        one ``what`` (an intent, a staged generation) recorded.

        That is another server under the same name (the project, or a command's options,
        now reach elsewhere) or the database dropped and created again: no observation
        there can say anything about what was recorded, and a closure there would end a
        lease on another server's evidence. Checked before anything is closed or sent. An
        unobservable database is left to the observations that follow, which refuse.
        """
        if not recorded_uuid:
            return  # nothing recorded to compare (the evidence checks refuse that)
        try:
            found = self.catalog.database_uuid(database)
        except DponeError:
            return
        if found is not None and found != recorded_uuid:
            raise SnapshotPublicationError(
                f"the database {database} of {what} had UUID {recorded_uuid}; the server "
                f"reached now has a database {database} with UUID {found}: this is another "
                f"server than the one {what} was staged on, or {database} was dropped and "
                "created again. Nothing was changed; reach the server it was staged on",
                code="database_mismatch",
                database=database,
                recorded_uuid=recorded_uuid,
                found_uuid=found,
            )

    def replaced_database(self, intent: SnapshotIntent) -> dict[str, Any] | None:
        """The facts proving the intent's database was dropped on this very server, or None.

        Proven when, read now as the operator (who sees every database): the server is
        the one the intent recorded, its database name holds another UUID or none, no
        database has the recorded UUID under any name, and neither A nor B exists in
        any database. Then nothing the intent names can ever be observed again (a
        database renamed away still has its UUID, another server another identity:
        both stay ``database_mismatch``). None when any of it is not so or unreadable.
        """
        try:
            presence = self.catalog.recorded_presence(
                intent.database,
                intent.database_uuid,
                (intent.target_uuid, intent.generation_uuid),
            )
        except DponeError:
            return None
        if (
            presence.server_id != intent.server_id
            or presence.named_uuid == intent.database_uuid
            or presence.database_found
            or presence.tables_found
        ):
            return None
        return {
            "database": intent.database,
            "recorded_uuid": intent.database_uuid,
            "found_uuid": presence.named_uuid,
            "server_id": presence.server_id,
            "tables": [intent.target_uuid, intent.generation_uuid],
            "tables_found": [],
        }

    def load(self, intent_sha256: str) -> LoadedIntent:
        """The stored intent and its current record, checked to belong together."""
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
        return LoadedIntent(intent, record)

    def close_publisher(self, intent: SnapshotIntent) -> ClosureProof | None:
        """Close the intent's publisher: its proof, or None when the closure failed."""
        try:
            return self.authority.close_principal(principal_ref(intent.publisher))
        except DponeError:
            return None  # an unproven closure keeps the record unknown
