"""Exact RowBinary preparation: a verified source file becomes a sealed private spool.

Every cell is converted and every row validated before this returns; nothing reaches
a server before then. The source is read through a descriptor held since entry
verification and hashed in the same pass, so the converted bytes are provably the
receipt's bytes. The spool is written 0600 inside a 0700 directory, fsynced, made
read-only and hashed again from disk.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from dpone.connectors.bulk_text_codec import BulkTextError, BulkTextReader
from dpone.contracts.preparation import (
    ROWS_DIGEST_MODULUS,
    DerivedIdentity,
    RowsDigest,
    TargetColumn,
)
from dpone.contracts.receipt import FileReceipt
from dpone.durable_files import fsync_directory
from dpone.errors import DeadlineError, DponeError
from dpone.preparation import native_conversion
from dpone.preparation.artifact import (
    ArtifactMismatch,
    FileObservation,
    HeldArtifact,
    scan_descriptor,
)
from dpone.preparation.conversion import convert_records
from dpone.preparation.modes import (
    DEFAULT_MODE,
    MODE_NATIVE,
    MODE_PYTHON,
    MODES,
    PreparationModeRemoved,
    refuse_removed_mode,
)
from dpone.preparation.native_conversion import NativeRanges
from dpone.preparation.ranges import MAX_CARRY_BYTES
from dpone.typepolicy import POLICY_ID, POLICY_VERSION, ColumnPlan, plan_columns

__all__ = [
    "DEFAULT_MODE",
    "MODES",
    "MODE_NATIVE",
    "MODE_PYTHON",
    "PreparationBudget",
    "PreparationError",
    "PreparationModeRemoved",
    "PreparedSpool",
    "prepare_rowbinary",
]

SPOOL_NAME = "data.rowbinary"
# Budgets are checked every this many rows (and at the end).
CHECK_EVERY_ROWS = 1024
WRITE_BUFFER_BYTES = 1 << 20


class PreparationError(DponeError):
    """Preparation stopped; the partial spool has been removed."""

    code = "preparation_failed"


@dataclass(frozen=True)
class PreparationBudget:
    """Finite limits for one preparation. ``None`` leaves a limit off."""

    max_record_bytes: int | None = None
    max_rows: int | None = None
    max_spool_bytes: int | None = None
    free_space_reserve_bytes: int = 0
    deadline_seconds: float | None = None
    clock: Callable[[], float] = field(default=time.monotonic, compare=False)


@dataclass(frozen=True)
class PreparedSpool:
    """A sealed spool, its derived identity and the converter that produced it."""

    path: Path
    identity: DerivedIdentity
    plans: tuple[ColumnPlan, ...]
    # The converter that wrote the spool: ``native`` only when the compiled converter
    # wrote all of it, ``python-reference`` when it was asked for or declined the file.
    converter: str = MODE_PYTHON

    @property
    def semantic_id(self) -> str:
        return self.identity.semantic_id


def prepare_rowbinary(
    source: str | os.PathLike[str],
    receipt: FileReceipt,
    spool_dir: str | os.PathLike[str],
    *,
    overrides: Mapping[str, str] | None = None,
    budget: PreparationBudget | None = None,
    held: HeldArtifact | None = None,
    progress: Callable[[int, int], None] | None = None,
    mode: str = MODE_PYTHON,
) -> PreparedSpool:
    """Convert ``source`` (described by ``receipt``) into a sealed RowBinary spool.

    ``spool_dir`` must not exist; it is created 0700. On any failure it is removed
    with everything in it. ``held`` lets a caller keep one descriptor for the whole
    attempt, verified by that caller just before; otherwise one is opened and verified
    here. Either way the conversion hashes every byte it converts and refuses a
    spool whose source bytes are not the receipt's. ``mode`` selects the converter: the
    Python reference, or the compiled converter, which hands a file it declines (or
    cannot take) to the reference, which names the exact error; both give the same
    bytes. A removed mode raises :class:`PreparationModeRemoved`, naming its replacement.
    """
    if mode not in MODES:
        refuse_removed_mode(mode)
        raise PreparationError(f"unknown preparation mode {mode!r}", code="invalid_mode")
    budget = budget or PreparationBudget()
    deadline = None if budget.deadline_seconds is None else budget.clock() + budget.deadline_seconds
    plans = plan_columns(receipt.schema.columns, dict(overrides or {}))  # before any read
    directory = Path(spool_dir)
    try:
        directory.mkdir(mode=0o700)
    except FileExistsError as exc:
        raise PreparationError(
            f"spool directory {directory} already exists", code="spool_exists", path=str(directory)
        ) from exc
    own_held = held is None
    try:
        artifact = held or HeldArtifact(source, receipt)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    path = directory / SPOOL_NAME
    try:
        _check_deadline(budget, deadline, "entry")
        if own_held:  # a caller's held descriptor was verified by that caller
            artifact.verify()
            _check_deadline(budget, deadline, "entry verification")
        job = _Job(artifact, receipt, plans, path, budget, deadline, str(source), progress)
        sealed, size, rows, content, converter = _write_and_seal(job, mode)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    finally:
        if own_held:
            artifact.close()
    identity = DerivedIdentity(
        target_schema=tuple(TargetColumn(p.name, p.clickhouse_type) for p in plans),
        source_receipt_sha256=receipt.sha256,
        binary_policy=f"{POLICY_ID}/{POLICY_VERSION}",
        rowbinary_bytes=size,
        rowbinary_sha256=sealed.sha256,
        prepared_rows=rows,
        rows_digest=content,
    )
    return PreparedSpool(path, identity, plans, converter)


@dataclass(frozen=True)
class _Job:
    """One preparation's inputs, as both converters take them."""

    artifact: HeldArtifact
    receipt: FileReceipt
    plans: tuple[ColumnPlan, ...]
    path: Path
    budget: PreparationBudget
    deadline: float | None
    source: str
    progress: Callable[[int, int], None] | None


def _write_and_seal(job: _Job, mode: str) -> tuple[FileObservation, int, int, str, str]:
    """Write the spool, seal it and read it back: (sealed, spool bytes, records, rows
    digest, the converter that wrote it).

    The compiled converter first when ``mode`` asks for it and it takes the columns;
    a file it declines (a value the reference refuses, nearly always) is converted
    again, whole, by the reference, which names the record, column and reason.
    """
    written = None
    if mode == MODE_NATIVE and native_conversion.takes(job.plans):
        written = _native_spool(job)
        if written is None:
            job.path.unlink(missing_ok=True)
    if written is None:
        digest, size, rows, content = _write_spool(job)
        converter = MODE_PYTHON
    else:
        # The compiled converter's digest is the one the seal reads back.
        digest, (size, rows, content) = None, written
        converter = MODE_NATIVE
    _check_deadline(job.budget, job.deadline, "sealing")
    sealed = _seal(job.path)
    if sealed.size != size or digest not in (None, sealed.sha256):
        raise PreparationError(
            "the spool on disk differs from what was written", code="spool_mismatch"
        )
    _check_deadline(job.budget, job.deadline, "seal verification")
    return sealed, size, rows, content, converter


def _write_spool(job: _Job) -> tuple[str, int, int, str]:
    """The reference path: (spool SHA-256, spool bytes, records, rows digest)."""
    receipt, plans, path, budget = job.receipt, job.plans, job.path, job.budget
    deadline, source, progress = job.deadline, job.source, job.progress
    source_digest = hashlib.sha256()
    spool_digest = hashlib.sha256()
    content = RowsDigest()
    written = 0
    rows_done = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb", buffering=WRITE_BUFFER_BYTES) as out, job.artifact.stream() as stream:
        _check_free_space(path, budget, 0)
        reader = BulkTextReader(
            stream,
            [p.codec_column for p in plans],
            source=source,
            max_record_bytes=budget.max_record_bytes,
            max_records=budget.max_rows,
            on_chunk=source_digest.update,
        )

        def write(row: bytes) -> None:
            nonlocal written, rows_done
            rows_done += 1
            written += len(row)
            if budget.max_spool_bytes is not None and written > budget.max_spool_bytes:
                raise PreparationError(
                    f"spool would exceed its budget of {budget.max_spool_bytes} bytes at "
                    f"record {rows_done}",
                    code="spool_budget_exceeded",
                    record=rows_done,
                )
            spool_digest.update(row)
            content.add(row)
            out.write(row)
            if rows_done % CHECK_EVERY_ROWS == 0:
                _check_deadline(budget, deadline, f"conversion (record {rows_done})")
                _check_free_space(path, budget, rows_done)
                if progress is not None:
                    progress(rows_done, reader.bytes_read)

        try:
            rows = convert_records(reader, plans, write, source=source)
        except BulkTextError as exc:
            if exc.code in ("record_too_large", "too_many_records"):
                raise PreparationError(exc.message, code=exc.code, **dict(exc.details)) from exc
            raise
        out.flush()
        os.fsync(out.fileno())
    if (source_digest.hexdigest(), reader.bytes_read) != (
        receipt.artifact_sha256,
        receipt.artifact_size,
    ):
        raise ArtifactMismatch(
            f"{source} changed after verification: the bytes converted are not the receipt's",
            code="artifact_changed_during_preparation",
        )
    if rows != receipt.rows_validated:
        raise PreparationError(
            f"prepared {rows} rows, the receipt says {receipt.rows_validated}",
            code="row_count_mismatch",
        )
    _check_free_space(path, budget, rows)
    return spool_digest.hexdigest(), written, rows, content.hexdigest()


def _native_spool(job: _Job) -> tuple[int, int, str] | None:
    """The compiled converter: (spool bytes, records, rows digest), or None to hand over.

    The source is read once, through the held descriptor, in ranges that end at a
    record boundary; every range is hashed in order before it is converted (so the
    bytes converted are provably the receipt's), converted in this process's threads,
    and its RowBinary appended to the spool in order. Anything the converter declines,
    and any budget or fault it cannot name exactly (a missing final LF, a too long
    record, too many records, the spool budget), goes to the reference, which names it
    at its record and column.
    """
    path, budget, deadline, progress = job.path, job.budget, job.deadline, job.progress
    source_digest = hashlib.sha256()
    written = records = 0
    content = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as out, job.artifact.stream() as stream:
        ranges = NativeRanges(
            stream,
            job.plans,
            total_bytes=job.receipt.artifact_size,
            carry_limit=budget.max_record_bytes or MAX_CARRY_BYTES,
            max_record_bytes=budget.max_record_bytes,
            on_bytes=source_digest.update,
        )
        with ranges.parts() as parts:
            for part in parts:
                if part is None:
                    return None
                out.write(part.data)
                written += len(part.data)
                records += part.rows
                content += part.rows_digest
                if budget.max_rows is not None and records > budget.max_rows:
                    return None
                if budget.max_spool_bytes is not None and written > budget.max_spool_bytes:
                    return None  # the reference names the record where the budget ran out
                _check_deadline(budget, deadline, f"conversion (record {records})")
                _check_free_space(path, budget, records)
                if progress is not None:
                    progress(records, ranges.size)
        if ranges.too_long or ranges.trailing:
            return None
        out.flush()
        os.fsync(out.fileno())
    return _converted(
        job.receipt, path, budget, source_digest.hexdigest(), ranges.size, written, records, content
    )


def _converted(
    receipt: FileReceipt,
    path: Path,
    budget: PreparationBudget,
    source_sha256: str,
    size: int,
    written: int,
    records: int,
    content: int,
) -> tuple[int, int, str] | None:
    """The end of the compiled path: (spool bytes, records, rows digest), or None to hand over.

    The bytes converted must be the receipt's (else the source changed after its
    verification); a record count or spool budget that does not hold goes to the
    reference, which names where.
    """
    if (source_sha256, size) != (receipt.artifact_sha256, receipt.artifact_size):
        raise ArtifactMismatch(
            "the source changed after verification: the bytes converted are not the receipt's",
            code="artifact_changed_during_preparation",
        )
    if records != receipt.rows_validated:
        return None
    if budget.max_spool_bytes is not None and written > budget.max_spool_bytes:
        return None
    _check_free_space(path, budget, records)
    return written, records, format(content % ROWS_DIGEST_MODULUS, "032x")


def _seal(path: Path) -> FileObservation:
    """Make the spool read-only, make that durable, and read it back whole."""
    os.chmod(path, 0o400)
    fsync_directory(path.parent)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        observed = scan_descriptor(fd)
    finally:
        os.close(fd)
    return observed


def _check_deadline(budget: PreparationBudget, deadline: float | None, phase: str) -> None:
    if deadline is not None and budget.clock() >= deadline:
        raise DeadlineError(
            f"preparation deadline of {budget.deadline_seconds:g} s expired during {phase}",
            code="preparation_deadline",
            phase=phase,
        )


def _check_free_space(path: Path, budget: PreparationBudget, rows: int) -> None:
    if budget.free_space_reserve_bytes <= 0:
        return
    stats = os.statvfs(path.parent)
    free = stats.f_bavail * stats.f_frsize
    if free < budget.free_space_reserve_bytes:
        raise PreparationError(
            f"free space {free} bytes is below the reserve of "
            f"{budget.free_space_reserve_bytes} bytes (after record {rows})",
            code="free_space_reserve",
            record=rows,
            free_bytes=free,
        )
