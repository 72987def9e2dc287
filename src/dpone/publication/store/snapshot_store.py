"""The store's parts joined: :class:`SnapshotStore` on one SQLite file (the embedded
default) or on a PostgreSQL database that workers share, and :func:`open_store`, which
opens the one a location names."""

from __future__ import annotations

import os
from pathlib import Path

from dpone.publication.store.admission import RunAdmission
from dpone.publication.store.connections import BUSY_TIMEOUT_SECONDS
from dpone.publication.store.errors import SnapshotStoreError
from dpone.publication.store.leases import PrincipalLeases
from dpone.publication.store.postgres import PostgresConnections, is_store_url
from dpone.publication.store.records import SnapshotRecords
from dpone.publication.store.retirement import SlotRetirement
from dpone.publication.store.steps import StepNotes

# A store's location: a SQLite file's path, or a ``postgresql://`` URL.
StoreLocation = Path | str


class SnapshotStore(SnapshotRecords, StepNotes, RunAdmission, PrincipalLeases, SlotRetirement):
    """Publication records, their history and the run registry in one store.

    Tests may subclass and override :meth:`_before_commit`, :meth:`_after_commit` and
    :meth:`_after_read_back` to inject faults at those exact points.
    """


class SqliteSnapshotStore(SnapshotStore):
    """The store in one SQLite file (the embedded default)."""


class PostgresSnapshotStore(PostgresConnections, SnapshotStore):
    """The store in a PostgreSQL database, shared by the workers of a project
    (:mod:`~dpone.publication.store.postgres`)."""


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
