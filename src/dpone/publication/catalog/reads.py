"""The catalog's reads: one deadline and one query id per read, typed failures, typed fields.

Any failed, partial or malformed answer raises :class:`CatalogUnobservable` instead of
turning into an empty list or a zero.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dpone.errors import DeadlineError, StateError, TransportError
from dpone.ports.clickhouse import QueryPort
from dpone.ports.clickhouse_request import read
from dpone.sql import quote_literal

_PURPOSE = re.compile(r"[a-z0-9_]{1,32}")
_UNKNOWN_TABLE = 60


class CatalogUnobservable(StateError):
    """The catalog could not observe something completely; nothing was assumed instead."""

    code = "catalog_unobservable"


class ByteObservationMissing(CatalogUnobservable):
    """A table's byte counter is missing (NULL); a missing counter is never zero."""

    code = "byte_observation_missing"


def catalog_query_id(observation: str, purpose: str, sequence: int) -> str:
    """``dpone-s00-catalog-<observation>-<purpose>-<n>``: one id per catalog read."""
    if not re.fullmatch(r"[0-9a-f]{16}", observation) or not _PURPOSE.fullmatch(purpose):
        raise ValueError(f"catalog query id parts {observation!r}, {purpose!r} are not plain")
    return f"dpone-s00-catalog-{observation}-{purpose}-{sequence}"


class CatalogReads:
    """One observation's reads: one deadline, one id per query, typed failures."""

    def __init__(self, transport: QueryPort, deadline: float, clock: Callable[[], float]) -> None:
        self._transport = transport
        self._deadline = deadline
        self._clock = clock
        self._observation = uuid.uuid4().hex[:16]
        self._sequence = 0
        self.last_query_id = ""

    def rows(self, purpose: str, sql: str, *, output: bool = True) -> list[dict[str, Any]]:
        """The JSON rows ``sql`` answers under its own query id (none expected if not ``output``)."""
        self._sequence += 1
        query_id = catalog_query_id(self._observation, purpose, self._sequence)
        self.last_query_id = query_id
        statement = f"{sql} FORMAT JSONEachRow" if output else sql
        try:
            result = self._transport.execute(read(statement, query_id), deadline=self._deadline)
            rows = result.json_rows()
        except (TransportError, DeadlineError) as exc:
            clickhouse_code = exc.details.get("clickhouse_code")
            raise CatalogUnobservable(
                f"catalog read {purpose} failed: {exc.message}",
                query_id=query_id,
                purpose=purpose,
                cause=exc.code,
                clickhouse_code=clickhouse_code,
                unknown_table=clickhouse_code == _UNKNOWN_TABLE,
            ) from exc
        if not output and rows:
            raise self.malformed(purpose, rows)
        return rows

    def malformed(self, purpose: str, value: object) -> CatalogUnobservable:
        """The error for an answer of the last read that is not what was asked for."""
        return CatalogUnobservable(
            f"catalog read {purpose} answered something malformed: {value!r:.300}",
            query_id=self.last_query_id,
            purpose=purpose,
        )


def text_field(row: Mapping[str, Any], key: str, reads: CatalogReads) -> str:
    """A string field of a row the catalog read."""
    value = row.get(key)
    if not isinstance(value, str):
        raise reads.malformed(key, row)
    return value


def optional_text_field(row: Mapping[str, Any], key: str, reads: CatalogReads) -> str | None:
    """A string or NULL field of a row (the key itself must be there)."""
    if key not in row:
        raise reads.malformed(key, row)
    return None if row[key] is None else text_field(row, key, reads)


def count_field(row: Mapping[str, Any], key: str, reads: CatalogReads) -> int:
    """A non-negative integer field of a row."""
    value = row.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise reads.malformed(key, row)
    return value


def in_list(names: Sequence[str]) -> str:
    """``('a', 'b')``: the names as a SQL IN list of quoted literals."""
    return "(" + ", ".join(quote_literal(n) for n in names) + ")"
