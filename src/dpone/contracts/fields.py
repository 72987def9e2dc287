"""Strict reading of JSON objects into typed fields.

One helper for every document: an object must have exactly the declared members,
each of the declared type. Booleans are never accepted where integers are meant.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dpone.errors import FormatError


class DocumentError(FormatError):
    """A document has missing, unknown or wrongly typed members."""

    code = "invalid_document"


# A member's declared type: a Python type or a tuple of them (``type(None)`` for null).
MemberType = type | tuple[type, ...]


def members(obj: Any, spec: Mapping[str, MemberType], *, where: str) -> dict[str, Any]:
    """Check that ``obj`` is an object with exactly ``spec``'s members and types."""
    if not isinstance(obj, dict):
        raise DocumentError(f"{where} must be an object", where=where)
    missing = sorted(set(spec) - set(obj))
    unknown = sorted(set(obj) - set(spec))
    if missing:
        raise DocumentError(
            f"{where} is missing member(s): {', '.join(missing)}",
            code="missing_member",
            where=where,
            members=missing,
        )
    if unknown:
        raise DocumentError(
            f"{where} has unknown member(s): {', '.join(unknown)}",
            code="unknown_member",
            where=where,
            members=unknown,
        )
    for name, expected in spec.items():
        check_type(obj[name], expected, where=f"{where}.{name}")
    return obj


def check_type(value: Any, expected: MemberType, *, where: str) -> None:
    """Refuse ``value`` unless it is of ``expected``; a bool is never an int here."""
    allowed = expected if isinstance(expected, tuple) else (expected,)
    if isinstance(value, bool) and bool not in allowed:
        raise DocumentError(f"{where} must not be a boolean", code="wrong_type", where=where)
    if not isinstance(value, allowed):
        names = " or ".join("null" if t is type(None) else t.__name__ for t in allowed)
        raise DocumentError(
            f"{where} must be {names}, not {type(value).__name__}", code="wrong_type", where=where
        )


def non_negative(value: int, *, where: str) -> int:
    """Refuse a negative count."""
    if value < 0:
        raise DocumentError(f"{where} must not be negative", code="invalid_counter", where=where)
    return value
