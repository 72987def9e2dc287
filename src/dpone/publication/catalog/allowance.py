"""Which principals may hold a write grant on a publication's tables, per observation.

Beside a fixed set of trusted users (the administrator, the catalog, the closer), the
caller passes an :data:`AllowedWriters` callable answering, for each observation, the
principals allowed now. :func:`lease_allowance` is that callable for a leased pool,
decided by each pool user's last lease: an active lease is allowed, an ended one only
once its closure is proven and stored, a user never leased is allowed. A grant allowed
is not a write allowed: :func:`accounted_pool_users` names the pool users whose queries
against the tables are read (:mod:`.pool_queries`). See docs/publication-principals.md
("Who may write: leases, not the pool") and docs/publication-catalog.md ("Who may
write").
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from dpone.ports.composition_snapshot import Lease, TargetSlot

# (slot, generation table) -> the principals whose write grants are allowed right now.
AllowedWriters = Callable[[TargetSlot, str], Collection[str]]


@dataclass(frozen=True)
class Idle:
    """A pool user no lease of the observed publication holds: what it ran from
    ``since_us`` (Unix microseconds) on is accounted for; ``leased``: whether this store
    ever leased it; ``held_by``: the attempt whose active lease holds it now (another
    run's), empty when no lease is active."""

    since_us: int
    leased: bool
    held_by: str = ""
    # The publisher of another attempt of the same slot: the statements the slot's
    # protocol decides between attempts (:data:`SLOT_PROTOCOL_KINDS`) are not its
    # blockers; anything else it writes is.
    slot_peer: bool = False


# What a publisher of another attempt of the same slot sends that the slot's epochs,
# its one claim and the target UUID each intent binds decide: a first publication's
# CREATE of the target and the EXCHANGE (query_log's query_kind).
SLOT_PROTOCOL_KINDS = frozenset({"Create", "Rename"})


# (slot, generation table) -> the pool's users no lease of that publication holds,
# read once per observation.
IdlePool = Callable[[TargetSlot, str], Mapping[str, Idle]]


def allowed_pool_users(
    leases: Sequence[Lease],
    closure_proven: Callable[[Lease], bool],
    pool: Collection[str],
) -> frozenset[str]:
    """The pool users allowed to hold write grants now (see the module doc).

    ``leases`` are oldest first (the store's order): every lease ever issued, or only
    each user's last one; the last one seen of each user decides.
    """
    last: dict[str, Lease] = {}
    for lease in leases:
        last[lease.user] = lease  # oldest first: the last one seen is the last issued
    allowed = set()
    for user in pool:
        latest = last.get(user)
        if latest is None or latest.active or closure_proven(latest):
            allowed.add(user)
    return frozenset(allowed)


def lease_allowance(
    leases: Callable[[], Sequence[Lease]],
    closure_proven: Callable[[Lease], bool],
    pool: Collection[str],
) -> AllowedWriters:
    """An :data:`AllowedWriters` over the leases as they are at each observation.

    ``leases`` is called once per observation (for example
    ``lambda: [r.lease for r in store.last_lease_records()]``).
    """
    members = frozenset(pool)

    def allowed(slot: TargetSlot, generation_table: str) -> frozenset[str]:
        del slot, generation_table  # a pool user's last lease decides, whatever it writes
        return allowed_pool_users(leases(), closure_proven, members)

    return allowed


def accounted_pool_users(
    last: Sequence[tuple[Lease, int | None]],
    pool: Collection[str],
    store_made_us: int = 0,
    *,
    own: Callable[[Lease], bool],
    ended_us: Mapping[str, int],
    peer: Callable[[Lease], bool] = lambda lease: False,
) -> dict[str, Idle]:
    """Each pool user that no lease ``own`` accepts holds now, and since when what it
    runs is no closed lease's (Unix microseconds).

    A user with no active lease counts from its last lease's end, or, never leased, from
    the store's making (``store_made_us``; 0 when unknown); one whose active lease ``own``
    refuses (another run's) from its previous lease's end (``ended_us``) or the store's
    making; one whose lease ``own`` accepts is not accounted; one whose lease ``peer``
    accepts (another attempt's publisher of the same slot) is accounted as another run's,
    except for ``slot_peer`` statements. ``last`` holds each user's last lease with its end
    (None while active), oldest first. See docs/publication-catalog.md ("Who may write").
    """
    latest: dict[str, tuple[Lease, int | None]] = {}
    for lease, ended in last:
        latest[lease.user] = (lease, ended)
    accounted = {}
    for user in pool:
        found = latest.get(user)
        if found is None:
            accounted[user] = Idle(store_made_us, leased=False)
        elif not found[0].active:
            accounted[user] = Idle(found[1] or 0, leased=True)
        elif not own(found[0]):
            since = ended_us.get(user, store_made_us)
            accounted[user] = Idle(
                since, leased=True, held_by=found[0].attempt_id, slot_peer=peer(found[0])
            )
    return accounted
