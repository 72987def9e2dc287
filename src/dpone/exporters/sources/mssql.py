"""The SQL Server source (``kind = "sqlserver"``, ``mssql://host[:port]/db``).

Through ``pymssql`` (extra ``dpone[mssql]``); not verified live here. Its catalog's
type names are the policy's own spelling, so they need no mapping. The user and
password come from the environment (a DSN), or from the variable or file a project
file names; never from the file, the DSN or argv.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from dpone.contracts.schema import SourceColumn, SourceSchema
from dpone.errors import ConfigurationError
from dpone.exporters.sources.base import (
    FETCH_ROWS,
    Source,
    SourceConfig,
    SourceError,
    SourceFields,
)
from dpone.sql.quoting import quote_literal

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
    ``DPONE_MSSQL_USER`` and ``DPONE_MSSQL_PASSWORD``, unless the caller gives them
    (a project file names the variable or file they are read from).
    """

    def __init__(
        self,
        host: str,
        port: int,
        database: str,
        *,
        user: str | None = None,
        password: str | None = None,
    ) -> None:
        self.host, self.port, self.database = host, port, database
        self._user, self._password = user, password

    @property
    def local_files(self) -> tuple[Path, ...]:
        return ()

    def _connect(self) -> Any:
        try:
            import pymssql  # type: ignore[import-not-found]
        except ImportError as exc:
            raise ConfigurationError(
                "SQL Server sources need the mssql extra: pip install 'dpone[mssql]'",
                code="driver_not_installed",
            ) from exc
        user = self._user or os.environ.get("DPONE_MSSQL_USER")
        password = self._password
        if password is None:
            password = os.environ.get("DPONE_MSSQL_PASSWORD")
        if not user or password is None:
            raise ConfigurationError(
                "set DPONE_MSSQL_USER and DPONE_MSSQL_PASSWORD for SQL Server sources",
                code="missing_credentials",
            )
        try:
            return pymssql.connect(
                server=self.host,
                port=self.port,
                user=user,
                password=password,
                database=self.database,
            )
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
        for batch in self.batches(table, schema):
            yield from batch

    def batches(self, table: str, schema: SourceSchema) -> Iterator[list[tuple[Any, ...]]]:
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
                yield batch if isinstance(batch, list) else list(batch)
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


@dataclass(frozen=True)
class SqlServerConfig(SourceConfig):
    """``[sources.NAME] kind = "sqlserver"``: where, and where its secrets are read from."""

    host: str
    database: str
    user_env: str
    port: int = 1433
    password_env: str | None = None
    password_file: Path | None = None

    def describe(self) -> str:
        return f"mssql://{self.host}:{self.port}/{self.database}"

    def open(self) -> Source:
        user, password = resolve_secret(self)
        return SqlServerSource(self.host, self.port, self.database, user=user, password=password)


def resolve_secret(source: SqlServerConfig) -> tuple[str, str]:
    """The SQL Server user and password, read now from the named variable or file."""
    user = os.environ.get(source.user_env or "")
    if not user:
        raise ConfigurationError(
            f"sources.{source.name}.user_env: the environment variable {source.user_env} is not set",
            code="missing_credentials",
            key=f"sources.{source.name}.user_env",
        )
    if source.password_file is not None:
        try:
            password = source.password_file.read_text(encoding="utf-8").rstrip("\r\n")
        except OSError as exc:
            raise ConfigurationError(
                f"sources.{source.name}.password_file: cannot read {source.password_file}: "
                f"{exc.strerror}",
                code="missing_credentials",
                key=f"sources.{source.name}.password_file",
            ) from exc
        return user, password
    from_env = os.environ.get(source.password_env or "")
    if from_env is None:
        raise ConfigurationError(
            f"sources.{source.name}.password_env: the environment variable "
            f"{source.password_env} is not set",
            code="missing_credentials",
            key=f"sources.{source.name}.password_env",
        )
    return user, from_env


class SqlServerKind:
    """The plugin of ``kind = "sqlserver"``."""

    kind = "sqlserver"
    schemes = ("mssql",)
    keys = ("host", "port", "database", "user_env", "password_env", "password_file")
    hints: Mapping[str, str] = {
        k: "secrets never go in the file: name an environment variable with "
        "password_env or a file with password_file"
        for k in ("password", "user", "secret")
    }

    def read(self, name: str, fields: SourceFields) -> SourceConfig | None:
        host = fields.text("host", required=True)
        port = fields.port("port", 1433)
        database = fields.text("database", required=True)
        user_env = fields.env_name("user_env", required=True)
        password_env = fields.env_name("password_env")
        password_file = fields.path("password_file")
        if fields.has("password_env") == fields.has("password_file"):
            fields.problem("password_env", "give exactly one of password_env and password_file")
        if host is None or database is None or user_env is None:
            return None
        return SqlServerConfig(
            name, self.kind, host, database, user_env, port, password_env, password_file
        )

    def from_dsn(self, dsn: str) -> Source:
        """``mssql://host[:port]/db``; the credentials come from ``DPONE_MSSQL_USER`` and
        ``DPONE_MSSQL_PASSWORD``, never from the DSN."""
        parts = urlsplit(dsn)
        if parts.username or parts.password:
            raise ConfigurationError(
                "credentials do not belong in the DSN; use DPONE_MSSQL_USER and "
                "DPONE_MSSQL_PASSWORD",
                code="credentials_in_dsn",
            )
        database = parts.path.lstrip("/")
        if not parts.hostname or not database:
            raise ConfigurationError("mssql DSN needs a host and a database", code="invalid_dsn")
        try:
            port = parts.port  # urllib raises for a port that is not 0-65535
        except ValueError as exc:
            raise ConfigurationError(
                f"mssql DSN {dsn!r} has an invalid port (a number from 1 to 65535)",
                code="invalid_dsn",
            ) from exc
        return SqlServerSource(parts.hostname, port or 1433, database)


KIND = SqlServerKind()
