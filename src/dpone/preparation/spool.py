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
from dpone.preparation import engine_conversion, native_conversion
from dpone.preparation.artifact import (
    ArtifactMismatch,
    FileObservation,
    HeldArtifact,
    scan_descriptor,
)
from dpone.preparation.conversion import convert_records
from dpone.preparation.engine_conversion import (
    MAX_CARRY_BYTES,
    MODE_ENGINE,
    EngineSession,
    EngineSpool,
    EngineUnavailable,
    RecordRanges,
    spill_range,
)
from dpone.preparation.native_conversion import MODE_NATIVE, NativeRanges
from dpone.typepolicy import POLICY_ID, POLICY_VERSION, ColumnPlan, plan_columns

MODE_PYTHON = "python-reference"
MODES = (MODE_NATIVE, MODE_ENGINE, MODE_PYTHON)
# What a stage uses unless told otherwise: the compiled converter, then the engine for
# whatever it declines, both held to the reference's bytes.
DEFAULT_MODE = MODE_NATIVE
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
    mode: str = MODE_PYTHON

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
    Python reference; the engine fast path, which produces identical bytes and, when
    it refuses anything, hands over to the reference to name the exact error; or the
    compiled converter, which hands a file it declines to the engine.
    """
    if mode not in MODES:
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
    session = None
    native = mode == MODE_NATIVE and native_conversion.takes(plans)
    try:
        if mode == MODE_ENGINE or (mode == MODE_NATIVE and not native):
            # Start the engine first: it loads while the source is verified. Ranges
            # pass through its home, which it removes.
            session = EngineSession()
        artifact = held or HeldArtifact(source, receipt)
    except BaseException:
        if session is not None:
            session.close()
        shutil.rmtree(directory, ignore_errors=True)
        raise
    try:
        _check_deadline(budget, deadline, "entry")
        if own_held:  # a caller's held descriptor was verified by that caller
            artifact.verify()
            _check_deadline(budget, deadline, "entry verification")
        path = directory / SPOOL_NAME
        engine_result = None
        declined = False
        if native:
            engine_result = _native_spool(
                artifact, receipt, plans, path, budget, deadline, progress
            )
            if engine_result is None:
                path.unlink(missing_ok=True)
                # The engine takes what the compiled converter declined; if it cannot
                # start, the stage fails as with --preparation engine-chdb, naming why.
                session = EngineSession()
        if session is not None:
            try:
                engine_result = _engine_spool(
                    artifact, receipt, plans, path, budget, deadline, session, progress
                )
            except _Declined:
                declined = True
            except EngineUnavailable as exc:
                if exc.code == "engine_timeout":
                    raise DeadlineError(
                        f"preparation deadline of {budget.deadline_seconds:g} s expired during engine conversion",
                        code="preparation_deadline",
                        phase="engine conversion",
                    ) from exc
                raise
            finally:
                session.close()
            if engine_result is None:
                path.unlink(missing_ok=True)
        if engine_result is None:
            digest, size, rows, content = _write_spool(
                artifact, receipt, plans, path, budget, deadline, str(source), progress
            )
            if session is not None and not declined:
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
        if session is not None:
            session.close()
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
    return PreparedSpool(path, identity, plans, mode)


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


def _engine_spool(
    artifact: HeldArtifact,
    receipt: FileReceipt,
    plans: tuple[ColumnPlan, ...],
    path: Path,
    budget: PreparationBudget,
    deadline: float | None,
    session: EngineSession,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[int, int, str] | None:
    """The engine fast path: (spool bytes, records, rows digest), or None to hand over.

    The source is read once, through the held descriptor, in ranges that end at a
    record boundary; every range is hashed in order before the engine sees it, so the
    bytes converted are provably the receipt's. Each range becomes a private file
    (0600, in the engine's private 0700 home) that one engine worker converts into a part of
    the spool and reads back for its row count and rows digest; at most a few ranges
    are in flight, so disk and memory stay flat whatever the file's size. Parts are
    joined in order. Any refusal or budget the engine cannot name exactly (a missing
    final LF, too many records, a too long record, the spool budget) goes to the
    reference, which reports it at its record and column.
    """
    work = session.work_dir
    chunk_bytes = engine_conversion.range_bytes(receipt.artifact_size, session.workers)
    source_digest = hashlib.sha256()
    size = records = written = rows_total = submitted = joined = 0
    counts: dict[int, int] = {}
    done: dict[int, EngineSpool] = {}
    content = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as out, artifact.stream() as stream:

        def collect() -> bool:
            """Wait for one range; join every finished one in order. False: refused."""
            nonlocal joined, written, rows_total, content
            job, answer = session.next_result(
                lambda: deadline is not None and budget.clock() >= deadline
            )
            if answer is None:
                return False
            done[job] = engine_conversion.parse_digest(answer)
            while joined in done:
                part = done.pop(joined)
                if part.rows != counts.pop(joined):
                    raise PreparationError(
                        f"the engine read {part.rows} rows back from its spool, the range has "
                        "a different number of records",
                        code="engine_divergence",
                    )
                part_path = work / f"out-{joined}"
                with open(part_path, "rb") as part_file:
                    written += _copy_all(part_file.fileno(), out.fileno())
                part_path.unlink()
                (work / f"in-{joined}").unlink()
                rows_total += part.rows
                content += int(part.rows_digest, 16)
                joined += 1
            return True

        ranges = RecordRanges(stream, chunk_bytes, budget.max_record_bytes or MAX_CARRY_BYTES)
        for data, end in ranges:
            chunk_path = work / f"in-{submitted}"
            counts[submitted] = spill_range(chunk_path, data, end, source_digest)
            del data
            size += end
            records += counts[submitted]
            if budget.max_rows is not None and records > budget.max_rows:
                return None
            session.submit(
                submitted,
                *engine_conversion.conversion_job(
                    plans,
                    chunk_path.absolute(),
                    (work / f"out-{submitted}").absolute(),
                    budget.max_record_bytes,
                ),
            )
            submitted += 1
            while submitted - joined > session.in_flight:
                if not collect():
                    return None
            _check_deadline(budget, deadline, f"engine conversion (record {records})")
            _check_free_space(path, budget, records)
            if budget.max_spool_bytes is not None and written > budget.max_spool_bytes:
                return None  # the reference names the record where the budget ran out
            if progress is not None:
                progress(rows_total, size)
        if ranges.too_long and budget.max_record_bytes is None:
            raise _Declined  # a record longer than the engine path holds: the reference decides
        if ranges.too_long or ranges.trailing:
            return None  # a record too long, or bytes after the last LF: the reference names them
        while joined < submitted:
            if not collect():
                return None
        out.flush()
        os.fsync(out.fileno())
    converted = _converted(
        receipt, path, budget, source_digest.hexdigest(), size, written, records, content
    )
    return converted if rows_total == records else None


def _native_spool(
    artifact: HeldArtifact,
    receipt: FileReceipt,
    plans: tuple[ColumnPlan, ...],
    path: Path,
    budget: PreparationBudget,
    deadline: float | None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[int, int, str] | None:
    """The compiled converter: (spool bytes, records, rows digest), or None to hand over.

    As :func:`_engine_spool`, with the ranges converted in this process's threads and
    their RowBinary appended to the spool in order; anything the converter declines,
    and any budget it cannot name exactly, goes to the next converter.
    """
    source_digest = hashlib.sha256()
    written = records = 0
    content = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as out, artifact.stream() as stream:
        ranges = NativeRanges(
            stream,
            plans,
            total_bytes=receipt.artifact_size,
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
        receipt, path, budget, source_digest.hexdigest(), ranges.size, written, records, content
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
    """The end of a fast path: (spool bytes, records, rows digest), or None to hand over.

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


class _Declined(Exception):
    """The engine path leaves a file it does not take in bounded memory to the reference."""


def _copy_all(source: int, target: int) -> int:
    """Append all of ``source`` to ``target`` inside the kernel; the bytes copied.

    ``sendfile``, not ``copy_file_range``: the part is on the engine's file system
    (often tmpfs), the spool on the work directory's, and the latter refuses a copy
    across file systems (EXDEV).
    """
    total = 0
    while copied := os.sendfile(target, source, None, 1 << 30):
        total += copied
    return total


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
