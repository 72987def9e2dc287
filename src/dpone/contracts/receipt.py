"""The receipt: integrity evidence about one exact bulk text file.

A receipt says: a file of ``artifact_size`` bytes with SHA-256 ``artifact_sha256``
was read by validator ``validator_version`` with codec ``codec_id`` version
``codec_version`` under schema ``schema`` and every one of its ``rows_validated``
records was convertible under policy ``policy_id`` version ``policy_version``; for a
source that reads one snapshot it can name, ``source`` says which (its kind, where it
is, and the snapshot), and is absent otherwise.
It is not a signature: anyone can write one. It binds a file's bytes, so any change
to the file is detected when the receipt is verified against it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dpone.contracts import canonical_json
from dpone.contracts.fields import DocumentError, members, non_negative
from dpone.contracts.schema import SourceSchema

RECEIPT_KIND = "dpone.bulk-text.receipt"
RECEIPT_VERSION = 1
VALIDATOR_VERSION = "dpone-validator/1"
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class FileReceipt:
    """A parsed, internally consistent receipt."""

    artifact_sha256: str
    artifact_size: int
    rows_validated: int
    schema: SourceSchema
    codec_id: str
    codec_version: int
    policy_id: str
    policy_version: int
    validator_version: str = VALIDATOR_VERSION
    # Where the rows were read, not what the file is: a file validated again has none,
    # and is the same file.
    source: Mapping[str, str] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if _SHA256.fullmatch(self.artifact_sha256) is None:
            raise DocumentError(
                "receipt.artifact_sha256 must be 64 lowercase hex digits", code="invalid_digest"
            )
        if self.source is not None and not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.source.items()
        ):
            raise DocumentError("receipt.source must map names to strings", where="receipt")

    @property
    def schema_sha256(self) -> str:
        return self.schema.sha256

    def to_document(self) -> dict[str, Any]:
        document = {
            "kind": RECEIPT_KIND,
            "receipt_version": RECEIPT_VERSION,
            "artifact_sha256": self.artifact_sha256,
            "artifact_size": self.artifact_size,
            "rows_validated": self.rows_validated,
            "schema": self.schema.to_document(),
            "schema_sha256": self.schema_sha256,
            "codec_id": self.codec_id,
            "codec_version": self.codec_version,
            "policy_id": self.policy_id,
            "policy_version": self.policy_version,
            "validator_version": self.validator_version,
        }
        if self.source is not None:
            document["source"] = dict(self.source)
        return document

    def to_bytes(self) -> bytes:
        """Canonical JSON bytes of the receipt."""
        return canonical_json.dumps(self.to_document())

    @property
    def sha256(self) -> str:
        """Digest of the receipt's canonical bytes."""
        return canonical_json.sha256_hex(self.to_document())

    @classmethod
    def from_bytes(cls, data: bytes) -> FileReceipt:
        """Parse canonical receipt bytes; refuse anything inconsistent."""
        obj = canonical_json.loads(data, what="receipt")
        spec: dict[str, type | tuple[type, ...]] = {
            "kind": str,
            "receipt_version": int,
            "artifact_sha256": str,
            "artifact_size": int,
            "rows_validated": int,
            "schema": dict,
            "schema_sha256": str,
            "codec_id": str,
            "codec_version": int,
            "policy_id": str,
            "policy_version": int,
            "validator_version": str,
        }
        if isinstance(obj, dict) and "source" in obj:
            spec["source"] = dict
        fields = members(obj, spec, where="receipt")
        if fields["kind"] != RECEIPT_KIND or fields["receipt_version"] != RECEIPT_VERSION:
            raise DocumentError(
                f"not a {RECEIPT_KIND} version {RECEIPT_VERSION} document",
                code="unsupported_version",
            )
        receipt = cls(
            artifact_sha256=fields["artifact_sha256"],
            artifact_size=non_negative(fields["artifact_size"], where="receipt.artifact_size"),
            rows_validated=non_negative(fields["rows_validated"], where="receipt.rows_validated"),
            schema=SourceSchema.from_document(fields["schema"], where="receipt.schema"),
            codec_id=fields["codec_id"],
            codec_version=fields["codec_version"],
            policy_id=fields["policy_id"],
            policy_version=fields["policy_version"],
            validator_version=fields["validator_version"],
            source=fields.get("source"),
        )
        if receipt.schema_sha256 != fields["schema_sha256"]:
            raise DocumentError(
                "receipt.schema_sha256 does not match its schema", code="schema_digest_mismatch"
            )
        return receipt
