"""The source document's name for ``dpone.staging.contract``: its public names, importable here."""

from dpone.staging.contract import (
    PhysicalDesign,
    StagingError,
    StagingPolicy,
)

__all__ = [
    "PhysicalDesign",
    "StagingError",
    "StagingPolicy",
]
