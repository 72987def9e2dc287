"""An independent decoder of the bulk text format, written from the specification.

Imports nothing from dpone. It walks the bytes one at a time with an explicit state
machine, unlike the production reader, so the two share no mistakes by construction.
"""

from __future__ import annotations

ESC = 0x1D
TAB = 0x09
LF = 0x0A
LETTERS = {
    ord("P"): "\x1d",
    ord("T"): "\t",
    ord("R"): "\r",
    ord("N"): "\n",
    ord("U"): "\x1f",
    ord("S"): "\x1e",
}


class OracleError(Exception):
    pass


def split_records(data: bytes) -> list[list[bytes]]:
    if data and data[-1] != LF:
        raise OracleError("no final LF")
    records: list[list[bytes]] = []
    field = bytearray()
    fields: list[bytes] = []
    for byte in data:
        if byte == LF:
            fields.append(bytes(field))
            records.append(fields)
            fields, field = [], bytearray()
        elif byte == TAB:
            fields.append(bytes(field))
            field = bytearray()
        else:
            field.append(byte)
    return records


def decode_text(field: bytes) -> str | None:
    if field == b"":
        return None
    if field == b"\x1dE":
        return ""
    out = []
    i = 0
    while i < len(field):
        b = field[i]
        if b == ESC:
            if i + 1 >= len(field) or field[i + 1] not in LETTERS:
                raise OracleError("bad escape")
            out.append(LETTERS[field[i + 1]].encode())
            i += 2
            continue
        if b in (0x0D, 0x1E, 0x1F):
            raise OracleError("raw reserved byte")
        out.append(bytes([b]))
        i += 1
    try:
        return b"".join(out).decode("utf-8")  # strict
    except UnicodeDecodeError as exc:
        raise OracleError("utf-8") from exc


def decode_binary(field: bytes) -> bytes | None:
    if field == b"":
        return None
    if field == b"\x1dE":
        return b""
    # States: 0 = expecting a pair's first digit, 1 = its second, 2 = after a pair.
    out = bytearray()
    state = 0
    high = ""
    for ch in field.decode("latin-1"):
        if ch in "0123456789abcdefABCDEF" and state in (0, 2):
            high, state = ch, 1
        elif ch in "0123456789abcdefABCDEF" and state == 1:
            out.append(int(high + ch, 16))
            state = 2
        elif ch in " \x0b\x0c\r" and state == 2:
            state = 3
        elif ch in " \x0b\x0c\r" and state == 3:
            pass
        elif ch in "0123456789abcdefABCDEF" and state == 3:
            high, state = ch, 1
        else:
            raise OracleError("hex")
    if state != 2:
        raise OracleError("hex ends badly")
    return bytes(out)


def decode(data: bytes, kinds: list[str]) -> list[tuple[object, ...]]:
    """Decode ``data`` whose columns have kinds 'text', 'binary' or 'raw'."""
    rows = []
    for fields in split_records(data):
        if len(fields) != len(kinds):
            raise OracleError("width")
        row: list[object] = []
        for kind, field in zip(kinds, fields, strict=True):
            if kind == "binary":
                row.append(decode_binary(field))
            elif kind == "text":
                row.append(decode_text(field))
            elif any(b in field for b in (0x0D, 0x1D, 0x1E, 0x1F)):
                raise OracleError("raw columns are never escaped")
            else:
                row.append(None if field == b"" else field.decode("utf-8"))
        rows.append(tuple(row))
    return rows
