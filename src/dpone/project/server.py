"""Which ClickHouse server a command acts on: the managed one on a data directory, or
the one a project file's ``[clickhouse]`` names (a remote server's host, ports and
credentials file)."""

from __future__ import annotations

from pathlib import Path

from dpone.project.config import load_project
from dpone.publication.principals.server_access import ServerAccess


def server_access(data_dir: Path, project_config: Path | None) -> ServerAccess:
    """The managed server on ``data_dir``, or the server ``project_config`` names."""
    if project_config is None:
        return ServerAccess(data_dir)
    return load_project(project_config).clickhouse.access
