"""The six ceilings a publication is bound to (the ``limits`` member of an intent)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from dpone.contracts.composition_snapshot.checks import COUNTER, check_counter
from dpone.contracts.fields import members


@dataclass(frozen=True)
class SnapshotLimits:
    """The six ceilings of a publication (bytes and rows; every value >= 0).

    The previous target A and every retained generation count toward
    ``retained_storage_bytes`` and ``total_transient_storage_bytes``.
    """

    source_rows: int
    source_bytes: int
    wire_bytes: int
    generation_storage_bytes: int
    retained_storage_bytes: int
    total_transient_storage_bytes: int

    def to_document(self) -> dict[str, Any]:
        """The canonical-JSON-ready document (the ``limits`` member of an intent)."""
        return {name: getattr(self, name) for name in _NAMES}

    @classmethod
    def from_document(cls, obj: Any, *, where: str = "limits") -> SnapshotLimits:
        """Parse the six ceilings; each must be a non-negative integer (not a boolean)."""
        doc = members(obj, dict.fromkeys(_NAMES, COUNTER), where=where)
        return cls(**{name: check_counter(doc[name], where=f"{where}.{name}") for name in _NAMES})


# The document's members are the fields, in their order (callers list them in it).
_NAMES = tuple(f.name for f in dataclasses.fields(SnapshotLimits))

# Defaults in line with the staging policy's bounds (StagingPolicy): finite, generous.
DEFAULT_LIMITS = SnapshotLimits(
    source_rows=100_000_000,
    source_bytes=256 * 1024**3,
    wire_bytes=64 * 1024**3,
    generation_storage_bytes=64 * 1024**3,
    retained_storage_bytes=256 * 1024**3,
    total_transient_storage_bytes=512 * 1024**3,
)
