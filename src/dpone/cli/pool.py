"""``dpone pool``: dpone's principals on a ClickHouse server you run.

``render`` writes the users file the server's operator installs (in ``users.d``) and
the private credentials file dpone's host keeps; ``verify`` proves, before any work,
that the server holds exactly that installation.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import click

from dpone.cli.output import config_option, emit_json, json_option, reported_errors
from dpone.durable_files import atomic_outputs, check_outputs
from dpone.errors import ConfigurationError, DponeError, StateError
from dpone.localserver.pool_file import (
    DEFAULT_NETWORKS,
    read_pool_file,
    render_pool,
    retire_principal,
)
from dpone.localserver.principal_pool import PoolNames
from dpone.project.config import load_project
from dpone.project.hand_over import hand_over_project
from dpone.publication.composition import check_ownership
from dpone.publication.principals.ownership import OwnedElsewhere
from dpone.publication.principals.pool_rotation import finish_rotation
from dpone.publication.principals.pool_verify import verify_pool
from dpone.publication.store import StoreLocation, open_store, store_exists


@click.group()
def pool() -> None:
    """dpone's principals on a ClickHouse server (render, verify, hand-over)."""


@pool.command()
@click.option(
    "--protect",
    "databases",
    multiple=True,
    required=True,
    help="A database dpone publishes into (repeat for each).",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path, dir_okay=False),
    required=True,
    help="The users file to write, for the server's users.d (password hashes only).",
)
@click.option(
    "--credentials",
    type=click.Path(path_type=Path, dir_okay=False),
    required=True,
    help="The credentials file to write for dpone's host (0600; the only place the "
    "passwords exist).",
)
@click.option(
    "--network",
    "networks",
    multiple=True,
    help=f"An address or CIDR block the principals may connect from (repeat; default "
    f"{', '.join(DEFAULT_NETWORKS)}).",
)
@click.option(
    "--pool",
    "pool_name",
    default="",
    help="The pool's name, one per project on a shared server: `--pool sales` makes "
    "dpone_sales_ingest_1...; the project names it with [clickhouse] pool. Default: "
    "the default pool (dpone_ingest_1...).",
)
@click.option(
    "--format",
    "form",
    type=click.Choice(["xml", "sql"]),
    default="xml",
    show_default=True,
    help="xml: a users file for users.d; sql: CREATE USER / GRANT statements for a server "
    "whose users are managed by SQL (run them as its administrator).",
)
@click.option(
    "--retired",
    multiple=True,
    help="A principal retired with `dpone pool retire` (repeat): left out of the users "
    "file, dropped by the SQL, kept retired in the credentials file.",
)
@click.option(
    "--rotate-from",
    "rotate_from",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="A rotation with overlap: the credentials file in use now. The new file keeps "
    "each old password beside the new one (dpone takes the new as soon as the server "
    "does); with --format sql the statements add the new passwords beside the old.",
)
@click.option("--force", is_flag=True, help="Replace existing files (a rotation).")
@json_option
def render(
    databases: tuple[str, ...],
    out: Path,
    credentials: Path,
    networks: tuple[str, ...],
    pool_name: str,
    form: str,
    retired: tuple[str, ...],
    rotate_from: Path | None,
    force: bool,
    as_json: bool,
) -> None:
    """Write a new pool: the server's users file (or SQL) and dpone's credentials file.

    Both appear together or not at all; new passwords are generated each time. A
    rotation names the credentials file in use with --rotate-from: old and new
    passwords overlap until `dpone pool finish-rotation`.
    """
    with reported_errors(as_json):
        names = PoolNames(pool_name)
        current = None if rotate_from is None else read_pool_file(rotate_from, names)
        if current is not None and current.previous:
            # Its previous passwords may be the only ones the server takes: keep them.
            raise StateError(
                f"{rotate_from} is in a rotation not finished yet: run `dpone pool "
                "finish-rotation --config dpone.toml` once the server takes its new "
                "passwords, then rotate again",
                code="rotation_pending",
                path=str(rotate_from),
            )
        rendered = render_pool(
            databases,
            networks=networks or DEFAULT_NETWORKS,
            pool=names,
            retired=(*sorted(current.retired if current else ()), *retired),
            previous=None if current is None else current.passwords,
        )
        server_text = rendered.users_xml
        if form == "sql":
            server_text = rendered.users_sql if current is None else rendered.rotation_sql
        with atomic_outputs([out, credentials], force=force) as (users_stream, secret_stream):
            users_stream.write(server_text.encode("utf-8"))
            secret_stream.write(rendered.credentials_json.encode("utf-8"))
        if as_json:
            emit_json(
                {
                    "ok": True,
                    "users_file": str(out),
                    "credentials_file": str(credentials),
                    "users": list(rendered.users),
                    "databases": list(databases),
                    "pool": pool_name,
                    "format": form,
                    "retired": list(rendered.retired),
                    "rotation": current is not None,
                }
            )
        else:
            what = "SQL file" if form == "sql" else "users file"
            click.echo(f"{what}: {out} ({len(rendered.users)} principals, hashes only)")
            click.echo(f"credentials file: {credentials} (0600; keep it on dpone's host only)")
            if pool_name:
                click.echo(f'the project names it in [clickhouse]: pool = "{pool_name}"')
            if current is not None:
                click.echo(
                    "a rotation: the credentials file keeps the old passwords beside the new; "
                    "dpone signs in with the new ones as soon as the server takes them, then "
                    "`dpone pool finish-rotation --config dpone.toml` drops the old ones"
                )
            click.echo(
                f"next: run {out} as the server's administrator (clickhouse-client "
                f"--multiquery < {out}), then run `dpone pool verify`"
                if form == "sql"
                else "next: install the users file in the server's users.d directory (the "
                "server reads it by itself), then run `dpone pool verify`"
            )


@pool.command()
@config_option
@json_option
def verify(config_path: Path, as_json: bool) -> None:
    """Prove the project's server holds the pool: logins, exact grants, databases,
    version and identity. Exit 0 when all hold, 1 otherwise."""
    with reported_errors(as_json):
        project = load_project(config_path)
        if project.clickhouse.remote is None:
            raise ConfigurationError(
                f"{config_path} names the managed local server, whose pool dpone declares "
                "itself; `dpone pool verify` is for a server named with host",
                code="not_remote",
            )
        # Another store's pool: nothing signs in as its principals, not even to verify.
        try:
            check_ownership(project.clickhouse.access, project.store, project=project.path)
        except OwnedElsewhere:
            raise
        except DponeError:
            pass  # unread: the verification names why (TLS, a refused sign-in)
        found = verify_pool(project.clickhouse.access, project.databases, project.store)
        if as_json:
            emit_json(found.to_dict())
        else:
            click.echo(f"{found.server}: ClickHouse {found.version}, identity {found.identity}")
            for entry in found.principals:
                ok = entry.get("authenticated") and entry.get("grants_exact")
                state = "retired" if entry.get("retired") else "ok" if ok else "NOT OK"
                click.echo(f"  {entry['user']} ({entry['role']}): {state}")
            for problem in found.problems:
                _echo_problem(problem)
            if found.problems:
                again = shlex.join(["dpone", "pool", "verify", "--config", str(config_path)])
                click.echo(
                    f"{len(found.problems)} problem(s); once fixed, run `{again}` again", err=True
                )
            if found.ok:
                click.echo("the pool is installed as dpone needs it")
        if not found.ok:
            raise SystemExit(1)


@pool.command()
@click.argument("user")
@config_option
@json_option
def retire(user: str, config_path: Path, as_json: bool) -> None:
    """Retire one principal (a compromised one): dpone never leases or uses it again.

    Its password is removed from the credentials file at once. The server still accepts
    it until the operator installs a render with `--retired USER` (which leaves it out);
    until then dpone counts the principal's write grants as a writer outside the pool.
    """
    with reported_errors(as_json):
        project = load_project(config_path)
        remote = project.clickhouse.remote
        if remote is None:
            raise ConfigurationError(
                f"{config_path} names the managed local server, whose pool dpone declares "
                "itself; `dpone pool retire` is for a server named with host",
                code="not_remote",
            )
        pool_names = PoolNames(project.clickhouse.pool)
        _refuse_held(project.store, user, config_path)
        retired = retire_principal(remote.credentials_file, user, pool_names)
        again = shlex.join(
            [
                "dpone",
                "pool",
                "render",
                *(a for d in project.databases for a in ("--protect", d)),
                *(("--pool", pool_names.name) if pool_names.name else ()),
                *(a for r in retired for a in ("--retired", r)),
                # A rotation: the others keep their passwords valid until it is finished.
                *("--rotate-from", str(remote.credentials_file)),
                "--out",
                "dpone-users.xml",
                "--credentials",
                "NEW_FILE",
            ]
        )
        # Not known here: the networks and the form the pool was rendered with.
        same = "repeat the --network options (and --format sql) the pool was rendered with"
        if as_json:
            emit_json({"ok": True, "retired": list(retired), "next_command": again, "note": same})
            return
        click.echo(f"{user} is retired: dpone no longer leases or uses it")
        click.echo(
            "the server still accepts its password: render the pool without it "
            f"(`{again}`; {same}), install it, then use the new credentials file"
        )


@pool.command(name="finish-rotation")
@config_option
@click.option(
    "--sql-out",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write the SQL that leaves each principal with its new password only (a server "
    "whose users are managed by SQL; 0600).",
)
@json_option
def finish_rotation_command(config_path: Path, sql_out: Path | None, as_json: bool) -> None:
    """End a rotation: once the server takes every new password, drop the previous ones.

    Nothing changes while the server refuses a new password (`rotation_not_installed`).
    """
    with reported_errors(as_json):
        project = load_project(config_path)
        if sql_out is not None:  # refused before the credentials file changes
            check_outputs([sql_out])
        finished = finish_rotation(project.clickhouse.access)
        if sql_out is not None and finished.users:
            with atomic_outputs([sql_out]) as (stream,):
                stream.write(finished.remove_old_sql.encode("utf-8"))
        if as_json:
            emit_json(
                {
                    "ok": True,
                    "users": list(finished.users),
                    "sql_file": str(sql_out) if sql_out and finished.users else None,
                }
            )
            return
        if not finished.users:
            click.echo("no rotation to finish: the credentials file holds one password each")
            return
        click.echo(f"dpone now signs in with the new passwords only ({len(finished.users)})")
        if sql_out is not None:
            click.echo(f"run {sql_out} as the server's administrator to remove the old ones")


@pool.command(name="hand-over")
@config_option
@click.option(
    "--from",
    "old_store",
    required=True,
    help="The store that owns the pool or slots now (its id, as a refusal names it); "
    "only what it owns is handed over.",
)
@json_option
def hand_over(config_path: Path, old_store: str, as_json: bool) -> None:
    """Give this project's store the pool and target slots another store owns.

    Only for a store that is really gone (its machine or disk lost, the project moved to a
    new store): two live stores on one pool or target break each other's proofs.
    """
    with reported_errors(as_json):
        outcome = hand_over_project(load_project(config_path), old_store)
        if as_json:
            emit_json({"ok": True, **outcome})
            return
        for marker in outcome["markers"]:
            owner = marker["owner"]
            who = "nobody" if owner is None else f"store {owner['store']} ({owner['path']})"
            moved = "handed over" if marker["handed_over"] else "unchanged"
            what = marker["about"] if marker["marks"] == "pool" else f"slot {marker['about']}"
            click.echo(f"{what}: {moved}, owned by {who}")


def _refuse_held(store_location: StoreLocation, user: str, config_path: Path) -> None:
    """Refuse to retire ``user`` while its last lease is active or its closure unproven:
    the closure signs in as the principal (to close its sessions), which needs the
    password retiring removes (``principal_leased``, naming the command that ends it)."""
    if not store_exists(store_location):
        return
    store = open_store(store_location, create=False)
    for record in store.last_lease_records():
        lease = record.lease
        if lease.user != user:
            continue
        if lease.active or not store.closure_proven(lease):
            command = shlex.join(
                [
                    *("dpone", "snapshot", "close-lease", lease.lease_id),
                    *("--store", str(store_location), "--config", str(config_path)),
                ]
            )
            raise StateError(
                f"{user} holds lease {lease.lease_id} "
                f"({'active' if lease.active else 'ended, closure not proven'}): its closure "
                f"signs in as {user}; end and close it first (`{command}`), then retire it",
                code="principal_leased",
                user=user,
                lease_id=lease.lease_id,
                next_command=command,
            )


def _echo_problem(problem: dict[str, Any]) -> None:
    """One problem of ``pool verify``: what is wrong, about whom, and what fixes it."""
    about = [f"{key} {problem[key]}" for key in ("user", "database") if problem.get(key)]
    if problem.get("users"):
        about.append(f"users {', '.join(problem['users'])}")
    where = f" ({'; '.join(about)})" if about else ""
    click.echo(f"problem [{problem['code']}]{where}: {problem['message']}", err=True)
    for key in ("missing", "extra"):
        if problem.get(key):
            click.echo(f"  {key} grants: {', '.join(problem[key])}", err=True)
    if problem.get("statement"):
        click.echo(f"  statement: {problem['statement']}", err=True)
    click.echo(f"  fix: {problem['fix']}", err=True)
