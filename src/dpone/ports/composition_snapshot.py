"""The four ports of atomic snapshot publication (seed 000), and what they return.

``ClickHouseAtomicSnapshotPublisher`` (``dpone.publication.publisher``) depends only on
these Protocols: :class:`SnapshotPublicationAuthority` (the evidence reopened,
principals issued and closed), :class:`SnapshotPublicationStore` (durable records, their
history, compare-and-set and an independent read-back), :class:`ClickHouseSnapshotCatalog`
(a fresh, complete observation) and :class:`ClickHouseSnapshotExecutor` (each mutation
rendered internally and sent once). Every method returns what it proved or raises a
typed error with a stable code; none retries behind the caller's back, and none turns a
missing observation into a zero or an empty list.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

# The record's vocabulary and the principal's document are the contracts' shapes; the
# ports' results name them, so they are importable here too.
from dpone.contracts.composition_snapshot import ClosureStrength as ClosureStrength
from dpone.contracts.composition_snapshot import DispatchOutcome as DispatchOutcome
from dpone.contracts.composition_snapshot import PrincipalIdentity

if TYPE_CHECKING:
    from dpone.contracts.composition_snapshot import SnapshotIntent
    from dpone.ports.clickhouse_request import Credentials


# ---------------------------------------------------------------------- references


@dataclass(frozen=True)
class TargetSlot:
    """The protected physical table a publication replaces: ``database.table``."""

    database: str
    table: str


@dataclass(frozen=True)
class AttemptRef:
    """What a caller names when it prepares: an attempt's journal and the target slot.

    It establishes nothing by itself; the authority reopens the journal it points to.
    """

    journal_dir: Path
    slot: TargetSlot


class OwnershipState(enum.Enum):
    """Ownership of an admitted run over its target slot (the run registry)."""

    ACTIVE = "active"
    RETIRING = "retiring"
    RETIRED = "retired"


@dataclass(frozen=True)
class PrincipalRef(PrincipalIdentity):
    """An issued ClickHouse principal: user name, ``system.users.id`` and its lease."""


@dataclass(frozen=True)
class IssuedPrincipal:
    """A principal together with its credentials (never printed, never stored in records)."""

    ref: PrincipalRef
    credentials: Credentials = field(repr=False)


@dataclass(frozen=True)
class ClosureProof:
    """The result of closing one principal: proven or not, how strongly, and the facts."""

    principal: PrincipalRef
    proven: bool
    strength: ClosureStrength
    facts: Mapping[str, Any]  # canonical-JSON-ready observations (samples, kills, gate)


@dataclass(frozen=True)
class AttemptEpochs:
    """Fencing numbers: the slot's epoch at admission and the attempt's admission number."""

    slot_epoch: int
    attempt_epoch: int


@dataclass(frozen=True)
class GenerationEvidence:
    """The private generation B as the staging journal's final ``staged`` event shows it."""

    table: str
    table_uuid: str
    staged_event_sha256: str
    semantic_id: str
    rows: int
    rowbinary_bytes: int
    rows_digest: str  # order-independent content digest computed at preparation


@dataclass(frozen=True)
class SourceEvidence:
    """The reconciled source snapshot: the receipt and what staging counted."""

    receipt_sha256: str
    rows: int
    bytes: int


@dataclass(frozen=True)
class PublicationEvidence:
    """Everything the authority reopened for one ``prepare`` call."""

    parent_request: str
    attempt_id: str
    epochs: AttemptEpochs
    slot: TargetSlot
    endpoint: Mapping[str, Any]  # EndpointIdentity.to_document() recorded by staging
    generation: GenerationEvidence
    source: SourceEvidence
    ingest: PrincipalRef
    # The transport staging's journal names ("http", "client"); None when the journal
    # names none (a rollback's, whose ingest principal writes nothing).
    ingest_transport: str | None = None
    # Whether staging's transport put every write in a drain-gate session; None when
    # the journal does not say (one written before it did, or a rollback's).
    ingest_gated: bool | None = None


@dataclass(frozen=True)
class ParentAuthority:
    """What a store compare-and-set rechecks atomically with the record bytes."""

    parent_request: str
    slot: TargetSlot
    slot_epoch: int


# ---------------------------------------------------------------------- registry


@dataclass(frozen=True)
class Admission:
    """One admitted run: its parent request, slot, attempt, epochs and ownership.

    ``activated``: the run has taken its slot epoch. A run is admitted with the epoch it
    will take (the slot's next one) and takes it only when its PREPARED intent is stored,
    so a prepare that fails fences no older run.
    """

    parent_request: str
    slot: TargetSlot
    attempt_id: str
    epochs: AttemptEpochs
    ownership: OwnershipState
    activated: bool = True


@dataclass(frozen=True)
class Lease:
    """A principal of the pool leased to one attempt in one role (ingest or publisher)."""

    lease_id: str
    user: str
    role: str
    attempt_id: str
    active: bool


class SnapshotRunRegistry(Protocol):
    """Admissions (with fencing epochs and ownership) and principal leases; durable."""

    def admit(self, slot: TargetSlot, attempt_id: str) -> Admission:
        """Admit ``attempt_id`` for ``slot`` (or return its existing admission).

        A new admission reserves the slot's next epoch; storing the run's PREPARED
        intent takes it (``activated``), which fences every older run of the slot out
        and makes older ACTIVE runs RETIRING. Refuses (``slot_blocked``) while a record
        of the slot is EXCHANGE_INTENT or COMMIT_UNKNOWN.
        """
        ...

    def admission(self, attempt_id: str) -> Admission | None:
        """The admission of ``attempt_id``, if any."""
        ...

    def current_epoch(self, slot: TargetSlot) -> int:
        """The slot's current epoch (0 before any admission)."""
        ...

    def set_ownership(self, parent_request: str, state: OwnershipState) -> None:
        """Move a run's ownership (ACTIVE -> RETIRING -> RETIRED only)."""
        ...

    def lease(self, role: str, candidates: tuple[str, ...], attempt_id: str) -> Lease:
        """Lease the first candidate user without an active lease (``pool_exhausted``)."""
        ...

    def end_lease(self, lease_id: str) -> Lease:
        """End a lease (idempotent); returns it as stored now."""
        ...

    def get_lease(self, lease_id: str) -> Lease:
        """A lease as stored now (``lease_not_found``)."""
        ...

    def leases_of(self, attempt_id: str) -> list[Lease]:
        """Every lease ever issued to ``attempt_id``, oldest first."""
        ...


# ---------------------------------------------------------------------- store


@dataclass(frozen=True)
class StoredSnapshot:
    """An intent's canonical original bytes and its current record's bytes."""

    intent_sha256: str
    intent_bytes: bytes
    record_bytes: bytes
    revision: int


@dataclass(frozen=True)
class HistoryEntry:
    """One line of a record's history: a transition (new revision) or an observation."""

    sequence: int
    revision: int
    state: str
    record_sha256: str | None  # None for an observation that changed no record
    at: str  # UTC, ISO 8601
    facts: Mapping[str, Any]
    # The exact canonical bytes of the revision it made (None for an observation, and for
    # a transition stored before the store kept bytes).
    record_bytes: bytes | None = None


@dataclass(frozen=True)
class StepNote:
    """A durable note of a step taken before any record exists (e.g. a first CREATE)."""

    sequence: int
    key: str
    at: str  # UTC, ISO 8601
    facts: Mapping[str, Any]


# ---------------------------------------------------------------------- catalog


@dataclass(frozen=True)
class Blocker:
    """A side effect the publisher does not handle; ``reason`` is a stable code."""

    reason: str
    detail: str


@dataclass(frozen=True)
class TableObservation:
    """One table as the server shows it now, never cached."""

    database: str
    name: str
    uuid: str
    engine: str
    design: Mapping[str, Any]  # ordered columns, keys, TTL, settings...; comments excluded
    design_sha256: str
    rows: int  # SELECT count(), never an estimate
    content_digest: str  # order-independent digest computed by the server (32 hex)
    total_bytes: int  # a missing byte observation raises, never 0
    parts: int
    blockers: tuple[Blocker, ...]


@dataclass(frozen=True)
class CatalogObservation:
    """Both names of one publication: the target slot and the generation table."""

    target: TableObservation | None  # None: the name does not exist (proven)
    generation: TableObservation | None
    retained_bytes: int  # the target and every retained generation of the slot
    observed_at: str
    # Who could write a name that does not exist yet, once it does (a grant on its
    # database, a Buffer over it): what a check before the export refuses, so that the
    # generation's prepare does not meet it after the export and the stage.
    absent_writers: tuple[Blocker, ...] = ()


@dataclass(frozen=True)
class ExchangeEvent:
    """One ``system.query_log`` row of an exchange query id."""

    type: str  # QueryStart, QueryFinish, ExceptionBeforeStart, ExceptionWhileProcessing
    exception_code: int
    user: str
    event_time: str


# ---------------------------------------------------------------------- executor


@dataclass(frozen=True)
class DispatchResult:
    """The answer to one executor call."""

    outcome: DispatchOutcome
    query_id: str
    session_id: str | None
    clickhouse_code: int | None = None
    error_code: str | None = None


# ---------------------------------------------------------------------- the ports


class SnapshotPublicationAuthority(Protocol):
    """Reopens the original evidence, issues and closes principals, proves quiescence."""

    def reopen(self, attempt: AttemptRef, generation_ref: str) -> PublicationEvidence:
        """Admit (or find the admission of) the attempt for its slot and reopen its evidence.

        Reads the journal from disk, verifies its chain, requires that its final event
        is ``staged`` and that ``generation_ref`` is exactly that event's SHA-256, and
        reopens the receipt it binds. Raises ``evidence_unverified`` or
        ``attempt_fenced``; never trusts a caller-supplied object.
        """
        ...

    def close_principal(self, principal: PrincipalRef) -> ClosureProof:
        """End the principal's lease, stop its queries and prove the server quiescent.

        One empty process sample is not proof; the HTTP session gate of the principal's
        sessions is probed; the proof records which strength was reached.
        """
        ...

    def issue_publisher(self, evidence: PublicationEvidence) -> PrincipalRef:
        """Lease a publisher principal distinct from the ingest principal."""
        ...

    def publisher_credentials(self, intent: SnapshotIntent) -> IssuedPrincipal:
        """The exact publisher bound in ``intent``, only while its lease is active."""
        ...

    def principal_credentials(self, principal: PrincipalRef) -> IssuedPrincipal:
        """The credentials of an issued ``principal``, only while its lease is active.

        A first publication's CREATE of the empty target runs as the publisher before
        any intent exists, so :meth:`publisher_credentials` cannot serve it.
        """
        ...

    def recheck(self, intent: SnapshotIntent) -> ParentAuthority:
        """The run is still admitted, not fenced and ACTIVE; returns the CAS authority."""
        ...

    def ownership(self, intent: SnapshotIntent) -> OwnershipState:
        """The run's current ownership of its slot (ACTIVE, RETIRING or RETIRED)."""
        ...


class SnapshotPublicationStore(Protocol):
    """Durable records: canonical originals, revisions, history, compare-and-set."""

    def create(self, intent_bytes: bytes, record_bytes: bytes, authority: ParentAuthority) -> None:
        """Persist a new intent with its PREPARED record; refuse an existing intent
        (``intent_exists``) and a second intent of the same run (``attempt_used``)."""
        ...

    def load(self, intent_sha256: str) -> StoredSnapshot:
        """The stored intent and current record (``snapshot_not_found`` when absent)."""
        ...

    def compare_and_set(
        self,
        intent_sha256: str,
        *,
        expected: bytes,
        replacement: bytes,
        authority: ParentAuthority,
        facts: Mapping[str, Any],
    ) -> None:
        """Atomically replace ``expected`` (exact bytes, its revision) by ``replacement``.

        The parent authority is checked in the same transaction. Raises ``claim_lost``
        when the stored bytes or the authority differ (nothing was written) and
        ``claim_uncertain`` when the commit's outcome is not known.
        """
        ...

    def read_back(self, intent_sha256: str) -> bytes:
        """The current record bytes through a fresh, independent connection."""
        ...

    def observe(self, intent_sha256: str, facts: Mapping[str, Any]) -> None:
        """Append an observation to the history without changing the record."""
        ...

    def history(self, intent_sha256: str) -> list[HistoryEntry]:
        """The full history of one intent, oldest first."""
        ...

    def note_step(self, key: str, facts: Mapping[str, Any]) -> StepNote:
        """Durably append a step note under ``key`` before any intent exists; return after commit.

        The first publication's CREATE of the empty target is noted here, keyed by its
        query id (``create_target_query_id(generation_ref)``), before it is dispatched,
        so that a crash between the CREATE and PREPARED leaves a trace. Notes are
        append-only; ``facts`` is canonical-JSON-ready.
        """
        ...

    def step_notes(self, key: str) -> list[StepNote]:
        """Every note under ``key``, oldest first (empty when there is none)."""
        ...


@dataclass(frozen=True)
class RecordedPresence:
    """Where the server reached now holds what an intent recorded, by UUID, under any name.

    ``server_id``: the server's identity now (as staging records it). ``named_uuid``: the
    UUID of the database under the recorded name now (None: there is none).
    ``database_found``: a database with the recorded UUID exists (under any name).
    ``tables_found``: which of the recorded table UUIDs (A, B) some database holds.
    """

    server_id: str
    named_uuid: str | None
    database_found: bool
    tables_found: tuple[str, ...]


class ClickHouseSnapshotCatalog(Protocol):
    """A fresh observation of the publication's two names; never partial, never cached."""

    def observe(self, slot: TargetSlot, generation_table: str) -> CatalogObservation:
        """Names, UUIDs, full physical design, side effects, B's content, byte counters."""
        ...

    def identities(self, slot: TargetSlot, generation_table: str) -> CatalogObservation:
        """What a reconcile decides by (names, UUIDs, designs, rows, content digests),
        read as :meth:`observe` reads them; side effects and byte counters not observed."""
        ...

    def exchange_events(self, query_id: str) -> list[ExchangeEvent]:
        """Every query-log row of ``query_id`` (after a log flush); raises if unobservable."""
        ...

    def database_uuid(self, database: str) -> str | None:
        """The UUID of ``database`` on this server now (None: it does not exist)."""
        ...

    def recorded_presence(
        self, database: str, database_uuid: str, table_uuids: tuple[str, ...]
    ) -> RecordedPresence:
        """What the server holds now of ``database`` (its UUID under that name) and whether
        a database and tables of the recorded UUIDs exist anywhere on it, as one who sees
        every database sees it; raises when that is unobservable."""
        ...


class ClickHouseSnapshotExecutor(Protocol):
    """Dispatches internally rendered statements with issued credentials; never retries."""

    def create_target(
        self, slot: TargetSlot, generation_table: str, query_id: str, principal: IssuedPrincipal
    ) -> DispatchResult:
        """First publication: create the empty target with the generation's exact design."""
        ...

    def drop_created_target(
        self, slot: TargetSlot, table_uuid: str, query_id: str, principal: IssuedPrincipal
    ) -> DispatchResult:
        """A first prepare refused after its CREATE: drop that empty target, only while
        the name holds the table of ``table_uuid`` with no row."""
        ...

    def exchange(self, intent: SnapshotIntent, principal: IssuedPrincipal) -> DispatchResult:
        """``EXCHANGE TABLES target AND generation`` once, with the intent's query id,
        in the intent's HTTP session (the drain gate), serialized against closure."""
        ...
