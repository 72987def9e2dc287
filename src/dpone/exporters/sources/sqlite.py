"""The SQLite source (``kind = "sqlite"``, ``sqlite:PATH``): the embedded default.

A local file opened read-only. Declared column types are SQL Server type names or
SQLite's own INTEGER, REAL, TEXT and BLOB, mapped onto the policy's families.
"""

from __future__ import annotations

import functools
import os
import sqlite3
import stat
from collections.abc import Iterator, Mapping
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpone.contracts.schema import SourceColumn, SourceSchema
from dpone.errors import ConfigurationError, PolicyError
from dpone.exporters import native_render
from dpone.exporters.sources.base import (
    FETCH_ROWS,
    ColumnMapping,
    Source,
    SourceConfig,
    SourceError,
    SourceFields,
    mapped_schema,
)
from dpone.typepolicy import families, plan_column
from dpone.typepolicy.source_types import parse_source_type


def _quote_sqlite(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


SQLITE_HEADER = b"SQLite format 3\x00"

# SQLite's own type names and the policy families that hold every value SQLite
# stores under them: INTEGER is 64-bit, REAL is binary64, TEXT and BLOB are unbounded.
SQLITE_TYPES = {
    "integer": families.integer(64),
    "real": families.float64(),
    "text": families.text(),
    "blob": families.binary(),
}

# Declarations that are SQL Server types but that SQLite users mean differently.
_AMBIGUOUS = {
    "timestamp": "datetime2(7) for date-times, or rowversion for SQL Server row versions",
}


def _declare_instead(declared: str) -> str:
    """The SQL Server type to declare for a column SQLite gives ``declared`` affinity.

    SQLite's affinity rules (https://sqlite.org/datatype3.html, 3.1), in their order.
    """
    upper = declared.upper()
    if "INT" in upper:
        return "bigint"
    if any(word in upper for word in ("CHAR", "CLOB", "TEXT", "STRING")):
        return "nvarchar(max) (or nvarchar(N))"
    if "BLOB" in upper or not upper.strip():
        return "varbinary(max)"
    if any(word in upper for word in ("REAL", "FLOA", "DOUB")):
        return "float(53)"
    if "BOOL" in upper:
        return "bit"
    return "decimal(P, S) with the precision and scale of its values, or float(53)"


def sqlite_column_type(declared: str, *, column: str) -> str:
    """The SQL Server type of a SQLite column declared ``declared``.

    SQLite's own names INTEGER, REAL, TEXT and BLOB map to lossless SQL Server types;
    any SQL Server type dpone accepts is kept, canonically spelled (so ``decimal(18, 4)`` or
    ``float(24)`` still choose the stored type); everything else is refused with the
    type to declare instead.
    """
    key = " ".join(declared.lower().split())
    if key in SQLITE_TYPES:
        return SQLITE_TYPES[key]
    if key in _AMBIGUOUS:
        raise PolicyError(
            f"column {column!r}: declared type {declared!r} is ambiguous in SQLite; declare "
            f"{_AMBIGUOUS[key]}",
            code="ambiguous_sqlite_type",
            column=column,
            source_type=declared,
        )
    try:
        plan_column(SourceColumn(column, declared, nullable=True))
        # SQLite upper-cases some names it knows (INT): keep the canonical spelling.
        return str(parse_source_type(declared, column=column))
    except PolicyError as exc:
        instead = _declare_instead(declared)
        raise PolicyError(
            f"column {column!r}: declared type {declared!r} is neither a SQL Server type "
            f"dpone accepts nor one of SQLite's INTEGER, REAL, TEXT, BLOB; declare {instead}",
            code="unsupported_type",
            column=column,
            source_type=declared,
            declare=instead,
        ) from exc


class SqliteSource:
    """A SQLite database, opened read-only; it must exist and be a SQLite database.

    Declared column types are SQL Server type names or SQLite's own INTEGER, REAL,
    TEXT and BLOB (see :func:`sqlite_column_type`), so a table created with
    ``amount decimal(18, 4) NOT NULL`` exports as ``decimal(18, 4)``, not null.
    The path is taken literally: ``?``, ``#`` and ``%`` are part of the file name.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            # stat before open: opening a FIFO or a device could block or have effects.
            if not stat.S_ISREG(os.stat(self.path).st_mode):
                raise SourceError(
                    f"SQLite source {self.path} is not a regular file",
                    code="source_not_found",
                    path=str(self.path),
                )
            with open(self.path, "rb") as stream:
                header = stream.read(len(SQLITE_HEADER))
        except (FileNotFoundError, NotADirectoryError) as exc:
            hint = (
                " (the path after 'sqlite:' is taken literally; '?', '#' and '%' are part "
                "of the file name)"
                if any(c in str(path) for c in "?#%")
                else ""
            )
            raise SourceError(
                f"SQLite database {self.path} does not exist{hint}",
                code="source_not_found",
                path=str(self.path),
            ) from exc
        except OSError as exc:
            raise SourceError(
                f"cannot read SQLite database {self.path}: {exc.strerror}",
                code="source_read_failed",
                path=str(self.path),
            ) from exc
        # SQLite itself treats an empty file as an empty database.
        if header and header != SQLITE_HEADER:
            raise SourceError(
                f"{self.path} is not a SQLite database (its header is not SQLite's)",
                code="not_a_sqlite_database",
                path=str(self.path),
            )
        # A file: URI with the path percent-encoded by as_uri(), so '?', '#' and '%'
        # in a name stay in the name, and mode=ro so nothing is ever created or written.
        self._uri = self.path.absolute().as_uri() + "?mode=ro"

    @property
    def local_files(self) -> tuple[Path, ...]:
        return (self.path,)

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self._uri, uri=True)

    def _failed(self, exc: sqlite3.Error) -> SourceError:
        if isinstance(exc, sqlite3.DatabaseError) and "not a database" in str(exc):
            return SourceError(
                f"{self.path} is not a SQLite database",
                code="not_a_sqlite_database",
                path=str(self.path),
            )
        return SourceError(
            f"cannot read SQLite database {self.path}: {exc}",
            code="source_read_failed",
            path=str(self.path),
        )

    def schema(self, table: str) -> SourceSchema:
        try:
            with closing(self._connect()) as conn:
                info = conn.execute(f"PRAGMA table_info({_quote_sqlite(table)})").fetchall()
        except sqlite3.Error as exc:
            raise self._failed(exc) from exc
        if not info:
            raise SourceError(f"table {table!r} not found in {self.path}", table=table)
        columns: list[ColumnMapping] = []
        for _cid, name, declared, notnull, _default, _pk in info:
            if not declared:
                raise SourceError(
                    f"column {name!r} of {table!r} has no declared type; declare a SQL Server "
                    "type or one of SQLite's INTEGER, REAL, TEXT, BLOB",
                    column=name,
                )
            family = functools.partial(sqlite_column_type, declared, column=name)
            columns.append((name, family, not notnull))
        return mapped_schema(columns)

    def rows(self, table: str, schema: SourceSchema) -> Iterator[tuple[Any, ...]]:
        for batch in self.batches(table, schema):
            yield from batch

    def select_sql(self, table: str, schema: SourceSchema) -> str:
        """The SELECT the rows are read by."""
        names = ", ".join(_quote_sqlite(c.name) for c in schema.columns)
        return f"SELECT {names} FROM {_quote_sqlite(table)}"

    def compiled_rows(
        self, table: str, schema: SourceSchema, ops: bytes
    ) -> native_render.SqliteRows | None:
        """The rows read and rendered by the compiled reader (the records of
        :meth:`batches` as the renderer writes them), or None where it is not built."""
        return native_render.sqlite_rows(self._uri, self.select_sql(table, schema), ops)

    def batches(self, table: str, schema: SourceSchema) -> Iterator[list[tuple[Any, ...]]]:
        try:
            with closing(self._connect()) as conn:
                cursor = conn.execute(self.select_sql(table, schema))
                while batch := cursor.fetchmany(FETCH_ROWS):
                    yield batch
        except sqlite3.Error as exc:
            raise self._failed(exc) from exc


def sqlite_path(dsn: str) -> Path:
    """The file a ``sqlite:`` DSN names; everything after the prefix is the path, verbatim.

    Accepted: ``sqlite:PATH`` (relative or absolute) and ``sqlite:///ABS/PATH`` (the
    file-URL spelling of ``sqlite:/ABS/PATH``). Nothing is percent-decoded and there
    are no URL parameters: ``?``, ``#`` and ``%`` are characters of the file name.
    Refused: SQLAlchemy's ``sqlite:////ABS/PATH``, a host (``sqlite://HOST/...``) and
    an empty path.
    """
    rest = dsn[len("sqlite:") :]
    if rest.startswith("////"):
        raise ConfigurationError(
            f"{dsn!r} is SQLAlchemy's spelling; dpone takes the path after 'sqlite:' "
            f"literally: write sqlite:{rest[3:]} (or sqlite://{rest[3:]})",
            code="invalid_dsn",
        )
    if rest.startswith("///"):
        rest = rest[2:]
    elif rest.startswith("//"):
        raise ConfigurationError(
            f"{dsn!r} names a host; a SQLite source is a local file: write sqlite:PATH "
            "or sqlite:///ABSOLUTE/PATH",
            code="invalid_dsn",
        )
    if not rest:
        raise ConfigurationError(f"no database path in {dsn!r}", code="invalid_dsn")
    return Path(rest)


@dataclass(frozen=True)
class SqliteConfig(SourceConfig):
    """``[sources.NAME] kind = "sqlite"``: the database file (``path``)."""

    path: Path

    def describe(self) -> str:
        return f"sqlite:{self.path}"

    def open(self) -> Source:
        return SqliteSource(self.path)


class SqliteKind:
    """The plugin of ``kind = "sqlite"``."""

    kind = "sqlite"
    schemes = ("sqlite",)
    keys = ("path",)
    # The advice a project file has always had for a secret in any source.
    hints: Mapping[str, str] = {
        k: "secrets never go in the file: name an environment variable with "
        "password_env or a file with password_file"
        for k in ("password", "user", "secret")
    }

    def read(self, name: str, fields: SourceFields) -> SourceConfig | None:
        if not fields.has("path"):
            fields.problem("path", "is required for a sqlite source")
        path = fields.path("path")
        return None if path is None else SqliteConfig(name, self.kind, path)

    def from_dsn(self, dsn: str) -> Source:
        return SqliteSource(sqlite_path(dsn))


KIND = SqliteKind()
