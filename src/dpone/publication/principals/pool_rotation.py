"""The end of a rotation with overlap: the old passwords removed, once the new verify.

``dpone pool render --rotate-from`` keeps each principal's previous password beside the
new one, and dpone signs in with the new as soon as the server takes it
(:func:`~dpone.publication.principals.server_access.rotated_credentials`).
:func:`finish_rotation` signs in with every new password first (nothing changes unless
the server takes them all), then drops the previous ones from the credentials file and
gives the SQL that leaves each principal with its new password only.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpone.durable_files import atomic_write_bytes
from dpone.errors import ConfigurationError, DponeError, StateError
from dpone.localserver.config import ServerUser
from dpone.localserver.pool_file import credentials_json, read_pool_file, remote_users
from dpone.localserver.pool_sql import retire_old_sql
from dpone.ports.clickhouse_request import Credentials
from dpone.publication.principals.server_access import ServerAccess, sign_in


@dataclass(frozen=True)
class FinishedRotation:
    """The principals whose previous password was dropped, and the SQL that removes it
    from a server whose users are managed by SQL (empty when none was pending)."""

    users: tuple[str, ...]
    remove_old_sql: str


def finish_rotation(access: ServerAccess) -> FinishedRotation:
    """Drop the previous passwords once the server takes every new one
    (``rotation_not_installed`` names those it refuses; nothing is changed then)."""
    remote = access.remote
    if remote is None:
        raise ConfigurationError(
            "the managed local server's pool has no rotation to finish", code="not_remote"
        )
    path = remote.credentials_file
    found = read_pool_file(path, access.pool)
    pending = tuple(u for u in remote_users(access.pool) if u in found.previous)
    refused = [u for u in pending if not _signs_in(access, Credentials(u, found.passwords[u]))]
    if refused:
        raise StateError(
            f"{access.describe()} does not take the new password of {', '.join(refused)}: "
            "install the rotation's users file or SQL first, then run this again (until "
            "then dpone keeps signing in with the previous passwords)",
            code="rotation_not_installed",
            users=refused,
        )
    if pending:
        names = [n for n in remote_users(access.pool) if n in found.passwords]
        text = credentials_json(found.passwords, names, retired=sorted(found.retired))
        atomic_write_bytes(path, text.encode("utf-8"))
    users = [ServerUser(u, password=found.passwords[u]) for u in pending]
    return FinishedRotation(pending, retire_old_sql(users) if pending else "")


def _signs_in(access: ServerAccess, login: Credentials) -> bool:
    """Whether ``login`` signs in: False for a refused sign-in, any other error raised."""
    try:
        sign_in(access, login)
    except DponeError as exc:
        if exc.code == "authentication_refused":
            return False
        raise
    return True
