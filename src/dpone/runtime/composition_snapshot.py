"""The source document's name for ``dpone.publication.publisher``: its public names, importable here."""

from dpone.publication.publisher import (
    ClickHouseAtomicSnapshotPublisher,
    PublicationReceipt,
    SnapshotPublicationError,
    utc_now,
)

__all__ = [
    "ClickHouseAtomicSnapshotPublisher",
    "PublicationReceipt",
    "SnapshotPublicationError",
    "utc_now",
]
