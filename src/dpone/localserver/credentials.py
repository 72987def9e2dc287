"""The managed server's passwords: generated once, kept private, rotated on request.

``<data_dir>/run/credentials.json`` holds the passwords the running server accepts and
``<data_dir>/run/credentials.next.json`` a rotation waiting for the next start (both
0600, ``{"users": [{"user": ..., "password": ...}, ...]}``), for every declared user
dpone generated a password for; only SHA-256 hashes reach ``users.xml``. The
administrator is :data:`ADMIN_USER`; the engine's :data:`ENGINE_USER` has no password,
is absent from these files and may only open and close the listeners. See
docs/local-server.md ("Users and the credentials file").
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dpone.localserver.config import ADMIN_USER, ENGINE_USER, ServerUser
from dpone.localserver.errors import CredentialsCorrupt, CredentialsMissing
from dpone.localserver.layout import DataDirLayout, write_private_file
from dpone.localserver.protected import restart_commands, start_command
from dpone.ports.clickhouse_request import Credentials

__all__ = [
    "ADMIN_USER",
    "ENGINE_USER",
    "admin_credentials",
    "generate_password",
    "load_credentials",
    "read_credentials_file",
    "resolve_users",
    "rotate_credentials",
    "rotation_pending",
]

# 32 random bytes, URL-safe text: safe in an HTTP header, XML and a JSON string.
PASSWORD_BYTES = 32


def generate_password() -> str:
    """A fresh random password (256 bits)."""
    return secrets.token_urlsafe(PASSWORD_BYTES)


def load_credentials(data_dir: str | os.PathLike[str] | None = None) -> dict[str, Credentials]:
    """The generated credentials the server on ``data_dir`` accepts, by user name."""
    path = DataDirLayout.at(data_dir).credentials_file
    passwords = read_credentials_file(path)
    if passwords is None:
        raise CredentialsMissing(
            f"no credentials file at {path}; start the server once with "
            f"`{start_command(data_dir)}`",
            path=str(path),
        )
    return {user: Credentials(user, password) for user, password in passwords.items()}


def admin_credentials(data_dir: str | os.PathLike[str] | None = None) -> Credentials:
    """The administrator's (``dpone_admin``) credentials for the server on ``data_dir``.

    Raises :class:`CredentialsMissing` when the file lists no administrator: a server
    started by a dpone older than the administrator; restarting it declares one.
    """
    credentials = load_credentials(data_dir)
    try:
        return credentials[ADMIN_USER]
    except KeyError:
        path = DataDirLayout.at(data_dir).credentials_file
        raise CredentialsMissing(
            f"credentials file {path} lists no {ADMIN_USER!r}; restart the server "
            f"(`{restart_commands(data_dir)}`) to create the administrator",
            path=str(path),
            user=ADMIN_USER,
        ) from None


def rotate_credentials(data_dir: str | os.PathLike[str] | None = None) -> tuple[str, ...]:
    """Prepare new passwords for every generated user; the next start applies them.

    Returns the user names whose passwords will change.
    """
    layout = DataDirLayout.at(data_dir)
    current = load_credentials(layout.root)
    pending = {user: generate_password() for user in sorted(current)}
    _write(layout.pending_credentials_file, pending)
    return tuple(pending)


def rotation_pending(data_dir: str | os.PathLike[str] | None = None) -> bool:
    """True when a rotation waits for the next start."""
    return DataDirLayout.at(data_dir).pending_credentials_file.exists()


def resolve_users(layout: DataDirLayout, users: Sequence[ServerUser]) -> tuple[ServerUser, ...]:
    """``users`` with a password each: a pending rotation, else the stored one, else new.

    Called by a start (and only while no server runs on ``layout``): it records the
    generated passwords first, then retires the applied rotation.
    """
    stored = read_credentials_file(layout.credentials_file) or {}
    pending = read_credentials_file(layout.pending_credentials_file) or {}
    generated: dict[str, str] = {}
    resolved = []
    for user in users:
        if user.password is not None or user.name == ENGINE_USER:
            resolved.append(user)
            continue
        password = pending.get(user.name) or stored.get(user.name) or generate_password()
        generated[user.name] = password
        resolved.append(dataclasses.replace(user, password=password))
    if generated != stored or not layout.credentials_file.exists():
        _write(layout.credentials_file, generated)
    layout.pending_credentials_file.unlink(missing_ok=True)
    return tuple(resolved)


def _write(path: Path, passwords: dict[str, str]) -> None:
    users = [{"user": user, "password": password} for user, password in passwords.items()]
    write_private_file(path, json.dumps({"users": users}, indent=2) + "\n")


def credential_entries(path: Path) -> list[Any] | None:
    """The ``users`` entries of the credentials file at ``path``, None when it does not
    exist. Errors name the file, never its content: a broken file may still hold secrets.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise CredentialsCorrupt(f"cannot read credentials file {path}", path=str(path)) from exc
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        # Not chained: the decode error carries the whole document (its ``doc``).
        raise CredentialsCorrupt(
            f"credentials file {path} is not JSON (line {exc.lineno}, column {exc.colno})",
            path=str(path),
        ) from None
    entries = document.get("users") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise CredentialsCorrupt(f"credentials file {path} has no 'users' list", path=str(path))
    return entries


def read_credentials_file(path: Path) -> dict[str, str] | None:
    """A credentials file's passwords by user, None when it does not exist.

    Errors name the file, never its content: a broken file may still hold secrets.
    """
    entries = credential_entries(path)
    if entries is None:
        return None
    passwords: dict[str, str] = {}
    for ordinal, entry in enumerate(entries):
        user = entry.get("user") if isinstance(entry, dict) else None
        password = entry.get("password") if isinstance(entry, dict) else None
        if not (isinstance(user, str) and isinstance(password, str) and password):
            raise CredentialsCorrupt(
                f"credentials file {path}: entry {ordinal} needs a 'user' and a non-empty 'password'",
                path=str(path),
                entry=ordinal,
            )
        if user in passwords:
            raise CredentialsCorrupt(
                f"credentials file {path} lists user {user!r} twice", path=str(path), user=user
            )
        passwords[user] = password
    return passwords
