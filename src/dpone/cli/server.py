"""``dpone server``: start, stop and inspect the managed local ClickHouse server."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from types import FrameType

import click

from dpone.cli.output import emit_json, json_option, reported_errors
from dpone.localserver import LocalServer, ServerNotRunning, find_running, stop_running
from dpone.localserver.layout import DEFAULT_DATA_DIR

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
@json_option
def start(
    data_dir: Path,
    http_port: int,
    tcp_port: int,
    foreground: bool,
    timeout: float,
    as_json: bool,
) -> None:
    """Start a server on DATA_DIR and wait until both ports accept connections."""
    with reported_errors(as_json):
        local = LocalServer(
            data_dir,
            http_port=http_port,
            tcp_port=tcp_port,
            watch_parent=foreground,
            start_timeout=timeout,
        )
        info = local.start()
        if as_json:
            emit_json({"ok": True, "running": True, **info.to_dict()})
        else:
            click.echo(
                f"server ready: pid {info.pid}, http {info.http_port}, tcp {info.tcp_port}, "
                f"version {info.version}, data dir {info.data_dir}"
            )
        if foreground:
            _serve_until_signalled(local)


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
    """Report whether a server runs on DATA_DIR (exit 1 when none does)."""
    info = find_running(data_dir)
    if info is None:
        if as_json:
            emit_json({"running": False, "data_dir": str(data_dir.absolute())})
        else:
            click.echo(f"no server is running on {data_dir.absolute()}")
        sys.exit(1)
    if as_json:
        emit_json({"running": True, **info.to_dict()})
    else:
        click.echo(
            f"running: pid {info.pid}, http {info.http_port}, tcp {info.tcp_port}, "
            f"version {info.version}, data dir {info.data_dir}, since {info.started_at}"
        )


@server.command()
@data_dir_option
def url(data_dir: Path) -> None:
    """Print the HTTP URL of the server running on DATA_DIR."""
    with reported_errors(False):
        info = find_running(data_dir)
        if info is None:
            raise ServerNotRunning(f"no server is running on {data_dir.absolute()}")
        click.echo(info.http_url)
