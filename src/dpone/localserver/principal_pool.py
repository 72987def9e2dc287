"""The principal pool of the managed local server: users declared at start, leased later.

The embedded server reads users, passwords and grants only from ``users.xml`` at start,
so principals cannot be issued or revoked while it runs: dpone declares a fixed pool
(``dpone_catalog``, ``dpone_closer``, ``dpone_ingest_1..N``, ``dpone_publisher_1..N``,
:func:`pool_users`) with grants per protected database, and leases its members through
the run registry (:mod:`dpone.publication.principals.principal_issuers`). Each role's
grants and the server facts behind them are in docs/publication-principals.md ("The
pool"); tests/integration/test_principal_pool.py tests each user's can and cannot.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dpone.errors import ConfigurationError
from dpone.localserver.config import DEFAULT_USERS, ServerUser
from dpone.sql import quote_identifier

CATALOG_USER = "dpone_catalog"
CLOSER_USER = "dpone_closer"
INGEST_PREFIX = "dpone_ingest_"
PUBLISHER_PREFIX = "dpone_publisher_"
DEFAULT_POOL_SIZE = 4
STAGING_TABLE_PREFIX = "dpone_stage_"
# The endpoint identity substitute of the embedded server (connectors.endpoint_identity).
IDENTITY_DATABASE = "_dpone_identity"
# Ownership markers in the identity database (publication.ownership): ``owner_pool``,
# ``owner_pool_<name>``, and ``owner_slot_<digest>`` for each target slot.
OWNER_MARKER_PREFIX = "owner_"
SLOT_MARKER_PREFIX = "owner_slot_"

# A pool's name goes into its principals' names (``dpone_<pool>_ingest_1``) and its
# ownership marker's: lowercase letters and digits, a letter first.
_POOL_NAME = re.compile(r"^[a-z][a-z0-9]{0,23}$")

ROLE_INGEST = "ingest"
ROLE_PUBLISHER = "publisher"
ROLE_CATALOG = "catalog"
ROLE_CLOSER = "closer"

# A protected database goes into a users.xml grant: a plain identifier only (it is
# also back-quoted, but a name that needs quoting has no business being protected).
_DATABASE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


@dataclass(frozen=True)
class Grant:
    """One privilege list on one object; rendered for users.xml or as SQL ``GRANT ... TO``."""

    privileges: str
    on: str

    def statement(self) -> str:
        """``GRANT <privileges> ON <object>`` as users.xml takes it (the user is implied)."""
        return f"GRANT {self.privileges} ON {self.on}"


@dataclass(frozen=True)
class PoolNames:
    """The names of one pool's principals: the default pool's (``name`` empty:
    ``dpone_catalog``, ``dpone_ingest_1``...) or a named pool's (``sales``:
    ``dpone_sales_catalog``, ``dpone_sales_ingest_1``...), so that several projects'
    pools live side by side on one server."""

    name: str = ""
    size: int = DEFAULT_POOL_SIZE

    def __post_init__(self) -> None:
        check_pool_name(self.name)

    @property
    def prefix(self) -> str:
        """What every principal's name of this pool starts with."""
        return f"dpone_{self.name}_" if self.name else "dpone_"

    @property
    def catalog(self) -> str:
        return f"{self.prefix}catalog"

    @property
    def closer(self) -> str:
        return f"{self.prefix}closer"

    @property
    def keeper(self) -> str:
        """A remote server's keeper (see :mod:`dpone.localserver.pool_file`)."""
        return f"{self.prefix}keeper"

    def ingest(self) -> tuple[str, ...]:
        """``<prefix>ingest_1`` .. ``<prefix>ingest_<size>``."""
        return tuple(f"{self.prefix}ingest_{i}" for i in range(1, self.size + 1))

    def publishers(self) -> tuple[str, ...]:
        """``<prefix>publisher_1`` .. ``<prefix>publisher_<size>``."""
        return tuple(f"{self.prefix}publisher_{i}" for i in range(1, self.size + 1))

    def members(self) -> tuple[str, ...]:
        """Every user of the pool, in declaration order."""
        return (self.catalog, self.closer, *self.ingest(), *self.publishers())

    def role_of(self, user: str) -> str | None:
        """The role ``user`` has in this pool, or None for a user outside it."""
        if user == self.catalog:
            return ROLE_CATALOG
        if user == self.closer:
            return ROLE_CLOSER
        for role in (ROLE_INGEST, ROLE_PUBLISHER):
            head = f"{self.prefix}{role}_"
            if user.startswith(head) and user[len(head) :].isdigit():
                return role
        return None

    @property
    def marker(self) -> str:
        """The table in ``_dpone_identity`` whose comment names the store owning the pool."""
        return (
            f"{OWNER_MARKER_PREFIX}pool_{self.name}" if self.name else f"{OWNER_MARKER_PREFIX}pool"
        )

    def describe(self) -> str:
        """``the default pool`` or ``pool 'sales'``, for messages."""
        return f"pool {self.name!r}" if self.name else "the default pool"


def check_pool_name(name: str) -> str:
    """``name`` when it may name a pool (empty: the default pool), else ``invalid_pool``."""
    if name and not _POOL_NAME.fullmatch(name):
        raise ConfigurationError(
            f"pool name {name!r} must be 1-24 lowercase letters and digits, a letter first",
            code="invalid_pool",
            pool=name,
        )
    return name


DEFAULT_POOL = PoolNames()


def ingest_users(size: int = DEFAULT_POOL_SIZE) -> tuple[str, ...]:
    """The default pool's ``dpone_ingest_1`` .. ``dpone_ingest_<size>``."""
    return PoolNames(size=size).ingest()


def publisher_users(size: int = DEFAULT_POOL_SIZE) -> tuple[str, ...]:
    """The default pool's ``dpone_publisher_1`` .. ``dpone_publisher_<size>``."""
    return PoolNames(size=size).publishers()


def pool_names(size: int = DEFAULT_POOL_SIZE) -> tuple[str, ...]:
    """Every user of the default pool, in declaration order."""
    return PoolNames(size=size).members()


def role_of(user: str) -> str | None:
    """The default pool's role of a user name, or None for a user outside it."""
    return DEFAULT_POOL.role_of(user)


def check_databases(databases: Sequence[str]) -> tuple[str, ...]:
    """The protected databases as given; refuses none, duplicates and non-identifiers."""
    if not databases:
        raise ConfigurationError(
            "the pool needs at least one protected database", code="no_databases"
        )
    for name in databases:
        if not _DATABASE.fullmatch(name) or name in ("system", IDENTITY_DATABASE):
            raise ConfigurationError(
                f"protected database {name!r} must be a plain identifier other than "
                f"system and {IDENTITY_DATABASE}",
                code="invalid_database",
                database=name,
            )
    if len(set(databases)) != len(databases):
        raise ConfigurationError("a protected database is named twice", code="duplicate_database")
    return tuple(databases)


def role_grants(role: str, databases: Sequence[str]) -> tuple[Grant, ...]:
    """The grants of one role over ``databases`` (the protected databases)."""
    dbs = [quote_identifier(d) for d in check_databases(databases)]
    flush = Grant("SYSTEM FLUSH LOGS", "*.*")
    if role == ROLE_INGEST:
        # KILL QUERY of its own queries needs SELECT on system.processes; remote
        # termination reads system.query_log after a flush; identity is read only.
        return (
            *(
                Grant("CREATE TABLE, INSERT, SELECT, DROP TABLE", f"{d}.{STAGING_TABLE_PREFIX}*")
                for d in dbs
            ),
            Grant("TABLE ENGINE", "MergeTree"),
            Grant("SELECT", f"{quote_identifier(IDENTITY_DATABASE)}.*"),
            Grant("SELECT", "system.processes"),
            Grant("SELECT", "system.query_log"),
            flush,
        )
    if role == ROLE_PUBLISHER:
        return (
            *(Grant("SELECT, INSERT, CREATE TABLE, DROP TABLE", f"{d}.*") for d in dbs),
            Grant("TABLE ENGINE", "MergeTree"),
        )
    if role == ROLE_CLOSER:
        # The session log: a closure counts the user's open sign-ins
        # (dpone.publication.authority.login_account).
        return (
            Grant("KILL QUERY", "*.*"),
            Grant("SELECT", "system.processes"),
            Grant("SELECT", "system.query_log"),
            Grant("SELECT", "system.session_log"),
            flush,
        )
    if role == ROLE_CATALOG:
        return (
            Grant("SELECT", "system.*"),
            Grant("SHOW USERS, SHOW ROLES, SHOW ROW POLICIES", "*.*"),
            *(Grant("SELECT", f"{d}.*") for d in dbs),
            Grant("SELECT", f"{quote_identifier(IDENTITY_DATABASE)}.*"),
            flush,
        )
    raise ConfigurationError(f"unknown pool role {role!r}", code="unknown_role")


def pool_users(
    passwords: Mapping[str, str] | None,
    databases: Sequence[str],
    *,
    size: int = DEFAULT_POOL_SIZE,
    pool: PoolNames | None = None,
) -> tuple[ServerUser, ...]:
    """The pool as :class:`ServerUser` objects for a :class:`LocalServer`.

    ``passwords`` must name every pool user (see :func:`pool_names`) with a nonempty
    password and nothing else; ``None`` leaves them unset, and the managed server
    generates each one into its credentials file. The administrator is declared by
    the caller.
    """
    if size < 1:
        raise ConfigurationError("the pool needs at least one ingest and one publisher")
    names_of = pool or PoolNames(size=size)
    names = names_of.members()

    def grants(name: str) -> tuple[str, ...]:
        role = names_of.role_of(name)
        assert role is not None  # every name comes from the pool's members
        return tuple(g.statement() for g in role_grants(role, databases))

    if passwords is None:
        return tuple(ServerUser(name, grants=grants(name)) for name in names)
    missing = [n for n in names if not passwords.get(n)]
    unknown = sorted(set(passwords) - set(names))
    if missing or unknown:
        raise ConfigurationError(
            f"pool passwords: missing {missing}, not in the pool {unknown}",
            code="pool_passwords",
            missing=missing,
            unknown=unknown,
        )
    return tuple(ServerUser(name, password=passwords[name], grants=grants(name)) for name in names)


def managed_server_users(
    databases: Sequence[str],
    base: Sequence[ServerUser] = DEFAULT_USERS,
    *,
    pools: Mapping[str, Sequence[str]] | None = None,
) -> tuple[ServerUser, ...]:
    """The managed server's users: the administrator(s), the default pool over
    ``databases``, and each named pool of ``pools`` over its own databases."""
    named = [pool_users(None, dbs, pool=PoolNames(name)) for name, dbs in (pools or {}).items()]
    return (*base, *pool_users(None, databases), *(user for users in named for user in users))
