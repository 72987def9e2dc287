"""``validate_file``: scan a bulk text file under a schema and issue its receipt.

One pass reads the file through the codec's reader, hashes every byte read, checks
row width, UTF-8, escapes, hex, NOT NULL and that every value converts exactly under
the type policy. Only a file that passes gets a receipt.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path

from dpone.connectors.bulk_text_codec import CODEC_ID, CODEC_VERSION, BulkTextReader
from dpone.contracts.receipt import FileReceipt
from dpone.contracts.schema import SourceSchema
from dpone.runtime.artifact import ArtifactMismatch, HeldArtifact
from dpone.runtime.conversion import convert_records
from dpone.typepolicy import POLICY_ID, POLICY_VERSION, plan_columns


def validate_file(
    path: str | os.PathLike[str],
    schema: SourceSchema,
    *,
    overrides: Mapping[str, str] | None = None,
    max_record_bytes: int | None = None,
    max_records: int | None = None,
    source_name: str | None = None,
) -> FileReceipt:
    """Validate ``path`` against ``schema``; return its receipt or raise a located error."""
    plans = plan_columns(schema.columns, dict(overrides or {}))  # refuses types before reading
    digest = hashlib.sha256()
    source = source_name or str(path)
    with open(Path(path), "rb") as stream:
        size_before = os.fstat(stream.fileno()).st_size
        reader = BulkTextReader(
            stream,
            [p.codec_column for p in plans],
            source=source,
            max_record_bytes=max_record_bytes,
            max_records=max_records,
            on_chunk=digest.update,
        )
        rows = convert_records(reader, plans, source=source)
        size_after = os.fstat(stream.fileno()).st_size
    if not size_before == size_after == reader.bytes_read:
        raise ArtifactMismatch(
            f"{source} changed while it was validated", code="artifact_changed_during_scan"
        )
    return FileReceipt(
        artifact_sha256=digest.hexdigest(),
        artifact_size=reader.bytes_read,
        rows_validated=rows,
        schema=schema,
        codec_id=CODEC_ID,
        codec_version=CODEC_VERSION,
        policy_id=POLICY_ID,
        policy_version=POLICY_VERSION,
    )


def verify_file(path: str | os.PathLike[str], receipt: FileReceipt) -> FileReceipt:
    """Check that ``path`` is exactly the file ``receipt`` describes; return a fresh receipt.

    The bytes are checked first (size and SHA-256 through a held descriptor, so a
    replaced file is refused), then the file is validated again under the receipt's
    schema: the fresh receipt must equal the given one member for member, so a
    hand-edited ``rows_validated`` (or codec, policy or validator) is refused too.
    """
    with HeldArtifact(path, receipt) as held:
        held.verify()
        fresh = validate_file(f"/proc/self/fd/{held.fd}", receipt.schema, source_name=str(path))
    if fresh.artifact_sha256 != receipt.artifact_sha256:
        raise ArtifactMismatch(
            f"{path} changed while it was verified", code="artifact_changed_during_scan",
            path=str(path),
        )  # fmt: skip
    if fresh.rows_validated != receipt.rows_validated:
        raise ArtifactMismatch(
            f"{path} has {fresh.rows_validated} records, the receipt says "
            f"{receipt.rows_validated}",
            code="receipt_rows_mismatch", path=str(path),
        )  # fmt: skip
    if fresh != receipt:
        differing = [
            name
            for name in ("codec_id", "codec_version", "policy_id", "policy_version",
                         "validator_version")
            if getattr(fresh, name) != getattr(receipt, name)
        ]  # fmt: skip
        raise ArtifactMismatch(
            f"the receipt of {path} was made by another validator ({', '.join(differing)} "
            "differ from this dpone's); validate the file again",
            code="receipt_validator_mismatch", path=str(path), members=differing,
        )  # fmt: skip
    return fresh
