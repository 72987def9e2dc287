"""The store's one public facade, :class:`SnapshotStore`, and :func:`open_store`.

The facade owns one connections object
(:class:`~dpone.publication.store.connections.StoreConnections`, SQLite's or
PostgreSQL's) and one object per part, each given those connections
(:class:`SnapshotRecords`, :class:`StepNotes`, :class:`RunAdmission`,
:class:`PrincipalLeases`, :class:`SlotRetirement`), and delegates every public method to
the part that holds it. It is also the store's fault seams
(:meth:`SnapshotStore._before_commit` and the others), which a test's subclass overrides
to inject a fault at that exact point; :class:`SqliteSnapshotStore` and
:class:`PostgresSnapshotStore` only choose the connections object. See
docs/architecture.md ("A kind of store record").
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from dpone.ports.composition_snapshot import (
    Admission,
    HistoryEntry,
    Lease,
    OwnershipState,
    ParentAuthority,
    StepNote,
    StoredSnapshot,
    TargetSlot,
)
from dpone.publication.store.admission import RunAdmission
from dpone.publication.store.chain import ChainCheck
from dpone.publication.store.connections import (
    BUSY_TIMEOUT_SECONDS,
    SqliteConnections,
    StoreConnection,
    StoreConnections,
)
from dpone.publication.store.errors import SnapshotStoreError
from dpone.publication.store.leases import LeaseRecord, PrincipalLeases
from dpone.publication.store.postgres import PostgresConnections, is_store_url
from dpone.publication.store.records import SnapshotRecords, SnapshotSummary
from dpone.publication.store.retirement import SlotRetirement
from dpone.publication.store.steps import StepNotes

# A store's location: a SQLite file's path, or a ``postgresql://`` URL.
StoreLocation = Path | str


class SnapshotStore:
    """Publication records, their history and the run registry in one store.

    Tests may subclass and override :meth:`_before_commit`, :meth:`_after_commit` and
    :meth:`_after_read_back` to inject faults at those exact points.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout: float = BUSY_TIMEOUT_SECONDS,
        create: bool = True,
    ) -> None:
        """Open (``create``: and create if missing) the SQLite store at ``path``.

        With ``create=False`` a missing file, or one that holds no store yet, is
        ``store_missing`` and nothing is created or written.
        """
        self._assemble(
            SqliteConnections(path, busy_timeout=busy_timeout, create=create, hooks=self)
        )

    def _assemble(self, connections: StoreConnections) -> None:
        """Own ``connections`` and the parts that read and write through them."""
        self._connections = connections
        self._records = SnapshotRecords(connections, hooks=self)
        self._steps = StepNotes(connections)
        self._runs = RunAdmission(connections)
        self._leases = PrincipalLeases(connections)
        self._retirement = SlotRetirement(connections)

    # ------------------------------------------------------------------ fault seams

    def _before_commit(self, operation: str) -> None:
        """Called inside the transaction just before ``COMMIT`` (test seam)."""

    def _after_commit(self, operation: str) -> None:
        """Called right after ``COMMIT`` returned; raising here models a lost answer."""

    def _after_read_back(self, intent_sha256: str, data: bytes | None) -> bytes | None:
        """Called with what the fresh connection read (test seam); returns what to report."""
        return data

    # ------------------------------------------------------------------ connections

    @property
    def path(self) -> Path:
        """The store's file (a PostgreSQL store's URL as a path, only for messages)."""
        return self._connections.path

    @property
    def busy_timeout(self) -> float:
        """How long a call waits for another writer, in seconds."""
        return self._connections.busy_timeout

    @property
    def location(self) -> str:
        """Where the store is, for messages and ownership markers (never a secret)."""
        return self._connections.location

    def _connect(self, operation: str) -> Any:
        """A connection of the store, outside any transaction (for tests)."""
        return self._connections.connect(operation)

    def _reading(self, operation: str) -> AbstractContextManager[StoreConnection]:
        """A read-only snapshot on a fresh connection (for tests)."""
        return self._connections.reading(operation)

    def _fresh(self, operation: str) -> AbstractContextManager[StoreConnection]:
        """A new connection of its own, outside any transaction (for tests)."""
        return self._connections.fresh(operation)

    def _write(self, operation: str, uncertain: str) -> AbstractContextManager[StoreConnection]:
        """One unit of work, committed when the block succeeds (for tests)."""
        return self._connections.write(operation, uncertain)

    # ------------------------------------------------------------------ records

    def create(self, intent_bytes: bytes, record_bytes: bytes, authority: ParentAuthority) -> None:
        """Persist a new intent with its PREPARED record (:meth:`SnapshotRecords.create`)."""
        self._records.create(intent_bytes, record_bytes, authority)

    def load(self, intent_sha256: str) -> StoredSnapshot:
        """The stored intent and current record (``snapshot_not_found`` when absent)."""
        return self._records.load(intent_sha256)

    def intent_keys(
        self, database: str | None = None, *, attempt_id: str | None = None
    ) -> list[str]:
        """The digests of the intents (of ``database``; of the run of ``attempt_id``):
        :meth:`SnapshotRecords.intent_keys`."""
        return self._records.intent_keys(database, attempt_id=attempt_id)

    def intent_bytes(self, keys: Sequence[str]) -> dict[str, bytes]:
        """The bytes of these intents (:meth:`SnapshotRecords.intent_bytes`)."""
        return self._records.intent_bytes(keys)

    def list_snapshots(self, slot: TargetSlot | None = None) -> list[SnapshotSummary]:
        """Every intent (of ``slot``) with its state (:meth:`SnapshotRecords.list_snapshots`)."""
        return self._records.list_snapshots(slot)

    def compare_and_set(
        self,
        intent_sha256: str,
        *,
        expected: bytes,
        replacement: bytes,
        authority: ParentAuthority,
        facts: Mapping[str, Any],
    ) -> None:
        """Replace ``expected`` by ``replacement`` atomically
        (:meth:`SnapshotRecords.compare_and_set`)."""
        self._records.compare_and_set(
            intent_sha256,
            expected=expected,
            replacement=replacement,
            authority=authority,
            facts=facts,
        )

    def read_back(self, intent_sha256: str) -> bytes:
        """The current record bytes through a fresh, independent connection."""
        return self._records.read_back(intent_sha256)

    def observe(self, intent_sha256: str, facts: Mapping[str, Any]) -> None:
        """Append an observation (no record change) at the record's current revision."""
        self._records.observe(intent_sha256, facts)

    def verify_chain(self, intent_sha256: str) -> ChainCheck:
        """Re-verify the intent's chain from the bytes its history keeps."""
        return self._records.verify_chain(intent_sha256)

    def history(self, intent_sha256: str) -> list[HistoryEntry]:
        """The full history of one intent, oldest first (``snapshot_not_found``)."""
        return self._records.history(intent_sha256)

    # ------------------------------------------------------------------ step notes

    def note_step(self, key: str, facts: Mapping[str, Any]) -> StepNote:
        """Durably note a step before any record exists (:meth:`StepNotes.note_step`)."""
        return self._steps.note_step(key, facts)

    def step_notes(self, key: str) -> list[StepNote]:
        """Every note of ``key``, oldest first."""
        return self._steps.step_notes(key)

    def store_identity(self) -> str:
        """This store's identity: a UUID made once (:meth:`StepNotes.store_identity`)."""
        return self._steps.store_identity()

    # ------------------------------------------------------------------ run admission

    def admit(self, slot: TargetSlot, attempt_id: str) -> Admission:
        """Admit ``attempt_id`` for ``slot`` or return its existing admission
        (:meth:`RunAdmission.admit`)."""
        return self._runs.admit(slot, attempt_id)

    def admission(self, attempt_id: str) -> Admission | None:
        """The admission of ``attempt_id``, if any."""
        return self._runs.admission(attempt_id)

    def current_epoch(self, slot: TargetSlot) -> int:
        """The slot's current epoch (0 before any admission)."""
        return self._runs.current_epoch(slot)

    def set_ownership(self, parent_request: str, state: OwnershipState) -> None:
        """Move a run's ownership one step forward (setting the current one is a no-op)."""
        self._runs.set_ownership(parent_request, state)

    # ------------------------------------------------------------------ principal leases

    def lease(self, role: str, candidates: tuple[str, ...], attempt_id: str) -> Lease:
        """Lease the first candidate without an active lease (``pool_exhausted``)."""
        return self._leases.lease(role, candidates, attempt_id)

    def end_lease(self, lease_id: str) -> Lease:
        """End a lease (idempotent); returns it as stored now."""
        return self._leases.end_lease(lease_id)

    def end_lease_of_gone_holder(
        self, lease_id: str, facts: Mapping[str, Any]
    ) -> tuple[Lease, bool]:
        """End an operator-proven abandoned lease and note why, in one transaction
        (:meth:`PrincipalLeases.end_lease_of_gone_holder`)."""
        return self._leases.end_lease_of_gone_holder(lease_id, facts)

    def lease_records(self, *, active_only: bool = True) -> list[LeaseRecord]:
        """Leases (by default the active ones), oldest first, with their holder process."""
        return self._leases.lease_records(active_only=active_only)

    def last_lease_records(self) -> list[LeaseRecord]:
        """Each pool user's last lease (active or ended), oldest first, with its holder."""
        return self._leases.last_lease_records()

    def last_lease_ends(self) -> dict[str, str]:
        """When each pool user's last ended lease ended (users with none are absent)."""
        return self._leases.last_lease_ends()

    def lease_record(self, lease_id: str) -> tuple[LeaseRecord, bool] | None:
        """One lease with its holder, and whether its user was leased again after it."""
        return self._leases.lease_record(lease_id)

    def closure_proven(self, lease: Lease) -> bool:
        """Whether the last closure noted for ``lease`` was proven (False: none noted)."""
        return self._leases.closure_proven(lease)

    def get_lease(self, lease_id: str) -> Lease:
        """A lease as stored now (``lease_not_found``)."""
        return self._leases.get_lease(lease_id)

    def leases_of(self, attempt_id: str) -> list[Lease]:
        """Every lease ever issued to ``attempt_id``, oldest first."""
        return self._leases.leases_of(attempt_id)

    # ------------------------------------------------------------------ slot retirement

    def begin_retirement(self, slot: TargetSlot, facts: Mapping[str, Any]) -> StepNote:
        """Fence the slot and note ``retire_begun`` (:meth:`SlotRetirement.begin_retirement`)."""
        return self._retirement.begin_retirement(slot, facts)

    def end_retirement(self, slot: TargetSlot, facts: Mapping[str, Any]) -> StepNote:
        """Note ``retired`` and retire the fenced runs (an ended retirement is returned)."""
        return self._retirement.end_retirement(slot, facts)

    def retirement_notes(self) -> dict[TargetSlot, list[StepNote]]:
        """Every slot's retirement notes, oldest first."""
        return self._retirement.retirement_notes()


class SqliteSnapshotStore(SnapshotStore):
    """The store in one SQLite file (the embedded default)."""


class PostgresSnapshotStore(SnapshotStore):
    """The store in a PostgreSQL database, shared by the workers of a project
    (:mod:`~dpone.publication.store.postgres`)."""

    def __init__(
        self,
        url: str,
        *,
        busy_timeout: float = BUSY_TIMEOUT_SECONDS,
        create: bool = True,
    ) -> None:
        """Open (``create``: and create if missing) the store in the database ``url`` names.

        With ``create=False`` a database without the store's schema is ``store_missing``
        and nothing is created.
        """
        self._postgres = PostgresConnections(
            url, busy_timeout=busy_timeout, create=create, hooks=self
        )
        self._assemble(self._postgres)

    @property
    def url(self) -> str:
        """The store's URL (never with a password)."""
        return self._postgres.url


def open_store(
    location: StoreLocation | os.PathLike[str],
    *,
    create: bool = True,
    busy_timeout: float = BUSY_TIMEOUT_SECONDS,
) -> SnapshotStore:
    """The store at ``location``: a ``postgresql://`` URL's database, else a SQLite file."""
    if isinstance(location, str) and is_store_url(location):
        return PostgresSnapshotStore(location, create=create, busy_timeout=busy_timeout)
    return SqliteSnapshotStore(Path(location), create=create, busy_timeout=busy_timeout)


def store_exists(location: StoreLocation) -> bool:
    """Whether a store is at ``location`` (a file; a database with the store's schema).

    A PostgreSQL server that cannot be reached raises: it is said, never read as "none".
    """
    if isinstance(location, str) and is_store_url(location):
        try:
            PostgresSnapshotStore(location, create=False)
        except SnapshotStoreError as exc:
            if exc.code == "store_missing":
                return False
            raise
        return True
    return Path(location).exists()


def store_argument(value: str | os.PathLike[str]) -> StoreLocation:
    """A ``--store`` value: a ``postgresql://`` URL as given, anything else a path."""
    if isinstance(value, str) and is_store_url(value):
        return value
    return Path(value)
