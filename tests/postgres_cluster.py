"""A throwaway PostgreSQL cluster (Debian's ``postgresql`` package) for the store tests.

``postgres_cluster()`` finds ``initdb``, ``pg_ctl`` and ``psql`` under
``/usr/lib/postgresql/<version>/bin`` (the newest version), makes a cluster in a private
temporary directory, starts it on a free TCP port of ``127.0.0.1`` (and a unix socket in
that directory) with password authentication (``scram-sha-256``) everywhere, creates the
role ``dpone`` and its database ``dpone_store``, and writes a libpq password file
(``PGPASSFILE``) for that role. On exit it stops the server and removes its directories.

``initdb`` refuses to run as root, so when the tests run as root (as on CI) the server's
programs run as the ``postgres`` system user through ``runuser``; the cluster's directory
is then owned by that user. The directory is made with ``tempfile.mkdtemp`` rather than
under pytest's temporary directories, which root owns with mode 0700 and which the
``postgres`` user therefore cannot reach.

Passwords never appear in a command line: ``initdb`` reads the superuser's from a file
(deleted after), ``psql`` takes it from ``PGPASSWORD`` in its own environment and the
``CREATE ROLE`` statement on its standard input, and the tests read the role's from the
password file.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

HOST = "127.0.0.1"
DATABASE = "dpone_store"
USER = "dpone"
SUPERUSER = "postgres"
SERVER_ACCOUNT = "postgres"
INSTALL_ROOT = Path("/usr/lib/postgresql")
PROGRAMS = ("initdb", "pg_ctl", "psql")
STEP_TIMEOUT = 120.0


@dataclass(frozen=True)
class PostgresCluster:
    """Where a running throwaway cluster listens, and the password file for its role."""

    host: str
    port: int
    database: str
    user: str
    passfile: Path
    data_dir: Path

    @property
    def url(self) -> str:
        """A libpq URL without a password: the password comes from ``passfile``."""
        return f"postgresql://{self.user}@{self.host}:{self.port}/{self.database}"

    def env(self) -> dict[str, str]:
        """The environment variables a libpq client needs to log in as ``user``."""
        return {"PGPASSFILE": str(self.passfile)}


def _version_key(path: Path) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", path.parent.name))


def find_bin_dir() -> Path:
    """The ``bin`` directory of the newest installed PostgreSQL with all needed programs."""
    candidates = [
        bin_dir
        for bin_dir in INSTALL_ROOT.glob("*/bin")
        if all(os.access(bin_dir / program, os.X_OK) for program in PROGRAMS)
    ]
    if not candidates:
        raise RuntimeError(
            f"no PostgreSQL server programs ({', '.join(PROGRAMS)}) under "
            f"{INSTALL_ROOT}/*/bin: install them with `apt-get install postgresql`"
        )
    return max(candidates, key=_version_key)


def _as_root() -> bool:
    return os.geteuid() == 0


def _server_argv(*argv: str) -> list[str]:
    """Run a server program as the ``postgres`` user when we are root, else as ourselves."""
    if _as_root():
        return ["runuser", "-u", SERVER_ACCOUNT, "--", *argv]
    return list(argv)


def _give_to_server_account(path: Path) -> None:
    if _as_root():
        account = pwd.getpwnam(SERVER_ACCOUNT)
        os.chown(path, account.pw_uid, account.pw_gid)


def _clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment without libpq's variables (a caller's PGPASSFILE, PGHOST, ...)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PG")}
    env.update(extra or {})
    return env


def _run(
    argv: list[str],
    *,
    cwd: Path,
    what: str,
    env: Mapping[str, str] | None = None,
    stdin: str | None = None,
) -> None:
    done = subprocess.run(
        argv,
        cwd=cwd,
        env=_clean_env(env),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=STEP_TIMEOUT,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{what} failed (exit {done.returncode}):\n{done.stdout}\n{done.stderr}".rstrip()
        )


def _write_secret(path: Path, text: str) -> None:
    """Create ``path`` with mode 0600 (never readable by others, even for a moment)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listened on a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _log_tail(log: Path) -> str:
    try:
        return log.read_text(encoding="utf-8", errors="replace")[-4000:]
    except OSError:
        return "(no server log)"


@contextlib.contextmanager
def postgres_cluster(root: Path | None = None) -> Iterator[PostgresCluster]:
    """Start a throwaway cluster with role ``dpone`` and database ``dpone_store``.

    ``root`` is the directory the cluster's private directory is made in (default: the
    system's temporary directory); when running as root, the ``postgres`` user must be
    able to reach it.
    """
    bin_dir = find_bin_dir()
    work = Path(tempfile.mkdtemp(prefix="dpone-pg-", dir=root))
    client_dir = Path(tempfile.mkdtemp(prefix="dpone-pg-client-"))
    data_dir = work / "data"
    log = work / "log"
    started = False
    try:
        _give_to_server_account(work)
        superuser_password = secrets.token_hex(16)
        pwfile = work / "superuser-password"
        _write_secret(pwfile, superuser_password + "\n")
        _give_to_server_account(pwfile)
        try:
            _run(
                _server_argv(
                    str(bin_dir / "initdb"),
                    "-D",
                    str(data_dir),
                    "-U",
                    SUPERUSER,
                    "--auth=scram-sha-256",
                    f"--pwfile={pwfile}",
                    "--encoding=UTF8",
                    "--locale=C",
                    "--no-sync",
                ),
                cwd=work,
                what="initdb",
            )
        finally:
            pwfile.unlink(missing_ok=True)

        port = free_port()
        options = f"-p {port} -k {work} -c listen_addresses={HOST}"
        started = True
        try:
            _run(
                _server_argv(
                    str(bin_dir / "pg_ctl"),
                    "-D",
                    str(data_dir),
                    "-l",
                    str(log),
                    "-w",
                    "-o",
                    options,
                    "start",
                ),
                cwd=work,
                what="pg_ctl start",
            )
        except RuntimeError as error:
            raise RuntimeError(f"{error}\nserver log:\n{_log_tail(log)}") from None

        password = secrets.token_hex(16)
        _run(
            [
                str(bin_dir / "psql"),
                "-X",
                "-q",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                HOST,
                "-p",
                str(port),
                "-U",
                SUPERUSER,
                "-d",
                "postgres",
            ],
            cwd=client_dir,
            what="psql (create role and database)",
            env={"PGPASSWORD": superuser_password},
            stdin=(
                f"CREATE ROLE {USER} LOGIN PASSWORD '{password}';\n"
                f"CREATE DATABASE {DATABASE} OWNER {USER};\n"
            ),
        )
        passfile = client_dir / "pgpass"
        _write_secret(passfile, f"{HOST}:{port}:{DATABASE}:{USER}:{password}\n")
        yield PostgresCluster(
            host=HOST,
            port=port,
            database=DATABASE,
            user=USER,
            passfile=passfile,
            data_dir=data_dir,
        )
    finally:
        if started:
            subprocess.run(
                _server_argv(str(bin_dir / "pg_ctl"), "-D", str(data_dir), "-m", "fast", "stop"),
                cwd=work,
                env=_clean_env(),
                capture_output=True,
                timeout=STEP_TIMEOUT,
                check=False,
            )
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(client_dir, ignore_errors=True)
