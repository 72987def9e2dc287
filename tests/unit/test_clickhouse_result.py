"""Control output parsing: rows end at LF only, strict UTF-8, coded failures."""

from __future__ import annotations

import pytest

from dpone.ports.clickhouse_errors import OutcomeUnknown
from dpone.ports.clickhouse_result import QueryResult


def result(output: bytes) -> QueryResult:
    return QueryResult("q-rows", output, None, None, "http")


def test_unicode_line_separators_inside_values_do_not_split_rows() -> None:
    # ClickHouse writes U+0085 (and other separators str.splitlines knows) raw in JSON.
    output = '{"s":"a\u0085b"}\n{"s":"c\u2028d\u2029e"}\n'.encode()
    assert result(output).json_rows() == [{"s": "a\u0085b"}, {"s": "c\u2028d\u2029e"}]


def test_non_utf8_output_is_a_coded_failure_with_its_position() -> None:
    with pytest.raises(OutcomeUnknown) as caught:
        result(b'{"n":1}\n{"s":"\xff"}\n').json_rows()
    assert caught.value.code == "invalid_control_output"
    assert caught.value.details == {"query_id": "q-rows", "line": 2, "byte_offset": 14}


def test_a_missing_final_lf_and_empty_output() -> None:
    assert result(b'{"n":1}').json_rows() == [{"n": 1}]
    assert result(b"").json_rows() == []
    with pytest.raises(OutcomeUnknown) as caught:
        result(b'{"n":1}\n\n{"n":2}\n').json_rows()  # an empty line is not a row
    assert caught.value.details["line"] == 2
