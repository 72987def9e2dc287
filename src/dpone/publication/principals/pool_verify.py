"""Proof that a server's installation of dpone's principals is what dpone needs, before any work.

:func:`verify_pool` signs in as every principal of the credentials file and checks, on
the server itself and changing nothing: that each authenticates as that user, that its
grants (``SHOW GRANTS`` as itself) are exactly its role's, that each protected database
exists and is ``Atomic``, the server's version (:data:`MIN_SERVER_VERSION`), that every
principal's queries are logged from their start and it cannot change that
(:mod:`dpone.publication.principals.pool_logging`), and the server's identity
(``serverUUID()``, or ``_dpone_identity`` where the server reports the Nil UUID). Every
problem is collected with a stable code and the principal or database it is about. See
docs/remote.md ("4. Verify the installation").
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.connectors.endpoint_identity import (
    EMPTY_SET_ANSWERS,
    IDENTITY_CREATE,
    IDENTITY_DATABASE,
    NIL_UUID,
)
from dpone.connectors.http_connections import POOL
from dpone.connectors.tls_probe import PLAIN_TO_TLS, TLS_PORT_FIX, plain_http_to_tls
from dpone.durable_files import private_directories
from dpone.errors import ConfigurationError, DponeError
from dpone.localserver.pool_file import read_pool_file, remote_grants, remote_role, remote_users
from dpone.localserver.principal_pool import DEFAULT_POOL, PoolNames
from dpone.ports.clickhouse_errors import NotSubmitted, TransportDeadline
from dpone.ports.clickhouse_request import Credentials, read
from dpone.publication.dispatch.dispatch_gate import gate_for
from dpone.publication.principals.pool_logging import (
    QUERY_LOG_OFF_FIX,
    WHO,
    changeable_fix,
    query_log_problems,
)
from dpone.publication.principals.server_access import ServerAccess
from dpone.sql import quote_literal

# The oldest server line dpone accepts: the 26.3 long-term-support line. Time and Time64,
# which SQL Server's time(n) maps to, exist only from 25.6; the session drain gate,
# EXCHANGE TABLES and the query log columns dpone reads are older. The suite runs on
# 26.9 (the managed server's engine); see docs/remote.md for what is proven where.
MIN_SERVER_VERSION = (26, 3)
REQUEST_SECONDS = 30.0
_VERSION = "SELECT version() AS v"
_GRANT = re.compile(
    r"^GRANT (?P<privileges>.+) ON (?P<on>\S+) TO \S+(?P<option> WITH GRANT OPTION)?$"
)


@dataclass
class PoolVerification:
    """What :func:`verify_pool` found: the server's facts and every problem."""

    server: str
    version: str | None = None
    server_uuid: str | None = None
    identity: str | None = None
    principals: list[dict[str, Any]] = field(default_factory=list)
    problems: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether nothing is wrong."""
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "server": self.server,
            "version": self.version,
            "server_uuid": self.server_uuid,
            "identity": self.identity,
            "principals": self.principals,
            "problems": self.problems,
        }


def render_command(databases: Sequence[str], pool: PoolNames = DEFAULT_POOL) -> str:
    """The ``dpone pool render`` of ``pool`` that protects ``databases`` (to a new
    credentials file, switched to once the users file is installed, as a rotation)."""
    protect = " ".join(f"--protect {d}" for d in dict.fromkeys(databases))
    named = f" --pool {pool.name}" if pool.name else ""
    return f"dpone pool render {protect}{named} --out dpone-users.xml --credentials NEW_FILE"


def protected_databases(access: ServerAccess) -> tuple[str, ...] | None:
    """The databases the installed pool protects, read from the publishers' own grants
    (``INSERT`` on ``DB.*``, over all of them: one given a wider grant by mistake shows
    the narrower ones subsumed); None when no publisher can sign in."""
    credentials = access.known_credentials()
    read_grants: dict[str, list[str]] = {}
    for user in (u for u in access.pool.publishers() if u in credentials):
        with contextlib.suppress(DponeError):
            read_grants[user] = _grants(
                HttpTransport(access.endpoint("system"), credentials[user]), user
            )
    return _protected_by(read_grants, access.pool)


def _protected_by(grants: dict[str, list[str]], pool: PoolNames) -> tuple[str, ...] | None:
    """What the publishers' grants (by user, those that could be read) protect."""
    read = [g for user, g in grants.items() if user in pool.publishers()]
    if not read:
        return None
    pairs = grant_pairs([statement for statements in read for statement in statements])
    return tuple(
        sorted(
            {
                on[:-2]
                for priv, on in pairs
                if priv == "INSERT" and on.endswith(".*") and on != "*.*"
            }
        )
    )


def _grants(transport: HttpTransport, user: str) -> list[str]:
    """``SHOW GRANTS`` as the transport's user."""
    return [str(r["g"]) for r in _rows(transport, "SHOW GRANTS", f"grants-{user}", "g")]


def grant_pairs(statements: Sequence[str]) -> set[tuple[str, str]]:
    """``GRANT a, b ON x`` statements as {(privilege, object)} with back-quotes removed,
    so that the users file's text and the server's ``SHOW GRANTS`` compare."""
    pairs: set[tuple[str, str]] = set()
    for statement in statements:
        text = statement.strip()
        if " TO " not in text:
            text += " TO _"
        match = _GRANT.fullmatch(text)
        if match is None:
            pairs.add((text, "?"))  # a REVOKE or anything unexpected: never equal
            continue
        on = match.group("on").replace("`", "")
        suffix = " WITH GRANT OPTION" if match.group("option") else ""
        for privilege in match.group("privileges").split(", "):
            pairs.add((privilege.strip() + suffix, on))
    return pairs


def require_server_version(
    access: ServerAccess,
    minimum: tuple[int, int] = MIN_SERVER_VERSION,
    *,
    version: str | None = None,
) -> str:
    """The server's version; refused (``server_too_old``, naming the version and what
    needs a newer one) when it is older than ``minimum``: never a late SQL error.
    ``version``: as the server answered it just now, in a read of its own caller."""
    if version is None:
        operator = HttpTransport(access.endpoint("system"), access.operator())
        version = str(_rows(operator, _VERSION, "version")[0]["v"])
    if parse_version(version) < minimum:
        raise ConfigurationError(
            too_old_message(version, minimum),
            code="server_too_old",
            version=version,
            minimum=".".join(map(str, minimum)),
        )
    return version


def too_old_message(version: str, minimum: tuple[int, int]) -> str:
    """Why ``version`` is refused."""
    oldest = ".".join(map(str, minimum))
    return (
        f"ClickHouse {version} is older than {oldest}, the oldest version dpone supports "
        f"(Time and Time64 columns, which SQL Server's time(n) maps to, need 25.6, and "
        f"{oldest} is the oldest long-term-support line dpone accepts); upgrade the server"
    )


def parse_version(text: str) -> tuple[int, int]:
    """``26.9.2.1`` as (26, 9)."""
    major, minor = [*text.split("."), "0", "0"][:2]
    return int(major), int(minor)


def verify_pool(
    access: ServerAccess, databases: Sequence[str], store: Path | str | None = None
) -> PoolVerification:
    """Check the installation of the pool over ``databases`` on ``access``'s server.

    It signs in as every pool user. With ``store`` (the publication store of the
    project), it does so holding the store's dispatch gate, as every closure does while
    it proves a lease of one of them quiescent, so that a closure running beside it
    never counts these sign-ins as its lease's queries started after it began.
    """
    if store is None:
        return _verify(access, databases)
    if isinstance(store, Path):
        private_directories(store.parent)
    with gate_for(store).held_for_all(remote_users(access.pool)):
        return _verify(access, databases)


def _verify(access: ServerAccess, databases: Sequence[str]) -> PoolVerification:
    found = PoolVerification(access.describe())
    credentials = access.known_credentials()
    pool = access.pool
    try:
        _rows(
            HttpTransport(access.endpoint("system"), credentials[pool.keeper]), "SELECT 1", "reach"
        )
    except (NotSubmitted, TransportDeadline) as exc:
        # The server is not reached at all (TLS refused, nothing listening): one problem,
        # said once, not once per principal.
        problem = {"code": exc.code, "message": exc.message}
        found.problems.append({**problem, "fix": problem_fix(problem, databases, pool)})
        return found
    except DponeError as exc:
        mismatch = plain_http_to_tls(access.endpoint("system"), exc)
        if mismatch is not None:  # every sign-in would fail alike: said once
            found.problems.append({**mismatch, "fix": problem_fix(mismatch, databases, pool)})
            return found
        # Otherwise reached: the keeper's own login is judged with the others below.
    # The keeper's reads of the server run beside the sign-ins (a round trip or two of
    # their own, not added after them); their problems are taken after the sign-ins'.
    keeper_found = PoolVerification(found.server)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpone-keeper") as beside:
        keeper = (
            beside.submit(
                POOL.carried(_keeper_checks),
                keeper_found,
                HttpTransport(access.endpoint("system"), credentials[pool.keeper]),
                databases,
            )
            if pool.keeper in credentials
            else None
        )
        signed = _sign_in_all(access, credentials, found)
        if keeper is not None:
            keeper.result()
    protected = _protected_by({user: grants for user, (_, grants) in signed.items()}, pool)
    _unprotected(found, access, databases, protected)
    # Each role's grants are judged over what the installation protects, which may be
    # more databases than this project publishes into.
    over = protected if protected else tuple(databases)
    _judge_principals(found, access, credentials, signed, over)
    found.problems.extend(query_log_problems({user: rows for user, (rows, _) in signed.items()}))
    found.version, found.server_uuid = keeper_found.version, keeper_found.server_uuid
    found.identity = keeper_found.identity
    found.problems.extend(keeper_found.problems)
    for problem in found.problems:
        problem.setdefault("fix", problem_fix(problem, over, pool))
    return found


def _rotating(access: ServerAccess, credentials: Mapping[str, Credentials]) -> dict[str, str]:
    """During a rotation, for each principal with a previous password: ``new`` when
    dpone signs in with the new one (the server takes it), else ``previous``."""
    if access.remote is None:
        return {}
    found = read_pool_file(access.remote.credentials_file, access.pool)
    return {
        user: "new" if credentials[user].password == found.passwords[user] else "previous"
        for user in found.previous
        if user in credentials
    }


def _unprotected(
    found: PoolVerification,
    access: ServerAccess,
    databases: Sequence[str],
    protected: tuple[str, ...] | None,
) -> None:
    """A problem for each of ``databases`` the installed pool does not protect."""
    for database in databases:
        if protected is not None and database not in protected:
            found.problems.append(
                {
                    "code": "database_not_protected",
                    "database": database,
                    "message": f"the pool installed on {access.describe()} does not protect "
                    f"{database}: render it again with every database it protects and this "
                    f"one (`{render_command((*protected, database), access.pool)}`) and "
                    "install it",
                }
            )


def _judge_principals(
    found: PoolVerification,
    access: ServerAccess,
    credentials: Mapping[str, Credentials],
    signed: dict[str, tuple[list[dict[str, Any]], list[str]]],
    over: Sequence[str],
) -> None:
    """Each principal's entry: retired, signed in as itself, with its role's grants
    over the databases ``over`` (what the installation protects)."""
    pool = access.pool
    retired = access.retired()
    rotating = _rotating(access, credentials)
    for user in remote_users(pool):
        role = remote_role(user, pool)
        assert role is not None
        entry: dict[str, Any] = {"user": user, "role": role}
        found.principals.append(entry)
        if user in retired:
            # No password left to sign in with; whether it can still write is the
            # catalog's to judge (an outside writer until a render leaves it out).
            entry["retired"] = True
            continue
        if user in rotating:  # which password signed in, while a rotation overlaps
            entry["password"] = rotating[user]
        if user not in signed:
            entry["authenticated"] = False
            continue
        rows, grants = signed[user]
        entry["authenticated"] = [r.get("who") for r in rows] == [user]
        if not entry["authenticated"]:
            found.problems.append(
                {
                    "code": "principal_login_failed",
                    "user": user,
                    "message": f"signed in as {user}, the server says the user is "
                    f"{[r.get('who') for r in rows]}",
                }
            )
        have, want = grant_pairs(grants), grant_pairs(remote_grants(role, over, pool))
        entry["grants_exact"] = have == want
        if have != want:
            found.problems.append(
                {
                    "code": "principal_grants_differ",
                    "user": user,
                    "message": f"{user}'s grants are not its role's ({role})",
                    "missing": sorted(" ON ".join(p) for p in want - have),
                    "extra": sorted(" ON ".join(p) for p in have - want),
                }
            )


def _sign_in_all(
    access: ServerAccess, credentials: Mapping[str, Credentials], found: PoolVerification
) -> dict[str, tuple[list[dict[str, Any]], list[str]]]:
    """Every principal signs in once: its identity and grants, or why it could not.

    The sign-ins are independent reads: they run side by side (a round trip each, not
    one after another), and their findings are taken in the users' order.
    """
    signed: dict[str, tuple[list[dict[str, Any]], list[str]]] = {}
    users = [u for u in remote_users(access.pool) if u in credentials]
    with ThreadPoolExecutor(max_workers=len(users), thread_name_prefix="dpone-sign-in") as run:
        # Counted as the caller's requests (its phase's), though other threads send them.
        sign_in = POOL.carried(_sign_in)
        answers = [run.submit(sign_in, access, credentials, user) for user in users]
        for user, answer in zip(users, answers, strict=True):
            outcome = answer.result()
            if isinstance(outcome, DponeError):
                found.problems.append(
                    {"code": "principal_login_failed", "user": user, "message": outcome.message}
                )
            else:
                signed[user] = outcome
    return signed


def _sign_in(
    access: ServerAccess, credentials: Mapping[str, Credentials], user: str
) -> tuple[list[dict[str, Any]], list[str]] | DponeError:
    """``user``'s identity and grants as it sees them, or the error of its sign-in."""
    transport = HttpTransport(access.endpoint("system"), credentials[user])
    try:
        return _rows(transport, WHO, f"who-{user}"), _grants(transport, user)
    except DponeError as exc:
        return exc


def _keeper_checks(
    found: PoolVerification, keeper: HttpTransport, databases: Sequence[str]
) -> None:
    """What the keeper reads: the server's version and identity, its query log, the databases."""
    _server_facts(found, keeper)
    _query_log_readable(found, keeper)
    _databases(found, keeper, databases)


_ENDPOINT_FIX = (
    "check [clickhouse] host, http_port and secure in the project file, and that the "
    "server listens there"
)


def problem_fix(
    problem: Mapping[str, Any], protected: Sequence[str], pool: PoolNames = DEFAULT_POOL
) -> str:
    """What fixes ``problem``, in words and with its command or config key (``protected``:
    the databases the installation protects, which a new render of ``pool`` must keep)."""
    user, database = problem.get("user"), problem.get("database")
    render = render_command(protected, pool)
    keeper = pool.keeper
    fixes = {
        "connect_failed": _ENDPOINT_FIX,
        "host_not_found": _ENDPOINT_FIX,
        "transport_deadline": _ENDPOINT_FIX,
        "tls_certificate_refused": "check [clickhouse] ca_file (the CA that signed the "
        "server's certificate) and that the certificate names host and has not expired",
        "tls_handshake_failed": "check [clickhouse] secure and http_port: with secure = "
        "true the port must be the server's HTTPS one",
        PLAIN_TO_TLS: TLS_PORT_FIX,
        "principal_login_failed": f"the server does not accept {user}'s password from "
        "[clickhouse] credentials_file: install, in the server's users.d, the users file "
        "rendered with that credentials file, or point credentials_file at the credentials "
        f"file of the render installed; if the installed file lacks {user}, render the pool "
        f"again (`{render}`) and install it",
        "principal_grants_differ": f"the server gives {user} other grants than its role's: "
        "install the users file exactly as `dpone pool render` wrote it (or render again: "
        f"`{render}`) and revoke any grant given to {user} beside it; a users file "
        "rendered by an older dpone lacks grants this one needs (the keeper's ownership "
        "markers): render again and install it, a rotation",
        "database_not_protected": "render the pool with every database it protects "
        f"(`{render_command((*protected, str(database)), pool)}`), install the users file, then "
        "point [clickhouse] credentials_file at the new credentials file",
        "database_missing": f"as the server's administrator: `CREATE DATABASE {database} "
        "ENGINE = Atomic`; or point the tables' target in the project file at a database "
        "that exists",
        "database_not_atomic": "EXCHANGE TABLES needs an Atomic database: have the "
        f"administrator move {database}'s tables into an Atomic database (`CREATE DATABASE "
        "... ENGINE = Atomic`, then `RENAME TABLE`), or point the tables' target at one",
        "server_too_old": "upgrade the server to ClickHouse "
        f"{'.'.join(map(str, MIN_SERVER_VERSION))} or newer",
        "identity_missing": f"as the server's administrator: `{IDENTITY_CREATE}`",
        "server_unreadable": f"{keeper} must read the server's system tables: install "
        f"the users file as rendered (its role's grants), or render again (`{render}`)",
        "query_log_off": QUERY_LOG_OFF_FIX,
        "pool_settings_changeable": changeable_fix(render),
        "query_log_unreadable": "turn the server's query log on: its configuration needs "
        "the <query_log> section (ClickHouse's default config.xml has it; a config.d file may "
        f"remove it), and {keeper} keeps its rendered SELECT on system.*",
    }
    return fixes.get(str(problem.get("code")), "see docs/remote.md")


def _query_log_readable(found: PoolVerification, keeper: HttpTransport) -> None:
    """``query_log_unreadable``: ``system.query_log`` cannot be read (the server's query
    log is off, so the table does not exist, or the read is not granted)."""
    try:
        _rows(
            keeper,
            "SELECT count() AS n FROM system.query_log "
            "WHERE event_date = today() AND query_id = ''",
            "query-log",
        )
    except DponeError as exc:
        found.problems.append(
            {
                "code": "query_log_unreadable",
                "message": f"the keeper cannot read system.query_log ({exc.message}): "
                "closure reads it to prove a lease's queries ended",
            }
        )


def _server_facts(found: PoolVerification, keeper: HttpTransport) -> None:
    try:
        # The version, serverUUID() and the identity database's UUID (if any), at once.
        row = _rows(
            keeper,
            "SELECT version() AS v, toString(serverUUID()) AS u, (SELECT groupArray("
            "toString(uuid)) FROM system.databases WHERE name = "
            f"{quote_literal(IDENTITY_DATABASE)}) AS identity{EMPTY_SET_ANSWERS}",
            "server",
        )[0]
        found.version, found.server_uuid = str(row["v"]), str(row["u"])
        identity = [str(uuid) for uuid in row["identity"]]
    except DponeError as exc:
        found.problems.append({"code": "server_unreadable", "message": exc.message})
        return
    except (IndexError, KeyError, TypeError) as exc:  # an answer of another shape
        message = f"the server's version and identity answered another shape ({exc!r:.200})"
        found.problems.append({"code": "server_unreadable", "message": message})
        return
    if parse_version(found.version) < MIN_SERVER_VERSION:
        found.problems.append(
            {
                "code": "server_too_old",
                "version": found.version,
                "message": too_old_message(found.version, MIN_SERVER_VERSION),
            }
        )
    if found.server_uuid != NIL_UUID:
        found.identity = f"serverUUID {found.server_uuid}"
    elif identity:
        found.identity = f"database {IDENTITY_DATABASE} {identity[0]}"
    else:
        found.problems.append(
            {
                "code": "identity_missing",
                "message": f"the server reports no identity of its own (serverUUID is nil) and "
                f"has no {IDENTITY_DATABASE} database: its administrator runs `{IDENTITY_CREATE}`",
                "statement": IDENTITY_CREATE,
            }
        )


def _databases(found: PoolVerification, keeper: HttpTransport, databases: Sequence[str]) -> None:
    names = ", ".join(quote_literal(d) for d in databases)
    try:
        rows = _rows(
            keeper,
            f"SELECT name, engine FROM system.databases WHERE name IN ({names})",
            "databases",
        )
    except DponeError as exc:
        found.problems.append({"code": "server_unreadable", "message": exc.message})
        return
    engines = {str(r["name"]): str(r["engine"]) for r in rows}
    for database in databases:
        engine = engines.get(database)
        if engine == "Atomic":
            continue
        statement = f"CREATE DATABASE {database} ENGINE = Atomic"
        found.problems.append(
            {
                "code": "database_missing" if engine is None else "database_not_atomic",
                "database": database,
                "message": f"database {database} does not exist: its administrator runs "
                f"`{statement}`"
                if engine is None
                else f"database {database} has engine {engine}, not Atomic: EXCHANGE TABLES "
                "needs an Atomic database",
            }
        )


def _rows(
    transport: HttpTransport, sql: str, what: str, column: str | None = None
) -> list[dict[str, Any]]:
    query = f"dpone-pool-verify-{what}-{time.time_ns()}"
    result = transport.execute(
        read(sql + (" FORMAT TSV" if column else " FORMAT JSONEachRow"), query),
        deadline=time.monotonic() + REQUEST_SECONDS,
    )
    if column is None:
        return result.json_rows()
    text = result.output.decode("utf-8")
    return [{column: line} for line in text.splitlines() if line]
