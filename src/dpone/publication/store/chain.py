"""Re-verification of one intent's record chain from the bytes the history keeps.

Every transition the store writes keeps the exact canonical bytes of the revision it
made, so :func:`verify_chain` checks the chain from bytes alone, trusting none of the
``state``, ``revision`` and ``record_sha256`` columns beside them; a transition from
before the store kept bytes is listed as ``unverifiable``, never counted as verified.
See docs/publication.md ("The model", "The snapshot store").
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dpone.contracts.composition_snapshot import SnapshotRecord, check_transition
from dpone.errors import DponeError
from dpone.ports.composition_snapshot import HistoryEntry


@dataclass(frozen=True)
class ChainCheck:
    """What re-verifying one intent's chain found (``verified``: every revision held)."""

    intent_sha256: str
    revisions: int
    problems: tuple[str, ...] = ()
    unverifiable: tuple[int, ...] = field(default=())

    @property
    def verified(self) -> bool:
        return not self.problems and not self.unverifiable

    def to_dict(self) -> dict[str, Any]:
        return {
            "intent_sha256": self.intent_sha256,
            "verified": self.verified,
            "revisions": self.revisions,
            "problems": list(self.problems),
            "unverifiable_revisions": list(self.unverifiable),
        }


def verify_chain(intent_sha256: str, history: Sequence[HistoryEntry], current: bytes) -> ChainCheck:
    """Re-verify ``history``'s transitions from their bytes against the ``current`` record."""
    transitions = [h for h in history if h.record_sha256 is not None]
    problems: list[str] = []
    unverifiable: list[int] = []
    previous: SnapshotRecord | None = None
    previous_bytes: bytes | None = None
    for number, entry in enumerate(transitions, start=1):
        where = f"revision {entry.revision} (history #{entry.sequence})"
        if entry.revision != number:
            problems.append(f"{where}: expected revision {number}")
        if entry.record_bytes is None:
            unverifiable.append(entry.revision)
            previous, previous_bytes = None, None
            continue
        record = _parsed(entry, where, problems)
        if record is None:
            previous, previous_bytes = None, None
            continue
        if record.intent_sha256 != intent_sha256:
            problems.append(f"{where}: the record names intent {record.intent_sha256}")
        if number == 1 or (previous is not None and previous_bytes is not None):
            before = None if number == 1 else previous
            expected = (
                None if previous_bytes is None else hashlib.sha256(previous_bytes).hexdigest()
            )
            if record.previous_record_sha256 != (None if number == 1 else expected):
                problems.append(f"{where}: it does not name the bytes of the revision before it")
            try:
                check_transition(
                    None if before is None else before.state,
                    None if before is None else before.revision,
                    record.state,
                    record.revision,
                )
            except DponeError as exc:
                problems.append(f"{where}: {exc.message}")
        previous, previous_bytes = record, entry.record_bytes
    if not transitions:
        problems.append("the history holds no transition")
    elif transitions[-1].record_bytes is not None and transitions[-1].record_bytes != current:
        problems.append("the last revision's bytes are not the current record")
    return ChainCheck(intent_sha256, len(transitions), tuple(problems), tuple(unverifiable))


def _parsed(entry: HistoryEntry, where: str, problems: list[str]) -> SnapshotRecord | None:
    """The entry's record, checked against its own row; None (with a problem) otherwise."""
    data = entry.record_bytes
    assert data is not None
    if hashlib.sha256(data).hexdigest() != entry.record_sha256:
        problems.append(f"{where}: its bytes do not hash to the recorded digest")
        return None
    try:
        record = SnapshotRecord.from_bytes(data)
    except DponeError as exc:
        problems.append(f"{where}: its bytes are not a canonical record ({exc.message})")
        return None
    if (record.state.value, record.revision) != (entry.state, entry.revision):
        problems.append(
            f"{where}: its bytes say {record.state.value}@{record.revision},"
            f" the row {entry.state}@{entry.revision}"
        )
    return record
