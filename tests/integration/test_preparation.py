"""RowBinary preparation: sealed private spools, identity, budgets and source checks."""

from __future__ import annotations

import os
import stat
import struct
from collections.abc import Iterator
from datetime import date
from pathlib import Path

import pytest

from dpone.contracts.preparation import rows_digest_sql
from dpone.contracts.schema import SourceColumn, SourceSchema
from dpone.errors import DeadlineError
from dpone.exporters.export import export_table
from dpone.exporters.sources import SqliteSource
from dpone.localserver import ServerInfo
from dpone.preparation.artifact import ArtifactMismatch, HeldArtifact
from dpone.preparation.conversion import ValueNotRepresentable
from dpone.preparation.file_validation import validate_file
from dpone.preparation.spool import PreparationBudget, PreparationError, prepare_rowbinary
from tests import chhttp
from tests.oracles.rowbinary_oracle import decode_rows
from tests.plugins.staging import make_hostile_db

SCHEMA = SourceSchema.of(
    [
        SourceColumn("id", "int", False),
        SourceColumn("s", "nvarchar(20)", True),
        SourceColumn("d", "date", True),
    ]
)


def write_file(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"".join(lines))
    return path


@pytest.fixture
def sample(tmp_path: Path) -> Path:
    return write_file(
        tmp_path / "in.tsv",
        [b"%d\tname %d\t2020-01-%02d\n" % (i, i, i % 28 + 1) for i in range(1, 3001)],
    )


def test_spool_is_private_sealed_and_exact(sample: Path, tmp_path: Path) -> None:
    receipt = validate_file(sample, SCHEMA)
    prepared = prepare_rowbinary(sample, receipt, tmp_path / "spool")
    assert stat.S_IMODE((tmp_path / "spool").stat().st_mode) == 0o700
    assert stat.S_IMODE(prepared.path.stat().st_mode) == 0o400
    data = prepared.path.read_bytes()
    ident = prepared.identity
    assert ident.prepared_rows == 3000 and ident.rowbinary_bytes == len(data)
    import hashlib

    assert ident.rowbinary_sha256 == hashlib.sha256(data).hexdigest()
    # The rows digest, from rows encoded here by hand (Int32, Nullable(String), Nullable(Date32)).
    by_hand = [
        struct.pack("<i", i)
        + b"\x00"
        + bytes([len(b"name %d" % i)])
        + b"name %d" % i
        + b"\x00"
        + struct.pack("<i", (date(2020, 1, i % 28 + 1) - date(1970, 1, 1)).days)
        for i in range(1, 3001)
    ]
    assert b"".join(by_hand) == data
    total = sum(int.from_bytes(hashlib.sha256(r).digest()[:16], "little") for r in by_hand)
    assert ident.rows_digest == format(total % 2**128, "032x")
    assert ident.to_document()["rows_digest"] == ident.rows_digest
    assert ident.to_document()["preparation_version"] == "dpone-rowbinary-preparation/3"
    assert ident.source_receipt_sha256 == receipt.sha256
    rows = decode_rows(data, [c.clickhouse_type for c in ident.target_schema], rows=3000)
    assert rows[0][0] == 1 and rows[0][1] == b"name 1" and str(rows[0][2]) == "2020-01-02"
    assert [c.clickhouse_type for c in ident.target_schema] == [
        "Int32",
        "Nullable(String)",
        "Nullable(Date32)",
    ]


def test_semantic_id_is_stable_across_attempts_and_excludes_paths(
    sample: Path, tmp_path: Path
) -> None:
    receipt = validate_file(sample, SCHEMA)
    first = prepare_rowbinary(sample, receipt, tmp_path / "a")
    copy = tmp_path / "elsewhere.tsv"
    copy.write_bytes(sample.read_bytes())
    second = prepare_rowbinary(copy, receipt, tmp_path / "b")
    assert first.semantic_id == second.semantic_id and first.path != second.path
    widened = prepare_rowbinary(sample, receipt, tmp_path / "c", overrides={"id": "Int64"})
    assert widened.semantic_id != first.semantic_id


def test_existing_spool_directory_is_refused(sample: Path, tmp_path: Path) -> None:
    (tmp_path / "spool").mkdir()
    (tmp_path / "spool" / "keep.txt").write_text("mine")
    with pytest.raises(PreparationError) as caught:
        prepare_rowbinary(sample, validate_file(sample, SCHEMA), tmp_path / "spool")
    assert caught.value.code == "spool_exists"
    assert (tmp_path / "spool" / "keep.txt").read_text() == "mine"  # nothing of ours removed


class FakeClock:
    """Advances one second per reading: a deterministic monotonic clock."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


@pytest.mark.parametrize(
    ("budget", "code", "record"),
    [
        (PreparationBudget(max_record_bytes=20), "record_too_large", 10),
        (PreparationBudget(max_rows=2999), "too_many_records", 3000),
        (PreparationBudget(max_spool_bytes=1000), "spool_budget_exceeded", 57),
        (PreparationBudget(free_space_reserve_bytes=1 << 62), "free_space_reserve", 0),
    ],
)
def test_budgets_stop_with_code_and_position_and_remove_the_spool(
    sample: Path, tmp_path: Path, budget: PreparationBudget, code: str, record: int
) -> None:
    with pytest.raises(PreparationError) as caught:
        prepare_rowbinary(sample, validate_file(sample, SCHEMA), tmp_path / "spool", budget=budget)
    assert caught.value.code == code
    assert caught.value.details["record"] == record
    assert not (tmp_path / "spool").exists()


def test_deadline_on_an_injected_clock(sample: Path, tmp_path: Path) -> None:
    # Reading 1 sets the deadline, reading 2 is the entry check, reading 3 follows verification.
    budget = PreparationBudget(deadline_seconds=2.5, clock=FakeClock())
    with pytest.raises(DeadlineError) as caught:
        prepare_rowbinary(sample, validate_file(sample, SCHEMA), tmp_path / "spool", budget=budget)
    assert caught.value.code == "preparation_deadline"
    assert caught.value.details["phase"] == "conversion (record 1024)"
    assert not (tmp_path / "spool").exists()


def test_value_errors_name_record_and_column(tmp_path: Path) -> None:
    path = write_file(tmp_path / "in.tsv", [b"1\ta\t2020-01-01\n", b"2\tb\t1800-01-01\n"])
    schema_ok = SourceSchema.of(
        [
            SourceColumn("id", "int", False),
            SourceColumn("s", "nvarchar(20)", True),
            SourceColumn("d", "nvarchar(20)", True),
        ]
    )
    receipt = validate_file(path, schema_ok)
    forged = type(receipt)(
        **{**receipt.__dict__, "schema": SCHEMA}
    )  # a receipt that lies about types
    with pytest.raises(ValueNotRepresentable) as caught:
        prepare_rowbinary(path, forged, tmp_path / "spool")
    assert (caught.value.details["record"], caught.value.details["column"]) == (2, "d")
    assert not (tmp_path / "spool").exists()


def test_source_modified_before_preparation_is_refused(sample: Path, tmp_path: Path) -> None:
    receipt = validate_file(sample, SCHEMA)
    with open(sample, "r+b") as f:
        f.write(b"9")
    with pytest.raises(ArtifactMismatch) as caught:
        prepare_rowbinary(sample, receipt, tmp_path / "spool")
    assert caught.value.code == "artifact_hash_mismatch"
    assert not (tmp_path / "spool").exists()


def test_source_modified_during_conversion_is_refused(sample: Path, tmp_path: Path) -> None:
    receipt = validate_file(sample, SCHEMA)

    class Tampering(HeldArtifact):
        def stream(self) -> Iterator[bytes]:  # type: ignore[override]
            with open(self.path, "r+b") as f:  # after verification, before the read
                f.seek(-2, os.SEEK_END)  # the last day digit: still a valid date
                f.write(b"6")
            return super().stream()

    with Tampering(sample, receipt) as held, pytest.raises(ArtifactMismatch) as caught:
        prepare_rowbinary(sample, receipt, tmp_path / "spool", held=held)
    assert caught.value.code == "artifact_changed_during_preparation"
    assert not (tmp_path / "spool").exists()


def test_hostile_export_prepared_and_read_back_from_the_server(
    clickhouse: ServerInfo, tmp_path: Path
) -> None:
    rows = make_hostile_db(tmp_path / "src.db")
    exported = export_table(SqliteSource(tmp_path / "src.db"), "hostile", tmp_path / "h.tsv")
    prepared = prepare_rowbinary(exported.path, exported.receipt, tmp_path / "spool")
    port = clickhouse.http_port
    chhttp.query(port, "CREATE DATABASE IF NOT EXISTS prep_db ENGINE = Atomic")
    ddl = ", ".join(f"`{c.name}` {c.clickhouse_type}" for c in prepared.identity.target_schema)
    chhttp.query(port, f"CREATE TABLE prep_db.hostile ({ddl}) ENGINE = MergeTree ORDER BY tuple()")
    chhttp.query(
        port, "INSERT INTO prep_db.hostile FORMAT RowBinary", data=prepared.path.read_bytes()
    )
    # The server's order-independent digest of what it stored equals preparation's.
    names = [f"`{c.name}`" for c in prepared.identity.target_schema]
    server_digest = chhttp.rows(port, f"SELECT {rows_digest_sql(names)} AS d FROM prep_db.hostile")
    assert server_digest == [{"d": prepared.identity.rows_digest}]
    got = chhttp.rows(
        port,
        "SELECT id, hex(txt) AS t, isNull(txt) AS tn, hex(bin) AS b, isNull(bin) AS bn, toString(amount) AS a FROM prep_db.hostile",
    )
    by_id: dict[int, list[dict[str, object]]] = {}
    for r in got:
        by_id.setdefault(int(r["id"]), []).append(r)
    assert sum(len(v) for v in by_id.values()) == len(rows)
    for rid, text, blob, amount, _ts, _g in rows:
        for r in by_id[int(rid)]:  # type: ignore[call-overload]
            assert r["tn"] == (text is None) and r["bn"] == (blob is None)
            if text is not None:
                assert bytes.fromhex(str(r["t"])).decode() == text
            if blob is not None:
                assert bytes.fromhex(str(r["b"])) == blob
            assert r["a"] == (
                None
                if amount is None
                else str(amount).rstrip("0").rstrip(".")
                if "." in str(amount)
                else str(amount)
            )
