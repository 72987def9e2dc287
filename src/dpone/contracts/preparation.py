"""The derived identity of a prepared RowBinary spool and its ``semantic_id``."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from dpone.contracts import canonical_json

# /2 added ``rows_digest``, the order-independent content digest of the rows; /3 drops
# ``selected_mode``: both converters produce the same bytes, so the same identity.
PREPARATION_VERSION = "dpone-rowbinary-preparation/3"
ROWS_DIGEST_MODULUS = 1 << 128


class RowsDigest:
    """The order-independent digest of a set of RowBinary rows (a multiset, in fact).

    Each row contributes the first 16 bytes of SHA-256 of its exact RowBinary bytes,
    read as a little-endian integer; the contributions are summed modulo 2**128 and
    the sum is written as 32 lowercase hex digits, most significant first
    (``format(n, '032x')``). A server computes the same value over a table whatever
    order it keeps the rows in (see docs/publication-catalog.md for the SQL).
    """

    __slots__ = ("_total",)

    def __init__(self) -> None:
        self._total = 0

    def add(self, row: bytes) -> None:
        """Count one row's exact RowBinary bytes."""
        self._total += int.from_bytes(hashlib.sha256(row).digest()[:16], "little")

    def hexdigest(self) -> str:
        """The digest so far: 32 lowercase hex digits (an empty set gives 32 zeros)."""
        return format(self._total % ROWS_DIGEST_MODULUS, "032x")


def rows_digest_sql(columns: Sequence[str]) -> str:
    """The SQL aggregate that computes :class:`RowsDigest` over ``columns`` (quoted, in order).

    ``hex`` of an integer writes its most significant byte first and omits leading
    zero bytes (``hex(0)`` is ``'00'``), hence the padding to 32 digits. ``formatRow``,
    not ``formatRowNoNewline``: the latter drops a final 0x0A byte, which in RowBinary
    is data (a string ending in a newline), not a row delimiter (checked on 26.9).
    """
    if not columns:
        raise ValueError("a rows digest needs at least one column")
    row = f"formatRow('RowBinary', {', '.join(columns)})"
    term = f"reinterpretAsUInt128(substring(SHA256({row}), 1, 16))"
    return f"leftPad(lower(hex(sum({term}))), 32, '0')"


def rows_digest(rows: Iterable[bytes]) -> str:
    """The :class:`RowsDigest` of ``rows`` (each one row's RowBinary bytes)."""
    digest = RowsDigest()
    for row in rows:
        digest.add(row)
    return digest.hexdigest()


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
    identity and therefore the same ``semantic_id``, whichever converter prepared
    them: the modes are held to byte-identical spools, so the mode is not part of it. ``rowbinary_sha256`` binds the
    spool in file order; ``rows_digest`` (:class:`RowsDigest`) binds the same rows in
    any order, which is what a server can recompute over the table it loaded.
    """

    target_schema: tuple[TargetColumn, ...]
    source_receipt_sha256: str
    binary_policy: str
    rowbinary_bytes: int
    rowbinary_sha256: str
    prepared_rows: int
    rows_digest: str
    preparation_version: str = PREPARATION_VERSION

    def to_document(self) -> dict[str, Any]:
        return {
            "preparation_version": self.preparation_version,
            "target_schema": [c.to_document() for c in self.target_schema],
            "source_receipt_sha256": self.source_receipt_sha256,
            "binary_policy": self.binary_policy,
            "rowbinary_bytes": self.rowbinary_bytes,
            "rowbinary_sha256": self.rowbinary_sha256,
            "prepared_rows": self.prepared_rows,
            "rows_digest": self.rows_digest,
        }

    @property
    def semantic_id(self) -> str:
        """SHA-256 of the identity's canonical JSON."""
        return canonical_json.sha256_hex(self.to_document())
