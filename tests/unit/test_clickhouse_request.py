"""Pure request construction: query ids, pinned settings, credentials kept private."""

from __future__ import annotations

import pytest

from dpone.errors import ConfigurationError
from dpone.ports.clickhouse_request import (
    ClickHouseRequest,
    Credentials,
    RequestKind,
    mutation,
    mutation_query_id,
    read,
    read_query_id,
)


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


SECRET = "s3cr3t-\r\nX-Injected: 1"


@pytest.mark.parametrize(
    ("user", "password", "field", "shown"),
    [
        ("loader", "pa\rss-" + SECRET, "password", ["U+000A", "U+000D"]),
        ("loader", "pass\x00word-s3cr3t", "password", ["U+0000"]),
        ("loader", "tab\tand\x7fdel-s3cr3t", "password", ["U+0009", "U+007F"]),
        ("loader", "next-line\x85-s3cr3t", "password", ["U+0085"]),
        ("load\ner", "s3cr3t", "user name", ["U+000A"]),
    ],
)
def test_credentials_that_headers_and_xml_cannot_carry_are_refused(
    user: str, password: str, field: str, shown: list[str]
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        Credentials(user, password)
    error = caught.value
    assert error.code == "invalid_credentials"
    assert error.details["field"] == field and error.details["characters"] == shown
    assert error.__cause__ is None
    for text in (str(error), repr(error), repr(error.details), repr(error.to_dict())):
        assert "s3cr3t" not in text


def test_a_password_without_utf8_form_is_refused_without_quoting_it() -> None:
    with pytest.raises(ConfigurationError) as caught:
        Credentials("loader", "s3cr3t-\ud800")
    assert caught.value.code == "invalid_credentials"
    # No UnicodeEncodeError anywhere in the chain: it would carry the whole password.
    assert caught.value.__cause__ is None and caught.value.__context__ is None
    assert "s3cr3t" not in str(caught.value) and "s3cr3t" not in repr(caught.value.to_dict())


def test_credentials_accept_any_utf8_text() -> None:
    c = Credentials("Łukasz-пользователь", "pässwörd €-ok with spaces")
    assert c.user == "Łukasz-пользователь"
    with pytest.raises(ConfigurationError):
        Credentials("", "x")


def test_session_parameters_and_their_checks() -> None:
    assert read("SELECT 1", "q").session_parameters() == {}
    gate = ClickHouseRequest(
        "SELECT 1",
        "q",
        RequestKind.READ,
        session_id="pub-1",
        session_timeout=3,
        session_check=True,
    )
    assert gate.session_parameters() == {
        "session_id": "pub-1",
        "session_timeout": "3",
        "session_check": "1",
    }
    for bad in (
        {"session_timeout": 3},
        {"session_check": True},
        {"session_id": "a b"},
        {"session_id": "s", "session_timeout": 0},
        {"session_id": "s", "session_timeout": True},
    ):
        with pytest.raises(ConfigurationError) as caught:
            ClickHouseRequest("SELECT 1", "q", RequestKind.READ, **bad)
        assert caught.value.code == "invalid_session"
    with pytest.raises(ConfigurationError) as limit:
        ClickHouseRequest("SELECT 1", "q", RequestKind.READ, max_body_bytes=-1)
    assert limit.value.code == "invalid_body_limit"
