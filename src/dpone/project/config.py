"""Strict parsing of ``dpone.toml`` (the standard library's TOML reader).

Every problem is collected, not only the first (an unknown or missing key, a value of
the wrong type or out of range, a table naming no source), each with its key path and,
when the key can be found in the text, its line; each source's kind reads its own keys
(:mod:`dpone.project.source_config`). A ``password`` key is refused: a source takes its
secret from where its kind says. Relative paths are relative to the directory holding
the project file. See docs/configuration.md.
"""

from __future__ import annotations

import math
import os
import re
import stat
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpone.contracts.composition_snapshot import DEFAULT_LIMITS, SnapshotLimits
from dpone.errors import ConfigurationError
from dpone.exporters.sources import SourceConfig  # re-exported: a project's sources
from dpone.localserver.layout import DEFAULT_DATA_DIR
from dpone.localserver.principal_pool import (
    DEFAULT_POOL_SIZE,
    PoolNames,
    check_databases,
    check_pool_name,
)
from dpone.preparation.modes import (
    DEFAULT_MODE,
    MODES,
    REMOVED_MODES,
    PreparationModeRemoved,
    removed_mode_message,
)
from dpone.project.config_reader import (
    ConfigProblem,
    Locator,
    TomlReader,
    decode_line,
    kind_of,
    non_empty,
    one_of,
)
from dpone.project.source_config import read_source
from dpone.publication.principals.server_access import RemoteServer, ServerAccess
from dpone.publication.settings import (
    REMOTE_SESSION_MARGIN_SECONDS,
    SETTINGS,
    PublicationSettings,
)
from dpone.publication.store.postgres import check_store_url, is_store_url
from dpone.publication.store.snapshot_store import StoreLocation
from dpone.staging.composition import TRANSPORTS
from dpone.staging.contract import PhysicalDesign

DEFAULT_CONFIG = Path("dpone.toml")
DEFAULT_SHRINK_GUARD = 0.5
DEFAULT_KEEP_ROLLBACK = 1
DESIGN_CHANGES = ("refuse", "replace")  # a table's `on_design_change`
# Each running refresh holds one ingest and then one publisher lease of the pool.
# A table that exports or checks holds no principal: twice the pool's size keep every
# principal busy, a table waiting for a free one (the issuer waits for it).
MAX_JOBS = 2 * DEFAULT_POOL_SIZE
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
_LIMIT_KEYS = tuple(DEFAULT_LIMITS.to_document())
# [clickhouse] keys of a remote server; host first (the others need it).
_REMOTE_KEYS = (
    "host",
    "http_port",
    "tcp_port",
    "secure",
    "ca_file",
    "credentials_file",
    "trusted_writers",
)


def _pool_name(value: str) -> str | None:
    """A pool name (``dpone pool render --pool`` / ``dpone server start --pool``)."""
    try:
        check_pool_name(value)
    except ConfigurationError as exc:
        return exc.message
    return None


def _user_names(value: list[Any]) -> str | None:
    """A list of ClickHouse user names (plain strings)."""
    if all(isinstance(v, str) and v for v in value):
        return None
    return "must be a list of user names"


class ProjectConfigError(ConfigurationError):
    """The project file is missing, not TOML, or has problems (``details['problems']``)."""

    code = "invalid_config"


@dataclass(frozen=True)
class ClickHouseConfig:
    """The ClickHouse a refresh publishes into: the managed local server on ``data_dir``
    (the embedded default), or the ``remote`` server ``host = ...`` names."""

    data_dir: Path
    transport: str = "http"
    client_path: str = "clickhouse-client"
    preparation: str = DEFAULT_MODE
    remote: RemoteServer | None = None
    # The project's pool on that server: "" is the default pool (dpone_ingest_1...).
    pool: str = ""

    @property
    def access(self) -> ServerAccess:
        """The server and the logins dpone uses there."""
        return ServerAccess(self.data_dir, self.remote, PoolNames(self.pool))


@dataclass(frozen=True)
class TableConfig:
    """One refreshed table: source table, target slot, design of a new target, guards."""

    name: str
    source: str
    source_table: str
    database: str
    target: str
    design: PhysicalDesign = field(default_factory=PhysicalDesign)
    types: Mapping[str, str] = field(default_factory=dict)
    shrink_guard: float = DEFAULT_SHRINK_GUARD
    limits: SnapshotLimits = DEFAULT_LIMITS
    # What a refresh does when the source's columns differ from the target's:
    # "refuse" (before the export, saying what differs) or "replace" (publish the
    # new design through the same one EXCHANGE).
    on_design_change: str = "refuse"

    @property
    def qualified_target(self) -> str:
        return f"{self.database}.{self.target}"

    def limit_key(self, ceiling: str) -> str:
        """The key of ``dpone.toml`` that sets ``ceiling`` for this table."""
        return f"tables.{self.name}.limits.{ceiling}"


@dataclass(frozen=True)
class Project:
    """A parsed ``dpone.toml``."""

    path: Path
    work_dir: Path
    # A SQLite file, or a PostgreSQL database (``postgresql://...``) workers share.
    store: StoreLocation
    keep_rollback: int
    clickhouse: ClickHouseConfig
    sources: Mapping[str, SourceConfig]
    tables: Mapping[str, TableConfig]
    publication: PublicationSettings = field(default_factory=PublicationSettings)
    keep_exports: bool = False  # keep a refresh's export once its table is published
    jobs: int = 1  # tables refreshed at once by `refresh --all` (each its own process)

    @property
    def databases(self) -> tuple[str, ...]:
        """The protected databases the tables publish into, in order of appearance."""
        return tuple(dict.fromkeys(t.database for t in self.tables.values()))

    def server_arguments(self) -> list[str]:
        """How a printed command names this project's server: the managed server's
        ``--data-dir``, or ``--config`` of this file for a remote one or a named pool
        (whose host, credentials file and pool the command then reads from it)."""
        if self.clickhouse.remote is not None or self.clickhouse.pool:
            return ["--config", str(self.path)]
        return ["--data-dir", str(self.clickhouse.data_dir)]


def load_project(path: Path) -> Project:
    """Read and parse ``path``; raises :class:`ProjectConfigError` listing every problem.

    A path that is missing (``config_missing``), not a regular file such as a directory
    (``config_not_a_file``) or unreadable (``config_unreadable``) has a code of its own.
    """
    try:
        # stat before reading: reading a FIFO would block, and a device could have effects.
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise not_a_file(path)
        text = path.read_bytes().decode("utf-8")
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise ProjectConfigError(
            f"no project file {path}; write an example with `dpone init`",
            code="config_missing",
            path=str(path),
        ) from exc
    except OSError as exc:
        raise ProjectConfigError(
            f"cannot read the project file {path}: {exc.strerror}",
            code="config_unreadable",
            path=str(path),
        ) from exc
    except UnicodeDecodeError as exc:
        raise ProjectConfigError(f"{path} is not UTF-8 text: {exc}", path=str(path)) from exc
    return parse_project(text, path)


def not_a_file(path: Path) -> ProjectConfigError:
    """The error for a project file path that names a directory or another non-file."""
    if path.is_dir():
        what = f"is a directory; name the file in it, e.g. --config {path / DEFAULT_CONFIG}"
    else:
        what = "is not a regular file"
    return ProjectConfigError(
        f"the project file {path} {what}", code="config_not_a_file", path=str(path)
    )


def parse_project(text: str, path: Path) -> Project:
    """Parse the text of a project file found at ``path`` (for relative paths)."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        line = decode_line(str(exc))
        problem = ConfigProblem("(file)", f"not valid TOML: {exc}", line)
        raise ProjectConfigError(
            f"{path}: {problem}", path=str(path), problems=[problem.to_dict()]
        ) from exc
    reader = _Reader(Locator(text), path.parent)
    project = reader.project(document, path)
    if reader.problems:
        listed = "\n".join(f"  {p}" for p in reader.problems)
        # A file whose one problem has a code of its own fails with that code.
        only = reader.problems[0] if len(reader.problems) == 1 else None
        raise ProjectConfigError(
            f"{path} has {len(reader.problems)} problem(s):\n{listed}",
            code=None if only is None else only.code,
            path=str(path),
            problems=[p.to_dict() for p in reader.problems],
        )
    assert project is not None
    return project


class _Reader(TomlReader):
    """The project file's sections, read with the generic reader."""

    # ------------------------------------------------------------------ sections

    def project(self, document: dict[str, Any], path: Path) -> Project | None:
        top = self.section(
            document, (), ("project", "clickhouse", "publication", "sources", "tables"), {}
        )
        keys = ("work_dir", "store", "keep_rollback", "keep_exports", "jobs")
        settings = self.section(top.get("project", {}), ("project",), keys, {})
        work_dir = self.path_value(settings, ("project",), "work_dir", self.base / ".dpone/work")
        store = self.store(settings)
        keep = self.get(
            settings,
            ("project",),
            "keep_rollback",
            int,
            DEFAULT_KEEP_ROLLBACK,
            check=lambda v: None if 0 <= v <= 100 else "must be between 0 and 100",
        )
        keep_exports = self.get(settings, ("project",), "keep_exports", bool, False)
        jobs = self.get(
            settings,
            ("project",),
            "jobs",
            int,
            1,
            check=lambda v: None if 1 <= v <= MAX_JOBS else f"must be between 1 and {MAX_JOBS}",
        )
        clickhouse = self.clickhouse(top.get("clickhouse", {}))
        publication = self.publication(top.get("publication", {}), clickhouse.remote is not None)
        sources = {
            name: source
            for name, raw in self.named(top, "sources").items()
            if (source := read_source(self, name, raw)) is not None
        }
        tables = {
            name: table
            for name, raw in self.named(top, "tables").items()
            if (table := self.table(name, raw, top.get("sources", {}))) is not None
        }
        if "tables" in top and not top.get("tables"):
            self.problem(("tables",), "declares no table")
        if self.problems:
            return None
        assert work_dir is not None and store is not None
        return Project(
            path,
            work_dir,
            store,
            keep,
            clickhouse,
            sources,
            tables,
            publication,
            keep_exports,
            jobs,
        )

    def store(self, settings: Mapping[str, Any]) -> StoreLocation | None:
        """A SQLite file's path (relative to the project file), or a PostgreSQL URL."""
        raw = settings.get("store")
        if isinstance(raw, str) and is_store_url(raw):
            try:
                return check_store_url(raw)
            except ConfigurationError as exc:
                self.problem(("project", "store"), exc.message)
                return None
        return self.path_value(
            settings, ("project",), "store", self.base / ".dpone/snapshots.sqlite"
        )

    def named(self, top: Mapping[str, Any], key: str) -> dict[str, Any]:
        found = top.get(key, {})
        if not isinstance(found, dict):
            self.problem((key,), f"must be a table of named {key}, not {kind_of(found)}")
            return {}
        for name in found:
            if not _NAME.fullmatch(name):
                self.problem((key, name), "a name is 1-64 letters, digits, '_', '-' or '.'")
        return {n: v for n, v in found.items() if _NAME.fullmatch(n)}

    def clickhouse(self, raw: Any) -> ClickHouseConfig:
        path = ("clickhouse",)
        hints = {
            "password": "secrets never go in the file: name the pool's credentials file "
            "with credentials_file (written by `dpone pool render`)",
            "user": "dpone signs in as its pool's principals, from credentials_file",
            "port": "name http_port (and tcp_port for the client transport)",
        }
        keys = ("data_dir", "transport", "client_path", "preparation", "pool", *_REMOTE_KEYS)
        table = self.section(raw, path, keys, hints)
        data_dir = self.path_value(table, path, "data_dir", self.base / DEFAULT_DATA_DIR)
        transport = self.get(table, path, "transport", str, "http", check=one_of(TRANSPORTS))
        remote = self.remote(table, path)
        if remote is not None and "data_dir" in table:
            self.problem(
                (*path, "data_dir"),
                "name exactly one server: data_dir (the managed local server) or host "
                "(a server you run), not both",
            )
        return ClickHouseConfig(
            data_dir=data_dir or self.base / DEFAULT_DATA_DIR,
            transport=transport,
            client_path=self.get(
                table, path, "client_path", str, "clickhouse-client", check=non_empty
            ),
            preparation=self.preparation(table, path),
            remote=remote,
            pool=self.get(table, path, "pool", str, "", check=_pool_name) or "",
        )

    def remote(self, table: Mapping[str, Any], path: tuple[str, ...]) -> RemoteServer | None:
        """The remote server of ``host = ...``, or None (the managed one); a remote key
        without ``host`` is a problem."""
        if "host" not in table:
            for key in _REMOTE_KEYS[1:]:
                if key in table:
                    self.problem((*path, key), "is for a remote server: name its host too")
            return None

        def port(v: int) -> str | None:
            return None if 0 < v < 65536 else "must be a TCP port"

        host = self.get(table, path, "host", str, required=True, check=non_empty)
        secure = self.get(table, path, "secure", bool, False)
        http_port = self.get(table, path, "http_port", int, 8443 if secure else 8123, check=port)
        tcp_port = self.get(table, path, "tcp_port", int, 9440 if secure else 9000, check=port)
        credentials = self.path_value(table, path, "credentials_file", None)
        if "credentials_file" not in table:
            self.problem(
                (*path, "credentials_file"),
                "is required with host: the credentials file `dpone pool render` wrote",
            )
        ca_file = self.path_value(table, path, "ca_file", None)
        if ca_file is not None and not secure:
            self.problem((*path, "ca_file"), "is for secure = true (TLS) only")
        trusted = self.get(table, path, "trusted_writers", list, [], check=_user_names)
        if host is None or credentials is None:
            return None
        return RemoteServer(
            host, http_port, tcp_port, credentials, secure, ca_file, tuple(trusted or ())
        )

    def publication(self, raw: Any, remote: bool) -> PublicationSettings:
        path = ("publication",)
        table = self.section(raw, path, tuple(SETTINGS), {})
        defaults = {k: d for k, (_, d, _) in SETTINGS.items()}
        if remote:
            # A network, not loopback, between this host and the server: a wider margin.
            defaults["session_margin_seconds"] = REMOTE_SESSION_MARGIN_SECONDS
        got = {
            k: self.get(table, path, k, t, defaults[k], check=c)
            for k, (t, _, c) in SETTINGS.items()
        }
        return PublicationSettings(**got)

    def preparation(self, table: Mapping[str, Any], path: tuple[str, ...]) -> str:
        """The preparation mode; a removed one is a problem with its own code, naming
        the replacement."""
        chosen = table.get("preparation")
        if isinstance(chosen, str) and chosen in REMOVED_MODES:
            self.problem(
                (*path, "preparation"),
                removed_mode_message(chosen),
                code=PreparationModeRemoved.code,
            )
            return DEFAULT_MODE
        mode: str = self.get(table, path, "preparation", str, DEFAULT_MODE, check=one_of(MODES))
        return mode

    def table(self, name: str, raw: Any, sources: Any) -> TableConfig | None:
        path = ("tables", name)
        known = (
            "source",
            "table",
            "target",
            "order_by",
            "partition_by",
            "types",
            "shrink_guard",
            "limits",
            "on_design_change",
        )
        table = self.section(
            raw,
            path,
            known,
            {"query": "a source query is not supported; refresh a table or a view"},
        )
        if not table and not isinstance(raw, dict):
            return None
        source = self.get(table, path, "source", str, required=True, check=non_empty)
        if source is not None and (not isinstance(sources, dict) or source not in sources):
            self.problem((*path, "source"), f"names no source: declare [sources.{source}]")
        source_table = self.get(table, path, "table", str, required=True, check=non_empty)
        target = self.get(table, path, "target", str, required=True, check=_target)
        order_by = self.get(table, path, "order_by", str, "tuple()", check=non_empty)
        partition_by = self.get(table, path, "partition_by", str, None, check=non_empty)
        design = PhysicalDesign()
        try:
            design = PhysicalDesign(order_by=order_by, partition_by=partition_by)
        except ConfigurationError as exc:
            self.problem((*path, "order_by"), exc.message)
        types = self.get(table, path, "types", dict, {})
        for column, type_ in types.items():
            if not isinstance(type_, str) or not type_.strip():
                self.problem((*path, "types", column), "must be a ClickHouse type name (a string)")
        guard = self.get(
            table,
            path,
            "shrink_guard",
            float,
            DEFAULT_SHRINK_GUARD,
            check=lambda v: (
                None
                if 0.0 <= v <= 1.0 and math.isfinite(v)
                else "must be a fraction between 0 and 1"
            ),
        )
        limits = self.limits(table.get("limits", {}), (*path, "limits"))
        on_change = self.get(
            table,
            path,
            "on_design_change",
            str,
            "refuse",
            check=lambda v: None if v in DESIGN_CHANGES else "must be 'refuse' or 'replace'",
        )
        if source is None or source_table is None or target is None:
            return None
        database, _, target_table = target.partition(".")
        return TableConfig(
            name,
            source,
            source_table,
            database,
            target_table,
            design,
            dict(types),
            guard,
            limits,
            on_change or "refuse",
        )

    def limits(self, raw: Any, path: tuple[str, ...]) -> SnapshotLimits:
        table = self.section(raw, path, _LIMIT_KEYS, {})
        defaults = DEFAULT_LIMITS.to_document()
        values = {
            key: self.get(
                table,
                path,
                key,
                int,
                defaults[key],
                check=lambda v: None if v > 0 else "must be a positive integer",
            )
            for key in _LIMIT_KEYS
        }
        return SnapshotLimits(**values)


def _target(value: str) -> str | None:
    database, dot, table = value.partition(".")
    if not dot or not table or "." in table:
        return "must be DATABASE.TABLE"
    try:
        check_databases((database,))
    except ConfigurationError as exc:
        return exc.message
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,191}", table):
        return "the table name must be letters, digits and '_'"
    if table.startswith("dpone_stage_"):
        return "dpone_stage_ names are staging generations, not targets"
    return None
