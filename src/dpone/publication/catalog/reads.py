"""The catalog's reads: one deadline and one query id per read, typed failures, typed fields.

Any failed, partial or malformed answer raises :class:`CatalogUnobservable` instead of
turning into an empty list or a zero. Reads an observation knows it will make can be
asked together first, in one request (:meth:`CatalogReads.prefetch`): each answer is
then taken by the read it belongs to; a batch that ran and failed, or was too large,
leaves every read to be asked on its own, as if there had been no batch.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dpone.connectors.batched_reads import ask_together, batched_columns
from dpone.errors import DeadlineError, DponeError, StateError, TransportError
from dpone.ports.clickhouse import QueryPort
from dpone.ports.clickhouse_request import read

_PURPOSE = re.compile(r"[a-z0-9_]{1,32}")
_UNKNOWN_TABLE = 60
# A read: its purpose (part of its query id) and its SELECT, without FORMAT.
Read = tuple[str, str]


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
        self._ready: dict[Read, tuple[str, list[dict[str, Any]]]] = {}

    def prefetch(self, purpose: str, reads: Sequence[Read]) -> None:
        """Ask ``reads`` in one request, for the :meth:`rows` calls that will ask them.

        Only a saving of round trips, never a source of answers: if the batch ran and
        failed (the server's error for one of its reads), its answer is over the
        response budget, or its JSON is not the batch's shape, nothing is kept and
        each read is then asked on its own, with its own query id and its own precise
        failure. A batch lost on the way, cut by its deadline, or answered with output
        that is not JSON at all is that failure (never asked again). A kept answer is
        taken once, by the first read of the same purpose and SQL, and names the
        batch's query id.
        """
        wanted = list(dict.fromkeys(r for r in reads if r not in self._ready))
        if len(wanted) < 2:
            return
        self._sequence += 1
        query_id = catalog_query_id(self._observation, purpose, self._sequence)
        names = [f"r{n}" for n in range(len(wanted))]
        columns = batched_columns([(n, sql) for n, (_, sql) in zip(names, wanted, strict=True)])
        try:
            split = ask_together(self._transport, columns, names, query_id, self._deadline)
        except (TransportError, DeadlineError) as exc:
            # Lost, cut or late: never asked again behind the caller's back.
            raise self._unobservable(purpose, query_id, exc) from exc
        except DponeError:
            return  # an answer of another shape: each read is asked on its own
        if split is None:
            return  # refused, too large or of another shape: each read on its own
        answers = split[1]
        for key, answer in zip(wanted, answers, strict=True):
            self._ready[key] = (query_id, answer)

    def rows(self, purpose: str, sql: str, *, output: bool = True) -> list[dict[str, Any]]:
        """The JSON rows ``sql`` answers under its own query id (none expected if not ``output``)."""
        ready = self._ready.pop((purpose, sql), None) if output else None
        if ready is not None:
            self.last_query_id = ready[0]
            return ready[1]
        self._sequence += 1
        query_id = catalog_query_id(self._observation, purpose, self._sequence)
        self.last_query_id = query_id
        statement = f"{sql} FORMAT JSONEachRow" if output else sql
        try:
            result = self._transport.execute(read(statement, query_id), deadline=self._deadline)
            rows = result.json_rows()
        except (TransportError, DeadlineError) as exc:
            raise self._unobservable(purpose, query_id, exc) from exc
        if not output and rows:
            raise self.malformed(purpose, rows)
        return rows

    @staticmethod
    def _unobservable(purpose: str, query_id: str, exc: DponeError) -> CatalogUnobservable:
        clickhouse_code = exc.details.get("clickhouse_code")
        return CatalogUnobservable(
            f"catalog read {purpose} failed: {exc.message}",
            query_id=query_id,
            purpose=purpose,
            cause=exc.code,
            clickhouse_code=clickhouse_code,
            unknown_table=clickhouse_code == _UNKNOWN_TABLE,
        )

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
