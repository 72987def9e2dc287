"""An independent RowBinary decoder for the types dpone writes. Imports nothing from dpone.

Decodes to plain Python values: ints, Decimal, float, datetime.date, ISO-like strings
for DateTime64/Time64 (exact tick arithmetic), uuid.UUID, bytes for String and
FixedString, tuples for Tuple, None for NULL.
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
import struct
import uuid
from typing import Any


class Cursor:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ValueError("truncated RowBinary")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def uleb(self) -> int:
        shift = result = 0
        while True:
            byte = self.take(1)[0]
            result |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return result


def _ticks_to_text(ticks: int, precision: int) -> str:
    seconds, frac = divmod(ticks, 10**precision)
    stamp = dt.datetime(1970, 1, 1) + dt.timedelta(seconds=seconds)
    text = stamp.strftime("%Y-%m-%d %H:%M:%S")
    return text + (f".{frac:0{precision}d}" if precision else "")


def decode_value(cur: Cursor, ch_type: str) -> Any:
    t = ch_type.strip()
    if m := re.fullmatch(r"Nullable\((.*)\)", t):
        return None if cur.take(1) == b"\x01" else decode_value(cur, m[1])
    if m := re.fullmatch(r"LowCardinality\((.*)\)", t):
        return decode_value(cur, m[1])
    if m := re.fullmatch(r"(U?)Int(8|16|32|64|128|256)", t):
        return int.from_bytes(cur.take(int(m[2]) // 8), "little", signed=not m[1])
    if t == "Bool":
        b = cur.take(1)[0]
        assert b in (0, 1)
        return bool(b)
    if m := re.fullmatch(r"Decimal\((\d+), (\d+)\)", t):
        p, s = int(m[1]), int(m[2])
        width = 4 if p <= 9 else 8 if p <= 18 else 16 if p <= 38 else 32
        raw = int.from_bytes(cur.take(width), "little", signed=True)
        return decimal.Decimal(raw).scaleb(-s, context=decimal.Context(prec=100))
    if t == "Float64":
        return struct.unpack("<d", cur.take(8))[0]
    if t == "Float32":
        return struct.unpack("<f", cur.take(4))[0]
    if t == "Date32":
        return dt.date(1970, 1, 1) + dt.timedelta(
            days=int.from_bytes(cur.take(4), "little", signed=True)
        )
    if m := re.fullmatch(r"DateTime64\((\d), 'UTC'\)", t):
        return _ticks_to_text(int.from_bytes(cur.take(8), "little", signed=True), int(m[1]))
    if m := re.fullmatch(r"Time64\((\d)\)", t):
        p = int(m[1])
        ticks = int.from_bytes(cur.take(8), "little", signed=True)
        seconds, frac = divmod(ticks, 10**p)
        hh, rest = divmod(seconds, 3600)
        return f"{hh:02d}:{rest // 60:02d}:{rest % 60:02d}" + (f".{frac:0{p}d}" if p else "")
    if m := re.fullmatch(r"Tuple\(utc DateTime64\((\d), 'UTC'\), offset_minutes Int16\)", t):
        instant = _ticks_to_text(int.from_bytes(cur.take(8), "little", signed=True), int(m[1]))
        return (instant, int.from_bytes(cur.take(2), "little", signed=True))
    if t == "UUID":
        high = int.from_bytes(cur.take(8), "little")
        low = int.from_bytes(cur.take(8), "little")
        return uuid.UUID(int=(high << 64) | low)
    if t == "String":
        return cur.take(cur.uleb())
    if m := re.fullmatch(r"FixedString\((\d+)\)", t):
        return cur.take(int(m[1]))
    raise NotImplementedError(t)


def decode_rows(data: bytes, types: list[str], rows: int | None = None) -> list[tuple[Any, ...]]:
    """Decode ``data`` as rows of ``types``: exactly ``rows`` of them when given.

    Without ``rows`` any whole number of rows is accepted, so a writer that emits an
    extra row goes unnoticed: pass the count the writer claims. With it, bytes after
    the last expected row (trailing rows, whole or partial) and a short input are
    refused with ``ValueError``.
    """
    cur = Cursor(data)
    decoded: list[tuple[Any, ...]] = []
    while cur.pos < len(data) if rows is None else len(decoded) < rows:
        decoded.append(tuple(decode_value(cur, t) for t in types))
    if cur.pos != len(data):
        raise ValueError(
            f"{len(data) - cur.pos} trailing bytes after the {len(decoded)} expected rows"
        )
    return decoded
