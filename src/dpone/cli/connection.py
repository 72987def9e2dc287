"""Which credentials a command uses to talk to ClickHouse.

One rule for every command: credentials given in the environment
(``DPONE_CLICKHOUSE_USER`` / ``DPONE_CLICKHOUSE_PASSWORD``) win; otherwise a command
that talks to the managed local server reads its administrator's credentials from
the data directory's credentials file. Nobody types or copies a password.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from dpone.localserver import admin_credentials
from dpone.ports.clickhouse_request import Credentials

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
