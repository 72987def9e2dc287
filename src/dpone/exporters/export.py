"""``export_table``: source table -> bulk text file + receipt, both appearing atomically."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dpone.connectors.bulk_text_codec import BulkTextError, BulkTextWriter, encode_fields
from dpone.contracts.receipt import FileReceipt
from dpone.durable_files import OutputError, atomic_outputs
from dpone.errors import ConfigurationError
from dpone.exporters.render import RenderError, field_for, render_row, renderer_for
from dpone.exporters.sources import Source
from dpone.preparation.file_validation import validate_file
from dpone.typepolicy import plan_columns
from dpone.typepolicy.source_types import parse_source_type

# Progress is reported every this many records (and once at the end).
PROGRESS_EVERY = 10_000

Progress = Callable[[int, int], None]
"""Called with (records written, bytes written) while an export runs."""


@dataclass(frozen=True)
class ExportResult:
    """Where the file and its receipt were written, and the receipt itself."""

    path: Path
    receipt_path: Path
    receipt: FileReceipt


def receipt_path_for(path: Path) -> Path:
    """The default receipt name beside a file: ``<file>.receipt.json``."""
    return path.with_name(path.name + ".receipt.json")


def _check_table_name(table: str) -> None:
    """A table name is text: refuse bytes that are not UTF-8 (a shell's ``$'\\xff'``)."""
    try:
        table.encode("utf-8")
    except UnicodeEncodeError as exc:
        shown = os.fsencode(table).decode("utf-8", "backslashreplace")
        raise ConfigurationError(
            f"table name {shown} is not valid UTF-8 text", code="invalid_table_name"
        ) from exc
    if not table or "\x00" in table:
        raise ConfigurationError(
            f"table name {table!r} is empty or holds a NUL character", code="invalid_table_name"
        )


def export_table(
    source: Source,
    table: str,
    out: str | os.PathLike[str],
    *,
    receipt_out: Path | None = None,
    force: bool = False,
    progress: Progress | None = None,
    warn: Callable[[str], None] | None = None,
) -> ExportResult:
    """Export ``table`` to ``out``; the receipt comes from re-reading what was written.

    Both outputs are checked before anything is read (neither may be an input of the
    source or the other output; an existing one is refused unless ``force``). The data
    and the receipt are written under temporary names; the data is fsynced and
    validated by the same reader and policy a consumer uses, then the data and then
    the receipt are renamed into place. A failed or interrupted export leaves neither.
    """
    _check_table_name(table)
    path = Path(out)
    receipt_path = receipt_out or receipt_path_for(path)
    outputs = [path, receipt_path]
    with atomic_outputs(outputs, source.local_files, force=force) as (stream, receipt_stream):
        schema = source.schema(table)
        plans = plan_columns(schema.columns)  # unsupported types are refused before reading
        types = [parse_source_type(c.source_type, column=c.name) for c in schema.columns]
        renderers = [renderer_for(st) for st in types]
        fields = [field_for(st, p.codec_column) for st, p in zip(types, plans, strict=True)]
        names = [c.name for c in schema.columns]
        writer = BulkTextWriter(stream, [p.codec_column for p in plans])
        for ordinal, row in enumerate(source.rows(table, schema), start=1):
            try:  # the common row in one pass
                record: bytes | None = encode_fields(fields, row)
            except Exception:  # rendered again below, which names what is wrong
                record = None
            try:
                if record is None:
                    writer.write(render_row(renderers, names, row, record=ordinal))
                else:
                    writer.write_record(record)
            except BulkTextError as exc:
                raise _unwritable(exc, ordinal) from exc
            except OSError as exc:
                raise OutputError(f"cannot write {path}: {exc.strerror}", path=str(path)) from exc
            if progress is not None and ordinal % PROGRESS_EVERY == 0:
                progress(writer.records, writer.bytes)
        if progress is not None:
            progress(writer.records, writer.bytes)
        try:
            stream.flush()
        except OSError as exc:
            raise OutputError(f"cannot write {path}: {exc.strerror}", path=str(path)) from exc
        receipt = validate_file(_fd_path(stream.fileno()), schema, source_name=str(path), warn=warn)
        receipt_stream.write(receipt.to_bytes())
    return ExportResult(path, receipt_path, receipt)


def _unwritable(exc: BulkTextError, ordinal: int) -> RenderError:
    # The codec's message may quote the value; the export names only where it is.
    column = exc.details.get("column")
    where = f"record {ordinal}" + (f", column {column!r}" if column else "")
    reason = {
        "unencodable_value": "the value holds a character the bulk text format cannot carry",
    }.get(exc.code, exc.code)
    return RenderError(f"{where}: {reason}", code=exc.code, record=ordinal, column=column)


def _fd_path(fd: int) -> str:
    # Validate the very file being written (by descriptor), before it gets its name.
    return f"/proc/self/fd/{fd}"
