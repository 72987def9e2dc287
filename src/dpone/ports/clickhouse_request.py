"""Pure request construction shared by the HTTP and client transports.

One module decides what a request is: its statement, its one query id, the settings
pinned for its kind, the endpoint and the user. Credentials are kept out of every
printable form (``repr``, argv, URL, log, exception text).
"""

from __future__ import annotations

import enum
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

from dpone.errors import ConfigurationError
from dpone.ports.clickhouse_errors import NotSubmitted

_ATTEMPT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,79}$")
_SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
MUTATION_KINDS = ("create", "insert", "drop", "identity", "discard")


class RequestKind(enum.Enum):
    """Whether a request changes the server (mutation) or only reads (read)."""

    MUTATION = "mutation"
    READ = "read"


@dataclass(frozen=True)
class Credentials:
    """A user and password; the password never appears in ``repr``, ``str`` or errors.

    Both travel as UTF-8: in HTTP headers (``X-ClickHouse-User``/``X-ClickHouse-Key``)
    and in the client's XML configuration file. Control characters (CR, LF, NUL and
    the rest of Unicode category Cc) would split a header or be rewritten by the XML
    parser, so the server would check something else than what was configured: they
    are refused here, at configuration time, as is text that has no UTF-8 form.
    """

    user: str
    password: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        if not self.user:
            raise ConfigurationError(
                "the ClickHouse user name is empty", code="invalid_credentials"
            )
        _check_credential("user name", self.user, show=True)
        _check_credential("password", self.password, show=False)

    def __str__(self) -> str:
        return f"Credentials(user={self.user!r})"


def _check_credential(what: str, text: str, *, show: bool) -> None:
    """Refuse what HTTP headers and XML cannot carry unchanged; never quote a secret."""
    named = {"user": text} if show else {}
    # Checked by code point, not by encoding: a UnicodeEncodeError quotes the text.
    if any(0xD800 <= ord(ch) <= 0xDFFF for ch in text):
        raise ConfigurationError(
            f"the ClickHouse {what} has no UTF-8 form (a lone surrogate)",
            code="invalid_credentials",
            field=what,
            **named,
        )
    bad = sorted({f"U+{ord(ch):04X}" for ch in text if unicodedata.category(ch) == "Cc"})
    if bad:
        raise ConfigurationError(
            f"the ClickHouse {what} contains control characters ({', '.join(bad)}); "
            "HTTP headers and the client's configuration file cannot carry them",
            code="invalid_credentials",
            field=what,
            characters=bad,
            **named,
        )


@dataclass(frozen=True)
class Endpoint:
    """One ClickHouse server: host, ports and the database dpone works in.

    ``secure``: both transports speak TLS and verify the server's certificate and host
    name, against ``ca_file`` when given, else the system's trust store. There is no
    setting that turns verification off.
    """

    host: str
    http_port: int
    tcp_port: int
    database: str
    secure: bool = False
    ca_file: str | None = None

    def describe(self) -> str:
        """A printable, credential-free name for logs and journals."""
        scheme = "https://" if self.secure else ""
        return f"{scheme}{self.host}:{self.http_port}/{self.database}"


# Settings every request carries. async_insert is on by default in recent servers;
# an insert must be synchronous for its acknowledgment to mean anything.
COMMON_SETTINGS: dict[str, str] = {"async_insert": "0"}
# Control output (counts, positions) must carry integers as JSON integers.
READ_SETTINGS: dict[str, str] = {"output_format_json_quote_64bit_integers": "0"}
# HTTP only: the status must wait for the end of the query, and mutations never
# stream progress headers (which would commit a 200 before the outcome is known).
HTTP_MUTATION_SETTINGS: dict[str, str] = {
    "wait_end_of_query": "1",
    "send_progress_in_http_headers": "0",
}
HTTP_READ_SETTINGS: dict[str, str] = {"wait_end_of_query": "1"}


@dataclass(frozen=True)
class ClickHouseRequest:
    """One statement with its query id; ``body`` is a spool streamed as INSERT data."""

    statement: str
    query_id: str
    kind: RequestKind
    body: Path | None = None
    settings: tuple[tuple[str, str], ...] = ()
    # A read may let the server stream its output (no wait_end_of_query); then an
    # exception can arrive after status 200, which the HTTP transport detects.
    stream_output: bool = False
    # An HTTP session (HTTP transport only; the client transport refuses it): the
    # server keeps it ``session_timeout`` seconds after its last request, and with
    # ``session_check`` a request fails (372 SESSION_NOT_FOUND) unless it exists.
    session_id: str | None = None
    session_timeout: int | None = None
    session_check: bool = False
    # A ceiling on the request body bytes that may leave this process (the spool, or
    # the statement when there is no spool), enforced while the body streams.
    max_body_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.stream_output and self.kind is RequestKind.MUTATION:
            raise ConfigurationError(
                "a mutation must wait for the end of the query", code="pinned_setting"
            )
        if self.session_id is not None and not _SESSION_ID.fullmatch(self.session_id):
            raise ConfigurationError(
                f"session id {self.session_id!r} must match {_SESSION_ID.pattern}",
                code="invalid_session",
                query_id=self.query_id,
            )
        if self.session_id is None and (self.session_timeout is not None or self.session_check):
            raise ConfigurationError(
                "session_timeout and session_check need a session_id",
                code="invalid_session",
                query_id=self.query_id,
            )
        if self.session_timeout is not None and not _positive_int(self.session_timeout):
            raise ConfigurationError(
                f"session_timeout must be a positive number of seconds, not {self.session_timeout!r}",
                code="invalid_session",
                query_id=self.query_id,
            )
        if self.max_body_bytes is not None and not (
            _positive_int(self.max_body_bytes) or self.max_body_bytes == 0
        ):
            raise ConfigurationError(
                f"max_body_bytes must be a byte count, not {self.max_body_bytes!r}",
                code="invalid_body_limit",
                query_id=self.query_id,
            )

    def session_parameters(self) -> dict[str, str]:
        """The HTTP URL parameters of this request's session (empty without one)."""
        if self.session_id is None:
            return {}
        params = {"session_id": self.session_id}
        if self.session_timeout is not None:
            params["session_timeout"] = str(self.session_timeout)
        if self.session_check:
            params["session_check"] = "1"
        return params

    def check_body_size(self, size: int) -> None:
        """Refuse a body over ``max_body_bytes`` before anything is sent (``NotSubmitted``)."""
        if self.max_body_bytes is not None and size > self.max_body_bytes:
            raise NotSubmitted(
                f"the body of query {self.query_id} has {size} bytes, over its ceiling of "
                f"{self.max_body_bytes}; nothing was sent",
                code="body_limit_exceeded",
                query_id=self.query_id,
                limit=self.max_body_bytes,
                size=size,
            )

    def all_settings(self, *, http: bool) -> dict[str, str]:
        """Pinned settings for this kind and transport, then the request's own."""
        merged = dict(COMMON_SETTINGS)
        if self.kind is RequestKind.READ:
            merged.update(READ_SETTINGS)
        if http and self.kind is RequestKind.MUTATION:
            merged.update(HTTP_MUTATION_SETTINGS)
        elif http and not self.stream_output:
            merged.update(HTTP_READ_SETTINGS)
        for name, value in self.settings:
            if name in merged and merged[name] != value:
                raise ConfigurationError(
                    f"setting {name} is pinned to {merged[name]} and cannot be {value}",
                    code="pinned_setting",
                    setting=name,
                )
            merged[name] = value
        return merged


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def check_attempt_id(attempt_id: str) -> str:
    """Attempt ids go into query ids and paths: a short, plain token only."""
    if not _ATTEMPT_ID.fullmatch(attempt_id):
        raise ConfigurationError(
            f"attempt id {attempt_id!r} must match {_ATTEMPT_ID.pattern}",
            code="invalid_attempt_id",
        )
    return attempt_id


def mutation_query_id(attempt_id: str, kind: str) -> str:
    """``dpone-b02-<attempt_id>-<create|insert|drop>``: one id per mutation, ever."""
    if kind not in MUTATION_KINDS:
        raise ConfigurationError(f"unknown mutation kind {kind!r}", code="invalid_mutation_kind")
    return f"dpone-b02-{check_attempt_id(attempt_id)}-{kind}"


def read_query_id(attempt_id: str, purpose: str, sequence: int) -> str:
    """A separate identified request for a read: ``dpone-b02-<attempt>-read-<purpose>-<n>``."""
    if not re.fullmatch(r"[a-z0-9_]{1,32}", purpose):
        raise ConfigurationError(f"read purpose {purpose!r} is not a plain token")
    return f"dpone-b02-{check_attempt_id(attempt_id)}-read-{purpose}-{sequence}"


def mutation(statement: str, query_id: str, *, body: Path | None = None) -> ClickHouseRequest:
    """A mutation request (CREATE, INSERT, DROP, EXCHANGE...)."""
    return ClickHouseRequest(statement, query_id, RequestKind.MUTATION, body)


def read(statement: str, query_id: str, *, stream_output: bool = False) -> ClickHouseRequest:
    """A read-only request whose output is control data (JSONEachRow)."""
    return ClickHouseRequest(statement, query_id, RequestKind.READ, stream_output=stream_output)
