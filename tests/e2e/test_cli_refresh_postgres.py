"""``dpone refresh`` from a PostgreSQL source (the session's throwaway cluster) into the
managed ClickHouse server: the published values are the source's, value for value."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests import chhttp
from tests.plugins.cli import as_json, dpone
from tests.plugins.refresh import protected_server
from tests.postgres_cluster import PostgresCluster

DATABASE = "pg_refresh_db"
COLUMNS = (
    "id int8 NOT NULL, name text, amount numeric(38, 6), f4 float4, f8 float8, ok bool, "
    "d date, ts timestamp, tz timestamptz(3), tm time, u uuid, raw bytea, js jsonb"
)
ROWS = [
    "1, 'tab\there', 12345678901234567890123456789012.123456, 1.1, 0.1, true, "
    "'1900-01-01', '2299-12-31 23:59:59.999999', '2020-06-01 12:00:00.123+05:30', "
    "'23:59:59.999999', 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11', '\\x00ff1d', "
    '\'{"k": "é 😀", "n": [1, 2.50]}\'',
    "2, '', -0.000001, '-0.0', '-0.0', false, '2299-12-31', '1900-01-01 00:00:00', "
    "'1900-01-01 00:00:00+00', '00:00:00', '00000000-0000-0000-0000-000000000000', '\\x', 'null'",
    "3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL",
]
# What ClickHouse shows of each column, and PostgreSQL's own text of the same value.
CLICKHOUSE = (
    "SELECT toString(id) AS id, name, toString(amount) AS amount, "
    "hex(reinterpretAsString(f4)) AS f4, hex(reinterpretAsString(f8)) AS f8, "
    "toString(ok) AS ok, toString(d) AS d, toString(ts) AS ts, toString(tz) AS tz, "
    "toString(tm) AS tm, toString(u) AS u, hex(raw) AS raw, js FROM {target} ORDER BY id"
)
POSTGRES = (
    "SELECT id::text, name, amount::text, float4send(f4), float8send(f8), ok::text, d::text, "
    "to_char(ts, 'YYYY-MM-DD HH24:MI:SS.US'), "
    "to_char(tz AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.MS'), "
    "to_char('2000-01-01'::date + tm, 'HH24:MI:SS.US'), u::text, upper(encode(raw, 'hex')), "
    "js::text FROM {table} ORDER BY id"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    yield from protected_server(tmp_path_factory, DATABASE, "pg-refresh-ch")


@pytest.fixture
def source_table(postgres: PostgresCluster) -> Iterator[tuple[psycopg.Connection[Any], str]]:
    schema = f"src_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres.url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"CREATE TABLE {schema}.items ({COLUMNS})")
        for row in ROWS:
            conn.execute(f"INSERT INTO {schema}.items VALUES ({row})")
        try:
            yield conn, f"{schema}.items"
        finally:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def _clickhouse_value(value: Any) -> Any:
    return None if value is None else str(value)


def _postgres_value(value: Any, column: int) -> Any:
    if value is None:
        return None
    if column in (3, 4):  # float4send/float8send: big-endian; ClickHouse shows little-endian
        return bytes(value)[::-1].hex().upper()
    return value


def _normalize_decimal(text: str | None) -> str | None:
    if text is None or "." not in text:
        return text
    whole = text.rstrip("0").rstrip(".")
    return "0" if whole in ("-0", "") else whole


def test_a_refresh_publishes_the_postgres_table_value_for_value(
    tmp_path: Path,
    server: dict[str, Any],
    postgres: PostgresCluster,
    source_table: tuple[psycopg.Connection[Any], str],
) -> None:
    conn, table = source_table
    config = tmp_path / "dpone.toml"
    config.write_text(
        '[project]\nwork_dir = "work"\nstore = "store.sqlite"\nkeep_exports = true\n'
        f'[clickhouse]\ndata_dir = "{server["data_dir"]}"\n'
        f'[sources.pg]\nkind = "postgres"\nhost = "{postgres.host}"\nport = {postgres.port}\n'
        f'dbname = "{postgres.database}"\nuser = "{postgres.user}"\nsslmode = "disable"\n'
        f'[tables.items]\nsource = "pg"\ntable = "{table}"\ntarget = "{DATABASE}.items"\n'
        'order_by = "id"\n'
    )
    done = dpone("refresh", "--config", str(config), "items", "--json")
    report = as_json(done)
    assert done.returncode == 0, report
    assert report["tables"][0]["outcome"] == "published" and report["tables"][0]["rows"] == 3
    # The export's receipt names the snapshot the rows were read from.
    receipt = json.loads((tmp_path / "work" / "exports" / "items.tsv.receipt.json").read_text())
    assert receipt["source"]["kind"] == "postgres"
    assert receipt["source"]["source"].startswith(f"postgresql://{postgres.user}@")
    published = chhttp.rows(server["http_port"], CLICKHOUSE.format(target=f"{DATABASE}.items"))
    shown = [[_clickhouse_value(v) for v in row.values()] for row in published]
    source = [
        [_postgres_value(v, i) for i, v in enumerate(row)]
        for row in conn.execute(POSTGRES.format(table=table)).fetchall()
    ]
    for row in (*shown, *source):  # Decimal's text: ClickHouse drops trailing zeros
        row[2] = _normalize_decimal(row[2])
        if row[5] is not None:
            row[5] = row[5] == "true"
    assert shown == source
    types = chhttp.rows(
        server["http_port"],
        f"SELECT name, type FROM system.columns WHERE database = '{DATABASE}' "
        "AND table = 'items' ORDER BY position",
    )
    assert [t["type"] for t in types] == [
        "Int64",
        "Nullable(String)",
        "Nullable(Decimal(38, 6))",
        "Nullable(Float32)",
        "Nullable(Float64)",
        "Nullable(Bool)",
        "Nullable(Date32)",
        "Nullable(DateTime64(6, 'UTC'))",
        "Nullable(DateTime64(3, 'UTC'))",
        "Nullable(Time64(6))",
        "Nullable(UUID)",
        "Nullable(String)",
        "Nullable(String)",
    ]
