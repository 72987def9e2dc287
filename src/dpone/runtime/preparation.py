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
from dpone.contracts.preparation import DerivedIdentity, RowsDigest, TargetColumn
from dpone.contracts.receipt import FileReceipt
from dpone.durable_files import fsync_directory
from dpone.errors import DeadlineError, DponeError
from dpone.runtime.artifact import ArtifactMismatch, FileObservation, HeldArtifact, scan_descriptor
from dpone.runtime.conversion import convert_records
from dpone.runtime.engine_conversion import MODE_ENGINE, EngineUnavailable, convert_with_engine
from dpone.typepolicy import POLICY_ID, POLICY_VERSION, ColumnPlan, plan_columns

MODE_PYTHON = "python-reference"
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
    """A sealed spool and its derived identity."""

    path: Path
    identity: DerivedIdentity
    plans: tuple[ColumnPlan, ...]

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
    attempt; otherwise one is opened here. ``mode`` selects the converter: the
    Python reference or the engine fast path, which produces identical bytes and,
    when it refuses anything, hands over to the reference to name the exact error.
    """
    if mode not in (MODE_PYTHON, MODE_ENGINE):
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
    artifact = held or HeldArtifact(source, receipt)
    try:
        _check_deadline(budget, deadline, "entry")
        artifact.verify()
        _check_deadline(budget, deadline, "entry verification")
        path = directory / SPOOL_NAME
        engine_result = None
        if mode == MODE_ENGINE:
            engine_result = _engine_spool(artifact, receipt, plans, path, budget, deadline)
        if engine_result is None:
            digest, size, rows, content = _write_spool(
                artifact, receipt, plans, path, budget, deadline, str(source), progress
            )
            if mode == MODE_ENGINE:
                # The engine refused what the reference accepts: never silently.
                raise PreparationError(
                    "the engine refused a file the reference converter accepts",
                    code="engine_divergence",
                )
        else:
            # The engine wrote the spool itself: its digest is the one the seal reads.
            digest, size, rows, content = None, *engine_result
        _check_deadline(budget, deadline, "sealing")
        sealed = _seal(path)
        if sealed.size != size or digest not in (None, sealed.sha256):
            raise PreparationError(
                "the spool on disk differs from what was written", code="spool_mismatch"
            )
        _check_deadline(budget, deadline, "seal verification")
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
        selected_mode=mode,
        rowbinary_bytes=size,
        rowbinary_sha256=sealed.sha256,
        prepared_rows=rows,
        rows_digest=content,
    )
    return PreparedSpool(path, identity, plans)


def _write_spool(
    artifact: HeldArtifact,
    receipt: FileReceipt,
    plans: tuple[ColumnPlan, ...],
    path: Path,
    budget: PreparationBudget,
    deadline: float | None,
    source: str,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[str, int, int, str]:
    """The reference path: (spool SHA-256, spool bytes, records, rows digest)."""
    source_digest = hashlib.sha256()
    spool_digest = hashlib.sha256()
    content = RowsDigest()
    written = 0
    rows_done = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb", buffering=WRITE_BUFFER_BYTES) as out, artifact.stream() as stream:
        _check_free_space(path, budget, 0)
        reader = BulkTextReader(
            stream, [p.codec_column for p in plans], source=source,
            max_record_bytes=budget.max_record_bytes, max_records=budget.max_rows,
            on_chunk=source_digest.update,
        )  # fmt: skip

        def write(row: bytes) -> None:
            nonlocal written, rows_done
            rows_done += 1
            written += len(row)
            if budget.max_spool_bytes is not None and written > budget.max_spool_bytes:
                raise PreparationError(
                    f"spool would exceed its budget of {budget.max_spool_bytes} bytes at "
                    f"record {rows_done}",
                    code="spool_budget_exceeded", record=rows_done,
                )  # fmt: skip
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
        receipt.artifact_sha256, receipt.artifact_size,
    ):  # fmt: skip
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


def _engine_spool(
    artifact: HeldArtifact,
    receipt: FileReceipt,
    plans: tuple[ColumnPlan, ...],
    path: Path,
    budget: PreparationBudget,
    deadline: float | None,
) -> tuple[int, int, str] | None:
    """The engine fast path: (spool bytes, records, rows digest), or None to hand over.

    The engine reads a private copy made through the held descriptor and hashed on the
    way, so the bytes it converts are provably the receipt's. Records, their longest
    length and the final LF are counted on the way too; any budget the copy breaks,
    and any refusal by the engine, goes to the reference, which reports it exactly.
    The engine reads the written spool back for the rows digest, and the rows it
    counts there must be the records counted here.
    """
    copy = path.with_name("source.copy")
    _check_free_space(path, budget, 0)
    digest = hashlib.sha256()
    size = records = longest = pending = 0
    last = b""
    fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as out, artifact.stream() as stream:
            while chunk := stream.read(WRITE_BUFFER_BYTES):
                digest.update(chunk)
                out.write(chunk)
                size += len(chunk)
                lines = chunk.split(b"\n")
                records += len(lines) - 1
                if len(lines) > 1:
                    inner = max((len(x) + 1 for x in lines[1:-1]), default=0)
                    longest = max(longest, pending + len(lines[0]) + 1, inner)
                    pending = len(lines[-1])
                else:
                    pending += len(chunk)
                last = chunk[-1:]
        if (digest.hexdigest(), size) != (receipt.artifact_sha256, receipt.artifact_size):
            raise ArtifactMismatch(
                "the source changed after verification: the bytes copied are not the receipt's",
                code="artifact_changed_during_preparation",
            )
        too_long = (
            budget.max_record_bytes is not None and max(longest, pending) > budget.max_record_bytes
        )
        too_many = budget.max_rows is not None and records > budget.max_rows
        if (size and last != b"\n") or too_long or too_many or records != receipt.rows_validated:
            return None
        remaining = 3600.0 if deadline is None else deadline - budget.clock()
        _check_deadline(budget, deadline, "engine conversion")
        try:
            written_spool = convert_with_engine(plans, copy, path, timeout=remaining)
        except EngineUnavailable as exc:
            if exc.code == "engine_timeout":
                raise DeadlineError(
                    f"preparation deadline of {budget.deadline_seconds:g} s expired during engine conversion",
                    code="preparation_deadline", phase="engine conversion",
                ) from exc  # fmt: skip
            raise
        if written_spool is None:
            path.unlink(missing_ok=True)
            return None
        if written_spool.rows != records:
            raise PreparationError(
                f"the engine read {written_spool.rows} rows back from its spool, "
                f"the file has {records} records",
                code="engine_divergence",
            )
    finally:
        copy.unlink(missing_ok=True)
    _check_deadline(budget, deadline, "engine conversion")
    written = path.stat().st_size
    if budget.max_spool_bytes is not None and written > budget.max_spool_bytes:
        path.unlink()
        return None  # the reference names the record where the budget ran out
    _check_free_space(path, budget, records)
    with open(path, "rb") as spool:
        os.fsync(spool.fileno())
    return written, records, written_spool.rows_digest


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
            code="preparation_deadline", phase=phase,
        )  # fmt: skip


def _check_free_space(path: Path, budget: PreparationBudget, rows: int) -> None:
    if budget.free_space_reserve_bytes <= 0:
        return
    stats = os.statvfs(path.parent)
    free = stats.f_bavail * stats.f_frsize
    if free < budget.free_space_reserve_bytes:
        raise PreparationError(
            f"free space {free} bytes is below the reserve of "
            f"{budget.free_space_reserve_bytes} bytes (after record {rows})",
            code="free_space_reserve", record=rows, free_bytes=free,
        )  # fmt: skip
