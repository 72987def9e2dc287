"""The renderers of driver values: one per way a driver hands a value of a type family.

Each takes the Python value a driver returns for a column and gives the canonical
cell the type policy expects (``str`` or ``bytes``), or raises :class:`RenderError`
naming what it cannot render, never the value. The registry
(:mod:`dpone.typepolicy.registry`) pairs each declared type with its renderer;
``dpone.exporters.render`` renders rows with them.
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
import uuid
from collections.abc import Callable

from dpone.connectors.bulk_text_codec import Cell
from dpone.errors import PolicyError
from dpone.typepolicy.converters import is_binary32, shortest_float32

Renderer = Callable[[object], Cell]

# SQLite keeps a REAL in a NUMERIC column only when 15 significant digits round-trip.
_REVERSIBLE_DIGITS = 15
# A float's shortest text without an exponent (repr writes one only for very large or
# very small magnitudes).
_PLAIN_FLOAT = re.compile(r"-?[0-9]+\.[0-9]+")


class RenderError(PolicyError):
    """A driver value that has no exact canonical text for its column's type."""

    code = "value_not_renderable"


def _refuse(value: object, what: str) -> RenderError:
    return RenderError(f"cannot render {type(value).__name__} as {what}")


def render_integer(value: object) -> Cell:
    """An integer (never a bool) as its decimal text."""
    if type(value) is int:  # the common case, first
        return str(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _refuse(value, "an integer")
    return str(value)


def render_bit(value: object) -> Cell:
    """0, 1, False or True as ``0`` or ``1``."""
    if value in (0, 1) and isinstance(value, bool | int):
        return "1" if value else "0"
    raise _refuse(value, "a bit")


def render_decimal(value: object) -> Cell:
    """An exact decimal (Decimal, int, or a float whose 15 digits round-trip) as plain text."""
    if isinstance(value, bool):
        raise _refuse(value, "a decimal")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        text = repr(value)
        if _PLAIN_FLOAT.fullmatch(text):
            # The common float, without building a Decimal: its shortest text is already
            # the plain decimal text format(Decimal(text), "f") gives; the significant
            # digits are those after any leading zeros (at least one).
            digits = text.replace("-", "").replace(".", "").lstrip("0") or "0"
            if len(digits) > _REVERSIBLE_DIGITS:
                raise _refuse(value, "an exact decimal (binary float with too many digits)")
            return text[1:] if text.startswith("-") and not value else text  # no negative zero
        if len(decimal.Decimal(text).as_tuple().digits) > _REVERSIBLE_DIGITS:
            raise _refuse(value, "an exact decimal (binary float with too many digits)")
        value = decimal.Decimal(text)
    if isinstance(value, str):
        value = decimal.Decimal(value)
    if isinstance(value, decimal.Decimal) and value.is_finite():
        text = format(value, "f")
        return text[1:] if text.startswith("-") and not value else text  # no negative zero
    raise _refuse(value, "a decimal")


def render_float64(value: object) -> Cell:
    """A binary64 (or an int it holds exactly) as its shortest round-trip text."""
    if isinstance(value, int) and not isinstance(value, bool) and float(value) == value:
        return repr(float(value))
    if isinstance(value, float):
        return repr(value)
    raise _refuse(value, "a float")


def render_float32(value: object) -> Cell:
    """A binary64 that is exactly a binary32 value as its shortest float32 text."""
    if isinstance(value, int) and not isinstance(value, bool):
        if float(value) != value:
            raise _refuse(value, "a real (the integer is not exactly a binary32 value)")
        value = float(value)
    if isinstance(value, float):
        # A driver hands binary64; only a value that widens back unchanged from binary32
        # is a real. The shortest text of the nearest binary32 would round silently.
        if not is_binary32(value):
            raise _refuse(value, "a real (not exactly a binary32 value; declare float(53))")
        return shortest_float32(value)
    raise _refuse(value, "a real")


def _fraction(t: dt.datetime | dt.time, digits: int) -> str:
    # Python stops at microseconds; a 7th digit from a driver value is always 0.
    text = f"{t.microsecond:06d}0"[:digits]
    return f".{text}" if digits else ""


def _datetime(digits: int) -> Renderer:
    def render(value: object) -> Cell:
        if isinstance(value, str):
            return value
        if isinstance(value, dt.datetime) and value.tzinfo is None:
            if digits == 3 and value.microsecond % 1000:
                return value.strftime("%Y-%m-%d %H:%M:%S") + _fraction(value, 7)
            return value.strftime("%Y-%m-%d %H:%M:%S") + _fraction(value, digits)
        raise _refuse(value, "a datetime without time zone")

    return render


# A naive datetime (or its text) with 7, 3 (datetime) or 0 (smalldatetime) fractional
# digits.
render_datetime7, render_datetime3, render_datetime0 = _datetime(7), _datetime(3), _datetime(0)


def render_datetimeoffset(value: object) -> Cell:
    """An aware datetime (or its text) as ``YYYY-MM-DD HH:MM:SS.fffffff +HH:MM``."""
    if isinstance(value, str):
        return value
    if isinstance(value, dt.datetime) and value.utcoffset() is not None:
        offset = value.utcoffset()
        assert offset is not None
        minutes = int(offset.total_seconds()) // 60
        sign = "-" if minutes < 0 else "+"
        hh, mm = divmod(abs(minutes), 60)
        return (
            value.strftime("%Y-%m-%d %H:%M:%S") + _fraction(value, 7) + f" {sign}{hh:02d}:{mm:02d}"
        )
    raise _refuse(value, "a datetimeoffset")


def render_date(value: object) -> Cell:
    """A date (or its text) as ``YYYY-MM-DD``."""
    if isinstance(value, str):
        return value
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return f"{value.year:04d}-{value.month:02d}-{value.day:02d}"
    raise _refuse(value, "a date")


def render_time(value: object) -> Cell:
    """A naive time (or its text) as ``HH:MM:SS.fffffff``."""
    if isinstance(value, str):
        return value
    if isinstance(value, dt.time) and value.tzinfo is None:
        return value.strftime("%H:%M:%S") + _fraction(value, 7)
    raise _refuse(value, "a time")


# ``str(uuid.UUID(text))`` is ``text`` itself for this form, and ``text.lower()`` for
# the same form in any case.
CANONICAL_UUID = re.compile("[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
ANY_CASE_UUID = re.compile(CANONICAL_UUID.pattern, re.IGNORECASE)


def render_uuid(value: object) -> Cell:
    """A UUID, or its text in any form :class:`uuid.UUID` reads, as lowercase 8-4-4-4-12."""
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, str):
        if CANONICAL_UUID.fullmatch(value):
            return value
        if ANY_CASE_UUID.fullmatch(value):
            return value.lower()
        try:
            return str(uuid.UUID(value))
        except ValueError as exc:
            raise _refuse(value, "a GUID") from exc
    raise _refuse(value, "a GUID")


def render_text(value: object) -> Cell:
    """Text as itself."""
    if isinstance(value, str):
        return value
    raise _refuse(value, "text")


def render_binary(value: object) -> Cell:
    """Bytes (or a bytearray or memoryview) as bytes."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise _refuse(value, "binary")
