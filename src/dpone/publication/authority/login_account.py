"""A closure's account of the principal's open sign-ins: every request, whatever its shape.

The drain gate (:mod:`dpone.publication.authority.session_drain`) stops what runs in the lease's
own HTTP sessions, the process samples and the query log what the server registered
as a query. A request as the same user *without* the session parameters, whose body
the server is still reading (an INSERT whose chunked body is held open: the server
reads up to ``max_query_size`` of it before it parses, registers or logs the query),
is in none of them, and lands when the body ends. It is signed in, though: the server
logs a ``LoginSuccess`` in ``system.session_log`` when it authenticates a request (or
a native connection) and a ``Logout`` when it ends, both under the user's name. So
the closure counts them, for the user, since the server's current process began:

- logins minus logouts is the number of requests (and connections) of the user still
  open; the closure's own requests as the user (the session closes and probes) have
  answered by then, so any left is someone else's. (The log's ``auth_id`` would pair
  them, but this engine writes one constant id for every sign-in: checked.) Fewer
  logins than logouts means the log lost rows: the count is then not observed;
- a count above zero is read again (after another ``SYSTEM FLUSH LOGS``) a few times:
  a logout logged a moment after its answer settles; a request held open stays, and
  the closure is not proven (``logins_open``): it waits for it, then refuses;
- no ``system.session_log`` (a server whose configuration lacks the ``<session_log>``
  section; ClickHouse's default config.xml has it commented out), or a closer
  without its grant on it (a pool rendered before it): the count is
  ``None``, the closure says so (``facts["logins"]["observed"]``) and is not proven
  (:data:`LOGINS_UNOBSERVABLE`, for the ingest's lease and the publisher's alike)
  unless the operator accepts a closure on samples and the query log alone
  (``accept_ungated_ingest``). Prepare names it ``ingest_logins_unobservable``,
  reconcile leaves the record ``commit_unknown`` with reason
  ``publisher_logins_unobservable`` and abandon refuses with that code.
- a user leased again (``relet``) is not counted for an earlier lease's closure (the
  new lease's requests are its own, and the log cannot tell them apart): nothing of
  the earlier lease is missed, because the store never leases a user again before its
  last lease's closure is proven, and that proof, made while the lease was the
  user's latest, counted the user's open sign-ins (or accepted them unobserved).

The count is read in the request the closure already makes for the server's start
time and its query-log account, so it costs no request when nothing is open.
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
