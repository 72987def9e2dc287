"""``dpone demo``: two verified full refreshes of a SQLite table on the embedded default.

The demo builds its own project under ``--work-dir``: a SQLite source (realistic rows
and hostile values), a ``dpone.toml`` naming it, and the managed local server (started
with the publication pool when it is not running, and stopped again at the end). It
refreshes the table into ``dpone_demo.customers``, changes the source (deletes,
updates, inserts), refreshes again, and compares the target with the new source row
by row: deleted rows are gone. Then it prints ``dpone status``. Everything the demo
writes is private to the user (umask 077); a second run rebuilds the source.
"""

from __future__ import annotations

import os
import random
import sqlite3
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from dpone.cli.output import echo_warnings, emit_json, json_option, reported_errors
from dpone.cli.server import data_dir_option
from dpone.connectors.clickhouse_http import HttpTransport
from dpone.errors import StateError
from dpone.localserver import LocalServer, ServerInfo, find_running
from dpone.localserver.credentials import admin_credentials
from dpone.localserver.principal_pool import managed_server_users
from dpone.ports.clickhouse_request import Endpoint, read
from dpone.project.config import TableConfig, load_project
from dpone.project.refresh import RefreshService, TableReport
from dpone.project.status import ProjectStatus, project_status
from dpone.publication.composition import DEFAULT_STORE, provision_protected_databases

DEMO_DATABASE = "dpone_demo"
DEMO_TARGET = "customers"
DEMO_ROWS = [
    (
        1,
        "Ada Lovelace",
        "1234.50",
        "2024-02-29 23:59:59.1234567",
        "6F9619FF-8B86-D011-B42D-00C04FC964FF",
        b"\x00\xff",
    ),
    (2, "tab\there, newline\nthere", "-0.01", "1900-01-01 00:00:00.0000000", None, b""),
    (3, "NULL", None, "2299-12-31 23:59:59.9999999", None, None),
    (4, "", "9999999999999.99", "1970-01-01 00:00:00.0000000", None, bytes(range(256))),
    (
        5,
        "\x1d marker, 'quotes', \\backslash, emoji 🎉, עברית",
        "0",
        "2000-01-01 12:00:00.5000000",
        None,
        None,
    ),
]
GENERATED = 995  # realistic rows after the hostile ones: 1,000 in all
# The change between the two refreshes: deleted ids, updated ids, inserted rows.
DELETED = (2, 4, *range(100, 200))
UPDATED = (1, 3, *range(500, 510))
INSERTED = 25
# say(text): the demo's running commentary (silent under --json).
Say = Callable[[str], object]
CREATE = (
    "CREATE TABLE customers (id bigint NOT NULL, name nvarchar(200), balance decimal(18, 2), "
    "updated_at datetime2(7) NOT NULL, external_id uniqueidentifier, avatar varbinary)"
)


def _generated(start: int, count: int, seed: int) -> list[tuple[Any, ...]]:
    rng = random.Random(seed)  # noqa: S311 (repeatable demo data, not a secret)
    first = ("Grace", "Alan", "Edsger", "Barbara", "Donald", "Frances", "Ken", "Radia")
    last = ("Hopper", "Turing", "Dijkstra", "Liskov", "Knuth", "Allen", "Thompson", "Perlman")
    rows = []
    for i in range(start, start + count):
        name = f"{rng.choice(first)} {rng.choice(last)}"
        balance = f"{rng.randint(-50_000, 5_000_000) / 100:.2f}"
        when = f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} {rng.randint(0, 23):02d}:00:00.0000000"
        ext = str(uuid.UUID(int=rng.getrandbits(128))).upper()
        rows.append((i, name, balance, when, ext, rng.randbytes(rng.randint(0, 8)) or None))
    return rows


def build_source(path: Path) -> None:
    """(Re)create the demo source: 5 hostile rows and 995 realistic ones."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    with sqlite3.connect(path) as conn:
        conn.execute(CREATE)
        conn.executemany(
            "INSERT INTO customers VALUES (?, ?, ?, ?, ?, ?)",
            [*DEMO_ROWS, *_generated(6, GENERATED, seed=1)],
        )
    conn.close()


def change_source(path: Path) -> None:
    """Deletes, updates and inserts between the two refreshes."""
    with sqlite3.connect(path) as conn:
        conn.executemany("DELETE FROM customers WHERE id = ?", [(i,) for i in DELETED])
        conn.executemany(
            "UPDATE customers SET name = name || ' (updated)', balance = '0.01' WHERE id = ?",
            [(i,) for i in UPDATED],
        )
        conn.executemany(
            "INSERT INTO customers VALUES (?, ?, ?, ?, ?, ?)", _generated(5000, INSERTED, seed=2)
        )
    conn.close()


def write_project(work_dir: Path, data_dir: Path, store: Path) -> Path:
    """The demo's dpone.toml (absolute paths: the demo may run from anywhere)."""
    config = work_dir / "dpone.toml"
    config.write_text(
        "# Written by `dpone demo`; a second run rewrites it.\n"
        f"[project]\nwork_dir = {_toml(work_dir.absolute())}\nstore = {_toml(store.absolute())}\n"
        f"keep_rollback = 1\n\n[clickhouse]\ndata_dir = {_toml(data_dir.absolute())}\n\n"
        f'[sources.demo]\nkind = "sqlite"\npath = {_toml((work_dir / "source.db").absolute())}\n\n'
        f'[tables.customers]\nsource = "demo"\ntable = "customers"\n'
        f'target = "{DEMO_DATABASE}.{DEMO_TARGET}"\norder_by = "id"\n',
        encoding="utf-8",
    )
    return config


def _toml(path: Path) -> str:
    return '"' + str(path).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _source_rows(path: Path) -> list[list[Any]]:
    with sqlite3.connect(f"file:{path.absolute()}?mode=ro", uri=True) as conn:
        found = conn.execute("SELECT id, name FROM customers ORDER BY id").fetchall()
    conn.close()
    return [list(row) for row in found]


def _target_rows(data_dir: Path, port: int) -> list[list[Any]]:
    admin = HttpTransport(
        Endpoint("127.0.0.1", port, 0, DEMO_DATABASE), admin_credentials(data_dir)
    )
    result = admin.execute(
        read(
            f"SELECT id, name FROM {DEMO_DATABASE}.{DEMO_TARGET} ORDER BY id FORMAT JSONEachRow",
            f"dpone-demo-compare-{time.time_ns()}",
        ),
        deadline=time.monotonic() + 60,
    )
    return [[int(r["id"]), r["name"]] for r in result.json_rows()]


@click.command()
@data_dir_option
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".dpone/demo"),
    show_default=True,
    help="Where the demo's project, source, exports and journals go.",
)
@click.option(
    "--store",
    "store_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=DEFAULT_STORE,
    show_default=True,
    help="The publication store.",
)
@json_option
def demo(data_dir: Path, work_dir: Path, store_path: Path, as_json: bool) -> None:
    """Two verified full refreshes of a SQLite table into the local ClickHouse server."""
    # The demo's source, files, journals and server data are nobody else's business.
    os.umask(0o077)
    with reported_errors(as_json):
        started = time.monotonic()
        source = work_dir / "source.db"
        build_source(source)
        project = load_project(write_project(work_dir, data_dir, store_path))
        table = project.tables["customers"]
        say = (lambda text: None) if as_json else click.echo
        running = find_running(data_dir)
        info, local = _server(data_dir, running)
        say(
            f"ClickHouse {info.version} on http {info.http_port} ({info.data_dir}); "
            f"project {project.path}"
        )
        try:
            provision_protected_databases(data_dir, info.http_port, (DEMO_DATABASE,))
            first, second = _refresh_twice(RefreshService(project), table, source, say, as_json)
            refreshed = first.ok and second is not None and second.ok
            # A target a failed refresh never made is not read: the failure says why.
            found = _target_rows(data_dir, info.http_port) if refreshed else []
            expected = _source_rows(source)
            status = project_status(project)
        finally:
            if local is not None:
                local.stop()
        equal = expected == found
        deleted_gone = not {r[0] for r in found} & set(DELETED)
        ok = refreshed and equal and deleted_gone
        if as_json:
            emit_json(
                _payload(
                    ok,
                    info,
                    running is not None,
                    project.path,
                    first,
                    second,
                    equal,
                    len(found),
                    status.to_dict(),
                )
            )
        else:
            say(
                f"target {table.qualified_target} equals the new source row by row: {equal} "
                f"({len(found)} rows; deleted rows gone: {deleted_gone})"
            )
            _tell_status(say, status)
            _tell_next(say, project.path, started)
        if not ok:
            if not refreshed:
                raise SystemExit(1)
            raise StateError("the target does not equal the source", code="demo_mismatch")


def _server(data_dir: Path, running: ServerInfo | None) -> tuple[ServerInfo, LocalServer | None]:
    """The running server's info, or a server started for the demo (stopped at its end)."""
    if running is not None:
        return running, None
    local = LocalServer(data_dir, users=managed_server_users((DEMO_DATABASE,)))
    info = local.start()
    echo_warnings(local.warnings)
    return info, local


def _refresh_twice(
    service: RefreshService, table: TableConfig, source: Path, say: Say, as_json: bool
) -> tuple[TableReport, TableReport | None]:
    """Refresh, change the source, refresh again (not after a failed first refresh)."""
    first = service.refresh(table)
    _tell(say, "first refresh", first)
    if not as_json:
        echo_warnings(first.warnings)
    if not first.ok:
        return first, None
    change_source(source)
    say(
        f"changed the source: deleted {len(DELETED)} rows, updated {len(UPDATED)}, "
        f"inserted {INSERTED}"
    )
    second = service.refresh(table)
    _tell(say, "second refresh", second)
    if not as_json:
        echo_warnings(second.warnings)
    return first, second


def _tell_status(say: Say, status: ProjectStatus) -> None:
    say("dpone status:")
    for target in status.targets:
        last = target["last_publication"] or {}
        say(
            f"  {target['target']}: {last.get('rows')} rows, uuid {last.get('uuid')}; "
            f"rollback copies {[c['table'] for c in target['rollback_copies'] or []]}"
        )
    say(f"  needs a person: {len(status.needs_person)}")


def _tell_next(say: Say, config: Path, started: float) -> None:
    say(f"done in {time.monotonic() - started:.0f} s. Next:")
    say(
        f"  dpone server start --protect {DEMO_DATABASE}      # the demo stopped the server it started"
    )
    say(f"  dpone status --config {config}")
    say(f"  dpone refresh customers --config {config}")
    say("  dpone init                      # a dpone.toml for your own tables")


def _tell(say: Say, what: str, report: TableReport) -> None:
    if report.ok:
        say(
            f"{what}: published {report.rows} rows into {report.target} "
            f"(uuid {report.target_uuid_before} -> {report.target_uuid_after}) in "
            f"{sum(report.timings.values()):.1f} s"
        )
    else:
        error = report.error or {}
        say(f"{what}: FAILED in {report.phase}: [{error.get('code')}] {error.get('message')}")
        for command in report.next_commands:
            say(f"  next: {command}")


def _payload(
    ok: bool,
    info: Any,
    was_running: bool,
    config: Path,
    first: TableReport,
    second: TableReport | None,
    equal: bool,
    rows: int,
    status: dict[str, Any],
) -> dict[str, Any]:
    return {
        "ok": ok,
        "version": info.version,
        "http_port": info.http_port,
        "tcp_port": info.tcp_port,
        "data_dir": info.data_dir,
        "server_was_running": was_running,
        "config": str(config),
        "database": DEMO_DATABASE,
        "target": f"{DEMO_DATABASE}.{DEMO_TARGET}",
        "rows": rows,
        "target_equals_source": equal,
        "refreshes": [r.to_dict() for r in (first, second) if r is not None],
        "status": status,
    }
