"""Typed outcomes of a ClickHouse request that did not succeed.

The split that matters to callers: a :class:`ClickHouseServerError` is a terminal
answer from the server (the query failed there); a :class:`OutcomeUnknown` means the
request may or may not have run, and only a proof of remote termination (see
:mod:`dpone.connectors.remote_termination`) settles it; a :class:`NotSubmitted`
means the request provably never reached the server (a deadline that expired before
anything was sent is :class:`DeadlineBeforeSend`, both a deadline and not submitted).
"""

from __future__ import annotations

from dpone.errors import DeadlineError, TransportError


class ClickHouseServerError(TransportError):
    """The server answered with an exception. ``clickhouse_code`` is its number."""

    code = "clickhouse_error"


class OutcomeUnknown(TransportError):
    """The request may have run: the connection or the framing broke after sending began."""

    code = "outcome_unknown"


class NotSubmitted(TransportError):
    """The request was never sent (refused before any byte left, or connect failed)."""

    code = "not_submitted"


class TransportDeadline(DeadlineError):
    """The absolute deadline expired; ``submitted`` says whether bytes had left."""

    code = "transport_deadline"


class DeadlineBeforeSend(TransportDeadline, NotSubmitted):
    """The deadline expired before any byte left: a deadline, and provably not sent.

    Callers that settle outcomes by ``isinstance(exc, NotSubmitted)`` treat it as not
    sent (nothing to prove remotely); callers that look for deadlines still find one.
    """

    def __init__(self, message: str, *, query_id: str) -> None:
        super().__init__(message, submitted=False, query_id=query_id)
