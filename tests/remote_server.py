"""A ClickHouse server dpone did not start, set up as its operator would.

The server is the managed local server's engine started with only its own two users
(no pool declared by dpone), then prepared exactly as an operator prepares a server
they run: the users file ``dpone pool render`` wrote is installed in the server's
``users.d`` directory, and the administrator creates the protected databases and
``_dpone_identity`` (the embedded engine reports a nil ``serverUUID``). dpone then
reaches it only through ``[clickhouse] host``, the ports and the credentials file: no
data directory, no administrator.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from dpone.localserver import LocalServer
from tests import chhttp

POOL_FILE = "dpone-users.xml"


def clickhouse_toml(http_port: int, tcp_port: int, credentials: Path) -> str:
    """The ``[clickhouse]`` section of a project that reaches the server only by host,
    ports and credentials file."""
    return (
        "[clickhouse]\n"
        'host = "127.0.0.1"\n'
        f"http_port = {http_port}\n"
        f"tcp_port = {tcp_port}\n"
        f'credentials_file = "{credentials}"\n'
        # The server's own administrator, vouched for as an operator would.
        'trusted_writers = ["dpone_admin"]\n'
    )


def render_pool(databases: Sequence[str], out: Path, credentials: Path) -> None:
    """``dpone pool render`` as an operator runs it."""
    protect = [arg for d in databases for arg in ("--protect", d)]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "dpone",
            "pool",
            "render",
            *protect,
            "--out",
            str(out),
            "--credentials",
            str(credentials),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def remote_server(
    root: Path,
    databases: Sequence[str],
    *,
    tamper: Callable[[str], str] | None = None,
    identity: bool = True,
    python: str | None = None,
) -> Iterator[dict[str, Any]]:
    """Start the server with the rendered pool installed; yield what a project names.

    ``tamper`` changes the users file before it is installed (an operator's mistake);
    ``identity`` False leaves ``_dpone_identity`` uncreated; ``python`` runs the engine
    under another interpreter (another server version's package).
    """
    data_dir = root / "server"
    users_d = data_dir / "run" / "users.d"
    users_d.mkdir(parents=True)
    os.chmod(data_dir / "run", 0o700)
    credentials = root / "dpone-credentials.json"
    render_pool(databases, root / POOL_FILE, credentials)
    # The operator's install: the file as rendered, into users.d.
    text = (root / POOL_FILE).read_text()
    (users_d / POOL_FILE).write_text(tamper(text) if tamper else text)
    server = LocalServer(data_dir, users=(), python=python)
    info = server.start()
    chhttp.register_server(info.http_port, data_dir)
    try:
        for name in ("_dpone_identity", *databases) if identity else databases:
            chhttp.query(info.http_port, f"CREATE DATABASE IF NOT EXISTS {name} ENGINE = Atomic")
        yield {
            "kind": "remote",
            "http_port": info.http_port,
            "tcp_port": info.tcp_port,
            "credentials_file": credentials,
            "server_dir": data_dir,
            "clickhouse_toml": clickhouse_toml(info.http_port, info.tcp_port, credentials),
        }
    finally:
        server.stop()


# The administrator with SQL access management, and a writable user directory: what a
# server whose users are managed by SQL has. The engine merges both at start.
SQL_ACCESS_RUN_FILES = {
    "users.d/admin-access.xml": (
        "<clickhouse><users><dpone_admin>"
        "<access_management>1</access_management>"
        "</dpone_admin></users></clickhouse>\n"
    ),
    "config.d/access.xml": (
        "<clickhouse><user_directories><local_directory><path>access/</path>"
        "</local_directory></user_directories></clickhouse>\n"
    ),
}


class OperatedServer:
    """The server of :func:`remote_server`, stopped and started again by its operator
    (this engine reads users files at start only: an install is a restart)."""

    def __init__(self, root: Path, databases: Sequence[str]) -> None:
        self.root = root
        self.databases = tuple(databases)
        self.data_dir = root / "server"
        self.users_d = self.data_dir / "run" / "users.d"
        self.users_d.mkdir(parents=True)
        os.chmod(self.data_dir / "run", 0o700)
        self._server: LocalServer | None = None

    def start(
        self, users_file: str, credentials: Path, run_files: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """Install ``users_file`` (and ``run_files`` under ``run/``), start, create the
        databases; returns what a project names (as :func:`remote_server` yields)."""
        (self.users_d / POOL_FILE).write_text(users_file)
        for relative, text in (run_files or {}).items():
            path = self.data_dir / "run" / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        self._server = LocalServer(self.data_dir, users=())
        info = self._server.start()
        chhttp.register_server(info.http_port, self.data_dir)
        for name in ("_dpone_identity", *self.databases):
            chhttp.query(info.http_port, f"CREATE DATABASE IF NOT EXISTS {name} ENGINE = Atomic")
        return {
            "http_port": info.http_port,
            "tcp_port": info.tcp_port,
            "credentials_file": credentials,
            "clickhouse_toml": clickhouse_toml(info.http_port, info.tcp_port, credentials),
        }

    def stop(self) -> None:
        """Stop the server when it runs."""
        if self._server is not None:
            self._server.stop()
            self._server = None
