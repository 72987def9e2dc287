"""Typed outcomes of a ClickHouse request that did not succeed.

The split that matters to callers: a :class:`ClickHouseServerError` is a terminal
answer from the server (the query failed there); a :class:`OutcomeUnknown` means the
request may or may not have run, and only a proof of remote termination (see
:mod:`dpone.connectors.remote_termination`) settles it; a :class:`NotSubmitted`
means the request provably never reached the server (a deadline that expired before
anything was sent is :class:`DeadlineBeforeSend`, both a deadline and not submitted).
"""

from __future__ import annotations

from typing import Any

from dpone.errors import DeadlineError, TransportError

# ClickHouse's error code for a login it refuses (a wrong password, an unknown user).
AUTHENTICATION_FAILED = 516
SIGN_IN_FIX = (
    "the credentials file dpone reads does not match the users the server has installed: "
    "`dpone pool verify` names each principal it refuses; for a server you run, install "
    "the users file of the same `dpone pool render`, or point [clickhouse] "
    "credentials_file at the credentials file of the render installed"
)


class ClickHouseServerError(TransportError):
    """The server answered with an exception. ``clickhouse_code`` is its number.

    A refused sign-in (``AUTHENTICATION_FAILED``) is ``authentication_refused``, and
    its message and ``fix`` say what to do, whichever command met it.
    """

    code = "clickhouse_error"

    def __init__(self, message: str, *, code: str | None = None, **details: Any) -> None:
        if code is None and details.get("clickhouse_code") == AUTHENTICATION_FAILED:
            code, message = "authentication_refused", f"{message}; fix: {SIGN_IN_FIX}"
            details.setdefault("fix", SIGN_IN_FIX)
        super().__init__(message, code=code, **details)


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
