"""Sources a snapshot is exported from: SQLite (embedded default) and SQL Server.

A source gives its ordered schema (SQL Server type names) and an iterator of driver
rows. Credentials for SQL Server come from the environment, never from the DSN.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

from dpone.contracts.schema import SourceColumn, SourceSchema
from dpone.errors import ConfigurationError, DponeError
from dpone.sql.quoting import quote_literal

FETCH_ROWS = 10_000


class SourceError(DponeError):
    """The source could not be read."""

    code = "source_error"


class Source(Protocol):
    """What an exporter needs from a database."""

    def schema(self, table: str) -> SourceSchema:
        """The table's ordered columns with SQL Server type names and nullability."""
        ...

    def rows(self, table: str, schema: SourceSchema) -> Iterator[tuple[Any, ...]]:
        """Driver rows in the schema's column order."""
        ...


def _quote_sqlite(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class SqliteSource:
    """A SQLite database whose declared column types are SQL Server type names.

    SQLite keeps the declared type text verbatim, so a table created with
    ``amount decimal(18, 4) NOT NULL`` exports as ``decimal(18, 4)``, not null.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise SourceError(f"SQLite database {self.path} does not exist", path=str(self.path))

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)

    def schema(self, table: str) -> SourceSchema:
        with closing(self._connect()) as conn:
            info = conn.execute(f"PRAGMA table_info({_quote_sqlite(table)})").fetchall()
        if not info:
            raise SourceError(f"table {table!r} not found in {self.path}", table=table)
        columns = []
        for _cid, name, declared, notnull, _default, _pk in info:
            if not declared:
                raise SourceError(f"column {name!r} of {table!r} has no declared type", column=name)
            columns.append(SourceColumn(name, declared, nullable=not notnull))
        return SourceSchema.of(columns)

    def rows(self, table: str, schema: SourceSchema) -> Iterator[tuple[Any, ...]]:
        names = ", ".join(_quote_sqlite(c.name) for c in schema.columns)
        with closing(self._connect()) as conn:
            cursor = conn.execute(f"SELECT {names} FROM {_quote_sqlite(table)}")
            while batch := cursor.fetchmany(FETCH_ROWS):
                yield from batch


# SQL Server types whose full precision a Python driver value cannot carry: they are
# selected as text by CONVERT and rendered from that text, not from datetime objects.
_AS_TEXT = {
    "datetime2": "CONVERT(varchar(27), {col}, 121)",
    "datetimeoffset": "CONVERT(varchar(34), {col}, 121)",
    "time": "CONVERT(varchar(16), {col})",
}


class SqlServerSource:
    """SQL Server through ``pymssql`` (extra ``dpone[mssql]``); not verified live here.

    DSN ``mssql://host[:port]/database``; the user and password come from
    ``DPONE_MSSQL_USER`` and ``DPONE_MSSQL_PASSWORD``.
    """

    def __init__(self, host: str, port: int, database: str) -> None:
        self.host, self.port, self.database = host, port, database

    def _connect(self) -> Any:
        try:
            import pymssql  # type: ignore[import-not-found]
        except ImportError as exc:
            raise ConfigurationError(
                "SQL Server sources need the mssql extra: pip install 'dpone[mssql]'",
                code="driver_not_installed",
            ) from exc
        user = os.environ.get("DPONE_MSSQL_USER")
        password = os.environ.get("DPONE_MSSQL_PASSWORD")
        if not user or password is None:
            raise ConfigurationError(
                "set DPONE_MSSQL_USER and DPONE_MSSQL_PASSWORD for SQL Server sources",
                code="missing_credentials",
            )
        try:
            return pymssql.connect(
                server=self.host, port=self.port, user=user, password=password,
                database=self.database,
            )  # fmt: skip
        except Exception as exc:  # the driver's own error types; never echo the password
            raise SourceError(
                f"cannot connect to SQL Server {self.host}:{self.port}/{self.database}: "
                f"{type(exc).__name__}",
                code="source_connect_failed",
            ) from None

    def schema(self, table: str) -> SourceSchema:
        sql = (
            "SELECT c.name, t.name, c.max_length, c.precision, c.scale, c.is_nullable "
            "FROM sys.columns c JOIN sys.types t ON c.user_type_id = t.user_type_id "
            f"WHERE c.object_id = OBJECT_ID({quote_literal(table)}) ORDER BY c.column_id"
        )
        conn = self._connect()
        try:
            cursor = conn.cursor()
            cursor.execute(sql)
            found = cursor.fetchall()
        finally:
            conn.close()
        if not found:
            raise SourceError(f"table {table!r} not found", table=table)
        return SourceSchema.of(
            [
                SourceColumn(name, sqlserver_type_text(t, ml, p, s), bool(n))
                for name, t, ml, p, s, n in found
            ]
        )

    def rows(self, table: str, schema: SourceSchema) -> Iterator[tuple[Any, ...]]:
        exprs = []
        for column in schema.columns:
            col = "[" + column.name.replace("]", "]]") + "]"
            base = column.source_type.split("(")[0].strip().lower()
            exprs.append(_AS_TEXT[base].format(col=col) if base in _AS_TEXT else col)
        quoted = ".".join("[" + part.replace("]", "]]") + "]" for part in table.split("."))
        conn = self._connect()
        try:
            cursor = conn.cursor()
            cursor.execute(f"SELECT {', '.join(exprs)} FROM {quoted}")
            while batch := cursor.fetchmany(FETCH_ROWS):
                yield from batch
        finally:
            conn.close()


def sqlserver_type_text(name: str, max_length: int, precision: int, scale: int) -> str:
    """The declared type text from ``sys.columns`` metadata (lengths in characters)."""
    name = name.lower()
    if name in ("decimal", "numeric"):
        return f"{name}({precision}, {scale})"
    if name in ("datetime2", "datetimeoffset", "time"):
        return f"{name}({scale})"
    if name in ("float",):
        return "float(24)" if precision == 24 else "float(53)"
    if name in ("char", "varchar", "binary", "varbinary"):
        return f"{name}(max)" if max_length == -1 else f"{name}({max_length})"
    if name in ("nchar", "nvarchar"):
        return f"{name}(max)" if max_length == -1 else f"{name}({max_length // 2})"
    return name


def open_source(dsn: str) -> Source:
    """``sqlite:///abs/path.db``, ``sqlite:rel/path.db`` or ``mssql://host[:port]/db``."""
    parts = urlsplit(dsn)
    if parts.scheme == "sqlite":
        path = unquote(parts.path if parts.netloc == "" else parts.netloc + parts.path)
        if not path:
            raise ConfigurationError(f"no database path in {dsn!r}", code="invalid_dsn")
        return SqliteSource(path)
    if parts.scheme == "mssql":
        if parts.username or parts.password:
            raise ConfigurationError(
                "credentials do not belong in the DSN; use DPONE_MSSQL_USER and "
                "DPONE_MSSQL_PASSWORD",
                code="credentials_in_dsn",
            )
        database = parts.path.lstrip("/")
        if not parts.hostname or not database:
            raise ConfigurationError("mssql DSN needs a host and a database", code="invalid_dsn")
        return SqlServerSource(parts.hostname, parts.port or 1433, database)
    raise ConfigurationError(
        f"unknown source scheme {parts.scheme!r} (use sqlite: or mssql:)", code="invalid_dsn"
    )
