"""An export never reads the wrong database, never writes over a user's file, and
leaves its two outputs together or not at all (issue 9, items 1 to 4)."""

from __future__ import annotations

import os
import sqlite3
import struct
from pathlib import Path

import pytest

from dpone.contracts.receipt import FileReceipt
from dpone.contracts.schema import SourceColumn
from dpone.durable_files import OutputRefused, atomic_outputs
from dpone.errors import ConfigurationError, PolicyError
from dpone.exporters.export import export_table
from dpone.exporters.render import RenderError
from dpone.exporters.sources import SourceError, SqliteSource, open_source
from dpone.typepolicy import plan_column
from tests.oracles import bulk_text_oracle as oracle


def make_db(path: Path, marker: str) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (id bigint NOT NULL, s nvarchar(20))")
        conn.execute("INSERT INTO t VALUES (1, ?)", (marker,))


def exported_marker(source_dsn: str, out: Path) -> str:
    result = export_table(open_source(source_dsn), "t", out)
    rows = oracle.decode(result.path.read_bytes(), ["raw", "text"])
    assert len(rows) == 1
    marker = rows[0][1]
    assert isinstance(marker, str)
    return marker


# ----------------------------------------------------------------------------- item 1


@pytest.mark.parametrize(
    "name", ["a?b.db", "a#b.db", "a%b.db", "a%3Fb.db", "a%23b.db", "a?mode=rwc.db", "sp ace.db"]
)
def test_sqlite_paths_with_url_characters_open_exactly_that_file(tmp_path: Path, name: str) -> None:
    src = tmp_path / "src"
    src.mkdir()
    # Decoys: every file an ill-parsed spelling could reach instead.
    for decoy in (
        "a",
        "a.db",
        "a?b.db",
        "a#b.db",
        "a%b.db",
        "a%3Fb.db",
        "a%23b.db",
        "a?mode=rwc.db",
    ):
        if decoy != name:
            make_db(src / decoy, f"decoy {decoy}")
    make_db(src / name, "the one")
    before = sorted(p.name for p in src.iterdir())
    out = tmp_path / "out"
    out.mkdir()
    for n, dsn in enumerate([f"sqlite:{src / name}", f"sqlite://{src / name}"]):
        assert exported_marker(dsn, out / f"{n}.tsv") == "the one"
    relative = os.path.relpath(src / name)
    assert exported_marker(f"sqlite:{relative}", out / "rel.tsv") == "the one"
    assert sorted(p.name for p in src.iterdir()) == before  # nothing created beside it


@pytest.mark.parametrize("name", ["missing?x.db", "missing#x.db", "missing%3F.db", "new.db"])
def test_a_missing_sqlite_source_is_refused_and_never_created(tmp_path: Path, name: str) -> None:
    make_db(tmp_path / "missing", "decoy")  # what a cut at ? or # would open
    with pytest.raises(SourceError) as caught:
        export_table(open_source(f"sqlite:{tmp_path / name}"), "t", tmp_path / "o.tsv")
    assert caught.value.code == "source_not_found" and caught.value.details["path"] == str(
        tmp_path / name
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["missing"]


def test_the_source_is_opened_read_only(tmp_path: Path) -> None:
    db = tmp_path / "src.db"
    make_db(db, "x")
    db.chmod(0o444)  # a read-write open would still work for root, so also check bytes
    before = db.read_bytes()
    export_table(SqliteSource(db), "t", tmp_path / "o.tsv")
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.tsv", "o.tsv.receipt.json", "src.db"]


@pytest.mark.parametrize(
    ("dsn", "says"),
    [
        ("sqlite:////{abs}", "SQLAlchemy"),
        ("sqlite://host/{abs}", "host"),
        ("sqlite:", "no database path"),
    ],
)
def test_other_sqlite_spellings_get_a_coded_error(tmp_path: Path, dsn: str, says: str) -> None:
    make_db(tmp_path / "src.db", "x")
    abs_path = str(tmp_path / "src.db").lstrip("/")
    with pytest.raises(ConfigurationError) as caught:
        open_source(dsn.format(abs=abs_path))
    assert caught.value.code == "invalid_dsn" and says in caught.value.message
    if "SQLAlchemy" in says:
        assert f"sqlite:/{abs_path}" in caught.value.message  # what to write instead


def test_a_file_that_is_not_sqlite_gets_a_coded_error(tmp_path: Path) -> None:
    fake = tmp_path / "notes.db"
    fake.write_bytes(b"this is a text file, not a database\n" * 10)
    with pytest.raises(SourceError) as caught:
        export_table(open_source(f"sqlite:{fake}"), "t", tmp_path / "o.tsv")
    assert caught.value.code == "not_a_sqlite_database"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.db"]


# ----------------------------------------------------------------------------- item 2


def test_out_equal_to_the_source_is_refused_and_the_source_survives(tmp_path: Path) -> None:
    db = tmp_path / "src.db"
    make_db(db, "precious")
    before = db.read_bytes()
    (tmp_path / "link.db").symlink_to(db)
    os.link(db, tmp_path / "hard.db")
    for out in (db, tmp_path / "." / "src.db", tmp_path / "link.db", tmp_path / "hard.db"):
        with pytest.raises(OutputRefused) as caught:
            export_table(SqliteSource(db), "t", out, force=True)
        assert caught.value.code == "output_is_input"
    for receipt in (db, tmp_path / "hard.db"):
        with pytest.raises(OutputRefused) as caught:
            export_table(SqliteSource(db), "t", tmp_path / "o.tsv", receipt_out=receipt, force=True)
        assert caught.value.code == "output_is_input"
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hard.db", "link.db", "src.db"]


def test_receipt_equal_to_the_data_file_is_refused(tmp_path: Path) -> None:
    make_db(tmp_path / "src.db", "x")
    out = tmp_path / "o.tsv"
    with pytest.raises(OutputRefused) as caught:
        export_table(SqliteSource(tmp_path / "src.db"), "t", out, receipt_out=out)
    assert caught.value.code == "outputs_collide"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src.db"]


def test_existing_outputs_are_kept_unless_forced(tmp_path: Path) -> None:
    make_db(tmp_path / "src.db", "new")
    out = tmp_path / "o.tsv"
    receipt = tmp_path / "o.tsv.receipt.json"
    for existing in (out, receipt):
        existing.write_bytes(b"keep me")
        with pytest.raises(OutputRefused) as caught:
            export_table(SqliteSource(tmp_path / "src.db"), "t", out)
        assert caught.value.code == "output_exists"
        assert existing.read_bytes() == b"keep me"
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["src.db", existing.name])
        existing.unlink()
    out.write_bytes(b"old data")
    receipt.write_bytes(b"old receipt")
    result = export_table(SqliteSource(tmp_path / "src.db"), "t", out, force=True)
    assert oracle.decode(out.read_bytes(), ["raw", "text"]) == [("1", "new")]
    assert FileReceipt.from_bytes(receipt.read_bytes()) == result.receipt


# ----------------------------------------------------------------------------- item 3


def test_a_missing_receipt_directory_fails_before_anything_is_written(tmp_path: Path) -> None:
    make_db(tmp_path / "src.db", "x")
    with pytest.raises(OutputRefused) as caught:
        export_table(
            SqliteSource(tmp_path / "src.db"),
            "t",
            tmp_path / "o.tsv",
            receipt_out=tmp_path / "no" / "r.json",
        )
    assert caught.value.code == "output_directory_missing"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src.db"]


def test_a_failure_between_the_renames_removes_the_first_output(tmp_path: Path) -> None:
    first, second = tmp_path / "data", tmp_path / "receipt"

    def write_both() -> None:
        with atomic_outputs([first, second]) as (a, b):
            a.write(b"data")
            b.write(b"receipt")
            second.write_bytes(b"someone else's")  # appears after the check: link() refuses

    with pytest.raises(OutputRefused) as caught:
        write_both()
    assert caught.value.code == "output_exists"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["receipt"]
    assert second.read_bytes() == b"someone else's"


# ----------------------------------------------------------------------------- item 4


def _f32(value: float) -> float:
    widened: float = struct.unpack("<f", struct.pack("<f", value))[0]
    return widened


def test_sqlite_real_is_binary64_and_declared_float24_must_be_exact(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "src.db") as conn:
        conn.execute("CREATE TABLE d (id INTEGER NOT NULL, x REAL, t TEXT, b BLOB)")
        conn.execute("INSERT INTO d VALUES (?, ?, ?, ?)", (2**62, 0.1, "ü", b"\x00"))
        conn.execute("INSERT INTO d VALUES (?, ?, ?, ?)", (-1, 0.123456789, None, None))
        conn.execute("CREATE TABLE s (x float(24))")
        conn.execute("INSERT INTO s VALUES (?)", (_f32(0.1),))
        conn.execute("INSERT INTO s VALUES (?)", (0.1,))
    result = export_table(SqliteSource(tmp_path / "src.db"), "d", tmp_path / "d.tsv")
    assert [c.source_type for c in result.receipt.schema.columns] == [
        "bigint",
        "float(53)",
        "nvarchar(max)",
        "varbinary(max)",
    ]
    assert oracle.decode(result.path.read_bytes(), ["raw", "raw", "text", "binary"]) == [
        (str(2**62), "0.1", "ü", b"\x00"),
        ("-1", "0.123456789", None, None),
    ]
    assert [plan_column(c).clickhouse_type for c in result.receipt.schema.columns] == [
        "Int64",
        "Nullable(Float64)",
        "Nullable(String)",
        "Nullable(String)",
    ]
    # float(24) holds binary32: the first row is one, the double 0.1 is not.
    with pytest.raises(RenderError) as caught:
        export_table(SqliteSource(tmp_path / "src.db"), "s", tmp_path / "s.tsv")
    assert (caught.value.details["record"], caught.value.details["column"]) == (2, "x")
    assert "0.1" not in caught.value.message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.tsv", "d.tsv.receipt.json", "src.db"]


@pytest.mark.parametrize(
    ("declared", "declare"),
    [
        ("DOUBLE", "float(53)"),
        ("double precision", "float(53)"),
        ("BOOLEAN", "bit"),
        ("INT8", "bigint"),
        ("UNSIGNED BIG INT", "bigint"),
        ("CLOB", "nvarchar(max)"),
        ("VARCHAR2(10)", "nvarchar(max)"),
        ("timestamp", "datetime2(7)"),
    ],
)
def test_sqlite_declarations_without_a_lossless_meaning_name_the_type_to_declare(
    tmp_path: Path, declared: str, declare: str
) -> None:
    with sqlite3.connect(tmp_path / "src.db") as conn:
        conn.execute(f"CREATE TABLE t (c {declared})")
    with pytest.raises(PolicyError) as caught:
        export_table(SqliteSource(tmp_path / "src.db"), "t", tmp_path / "o.tsv")
    assert caught.value.details["column"] == "c" and declare in caught.value.message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src.db"]


def test_sql_server_type_names_keep_working_in_sqlite(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "src.db") as conn:
        # real and text are also SQLite's own names, so they are read as SQLite stores them.
        # SQLite's grammar has no (max): the type is written as a quoted name.
        conn.execute(
            'CREATE TABLE t (a int, b "nvarchar(max)", c "varbinary(max)", d real, e text)'
        )
        conn.execute("INSERT INTO t VALUES (1, 'x', x'01', 0.5, 'y')")
    result = export_table(SqliteSource(tmp_path / "src.db"), "t", tmp_path / "o.tsv")
    assert [c.source_type for c in result.receipt.schema.columns] == [
        "int",
        "nvarchar(max)",
        "varbinary(max)",
        "float(53)",
        "nvarchar(max)",
    ]
    assert plan_column(SourceColumn("a", "int", True)).clickhouse_type == "Nullable(Int32)"


def test_a_source_that_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.db")  # opening it to read the header would block
    (tmp_path / "dir.db").mkdir()
    for name in ("pipe.db", "dir.db"):
        with pytest.raises(SourceError) as caught:
            SqliteSource(tmp_path / name)
        assert caught.value.code == "source_not_found" and "regular file" in caught.value.message
