"""``[sources.NAME]`` of the project file, read by the plugin its ``kind`` names.

The reader here knows only ``kind``; the plugin (:mod:`dpone.exporters.sources`)
declares its keys and reads them through :class:`SourceFields`, and this module
reports, with their lines, a missing or unknown kind, a key of another kind and an
unknown key.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dpone.exporters.sources import SourceConfig, SourceKind, kinds
from dpone.project.config_reader import TomlReader, env_name, non_empty, one_of


def _tcp_port(value: int) -> str | None:
    return None if 0 < value < 65536 else "must be a TCP port"


class _Fields:
    """:class:`SourceFields` over one ``[sources.NAME]`` table of ``reader``."""

    def __init__(self, reader: TomlReader, path: tuple[str, ...], table: Mapping[str, Any]):
        self._reader, self._path, self._table = reader, path, table

    def has(self, key: str) -> bool:
        return key in self._table

    def _get(
        self, key: str, kind: type, default: Any, required: bool, check: Callable[[Any], Any]
    ) -> Any:
        return self._reader.get(
            self._table, self._path, key, kind, default, required=required, check=check
        )

    def text(self, key: str, *, required: bool = False) -> str | None:
        found: str | None = self._get(key, str, None, required, non_empty)
        return found

    def choice(self, key: str, choices: tuple[str, ...], default: str) -> str:
        found: str = self._get(key, str, default, False, one_of(choices))
        return found

    def port(self, key: str, default: int) -> int:
        found: int = self._get(key, int, default, False, _tcp_port)
        return found

    def env_name(self, key: str, *, required: bool = False) -> str | None:
        found: str | None = self._get(key, str, None, required, env_name)
        return found

    def path(self, key: str) -> Path | None:
        return self._reader.path_value(self._table, self._path, key, None)

    def problem(self, key: str, message: str) -> None:
        self._reader.problem((*self._path, key) if key else self._path, message)


def read_source(reader: TomlReader, name: str, raw: Any) -> SourceConfig | None:
    """``[sources.name]`` read by its kind's plugin; None when it has a problem."""
    path = ("sources", name)
    plugins = kinds()
    chosen = raw.get("kind") if isinstance(raw, dict) else None
    plugin: SourceKind | None = plugins.get(chosen) if isinstance(chosen, str) else None
    every = tuple(dict.fromkeys(k for p in plugins.values() for k in p.keys))
    if plugin is None:  # the kind's own problem below; every kind's keys are known
        table = reader.section(raw, path, ("kind", *every), _hints(plugins.values()))
        reader.get(table, path, "kind", str, required=True, check=one_of(tuple(plugins)))
        return None
    # A key another kind reads is named as theirs, unless this kind refuses it itself.
    others = tuple(k for k in every if k not in plugin.hints)
    table = reader.section(raw, path, ("kind", *plugin.keys, *others), plugin.hints)
    for key in table:
        if key not in plugin.keys and key in others:
            owners = " or ".join(f'kind = "{p.kind}"' for p in plugins.values() if key in p.keys)
            reader.problem((*path, key), f"is for {owners} sources only")
    before = len(reader.problems)
    config = plugin.read(name, _Fields(reader, path, table))
    return None if len(reader.problems) > before else config


def _hints(plugins: Any) -> dict[str, str]:
    hints: dict[str, str] = {}
    for plugin in plugins:
        hints.update(plugin.hints)
    return hints
