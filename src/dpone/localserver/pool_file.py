"""The principal pool as an operator installs it on a ClickHouse server dpone does not run.

:func:`render_pool` gives, from one set of generated passwords, the server's users file
(``users.d`` format: each principal's SHA-256 password hash, its networks, the
``dpone_pool`` profile of :data:`~dpone.localserver.pool_sql.POOL_SETTINGS` and exactly
its role's grants, :func:`~dpone.localserver.principal_pool.role_grants`), the same as
SQL (:mod:`dpone.localserver.pool_sql`), and the 0600 credentials file dpone's host
reads (:mod:`dpone.localserver.pool_credentials`), the only place the passwords exist.
It also declares ``dpone_keeper``, which does on a remote server what the managed
server's administrator does: the reads of status, the checks and the catalog, and the
drops of retention, discard and retire. See docs/remote.md.
"""

from __future__ import annotations

import ipaddress
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

from dpone.durable_files import atomic_write_bytes
from dpone.errors import ConfigurationError
from dpone.localserver.config import ServerUser
from dpone.localserver.credentials import generate_password
from dpone.localserver.pool_credentials import PoolCredentials, read_pool_credentials
from dpone.localserver.pool_sql import POOL_SETTINGS, rotation_sql, users_sql
from dpone.localserver.principal_pool import (
    DEFAULT_POOL,
    IDENTITY_DATABASE,
    ROLE_CATALOG,
    ROLE_INGEST,
    ROLE_PUBLISHER,
    SLOT_MARKER_PREFIX,
    PoolNames,
    check_databases,
    role_grants,
)
from dpone.sql import quote_identifier

KEEPER_USER = DEFAULT_POOL.keeper
ROLE_KEEPER = "keeper"
POOL_PROFILE = "dpone_pool"
# Any address: the passwords are the gate; an operator narrows it with --network.
DEFAULT_NETWORKS = ("::/0",)


@dataclass(frozen=True)
class RenderedPool:
    """The users file (for the server) and the credentials file (for dpone's host)."""

    users_xml: str
    credentials_json: str
    users: tuple[str, ...]
    users_sql: str = ""
    retired: tuple[str, ...] = ()
    # A rotation's step 1 (the new passwords added beside the old), when rotating.
    rotation_sql: str = ""


def remote_users(pool: PoolNames = DEFAULT_POOL) -> tuple[str, ...]:
    """Every principal a remote server declares for ``pool``: the pool, then its keeper."""
    return (*pool.members(), pool.keeper)


def remote_role(user: str, pool: PoolNames = DEFAULT_POOL) -> str | None:
    """The role of a remote server's principal of ``pool`` (the pool's, or ``keeper``)."""
    return ROLE_KEEPER if user == pool.keeper else pool.role_of(user)


def remote_grants(
    role: str, databases: Sequence[str], pool: PoolNames = DEFAULT_POOL
) -> tuple[str, ...]:
    """The grant statements of ``role`` over the protected ``databases``.

    The keeper also claims ownership for its store: it creates (and, handing ownership
    over, drops) its pool's marker and the slots' markers in the identity database. It
    sees every database's tables (a global ``SHOW TABLES``, no data): reconcile proves
    a publication's database dropped, rather than renamed out of sight, as the keeper
    (publication/catalog/presence.py).
    """
    if role == ROLE_KEEPER:
        reads = role_grants(ROLE_CATALOG, databases)
        drops = tuple(f"GRANT DROP TABLE ON {quote_identifier(d)}.*" for d in databases)
        identity = quote_identifier(IDENTITY_DATABASE)
        markers = (
            f"GRANT CREATE TABLE, DROP TABLE ON {identity}.{quote_identifier(pool.marker)}",
            f"GRANT CREATE TABLE, DROP TABLE ON {identity}.{SLOT_MARKER_PREFIX}*",
            "GRANT TABLE ENGINE ON Memory",
            "GRANT SHOW TABLES ON *.*",
        )
        return (*(g.statement() for g in reads), *drops, *markers)
    return tuple(g.statement() for g in role_grants(role, databases))


def check_networks(networks: Sequence[str]) -> tuple[str, ...]:
    """Each network as an IP address or CIDR block (``networks_invalid`` names the first bad)."""
    if not networks:
        raise ConfigurationError("at least one network is needed", code="networks_invalid")
    for network in networks:
        try:
            ipaddress.ip_network(network, strict=False)
        except ValueError as exc:
            raise ConfigurationError(
                f"network {network!r} is not an IP address or CIDR block",
                code="networks_invalid",
                network=network,
            ) from exc
    return tuple(networks)


def render_pool(
    databases: Sequence[str],
    *,
    networks: Sequence[str] = DEFAULT_NETWORKS,
    pool: PoolNames = DEFAULT_POOL,
    passwords: Mapping[str, str] | None = None,
    retired: Sequence[str] = (),
    previous: Mapping[str, str] | None = None,
) -> RenderedPool:
    """The users file (and its SQL form) and the credentials file of a new ``pool``
    over ``databases``.

    ``passwords`` (every principal's, for a test) defaults to freshly generated ones.
    ``retired`` principals (see :func:`check_retired`) are left out of the users file,
    dropped by the SQL and marked retired, without a password, in the credentials file.
    ``previous`` (a rotation: the passwords in use now) are kept beside the new ones in
    the credentials file, and ``rotation_sql`` adds the new ones beside them.
    """
    dbs = check_databases(databases)
    nets = check_networks(networks)
    gone = check_retired(retired, pool)
    names = tuple(n for n in remote_users(pool) if n not in gone)
    chosen = dict(passwords) if passwords is not None else {n: generate_password() for n in names}
    if sorted(chosen) != sorted(names):
        raise ConfigurationError("a password is needed for every principal", code="pool_passwords")
    users = [
        ServerUser(
            name,
            password=chosen[name],
            grants=remote_grants(_known_role(name, pool), dbs, pool),
            profile=POOL_PROFILE,
            networks=nets,
        )
        for name in names
    ]
    return RenderedPool(
        users_xml=_users_xml(users, dbs),
        credentials_json=credentials_json(chosen, names, retired=gone, previous=previous),
        users=names,
        users_sql=users_sql(users, dbs, gone),
        retired=gone,
        rotation_sql=rotation_sql(
            [u for u in users if previous and u.name in previous], gone if previous else ()
        ),
    )


def check_retired(retired: Sequence[str], pool: PoolNames = DEFAULT_POOL) -> tuple[str, ...]:
    """``retired`` when each is an ingest or publisher principal of ``pool`` and each
    role keeps at least one (``principal_not_retirable`` otherwise): the catalog, the
    closer and the keeper are one each, and dpone cannot work without them."""
    gone = tuple(dict.fromkeys(retired))
    for user in gone:
        if pool.role_of(user) not in (ROLE_INGEST, ROLE_PUBLISHER):
            raise ConfigurationError(
                f"{user} is not an ingest or publisher principal of {pool.describe()}: only "
                "those can be retired (the catalog, the closer and the keeper are one each)",
                code="principal_not_retirable",
                user=user,
            )
    for role, members in ((ROLE_INGEST, pool.ingest()), (ROLE_PUBLISHER, pool.publishers())):
        if set(members) <= set(gone):
            raise ConfigurationError(
                f"retiring every {role} principal of {pool.describe()} leaves none to lease",
                code="principal_not_retirable",
                role=role,
            )
    return gone


def read_pool_file(path: Path, pool: PoolNames = DEFAULT_POOL) -> PoolCredentials:
    """The credentials file ``render_pool`` wrote, checked.

    Refused: a file others may read (``credentials_file_exposed``), one that lacks a
    principal (``credentials_file_incomplete``; a retired one is marked, not missing);
    errors never quote the content.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise ConfigurationError(
            f"cannot read the credentials file {path}: {exc.strerror}",
            code="credentials_file_unreadable",
            path=str(path),
        ) from exc
    if mode & 0o077:
        raise ConfigurationError(
            f"the credentials file {path} may be read by others (mode {mode & 0o777:o}); "
            f"make it private: `chmod 600 {path}`",
            code="credentials_file_exposed",
            path=str(path),
        )
    found = read_pool_credentials(path)
    if found is None:
        raise ConfigurationError(
            f"no credentials file at {path}", code="credentials_file_unreadable", path=str(path)
        )
    missing = [n for n in remote_users(pool) if n not in found.passwords and n not in found.retired]
    if missing:
        raise ConfigurationError(
            f"the credentials file {path} lacks {', '.join(missing)} ({pool.describe()}): "
            "render the pool again with `dpone pool render` and install both files",
            code="credentials_file_incomplete",
            path=str(path),
            missing=missing,
        )
    return found


def retire_principal(path: Path, user: str, pool: PoolNames = DEFAULT_POOL) -> tuple[str, ...]:
    """Mark ``user`` retired in the credentials file at ``path``, its password (and a
    rotation's previous one) removed from dpone's host; returns every retired principal.

    The file is replaced atomically (a private temporary file renamed over it, 0600), so
    it is never seen half written. Retiring a retired principal again changes nothing.
    """
    found = read_pool_file(path, pool)
    gone = check_retired((*sorted(found.retired), user), pool)
    names = [n for n in remote_users(pool) if n in found.passwords and n not in gone]
    previous = {n: p for n, p in found.previous.items() if n in names}
    text = credentials_json(found.passwords, names, retired=gone, previous=previous)
    atomic_write_bytes(path, text.encode("utf-8"))
    return gone


def _known_role(name: str, pool: PoolNames) -> str:
    role = remote_role(name, pool)
    assert role is not None, name
    return role


def _users_xml(users: Sequence[ServerUser], databases: Sequence[str]) -> str:
    header = (
        "<!-- dpone's principals over "
        + escape(", ".join(databases))
        + ": written by `dpone pool render`; install it in the server's users.d -->\n"
    )
    body = "".join(_user_xml(u) for u in users)
    return (
        header
        + "<clickhouse>\n  <profiles>\n"
        + _profile_xml()
        + "  </profiles>\n  <users>\n"
        + body
        + "  </users>\n</clickhouse>\n"
    )


def _profile_xml() -> str:
    """The ``dpone_pool`` profile: its settings, then each made constant."""
    values = "".join(f"<{name}>{value}</{name}>" for name, value in POOL_SETTINGS)
    pinned = "".join(f"<{name}><const/></{name}>" for name, _ in POOL_SETTINGS)
    return (
        f"    <{POOL_PROFILE}>{values}\n"
        f"      <constraints>{pinned}</constraints>\n"
        f"    </{POOL_PROFILE}>\n"
    )


def _user_xml(user: ServerUser) -> str:
    networks = "".join(f"<ip>{escape(n)}</ip>" for n in user.networks)
    grants = "".join(f"        <query>{escape(g)}</query>\n" for g in user.grants or ())
    return (
        f"    <{user.name}>\n"
        f"      <password_sha256_hex>{user.password_sha256_hex}</password_sha256_hex>\n"
        f"      <networks>{networks}</networks>\n"
        f"      <profile>{user.profile}</profile>\n"
        "      <quota>default</quota>\n"
        f"      <grants>\n{grants}      </grants>\n"
        f"    </{user.name}>\n"
    )


def credentials_json(
    passwords: Mapping[str, str],
    names: Sequence[str],
    *,
    retired: Sequence[str] = (),
    previous: Mapping[str, str] | None = None,
) -> str:
    """The credentials file's text: each principal's password (and, during a rotation,
    its ``previous_password``), then each retired principal, marked, with none."""
    users: list[dict[str, object]] = []
    for name in names:
        entry: dict[str, object] = {"user": name, "password": passwords[name]}
        if previous and name in previous:
            entry["previous_password"] = previous[name]
        users.append(entry)
    users.extend({"user": name, "retired": True} for name in retired)
    return json.dumps({"users": users}, indent=2) + "\n"


__all__ = [
    "DEFAULT_NETWORKS",
    "KEEPER_USER",
    "POOL_PROFILE",
    "ROLE_KEEPER",
    "RenderedPool",
    "check_networks",
    "check_retired",
    "credentials_json",
    "read_pool_file",
    "remote_grants",
    "remote_role",
    "remote_users",
    "render_pool",
    "retire_principal",
]
