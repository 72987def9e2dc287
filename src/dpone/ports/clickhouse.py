"""The ClickHouse query port: what every service needs from a transport."""

from __future__ import annotations

from typing import Protocol

from dpone.ports.clickhouse_request import ClickHouseRequest
from dpone.ports.clickhouse_result import QueryResult


class QueryPort(Protocol):
    """One controlled transport (HTTP or client): one request, sent once.

    ``execute`` returns a complete acknowledgment or raises a typed outcome
    (:mod:`dpone.ports.clickhouse_errors`); it never retries.
    """

    name: str

    def execute(self, request: ClickHouseRequest, *, deadline: float) -> QueryResult:
        """Send once; return a complete acknowledgment or raise a typed outcome."""
        ...
