"""Errors of the managed local ClickHouse server, each with a stable code."""

from __future__ import annotations

from dpone.errors import LocalServerError


class ChdbNotInstalled(LocalServerError):
    """The interpreter that would run the server cannot import ``chdb``."""

    code = "chdb_not_installed"


class EngineVersionUnsupported(LocalServerError):
    """The installed embedded engine is not the version dpone is tested with."""

    code = "engine_version_unsupported"


class DataDirNotWritable(LocalServerError):
    """The data directory cannot be created or written."""

    code = "data_dir_not_writable"


class PortInUse(LocalServerError):
    """A requested port is already bound by another process."""

    code = "port_in_use"


class ServerAlreadyRunning(LocalServerError):
    """Another server holds the lock on this data directory."""

    code = "server_already_running"


class ServerDiedDuringStart(LocalServerError):
    """The server process exited before it was ready; details carry its log tail."""

    code = "server_died_during_start"


class ServerStartTimeout(LocalServerError):
    """The server did not become ready before the start deadline."""

    code = "server_start_timeout"


class ServerNotRunning(LocalServerError):
    """No running server was found for this data directory."""

    code = "server_not_running"


class ServerStopTimeout(LocalServerError):
    """The server did not stop within the bound, even after signals."""

    code = "server_stop_timeout"


class CredentialsMissing(LocalServerError):
    """The data directory has no credentials file (or no entry for a user)."""

    code = "credentials_missing"


class CredentialsCorrupt(LocalServerError):
    """The credentials file cannot be read or parsed; its content is never quoted."""

    code = "credentials_corrupt"


class ServerStateUnknown(LocalServerError):
    """A server holds the data directory's lock but its ports cannot be learned."""

    code = "server_state_unknown"


class ProtectedRecordCorrupt(LocalServerError):
    """The record of the protected databases (``protected.json``) cannot be read or parsed."""

    code = "protected_record_corrupt"
