"""``dpone init`` and ``dpone check``: write and check the project file."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path
from typing import Any

import click

from dpone.cli.output import config_option, emit_json, json_option, reported_errors
from dpone.errors import ConfigurationError, DponeError, PolicyError
from dpone.exporters.sources import open_source
from dpone.project.config import Project, TableConfig, load_project, not_a_file
from dpone.project.refresh_checks import RefreshChecks
from dpone.publication.composition import check_ownership, pool_credentials
from dpone.publication.principals.ownership import OwnedElsewhere
from dpone.publication.principals.pool_databases import pool_protects, pool_remedy
from dpone.publication.principals.pool_verify import verify_pool
from dpone.publication.store import store_exists
from dpone.typepolicy import column_problems, refusals

EXAMPLE = """\
# dpone.toml: what `dpone refresh` does. Every key is described in docs/configuration.md.
# Relative paths are relative to this file. Secrets never go in this file: a SQL
# Server password is read from the environment variable or file named here.

[project]
work_dir = ".dpone/work"          # exports, staging journals, retention journals
store = ".dpone/snapshots.sqlite" # the publication store (records and history)
keep_rollback = 1                 # rollback copies kept per target (0 keeps none)

[clickhouse]
# The managed local server (`dpone server start --protect DATABASE ...`).
data_dir = ".dpone/clickhouse"
transport = "http"                # http or client (clickhouse-client)
preparation = "native"            # native (the default; a file it declines goes to the
                                  # Python reference) or python-reference: same bytes
# Or a server you run (docs/remote.md): remove data_dir above and set these instead.
# Its operator installs the users file `dpone pool render` writes; the password of
# each principal stays in the credentials file it writes beside it.
# host = "clickhouse.example.com"
# http_port = 8443
# tcp_port = 9440
# secure = true                     # TLS, verified against ca_file or the system's CAs
# ca_file = "/etc/ssl/certs/clickhouse-ca.pem"
# credentials_file = ".dpone/pool-credentials.json"
# trusted_writers = []              # users besides the pool that may write the targets

[sources.shop]
kind = "sqlite"
path = "shop.db"

# [sources.erp]
# kind = "sqlserver"
# host = "sql.example.com"
# port = 1433
# database = "ERP"
# user_env = "ERP_USER"             # the variable holding the user name
# password_env = "ERP_PASSWORD"     # or: password_file = "/run/secrets/erp"

[tables.customers]
source = "shop"
table = "customers"               # the source table
target = "dpone_demo.customers"   # DATABASE.TABLE; the database is protected by the server
order_by = "id"                   # design of a NEW target (an existing one keeps its own)
# partition_by = "toYYYYMM(updated_at)"
# types = { balance = "Decimal(18, 2)" }   # ClickHouse type overrides per column
shrink_guard = 0.5                # refuse to publish when rows drop by more than this fraction

# [tables.customers.limits]        # publication ceilings (rows and bytes)
# source_rows = 100000000
# source_bytes = 274877906944
# wire_bytes = 68719476736
# generation_storage_bytes = 68719476736
# retained_storage_bytes = 274877906944
# total_transient_storage_bytes = 549755813888
"""


@click.command()
@config_option
def init(config_path: Path) -> None:
    """Write a commented example project file (never over an existing one)."""
    with reported_errors(False):
        if config_path.is_dir():
            raise not_a_file(config_path)
        try:
            fd = os.open(config_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError as exc:
            raise ConfigurationError(
                f"{config_path} exists; dpone init never overwrites a file",
                code="config_exists",
                path=str(config_path),
            ) from exc
        except OSError as exc:
            raise ConfigurationError(
                f"cannot write the project file {config_path}: {exc.strerror}",
                code="config_unwritable",
                path=str(config_path),
            ) from exc
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            stream.write(EXAMPLE)
        click.echo(f"wrote {config_path}; edit it, then run `dpone check`")


@click.command()
@config_option
@json_option
def check(config_path: Path, as_json: bool) -> None:
    """Validate the project file, then check every connection and source table."""
    with reported_errors(as_json):
        # A file with problems raises here: every problem is in the message (one per
        # line) and, with --json, in error.details.problems.
        project = load_project(config_path)
        problems = reachability(project)
        if as_json:
            document: dict[str, Any] = {
                "ok": not problems,
                "config": str(config_path),
                "tables": list(project.tables),
                "problems": problems,
            }
            if problems:  # a failure carries its error object, as every failure does
                document["error"] = {
                    "code": "check_failed" if len(problems) > 1 else problems[0]["code"],
                    "message": f"{len(problems)} problem(s): "
                    + "; ".join(f"{p['key']}: {p['message']}" for p in problems),
                    "details": {"problems": problems},
                }
            emit_json(document)
        else:
            for problem in problems:
                click.echo(f"{problem['key']}: [{problem['code']}] {problem['message']}")
            if not problems:
                click.echo(
                    f"{config_path}: {len(project.tables)} table(s), every source and "
                    "target reachable"
                )
        if problems:
            raise SystemExit(1)


def reachability(project: Project) -> list[dict[str, Any]]:
    """Every problem :func:`table_problems` finds, then the server's: reachable, with the
    pool (on a remote server: its installation verified, ``dpone pool verify``),
    protecting each target database. Each with the key it concerns."""
    problems = table_problems(project)
    access = project.clickhouse.access
    key = "clickhouse.data_dir" if access.managed else "clickhouse.host"
    try:
        pool_credentials(access)
        # Another store's pool: nothing signs in as its principals, not even to verify.
        try:
            check_ownership(access, project.store, project=project.path)
        except OwnedElsewhere:
            raise
        except DponeError:
            if access.managed:
                raise
            # Unread: the verification below names why (TLS, a refused sign-in).
        if not access.managed:
            found = verify_pool(access, project.databases, project.store)
            problems += [{"key": key, **p} for p in found.problems]
            if found.problems:
                return problems
        unprotected = []
        for database in project.databases:
            if pool_protects(access, database):
                continue
            unprotected.append(database)
            remedy, _ = pool_remedy(access, (database,))
            for table in project.tables.values():
                if table.database == database:
                    problems.append(
                        {
                            "key": f"tables.{table.name}.target",
                            "code": "database_not_protected",
                            "message": f"{access.describe()} does not protect {database}: {remedy}",
                        }
                    )
    except DponeError as exc:
        problems.append({"key": key, "code": exc.code, "message": exc.message})
        return problems
    protected = [t for t in project.tables.values() if t.database not in unprotected]
    return problems + target_problems(project, protected)


def target_problems(project: Project, tables: list[TableConfig]) -> list[dict[str, Any]]:
    """What the refresh's check would refuse about each target before its export: a
    side effect of the target, or a writer outside the pool's leases and
    ``trusted_writers`` that could write it or the generation. Read-only: without a
    project store, the leases are judged as a new store's (none), in a throwaway one."""
    problems: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="dpone-check-") as scratch:
        if not store_exists(project.store):  # check creates no store of the project's
            project = dataclasses.replace(project, store=Path(scratch) / "store.sqlite")
        for table in tables:
            try:
                RefreshChecks(project, None).writers(table)
            except DponeError as exc:
                key = f"tables.{table.name}.target"
                problems.append({"key": key, "code": exc.code, "message": exc.message})
    return problems


def table_problems(project: Project) -> list[dict[str, Any]]:
    """The checks that need no server, for every table: its source table readable, and
    each column and each type override accepted by the type policy, as the export and
    the stage will judge them. One entry per unsupported column and per refused
    override (key ``tables.NAME.table`` or ``tables.NAME.types.COLUMN``)."""
    problems: list[dict[str, Any]] = []
    for table in project.tables.values():
        try:
            schema = open_source(project.sources[table.source]).schema(table.source_table)
            refused = [p.to_dict() for p in column_problems(schema.columns, table.types)]
        except PolicyError as exc:  # a source that judges its declared types itself
            refused = refusals(exc)
        except DponeError as exc:
            problems.append(
                {"key": f"tables.{table.name}.table", "code": exc.code, "message": exc.message}
            )
            continue
        problems.extend(_refused(table, found) for found in refused)
    return problems


def _refused(table: TableConfig, found: dict[str, Any]) -> dict[str, Any]:
    """One refusal of the type policy as a problem of ``table``."""
    details = found["details"]
    column = details.get("column")
    key = f"tables.{table.name}.table"
    if "override" in details:  # an override refused, or one naming no column
        key = f"tables.{table.name}.types.{column}"
    entry = {
        "key": key,
        "code": found["code"],
        "message": f"table {table.name} (source table {table.source_table!r}): " + found["message"],
    }
    return entry | {k: details[k] for k in ("column", "source_type", "override") if k in details}
