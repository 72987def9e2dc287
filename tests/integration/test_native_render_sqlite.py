"""The compiled SQLite reader against sqlite3 and the Python renderer.

For every declared type of the policy and every value SQLite can store in it (after
its affinity: integers, reals, texts, blobs, NULL, hostile ones), the reader's record
must be the Python renderer's record of the row sqlite3 returns; a row it declines must
come back as exactly that row; text sqlite3 refuses must make the whole read decline,
and the export then names the same error as the Python path.
"""

from __future__ import annotations

import io
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from dpone.contracts.schema import SourceSchema
from dpone.errors import DponeError
from dpone.exporters import native_render
from dpone.exporters.export import export_table
from dpone.exporters.records import RecordWriter
from dpone.exporters.sources import SqliteSource, row_batches
from dpone.typepolicy import plan_columns
from dpone.typepolicy.source_types import parse_source_type
from tests.hostile_values import HOSTILE_BINARY, HOSTILE_TEXT
from tests.plugins.type_samples import GUID, TYPES

INTEGERS = [0, 1, -1, 2, 255, 256, 2**31, -(2**63), 2**63 - 1, 20200101]
REALS = [0.0, -0.0, 0.1, 0.5, 1.5, 1234.5, -5165434168404.59, 1e-5, 1e-4, 1e15, 1e16]
REALS += [100000000000000.0, 0.1 + 0.2, 3.4028234663852886e38, 0.10000000149011612]
REALS += [5e-324, float("inf"), float("-inf"), 1.7976931348623157e308, 16777217.0]
TEXTS = [t for t in HOSTILE_TEXT if "\ud800" not in t] + [
    "2020-01-02",
    "2020-01-02 03:04:05.1234567",
    "12:00:00.1234567",
    "2020-01-02 03:04:05.1234567 +05:30",
    GUID,
    GUID.upper(),
    "{" + GUID + "}",
    GUID.replace("-", ""),
    "-" * 36,
    "1.50",
    "12345678901234567890.25",
    "abc",
    "1e5",
    "\x00",
    "a\x00b",
]
BLOBS = list(HOSTILE_BINARY)
VALUES: list[Any] = [None, *INTEGERS, *REALS, *TEXTS, *BLOBS]
# Bytes sqlite3 refuses to decode: not UTF-8, a surrogate, an overlong form, beyond U+10FFFF.
NOT_UTF8 = ["ff", "eda080", "c080", "f4908080", "61e2"]


def _table(path: Path, source_type: str, values: list[Any]) -> SqliteSource:
    with sqlite3.connect(path) as conn:
        conn.execute(f'CREATE TABLE t (v "{source_type}")')
        conn.executemany("INSERT INTO t VALUES (?)", [(v,) for v in values])
    conn.close()
    return SqliteSource(path)


def _python_record(schema: SourceSchema, row: tuple[Any, ...]) -> bytes | tuple[Any, ...]:
    plans = plan_columns(schema.columns)
    types = [parse_source_type(c.source_type, column=c.name) for c in schema.columns]
    stream = io.BytesIO()
    try:
        RecordWriter(stream, types, plans, native=False).write([row])
    except DponeError as exc:
        return exc.code, exc.details
    return stream.getvalue()


def _ops(schema: SourceSchema) -> bytes:
    plans = plan_columns(schema.columns)
    types = [parse_source_type(c.source_type, column=c.name) for c in schema.columns]
    ops = native_render.ops_for(types, [p.codec_column for p in plans])
    assert ops is not None
    return ops


def _exact(row: tuple[Any, ...]) -> list[tuple[type, str]]:
    return [(type(v), repr(v)) for v in row]


@pytest.mark.parametrize("source_type", TYPES)
def test_every_stored_value_reads_as_sqlite3_and_the_python_renderer_give_it(
    tmp_path: Path, source_type: str
) -> None:
    source = _table(tmp_path / "s.db", source_type, VALUES)
    schema = source.schema("t")
    driver = [row for batch in row_batches(source, "t", schema) for row in batch]
    compiled = source.compiled_rows("t", schema, _ops(schema))
    assert compiled is not None
    differing = []
    for row in driver:
        data, taken, declined = compiled.read(1)
        expected = _python_record(schema, row)
        if taken:
            if data != expected:
                differing.append((row, data, expected))
        elif declined is None or _exact(declined) != _exact(row):
            differing.append((row, b"", declined or b""))
    assert compiled.read(1) == (b"", 0, None)  # and nothing more
    compiled.close()
    assert not differing, differing[:5]


@pytest.mark.parametrize(
    ("source_type", "values"),
    [
        ("bigint", INTEGERS),
        ("decimal(18, 2)", [1234.5, -5165434168404.59, 7, -0.0]),
        ("float", REALS),
        ("datetime2(7)", ["2020-01-02 03:04:05.1234567"]),
        ("uniqueidentifier", [GUID, GUID.upper()]),
        ("nvarchar(max)", TEXTS),
        ("varbinary(max)", BLOBS),
    ],
)
def test_the_common_values_are_the_readers_own(
    tmp_path: Path, source_type: str, values: list[Any]
) -> None:
    source = _table(tmp_path / "s.db", source_type, values)
    schema = source.schema("t")
    records = [
        _python_record(schema, row) for batch in row_batches(source, "t", schema) for row in batch
    ]
    assert all(isinstance(r, bytes) for r in records)
    expected = b"".join(r for r in records if isinstance(r, bytes))
    compiled = source.compiled_rows("t", schema, _ops(schema))
    assert compiled is not None
    assert compiled.read(10**6) == (expected, len(values), None)


def _outcome(source: SqliteSource, out: Path, *, native: bool) -> Any:
    try:
        result = export_table(source, "t", out, force=True, native=native)
    except DponeError as exc:
        return type(exc), exc.code, exc.details, exc.message
    return out.read_bytes(), result.receipt


@pytest.mark.parametrize("hex_text", NOT_UTF8)
def test_text_sqlite3_refuses_makes_the_export_read_through_sqlite3(
    tmp_path: Path, hex_text: str
) -> None:
    path = tmp_path / "s.db"
    source = _table(path, "nvarchar(max)", ["a", "b"])
    with sqlite3.connect(path) as conn:
        conn.execute(f"INSERT INTO t VALUES (CAST(X'{hex_text}' AS TEXT))")
        conn.execute("INSERT INTO t VALUES ('c')")
    conn.close()
    schema = source.schema("t")
    compiled = source.compiled_rows("t", schema, _ops(schema))
    assert compiled is not None
    with pytest.raises(native_render.Declined):
        compiled.read(100)
    expected = _outcome(source, tmp_path / "python.tsv", native=False)
    assert expected[1] == "source_read_failed"
    assert _outcome(source, tmp_path / "native.tsv", native=True) == expected


def test_a_declined_row_mid_table_is_refused_at_its_record_or_written_in_its_place(
    tmp_path: Path,
) -> None:
    rows = [(i, f"n\t{i}", i * 0.5, GUID.upper()) for i in range(1, 30_001)]
    path = tmp_path / "s.db"
    with sqlite3.connect(path) as conn:
        conn.execute(
            'CREATE TABLE t (a bigint, b "nvarchar(max)", c decimal(38, 10), d uniqueidentifier)'
        )
        conn.executemany("INSERT INTO t VALUES (?, ?, ?, ?)", rows)
        # Python writes the first (an exponent float), refuses the second (text in a bigint).
        conn.execute("UPDATE t SET c = 1e-7 WHERE a = 12345")
        conn.execute("UPDATE t SET a = 'x' WHERE a = 20001")
    conn.close()
    source = SqliteSource(path)
    expected = _outcome(source, tmp_path / "python.tsv", native=False)
    assert expected[1] == "value_not_renderable" and expected[2]["record"] == 20001
    assert _outcome(source, tmp_path / "native.tsv", native=True) == expected
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE t SET a = 20001 WHERE a = 'x'")
    conn.close()
    fine = _outcome(source, tmp_path / "python.tsv", native=False)
    assert isinstance(fine[0], bytes) and b"\t0.0000001\t" in fine[0], fine
    assert _outcome(source, tmp_path / "native.tsv", native=True) == fine


def test_the_export_reports_progress_as_before(tmp_path: Path) -> None:
    source = _table(tmp_path / "s.db", "bigint", list(range(25_000)))
    seen: list[tuple[int, int]] = []
    export_table(source, "t", tmp_path / "o.tsv", progress=lambda r, b: seen.append((r, b)))
    size = (tmp_path / "o.tsv").stat().st_size
    assert [r for r, _ in seen] == [10_000, 20_000, 25_000] and seen[-1][1] == size
