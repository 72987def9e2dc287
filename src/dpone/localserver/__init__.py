"""The managed local ClickHouse server: dpone's embedded default and test server."""

from dpone.localserver.config import ADMIN_USER, DEFAULT_USERS, ENGINE_USER, ServerUser
from dpone.localserver.credentials import (
    admin_credentials,
    load_credentials,
    rotate_credentials,
    rotation_pending,
)
from dpone.localserver.errors import (
    ChdbNotInstalled,
    CredentialsCorrupt,
    CredentialsMissing,
    DataDirNotWritable,
    EngineVersionUnsupported,
    PortInUse,
    ServerAlreadyRunning,
    ServerDiedDuringStart,
    ServerNotRunning,
    ServerStartTimeout,
    ServerStateUnknown,
    ServerStopTimeout,
)
from dpone.localserver.layout import DEFAULT_DATA_DIR, DataDirLayout
from dpone.localserver.server import (
    LocalServer,
    ServerInfo,
    StopReport,
    find_running,
    log_tail,
    stop_running,
)

__all__ = [
    "ADMIN_USER",
    "DEFAULT_DATA_DIR",
    "DEFAULT_USERS",
    "ENGINE_USER",
    "ChdbNotInstalled",
    "CredentialsCorrupt",
    "CredentialsMissing",
    "DataDirLayout",
    "DataDirNotWritable",
    "EngineVersionUnsupported",
    "LocalServer",
    "PortInUse",
    "ServerAlreadyRunning",
    "ServerDiedDuringStart",
    "ServerInfo",
    "ServerNotRunning",
    "ServerStartTimeout",
    "ServerStateUnknown",
    "ServerStopTimeout",
    "ServerUser",
    "StopReport",
    "admin_credentials",
    "find_running",
    "load_credentials",
    "log_tail",
    "rotate_credentials",
    "rotation_pending",
    "stop_running",
]
