""":class:`SqliteSnapshotStore`: the store's parts joined on one SQLite file."""

from __future__ import annotations

from dpone.publication.store.admission import RunAdmission
from dpone.publication.store.leases import PrincipalLeases
from dpone.publication.store.records import SnapshotRecords
from dpone.publication.store.retirement import SlotRetirement
from dpone.publication.store.steps import StepNotes


class SqliteSnapshotStore(
    SnapshotRecords, StepNotes, RunAdmission, PrincipalLeases, SlotRetirement
):
    """Publication records, their history and the run registry in one SQLite file.

    Tests may subclass and override :meth:`_before_commit`, :meth:`_after_commit` and
    :meth:`_after_read_back` to inject faults at those exact points.
    """
