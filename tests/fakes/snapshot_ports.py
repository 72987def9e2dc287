"""In-memory fakes of the four publication ports, for pure policy tests.

They satisfy the Protocols of :mod:`dpone.ports.composition_snapshot` (checked by mypy
through the typed fixtures in the tests) and model only what the policy depends on:

- :class:`FakeStore`: a real compare-and-set under a lock, parent-authority checks,
  append-only history and step notes, and fault hooks (commit then raise, busy,
  read-back missing or different, a crash after commit).
- :class:`FakeCatalog`: two names holding :class:`FakeTable` objects, a query log per
  query id; each part can be made unobservable.
- :class:`FakeExecutor`: EXCHANGE swaps the objects under the two names of the catalog
  and logs QueryStart/QueryFinish (like the server); scripted answers for faults.
- :class:`FakeAuthority`: admissions with slot epochs and ownership, a leased pool of
  publishers, closure proofs (proven or not), and a log of every call.

Every fake appends to one shared ``events`` list so a test can check the order of
steps across ports.
"""

from __future__ import annotations

import hashlib
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpone.contracts import canonical_json
from dpone.contracts.composition_snapshot import SnapshotIntent, SnapshotRecord, check_transition
from dpone.errors import StateError
from dpone.ports.clickhouse_request import Credentials
from dpone.ports.composition_snapshot import (
    AttemptEpochs,
    AttemptRef,
    Blocker,
    CatalogObservation,
    ClosureProof,
    ClosureStrength,
    DispatchOutcome,
    DispatchResult,
    ExchangeEvent,
    GenerationEvidence,
    HistoryEntry,
    IssuedPrincipal,
    OwnershipState,
    ParentAuthority,
    PrincipalRef,
    PublicationEvidence,
    RecordedPresence,
    SourceEvidence,
    StepNote,
    StoredSnapshot,
    TableObservation,
    TargetSlot,
)

AT = "2024-05-01T12:00:00.000000Z"
DATABASE = "dpone_pub"
TARGET = "orders"
GENERATION = "dpone_stage_orders_g1"
SLOT = TargetSlot(DATABASE, TARGET)
INGEST = PrincipalRef("dpone_ingest_1", "11111111-0000-4000-8000-000000000001", "lease-ingest")
DESIGN = "d" * 64


class FakeError(StateError):
    """A typed error raised by a fake port (the code says which)."""

    code = "fake_error"


class Crash(BaseException):
    """Stands for the process dying at a given step (not an error anyone handles)."""


def new_uuid() -> str:
    return str(uuid.uuid4())


# ---------------------------------------------------------------------- catalog


@dataclass
class FakeTable:
    """A table object: its identity and content travel with it through an EXCHANGE."""

    uuid: str
    rows: int
    content_digest: str
    design_sha256: str = DESIGN
    total_bytes: int = 1000
    blockers: tuple[Blocker, ...] = ()


class FakeCatalog:
    """Names -> table objects, and a query log; parts can be made unobservable."""

    def __init__(self, events: list[str]) -> None:
        self.events = events
        self.tables: dict[str, FakeTable] = {}
        self.log: dict[str, list[ExchangeEvent]] = {}
        self.retained_bytes = 1000
        self.observe_fails = False
        self.log_fails = False
        self.observations = 0
        self.lock = threading.Lock()

    def observe(self, slot: TargetSlot, generation_table: str) -> CatalogObservation:
        with self.lock:
            self.observations += 1
            self.events.append("catalog.observe")
            if self.observe_fails:
                raise FakeError("catalog unavailable", code="catalog_unobservable")
            return CatalogObservation(
                target=self._table(slot.table),
                generation=self._table(generation_table),
                retained_bytes=self.retained_bytes,
                observed_at=AT,
            )

    def identities(self, slot: TargetSlot, generation_table: str) -> CatalogObservation:
        """The same tables as :meth:`observe` (this double has no side effects to skip)."""
        return self.observe(slot, generation_table)

    def database_uuid(self, database: str) -> str | None:
        """Unknown to this double: the recorded-database check is the real catalog's."""
        raise FakeError("no database UUIDs here", code="catalog_unobservable")

    def recorded_presence(
        self, database: str, database_uuid: str, table_uuids: tuple[str, ...]
    ) -> RecordedPresence:
        """Unknown to this double, like the database UUIDs."""
        raise FakeError("no recorded presence here", code="catalog_unobservable")

    def _table(self, name: str) -> TableObservation | None:
        table = self.tables.get(name)
        if table is None:
            return None
        return TableObservation(
            database=DATABASE,
            name=name,
            uuid=table.uuid,
            engine="MergeTree",
            design={"columns": []},
            design_sha256=table.design_sha256,
            rows=table.rows,
            content_digest=table.content_digest,
            total_bytes=table.total_bytes,
            parts=1,
            blockers=table.blockers,
        )

    def exchange_events(self, query_id: str) -> list[ExchangeEvent]:
        with self.lock:
            self.events.append("catalog.exchange_events")
            if self.log_fails:
                raise FakeError("query log unavailable", code="catalog_unobservable")
            return list(self.log.get(query_id, []))

    def log_event(self, query_id: str, kind: str, code: int = 0) -> None:
        self.log.setdefault(query_id, []).append(ExchangeEvent(kind, code, "publisher", AT))


# ---------------------------------------------------------------------- executor


class FakeExecutor:
    """EXCHANGE swaps the catalog's two objects, like the server; ``mode`` scripts faults.

    Modes: ``ok``; ``refused`` (ClickHouse answers an error, nothing changes);
    ``lost_answer`` (it ran, the answer never arrived: UNKNOWN); ``crash_after_send``
    (it ran, then the process dies); ``raise`` (the executor raises after sending).
    """

    def __init__(self, catalog: FakeCatalog, events: list[str]) -> None:
        self.catalog = catalog
        self.events = events
        self.mode = "ok"
        self.exchanges: list[tuple[str, str]] = []  # (query id, user)
        self.creates: list[str] = []
        self.create_mode = "ok"
        self.before_exchange: Callable[[], None] | None = None

    def exchange(self, intent: SnapshotIntent, principal: IssuedPrincipal) -> DispatchResult:
        if self.before_exchange is not None:
            self.before_exchange()
        query_id = f"dpone-s00-{intent.sha256[:32]}-exchange"
        session = f"dpone-s00-{intent.sha256[:32]}-session"
        with self.catalog.lock:
            self.events.append("executor.exchange")
            self.exchanges.append((query_id, principal.credentials.user))
            if self.mode == "refused":
                self.catalog.log_event(query_id, "ExceptionBeforeStart", 60)
                return DispatchResult(DispatchOutcome.REFUSED, query_id, session, 60, "server")
            tables = self.catalog.tables
            target, generation = intent.target_table, intent.generation_table
            tables[target], tables[generation] = tables[generation], tables[target]
            self.catalog.log_event(query_id, "QueryStart")
            self.catalog.log_event(query_id, "QueryFinish")
        if self.mode == "crash_after_send":
            raise Crash("died after sending the EXCHANGE")
        if self.mode == "raise":
            raise FakeError("connection reset after send", code="outcome_unknown")
        if self.mode == "lost_answer":
            return DispatchResult(DispatchOutcome.UNKNOWN, query_id, session)
        return DispatchResult(DispatchOutcome.ACKNOWLEDGED, query_id, session)

    def create_target(
        self, slot: TargetSlot, generation_table: str, query_id: str, principal: IssuedPrincipal
    ) -> DispatchResult:
        self.events.append("executor.create_target")
        self.creates.append(query_id)
        if self.create_mode == "refused":
            return DispatchResult(DispatchOutcome.REFUSED, query_id, None, 57, "server")
        source = self.catalog.tables[generation_table]
        self.catalog.tables[slot.table] = FakeTable(
            uuid=new_uuid(),
            rows=0,
            content_digest="0" * 32,
            design_sha256=source.design_sha256,
            total_bytes=0,
        )
        return DispatchResult(DispatchOutcome.ACKNOWLEDGED, query_id, None)

    def drop_created_target(
        self, slot: TargetSlot, table_uuid: str, query_id: str, principal: IssuedPrincipal
    ) -> DispatchResult:
        self.events.append("executor.drop_created_target")
        table = self.catalog.tables.get(slot.table)
        if table is None or table.uuid != table_uuid or table.rows != 0:
            return DispatchResult(DispatchOutcome.NOT_SENT, query_id, None, None, "target_not_ours")
        del self.catalog.tables[slot.table]
        return DispatchResult(DispatchOutcome.ACKNOWLEDGED, query_id, None)


# ---------------------------------------------------------------------- authority


@dataclass
class FakeRun:
    parent_request: str
    attempt_id: str
    slot_epoch: int
    attempt_epoch: int
    ownership: OwnershipState = OwnershipState.ACTIVE


@dataclass
class FakeLease:
    lease_id: str
    user: str
    user_uuid: str
    active: bool = True


class FakeAuthority:
    """Admissions, epochs, a leased publisher pool, closure proofs; every call logged."""

    def __init__(self, events: list[str], generation: GenerationEvidence) -> None:
        self.events = events
        self.calls: list[str] = []
        self.slot_epoch = 1
        self.runs: dict[str, FakeRun] = {"req-1": FakeRun("req-1", "attempt-1", 1, 1)}
        self.current = "req-1"
        self.generation = generation
        self.pool = [f"dpone_publisher_{i}" for i in range(1, 5)]
        self.leases: dict[str, FakeLease] = {
            INGEST.lease_id: FakeLease(INGEST.lease_id, INGEST.user, INGEST.user_uuid)
        }
        self.closure_proven = True
        self.closure_raises = False
        self.closure_facts: dict[str, Any] = {"samples": 3}
        self.closed: list[str] = []  # lease ids, in order
        self.lock = threading.Lock()

    def _call(self, name: str) -> None:
        with self.lock:
            self.calls.append(name)
            self.events.append(f"authority.{name}")

    # evidence -----------------------------------------------------------------

    def evidence(self) -> PublicationEvidence:
        run = self.runs[self.current]
        return PublicationEvidence(
            parent_request=run.parent_request,
            attempt_id=run.attempt_id,
            epochs=AttemptEpochs(run.slot_epoch, run.attempt_epoch),
            slot=SLOT,
            endpoint={
                "server_id": "server-1",
                "server_id_source": "dpone_identity",
                "database": DATABASE,
                "database_uuid": "22222222-0000-4000-8000-000000000002",
                "database_engine": "Atomic",
            },
            generation=self.generation,
            source=SourceEvidence("e" * 64, self.generation.rows, 4096),
            ingest=INGEST,
        )

    def reopen(self, attempt: AttemptRef, generation_ref: str) -> PublicationEvidence:
        self._call("reopen")
        if generation_ref != self.generation.staged_event_sha256:
            raise FakeError("not the staged event", code="evidence_unverified")
        return self.evidence()

    # principals ---------------------------------------------------------------

    def issue_publisher(self, evidence: PublicationEvidence) -> PrincipalRef:
        self._call("issue_publisher")
        with self.lock:
            busy = {lease.user for lease in self.leases.values() if lease.active}
            free = [user for user in self.pool if user not in busy]
            if not free:
                raise FakeError("no publisher free", code="pool_exhausted")
            user = free[0]
            lease = FakeLease(f"lease-{len(self.leases)}", user, _user_uuid(user))
            self.leases[lease.lease_id] = lease
        return PrincipalRef(lease.user, lease.user_uuid, lease.lease_id)

    def close_principal(self, principal: PrincipalRef) -> ClosureProof:
        self._call("close_principal")
        with self.lock:
            self.closed.append(principal.lease_id)
            self.leases[principal.lease_id].active = False
        if self.closure_raises:
            raise FakeError("closure could not be observed", code="closure_unproven")
        return ClosureProof(
            principal, self.closure_proven, ClosureStrength.CUSTODIAL, dict(self.closure_facts)
        )

    def principal_credentials(self, principal: PrincipalRef) -> IssuedPrincipal:
        self._call("principal_credentials")
        return self._credentials(principal.lease_id)

    def publisher_credentials(self, intent: SnapshotIntent) -> IssuedPrincipal:
        self._call("publisher_credentials")
        return self._credentials(intent.publisher.lease_id)

    def _credentials(self, lease_id: str) -> IssuedPrincipal:
        lease = self.leases[lease_id]
        if not lease.active:
            raise FakeError(f"lease {lease_id} has ended", code="lease_not_active")
        ref = PrincipalRef(lease.user, lease.user_uuid, lease.lease_id)
        return IssuedPrincipal(ref, Credentials(lease.user, "secret"))

    # runs ---------------------------------------------------------------------

    def recheck(self, intent: SnapshotIntent) -> ParentAuthority:
        self._call("recheck")
        parent = ParentAuthority(intent.request_id, SLOT, intent.slot_epoch)
        problem = self.problem(parent, allow_retiring=False)
        if problem is not None:
            raise FakeError(f"refused: {problem}", code=problem)
        return parent

    def ownership(self, intent: SnapshotIntent) -> OwnershipState:
        self._call("ownership")
        return self.runs[intent.request_id].ownership

    def problem(self, parent: ParentAuthority, *, allow_retiring: bool) -> str | None:
        """Why ``parent`` may not write now (a code), or None (used by the store too)."""
        run = self.runs.get(parent.parent_request)
        if run is None or run.slot_epoch != parent.slot_epoch or self.slot_epoch != run.slot_epoch:
            return "attempt_fenced"
        allowed = {OwnershipState.ACTIVE} | ({OwnershipState.RETIRING} if allow_retiring else set())
        return None if run.ownership in allowed else "ownership_not_active"

    def admit_newer(self) -> str:
        """A newer attempt is admitted: the slot's epoch moves, the older run retires."""
        self.runs[self.current].ownership = OwnershipState.RETIRING
        self.slot_epoch += 1
        request = f"req-{self.slot_epoch}"
        self.runs[request] = FakeRun(request, f"attempt-{self.slot_epoch}", self.slot_epoch, 2)
        self.current = request
        return request


def _user_uuid(user: str) -> str:
    return str(uuid.UUID(bytes=hashlib.sha256(user.encode()).digest()[:16], version=4))


# ---------------------------------------------------------------------- store


@dataclass
class _Entry:
    intent_bytes: bytes
    record_bytes: bytes
    revision: int
    parent_request: str


@dataclass
class StoreFaults:
    """One-shot faults of the next compare-and-set / read-back."""

    commit_then_raise: bool = False  # commit, then report claim_uncertain
    crash_after_commit: bool = False  # commit, then the process dies
    busy: bool = False  # nothing written, outcome reported as claim_uncertain
    readback: Callable[[bytes], bytes | None] | None = None  # None -> missing
    create_uncertain: bool = False  # create commits, then reports prepare_uncertain


@dataclass
class FakeStore:
    """Records under a lock: a real compare-and-set of exact bytes and revision."""

    authority: FakeAuthority
    events: list[str]
    entries: dict[str, _Entry] = field(default_factory=dict)
    histories: dict[str, list[HistoryEntry]] = field(default_factory=dict)
    notes: dict[str, list[StepNote]] = field(default_factory=dict)
    faults: StoreFaults = field(default_factory=StoreFaults)
    lock: threading.Lock = field(default_factory=threading.Lock)
    sequence: int = 0

    def create(self, intent_bytes: bytes, record_bytes: bytes, authority: ParentAuthority) -> None:
        intent = SnapshotIntent.from_bytes(intent_bytes)
        record = SnapshotRecord.from_bytes(record_bytes)
        check_transition(None, None, record.state, record.revision)
        with self.lock:
            self.events.append("store.create")
            if intent.sha256 in self.entries:
                raise FakeError("intent exists", code="intent_exists")
            problem = self.authority.problem(authority, allow_retiring=False)
            if problem is not None:
                raise FakeError(f"refused: {problem}", code=problem)
            self.entries[intent.sha256] = _Entry(intent_bytes, record_bytes, 1, intent.request_id)
            self._history(intent.sha256, record, {})
        if self.faults.create_uncertain:
            self.faults.create_uncertain = False
            raise FakeError("commit outcome unknown", code="prepare_uncertain")

    def load(self, intent_sha256: str) -> StoredSnapshot:
        with self.lock:
            entry = self._entry(intent_sha256)
            return StoredSnapshot(
                intent_sha256, entry.intent_bytes, entry.record_bytes, entry.revision
            )

    def compare_and_set(
        self,
        intent_sha256: str,
        *,
        expected: bytes,
        replacement: bytes,
        authority: ParentAuthority,
        facts: Mapping[str, Any],
    ) -> None:
        old, new = SnapshotRecord.from_bytes(expected), SnapshotRecord.from_bytes(replacement)
        check_transition(old.state, old.revision, new.state, new.revision)
        faults = self.faults
        with self.lock:
            self.events.append(f"store.cas:{new.state.value}")
            if faults.busy:
                faults.busy = False
                raise FakeError("database is locked", code="claim_uncertain")
            entry = self._entry(intent_sha256)
            if entry.record_bytes != expected or entry.revision != old.revision:
                raise FakeError("stale record", code="claim_lost", reason="stale_record")
            claimed = old.state.value in ("exchange_intent", "commit_unknown")
            problem = self.authority.problem(authority, allow_retiring=claimed)
            if problem is not None or authority.parent_request != entry.parent_request:
                raise FakeError("authority refused", code="claim_lost", reason=problem)
            entry.record_bytes, entry.revision = replacement, new.revision
            self._history(intent_sha256, new, facts)
        if faults.commit_then_raise:
            faults.commit_then_raise = False
            raise FakeError("commit acknowledgment lost", code="claim_uncertain")
        if faults.crash_after_commit:
            faults.crash_after_commit = False
            raise Crash("died right after the commit")

    def read_back(self, intent_sha256: str) -> bytes:
        with self.lock:
            self.events.append("store.read_back")
            data: bytes | None = self._entry(intent_sha256).record_bytes
        hook, self.faults.readback = self.faults.readback, None
        if hook is not None:
            data = hook(data or b"")
        if data is None:
            raise FakeError("record not found on read-back", code="snapshot_not_found")
        return data

    def observe(self, intent_sha256: str, facts: Mapping[str, Any]) -> None:
        with self.lock:
            self.events.append("store.observe")
            entry = self._entry(intent_sha256)
            record = SnapshotRecord.from_bytes(entry.record_bytes)
            self.sequence += 1
            self.histories[intent_sha256].append(
                HistoryEntry(
                    self.sequence, record.revision, record.state.value, None, AT, _canonical(facts)
                )
            )

    def history(self, intent_sha256: str) -> list[HistoryEntry]:
        with self.lock:
            self._entry(intent_sha256)
            return list(self.histories[intent_sha256])

    def note_step(self, key: str, facts: Mapping[str, Any]) -> StepNote:
        with self.lock:
            self.events.append("store.note_step")
            self.sequence += 1
            note = StepNote(self.sequence, key, AT, _canonical(facts))
            self.notes.setdefault(key, []).append(note)
            return note

    def step_notes(self, key: str) -> list[StepNote]:
        with self.lock:
            return list(self.notes.get(key, []))

    def _entry(self, intent_sha256: str) -> _Entry:
        entry = self.entries.get(intent_sha256)
        if entry is None:
            raise FakeError(f"no snapshot {intent_sha256}", code="snapshot_not_found")
        return entry

    def _history(
        self, intent_sha256: str, record: SnapshotRecord, facts: Mapping[str, Any]
    ) -> None:
        self.sequence += 1
        self.histories.setdefault(intent_sha256, []).append(
            HistoryEntry(
                self.sequence,
                record.revision,
                record.state.value,
                record.sha256,
                AT,
                _canonical(facts),
            )
        )


def _canonical(facts: Mapping[str, Any]) -> Mapping[str, Any]:
    # Like a real store: facts must be canonical JSON, and what is kept is a copy.
    loaded: Mapping[str, Any] = canonical_json.loads(canonical_json.dumps(dict(facts)))
    return loaded


# ---------------------------------------------------------------------- a world


@dataclass
class World:
    """Every fake wired together around one staged generation and an existing target A."""

    events: list[str]
    catalog: FakeCatalog
    executor: FakeExecutor
    authority: FakeAuthority
    store: FakeStore
    a_uuid: str
    b_uuid: str
    generation_ref: str
    attempt: AttemptRef

    @classmethod
    def build(cls, *, rows: int = 3, target_exists: bool = True) -> World:
        events: list[str] = []
        b_uuid, a_uuid = new_uuid(), new_uuid()
        digest = hashlib.sha256(b"rows-%d" % rows).hexdigest()[:32]
        generation_ref = hashlib.sha256(b"staged-event").hexdigest()
        generation = GenerationEvidence(
            table=GENERATION,
            table_uuid=b_uuid,
            staged_event_sha256=generation_ref,
            semantic_id="semantic-1",
            rows=rows,
            rowbinary_bytes=2048,
            rows_digest=digest,
        )
        catalog = FakeCatalog(events)
        catalog.tables[GENERATION] = FakeTable(b_uuid, rows, digest)
        if target_exists:
            catalog.tables[TARGET] = FakeTable(a_uuid, 7, "a" * 32)
        authority = FakeAuthority(events, generation)
        return cls(
            events=events,
            catalog=catalog,
            executor=FakeExecutor(catalog, events),
            authority=authority,
            store=FakeStore(authority, events),
            a_uuid=a_uuid,
            b_uuid=b_uuid,
            generation_ref=generation_ref,
            attempt=AttemptRef(Path("/nonexistent/attempt"), SLOT),
        )
