"""The registry of source kinds and the one factory that opens a source.

Every module of this package that defines ``KIND`` (a :class:`SourceKind`) is a kind:
adding a source is adding its module, nothing here. Modules are found on first use,
in name order; two kinds claiming one ``kind`` or one scheme are refused.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache
from urllib.parse import urlsplit

from dpone.errors import ConfigurationError
from dpone.exporters.sources.base import Source, SourceConfig, SourceKind

_PACKAGE = "dpone.exporters.sources"


@cache
def kinds() -> dict[str, SourceKind]:
    """Every source kind, by the value of ``kind = ...``."""
    package = importlib.import_module(_PACKAGE)
    found: dict[str, SourceKind] = {}
    schemes: dict[str, str] = {}
    for module in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        plugin: SourceKind | None = getattr(
            importlib.import_module(f"{_PACKAGE}.{module.name}"), "KIND", None
        )
        if plugin is None:
            continue
        if plugin.kind in found:
            raise ConfigurationError(
                f"two source modules claim kind {plugin.kind!r}", code="source_kind_conflict"
            )
        for scheme in plugin.schemes:
            if scheme in schemes:
                raise ConfigurationError(
                    f"source kinds {schemes[scheme]!r} and {plugin.kind!r} both claim the "
                    f"scheme {scheme}:",
                    code="source_kind_conflict",
                )
            schemes[scheme] = plugin.kind
        found[plugin.kind] = plugin
    return found


def kind_for_scheme(scheme: str) -> SourceKind | None:
    """The kind a DSN scheme (any case) names, or None."""
    for plugin in kinds().values():
        if scheme.lower() in plugin.schemes:
            return plugin
    return None


def open_source(source: str | SourceConfig) -> Source:
    """The source a DSN (``dpone export --source``) or a project's configuration names.

    A DSN is opened by the kind owning its scheme; a configuration by its own kind,
    reading any secret now (a secret is never kept in the configuration).
    """
    if isinstance(source, SourceConfig):
        return source.open()
    scheme = source.split(":", 1)[0] if ":" in source else ""
    # A SQLite path is taken literally after "sqlite:": never parsed as a URL.
    plugin = kind_for_scheme(scheme) if scheme else None
    if plugin is None:
        known = " or ".join(f"{s}:" for k in kinds().values() for s in k.schemes)
        shown = urlsplit(source).scheme if scheme else ""
        raise ConfigurationError(
            f"unknown source scheme {shown!r} (use {known})", code="invalid_dsn"
        )
    return plugin.from_dsn(source)
