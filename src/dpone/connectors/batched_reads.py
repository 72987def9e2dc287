"""Several reads in one request, each read's rows split out as it would answer alone.

A read is a SELECT without FORMAT. A batch asks each as a scalar subquery that gathers
its rows as JSONEachRow lines (``groupArray(formatRowNoNewline('JSONEachRow', *))``),
so one round trip answers them all, and each read's rows are then parsed as its own
answer would have been. Only a saving of round trips: what a failed or misshapen batch
means (each read asked on its own, or the failure of the first) is the caller's
(the catalog's and the staging checks' prefetch).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from dpone.ports.clickhouse_result import QueryResult

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
