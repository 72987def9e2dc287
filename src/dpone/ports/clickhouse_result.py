"""The typed result of a request that completed with a full acknowledgment."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from dpone.ports.clickhouse_errors import OutcomeUnknown


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
        """Parse JSONEachRow control output; integers stay integers, floats refused.

        Rows end at LF only: ClickHouse leaves U+0085 unescaped inside JSON strings,
        and ``str.splitlines`` would cut a row there (and at U+2028, U+001C...). Each
        row must be strict UTF-8; anything else is an unreadable answer, never a guess.
        """
        rows = []
        offset = 0
        lines = self.output.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()  # the LF that ends the last row
        for number, line in enumerate(lines, start=1):
            rows.append(self._json_row(line, number, offset))
            offset += len(line) + 1
        return rows

    def _json_row(self, line: bytes, number: int, offset: int) -> dict[str, Any]:
        where = {"query_id": self.query_id, "line": number, "byte_offset": offset}
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise OutcomeUnknown(
                f"control output line {number} of query {self.query_id} is not UTF-8 "
                f"(byte offset {offset + exc.start})",
                code="invalid_control_output",
                **{**where, "byte_offset": offset + exc.start},
            ) from exc
        try:
            row = _DECODER.decode(text)
        except ValueError as exc:
            raise OutcomeUnknown(
                f"control output line {number} of query {self.query_id} is not a JSON row",
                code="invalid_control_output",
                **where,
            ) from exc
        if not isinstance(row, dict):
            raise OutcomeUnknown(
                f"control output line {number} of query {self.query_id} is not an object",
                code="invalid_control_output",
                **where,
            )
        return row


def _refuse_float(text: str) -> Any:
    raise ValueError(f"non-integer number {text} in control output")


# One decoder for every row (json.loads with options builds a new one each call).
_DECODER = json.JSONDecoder(parse_float=_refuse_float, parse_constant=_refuse_float)
