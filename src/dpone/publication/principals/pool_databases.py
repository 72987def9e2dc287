"""The databases a pool publishes into: they exist, are Atomic and are protected.

Asked as the server's operator before any work (a pool user would be told the same
only after the export, and as the server's raw ``UNKNOWN_DATABASE`` or a database it
cannot see), each refused with a coded :class:`~dpone.errors.ConfigurationError` that
names the statement or the command that fixes it (:func:`pool_remedy`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.errors import ConfigurationError
from dpone.localserver.protected import restart_commands
from dpone.ports.clickhouse_errors import ClickHouseServerError
from dpone.ports.clickhouse_request import read
from dpone.publication.principals.pool_verify import (
    protected_databases,
    render_command,
    require_server_version,
)
from dpone.publication.principals.server_access import ServerAccess
from dpone.sql import quote_identifier, quote_literal

REQUEST_SECONDS = 30.0


def as_access(server: ServerAccess | Path) -> ServerAccess:
    """``server`` as a :class:`ServerAccess`; a data directory names its managed server."""
    return server if isinstance(server, ServerAccess) else ServerAccess(server)


def _pool_command(access: ServerAccess, also: tuple[str, ...] = ()) -> str:
    """The command that gives the server its pool (over ``also`` too)."""
    if access.managed:
        if access.pool.name:
            return restart_commands(access.data_dir, pools={access.pool.name: also})
        return restart_commands(access.data_dir, also=also)
    # Every database the installed pool protects now, and the new ones: a users file
    # over fewer would take the grants of the others away.
    databases = (*(protected_databases(access) or ()), *also) or ("DB",)
    return render_command(databases, access.pool)


def pool_remedy(access: ServerAccess, also: tuple[str, ...] = ()) -> tuple[str, str]:
    """What gives the server its pool over ``also`` (a restart, or a render to install),
    in words and as the one command (reading what a remote pool protects once)."""
    command = _pool_command(access, also)
    if access.managed:
        return f"restart it with `{command}`", command
    return (
        f"render it with `{command}`, have the operator install the users file in the "
        "server's users.d, and point credentials_file at the credentials file",
        command,
    )


def pool_protects(
    server: ServerAccess | Path, database: str, *, known: Mapping[str, bool] | None = None
) -> bool:
    """Whether the server declares the pool with grants on ``database``.

    Read from the server's own ``system.grants``: the users file is applied when the
    server reads it, so what the server shows is what holds. ``known``: counts already
    asked (:func:`require_protected_database`).
    """
    access = as_access(server)
    where = _grants_where(access, database)
    return where is not None and _operator_count(access, where, "pool-grants", known)


def _grants_where(access: ServerAccess, database: str) -> str | None:
    """The pool's grants on ``database`` as ``system.grants`` shows them (None: no
    catalog credentials, hence no pool to ask about)."""
    if access.pool.catalog not in access.known_credentials():
        return None
    # The first ingest principal in use: a retired one may be gone from the server.
    ingest = next(u for u in access.pool.ingest() if u in access.members_in_use())
    return (
        "system.grants WHERE user_name = "
        f"{quote_literal(ingest)} AND database = {quote_literal(database)}"
    )


def require_protected(
    server: ServerAccess | Path, database: str, *, known: Mapping[str, bool] | None = None
) -> None:
    """Refuse ``database`` unless the server's pool holds its grants there.

    A pool user sees no database it has no grant on, so staging into one would answer
    that it "does not exist" even when it does. Refused as ``database_not_protected``
    with the command that protects it (and keeps every database protected now).
    ``known``: counts already asked (:func:`require_protected_database`).
    """
    access = as_access(server)
    if pool_protects(access, database, known=known):
        return
    exists = _operator_count(
        access, f"system.databases WHERE name = {quote_literal(database)}", "database"
    )
    what = "the managed server" if access.managed else access.describe()
    remedy, command = pool_remedy(access, (database,))
    raise ConfigurationError(
        f"{what} does not protect database {database!r}"
        f"{'' if exists else ' (which does not exist yet)'}: its publication pool has no "
        f"grants there; {remedy}",
        code="database_not_protected",
        database=database,
        database_exists=exists,
        next_command=command,
    )


def require_protected_database(
    server: ServerAccess | Path, database: str, *, version: bool = False
) -> None:
    """:func:`~dpone.publication.principals.pool_verify.require_server_version` (when
    ``version``), :func:`require_database`, then :func:`require_protected`: the same
    refusals in the same order, what each asks first asked together in one request (a
    count only a refusal needs is asked then, on its own)."""
    access = as_access(server)
    grants = _grants_where(access, database)
    atomic = _atomic_where(database)
    wheres = [atomic] if grants is None else [atomic, grants]
    known, seen = _operator_counts(access, wheres, version=version)
    if version:
        require_server_version(access, version=seen)  # None: asked again, on its own
    require_database(access, database, known=known)
    require_protected(access, database, known=known)


def _atomic_where(database: str) -> str:
    return f"system.databases WHERE name = {quote_literal(database)} AND engine = 'Atomic'"


def require_database(
    server: ServerAccess | Path, database: str, *, known: Mapping[str, bool] | None = None
) -> None:
    """Refuse ``database`` unless it exists on the server (``database_missing``) and is
    Atomic (``database_not_atomic``).

    Asked before any work: a pool user would be told the same only after the export,
    and as the server's raw ``UNKNOWN_DATABASE``. ``known``: counts already asked
    (:func:`require_protected_database`).
    """
    access = as_access(server)
    named = f"system.databases WHERE name = {quote_literal(database)}"
    if _operator_count(access, _atomic_where(database), "database", known):
        return
    statement = f"CREATE DATABASE {quote_identifier(database)} ENGINE = Atomic"
    if _operator_count(access, named, "database"):
        raise ConfigurationError(
            f"database {database!r} is not Atomic: EXCHANGE TABLES and the UUIDs dpone's "
            "proofs rest on need an Atomic database (a Replicated or Shared one is not "
            f"supported); point the table's target at one (`{statement}`)",
            code="database_not_atomic",
            database=database,
        )
    where = "the managed server" if access.managed else access.describe()
    raise ConfigurationError(
        f"database {database!r} does not exist on {where}; create it as its "
        f"administrator (`{statement}`), or point the table's target at an existing one",
        code="database_missing",
        database=database,
        statement=statement,
    )


def database_replaced(server: ServerAccess | Path, database: str, recorded_uuid: str) -> bool:
    """Whether ``database`` now has another UUID than ``recorded_uuid``, or none (dropped,
    perhaps created again): what an intent recorded there is gone with it."""
    named = f"system.databases WHERE name = {quote_literal(database)}"
    kept = f"{named} AND uuid = toUUIDOrZero({quote_literal(recorded_uuid)})"
    return not _operator_count(server, kept, "database")


def _operator_count(
    server: ServerAccess | Path, where: str, what: str, known: Mapping[str, bool] | None = None
) -> bool:
    """Whether ``SELECT count() FROM <where>`` is not zero, asked as the operator
    (unless ``known`` holds its answer: :func:`_operator_counts`)."""
    if known is not None and where in known:
        return known[where]
    rows = _operator_read(as_access(server), f"count() AS n FROM {where}", what)
    return rows != [{"n": 0}]


def _operator_counts(
    server: ServerAccess | Path, wheres: list[str], *, version: bool = False
) -> tuple[dict[str, bool], str | None]:
    """Each of ``wheres`` as :func:`_operator_count` answers it, and the server's
    version when ``version``, in one request.

    No counts and no version when that request ran and failed (the server's error for
    one of them) or answered in another shape (not one row of integer counts): each is
    then asked on its own, in its turn, for its own error or answer.
    """
    columns = [f"(SELECT count() FROM {w}) AS n{i}" for i, w in enumerate(wheres)]
    names = {f"n{i}" for i in range(len(wheres))} | ({"v"} if version else set())
    try:
        rows = _operator_read(
            as_access(server),
            ", ".join((["version() AS v"] if version else []) + columns),
            "database",
        )
    except ClickHouseServerError:
        return {}, None
    if len(rows) != 1 or set(rows[0]) != names:
        return {}, None
    found = [rows[0][f"n{i}"] for i in range(len(wheres))]
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in found):
        return {}, None
    seen = rows[0].get("v")
    counts = {w: n != 0 for w, n in zip(wheres, found, strict=True)}
    return counts, seen if isinstance(seen, str) else None


def _operator_read(access: ServerAccess, select: str, what: str) -> list[dict[str, Any]]:
    """The rows of ``SELECT <select>``, asked as the operator."""
    # Asked from `system`: the database concerned may not exist.
    endpoint = access.endpoint("system")
    return (
        HttpTransport(endpoint, access.operator())
        .execute(
            read(f"SELECT {select} FORMAT JSONEachRow", f"dpone-s00-{what}-{time.time_ns()}"),
            deadline=time.monotonic() + REQUEST_SECONDS,
        )
        .json_rows()
    )
