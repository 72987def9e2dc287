"""Which store owns a pool and a target slot, as the server records it.

Two stores on one server would lease the same principals and publish into the same
target, each proving what the other breaks, so the server records the owner: a marker
table in ``_dpone_identity`` per pool and per target slot, whose comment names the
owning store (:class:`Owner`). The first store to create a marker owns it; every other
refuses before any lease, claim, export or statement (``pool_owned_elsewhere``,
``slot_owned_elsewhere``), and :func:`hand_over` moves ownership once the other store is
really gone. The markers are made and dropped as the server's operator. See
docs/deploying.md ("One store owns a pool, and one store owns a target").
"""

from __future__ import annotations

import hashlib
import shlex
import socket
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.contracts import canonical_json
from dpone.errors import ConfigurationError, DponeError
from dpone.localserver.principal_pool import IDENTITY_DATABASE, SLOT_MARKER_PREFIX
from dpone.ports.clickhouse import QueryPort
from dpone.ports.clickhouse_errors import ClickHouseServerError
from dpone.ports.clickhouse_request import mutation, read
from dpone.ports.composition_snapshot import TargetSlot
from dpone.publication.principals.server_access import ServerAccess
from dpone.publication.store import SnapshotStore
from dpone.sql import quote_identifier, quote_literal

REQUEST_SECONDS = 30.0
TABLE_ALREADY_EXISTS = 57
MARKER_VERSION = 1


class OwnedElsewhere(ConfigurationError):
    """A pool or a target slot belongs to another store (``pool_owned_elsewhere``,
    ``slot_owned_elsewhere``); nothing was leased, claimed or sent."""

    code = "owned_elsewhere"


@dataclass(frozen=True)
class Owner:
    """A store as a marker names it: its identity, where it is, and on which machine."""

    store: str
    path: str
    host: str

    @classmethod
    def of_store(cls, store: SnapshotStore) -> Owner:
        """The owner ``store`` is: its identity, its file or URL, this host."""
        return cls(store.store_identity(), store.location, socket.gethostname())

    def describe(self) -> str:
        """``store <id> (<path> on <host>)``."""
        return f"store {self.store} ({self.path} on {self.host})"

    def to_dict(self) -> dict[str, str]:
        return {"store": self.store, "path": self.path, "host": self.host}


@dataclass(frozen=True)
class Marker:
    """One ownership marker: its table name and what it marks (for messages)."""

    name: str
    what: str  # "pool" or "slot"
    about: str  # the pool's description, or the slot's database.table

    @classmethod
    def of_slot(cls, slot: TargetSlot) -> Marker:
        key = canonical_json.dumps([slot.database, slot.table])
        digest = hashlib.sha256(key).hexdigest()[:40]
        return cls(f"{SLOT_MARKER_PREFIX}{digest}", "slot", f"{slot.database}.{slot.table}")

    def comment(self, owner: Owner) -> str:
        """The marker's comment: canonical JSON naming the owner and what is marked."""
        document = {"owner": owner.to_dict(), "marks": self.about, "version": MARKER_VERSION}
        return canonical_json.dumps(document).decode("utf-8")


def owner_of(comment: str) -> Owner | None:
    """The owner a marker's comment names, or None for a comment that names none."""
    try:
        document = canonical_json.loads(comment.encode("utf-8"), what="an ownership marker")
        found = document["owner"]
        return Owner(str(found["store"]), str(found["path"]), str(found["host"]))
    except (DponeError, KeyError, TypeError, ValueError):
        return None


def claim(
    access: ServerAccess,
    me: Owner | None,
    slots: Iterable[TargetSlot] = (),
    *,
    project: Path | None,
    create: bool = True,
) -> bool:
    """Own the access's pool and ``slots`` for ``me``, or refuse (``*_owned_elsewhere``).

    One read of the markers. The pool comes first: a store refused the pool claims no
    slot (two first runs at once never end with one owning the pool and the other a
    slot). Each missing marker is created (the first store to create it owns it) and
    read again. Refused before anything else is done: the caller has not leased,
    claimed, exported or sent anything yet. ``create=False`` (a read-only check)
    creates nothing, and ``me`` None (a project whose store is not made yet) owns
    nothing: any marker there is another store's.

    True when that one read found every marker, each ``me``'s: a claim of the same
    markers for ``me`` made before anything could change them would read the same and
    do nothing else, so it need not be asked (a refresh's check).
    """
    markers = [Marker(access.pool.marker, "pool", access.pool.describe())]
    markers += [Marker.of_slot(s) for s in dict.fromkeys(slots)]
    operator = HttpTransport(access.endpoint("system"), access.operator())
    owners = _read(operator, markers)
    all_found = all(m.name in owners for m in markers)
    for marker in markers:
        if marker.name not in owners:
            if not create or me is None:
                continue
            _create(operator, marker, me)
            owners.update(_read(operator, [marker]))
        found = owners.get(marker.name)
        if me is None or found is None or found.store != me.store:
            raise _elsewhere(access, marker, me, found, project)
    return all_found and me is not None


def hand_over(
    access: ServerAccess, me: Owner, old_store: str, slots: Sequence[TargetSlot]
) -> list[dict[str, Any]]:
    """Give ``me`` the pool and ``slots`` that ``old_store`` owns (a store that is gone).

    Only markers that name ``old_store`` are dropped, then claimed again; one owned by
    any other store is left and reported. Returns what each marker's owner is now.
    """
    markers = [Marker(access.pool.marker, "pool", access.pool.describe())]
    markers += [Marker.of_slot(s) for s in dict.fromkeys(slots)]
    operator = HttpTransport(access.endpoint("system"), access.operator())
    owners = _read(operator, markers)
    outcome: list[dict[str, Any]] = []
    for marker in markers:
        found = owners.get(marker.name)
        if found is not None and found.store == old_store and old_store != me.store:
            operator.execute(
                mutation(
                    f"DROP TABLE {_qualified(marker)} SYNC",
                    f"dpone-s00-owner-drop-{time.time_ns()}",
                ),
                deadline=time.monotonic() + REQUEST_SECONDS,
            )
            _create(operator, marker, me)
    now = _read(operator, markers)
    for marker in markers:
        found = now.get(marker.name)
        outcome.append(
            {
                "marks": marker.what,
                "about": marker.about,
                "owner": found.to_dict() if found is not None else None,
                "handed_over": found is not None
                and found.store == me.store
                and (owners.get(marker.name) or me).store == old_store,
            }
        )
    return outcome


def _qualified(marker: Marker) -> str:
    return f"{quote_identifier(IDENTITY_DATABASE)}.{quote_identifier(marker.name)}"


def _read(operator: QueryPort, markers: Sequence[Marker]) -> dict[str, Owner | None]:
    """Each existing marker's owner (None: a marker whose comment names none)."""
    names = ", ".join(quote_literal(m.name) for m in markers)
    rows = operator.execute(
        read(
            "SELECT name, comment FROM system.tables WHERE database = "
            f"{quote_literal(IDENTITY_DATABASE)} AND name IN ({names}) FORMAT JSONEachRow",
            f"dpone-s00-owner-read-{time.time_ns()}",
        ),
        deadline=time.monotonic() + REQUEST_SECONDS,
    ).json_rows()
    return {str(r["name"]): owner_of(str(r["comment"])) for r in rows}


def _create(operator: QueryPort, marker: Marker, me: Owner) -> None:
    """Create ``marker`` naming ``me``; another store's creating it first is no error."""
    statement = (
        f"CREATE TABLE {_qualified(marker)} (owner String) ENGINE = Memory "
        f"COMMENT {quote_literal(marker.comment(me))}"
    )
    try:
        operator.execute(
            mutation(statement, f"dpone-s00-owner-claim-{time.time_ns()}"),
            deadline=time.monotonic() + REQUEST_SECONDS,
        )
    except ClickHouseServerError as exc:
        if exc.details.get("clickhouse_code") != TABLE_ALREADY_EXISTS:
            raise


def _elsewhere(
    access: ServerAccess,
    marker: Marker,
    me: Owner | None,
    found: Owner | None,
    project: Path | None,
) -> OwnedElsewhere:
    other = found.describe() if found is not None else "no store dpone can name"
    command = hand_over_command(project, found)
    mine = me.describe() if me is not None else "store (not made yet)"
    details: Mapping[str, Any] = {
        "marker": marker.name,
        "owner": found.to_dict() if found is not None else None,
        "this_store": me.to_dict() if me is not None else None,
        "next_command": command,
    }
    if marker.what == "pool":
        return OwnedElsewhere(
            f"{access.pool.describe()} on {access.describe()} belongs to {other}, not to this "
            f"project's {mine}: two stores leasing one pool would break each other's "
            f"proofs. Give this project a pool of its own ([clickhouse] pool), or, if that "
            f"store is really gone, hand the pool over: `{command}`",
            code="pool_owned_elsewhere",
            **details,
        )
    return OwnedElsewhere(
        f"{marker.about} on {access.describe()} is published by {other}, not by this "
        f"project's {mine}: two stores publishing one target would each reconcile "
        f"against a target the other changed. Publish into another target, or, if that store "
        f"is really gone, hand the slot over: `{command}`",
        code="slot_owned_elsewhere",
        slot=marker.about,
        **details,
    )


def hand_over_command(project: Path | None, found: Owner | None) -> str:
    """The ``dpone pool hand-over`` that gives the project (``dpone.toml`` when the
    command was not given one) what ``found`` owns."""
    old = found.store if found is not None else "STORE_ID"
    config = str(project) if project is not None else "dpone.toml"
    return shlex.join(["dpone", "pool", "hand-over", "--config", config, "--from", old])
