"""Sources a snapshot is exported from, one module per kind (see :mod:`.registry`).

The names a caller uses, re-exported: the :class:`Source` protocol, the one
:func:`open_source` factory, and the built-in kinds' classes.
"""

from dpone.exporters.sources.base import (
    FETCH_ROWS,
    BatchedSource,
    SnapshotSource,
    Source,
    SourceConfig,
    SourceError,
    SourceFields,
    SourceKind,
    row_batches,
)
from dpone.exporters.sources.mssql import SqlServerConfig, SqlServerSource, sqlserver_type_text
from dpone.exporters.sources.registry import kind_for_scheme, kinds, open_source
from dpone.exporters.sources.sqlite import (
    SQLITE_TYPES,
    SqliteConfig,
    SqliteSource,
    sqlite_column_type,
    sqlite_path,
)

__all__ = [
    "FETCH_ROWS",
    "SQLITE_TYPES",
    "BatchedSource",
    "SnapshotSource",
    "Source",
    "SourceConfig",
    "SourceError",
    "SourceFields",
    "SourceKind",
    "SqlServerConfig",
    "SqlServerSource",
    "SqliteConfig",
    "SqliteSource",
    "kind_for_scheme",
    "kinds",
    "open_source",
    "row_batches",
    "sqlite_column_type",
    "sqlite_path",
    "sqlserver_type_text",
]
