"""The source document's name for ``dpone.staging.composition``: its public names, importable here."""

from dpone.staging.composition import (
    ReceiptDecoder,
    StagingComponents,
    StagingConfig,
    StagingFinalizer,
    build_clickhouse_staging_components,
    build_transport,
    client_type_check,
    client_version,
)

__all__ = [
    "ReceiptDecoder",
    "StagingComponents",
    "StagingConfig",
    "StagingFinalizer",
    "build_clickhouse_staging_components",
    "build_transport",
    "client_type_check",
    "client_version",
]
