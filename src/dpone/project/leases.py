"""Leases of the principal pool whose holder is gone, proven from durable facts.

A process killed with SIGKILL ends none of its pool leases, and four such exhaust a role
(``pool_exhausted``). :func:`judge_leases` decides, for every active lease, whether its
holder can still use it (``gone``, ``live`` or ``unknown``), only from facts that never
turn false once true: the intent that names a publisher lease, the journal of an ingest
lease's attempt, and the holder process as
:mod:`dpone.publication.store.holder_process` proves it; ``unknown`` is never ended. An
ended lease is not yet a closed one: :func:`close_lease` proves and stores its closure,
and :func:`unproven_closures` lists those still without one. See docs/operations.md
(``lease_abandoned``, ``closure_unproven``).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpone.contracts.composition_snapshot import SnapshotIntent, SnapshotState
from dpone.errors import DponeError, StateError
from dpone.localserver.principal_pool import ROLE_INGEST, ROLE_PUBLISHER
from dpone.ports.composition_snapshot import ClosureProof, PrincipalRef, TargetSlot
from dpone.publication.composition import PublicationComponents
from dpone.publication.store import LeaseRecord, SnapshotStore
from dpone.publication.store.holder_process import Liveness, holder_liveness
from dpone.staging.journal import read_events
from dpone.staging.states import TERMINAL

GONE, LIVE, UNKNOWN = "gone", "live", "unknown"
_TERMINAL_STAGE = {s.value for s in TERMINAL}
_UNRESOLVED = {SnapshotState.EXCHANGE_INTENT.value, SnapshotState.COMMIT_UNKNOWN.value}


@dataclass(frozen=True)
class LeaseVerdict:
    """One active lease and whether its holder can still use it (``holder``)."""

    record: LeaseRecord
    holder: str  # GONE, LIVE or UNKNOWN
    reason: str
    evidence: dict[str, Any]

    @property
    def lease_id(self) -> str:
        return self.record.lease.lease_id

    def to_dict(self) -> dict[str, Any]:
        lease = self.record.lease
        return {
            "lease_id": lease.lease_id,
            "user": lease.user,
            "role": lease.role,
            "attempt_id": lease.attempt_id,
            "issued_at": self.record.issued_at,
            "holder": self.holder,
            "reason": self.reason,
            "evidence": self.evidence,
            "holder_process": None if self.record.holder is None else self.record.holder.to_dict(),
        }


def project_journal_dirs(work_dir: Path) -> list[Path]:
    """Where a project's attempts keep their journals (refresh and rollback)."""
    return [work_dir / "attempts", work_dir / "rollbacks"]


def end_lease_command(lease_id: str, store: Path | str, journal_dirs: Sequence[Path]) -> str:
    """The exact ``dpone snapshot end-lease`` command for ``lease_id``."""
    argv = ["dpone", "snapshot", "end-lease", lease_id, "--store", str(store)]
    for directory in journal_dirs:
        argv += ["--work-dir", str(directory)]
    return shlex.join(argv)


def close_lease_command(
    lease_id: str, store: Path | str, server: Path | Sequence[str] | None = None
) -> str:
    """The exact ``dpone snapshot close-lease`` command that proves ``lease_id`` closed.

    ``server``: the managed server's data directory, or the arguments that name the
    server (:meth:`~dpone.project.config.Project.server_arguments`)."""
    argv = ["dpone", "snapshot", "close-lease", lease_id, "--store", str(store)]
    if isinstance(server, Path):
        argv += ["--data-dir", str(server)]
    elif server is not None:
        argv += list(server)
    return shlex.join(argv)


def judge_leases(store: SnapshotStore, journal_dirs: Sequence[Path]) -> list[LeaseVerdict]:
    """A verdict for every active lease of ``store``, oldest first."""
    intents = [(SnapshotIntent.from_bytes(s.intent_bytes), s.state) for s in store.list_snapshots()]
    # A PREPARED intent a newer epoch of its slot superseded can never be claimed: its
    # publisher lease holds nothing that may still be sent.
    superseded = {
        i.sha256
        for i, state in intents
        if state == SnapshotState.PREPARED.value
        and i.slot_epoch < store.current_epoch(TargetSlot(i.database, i.target_table))
    }
    return [_judge(r, intents, journal_dirs, superseded) for r in store.lease_records()]


def end_gone_lease(
    store: SnapshotStore, lease_id: str, journal_dirs: Sequence[Path]
) -> tuple[LeaseVerdict | None, bool]:
    """End ``lease_id`` only if its holder is proven gone; the verdict and whether it ended.

    ``(None, False)``: the lease had already ended. ``lease_holder_live`` or
    ``lease_holder_unknown`` (nothing written) otherwise.
    """
    store.get_lease(lease_id)  # lease_not_found before anything else
    verdict = next((v for v in judge_leases(store, journal_dirs) if v.lease_id == lease_id), None)
    if verdict is None:
        return None, False
    if verdict.holder != GONE:
        raise StateError(
            f"lease {lease_id} ({verdict.record.lease.user}) is not proven abandoned: "
            f"{verdict.reason} ({verdict.evidence.get('fact', '')})",
            code=f"lease_holder_{verdict.holder}",
            lease_id=lease_id,
            reason=verdict.reason,
            evidence=verdict.evidence,
        )
    facts = {
        "reason": verdict.reason,
        "evidence": verdict.evidence,
        "journal_dirs": [str(d) for d in journal_dirs],
    }
    _, ended = store.end_lease_of_gone_holder(lease_id, facts)
    return verdict, ended


def _judge(
    record: LeaseRecord,
    intents: list[tuple[SnapshotIntent, str]],
    journal_dirs: Sequence[Path],
    superseded: set[str],
) -> LeaseVerdict:
    lease = record.lease
    if lease.role == ROLE_PUBLISHER:
        bound = [(i, state) for i, state in intents if i.publisher.lease_id == lease.lease_id]
        if bound:
            intent, state = bound[0]
            evidence = {"intent_sha256": intent.sha256, "state": state}
            if intent.sha256 in superseded:
                return LeaseVerdict(record, GONE, "intent_superseded", evidence)
            if state == SnapshotState.PREPARED.value:
                return LeaseVerdict(record, LIVE, "intent_prepared", evidence)
            if state in _UNRESOLVED:
                return LeaseVerdict(record, LIVE, "intent_unresolved", evidence)
            return LeaseVerdict(record, GONE, "intent_terminal", evidence)
        return _by_process(record, {"intent": None})
    if lease.role != ROLE_INGEST:
        return LeaseVerdict(record, UNKNOWN, "unknown_role", {"role": lease.role})
    prepared = [i.sha256 for i, _ in intents if i.attempt_id == lease.attempt_id]
    if prepared:
        return LeaseVerdict(record, GONE, "attempt_prepared", {"intent_sha256": prepared[0]})
    journal = next(
        (d / lease.attempt_id for d in journal_dirs if (d / lease.attempt_id).is_dir()), None
    )
    if journal is None:
        searched = {"searched": [str(d) for d in journal_dirs]}
        found = _by_process(record, searched)
        if found.holder == LIVE:
            return found
        # Without its journal the attempt may have staged elsewhere, for a later prepare.
        return LeaseVerdict(record, UNKNOWN, "journal_not_found", {**found.evidence})
    try:
        events = read_events(journal)
    except DponeError as exc:
        return LeaseVerdict(
            record, UNKNOWN, "journal_unreadable", {"journal": str(journal), "error": exc.code}
        )
    last = events[-1].document if events else {}
    ended = str(last.get("state")) if events else None
    facts: dict[str, Any] = {"journal": str(journal), "journal_state": ended}
    if ended in _TERMINAL_STAGE and ended != "staged":
        return LeaseVerdict(record, GONE, "attempt_terminal", facts)
    if ended == "staged":
        if "rollback" not in last:
            return LeaseVerdict(record, LIVE, "staged_unprepared", facts)
        found = _by_process(record, facts)
        reason = "rollback_abandoned" if found.holder == GONE else found.reason
        return LeaseVerdict(record, found.holder, reason, found.evidence)
    return _by_process(record, facts)


def _by_process(record: LeaseRecord, evidence: dict[str, Any]) -> LeaseVerdict:
    liveness, fact = holder_liveness(record.holder)
    facts = {**evidence, "fact": fact}
    if liveness is Liveness.GONE:
        return LeaseVerdict(record, GONE, "process_gone", facts)
    if liveness is Liveness.ALIVE:
        return LeaseVerdict(record, LIVE, "process_alive", facts)
    return LeaseVerdict(record, UNKNOWN, "process_unknown", facts)


def unproven_closures(store: SnapshotStore) -> list[LeaseRecord]:
    """Ended leases that are their user's last and have no proven closure, oldest first.

    Each one's pool user blocks ``prepare`` of any table it can write
    (``writer_grant``) until :func:`close_lease` proves the closure.
    """
    last = store.last_lease_records()
    return [r for r in last if not r.lease.active and not store.closure_proven(r.lease)]


def close_lease(parts: PublicationComponents, lease_id: str) -> ClosureProof:
    """Close ``lease_id`` (ending it if it is active) and store the proof of its closure.

    The authority's closure, scoped to this lease (its marked queries once the user
    was leased again, its drain-gate sessions); proven or not, the proof is stored
    under the lease's step key, and a proven one lets the user write again.
    """
    lease = parts.store.get_lease(lease_id)
    ref = PrincipalRef(lease.user, parts.issuer.user_uuid(lease.user), lease.lease_id)
    return parts.publisher.authority.close_principal(ref)


def close_attempt_leases(parts: PublicationComponents, attempt_id: str) -> list[str]:
    """Close the ingest leases of ``attempt_id`` still active or ended unproven; their ids.

    For an attempt whose generation will never be published: the pool gets the user
    back, and a user whose closure is proven may write again.
    """
    store = parts.store
    assert isinstance(store, SnapshotStore)
    mine = [
        lease.lease_id
        for lease in store.leases_of(attempt_id)
        if lease.role == ROLE_INGEST and (lease.active or not store.closure_proven(lease))
    ]
    for lease_id in mine:
        close_lease(parts, lease_id)
    return mine
