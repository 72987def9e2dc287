"""The project file ``dpone.toml``: what a refresh reads, parsed strictly."""

from dpone.config.project import (
    DEFAULT_CONFIG,
    ClickHouseConfig,
    ConfigProblem,
    Project,
    ProjectConfigError,
    SourceConfig,
    TableConfig,
    load_project,
    parse_project,
)

__all__ = [
    "DEFAULT_CONFIG",
    "ClickHouseConfig",
    "ConfigProblem",
    "Project",
    "ProjectConfigError",
    "SourceConfig",
    "TableConfig",
    "load_project",
    "parse_project",
]
