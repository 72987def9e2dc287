"""SQLite export -> bulk text file + receipt -> validation and verification."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from dpone.contracts.receipt import FileReceipt
from dpone.contracts.schema import SourceColumn, SourceSchema
from dpone.errors import PolicyError
from dpone.exporters.export import export_table
from dpone.exporters.sources import SqliteSource, open_source
from dpone.preparation.artifact import ArtifactMismatch, HeldArtifact
from dpone.preparation.conversion import ValueNotRepresentable
from dpone.preparation.file_validation import validate_file
from tests.oracles import bulk_text_oracle as oracle
from tests.plugins.staging import make_hostile_db


def test_hostile_export_validates_and_every_value_agrees(tmp_path: Path) -> None:
    rows = make_hostile_db(tmp_path / "src.db")
    result = export_table(
        open_source(f"sqlite:{tmp_path / 'src.db'}"), "hostile", tmp_path / "out.tsv"
    )
    assert result.receipt.rows_validated == len(rows)
    data = result.path.read_bytes()
    assert result.receipt.artifact_size == len(data)
    decoded = oracle.decode(data, ["raw", "text", "binary", "raw", "raw", "raw"])
    # SQLite's NUMERIC affinity keeps "12.5000" as the REAL 12.5; GUIDs render lowercase.
    amounts = {"12.5000": "12.5", "-1.5": "-1.5", None: None}
    expected = [
        (str(i), t, b, amounts[a], ts, None if g is None else str(g).lower())  # type: ignore[index]
        for i, t, b, a, ts, g in rows
    ]
    assert decoded == expected
    # The receipt on disk is canonical and equals a fresh validation.
    on_disk = FileReceipt.from_bytes(result.receipt_path.read_bytes())
    assert on_disk == result.receipt
    assert validate_file(result.path, on_disk.schema) == on_disk
    with HeldArtifact(result.path, on_disk) as held:
        assert held.verify().sha256 == on_disk.artifact_sha256
    assert [c.source_type for c in on_disk.schema.columns] == [
        "bigint",
        "nvarchar",
        "varbinary",
        "decimal(18, 4)",
        "datetime2(7)",
        "uniqueidentifier",
    ]
    assert [c.nullable for c in on_disk.schema.columns] == [False, True, True, True, True, True]


def test_modification_and_replacement_are_detected(tmp_path: Path) -> None:
    make_hostile_db(tmp_path / "src.db")
    result = export_table(SqliteSource(tmp_path / "src.db"), "hostile", tmp_path / "out.tsv")
    with HeldArtifact(result.path, result.receipt) as held:
        held.verify()
        # Replace the file under the same name with identical bytes: still refused.
        copy = tmp_path / "copy.tsv"
        copy.write_bytes(result.path.read_bytes())
        os.replace(copy, result.path)
        with pytest.raises(ArtifactMismatch) as replaced:
            held.verify()
        assert replaced.value.code == "artifact_replaced"
    with HeldArtifact(result.path, result.receipt) as held:
        held.verify()
        with open(result.path, "r+b") as f:
            f.seek(3)
            byte = f.read(1)
            f.seek(3)
            f.write(bytes([byte[0] ^ 1]))
        with pytest.raises(ArtifactMismatch) as modified:
            held.verify()
        assert modified.value.code == "artifact_hash_mismatch"
        with open(result.path, "ab") as f:
            f.write(b"x")
        with pytest.raises(ArtifactMismatch) as grown:
            held.verify()
        assert grown.value.code == "artifact_size_mismatch"


def test_pread_keeps_a_shared_descriptor_position(tmp_path: Path) -> None:
    make_hostile_db(tmp_path / "src.db")
    result = export_table(SqliteSource(tmp_path / "src.db"), "hostile", tmp_path / "out.tsv")
    with HeldArtifact(result.path, result.receipt) as held:
        os.lseek(held.fd, 5, os.SEEK_SET)
        held.verify()
        assert os.lseek(held.fd, 0, os.SEEK_CUR) == 5


def test_failed_export_leaves_no_file_that_looks_finished(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "src.db") as conn:
        conn.execute("CREATE TABLE t (id int NOT NULL, d date)")
        conn.executemany("INSERT INTO t VALUES (?, ?)", [(1, "2000-01-01"), (2, "1899-12-31")])
    with pytest.raises(ValueNotRepresentable) as caught:
        export_table(SqliteSource(tmp_path / "src.db"), "t", tmp_path / "out.tsv")
    assert caught.value.details["record"] == 2 and caught.value.details["column"] == "d"
    assert caught.value.details["source"] == str(tmp_path / "out.tsv")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src.db"]


def test_unsupported_type_is_refused_before_reading(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "src.db") as conn:
        conn.execute("CREATE TABLE t (id int, geo geography)")
    with pytest.raises(PolicyError) as caught:
        export_table(SqliteSource(tmp_path / "src.db"), "t", tmp_path / "out.tsv")
    assert caught.value.code == "unsupported_type" and caught.value.details["column"] == "geo"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src.db"]


def test_not_null_violation_names_row_and_column(tmp_path: Path) -> None:
    path = tmp_path / "f.tsv"
    path.write_bytes(b"1\tx\n\ty\n")
    schema = SourceSchema.of(
        [SourceColumn("id", "int", False), SourceColumn("s", "varchar(5)", True)]
    )
    with pytest.raises(ValueNotRepresentable) as caught:
        validate_file(path, schema)
    assert caught.value.code == "null_not_allowed"
    assert (caught.value.details["record"], caught.value.details["column"]) == (2, "id")
