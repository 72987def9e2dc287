"""RunSharing: one group per kind and database, each caller given its own answer."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

from dpone.errors import DponeError
from dpone.ports.composition_snapshot import (
    Blocker,
    CatalogObservation,
    ClosureProof,
    ClosureStrength,
    PrincipalRef,
)
from dpone.publication.sharing.run_sharing import Pair, RunSharing


class _Catalog:
    """Answers each pair with an observation naming it in observed_at; records calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Pair, ...], bool]] = []

    def observe_many(
        self, database: str, pairs: Sequence[Pair], *, side_effects: bool = True
    ) -> Mapping[Pair, CatalogObservation]:
        self.calls.append((database, tuple(pairs), side_effects))
        return {p: CatalogObservation(None, None, 0, f"{database}.{p[0]}/{p[1]}") for p in pairs}

    def side_effects_many(
        self, database: str, pairs: Sequence[Pair]
    ) -> Mapping[Pair, tuple[Blocker, ...]]:
        """A blocker naming each pair; a batch holding ("bad", ...) fails whole, and
        that slot alone fails on its own."""
        self.calls.append((database, tuple(pairs), True))
        if any(t == "bad" for t, _ in pairs):
            raise DponeError("a name changed during the look", code="catalog_unobservable")
        return {p: (Blocker("seen", f"{database}.{p[0]}/{p[1]}"),) for p in pairs}


class _Authority:
    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def close_principals(self, principals: Sequence[PrincipalRef]) -> list[ClosureProof]:
        self.calls.append([p.user for p in principals])
        return [
            ClosureProof(p, p.user != "u2", ClosureStrength.CUSTODIAL, {"user": p.user})
            for p in principals
        ]


def _together(calls: list[object]) -> list[object]:
    """Run each zero-argument callable in its own thread, released together."""
    answers: list[object] = [None] * len(calls)
    start = threading.Barrier(len(calls))

    def one(i: int) -> None:
        start.wait()
        answers[i] = calls[i]()  # type: ignore[operator]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    return answers


def test_observations_of_one_database_asked_together_are_one_read() -> None:
    catalog = _Catalog()
    sharing = RunSharing(expected=lambda: 3, gather_seconds=5.0)
    pairs = [("t1", "g1"), ("t2", "g2"), ("t3", "g3")]
    answers = _together(
        [lambda p=p: sharing.observation(catalog, "db", p, side_effects=True) for p in pairs]
    )
    assert [a.observed_at for a in answers] == ["db.t1/g1", "db.t2/g2", "db.t3/g3"]  # type: ignore[attr-defined]
    assert len(catalog.calls) == 1 and sorted(catalog.calls[0][1]) == pairs
    assert sharing.batches() == {"observe:db": [3]}


def test_kinds_and_databases_are_never_mixed_in_one_read() -> None:
    catalog = _Catalog()
    sharing = RunSharing(expected=lambda: 1, gather_seconds=0.0)
    sharing.observation(catalog, "a", ("t", "g"), side_effects=True)
    sharing.observation(catalog, "a", ("t", "g"), side_effects=False)
    sharing.observation(catalog, "b", ("t", "g"), side_effects=True)
    assert catalog.calls == [
        ("a", (("t", "g"),), True),
        ("a", (("t", "g"),), False),
        ("b", (("t", "g"),), True),
    ]
    assert sharing.batches() == {"observe:a": [1], "identities:a": [1], "observe:b": [1]}


def test_each_lease_gets_its_own_proof_from_a_shared_closure() -> None:
    authority = _Authority()
    sharing = RunSharing(expected=lambda: 3, gather_seconds=5.0)
    refs = [PrincipalRef(f"u{i}", f"id{i}", f"lease{i}") for i in (1, 2, 3)]
    proofs = _together([lambda r=r: sharing.closure(authority, "db", r) for r in refs])
    assert [(p.principal, p.proven) for p in proofs] == [  # type: ignore[attr-defined]
        (refs[0], True),
        (refs[1], False),
        (refs[2], True),
    ]
    assert len(authority.calls) == 1 and sorted(authority.calls[0]) == ["u1", "u2", "u3"]


def test_last_looks_asked_together_are_one_read_and_a_failing_slot_fails_alone() -> None:
    catalog = _Catalog()
    sharing = RunSharing(expected=lambda: 3, gather_seconds=5.0)
    pairs = [("t1", "g1"), ("bad", "g2"), ("t3", "g3")]

    def look(pair: Pair) -> object:
        try:
            return sharing.side_effects(catalog, "db", pair)
        except DponeError as exc:
            return exc

    answers = _together([lambda p=p: look(p) for p in pairs])
    assert answers[0] == (Blocker("seen", "db.t1/g1"),)
    assert isinstance(answers[1], DponeError) and answers[1].code == "catalog_unobservable"
    assert answers[2] == (Blocker("seen", "db.t3/g3"),)
    # One look for the three, failed whole; then each slot looked at alone.
    assert sorted(catalog.calls[0][1]) == sorted(pairs)
    assert sorted(c[1] for c in catalog.calls[1:]) == sorted((p,) for p in pairs)
    assert sharing.batches() == {"side_effects:db": [3]}
