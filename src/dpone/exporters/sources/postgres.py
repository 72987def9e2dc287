"""The PostgreSQL source (``kind = "postgres"``, ``postgresql://user@host[:port]/dbname``).

Through ``psycopg`` 3 (extra ``dpone[postgres]``) with libpq's conventions, the password
only from libpq's password file. A table is read in one ``REPEATABLE READ, READ ONLY``
transaction through a binary server-side cursor, its snapshot recorded in the receipt;
each column's type is mapped onto the policy's families (:func:`column_type`), and dates,
timestamps and times go from their binary form straight to text, so every value
ClickHouse can hold is exact and any other is ``value_out_of_range``. See
docs/configuration.md.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import re
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from dpone.contracts.schema import SourceSchema
from dpone.errors import ConfigurationError, PolicyError
from dpone.exporters.sources.base import (
    FETCH_ROWS,
    ColumnMapping,
    Source,
    SourceConfig,
    SourceError,
    SourceFields,
    mapped_schema,
)
from dpone.typepolicy import families

SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
APPLICATION = "dpone"
CONNECT_SECONDS = 30

# PostgreSQL's type names (pg_type.typname) whose every value a family holds exactly.
_FIXED = {
    "bool": families.boolean(),
    "int2": families.integer(16),
    "int4": families.integer(32),
    "int8": families.integer(64),
    "float4": families.float32(),
    "float8": families.float64(),
    "date": families.date(),
    "uuid": families.uuid(),
    "bytea": families.binary(),
    "text": families.text(),
    "varchar": families.text(),
    "bpchar": families.text(),
    "name": families.text(),
    "json": families.text(),
    "jsonb": families.text(),
}
_NUMERIC = re.compile(r"numeric\((\d+),(\d+)\)")
_WHY = {
    "numeric": "numeric needs a precision of 1 to 38 and a scale of 0 to its precision: "
    "declare numeric(p, s), or cast it in a view",
    "money": "money's text depends on lc_monetary: cast it to numeric(p, 2) in a view",
    "interval": "an interval has no exact ClickHouse type",
    "timetz": "a time with a time zone has no exact ClickHouse type",
    "array": "arrays are not supported",
    "domain": "a domain: cast the column to its base type in a view",
    "enum": "an enum: cast the column to text in a view",
}

# The binary forms (PostgreSQL's epoch is 2000-01-01) and the range ClickHouse's Date32
# and DateTime64 hold: 1900-01-01 .. 2299-12-31.
_EPOCH = dt.date(2000, 1, 1).toordinal()
_DAY_MIN = dt.date(1900, 1, 1).toordinal() - _EPOCH
_DAY_MAX = dt.date(2299, 12, 31).toordinal() - _EPOCH
_DAY_US = 86_400_000_000
_INT4 = struct.Struct("!i")
_INT8 = struct.Struct("!q")

# Refused before the export: the type, as format_type() names it, is in the message.
_COLUMNS_SQL = (
    "SELECT a.attname, t.typname, format_type(a.atttypid, a.atttypmod), a.atttypmod, "
    "a.attnotnull, t.typtype, t.typcategory "
    "FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
    "WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum"
)
_RELATION_SQL = (
    "SELECT c.oid, format('%%I.%%I', n.nspname, c.relname) FROM pg_class c "
    "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass(%s)"
)


def column_type(typname: str, declared: str, typmod: int, *, column: str) -> str:
    """The policy family of a column of PostgreSQL type ``typname`` (``declared`` is
    format_type()'s text of it); refused with ``unsupported_type`` when no family holds
    every value exactly."""
    if typname in _FIXED:
        return _FIXED[typname]
    digits = 6 if typmod < 0 else typmod  # PostgreSQL's default and largest precision
    if typname in ("timestamp", "timestamptz"):
        return families.timestamp(digits)  # timestamptz: its instant, written in UTC
    if typname == "time":
        return families.time(digits)
    found = _NUMERIC.fullmatch(declared.replace(" ", ""))
    if typname == "numeric" and found and 1 <= int(found[1]) <= 38:
        return families.decimal(int(found[1]), int(found[2]))
    why = _WHY.get(typname, "it is not in dpone's PostgreSQL type table")
    raise PolicyError(
        f"column {column!r}: PostgreSQL type {declared} is not supported ({why})",
        code="unsupported_type",
        column=column,
        source_type=declared,
    )


class _Outside:
    """A loaded value outside what ClickHouse's type holds (its row is found after)."""

    def __init__(self, what: str) -> None:
        self.what = what


def _clock(micros: int) -> str:
    seconds, fraction = divmod(micros, 1_000_000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    return f"{hour:02d}:{minute:02d}:{second:02d}.{fraction:06d}"


def date_text(days: int) -> str | _Outside:
    """A binary ``date`` (days from 2000-01-01) as ``YYYY-MM-DD``, if Date32 holds it."""
    if _DAY_MIN <= days <= _DAY_MAX:
        return dt.date.fromordinal(_EPOCH + days).isoformat()
    return _Outside("a date outside 1900-01-01 .. 2299-12-31 (ClickHouse's Date32)")


def timestamp_text(micros: int) -> str | _Outside:
    """A binary ``timestamp`` (or ``timestamptz``: in UTC) as ``YYYY-MM-DD HH:MM:SS.ffffff``."""
    days, clock = divmod(micros, _DAY_US)
    if _DAY_MIN <= days <= _DAY_MAX:
        return f"{dt.date.fromordinal(_EPOCH + days).isoformat()} {_clock(clock)}"
    return _Outside("a timestamp outside 1900-01-01 .. 2299-12-31 (ClickHouse's DateTime64)")


def time_text(micros: int) -> str | _Outside:
    """A binary ``time`` as ``HH:MM:SS.ffffff``; PostgreSQL's 24:00:00 is no time of day."""
    return _clock(micros) if 0 <= micros < _DAY_US else _Outside("the time 24:00:00")


def _loaders(context: Any, outside: list[_Outside]) -> None:
    """Register on ``context`` the loaders that make dates, times and JSON exact text
    and refuse NaN and infinities; each value they refuse is also put in ``outside``."""
    from psycopg import pq
    from psycopg.adapt import Loader

    def loader(decode: Any) -> type[Loader]:
        class Exact(Loader):
            format = pq.Format.BINARY

            def load(self, data: Any) -> Any:
                value = decode(bytes(data))
                if type(value) is _Outside:
                    outside.append(value)
                return value

        return Exact

    def jsonb(data: bytes) -> str:
        if data[:1] != b"\x01":
            raise SourceError("unknown binary jsonb version", code="source_read_failed")
        return data[1:].decode("utf-8")

    decoders = {
        "date": lambda d: date_text(_INT4.unpack(d)[0]),
        "timestamp": lambda d: timestamp_text(_INT8.unpack(d)[0]),
        "timestamptz": lambda d: timestamp_text(_INT8.unpack(d)[0]),
        "time": lambda d: time_text(_INT8.unpack(d)[0]),
        "json": lambda d: d.decode("utf-8"),
        "jsonb": jsonb,
    }
    for name, decode in decoders.items():
        context.adapters.register_loader(name, loader(decode))
    for name in ("float4", "float8", "numeric"):  # the driver's loader, NaN and infinities refused
        context.adapters.register_loader(name, _finite(context, name, outside))


def _finite(context: Any, name: str, found: list[_Outside]) -> Any:
    """The driver's loader of ``name``, with NaN and the infinities refused."""
    from psycopg import postgres, pq
    from psycopg.adapt import Loader

    base = context.adapters.get_loader(postgres.types[name].oid, pq.Format.BINARY)
    outside = _Outside(f"a NaN or infinite {name} (ClickHouse's column holds finite values)")

    class Finite(Loader):
        format = pq.Format.BINARY

        def __init__(self, oid: int, context: Any = None) -> None:
            super().__init__(oid, context)
            self._load = base(oid, context).load

        def load(self, data: Any) -> Any:
            value = self._load(data)
            finite = value.is_finite() if name == "numeric" else math.isfinite(value)
            if finite:
                return value
            found.append(outside)
            return outside

    return Finite


@dataclass(frozen=True)
class PostgresConfig(SourceConfig):
    """``[sources.NAME] kind = "postgres"``: libpq's host, port, dbname, user, sslmode."""

    host: str
    dbname: str
    user: str
    port: int = 5432
    sslmode: str = "prefer"

    def describe(self) -> str:
        return _describe(self.host, self.port, self.dbname, self.user, self.sslmode)

    def open(self) -> Source:
        return PostgresSource(self.host, self.port, self.dbname, self.user, self.sslmode)


def _describe(host: str, port: int, dbname: str, user: str, sslmode: str) -> str:
    return (
        f"postgresql://{quote(user, safe='')}@{host}:{port}/{quote(dbname, safe='')}"
        f"?sslmode={sslmode}"
    )


class PostgresSource:
    """One PostgreSQL database; each read is one ``REPEATABLE READ, READ ONLY`` snapshot."""

    def __init__(
        self, host: str, port: int, dbname: str, user: str, sslmode: str = "prefer"
    ) -> None:
        self.host, self.port, self.dbname, self.user, self.sslmode = (
            host,
            port,
            dbname,
            user,
            sslmode,
        )
        self._snapshot: dict[str, str] | None = None

    @property
    def local_files(self) -> tuple[Path, ...]:
        return ()

    def describe(self) -> str:
        """Where the source is, without any secret."""
        return _describe(self.host, self.port, self.dbname, self.user, self.sslmode)

    def _connect(self) -> Any:
        try:
            import psycopg
        except ImportError as exc:
            raise ConfigurationError(
                "PostgreSQL sources need the postgres extra: pip install 'dpone[postgres]'",
                code="driver_not_installed",
            ) from exc
        try:
            # password="" stops libpq reading PGPASSWORD; an empty one sends it to the
            # password file (PGPASSFILE or ~/.pgpass), the only place a password is read.
            return psycopg.connect(
                host=self.host,
                port=self.port,
                dbname=self.dbname,
                user=self.user,
                sslmode=self.sslmode,
                password="",
                application_name=APPLICATION,
                client_encoding="UTF8",
                connect_timeout=CONNECT_SECONDS,
            )
        except psycopg.Error as exc:
            raise SourceError(
                f"cannot connect to PostgreSQL {self.describe()}: {_reason(exc)}",
                code="source_connect_failed",
            ) from exc

    def _failed(self, exc: Exception) -> SourceError:
        return SourceError(
            f"cannot read PostgreSQL {self.describe()}: {_reason(exc)}",
            code="source_read_failed",
        )

    def schema(self, table: str) -> SourceSchema:
        import psycopg

        conn = self._connect()
        try:
            with conn.cursor() as cursor:
                return self._schema(cursor, table)[0]
        except psycopg.Error as exc:
            raise self._failed(exc) from exc
        finally:
            conn.close()

    def _schema(self, cursor: Any, table: str) -> tuple[SourceSchema, str]:
        """The table's schema and its qualified, quoted name, read through ``cursor``."""
        cursor.execute(_RELATION_SQL, (table,))
        found = cursor.fetchone()
        if found is None:
            raise SourceError(f"table {table!r} not found in {self.describe()}", table=table)
        oid, qualified = found
        cursor.execute(_COLUMNS_SQL, (oid,))
        columns: list[ColumnMapping] = []
        for name, typname, declared, typmod, notnull, typtype, category in cursor.fetchall():
            if category == "A":
                typname = "array"
            elif typtype != "b":
                typname = {"d": "domain", "e": "enum"}.get(typtype, "")
            family = functools.partial(column_type, typname, declared, typmod, column=name)
            columns.append((name, family, not notnull))
        return mapped_schema(columns), qualified

    def rows(self, table: str, schema: SourceSchema) -> Iterator[tuple[Any, ...]]:
        for batch in self.batches(table, schema):
            yield from batch

    def batches(self, table: str, schema: SourceSchema) -> Iterator[list[tuple[Any, ...]]]:
        """The rows of one snapshot, whose columns must still be ``schema``'s."""
        import psycopg

        self._snapshot = None
        conn = self._connect()
        try:
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            conn.read_only = True
            outside: list[_Outside] = []  # filled by the loaders: rare, so rows are not scanned
            _loaders(conn, outside)
            with conn.cursor() as cursor:
                # The transaction's first statement takes its snapshot; all below read it.
                cursor.execute("SELECT pg_current_snapshot()::text")
                snapshot = cursor.fetchone()[0]
                found, qualified = self._schema(cursor, table)
            if found.columns != schema.columns:
                raise SourceError(
                    f"the columns of {table!r} changed since its schema was read; export again",
                    code="source_schema_changed",
                    table=table,
                )
            names = ", ".join(_identifier(c.name) for c in schema.columns)
            read = 0
            with conn.cursor(name="dpone_export", binary=True) as cursor:
                cursor.execute(f"SELECT {names} FROM {qualified}")
                while batch := cursor.fetchmany(FETCH_ROWS):
                    if outside:
                        _refuse_outside(batch, schema, read)
                    read += len(batch)
                    yield batch
            conn.rollback()  # read only: nothing to commit
            self._snapshot = {
                "kind": "postgres",
                "source": self.describe(),
                "isolation": "repeatable read, read only",
                "snapshot": snapshot,
            }
        except psycopg.Error as exc:
            raise self._failed(exc) from exc
        finally:
            conn.close()

    def snapshot_identity(self) -> Mapping[str, str] | None:
        """The snapshot the last complete read saw (``pg_current_snapshot()``)."""
        return self._snapshot


def _identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _refuse_outside(batch: list[tuple[Any, ...]], schema: SourceSchema, before: int) -> None:
    """Refuse the first value of ``batch`` a loader found outside its ClickHouse type."""
    for index, row in enumerate(batch):
        for column, value in zip(schema.columns, row, strict=True):
            if isinstance(value, _Outside):
                number = before + index + 1
                raise SourceError(
                    f"row {number}, column {column.name!r}: {value.what}",
                    code="value_out_of_range",
                    record=number,
                    column=column.name,
                )


def _reason(exc: Exception) -> str:
    """The driver's reason, first line (libpq never puts a password in it)."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


class PostgresKind:
    """The plugin of ``kind = "postgres"``."""

    kind = "postgres"
    schemes = ("postgresql", "postgres")
    keys = ("host", "port", "dbname", "user", "sslmode")
    hints: Mapping[str, str] = {
        "password": "secrets never go in the file: libpq reads the password from the "
        "file PGPASSFILE names, or ~/.pgpass",
        "database": "libpq names it dbname",
    }

    def read(self, name: str, fields: SourceFields) -> SourceConfig | None:
        host = fields.text("host", required=True)
        port = fields.port("port", 5432)
        dbname = fields.text("dbname", required=True)
        user = fields.text("user", required=True)
        sslmode = fields.choice("sslmode", SSLMODES, "prefer")
        if host is None or dbname is None or user is None:
            return None
        return PostgresConfig(name, self.kind, host, dbname, user, port, sslmode)

    def from_dsn(self, dsn: str) -> Source:
        """``postgresql://user@host[:port]/dbname[?sslmode=...]``; no password."""
        parts = urlsplit(dsn)
        if parts.password is not None:
            raise ConfigurationError(
                "a password does not belong in the DSN; libpq reads it from PGPASSFILE "
                "or ~/.pgpass",
                code="credentials_in_dsn",
            )
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        sslmode = query.pop("sslmode", "prefer")
        dbname = unquote(parts.path.lstrip("/"))
        try:
            port = parts.port or 5432
        except ValueError as exc:
            raise ConfigurationError(
                "the PostgreSQL DSN has an invalid port (a number from 1 to 65535)",
                code="invalid_dsn",
            ) from exc
        if not parts.hostname or not dbname or not parts.username:
            raise ConfigurationError(
                "a PostgreSQL DSN needs a user, a host and a database: "
                "postgresql://user@host[:port]/dbname",
                code="invalid_dsn",
            )
        if query or sslmode not in SSLMODES:
            raise ConfigurationError(
                f"a PostgreSQL DSN takes only sslmode ({', '.join(SSLMODES)})",
                code="invalid_dsn",
            )
        return PostgresSource(parts.hostname, port, dbname, unquote(parts.username), sslmode)


KIND = PostgresKind()
