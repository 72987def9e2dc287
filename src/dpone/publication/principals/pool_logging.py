"""Whether the server logs every query of each pool principal, and keeps it so.

Closure reads each query's ``QueryStart`` row to prove a lease's queries ended, so every
principal's queries must be logged from their start and its inserts synchronous, read
as the principal itself (``query_log_off``). A value now proves nothing about the next
query unless the principal cannot change it (whoever holds its password could send
``SETTINGS log_queries = 0``): the rendered ``dpone_pool`` profile makes each constant
(:data:`~dpone.localserver.pool_sql.POOL_SETTINGS`), and a profile that leaves one
changeable (``system.settings``, ``readonly``) is named (``pool_settings_changeable``).
See docs/remote.md ("4. Verify the installation").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dpone.connectors.endpoint_identity import EMPTY_SET_ANSWERS
from dpone.localserver.pool_sql import POOL_SETTINGS
from dpone.sql import quote_literal

_PINNED = ", ".join(quote_literal(name) for name, _ in POOL_SETTINGS)
# Who the server says a principal is, whether it logs every query of theirs, and which
# of the profile's settings the principal cannot change.
WHO = (
    "SELECT currentUser() AS who, toUInt8(getSetting('log_queries')) AS log_queries, "
    "toFloat64(getSetting('log_queries_probability')) AS sampled, "
    "toString(getSetting('log_queries_min_type')) AS min_type, "
    "toUInt64(getSetting('log_queries_min_query_duration_ms')) AS min_ms, "
    "(SELECT groupArray(name) FROM system.settings "
    f"WHERE name IN ({_PINNED}) AND readonly != 0) AS pinned" + EMPTY_SET_ANSWERS
)
# What every logged query of a principal needs: its QueryStart row (closure and the
# pool users' check read them), so no minimum type above it and no minimum duration.
_LOGGED = {"log_queries": 1, "sampled": 1, "min_type": "QUERY_START", "min_ms": 0}

QUERY_LOG_OFF_FIX = (
    "remove what sets log_queries to 0, log_queries_probability below 1, "
    "log_queries_min_type above QUERY_START or log_queries_min_query_duration_ms above 0 "
    "for these users: a setting in the dpone_pool profile of the installed users file, or "
    "in the server's configuration (the server's defaults are 1, 1, QUERY_START and 0)"
)


def changeable_fix(render: str) -> str:
    """What fixes ``pool_settings_changeable`` (``render``: the render command)."""
    pinned = ", ".join(name for name, _ in POOL_SETTINGS)
    return (
        f"install the pool as `dpone pool render` writes it now (`{render}`, a rotation: "
        f"its dpone_pool profile makes {pinned} constant; a pool rendered by an older "
        "dpone lacks these constraints), and remove any profile or constraint that lets "
        "these users change them"
    )


def query_log_problems(signed: Mapping[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """``query_log_off``: the principals whose queries the server does not log from their
    start, whose closure could then never be proven from ``system.query_log``; and
    ``pool_settings_changeable``: those who could change that (or ``async_insert``) for
    a query of their own. ``signed``: each principal's answer to :data:`WHO`."""
    problems: list[dict[str, Any]] = []
    names = {"sampled": "probability"}
    off = {
        user: {names.get(k, k): rows[0].get(k) for k in _LOGGED}
        for user, rows in signed.items()
        if rows and any(rows[0].get(k) != want for k, want in _LOGGED.items())
    }
    if off:
        problems.append(
            {
                "code": "query_log_off",
                "users": sorted(off),
                "settings": off,
                "message": f"the server does not log every query of {', '.join(sorted(off))} "
                "from its start (log_queries must be 1, log_queries_probability 1, "
                "log_queries_min_type QUERY_START and log_queries_min_query_duration_ms 0 "
                "for each): closure reads each query's start in system.query_log to prove "
                "a lease's queries ended, and cannot",
            }
        )
    changeable = {
        user: [name for name, _ in POOL_SETTINGS if name not in _pinned(rows)]
        for user, rows in signed.items()
        if rows
    }
    changeable = {user: found for user, found in changeable.items() if found}
    if changeable:
        problems.append(
            {
                "code": "pool_settings_changeable",
                "users": sorted(changeable),
                "settings": changeable,
                "message": f"{', '.join(sorted(changeable))} may change settings the proofs "
                "rest on for a query of their own (their profile does not make them "
                "constant): a query sent with SETTINGS log_queries = 0 would be missing from "
                "system.query_log, where closure proves a lease's queries ended",
            }
        )
    return problems


def _pinned(rows: list[dict[str, Any]]) -> set[str]:
    found = rows[0].get("pinned")
    return {str(name) for name in found} if isinstance(found, list) else set()
