"""Exact conversion of one canonical text (or bytes) value to RowBinary.

One converter per ClickHouse type family. A converter either returns the exact bytes
or raises :class:`Refused` with a reason; it never rounds, clamps or wraps. The caller
adds the position (record, column) to the error it reports; a reason never quotes
the value.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Callable
from datetime import date

from dpone.connectors.rowbinary import leb128

Encoder = Callable[[str | bytes], bytes]

EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
# ClickHouse's documented ranges for Date32 and DateTime64.
MIN_DAY = date(1900, 1, 1).toordinal() - EPOCH_ORDINAL
MAX_DAY = date(2299, 12, 31).toordinal() - EPOCH_ORDINAL
SECONDS_PER_DAY = 86400


class Refused(Exception):
    """A value that the policy does not accept, with the reason.

    ``reason`` says what is wrong with the value without quoting it ("is not a
    canonical integer"): a value may be large or private, so messages name where it
    is (the caller adds the record and column), never what it is.
    """

    def __init__(self, reason: str, code: str = "value_not_representable") -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


def _text(value: str | bytes) -> str:
    if not isinstance(value, str):
        raise Refused("is bytes, not text", code="invalid_value")
    return value


# ----------------------------------------------------------------------------- integers

_INT = re.compile(r"-?(?:0|[1-9][0-9]*)")
_INT_FORMATS = {8: "b", 16: "h", 32: "i", 64: "q"}


def integer(bits: int, signed: bool) -> Encoder:
    """Int8..Int64 / UInt8..UInt64 (and Bool as UInt8 0/1 via :func:`boolean`)."""
    low, high = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    fmt = "<" + (_INT_FORMATS[bits] if signed else _INT_FORMATS[bits].upper())
    pack = struct.Struct(fmt).pack

    def encode(value: str | bytes) -> bytes:
        text = _text(value)
        if _INT.fullmatch(text) is None or text == "-0":
            raise Refused("is not a canonical integer", code="invalid_value")
        # Checked before int(): Python refuses to parse more than 4300 digits, and a
        # number longer than UInt64's 20 digits is out of range anyway.
        if len(text) > 21:
            raise Refused(f"is outside [{low}, {high}]")
        number = int(text)
        if not low <= number <= high:
            raise Refused(f"is outside [{low}, {high}]")
        return pack(number)

    return encode


def boolean() -> Encoder:
    """SQL Server bit as ClickHouse Bool: exactly ``0`` or ``1``."""

    def encode(value: str | bytes) -> bytes:
        text = _text(value)
        if text == "0":
            return b"\x00"
        if text == "1":
            return b"\x01"
        raise Refused("is not a bit (0 or 1)", code="invalid_value")

    return encode


# ----------------------------------------------------------------------------- decimals

_DECIMAL = re.compile(r"(-?)(0|[1-9][0-9]*)(?:\.([0-9]+))?")


def decimal_width(precision: int) -> int:
    """Bytes of the scaled integer for a Decimal of ``precision`` digits."""
    if precision <= 9:
        return 4
    if precision <= 18:
        return 8
    if precision <= 38:
        return 16
    return 32


def decimal(precision: int, scale: int) -> Encoder:
    """Decimal(P, S): the scaled little-endian integer; digits that do not fit are refused."""
    width = decimal_width(precision)
    integer_digits = precision - scale

    def encode(value: str | bytes) -> bytes:
        text = _text(value)
        match = _DECIMAL.fullmatch(text)
        if match is None:
            raise Refused("is not a canonical decimal", code="invalid_value")
        sign, whole, fraction = match.group(1), match.group(2), match.group(3) or ""
        if len(fraction) > scale:
            if fraction[scale:].strip("0"):
                raise Refused(f"has more than {scale} fractional digits (no rounding)")
            fraction = fraction[:scale]
        if whole != "0" and len(whole) > integer_digits:
            raise Refused(f"has more than {integer_digits} integer digits")
        scaled = int(whole + fraction.ljust(scale, "0"))
        if sign:
            if scaled == 0:
                raise Refused("is a negative zero", code="invalid_value")
            scaled = -scaled
        return scaled.to_bytes(width, "little", signed=True)

    return encode


# ----------------------------------------------------------------------------- floats

_FLOAT = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")
_F64 = struct.Struct("<d")
_F32 = struct.Struct("<f")


def is_binary32(value: float) -> bool:
    """True when the binary64 ``value`` is exactly a finite binary32 value (widened)."""
    if not math.isfinite(value):
        return False
    try:
        return bool(_F32.unpack(_F32.pack(value))[0] == value)
    except OverflowError:
        return False


def shortest_float32(value: float) -> str:
    """The shortest decimal text that reads back as the binary32 ``value``."""
    if value == 0:
        return "-0.0" if str(value).startswith("-") else "0.0"
    for digits in range(1, 10):
        text = f"{value:.{digits}g}"
        try:
            if _F32.unpack(_F32.pack(float(text)))[0] == value:
                return repr(float(text))
        except OverflowError:
            continue  # a short rounding of a value near the maximum overshoots it
    return repr(value)


def _finite_binary64(value: str | bytes, target: str) -> float:
    """The nearest binary64 of the text; refused unless canonical and finite.

    Beyond binary64 the text reads as infinity (which would even pack as Float32).
    """
    text = _text(value)
    if _FLOAT.fullmatch(text) is None:
        raise Refused("is not a finite decimal number", code="invalid_value")
    number = float(text)
    if number in (float("inf"), float("-inf")):
        raise Refused(f"is outside the range of {target}")
    return number


def float64() -> Encoder:
    """Float64 from decimal text (the text of a binary64 reads back exactly)."""

    def encode(value: str | bytes) -> bytes:
        return _F64.pack(_finite_binary64(value, "Float64"))

    return encode


def float32() -> Encoder:
    """Float32 from decimal text; refused unless it names one binary32 value exactly."""

    def encode(value: str | bytes) -> bytes:
        number = _finite_binary64(value, "Float32")
        try:
            packed = _F32.pack(number)
        except OverflowError as exc:
            raise Refused("is outside the range of Float32") from exc
        single = _F32.unpack(packed)[0]
        if single != number and float(shortest_float32(single)) != number:
            raise Refused("is not exactly one Float32 value (no rounding)")
        return packed

    return encode


# ----------------------------------------------------------------------------- time

_DATE = r"([0-9]{4})-([0-9]{2})-([0-9]{2})"
_CLOCK = r"([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,9}))?"
_DATE_RE = re.compile(_DATE)
_DATETIME_RE = re.compile(_DATE + " " + _CLOCK)
_TIME_RE = re.compile(_CLOCK)
_DTO_RE = re.compile(_DATE + " " + _CLOCK + r" ([+-])([0-9]{2}):([0-9]{2})")
_I16 = struct.Struct("<h")
_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")


def _day(y: str, m: str, d: str) -> int:
    try:
        day: int = date(int(y), int(m), int(d)).toordinal() - EPOCH_ORDINAL
    except ValueError as exc:
        raise Refused("is not a calendar date", code="invalid_value") from exc
    return day


def _in_range(day: int) -> None:
    if not MIN_DAY <= day <= MAX_DAY:
        raise Refused("is outside ClickHouse's range 1900-01-01 .. 2299-12-31")


def _clock_ticks(hh: str, mm: str, ss: str, frac: str | None, precision: int) -> int:
    hour, minute, second = int(hh), int(mm), int(ss)
    if hour > 23 or minute > 59 or second > 59:
        raise Refused("is not a valid time of day", code="invalid_value")
    fraction = frac or ""
    if len(fraction) > precision:
        if fraction[precision:].strip("0"):
            raise Refused(f"has more than {precision} fractional digits (no rounding)")
        fraction = fraction[:precision]
    seconds = hour * 3600 + minute * 60 + second
    scale: int = 10**precision
    return seconds * scale + int(fraction.ljust(precision, "0") or "0")


def date32() -> Encoder:
    """Date32: Int32 days since 1970-01-01, limited to 1900-01-01 .. 2299-12-31."""

    def encode(value: str | bytes) -> bytes:
        text = _text(value)
        match = _DATE_RE.fullmatch(text)
        if match is None:
            raise Refused("is not a date YYYY-MM-DD", code="invalid_value")
        day = _day(*match.groups())
        _in_range(day)
        return _I32.pack(day)

    return encode


def datetime64(precision: int, *, whole_minutes: bool = False) -> Encoder:
    """DateTime64(P, 'UTC'): Int64 ticks of 10^-P s since the epoch, 1900..2299."""

    def encode(value: str | bytes) -> bytes:
        text = _text(value)
        match = _DATETIME_RE.fullmatch(text)
        if match is None:
            raise Refused("is not a datetime YYYY-MM-DD HH:MM:SS[.fraction]", code="invalid_value")
        y, mo, d, hh, mi, ss, frac = match.groups()
        if whole_minutes and (ss != "00" or (frac or "").strip("0")):
            raise Refused("is not a whole minute (smalldatetime)", code="invalid_value")
        day = _day(y, mo, d)
        _in_range(day)
        scale: int = 10**precision
        ticks = day * SECONDS_PER_DAY * scale + _clock_ticks(hh, mi, ss, frac, precision)
        return _I64.pack(ticks)

    return encode


def time64(precision: int) -> Encoder:
    """Time64(P): Int64 ticks of 10^-P s since midnight (00:00:00 .. 23:59:59.9999999)."""

    def encode(value: str | bytes) -> bytes:
        text = _text(value)
        match = _TIME_RE.fullmatch(text)
        if match is None:
            raise Refused("is not a time HH:MM:SS[.fraction]", code="invalid_value")
        hh, mm, ss, frac = match.groups()
        return _I64.pack(_clock_ticks(hh, mm, ss, frac, precision))

    return encode


def datetimeoffset(precision: int) -> Encoder:
    """Tuple(DateTime64(P, 'UTC'), Int16): the UTC instant and the offset in minutes."""

    def encode(value: str | bytes) -> bytes:
        text = _text(value)
        match = _DTO_RE.fullmatch(text)
        if match is None:
            raise Refused("is not YYYY-MM-DD HH:MM:SS[.fraction] +HH:MM", code="invalid_value")
        y, mo, d, hh, mi, ss, frac, sign, oh, om = match.groups()
        if int(om) > 59 or int(oh) * 60 + int(om) > 14 * 60:
            raise Refused("has an offset outside -14:00 .. +14:00", code="invalid_value")
        offset = (int(oh) * 60 + int(om)) * (-1 if sign == "-" else 1)
        day = _day(y, mo, d)
        scale: int = 10**precision
        local = day * SECONDS_PER_DAY * scale + _clock_ticks(hh, mi, ss, frac, precision)
        utc = local - offset * 60 * scale
        if not MIN_DAY * SECONDS_PER_DAY * scale <= utc < (MAX_DAY + 1) * SECONDS_PER_DAY * scale:
            raise Refused("has a UTC instant outside 1900-01-01 .. 2299-12-31")
        return _I64.pack(utc) + _I16.pack(offset)

    return encode


# ----------------------------------------------------------------------------- others

_UUID = re.compile(r"[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}")


def uuid() -> Encoder:
    """UUID: the two 64-bit halves of the textual form, each little-endian."""

    def encode(value: str | bytes) -> bytes:
        text = _text(value)
        if _UUID.fullmatch(text) is None:
            raise Refused("is not a GUID 8-4-4-4-12", code="invalid_value")
        digits = text.replace("-", "")
        return int(digits[:16], 16).to_bytes(8, "little") + int(digits[16:], 16).to_bytes(
            8, "little"
        )

    return encode


def string() -> Encoder:
    """String from text (UTF-8) or from bytes (binary columns)."""

    def encode(value: str | bytes) -> bytes:
        data = value.encode("utf-8") if isinstance(value, str) else value
        return leb128(len(data)) + data

    return encode


def fixed_string(length: int) -> Encoder:
    """FixedString(N): exactly N bytes, never padded or cut."""

    def encode(value: str | bytes) -> bytes:
        data = value.encode("utf-8") if isinstance(value, str) else value
        if len(data) != length:
            raise Refused(f"is {len(data)} bytes, FixedString({length}) needs exactly {length}")
        return data

    return encode
