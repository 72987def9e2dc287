"""``dpone validate``, ``dpone verify`` and ``dpone export``: files and their receipts."""

from __future__ import annotations

from pathlib import Path

import click

from dpone.cli.output import emit_json, json_option, reported_errors
from dpone.contracts import canonical_json
from dpone.contracts.receipt import FileReceipt
from dpone.contracts.schema import SourceSchema
from dpone.durable_files import atomic_write_bytes
from dpone.errors import ConfigurationError
from dpone.exporters.export import export_table, receipt_path_for
from dpone.exporters.sources import open_source
from dpone.runtime.artifact import HeldArtifact
from dpone.runtime.file_validation import validate_file

existing_file = click.Path(exists=True, dir_okay=False, path_type=Path)


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
@click.option(
    "--receipt-out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the receipt [default: FILE.receipt.json].",
)
@click.option("--max-record-bytes", type=click.IntRange(min=1), help="Refuse longer records.")
@click.option("--max-records", type=click.IntRange(min=0), help="Refuse more records.")
@json_option
def validate(
    file: Path,
    schema_path: Path,
    receipt_out: Path | None,
    max_record_bytes: int | None,
    max_records: int | None,
    as_json: bool,
) -> None:
    """Validate FILE against a schema and write its receipt (only if it passes)."""
    with reported_errors(as_json):
        schema = load_schema(schema_path)
        receipt = validate_file(
            file, schema, max_record_bytes=max_record_bytes, max_records=max_records
        )
        target = receipt_out or receipt_path_for(file)
        atomic_write_bytes(target, receipt.to_bytes())
        if as_json:
            emit_json({"ok": True, "receipt": str(target), **_summary(receipt)})
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
    """Check that FILE is exactly the file its receipt describes."""
    with reported_errors(as_json):
        receipt = load_receipt(receipt_path)
        with HeldArtifact(file, receipt) as held:
            held.verify()
        if as_json:
            emit_json({"ok": True, **_summary(receipt)})
        else:
            click.echo(f"{file}: matches its receipt ({receipt.rows_validated} rows)")


@click.command()
@click.option(
    "--source",
    "dsn",
    required=True,
    help="sqlite:PATH or mssql://HOST[:PORT]/DATABASE (credentials from env).",
)
@click.option("--table", required=True, help="Table to export (schema.table for SQL Server).")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="The bulk text file to write.",
)
@click.option(
    "--receipt-out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the receipt [default: OUT.receipt.json].",
)
@json_option
def export(dsn: str, table: str, out: Path, receipt_out: Path | None, as_json: bool) -> None:
    """Export a table to a bulk text file and its receipt."""
    with reported_errors(as_json):
        result = export_table(open_source(dsn), table, out, receipt_out=receipt_out)
        if as_json:
            emit_json(
                {
                    "ok": True,
                    "file": str(result.path),
                    "receipt": str(result.receipt_path),
                    **_summary(result.receipt),
                }
            )
        else:
            click.echo(
                f"{result.path}: {result.receipt.rows_validated} rows; "
                f"receipt {result.receipt_path}"
            )
