"""The principal pool as SQL, for a server whose users are managed by SQL.

The statements are the users file's equivalent (:mod:`dpone.localserver.pool_file`):
the same principals with their SHA-256 password hashes, networks, ``dpone_pool``
profile (:data:`POOL_SETTINGS`, each ``CONST``) and grants; each principal is replaced
whole (``CREATE USER OR REPLACE``) and a retired one dropped. A rotation with overlap
adds the new password beside the old (:func:`rotation_sql`, ClickHouse 24.9 and later)
and :func:`retire_old_sql` keeps only the new one. See docs/remote.md ("1. Render the
pool", "Rotate the passwords").
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from dpone.localserver.config import ServerUser
from dpone.sql import quote_identifier, quote_literal

POOL_PROFILE = "dpone_pool"
# The profile's settings, each constant (a principal's query cannot change them, the
# server answers 452 SETTING_CONSTRAINT_VIOLATION): every insert synchronous, and every
# query logged from its start, which closure's query-log account and the pool users'
# check read. Without CONST, whoever holds a password could hide a query with
# ``SETTINGS log_queries = 0``.
POOL_SETTINGS: tuple[tuple[str, int | str], ...] = (
    ("async_insert", 0),
    ("log_queries", 1),
    ("log_queries_probability", 1),
    ("log_queries_min_type", "QUERY_START"),
    ("log_queries_min_query_duration_ms", 0),
)


def users_sql(
    users: Sequence[ServerUser], databases: Sequence[str], retired: Collection[str] = ()
) -> str:
    """The ``CREATE USER`` / ``GRANT`` statements of ``users``, then the ``DROP USER``
    of each ``retired`` principal; one statement per line, each ending with ``;``."""
    lines = [
        f"-- dpone's principals over {', '.join(databases)}: written by "
        "`dpone pool render --format sql`; run it as the server's administrator",
        f"CREATE SETTINGS PROFILE OR REPLACE {quote_identifier(POOL_PROFILE)} SETTINGS "
        + ", ".join(f"{name} = {_literal(value)} CONST" for name, value in POOL_SETTINGS)
        + ";",
    ]
    for user in users:
        lines.append(_create_user(user))
        name = quote_identifier(user.name)
        lines.extend(f"{grant} TO {name};" for grant in user.grants or ())
    lines.extend(f"DROP USER IF EXISTS {quote_identifier(name)};" for name in sorted(retired))
    return "\n".join(lines) + "\n"


def rotation_sql(users: Sequence[ServerUser], retired: Collection[str] = ()) -> str:
    """Each principal's new password added beside its old one (both valid until
    :func:`retire_old_sql` runs); grants and the rest are left as they are. Each
    ``retired`` principal is dropped."""
    lines = [
        "-- dpone's rotation, step 1: the new passwords beside the old ones "
        "(`dpone pool render --rotate-from ... --format sql`)"
    ]
    lines.extend(
        f"ALTER USER {quote_identifier(u.name)} ADD IDENTIFIED WITH sha256_hash BY "
        f"{quote_literal(u.password_sha256_hex)};"
        for u in users
    )
    lines.extend(f"DROP USER IF EXISTS {quote_identifier(name)};" for name in sorted(retired))
    return "\n".join(lines) + "\n"


def retire_old_sql(users: Sequence[ServerUser]) -> str:
    """Each principal left with its new password only (the old ones removed)."""
    lines = ["-- dpone's rotation, step 2: only the new passwords remain"]
    lines.extend(
        f"ALTER USER {quote_identifier(u.name)} IDENTIFIED WITH sha256_hash BY "
        f"{quote_literal(u.password_sha256_hex)};"
        for u in users
    )
    return "\n".join(lines) + "\n"


def statements(text: str) -> list[str]:
    """The statements of a rendered SQL file, comments left out, without the ``;``."""
    return [
        line.rstrip(";")
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("--")
    ]


def _literal(value: int | str) -> str:
    return str(value) if isinstance(value, int) else quote_literal(value)


def _create_user(user: ServerUser) -> str:
    hosts = ", ".join(f"IP {quote_literal(n)}" for n in user.networks)
    return (
        f"CREATE USER OR REPLACE {quote_identifier(user.name)} "
        f"IDENTIFIED WITH sha256_hash BY {quote_literal(user.password_sha256_hex)} "
        f"HOST {hosts} SETTINGS PROFILE {quote_literal(user.profile)};"
    )
