"""The value checks the intent and the record share, each with its stable error code.

Every check returns the value it accepted or raises :class:`DocumentError` naming
``where`` (the member's dotted path in the document).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from dpone.contracts.fields import DocumentError, MemberType

# Counters are declared as int-or-bool so that :func:`check_counter` (not ``members``)
# owns the refusal of a boolean and reports it as ``invalid_counter``.
COUNTER: MemberType = (int, bool)
NULLABLE_TEXT: MemberType = (str, type(None))
NULLABLE_COUNTER: MemberType = (int, bool, type(None))
OBJECT_OR_NULL: MemberType = (dict, type(None))

_SHA256 = re.compile(r"[0-9a-f]{64}")
_CONTENT_DIGEST = re.compile(r"[0-9a-f]{32}")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_NIL_UUID = "00000000-0000-0000-0000-000000000000"
_TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?(Z|\+00:00)")


def check_header(
    doc: Mapping[str, Any], version_key: str, kind: str, version: int, *, where: str
) -> None:
    """Refuse (``unsupported_version``) a document of another kind or version."""
    if doc["kind"] != kind or isinstance(doc[version_key], bool) or doc[version_key] != version:
        raise DocumentError(
            f"{where} is not a {kind} version {version} document",
            code="unsupported_version",
            where=where,
        )


def check_counter(value: Any, *, where: str) -> int:
    """A non-negative integer, never a boolean (``invalid_counter``)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DocumentError(
            f"{where} must be a non-negative integer, not {value!r}",
            code="invalid_counter",
            where=where,
        )
    return value


def check_text(value: str, *, where: str) -> str:
    """A non-empty string (``invalid_document``)."""
    if not value:
        raise DocumentError(f"{where} must not be empty", code="invalid_document", where=where)
    return value


def check_sha256(value: str, *, where: str) -> str:
    """64 lowercase hex digits (``invalid_digest``)."""
    if _SHA256.fullmatch(value) is None:
        raise DocumentError(
            f"{where} must be 64 lowercase hex digits", code="invalid_digest", where=where
        )
    return value


def check_content_digest(value: str, *, where: str) -> str:
    """An order-independent content digest: 32 lowercase hex digits (``invalid_digest``)."""
    if _CONTENT_DIGEST.fullmatch(value) is None:
        raise DocumentError(
            f"{where} must be 32 lowercase hex digits", code="invalid_digest", where=where
        )
    return value


def check_uuid(value: str, *, where: str) -> str:
    """A lowercase, non-nil UUID (``invalid_uuid``)."""
    # A Nil UUID is what a non-Atomic database shows: it identifies nothing.
    if _UUID.fullmatch(value) is None or value == _NIL_UUID:
        raise DocumentError(
            f"{where} must be a lowercase, non-nil UUID", code="invalid_uuid", where=where
        )
    return value


def check_timestamp(value: str, *, where: str) -> str:
    """A UTC ISO 8601 time that is also a real date and time (``invalid_timestamp``)."""
    valid = _TIMESTAMP.fullmatch(value) is not None
    if valid:
        try:
            datetime.fromisoformat(value)
        except ValueError:
            valid = False
    if not valid:
        raise DocumentError(
            f"{where} must be a UTC ISO 8601 time, not {value!r}",
            code="invalid_timestamp",
            where=where,
        )
    return value
