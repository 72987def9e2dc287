"""Escaping of identifiers and literals (checked against the real server too)."""

from __future__ import annotations

import pytest

from dpone.sql import quote_identifier, quote_literal
from tests.hostile_values import HOSTILE_NAMES


@pytest.mark.parametrize("text", HOSTILE_NAMES)
def test_quoted_forms_contain_no_raw_quote_or_control(text: str) -> None:
    for quoted, q in ((quote_literal(text), "'"), (quote_identifier(text), "`")):
        inner = quoted[1:-1]
        assert quoted[0] == quoted[-1] == q
        assert all(ord(c) >= 0x20 and ord(c) != 0x7F for c in inner)
        # Every quote inside is escaped by an odd run of backslashes.
        for i, c in enumerate(inner):
            if c == q:
                run = len(inner[:i]) - len(inner[:i].rstrip("\\"))
                assert run % 2 == 1


def test_empty_identifier_is_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        quote_identifier("")
