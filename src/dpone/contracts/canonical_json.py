"""Canonical JSON: the one encoding of every document dpone writes.

UTF-8 without BOM, keys sorted by code point, no insignificant whitespace, no
floating-point numbers, one spelling of every string and integer (the rules are in
``docs/canonical-json.md``). :func:`dumps` writes it, and :func:`loads` accepts exactly
the bytes ``dumps`` would produce for what it parsed: duplicate members, floats, NaN,
BOMs, whitespace and escapes in other spellings are all refused.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from dpone.errors import FormatError

JsonValue = Any


class CanonicalJsonError(FormatError):
    """Bytes or values that are not canonical JSON."""

    code = "noncanonical_json"


def dumps(value: JsonValue) -> bytes:
    """Encode ``value`` to its canonical UTF-8 bytes."""
    if not _plain(value):
        _check_value(value, "$")  # says what is wrong, and where
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8")


def sha256_hex(value: JsonValue) -> str:
    """SHA-256 (lowercase hex) of the canonical bytes of ``value``."""
    return hashlib.sha256(dumps(value)).hexdigest()


def loads(data: bytes, *, what: str = "document", canonical: bool = True) -> JsonValue:
    """Parse canonical JSON bytes; refuse anything that is not exactly canonical.

    With ``canonical=False`` (for hand-written input such as a schema file) layout and
    member order are free, but duplicates, floats and non-UTF-8 are still refused.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CanonicalJsonError(
            f"{what} is not UTF-8 (byte offset {exc.start})", offset=exc.start
        ) from exc
    try:
        value = json.loads(
            text,
            object_pairs_hook=_unique_members,
            parse_float=_refuse_float,
            parse_constant=_refuse_constant,
        )
    except CanonicalJsonError:
        raise
    except json.JSONDecodeError as exc:
        raise CanonicalJsonError(
            f"{what} is not JSON: {exc.msg} at character {exc.pos}", position=exc.pos
        ) from exc
    if not canonical:
        return value
    try:
        again = dumps(value)
    except CanonicalJsonError as exc:
        raise CanonicalJsonError(f"{what}: {exc.message}") from exc
    if again != data:
        first = next(
            (i for i, (a, b) in enumerate(zip(again, data, strict=False)) if a != b),
            min(len(again), len(data)),
        )
        raise CanonicalJsonError(
            f"{what} is valid JSON but not canonical (first difference at byte {first})",
            offset=first,
        )
    return value


def _unique_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise CanonicalJsonError(
                f"duplicate member {key!r}", code="duplicate_member", member=key
            )
        out[key] = value
    return out


def _refuse_float(text: str) -> Any:
    raise CanonicalJsonError(f"number {text} is not an integer", code="float_not_allowed")


def _refuse_constant(text: str) -> Any:
    raise CanonicalJsonError(f"{text} is not allowed", code="float_not_allowed")


def _plain(value: JsonValue) -> bool:
    """Whether ``value`` is all JSON values and encodable strings: what
    :func:`_check_value` accepts, found without building a path for each member (every
    document dpone reads is encoded again to prove it canonical)."""
    if value is None or isinstance(value, bool | int):
        return True
    if isinstance(value, str):
        return value.isascii() or _encodes(value)
    if isinstance(value, list | tuple):
        return all(_plain(item) for item in value)
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str) or not (key.isascii() or _encodes(key)):
                return False
            if not _plain(item):
                return False
        return True
    return False  # a float or another type: refused, with its path, by _check_value


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_value(value: JsonValue, where: str) -> None:
    if value is None or isinstance(value, bool | int):
        return
    if isinstance(value, str):
        _check_text(value, where)
    elif isinstance(value, float):
        raise CanonicalJsonError(
            f"{where}: floats are not allowed in canonical JSON", code="float_not_allowed"
        )
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_value(item, f"{where}[{i}]")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise CanonicalJsonError(f"{where}: member name {key!r} is not a string")
            _check_text(key, where)
            _check_value(item, f"{where}.{key}")
    else:
        raise CanonicalJsonError(f"{where}: {type(value).__name__} is not a JSON value")


def _check_text(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise CanonicalJsonError(
            f"{where}: string holds a lone surrogate at index {exc.start}", code="lone_surrogate"
        ) from exc
