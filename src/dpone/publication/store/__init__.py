"""The SQLite snapshot store: publication records, their history and the run registry.

:class:`SqliteSnapshotStore` implements both
:class:`~dpone.ports.composition_snapshot.SnapshotPublicationStore` and
:class:`~dpone.ports.composition_snapshot.SnapshotRunRegistry` in one SQLite file, so
that a compare-and-set can recheck the parent authority (the run, its slot epoch and
its ownership) in the same transaction that writes the record.

The file is created ``0600`` (a missing parent directory is created ``0700``; an
existing one is left as it is) unless the store is opened with ``create=False``: a
command that only reads or continues existing records then fails with
``store_missing`` naming the path, and creates nothing. The store runs in WAL mode
with ``synchronous=FULL`` and a busy timeout, and identifies itself with ``PRAGMA
application_id`` and ``PRAGMA user_version`` (:data:`SCHEMA_VERSION`). A file that is
not SQLite, or another application's database, is refused and never modified.

Layout (every ``at`` is UTC ISO 8601, every ``facts`` canonical JSON bytes)::

    intents  (intent_sha256 PK, intent_bytes, created_at, parent_request,
              database, target_table)                       -- immutable
    records  (intent_sha256 PK -> intents, record_bytes, revision, state)
              -- updated only to revision + 1, never deleted
    history  (id PK autoincrement, intent_sha256, revision, state,
              record_sha256 NULL for an observation, at, facts) -- append-only
    slots    (database, target_table PK, epoch)
    runs     (parent_request PK, database, target_table, attempt_id UNIQUE,
              slot_epoch, attempt_epoch UNIQUE, ownership, admitted_at)
    leases   (lease_id PK, user, role, attempt_id, active, issued_at, ended_at)
              -- at most one active lease per user (partial unique index)
    steps    (id PK autoincrement, key, facts, at)           -- append-only

A lease's holder process (:mod:`dpone.publication.store.holder_process`) is noted in ``steps``
under the key ``lease/<lease_id>`` in the transaction that issues the lease; an
operator's end of a lease whose holder is gone is noted there too, with the facts
that proved it, in the transaction that ends it. A slot's retirement (``dpone retire``)
is noted under ``retire/<database>/<table>``, with the fence that makes it safe.

Triggers enforce what SQL can: immutable intents, append-only history and steps,
records only to the next revision, ownership only forward.

Every write is one unit of work: ``BEGIN IMMEDIATE``, the checks and the writes,
``COMMIT``; anything else rolls back.
:func:`~dpone.publication.store.errors.store_error` is the one place where an
``sqlite3`` exception becomes a typed error: an error while committing (or a busy
database during a write) leaves the outcome unknown (``claim_uncertain`` for a
compare-and-set, ``prepare_uncertain`` for ``create``, ``store_commit_unknown``
otherwise); a refused comparison is definite and wrote nothing (``claim_lost``).
``read_back`` always opens a fresh connection.

A run's ``parent_request`` is a random id chosen at admission; its ``attempt_epoch``
is the store-wide admission number (1, 2, ...), its ``slot_epoch`` the slot's epoch
after the admission incremented it.

The parts, one concern each, are objects that :class:`SnapshotStore`
(:mod:`~dpone.publication.store.snapshot_store`) owns and delegates to, each given the
store's one connections object (none inherits from another):
:mod:`~dpone.publication.store.schema` (the file, its schema and identity),
:mod:`~dpone.publication.store.connections` (fresh reads, units of work; SQLite's),
:mod:`~dpone.publication.store.postgres` (the same on PostgreSQL),
:mod:`~dpone.publication.store.records` (intents, records, compare-and-set, history),
:mod:`~dpone.publication.store.steps` (step notes),
:mod:`~dpone.publication.store.admission` (the run registry and the authority recheck),
:mod:`~dpone.publication.store.leases` (principal leases and their holders),
:mod:`~dpone.publication.store.retirement` (a slot's retirement notes and its fence) and
:mod:`~dpone.publication.store.errors` (the one error type).
"""

from dpone.publication.store.admission import UNRESOLVED_STATES, abandoned_key
from dpone.publication.store.connections import BUSY_TIMEOUT_SECONDS
from dpone.publication.store.errors import SnapshotStoreError
from dpone.publication.store.leases import LeaseRecord, lease_step_key
from dpone.publication.store.records import SnapshotSummary
from dpone.publication.store.schema import APPLICATION_ID, SCHEMA_VERSION
from dpone.publication.store.snapshot_store import (
    PostgresSnapshotStore,
    SnapshotStore,
    SqliteSnapshotStore,
    StoreLocation,
    open_store,
    store_argument,
    store_exists,
)

__all__ = [
    "APPLICATION_ID",
    "BUSY_TIMEOUT_SECONDS",
    "SCHEMA_VERSION",
    "UNRESOLVED_STATES",
    "LeaseRecord",
    "PostgresSnapshotStore",
    "SnapshotStore",
    "SnapshotStoreError",
    "SnapshotSummary",
    "SqliteSnapshotStore",
    "StoreLocation",
    "abandoned_key",
    "lease_step_key",
    "open_store",
    "store_argument",
    "store_exists",
]
