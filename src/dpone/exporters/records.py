"""Driver rows written as bulk text records: compiled where it takes them, Python otherwise.

The Python path (``render.py`` and the codec) is the specification. The compiled
renderer (:mod:`dpone.exporters.native_render`) writes runs of rows it takes with the
same bytes; a row it declines is rendered here in Python, which writes it or raises
the error that names it, exactly as if the compiled renderer did not exist.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, BinaryIO

from dpone.connectors.bulk_text_codec import (
    BulkTextError,
    encode_fields,
    encode_record,
    field_encoders,
)
from dpone.exporters import native_render
from dpone.exporters.render import RenderError, field_for, render_row, renderer_for
from dpone.typepolicy import ColumnPlan
from dpone.typepolicy.source_types import SourceType


class RecordWriter:
    """Writes driver rows to ``stream`` as the next records, and counts them.

    ``native`` False renders every row in Python (the specification, for tests and
    benchmarks); otherwise the compiled renderer takes what it can, when it is built.
    """

    def __init__(
        self,
        stream: BinaryIO,
        types: Sequence[SourceType],
        plans: Sequence[ColumnPlan],
        *,
        native: bool = True,
    ) -> None:
        self._stream = stream
        self._columns = [p.codec_column for p in plans]
        self._encoders = field_encoders(self._columns)
        self._renderers = [renderer_for(st) for st in types]
        self._fields = [field_for(st, c) for st, c in zip(types, self._columns, strict=True)]
        self._names = [c.name for c in self._columns]
        self._ops = native_render.ops_for(types, self._columns) if native else None
        self.records = 0
        self.bytes = 0

    @property
    def ops(self) -> bytes | None:
        """The compiled renderer's description of the columns, None when it takes none."""
        return self._ops

    def restart(self) -> None:
        """Start again from an empty file (after the compiled reader declined)."""
        self._stream.seek(0)
        self._stream.truncate()
        self.records = self.bytes = 0

    def flush(self) -> int:
        """Flush what was written into the file; the file's size (whole records)."""
        self._stream.flush()
        return self.bytes

    def write_read(self, rows: native_render.SqliteRows, max_rows: int) -> bool:
        """Write the next at most ``max_rows`` rows of the compiled reader; False at the end."""
        data, taken, declined = rows.read(max_rows)
        if data:
            self._stream.write(data)
            self.records += taken
            self.bytes += len(data)
        if declined is not None:
            self._write_row(declined)
        return bool(taken) or declined is not None

    def write(self, batch: list[Any], start: int = 0, stop: int | None = None) -> None:
        """Write ``batch[start:stop]`` as the next records (OSError: the stream's)."""
        stop = len(batch) if stop is None else stop
        while start < stop:
            taken = start
            if self._ops is not None:
                data, taken = native_render.render_rows(self._ops, batch, start, stop)
                if data:
                    self._stream.write(data)
                    self.records += taken - start
                    self.bytes += len(data)
            if taken < stop:
                self._write_row(batch[taken])  # the compiled renderer declined it
            start = taken + 1

    def _write_row(self, row: tuple[Any, ...]) -> None:
        ordinal = self.records + 1
        try:  # the common row in one pass
            record: bytes | None = encode_fields(self._fields, row)
        except Exception:  # rendered again below, which names what is wrong
            record = None
        try:
            if record is None:
                cells = render_row(self._renderers, self._names, row, record=ordinal)
                record = encode_record(self._columns, cells, self._encoders)
        except BulkTextError as exc:
            raise _unwritable(exc, ordinal) from exc
        self._stream.write(record)
        self.records += 1
        self.bytes += len(record)


def _unwritable(exc: BulkTextError, ordinal: int) -> RenderError:
    # The codec's message may quote the value; the export names only where it is.
    column = exc.details.get("column")
    where = f"record {ordinal}" + (f", column {column!r}" if column else "")
    reason = {
        "unencodable_value": "the value holds a character the bulk text format cannot carry",
    }.get(exc.code, exc.code)
    return RenderError(f"{where}: {reason}", code=exc.code, record=ordinal, column=column)
