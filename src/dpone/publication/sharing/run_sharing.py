"""One run's shared reads: the observations and closure proofs its tables ask at once.

A run that refreshes several tables in threads of one process hands every table's
publication the same :class:`RunSharing`. The catalog of each database answers
``observe`` and ``identities`` from one observation of every slot asked at once
(``observe_many``), and the executor's last look before an EXCHANGE
(``side_effects_now``) from one look at every slot asked at once
(``side_effects_many``); the authority answers ``close_principal`` from one closure of
every lease asked at once (``close_principals``): each answer is the slot's or the
lease's own, read after it was asked (:mod:`.group_commit`). Nothing else is shared.
See docs/publication.md ("Many tables in one run").
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from dpone.errors import DponeError
from dpone.ports.composition_snapshot import (
    Blocker,
    CatalogObservation,
    ClosureProof,
    PrincipalRef,
    TargetSlot,
)
from dpone.publication.sharing.group_commit import GroupCommit
from dpone.publication.store.holder_process import closing_here, wait_closures_begun_here

# A slot of one database: its target's name and its generation's.
Pair = tuple[str, str]
T = TypeVar("T")
# How long a batch's first caller waits for the others the run expects.
GATHER_SECONDS = 0.05
# At most this long an observation waits for the closures running as it begins.
CLOSURE_WAIT_SECONDS = 5.0


class ObservesMany(Protocol):
    """The catalog's reads of several slots of one database at once."""

    def observe_many(
        self, database: str, pairs: Sequence[Pair], *, side_effects: bool = True
    ) -> Mapping[Pair, CatalogObservation]: ...


class LooksMany(Protocol):
    """The catalog's last look at the side effects of several slots at once."""

    def side_effects_many(
        self, database: str, pairs: Sequence[Pair]
    ) -> Mapping[Pair, tuple[Blocker, ...]]: ...


class ClosesMany(Protocol):
    """The authority's closure of several leases at once."""

    def close_principals(self, principals: Sequence[PrincipalRef]) -> list[ClosureProof]: ...


class SharesObservations(ObservesMany, LooksMany, Protocol):
    """A catalog whose observations and last looks a run may answer (its ``shared``
    and ``shared_side_effects`` hooks)."""

    shared: Callable[[TargetSlot, str, bool], CatalogObservation] | None
    shared_side_effects: Callable[[TargetSlot, str], tuple[Blocker, ...]] | None


class SharesClosures(ClosesMany, Protocol):
    """An authority whose closures a run may answer (its ``shared_close`` hook)."""

    shared_close: Callable[[PrincipalRef], ClosureProof] | None


class RunSharing:
    """The group commits of one run, by what is asked and the database it is asked of.

    ``expected()`` is how many of the run's tables may ask now (its running tables):
    a batch's first caller waits up to ``gather_seconds`` for that many.
    """

    def __init__(
        self,
        *,
        expected: Callable[[], int] = lambda: 1,
        gather_seconds: float = GATHER_SECONDS,
    ) -> None:
        self._expected = expected
        self._gather = gather_seconds
        self._lock = threading.Lock()
        self._groups: dict[tuple[str, str], GroupCommit[Any, Any]] = {}

    def expect(self, expected: Callable[[], int]) -> None:
        """From now on, ``expected()`` says how many tables may ask at once."""
        self._expected = expected

    def observation(
        self, catalog: ObservesMany, database: str, pair: Pair, *, side_effects: bool
    ) -> CatalogObservation:
        """``pair``'s observation (``side_effects=False``: its identities), read with
        those of every slot of ``database`` asked at once."""
        kind = "observe" if side_effects else "identities"

        def observe(pairs: Sequence[Pair]) -> Mapping[Pair, CatalogObservation]:
            if side_effects:
                # A lease another table is closing now would be read as a writer, and
                # the observation taken again once its proof is stored: wait for it.
                wait_closures_begun_here(CLOSURE_WAIT_SECONDS)
            return catalog.observe_many(database, pairs, side_effects=side_effects)

        return self._answer(kind, database, pair, observe)

    def side_effects(self, catalog: LooksMany, database: str, pair: Pair) -> tuple[Blocker, ...]:
        """``pair``'s last look before its EXCHANGE, read with those of every slot of
        ``database`` asked at once (the pool's principals are left to the observation,
        so it waits for no closure)."""

        def look(pairs: Sequence[Pair]) -> Mapping[Pair, tuple[Blocker, ...]]:
            return catalog.side_effects_many(database, pairs)

        return self._answer("side_effects", database, pair, look)

    def _answer(
        self,
        kind: str,
        database: str,
        pair: Pair,
        read_many: Callable[[Sequence[Pair]], Mapping[Pair, T]],
    ) -> T:
        """``pair``'s answer from one ``read_many`` of every slot asked at once."""

        def batch(pairs: Sequence[Pair]) -> Mapping[Pair, T | DponeError]:
            try:
                return read_many(pairs)
            except DponeError:
                if len(pairs) == 1:
                    raise
            # A name of one slot changed, say: each slot is read alone, so that what
            # refuses one table refuses it alone (each still read after it asked).
            alone: dict[Pair, T | DponeError] = {}
            for one in pairs:
                try:
                    alone[one] = read_many([one])[one]
                except DponeError as exc:
                    alone[one] = exc
            return alone

        group: GroupCommit[Pair, T | DponeError] = self._group(kind, database, batch)
        answer = group(pair, batch)  # a batch it leads reads through its own catalog
        if isinstance(answer, DponeError):
            raise answer
        return answer

    def closure(
        self, authority: ClosesMany, database: str, principal: PrincipalRef
    ) -> ClosureProof:
        """``principal``'s closure proof, proven with every lease asked at once."""

        def batch(principals: Sequence[PrincipalRef]) -> Mapping[PrincipalRef, ClosureProof]:
            return dict(zip(principals, authority.close_principals(principals), strict=True))

        group: GroupCommit[PrincipalRef, ClosureProof] = self._group("close", database, batch)
        # Closing from the moment it is asked: a batch whose leader stopped may have
        # ended the lease before this one's own batch proves it.
        with closing_here([principal.lease_id]):
            return group(principal, batch)  # a batch it leads closes through its own ports

    def attach(self, catalog: SharesObservations, authority: SharesClosures, database: str) -> None:
        """Answer ``catalog``'s observations and last looks and ``authority``'s closures
        of ``database`` with the run's other tables' asked at once."""
        catalog.shared = lambda slot, generation, side: self.observation(
            catalog, database, (slot.table, generation), side_effects=side
        )
        catalog.shared_side_effects = lambda slot, generation: self.side_effects(
            catalog, database, (slot.table, generation)
        )
        authority.shared_close = lambda principal: self.closure(authority, database, principal)

    def batches(self) -> dict[str, list[int]]:
        """Each group's batch sizes so far, by ``kind:database`` (for the run's report)."""
        with self._lock:
            return {f"{k}:{d}": list(g.batches) for (k, d), g in self._groups.items()}

    def _group(
        self, kind: str, database: str, batch: Callable[[Sequence[Any]], Mapping[Any, Any]]
    ) -> GroupCommit[Any, Any]:
        # The first table to ask creates the group; each batch then runs the batch of
        # the caller that leads it, through that table's own ports (its credentials
        # are read when its publication is built: a rotation meanwhile is its own).
        with self._lock:
            group = self._groups.get((kind, database))
            if group is None:
                group = GroupCommit(
                    batch, expected=lambda: self._expected(), gather_seconds=self._gather
                )
                self._groups[(kind, database)] = group
            return group
