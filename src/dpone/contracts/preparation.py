"""The derived identity of a prepared RowBinary spool and its ``semantic_id``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dpone.contracts import canonical_json

PREPARATION_VERSION = "dpone-rowbinary-preparation/1"


@dataclass(frozen=True)
class TargetColumn:
    """One physical column of the staging table."""

    name: str
    clickhouse_type: str

    def to_document(self) -> dict[str, Any]:
        return {"name": self.name, "clickhouse_type": self.clickhouse_type}


@dataclass(frozen=True)
class DerivedIdentity:
    """What a spool is, independent of attempt ids, paths, credentials and times.

    Two attempts over identical source and representation inputs have the same
    identity and therefore the same ``semantic_id``.
    """

    target_schema: tuple[TargetColumn, ...]
    source_receipt_sha256: str
    binary_policy: str
    selected_mode: str
    rowbinary_bytes: int
    rowbinary_sha256: str
    prepared_rows: int
    preparation_version: str = PREPARATION_VERSION

    def to_document(self) -> dict[str, Any]:
        return {
            "preparation_version": self.preparation_version,
            "target_schema": [c.to_document() for c in self.target_schema],
            "source_receipt_sha256": self.source_receipt_sha256,
            "binary_policy": self.binary_policy,
            "selected_mode": self.selected_mode,
            "rowbinary_bytes": self.rowbinary_bytes,
            "rowbinary_sha256": self.rowbinary_sha256,
            "prepared_rows": self.prepared_rows,
        }

    @property
    def semantic_id(self) -> str:
        """SHA-256 of the identity's canonical JSON."""
        return canonical_json.sha256_hex(self.to_document())
