"""Several reads in one request, each read's rows split out as it would answer alone.

A read is a SELECT without FORMAT. A batch asks each as a scalar subquery that gathers
its rows as JSONEachRow lines (``groupArray(formatRowNoNewline('JSONEachRow', *))``),
so one round trip answers them all, and each read's rows are then parsed as its own
answer would have been. Only a saving of round trips (:func:`ask_together`): a batch
the server refused, answered over the response budget or in another shape keeps
nothing, and its reads are then asked on their own; a batch lost, cut or late is a
failure, never asked again (the catalog's and the staging checks' prefetch).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from dpone.errors import DeadlineError, TransportError
from dpone.ports.clickhouse import QueryPort
from dpone.ports.clickhouse_errors import ClickHouseServerError
from dpone.ports.clickhouse_request import read
from dpone.ports.clickhouse_result import QueryResult

# A batch answer over the transport's response budget (HTTP, clickhouse-client).
_TOO_LARGE = frozenset({"response_body_budget_exceeded", "output_budget_exceeded"})
_GATHERED = "(SELECT groupArray(formatRowNoNewline('JSONEachRow', *)) FROM ({sql})) AS {column}"


def batched_columns(reads: Sequence[tuple[str, str]]) -> list[str]:
    """The select list asking each ``(column, sql)`` read as one column of its rows."""
    return [_GATHERED.format(sql=sql, column=column) for column, sql in reads]


def split_answers(
    result: QueryResult, columns: Sequence[str]
) -> tuple[dict[str, Any], list[list[dict[str, Any]]]] | None:
    """The batch's one row and each column's rows, parsed as that read's own answer;
    None for an answer of another shape (not one row, or a column that is not a list
    of lines)."""
    rows = result.json_rows()
    if len(rows) != 1:
        return None
    answers = []
    for column in columns:
        lines = rows[0].get(column)
        if not isinstance(lines, list) or not all(isinstance(x, str) for x in lines):
            return None
        text = "".join(f"{line}\n" for line in lines).encode("utf-8")
        answers.append(dataclasses.replace(result, output=text).json_rows())
    return rows[0], answers


def ask_together(
    transport: QueryPort,
    columns: Sequence[str],
    names: Sequence[str],
    query_id: str,
    deadline: float,
    *,
    suffix: str = "",
) -> tuple[dict[str, Any], list[list[dict[str, Any]]]] | None:
    """``SELECT <columns><suffix>`` in one request: its row and the rows of each of the
    gathered ``names`` (:func:`split_answers`). None when the reads are to be asked on
    their own: the batch ran and the server refused it (one read's error), or its answer
    is over the response budget or of another shape. A batch lost, cut or late raises
    the transport's error."""
    statement = f"SELECT {', '.join(columns)}{suffix} FORMAT JSONEachRow"
    try:
        result = transport.execute(read(statement, query_id), deadline=deadline)
    except ClickHouseServerError:
        return None  # it ran and failed: each read is asked on its own, for its own error
    except (TransportError, DeadlineError) as exc:
        if exc.code in _TOO_LARGE:
            return None  # too large together: each read is asked on its own
        raise
    return split_answers(result, names)
