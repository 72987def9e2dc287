"""Which ClickHouse server a project works on, and as whom: the one owner of that choice.

Exactly one kind per project: **managed** (the embedded default), the server dpone
starts on its data directory, its endpoint from the running server's state, the pool's
passwords from the data directory's credentials file, its checks, status and drops as
the administrator ``dpone_admin``; or **remote** (``[clickhouse] host = ...``), a server
the user runs with the pool ``dpone pool render`` wrote, its credentials file on dpone's
host, its checks, status and drops (rollback copies, discarded generations, retire) as
``dpone_keeper``, and nothing else with more than its role. See docs/remote.md.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.errors import DponeError
from dpone.localserver import find_running
from dpone.localserver.credentials import admin_credentials, load_credentials
from dpone.localserver.errors import ServerNotRunning
from dpone.localserver.pool_credentials import PoolCredentials
from dpone.localserver.pool_file import read_pool_file
from dpone.localserver.principal_pool import DEFAULT_POOL, PoolNames
from dpone.localserver.protected import start_command
from dpone.ports.clickhouse_request import Credentials, Endpoint, read

# How long status waits for a remote server to answer before it says it is unreachable.
REACH_SECONDS = 10.0


@dataclass(frozen=True)
class RemoteServer:
    """A ClickHouse server dpone did not start: where it is and where the pool's
    credentials are (the file ``dpone pool render`` wrote; never a password here)."""

    host: str
    http_port: int
    tcp_port: int
    credentials_file: Path
    secure: bool = False
    ca_file: Path | None = None
    # Users outside dpone that may write the protected databases and whom the operator
    # vouches for (its administrators): the catalog refuses any other writer.
    trusted_writers: tuple[str, ...] = ()

    def describe(self) -> str:
        """``https://host:port`` (or ``http://``), without any secret."""
        return f"{'https' if self.secure else 'http'}://{self.host}:{self.http_port}"


@dataclass(frozen=True)
class ServerAccess:
    """The server (managed on ``data_dir``, or ``remote``) and the logins dpone uses
    there: the principals of ``pool`` (the project's, ``[clickhouse] pool``)."""

    data_dir: Path
    remote: RemoteServer | None = None
    pool: PoolNames = DEFAULT_POOL

    @property
    def managed(self) -> bool:
        """Whether this is the managed local server (dpone's own files and process)."""
        return self.remote is None

    def describe(self) -> str:
        """Where the server is, for messages: its URL, or the managed server's data dir."""
        if self.remote is not None:
            return self.remote.describe()
        return f"the managed server on {self.data_dir}"

    def endpoint(self, database: str) -> Endpoint:
        """The server's endpoint in ``database`` (``server_not_running`` for a managed
        server that is not running, with the command that starts it)."""
        if self.remote is not None:
            r = self.remote
            return Endpoint(
                r.host,
                r.http_port,
                r.tcp_port,
                database,
                secure=r.secure,
                ca_file=None if r.ca_file is None else str(r.ca_file),
            )
        info = find_running(self.data_dir)
        if info is None:
            command = start_command(self.data_dir, also=() if database == "system" else (database,))
            raise ServerNotRunning(
                f"no managed server is running on {self.data_dir}; start it with `{command}`",
                data_dir=str(self.data_dir),
                next_command=command,
            )
        return Endpoint("127.0.0.1", info.http_port, info.tcp_port, database)

    def known_credentials(self) -> dict[str, Credentials]:
        """Every login dpone holds for this server, by user name. During a rotation a
        principal's new password as soon as the server takes it, its previous one until
        then (see :func:`rotated_credentials`)."""
        if self.remote is not None:
            found = read_pool_file(self.remote.credentials_file, self.pool)
            if found.previous:
                return rotated_credentials(self, found)
            return {user: Credentials(user, pw) for user, pw in found.passwords.items()}
        return load_credentials(self.data_dir)

    def retired(self) -> frozenset[str]:
        """The pool's principals retired with ``dpone pool retire`` (a remote server's
        credentials file marks them; the managed server's pool has none)."""
        if self.remote is None:
            return frozenset()
        return read_pool_file(self.remote.credentials_file, self.pool).retired

    def members_in_use(self) -> tuple[str, ...]:
        """The pool's members dpone leases and trusts: all but the retired ones."""
        retired = self.retired()
        return tuple(user for user in self.pool.members() if user not in retired)

    def trusted_writers(self) -> frozenset[str]:
        """Users besides the pool whose write grants the catalog accepts: the operator
        login, and on a remote server the ``trusted_writers`` its operator vouches for."""
        extra = self.remote.trusted_writers if self.remote is not None else ()
        return frozenset({self.operator().user, *extra})

    def operator(self) -> Credentials:
        """Who reads for the checks and status and makes the recorded drops: the managed
        server's administrator, or a remote server's keeper of the pool (``dpone_keeper``)."""
        if self.remote is not None:
            return self.known_credentials()[self.pool.keeper]
        return admin_credentials(self.data_dir)


# Users whose new password a server took, by (credentials file, host, port): once taken
# it stays in use. A principal still on its previous password is tried again after
# ROTATION_RETRY_SECONDS, not at every read of the credentials.
_NEW_TAKEN: dict[tuple[str, str, int], set[str]] = {}
_OLD_UNTIL: dict[tuple[str, str, int, str], float] = {}
ROTATION_RETRY_SECONDS = 5.0


def rotated_credentials(access: ServerAccess, found: PoolCredentials) -> dict[str, Credentials]:
    """The login of each principal during a rotation: the new password once the server
    takes it (a ``SELECT 1`` signed in with it), the previous one while the server
    refuses the new one's sign-in (the operator has not installed it yet)."""
    assert access.remote is not None
    remote = access.remote
    key = (str(remote.credentials_file), remote.host, remote.http_port)
    taken = _NEW_TAKEN.setdefault(key, set())
    chosen = {}
    for user, password in found.passwords.items():
        old = found.previous.get(user)
        if old is not None and user not in taken:
            if _OLD_UNTIL.get((*key, user), 0.0) > time.monotonic():
                chosen[user] = Credentials(user, old)
                continue
            if new_password_taken(access, Credentials(user, password)) is not True:
                # Refused, or not known (no answer): the old one for now, tried again
                # later; only a sign-in the server took is kept for good.
                _OLD_UNTIL[(*key, user)] = time.monotonic() + ROTATION_RETRY_SECONDS
                chosen[user] = Credentials(user, old)
                continue
            taken.add(user)
        chosen[user] = Credentials(user, password)
    return chosen


def new_password_taken(access: ServerAccess, login: Credentials) -> bool | None:
    """Whether the server takes ``login``: True once a sign-in with it answered, False
    when the server refused it, None when neither is known (no answer: the requests
    that follow meet that failure themselves)."""
    try:
        sign_in(access, login)
    except DponeError as exc:
        return False if exc.code == "authentication_refused" else None
    return True


def sign_in(access: ServerAccess, login: Credentials) -> None:
    """``SELECT 1`` signed in as ``login`` (a refusal is ``authentication_refused``)."""
    HttpTransport(access.endpoint("system"), login).execute(
        read("SELECT 1", f"dpone-pool-rotation-{time.time_ns()}"),
        deadline=time.monotonic() + REACH_SECONDS,
    )


def server_reachable(access: ServerAccess) -> bool:
    """Whether the server answers now (see :func:`reach_failure`)."""
    return reach_failure(access) is None


def reach_failure(access: ServerAccess) -> DponeError | None:
    """Why the server does not answer now, or None when it does: the managed one runs
    (else ``server_not_running``), a remote one answers ``SELECT 1`` to its operator
    (else the typed error of the request: a refused connection, TLS, login or a
    timeout). A credentials file that cannot be used raises: it is said, not hidden."""
    if access.remote is None:
        try:
            access.endpoint("system")
        except ServerNotRunning as exc:
            return exc
        return None
    login = access.operator()
    try:
        HttpTransport(access.endpoint("system"), login).execute(
            read("SELECT 1", f"dpone-status-reach-{time.time_ns()}"),
            deadline=time.monotonic() + REACH_SECONDS,
        )
    except DponeError as exc:
        return exc
    return None
