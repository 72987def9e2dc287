"""The typed result of a request that completed with a full acknowledgment."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from dpone.connectors.clickhouse_errors import OutcomeUnknown


@dataclass(frozen=True)
class QueryResult:
    """A complete acknowledgment: the server finished the query and said so.

    ``sent_bytes`` and ``sent_sha256`` describe the request body that left this
    process (None without a body). ``summary`` is the server's own progress summary,
    a hint and never a count.
    """

    query_id: str
    output: bytes
    sent_bytes: int | None
    sent_sha256: str | None
    transport: str
    summary: dict[str, Any] | None = None
    # Pinned settings the transport could not send (an old client); the server's
    # profile must pin them.
    settings_not_sent: tuple[str, ...] = ()

    def json_rows(self) -> list[dict[str, Any]]:
        """Parse JSONEachRow control output; integers stay integers, floats refused."""
        rows = []
        for number, line in enumerate(self.output.decode("utf-8").splitlines(), start=1):
            try:
                row = json.loads(line, parse_float=_refuse_float, parse_constant=_refuse_float)
            except (ValueError, json.JSONDecodeError) as exc:
                raise OutcomeUnknown(
                    f"control output line {number} of query {self.query_id} is not a JSON row",
                    code="invalid_control_output", query_id=self.query_id, line=number,
                ) from exc  # fmt: skip
            if not isinstance(row, dict):
                raise OutcomeUnknown(
                    f"control output line {number} of query {self.query_id} is not an object",
                    code="invalid_control_output", query_id=self.query_id, line=number,
                )  # fmt: skip
            rows.append(row)
        return rows


def _refuse_float(text: str) -> Any:
    raise ValueError(f"non-integer number {text} in control output")
