"""The snapshot store's one error type, and the one mapping of a storage failure to it."""

from __future__ import annotations

from pathlib import Path

from dpone.errors import StateError

_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_NOTADB = 5, 6, 26


class SnapshotStoreError(StateError):
    """A store or registry operation was refused, or its outcome is not known.

    Codes: ``claim_lost``, ``claim_uncertain``, ``prepare_uncertain``,
    ``store_commit_unknown``, ``intent_exists``, ``attempt_used``, ``snapshot_not_found``,
    ``attempt_fenced``, ``ownership_not_active``, ``slot_blocked``, ``pool_exhausted``,
    ``lease_not_found``, ``admission_not_found``, ``admission_conflict``,
    ``invalid_ownership_transition``, ``store_unavailable``, ``store_not_sqlite``,
    ``store_schema_mismatch``, ``store_missing``, ``publication_unfinished`` and
    ``retirement_superseded`` (a slot's retirement, :mod:`.retirement`).
    """

    code = "store_unavailable"


def _primary_code(exc: BaseException) -> int | None:
    raw = getattr(exc, "sqlite_errorcode", None)
    return raw & 0xFF if isinstance(raw, int) else None


def sqlite_busy(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite's ``SQLITE_BUSY`` (any extended code of it)."""
    return _primary_code(exc) == _SQLITE_BUSY


def store_error(
    exc: BaseException, *, path: Path, operation: str, committing: bool, uncertain: str | None
) -> SnapshotStoreError:
    """The one mapping of a storage failure to a typed error (outcome known or not)."""
    primary = _primary_code(exc)
    text = str(exc)
    busy = primary in (_SQLITE_BUSY, _SQLITE_LOCKED) or "locked" in text or "busy" in text
    where = {"path": str(path), "operation": operation}
    name = getattr(exc, "sqlite_errorname", None)
    if isinstance(name, str):  # the extended result code (SQLITE_IOERR_SHMOPEN, ...)
        where["sqlite_error"] = name
    if uncertain is not None and (committing or busy):
        phase = "while committing" if committing else "while the database was busy"
        return SnapshotStoreError(
            f"{operation} on {path} failed {phase}; whether it was written is unknown: {text}",
            code=uncertain,
            **where,
        )
    if primary == _SQLITE_NOTADB or "file is not a database" in text:
        return SnapshotStoreError(
            f"{path} is not an SQLite database: {text}", code="store_not_sqlite", **where
        )
    return SnapshotStoreError(
        f"{operation} on {path} failed: {text}", code="store_unavailable", **where
    )


def store_missing(path: Path, why: str) -> SnapshotStoreError:
    """``store_missing``: a store that must exist is not at ``path`` (``why``)."""
    return SnapshotStoreError(
        f"no snapshot store at {path} ({why}); check --store (or the project's store)",
        code="store_missing",
        path=str(path),
    )
