"""A source's secrets, read when the source is opened, never kept in the project."""

from __future__ import annotations

import os

from dpone.errors import ConfigurationError
from dpone.project.config import SourceConfig


def resolve_secret(source: SourceConfig) -> tuple[str, str]:
    """The SQL Server user and password, read now from the named variable or file."""
    user = os.environ.get(source.user_env or "")
    if not user:
        raise ConfigurationError(
            f"sources.{source.name}.user_env: the environment variable {source.user_env} is not set",
            code="missing_credentials",
            key=f"sources.{source.name}.user_env",
        )
    if source.password_file is not None:
        try:
            password = source.password_file.read_text(encoding="utf-8").rstrip("\r\n")
        except OSError as exc:
            raise ConfigurationError(
                f"sources.{source.name}.password_file: cannot read {source.password_file}: "
                f"{exc.strerror}",
                code="missing_credentials",
                key=f"sources.{source.name}.password_file",
            ) from exc
        return user, password
    from_env = os.environ.get(source.password_env or "")
    if from_env is None:
        raise ConfigurationError(
            f"sources.{source.name}.password_env: the environment variable "
            f"{source.password_env} is not set",
            code="missing_credentials",
            key=f"sources.{source.name}.password_env",
        )
    return user, from_env
