"""The PostgreSQL source on a real server (the session's throwaway cluster, conftest's
``postgres``): hostile values exact, refusals coded, one snapshot, a lost connection."""

from __future__ import annotations

import re
import struct
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from dpone.errors import DponeError, PolicyError
from dpone.exporters.export import ExportResult, export_table
from dpone.exporters.sources import SourceError, open_source
from dpone.exporters.sources.postgres import PostgresSource
from tests.hostile_values import HOSTILE_BINARY, HOSTILE_TEXT
from tests.oracles import bulk_text_oracle as oracle
from tests.postgres_cluster import PostgresCluster

COLUMNS = (
    "id int8 NOT NULL, i2 int2, i4 int4, i8 int8, b bool, n numeric(38, 10), "
    "n0 numeric(38, 0), f4 float4, f8 float8, d date, ts timestamp(6), tz timestamptz, "
    "tm time, u uuid, by bytea, tx text, vc varchar(12), ch char(3), js json, jb jsonb"
)
KINDS = ["raw"] * 14 + ["binary", "text", "text", "text", "text", "text"]
# PostgreSQL's own text of each column, as the export must write it (floats: their bits).
EXPECTED = (
    "SELECT id::text, i2::text, i4::text, i8::text, b::int::text, n::text, n0::text, "
    "float4send(f4), float8send(f8), to_char(d, 'YYYY-MM-DD'), "
    "to_char(ts, 'YYYY-MM-DD HH24:MI:SS.US'), "
    "to_char(tz AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US'), "
    "to_char('2000-01-01'::date + tm, 'HH24:MI:SS.US'), u::text, by, tx, vc, ch, js::text, "
    "jb::text FROM {table} AS t ORDER BY t.id"
)
EXTREMES = [
    "1, -32768, -2147483648, -9223372036854775808, false, "
    "-9999999999999999999999999999.9999999999, -99999999999999999999999999999999999999, "
    "'-3.4028235e38', '-1.7976931348623157e308', '1900-01-01', '1900-01-01 00:00:00', "
    "'1900-01-01 00:00:00+00', '00:00:00', '00000000-0000-0000-0000-000000000000', "
    "'', '', '', '', '\"\"', '{}'",
    "2, 32767, 2147483647, 9223372036854775807, true, "
    "9999999999999999999999999999.9999999999, 99999999999999999999999999999999999999, "
    "'3.4028235e38', '1.7976931348623157e308', '2299-12-31', '2299-12-31 23:59:59.999999', "
    "'2299-12-31 23:59:59.999999+00', '23:59:59.999999', "
    "'FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF', '\\x00ff', 'x', 'y', 'abc', "
    '\'{"a":  [1, 2.50, "\\u00e9"]}\', \'{"k": "\\u00e9 \U0001f600", "a": [1, 2.50]}\'',
    "3, 0, 0, 0, false, 0, 0, '-0.0', '-0.0', '2000-02-29', '2020-06-01 12:34:56.000001', "
    "'2020-06-01 12:00:00.123456+05:30', '12:00:00.5', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', "
    "'\\x', ' ', ' ', ' ', 'null', 'null'",
    "4, 1, -1, 1, true, 0.0000000001, 1, '1.4e-45', '5e-324', '1969-12-31', "
    "'1999-12-31 23:59:59.999999', '1970-01-01 00:00:00-14:00', '00:00:00.000001', "
    "'6f9619ff-8b86-d011-b42d-00c04fc964ff', '\\x1d0a0d09', '\U0001f469\u200d\U0001f467', "
    "'\\', 'é', '[1,\"\\t\"]', '[1, \"\\t\"]'",
    "5, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
    "NULL, NULL, NULL, NULL, NULL",
]


@pytest.fixture
def pg(postgres: PostgresCluster) -> Iterator[tuple[psycopg.Connection[Any], str]]:
    """An autocommit connection and a fresh schema of the cluster's database."""
    schema = f"src_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres.url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        try:
            yield conn, schema
        finally:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def source_of(postgres: PostgresCluster) -> PostgresSource:
    return PostgresSource(postgres.host, postgres.port, postgres.database, postgres.user)


def export(
    source: PostgresSource,
    table: str,
    out: Path,
    progress: Callable[[int, int], None] | None = None,
) -> ExportResult:
    return export_table(source, table, out, progress=progress)


def nothing_left(directory: Path) -> bool:
    """No output file and no temporary sibling of one (an export that failed)."""
    return list(directory.iterdir()) == []


def test_hostile_values_are_exported_exactly(
    postgres: PostgresCluster, pg: tuple[psycopg.Connection[Any], str], tmp_path: Path
) -> None:
    conn, schema = pg
    table = f"{schema}.hostile"
    conn.execute(f"CREATE TABLE {table} ({COLUMNS})")
    for values in EXTREMES:
        conn.execute(f"INSERT INTO {table} VALUES ({values})".replace("%", "%%"))
    texts = [t for t in HOSTILE_TEXT if "\x00" not in t]  # text never holds NUL
    with conn.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO {table} (id, tx, vc) VALUES (%s, %s, %s)",
            [(100 + i, text, text[:12]) for i, text in enumerate(texts)],
        )
        cursor.executemany(
            f"INSERT INTO {table} (id, by) VALUES (%s, %s)",
            [(10_000 + i, blob) for i, blob in enumerate(HOSTILE_BINARY)],
        )
    result = export(source_of(postgres), table, tmp_path / "out.tsv")
    expected = conn.execute(EXPECTED.format(table=table)).fetchall()
    assert result.receipt.rows_validated == len(expected) == 5 + len(texts) + len(HOSTILE_BINARY)
    decoded = sorted(oracle.decode(result.path.read_bytes(), KINDS), key=lambda r: int(str(r[0])))
    for got, want in zip(decoded, expected, strict=True):
        assert [_float_bits(got[7], "!f"), _float_bits(got[8], "!d")] == [
            None if want[7] is None else bytes(want[7]),
            None if want[8] is None else bytes(want[8]),
        ], got[0]
        want_rest = [None if v is None else bytes(v) if isinstance(v, bytes) else v for v in want]
        assert [*got[:7], *got[9:]] == [*want_rest[:7], *want_rest[9:]], got[0]
    types = [c.source_type for c in result.receipt.schema.columns]
    assert types[:10] == [
        "bigint",
        "smallint",
        "int",
        "bigint",
        "bit",
        "decimal(38, 10)",
        "decimal(38, 0)",
        "real",
        "float(53)",
        "date",
    ]
    assert types[10:14] == ["datetime2(6)", "datetime2(6)", "time(6)", "uniqueidentifier"]


def _float_bits(text: object, layout: str) -> bytes | None:
    return None if text is None else struct.pack(layout, float(str(text)))


@pytest.mark.parametrize(
    ("column", "value", "code"),
    [
        ("f8", "'NaN'", "value_out_of_range"),
        ("f8", "'Infinity'", "value_out_of_range"),
        ("f4", "'-Infinity'", "value_out_of_range"),
        ("f4", "'NaN'", "value_out_of_range"),
        ("n", "'NaN'", "value_out_of_range"),
        ("d", "'1899-12-31'", "value_out_of_range"),
        ("d", "'2300-01-01'", "value_out_of_range"),
        ("d", "'infinity'", "value_out_of_range"),
        ("d", "'4713-01-01 BC'", "value_out_of_range"),
        ("d", "'5874897-12-31'", "value_out_of_range"),
        ("ts", "'-infinity'", "value_out_of_range"),
        ("ts", "'1899-12-31 23:59:59.999999'", "value_out_of_range"),
        ("tz", "'2300-01-01 00:00:00+00'", "value_out_of_range"),
        ("tm", "'24:00:00'", "value_out_of_range"),
    ],
)
def test_a_value_clickhouse_cannot_hold_is_refused_naming_row_and_column(
    postgres: PostgresCluster,
    pg: tuple[psycopg.Connection[Any], str],
    tmp_path: Path,
    column: str,
    value: str,
    code: str,
) -> None:
    conn, schema = pg
    table = f"{schema}.edge"
    conn.execute(f"CREATE TABLE {table} (id int8 NOT NULL, {column} {_type(column)})")
    conn.execute(f"INSERT INTO {table} SELECT g, NULL FROM generate_series(1, 2) g")
    conn.execute(f"INSERT INTO {table} VALUES (3, {value})")
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(DponeError) as refused:
        export(source_of(postgres), table, out / "edge.tsv")
    assert refused.value.code == code, refused.value
    assert refused.value.details["column"] == column
    assert refused.value.details["record"] == 3
    assert nothing_left(out)


def _type(column: str) -> str:
    return re.search(rf"\b{column} ([a-z0-9]+(?:\([0-9, ]+\))?)", COLUMNS)[1]  # type: ignore[index]


@pytest.mark.parametrize(
    ("declared", "shown"),
    [
        ("numeric", "numeric"),
        ("numeric(39, 0)", "numeric(39,0)"),
        ("interval", "interval"),
        ("int4[]", "integer[]"),
        ("money", "money"),
        ("timetz", "time with time zone"),
        ("inet", "inet"),
        ("positive", "positive"),
    ],
)
def test_a_type_without_an_exact_mapping_is_refused_before_the_export(
    postgres: PostgresCluster,
    pg: tuple[psycopg.Connection[Any], str],
    tmp_path: Path,
    declared: str,
    shown: str,
) -> None:
    conn, schema = pg
    conn.execute(f"CREATE DOMAIN {schema}.positive AS int4 CHECK (VALUE > 0)")
    conn.execute(f"SET search_path = {schema}")
    conn.execute(f"CREATE TABLE {schema}.odd (id int8, bad {declared})")
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(PolicyError) as refused:
        export(source_of(postgres), f"{schema}.odd", out / "odd.tsv")
    assert refused.value.code == "unsupported_type"
    assert refused.value.details["column"] == "bad"
    assert refused.value.details["source_type"].endswith(shown)
    assert "'bad'" in refused.value.message
    assert nothing_left(out)


def test_every_refused_column_is_named(
    postgres: PostgresCluster, pg: tuple[psycopg.Connection[Any], str]
) -> None:
    conn, schema = pg
    conn.execute(f"CREATE TABLE {schema}.odd (a interval, b int4, c numeric)")
    with pytest.raises(PolicyError) as refused:
        source_of(postgres).schema(f"{schema}.odd")
    assert [p["details"]["column"] for p in refused.value.details["problems"]] == ["a", "c"]


def _fill(conn: psycopg.Connection[Any], table: str, rows: int) -> None:
    conn.execute(f"CREATE TABLE {table} (id int8 NOT NULL, name text)")
    conn.execute(f"INSERT INTO {table} SELECT g, 'n' || g FROM generate_series(1, {rows}) g")


def test_a_connection_dropped_mid_export_is_coded_and_leaves_no_file(
    postgres: PostgresCluster, pg: tuple[psycopg.Connection[Any], str], tmp_path: Path
) -> None:
    conn, schema = pg
    _fill(conn, f"{schema}.big", 50_000)
    ended: list[bool] = []

    def terminate(records: int, size: int) -> None:
        if not ended:  # after the first 10,000 rows: the export's backend is ended
            found = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = 'dpone' AND pid <> pg_backend_pid()"
            ).fetchall()
            ended.append(found == [(True,)])

    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(SourceError) as lost:
        export(source_of(postgres), f"{schema}.big", out / "big.tsv", progress=terminate)
    assert ended == [True]
    assert lost.value.code == "source_read_failed"
    assert nothing_left(out)


def test_rows_written_during_the_export_are_not_in_its_snapshot(
    postgres: PostgresCluster, pg: tuple[psycopg.Connection[Any], str], tmp_path: Path
) -> None:
    conn, schema = pg
    table = f"{schema}.moving"
    _fill(conn, table, 30_000)

    def write(records: int, size: int) -> None:
        if records == 10_000:  # committed by another connection while the export reads
            conn.execute(f"INSERT INTO {table} SELECT g, 'late' FROM generate_series(-5, -1) g")
            conn.execute(f"DELETE FROM {table} WHERE id > 29000")

    result = export(source_of(postgres), table, tmp_path / "a.tsv", progress=write)
    ids = [int(str(r[0])) for r in oracle.decode(result.path.read_bytes(), ["raw", "text"])]
    assert sorted(ids) == list(range(1, 30_001))
    identity = result.receipt.source
    assert identity is not None and identity["kind"] == "postgres"
    assert identity["source"] == source_of(postgres).describe()
    assert re.fullmatch(r"\d+:\d+:(\d+(,\d+)*)?", identity["snapshot"])
    # The recorded snapshot is the rows': every exported row's writer is visible in it,
    # the late writer is not.
    visible = (
        f"SELECT bool_and(pg_visible_in_snapshot(xmin::text::xid8, %s::pg_snapshot)), "
        f"bool_or(pg_visible_in_snapshot(xmin::text::xid8, %s::pg_snapshot)) FROM {table} "
    )
    snap = identity["snapshot"]
    assert conn.execute(visible + "WHERE id > 0", (snap, snap)).fetchone() == (True, True)
    assert conn.execute(visible + "WHERE id < 0", (snap, snap)).fetchone() == (False, False)
    again = export(source_of(postgres), table, tmp_path / "b.tsv")
    assert again.receipt.rows_validated == 29_005
    assert again.receipt.source is not None
    assert again.receipt.source["snapshot"] != identity["snapshot"]


def test_the_password_comes_only_from_the_password_file(
    postgres: PostgresCluster,
    pg: tuple[psycopg.Connection[Any], str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    conn, schema = pg
    _fill(conn, f"{schema}.t", 3)
    password = postgres.passfile.read_text().strip().rsplit(":", 1)[1]
    empty = tmp_path / "pgpass"
    empty.write_text("")
    empty.chmod(0o600)
    monkeypatch.setenv("PGPASSFILE", str(empty))
    monkeypatch.setenv("PGPASSWORD", password)  # libpq's variable: never read by dpone
    with pytest.raises(SourceError) as refused:
        source_of(postgres).schema(f"{schema}.t")
    assert refused.value.code == "source_connect_failed" and password not in str(refused.value)
    monkeypatch.setenv("PGPASSFILE", str(postgres.passfile))
    dsn = f"postgresql://{postgres.user}@{postgres.host}:{postgres.port}/{postgres.database}"
    assert [c.name for c in open_source(dsn).schema(f"{schema}.t").columns] == ["id", "name"]
    with pytest.raises(DponeError) as in_url:
        open_source(dsn.replace("@", f":{password}@"))
    assert in_url.value.code == "credentials_in_dsn" and password not in str(in_url.value)
