"""The bulk text format: producer codec (encode) and streaming logical reader (decode).

Codec ``dpone.mssql-delimited.bulk-text`` version 2, specified in
``docs/bulk-text-format.md``. In short: every record ends in LF; fields split on TAB;
a zero-length field is NULL; U+001D starts a two-character escape (``E`` alone is the
empty string; ``P`` U+001D, ``T`` TAB, ``R`` CR, ``N`` LF, ``U`` U+001F, ``S`` U+001E);
text is strict UTF-8; binary columns are hex with optional ASCII whitespace between
byte pairs. The reader is stricter than the historical producer's readers: unknown or
lone escapes, raw CR/U+001E/U+001F in text and misplaced empty markers are errors.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import BinaryIO

from dpone.errors import FormatError

CODEC_ID = "dpone.mssql-delimited.bulk-text"
CODEC_VERSION = 2

MARK = "\x1d"
EMPTY_FIELD = MARK + "E"
_DECODE = {"P": MARK, "T": "\t", "R": "\r", "N": "\n", "U": "\x1f", "S": "\x1e"}
_ENCODE = str.maketrans({v: MARK + k for k, v in _DECODE.items()})
_ENCODE_CHARS = tuple(_DECODE.values())
# Characters a text field may not hold raw (TAB and LF cannot occur inside a field).
_RAW_FORBIDDEN = re.compile("[\r\x1e\x1f]")
_ESCAPE = re.compile("\x1d(.?)", re.DOTALL)


def _unescape_one(match: re.Match[str]) -> str:
    return _DECODE[match.group(1)]  # KeyError: not one of the six, decided exactly later


_HEX_WS = b" \x0b\x0c\r"
_HEX_PAIRS = re.compile(rb"(?:[0-9A-Fa-f]{2}[ \x0b\x0c\r]*)*[0-9A-Fa-f]{2}")
READ_CHUNK_BYTES = 1 << 20

Cell = None | str | bytes


class ColumnKind(enum.Enum):
    """How a column's fields are decoded."""

    TEXT = "text"  # escaped UTF-8 text -> str
    BINARY = "binary"  # hex -> bytes
    RAW = "raw"  # canonical text of a non-text value -> str, converted later


@dataclass(frozen=True)
class CodecColumn:
    """One ordered column as the codec sees it."""

    name: str
    kind: ColumnKind


class BulkTextError(FormatError):
    """A bulk text file or value that does not follow the format.

    ``details`` name the ``record`` (1-based), ``column``, ``offset`` (byte offset in
    the file) and ``source`` where known.
    """

    code = "bulk_text_error"


# ----------------------------------------------------------------------------- encode


def encode_text(value: str) -> str:
    """The field text of a text value (never empty: ``""`` becomes the empty marker)."""
    if not value:
        return EMPTY_FIELD
    return value.translate(_ENCODE)


def encode_binary(value: bytes) -> str:
    """The field text of a binary value: lowercase hex, empty marker for no bytes."""
    return value.hex() if value else EMPTY_FIELD


_RESERVED = re.compile("[\t\n\r\x1d\x1e\x1f]")
_TEXT_RESERVED = re.compile("[" + re.escape("".join(_ENCODE_CHARS)) + "]")


def encode_raw(value: str, *, column: str = "") -> str:
    """The field text of a non-text value's canonical text, checked to be safe."""
    if not value or _RESERVED.search(value):
        raise BulkTextError(
            f"canonical text {value!r} of column {column!r} is empty or holds a reserved character",
            code="unencodable_value",
            column=column,
        )
    return value


def _fast_text(cell: object) -> str:
    if type(cell) is not str:
        raise TypeError
    if not cell:
        return EMPTY_FIELD
    # Most text holds nothing to escape; one search is much cheaper than a translate.
    return cell.translate(_ENCODE) if _TEXT_RESERVED.search(cell) else cell


def _fast_binary(cell: object) -> str:
    if type(cell) is not bytes:
        raise TypeError
    return cell.hex() if cell else EMPTY_FIELD


def _fast_raw(cell: object) -> str:
    if type(cell) is not str or not cell or _RESERVED.search(cell):
        raise TypeError
    return cell


_FAST = {ColumnKind.TEXT: _fast_text, ColumnKind.BINARY: _fast_binary, ColumnKind.RAW: _fast_raw}


def field_encoders(columns: Sequence[CodecColumn]) -> tuple[Callable[[object], str], ...]:
    """Per column, a fast encoder of the common cells (anything else raises ``TypeError``)."""
    return tuple(_FAST[c.kind] for c in columns)


def encode_fields(encoders: Sequence[Callable[[object], str]], values: Sequence[object]) -> bytes:
    """One record's bytes from per-column one-step encoders (``None`` is an empty field).

    Raises whatever an encoder raises (or ``UnicodeEncodeError``, or ``ValueError``
    for a width mismatch): a caller then takes its careful path, which names the cause.
    """
    line = "\t".join(
        [
            "" if value is None else encode(value)
            for encode, value in zip(encoders, values, strict=True)
        ]
    )
    return (line + "\n").encode("utf-8")


def encode_record(
    columns: Sequence[CodecColumn],
    cells: Sequence[Cell],
    encoders: Sequence[Callable[[object], str]] | None = None,
) -> bytes:
    """One record's bytes, LF included.

    ``encoders`` (from :func:`field_encoders`, for the same columns) take the common
    cells in one pass; on anything they do not take, the record is encoded again
    cell by cell, which names the column of what is wrong.
    """
    if encoders is not None and len(cells) == len(encoders):
        try:
            return encode_fields(encoders, cells)
        except (TypeError, UnicodeEncodeError):
            pass  # the careful path below says what and where
    if len(cells) != len(columns):
        raise BulkTextError(
            f"record has {len(cells)} cells for {len(columns)} columns",
            code="row_width_mismatch",
        )
    fields = []
    for column, cell in zip(columns, cells, strict=True):
        if cell is None:
            fields.append("")
        elif column.kind is ColumnKind.BINARY:
            if not isinstance(cell, bytes | bytearray | memoryview):
                raise _wrong_cell(column, cell)
            fields.append(encode_binary(bytes(cell)))
        elif not isinstance(cell, str):
            raise _wrong_cell(column, cell)
        elif column.kind is ColumnKind.TEXT:
            fields.append(encode_text(cell))
        else:
            fields.append(encode_raw(cell, column=column.name))
    line = "\t".join(fields) + "\n"
    try:
        return line.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BulkTextError(
            "text holds a lone surrogate, which UTF-8 cannot encode", code="unencodable_value"
        ) from exc


def _wrong_cell(column: CodecColumn, cell: object) -> BulkTextError:
    return BulkTextError(
        f"column {column.name!r} ({column.kind.value}) cannot hold a {type(cell).__name__}",
        code="unencodable_value",
        column=column.name,
    )


class BulkTextWriter:
    """Writes records to a binary stream and counts them."""

    def __init__(self, stream: BinaryIO, columns: Sequence[CodecColumn]) -> None:
        self._stream = stream
        self.columns = tuple(columns)
        self._encoders = field_encoders(self.columns)
        self.records = 0
        self.bytes = 0

    def write(self, cells: Sequence[Cell]) -> None:
        self.write_record(encode_record(self.columns, cells, self._encoders))

    def write_record(self, data: bytes) -> None:
        """Write one record already encoded for these columns (LF included)."""
        self._stream.write(data)
        self.records += 1
        self.bytes += len(data)


# ----------------------------------------------------------------------------- decode


class BulkTextReader:
    """Streams records from a bulk text file as tuples of cells.

    Cells are ``None`` (NULL), ``str`` (text, or the raw canonical text of a ``RAW``
    column) or ``bytes`` (``BINARY`` columns). Memory stays bounded by the chunk size
    plus the longest record; ``max_record_bytes`` bounds that too. ``on_chunk`` sees
    every byte read, in order, so a caller can hash the file in the same pass.
    """

    def __init__(
        self,
        stream: BinaryIO,
        columns: Sequence[CodecColumn],
        *,
        source: str | None = None,
        max_record_bytes: int | None = None,
        max_records: int | None = None,
        on_chunk: Callable[[bytes], None] | None = None,
        chunk_bytes: int = READ_CHUNK_BYTES,
    ) -> None:
        if not columns:
            raise BulkTextError("a reader needs at least one column", code="no_columns")
        self._stream = stream
        self.columns = tuple(columns)  # frozen: later changes to the caller's list do not apply
        self._kinds = tuple(c.kind for c in self.columns)
        self.source = source
        self.max_record_bytes = max_record_bytes
        self.max_records = max_records
        self._on_chunk = on_chunk
        self._chunk_bytes = chunk_bytes
        self.records = 0
        self.bytes_read = 0

    def __iter__(self) -> Iterator[tuple[Cell, ...]]:
        buffer = b""
        buffer_offset = 0  # file offset of buffer[0]
        limit = self.max_record_bytes
        while True:
            chunk = self._stream.read(self._chunk_bytes)
            if not chunk:
                break
            self.bytes_read += len(chunk)
            if self._on_chunk is not None:
                self._on_chunk(chunk)
            buffer = buffer + chunk if buffer else chunk
            lines = buffer.split(b"\n")
            buffer = lines.pop()
            for line in lines:
                yield self._record(line, buffer_offset)
                buffer_offset += len(line) + 1
            if limit is not None and len(buffer) > limit:
                raise self._error(
                    "record_too_large",
                    f"record is longer than the budget of {limit} bytes",
                    buffer_offset + limit,
                    column=None,
                )
        if buffer:
            raise self._error(
                "missing_final_lf",
                "the file does not end in LF: the last record is incomplete",
                buffer_offset + len(buffer),
                column=None,
                record=self.records + 1,
            )

    def _record(self, line: bytes, offset: int) -> tuple[Cell, ...]:
        ordinal = self.records + 1
        if self.max_records is not None and ordinal > self.max_records:
            raise self._error(
                "too_many_records",
                f"more than the budget of {self.max_records} records",
                offset,
                column=None,
                record=ordinal,
            )
        if self.max_record_bytes is not None and len(line) + 1 > self.max_record_bytes:
            raise self._error(
                "record_too_large",
                f"record of {len(line) + 1} bytes exceeds the budget of "
                f"{self.max_record_bytes} bytes",
                offset,
                column=None,
                record=ordinal,
            )
        self.records = ordinal
        fast = self._fast_record(line)
        if fast is not None:
            return fast
        fields = line.split(b"\t")
        if len(fields) != len(self.columns):
            raise self._width_error(fields, offset, ordinal)
        cells: list[Cell] = []
        field_offset = offset
        for column, field in zip(self.columns, fields, strict=True):
            cells.append(self._cell(column, field, field_offset, ordinal) if field else None)
            field_offset += len(field) + 1
        return tuple(cells)

    def _fast_record(self, line: bytes) -> tuple[Cell, ...] | None:
        """The common case in C-speed steps; None sends the record to the exact path.

        Taken only when the record is valid UTF-8, holds no CR, U+001E or U+001F, has
        the right width, every escape is one of the six and every hex field is plain
        pairs. Anything else is decided (and, if wrong, located) field by field below.
        """
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            return None
        if _RAW_FORBIDDEN.search(text) is not None:
            return None
        fields = text.split("\t")
        if len(fields) != len(self._kinds):
            return None
        cells: list[Cell] = []
        for kind, field in zip(self._kinds, fields, strict=True):
            if not field:
                cells.append(None)
            elif MARK in field:
                if field == EMPTY_FIELD and kind is not ColumnKind.RAW:
                    cells.append(b"" if kind is ColumnKind.BINARY else "")
                elif kind is ColumnKind.TEXT:
                    try:
                        cells.append(_ESCAPE.sub(_unescape_one, field))
                    except KeyError:
                        return None
                else:
                    return None
            elif kind is ColumnKind.BINARY:
                try:
                    data = bytes.fromhex(field)
                except ValueError:
                    return None
                if len(data) * 2 != len(field):
                    return None  # whitespace between pairs: checked exactly below
                cells.append(data)
            else:
                cells.append(field)
        return tuple(cells)

    def _cell(self, column: CodecColumn, field: bytes, offset: int, ordinal: int) -> Cell:
        if column.kind is ColumnKind.BINARY:
            return self._binary(column, field, offset, ordinal)
        try:
            text = field.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self._error(
                "invalid_utf8",
                f"invalid UTF-8 in column {column.name!r}",
                offset + exc.start,
                column=column.name,
                record=ordinal,
            ) from exc
        if column.kind is ColumnKind.RAW:
            if MARK in text or "\r" in text or "\x1e" in text or "\x1f" in text:
                position = min(i for i, c in enumerate(text) if c in "\x1d\r\x1e\x1f")
                raise self._error(
                    "reserved_character",
                    f"column {column.name!r} holds a reserved character "
                    f"U+{ord(text[position]):04X}; non-text values are never escaped",
                    offset + _utf8_len(text[:position]),
                    column=column.name,
                    record=ordinal,
                )
            return text
        if MARK not in text:
            bad = _RAW_FORBIDDEN.search(text)
            if bad is not None:
                raise self._raw_forbidden(column, text, bad.start(), offset, ordinal)
            return text
        return self._unescape(column, text, offset, ordinal)

    def _unescape(self, column: CodecColumn, text: str, offset: int, ordinal: int) -> str:
        if text == EMPTY_FIELD:
            return ""
        out = []
        i = 0
        n = len(text)
        while i < n:
            j = text.find(MARK, i)
            segment = text[i:] if j < 0 else text[i:j]
            bad = _RAW_FORBIDDEN.search(segment)
            if bad is not None:
                raise self._raw_forbidden(column, text, i + bad.start(), offset, ordinal)
            out.append(segment)
            if j < 0:
                break
            if j + 1 >= n:
                raise self._error(
                    "dangling_escape",
                    f"column {column.name!r} ends in a lone U+001D",
                    offset + _utf8_len(text[:j]),
                    column=column.name,
                    record=ordinal,
                )
            letter = text[j + 1]
            decoded = _DECODE.get(letter)
            if decoded is None:
                code = "misplaced_empty_marker" if letter == "E" else "unknown_escape"
                what = (
                    "the empty-string marker U+001D E must be the whole field"
                    if letter == "E"
                    else f"unknown escape U+001D {letter!r}"
                )
                raise self._error(
                    code,
                    f"{what} in column {column.name!r}",
                    offset + _utf8_len(text[:j]),
                    column=column.name,
                    record=ordinal,
                )
            out.append(decoded)
            i = j + 2
        return "".join(out)

    def _binary(self, column: CodecColumn, field: bytes, offset: int, ordinal: int) -> bytes:
        if field == b"\x1dE":
            return b""
        if _HEX_PAIRS.fullmatch(field) is None:
            position = _first_bad_hex(field)
            raise self._error(
                "invalid_hex",
                f"column {column.name!r} is not hex byte pairs "
                "(whitespace is allowed only between pairs)",
                offset + position,
                column=column.name,
                record=ordinal,
            )
        return bytes.fromhex(field.decode("ascii"))

    def _width_error(self, fields: list[bytes], offset: int, ordinal: int) -> BulkTextError:
        expected = len(self.columns)
        if len(fields) > expected:
            # Offset of the first TAB too many.
            position = offset + sum(len(f) + 1 for f in fields[:expected]) - 1
            message = f"record has {len(fields)} fields, more than the {expected} columns"
        else:
            position = offset + sum(len(f) + 1 for f in fields) - 1
            message = f"record has {len(fields)} fields, fewer than the {expected} columns"
        column = self.columns[min(len(fields), expected) - 1].name
        return self._error("row_width_mismatch", message, position, column=column, record=ordinal)

    def _raw_forbidden(
        self, column: CodecColumn, text: str, index: int, offset: int, ordinal: int
    ) -> BulkTextError:
        char = text[index]
        code = "cr_not_allowed" if char == "\r" else "reserved_character"
        return self._error(
            code,
            f"column {column.name!r} holds a raw U+{ord(char):04X}; text must escape it",
            offset + _utf8_len(text[:index]),
            column=column.name,
            record=ordinal,
        )

    def _error(
        self, code: str, message: str, offset: int, *, column: str | None, record: int | None = None
    ) -> BulkTextError:
        record = self.records if record is None else record
        where = [f"record {record}"] if record else []
        if column is not None:
            where.append(f"column {column!r}")
        where.append(f"byte offset {offset}")
        if self.source:
            where.insert(0, self.source)
        return BulkTextError(
            f"{message} ({', '.join(where)})",
            code=code,
            record=record,
            column=column,
            offset=offset,
            source=self.source,
        )


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8"))


def _first_bad_hex(field: bytes) -> int:
    hexdigits = b"0123456789abcdefABCDEF"
    i = 0
    n = len(field)
    expect_pair = True
    while i < n:
        if expect_pair:
            if i + 1 < n and field[i] in hexdigits and field[i + 1] in hexdigits:
                i += 2
                expect_pair = False
                continue
            return i if field[i] not in hexdigits else i + 1
        if field[i] in _HEX_WS:
            i += 1
            if i == n:
                return i - 1  # trailing whitespace
            continue
        expect_pair = True
    return max(0, n - 1)
