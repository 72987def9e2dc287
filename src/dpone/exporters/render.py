"""Rendering of driver values to the canonical cells the type policy expects.

Shared by every source (SQLite, SQL Server): the Python value a driver returns for a
column of a given SQL Server type becomes ``None``, ``str`` (text or canonical text)
or ``bytes``. Anything that cannot be rendered exactly is refused with the column.
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
import uuid
from collections.abc import Callable

from dpone.connectors.bulk_text_codec import Cell, CodecColumn, ColumnKind, field_encoders
from dpone.errors import PolicyError
from dpone.typepolicy.converters import is_binary32, shortest_float32
from dpone.typepolicy.policy import BINARY_TYPES, TEXT_TYPES
from dpone.typepolicy.source_types import SourceType

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


def _integer(value: object) -> Cell:
    if type(value) is int:  # the common case, first
        return str(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _refuse(value, "an integer")
    return str(value)


def _bit(value: object) -> Cell:
    if value in (0, 1) and isinstance(value, bool | int):
        return "1" if value else "0"
    raise _refuse(value, "a bit")


def _decimal(value: object) -> Cell:
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


def _float64(value: object) -> Cell:
    if isinstance(value, int) and not isinstance(value, bool) and float(value) == value:
        return repr(float(value))
    if isinstance(value, float):
        return repr(value)
    raise _refuse(value, "a float")


def _float32(value: object) -> Cell:
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


_datetime2, _datetime3, _smalldatetime = _datetime(7), _datetime(3), _datetime(0)


def _datetimeoffset(value: object) -> Cell:
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


def _date(value: object) -> Cell:
    if isinstance(value, str):
        return value
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return f"{value.year:04d}-{value.month:02d}-{value.day:02d}"
    raise _refuse(value, "a date")


def _time(value: object) -> Cell:
    if isinstance(value, str):
        return value
    if isinstance(value, dt.time) and value.tzinfo is None:
        return value.strftime("%H:%M:%S") + _fraction(value, 7)
    raise _refuse(value, "a time")


# ``str(uuid.UUID(text))`` is ``text`` itself for this form, and ``text.lower()`` for
# the same form in any case.
_CANONICAL_UUID = re.compile("[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_ANY_CASE_UUID = re.compile(_CANONICAL_UUID.pattern, re.IGNORECASE)


def _uuid(value: object) -> Cell:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, str):
        if _CANONICAL_UUID.fullmatch(value):
            return value
        if _ANY_CASE_UUID.fullmatch(value):
            return value.lower()
        try:
            return str(uuid.UUID(value))
        except ValueError as exc:
            raise _refuse(value, "a GUID") from exc
    raise _refuse(value, "a GUID")


def _text(value: object) -> Cell:
    if isinstance(value, str):
        return value
    raise _refuse(value, "text")


def _binary(value: object) -> Cell:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise _refuse(value, "binary")


def renderer_for(st: SourceType) -> Renderer:
    """The renderer of one SQL Server type (the type policy decides acceptance)."""
    name = st.name
    if name in ("tinyint", "smallint", "int", "bigint"):
        return _integer
    if name == "bit":
        return _bit
    if name in ("decimal", "numeric", "money", "smallmoney"):
        return _decimal
    if name == "real" or (name == "float" and st.params and int(st.params[0]) <= 24):
        return _float32
    if name == "float":
        return _float64
    if name == "date":
        return _date
    if name == "datetime2":
        return _datetime2
    if name == "datetime":
        return _datetime3
    if name == "smalldatetime":
        return _smalldatetime
    if name == "datetimeoffset":
        return _datetimeoffset
    if name == "time":
        return _time
    if name == "uniqueidentifier":
        return _uuid
    if name in TEXT_TYPES:
        return _text
    if name in BINARY_TYPES or name in ("rowversion", "timestamp"):
        return _binary
    raise RenderError(f"no renderer for SQL Server type {st}", code="unsupported_type")


# What each renderer renders, by name: how the compiled renderer
# (dpone.exporters.native_render) chooses the rules of a column.
FAMILIES: dict[Renderer, str] = {
    _integer: "integer",
    _bit: "bit",
    _decimal: "decimal",
    _float64: "float64",
    _float32: "float32",
    _date: "date",
    _datetime2: "datetime7",
    _datetime3: "datetime3",
    _smalldatetime: "datetime0",
    _datetimeoffset: "datetimeoffset",
    _time: "time",
    _uuid: "uuid",
    _text: "text",
    _binary: "binary",
}


def _int_field(value: object) -> str:
    if type(value) is not int:
        raise TypeError
    return str(value)  # digits and a sign: nothing the codec escapes or refuses


def _float64_field(value: object) -> str:
    if type(value) is not float:
        raise TypeError
    return repr(value)  # as _float64 renders it; no character the codec escapes or refuses


def _uuid_field(value: object) -> str:
    if type(value) is not str:
        raise TypeError
    if _CANONICAL_UUID.fullmatch(value):
        return value
    if _ANY_CASE_UUID.fullmatch(value):
        return value.lower()  # as _uuid renders it
    raise TypeError


def field_for(st: SourceType, column: CodecColumn) -> Callable[[object], str]:
    """A driver value's field text in one step, for the common values of ``st``.

    For every value it takes it returns exactly what :func:`render_row` and the
    codec's ``encode_record`` make of it; any other value raises (any exception), and
    the caller renders that row again cell by cell, which names what is wrong.
    """
    render = renderer_for(st)
    encode = field_encoders([column])[0]
    if column.kind is not ColumnKind.RAW and render in (_text, _binary):
        return encode  # the renderer hands str or bytes through; the encoder checks the type
    fused: dict[Renderer, Callable[[object], str]] = {
        _integer: _int_field,
        _float64: _float64_field,
        _uuid: _uuid_field,
    }
    direct = fused.get(render)
    if direct is not None:
        return direct

    def both(value: object) -> str:
        cell = render(value)
        if cell is None:
            raise TypeError
        return encode(cell)

    return both


def render_row(
    renderers: list[Renderer], names: list[str], row: tuple[object, ...], *, record: int
) -> list[Cell]:
    """Render driver row number ``record`` (1-based); NULL stays None.

    Errors name the record and the column, never the value (it may be confidential).
    """
    try:  # the common case in one pass; a failure is rendered again cell by cell to name it
        return [
            None if value is None else render(value)
            for render, value in zip(renderers, row, strict=True)
        ]
    except (RenderError, ArithmeticError, ValueError):
        pass
    cells: list[Cell] = []
    for render, name, value in zip(renderers, names, row, strict=True):
        if value is None:
            cells.append(None)
            continue
        try:
            cells.append(render(value))
        except (RenderError, ArithmeticError, ValueError) as exc:
            # Only our own reasons are known to be free of the value's text.
            reason = (
                exc.message
                if isinstance(exc, RenderError)
                else (f"cannot render this {type(value).__name__} value")
            )
            raise RenderError(
                f"record {record}, column {name!r}: {reason}",
                code="value_not_renderable",
                record=record,
                column=name,
            ) from exc
    return cells
