"""Escaping of ClickHouse identifiers and string literals.

ClickHouse accepts backslash escapes inside both back-quoted identifiers and
single-quoted literals, so both the quote character and the backslash are escaped.
NUL and other control characters are written as escapes so the statement text stays
printable and cannot be cut short by a C-string boundary.
"""

from __future__ import annotations

from collections.abc import Iterable

_ESCAPES = {
    "\\": "\\\\",
    "\0": "\\0",
    "\b": "\\b",
    "\f": "\\f",
    "\r": "\\r",
    "\n": "\\n",
    "\t": "\\t",
}


def _escape(text: str, quote: str) -> str:
    out = []
    for ch in text:
        if ch == quote:
            out.append("\\" + quote)
        elif ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return quote + "".join(out) + quote


def quote_literal(value: str) -> str:
    """Return ``value`` as a single-quoted ClickHouse string literal."""
    return _escape(value, "'")


def in_list(values: Iterable[str]) -> str:
    """``('a', 'b')``: the values as a SQL IN list of quoted literals."""
    return "(" + ", ".join(quote_literal(v) for v in values) + ")"


def quote_identifier(name: str) -> str:
    """Return ``name`` as a back-quoted ClickHouse identifier.

    An empty name is refused: ClickHouse has no empty identifiers and a silent
    empty quote pair would name nothing.
    """
    if not name:
        raise ValueError("an SQL identifier cannot be empty")
    return _escape(name, "`")
