"""A closure's account of the principal's open sign-ins: every request, whatever its shape.

A request as the lease's user without the drain gate's session, whose body the server is
still reading, is in no process sample and no query log yet, but the server has
authenticated it: ``system.session_log`` logs a ``LoginSuccess`` for it and a ``Logout``
when it ends. So, while the lease is the user's latest, the closure counts logins minus
logouts since the server's current process began, reads a count above zero again after
flushing the logs, and is not proven while one stays open (``logins_open``) or when the
log cannot be read (:data:`LOGINS_UNOBSERVABLE`, unless the operator accepts a closure
without it). The count rides on the request the closure already makes for the server's
start time. See docs/publication-principals.md ("Every request of the principal, not one
shape").
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from dpone.ports.clickhouse_errors import ClickHouseServerError, OutcomeUnknown
from dpone.sql import quote_literal

# The server's process start (a second early: uptime() counts whole seconds), the
# user's open sign-ins since then and, when asked, the rows of the closure's query-log
# account (each row a JSON line); one row.
_STARTED = "toUnixTimestamp64Micro(now64(6)) - (toUInt64(uptime()) + 1) * 1000000 AS us"
_LOGINS = (
    "(SELECT toInt64(countIf(type = 'LoginSuccess')) - toInt64(countIf(type = 'Logout')) "
    "FROM system.session_log WHERE user = {user} AND event_time_microseconds >= "
    "now64(6) - toIntervalSecond(toUInt64(uptime()) + 1)) AS open_logins"
)
_ACCOUNT = "(SELECT groupArray(formatRowNoNewline('JSONEachRow', *)) FROM ({account})) AS rows"
# A profile's empty_result_for_aggregation_by_empty_set must not turn "none" into no row.
_TAIL = " SETTINGS empty_result_for_aggregation_by_empty_set = 0 FORMAT JSONEachRow"
# ClickHouse's UNKNOWN_TABLE (the server keeps no session log) and ACCESS_DENIED (a
# pool rendered before the closer's grant on it): the count is not observed.
UNOBSERVED_CODES = (60, 497)
# The closure's finding when the count is not observed and the operator did not accept
# a closure without it: the closure is not proven.
LOGINS_UNOBSERVABLE = "logins_unobservable"


# A closure's read: (SQL, purpose) -> the JSON rows, as the closer.
Rows = Callable[[str, str], list[dict[str, Any]]]


def started_and_logins(
    rows: Rows, user: str, account: str | None = None
) -> tuple[int, int | None, list[dict[str, Any]]]:
    """A time (server clock, microseconds) before the server's current process began,
    ``user``'s open sign-ins since then (None: the server keeps no session log) and the
    rows ``account`` (a query-log read) answers ([] when not asked), in one request."""
    asked = [] if account is None else [_ACCOUNT.format(account=account)]
    try:
        found = rows(
            "SELECT "
            + ", ".join([_STARTED, _LOGINS.format(user=quote_literal(user)), *asked])
            + _TAIL,
            "uptime",
        )
    except ClickHouseServerError as exc:
        if exc.details.get("clickhouse_code") not in UNOBSERVED_CODES:
            raise
        found = rows("SELECT " + ", ".join([_STARTED, *asked]) + _TAIL, "uptime")
        return _started(found, user), None, _account_rows(found, account)
    count = found[0].get("open_logins") if len(found) == 1 else None
    if not isinstance(count, int) or isinstance(count, bool):
        raise OutcomeUnknown(
            f"the closure's sign-in count of {user} answered {found!r:.200}",
            code="closure_sample_malformed",
            user=user,
        )
    # More logouts than logins: the log lost rows (a full queue, a TTL), so the count
    # proves nothing and is not observed. (A lost login beside a request held open can
    # also net to zero: the log's completeness is the operator's, docs/remote.md.)
    observed = count if count >= 0 else None
    return _started(found, user), observed, _account_rows(found, account)


def _started(found: list[dict[str, Any]], user: str) -> int:
    at_us = found[0].get("us") if len(found) == 1 else None
    if not isinstance(at_us, int) or isinstance(at_us, bool):
        raise OutcomeUnknown(
            f"the closure's server start of {user} answered {found!r:.200}",
            code="closure_sample_malformed",
            user=user,
        )
    return at_us


def _account_rows(found: list[dict[str, Any]], account: str | None) -> list[dict[str, Any]]:
    """The account's rows (each a JSON line of the one row), or why they are not."""
    if account is None:
        return []
    lines = found[0].get("rows") if len(found) == 1 else None
    try:
        if not isinstance(lines, list):
            raise ValueError(lines)
        rows = [json.loads(line) for line in lines]
        if not all(isinstance(r, dict) for r in rows):
            raise ValueError(rows)
    except (TypeError, ValueError) as exc:
        raise OutcomeUnknown(
            f"the closure's query-log account answered {found!r:.200}",
            code="closure_account_malformed",
        ) from exc
    return rows


def settle_logins(
    first: int | None,
    again: Callable[[], int | None],
    sleep: Callable[[float], None],
    tries: int,
    spacing_seconds: float,
) -> dict[str, Any]:
    """The closure's login facts: ``observed``, ``open`` (the last count) and ``reads``.

    ``first`` is the count read with the server's start; while it is above zero it is
    read again (``again`` flushes the logs first), up to ``tries`` more times.
    """
    if first is None:
        return {"observed": False, "open": None, "reads": 1}
    count, reads = first, 1
    while count > 0 and reads <= tries:
        sleep(spacing_seconds)
        found = again()
        reads += 1
        if found is None:
            return {"observed": False, "open": None, "reads": reads}
        count = found
    return {"observed": True, "open": count, "reads": reads}


def login_findings(logins: dict[str, Any], accept_unobserved: bool) -> list[str]:
    """Why ``logins`` (:func:`settle_logins`' facts) leave a closure unproven: a sign-in
    still open (``logins_open``), or none could be counted (:data:`LOGINS_UNOBSERVABLE`)
    unless ``accept_unobserved`` (the operator's [publication] accept_ungated_ingest);
    a count skipped for a relet user is no finding (see the module doc)."""
    if logins["open"]:
        return ["logins_open"]
    unobserved = logins_unobserved(logins)
    return [LOGINS_UNOBSERVABLE] if unobserved and not accept_unobserved else []


def logins_unobserved(logins: Mapping[str, Any]) -> bool:
    """Whether a closure's ``logins`` facts say no sign-in could be counted (a count
    skipped for a relet user is not that, see the module doc)."""
    return logins.get("observed") is False and "skipped" not in logins
