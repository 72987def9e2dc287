"""Which publication ceiling stopped a staging stream, said as the ceiling.

:func:`~dpone.publication.composition.staging_policy` turns a publication's ceilings into
staging's streaming bounds, and each bound stops a stream with staging's own code;
:func:`stream_refusal` says which ceiling that bound stood for, its configured value and
the key that sets it (``limit_exceeded``), so a person knows what to change. Wire bytes
stand for the storage ceilings while the rows stream (what the server stores exists only
once they are in): an early stop, checked again at ``prepare`` and ``publish``. See
docs/publication-storage.md ("When the storage ceilings are checked").
"""

from __future__ import annotations

from collections.abc import Callable

from dpone.contracts.composition_snapshot import SnapshotLimits
from dpone.errors import DponeError
from dpone.publication.publisher.receipts import SnapshotPublicationError
from dpone.staging.contract import StagingPolicy

# The byte bound of the spool and the body stands for these ceilings, and the bound of
# what the staged table stores for these, each in this order (the first whose value is
# the bound is named).
BYTE_CEILINGS = ("wire_bytes", "generation_storage_bytes", "total_transient_storage_bytes")
STORED_CEILINGS = ("generation_storage_bytes", "total_transient_storage_bytes")
_BYTE_CODES = frozenset({"spool_budget_exceeded", "body_limit_exceeded"})
STORED_CODE = "storage_budget_exceeded"


def stream_bytes_bound(limits: SnapshotLimits) -> int:
    """The streaming byte bound ``limits`` allow one generation (at least 1)."""
    values: list[int] = [getattr(limits, name) for name in BYTE_CEILINGS]
    return max(min(values), 1)


def stored_bytes_bound(limits: SnapshotLimits) -> int:
    """What the staged table may store under ``limits`` (at least 1)."""
    values: list[int] = [getattr(limits, name) for name in STORED_CEILINGS]
    return max(min(values), 1)


def stream_refusal(
    limits: SnapshotLimits,
    policy: StagingPolicy,
    exc: DponeError,
    key: Callable[[str], str],
) -> SnapshotPublicationError | None:
    """``limit_exceeded`` for the ceiling whose bound in ``policy`` stopped ``exc``, or None.

    ``key(ceiling)`` is where that ceiling is set (``tables.items.limits.wire_bytes``,
    ``--limit wire_bytes=N``). None when ``exc`` is not a stream bound of ``policy`` or
    the bound was not one of ``limits``' (a narrower bound is its owner's to name).
    """
    ceiling = _ceiling_of(limits, policy, exc.code)
    if ceiling is None:
        return None
    limit = getattr(limits, ceiling)
    return SnapshotPublicationError(
        f"{ceiling}: the staging stream went over the ceiling {limit} ({exc.code}: "
        f"{exc.message}); it was stopped and nothing was published. Raise {key(ceiling)} "
        "if the table is meant to be this large",
        code="limit_exceeded",
        ceiling=ceiling,
        limit=limit,
        key=key(ceiling),
        cause=exc.code,
        # The stored size, when the stop was the staged table's (a stream stop has no
        # total: it stopped at the bound).
        **{k: exc.details[k] for k in ("observed",) if k in exc.details},
    )


def _ceiling_of(limits: SnapshotLimits, policy: StagingPolicy, code: str) -> str | None:
    if code == "too_many_records" and policy.max_rows == max(limits.source_rows, 1):
        return "source_rows"
    if code == "verification_budget_exceeded" and policy.max_scan_bytes == max(
        limits.source_bytes, 1
    ):
        return "source_bytes"
    names: tuple[str, ...]
    if code in _BYTE_CODES:
        names, bound = BYTE_CEILINGS, policy.max_spool_bytes
    elif code == STORED_CODE:
        names, bound = STORED_CEILINGS, policy.max_stored_bytes
    else:
        return None
    return next((name for name in names if max(getattr(limits, name), 1) == bound), None)
