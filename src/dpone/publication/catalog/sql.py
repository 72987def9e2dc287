"""The SQL text the server shows: the column list, column TTLs and engine clauses of a table.

system.columns has no TTL, and system.tables' ``engine_full`` holds the table TTL,
SETTINGS and COMMENT in one text; these read them from ``create_table_query`` and
``engine_full`` with a small tokenizer, so a string or comment that mentions a keyword
is never taken for one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from dpone.publication.catalog.reads import CatalogUnobservable

_TOKEN = re.compile(
    r"""'(?:[^'\\]|\\.)*'|`(?:[^`\\]|\\.)*`|"(?:[^"\\]|\\.)*"|[A-Za-z_][A-Za-z0-9_]*|\s+|.""",
    re.S,
)


def _tokens(text: str) -> list[str]:
    tokens: list[str] = _TOKEN.findall(text)
    if "".join(tokens) != text:
        raise CatalogUnobservable(
            "SQL text the server showed cannot be tokenized", code="catalog_unobservable"
        )
    return tokens


def _split_top(tokens: Sequence[str], separator: str = ",") -> list[list[str]]:
    """Split at ``separator`` tokens outside any brackets."""
    parts: list[list[str]] = [[]]
    depth = 0
    for lexeme in tokens:
        if lexeme in "([{" and len(lexeme) == 1:
            depth += 1
        elif lexeme in ")]}" and len(lexeme) == 1:
            depth -= 1
        if lexeme == separator and depth == 0:
            parts.append([])
        else:
            parts[-1].append(lexeme)
    return parts


def _clause(tokens: Sequence[str], keyword: str, stops: Iterable[str]) -> str | None:
    """The text after the top-level word ``keyword`` up to the next top-level stop word."""
    stop = set(stops)
    depth, start = 0, None
    for index, lexeme in enumerate(tokens):
        if lexeme in "([{" and len(lexeme) == 1:
            depth += 1
        elif lexeme in ")]}" and len(lexeme) == 1:
            depth -= 1
        elif depth == 0 and start is None and lexeme == keyword:
            start = index + 1
        elif depth == 0 and start is not None and lexeme in stop:
            return "".join(tokens[start:index]).strip()
    return None if start is None else "".join(tokens[start:]).strip()


def column_elements(create_table_query: str) -> list[list[str]]:
    """The top-level elements of a CREATE TABLE's column list (columns, indices, ...)."""
    tokens = _tokens(create_table_query)
    try:
        opening = tokens.index("(")
    except ValueError as exc:
        raise CatalogUnobservable(
            "create_table_query has no column list", code="catalog_unobservable"
        ) from exc
    depth = 0
    for index in range(opening, len(tokens)):
        depth += {"(": 1, ")": -1}.get(tokens[index], 0)
        if depth == 0:
            return [e for e in _split_top(tokens[opening + 1 : index]) if "".join(e).strip()]
    raise CatalogUnobservable(
        "create_table_query's column list is not closed", code="catalog_unobservable"
    )


def column_ttls(create_table_query: str) -> dict[str, str]:
    """Column name -> its TTL expression, for every column that declares one.

    system.columns has no TTL; the formatted CREATE statement is the only source. A
    column element starts with its backquoted name; its TTL runs to a column-level
    SETTINGS clause or the end of the element (comments are single string tokens, so
    a comment mentioning TTL is never mistaken for one).
    """
    ttls: dict[str, str] = {}
    for element in column_elements(create_table_query):
        words = [t for t in element if not t.isspace()]
        if not words or not words[0].startswith("`"):
            continue  # INDEX, PROJECTION, CONSTRAINT, PRIMARY KEY elements
        ttl = _clause(element, "TTL", ("SETTINGS",))
        if ttl is not None:
            ttls[_unquote_identifier(words[0])] = ttl
    return ttls


def engine_clauses(engine_full: str) -> tuple[str, str | None, str | None]:
    """(engine_full without a COMMENT clause, table TTL, SETTINGS) from ``engine_full``."""
    tokens = _tokens(engine_full)
    depth, cut = 0, len(tokens)
    for index, lexeme in enumerate(tokens):
        depth += {"(": 1, ")": -1}.get(lexeme, 0)
        if depth == 0 and lexeme == "COMMENT":
            cut = index
            break
    kept = tokens[:cut]
    keys = ("PARTITION", "PRIMARY", "ORDER", "SAMPLE", "SETTINGS", "COMMENT")
    return "".join(kept).strip(), _clause(kept, "TTL", keys), _clause(kept, "SETTINGS", ())


def _unquote_identifier(lexeme: str) -> str:
    return re.sub(r"\\(.)", r"\1", lexeme[1:-1])


def engine_arguments(engine_full: str) -> list[list[str]] | None:
    """The top-level arguments of ``Engine(a, b, ...)`` (tokens, blanks dropped), or None.

    None when ``engine_full`` does not start with an engine name and its argument list.
    """
    words = [t for t in _tokens(engine_full) if not t.isspace()]
    if len(words) < 3 or words[1] != "(":
        return None
    depth = 0
    for index in range(1, len(words)):
        depth += {"(": 1, ")": -1}.get(words[index], 0)
        if depth == 0:
            inner = words[2:index]
            return _split_top(inner) if inner else []
    return None


def string_literal(argument: Sequence[str]) -> str | None:
    """The value of an argument that is exactly one single-quoted string literal."""
    if len(argument) == 1 and len(argument[0]) >= 2 and argument[0][0] == argument[0][-1] == "'":
        return re.sub(r"\\(.)", r"\1", argument[0][1:-1])
    return None


def definition_words(create_table_query: str, engine_full: str) -> frozenset[str]:
    """Every identifier and string value a table's definition shows, column list excluded.

    The column list is left out so that a column named like a table never reads as a
    reference to it; ``engine_full`` is included whole (engine arguments live there).
    """
    tokens = _tokens(create_table_query)
    cut: tuple[int, int] | None = None
    depth = start = 0
    for index, lexeme in enumerate(tokens):
        if depth == 0 and lexeme in ("ENGINE", "AS"):
            break  # the first group after these is not a column list
        if lexeme == "(":
            if depth == 0:
                start = index
            depth += 1
        elif lexeme == ")":
            depth -= 1
            if depth == 0:
                cut = (start, index + 1)
                break
    kept = tokens if cut is None else [*tokens[: cut[0]], *tokens[cut[1] :]]
    return frozenset(_word(t) for t in (*kept, *_tokens(engine_full)) if _is_word(t))


def _is_word(lexeme: str) -> bool:
    return lexeme[:1] in ("'", "`", '"') or lexeme[:1].isalpha() or lexeme[:1] == "_"


def _word(lexeme: str) -> str:
    if lexeme[:1] in ("'", "`", '"'):
        return re.sub(r"\\(.)", r"\1", lexeme[1:-1])
    return lexeme
