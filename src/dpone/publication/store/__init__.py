"""The snapshot store: publication records, their history, the run registry and the leases.

:class:`SqliteSnapshotStore` and :class:`PostgresSnapshotStore` implement both
:class:`~dpone.ports.composition_snapshot.SnapshotPublicationStore` and
:class:`~dpone.ports.composition_snapshot.SnapshotRunRegistry` in one database, so that
a compare-and-set can recheck the parent authority (the run, its slot epoch and its
ownership) in the same transaction that writes the record. The parts, one concern each,
are objects that :class:`SnapshotStore` (:mod:`~dpone.publication.store.snapshot_store`)
owns and delegates to: :mod:`~dpone.publication.store.schema`,
:mod:`~dpone.publication.store.connections`, :mod:`~dpone.publication.store.postgres`,
:mod:`~dpone.publication.store.records`, :mod:`~dpone.publication.store.steps`,
:mod:`~dpone.publication.store.admission`, :mod:`~dpone.publication.store.leases`,
:mod:`~dpone.publication.store.retirement` and :mod:`~dpone.publication.store.errors`.
The file, its layout, its triggers and its units of work are in docs/publication.md
("The snapshot store").
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
