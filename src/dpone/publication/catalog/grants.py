"""Writer discovery: which users other than the trusted ones can write a table.

A user can write through a grant of its own or through roles (granted to it directly
or to a role it holds), for any privilege at or under the writer roots of
system.privileges. The rules are documented in docs/publication-catalog.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from dpone.ports.composition_snapshot import Blocker
from dpone.publication.catalog.reads import (
    CatalogReads,
    Read,
    count_field,
    optional_text_field,
    text_field,
)
from dpone.sql import quote_literal

# Privileges that let a holder change a table's rows, design or existence, and every
# group above them (ALL, ALTER, CREATE, DROP) through system.privileges.
WRITER_ROOTS = frozenset(
    {
        "INSERT",
        "ALTER TABLE",
        "CREATE TABLE",
        "DROP TABLE",
        "DROP DATABASE",
        "TRUNCATE",
        "OPTIMIZE",
        "UNDROP TABLE",
    }
)

RoleGrant = tuple[str | None, str | None, str]  # (user_name, role_name, granted_role_name)


@dataclass(frozen=True)
class GrantRow:
    """One row of system.grants (for a user or a role)."""

    user_name: str | None
    role_name: str | None
    access_type: str
    database: str | None
    table: str | None
    is_partial_revoke: bool
    is_wildcard: bool

    def covers(self, database: str, table: str) -> bool:
        """Whether this grant's object includes ``database.table``."""
        if self.database is None:
            return True  # ON *.*
        if self.table is None:
            return (
                database.startswith(self.database)
                if self.is_wildcard
                else database == self.database
            )
        if database != self.database:
            return False
        return table.startswith(self.table) if self.is_wildcard else table == self.table


def writer_privileges(tree: Mapping[str, str | None]) -> frozenset[str]:
    """Every privilege that lets a holder write: the roots, their groups and subtypes.

    ``tree`` maps each privilege to its parent group (system.privileges).
    """

    def ancestors(name: str) -> list[str]:
        chain, seen = [], set()
        parent = tree.get(name)
        while parent is not None and parent not in seen:
            seen.add(parent)
            chain.append(parent)
            parent = tree.get(parent)
        return chain

    writers = set(WRITER_ROOTS)
    for name in tree:
        above = ancestors(name)
        if name in WRITER_ROOTS:
            writers.update(above)
        elif any(a in WRITER_ROOTS for a in above):
            writers.add(name)
    return frozenset(writers)


def writer_grant_blockers(
    grants: Iterable[GrantRow],
    role_grants: Iterable[RoleGrant],
    writers: frozenset[str],
    trusted_users: frozenset[str],
    database: str,
    table: str,
) -> list[Blocker]:
    """One ``writer_grant`` blocker per untrusted user that can write ``database.table``.

    ``role_grants`` are (user_name, role_name, granted_role_name) rows; roles granted to
    roles are followed. Partial revokes are not subtracted: a revoke that narrows a
    broader grant still leaves the broader grant reported (conservative, never silent).
    """
    reported = writer_vias(grants, role_grants, writers, database, table)
    return [
        Blocker(
            "writer_grant", f"user {user} can write {database}.{table}: {'; '.join(sorted(vias))}"
        )
        for user, vias in sorted(reported.items())
        if user not in trusted_users
    ]


def writer_vias(
    grants: Iterable[GrantRow],
    role_grants: Iterable[RoleGrant],
    writers: frozenset[str],
    database: str,
    table: str,
) -> dict[str, list[str]]:
    """Every user that can write ``database.table``, with the grants it can through."""
    holders: dict[str, set[str]] = {}  # role -> users holding it, directly or through roles
    members: dict[str, set[str]] = {}  # role -> roles that hold it
    for user, role, granted in role_grants:
        if user is not None:
            holders.setdefault(granted, set()).add(user)
        elif role is not None:
            members.setdefault(granted, set()).add(role)

    def users_of(role: str) -> set[str]:
        found, todo, seen = set(), [role], set()
        while todo:
            current = todo.pop()
            if current in seen:
                continue
            seen.add(current)
            found |= holders.get(current, set())
            todo.extend(members.get(current, set()))
        return found

    reported: dict[str, list[str]] = {}
    for grant in grants:
        if grant.is_partial_revoke or grant.access_type not in writers:
            continue
        if not grant.covers(database, table):
            continue
        via = f"{grant.access_type} ON {_grant_object(grant)}"
        if grant.user_name is not None:
            users = {grant.user_name}
        elif grant.role_name is not None:
            users = users_of(grant.role_name)
            via += f" through role {grant.role_name}"
        else:
            users = set()
        for user in users:
            reported.setdefault(user, []).append(via)
    return reported


def _grant_object(grant: GrantRow) -> str:
    star = "*" if grant.is_wildcard else ""
    if grant.database is None:
        return "*.*"
    if grant.table is None:
        return f"{grant.database}{star}.*"
    return f"{grant.database}.{grant.table}{star}"


@dataclass(frozen=True)
class ServerAccess:
    """Every grant, role grant and writer privilege of the server, read once an observation."""

    grants: list[GrantRow]
    role_grants: list[RoleGrant]
    writers: frozenset[str]

    @staticmethod
    def reads(database: str) -> list[Read]:
        """The reads of :meth:`read`, in its order."""
        return [
            (
                "grants",
                "SELECT user_name, role_name, access_type, database, table, is_partial_revoke, "
                "is_wildcard FROM system.grants WHERE database IS NULL OR is_wildcard OR "
                f"database = {quote_literal(database)}",
            ),
            (
                "role_grants",
                "SELECT user_name, role_name, granted_role_name FROM system.role_grants",
            ),
            (
                "privileges",
                "SELECT toString(privilege) AS privilege, toString(parent_group) AS parent_group "
                "FROM system.privileges",
            ),
        ]

    @classmethod
    def read(cls, reads: CatalogReads, database: str) -> ServerAccess:
        """Read system.grants, system.role_grants and system.privileges, in that order.

        Only the grants that can reach ``database`` are read: global ones, the
        database's own, and every wildcard one (kept whole, conservatively). A server
        with many users and databases answers all of ``system.grants`` in more than
        the response budget (65,536 bytes with ten protected databases, checked).
        """
        sql = dict(cls.reads(database))
        grants = [
            GrantRow(
                user_name=optional_text_field(r, "user_name", reads),
                role_name=optional_text_field(r, "role_name", reads),
                access_type=text_field(r, "access_type", reads),
                database=optional_text_field(r, "database", reads),
                table=optional_text_field(r, "table", reads),
                is_partial_revoke=bool(count_field(r, "is_partial_revoke", reads)),
                is_wildcard=bool(count_field(r, "is_wildcard", reads)),
            )
            for r in reads.rows("grants", sql["grants"])
        ]
        role_grants = [
            (
                optional_text_field(r, "user_name", reads),
                optional_text_field(r, "role_name", reads),
                text_field(r, "granted_role_name", reads),
            )
            for r in reads.rows("role_grants", sql["role_grants"])
        ]
        tree = {
            text_field(r, "privilege", reads): optional_text_field(r, "parent_group", reads)
            for r in reads.rows("privileges", sql["privileges"])
        }
        if not tree:
            raise reads.malformed("privileges", [])
        return cls(grants, role_grants, writer_privileges(tree))

    def writers_of(self, database: str, table: str) -> frozenset[str]:
        """Every user (trusted or not) whose grants let it write ``database.table``."""
        return frozenset(writer_vias(self.grants, self.role_grants, self.writers, database, table))

    def blockers(self, trusted: frozenset[str], database: str, table: str) -> list[Blocker]:
        """One ``writer_grant`` blocker per untrusted user that can write ``database.table``."""
        return writer_grant_blockers(
            self.grants, self.role_grants, self.writers, trusted, database, table
        )
