"""The remote pool's credentials file as dpone's host keeps it.

``{"users": [...]}``, one entry per principal: ``{"user", "password"}``; during a
rotation also ``"previous_password"`` (the one the server accepted before the
rotation, used until the new one verifies); for a principal retired from the pool
``{"user", "retired": true}`` and no password at all (see ``dpone pool retire``).
Errors name the file, never its content: a broken file may still hold secrets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpone.localserver.credentials import credential_entries
from dpone.localserver.errors import CredentialsCorrupt


@dataclass(frozen=True)
class PoolCredentials:
    """The passwords (by user), the previous ones of a rotation, the retired users."""

    passwords: dict[str, str] = field(repr=False)
    previous: dict[str, str] = field(repr=False)
    retired: frozenset[str]


def read_pool_credentials(path: Path) -> PoolCredentials | None:
    """The credentials file at ``path``, None when it does not exist."""
    entries = credential_entries(path)
    if entries is None:
        return None
    found = PoolCredentials({}, {}, frozenset())
    retired: set[str] = set()
    for ordinal, entry in enumerate(entries):
        user = _entry(path, ordinal, entry)
        if user in found.passwords or user in retired:
            raise CredentialsCorrupt(
                f"credentials file {path} lists user {user!r} twice", path=str(path), user=user
            )
        if entry.get("retired") is True:
            retired.add(user)
            continue
        found.passwords[user] = entry["password"]
        if "previous_password" in entry:
            found.previous[user] = entry["previous_password"]
    return PoolCredentials(found.passwords, found.previous, frozenset(retired))


def _entry(path: Path, ordinal: int, entry: Any) -> str:
    """The user of one well-formed entry (``credentials_corrupt`` otherwise)."""
    user = entry.get("user") if isinstance(entry, dict) else None
    if isinstance(entry, dict) and isinstance(user, str):
        if "retired" in entry:  # retired: no password of it is kept at all
            if entry["retired"] is True and not {"password", "previous_password"} & set(entry):
                return user
        elif all(
            isinstance(s, str) and s
            for s in (entry.get("password"), entry.get("previous_password", "x"))
        ):
            return user
    raise CredentialsCorrupt(
        f"credentials file {path}: entry {ordinal} needs a 'user' and a non-empty "
        "'password' (or 'retired': true and no password)",
        path=str(path),
        entry=ordinal,
    )
