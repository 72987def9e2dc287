"""``dpone demo``: the main job on the embedded default.

A SQLite source (created once with a few hostile values) is exported to a bulk text
file with its receipt, validated, prepared into exact RowBinary and staged into a
private, verified table of the managed local ClickHouse server as a leased ingest
user of the publication pool (passwords read from the server's credentials file), and
published into ``dpone_demo.customers`` with one EXCHANGE as a leased publisher.
Everything the demo writes is private to the user (umask 077).
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import click

from dpone.cli.output import emit_json, json_option, reported_errors
from dpone.cli.server import data_dir_option, echo_warnings
from dpone.connectors.clickhouse_request import Endpoint
from dpone.contracts.composition_snapshot import SnapshotIntent, SnapshotState
from dpone.exporters.export import export_table
from dpone.exporters.sources import SqliteSource
from dpone.localserver import LocalServer, find_running
from dpone.localserver.principal_pool import managed_server_users
from dpone.ports.composition_snapshot import AttemptRef, TargetSlot
from dpone.runtime.clickhouse_staging_composition import StagingConfig
from dpone.runtime.snapshot_composition import (
    DEFAULT_STORE,
    PublicationConfig,
    build_publication,
    issue_ingest,
    provision_protected_databases,
)
from dpone.sinks import ClickHouseSink
from dpone.sinks.clickhouse import new_attempt_id

DEMO_DATABASE = "dpone_demo"
DEMO_TARGET = "customers"
DEMO_ROWS = [
    (1, "Ada Lovelace", "1234.50", "2024-02-29 23:59:59.1234567", "6F9619FF-8B86-D011-B42D-00C04FC964FF", b"\x00\xff"),
    (2, "tab\there, newline\nthere", "-0.01", "1900-01-01 00:00:00.0000000", None, b""),
    (3, "NULL", None, "2299-12-31 23:59:59.9999999", None, None),
    (4, "", "9999999999999.99", "1970-01-01 00:00:00.0000000", None, bytes(range(256))),
    (5, "\x1d marker, 'quotes', \\backslash, emoji 🎉, עברית", "0", "2000-01-01 12:00:00.5000000", None, None),
]  # fmt: skip


def ensure_source(path: Path) -> None:
    """Create the demo SQLite source once (declared types are SQL Server types)."""
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE customers (id bigint NOT NULL, name nvarchar(200), "
            "balance decimal(18, 2), updated_at datetime2(7) NOT NULL, external_id uniqueidentifier, "
            "avatar varbinary)"
        )
        conn.executemany("INSERT INTO customers VALUES (?, ?, ?, ?, ?, ?)", DEMO_ROWS)


@click.command()
@data_dir_option
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=Path(".dpone/demo"),
              show_default=True, help="Where the demo source, file, receipt and journals go.")  # fmt: skip
@click.option("--store", "store_path", type=click.Path(dir_okay=False, path_type=Path),
              default=DEFAULT_STORE, show_default=True, help="The publication store.")  # fmt: skip
@json_option
def demo(data_dir: Path, work_dir: Path, store_path: Path, as_json: bool) -> None:
    """Export a SQLite table, stage it into the local ClickHouse server and publish it."""
    # The demo's source, files, journals and server data are nobody else's business.
    os.umask(0o077)
    with reported_errors(as_json):
        source = work_dir / "source.db"
        ensure_source(source)
        # The demo owns its work directory: a second run replaces its own export.
        exported = export_table(
            SqliteSource(source), "customers", work_dir / "customers.tsv", force=True
        )
        running = find_running(data_dir)
        local = None
        if running is None:
            local = LocalServer(data_dir, users=managed_server_users((DEMO_DATABASE,)))
            info = local.start()
            echo_warnings(local.warnings)
        else:
            info = running
        try:
            provision_protected_databases(data_dir, info.http_port, (DEMO_DATABASE,))
            endpoint = Endpoint("127.0.0.1", info.http_port, info.tcp_port, DEMO_DATABASE)
            attempt_id = new_attempt_id()
            # Staging runs as a leased ingest principal, publication as a leased publisher.
            ingest = issue_ingest(data_dir, store_path, DEMO_DATABASE, attempt_id)
            config = StagingConfig(endpoint, ingest.credentials, work_dir / "attempts",
                                   principal_uuid=ingest.ref.user_uuid)  # fmt: skip
            staged = ClickHouseSink(config).stage_validated_file(
                exported.path, exported.receipt_path, attempt_id=attempt_id
            )
            publisher = build_publication(
                PublicationConfig(data_dir, store_path), DEMO_DATABASE
            ).publisher
            prepared = publisher.prepare(
                AttemptRef(staged.journal_path, TargetSlot(DEMO_DATABASE, DEMO_TARGET)),
                staged.journal_head,
            )
            published = publisher.publish(prepared.intent_sha256)
            intent = publisher.store.load(prepared.intent_sha256)
        finally:
            if local is not None:
                local.stop()
        before = SnapshotIntent.from_bytes(intent.intent_bytes).target_uuid
        payload = {
            "ok": published.state is SnapshotState.PUBLISHED, "version": info.version, "http_port": info.http_port,
            "tcp_port": info.tcp_port, "data_dir": info.data_dir, "database": staged.database, "table": staged.table,
            "uuid": staged.uuid, "rows": staged.rows, "semantic_id": staged.semantic_id,
            "journal": str(staged.journal_path), "journal_head": staged.journal_head, "file": str(exported.path),
            "receipt": str(exported.receipt_path), "server_was_running": running is not None,
            "target": f"{DEMO_DATABASE}.{DEMO_TARGET}", "intent_sha256": published.intent_sha256,
            "state": published.state.value, "revision": published.revision,
            "target_uuid_before": before, "target_uuid_after": published.target_uuid,
        }  # fmt: skip
        if as_json:
            emit_json(payload)
        else:
            click.echo(
                f"ClickHouse {info.version} on http {info.http_port}, tcp {info.tcp_port} ({info.data_dir})"
            )
            click.echo(
                f"exported {exported.receipt.rows_validated} rows to {exported.path} (receipt {exported.receipt_path})"
            )
            click.echo(
                f"staged {staged.rows} rows into {staged.database}.{staged.table} (uuid {staged.uuid})"
            )
            click.echo(f"semantic id {staged.semantic_id}; journal {staged.journal_path}")
            click.echo(
                f"published {DEMO_DATABASE}.{DEMO_TARGET}: {published.state.value} (revision "
                f"{published.revision}); target uuid {before} -> {published.target_uuid}"
            )
            click.echo(
                f"intent {published.intent_sha256}: `dpone snapshot show {published.intent_sha256}`"
            )
        if published.state is not SnapshotState.PUBLISHED:
            raise SystemExit(1)
