"""Which credentials a command uses to talk to ClickHouse.

One rule for every command: credentials given in the environment
(``DPONE_CLICKHOUSE_USER`` / ``DPONE_CLICKHOUSE_PASSWORD``) win; otherwise a command
that talks to the managed local server reads its administrator's credentials from
the data directory's credentials file. Nobody types or copies a password.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import click

from dpone.localserver import admin_credentials
from dpone.ports.clickhouse_request import Credentials

F = TypeVar("F", bound=Callable[..., Any])

USER_VARIABLE = "DPONE_CLICKHOUSE_USER"
PASSWORD_VARIABLE = "DPONE_CLICKHOUSE_PASSWORD"  # noqa: S105 (a variable name)


def managed_credentials(
    data_dir: Path, *, managed: bool = True, environ: Mapping[str, str] | None = None
) -> Credentials:
    """The environment's credentials when set, else the managed server's administrator.

    ``managed=False`` (a ``--host`` server) never reads the managed server's file:
    the environment's user, ``default`` without a password when unset.
    """
    env = os.environ if environ is None else environ
    if USER_VARIABLE in env or PASSWORD_VARIABLE in env:
        return Credentials(env.get(USER_VARIABLE, "default"), env.get(PASSWORD_VARIABLE, ""))
    if not managed:
        return Credentials("default")
    return admin_credentials(data_dir)


def project_server_option(func: F) -> F:
    """``--config``: take the server (a remote one's host, ports and credentials file)
    from a project file instead of ``--data-dir``; the commands status names use it."""
    return click.option(
        "--config",
        "project_config",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="A project file whose [clickhouse] server to use instead of --data-dir.",
    )(func)
