"""The options ``dpone stage`` and ``dpone attempts`` share, and the staging configuration
they make (the endpoint, its credentials, the transport, the converter)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from dpone.cli.connection import managed_credentials, project_server_option
from dpone.cli.server import data_dir_option
from dpone.contracts.composition_snapshot import DEFAULT_LIMITS, SnapshotLimits
from dpone.errors import ConfigurationError
from dpone.localserver import find_running
from dpone.localserver.protected import start_command
from dpone.ports.clickhouse_request import Endpoint
from dpone.preparation.modes import DEFAULT_MODE, MODES, refuse_removed_mode
from dpone.project.server import server_access
from dpone.publication.composition import DEFAULT_STORE
from dpone.publication.store import store_argument
from dpone.staging.composition import StagingConfig

existing_file = click.Path(exists=True, dir_okay=False, path_type=Path)
work_dir_option = click.option(
    "--work-dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Directory holding attempt journals and spools.",
)


class StoreParam(click.ParamType):  # type: ignore[type-arg]
    """``--store``: a SQLite file's path, or a PostgreSQL store's ``postgresql://`` URL."""

    name = "store"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> Path | str:
        if isinstance(value, Path):
            return value
        return store_argument(str(value))


STORE = StoreParam()

store_option = click.option(
    "--store",
    "store_path",
    type=STORE,
    default=DEFAULT_STORE,
    show_default=True,
    help="The publication store holding the attempt's ingest lease (a SQLite file, or "
    "postgresql://USER@HOST:PORT/DB).",
)


# The largest ceiling: a signed 64-bit count, as the store and the server hold it.
_MAX_CEILING = 2**63 - 1


def _limits(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> SnapshotLimits:
    """``--limit CEILING=N`` (repeatable) over the publication's defaults."""
    # Retained storage is what the database holds besides the stream: no stream crosses it.
    names = [name for name in DEFAULT_LIMITS.to_document() if name != "retained_storage_bytes"]
    given: dict[str, int] = {}
    for value in values:
        name, sep, number = value.partition("=")
        if (
            not sep
            or name not in names
            or re.fullmatch(r"[0-9]{1,19}", number) is None
            or not 1 <= int(number) <= _MAX_CEILING
        ):
            raise click.BadParameter(
                f"{value!r} is not CEILING=N with N an integer from 1 to {_MAX_CEILING} and "
                f"CEILING one of {', '.join(names)}",
                ctx,
                param,
            )
        given[name] = int(number)
    return dataclasses.replace(DEFAULT_LIMITS, **given)


limit_option = click.option(
    "--limit",
    "limits",
    multiple=True,
    metavar="CEILING=N",
    callback=_limits,
    help="A publication ceiling the stream must stay under (repeatable): source_rows, "
    "source_bytes, wire_bytes, generation_storage_bytes, total_transient_storage_bytes "
    "(default: the publication's, DEFAULT_LIMITS). A stream that would cross one is "
    "stopped: limit_exceeded.",
)


F = TypeVar("F", bound=Callable[..., Any])


class PreparationChoice(click.Choice[str]):
    """The preparation modes. A removed one (``engine-chdb``) is refused with its typed
    error, ``preparation_mode_removed``, which names the replacement, not as an
    unknown choice."""

    def __init__(self) -> None:
        super().__init__(MODES)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        if isinstance(value, str):
            refuse_removed_mode(value)
        return super().convert(value, param, ctx)


def server_options(func: F) -> F:
    """Where the ClickHouse server is: the managed local one by default."""
    for option in reversed(
        [
            data_dir_option,
            project_server_option,
            click.option("--host", help="A ClickHouse host instead of the managed local server."),
            click.option("--http-port", type=int, help="HTTP port (with --host)."),
            click.option("--tcp-port", type=int, help="Native port (with --host)."),
            click.option("--database", required=True, help="The Atomic database to stage into."),
            click.option(
                "--transport",
                type=click.Choice(["http", "client"]),
                default="http",
                show_default=True,
                help="Controlled transport; chosen explicitly, never auto.",
            ),
            click.option(
                "--client-path",
                default="clickhouse-client",
                show_default=True,
                help="clickhouse-client binary for --transport client.",
            ),
            click.option(
                "--preparation",
                "preparation_mode",
                type=PreparationChoice(),
                default=DEFAULT_MODE,
                show_default=True,
                help="RowBinary converter: compiled (a file it declines goes to the Python "
                "reference), or the Python reference alone; both give the same bytes.",
            ),
        ]
    ):
        func = option(func)
    return func


def staging_config(
    data_dir: Path,
    host: str | None,
    http_port: int | None,
    tcp_port: int | None,
    database: str,
    transport: str,
    client_path: str,
    work_dir: Path,
    preparation_mode: str = DEFAULT_MODE,
    project_config: Path | None = None,
) -> StagingConfig:
    """Endpoint from options; credentials from the environment or the managed server's
    file, or, with ``project_config``, the endpoint and operator of the project's server."""
    if project_config is not None:
        if host is not None:
            raise ConfigurationError(
                "--config names the server; do not give --host too", code="conflicting_server"
            )
        access = server_access(data_dir, project_config)
        return StagingConfig(
            access.endpoint(database),
            access.operator(),
            work_dir,
            transport=transport,
            client_path=client_path,
            preparation_mode=preparation_mode,
        )
    if host is None:
        info = find_running(data_dir)
        if info is None:
            command = start_command(data_dir, also=(database,))
            raise ConfigurationError(
                f"no managed server runs on {data_dir}; start it with `{command}` or pass --host",
                code="no_server",
                next_command=command,
            )
        endpoint = Endpoint("127.0.0.1", info.http_port, info.tcp_port, database)
    else:
        if http_port is None or tcp_port is None:
            raise ConfigurationError(
                "--host needs --http-port and --tcp-port", code="incomplete_endpoint"
            )
        endpoint = Endpoint(host, http_port, tcp_port, database)
    credentials = managed_credentials(data_dir, managed=host is None)
    return StagingConfig(
        endpoint,
        credentials,
        work_dir,
        transport=transport,
        client_path=client_path,
        preparation_mode=preparation_mode,
    )
