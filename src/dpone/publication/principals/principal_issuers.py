"""Issuing and revoking the ClickHouse principals of a publication, behind one interface.

:class:`LocalPoolIssuer` leases the pool the managed server declared at start
(:mod:`dpone.localserver.principal_pool`), a ``custodial`` closure;
:class:`SqlRbacIssuer` creates and drops a user per lease on a real server, a
``revoked`` closure, and is not run here (the embedded server refuses its statements:
its rendering and its sequence are tested). Either way the registry holds the lease
(durable) before any credential leaves the issuer, and credentials are handed out only
for an active lease. See docs/publication-principals.md ("Issuers").
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from dpone.errors import ConfigurationError, StateError, stop_point
from dpone.localserver.principal_pool import (
    DEFAULT_POOL,
    ROLE_INGEST,
    ROLE_PUBLISHER,
    Grant,
    PoolNames,
    role_grants,
)
from dpone.ports.clickhouse import QueryPort
from dpone.ports.clickhouse_request import Credentials, mutation, read
from dpone.ports.composition_snapshot import (
    ClosureStrength,
    IssuedPrincipal,
    Lease,
    PrincipalRef,
    SnapshotRunRegistry,
)
from dpone.publication.store.holder_process import Liveness, holder_liveness, wait_closures_here
from dpone.sql import quote_identifier, quote_literal

ISSUABLE_ROLES = (ROLE_INGEST, ROLE_PUBLISHER)
REQUEST_SECONDS = 30.0
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


# How long a lease request waits for a principal another attempt gives back.
LEASE_WAIT_SECONDS = 300.0
LEASE_POLL_SECONDS = 0.2
LEASE_POLL_MAX_SECONDS = 2.0


class PrincipalError(StateError):
    """A principal cannot be issued, handed out or revoked (see ``code``)."""

    code = "principal_error"


class PrincipalIssuer(Protocol):
    """Issues principals for one role and attempt, hands out credentials, revokes."""

    strength: ClosureStrength

    def issue(self, role: str, attempt_id: str) -> IssuedPrincipal:
        """Lease (and, where the server can, create) a principal for ``attempt_id``."""
        ...

    def credentials(self, ref: PrincipalRef) -> IssuedPrincipal:
        """The credentials of ``ref``, only while its exact lease is active."""
        ...

    def revoke(self, ref: PrincipalRef) -> Lease:
        """End the lease (and, where the server can, drop the user); idempotent."""
        ...

    def user_uuid(self, user: str) -> str:
        """``system.users.id`` of a user this issuer knows."""
        ...


def observe_user_ids(
    transport: QueryPort, users: Sequence[str], *, query_id: str, deadline: float
) -> dict[str, str]:
    """``system.users.id`` of every name in ``users``; any missing name is an error.

    Needs ``SHOW USERS`` (the catalog principal or the administrator).
    """
    names = ", ".join(quote_literal(u) for u in users)
    rows = transport.execute(
        read(
            f"SELECT name, toString(id) AS id FROM system.users WHERE name IN ({names}) "
            "FORMAT JSONEachRow",
            query_id,
        ),
        deadline=deadline,
    ).json_rows()
    found = {str(r["name"]): str(r["id"]) for r in rows}
    missing = sorted(set(users) - set(found))
    if missing or len(rows) != len(found):
        raise PrincipalError(
            f"users not declared on the server: {missing}",
            code="principal_unknown",
            missing=missing,
            query_id=query_id,
        )
    return found


def _check_role(role: str) -> None:
    if role not in ISSUABLE_ROLES:
        raise PrincipalError(
            f"only {ISSUABLE_ROLES} principals are issued, not {role!r}", code="unknown_role"
        )


def _active_lease(registry: SnapshotRunRegistry, ref: PrincipalRef) -> Lease:
    lease = registry.get_lease(ref.lease_id)
    if lease.user != ref.user:
        raise PrincipalError(
            f"lease {ref.lease_id} belongs to {lease.user}, not {ref.user}",
            code="principal_mismatch",
            lease_id=ref.lease_id,
        )
    if not lease.active:
        raise PrincipalError(
            f"lease {ref.lease_id} of {ref.user} has ended",
            code="principal_not_active",
            lease_id=ref.lease_id,
            user=ref.user,
        )
    return lease


class LocalPoolIssuer:
    """Leases users of the declared pool through the run registry (``custodial``)."""

    strength = ClosureStrength.CUSTODIAL

    def __init__(
        self,
        registry: SnapshotRunRegistry,
        credentials: Mapping[str, Credentials],
        user_ids: Mapping[str, str],
        *,
        pool: PoolNames = DEFAULT_POOL,
        members: Sequence[str] | None = None,
        lease_wait_seconds: float = LEASE_WAIT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._registry = registry
        self.lease_wait_seconds = lease_wait_seconds
        self._clock, self._sleep = clock, sleep
        # ``members``: the pool's principals in use (a retired one is never leased again).
        use = set(pool.members() if members is None else members)
        self._candidates = {
            role: tuple(u for u in users if u in use)
            for role, users in ((ROLE_INGEST, pool.ingest()), (ROLE_PUBLISHER, pool.publishers()))
        }
        leased = {u for users in self._candidates.values() for u in users}
        missing = sorted(leased - set(credentials)) + sorted(leased - set(user_ids))
        if missing:
            raise ConfigurationError(
                f"pool users without credentials or ids: {sorted(set(missing))}",
                code="pool_incomplete",
            )
        self._credentials = dict(credentials)
        self._user_ids = dict(user_ids)

    def issue(self, role: str, attempt_id: str) -> IssuedPrincipal:
        """Lease the first free pool user of ``role``.

        While none is free and a holder of their last leases runs (another worker, or
        another table of ``--jobs``, staging, publishing or proving a closure: its
        process is alive, or on another host), it waits for one to be given back, up to
        ``lease_wait_seconds`` from the last time one was given back or taken. Then, or
        at once when every holder is gone (leases and closures an operator ends or
        proves, which status names), ``pool_exhausted``.
        """
        _check_role(role)
        candidates = self._candidates[role]
        deadline = self._clock() + self.lease_wait_seconds
        pause = LEASE_POLL_SECONDS
        seen = self._leases_of(candidates)
        while True:
            try:
                lease = self._registry.lease(role, candidates, attempt_id)
            except StateError as exc:
                if exc.code != "pool_exhausted" or not self._holder_runs(candidates, attempt_id):
                    raise
                now = self._leases_of(candidates)
                if now != seen:  # a principal was given back and taken again: the
                    seen = now  # pool moves, so the wait is counted from now
                    deadline = self._clock() + self.lease_wait_seconds
                if self._clock() >= deadline:
                    raise
                stop_point()  # a table of --jobs waiting here stops when its run does
                # A closure this process runs frees a principal as it ends: tried then.
                if not wait_closures_here(pause):
                    self._sleep(pause)
                    pause = min(pause * 1.5, LEASE_POLL_MAX_SECONDS)  # each try takes the lock
                continue
            return self._issued(
                PrincipalRef(lease.user, self._user_ids[lease.user], lease.lease_id)
            )

    def _leases_of(self, users: Sequence[str]) -> frozenset[tuple[str, bool]]:
        """The last lease of each of ``users`` and whether it is active (empty from a
        registry that names none)."""
        records = getattr(self._registry, "last_lease_records", None)
        if records is None:
            return frozenset()
        return frozenset(
            (r.lease.lease_id, r.lease.active) for r in records() if r.lease.user in users
        )

    def _holder_runs(self, users: Sequence[str], attempt_id: str) -> bool:
        """Whether a holder of ``users``' last leases may still give one back: another
        running attempt, or one proving its closure now (an ended lease whose proof is
        not yet stored). Held only by gone holders, or by this attempt's own leases
        (which it will not give back while it waits), the pool needs an operator."""
        records = getattr(self._registry, "last_lease_records", None)
        if records is None:
            return False  # a registry that names no holders: nothing to wait for
        return any(
            holder_liveness(r.holder)[0] is not Liveness.GONE
            for r in records()
            if r.lease.user in users and r.lease.attempt_id != attempt_id
        )

    def credentials(self, ref: PrincipalRef) -> IssuedPrincipal:
        """The pool user's credentials while ``ref``'s lease is active and its id matches."""
        _active_lease(self._registry, ref)
        if self._user_ids.get(ref.user) != ref.user_uuid:
            raise PrincipalError(
                f"{ref.user} has id {self._user_ids.get(ref.user)}, not {ref.user_uuid}",
                code="principal_mismatch",
                lease_id=ref.lease_id,
            )
        return self._issued(ref)

    def revoke(self, ref: PrincipalRef) -> Lease:
        """End the lease; the server still accepts the password (custodial)."""
        lease = self._registry.get_lease(ref.lease_id)
        if lease.user != ref.user:
            raise PrincipalError(
                f"lease {ref.lease_id} belongs to {lease.user}, not {ref.user}",
                code="principal_mismatch",
                lease_id=ref.lease_id,
            )
        return self._registry.end_lease(ref.lease_id)

    def user_uuid(self, user: str) -> str:
        """The observed ``system.users.id`` of a pool user."""
        if user not in self._user_ids:
            raise PrincipalError(f"{user} is not in the pool", code="principal_unknown", user=user)
        return self._user_ids[user]

    def role_credentials(self, user: str) -> Credentials:
        """Credentials of any pool user by name, for the authority's own probes only."""
        if user not in self._credentials:
            raise PrincipalError(f"{user} is not in the pool", code="principal_unknown", user=user)
        return self._credentials[user]

    def _issued(self, ref: PrincipalRef) -> IssuedPrincipal:
        return IssuedPrincipal(ref, self._credentials[ref.user])


# ---------------------------------------------------------------------- SQL RBAC


def render_create_user(user: str, password_sha256_hex: str, hosts: Sequence[str]) -> str:
    """``CREATE USER`` with a SHA-256 password hash (never the password) and host IPs."""
    if not _SHA256_HEX.fullmatch(password_sha256_hex):
        raise ConfigurationError(
            "a password hash must be 64 lowercase hex digits", code="invalid_password_hash"
        )
    if not hosts:
        raise ConfigurationError("a user needs at least one host", code="invalid_host")
    try:
        networks = [str(ipaddress.ip_network(h)) for h in hosts]
    except ValueError as exc:
        raise ConfigurationError(
            f"a host must be an IP address or network: {exc}", code="invalid_host"
        ) from exc
    ips = ", ".join(f"IP {quote_literal(n)}" for n in networks)
    return (
        f"CREATE USER {quote_identifier(user)} IDENTIFIED WITH sha256_hash BY "
        f"{quote_literal(password_sha256_hex)} HOST {ips}"
    )


def render_grant(grant: Grant, user: str) -> str:
    """``GRANT <privileges> ON <object> TO <user>``."""
    return f"{grant.statement()} TO {quote_identifier(user)}"


def render_drop_user(user: str) -> str:
    """``DROP USER IF EXISTS``: revocation is idempotent (a crash may repeat it)."""
    return f"DROP USER IF EXISTS {quote_identifier(user)}"


def _new_name(role: str) -> str:
    return f"dpone_{role}_{secrets.token_hex(8)}"


def _new_password() -> str:
    return secrets.token_urlsafe(32)


class SqlRbacIssuer:
    """Creates one user per issue with the role's grants and drops it on revocation.

    For a real ClickHouse server (``revoked`` closure). Not runnable on the embedded
    server; see the module docstring. Passwords live only in this object's memory: a
    process that did not issue a principal can revoke it but never hand it out.
    """

    strength = ClosureStrength.REVOKED

    def __init__(
        self,
        registry: SnapshotRunRegistry,
        admin: QueryPort,
        databases: Sequence[str],
        *,
        hosts: Sequence[str] = ("127.0.0.1", "::1"),
        name_factory: Callable[[str], str] = _new_name,
        password_factory: Callable[[], str] = _new_password,
        request_seconds: float = REQUEST_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._registry = registry
        self._admin = admin
        self._databases = tuple(databases)
        self._hosts = tuple(hosts)
        self._name_factory = name_factory
        self._password_factory = password_factory
        self._request_seconds = request_seconds
        self._clock = clock
        self._passwords: dict[str, str] = {}
        self._user_ids: dict[str, str] = {}

    def statements(self, role: str, user: str, password_sha256_hex: str) -> list[str]:
        """Every statement that creates ``user`` for ``role``, in order."""
        _check_role(role)
        create = render_create_user(user, password_sha256_hex, self._hosts)
        return [create, *(render_grant(g, user) for g in role_grants(role, self._databases))]

    def issue(self, role: str, attempt_id: str) -> IssuedPrincipal:
        """Lease a fresh name (durable first), then CREATE USER and GRANT, then read its id."""
        _check_role(role)
        user = self._name_factory(role)
        password = self._password_factory()
        lease = self._registry.lease(role, (user,), attempt_id)
        digest = hashlib.sha256(password.encode("utf-8")).hexdigest()
        for step, statement in enumerate(self.statements(role, user, digest)):
            self._admin.execute(
                mutation(statement, f"dpone-s00-rbac-{user}-{step}"), deadline=self._deadline()
            )
        ids = observe_user_ids(
            self._admin, [user], query_id=f"dpone-s00-rbac-{user}-id", deadline=self._deadline()
        )
        self._passwords[user] = password
        self._user_ids[user] = ids[user]
        return IssuedPrincipal(
            PrincipalRef(user, ids[user], lease.lease_id), Credentials(user, password)
        )

    def credentials(self, ref: PrincipalRef) -> IssuedPrincipal:
        """The created user's credentials while its lease is active (this process only)."""
        _active_lease(self._registry, ref)
        if ref.user not in self._passwords or self._user_ids.get(ref.user) != ref.user_uuid:
            raise PrincipalError(
                f"{ref.user} was not issued by this process",
                code="principal_unknown",
                lease_id=ref.lease_id,
            )
        return IssuedPrincipal(ref, Credentials(ref.user, self._passwords[ref.user]))

    def revoke(self, ref: PrincipalRef) -> Lease:
        """End the lease, then ``DROP USER IF EXISTS`` (the server refuses it from then on)."""
        lease = self._registry.end_lease(ref.lease_id)
        self._admin.execute(
            mutation(render_drop_user(ref.user), f"dpone-s00-rbac-{ref.user}-drop"),
            deadline=self._deadline(),
        )
        self._passwords.pop(ref.user, None)
        return lease

    def user_uuid(self, user: str) -> str:
        """The id read after the user was created here."""
        if user not in self._user_ids:
            raise PrincipalError(f"{user} was not issued here", code="principal_unknown", user=user)
        return self._user_ids[user]

    def _deadline(self) -> float:
        return self._clock() + self._request_seconds
