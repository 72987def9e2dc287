"""``dpone doctor``: whether each compiled part of dpone is present and loads, and from where."""

from __future__ import annotations

import ctypes
import importlib.machinery
import importlib.util
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click

import dpone
from dpone.cli.output import emit_json, json_option
from dpone.exporters import native_render
from dpone.preparation import native_conversion

RENDERER = "dpone.exporters.native._render"


def _renderer() -> tuple[Path, str | None]:
    """The compiled renderer's extension module: where this Python's import system finds
    it (or where it would, when it is not built for this Python), and why it is not used."""
    spec = importlib.util.find_spec(RENDERER)
    if spec is not None and spec.origin is not None:
        path = Path(spec.origin)
    else:
        folder = Path(native_render.__file__).parent / "native"
        path = folder / f"_render{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    return path, native_render.unavailable_reason()


# Each compiled part and its loader's answer: the library's path, and why it is not in
# use (None when it loaded and passed its own check). A new part adds its line here.
PARTS: dict[str, Callable[[], tuple[Path, str | None]]] = {
    "converter": native_conversion.library,
    "renderer": _renderer,
}
# Where the package's libraries lie (the build puts each ``_*.so`` in a ``native`` folder).
LIBRARIES = "**/native/_*.so"
# The names an extension module for this Python may end with; one built for another
# Python (they can lie side by side in a tree) is not this installation's.
TAGGED = tuple(s for s in importlib.machinery.EXTENSION_SUFFIXES if s != ".so")


@dataclass(frozen=True)
class CompiledPart:
    """One compiled part as this installation has it."""

    name: str
    library: str
    present: bool
    loaded: bool
    reason: str | None  # why it is not loaded; None when it is
    # False for a library found in the package that no loader above claims: it was only
    # loaded, not checked by dpone's own code.
    registered: bool = True


def _unregistered(claimed: set[Path]) -> list[CompiledPart]:
    """The package's libraries no loader claims, each loaded once to say whether it can be."""
    found = []
    for path in sorted(Path(dpone.__file__).parent.glob(LIBRARIES)):
        other_python = path.suffixes != [".so"] and not path.name.endswith(TAGGED)
        if other_python or path.resolve() in claimed:
            continue
        try:
            ctypes.CDLL(str(path))
        except OSError as exc:
            reason: str | None = f"cannot be loaded ({exc})"
        else:
            reason = None
        name = path.name.split(".")[0].removeprefix("_")
        found.append(CompiledPart(name, str(path), True, reason is None, reason, registered=False))
    return found


def compiled_parts() -> list[CompiledPart]:
    """Every compiled part: the registered ones in order, then any other library found."""
    parts = []
    for name, where in PARTS.items():
        path, reason = where()
        parts.append(CompiledPart(name, str(path), path.is_file(), reason is None, reason))
    return parts + _unregistered({Path(p.library).resolve() for p in parts})


def _describe(part: CompiledPart) -> str:
    if part.loaded:
        checked = "" if part.registered else " (no loader of dpone checks it)"
        return f"{part.name}: loaded from {part.library}{checked}"
    return f"{part.name}: NOT LOADED: {part.reason} (library {part.library})"


@click.command()
@json_option
def doctor(as_json: bool) -> None:
    """Say whether each compiled part is present and loaded, with its path or why not.

    Without the compiled converter dpone still works, through the Python reference,
    many times slower. Exit 0 when every compiled part is loaded, 1 otherwise.
    """
    parts = compiled_parts()
    ok = all(part.loaded for part in parts)
    package = str(Path(dpone.__file__).parent)
    if as_json:
        found: list[dict[str, Any]] = [asdict(part) for part in parts]
        emit_json({"ok": ok, "version": dpone.__version__, "package": package, "compiled": found})
    else:
        click.echo(f"dpone {dpone.__version__} ({package})")
        for part in parts:
            click.echo(_describe(part))
    if not ok:
        raise SystemExit(1)
