"""``dpone validate``, ``dpone verify`` and ``dpone export``: files and their receipts."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from dpone.cli.output import (
    TerminalProgress,
    Warnings,
    emit_json,
    json_option,
    reported_errors,
)
from dpone.contracts import canonical_json
from dpone.contracts.receipt import FileReceipt
from dpone.contracts.schema import SourceSchema
from dpone.durable_files import atomic_outputs
from dpone.errors import ConfigurationError
from dpone.exporters.export import export_table, receipt_path_for
from dpone.exporters.sources import open_source
from dpone.preparation.file_validation import validate_file, verify_file

existing_file = click.Path(exists=True, dir_okay=False, path_type=Path)
F = TypeVar("F", bound=Callable[..., Any])
force_option = click.option(
    "--force", is_flag=True, help="Replace outputs that already exist (never an input)."
)


def _refuse_dash(ctx: click.Context, param: click.Parameter, value: str | None) -> Path | None:
    # click.Path takes "-" as a file named "-"; an output here is a validated file put
    # in place by rename, never a stream, so say so instead of creating that file. The
    # raw text is compared: Path("./-") == Path("-"), and ./- is the spelling offered.
    if value is None:
        return None
    if value == "-":
        raise click.BadParameter(
            "'-' is not standard output here: dpone writes files through a temporary name "
            "and a rename; give a file path (./- for a file named '-')"
        )
    return Path(value)


def output_option(name: str, *, help: str, required: bool = False) -> Callable[[F], F]:
    """An option naming an output file (see :func:`dpone.durable_files.atomic_outputs`)."""
    return click.option(
        name,
        type=click.Path(dir_okay=False),
        callback=_refuse_dash,
        required=required,
        help=help,
    )


def load_schema(path: Path) -> SourceSchema:
    """Read a hand-written schema file (strict members, free layout)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigurationError(f"cannot read schema {path}: {exc.strerror}") from exc
    return SourceSchema.from_document(
        canonical_json.loads(data, what=f"schema {path}", canonical=False), where=str(path)
    )


def load_receipt(path: Path) -> FileReceipt:
    """Read a receipt file (canonical bytes required)."""
    return FileReceipt.from_bytes(path.read_bytes())


def _summary(receipt: FileReceipt) -> dict[str, object]:
    return {
        "rows": receipt.rows_validated,
        "artifact_size": receipt.artifact_size,
        "artifact_sha256": receipt.artifact_sha256,
        "receipt_sha256": receipt.sha256,
    }


@click.command()
@click.argument("file", type=existing_file)
@click.option(
    "--schema",
    "schema_path",
    type=existing_file,
    required=True,
    help='Schema JSON: {"schema_version": 1, "columns": [...]}.',
)
@output_option("--receipt-out", help="Where to write the receipt [default: FILE.receipt.json].")
@click.option("--max-record-bytes", type=click.IntRange(min=1), help="Refuse longer records.")
@click.option("--max-records", type=click.IntRange(min=0), help="Refuse more records.")
@force_option
@json_option
def validate(
    file: Path,
    schema_path: Path,
    receipt_out: Path | None,
    max_record_bytes: int | None,
    max_records: int | None,
    force: bool,
    as_json: bool,
) -> None:
    """Validate FILE against a schema and write its receipt (only if it passes)."""
    warn = Warnings(as_json)
    with reported_errors(as_json, warn):
        target = receipt_out or receipt_path_for(file)
        # A receipt left half-written by a killed validate of the same output is
        # removed first (said in a warning); one a running validate writes is kept.
        with atomic_outputs([target], [file, schema_path], force=force, warn=warn) as (stream,):
            schema = load_schema(schema_path)
            receipt = validate_file(
                file,
                schema,
                max_record_bytes=max_record_bytes,
                max_records=max_records,
                warn=warn,
            )
            stream.write(receipt.to_bytes())
        if as_json:
            emit_json({"ok": True, "receipt": str(target), **_summary(receipt), **warn.document()})
        else:
            click.echo(f"{file}: {receipt.rows_validated} rows valid; receipt {target}")


@click.command()
@click.argument("file", type=existing_file)
@click.option(
    "--receipt",
    "receipt_path",
    type=existing_file,
    required=True,
    help="The receipt to check FILE against.",
)
@json_option
def verify(file: Path, receipt_path: Path, as_json: bool) -> None:
    """Check that FILE is exactly the file its receipt describes (bytes and records)."""
    warn = Warnings(as_json)
    with reported_errors(as_json, warn):
        receipt = load_receipt(receipt_path)
        verify_file(file, receipt, warn=warn)
        if as_json:
            emit_json({"ok": True, **_summary(receipt), **warn.document()})
        else:
            click.echo(f"{file}: matches its receipt ({receipt.rows_validated} rows)")


@click.command()
@click.option(
    "--source",
    "dsn",
    required=True,
    help="sqlite:PATH (taken literally, opened read-only), mssql://HOST[:PORT]/DATABASE "
    "(credentials from env) or postgresql://USER@HOST[:PORT]/DBNAME (password from "
    "PGPASSFILE or ~/.pgpass).",
)
@click.option(
    "--table", required=True, help="Table to export (schema.table for SQL Server, PostgreSQL)."
)
@output_option("--out", required=True, help="The bulk text file to write.")
@output_option("--receipt-out", help="Where to write the receipt [default: OUT.receipt.json].")
@force_option
@json_option
def export(
    dsn: str, table: str, out: Path, receipt_out: Path | None, force: bool, as_json: bool
) -> None:
    """Export a table to a bulk text file and its receipt (both appear, or neither)."""
    warn = Warnings(as_json)
    with reported_errors(as_json, warn):
        progress = TerminalProgress("exported") if TerminalProgress.on_terminal(as_json) else None
        result = export_table(
            open_source(dsn),
            table,
            out,
            receipt_out=receipt_out,
            force=force,
            progress=progress,
            warn=warn,
        )
        TerminalProgress.finish()
        if as_json:
            emit_json(
                {
                    "ok": True,
                    "file": str(result.path),
                    "receipt": str(result.receipt_path),
                    **_summary(result.receipt),
                    **warn.document(),
                }
            )
        else:
            click.echo(
                f"{result.path}: {result.receipt.rows_validated} rows; "
                f"receipt {result.receipt_path}"
            )
