"""``validate_file``: scan a bulk text file under a schema and issue its receipt.

One pass reads the file through the codec's reader, hashes every byte read, and checks
row width, UTF-8, escapes, hex, NOT NULL and that every value converts exactly under the
type policy; only a file that passes gets a receipt. By default the checks run in the
compiled converter (:func:`native_check`: the conversion a preparation runs, its bytes
discarded); a file it declines goes to the Python reference, which validates it again
and names the first bad value exactly. The receipt is the same whichever decided.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from dpone.connectors.bulk_text_codec import CODEC_ID, CODEC_VERSION, BulkTextReader
from dpone.contracts.receipt import FileReceipt
from dpone.contracts.schema import SourceSchema
from dpone.preparation.artifact import ArtifactMismatch, HeldArtifact
from dpone.preparation.conversion import convert_records
from dpone.preparation.modes import DEFAULT_MODE, MODE_NATIVE, MODE_PYTHON, refuse_removed_mode
from dpone.preparation.native_conversion import NativeRanges, not_taken
from dpone.preparation.ranges import MAX_CARRY_BYTES, ReadsInto
from dpone.typepolicy import POLICY_ID, POLICY_VERSION, ColumnPlan, plan_columns

__all__ = ["MODE_NATIVE", "MODE_PYTHON", "validate_file", "verify_file"]


def validate_file(
    path: str | os.PathLike[str],
    schema: SourceSchema,
    *,
    overrides: Mapping[str, str] | None = None,
    max_record_bytes: int | None = None,
    max_records: int | None = None,
    source_name: str | None = None,
    mode: str = DEFAULT_MODE,
    warn: Callable[[str], None] | None = None,
) -> FileReceipt:
    """Validate ``path`` against ``schema``; return its receipt or raise a located error.

    ``mode`` chooses who checks the values first: the compiled converter (the default;
    a file it declines goes to the reference, which names any refusal) or the Python
    reference alone. When the compiled converter cannot take the file at all (switched
    off, not built, a column it does not take), the reference validates alone, with the
    same result but many times slower: ``warn`` is told why. A removed mode raises
    :class:`dpone.preparation.modes.PreparationModeRemoved`, naming its replacement.
    """
    refuse_removed_mode(mode)
    plans = plan_columns(schema.columns, dict(overrides or {}))  # refuses types before reading
    digest = hashlib.sha256()
    source = source_name or str(path)
    with open(Path(path), "rb") as stream:
        size_before = os.fstat(stream.fileno()).st_size
        counted = None
        if mode == MODE_NATIVE:
            counted = native_check(
                stream, plans, max_record_bytes, max_records, warn, total_bytes=size_before
            )
            if counted is None:
                stream.seek(0)
        if counted is not None:
            rows, sha256, read = counted
            if not size_before == os.fstat(stream.fileno()).st_size == read:
                raise ArtifactMismatch(
                    f"{source} changed while it was validated", code="artifact_changed_during_scan"
                )
            return receipt_for(schema, sha256, read, rows)
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
    return receipt_for(schema, digest.hexdigest(), reader.bytes_read, rows)


def receipt_for(schema: SourceSchema, sha256: str, size: int, rows: int) -> FileReceipt:
    """The receipt of a file of ``size`` bytes and ``rows`` records, validated whole."""
    return FileReceipt(
        artifact_sha256=sha256,
        artifact_size=size,
        rows_validated=rows,
        schema=schema,
        codec_id=CODEC_ID,
        codec_version=CODEC_VERSION,
        policy_id=POLICY_ID,
        policy_version=POLICY_VERSION,
    )


def native_check(
    stream: ReadsInto,
    plans: tuple[ColumnPlan, ...],
    max_record_bytes: int | None,
    max_records: int | None,
    warn: Callable[[str], None] | None,
    *,
    total_bytes: int,
    workers: int | None = None,
) -> tuple[int, str, int] | None:
    """(records, SHA-256, bytes) when the compiled converter takes every record; None
    to hand the file to the reference.

    The stream is read once; each whole-record range is hashed in order and converted
    with its bytes discarded. A decline, a budget, a too long record or a missing final
    LF hands the file over; so does a converter that cannot take it at all, with a
    ``warn``ing that says why.
    """
    reason = not_taken(plans)
    if reason is not None:
        if warn is not None:
            warn(
                f"the compiled converter {reason}, so the Python reference validated the "
                "file alone, which is many times slower"
            )
        return None
    digest = hashlib.sha256()
    records = 0
    ranges = NativeRanges(
        stream,
        plans,
        total_bytes=total_bytes,
        carry_limit=max_record_bytes or MAX_CARRY_BYTES,
        max_record_bytes=max_record_bytes,
        on_bytes=digest.update,
        keep=False,
        workers=workers,
    )
    with ranges.parts() as parts:
        for part in parts:
            if part is None:
                return None
            records += part.rows
            if max_records is not None and records > max_records:
                return None
    if ranges.too_long or ranges.trailing:
        return None
    return records, digest.hexdigest(), ranges.size


def verify_file(
    path: str | os.PathLike[str], receipt: FileReceipt, *, warn: Callable[[str], None] | None = None
) -> FileReceipt:
    """Check that ``path`` is exactly the file ``receipt`` describes; return a fresh receipt.

    The bytes are checked first (size and SHA-256 through a held descriptor, so a
    replaced file is refused), then the file is validated again under the receipt's
    schema: the fresh receipt must equal the given one member for member, so a
    hand-edited ``rows_validated`` (or codec, policy or validator) is refused too.
    """
    with HeldArtifact(path, receipt) as held:
        held.verify()
        fresh = validate_file(
            f"/proc/self/fd/{held.fd}", receipt.schema, source_name=str(path), warn=warn
        )
    if fresh.artifact_sha256 != receipt.artifact_sha256:
        raise ArtifactMismatch(
            f"{path} changed while it was verified",
            code="artifact_changed_during_scan",
            path=str(path),
        )
    if fresh.rows_validated != receipt.rows_validated:
        raise ArtifactMismatch(
            f"{path} has {fresh.rows_validated} records, the receipt says {receipt.rows_validated}",
            code="receipt_rows_mismatch",
            path=str(path),
        )
    if fresh != receipt:
        differing = [
            name
            for name in (
                "codec_id",
                "codec_version",
                "policy_id",
                "policy_version",
                "validator_version",
            )
            if getattr(fresh, name) != getattr(receipt, name)
        ]
        raise ArtifactMismatch(
            f"the receipt of {path} was made by another validator ({', '.join(differing)} "
            "differ from this dpone's); validate the file again",
            code="receipt_validator_mismatch",
            path=str(path),
            members=differing,
        )
    return fresh
