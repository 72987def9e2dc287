"""A closure's account of the principal's open sign-ins: every request, whatever its shape.

A request as the lease's user without the drain gate's session, whose body the server is
still reading, is in no process sample and no query log yet, but the server has
authenticated it: ``system.session_log`` logs a ``LoginSuccess`` for it and a ``Logout``
when it ends. So, while the lease is the user's latest, the closure counts logins minus
logouts since the server's current process began, reads a count above zero again after
flushing the logs, and is not proven while one stays open (``logins_open``) or when the
log cannot be read (:data:`LOGINS_UNOBSERVABLE`, unless the operator accepts a closure
without it). The count rides on the request the closure already makes for the server's
start time, one count a user for every lease closed at once. See docs/publication-principals.md ("Every request of the principal, not one
shape").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dpone.ports.clickhouse_errors import ClickHouseServerError, OutcomeUnknown
from dpone.publication.authority.closure_reads import SETTINGS, Rows, any_of, columns, per_lease
from dpone.sql import quote_literal

# The server's process start (a second early: uptime() counts whole seconds), each
# user's open sign-ins since then (one column a user, closure_reads.per_lease) and, when
# asked, the closure's query-log account (closure_reads.account_column); one row.
_STARTED = "toUnixTimestamp64Micro(now64(6)) - (toUInt64(uptime()) + 1) * 1000000 AS us"
_OPEN = "toInt64(countIf(type = 'LoginSuccess' AND {cond})) - toInt64(countIf(type = 'Logout' AND {cond}))"
_LOGINS = (
    "(SELECT {columns} FROM system.session_log WHERE ({users}) AND event_time_microseconds >= "
    "now64(6) - toIntervalSecond(toUInt64(uptime()) + 1)) AS open_logins"
)
# ClickHouse's UNKNOWN_TABLE (the server keeps no session log) and ACCESS_DENIED (a
# pool rendered before the closer's grant on it): the count is not observed.
UNOBSERVED_CODES = (60, 497)
# The closure's finding when the count is not observed and the operator did not accept
# a closure without it: the closure is not proven.
LOGINS_UNOBSERVABLE = "logins_unobservable"


def started_and_logins(
    rows: Rows, users: Sequence[str], account: str | None = None
) -> tuple[int, list[int | None], object]:
    """A time (server clock, microseconds) before the server's current process began,
    each of ``users``' open sign-ins since then (None: the server keeps no session log)
    and the value of the ``account`` column (closure_reads.account_column; None when
    not asked), in one request."""
    asked = [] if account is None else [account]
    conditions = [f"user = {quote_literal(u)}" for u in users]
    logins = _LOGINS.format(columns=columns(_OPEN, conditions), users=any_of(conditions))
    try:
        found = rows("SELECT " + ", ".join([_STARTED, logins, *asked]) + SETTINGS, "uptime")
    except ClickHouseServerError as exc:
        if exc.details.get("clickhouse_code") not in UNOBSERVED_CODES:
            raise
        found = rows("SELECT " + ", ".join([_STARTED, *asked]) + SETTINGS, "uptime")
        return _started(found, users), [None] * len(users), _asked(found)
    row = found[0] if len(found) == 1 else {}
    counts = per_lease(row.get("open_logins"), len(users))
    if not all(isinstance(c, int) and not isinstance(c, bool) for c in counts):
        raise OutcomeUnknown(
            f"the closure's sign-in count of {', '.join(users)} answered {found!r:.200}",
            code="closure_sample_malformed",
            user=users[0] if len(users) == 1 else list(users),
        )
    # More logouts than logins: the log lost rows (a full queue, a TTL), so the count
    # proves nothing and is not observed. (A lost login beside a request held open can
    # also net to zero: the log's completeness is the operator's, docs/remote.md.)
    observed = [c if isinstance(c, int) and c >= 0 else None for c in counts]
    return _started(found, users), observed, _asked(found)


def _started(found: list[dict[str, Any]], users: Sequence[str]) -> int:
    at_us = found[0].get("us") if len(found) == 1 else None
    if not isinstance(at_us, int) or isinstance(at_us, bool):
        raise OutcomeUnknown(
            f"the closure's server start of {', '.join(users)} answered {found!r:.200}",
            code="closure_sample_malformed",
            user=users[0] if len(users) == 1 else list(users),
        )
    return at_us


def _asked(found: list[dict[str, Any]]) -> object:
    return found[0].get("rows") if len(found) == 1 else None


def settle_logins(
    first: Mapping[str, int | None],
    again: Callable[[list[str]], Mapping[str, int | None]],
    sleep: Callable[[float], None],
    tries: int,
    spacing_seconds: float,
) -> dict[str, dict[str, Any]]:
    """Each user's login facts: ``observed``, ``open`` (the last count) and ``reads``.

    ``first`` are the counts read with the server's start; the users whose count is
    above zero are read again together (``again`` flushes the logs first and counts
    the users it is given), each up to ``tries`` more times.
    """
    counts = dict(first)
    reads = dict.fromkeys(counts, 1)
    unobserved = {user for user, count in counts.items() if count is None}
    while True:
        pending = [
            user
            for user, count in counts.items()
            if user not in unobserved and (count or 0) > 0 and reads[user] <= tries
        ]
        if not pending:
            break
        sleep(spacing_seconds)
        found = again(pending)
        for user in pending:
            reads[user] += 1
            count = found.get(user)
            if count is None:
                unobserved.add(user)
            counts[user] = count
    return {
        user: {"observed": False, "open": None, "reads": reads[user]}
        if user in unobserved
        else {"observed": True, "open": counts[user], "reads": reads[user]}
        for user in counts
    }


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
