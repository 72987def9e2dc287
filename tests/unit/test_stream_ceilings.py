"""Which publication ceiling a staging stop was (issue 37, item 7): pure mapping."""

from __future__ import annotations

import dataclasses

import pytest

from dpone.contracts.composition_snapshot import DEFAULT_LIMITS, SnapshotLimits
from dpone.errors import DponeError
from dpone.publication.ceilings.retained import headroom_policy, headroom_refusal
from dpone.publication.ceilings.stream_ceilings import stream_refusal
from dpone.publication.composition import staging_policy

LIMITS = dataclasses.replace(
    DEFAULT_LIMITS,
    source_rows=10,
    source_bytes=2000,
    wire_bytes=900,
    generation_storage_bytes=700,
    total_transient_storage_bytes=5000,
)


def key(ceiling: str) -> str:
    return f"tables.t.limits.{ceiling}"


def test_the_policy_bounds_each_stream_by_its_smallest_ceiling() -> None:
    policy = staging_policy(LIMITS)
    assert (policy.max_rows, policy.max_scan_bytes) == (10, 2000)
    assert (policy.max_spool_bytes, policy.max_stored_bytes) == (700, 700)
    wide = staging_policy(dataclasses.replace(LIMITS, generation_storage_bytes=10**6))
    assert (wide.max_spool_bytes, wide.max_stored_bytes) == (900, 5000)


@pytest.mark.parametrize(
    ("limits", "code", "ceiling"),
    [
        (LIMITS, "too_many_records", "source_rows"),
        (LIMITS, "verification_budget_exceeded", "source_bytes"),
        (LIMITS, "spool_budget_exceeded", "generation_storage_bytes"),
        (LIMITS, "body_limit_exceeded", "generation_storage_bytes"),
        (LIMITS, "storage_budget_exceeded", "generation_storage_bytes"),
        (dataclasses.replace(LIMITS, wire_bytes=600), "spool_budget_exceeded", "wire_bytes"),
        (
            dataclasses.replace(LIMITS, total_transient_storage_bytes=500),
            "storage_budget_exceeded",
            "total_transient_storage_bytes",
        ),
    ],
)
def test_a_stop_at_a_bound_is_named_as_its_ceiling(
    limits: SnapshotLimits, code: str, ceiling: str
) -> None:
    policy = staging_policy(limits)
    stop = DponeError("stopped", code=code, observed=777)
    refusal = stream_refusal(limits, policy, stop, key)
    assert refusal is not None and refusal.code == "limit_exceeded"
    limit = getattr(limits, ceiling)
    assert refusal.details["ceiling"] == ceiling and refusal.details["limit"] == limit
    assert refusal.details["key"] == key(ceiling) and refusal.details["cause"] == code
    assert key(ceiling) in refusal.message and str(limit) in refusal.message


def test_other_failures_and_narrower_bounds_are_not_ceilings() -> None:
    policy = staging_policy(LIMITS)
    other = DponeError("no", code="count_mismatch")
    assert stream_refusal(LIMITS, policy, other, key) is None
    narrower = dataclasses.replace(policy, max_spool_bytes=100)  # someone else's bound
    spool = DponeError("over", code="spool_budget_exceeded")
    assert stream_refusal(LIMITS, narrower, spool, key) is None


def test_the_headroom_bounds_what_the_staged_table_stores_too() -> None:
    base = staging_policy(LIMITS)
    narrowed = headroom_policy(LIMITS, 4800, base)
    assert (narrowed.max_spool_bytes, narrowed.max_stored_bytes) == (200, 200)
    stored = DponeError("over", code="storage_budget_exceeded", observed=300)
    refusal = headroom_refusal(LIMITS, 4800, narrowed, stored)
    assert refusal is not None
    assert (refusal.details["ceiling"], refusal.details["headroom_bytes"]) == (
        "total_transient_storage_bytes",
        200,
    )
    wide = headroom_policy(LIMITS, 100, base)
    assert headroom_refusal(LIMITS, 100, wide, stored) is None  # generation storage bound it
