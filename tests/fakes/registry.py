"""An in-memory :class:`SnapshotRunRegistry` for tests (the durable one is SQLite).

It follows the port's documented rules: a new admission increments the slot's epoch
and moves older ACTIVE runs of the slot to RETIRING; ownership only moves forward;
a lease takes the first candidate without an active lease.
"""

from __future__ import annotations

import itertools
import threading

from dpone.errors import StateError
from dpone.ports.composition_snapshot import (
    Admission,
    AttemptEpochs,
    Lease,
    OwnershipState,
    TargetSlot,
)

_ORDER = [OwnershipState.ACTIVE, OwnershipState.RETIRING, OwnershipState.RETIRED]


class MemoryRunRegistry:
    """Admissions, epochs, ownership and leases in memory; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._admissions: dict[str, Admission] = {}
        self._epochs: dict[TargetSlot, int] = {}
        self._leases: dict[str, Lease] = {}
        self._ids = itertools.count(1)
        self.blocked: set[TargetSlot] = set()

    def admit(self, slot: TargetSlot, attempt_id: str) -> Admission:
        with self._lock:
            if attempt_id in self._admissions:
                return self._admissions[attempt_id]
            if slot in self.blocked:
                raise StateError(f"slot {slot} is blocked", code="slot_blocked")
            for other in list(self._admissions.values()):
                if other.slot == slot and other.ownership is OwnershipState.ACTIVE:
                    self._replace(other, OwnershipState.RETIRING)
            epoch = self._epochs.get(slot, 0) + 1
            self._epochs[slot] = epoch
            admission = Admission(
                parent_request=f"request-{attempt_id}",
                slot=slot,
                attempt_id=attempt_id,
                epochs=AttemptEpochs(slot_epoch=epoch, attempt_epoch=len(self._admissions) + 1),
                ownership=OwnershipState.ACTIVE,
            )
            self._admissions[attempt_id] = admission
            return admission

    def admission(self, attempt_id: str) -> Admission | None:
        with self._lock:
            return self._admissions.get(attempt_id)

    def current_epoch(self, slot: TargetSlot) -> int:
        with self._lock:
            return self._epochs.get(slot, 0)

    def set_ownership(self, parent_request: str, state: OwnershipState) -> None:
        with self._lock:
            found = [a for a in self._admissions.values() if a.parent_request == parent_request]
            if not found:
                raise StateError(f"no run {parent_request}", code="run_not_found")
            if _ORDER.index(state) < _ORDER.index(found[0].ownership):
                raise StateError("ownership only moves forward", code="invalid_ownership")
            self._replace(found[0], state)

    def lease(self, role: str, candidates: tuple[str, ...], attempt_id: str) -> Lease:
        with self._lock:
            busy = {lease.user for lease in self._leases.values() if lease.active}
            for user in candidates:
                if user not in busy:
                    lease = Lease(f"lease-{next(self._ids)}", user, role, attempt_id, True)
                    self._leases[lease.lease_id] = lease
                    return lease
            raise StateError(f"no free {role} principal", code="pool_exhausted")

    def end_lease(self, lease_id: str) -> Lease:
        with self._lock:
            lease = self._get(lease_id)
            ended = Lease(lease.lease_id, lease.user, lease.role, lease.attempt_id, False)
            self._leases[lease_id] = ended
            return ended

    def get_lease(self, lease_id: str) -> Lease:
        with self._lock:
            return self._get(lease_id)

    def leases_of(self, attempt_id: str) -> list[Lease]:
        with self._lock:
            return [lease for lease in self._leases.values() if lease.attempt_id == attempt_id]

    def _get(self, lease_id: str) -> Lease:
        if lease_id not in self._leases:
            raise StateError(f"no lease {lease_id}", code="lease_not_found")
        return self._leases[lease_id]

    def _replace(self, admission: Admission, state: OwnershipState) -> None:
        self._admissions[admission.attempt_id] = Admission(
            admission.parent_request, admission.slot, admission.attempt_id, admission.epochs, state
        )
