"""Pure request construction: query ids, pinned settings, credentials kept private."""

from __future__ import annotations

import pytest

from dpone.connectors.clickhouse_request import (
    ClickHouseRequest,
    Credentials,
    RequestKind,
    mutation,
    mutation_query_id,
    read,
    read_query_id,
)
from dpone.errors import ConfigurationError


def test_mutation_query_ids() -> None:
    assert mutation_query_id("a1-b2", "create") == "dpone-b02-a1-b2-create"
    assert mutation_query_id("a1-b2", "insert") == "dpone-b02-a1-b2-insert"
    assert mutation_query_id("a1-b2", "drop") == "dpone-b02-a1-b2-drop"
    assert read_query_id("a1", "count", 3) == "dpone-b02-a1-read-count-3"
    for bad in ("", "a b", "x'; DROP", "-lead", "a" * 81):
        with pytest.raises(ConfigurationError):
            mutation_query_id(bad, "insert")
    with pytest.raises(ConfigurationError):
        mutation_query_id("a1", "truncate")


def test_pinned_settings_by_kind_and_transport() -> None:
    m = mutation("INSERT INTO t FORMAT RowBinary", "q")
    assert m.all_settings(http=True) == {
        "async_insert": "0",
        "wait_end_of_query": "1",
        "send_progress_in_http_headers": "0",
    }
    assert m.all_settings(http=False) == {"async_insert": "0"}
    r = read("SELECT 1", "q")
    assert r.all_settings(http=True) == {
        "async_insert": "0",
        "output_format_json_quote_64bit_integers": "0",
        "wait_end_of_query": "1",
    }
    assert "wait_end_of_query" not in read("SELECT 1", "q", stream_output=True).all_settings(
        http=True
    )


def test_pinned_settings_cannot_be_overridden() -> None:
    request = ClickHouseRequest(
        "INSERT", "q", RequestKind.MUTATION, settings=(("async_insert", "1"),)
    )
    with pytest.raises(ConfigurationError) as caught:
        request.all_settings(http=True)
    assert caught.value.code == "pinned_setting"
    with pytest.raises(ConfigurationError):
        ClickHouseRequest("INSERT", "q", RequestKind.MUTATION, stream_output=True)
    extra = ClickHouseRequest("SELECT 1", "q", RequestKind.READ, settings=(("max_threads", "1"),))
    assert extra.all_settings(http=False)["max_threads"] == "1"


def test_credentials_never_print_the_password() -> None:
    c = Credentials("loader", "hunter2")
    assert "hunter2" not in repr(c) and "hunter2" not in str(c) and "loader" in repr(c)
