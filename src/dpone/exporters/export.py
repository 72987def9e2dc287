"""``export_table``: source table -> bulk text file + receipt, both appearing atomically."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from dpone.contracts.receipt import FileReceipt
from dpone.contracts.schema import SourceSchema
from dpone.durable_files import OutputError, atomic_outputs
from dpone.errors import ConfigurationError
from dpone.exporters import native_render
from dpone.exporters.records import RecordWriter
from dpone.exporters.sources import SnapshotSource, Source, SqliteSource, row_batches
from dpone.preparation.file_validation import validate_file
from dpone.preparation.following_validation import FollowingValidation
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
    native: bool = True,
) -> ExportResult:
    """Export ``table`` to ``out``; the receipt comes from re-reading what was written.

    Both outputs are checked before anything is read (neither may be an input of the
    source or the other output; an existing one is refused unless ``force``). The data
    and the receipt are written under temporary names; the data is fsynced and
    validated by the same reader and policy a consumer uses (by
    :class:`FollowingValidation` while it is written, else whole afterwards), then the
    data and then the receipt are renamed into place. A failed or interrupted export
    leaves neither.

    Rows are rendered by the compiled renderer where it is built and takes them, and
    otherwise by the Python renderer, with the same bytes and errors; ``native``
    False renders them all in Python (the specification).
    """
    _check_table_name(table)
    path = Path(out)
    receipt_path = receipt_out or receipt_path_for(path)
    outputs = [path, receipt_path]
    with atomic_outputs(outputs, source.local_files, force=force) as (stream, receipt_stream):
        schema = source.schema(table)
        plans = plan_columns(schema.columns)  # unsupported types are refused before reading
        types = [parse_source_type(c.source_type, column=c.name) for c in schema.columns]
        writer = RecordWriter(stream, types, plans, native=native)
        # The validation follows the file as it is written, on the other core.
        following = FollowingValidation.start(_fd_path(stream.fileno()), schema)
        try:
            _write_rows(source, table, schema, writer, progress, following)
            if progress is not None:
                progress(writer.records, writer.bytes)
            stream.flush()
        except BaseException as exc:
            if following is not None:
                following.abandon()
            if isinstance(exc, OSError):
                message = f"cannot write {path}: {exc.strerror}"
                raise OutputError(message, path=str(path)) from exc
            raise
        receipt = following.finish(stream.tell()) if following is not None else None
        if receipt is None:  # the compiled check could not decide: the whole file again
            receipt = validate_file(
                _fd_path(stream.fileno()), schema, source_name=str(path), warn=warn
            )
        if isinstance(source, SnapshotSource):  # which snapshot the rows are, in the receipt
            receipt = dataclasses.replace(receipt, source=source.snapshot_identity())
        receipt_stream.write(receipt.to_bytes())
    return ExportResult(path, receipt_path, receipt)


def _write_rows(
    source: Source,
    table: str,
    schema: SourceSchema,
    writer: RecordWriter,
    progress: Progress | None,
    following: FollowingValidation | None,
) -> None:
    """Every row of ``table`` through ``writer``, with progress every PROGRESS_EVERY records;
    each time the written records are flushed for ``following`` to check.

    A SQLite table goes through the compiled reader when it is built; where the reader
    declines (it met what sqlite3 itself would refuse) the file starts again, read
    through sqlite3, which names what is wrong. Other sources hand their driver rows.
    """

    def room() -> int:  # rows up to the next progress report
        return PROGRESS_EVERY - writer.records % PROGRESS_EVERY

    def report() -> None:
        if writer.records % PROGRESS_EVERY != 0:
            return
        if progress is not None:
            progress(writer.records, writer.bytes)
        if following is not None:
            following.flushed(writer.flush())

    compiled = (
        source.compiled_rows(table, schema, writer.ops)
        if isinstance(source, SqliteSource) and writer.ops is not None
        else None
    )
    if compiled is not None:
        try:
            with closing(compiled):
                while writer.write_read(compiled, room()):
                    report()
            return
        except native_render.Declined:
            if following is not None:
                following.abandon()  # the file starts again: validate_file decides it
            writer.restart()
    for batch in row_batches(source, table, schema):
        start = 0
        while start < len(batch):
            stop = min(len(batch), start + room())
            writer.write(batch, start, stop)
            start = stop
            report()


def _fd_path(fd: int) -> str:
    # Validate the very file being written (by descriptor), before it gets its name.
    return f"/proc/self/fd/{fd}"
