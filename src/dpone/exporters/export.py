"""``export_table``: source table -> bulk text file + receipt, both appearing atomically."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from dpone.connectors.bulk_text_codec import BulkTextWriter
from dpone.contracts.receipt import FileReceipt
from dpone.durable_files import atomic_output, atomic_write_bytes
from dpone.exporters.render import render_row, renderer_for
from dpone.exporters.sources import Source
from dpone.runtime.file_validation import validate_file
from dpone.typepolicy import plan_columns
from dpone.typepolicy.source_types import parse_source_type


@dataclass(frozen=True)
class ExportResult:
    """Where the file and its receipt were written, and the receipt itself."""

    path: Path
    receipt_path: Path
    receipt: FileReceipt


def receipt_path_for(path: Path) -> Path:
    """The default receipt name beside a file: ``<file>.receipt.json``."""
    return path.with_name(path.name + ".receipt.json")


def export_table(
    source: Source, table: str, out: str | os.PathLike[str], *, receipt_out: Path | None = None
) -> ExportResult:
    """Export ``table`` to ``out``; the receipt comes from re-reading what was written.

    The data goes to a temporary name, is fsynced, validated by the same reader and
    policy a consumer uses, and only then renamed to ``out``. A failed or interrupted
    export leaves neither a file nor a receipt under the final names.
    """
    path = Path(out)
    schema = source.schema(table)
    plans = plan_columns(schema.columns)  # unsupported types are refused before reading
    renderers = [
        renderer_for(parse_source_type(c.source_type, column=c.name)) for c in schema.columns
    ]
    names = [c.name for c in schema.columns]
    with atomic_output(path) as stream:
        writer = BulkTextWriter(stream, [p.codec_column for p in plans])
        for row in source.rows(table, schema):
            writer.write(render_row(renderers, names, row))
        stream.flush()
        receipt = validate_file(_fd_path(stream.fileno()), schema, source_name=str(path))
    receipt_path = receipt_out or receipt_path_for(path)
    atomic_write_bytes(receipt_path, receipt.to_bytes())
    return ExportResult(path, receipt_path, receipt)


def _fd_path(fd: int) -> str:
    # Validate the very file being written (by descriptor), before it gets its name.
    return f"/proc/self/fd/{fd}"
