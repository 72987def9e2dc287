"""``dpone server``: start, stop and inspect the managed local ClickHouse server.

Every user of the server authenticates; the administrator's generated password is in
the data directory's credentials file, which dpone's commands read themselves.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType

import click

from dpone.cli.output import echo_warnings, emit_json, json_option, reported_errors
from dpone.connectors.clickhouse_client_config import client_config
from dpone.errors import LocalServerError
from dpone.localserver import (
    LocalServer,
    ServerInfo,
    ServerNotRunning,
    admin_credentials,
    find_running,
    rotate_credentials,
    rotation_pending,
    stop_running,
)
from dpone.localserver.layout import DEFAULT_DATA_DIR, DataDirLayout
from dpone.localserver.principal_pool import managed_server_users
from dpone.localserver.protected import (
    DEFAULT_PROTECTED_DATABASE,
    check_pools,
    databases_to_start,
    parse_pools,
    record_protected,
    recorded_pools,
    recorded_protected,
    restart_commands,
    start_command,
)
from dpone.publication.composition import provision_protected_databases

data_dir_option = click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_DATA_DIR,
    show_default=True,
    envvar="DPONE_DATA_DIR",
    help="Directory that holds the server's data, configuration and logs.",
)


@click.group()
def server() -> None:
    """Manage the local ClickHouse server (the embedded default)."""


@server.command()
@data_dir_option
@click.option(
    "--http-port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="HTTP port; 0 lets the system choose.",
)
@click.option(
    "--tcp-port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="Native protocol port; 0 lets the system choose.",
)
@click.option(
    "--foreground", is_flag=True, help="Stay attached; stop the server on Ctrl-C or SIGTERM."
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.1),
    default=60.0,
    show_default=True,
    help="Seconds to wait for readiness.",
)
@click.option(
    "--protect",
    "protected",
    multiple=True,
    help="A database that publications replace tables in (repeatable); the publication "
    "pool gets its grants there. Recorded in the data directory: without --protect the "
    f"recorded set is started again (the first time: {DEFAULT_PROTECTED_DATABASE}); a "
    "given set replaces the record. Users are read at start only: a new one needs a restart.",
)
@click.option(
    "--pool",
    "pools",
    multiple=True,
    metavar="NAME:DB[,DB...]",
    help="A named pool and the databases it protects, declared beside the default pool "
    "(repeatable), for a project whose [clickhouse] pool names it: several projects then "
    "share this server, each with its own principals and databases. Recorded like "
    "--protect: without --pool the recorded pools are declared again; given ones replace "
    "the record.",
)
@json_option
def start(
    data_dir: Path,
    http_port: int,
    tcp_port: int,
    foreground: bool,
    timeout: float,
    protected: tuple[str, ...],
    pools: tuple[str, ...],
    as_json: bool,
) -> None:
    """Start a server on DATA_DIR and wait until both ports accept connections."""
    with reported_errors(as_json):
        databases, recorded = databases_to_start(data_dir, protected)
        named = parse_pools(pools) if pools else recorded_pools(data_dir)
        check_pools(databases, named)
        local = LocalServer(
            data_dir,
            users=managed_server_users(databases, pools=named),
            http_port=http_port,
            tcp_port=tcp_port,
            watch_parent=foreground,
            start_timeout=timeout,
        )
        info = local.start()
        # Recorded once the server runs with them: the record is what a restart repeats.
        record_protected(data_dir, databases, named)
        every = (*databases, *(d for dbs in named.values() for d in dbs))
        provision_protected_databases(data_dir, info.http_port, every)
        replaced = recorded if recorded is not None and set(recorded) != set(databases) else None
        echo_warnings(local.warnings)
        if as_json:
            emit_json(
                {
                    "ok": True,
                    **_described(info),
                    "protected_from": "option"
                    if protected
                    else "record"
                    if recorded
                    else "default",
                    "protected_replaced": list(replaced) if replaced is not None else None,
                    "warnings": list(local.warnings),
                }
            )
        else:
            click.echo(
                f"server ready: pid {info.pid}, http {info.http_port}, tcp {info.tcp_port}, "
                f"version {info.version}, data dir {info.data_dir}"
            )
            click.echo(f"credentials: {_credentials_file(info.data_dir)}")
            _echo_protected(info.data_dir, replaced)
        if foreground:
            _serve_until_signalled(local)


def _credentials_file(data_dir: str | Path) -> str:
    return str(DataDirLayout.at(data_dir).credentials_file)


def _described(info: ServerInfo) -> dict[str, object]:
    """A running server's facts for ``--json``: where the credentials are, never them."""
    return {
        "running": True,
        **info.to_dict(),
        "credentials_file": _credentials_file(info.data_dir),
        "credentials_rotation_pending": rotation_pending(info.data_dir),
        **_protection(info.data_dir),
    }


def _protection(data_dir: str | Path) -> dict[str, object]:
    """The recorded protected databases and the command that starts the server as it was."""
    recorded = recorded_protected(data_dir)
    return {
        "protected_databases": list(recorded) if recorded is not None else None,
        "pools": {name: list(dbs) for name, dbs in recorded_pools(data_dir).items()},
        "start_command": start_command(data_dir),
    }


def _echo_protected(data_dir: str | Path, replaced: tuple[str, ...] | None = None) -> None:
    recorded = recorded_protected(data_dir)
    if recorded is None:
        click.echo("protected databases: none recorded (started by the library or an older dpone)")
    else:
        where = DataDirLayout.at(data_dir).protected_file
        click.echo(f"protected databases: {', '.join(recorded)} (recorded in {where})")
        for name, dbs in recorded_pools(data_dir).items():
            click.echo(f"pool {name}: protects {', '.join(dbs)}")
    if replaced is not None:
        click.echo(
            f"the protected databases changed: they were {', '.join(replaced)}; the given "
            "--protect set replaced the record"
        )


def _serve_until_signalled(local: LocalServer) -> None:
    def _interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _interrupt)
    try:
        code = local.wait()
    except KeyboardInterrupt:
        report = local.stop()
        click.echo(f"server stopped in {report.seconds:.2f} s", err=True)
        return
    click.echo(f"server exited with code {code}", err=True)
    sys.exit(0 if code == 0 else 1)


@server.command()
@data_dir_option
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.1),
    default=15.0,
    show_default=True,
    help="Seconds to wait for a clean stop before signals are sent.",
)
@json_option
def stop(data_dir: Path, timeout: float, as_json: bool) -> None:
    """Stop the server running on DATA_DIR."""
    with reported_errors(as_json):
        report = stop_running(data_dir, timeout=timeout)
        if as_json:
            emit_json(
                {
                    "ok": True,
                    "pid": report.pid,
                    "forced": report.forced,
                    "seconds": round(report.seconds, 3),
                }
            )
        else:
            how = "after signals" if report.forced else "cleanly"
            click.echo(f"server pid {report.pid} stopped {how} in {report.seconds:.2f} s")


@server.command()
@data_dir_option
@json_option
def status(data_dir: Path, as_json: bool) -> None:
    """Report whether a server runs on DATA_DIR (exit 1 when none does).

    ``ok`` says the question was answered; ``running`` gives the answer.
    """
    with reported_errors(as_json):
        info = find_running(data_dir)
        protection = _protection(data_dir)
    if info is None:
        if as_json:
            # ok follows the exit code: "no server" is the answer scripts test for.
            emit_json(
                {
                    "ok": False,
                    "running": False,
                    "data_dir": str(data_dir.absolute()),
                    **protection,
                    "error": {
                        "code": "server_not_running",
                        "message": "no server is running",
                        "details": {},
                    },
                }
            )
        else:
            click.echo(f"no server is running on {data_dir.absolute()}")
            _echo_protected(data_dir)
            click.echo(f"start it as it was: {protection['start_command']}")
        sys.exit(1)
    if as_json:
        emit_json({"ok": True, **_described(info)})
    else:
        click.echo(
            f"running: pid {info.pid}, http {info.http_port}, tcp {info.tcp_port}, "
            f"version {info.version}, data dir {info.data_dir}, since {info.started_at}"
        )
        click.echo(f"credentials: {_credentials_file(info.data_dir)}")
        _echo_protected(info.data_dir)
        if rotation_pending(info.data_dir):
            click.echo(
                f"rotated credentials wait for a restart ({restart_commands(info.data_dir)})"
            )


def _running(data_dir: Path) -> ServerInfo:
    info = find_running(data_dir)
    if info is None:
        raise ServerNotRunning(f"no server is running on {data_dir.absolute()}")
    return info


@server.command()
@data_dir_option
def url(data_dir: Path) -> None:
    """Print the HTTP URL of the server running on DATA_DIR (never with a password).

    Other tools authenticate as the administrator ``dpone_admin`` with its password
    from the credentials file (``dpone server status`` names it); ``default`` needs
    no password but may do nothing.
    """
    with reported_errors(False):
        click.echo(_running(data_dir).http_url)


@server.command("rotate-credentials")
@data_dir_option
@json_option
def rotate(data_dir: Path, as_json: bool) -> None:
    """Replace the generated passwords; the next start of the server applies them.

    The server reads its users only at start: until it restarts, the old passwords
    stay valid and dpone keeps using them.
    """
    with reported_errors(as_json):
        users = rotate_credentials(data_dir)
        running = find_running(data_dir) is not None
        if as_json:
            emit_json(
                {
                    "ok": True,
                    "users": list(users),
                    "applied_at_next_start": True,
                    "credentials_file": _credentials_file(data_dir),
                }
            )
            return
        if not users:
            click.echo("no generated passwords to rotate (see docs/local-server.md)")
            return
        click.echo(f"new passwords prepared for: {', '.join(users)}")
        if running:
            click.echo(f"they take effect when the server restarts: {restart_commands(data_dir)}")
        else:
            click.echo(f"they take effect at the next start: {start_command(data_dir)}")


@server.command(context_settings={"ignore_unknown_options": True})
@data_dir_option
@click.option(
    "--client-path",
    default="clickhouse-client",
    show_default=True,
    help="The clickhouse-client binary.",
)
@click.argument("client_args", nargs=-1, type=click.UNPROCESSED)
def client(data_dir: Path, client_path: str, client_args: tuple[str, ...]) -> None:
    """Open clickhouse-client on the server as its administrator.

    The credentials reach the client through a private (0600) configuration file,
    never its arguments. CLIENT_ARGS (after ``--``) are passed on, e.g.
    ``dpone server client -- --query 'SELECT 1'``.
    """
    with reported_errors(False):
        info = _running(data_dir)
        credentials = admin_credentials(data_dir)
        with client_config(credentials) as (config, config_fd):
            argv = [
                client_path,
                "--config-file",
                config,
                "--host",
                "127.0.0.1",
                "--port",
                str(info.tcp_port),
                *client_args,
            ]
            try:
                code = subprocess.call(argv, pass_fds=(config_fd,))
            except FileNotFoundError as exc:
                raise LocalServerError(
                    f"{client_path!r} not found; install clickhouse-client or pass --client-path",
                    code="client_not_found",
                ) from exc
    sys.exit(code)
