"""RowBinary wire primitives (ClickHouse's row-oriented binary format).

Integers and floats little-endian; String is an unsigned LEB128 byte length followed
by the bytes; Nullable is one flag byte (1 = NULL, nothing follows; 0 = value follows).
"""

from __future__ import annotations

NULL_FLAG = b"\x01"
VALUE_FLAG = b"\x00"


def leb128(n: int) -> bytes:
    """Unsigned LEB128 encoding of ``n`` (``n >= 0``)."""
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def string(data: bytes) -> bytes:
    """A RowBinary String: LEB128 length then the bytes."""
    return leb128(len(data)) + data
