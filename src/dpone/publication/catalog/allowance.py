"""Which principals may hold a write grant on a publication's tables, per observation.

The catalog reports every user that can write the target or the generation unless the
user is trusted. Beside a fixed set (the administrator, the catalog, the closer), the
caller passes an :data:`AllowedWriters` callable that answers, for each observation,
the principals allowed now. :func:`lease_allowance` is that callable for a leased pool:

- a pool user holding an active lease is allowed only when that lease belongs to the
  attempt whose generation is observed (the current holder); the holder of another
  attempt's lease can write these tables too, so it is reported;
- a pool user holding no lease is allowed only when the closure of its last lease is
  proven (``closure_proven``): until then a request of that lease may still arrive;
- a pool user that was never leased is allowed: no credential of it was handed out,
  so nothing of dpone's runs as it (its password is in the same 0600 file as the
  administrator's; that file is the custody either way).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from dpone.connectors.clickhouse_tables import staging_table_name
from dpone.ports.composition_snapshot import Lease, TargetSlot

# (slot, generation table) -> the principals whose write grants are allowed right now.
AllowedWriters = Callable[[TargetSlot, str], Collection[str]]


def allowed_pool_users(
    leases: Sequence[Lease],
    closure_proven: Callable[[Lease], bool],
    pool: Collection[str],
    generation_table: str,
) -> frozenset[str]:
    """The pool users allowed to hold write grants while ``generation_table`` is observed.

    ``leases`` are every lease ever issued, oldest first (the store's order).
    """
    last: dict[str, Lease] = {}
    for lease in leases:
        last[lease.user] = lease  # oldest first: the last one seen is the last issued
    allowed = set()
    for user in pool:
        latest = last.get(user)
        if latest is None:
            allowed.add(user)
        elif latest.active:
            if staging_table_name(latest.attempt_id) == generation_table:
                allowed.add(user)
        elif closure_proven(latest):
            allowed.add(user)
    return frozenset(allowed)


def lease_allowance(
    leases: Callable[[], Sequence[Lease]],
    closure_proven: Callable[[Lease], bool],
    pool: Collection[str],
) -> AllowedWriters:
    """An :data:`AllowedWriters` over the leases as they are at each observation.

    ``leases`` is called once per observation (for example
    ``lambda: [r.lease for r in store.lease_records(active_only=False)]``).
    """
    members = frozenset(pool)

    def allowed(slot: TargetSlot, generation_table: str) -> frozenset[str]:
        del slot  # the generation names the attempt, and with it the current holders
        return allowed_pool_users(leases(), closure_proven, members, generation_table)

    return allowed
