"""The embedded engine: whether it is installed, and whether it is the tested one.

The managed server runs ClickHouse from the optional ``chdb-core`` package
(``pip install 'dpone[embedded]'``). Another engine version than the tested one may fail
in ways only a start shows (a query log that cannot be restored), so :func:`check_engine`
runs before a start: a missing engine names the extra to install, another version is
refused naming both versions and the install that fixes it. See
docs/getting-started.md.
"""

from __future__ import annotations

import importlib.metadata

from dpone.localserver.errors import ChdbNotInstalled, EngineVersionUnsupported

ENGINE_PACKAGE = "chdb-core"
# The engine every test of this tree ran against; the `embedded` extra pins it.
TESTED_ENGINE = "26.9.0"
INSTALL_EMBEDDED = "pip install 'dpone[embedded]'"


def installed_engine() -> str | None:
    """The installed ``chdb-core`` version (None: not installed)."""
    try:
        return importlib.metadata.version(ENGINE_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_engine() -> str:
    """The engine's version, when it is the tested one; else a coded refusal."""
    found = installed_engine()
    if found is None:
        raise ChdbNotInstalled(
            "the embedded ClickHouse engine (chdb-core) is not installed: the managed "
            f"server needs it; install it with: {INSTALL_EMBEDDED}",
            package=ENGINE_PACKAGE,
            install=INSTALL_EMBEDDED,
        )
    if found != TESTED_ENGINE:
        raise EngineVersionUnsupported(
            f"the embedded engine is chdb-core {found}, but this dpone is tested with "
            f"{TESTED_ENGINE} only (another version may not restart after a clean stop, or "
            f"run without a query log); install the tested one with: {INSTALL_EMBEDDED} "
            f"(or pip install 'chdb-core=={TESTED_ENGINE}')",
            found=found,
            tested=TESTED_ENGINE,
            install=INSTALL_EMBEDDED,
        )
    return found
