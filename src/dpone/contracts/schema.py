"""The ordered source schema of one file: column name, SQL Server type, nullability."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dpone.contracts import canonical_json
from dpone.contracts.fields import DocumentError, members

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class SourceColumn:
    """One source column. ``source_type`` is the SQL Server type as declared."""

    name: str
    source_type: str
    nullable: bool

    def to_document(self) -> dict[str, Any]:
        return {"name": self.name, "source_type": self.source_type, "nullable": self.nullable}

    @classmethod
    def from_document(cls, obj: Any, *, where: str) -> SourceColumn:
        fields = members(obj, {"name": str, "source_type": str, "nullable": bool}, where=where)
        if not fields["name"]:
            raise DocumentError(f"{where}.name must not be empty", code="empty_name", where=where)
        return cls(fields["name"], fields["source_type"], fields["nullable"])


@dataclass(frozen=True)
class SourceSchema:
    """An ordered tuple of uniquely named columns."""

    columns: tuple[SourceColumn, ...]

    def __post_init__(self) -> None:
        if not self.columns:
            raise DocumentError("a schema needs at least one column", code="empty_schema")
        seen: set[str] = set()
        for column in self.columns:
            if column.name in seen:
                raise DocumentError(
                    f"column {column.name!r} is declared twice",
                    code="duplicate_column",
                    column=column.name,
                )
            seen.add(column.name)

    @classmethod
    def of(cls, columns: Sequence[SourceColumn]) -> SourceSchema:
        return cls(tuple(columns))

    def to_document(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "columns": [c.to_document() for c in self.columns],
        }

    @classmethod
    def from_document(cls, obj: Any, *, where: str = "schema") -> SourceSchema:
        fields = members(obj, {"schema_version": int, "columns": list}, where=where)
        if fields["schema_version"] != SCHEMA_VERSION:
            raise DocumentError(
                f"{where}.schema_version must be {SCHEMA_VERSION}",
                code="unsupported_version",
                where=where,
            )
        return cls(
            tuple(
                SourceColumn.from_document(c, where=f"{where}.columns[{i}]")
                for i, c in enumerate(fields["columns"])
            )
        )

    @property
    def sha256(self) -> str:
        """Digest of the schema's canonical JSON."""
        return canonical_json.sha256_hex(self.to_document())
