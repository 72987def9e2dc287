"""Principal leases: at most one active lease per user, each with its holder noted.

:class:`PrincipalLeases` issues and ends leases and notes, under the step key
``lease/<lease_id>``, the lease's holder process in the transaction that issues it and
an operator's end of a lease whose holder is gone in the transaction that ends it; the
lease's closures append their proofs under the same key (:data:`CLOSURE_STEP`), and
:meth:`PrincipalLeases.closure_proven` answers from the last one. See docs/publication.md
("The snapshot store").
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dpone.contracts import canonical_json
from dpone.ports.composition_snapshot import Lease
from dpone.publication.store.connections import StoreConnection, StoreConnections
from dpone.publication.store.errors import SnapshotStoreError
from dpone.publication.store.holder_process import HolderProcess, current_process
from dpone.publication.store.schema import decode_facts, now
from dpone.publication.store.steps import append_step

_LEASE_COLUMNS = 'lease_id, "user", role, attempt_id, active'  # the order _lease reads
# The step of a closure's proof under the lease's key (see the module doc).
CLOSURE_STEP = "closure"
_LEASE_KEY_PREFIX = "lease/"


@dataclass(frozen=True)
class LeaseRecord:
    """One lease as stored, with when it was issued and the process that took it."""

    lease: Lease
    issued_at: str
    ended_at: str | None
    holder: HolderProcess | None


def lease_step_key(lease_id: str) -> str:
    """The ``steps`` key under which a lease's holder and its operator end are noted."""
    return f"{_LEASE_KEY_PREFIX}{lease_id}"


class PrincipalLeases:
    """Leases of pool principals: issued, ended, and listed with their holders."""

    def __init__(self, connections: StoreConnections) -> None:
        self.connections = connections

    def lease(self, role: str, candidates: tuple[str, ...], attempt_id: str) -> Lease:
        """Lease the first candidate without an active lease (``pool_exhausted``)."""
        with self.connections.write("lease", "store_commit_unknown") as conn:
            busy = {
                row[0]
                for row in conn.execute('SELECT "user" FROM leases WHERE active = 1').fetchall()
            }
            # A user whose last lease ended without a proven closure is not leased again:
            # a request of that lease may still arrive, and a new lease would hide it.
            held = {
                user: lease_id
                for user in candidates
                if user not in busy
                for lease_id in [_unproven_last_lease(conn, user)]
                if lease_id is not None
            }
            free = [user for user in candidates if user not in busy and user not in held]
            if not free:
                waiting = (
                    f"; {len(held)} wait until their last lease's closure is proven "
                    "(`dpone snapshot close-lease LEASE_ID`, listed by `dpone snapshot leases`)"
                    if held
                    else ""
                )
                raise SnapshotStoreError(
                    f"every {role} principal is leased ({', '.join(candidates) or 'none'})"
                    + waiting,
                    code="pool_exhausted",
                    role=role,
                    attempt_id=attempt_id,
                    unproven_leases=sorted(held.values()),
                )
            lease = Lease(uuid.uuid4().hex, free[0], role, attempt_id, True)
            at = now()
            conn.execute(
                "INSERT INTO leases VALUES (?, ?, ?, ?, 1, ?, NULL)",
                (lease.lease_id, lease.user, role, attempt_id, at),
            )
            # Who holds it, in the same transaction: a holder killed with SIGKILL cannot
            # end its lease, and only this record lets a later reader prove it gone.
            holder = {"step": "issued", "holder": current_process().to_dict()}
            append_step(conn, lease_step_key(lease.lease_id), canonical_json.dumps(holder), at)
        return lease

    def end_lease(self, lease_id: str) -> Lease:
        """End a lease (idempotent); returns it as stored now."""
        with self.connections.write("end_lease", "store_commit_unknown") as conn:
            conn.execute(
                "UPDATE leases SET active = 0, ended_at = ? WHERE lease_id = ? AND active = 1",
                (now(), lease_id),
            )
            return _lease_row(conn, lease_id)

    def end_lease_of_gone_holder(
        self, lease_id: str, facts: Mapping[str, Any]
    ) -> tuple[Lease, bool]:
        """End an operator-proven abandoned lease and note why, in one transaction.

        ``facts`` are what proved the holder gone (the caller decides; see
        :mod:`dpone.project.leases`). Returns the lease as stored now and whether
        this call ended it (False: it had already ended; nothing is written then).
        """
        note = canonical_json.dumps({"step": "ended_by_operator", **dict(facts)})
        with self.connections.write("end_lease_of_gone_holder", "store_commit_unknown") as conn:
            at = now()
            ended = conn.execute(
                "UPDATE leases SET active = 0, ended_at = ? WHERE lease_id = ? AND active = 1",
                (at, lease_id),
            ).rowcount
            lease = _lease_row(conn, lease_id)
            if ended:
                append_step(conn, lease_step_key(lease_id), note, at)
        return lease, bool(ended)

    def lease_records(self, *, active_only: bool = True) -> list[LeaseRecord]:
        """Leases (by default the active ones), oldest first, with their holder process."""
        return self._records("lease_records", " WHERE l.active = 1" if active_only else "")

    def last_lease_records(self) -> list[LeaseRecord]:
        """Each pool user's last lease (active or ended), oldest first, with its holder.

        What a writer allowance and a closure check decide by; read without the rest of
        the history, so its cost does not grow with every lease the store ever issued.
        """
        where = ' WHERE l.rowid IN (SELECT max(rowid) FROM leases GROUP BY "user")'
        return self._records("last_lease_records", where)

    def last_lease_ends(self) -> dict[str, str]:
        """When each pool user's last ended lease ended (users with none are absent).

        For a user leased now, the end of the lease before the active one: from there
        on, what it ran is accounted for by no closure but the active lease's.
        """
        with self.connections.reading("last_lease_ends") as conn:
            rows = conn.execute(
                'SELECT "user", max(ended_at) FROM leases WHERE ended_at IS NOT NULL '
                'GROUP BY "user"'
            ).fetchall()
        return {str(row[0]): str(row[1]) for row in rows}

    def lease_record(self, lease_id: str) -> tuple[LeaseRecord, bool] | None:
        """One lease with its holder, and whether its user was leased again after it
        (None: no such lease was issued)."""
        found = self._records("lease_record", " WHERE l.lease_id = ?", (lease_id,))
        if not found:
            return None
        with self.connections.reading("lease_record") as conn:
            later = conn.execute(
                'SELECT 1 FROM leases WHERE "user" = ? AND rowid > '
                "(SELECT rowid FROM leases WHERE lease_id = ?) LIMIT 1",
                (found[0].lease.user, lease_id),
            ).fetchone()
        return found[0], later is not None

    def _records(
        self, operation: str, where: str, parameters: tuple[str, ...] = ()
    ) -> list[LeaseRecord]:
        """The leases ``where`` selects, with only their own notes read (never the
        whole history's)."""
        with self.connections.reading(operation) as conn:
            rows = conn.execute(
                f"SELECT {_LEASE_COLUMNS}, issued_at, ended_at FROM leases l{where}"
                " ORDER BY l.rowid",
                parameters,
            ).fetchall()
            notes = conn.execute(
                "SELECT key, facts FROM steps WHERE key IN "
                f"(SELECT ? || l.lease_id FROM leases l{where}) ORDER BY id",
                (_LEASE_KEY_PREFIX, *parameters),
            ).fetchall()
        issued: dict[str, Mapping[str, Any]] = {}
        for key, data in notes:
            if str(key) in issued:
                continue  # the holder is noted first, in the transaction that issued it
            facts = decode_facts(data)
            if facts.get("step") == "issued":
                issued[str(key)] = facts
        records = []
        for row in rows:
            holder = issued.get(lease_step_key(row[0]), {}).get("holder")
            records.append(
                LeaseRecord(
                    _lease(row[:5]),
                    row[5],
                    row[6],
                    HolderProcess.from_dict(holder) if isinstance(holder, Mapping) else None,
                )
            )
        return records

    def closure_proven(self, lease: Lease) -> bool:
        """Whether the last closure noted for ``lease`` was proven (False: none noted).

        Only the last one counts: a later closure that could not prove the lease
        quiescent (a probe found its session open again) withdraws an earlier proof.
        """
        with self.connections.reading("closure_proven") as conn:
            return _closure_proven(conn, lease.lease_id)

    def get_lease(self, lease_id: str) -> Lease:
        """A lease as stored now (``lease_not_found``)."""
        with self.connections.reading("get_lease") as conn:
            return _lease_row(conn, lease_id)

    def leases_of(self, attempt_id: str) -> list[Lease]:
        """Every lease ever issued to ``attempt_id``, oldest first."""
        with self.connections.reading("leases_of") as conn:
            rows = conn.execute(
                f"SELECT {_LEASE_COLUMNS} FROM leases WHERE attempt_id = ? ORDER BY rowid",
                (attempt_id,),
            ).fetchall()
        return [_lease(row) for row in rows]


def _lease(row: tuple[Any, ...]) -> Lease:
    return Lease(row[0], row[1], row[2], row[3], bool(row[4]))


def _lease_row(conn: StoreConnection, lease_id: str) -> Lease:
    row = conn.execute(
        f"SELECT {_LEASE_COLUMNS} FROM leases WHERE lease_id = ?", (lease_id,)
    ).fetchone()
    if row is None:
        raise SnapshotStoreError(
            f"no lease {lease_id} was issued", code="lease_not_found", lease_id=lease_id
        )
    return _lease(row)


def _closure_proven(conn: StoreConnection, lease_id: str) -> bool:
    """Whether the last closure noted for ``lease_id`` was proven (False: none noted)."""
    rows = conn.execute(
        "SELECT facts FROM steps WHERE key = ? ORDER BY id DESC", (lease_step_key(lease_id),)
    ).fetchall()
    # Newest first, up to the last closure: the notes before it (a closure's facts are
    # large) are never decoded, and this is asked for every pool user at each look.
    for row in rows:
        facts = decode_facts(row[0])
        if facts.get("step") == CLOSURE_STEP:
            return facts.get("proven") is True
    return False


def _unproven_last_lease(conn: StoreConnection, user: str) -> str | None:
    """The user's last lease when it ended without a proven closure, else None."""
    row = conn.execute(
        'SELECT lease_id, active FROM leases WHERE "user" = ? ORDER BY rowid DESC LIMIT 1',
        (user,),
    ).fetchone()
    if row is None or row[1] == 1 or _closure_proven(conn, row[0]):
        return None
    return str(row[0])
