"""``dpone demo``: the main job on the embedded default."""

from __future__ import annotations

from pathlib import Path

import click

from dpone.cli.output import emit_json, json_option, reported_errors
from dpone.cli.server import data_dir_option
from dpone.localserver import LocalServer, find_running
from dpone.localserver.control import run_admin_sql
from dpone.sql import quote_identifier, quote_literal

DEMO_DATABASE = "dpone_demo"


@click.command()
@data_dir_option
@json_option
def demo(data_dir: Path, as_json: bool) -> None:
    """Start the local server (or use the running one) and prepare the demo database."""
    with reported_errors(as_json):
        running = find_running(data_dir)
        local = None
        if running is None:
            local = LocalServer(data_dir)
            info = local.start()
        else:
            info = running
        try:
            run_admin_sql(
                info.http_port,
                f"CREATE DATABASE IF NOT EXISTS {quote_identifier(DEMO_DATABASE)} ENGINE = Atomic",
            )
            row = run_admin_sql(
                info.http_port,
                "SELECT engine, toString(uuid) FROM system.databases "
                f"WHERE name = {quote_literal(DEMO_DATABASE)} FORMAT TabSeparated",
            )
            engine, uuid = row.rstrip("\n").split("\t")
        finally:
            if local is not None:
                local.stop()
        payload = {
            "ok": True,
            "version": info.version,
            "http_port": info.http_port,
            "tcp_port": info.tcp_port,
            "data_dir": info.data_dir,
            "database": DEMO_DATABASE,
            "database_engine": engine,
            "database_uuid": uuid,
            "server_was_running": running is not None,
        }
        if as_json:
            emit_json(payload)
        else:
            click.echo(f"ClickHouse {info.version} on http {info.http_port}, tcp {info.tcp_port}")
            click.echo(f"database {DEMO_DATABASE}: engine {engine}, uuid {uuid}")
            click.echo(f"data dir {info.data_dir}")
