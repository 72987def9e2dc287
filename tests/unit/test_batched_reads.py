"""Several reads in one request: the select list, and each read's rows split out."""

from __future__ import annotations

import json
from collections.abc import Mapping

import pytest

from dpone.connectors.batched_reads import ask_together, batched_columns, split_answers
from dpone.errors import TransportError
from dpone.ports.clickhouse_errors import ClickHouseServerError, OutcomeUnknown, TransportDeadline
from dpone.ports.clickhouse_request import ClickHouseRequest
from dpone.ports.clickhouse_result import QueryResult


def _result(*rows: Mapping[str, object]) -> QueryResult:
    output = "".join(json.dumps(r) + "\n" for r in rows).encode()
    return QueryResult("q-batch", output, None, None, "http")


def test_each_read_is_one_column_of_its_rows() -> None:
    assert batched_columns(
        [("r0", "SELECT 1 AS a"), ("r_count", "SELECT count() AS n FROM t")]
    ) == [
        "(SELECT groupArray(formatRowNoNewline('JSONEachRow', *)) FROM (SELECT 1 AS a)) AS r0",
        "(SELECT groupArray(formatRowNoNewline('JSONEachRow', *)) FROM "
        "(SELECT count() AS n FROM t)) AS r_count",
    ]


def test_each_columns_rows_are_parsed_as_its_own_answer() -> None:
    row = {"id": "server-1", "r0": ['{"a":1}', '{"a":2}'], "r1": []}
    split = split_answers(_result(row), ["r0", "r1"])
    assert split is not None
    whole, answers = split
    assert whole == row
    assert answers == [[{"a": 1}, {"a": 2}], []]


@pytest.mark.parametrize(
    "rows",
    [
        (),  # no row
        ({"r0": []}, {"r0": []}),  # two rows
        ({"r1": []},),  # the column missing
        ({"r0": "not a list"},),
        ({"r0": [1, 2]},),  # not lines of text
    ],
)
def test_an_answer_of_another_shape_is_none(rows: tuple[Mapping[str, object], ...]) -> None:
    assert split_answers(_result(*rows), ["r0"]) is None


def test_a_line_that_is_not_a_json_row_is_refused_as_its_own_answer_would_be() -> None:
    with pytest.raises(OutcomeUnknown) as refused:
        split_answers(_result({"r0": ['{"a": 1.5}']}), ["r0"])
    assert refused.value.code == "invalid_control_output"
    assert refused.value.details["query_id"] == "q-batch"


class _Answers:
    """A transport that answers each request with the next of ``outcomes`` (a result,
    or an error to raise), keeping the statements it was asked."""

    name = "answers"

    def __init__(self, *outcomes: QueryResult | Exception) -> None:
        self.outcomes = list(outcomes)
        self.asked: list[str] = []

    def execute(self, request: ClickHouseRequest, *, deadline: float) -> QueryResult:
        self.asked.append(request.statement)
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


def test_asked_together_in_one_request_and_split() -> None:
    transport = _Answers(_result({"id": "s", "r0": ['{"a":1}']}))
    found = ask_together(transport, ["toString(1) AS id", "x AS r0"], ["r0"], "q", 9.0, suffix=" S")
    assert found == ({"id": "s", "r0": ['{"a":1}']}, [[{"a": 1}]])
    assert transport.asked == ["SELECT toString(1) AS id, x AS r0 S FORMAT JSONEachRow"]


@pytest.mark.parametrize(
    "outcome",
    [
        ClickHouseServerError("unknown table", clickhouse_code=60),  # ran, refused
        TransportError("over the budget", code="response_body_budget_exceeded"),
        TransportError("over the cap", code="output_budget_exceeded"),
        _result({"r1": []}),  # another shape
    ],
)
def test_a_batch_refused_too_large_or_misshapen_is_none(outcome: QueryResult | Exception) -> None:
    assert ask_together(_Answers(outcome), ["x AS r0"], ["r0"], "q", 9.0) is None


@pytest.mark.parametrize(
    "outcome",
    [
        OutcomeUnknown("connection cut", code="connection_lost"),
        TransportDeadline("late", code="deadline_exceeded"),
    ],
)
def test_a_batch_lost_cut_or_late_is_that_failure(outcome: Exception) -> None:
    with pytest.raises(type(outcome)):
        ask_together(_Answers(outcome), ["x AS r0"], ["r0"], "q", 9.0)
