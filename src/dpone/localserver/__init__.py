"""The managed local ClickHouse server: dpone's embedded default and test server."""

from dpone.localserver.config import DEFAULT_USERS, ServerUser
from dpone.localserver.errors import (
    ChdbNotInstalled,
    DataDirNotWritable,
    PortInUse,
    ServerAlreadyRunning,
    ServerDiedDuringStart,
    ServerNotRunning,
    ServerStartTimeout,
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
    "DEFAULT_DATA_DIR",
    "DEFAULT_USERS",
    "ChdbNotInstalled",
    "DataDirLayout",
    "DataDirNotWritable",
    "LocalServer",
    "PortInUse",
    "ServerAlreadyRunning",
    "ServerDiedDuringStart",
    "ServerInfo",
    "ServerNotRunning",
    "ServerStartTimeout",
    "ServerStopTimeout",
    "ServerUser",
    "StopReport",
    "find_running",
    "log_tail",
    "stop_running",
]
