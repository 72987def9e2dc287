"""Receipt documents: strict members, types, digests."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dpone.contracts import canonical_json
from dpone.contracts.fields import DocumentError
from dpone.contracts.receipt import FileReceipt
from dpone.contracts.schema import SourceColumn, SourceSchema
from dpone.errors import FormatError

SCHEMA = SourceSchema.of(
    [SourceColumn("id", "bigint", False), SourceColumn("s", "nvarchar(10)", True)]
)


def receipt() -> FileReceipt:
    return FileReceipt(
        artifact_sha256="a" * 64,
        artifact_size=10,
        rows_validated=2,
        schema=SCHEMA,
        codec_id="dpone.mssql-delimited.bulk-text",
        codec_version=2,
        policy_id="dpone.sqlserver-clickhouse.lossless",
        policy_version=1,
    )


def mutate(change: Any) -> bytes:
    doc = receipt().to_document()
    change(doc)
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def test_round_trip_and_digest() -> None:
    r = receipt()
    again = FileReceipt.from_bytes(r.to_bytes())
    assert again == r
    assert r.sha256 == canonical_json.sha256_hex(r.to_document())
    assert r.to_document()["schema_sha256"] == SCHEMA.sha256


@pytest.mark.parametrize(
    ("change", "code"),
    [
        (lambda d: d.pop("rows_validated"), "missing_member"),
        (lambda d: d.update(extra=1), "unknown_member"),
        (lambda d: d.update(rows_validated=True), "wrong_type"),
        (lambda d: d.update(rows_validated="2"), "wrong_type"),
        (lambda d: d.update(rows_validated=-1), "invalid_counter"),
        (lambda d: d.update(schema_sha256="0" * 64), "schema_digest_mismatch"),
        (lambda d: d.update(artifact_sha256="A" * 64), "invalid_digest"),
        (lambda d: d.update(receipt_version=2), "unsupported_version"),
        (lambda d: d["schema"]["columns"].append(d["schema"]["columns"][0]), "duplicate_column"),
        (lambda d: d["schema"]["columns"][0].update(nullable=0), "wrong_type"),
    ],
)
def test_invalid_receipts_are_refused(change: Any, code: str) -> None:
    with pytest.raises(DocumentError) as caught:
        FileReceipt.from_bytes(mutate(change))
    assert caught.value.code == code


def test_noncanonical_bytes_are_refused() -> None:
    pretty = json.dumps(receipt().to_document(), indent=1, sort_keys=True).encode()
    with pytest.raises(FormatError) as caught:
        FileReceipt.from_bytes(pretty)
    assert caught.value.code == "noncanonical_json"
