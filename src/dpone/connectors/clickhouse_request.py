"""Pure request construction shared by the HTTP and client transports.

One module decides what a request is: its statement, its one query id, the settings
pinned for its kind, the endpoint and the user. Credentials are kept out of every
printable form (``repr``, argv, URL, log, exception text).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from pathlib import Path

from dpone.errors import ConfigurationError

_ATTEMPT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,79}$")
MUTATION_KINDS = ("create", "insert", "drop", "identity", "discard")


class RequestKind(enum.Enum):
    """Whether a request changes the server (mutation) or only reads (read)."""

    MUTATION = "mutation"
    READ = "read"


@dataclass(frozen=True)
class Credentials:
    """A user and password; the password never appears in ``repr`` or ``str``."""

    user: str
    password: str = field(default="", repr=False)

    def __str__(self) -> str:
        return f"Credentials(user={self.user!r})"


@dataclass(frozen=True)
class Endpoint:
    """One ClickHouse server: host, ports and the database dpone works in."""

    host: str
    http_port: int
    tcp_port: int
    database: str

    def describe(self) -> str:
        """A printable, credential-free name for logs and journals."""
        return f"{self.host}:{self.http_port}/{self.database}"


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

    def __post_init__(self) -> None:
        if self.stream_output and self.kind is RequestKind.MUTATION:
            raise ConfigurationError(
                "a mutation must wait for the end of the query", code="pinned_setting"
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
                    code="pinned_setting", setting=name,
                )  # fmt: skip
            merged[name] = value
        return merged


def check_attempt_id(attempt_id: str) -> str:
    """Attempt ids go into query ids and paths: a short, plain token only."""
    if not _ATTEMPT_ID.match(attempt_id):
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
