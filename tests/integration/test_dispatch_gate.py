"""Dispatch against closure across real processes, and the drain gate's wait.

A holder process publishes through the library and SIGSTOPs itself at one step
between the claim and the EXCHANGE (tests/publication_harness.py); another process
reconciles meanwhile; then the holder gets SIGCONT. The record and the target must
agree every time: the reconcile that ends the lease before the session opened decides
NOT_PUBLISHED and the holder can no longer send; a holder stopped inside the gate
holds the reconcile back until its EXCHANGE answered (372 here: the session died
while the holder was stopped), and the reconcile then decides from that.
"""

from __future__ import annotations

import functools
import signal
import time
from pathlib import Path

import pytest

from dpone.contracts.composition_snapshot import (
    SnapshotIntent,
    SnapshotState,
)
from dpone.ports.composition_snapshot import PrincipalRef
from dpone.publication.authority.snapshot_authority import SnapshotAuthority
from dpone.publication.dispatch.dispatch_notes import dispatch_step_key
from dpone.publication.publisher.records import principal_ref
from tests.plugins.publication_rig import Case
from tests.publication_harness import STOP_STEPS

P = SnapshotState
# Stopped inside the dispatch gate: the reconcile waits for the holder.
INSIDE_GATE = ("after-session", "before-exchange")


def stopped(pid: int) -> bool:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return fields[0] == "T"


def wait_for(predicate: functools.partial[bool], seconds: float, what: str) -> None:
    give_up = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < give_up, what
        time.sleep(0.05)


@pytest.mark.parametrize("step", STOP_STEPS)
def test_a_stopped_holder_and_a_reconcile_agree_with_the_target(case: Case, step: str) -> None:
    holder = case.rig.child(f"stop-{step}", case.intent)
    try:
        wait_for(functools.partial(stopped, holder.pid), 60, f"the holder never reached {step}")
        reconciler = case.rig.child("reconcile", case.intent)
        if step in INSIDE_GATE:
            # Stopped past the session's death: T (1 s) plus the server's sweep, which
            # answers 372 reliably only from T + 2 s (measured), plus a second to spare.
            time.sleep(4.0)
            assert reconciler.poll() is None, "the reconcile did not wait for the gate"
        else:
            out, err = reconciler.communicate(timeout=60)
            assert out.strip() == "not_published@3", err
    finally:
        holder.send_signal(signal.SIGCONT)
    held_out, held_err = holder.communicate(timeout=120)
    if step in INSIDE_GATE:
        out, err = reconciler.communicate(timeout=120)
    record = case.record()
    notes = [n.facts for n in case.store().step_notes(dispatch_step_key(case.intent))]
    if step in INSIDE_GATE:
        # Stopped longer than T inside the gate: the session died meanwhile, so the late
        # EXCHANGE failed 372 and changed nothing; the reconcile, let through only then,
        # proves it.
        answered = [n for n in notes if n.get("step") == "exchange_answered"]
        assert [(n["outcome"], n["clickhouse_code"]) for n in answered] == [("refused", 372)]
        assert (record.state, record.revision) == (P.NOT_PUBLISHED, 3), (out, err, held_err)
        assert case.holds_a()
        return
    assert (record.state, record.revision) == (P.NOT_PUBLISHED, 3), (held_out, held_err)
    assert case.holds_a()
    assert "QueryStart" not in case.rig.exchange_events(case.intent)
    assert all(n.get("step") != "session_opening" for n in notes)
    if step in ("after-credentials", "before-gate"):
        # The resumed holder's re-check refused under the gate, with its reason, and
        # its own losing reconcile kept what it observed.
        assert {"step": "dispatch_refused", "reason": "lease_ended"}.items() <= notes[-1].items()
        steps = [entry.facts.get("step") for entry in case.store().history(case.intent)]
        assert "reconcile_lost" in steps
        assert held_out.strip() == "not_published@3", held_err


class Sleeps:
    """Sleeps that only move a clock (the monotonic clock plus what was slept)."""

    def __init__(self) -> None:
        self.slept: list[float] = []

    def clock(self) -> float:
        return time.monotonic() + sum(self.slept)

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


def test_closure_without_an_opened_session_does_not_wait(case: Case) -> None:
    sleeps = Sleeps()
    authority = functools.partial(SnapshotAuthority, clock=sleeps.clock, sleep=sleeps.sleep)
    publisher = case.rig.components(authority=authority).publisher
    publisher.cancel(case.intent)
    closure = case.last_facts()["closure"]
    assert isinstance(closure, dict) and closure["proven"] is True
    facts = closure["facts"]
    assert facts["gate_wait_ms"] == 0
    assert [g["answer"] for g in facts["sessions"]] == [372]
    policy = publisher.authority.policy  # type: ignore[attr-defined]
    # Only the samples' pacing (each sleep tops its sample up to the spacing); nothing
    # waits for a session that never existed.
    assert len(sleeps.slept) == policy.samples - 1
    assert all(0 <= s <= policy.sample_spacing_seconds for s in sleeps.slept), sleeps.slept


def _publisher_ref(case: Case) -> PrincipalRef:
    intent = SnapshotIntent.from_bytes(case.store().load(case.intent).intent_bytes)
    return principal_ref(intent.publisher)
