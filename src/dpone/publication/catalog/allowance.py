"""Which principals may hold a write grant on a publication's tables, per observation.

The catalog reports every user that can write the target or the generation unless the
user is trusted. Beside a fixed set (the administrator, the catalog, the closer), the
caller passes an :data:`AllowedWriters` callable that answers, for each observation,
the principals allowed now. :func:`lease_allowance` is that callable for a leased pool,
decided by each pool user's last lease:

- an active lease: allowed. The user is one of dpone's own principals in custody: its
  credentials exist only inside the process that holds the lease, every write it sends
  carries the lease's query-id mark and (over HTTP) runs in a drain-gated session, and
  its closure is proven before anything of its own attempt is published. Several
  tables of one database can therefore stage and prepare at once; what a *stale*
  active lease (its holder killed) may still send is what ``dpone snapshot leases``
  and ``dpone status`` name, and ending it turns it into the next case;
- an ended lease: allowed only when the closure of that lease is proven and stored
  (``closure_proven``). Until then a request of it may still arrive, so the user is a
  writer outside the leases and blocks (``writer_grant``) until
  ``dpone snapshot close-lease`` proves the closure;
- never leased: allowed. No credential of it was handed out, so nothing of dpone's
  runs as it (its password is in the same 0600 file as the administrator's; that file
  is the custody either way).

A grant allowed is not a write allowed: every pool user that no lease of the
observation's own publication holds (never leased, its last lease ended, or held right
now by another run's active lease) is accounted for at each observation by what it ran
against the generation and the target (:mod:`.pool_queries`);
:func:`accounted_pool_users` says who they are and since when.
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
    runs is no closed lease's:

    - no active lease: from its last lease's end, or (never leased) from when the store
      was made (``store_made_us``; 0 when unknown): what ran before this store existed,
      under another store the pool was handed over from, is not this store's to
      account for;
    - an active lease ``own`` refuses (another run's): from where it would count had
      it no lease, its previous lease's end (``ended_us``: each user's last ended
      lease's end), or the store's making: a query of its idle time before this lease
      is still accounted, and what its current lease runs is another run's, which
      never writes this publication's tables;
    - an active lease ``own`` accepts (the observed publication's own ingest or
      publisher): not accounted; the own closures are proven before anything is
      published;
    - an active lease ``peer`` accepts (another attempt's publisher of the same slot):
      accounted as another run's, except for the statements the slot's protocol
      decides between attempts (``slot_peer``: its CREATE of the target, its EXCHANGE).

    ``last`` holds each user's last lease with its end (Unix microseconds, None while
    active), oldest first; the last one seen of each user decides.
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
