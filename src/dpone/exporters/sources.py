"""Sources a snapshot is exported from: SQLite (embedded default) and SQL Server.

A source gives its ordered schema (SQL Server type names) and an iterator of driver
rows. Credentials for SQL Server come from the environment, never from the DSN.
"""

from __future__ import annotations

import itertools
import os
import sqlite3
import stat
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

from dpone.contracts.schema import SourceColumn, SourceSchema
from dpone.errors import ConfigurationError, DponeError, PolicyError
from dpone.exporters import native_render
from dpone.sql.quoting import quote_literal
from dpone.typepolicy import plan_column, refusal
from dpone.typepolicy.source_types import parse_source_type

FETCH_ROWS = 10_000


class SourceError(DponeError):
    """The source could not be read."""

    code = "source_error"


class Source(Protocol):
    """What an exporter needs from a database."""

    @property
    def local_files(self) -> tuple[Path, ...]:
        """Files on this machine the source reads (an export must never write over them)."""
        ...

    def schema(self, table: str) -> SourceSchema:
        """The table's ordered columns with SQL Server type names and nullability."""
        ...

    def rows(self, table: str, schema: SourceSchema) -> Iterator[tuple[Any, ...]]:
        """Driver rows in the schema's column order."""
        ...


@runtime_checkable
class BatchedSource(Source, Protocol):
    """A source that also hands its rows as the driver fetches them, a list at a time."""

    def batches(self, table: str, schema: SourceSchema) -> Iterator[list[tuple[Any, ...]]]:
        """The rows of :meth:`rows`, in the same order, in lists of at most ``FETCH_ROWS``."""
        ...


def row_batches(
    source: Source, table: str, schema: SourceSchema
) -> Iterator[list[tuple[Any, ...]]]:
    """The rows of ``source`` in lists: its own batches, or its rows gathered."""
    if isinstance(source, BatchedSource):
        yield from source.batches(table, schema)
        return
    rows = source.rows(table, schema)
    while batch := list(itertools.islice(rows, FETCH_ROWS)):
        yield batch


def _quote_sqlite(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


SQLITE_HEADER = b"SQLite format 3\x00"

# SQLite's own type names and the SQL Server types that hold every value SQLite
# stores under them: INTEGER is 64-bit, REAL is binary64, TEXT and BLOB are unbounded.
SQLITE_TYPES = {
    "integer": "bigint",
    "real": "float(53)",
    "text": "nvarchar(max)",
    "blob": "varbinary(max)",
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
        columns: list[SourceColumn] = []
        refused: list[PolicyError] = []
        for _cid, name, declared, notnull, _default, _pk in info:
            if not declared:
                raise SourceError(
                    f"column {name!r} of {table!r} has no declared type; declare a SQL Server "
                    "type or one of SQLite's INTEGER, REAL, TEXT, BLOB",
                    column=name,
                )
            try:
                mapped = sqlite_column_type(declared, column=name)
            except PolicyError as exc:  # every refused column is named, not the first
                refused.append(exc)
                continue
            columns.append(SourceColumn(name, mapped, nullable=not notnull))
        if refused:
            raise refusal(refused)
        return SourceSchema.of(columns)

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


def open_source(dsn: str) -> Source:
    """``sqlite:PATH``, ``sqlite:///ABS/PATH`` or ``mssql://host[:port]/db``."""
    if dsn[: len("sqlite:")].lower() == "sqlite:":
        return SqliteSource(sqlite_path(dsn))
    parts = urlsplit(dsn)
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
        try:
            port = parts.port  # urllib raises for a port that is not 0-65535
        except ValueError as exc:
            raise ConfigurationError(
                f"mssql DSN {dsn!r} has an invalid port (a number from 1 to 65535)",
                code="invalid_dsn",
            ) from exc
        return SqlServerSource(parts.hostname, port or 1433, database)
    raise ConfigurationError(
        f"unknown source scheme {parts.scheme!r} (use sqlite: or mssql:)", code="invalid_dsn"
    )
